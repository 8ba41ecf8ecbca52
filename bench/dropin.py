"""Drop-in, end to end: two MADDPG codebases with their own buffer and with marlbuf swapped in.

The consumers (:mod:`marlbuf.bench.consumers`) are complete PyTorch MADDPG loops written the way
two popular kinds of codebase write them. marlbuf enters each as a user would build it, with the
library's defaults (no tuning options); a case that exists for a tuning option is labelled so
(column ``buffer``) and sits beside the default case:

* **per_agent** — one buffer object per agent (``buffers[i].add(...)`` every step; a trainer
  draws ``np.random.choice(len, B, replace=False)`` and reads every agent's buffer with
  ``sample_index``). Case ``marlbuf``: :func:`marlbuf.compat.maddpg.make_buffers` with
  ``Uniform(replace=False)`` (the consumer's draw without replacement) and float32 fields (what
  the consumer stores).
* **joint** — one ``push(obs_n, act_n, rew_n, next_obs_n, done_n)`` / ``sample(B)`` buffer
  returning per-agent tensor lists with normalised rewards. Case ``marlbuf``:
  ``MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(replace=False))`` behind ``push`` /
  ``sample`` + ``Batch.as_lists()`` + ``torch.from_numpy`` (rewards normalised from
  ``stored("reward")``). Case ``marlbuf_per_agent_batches``: the same with the tuning option
  ``batch_layout="per_agent"`` (contiguous per-agent arrays).

Every agent count, consumer and case is prefilled (not timed) with the same synthetic
transitions of each of two data kinds (:data:`marlbuf.bench.workloads.DATA_KINDS`):

* ``streams`` — MPE-like: every step's next observation is the following step's observation,
  except at an episode end every 25 steps;
* ``independent`` — next observations unrelated to the following observations, as in a
  shuffled dataset.

marlbuf's buffers are filled with one ``extend`` call per chunk of steps (the per-agent adapter
takes its first step through ``add``, which allocates its store); column ``next_obs`` records
how the default buffer chose to keep next observations for that data. Capacity 1e5, lowered
where one table would exceed ``TABLE_BUDGET_BYTES``. The run first checks that the swapped
buffer returns the consumer's arrays at the same indices. All cases are built from the same
seeded environment (:func:`marlbuf.envs.make`'s cooperative navigation, continuous actions,
vectorized step: the same cost in every case). Then, repeats interleaved across cases:

* ``write_us`` — the consumer's write path per environment step (every agent's ``add`` / one
  ``push``), on env-shaped transitions;
* ``sample_ms`` — one sampling call of one trainer, tensors included;
* ``update_ms`` — one update round (every trainer samples and updates);
* ``per100_s`` — 100 environment steps of the training loop: action selection, env step, write,
  and the one update round that falls in every 100 steps.

``ratio_*`` columns are case / the consumer's own buffer (below 1: marlbuf is faster): ratios
of medians, except ``ratio_per100``, the median of the ratios of the windows timed in the same
round. ``sample_speedup`` is the own buffer's sampling call over the case's. The Amdahl bound,
from the same run: ``own_buffer_s`` is the time the own buffer spends in its calls in a 100-step
window (100 writes and one sampling call per trainer), ``own_buffer_share`` its share of the
window; ``gain_s`` is the own window minus the case's (median of the same-round differences),
and ``gain_vs_own_buffer`` that gain over ``own_buffer_s`` (1: as if the buffer cost nothing;
0: no gain; negative: slower). Where the buffer's share is a few percent (3 agents, the quick
sizes) the gain is within the noise of the window and this ratio swings widely.

Targets, reported as PASS/FAIL for the default cases (``targets`` in the payload, a table in the
markdown; a miss is reported, not an error): the sampling call at least 3x faster than the own
buffer's at 12 and 24 agents; whole runs (``per100_s``) never slower; the whole-run gain at least
70% of ``own_buffer_s``.

A write-path micro-benchmark completes it: one step from PettingZoo-style dicts with integer
(discrete) actions through a default ``MultiAgentReplayBuffer``'s ``add`` (stored one-hot)
against a minimal per-agent NumPy row write (one-hot, then five row assignments per agent), on
both data kinds.

**On a device** (``run(device="cuda")``, ``marlbuf bench dropin --device cuda``) the suite
measures this instead: both consumers with their networks on the device, in two cases each,

* ``own+copy`` — the consumer's own host buffers, every sampled array copied to the device
  (``torch.tensor(..., device=...)``, as these codebases' ``.cuda()`` casts);
* ``marlbuf device`` — marlbuf on the device, changed as a user would change it: the joint
  consumer builds its buffer with ``device=...``
  (:class:`~marlbuf.bench.consumers.joint.MarlbufJointBuffer`); the per-agent consumer's
  buffers become one ``MultiAgentReplayBuffer(..., device=...)`` with ``store`` and ``sample``
  rewritten for it (:class:`~marlbuf.bench.consumers.per_agent.DeviceBufferMADDPG`);

at 3, 12 and 24 agents (B = 1024, MPE-like ``streams`` data), prefilled as above (after the
same check that both hold the same data). Per case: ``per100_s``, whole runs of 100
environment steps (action selection on the device, env step, write, the one update round),
and ``update_ms``, one update round; each timed call ends with ``torch.cuda.synchronize()``.
``speedup_per100`` is ``own+copy``'s window over the case's, paired within each round (median).
Targets, PASS/FAIL per consumer: at least 3x at 24 agents, 1.5x at 12, never slower at 3. Where
the device cannot be used (no CUDA) or mpe2 is missing, every case and target is recorded as
not measured, with the reason. ``device="cpu"`` runs the same code on the host (a test of the
suite, not a GPU figure).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.adapters import capacity_for
from marlbuf.bench.common import (
    check,
    checks_markdown,
    markdown_table,
    quiet_threads,
    time_interleaved,
)
from marlbuf.bench.sampling import FILL_CHUNK
from marlbuf.bench.workloads import DATA_KINDS, steps_of_kind

SUITE = "dropin"
STEPS = 100  # environment steps per timed window (one update round in each)
ACTION_DIM = 5
EPISODE_STEPS = 25  # episode length of the streams in the write-path micro-benchmark

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
    "repeats": 5,
    "write_agents": (3, 12, 24),
    "write_steps": 50,
    "write_repeats": 5,
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

METRICS = ("write_us", "sample_ms", "update_ms", "per100_s")
#: the prefill data's keys (the consumers' field names) and the buffer's fields they hold
FIELDS = ("obs", "act", "rew", "next_obs", "done")
BUFFER_FIELDS = ("obs", "action", "reward", "next_obs", "done")

#: what each case's buffer is, as its ``buffer`` column says
BUFFERS = {
    "own": "the consumer's own",
    "marlbuf": "marlbuf, defaults",
    "marlbuf_per_agent_batches": 'marlbuf, batch_layout="per_agent" (tuning option)',
}
#: targets for the default cases: agent counts where the sampling call must be SAMPLE_SPEEDUP
#: times faster; the whole run at most WHOLE_RUN_RATIO of the own buffer's; the whole-run gain at
#: least AMDAHL_SHARE of the time the own buffer spends in its calls
SAMPLE_SPEEDUP_AGENTS = (12, 24)
SAMPLE_SPEEDUP = 3.0
WHOLE_RUN_RATIO = 1.0
AMDAHL_SHARE = 0.70


# ------------------------------------------------------------------------------ prefill data
def make_data(
    obs_dims: list[int], capacity: int, seed: int, kind: str
) -> dict[str, list[np.ndarray]]:
    """Per agent, ``capacity`` synthetic transitions of data kind ``kind`` (see the module
    docstring): lists in agent order under ``obs``, ``act``, ``rew``, ``next_obs``, ``done``."""
    specs = {
        f"agent_{i}": AgentSpec(obs_shape=(d,), action_shape=(ACTION_DIM,))
        for i, d in enumerate(obs_dims)
    }
    steps = steps_of_kind(kind, specs, capacity, np.random.default_rng(seed))
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
    """Run ``fill(buf, data)``; the warnings it raised (e.g. the side-table warning of a
    default buffer holding independent transitions), recorded instead of printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fill(buf, data)
    return sorted({type(w.message).__name__ for w in caught})


