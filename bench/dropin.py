"""Drop-in, end to end: two MADDPG codebases with their own buffer and with marlbuf swapped in.

The consumers (:mod:`marlbuf.bench.consumers`) are complete PyTorch MADDPG loops written the way
two popular kinds of codebase write them:

* **per_agent** — one buffer object per agent (``buffers[i].add(...)`` every step; a trainer
  draws ``np.random.choice(len, B, replace=False)`` and reads every agent's buffer with
  ``sample_index``); marlbuf enters as :func:`marlbuf.compat.maddpg.make_buffers` with
  ``Uniform(replace=False)``.
* **joint** — one ``push(obs_n, act_n, rew_n, next_obs_n, done_n)`` / ``sample(B)`` buffer
  returning per-agent tensor lists with normalised rewards; marlbuf enters as
  ``MultiAgentReplayBuffer.add`` / ``sample`` + ``Batch.as_lists()`` + ``torch.from_numpy``
  (rewards normalised from ``stored("reward")``), with ``batch_layout="per_agent"`` (case
  ``marlbuf``) and with the default ``"rows"`` layout (case ``marlbuf_rows``).

For every agent count and consumer, all cases are built from the same seeded environment
(:func:`marlbuf.envs.make`'s cooperative navigation, continuous actions, vectorized step: the
same cost in every case) and prefilled with the same synthetic transitions (capacity 1e5,
lowered where one table would exceed ``TABLE_BUDGET_BYTES``; filling is not timed). The run
first checks that the swapped buffer returns the consumer's arrays at the same indices. Then,
repeats interleaved across cases:

* ``write_us`` — the consumer's write path per environment step (every agent's ``add`` / one
  ``push``), on env-shaped transitions;
* ``sample_ms`` — one sampling call of one trainer, tensors included;
* ``update_ms`` — one update round (every trainer samples and updates);
* ``per100_s`` — 100 environment steps of the training loop: action selection, env step, write,
  and the one update round that falls in every 100 steps.

``ratio_*`` columns are case / the consumer's own buffer (below 1: marlbuf is faster).

A write-path micro-benchmark completes it: one step from PettingZoo-style dicts with integer
(discrete) actions through ``MultiAgentReplayBuffer.add`` (stored one-hot) against a minimal
per-agent NumPy row write (one-hot, then five row assignments per agent).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.adapters import capacity_for
from marlbuf.bench.common import markdown_table, quiet_threads, time_interleaved

SUITE = "dropin"
STEPS = 100  # environment steps per timed window (one update round in each)
ACTION_DIM = 5

#: Full-size run.
FULL: dict[str, Any] = {
    "agents": (3, 12, 24),
    "capacity": None,  # 1e5, lowered to fit TABLE_BUDGET_BYTES (see bench.adapters)
    "batch_size": 1024,
    "repeats": 5,
    "write_agents": (3, 12, 24),
    "write_steps": 200,
    "write_repeats": 15,
}
#: Sizes of the quick run (``marlbuf bench --quick``); tests patch it smaller.
QUICK: dict[str, Any] = {
    "agents": (3, 12),
    "capacity": 2_000,
    "batch_size": 128,
    "repeats": 3,
    "write_agents": (3, 12, 24),
    "write_steps": 50,
    "write_repeats": 5,
}

METRICS = ("write_us", "sample_ms", "update_ms", "per100_s")


# ------------------------------------------------------------------------------ prefill data
def make_data(obs_dims: list[int], capacity: int, seed: int) -> dict[str, list[np.ndarray]]:
    """Per agent, ``capacity`` synthetic transitions: observations along one trajectory (step
    t's next observation is step t+1's observation), actions in [0, 1), normal rewards, no
    terminations. ``obs`` and ``next_obs`` are views of one array per agent."""
    rng = np.random.default_rng(seed)
    traj = [rng.random((capacity + 1, d), np.float32) for d in obs_dims]
    return {
        "obs": [t[:-1] for t in traj],
        "act": [rng.random((capacity, ACTION_DIM), np.float32) for _ in obs_dims],
        "rew": [rng.standard_normal(capacity).astype(np.float32) for _ in obs_dims],
        "next_obs": [t[1:] for t in traj],
        "done": [np.zeros(capacity, np.float32) for _ in obs_dims],
    }


def env_transitions(obs_dims: list[int], steps: int, seed: int) -> list[tuple[Any, ...]]:
    """``steps`` transitions shaped as the environment returns them: per-agent lists of float32
    observations and actions, a float64 reward array and a bool done array."""
    rng = np.random.default_rng(seed)
    n = len(obs_dims)
    out = []
    for _ in range(steps):
        obs = [rng.random(d, np.float32) for d in obs_dims]
        act = [rng.random(ACTION_DIM, np.float32) for _ in obs_dims]
        nxt = [rng.random(d, np.float32) for d in obs_dims]
        out.append((obs, act, rng.standard_normal(n), nxt, np.zeros(n, dtype=bool)))
    return out


def fill_own_per_agent(buffers: list[Any], data: dict[str, list[np.ndarray]]) -> None:
    for i, buf in enumerate(buffers):
        buf.obs[:] = data["obs"][i]
        buf.act[:] = data["act"][i]
        buf.rew[:] = data["rew"][i]
        buf.next_obs[:] = data["next_obs"][i]
        buf.done[:] = data["done"][i]
        buf.filled, buf.ptr = buf.size, 0


def fill_marlbuf_per_agent(buffers: list[Any], data: dict[str, list[np.ndarray]]) -> None:
    for i, buf in enumerate(buffers):  # the first step through add(): allocates the store
        buf.add(*(data[f][i][0] for f in ("obs", "act", "rew", "next_obs", "done")))
    store = buffers[0].store.buffer
    rest = {f: [x[1:] for x in data[f]] for f in ("obs", "act", "rew", "next_obs", "done")}
    store.extend(rest["obs"], rest["act"], rest["rew"], rest["next_obs"], rest["done"])


def fill_own_joint(buf: Any, data: dict[str, list[np.ndarray]]) -> None:
    for i in range(buf.num_agents):
        buf.obs_buffs[i][:] = data["obs"][i]
        buf.ac_buffs[i][:] = data["act"][i]
        buf.rew_buffs[i][:] = data["rew"][i]
        buf.next_obs_buffs[i][:] = data["next_obs"][i]
        buf.done_buffs[i][:] = data["done"][i]
    buf.filled_i, buf.curr_i = buf.max_steps, 0


def fill_marlbuf_joint(buf: Any, data: dict[str, list[np.ndarray]]) -> None:
    buf.buffer.extend(data["obs"], data["act"], data["rew"], data["next_obs"], data["done"])


# ------------------------------------------------------------------------------ consumers
def build_cases(
    consumer: str, n: int, capacity: int, batch_size: int, data: dict[str, list[np.ndarray]]
) -> dict[str, Any]:
    """The consumer's training loops, one per case, each with its own env (same seed) and a
    buffer prefilled with ``data``."""
    from marlbuf.bench.consumers import joint, per_agent
    from marlbuf.envs import make

    def env() -> Any:
        return make("cooperative_navigation", n, seed=0)

    settings: dict[str, Any] = {"batch_size": batch_size, "update_every": STEPS, "seed": 0}
    obs_dims = env().obs_dims
    loops: dict[str, Any] = {}
    if consumer == "per_agent":
        own = per_agent.own_buffers(capacity, obs_dims, ACTION_DIM)
        fill_own_per_agent(own, data)
        loops["own"] = per_agent.PerAgentMADDPG(env(), own, **settings)
        ours = per_agent.marlbuf_buffers(capacity, obs_dims, ACTION_DIM, seed=0)
        fill_marlbuf_per_agent(ours, data)
        loops["marlbuf"] = per_agent.PerAgentMADDPG(env(), ours, **settings)
        return loops
    act_dims = [ACTION_DIM] * n
    own_joint = joint.JointReplayBuffer(capacity, obs_dims, act_dims)
    fill_own_joint(own_joint, data)
    loops["own"] = joint.JointMADDPG(env(), own_joint, **settings)
    for case, layout in (("marlbuf", "per_agent"), ("marlbuf_rows", "rows")):
        swapped = joint.MarlbufJointBuffer(capacity, obs_dims, act_dims, layout, seed=0)
        fill_marlbuf_joint(swapped, data)
        loops[case] = joint.JointMADDPG(env(), swapped, **settings)
    return loops


def check_same_data(consumer: str, loops: dict[str, Any], capacity: int) -> None:
    """Every case returns the own buffer's arrays at the same indices (else the run is void)."""
    idx = np.random.default_rng(1).choice(capacity, 64, replace=False)
    if consumer == "per_agent":
        own = [b.sample_index(idx) for b in loops["own"].buffers]
        for case, loop in loops.items():
            got = [b.sample_index(idx) for b in loop.buffers]
            if not all(np.array_equal(x, y) for a, b in zip(own, got) for x, y in zip(a, b)):
                raise AssertionError(f"{case} and own buffers disagree; the benchmark is void")
        return
    buf = loops["own"].buffer
    own_fields = [buf.obs_buffs, buf.ac_buffs, buf.rew_buffs, buf.next_obs_buffs, buf.done_buffs]
    for case, loop in loops.items():
        if case == "own":
            continue
        for field, theirs in zip(loop.buffer.buffer.gather(idx).as_lists(), own_fields):
            if not all(np.array_equal(x, y[idx]) for x, y in zip(field, theirs)):
                raise AssertionError(f"{case} and own buffers disagree; the benchmark is void")


