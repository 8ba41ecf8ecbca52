"""``marlbuf bench guard``: same-run ratios that protect the default path, with PASS/FAIL.

Every check is a ratio of two cases timed in the same process, repeats interleaved (rounds
rotated, ratios paired within a round and their median taken), so it holds on a busy machine
where absolute times do not. The data comes in two kinds (:data:`DATA_KINDS`): **streams**
(MPE-like: every step's next_obs is the following step's obs, except at an episode end every 25
steps) and **independent transitions** (next_obs unrelated to the following obs, as in a
shuffled dataset), both written with one ``extend`` call per chunk of ``FILL_CHUNK`` steps.
The checks, each on both data kinds where it applies:

1. **default round / dense round** — the MADDPG round (``sample_for_trainers(1024)``, reading
   obs, action, reward, next_obs and done of every batch) of ``MultiAgentReplayBuffer(specs,
   capacity)`` with no options, over the same round of a buffer with ``next_obs="stored"``:
   at most 1.10 on streams, 1.25 on independent transitions (:data:`ROUND_LIMITS`).
2. **dense round / bare row gather** — the dense round over N gathers of 1024 random rows of
   the same table into one reused array by a bare Numba loop (the ``sampling`` suite's
   yardstick): at most 1.3 at CN-3, 1.2 at CN-24 (:data:`BARE_LIMITS`).
3. **Neighbor(64) round / uniform round**, default format: at most 0.60 at CN-24 and PP-24+8
   (:data:`NEIGHBOR_LIMITS`). Its note gives the round's output-write floor over the uniform
   round: zero-filling one batch block per trainer (:func:`output_write_floor`, timed in the
   same repeats), below which no read locality can take a round that copies its batches.
4. **PER sample + update, cpprb / marlbuf** — ``sample(1024)`` + ``update_priorities`` through a
   prioritized ``MultiAgentReplayBuffer`` at capacity 1e6 against cpprb's
   ``PrioritizedReplayBuffer`` (the ``prioritized`` suite's part 1): at least 3.5x
   (:data:`PER_TARGET`); skipped, with a note, where cpprb is not installed.
5. **add / NumPy row write** — one step of mpe2's raw ``env.step`` output (discrete and
   continuous actions) through a default buffer's ``add`` over a per-agent NumPy row write (the
   ``dropin`` suite's write micro-benchmark): at most 3x at N = 3 and 0.5x at N = 24
   (:data:`ADD_LIMITS`).

Workloads: cooperative navigation CN-3, CN-12 and CN-24 (obs 6N, action 5) and predator-prey
PP-24+8 (:mod:`marlbuf.bench.workloads`); ``--quick`` runs CN-3 and CN-24 at small capacities
and the PER check at capacity 1e5, in well under a minute on 2 cores. Each row also records the
round's floor from this machine's copy bandwidth (bytes gathered / bandwidth).

A check past its limit is printed as ``FAIL`` and listed in the payload's ``failed_checks``.
``marlbuf bench guard`` then exits non-zero; with ``--quick`` it does not (small sizes on a
noisy machine), and the failures are only reported.
"""

from __future__ import annotations

import gc
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench import dropin, prioritized, sampling
from marlbuf.bench.common import (
    check,
    checks_markdown,
    copy_bandwidth,
    markdown_table,
    paired_ratio,
    quiet_threads,
    time_interleaved,
    time_once,
)
from marlbuf.bench.workloads import DATA_KINDS, Workload, steps_of_kind
from marlbuf.memory import estimate
from marlbuf.samplers import Neighbor

SUITE = "guard"
BATCH = sampling.BATCH
FILL_CHUNK = sampling.FILL_CHUNK
NEIGHBOR_RUN = 64

