"""Key-value (interleaved) layout vs per-agent arrays (the paper's Fig. 14 view).

One trainer's joint batch — every agent's obs, action, reward, next_obs and done at the same
B = 1024 uniformly drawn slots — gathered from:

* ``numpy_per_agent`` — per-agent arrays, fancy indexing (baseline);
* ``agent_major`` — marlbuf's per-agent layout (5N Numba gathers into one pooled block);
* ``interleaved`` — one Numba gather of wide rows (gather only: per-agent arrays are views);
* ``interleaved+split`` — the same plus a contiguous copy of every per-agent array, which is
  what the paper's "reshaping" step costs when a consumer needs contiguous per-agent tensors.

The same index arrays are used for every case. Ratios are per workload, against
``numpy_per_agent`` measured in the same run.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from marlbuf import FIELDS, MultiAgentReplayBuffer
from marlbuf.bench.baselines.numpy_buffers import NumpyPerAgentBuffer
from marlbuf.bench.tools.common import markdown_table, per_workload, quiet_threads, time_interleaved
from marlbuf.workloads import PAPER_WORKLOADS, Workload, random_steps

SUITE = "layout"
BATCH = 1024

QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
    "capacity": 20_000,
    "repeats": 5,
    "inner": 5,
}
FULL: dict[str, Any] = {"workloads": PAPER_WORKLOADS, "capacity": 100_000, "repeats": 7, "inner": 3}


def _measure(workload: Workload, cfg: dict[str, Any]) -> dict[str, dict[str, float]]:
    specs = workload.specs()
    capacity = cfg["capacity"]
    rng = np.random.default_rng(0)
    bufs = {
        lay: MultiAgentReplayBuffer(specs, capacity, layout=lay)
        for lay in ("agent_major", "interleaved")
    }
    base = NumpyPerAgentBuffer(specs, capacity)
    for start in range(0, capacity, 5_000):
        data = random_steps(specs, min(5_000, capacity - start), rng)
        for b in bufs.values():
            b.extend(**data)
        base.extend(**data)
    indices = [rng.integers(0, capacity, BATCH) for _ in range(8)]
    cursor = {"i": 0}

    def next_index() -> np.ndarray:
        cursor["i"] = (cursor["i"] + 1) % len(indices)
        return indices[cursor["i"]]

    def numpy_gather() -> Any:
        idx = next_index()
        return {f: {a: arr[idx] for a, arr in per.items()} for f, per in base.data.items()}

    def split(batch: Any) -> Any:
        return {f: {a: np.ascontiguousarray(x) for a, x in batch.field(f).items()} for f in FIELDS}

    cases = {
        "numpy_per_agent": numpy_gather,
        "agent_major": lambda: bufs["agent_major"].gather(next_index()),
        "interleaved": lambda: bufs["interleaved"].gather(next_index()),
        "interleaved+split": lambda: split(bufs["interleaved"].gather(next_index())),
    }
    return time_interleaved(cases, repeats=cfg["repeats"], warmup=2, inner=cfg["inner"])


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows: list[dict[str, Any]] = []
    for workload in cfg["workloads"]:
        timings = _measure(workload, cfg)
        baseline = timings["numpy_per_agent"]["median"]
        for case, t in timings.items():
            rows.append(
                {
                    "workload": workload.label,
                    "n_agents": workload.n_trainers,
                    "case": case,
                    "us_median": 1e6 * t["median"],
                    "us_min": 1e6 * t["min"],
                    "us_max": 1e6 * t["max"],
                    "first_call_ms": 1e3 * t["first_call"],
                    "speedup_vs_numpy_per_agent": baseline / t["median"],
                }
            )
        if progress:
            print(
                f"[layout] {workload.label}: "
                + ", ".join(f"{k} {1e6 * v['median']:.0f} us" for k, v in timings.items()),
                flush=True,
            )
        gc.collect()
    summary = per_workload(rows, "speedup_vs_numpy_per_agent", skip=("numpy_per_agent",))
    return {
        "config": {
            "batch_size": BATCH,
            "capacity": cfg["capacity"],
            "repeats": cfg["repeats"],
            "threads": threads,
            "index": "uniform, same arrays for every case",
        },
        "rows": rows,
        "summary": summary,
        "markdown": markdown_table(
            rows, ["workload", "case", "us_median", "speedup_vs_numpy_per_agent"]
        ),
    }