def measure_consumer(
    consumer: str, n: int, capacity: int, batch_size: int, repeats: int
) -> list[dict[str, Any]]:
    """Rows (one per case) of the four metrics for one consumer at ``n`` agents."""
    data = make_data([6 * n] * n, capacity, seed=n)
    loops = build_cases(consumer, n, capacity, batch_size, data)
    del data
    check_same_data(consumer, loops, capacity)
    transitions = env_transitions([6 * n] * n, STEPS, seed=100 + n)

    def writes(loop: Any) -> Callable[[], None]:
        def run() -> None:
            for t in transitions:
                loop.store(*t)

        return run

    timings: dict[str, dict[str, dict[str, float]]] = {}
    timings["write_us"] = time_interleaved(
        {c: writes(loop) for c, loop in loops.items()}, repeats=repeats, warmup=1
    )
    timings["sample_ms"] = time_interleaved(
        {c: partial(loop.sample, 0) for c, loop in loops.items()},
        repeats=repeats,
        warmup=1,
        inner=5,
    )
    timings["update_ms"] = time_interleaved(
        {c: loop.update_round for c, loop in loops.items()}, repeats=repeats, warmup=1
    )
    timings["per100_s"] = time_interleaved(
        {c: partial(loop.run_steps, STEPS) for c, loop in loops.items()},
        repeats=repeats,
        warmup=1,
    )
    for case, loop in loops.items():
        expected = 2 * (repeats + 1)  # the update_ms rounds, then one per 100-step window
        if loop.updates != expected:
            raise AssertionError(f"{case}: {loop.updates} update rounds, expected {expected}")
    scale = {"write_us": 1e6 / STEPS, "sample_ms": 1e3, "update_ms": 1e3, "per100_s": 1.0}
    rows = []
    for case in loops:
        row: dict[str, Any] = {"consumer": consumer, "agents": n, "case": case}
        row["capacity"] = capacity
        for metric in METRICS:
            row[metric] = timings[metric][case]["median"] * scale[metric]
            row[f"{metric}_min"] = timings[metric][case]["min"] * scale[metric]
        row["repeats"] = repeats
        rows.append(row)
    own = rows[0]
    for row in rows:
        for metric in METRICS:
            row[f"ratio_{metric.rsplit('_', 1)[0]}"] = row[metric] / own[metric]
    del loops
    gc.collect()
    return rows