#: default round / dense round, at most, per data kind
ROUND_LIMITS = {"streams": 1.10, "independent": 1.25}
#: dense round / bare row gather, at most, per workload (the check runs where one is set)
BARE_LIMITS = {"CN-3": 1.3, "CN-24": 1.2}
#: Neighbor(64) round / uniform round (default format), at most, per workload
NEIGHBOR_LIMITS = {"CN-24": 0.60, "PP-24+8": 0.60}
#: PER sample + update: cpprb's time / marlbuf's, at least
PER_TARGET = 3.5
#: add / NumPy row write, at most, per agent count
ADD_LIMITS = {3: 3.0, 24: 0.5}

FULL: dict[str, Any] = {
    "workloads": [
        Workload("cooperative_navigation", 3),
        Workload("cooperative_navigation", 12),
        Workload("cooperative_navigation", 24),
        Workload("predator_prey", 24),
    ],
    "capacity": 100_000,
    "table_budget": sampling.TABLE_BUDGET_BYTES,  # bytes of one dense table, at most
    "repeats": 9,
    "min_sample_s": 0.05,  # each timed sample repeats a round until it takes about this long
    "per_capacity": 1_000_000,
    "per_repeats": 100,
    "add_steps": 200,
    "add_repeats": 15,
}
QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("cooperative_navigation", 24)],
    "capacity": 20_000,
    "table_budget": 120_000_000,
    "repeats": 7,
    "min_sample_s": 0.02,
    "per_capacity": 100_000,
    "per_repeats": 30,
    "add_steps": 50,
    "add_repeats": 7,
}


