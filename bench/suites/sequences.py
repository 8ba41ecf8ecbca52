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
  - ``padded_episodes`` (:mod:`marlbuf.bench.baselines.padded_episodes`, EPyMARL's ``EpisodeBatch``
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
* **Episodes** — whole-episode replay as EPyMARL's learners use it: ``sample(32)`` of 32
  distinct whole episodes out of ``episodes_stored`` (5,000 in the full run), cooperative
  navigation with 3 and 12 agents plus a global state (all observations: EPyMARL's MPE state),
  episodes of 25 steps and of mixed lengths (uniform in 5..25):

  - ``marlbuf``: ``MultiAgentReplayBuffer(specs, capacity=the rows of those episodes,
    sampler=Episodes(), next_obs="none", global_fields={"state": ..., "terminated": uint8})``,
    each episode written by one ``extend`` as EPyMARL keeps it (the mapping of
    docs/migrating.md's "Or use the buffer directly"): ``length + 1`` rows, the last holding
    the observation after the last transition, ``terminated`` at the last transition, the
    episode closed by ``truncated``;
    ``sample(32, fields=("obs", "action", "reward", "state", "terminated"))`` (what an
    EPyMARL learner reads) returns an ``EpisodeBatch`` of those fields padded to the batch's
    longest episode (``marlbuf_torch``: the same, then ``to_torch()``, CPU tensors sharing
    its memory);
  - ``padded_torch`` (:class:`marlbuf.bench.baselines.padded_episodes.TorchPaddedEpisodeBuffer`):
    the EPyMARL layout in torch tensors (obs, action and reward per agent, the state, ``terminated``
    and ``filled``, every episode padded to ``max_t + 1 = 26`` steps), ``sample_episodes(32)``
    indexing every tensor with 32 distinct episode slots.

  Also timed: inserting one episode (marlbuf: ``extend`` of its steps; padded: writing the
  runner's padded episode, every field and step), and the bytes per stored step (marlbuf:
  every array the buffer keeps, over its capacity; padded: the tensors over the real
  transitions they hold).
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.baselines.padded_episodes import (
    PaddedEpisodeBuffer,
    PaddedField,
    TorchPaddedEpisodeBuffer,
    from_stream,
)
from marlbuf.bench.suites.memory import half_specs
from marlbuf.bench.tools.common import markdown_table, quiet_threads, time_interleaved
from marlbuf.memory import GIB, estimate
from marlbuf.storage import available_memory_bytes
from marlbuf.workloads import Workload, episode_steps

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
#: whole episodes per draw in the episodes part (EPyMARL's default batch_size)
EPISODE_BATCH = 32
#: targets of the episodes part: padded time / marlbuf time per mix, marlbuf bytes per step /
#: padded bytes per step with mixed lengths, marlbuf insert time / padded insert time
EPISODE_TARGETS: dict[str, float] = {
    "sample_speedup length 25": 1.5,
    "sample_speedup mixed 5-25": 2.0,
    "memory_vs_padded mixed 5-25": 0.7,
    "insert_vs_padded": 1.0,
}
#: episodes generated once per workload and written again and again (the bytes do not matter)
EPISODE_POOL = 16

QUICK: dict[str, Any] = {
    "workload": Workload("cooperative_navigation", 6),
    "capacity": 20_000,
    "repeats": 3,
    "scaling_workload": Workload("cooperative_navigation", 3),
    "scaling": [10_000, 40_000],
    "memory_capacity": 5_000,
    "episode_workloads": [Workload("cooperative_navigation", 3)],
    "episodes_stored": 200,
    "episode_repeats": 5,
}
FULL: dict[str, Any] = {
    "workload": Workload("cooperative_navigation", 6),
    "capacity": 1_000_000,
    "repeats": 25,
    "scaling_workload": Workload("cooperative_navigation", 3),
    "scaling": [100_000, 1_000_000, 10_000_000],
    "memory_capacity": 100_000,
    "episode_workloads": [
        Workload("cooperative_navigation", 3),
        Workload("cooperative_navigation", 12),
    ],
    "episodes_stored": 5_000,
    "episode_repeats": 200,
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
            row = rows[-1]

            def per_step(value: Any) -> str:
                return "not measured" if value is None else f"{float(value):,.0f} bytes/step"

            ratio = row["marlbuf_vs_padded"]
            print(
                f"[sequences] memory {mix_name} (mean episode {mean_length:.1f} steps): marlbuf "
                f"{per_step(row['marlbuf_measured_bytes_per_step'])} measured, "
                f"{per_step(row['marlbuf_estimate_bytes_per_step'])} estimated; padded "
                f"episodes {per_step(padded_per_step)}"
                + ("" if ratio is None else f" ({ratio:.2f}x)"),
                flush=True,
            )
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


# ------------------------------------------------------------------------------- episodes
def _episode_pool(
    specs: dict[str, AgentSpec], state_dim: int, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """:data:`EPISODE_POOL` episodes of ``EPISODE_LENGTH`` steps: per agent an observation
    chain of ``EPISODE_LENGTH + 1`` rows (obs, then next_obs one row later), actions, rewards,
    and a state chain (the observations side by side)."""
    pool = []
    for _ in range(EPISODE_POOL):
        chain = {
            a: rng.random((EPISODE_LENGTH + 1, *s.obs_shape), np.float32) for a, s in specs.items()
        }
        state = np.concatenate([c.reshape(EPISODE_LENGTH + 1, -1) for c in chain.values()], 1)
        pool.append(
            {
                "chain": chain,
                "state": state[:, :state_dim],
                "action": {
                    a: rng.random((EPISODE_LENGTH + 1, *s.action_shape), np.float32)
                    for a, s in specs.items()
                },
                "reward": {a: rng.random(EPISODE_LENGTH + 1, np.float32) for a in specs},
            }
        )
    return pool


def _marlbuf_episode(episode: Mapping[str, Any], length: int) -> dict[str, Any]:
    """``extend`` keywords of a pool episode of ``length`` transitions as EPyMARL keeps it:
    ``length + 1`` rows (the last holds the observation and state after the last transition),
    no next_obs, ``terminated`` (a global flag) at the last transition, and the episode closed
    by ``truncated`` on its last row (``done`` stays 0: it would end the episode one row
    early)."""
    rows = length + 1
    terminated = np.zeros(rows, np.uint8)
    terminated[length - 1] = 1
    truncated = np.zeros(rows, bool)
    truncated[-1] = True
    chain = episode["chain"]
    return {
        "obs": {a: c[:rows] for a, c in chain.items()},
        "action": {a: x[:rows] for a, x in episode["action"].items()},
        "reward": {a: x[:rows] for a, x in episode["reward"].items()},
        "done": {a: np.zeros(rows, np.uint8) for a in chain},
        "state": episode["state"][:rows],
        "terminated": terminated,
        "truncated": truncated,
    }


def _padded_episode(
    buf: TorchPaddedEpisodeBuffer, episode: Mapping[str, Any], length: int
) -> dict[str, Any]:
    """A pool episode as a runner's padded batch of one (agents stacked)."""

    def stacked(per_agent: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.stack(list(per_agent.values()), axis=1)

    return buf.pad(
        {
            "obs": stacked(episode["chain"]),
            "action": stacked(episode["action"]),
            "reward": stacked(episode["reward"]),
            "state": episode["state"],
        },
        length,
    )


def _episode_buffers(
    specs: dict[str, AgentSpec], state_dim: int, lengths: np.ndarray
) -> tuple[MultiAgentReplayBuffer, TorchPaddedEpisodeBuffer]:
    from marlbuf.samplers import Episodes  # type: ignore[attr-defined,unused-ignore]
    from marlbuf.spec import FieldSpec  # type: ignore[attr-defined,unused-ignore]

    first = next(iter(specs.values()))
    # done as one byte per agent (EPyMARL keeps none)
    byte_done = {a: dataclasses.replace(s, done_dtype=np.uint8) for a, s in specs.items()}
    ours = MultiAgentReplayBuffer(
        byte_done,
        int(lengths.sum() + lengths.shape[0]),  # every episode's rows, the last obs included
        sampler=Episodes(),
        seed=0,
        next_obs="none",
        global_fields={"state": FieldSpec((state_dim,)), "terminated": FieldSpec((), np.uint8)},
    )
    padded = TorchPaddedEpisodeBuffer(
        {
            "obs": PaddedField(first.obs_shape),
            "action": PaddedField(first.action_shape),
            "reward": PaddedField(()),
            "state": PaddedField((state_dim,), per_agent=False),
        },
        n_agents=len(specs),
        n_episodes=len(lengths),
        max_t=EPISODE_LENGTH,
        seed=0,
    )
    return ours, padded


def _episodes(cfg: dict[str, Any], progress: bool) -> tuple[list[dict[str, Any]], dict[str, str]]:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return [], {"episodes": f"needs torch ([algos] extra): {exc}"}
    rows: list[dict[str, Any]] = []
    for workload in cfg["episode_workloads"]:
        for mix_name in EPISODE_MIXES:
            rows += _episode_case(workload, mix_name, cfg, progress)
            gc.collect()
    return rows, {}


def _cycle(call: Callable[[Any], Any], items: list[Any]) -> Callable[[], None]:
    """A zero-argument callable that calls ``call`` on the next of ``items`` each time."""
    position = [0]

    def step() -> None:
        position[0] = (position[0] + 1) % len(items)
        call(items[position[0]])

    return step


#: what an EPyMARL learner reads of an episode batch: the marlbuf cases of the episodes part
#: gather these only (``fields=``: not the per-agent ``done``, which EPyMARL does not keep)
EPISODE_FIELDS = ("obs", "action", "reward", "state", "terminated")


def _sample_to_torch(buf: MultiAgentReplayBuffer, batch_size: int) -> Any:
    return buf.sample(batch_size, fields=EPISODE_FIELDS).to_torch()


def _episode_case(
    workload: Workload, mix_name: str, cfg: dict[str, Any], progress: bool
) -> list[dict[str, Any]]:
    """The episodes part for one workload and episode mix (see the module notes)."""
    specs = workload.specs()
    state_dim = sum(s.obs_dim for s in specs.values())
    count = int(cfg["episodes_stored"])
    low, high = EPISODE_MIXES[mix_name]
    rng = np.random.default_rng(0)
    lengths = rng.integers(low, high + 1, size=count)
    pool = _episode_pool(specs, state_dim, rng)
    ours, padded = _episode_buffers(specs, state_dim, lengths)
    pads: dict[tuple[int, int], dict[str, Any]] = {}  # (pool episode, length) -> padded batch
    for e, length in enumerate(lengths.tolist()):
        episode = pool[e % EPISODE_POOL]
        ours.extend(**_marlbuf_episode(episode, length))
        key = (e % EPISODE_POOL, length)
        if key not in pads:
            pads[key] = _padded_episode(padded, episode, length)
        padded.insert_episode_batch(pads[key])
    if ours.complete_episodes != count:
        raise RuntimeError(f"marlbuf holds {ours.complete_episodes} complete episodes, not {count}")
    # bytes per stored transition, for both (marlbuf also holds each episode's last obs row)
    ours_bytes = held_bytes(ours) / int(lengths.sum())
    padded_bytes = padded.nbytes / int(lengths.sum())
    # both buffers insert the same episodes, cycling through lengths of the mix
    chosen = list(enumerate(lengths[: 4 * EPISODE_POOL].tolist()))
    fns: dict[str, Callable[[], Any]] = {
        "marlbuf": partial(ours.sample, EPISODE_BATCH, fields=EPISODE_FIELDS),
        "marlbuf_torch": partial(_sample_to_torch, ours, EPISODE_BATCH),
        "padded_torch": partial(padded.sample_episodes, EPISODE_BATCH),
        "insert/marlbuf": _cycle(
            lambda kwargs: ours.extend(**kwargs),
            [_marlbuf_episode(pool[e % EPISODE_POOL], n) for e, n in chosen],
        ),
        "insert/padded_torch": _cycle(
            padded.insert_episode_batch, [pads[(e % EPISODE_POOL, n)] for e, n in chosen]
        ),
    }
    timings = time_interleaved(fns, repeats=cfg["episode_repeats"], warmup=3, rotate=True)
    rows = []
    for case, t in timings.items():
        insert = case.startswith("insert/")
        ref = "insert/marlbuf" if insert else "marlbuf"
        rows.append(
            {
                "part": "episodes",
                "workload": workload.label + f" + state({state_dim})",
                "episodes": mix_name,
                "episodes_stored": count,
                "mean_episode_length": float(lengths.mean()),
                "case": case,
                "measure": "insert one episode" if insert else f"sample({EPISODE_BATCH})",
                "ms_median": 1e3 * t["median"],
                "ms_min": 1e3 * t["min"],
                "first_call_ms": 1e3 * t["first_call"],
                "time_vs_marlbuf": t["median"] / timings[ref]["median"],
                "marlbuf_bytes_per_step": ours_bytes,
                "padded_bytes_per_step": padded_bytes,
                "marlbuf_vs_padded_bytes": ours_bytes / padded_bytes,
            }
        )
    if progress:
        print(
            f"[sequences] episodes {workload.label} {mix_name}: "
            + ", ".join(f"{k} {1e3 * v['median']:.3f} ms" for k, v in timings.items())
            + f"; bytes/step {ours_bytes:.0f} vs {padded_bytes:.0f}",
            flush=True,
        )
    return rows


def _episodes_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload and mix: marlbuf's speed-ups over the padded torch buffer (sampling and
    inserting), its bytes per step against the padded layout's, and the targets met."""
    out: dict[str, Any] = {}
    for row in rows:
        if row["case"] != "padded_torch" and row["case"] != "insert/padded_torch":
            continue
        entry = out.setdefault(f"{row['workload']} {row['episodes']}", {})
        mix = row["episodes"]
        if row["case"] == "padded_torch":
            entry["sample_speedup_over_padded_torch"] = round(row["time_vs_marlbuf"], 3)
            target = EPISODE_TARGETS[f"sample_speedup {mix}"]
            entry[f"sample_target_{target:g}x_met"] = row["time_vs_marlbuf"] >= target
            entry["marlbuf_bytes_per_step"] = round(row["marlbuf_bytes_per_step"], 1)
            entry["padded_bytes_per_step"] = round(row["padded_bytes_per_step"], 1)
            entry["marlbuf_vs_padded_bytes"] = round(row["marlbuf_vs_padded_bytes"], 3)
            key = f"memory_vs_padded {mix}"
            if key in EPISODE_TARGETS:
                limit = EPISODE_TARGETS[key]
                entry[f"memory_target_{limit:g}x_met"] = row["marlbuf_vs_padded_bytes"] <= limit
        else:
            speedup = row["time_vs_marlbuf"]  # padded insert time / marlbuf insert time
            entry["insert_speedup_over_padded_torch"] = round(speedup, 3)
            entry["insert_no_slower_met"] = speedup >= EPISODE_TARGETS["insert_vs_padded"]
    return out


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


#: the suite's parts, in the order they run
PARTS = ("sampling", "scaling", "memory", "episodes")


def run(
    quick: bool = False, progress: bool = True, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    """Run the suite (``parts``: a subset of :data:`PARTS`, e.g. ``("episodes",)``)."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"parts must be among {PARTS}; got {sorted(unknown)}")
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    load_before = os.getloadavg()  # the machine may be shared: recorded with the results
    skipped: dict[str, str] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    for name, part in (
        ("sampling", _sampling),
        ("scaling", _scaling),
        ("memory", _memory),
        ("episodes", _episodes),
    ):
        results[name] = []
        if name in parts:
            results[name], skip = part(cfg, progress)
            skipped |= skip
    sampling, scaling, memory = results["sampling"], results["scaling"], results["memory"]
    episodes = results["episodes"]
    rows = sampling + scaling + memory + episodes
    summary = _summary(sampling, scaling, memory, skipped)
    summary["episodes"] = _episodes_summary(episodes)
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
            "parts": list(parts),
            "episode_workloads": [w.label for w in cfg["episode_workloads"]],
            "episodes_stored": cfg["episodes_stored"],
            "episode_batch": EPISODE_BATCH,
            "episode_repeats": cfg["episode_repeats"],
            "threads": threads,
            "load_average_1_5_15_min_before": [round(x, 2) for x in load_before],
            "load_average_1_5_15_min_after": [round(x, 2) for x in os.getloadavg()],
        },
        "rows": rows,
        "summary": summary,
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
                (
                    episodes,
                    [
                        "workload",
                        "episodes",
                        "measure",
                        "case",
                        "ms_median",
                        "ms_min",
                        "time_vs_marlbuf",
                        "marlbuf_vs_padded_bytes",
                    ],
                ),
            )
            if part_rows
        ),
    }