# ------------------------------------------------------------------------------ write path
def measure_write(n: int, steps: int, repeats: int) -> list[dict[str, Any]]:
    """One step of PettingZoo-style dicts with integer actions: ``add`` vs NumPy rows."""
    agents = [f"agent_{i}" for i in range(n)]
    obs_dim, capacity = 6 * n, 10_000
    rng = np.random.default_rng(n)
    step_dicts = [
        (
            {a: rng.random(obs_dim, np.float32) for a in agents},
            {a: int(rng.integers(ACTION_DIM)) for a in agents},
            {a: float(rng.standard_normal()) for a in agents},
            {a: rng.random(obs_dim, np.float32) for a in agents},
            {a: False for a in agents},
        )
        for _ in range(steps)
    ]
    specs = {
        a: AgentSpec(obs_shape=(obs_dim,), action_shape=(ACTION_DIM,), n_discrete_actions=5)
        for a in agents
    }
    buf = MultiAgentReplayBuffer(specs, capacity, seed=0)
    arrays = {
        a: (
            np.zeros((capacity, obs_dim), np.float32),
            np.zeros((capacity, ACTION_DIM), np.float32),
            np.zeros(capacity, np.float32),
            np.zeros((capacity, obs_dim), np.float32),
            np.zeros(capacity, np.float32),
        )
        for a in agents
    }
    cursor = [0]

    def numpy_rows() -> None:
        for obs, act, rew, nxt, done in step_dicts:
            ptr = cursor[0]
            for a in agents:
                one_hot = np.zeros(ACTION_DIM, np.float32)
                one_hot[act[a]] = 1.0
                o, ac, r, o2, d = arrays[a]
                o[ptr] = obs[a]
                ac[ptr] = one_hot
                r[ptr] = rew[a]
                o2[ptr] = nxt[a]
                d[ptr] = done[a]
            cursor[0] = (ptr + 1) % capacity

    def marlbuf_add() -> None:
        for obs, act, rew, nxt, done in step_dicts:
            buf.add(obs, act, rew, nxt, done)

    times = time_interleaved(
        {"numpy_rows": numpy_rows, "marlbuf_add": marlbuf_add}, repeats=repeats, warmup=1
    )
    # both wrote the same last step
    last = (cursor[0] - 1) % capacity
    got = buf.gather(np.array([(buf.cursor - 1) % capacity]))
    for a in agents:
        if not np.array_equal(got.action[a][0], arrays[a][1][last]):
            raise AssertionError("add and the NumPy row write stored different actions")
    base = times["numpy_rows"]["median"]
    return [
        {
            "agents": n,
            "case": case,
            "us_per_step": t["median"] / steps * 1e6,
            "us_per_step_min": t["min"] / steps * 1e6,
            "ratio_vs_numpy_rows": t["median"] / base,
            "repeats": t["n"],
        }
        for case, t in times.items()
    ]