def env_transitions(obs_dims: list[int], steps: int, seed: int, kind: str) -> list[tuple[Any, ...]]:
    """``steps`` transitions shaped as the environment returns them (per-agent lists of float32
    observations and actions, a float64 reward array and a bool done array), of data kind
    ``kind``: with ``"streams"`` a step's next observations are the following step's, except at
    an episode end every ``EPISODE_STEPS`` steps."""
    if kind not in DATA_KINDS:
        raise ValueError(f"kind must be one of {DATA_KINDS}; got kind={kind!r}")
    rng = np.random.default_rng(seed)
    n = len(obs_dims)
    observations = [[rng.random(d, np.float32) for d in obs_dims] for _ in range(steps + 1)]
    out = []
    for t in range(steps):
        act = [rng.random(ACTION_DIM, np.float32) for _ in obs_dims]
        linked = kind == "streams" and (t + 1) % EPISODE_STEPS
        nxt = observations[t + 1] if linked else [rng.random(d, np.float32) for d in obs_dims]
        out.append((observations[t], act, rng.standard_normal(n), nxt, np.zeros(n, dtype=bool)))
    return out


# ------------------------------------------------------------------------------ consumers
def build_cases(
    consumer: str, n: int, capacity: int, batch_size: int, data: dict[str, list[np.ndarray]]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The consumer's training loops, one per case, each with its own env (same seed) and a
    buffer prefilled with ``data``; and per marlbuf case, how its buffer keeps next
    observations (``next_obs``) and the warnings the fill raised (``fill_warnings``)."""
    from marlbuf.bench.consumers import joint, per_agent
    from marlbuf.envs import make

    def env() -> Any:
        return make("cooperative_navigation", n, seed=0)

    settings: dict[str, Any] = {"batch_size": batch_size, "update_every": STEPS, "seed": 0}
    obs_dims = env().obs_dims
    loops: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    if consumer == "per_agent":
        own = per_agent.own_buffers(capacity, obs_dims, ACTION_DIM)
        fill_own_per_agent(own, data)
        loops["own"] = per_agent.PerAgentMADDPG(env(), own, **settings)
        ours = per_agent.marlbuf_buffers(capacity, obs_dims, ACTION_DIM, seed=0)
        caught = _filled(fill_marlbuf_per_agent, ours, data)
        info["marlbuf"] = {"next_obs": ours[0].store.buffer.next_obs, "fill_warnings": caught}
        loops["marlbuf"] = per_agent.PerAgentMADDPG(env(), ours, **settings)
        return loops, info
    act_dims = [ACTION_DIM] * n
    own_joint = joint.JointReplayBuffer(capacity, obs_dims, act_dims)
    fill_own_joint(own_joint, data)
    loops["own"] = joint.JointMADDPG(env(), own_joint, **settings)
    for case, options in (
        ("marlbuf", {}),
        ("marlbuf_per_agent_batches", {"batch_layout": "per_agent"}),
    ):
        swapped = joint.MarlbufJointBuffer(capacity, obs_dims, act_dims, seed=0, **options)
        caught = _filled(fill_marlbuf_joint, swapped, data)
        info[case] = {"next_obs": swapped.buffer.next_obs, "fill_warnings": caught}
        loops[case] = joint.JointMADDPG(env(), swapped, **settings)
    return loops, info


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
    consumer: str, n: int, capacity: int, batch_size: int, repeats: int, kind: str
) -> list[dict[str, Any]]:
    """Rows (one per case) of the four metrics and the Amdahl columns for one consumer at
    ``n`` agents, prefilled with data of kind ``kind``."""
    data = make_data([6 * n] * n, capacity, seed=n, kind=kind)
    loops, info = build_cases(consumer, n, capacity, batch_size, data)
    del data
    check_same_data(consumer, loops, capacity)
    transitions = env_transitions([6 * n] * n, STEPS, seed=100 + n, kind=kind)

    def writes(loop: Any) -> Callable[[], None]:
        def run() -> None:
            for t in transitions:
                loop.store(*t)

        return run

    timings: dict[str, dict[str, dict[str, Any]]] = {}
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
        rotate=True,
        keep_samples=True,
    )
    for case, loop in loops.items():
        expected = 2 * (repeats + 1)  # the update_ms rounds, then one per 100-step window
        if loop.updates != expected:
            raise AssertionError(f"{case}: {loop.updates} update rounds, expected {expected}")
    scale = {"write_us": 1e6 / STEPS, "sample_ms": 1e3, "update_ms": 1e3, "per100_s": 1.0}
    rows = []
    for case in loops:
        row: dict[str, Any] = {"consumer": consumer, "kind": kind, "agents": n, "case": case}
        row["buffer"] = BUFFERS[case]
        row["capacity"] = capacity
        row["next_obs"] = info.get(case, {}).get("next_obs", "stored")
        row["fill_warnings"] = ", ".join(info.get(case, {}).get("fill_warnings", []))
        for metric in METRICS:
            row[metric] = timings[metric][case]["median"] * scale[metric]
            row[f"{metric}_min"] = timings[metric][case]["min"] * scale[metric]
        row["repeats"] = repeats
        rows.append(row)
    own = rows[0]
    # the own buffer's calls in one 100-step window: STEPS writes, one sampling call per
    # trainer (the window's update round); what a free buffer would take off the window
    own_buffer_s = STEPS * own["write_us"] * 1e-6 + n * own["sample_ms"] * 1e-3
    windows = {case: np.array(t["samples"]) for case, t in timings["per100_s"].items()}
    for row in rows:
        for metric in METRICS:
            row[f"ratio_{metric.rsplit('_', 1)[0]}"] = row[metric] / own[metric]
        # whole windows: paired within each timed round (the slow drift of a shared machine
        # hits both windows of a pair alike), then the median
        row["ratio_per100"] = float(np.median(windows[row["case"]] / windows["own"]))
        row["sample_speedup"] = own["sample_ms"] / row["sample_ms"]
        row["own_buffer_s"] = own_buffer_s
        row["own_buffer_share"] = own_buffer_s / own["per100_s"]
        row["gain_s"] = float(np.median(windows["own"] - windows[row["case"]]))
        row["gain_vs_own_buffer"] = row["gain_s"] / own_buffer_s
    del loops
    gc.collect()
    return rows


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PASS/FAIL of the default marlbuf cases against the targets (module docstring)."""
    out = []
    for row in rows:
        if row["case"] != "marlbuf":
            continue
        ident: dict[str, Any] = {"workload": f"{row['consumer']} N={row['agents']}"}
        ident["kind"] = row["kind"]
        if row["agents"] in SAMPLE_SPEEDUP_AGENTS:
            out.append(
                check(
                    "sampling call: own / marlbuf",
                    row["sample_speedup"],
                    SAMPLE_SPEEDUP,
                    at_most=False,
                    **ident,
                )
            )
        out.append(
            check("100 env steps: marlbuf / own", row["ratio_per100"], WHOLE_RUN_RATIO, **ident)
        )
        out.append(
            check(
                "whole-run gain / own buffer's time in its calls",
                row["gain_vs_own_buffer"],
                AMDAHL_SHARE,
                at_most=False,
                **ident,
            )
        )
    return out


# ------------------------------------------------------------------------------ write path
def measure_write(
    n: int, steps: int, repeats: int, kind: str = "independent"
) -> list[dict[str, Any]]:
    """One step of PettingZoo-style dicts with integer actions: ``add`` (a default buffer) vs
    NumPy rows. ``kind``: ``"streams"`` (a step's next observation is the following step's
    observation, except at an episode end every 25 steps) or ``"independent"`` (unrelated)."""
    if kind not in DATA_KINDS:
        raise ValueError(f"kind must be one of {DATA_KINDS}; got kind={kind!r}")
    agents = [f"agent_{i}" for i in range(n)]
    obs_dim, capacity = 6 * n, 10_000
    rng = np.random.default_rng(n)
    observations = [{a: rng.random(obs_dim, np.float32) for a in agents} for _ in range(steps + 1)]
    step_dicts = [
        (
            observations[t],
            {a: int(rng.integers(ACTION_DIM)) for a in agents},
            {a: float(rng.standard_normal()) for a in agents},
            observations[t + 1]
            if kind == "streams" and (t + 1) % EPISODE_STEPS
            else {a: rng.random(obs_dim, np.float32) for a in agents},
            {a: False for a in agents},
        )
        for t in range(steps)
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

    with warnings.catch_warnings(record=True) as caught:  # recorded in the rows, not printed
        warnings.simplefilter("always")
        times = time_interleaved(
            {"numpy_rows": numpy_rows, "marlbuf_add": marlbuf_add}, repeats=repeats, warmup=1
        )
    warned = ", ".join(sorted({type(w.message).__name__ for w in caught}))
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
            "kind": kind,
            "case": case,
            "us_per_step": t["median"] / steps * 1e6,
            "us_per_step_min": t["min"] / steps * 1e6,
            "ratio_vs_numpy_rows": t["median"] / base,
            "repeats": t["n"],
            "warnings": warned if case == "marlbuf_add" else "",
        }
        for case, t in times.items()
    ]


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
    from marlbuf.bench.consumers import joint, per_agent
    from marlbuf.envs import make

    def env() -> Any:
        return make("cooperative_navigation", n, seed=0)

    settings: dict[str, Any] = {"batch_size": batch_size, "update_every": STEPS, "seed": 0}
    settings["device"] = device
    obs_dims = env().obs_dims
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
    data = make_data([6 * n] * n, capacity, seed=n, kind=kind)
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
    from marlbuf.bench.device import gpu_status, targets_markdown

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
            "env": "marlbuf.envs cooperative_navigation, continuous actions, seed 0",
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
    rows: list[dict[str, Any]] = []
    for n in sizes["agents"]:
        capacity = sizes["capacity"] or capacity_for(n)[0]
        for consumer in ("per_agent", "joint"):
            for kind in DATA_KINDS:
                print(
                    f"[dropin] {consumer} consumer, N={n}, {kind}, capacity {capacity}", flush=True
                )
                rows += measure_consumer(
                    consumer, n, capacity, sizes["batch_size"], sizes["repeats"], kind
                )
    write_rows: list[dict[str, Any]] = []
    for kind in DATA_KINDS:
        for n in sizes["write_agents"]:
            write_rows += measure_write(n, sizes["write_steps"], sizes["write_repeats"], kind)
    checks = targets(rows)

    summary: dict[str, Any] = {}
    for row in rows:
        if row["case"] == "own":
            continue
        key = f"{row['consumer']}/{row['case']}/{row['kind']}/N={row['agents']}"
        summary[key] = {m: round(row[f"ratio_{m.rsplit('_', 1)[0]}"], 3) for m in METRICS}
        for column in ("sample_speedup", "own_buffer_share", "gain_vs_own_buffer"):
            summary[key][column] = round(row[column], 3)
    for row in write_rows:
        if row["case"] == "marlbuf_add":
            summary[f"write_add_vs_numpy_rows/{row['kind']}/N={row['agents']}"] = round(
                row["ratio_vs_numpy_rows"], 3
            )
    summary["targets_missed"] = [
        f"{c['check']} ({c['workload']}, {c['kind']}): {c['ratio']:.3g}"
        for c in checks
        if c["status"] == "FAIL"
    ]
    columns = ["consumer", "kind", "agents", "case", "next_obs", *METRICS]
    columns += [f"ratio_{m.rsplit('_', 1)[0]}" for m in METRICS]
    columns += ["sample_speedup", "own_buffer_share", "gain_vs_own_buffer"]
    write_columns = ["kind", "agents", "case", "us_per_step", "ratio_vs_numpy_rows", "warnings"]
    markdown = (
        "Cases: "
        + "; ".join(f"`{case}`: {what}" for case, what in BUFFERS.items())
        + ".\n\n"
        + markdown_table(rows, columns)
        + "\n\nTargets (default marlbuf cases; a miss is reported, not an error):\n\n"
        + checks_markdown(checks)
        + "\n\nWrite path, one step from PettingZoo-style dicts with integer actions:\n\n"
        + markdown_table(write_rows, write_columns)
    )
    return {
        "rows": rows,
        "write_rows": write_rows,
        "targets": checks,
        "markdown": markdown,
        "summary": summary,
        "config": {
            **{k: v for k, v in sizes.items() if k != "capacity"},
            "capacity": sizes["capacity"] or "1e5, lowered to fit 384 MiB per table",
            "data_kinds": list(DATA_KINDS),
            "fill_chunk": FILL_CHUNK,
            "steps_per_window": STEPS,
            "env": "marlbuf.envs cooperative_navigation, continuous actions, seed 0",
            "threads": threads,
            "what": "medians of interleaved repeats; ratio_* = case / own buffer; "
            "gain_vs_own_buffer = (own - case time per 100 steps) / own buffer's time in its calls",
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
