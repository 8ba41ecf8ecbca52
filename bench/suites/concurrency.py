"""Concurrency: what the buffer's lock costs on the MADDPG round, measured pairwise.

The buffer takes a lock around every commit and every index draw + gather (see
``docs/architecture.md``, concurrency model). Here one buffer per workload and storage format
runs the same sampling round (``iter_trainers``, B = 1024) with its real lock and with the lock
swapped for a no-op, alternating round by round on the same handle and the same memory, so the
ratio isolates the lock. Also measured: a writer thread adding steps while the main thread
samples, against the same work done one after the other (what overlapping collection and
training gains or loses on this machine).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.suites.memory import half_specs
from marlbuf.bench.tools.common import markdown_table, quiet_threads, time_interleaved
from marlbuf.workloads import Workload, episode_steps

SUITE = "concurrency"
BATCH = 1024

QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3)],
    "capacity": 5_000,
    "repeats": 3,
    "writes": 200,
}
FULL: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("cooperative_navigation", 24)],
    "capacity": 20_000,
    "repeats": 7,
    "writes": 2_000,
}


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _buffers(workload: Workload, capacity: int) -> dict[str, MultiAgentReplayBuffer]:
    specs = workload.specs()
    bufs = {
        "dense": MultiAgentReplayBuffer(specs, capacity, next_obs="stored", seed=0),
        "lean16": MultiAgentReplayBuffer(half_specs(specs), capacity, seed=0),
    }
    rng = np.random.default_rng(0)
    for start in range(0, capacity, 5_000):
        data = episode_steps(specs, min(5_000, capacity - start), rng, first=start)
        for buf in bufs.values():
            buf.extend(**data)
    return bufs


def _round(buf: MultiAgentReplayBuffer, locked: bool, real: Any) -> Any:
    def run() -> None:
        buf.writer.lock = real if locked else _NoLock()  # type: ignore[assignment]
        for batch in buf.iter_trainers(BATCH):
            del batch
        buf.writer.lock = real

    return run


def _overlap(buf: MultiAgentReplayBuffer, steps: dict[str, Any], writes: int) -> dict[str, float]:
    """Seconds for ``writes`` adds plus as many sampling rounds as fit, sequential vs threaded."""
    one = {f: {a: x[0] for a, x in per.items()} for f, per in steps.items()}

    def write() -> None:
        for _ in range(writes):
            buf.add(**one)

    rounds = 3
    t0 = time.perf_counter()
    write()
    for _ in range(rounds):
        for batch in buf.iter_trainers(BATCH):
            del batch
    sequential = time.perf_counter() - t0
    t0 = time.perf_counter()
    writer = threading.Thread(target=write)
    writer.start()
    for _ in range(rounds):
        for batch in buf.iter_trainers(BATCH):
            del batch
    writer.join()
    threaded = time.perf_counter() - t0
    return {"sequential_s": sequential, "threaded_s": threaded}


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows: list[dict[str, Any]] = []
    for workload in cfg["workloads"]:
        bufs = _buffers(workload, cfg["capacity"])
        timings: dict[str, Any] = {}
        for fmt, buf in bufs.items():
            # one buffer at a time, its two cases alternating with the order rotated each
            # round: both see the same warm memory, so the ratio is the lock's alone
            real = buf.writer.lock
            pair = {
                f"{fmt}+lock": _round(buf, True, real),
                f"{fmt}+nolock": _round(buf, False, real),
            }
            timings |= time_interleaved(pair, repeats=2 * cfg["repeats"], warmup=2, rotate=True)
        for fmt, buf in bufs.items():
            locked = timings[f"{fmt}+lock"]["median"]
            free = timings[f"{fmt}+nolock"]["median"]
            overlap = _overlap(
                buf, episode_steps(workload.specs(), 1, np.random.default_rng(1)), cfg["writes"]
            )
            rows.append(
                {
                    "workload": workload.label,
                    "format": fmt,
                    "capacity": cfg["capacity"],
                    "round_ms_with_lock": 1e3 * locked,
                    "round_ms_without_lock": 1e3 * free,
                    "lock_cost": locked / free,
                    **overlap,
                    "threaded_vs_sequential": overlap["threaded_s"] / overlap["sequential_s"],
                }
            )
        if progress:
            for row in rows[-2:]:
                print(
                    f"[concurrency] {workload.label} {row['format']}: round "
                    f"{row['round_ms_with_lock']:.3g} ms with the lock, "
                    f"{row['round_ms_without_lock']:.3g} ms without ({row['lock_cost']:.3g}x); "
                    f"writer + sampler threaded {row['threaded_vs_sequential']:.3g}x sequential",
                    flush=True,
                )
    return {
        "config": {k: (v if k != "workloads" else [w.label for w in v]) for k, v in cfg.items()}
        | {"threads": threads, "batch_size": BATCH},
        "rows": rows,
        "summary": {f"{r['workload']}/{r['format']}": {"lock_cost": r["lock_cost"]} for r in rows},
        "markdown": markdown_table(
            rows,
            [
                "workload",
                "format",
                "round_ms_with_lock",
                "round_ms_without_lock",
                "lock_cost",
                "threaded_vs_sequential",
            ],
        ),
    }
