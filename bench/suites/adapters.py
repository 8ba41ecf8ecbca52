"""Drop-in adapters vs the buffers they replace, on the original trainers' sampling rounds.

* **openai round** — what every ``MADDPGAgentTrainer.update`` does, for all N trainers:
  ``index = own.make_index(B)``, then ``sample_index(index)`` on every agent's buffer and once
  more on its own (N × (1 + N + 1) calls). Compared: the original list-of-tuples buffer (the
  paper's baseline), per-agent NumPy arrays with the same API (the strong baseline), and
  :func:`marlbuf.compat.maddpg.make_buffers` (one shared interleaved store; one gather per
  trainer), with read-only views (default) and with ``copy=True``.
* **tf2marl round** — every agent's buffer draws one batch: N × ``sample(B)``. Compared:
  tf2multiagentrl's ``EfficientReplayBuffer`` semantics (per-agent float32 arrays, fancy
  indexing) and :class:`marlbuf.compat.tf2marl.EfficientReplayBuffer`.
* **tf2marl prioritized round** — N × (``sample(B, beta)`` + ``update_priorities``). Compared:
  tf2multiagentrl's ``PrioritizedReplayBuffer`` semantics (Python sum/min segment trees, one
  tree descent and one weight per sampled row in Python) and
  :class:`marlbuf.compat.tf2marl.PrioritizedReplayBuffer` (Numba float64 sum-tree).

Workloads: cooperative navigation, N = 3, 6, 12, 24 agents (obs 6N, action 5), batch 1024. The
capacity is 1e5 steps, lowered where one interleaved table would exceed ``TABLE_BUDGET_BYTES``
(the machine is shared); every case of one N holds the same data. The adapters are filled with
one ``add`` per agent (which infers the shapes) and the rest through the store's ``extend``;
filling is not timed.
"""

from __future__ import annotations

import gc
import random
from typing import Any

import numpy as np

from marlbuf.bench.baselines.numpy_buffers import ListOfTuplesBuffer
from marlbuf.bench.tools.common import quiet_threads, time_interleaved, write_result
from marlbuf.compat.maddpg import ReplayBuffer, make_buffers
from marlbuf.compat.tf2marl import EfficientReplayBuffer, PrioritizedReplayBuffer
from marlbuf.workloads import ACTION_DIM, Workload

SUITE = "adapters"
AGENT_COUNTS = (3, 6, 12, 24)
MAX_CAPACITY = 100_000
TABLE_BUDGET_BYTES = 384 * 1024**2
BATCH_SIZE = 1024


class PerAgentArrays:
    """One agent's preallocated arrays (the layout of tf2marl, SB3, cpprb), with openai's
    ``make_index`` / ``sample_index`` API: five fancy-indexing copies per call."""

    def __init__(self, fields: tuple[np.ndarray, ...], rng: np.random.Generator) -> None:
        self.fields = fields
        self.rng = rng

    def __len__(self) -> int:
        return len(self.fields[0])

    def make_index(self, batch_size: int) -> np.ndarray:
        return self.rng.integers(0, len(self), size=batch_size)

    def sample_index(self, idxes: Any) -> tuple[np.ndarray, ...]:
        return tuple(f[idxes] for f in self.fields)


