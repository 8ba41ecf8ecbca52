"""Sequence sampling (recurrent learners): marlbuf's ``Sequence`` sampler against TorchRL's
``SliceSampler`` and an EPyMARL-style padded episode buffer.

Three parts, each measured in one process with interleaved repeats (ratios, not absolute
times, carry over between machines):

* **Sampling** — B = 256 sequences of T = 32 steps (and one case with a burn-in of 8, so
  L = 40 steps per sequence) from ``capacity`` stored steps (1e6 in the full run) of
  cooperative navigation with 6 agents (every step holds each agent's obs, action, reward,
  next_obs and done), written as one stream of 25-step episodes (MPE's default length):

  - ``marlbuf``: ``MultiAgentReplayBuffer(specs, capacity, sampler=Sequence(length=32,
    burn_in=k), seed=0)`` then ``buf.sample(256)``: a ``SequenceBatch`` with every per-agent
    array of shape ``(B, k + 32, ...)`` and a ``(B, L)`` mask; observations stored once (the
    default), float32 batches;
  - ``torchrl`` (``[peers]`` extra): a ``TensorDictReplayBuffer`` over a
    ``LazyTensorStorage`` holding the same fields in TorchRL's multi-agent layout (agents
    stacked under ``"agents"``: ``("agents", "observation")`` ``(N, 6, 36)``,
    ``("agents", "action")``, ``("next", "agents", "observation" | "reward" | "done")``,
    ``("next", "done")``) and an ``"episode"`` id per step, sampled by
    ``SliceSampler(slice_len=L, traj_key="episode", strict_length=False, ...)`` with
    ``batch_size = B * L``. TorchRL draws an episode uniformly, then a start inside it with a
    full slice; an episode shorter than L (every one here: 25 < 32) is returned whole, from
    its first step. Variants: ``pad_output=True`` (each short slice padded to L by repeating
    its last step; a ``[B * L]`` batch with a ``("collector", "mask")`` of real steps, viewed
    as ``(B, L)``: marlbuf's output shape), the default ragged output (``pad_output=False``:
    a ``[sum of slice lengths]`` batch, here B × 25 rows, with ``is_init``/``truncated``
    markers where slices meet), and ``pad_output`` with ``cache_values=True`` (trajectory
    boundaries cached until the storage is written to: valid for a static buffer only, so it
    shows TorchRL without its per-call boundary scan; a training loop that writes between
    updates pays the scan every time);
  - ``padded_episodes`` (:mod:`marlbuf.bench.padded_episodes`, EPyMARL's ``EpisodeBatch``
    design in NumPy): gather B whole padded episodes, then cut a window of L steps from each
    (start uniform over the episode's real steps, masked past its end);
    ``padded_episodes_whole`` is the gather of B whole episodes alone (what EPyMARL's
    learners train on), for reference.

  marlbuf draws the training start uniformly over stored steps and masks what falls past
  the episode end; TorchRL with these episodes always returns whole episodes. Both return the
  same number of (B × L) rows per batch with ``pad_output``. The yardstick ``gather_runs`` is
  marlbuf's ``buf.gather`` of B runs of L consecutive slots at random starts: the rows a
  sequence batch reads, without episode links, masks or reshaping.
* **Scaling** — time per sequence batch (B = 256, T = 32) at 1e5, 1e6 and 1e7 stored steps,
  marlbuf and TorchRL (``pad_output``, no cache), on a lean spec so that 1e7 steps of both fit
  next to everything else on a 24 GiB machine: cooperative navigation with 3 agents, float16
  observations (and next observations) in both buffers, batches returned in storage
  precision by both (marlbuf ``batch_dtype="storage"``). marlbuf (with the ``gather_runs``
  yardstick) and TorchRL are timed in separate interleaved loops at each size: TorchRL's
  per-call boundary scan sweeps memory in proportion to the stored steps and would otherwise
  evict marlbuf's caches between its calls. A size whose two buffers would take more than
  :data:`MEMORY_FRACTION` of the memory available at that moment is skipped with the reason
  recorded.
* **Memory** — bytes per stored step of marlbuf with a global state field
  (``global_fields={"state": FieldSpec((216,))}``: all six observations' size) and alive masks
  (``alive=True``) against the padded-episode layout holding the same fields (obs, action,
  reward per agent, the state, ``terminated`` and ``filled``), for episodes of 25 steps and
  for a mix of shorter ones (lengths uniform in 5..25: agents dying early end the episode
  early; the padded layout still reserves ``max_t + 1 = 26`` steps per episode). marlbuf's
  figure is :func:`marlbuf.memory.estimate` and a measured buffer (``nbytes`` / capacity); the
  padded figure is the arrays' bytes over the real transitions they hold.
"""