def capacity_for(workload: Workload, capacity: int, table_budget: int) -> int:
    """``capacity``, lowered so that the dense table stays within ``table_budget`` bytes (never
    below two batches: every round draws 1024 rows)."""
    row = estimate(workload.specs(), 1, next_obs="stored").table_row_bytes
    return int(max(2 * BATCH, min(capacity, table_budget // row)))


def maddpg_round(buf: MultiAgentReplayBuffer) -> Callable[[], None]:
    """One MADDPG round: a batch per trainer, every field of every batch read."""

    def round_() -> None:
        for batch in buf.sample_for_trainers(BATCH):
            _ = (batch.obs, batch.action, batch.reward, batch.next_obs, batch.done)

    return round_


def output_write_floor(buf: MultiAgentReplayBuffer) -> Callable[[], None]:
    """Zero-filling one batch block per trainer, each a distinct block as in a round that keeps
    every batch alive: what writing a round's output costs before any row is read (the bound
    that read locality, e.g. neighbor runs, cannot go below)."""
    dtype, shape = buf.storage.block_spec(BATCH)
    blocks = [np.empty(shape, dtype=dtype) for _ in range(buf.n_trainers)]

    def round_() -> None:
        for block in blocks:
            block.fill(0)

    return round_


def fill(
    buffers: list[MultiAgentReplayBuffer], workload: Workload, kind: str, seed: int
) -> list[str]:
    """Write the same ``kind`` data into every buffer, one ``extend`` per chunk; returns the
    warnings raised (recorded, not printed: e.g. a side-table warning is a finding)."""
    specs = workload.specs()
    rng = np.random.default_rng(seed)
    capacity = buffers[0].capacity
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in range(0, capacity, FILL_CHUNK):
            data = steps_of_kind(kind, specs, min(FILL_CHUNK, capacity - start), rng, first=start)
            for buf in buffers:
                buf.extend(**data)
    return sorted({type(w.message).__name__ for w in caught})


def measure_rounds(
    workload: Workload, kind: str, cfg: dict[str, Any], bandwidth: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Timing rows and checks 1-3 for one workload and data kind."""
    capacity = capacity_for(workload, cfg["capacity"], cfg["table_budget"])
    specs = workload.specs()
    default = MultiAgentReplayBuffer(specs, capacity)  # no options: what a user gets
    dense = MultiAgentReplayBuffer(specs, capacity, next_obs="stored")
    caught = fill([default, dense], workload, kind, seed=workload.n)
    neighbor = sampling._share_storage(default, Neighbor(NEIGHBOR_RUN), seed=1)
    cases = {
        "default": maddpg_round(default),
        "dense": maddpg_round(dense),
        "bare_row_gather": sampling._bare_gather(dense, workload.n_trainers),
        f"default+neighbor{NEIGHBOR_RUN}": maddpg_round(neighbor),
        "output_write_floor": output_write_floor(default),
    }
    for fn in cases.values():  # JIT compilation and first-touch faults, before calibrating
        fn()
    slowest = max(time_once(fn) for fn in cases.values())
    inner = max(1, min(100, math.ceil(cfg["min_sample_s"] / max(slowest, 1e-6))))
    timings = time_interleaved(
        cases, repeats=cfg["repeats"], warmup=1, inner=inner, rotate=True, keep_samples=True
    )
    floor_ms = 1e3 * sampling.useful_bytes_per_round(workload) / bandwidth
    formats = {"default": default.next_obs, "dense": dense.next_obs, "bare_row_gather": "stored"}
    formats[f"default+neighbor{NEIGHBOR_RUN}"] = default.next_obs
    formats["output_write_floor"] = default.next_obs
    rows = [
        {
            "workload": workload.label,
            "kind": kind,
            "case": case,
            "capacity": capacity,
            "n_trainers": workload.n_trainers,
            "next_obs": formats[case],
            "ms_median": 1e3 * t["median"],
            "ms_min": 1e3 * t["min"],
            "ms_max": 1e3 * t["max"],
            "first_call_ms": 1e3 * t["first_call"],
            "inner": inner,
            "time_vs_dense": t["median"] / timings["dense"]["median"],
            "floor_ms_from_bandwidth": floor_ms,
            "fill_warnings": ", ".join(caught),
        }
        for case, t in timings.items()
    ]
    ident: dict[str, Any] = {"workload": workload.label, "kind": kind}
    note: dict[str, Any] = {"note": f"default fill warned: {', '.join(caught)}"} if caught else {}
    checks = [
        check(
            "default round / dense round",
            paired_ratio(timings["default"], timings["dense"]),
            ROUND_LIMITS[kind],
            **ident,
            **note,
        )
    ]
    if workload.label in BARE_LIMITS:
        checks.append(
            check(
                "dense round / bare row gather",
                paired_ratio(timings["dense"], timings["bare_row_gather"]),
                BARE_LIMITS[workload.label],
                **ident,
            )
        )
    if workload.label in NEIGHBOR_LIMITS:
        floor = paired_ratio(timings["output_write_floor"], timings["default"])
        checks.append(
            check(
                f"Neighbor({NEIGHBOR_RUN}) round / uniform round, default format",
                paired_ratio(timings[f"default+neighbor{NEIGHBOR_RUN}"], timings["default"]),
                NEIGHBOR_LIMITS[workload.label],
                **ident,
                note=f"writing the round's output blocks alone: {floor:.2f}x the uniform round",
            )
        )
    return rows, checks


def measure_per(cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Check 4 from the ``prioritized`` suite's PER comparison."""
    per_rows, summary = prioritized.bench_per(cfg["per_capacity"], repeats=cfg["per_repeats"])
    ratio = summary.get("per_buffer_vs_cpprb", float("nan"))
    note = summary.get("cpprb", "")
    if "per_vs_cpprb" in summary:
        note = f"sampler alone (no gather): {summary['per_vs_cpprb']:.3g}x"
    ident: dict[str, Any] = {"workload": f"capacity {cfg['per_capacity']:,}", "kind": ""}
    ident["note"] = note
    rows = [{"workload": "PER", "kind": "", **r} for r in per_rows]
    return rows, [
        check("PER sample + update: cpprb / marlbuf", ratio, PER_TARGET, at_most=False, **ident)
    ]


def measure_add(cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Check 5 from the ``dropin`` suite's write-path micro-benchmark, both action kinds."""
    rows: list[dict[str, Any]] = []
    checks = []
    for kind in ("discrete", "continuous"):
        for n, limit in ADD_LIMITS.items():
            write_rows = dropin.measure_write(
                n, cfg["add_steps"], cfg["add_repeats"], kind == "continuous"
            )
            rows += [{"workload": f"add N={n}", **r} for r in write_rows]
            add = next(r for r in write_rows if r["case"] == "add_raw_env_step")
            note = f"add warned: {add['warnings']}" if add["warnings"] else ""
            checks.append(
                check(
                    "add / NumPy row write",
                    add["ratio_vs_numpy_rows"],
                    limit,
                    workload=f"N={n}",
                    kind=kind,
                    note=note,
                )
            )
    return rows, checks


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Every check; returns the JSON payload (rows, checks, summary, markdown, config)."""
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    bandwidth = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []

    def report(new: list[dict[str, Any]]) -> None:
        checks.extend(new)
        for c in new if progress else ():
            where = " ".join(str(c[k]) for k in ("workload", "kind") if c.get(k))
            sign = "<=" if c["bound"] == "at most" else ">="
            print(
                f"[guard] {c['status']:<4} {c['check']} ({where}): {c['ratio']:.3g} "
                f"(limit {sign} {c['limit']:g}){'  ' + c['note'] if c.get('note') else ''}",
                flush=True,
            )

    for workload in cfg["workloads"]:
        for kind in DATA_KINDS:
            new_rows, new_checks = measure_rounds(workload, kind, cfg, bandwidth)
            rows += new_rows
            report(new_checks)
            gc.collect()
    for measure in (measure_per, measure_add):
        new_rows, new_checks = measure(cfg)
        rows += new_rows
        report(new_checks)
    failed = [
        f"{c['check']} ({c['workload']}{', ' + c['kind'] if c['kind'] else ''}): "
        f"{c['ratio']:.3g}, limit {c['limit']:g}"
        for c in checks
        if c["status"] == "FAIL"
    ]
    if progress:
        passed = sum(c["status"] == "PASS" for c in checks)
        print(f"[guard] {passed} of {len(checks)} checks passed", flush=True)
    round_rows = [r for r in rows if "ms_median" in r]
    return {
        "rows": rows,
        "checks": checks,
        "failed_checks": failed,
        "summary": {
            "passed": sum(c["status"] == "PASS" for c in checks),
            "failed": len(failed),
            "skipped": [
                f"{c['check']}: {c.get('note', '')}" for c in checks if c["status"] == "SKIP"
            ],
            "failed_checks": failed,
            "ratios": {
                f"{c['check']} | {c['workload']}{' ' + c['kind'] if c['kind'] else ''}": round(
                    c["ratio"], 3
                )
                for c in checks
            },
        },
        "markdown": checks_markdown(checks)
        + "\n\nMADDPG rounds (ms per round; ratios in the checks are paired per round):\n\n"
        + markdown_table(
            round_rows,
            ["workload", "kind", "case", "capacity", "next_obs", "ms_median", "time_vs_dense"],
        ),
        "config": {
            "batch_size": BATCH,
            "fill_chunk": FILL_CHUNK,
            "workloads": [w.label for w in cfg["workloads"]],
            "capacity": cfg["capacity"],
            "table_budget_bytes": cfg["table_budget"],
            "repeats": cfg["repeats"],
            "per_capacity": cfg["per_capacity"],
            "per_repeats": cfg["per_repeats"],
            "add_steps": cfg["add_steps"],
            "add_repeats": cfg["add_repeats"],
            "data_kinds": list(DATA_KINDS),
            "copy_bandwidth_GBps": bandwidth / 1e9,
            "threads": threads,
            "exit_status": "non-zero on a failed check, except with --quick",
        },
    }