class Tf2marlArrays:
    """tf2multiagentrl's ``EfficientReplayBuffer.sample``: one index array, then every agent's
    obs / action (copied) / next obs and the buffer's reward and done by fancy indexing."""

    def __init__(
        self,
        obs: list[np.ndarray],
        acts: list[np.ndarray],
        next_obs: list[np.ndarray],
        reward: np.ndarray,
        done: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        self.obs, self.acts, self.next_obs = obs, acts, next_obs
        self.reward, self.done = reward, done
        self.rng = rng

    def sample(self, batch_size: int) -> tuple[Any, ...]:
        idx = self.rng.integers(len(self.reward), size=batch_size)
        return (
            [o[idx] for o in self.obs],
            [a[idx].copy() for a in self.acts],
            self.reward[idx],
            [o[idx] for o in self.next_obs],
            self.done[idx],
        )


class PySegmentTree:
    """A binary segment tree in a Python list (openai/baselines' design, which tf2marl uses):
    sums or minima of ``priority ** alpha``, updated and searched one Python step per level."""

    def __init__(self, capacity: int, leaves: np.ndarray, is_min: bool) -> None:
        self.leaf_offset = 1 << max(0, (capacity - 1).bit_length())
        self.is_min = is_min
        neutral = float("inf") if is_min else 0.0
        self.value = [neutral] * (2 * self.leaf_offset)
        self.value[self.leaf_offset : self.leaf_offset + len(leaves)] = leaves.tolist()
        for node in range(self.leaf_offset - 1, 0, -1):
            self.value[node] = self._combine(self.value[2 * node], self.value[2 * node + 1])

    def _combine(self, left: float, right: float) -> float:
        return min(left, right) if self.is_min else left + right

    def __setitem__(self, slot: int, leaf: float) -> None:
        node = slot + self.leaf_offset
        self.value[node] = leaf
        node //= 2
        while node >= 1:
            self.value[node] = self._combine(self.value[2 * node], self.value[2 * node + 1])
            node //= 2

    def __getitem__(self, slot: int) -> float:
        return self.value[slot + self.leaf_offset]

    def total(self) -> float:
        return self.value[1]

    def prefix_sum(self, stop: int) -> float:
        """Sum of leaves ``[0, stop)``."""
        total, lo, hi = 0.0, self.leaf_offset, stop + self.leaf_offset
        while lo < hi:
            if lo & 1:
                total += self.value[lo]
                lo += 1
            if hi & 1:
                hi -= 1
                total += self.value[hi]
            lo //= 2
            hi //= 2
        return total

    def find_prefixsum_idx(self, mass: float) -> int:
        node = 1
        while node < self.leaf_offset:
            if self.value[2 * node] > mass:
                node = 2 * node
            else:
                mass -= self.value[2 * node]
                node = 2 * node + 1
        return node - self.leaf_offset


class Tf2marlPrioritized(Tf2marlArrays):
    """tf2multiagentrl's ``PrioritizedReplayBuffer.sample`` / ``update_priorities``: per row a
    Python tree descent and a weight from the sum and min trees; per update two tree walks."""

    def __init__(self, arrays: Tf2marlArrays, priorities: np.ndarray, alpha: float) -> None:
        super().__init__(
            arrays.obs, arrays.acts, arrays.next_obs, arrays.reward, arrays.done, arrays.rng
        )
        self.alpha = alpha
        self.sums = PySegmentTree(len(priorities), priorities**alpha, is_min=False)
        self.mins = PySegmentTree(len(priorities), priorities**alpha, is_min=True)
        self.max_priority = float(priorities.max())

    def sample_prioritized(self, batch_size: int, beta: float) -> tuple[Any, ...]:
        size = len(self.reward)
        indices = [
            self.sums.find_prefixsum_idx(random.random() * self.sums.prefix_sum(size))
            for _ in range(batch_size)
        ]
        largest = (self.mins.total() / self.sums.total() * size) ** -beta
        weights = np.array(
            [(self.sums[i] / self.sums.total() * size) ** -beta / largest for i in indices],
            dtype=np.float32,
        )
        idx = np.array(indices)
        return (
            [o[idx] for o in self.obs],
            [a[idx].copy() for a in self.acts],
            self.reward[idx],
            [o[idx] for o in self.next_obs],
            self.done[idx],
            weights,
            indices,
        )

    def update_priorities(self, indices: list[int], priorities: np.ndarray) -> None:
        for slot, priority in zip(indices, priorities.tolist()):
            self.sums[slot] = priority**self.alpha
            self.mins[slot] = priority**self.alpha
            self.max_priority = max(self.max_priority, priority)


def openai_round(buffers: list[Any], batch_size: int) -> None:
    """Every trainer's sampling in openai's ``MADDPGAgentTrainer.update``."""
    for own in buffers:
        index = own.make_index(batch_size)
        for buf in buffers:
            buf.sample_index(index)
        own.sample_index(index)


def capacity_for(n_agents: int) -> tuple[int, int]:
    """(capacity, interleaved row bytes) for the openai adapter's table within the budget."""
    obs_dim = 6 * n_agents
    # per agent: obs + next obs float32, action float32, reward and done float64 (Python floats)
    raw = n_agents * (2 * obs_dim * 4 + ACTION_DIM * 4 + 16)
    row_bytes = -(-raw // 64) * 64
    return min(MAX_CAPACITY, TABLE_BUDGET_BYTES // row_bytes), row_bytes


def make_data(n_agents: int, capacity: int, seed: int) -> dict[str, Any]:
    """Per agent: a trajectory of capacity + 1 observations (step t's next obs is step t+1's
    obs, as in a real loop), actions, Python-float rewards, ``float(done)`` flags."""
    rng = np.random.default_rng(seed)
    obs_dim = 6 * n_agents
    return {
        "traj": [rng.random((capacity + 1, obs_dim), np.float32) for _ in range(n_agents)],
        "acts": [rng.random((capacity, ACTION_DIM), np.float32) for _ in range(n_agents)],
        "rews": [rng.standard_normal(capacity) for _ in range(n_agents)],
        "dones": [(np.arange(capacity) % 25 == 24).astype(np.float64) for _ in range(n_agents)],
    }


def build_original(data: dict[str, Any], capacity: int) -> list[ListOfTuplesBuffer]:
    buffers = [ListOfTuplesBuffer(capacity, seed=i) for i in range(len(data["traj"]))]
    for i, buf in enumerate(buffers):
        steps = list(data["traj"][i])  # separate small arrays, shared by consecutive steps
        acts, rews, dones = list(data["acts"][i]), data["rews"][i].tolist(), data["dones"][i]
        for t in range(capacity):
            buf.add(steps[t], acts[t], rews[t], steps[t + 1], float(dones[t]))
    return buffers


def build_openai_adapter(data: dict[str, Any], capacity: int, copy: bool) -> list[ReplayBuffer]:
    buffers = make_buffers(len(data["traj"]), capacity, seed=0, copy=copy)
    for i, buf in enumerate(buffers):  # the first step through add(): infers shapes, dtypes
        traj = data["traj"][i]
        buf.add(
            traj[0],
            data["acts"][i][0],
            float(data["rews"][i][0]),
            traj[1],
            float(data["dones"][i][0]),
        )
    store = buffers[0].store.buffer
    assert store is not None
    names = store.agents
    store.extend(
        obs={a: data["traj"][i][1:capacity] for i, a in enumerate(names)},
        action={a: data["acts"][i][1:] for i, a in enumerate(names)},
        reward={a: data["rews"][i][1:] for i, a in enumerate(names)},
        next_obs={a: data["traj"][i][2:] for i, a in enumerate(names)},
        done={a: data["dones"][i][1:] for i, a in enumerate(names)},
    )
    return buffers


def check_same(original: list[Any], adapter: list[Any]) -> None:
    """The adapter returns what the original returns (values, shapes, dtypes) at one index."""
    index = original[0].make_index(64)
    for ours, theirs in zip(adapter, original):
        for a, b in zip(ours.sample_index(index), theirs.sample_index(index)):
            if a.dtype != b.dtype or not np.array_equal(a, b):
                raise AssertionError("adapter and original disagree; the benchmark is invalid")


def _rows(
    times: dict[str, dict[str, float]], round_name: str, baselines: dict[str, str], **config: Any
) -> list[dict[str, Any]]:
    rows = []
    for name, t in times.items():
        row = {"round": round_name, **config, "case": name, "median_s": t["median"]}
        row.update(min_s=t["min"], max_s=t["max"], repeats=t["n"])
        for label, base in baselines.items():
            row[f"speedup_vs_{label}"] = times[base]["median"] / t["median"]
        rows.append(row)
    return rows


def measure_openai(
    data: dict[str, Any], capacity: int, batch_size: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Time openai's sampling round through the four buffers holding ``data``."""
    n_agents = len(data["traj"])
    rng = np.random.default_rng(0)
    random.seed(0)
    original = build_original(data, capacity)
    adapter = build_openai_adapter(data, capacity, copy=False)
    adapter_copy = build_openai_adapter(data, capacity, copy=True)
    check_same(original, adapter)
    arrays = [
        PerAgentArrays(
            (
                data["traj"][i][:capacity].copy(),
                data["acts"][i],
                data["rews"][i],
                data["traj"][i][1:].copy(),
                data["dones"][i],
            ),
            rng,
        )
        for i in range(n_agents)
    ]
    cases = {
        "list_of_tuples": lambda: openai_round(original, batch_size),
        "per_agent_arrays": lambda: openai_round(arrays, batch_size),
        "adapter": lambda: openai_round(adapter, batch_size),
        "adapter_copy": lambda: openai_round(adapter_copy, batch_size),
    }
    return time_interleaved(cases, repeats=repeats, warmup=1)


def measure_tf2marl(
    data: dict[str, Any], capacity: int, batch_size: int, repeats: int
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Time tf2marl's rounds (every agent's buffer draws one batch; and the prioritized
    variant with its priority updates) for the original semantics and the adapters."""
    n_agents = len(data["traj"])
    rng = np.random.default_rng(0)
    obs = [d[:capacity].copy() for d in data["traj"]]
    next_obs = [d[1:].copy() for d in data["traj"]]
    reward = data["rews"][0].astype(np.float32)
    done = data["dones"][0].astype(np.float32)
    original = Tf2marlArrays(obs, data["acts"], next_obs, reward, done, rng)
    adapter = EfficientReplayBuffer(
        capacity, n_agents, [o.shape[1:] for o in obs], [(ACTION_DIM,)] * n_agents, seed=0
    )
    adapter.buffer.extend(
        obs=obs,
        action=data["acts"],
        reward=[reward] * n_agents,
        next_obs=next_obs,
        done=[done] * n_agents,
    )

    def tf2marl_round(buf: Any) -> None:
        for _ in range(n_agents):
            buf.sample(batch_size)

    cases = {
        "tf2marl_arrays": lambda: tf2marl_round(original),
        "adapter": lambda: tf2marl_round(adapter),
    }
    times = time_interleaved(cases, repeats=repeats, warmup=1)

    # prioritized: the same data, priorities drawn once, alpha 0.6, beta 0.5, eps 1e-6
    priorities = rng.random(capacity) * 2 + 1e-6
    td_errors = rng.random(batch_size).astype(np.float32) + np.float32(1e-6)
    per_original = Tf2marlPrioritized(original, priorities, alpha=0.6)
    per_adapter = PrioritizedReplayBuffer(
        capacity, n_agents, [o.shape[1:] for o in obs], [(ACTION_DIM,)] * n_agents, 0.6, seed=0
    )
    per_adapter.buffer.extend(
        obs=obs,
        action=data["acts"],
        reward=[reward] * n_agents,
        next_obs=next_obs,
        done=[done] * n_agents,
    )
    per_adapter.update_priorities(np.arange(capacity), priorities)

    def original_per_round() -> None:
        for _ in range(n_agents):
            *_, indices = per_original.sample_prioritized(batch_size, beta=0.5)
            per_original.update_priorities(indices, td_errors)

    def adapter_per_round() -> None:
        for _ in range(n_agents):
            *_, indices = per_adapter.sample(batch_size, beta=0.5)
            per_adapter.update_priorities(indices, td_errors)

    per_cases = {"tf2marl_per": original_per_round, "adapter_per": adapter_per_round}
    per_times = time_interleaved(per_cases, repeats=repeats, warmup=1)
    return times, per_times


def measure(n_agents: int, capacity: int, batch_size: int, repeats: int) -> list[dict[str, Any]]:
    """Both rounds for one agent count; each comparison's buffers are freed before the next."""
    data = make_data(n_agents, capacity, seed=n_agents)
    config = {
        "workload": Workload("cooperative_navigation", n_agents).label,
        "n_agents": n_agents,
        "capacity": capacity,
        "batch_size": batch_size,
    }
    openai = measure_openai(data, capacity, batch_size, repeats)
    gc.collect()
    tf2marl, tf2marl_per = measure_tf2marl(data, capacity, batch_size, repeats)
    baselines = {"list_of_tuples": "list_of_tuples", "per_agent_arrays": "per_agent_arrays"}
    return (
        _rows(openai, "openai", baselines, **config)
        + _rows(tf2marl, "tf2marl", {"tf2marl_arrays": "tf2marl_arrays"}, **config)
        + _rows(tf2marl_per, "tf2marl_prioritized", {"tf2marl_per": "tf2marl_per"}, **config)
    )


def run(quick: bool = False) -> dict[str, Any]:
    """Time both rounds for N = 3, 6, 12, 24; ``quick`` uses small buffers and batches."""
    settings = quiet_threads()
    batch_size = 256 if quick else BATCH_SIZE
    repeats = 2 if quick else 5
    rows: list[dict[str, Any]] = []
    capacities: dict[str, int] = {}
    for n_agents in AGENT_COUNTS:
        capacity = 2_000 if quick else capacity_for(n_agents)[0]
        capacities[f"CN-{n_agents}"] = capacity
        rows += measure(n_agents, capacity, batch_size, repeats)
        gc.collect()
    summary: dict[str, Any] = {}
    for row in rows:
        key = f"{row['round']}/{row['workload']}/{row['case']}"
        if row["round"] == "openai" and row["case"] != "list_of_tuples":
            summary[f"{key}/speedup_vs_list_of_tuples"] = row["speedup_vs_list_of_tuples"]
            summary[f"{key}/speedup_vs_per_agent_arrays"] = row["speedup_vs_per_agent_arrays"]
        if row["round"] == "tf2marl" and row["case"] == "adapter":
            summary[f"{key}/speedup_vs_tf2marl_arrays"] = row["speedup_vs_tf2marl_arrays"]
        if row["round"] == "tf2marl_prioritized" and row["case"] == "adapter_per":
            summary[f"{key}/speedup_vs_tf2marl_per"] = row["speedup_vs_tf2marl_per"]
    return {
        "rows": rows,
        "summary": summary,
        "config": {
            "agent_counts": list(AGENT_COUNTS),
            "capacity": capacities,
            "max_capacity": MAX_CAPACITY,
            "table_budget_bytes": TABLE_BUDGET_BYTES,
            "batch_size": batch_size,
            "repeats": repeats,
            "obs_dtype": "float32",
            "reward_done": "Python floats (float64 out, as the original returns)",
            "threads": settings,
        },
    }


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    payload = run(quick=args.quick)
    path = write_result(SUITE, payload, quick=args.quick)
    print(json.dumps(payload["summary"], indent=1))
    print(f"wrote {path}")