from __future__ import annotations

import gc
import inspect
import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.common import markdown_table, quiet_threads, time_interleaved
from marlbuf.bench.memory import half_specs
from marlbuf.bench.padded_episodes import PaddedEpisodeBuffer, PaddedField, from_stream
from marlbuf.bench.workloads import Workload, episode_steps
from marlbuf.memory import GIB, estimate
from marlbuf.storage import available_memory_bytes

SUITE = "sequences"
BATCH = 256
LENGTH = 32
BURN_IN = 8
EPISODE_LENGTH = 25  # MPE's max_cycles
FILL_CHUNK = 5_000  # a multiple of EPISODE_LENGTH: every chunk holds whole episodes
#: the scaling part skips a size whose buffers would take more than this share of the memory
#: the OS reports available when that size starts
MEMORY_FRACTION = 0.5
#: the speed-up over each peer the suite checks for (sampling part)
TARGET_SPEEDUP = 5.0
#: the most marlbuf's time per batch may grow from the smallest to the largest stored size
TARGET_FLAT = 1.3
#: episode mixes of the memory part: name -> (shortest, longest) episode length
EPISODE_MIXES: dict[str, tuple[int, int]] = {"length 25": (25, 25), "mixed 5-25": (5, 25)}

QUICK: dict[str, Any] = {
    "workload": Workload("cooperative_navigation", 6),
    "capacity": 20_000,
    "repeats": 3,
    "scaling_workload": Workload("cooperative_navigation", 3),
    "scaling": [10_000, 40_000],
    "memory_capacity": 5_000,
}
FULL: dict[str, Any] = {
    "workload": Workload("cooperative_navigation", 6),
    "capacity": 1_000_000,
    "repeats": 25,
    "scaling_workload": Workload("cooperative_navigation", 3),
    "scaling": [100_000, 1_000_000, 10_000_000],
    "memory_capacity": 100_000,
}


# ------------------------------------------------------------------------------- builders
def _sequence_sampler(burn_in: int) -> Any:
    """marlbuf's ``Sequence(length=LENGTH, burn_in=burn_in)`` (ImportError where absent)."""
    from marlbuf.samplers import Sequence  # type: ignore[attr-defined,unused-ignore]

    return Sequence(length=LENGTH, burn_in=burn_in)


def _marlbuf_sequences(
    specs: dict[str, AgentSpec], capacity: int, burn_in: int, **options: Any
) -> MultiAgentReplayBuffer:
    """The marlbuf case: ``MultiAgentReplayBuffer(specs, capacity, sampler=Sequence(...),
    seed=0, **options)``."""
    return MultiAgentReplayBuffer(
        specs, capacity, sampler=_sequence_sampler(burn_in), seed=0, **options
    )


def _chunks(
    specs: dict[str, AgentSpec], steps: int, seed: int, pool_size: int | None = None
) -> Any:
    """``(first_step, data)`` chunks of 25-step episode streams covering ``steps`` steps.
    With ``pool_size``, only that many chunks are generated and then repeated (1e7 distinct
    random steps would dominate the run; the sampled bytes do not matter)."""
    rng = np.random.default_rng(seed)
    pool: list[dict[str, dict[str, np.ndarray]]] = []
    for position, first in enumerate(range(0, steps, FILL_CHUNK)):
        count = min(FILL_CHUNK, steps - first)
        if pool_size is None or len(pool) < pool_size:
            data = episode_steps(specs, FILL_CHUNK, rng, EPISODE_LENGTH, first=first)
            if pool_size is not None:
                pool.append(data)
        else:
            data = pool[position % pool_size]
        if count < FILL_CHUNK:
            data = {f: {a: x[:count] for a, x in per.items()} for f, per in data.items()}
        yield first, data


