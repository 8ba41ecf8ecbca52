"""Memory: bytes per transition and total size of the storage formats, and the paper's scale.

Two parts:

* **Sizes** (every run): per workload (cooperative navigation with 3 to 48 agents,
  predator-prey with 3+1 to 24+8) and format — ``dense`` (every row holds next_obs, float32:
  the 0.1 format), ``once`` (observations stored once), ``once+float16`` (stored once, float16
  observations) — the bytes per transition and the total for a capacity of 1e6, from
  :func:`marlbuf.memory.estimate` (MPE's 25-step episodes), and the same measured on a real
  buffer of ``measure_capacity`` transitions filled with 25-step episode streams
  (``buffer.nbytes`` / capacity, side table included).
* **The paper's scale** (full runs only): CN-24 and PP-24+8 buffers of 1e6 transitions in the
  leanest format are allocated, filled, and sampled for one full MADDPG round
  (``iter_trainers``), reporting the process's resident memory before and after (the buffer's
  share is the difference) and the time of each phase.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.tools.common import markdown_table, quiet_threads
from marlbuf.memory import GIB, estimate
from marlbuf.workloads import Workload, episode_steps

SUITE = "memory"
BATCH = 1024

#: format -> (next_obs, float16 observations)
FORMATS: dict[str, tuple[str, bool]] = {
    "dense": ("stored", False),
    "once": ("once", False),
    "once+float16": ("once", True),
}

SIZE_WORKLOADS = [Workload("cooperative_navigation", n) for n in (3, 6, 12, 24, 48)] + [
    Workload("predator_prey", n) for n in (3, 6, 12, 24)
]

QUICK: dict[str, Any] = {
    # the agent counts of the report's headline: 3, 12 and 24 (sizes are cheap to measure)
    "workloads": [Workload("cooperative_navigation", n) for n in (3, 12, 24)],
    "capacity": 1_000_000,
    "measure_capacity": 2_000,
    "scale": [],
    "scale_capacity": 0,
}
FULL: dict[str, Any] = {
    "workloads": SIZE_WORKLOADS,
    "capacity": 1_000_000,
    "measure_capacity": 20_000,
    "scale": [Workload("cooperative_navigation", 24), Workload("predator_prey", 24)],
    "scale_capacity": 1_000_000,
}


def half_specs(specs: dict[str, AgentSpec]) -> dict[str, AgentSpec]:
    """``specs`` with float16 observations."""
    return {a: dataclasses.replace(s, obs_dtype=np.float16) for a, s in specs.items()}


def _specs(workload: Workload, fmt: str) -> dict[str, AgentSpec]:
    specs = workload.specs()
    return half_specs(specs) if FORMATS[fmt][1] else specs


def resident_bytes() -> int:
    """The process's resident set size (``VmRSS``), in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def _fill(buf: MultiAgentReplayBuffer, specs: dict[str, AgentSpec], steps: int, seed: int) -> None:
    """``steps`` transitions of 25-step episode streams, written in chunks (a few chunks of
    fresh data, then repeated: generating 1e6 distinct rows would dominate the run)."""
    rng = np.random.default_rng(seed)
    chunk = min(steps, 5_000)
    pool = [
        episode_steps(specs, chunk, rng, first=i * chunk) for i in range(min(4, -(-steps // chunk)))
    ]
    written = 0
    while written < steps:
        data = pool[(written // chunk) % len(pool)]
        count = min(chunk, steps - written)
        if count < chunk:
            data = {f: {a: x[:count] for a, x in per.items()} for f, per in data.items()}
        buf.extend(**data)
        written += count


def _sizes(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    dense_bytes: dict[str, float] = {}
    for workload in cfg["workloads"]:
        for fmt, (next_obs, _) in FORMATS.items():
            specs = _specs(workload, fmt)
            est = estimate(specs, cfg["capacity"], next_obs=next_obs)
            buf = MultiAgentReplayBuffer(specs, cfg["measure_capacity"], next_obs=next_obs)
            _fill(buf, workload.specs(), cfg["measure_capacity"], seed=0)
            measured = buf.nbytes / cfg["measure_capacity"]
            if fmt == "dense":
                dense_bytes[workload.label] = est.bytes_per_transition
            rows.append(
                {
                    "workload": workload.label,
                    "format": fmt,
                    "bytes_per_transition": est.bytes_per_transition,
                    "measured_bytes_per_transition": measured,
                    "vs_dense": est.bytes_per_transition / dense_bytes[workload.label],
                    "GiB_at_capacity": est.total_bytes / GIB,
                    "capacity": cfg["capacity"],
                }
            )
            del buf
            gc.collect()
    return rows


def _scale(workload: Workload, capacity: int) -> dict[str, Any]:
    """Allocate, fill and sample a buffer of ``capacity`` transitions in the leanest format."""
    specs = half_specs(workload.specs())
    gc.collect()
    before = resident_bytes()
    t0 = time.perf_counter()
    buf = MultiAgentReplayBuffer(specs, capacity, seed=0)
    t1 = time.perf_counter()
    _fill(buf, workload.specs(), capacity, seed=1)
    t2 = time.perf_counter()
    rows = 0
    for batch in buf.iter_trainers(BATCH):
        rows += len(batch)
        del batch
    t3 = time.perf_counter()
    after = resident_bytes()
    out = {
        "workload": workload.label,
        "format": "once+float16",
        "capacity": capacity,
        "buffer_nbytes_GiB": buf.nbytes / GIB,
        "resident_growth_GiB": (after - before) / GIB,
        "side_table_rows": buf.links.side_rows_used if buf.links is not None else 0,
        "allocate_s": t1 - t0,
        "fill_s": t2 - t1,
        "round_s": t3 - t2,
        "round_rows": rows,
        "n_trainers": workload.n_trainers,
    }
    del buf
    gc.collect()
    return out


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows = _sizes(cfg)
    if progress:
        print(f"[memory] sizes of {len(cfg['workloads'])} workloads done", flush=True)
    scale = []
    for workload in cfg["scale"]:
        if progress:
            print(
                f"[memory] {workload.label}: {cfg['scale_capacity']:,} transitions ...", flush=True
            )
        scale.append(_scale(workload, cfg["scale_capacity"]))
        if progress:
            print(f"[memory] {scale[-1]}", flush=True)
    summary = {
        r["workload"]: {"once+float16_vs_dense": r["vs_dense"], "GiB_at_1e6": r["GiB_at_capacity"]}
        for r in rows
        if r["format"] == "once+float16"
    }
    return {
        "config": {
            "capacity": cfg["capacity"],
            "measure_capacity": cfg["measure_capacity"],
            "episode_length": 25,
            "threads": threads,
        },
        "rows": rows,
        "scale": scale,
        "summary": summary,
        "markdown": markdown_table(
            rows,
            [
                "workload",
                "format",
                "bytes_per_transition",
                "measured_bytes_per_transition",
                "vs_dense",
                "GiB_at_capacity",
            ],
        )
        + ("\n\n" + markdown_table(scale, list(scale[0])) if scale else ""),
    }
