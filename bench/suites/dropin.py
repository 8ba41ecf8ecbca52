"""Drop-in, end to end: three codebases with their own buffer and with marlbuf swapped in,
driven by a real environment.

The consumers (:mod:`marlbuf.bench.baselines.consumers`) are complete PyTorch training loops written
the way three popular kinds of codebase write them. marlbuf enters each as a user would swap it in,
with the library's defaults (no tuning options; a case that exists for a tuning option is labelled
so in column ``buffer``):

* **per_agent** — MADDPG with one buffer object per agent (``buffers[i].add(obs[a], act[a],
  rew[a], next_obs[a], term[a])`` every step; a trainer draws ``np.random.choice(len, B,
  replace=False)`` and reads every agent's buffer with ``sample_index``). Case ``marlbuf``:
  :func:`marlbuf.compat.maddpg.make_buffers` with ``Uniform(replace=False)`` and float32
  fields.
* **joint** — MADDPG with one ``push(obs, act, rew, next_obs, term)`` / ``sample(B)`` buffer
  returning per-agent tensor lists with normalised rewards. Case ``marlbuf``: ``push`` is
  ``MultiAgentReplayBuffer.add`` of the env's dicts, ``sample`` is ``sample(B)`` +
  ``Batch.as_lists()`` + ``torch.from_numpy``; case ``marlbuf_per_agent_batches`` adds the
  tuning option ``batch_layout="per_agent"``.
* **epymarl** — EPyMARL's QMIX pipeline (:mod:`marlbuf.bench.baselines.consumers.epymarl`: episode
  runner, padded ``EpisodeBatch``/``ReplayBuffer`` semantics, QMIX learner). Case ``marlbuf``:
  the one-line swap to :class:`marlbuf.compat.epymarl.ReplayBuffer`.

**The environment** is mpe2's ``simple_spread`` through its PettingZoo parallel API, and the
consumers store what ``env.step`` returns, unmodified: dicts keyed by agent, rewards a
``collections.defaultdict`` of Python floats, terminations bools (continuous actions for the
MADDPG loops, discrete ones for QMIX).

**Whole runs** (rows of ``rows``) are measured as paired seeds: per seed, both (or all three)
cases are built with that seed (networks, global generators, environment), their buffers
prefilled with the same MPE-like stream data (not timed; capacity 1e5, lowered where one table
would exceed the table budget; EPyMARL: episodes of a random policy), and then timed windows
alternate between the cases: 100 environment steps with the update round that falls in them
(EPyMARL: a number of episodes, each inserted, and once enough are stored sampled, truncated
and trained on). ``ratio`` is the median over seeds of each seed's median of paired window
ratios (case / own), with ``ratio_min``/``ratio_max`` over the seeds: the spread. A verdict is
claimed only where the spread allows it (``faster``: every seed's ratio below 1, ``slower``:
every seed's above 1, else ``within spread``). Per window each loop times its calls apart:
``buffer_s`` (the write path and the sampling calls up to the tensors the update reads) and
``update_s`` (forward and backward passes, optimiser steps); ``batch_cost_s`` is the case's
update time minus the own buffer's in the same window (what the batches add to the update:
their memory layout), ``gain_s`` the own window minus the case's, and ``gain_vs_own_buffer``
that gain over ``own_buffer_s``, the own buffer's time in its calls (1: as if the buffer cost
nothing; negative: slower).

**Write path** (``write_rows``): one step of mpe2's raw ``env.step`` output through ``add``,
against ``add`` of the same step as plain dicts of arrays and Python numbers, a one-step
``extend`` of it, and the consumers' own writes (every agent's NumPy row write of the per-agent
buffers, the joint buffer's ``push``), continuous and discrete actions; every buffer holds 512
steps and has wrapped before the timing starts (the steady state: no write touches memory for
the first time).

**Batch layouts** (``batch_rows``): what strided batch views cost in a real update. The joint
consumer's update (critic and actor, forward and backward) of one agent on batches gathered as
``batch_layout="rows"`` (strided views, the default), ``"per_agent"`` (contiguous, written by
the gather kernel) and ``"rows"`` followed by ``.contiguous()`` copies; the sampling call and
the update timed apart, interleaved; ``total_ms`` is their sum.

**EPyMARL's buffer on its own terms** (``episode_rows``): ``insert_episode_batch`` of runner
episodes once the ring has wrapped (steady state), and the first fill of an empty buffer
(which includes the padded buffer's zero-filled allocation and marlbuf's first touches of its
rows), ``sample(32)`` with the truncation to ``max_t_filled``, and the memory each buffer takes
for the same window, for fixed (25-step) and mixed episode lengths.

Targets (``targets``, PASS/FAIL; a miss is reported, not an error): whole runs never slower
beyond the spread (every consumer, every agent count); at 12 and 24 agents the whole-run gain
at least half of the own buffer's time in its calls; ``add`` of raw ``env.step`` output within
1.1x of ``add`` of plain dicts and at most the per-agent NumPy row write (3 agents) or 0.3x of
it (24 agents); a one-step ``extend`` within 1.2x of ``add``; EPyMARL's buffer: insert at
least 1.2x and sample + truncation 1.5x the padded buffer's speed, memory for mixed lengths at
most 0.7x padding.

**On a device** (``run(device="cuda")``, ``marlbuf bench dropin --device cuda``) the suite
measures the MADDPG consumers with their networks on the device, in two cases each,
``own+copy`` (the own host buffers, every sampled array copied to the device) and ``marlbuf
device`` (the joint consumer's buffer built with ``device=...``; the per-agent loop's buffers
replaced by one device buffer,
:class:`~marlbuf.bench.baselines.consumers.per_agent.DeviceBufferMADDPG`),
at 3, 12 and 24 agents, per 100 environment steps, each timed call synchronised with the
device; targets: at least 3x at 24 agents, 1.5x at 12, never slower at 3. Without CUDA every
case is recorded as not measured, with the reason; ``device="cpu"`` runs the same code on the
host (a test of the suite, not a GPU figure).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from functools import partial
from time import perf_counter
from typing import Any

import numpy as np

from marlbuf import AgentSpec
from marlbuf.bench.suites.adapters import capacity_for
from marlbuf.bench.suites.sampling import FILL_CHUNK
from marlbuf.bench.tools.common import (
    check,
    checks_markdown,
    markdown_table,
    quiet_threads,
    time_interleaved,
)
from marlbuf.workloads import steps_of_kind

SUITE = "dropin"
STEPS = 100  # environment steps per timed window (one update round in each)
ACTION_DIM = 5

#: Full-size run.
FULL: dict[str, Any] = {
    "agents": (3, 12, 24),
    "capacity": None,  # 1e5, lowered to fit TABLE_BUDGET_BYTES (see bench.adapters)
    "batch_size": 1024,
    "seeds": (0, 1, 2),
    # timed windows per seed and agent count: more where a window is short (its noise larger)
    "windows": {3: 9, 12: 5, 24: 3},
    "write_agents": (3, 12, 24),
    "write_steps": 200,
    "write_repeats": 15,
    "batch_agents": (3, 12, 24),
    "batch_repeats": 7,
    "episode_agents": (3, 12, 24),
    "episode_windows": {3: 7, 12: 5, 24: 3},
    "episodes_per_window": 8,
    "episode_buffer_agents": (3, 12),
    "episode_buffer_size": 300,
    "episode_repeats": 9,
}
#: Sizes of the quick run (``marlbuf bench --quick``); tests patch it smaller.
QUICK: dict[str, Any] = {
    "agents": (3,),
    "capacity": 2_000,
    "batch_size": 128,
    "seeds": (0, 1, 2),
    "windows": {3: 3},
    "write_agents": (3, 24),
    "write_steps": 50,
    "write_repeats": 5,
    "batch_agents": (3,),
    "batch_repeats": 3,
    "episode_agents": (3,),
    "episode_windows": {3: 2},
    "episodes_per_window": 3,
    "episode_buffer_agents": (3,),
    "episode_buffer_size": 80,
    "episode_repeats": 3,
}

#: Sizes of the device run (``run(device=...)``), full and quick.
DEVICE_FULL: dict[str, Any] = {
    "agents": (3, 12, 24),
    "capacity": None,  # as FULL
    "batch_size": 1024,
    "repeats": 5,
    "kind": "streams",
}
DEVICE_QUICK: dict[str, Any] = {
    "agents": (3, 12),
    "capacity": 2_000,
    "batch_size": 128,
    "repeats": 3,
    "kind": "streams",
}
#: the device run's cases: what each one's buffer is
DEVICE_BUFFERS = {
    "own+copy": "the consumer's own host buffers, each sampled array copied to the device",
    "marlbuf device": "marlbuf on the device (MultiAgentReplayBuffer(..., device=...))",
}
#: the device run's targets: own+copy's 100-step window over marlbuf device's, at least
DEVICE_TARGETS = {3: 1.0, 12: 1.5, 24: 3.0}

#: what each case's buffer is, as its ``buffer`` column says
BUFFERS = {
    "own": "the consumer's own",
    "marlbuf": "marlbuf, defaults",
    "marlbuf_per_agent_batches": 'marlbuf, batch_layout="per_agent" (tuning option)',
}
#: the prefill data's keys (the consumers' field names) and the buffer's fields they hold
FIELDS = ("obs", "act", "rew", "next_obs", "done")
BUFFER_FIELDS = ("obs", "action", "reward", "next_obs", "done")

#: targets: whole runs never slower beyond the spread; at these agent counts the gain at least
#: AMDAHL_SHARE of the own buffer's time in its calls
AMDAHL_AGENTS = (12, 24)
AMDAHL_SHARE = 0.5
#: write path: raw env output / plain dicts; add / per-agent NumPy rows (by agent count);
#: one-step extend / add
RAW_VS_PLAIN = 1.1
ADD_VS_ROWS = {3: 1.0, 24: 0.3}
EXTEND_VS_ADD = 1.2
#: EPyMARL's buffer: speed-ups at least, memory (mixed lengths) at most
EPISODE_INSERT = 1.2
EPISODE_SAMPLE = 1.5
EPISODE_MEMORY = 0.7
#: EPyMARL's mixed episode lengths: each episode ends at a step drawn from this range
MIXED_LENGTHS = (8, 25)


# ------------------------------------------------------------------------------ prefill data
def make_data(obs_dims: list[int], capacity: int, seed: int) -> dict[str, list[np.ndarray]]:
    """Per agent, ``capacity`` MPE-like transitions (a step's next observation is the
    following step's, except at an episode end every 25 steps): lists in agent order under
    ``obs``, ``act``, ``rew``, ``next_obs``, ``done``."""
    specs = {
        f"agent_{i}": AgentSpec(obs_shape=(d,), action_shape=(ACTION_DIM,))
        for i, d in enumerate(obs_dims)
    }
    steps = steps_of_kind("streams", specs, capacity, np.random.default_rng(seed))
    return {key: list(steps[field].values()) for key, field in zip(FIELDS, BUFFER_FIELDS)}


def _chunks(data: dict[str, list[np.ndarray]], start: int) -> Any:
    """``data`` from step ``start`` on, in chunks of ``FILL_CHUNK`` steps (field lists)."""
    total = len(data["obs"][0])
    for begin in range(start, total, FILL_CHUNK):
        end = min(total, begin + FILL_CHUNK)
        yield [[x[begin:end] for x in data[f]] for f in FIELDS]


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
        buf.add(*(data[f][i][0] for f in FIELDS))
    store = buffers[0].store.buffer
    for chunk in _chunks(data, 1):
        store.extend(*chunk)


def fill_own_joint(buf: Any, data: dict[str, list[np.ndarray]]) -> None:
    for i in range(buf.num_agents):
        buf.obs_buffs[i][:] = data["obs"][i]
        buf.ac_buffs[i][:] = data["act"][i]
        buf.rew_buffs[i][:] = data["rew"][i]
        buf.next_obs_buffs[i][:] = data["next_obs"][i]
        buf.done_buffs[i][:] = data["done"][i]
    buf.filled_i, buf.curr_i = buf.max_steps, 0


def fill_marlbuf_joint(buf: Any, data: dict[str, list[np.ndarray]]) -> None:
    for chunk in _chunks(data, 0):
        buf.buffer.extend(*chunk)


def _filled(fill: Callable[[Any, Any], None], buf: Any, data: Any) -> list[str]:
    """Run ``fill(buf, data)``; the warnings it raised, recorded instead of printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fill(buf, data)
    return sorted({type(w.message).__name__ for w in caught})


# ------------------------------------------------------------------------------ MADDPG
def build_cases(
    consumer: str, n: int, capacity: int, batch_size: int, seed: int
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The consumer's training loops for one seed, one per case, each with its own mpe2 env
    and a buffer prefilled with the same data; and the warnings each prefill raised."""
    from marlbuf.bench.baselines.consumers import joint, per_agent
    from marlbuf.bench.baselines.consumers.mpe import env_dims, parallel_env

    settings: dict[str, Any] = {"batch_size": batch_size, "update_every": STEPS, "seed": seed}
    _, obs_dims, act_dims = env_dims(parallel_env(n))
    data = make_data(obs_dims, capacity, seed=1000 + seed)
    loops: dict[str, Any] = {}
    caught: dict[str, list[str]] = {}
    if consumer == "per_agent":
        own = per_agent.own_buffers(capacity, obs_dims, ACTION_DIM)
        fill_own_per_agent(own, data)
        loops["own"] = per_agent.PerAgentMADDPG(parallel_env(n), own, **settings)
        ours = per_agent.marlbuf_buffers(capacity, obs_dims, ACTION_DIM, seed=seed)
        caught["marlbuf"] = _filled(fill_marlbuf_per_agent, ours, data)
        loops["marlbuf"] = per_agent.PerAgentMADDPG(parallel_env(n), ours, **settings)
        return loops, caught
    own_joint = joint.JointReplayBuffer(capacity, obs_dims, act_dims)
    fill_own_joint(own_joint, data)
    loops["own"] = joint.JointMADDPG(parallel_env(n), own_joint, **settings)
    for case, options in (
        ("marlbuf", {}),
        ("marlbuf_per_agent_batches", {"batch_layout": "per_agent"}),
    ):
        swapped = joint.MarlbufJointBuffer(capacity, obs_dims, act_dims, seed=seed, **options)
        caught[case] = _filled(fill_marlbuf_joint, swapped, data)
        loops[case] = joint.JointMADDPG(parallel_env(n), swapped, **settings)
    return loops, caught


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


def _window(loop: Any, run: Callable[[], None]) -> dict[str, float]:
    """``run()`` timed: its wall time and what the loop's timers gained during it."""
    before = dict(loop.timers)
    start = perf_counter()
    run()
    wall = perf_counter() - start
    out = {k: loop.timers[k] - before[k] for k in loop.timers}
    out["wall"] = wall
    out["buffer"] = sum(out.get(k, 0.0) for k in ("write", "sample", "insert"))
    return out


def paired_windows(
    loops: dict[str, Any], run: Callable[[Any], Callable[[], None]], windows: int
) -> dict[str, list[dict[str, float]]]:
    """One untimed warm-up window per case, then ``windows`` rounds of one window per case
    (the order rotated round by round): per case, the windows' timings in round order."""
    for loop in loops.values():
        run(loop)()
    names = list(loops)
    out: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_ in range(windows):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                out[name].append(_window(loops[name], run(loops[name])))
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def seed_summary(timings: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per case of one seed's windows: the median paired ratio of whole windows over the own
    buffer's, the median gain, the case's median buffer and update time per window, and the
    median paired difference of update time (the batch cost)."""
    own = timings["own"]
    out = {}
    for case, windows in timings.items():
        wall = np.array([w["wall"] for w in windows])
        own_wall = np.array([w["wall"] for w in own])
        update = np.array([w["update"] for w in windows])
        own_update = np.array([w["update"] for w in own])
        out[case] = {
            "ratio": float(np.median(wall / own_wall)),
            "gain_s": float(np.median(own_wall - wall)),
            "window_s": float(np.median(wall)),
            "buffer_s": float(np.median([w["buffer"] for w in windows])),
            "update_s": float(np.median(update)),
            "batch_cost_s": float(np.median(update - own_update)),
            "own_buffer_s": float(np.median([w["buffer"] for w in own])),
        }
    return out


def whole_run_rows(
    consumer: str, n: int, per_seed: list[dict[str, dict[str, float]]], extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rows of one consumer at ``n`` agents from each seed's :func:`seed_summary`."""
    rows = []
    for case in per_seed[0]:
        ratios = [s[case]["ratio"] for s in per_seed]
        row: dict[str, Any] = {"consumer": consumer, "agents": n, "case": case}
        row["buffer"] = BUFFERS.get(case, case)
        row.update(extra)
        row["seeds"] = len(per_seed)
        row["ratio"] = float(np.median(ratios))
        row["ratio_min"], row["ratio_max"] = float(min(ratios)), float(max(ratios))
        row["verdict"] = (
            "faster" if max(ratios) < 1 else "slower" if min(ratios) > 1 else "within spread"
        )
        for key in ("window_s", "buffer_s", "update_s", "batch_cost_s", "gain_s", "own_buffer_s"):
            row[key] = float(np.median([s[case][key] for s in per_seed]))
        row["own_buffer_share"] = row["own_buffer_s"] / float(
            np.median([s["own"]["window_s"] for s in per_seed])
        )
        row["gain_vs_own_buffer"] = row["gain_s"] / row["own_buffer_s"]
        rows.append(row)
    return rows


def measure_consumer(
    consumer: str, n: int, capacity: int, batch_size: int, seeds: tuple[int, ...], windows: int
) -> list[dict[str, Any]]:
    """Whole-run rows (one per case) of a MADDPG consumer at ``n`` agents, paired seeds."""
    per_seed = []
    caught: dict[str, set[str]] = {}
    for seed in seeds:
        loops, warned = build_cases(consumer, n, capacity, batch_size, seed)
        for case, names in warned.items():
            caught.setdefault(case, set()).update(names)
        check_same_data(consumer, loops, capacity)
        timings = paired_windows(loops, lambda loop: partial(loop.run_steps, STEPS), windows)
        for case, loop in loops.items():
            if loop.updates != windows + 1:  # one update round per window, warm-up included
                raise AssertionError(
                    f"{case}: {loop.updates} update rounds, expected {windows + 1}"
                )
        per_seed.append(seed_summary(timings))
        del loops
        gc.collect()
    rows = whole_run_rows(
        consumer, n, per_seed, {"capacity": capacity, "window": f"{STEPS} env steps"}
    )
    for row in rows:
        row["fill_warnings"] = ", ".join(sorted(caught.get(row["case"], ())))
    return rows


# ------------------------------------------------------------------------------ EPyMARL
def measure_epymarl(
    n: int, seeds: tuple[int, ...], windows: int, episodes: int
) -> list[dict[str, Any]]:
    """Whole-run rows of the QMIX consumer at ``n`` agents: per seed, the run with the padded
    buffer and the run with marlbuf's fill their buffers with ``batch_size`` episodes (not
    timed), then windows of ``episodes`` episodes alternate, each episode inserted, sampled,
    truncated and trained on (the runs draw from NumPy's and torch's global generators, as
    EPyMARL does, so alternating them gives each other draws: the learning of the swap is
    checked apart, in the tests)."""
    from marlbuf.bench.baselines.consumers.epymarl import PaddedReplayBuffer, QMIXRun
    from marlbuf.compat.epymarl import ReplayBuffer

    per_seed = []
    for seed in seeds:
        runs = {
            "own": QMIXRun(PaddedReplayBuffer, n, seed=seed),
            "marlbuf": QMIXRun(ReplayBuffer, n, seed=seed),
        }
        for run in runs.values():
            for _ in range(run.config.batch_size):
                run.episode(train=False)

        def window(run: Any) -> Callable[[], None]:
            def go() -> None:
                for _ in range(episodes):
                    run.episode()

            return go

        per_seed.append(seed_summary(paired_windows(runs, window, windows)))
    return whole_run_rows(
        "epymarl",
        n,
        per_seed,
        {
            "capacity": f"{runs['own'].config.buffer_size} episodes",
            "window": f"{episodes} episodes",
        },
    )


def _runner_episodes(n: int, mixed: Any, count: int, seed: int) -> tuple[Any, list[Any]]:
    """``count`` episodes from EPyMARL's runner (a random policy: epsilon 1) and the
    scheme, groups and preprocess they follow."""
    from marlbuf.bench.baselines.consumers.epymarl import PaddedReplayBuffer, QMIXRun, scheme_of

    run = QMIXRun(PaddedReplayBuffer, n, seed=seed, mixed=mixed)
    return scheme_of(run.env.get_env_info()), [run.runner.run() for _ in range(count)]


def measure_episode_buffers(n: int, lengths: str, size: int, repeats: int) -> list[dict[str, Any]]:
    """EPyMARL's buffer against marlbuf's adapter on EPyMARL's terms (module docstring): rows
    of ``insert_us`` (steady state), ``fill_ms`` (``size`` episodes into a new buffer),
    ``sample_us`` (``sample(32)`` and the truncation) and ``bytes`` (once the window is
    full)."""
    import torch

    from marlbuf.bench.baselines.consumers.epymarl import PaddedReplayBuffer
    from marlbuf.compat.epymarl import ReplayBuffer

    mixed = MIXED_LENGTHS if lengths == "mixed" else None
    (scheme, groups, preprocess), pool = _runner_episodes(n, mixed, 40, seed=n)
    max_t = pool[0].max_seq_length
    classes = {"own": PaddedReplayBuffer, "marlbuf": ReplayBuffer}

    def build(name: str) -> Any:
        return classes[name](scheme, groups, size, max_t, preprocess=preprocess, device="cpu")

    def fill(name: str) -> Callable[[], None]:
        def go() -> None:
            buf = build(name)
            for k in range(size):
                buf.insert_episode_batch(pool[k % len(pool)])

        return go

    buffers = {name: build(name) for name in classes}
    for buf in buffers.values():  # past the ring's end: the steady state
        for k in range(size + len(pool)):
            buf.insert_episode_batch(pool[k % len(pool)])

    def inserts(buf: Any) -> Callable[[], None]:
        def go() -> None:
            for episode in pool:
                buf.insert_episode_batch(episode)

        return go

    def samples(buf: Any) -> Callable[[], None]:
        state = {"round": 0}

        def go() -> None:
            np.random.seed(state["round"])  # noqa: NPY002 - both buffers draw the same ids
            state["round"] += 1
            for _ in range(10):
                batch = buf.sample(32)
                batch = batch[:, : batch.max_t_filled()]

        return go

    insert = time_interleaved(
        {k: inserts(b) for k, b in buffers.items()}, repeats, rotate=True, keep_samples=True
    )
    sample = time_interleaved(
        {k: samples(b) for k, b in buffers.items()}, repeats, rotate=True, keep_samples=True
    )
    first = time_interleaved({k: fill(k) for k in classes}, max(1, repeats // 3), warmup=0)
    np.random.seed(0)  # noqa: NPY002
    want = buffers["own"].sample(32)
    np.random.seed(0)  # noqa: NPY002
    got = buffers["marlbuf"].sample(32)
    for key, value in want.data.transition_data.items():
        if not torch.equal(got[key], value):
            raise AssertionError(f"{key}: the buffers disagree; the benchmark is void")
    padded_bytes = sum(v.nbytes for v in buffers["own"].data.transition_data.values())
    rows = []
    for name, buf in buffers.items():
        held = padded_bytes if name == "own" else buf.nbytes
        rows.append(
            {
                "agents": n,
                "lengths": lengths,
                "case": name,
                "buffer": BUFFERS[name] if name == "own" else "marlbuf.compat.epymarl",
                "buffer_size": size,
                "insert_us": insert[name]["median"] / len(pool) * 1e6,
                "fill_ms": first[name]["median"] * 1e3,
                "sample_us": sample[name]["median"] / 10 * 1e6,
                "bytes": int(held),
                "insert_speedup": float(
                    np.median(np.divide(insert["own"]["samples"], insert[name]["samples"]))
                ),
                "sample_speedup": float(
                    np.median(np.divide(sample["own"]["samples"], sample[name]["samples"]))
                ),
                "fill_speedup": first["own"]["median"] / first[name]["median"],
                "memory_vs_padded": held / padded_bytes,
                "repeats": repeats,
            }
        )
    return rows


# ------------------------------------------------------------------------------ write path
def _mpe_steps(n: int, count: int, continuous: bool, seed: int) -> list[tuple[Any, ...]]:
    """``count`` steps of mpe2's raw ``env.step`` output (random actions), as
    ``(obs, actions, rewards, next_obs, terminations)``."""
    from marlbuf.bench.baselines.consumers.mpe import parallel_env

    env = parallel_env(n, continuous)
    obs, _ = env.reset(seed=seed)
    for agent in env.possible_agents:
        env.action_space(agent).seed(seed)
    steps: list[tuple[Any, ...]] = []
    while len(steps) < count:
        if not env.agents:
            obs, _ = env.reset()
        actions = {a: env.action_space(a).sample() for a in env.agents}
        nxt, rewards, terminations, _, _ = env.step(actions)
        steps.append((obs, actions, rewards, nxt, terminations))
        obs = nxt
    return steps


def measure_write(n: int, steps: int, repeats: int, continuous: bool) -> list[dict[str, Any]]:
    """One step of mpe2's raw output through ``add`` and the alternatives (module docstring),
    interleaved; ratios against the per-agent NumPy row write."""
    from marlbuf import MultiAgentReplayBuffer
    from marlbuf.bench.baselines.consumers import joint, per_agent
    from marlbuf.bench.baselines.consumers.mpe import env_dims, parallel_env

    agents, obs_dims, _ = env_dims(parallel_env(n, continuous))
    raw = _mpe_steps(n, steps, continuous, seed=n)
    plain = [
        (
            dict(o),
            {a: int(x) if not continuous else x for a, x in act.items()},
            {a: float(x) for a, x in rew.items()},
            dict(nxt),
            {a: bool(x) for a, x in term.items()},
        )
        for o, act, rew, nxt, term in raw
    ]
    one_step = [tuple({a: np.asarray(v[a])[None] for a in agents} for v in step) for step in raw]
    capacity = 512  # small: the untimed first calls wrap every ring, so no write first-touches
    specs = {
        a: AgentSpec(
            obs_shape=(d,),
            action_shape=(ACTION_DIM,),
            n_discrete_actions=None if continuous else ACTION_DIM,
        )
        for a, d in zip(agents, obs_dims)
    }
    buffers = {name: MultiAgentReplayBuffer(specs, capacity, seed=0) for name in range(3)}
    own_rows = per_agent.own_buffers(capacity, obs_dims, ACTION_DIM)
    own_joint = joint.JointReplayBuffer(capacity, obs_dims, [ACTION_DIM] * n)
    eye = np.eye(ACTION_DIM, dtype=np.float32)

    def writes(buf_write: Callable[[Any], None], data: list[Any]) -> Callable[[], None]:
        def go() -> None:
            for step in data:
                buf_write(step)

        return go

    def rows_write(step: Any) -> None:
        obs, act, rew, nxt, term = step
        for agent, buf in zip(agents, own_rows):
            action = act[agent] if continuous else eye[act[agent]]
            buf.add(obs[agent], action, rew[agent], nxt[agent], term[agent])

    def push(step: Any) -> None:
        obs, act, rew, nxt, term = step
        if not continuous:
            act = {a: eye[x] for a, x in act.items()}
        own_joint.push(obs, act, rew, nxt, term)

    cases = {
        "numpy_rows": writes(rows_write, raw),
        "joint_push": writes(push, raw),
        "add_raw_env_step": writes(lambda s: buffers[0].add(*s), raw),
        "add_plain_dicts": writes(lambda s: buffers[1].add(*s), plain),
        "extend_one_step": writes(lambda s: buffers[2].extend(*s), one_step),
    }
    with warnings.catch_warnings(record=True) as caught:  # recorded in the rows, not printed
        warnings.simplefilter("always")
        for case in cases.values():  # past every ring's end (the steady state)
            for _ in range(capacity // steps + 1):
                case()
        times = time_interleaved(cases, repeats=repeats, warmup=1, rotate=True)
    warned = ", ".join(sorted({type(w.message).__name__ for w in caught}))
    last = buffers[0].gather(np.array([(buffers[0].cursor - 1) % capacity]))
    if not all(np.array_equal(last.obs[a][0], raw[-1][0][a]) for a in agents):
        raise AssertionError("add stored another step than it was given")
    base = times["numpy_rows"]["median"]
    return [
        {
            "agents": n,
            "actions": "continuous" if continuous else "discrete",
            "case": case,
            "us_per_step": t["median"] / steps * 1e6,
            "us_per_step_min": t["min"] / steps * 1e6,
            "ratio_vs_numpy_rows": t["median"] / base,
            "ratio_vs_add_plain": t["median"] / times["add_plain_dicts"]["median"],
            "ratio_vs_add_raw": t["median"] / times["add_raw_env_step"]["median"],
            "repeats": t["n"],
            "warnings": warned,
        }
        for case, t in times.items()
    ]


# ------------------------------------------------------------------------------ batch layouts
class _ContiguousCopies:
    """A joint buffer whose sampled tensors are made contiguous (``.contiguous()`` copies)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return tuple(
            [t.contiguous() for t in field] for field in self.inner.sample(*args, **kwargs)
        )


def measure_batches(n: int, capacity: int, batch_size: int, repeats: int) -> list[dict[str, Any]]:
    """The joint consumer's sampling call and one agent's update on each batch layout
    (module docstring), interleaved; the own buffer's for reference."""
    from marlbuf.bench.baselines.consumers import joint
    from marlbuf.bench.baselines.consumers.mpe import env_dims, parallel_env

    _, obs_dims, act_dims = env_dims(parallel_env(n))
    data = make_data(obs_dims, capacity, seed=n)
    own = joint.JointReplayBuffer(capacity, obs_dims, act_dims)
    fill_own_joint(own, data)
    buffers: dict[str, Any] = {"own": own}
    for name, options in (("rows", {}), ("per_agent", {"batch_layout": "per_agent"})):
        buffers[name] = joint.MarlbufJointBuffer(capacity, obs_dims, act_dims, seed=0, **options)
        fill_marlbuf_joint(buffers[name], data)
    buffers["rows+contiguous()"] = _ContiguousCopies(buffers["rows"])
    loops = {
        name: joint.JointMADDPG(parallel_env(n), buf, batch_size=batch_size, seed=0)
        for name, buf in buffers.items()
    }
    agent = n // 2
    held: dict[str, Any] = {}

    def sample(loop: Any, name: str) -> Callable[[], None]:
        def go() -> None:
            held[name] = loop.sample(agent)

        return go

    def update(loop: Any, name: str) -> Callable[[], None]:
        def go() -> None:
            if name not in held:
                held[name] = loop.sample(agent)
            loop.update(held[name], agent)

        return go

    samples = time_interleaved(
        {k: sample(loop, k) for k, loop in loops.items()}, repeats, rotate=True
    )
    updates = time_interleaved(
        {k: update(loop, k) for k, loop in loops.items()}, repeats, rotate=True
    )
    strided = held["rows"][0][0]
    base = samples["own"]["median"] + updates["own"]["median"]
    rows = []
    for name in loops:
        total = samples[name]["median"] + updates[name]["median"]
        tensor = held[name][0][0]
        rows.append(
            {
                "agents": n,
                "case": name,
                "contiguous": bool(tensor.is_contiguous()),
                "row_stride": int(tensor.stride(0)),
                "sample_ms": samples[name]["median"] * 1e3,
                "update_ms": updates[name]["median"] * 1e3,
                "total_ms": total * 1e3,
                "total_vs_own": total / base,
                "update_vs_rows": updates[name]["median"] / updates["rows"]["median"],
                "total_vs_rows": total / (samples["rows"]["median"] + updates["rows"]["median"]),
                "repeats": repeats,
            }
        )
    del strided
    return rows


# ------------------------------------------------------------------------------ targets
def targets(
    rows: list[dict[str, Any]],
    write_rows: list[dict[str, Any]],
    episode_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """PASS/FAIL of the default cases against the targets (module docstring)."""
    out = []
    for row in rows:
        if row["case"] != "marlbuf":
            continue
        where = f"{row['consumer']} N={row['agents']}"
        # "never slower beyond the spread": refused only when every seed was slower
        out.append(
            check("whole run: marlbuf / own (lowest seed)", row["ratio_min"], 1.0, workload=where)
        )
        if row["agents"] in AMDAHL_AGENTS:
            # the gain in seconds beside the whole-run spread in seconds: a gain below the
            # spread is not resolved by the run, whatever its ratio says
            spread = (row["ratio_max"] - row["ratio_min"]) / 2 * row["window_s"] / row["ratio"]
            out.append(
                check(
                    "whole-run gain / own buffer's time in its calls",
                    row["gain_vs_own_buffer"],
                    AMDAHL_SHARE,
                    at_most=False,
                    workload=where,
                    note=f"gain {row['gain_s']:.3g} s of {row['own_buffer_s']:.3g} s; "
                    f"spread ±{spread:.3g} s",
                )
            )
    by = {(r["agents"], r["actions"], r["case"]): r for r in write_rows}
    for (n, actions, case), row in by.items():
        where = f"write N={n}, {actions} actions"
        if case == "add_raw_env_step":
            out.append(check("add: raw env.step / plain dicts", row["ratio_vs_add_plain"],
                             RAW_VS_PLAIN, workload=where))  # fmt: skip
            if n in ADD_VS_ROWS:
                out.append(check("add: raw env.step / per-agent NumPy rows",
                                 row["ratio_vs_numpy_rows"], ADD_VS_ROWS[n],
                                 workload=where))  # fmt: skip
        if case == "extend_one_step":
            out.append(check("one-step extend / add (raw)", row["ratio_vs_add_raw"],
                             EXTEND_VS_ADD, workload=where))  # fmt: skip
    for row in episode_rows:
        if row["case"] != "marlbuf":
            continue
        where = f"EPyMARL buffer N={row['agents']}, {row['lengths']} lengths"
        out.append(check("insert: padded / marlbuf", row["insert_speedup"], EPISODE_INSERT,
                         at_most=False, workload=where))  # fmt: skip
        out.append(check("sample(32) + truncation: padded / marlbuf", row["sample_speedup"],
                         EPISODE_SAMPLE, at_most=False, workload=where))  # fmt: skip
        if row["lengths"] == "mixed":
            out.append(check("memory: marlbuf / padded", row["memory_vs_padded"],
                             EPISODE_MEMORY, workload=where))  # fmt: skip
    return out


# ------------------------------------------------------------------------------ on a device
def build_device_cases(
    consumer: str,
    n: int,
    capacity: int,
    batch_size: int,
    data: dict[str, list[np.ndarray]],
    device: str,
) -> dict[str, Any]:
    """The consumer's training loops with their networks on ``device``: ``own+copy`` and
    ``marlbuf device``, each with its own env (same seed) and buffer prefilled with ``data``."""
    from marlbuf.bench.baselines.consumers import joint, per_agent
    from marlbuf.bench.baselines.consumers.mpe import env_dims, parallel_env

    def env() -> Any:
        return parallel_env(n)

    settings: dict[str, Any] = {"batch_size": batch_size, "update_every": STEPS, "seed": 0}
    settings["device"] = device
    _, obs_dims, _ = env_dims(env())
    loops: dict[str, Any] = {}
    if consumer == "per_agent":
        own = per_agent.own_buffers(capacity, obs_dims, ACTION_DIM)
        fill_own_per_agent(own, data)
        loops["own+copy"] = per_agent.PerAgentMADDPG(env(), own, **settings)
        ours = per_agent.device_buffer(capacity, obs_dims, ACTION_DIM, device, seed=0)
        _filled(fill_marlbuf_device, ours, data)
        loops["marlbuf device"] = per_agent.DeviceBufferMADDPG(env(), ours, **settings)
        return loops
    act_dims = [ACTION_DIM] * n
    own_joint = joint.JointReplayBuffer(capacity, obs_dims, act_dims)
    fill_own_joint(own_joint, data)
    loops["own+copy"] = joint.JointMADDPG(env(), own_joint, **settings)
    swapped = joint.MarlbufJointBuffer(capacity, obs_dims, act_dims, seed=0, device=device)
    _filled(fill_marlbuf_joint, swapped, data)
    loops["marlbuf device"] = joint.JointMADDPG(env(), swapped, **settings)
    return loops


def fill_marlbuf_device(buf: Any, data: dict[str, list[np.ndarray]]) -> None:
    for chunk in _chunks(data, 0):
        buf.extend(*chunk)


def check_same_data_on_device(consumer: str, loops: dict[str, Any], capacity: int) -> None:
    """The device buffer returns the own buffer's arrays at the same indices (else the run
    is void)."""
    idx = np.random.default_rng(1).choice(capacity, 64, replace=False)
    own, ours = loops["own+copy"], loops["marlbuf device"]
    if consumer == "per_agent":
        own_fields = [[b.sample_index(idx)[f] for b in own.buffers] for f in range(5)]
        device_buf = ours.buffer
    else:
        b = own.buffer
        own_fields = [
            [x[idx] for x in field]
            for field in (b.obs_buffs, b.ac_buffs, b.rew_buffs, b.next_obs_buffs, b.done_buffs)
        ]
        device_buf = ours.buffer.buffer
    got = device_buf.gather(idx).to_numpy().as_lists()
    for mine, theirs in zip(got, own_fields):
        if not all(np.array_equal(x, y) for x, y in zip(mine, theirs)):
            raise AssertionError("the device buffer and the own buffers disagree; void run")


def measure_on_device(
    consumer: str, n: int, sizes: dict[str, Any], device: str
) -> list[dict[str, Any]]:
    """Rows (one per case) of ``per100_s`` and ``update_ms`` for one consumer at ``n`` agents,
    networks on ``device``."""
    import torch

    capacity = sizes["capacity"] or capacity_for(n)[0]
    repeats, kind = sizes["repeats"], sizes["kind"]
    from marlbuf.bench.baselines.consumers.mpe import env_dims, parallel_env

    data = make_data(env_dims(parallel_env(n))[1], capacity, seed=n)
    loops = build_device_cases(consumer, n, capacity, sizes["batch_size"], data, device)
    del data
    check_same_data_on_device(consumer, loops, capacity)
    wait = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
            wait()

        return run

    update = time_interleaved(
        {c: synced(loop.update_round) for c, loop in loops.items()}, repeats=repeats, warmup=1
    )
    windows = time_interleaved(
        {c: synced(partial(loop.run_steps, STEPS)) for c, loop in loops.items()},
        repeats=repeats,
        warmup=1,
        rotate=True,
        keep_samples=True,
    )
    for case, loop in loops.items():
        expected = 2 * (repeats + 1)  # the update_ms rounds, then one per 100-step window
        if loop.updates != expected:
            raise AssertionError(f"{case}: {loop.updates} update rounds, expected {expected}")
    own = np.array(windows["own+copy"]["samples"])
    rows = []
    for case in loops:
        rows.append(
            {
                "consumer": consumer,
                "kind": kind,
                "agents": n,
                "case": case,
                "buffer": DEVICE_BUFFERS[case],
                "device": device,
                "capacity": capacity,
                "status": "measured",
                "per100_s": windows[case]["median"],
                "per100_s_min": windows[case]["min"],
                "update_ms": 1e3 * update[case]["median"],
                "speedup_per100": float(np.median(own / np.array(windows[case]["samples"]))),
                "speedup_update": update["own+copy"]["median"] / update[case]["median"],
                "repeats": repeats,
            }
        )
    del loops
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def device_targets(rows: list[dict[str, Any]], why_not: str | None) -> list[dict[str, Any]]:
    """PASS/FAIL of the device run's targets, or not measured with the reason."""
    out = []
    for consumer in ("per_agent", "joint"):
        for n, limit in DEVICE_TARGETS.items():
            ident = {"workload": f"{consumer} N={n}", "kind": "streams"}
            name = "100 env steps on the device: own+copy / marlbuf device"
            found = [
                r
                for r in rows
                if (r["consumer"], r["agents"], r["case"]) == (consumer, n, "marlbuf device")
            ]
            if found and found[0]["status"] == "measured":
                out.append(check(name, found[0]["speedup_per100"], limit, at_most=False, **ident))
                continue
            why = found[0]["status"] if found else why_not or "agent count not in this run"
            out.append(
                {
                    "check": name,
                    **ident,
                    "ratio": float("nan"),
                    "limit": limit,
                    "bound": "at least",
                    "status": "not measured",
                    "note": why.removeprefix("not measured: "),
                }
            )
    return out


def run_on_device(quick: bool, device: str) -> dict[str, Any]:
    """The device run (module docstring): rows, targets, summary, markdown, configuration."""
    from marlbuf.bench.suites.device import gpu_status, targets_markdown

    threads = quiet_threads()
    sizes = DEVICE_QUICK if quick else DEVICE_FULL
    why_not = gpu_status(device)
    if why_not is None:
        try:
            import mpe2  # noqa: F401 - marlbuf.envs' environments
        except ImportError as exc:
            why_not = f"not measured: mpe2 is not installed ({exc})"
    rows: list[dict[str, Any]] = []
    for n in sizes["agents"]:
        for consumer in ("per_agent", "joint"):
            if why_not is not None:
                rows += [
                    {"consumer": consumer, "kind": sizes["kind"], "agents": n, "case": case}
                    | {"buffer": what, "device": device, "status": why_not}
                    for case, what in DEVICE_BUFFERS.items()
                ]
                continue
            print(f"[dropin] {consumer} consumer on {device}, N={n}", flush=True)
            rows += measure_on_device(consumer, n, sizes, device)
    checks = device_targets(rows, why_not)
    summary: dict[str, Any] = {
        f"{r['consumer']}/N={r['agents']}": {
            "speedup_per100": round(r["speedup_per100"], 3),
            "speedup_update": round(r["speedup_update"], 3),
        }
        for r in rows
        if r["case"] == "marlbuf device" and r["status"] == "measured"
    }
    if why_not is not None:
        summary["not_measured"] = why_not
    summary["targets_missed"] = [
        f"{c['check']} ({c['workload']}): {c['ratio']:.3g}" for c in checks if c["status"] == "FAIL"
    ]
    columns = ["consumer", "agents", "case", "status", "per100_s", "update_ms"]
    columns += ["speedup_per100", "speedup_update"]
    markdown = (
        f"Networks on {device}. Cases: "
        + "; ".join(f"`{case}`: {what}" for case, what in DEVICE_BUFFERS.items())
        + ".\n\n"
        + markdown_table(rows, columns)
        + "\n\nTargets (a miss is reported, not an error):\n\n"
        + targets_markdown(checks)
    )
    import torch

    return {
        "rows": rows,
        "targets": checks,
        "markdown": markdown,
        "summary": summary,
        "config": {
            **{k: v for k, v in sizes.items() if k != "capacity"},
            "capacity": sizes["capacity"] or "1e5, lowered to fit 384 MiB per table",
            "device": device,
            "gpu": torch.cuda.get_device_name(device)
            if why_not is None and device.startswith("cuda")
            else why_not or "the CPU (a test of the suite, not a GPU figure)",
            "torch": torch.__version__,
            "steps_per_window": STEPS,
            "env": "mpe2 simple_spread_v3 (parallel API), continuous actions, seed 0",
            "threads": threads,
            "what": "medians of interleaved repeats, each timed call synchronised with the "
            "device; speedup_* = own+copy / case (per100: paired within each round)",
        },
    }


# ------------------------------------------------------------------------------ suite
def run(quick: bool = False, device: str | None = None) -> dict[str, Any]:
    """The suite (module docstring); with ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``),
    the device run instead."""
    if device is not None:
        if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:k]'; got device={device!r}")
        return run_on_device(quick, device)
    threads = quiet_threads()
    sizes = QUICK if quick else FULL
    seeds = tuple(sizes["seeds"])

    def windows_at(key: str, n: int) -> int:
        per_n = sizes[key]
        return int(per_n) if isinstance(per_n, int) else int(per_n.get(n, min(per_n.values())))

    rows: list[dict[str, Any]] = []
    for n in sizes["agents"]:
        capacity = sizes["capacity"] or capacity_for(n)[0]
        for consumer in ("per_agent", "joint"):
            print(f"[dropin] {consumer} consumer, N={n}, capacity {capacity}", flush=True)
            rows += measure_consumer(
                consumer, n, capacity, sizes["batch_size"], seeds, windows_at("windows", n)
            )
    for n in sizes["episode_agents"]:
        print(f"[dropin] epymarl consumer, N={n}", flush=True)
        rows += measure_epymarl(
            n, seeds, windows_at("episode_windows", n), sizes["episodes_per_window"]
        )
    write_rows: list[dict[str, Any]] = []
    for n in sizes["write_agents"]:
        for continuous in (True, False):
            write_rows += measure_write(n, sizes["write_steps"], sizes["write_repeats"], continuous)
    batch_rows: list[dict[str, Any]] = []
    for n in sizes["batch_agents"]:
        print(f"[dropin] batch layouts, N={n}", flush=True)
        capacity = sizes["capacity"] or capacity_for(n)[0]
        batch_rows += measure_batches(n, capacity, sizes["batch_size"], sizes["batch_repeats"])
    episode_rows: list[dict[str, Any]] = []
    for n in sizes["episode_buffer_agents"]:
        for lengths in ("fixed", "mixed"):
            print(f"[dropin] EPyMARL buffers, N={n}, {lengths} lengths", flush=True)
            episode_rows += measure_episode_buffers(
                n, lengths, sizes["episode_buffer_size"], sizes["episode_repeats"]
            )
    checks = targets(rows, write_rows, episode_rows)

    summary: dict[str, Any] = {}
    for row in rows:
        if row["case"] != "own":
            summary[f"{row['consumer']}/{row['case']}/N={row['agents']}"] = {
                key: round(row[key], 3)
                for key in ("ratio", "ratio_min", "ratio_max", "gain_vs_own_buffer")
            } | {"verdict": row["verdict"]}
    for row in write_rows:
        if row["case"] in ("add_raw_env_step", "extend_one_step"):
            key = f"write/{row['case']}/{row['actions']}/N={row['agents']}"
            summary[key] = round(row["ratio_vs_numpy_rows"], 3)
    for row in batch_rows:
        summary[f"batches/{row['case']}/N={row['agents']}"] = round(row["total_vs_own"], 3)
    for row in episode_rows:
        if row["case"] == "marlbuf":
            summary[f"epymarl_buffer/{row['lengths']}/N={row['agents']}"] = {
                key: round(row[key], 3)
                for key in ("insert_speedup", "sample_speedup", "memory_vs_padded")
            }
    summary["targets_missed"] = [
        f"{c['check']} ({c['workload']}): {c['ratio']:.3g}" for c in checks if c["status"] == "FAIL"
    ]
    columns = ["consumer", "agents", "case", "ratio", "ratio_min", "ratio_max", "verdict"]
    columns += ["window_s", "buffer_s", "update_s", "batch_cost_s", "own_buffer_s"]
    columns += ["gain_vs_own_buffer"]
    write_columns = ["actions", "agents", "case", "us_per_step", "ratio_vs_numpy_rows"]
    write_columns += ["ratio_vs_add_plain", "warnings"]
    batch_columns = ["agents", "case", "contiguous", "sample_ms", "update_ms", "total_ms"]
    batch_columns += ["total_vs_own", "total_vs_rows"]
    episode_columns = ["agents", "lengths", "case", "insert_us", "fill_ms", "sample_us", "bytes"]
    episode_columns += ["insert_speedup", "sample_speedup", "fill_speedup", "memory_vs_padded"]
    markdown = (
        "Cases: "
        + "; ".join(f"`{case}`: {what}" for case, what in BUFFERS.items())
        + f". Whole runs: {len(seeds)} paired seeds, windows per seed {sizes['windows']} "
        f"(MADDPG), {sizes['episode_windows']} (EPyMARL), by agent count.\n\n"
        + markdown_table(rows, columns)
        + "\n\nTargets (a miss is reported, not an error):\n\n"
        + checks_markdown(checks)
        + "\n\nWrite path, one step of mpe2's env.step output:\n\n"
        + markdown_table(write_rows, write_columns)
        + "\n\nBatch layouts in the joint consumer's update (one agent):\n\n"
        + markdown_table(batch_rows, batch_columns)
        + "\n\nEPyMARL's buffer (insert once the ring has wrapped; fill: a new buffer):\n\n"
        + markdown_table(episode_rows, episode_columns)
    )
    return {
        "rows": rows,
        "write_rows": write_rows,
        "batch_rows": batch_rows,
        "episode_rows": episode_rows,
        "targets": checks,
        "markdown": markdown,
        "summary": summary,
        "config": {
            **{k: v for k, v in sizes.items() if k != "capacity"},
            "capacity": sizes["capacity"] or "1e5, lowered to fit 384 MiB per table",
            "fill_chunk": FILL_CHUNK,
            "steps_per_window": STEPS,
            "env": "mpe2 simple_spread_v3 (parallel API, env.step output unmodified); "
            "continuous actions (MADDPG), discrete (QMIX)",
            "mixed_lengths": MIXED_LENGTHS,
            "threads": threads,
            "what": "whole runs: median over paired seeds of each seed's median window ratio "
            "case / own, with the spread over seeds; micro-benchmarks: medians of interleaved "
            "repeats",
        },
    }


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    from marlbuf.bench.tools.common import write_result

    quick = "--quick" in sys.argv
    payload = run(quick=quick)
    print(json.dumps(payload["summary"], indent=1))
    print(write_result(SUITE, payload, quick))