def _torchrl_chunk(data: Mapping[str, Mapping[str, np.ndarray]], first: int) -> Any:
    """One chunk in TorchRL's multi-agent layout (agents stacked under ``"agents"``)."""
    import torch
    from tensordict import TensorDict

    def stacked(field: str) -> Any:
        return torch.from_numpy(np.ascontiguousarray(np.stack(list(data[field].values()), 1)))

    steps = next(iter(data["obs"].values())).shape[0]
    agents = len(data["obs"])
    done = stacked("done") > 0.5  # (steps, agents)
    episode = torch.from_numpy((first + np.arange(steps)) // EPISODE_LENGTH)
    return TensorDict(
        {
            "agents": TensorDict(
                {"observation": stacked("obs"), "action": stacked("action")},
                batch_size=[steps, agents],
            ),
            "episode": episode,
            "next": TensorDict(
                {
                    "agents": TensorDict(
                        {
                            "observation": stacked("next_obs"),
                            "reward": stacked("reward").unsqueeze(-1),
                            "done": done.unsqueeze(-1),
                        },
                        batch_size=[steps, agents],
                    ),
                    "done": done.all(dim=1, keepdim=True),
                },
                batch_size=[steps],
            ),
        },
        batch_size=[steps],
    )


def _torchrl_slicer(length: int, pad: bool, cached: bool = False) -> Any:
    from torchrl.data.replay_buffers.samplers import SliceSampler

    return SliceSampler(
        slice_len=length,
        traj_key="episode",
        strict_length=False,
        pad_output=pad,
        cache_values=cached,
    )


def _torchrl_buffers(capacity: int, variants: Mapping[str, tuple[int, bool, bool]]) -> Any:
    """One ``LazyTensorStorage`` and, per variant ``name -> (slice_len, pad_output,
    cache_values)``, a ``TensorDictReplayBuffer`` over it (writes go through the first)."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    storage = LazyTensorStorage(capacity)
    return {
        name: TensorDictReplayBuffer(
            storage=storage, sampler=_torchrl_slicer(length, pad, cached), batch_size=BATCH * length
        )
        for name, (length, pad, cached) in variants.items()
    }


def _torchrl_sample(rb: Any, length: int, pad: bool) -> Callable[[], Any]:
    if not pad:
        return rb.sample  # a ragged [sum of slice lengths] batch

    def sample() -> Any:
        return rb.sample().view(BATCH, length)  # (B, L), mask at ("collector", "mask")

    return sample


def _try(factory: Callable[[], Any], skipped: dict[str, str], name: str) -> Any:
    """``factory()``, or None with the reason recorded (a peer not installed, an API not in
    this build)."""
    try:
        return factory()
    except Exception as exc:
        skipped[name] = f"{type(exc).__name__}: {exc}"
        return None


def _torchrl_bytes_per_step(workload: Workload, half: bool) -> float:
    """Bytes TorchRL's storage holds per step for this workload (measured on a small chunk)."""
    specs = half_specs(workload.specs()) if half else workload.specs()
    data = episode_steps(specs, EPISODE_LENGTH, np.random.default_rng(0))
    if half:
        data = _as_half(data)
    td = _torchrl_chunk(data, 0)
    return sum(t.numel() * t.element_size() for t in td.values(True, True)) / EPISODE_LENGTH


def _as_half(data: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
    """Observations and next observations as float16 (the values are exact in float16)."""
    return {
        f: {a: x.astype(np.float16) if f in ("obs", "next_obs") else x for a, x in per.items()}
        for f, per in data.items()
    }


# ------------------------------------------------------------------------------- sampling
def _sampling(cfg: dict[str, Any], progress: bool) -> tuple[list[dict[str, Any]], dict[str, str]]:
    workload: Workload = cfg["workload"]
    specs = workload.specs()
    capacity = int(cfg["capacity"])
    skipped: dict[str, str] = {}
    lengths = {0: LENGTH, BURN_IN: BURN_IN + LENGTH}  # burn-in -> steps per sequence
    ours = {
        k: _try(
            partial(_marlbuf_sequences, specs, capacity, k),
            skipped,
            f"marlbuf Sequence(burn_in={k})",
        )
        for k in lengths
    }
    variants = {f"torchrl_pad/L={L}": (L, True, False) for L in lengths.values()} | {
        f"torchrl_ragged/L={L}": (L, False, False) for L in lengths.values()
    }
    variants |= {f"torchrl_pad_cached/L={L}": (L, True, True) for L in lengths.values()}
    torchrl = _try(lambda: _torchrl_buffers(capacity, variants), skipped, "torchrl")
    if torchrl is not None:
        import torch

        torch.manual_seed(0)
    agent_field = PaddedField  # per-agent fields of the padded layout
    first_spec = next(iter(specs.values()))
    padded = PaddedEpisodeBuffer(
        {
            "obs": agent_field(first_spec.obs_shape),
            "action": agent_field(first_spec.action_shape),
            "reward": agent_field(()),
        },
        n_agents=len(specs),
        n_episodes=capacity // EPISODE_LENGTH,
        max_t=EPISODE_LENGTH,
        seed=0,
    )
    if progress:
        print(f"[sequences] {workload.label}: filling {capacity:,} steps ...", flush=True)
    for first, data in _chunks(specs, capacity, seed=0):
        for buf in ours.values():
            if buf is not None:
                buf.extend(**data)
        if torchrl is not None:
            next(iter(torchrl.values())).extend(_torchrl_chunk(data, first))
        episodes = from_stream(data, EPISODE_LENGTH)
        count = len(episodes["obs"])
        padded.insert_episode_batch(episodes, np.full(count, EPISODE_LENGTH))
        del data, episodes
    fns: dict[str, Callable[[], Any]] = {}
    case_info: dict[str, tuple[int, str]] = {}  # case -> (burn-in, peer kind)
    for burn_in, L in lengths.items():
        buf = ours[burn_in]
        if buf is not None:
            fns[f"marlbuf/L={L}"] = partial(buf.sample, BATCH)
            case_info[f"marlbuf/L={L}"] = (burn_in, "marlbuf")
        if torchrl is not None:
            for name, (length, pad, _) in variants.items():
                if length == L:
                    fns[name] = _torchrl_sample(torchrl[name], length, pad)
                    case_info[name] = (burn_in, name.split("/")[0])
        if buf is not None and burn_in == 0:
            fns[f"gather_runs/L={L}"] = _gather_runs(buf, L)
            case_info[f"gather_runs/L={L}"] = (burn_in, "gather_runs")
        fns[f"padded_episodes/L={L}"] = partial(padded.sample_sequences, BATCH, L)
        case_info[f"padded_episodes/L={L}"] = (burn_in, "padded_episodes")
    fns["padded_episodes_whole"] = partial(padded.sample_episodes, BATCH)
    case_info["padded_episodes_whole"] = (0, "padded_episodes_whole")
    _check_outputs(fns, case_info)
    timings = time_interleaved(fns, repeats=cfg["repeats"], warmup=2, rotate=True)
    rows = []
    for case, t in timings.items():
        burn_in, kind = case_info[case]
        L = lengths[burn_in] if kind != "padded_episodes_whole" else EPISODE_LENGTH + 1
        ref = f"marlbuf/L={lengths[burn_in]}"
        rows.append(
            {
                "part": "sampling",
                "workload": workload.label,
                "capacity": capacity,
                "case": case,
                "peer": kind,
                "burn_in": burn_in if kind in ("marlbuf", "padded_episodes") else 0,
                "steps_per_sequence": L,
                "ms_median": 1e3 * t["median"],
                "ms_min": 1e3 * t["min"],
                "ms_max": 1e3 * t["max"],
                "first_call_ms": 1e3 * t["first_call"],
                "time_vs_marlbuf": (
                    t["median"] / timings[ref]["median"] if ref in timings else None
                ),
            }
        )
    if progress:
        print(
            "[sequences] sampling: "
            + ", ".join(f"{k} {1e3 * v['median']:.2f} ms" for k, v in timings.items()),
            flush=True,
        )
    del ours, torchrl, padded, fns
    gc.collect()
    return rows, skipped


def _gather_runs(buf: MultiAgentReplayBuffer, length: int) -> Callable[[], Any]:
    """The yardstick: ``buf.gather`` of B runs of ``length`` consecutive slots at random starts
    (the rows a sequence batch reads, without episodes, masks or reshaping)."""
    rng = np.random.default_rng(1)
    steps = np.arange(length)

    def gather() -> Any:
        starts = rng.integers(0, len(buf) - length + 1, BATCH)
        return buf.gather((starts[:, None] + steps).reshape(-1))

    return gather


def _check_outputs(fns: Mapping[str, Callable[[], Any]], info: Mapping[str, Any]) -> None:
    """One call of every case, checking that it returns B sequences of the intended length
    (so the timed cases are the intended ones)."""
    for case, fn in fns.items():
        out = fn()
        if case.startswith("marlbuf"):
            mask = np.asarray(out.mask)
            want = int(case.split("=")[1])
            if mask.shape != (BATCH, want):
                raise RuntimeError(f"{case}: mask of shape {mask.shape}, expected {(BATCH, want)}")
        elif case.startswith("torchrl_pad"):
            if tuple(out.batch_size) != (BATCH, int(case.split("=")[1])):
                raise RuntimeError(f"{case}: batch of shape {tuple(out.batch_size)}")
        elif case.startswith("padded_episodes/"):
            if out["mask"].shape != (BATCH, int(case.split("=")[1])):
                raise RuntimeError(f"{case}: mask of shape {out['mask'].shape}")
        del out


# -------------------------------------------------------------------------------- scaling
def _scaling(cfg: dict[str, Any], progress: bool) -> tuple[list[dict[str, Any]], dict[str, str]]:
    workload: Workload = cfg["scaling_workload"]
    specs = half_specs(workload.specs())
    skipped: dict[str, str] = {}
    torchrl_step = _torchrl_bytes_per_step(workload, half=True)
    rows = []
    for capacity in cfg["scaling"]:
        gc.collect()
        ours_bytes = estimate(specs, capacity, **_sequence_estimate()).total_bytes
        theirs_bytes = int(torchrl_step * capacity)
        available = available_memory_bytes()
        record = {
            "part": "scaling",
            "workload": workload.label + " float16 obs",
            "capacity": capacity,
            "marlbuf_estimate_GiB": ours_bytes / GIB,
            "torchrl_storage_GiB": theirs_bytes / GIB,
            "available_GiB": None if available is None else available / GIB,
        }
        if available is not None and ours_bytes + theirs_bytes > MEMORY_FRACTION * available:
            reason = (
                f"capacity {capacity:,}: marlbuf {ours_bytes / GIB:.2f} GiB + TorchRL "
                f"{theirs_bytes / GIB:.2f} GiB exceed {MEMORY_FRACTION:.0%} of the "
                f"{available / GIB:.1f} GiB available"
            )
            skipped[f"scaling {capacity:,}"] = reason
            if progress:
                print(f"[sequences] skipped: {reason}", flush=True)
            continue
        if progress:
            print(
                f"[sequences] scaling {capacity:,}: marlbuf {ours_bytes / GIB:.2f} GiB, "
                f"TorchRL {theirs_bytes / GIB:.2f} GiB, {record['available_GiB'] or 0:.1f} GiB "
                "available; filling ...",
                flush=True,
            )
        buf = _try(
            partial(_marlbuf_sequences, specs, capacity, 0, batch_dtype="storage"),
            skipped,
            f"marlbuf Sequence {capacity:,}",
        )
        torchrl = _try(
            partial(_torchrl_buffers, capacity, {"torchrl": (LENGTH, True, False)}),
            skipped,
            f"torchrl {capacity:,}",
        )
        if torchrl is not None:
            import torch

            torch.manual_seed(0)
        for first, data in _chunks(workload.specs(), capacity, seed=1, pool_size=4):
            if buf is not None:
                buf.extend(**data)
            if torchrl is not None:
                torchrl["torchrl"].extend(_torchrl_chunk(_as_half(data), first))
        # each library in its own interleaved loop: TorchRL's per-call boundary scan sweeps
        # O(stored steps) of memory, which would evict marlbuf's caches and TLB between its
        # calls and make marlbuf's time grow with TorchRL's scan rather than its own work
        loops: list[dict[str, Callable[[], Any]]] = []
        if buf is not None:
            loops.append(
                {"marlbuf": partial(buf.sample, BATCH), "gather_runs": _gather_runs(buf, LENGTH)}
            )
        if torchrl is not None:
            loops.append({"torchrl_pad": _torchrl_sample(torchrl["torchrl"], LENGTH, True)})
        timings: dict[str, dict[str, Any]] = {}
        for fns in loops:
            timings |= time_interleaved(fns, repeats=cfg["repeats"], warmup=2, rotate=True)
        for case, t in timings.items():
            rows.append(
                record
                | {
                    "case": case,
                    "ms_median": 1e3 * t["median"],
                    "ms_min": 1e3 * t["min"],
                    "ms_max": 1e3 * t["max"],
                }
            )
        if progress:
            print(
                f"[sequences] scaling {capacity:,}: "
                + ", ".join(f"{k} {1e3 * v['median']:.2f} ms" for k, v in timings.items()),
                flush=True,
            )
        del buf, torchrl, loops
        gc.collect()
    smallest: dict[str, tuple[float, float]] = {}
    for row in rows:  # time relative to the smallest stored size measured (median, min)
        smallest.setdefault(row["case"], (row["ms_median"], row["ms_min"]))
        row["time_vs_smallest"] = row["ms_median"] / smallest[row["case"]][0]
        row["min_vs_smallest"] = row["ms_min"] / smallest[row["case"]][1]
    return rows, skipped


# --------------------------------------------------------------------------------- memory
def _episode_lengths(mix: tuple[int, int], steps: int, rng: np.random.Generator) -> np.ndarray:
    """Episode lengths of one mix adding up to exactly ``steps``."""
    low, high = mix
    lengths = rng.integers(low, high + 1, size=steps // low + 1)
    cut = int(np.searchsorted(np.cumsum(lengths), steps))
    lengths = lengths[: cut + 1].copy()
    lengths[-1] -= int(lengths.sum()) - steps
    if lengths[-1] < 1:
        lengths = lengths[:-1]
        lengths[-1] += steps - int(lengths.sum())
    return lengths


def _memory_stream(
    specs: dict[str, AgentSpec], lengths: np.ndarray, state_dim: int, rng: np.random.Generator
) -> dict[str, Any]:
    """Steps of episodes with these lengths: per-agent fields (each next_obs the next step's
    obs within an episode), a state, alive masks (an agent dies at a random step of its
    episode, one agent lives to the end), every agent done at the episode's last step."""
    steps = int(lengths.sum())
    ends = np.cumsum(lengths) - 1
    starts = ends - lengths + 1
    done = np.zeros(steps, np.float32)
    done[ends] = 1.0
    step_in_episode = np.arange(steps) - np.repeat(starts, lengths)
    alive = {}
    for i, agent in enumerate(specs):
        death = rng.integers(1, lengths + 1) if i else lengths  # agent 0 lives to the end
        alive[agent] = step_in_episode < np.repeat(death, lengths)
    obs = {a: rng.random((steps, *s.obs_shape), np.float32) for a, s in specs.items()}
    next_obs = {}
    for agent, seen in obs.items():  # the next step's obs, and a terminal obs at episode ends
        following = np.concatenate([seen[1:], seen[:1]])
        following[ends] = rng.random((len(ends), *seen.shape[1:]), np.float32)
        next_obs[agent] = following
    data = {
        "obs": obs,
        "action": {a: rng.random((steps, *s.action_shape), np.float32) for a, s in specs.items()},
        "reward": {a: rng.random(steps, np.float32) for a in specs},
        "next_obs": next_obs,
        "done": {a: done for a in specs},
    }
    return {"data": data, "state": rng.random((steps, state_dim), np.float32), "alive": alive}


def _padded_memory(
    specs: dict[str, AgentSpec], lengths: np.ndarray, state_dim: int
) -> PaddedEpisodeBuffer:
    """A padded-episode buffer holding episodes of these lengths (contents zero: only the
    arrays' sizes matter here)."""
    first = next(iter(specs.values()))
    buf = PaddedEpisodeBuffer(
        {
            "obs": PaddedField(first.obs_shape),
            "action": PaddedField(first.action_shape),
            "reward": PaddedField(()),
            "state": PaddedField((state_dim,), per_agent=False),
        },
        n_agents=len(specs),
        n_episodes=len(lengths),
        max_t=EPISODE_LENGTH,
    )
    episodes = {
        name: np.zeros((len(lengths), *a.shape[1:]), a.dtype) for name, a in buf.data.items()
    }
    buf.insert_episode_batch(episodes, lengths)
    return buf


def _memory(cfg: dict[str, Any], progress: bool) -> tuple[list[dict[str, Any]], dict[str, str]]:
    workload: Workload = cfg["workload"]
    specs = workload.specs()
    state_dim = sum(s.obs_dim for s in specs.values())
    capacity = int(cfg["memory_capacity"])
    skipped: dict[str, str] = {}
    rows = []
    for mix_name, mix in EPISODE_MIXES.items():
        rng = np.random.default_rng(0)
        lengths = _episode_lengths(mix, capacity, rng)
        mean_length = float(lengths.mean())
        padded = _padded_memory(specs, lengths, state_dim)
        padded_per_step = padded.nbytes / capacity
        del padded
        estimated = _try(
            partial(_marlbuf_estimate, specs, capacity, state_dim, round(mean_length)),
            skipped,
            f"marlbuf estimate ({mix_name})",
        )
        measured = _try(
            partial(_marlbuf_measured, specs, capacity, state_dim, lengths, rng),
            skipped,
            f"marlbuf measured ({mix_name})",
        )
        rows.append(
            {
                "part": "memory",
                "workload": workload.label + f" + state({state_dim})",
                "episodes": mix_name,
                "mean_episode_length": mean_length,
                "capacity": capacity,
                "padded_bytes_per_step": padded_per_step,
                "marlbuf_estimate_bytes_per_step": (
                    None if estimated is None else estimated / capacity
                ),
                "marlbuf_measured_bytes_per_step": (
                    None if measured is None else measured / capacity
                ),
            }
        )
        best = measured if measured is not None else estimated
        rows[-1]["marlbuf_vs_padded"] = None if best is None else best / capacity / padded_per_step
        if progress:
            print(f"[sequences] memory {mix_name}: {rows[-1]}", flush=True)
        gc.collect()
    return rows, skipped


def _sequence_estimate() -> dict[str, Any]:
    """``estimate``'s option counting the episode index of the ``Sequence`` sampler, where
    this build's estimate has one."""
    return {"episodes": True} if "episodes" in inspect.signature(estimate).parameters else {}


def _fields_kwargs(state_dim: int) -> dict[str, Any]:
    from marlbuf.spec import FieldSpec  # type: ignore[attr-defined,unused-ignore]

    return {"global_fields": {"state": FieldSpec((state_dim,))}, "alive": True}


def _marlbuf_estimate(
    specs: dict[str, AgentSpec], capacity: int, state_dim: int, episode_length: int
) -> int:
    est = estimate(
        specs,
        capacity,
        episode_length=episode_length,
        **_sequence_estimate(),
        **_fields_kwargs(state_dim),
    )
    return int(est.total_bytes)


def _marlbuf_measured(
    specs: dict[str, AgentSpec],
    capacity: int,
    state_dim: int,
    lengths: np.ndarray,
    rng: np.random.Generator,
) -> int:
    buf = _marlbuf_sequences(specs, capacity, 0, **_fields_kwargs(state_dim))
    stream = _memory_stream(specs, lengths, state_dim, rng)
    per_step: dict[str, Any] = {"state": stream["state"], "alive": stream["alive"]}
    buf.extend(**stream["data"], **per_step)
    return held_bytes(buf)


def held_bytes(buf: MultiAgentReplayBuffer) -> int:
    """Every array the buffer keeps: storage (rows, next-observation links and side table:
    ``buf.nbytes``), write generations, the episode index and the sampler's arrays."""
    total = buf.nbytes + buf.writer.write_generation.nbytes
    episodes = getattr(buf, "episodes", None)
    if episodes is not None:
        total += episodes.nbytes
    parts = [buf.sampler, getattr(buf.sampler, "trees", None)]
    for part in parts:
        if part is not None:
            total += sum(v.nbytes for v in vars(part).values() if isinstance(v, np.ndarray))
    return int(total)


# -------------------------------------------------------------------------------- summary
def _summary(
    sampling: list[dict[str, Any]],
    scaling: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    skipped: dict[str, str],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for burn_in in (0, BURN_IN):
        L = LENGTH + burn_in
        by_case = {r["case"]: r for r in sampling if r["steps_per_sequence"] == L}
        if f"marlbuf/L={L}" not in by_case:
            out[f"sampling burn_in={burn_in}"] = "marlbuf not measured (see skipped)"
            continue
        speedups = {
            case.split("/")[0]: round(r["time_vs_marlbuf"], 3)
            for case, r in by_case.items()
            if not case.startswith(("marlbuf", "gather_runs"))
        }
        ours_min = by_case[f"marlbuf/L={L}"]["ms_min"]
        out[f"sampling burn_in={burn_in}"] = {
            "marlbuf_ms": round(by_case[f"marlbuf/L={L}"]["ms_median"], 3),
            "marlbuf_speedup_over": speedups,
            "marlbuf_speedup_over_of_min": {
                case.split("/")[0]: round(r["ms_min"] / ours_min, 3)
                for case, r in by_case.items()
                if not case.startswith(("marlbuf", "gather_runs"))
            },
            f"target_{TARGET_SPEEDUP:g}x_met": {
                k: v >= TARGET_SPEEDUP for k, v in speedups.items()
            },
        }
        if f"gather_runs/L={L}" in by_case:  # the bare gather of as many rows: the yardstick
            out[f"sampling burn_in={burn_in}"]["marlbuf_time_vs_bare_gather_of_runs"] = round(
                1 / by_case[f"gather_runs/L={L}"]["time_vs_marlbuf"], 3
            )
    growth: dict[str, Any] = {}
    for case in dict.fromkeys(r["case"] for r in scaling):
        by_size = {r["capacity"]: r["ms_median"] for r in scaling if r["case"] == case}
        sizes = sorted(by_size)
        fastest = {r["capacity"]: r["ms_min"] for r in scaling if r["case"] == case}
        growth[case] = {
            "ms_by_stored_steps": {f"{s:.0e}": round(by_size[s], 3) for s in sizes},
            "largest_vs_smallest": round(by_size[sizes[-1]] / by_size[sizes[0]], 3),
            # the fastest repeat: on a shared machine the least disturbed estimate
            "largest_vs_smallest_of_min": round(fastest[sizes[-1]] / fastest[sizes[0]], 3),
        }
    if "marlbuf" in growth:
        growth[f"marlbuf_flat_within_{TARGET_FLAT:g}x"] = (
            growth["marlbuf"]["largest_vs_smallest"] <= TARGET_FLAT
        )
    out["scaling"] = growth
    out["memory"] = {}
    for r in memory:
        ours = r["marlbuf_measured_bytes_per_step"] or r["marlbuf_estimate_bytes_per_step"]
        out["memory"][r["episodes"]] = {
            "marlbuf_bytes_per_step": None if ours is None else round(ours, 1),
            "marlbuf_source": (
                "measured buffer"
                if r["marlbuf_measured_bytes_per_step"]
                else ("estimate" if ours else "not available (see skipped)")
            ),
            "padded_bytes_per_step": round(r["padded_bytes_per_step"], 1),
            "marlbuf_vs_padded": (
                None if r["marlbuf_vs_padded"] is None else round(r["marlbuf_vs_padded"], 3)
            ),
        }
    out["skipped"] = skipped
    return out


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    load_before = os.getloadavg()  # the machine may be shared: recorded with the results
    sampling, skipped = _sampling(cfg, progress)
    scaling, skip = _scaling(cfg, progress)
    skipped |= skip
    memory, skip = _memory(cfg, progress)
    skipped |= skip
    rows = sampling + scaling + memory
    return {
        "config": {
            "batch_size": BATCH,
            "length": LENGTH,
            "burn_in_case": BURN_IN,
            "episode_length": EPISODE_LENGTH,
            "workload": cfg["workload"].label,
            "capacity": cfg["capacity"],
            "scaling_workload": cfg["scaling_workload"].label + " float16 obs",
            "scaling": cfg["scaling"],
            "memory_capacity": cfg["memory_capacity"],
            "repeats": cfg["repeats"],
            "threads": threads,
            "load_average_1_5_15_min_before": [round(x, 2) for x in load_before],
            "load_average_1_5_15_min_after": [round(x, 2) for x in os.getloadavg()],
        },
        "rows": rows,
        "summary": _summary(sampling, scaling, memory, skipped),
        "markdown": "\n\n".join(
            markdown_table(part_rows, columns)
            for part_rows, columns in (
                (
                    sampling,
                    ["case", "steps_per_sequence", "ms_median", "ms_min", "time_vs_marlbuf"],
                ),
                (
                    scaling,
                    [
                        "workload",
                        "capacity",
                        "case",
                        "ms_median",
                        "ms_min",
                        "time_vs_smallest",
                        "min_vs_smallest",
                    ],
                ),
                (
                    memory,
                    [
                        "episodes",
                        "mean_episode_length",
                        "marlbuf_estimate_bytes_per_step",
                        "marlbuf_measured_bytes_per_step",
                        "padded_bytes_per_step",
                        "marlbuf_vs_padded",
                    ],
                ),
            )
            if part_rows
        ),
    }