# ------------------------------------------------------------------------------ suite
def run(quick: bool = False) -> dict[str, Any]:
    threads = quiet_threads()
    sizes = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    for n in sizes["agents"]:
        capacity = sizes["capacity"] or capacity_for(n)[0]
        for consumer in ("per_agent", "joint"):
            print(f"[dropin] {consumer} consumer, N={n}, capacity {capacity}", flush=True)
            rows += measure_consumer(consumer, n, capacity, sizes["batch_size"], sizes["repeats"])
    write_rows: list[dict[str, Any]] = []
    for n in sizes["write_agents"]:
        write_rows += measure_write(n, sizes["write_steps"], sizes["write_repeats"])

    summary: dict[str, Any] = {}
    for row in rows:
        if row["case"] == "own":
            continue
        key = f"{row['consumer']}/{row['case']}/N={row['agents']}"
        summary[key] = {m: round(row[f"ratio_{m.rsplit('_', 1)[0]}"], 3) for m in METRICS}
    for row in write_rows:
        if row["case"] == "marlbuf_add":
            summary[f"write_add_vs_numpy_rows/N={row['agents']}"] = round(
                row["ratio_vs_numpy_rows"], 3
            )
    columns = ["consumer", "agents", "case", *METRICS]
    columns += [f"ratio_{m.rsplit('_', 1)[0]}" for m in METRICS]
    write_columns = ["agents", "case", "us_per_step", "ratio_vs_numpy_rows"]
    markdown = (
        markdown_table(rows, columns)
        + "\n\nWrite path, one step from PettingZoo-style dicts with integer actions:\n\n"
        + markdown_table(write_rows, write_columns)
    )
    return {
        "rows": rows,
        "write_rows": write_rows,
        "markdown": markdown,
        "summary": summary,
        "config": {
            **{k: v for k, v in sizes.items() if k != "capacity"},
            "capacity": sizes["capacity"] or "1e5, lowered to fit 384 MiB per table",
            "steps_per_window": STEPS,
            "env": "marlbuf.envs cooperative_navigation, continuous actions, seed 0",
            "threads": threads,
            "what": "medians of interleaved repeats; ratio_* = case / own buffer",
        },
    }


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    from marlbuf.bench.common import write_result

    quick = "--quick" in sys.argv
    payload = run(quick=quick)
    print(json.dumps(payload["summary"], indent=1))
    print(write_result(SUITE, payload, quick))
