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
   the same table into one reused array by a plain Numba loop
   (:func:`marlbuf.bench.suites.sampling.bare_row_gather`, the ``sampling`` suite's
   yardstick): at most 1.3 at CN-3, 1.2 at CN-24 (:data:`BARE_LIMITS`).
3. **iter_trainers round / bare row gather** — the default buffer's streaming round (one batch
   alive at a time) over the same bare gather: at most 1.10 (:data:`STREAM_BARE_LIMITS`).
4. **Neighbor(64) round / uniform round**, default format: at most 0.80 at CN-24 and PP-24+8
   (:data:`NEIGHBOR_LIMITS`). Its note gives the round's output-write floor over the uniform
   round: zero-filling one batch block per trainer (:func:`output_write_floor`, timed in the
   same repeats), below which no read locality can take a round that copies its batches.
5. **Neighbor(64) ratio / the bare kernel's** — check 4's ratio over the bare gather's own ratio
   of runs of 64 consecutive rows to random rows, timed in the same repeats: at most 1.0 where
   check 4 runs (the round keeps the read saving the bare kernel shows; :data:`KEEP_LIMITS`).
6. **default round / memcpy floor** — the round over one contiguous copy per trainer of the
   bytes its batch holds, from the stored table into a block of its own (:func:`memcpy_floor`):
   at most 1.3 at CN-24 (:data:`MEMCPY_LIMITS`).
7. **float16 round / float32 round** — the default round of the same streams stored with
   float16 observations (float32 batches, widened in the gather) over the float32 one: at most
   0.85 at CN-24 (:data:`FLOAT16_LIMITS`; streams only).
8. **PER sample + update, cpprb / marlbuf** — ``sample(1024)`` + ``update_priorities`` through a
   prioritized ``MultiAgentReplayBuffer`` against cpprb's ``PrioritizedReplayBuffer`` (the
   ``prioritized`` suite's part 1): at least 4x at capacity 1e6, 3x at 1e5
   (:data:`PER_TARGETS`); skipped, with a note, where cpprb is not installed.
9. **add / NumPy row write** — one step of mpe2's raw ``env.step`` output (discrete and
   continuous actions) through a default buffer's ``add`` over a per-agent NumPy row write (the
   ``dropin`` suite's write micro-benchmark): at most 3x at N = 3 and 0.5x at N = 24
   (:data:`ADD_LIMITS`).

Workloads: cooperative navigation CN-3, CN-12 and CN-24 (obs 6N, action 5) and predator-prey
PP-24+8 (:mod:`marlbuf.workloads`); ``--quick`` runs CN-3, CN-12 (streams) and CN-24 at
small capacities and the PER check at capacity 1e5, in well under a minute on 2 cores. Each
row also records the round's floor from this machine's copy bandwidth (bytes gathered /
bandwidth).

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
from marlbuf.bench.suites import dropin, prioritized, sampling
from marlbuf.bench.suites.memory import half_specs
from marlbuf.bench.tools.common import (
    check,
    checks_markdown,
    copy_bandwidth,
    markdown_table,
    paired_ratio,
    quiet_threads,
    time_interleaved,
    time_once,
)
from marlbuf.memory import estimate
from marlbuf.samplers import Neighbor
from marlbuf.workloads import DATA_KINDS, Workload, steps_of_kind

SUITE = "guard"
BATCH = sampling.BATCH
FILL_CHUNK = sampling.FILL_CHUNK
NEIGHBOR_RUN = 64

#: default round / dense round, at most, per data kind
ROUND_LIMITS = {"streams": 1.10, "independent": 1.25}
#: dense round / bare row gather, at most, per workload (the check runs where one is set)
BARE_LIMITS = {"CN-3": 1.3, "CN-24": 1.2}
#: iter_trainers round (default buffer) / bare row gather, at most, per workload
STREAM_BARE_LIMITS = {"CN-3": 1.10, "CN-12": 1.10, "CN-24": 1.10}
#: Neighbor(64) round / uniform round (default format), at most, per workload
NEIGHBOR_LIMITS = {"CN-24": 0.80, "PP-24+8": 0.80}
#: (Neighbor(64) round / uniform round) / (bare gather of 64-row runs / bare gather), at most,
#: where the Neighbor check runs: the round keeps the bare kernel's read saving
KEEP_LIMIT = 1.0
#: default round / memcpy of its bytes, at most, per workload
MEMCPY_LIMITS = {"CN-24": 1.3}
#: float16 round / float32 round (streams, default format), at most, per workload
FLOAT16_LIMITS = {"CN-24": 0.85}
#: PER sample + update: cpprb's time / marlbuf's, at least, per capacity (the largest capacity
#: at or below the measured one applies)
PER_TARGETS = {100_000: 3.0, 1_000_000: 4.0}
#: add / NumPy row write, at most, per agent count
ADD_LIMITS = {3: 3.0, 24: 0.5}

FULL: dict[str, Any] = {
    "streams_only": [],
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
    "workloads": [
        Workload("cooperative_navigation", 3),
        Workload("cooperative_navigation", 12),
        Workload("cooperative_navigation", 24),
    ],
    #: workloads measured on streams only (their checks concern MPE streams)
    "streams_only": ["CN-12"],
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


def streaming_round(buf: MultiAgentReplayBuffer) -> Callable[[], None]:
    """The round as ``iter_trainers`` with one batch alive: each batch's fields read, then the
    batch and its arrays dropped before the next is drawn (so its block is recycled)."""

    def round_() -> None:
        for batch in buf.iter_trainers(BATCH):
            fields = (batch.obs, batch.action, batch.reward, batch.next_obs, batch.done)
            del batch, fields

    return round_


def memcpy_floor(buf: MultiAgentReplayBuffer) -> Callable[[], None]:
    """One contiguous copy per trainer of the bytes its batch block holds, from a random
    place in the stored table into a block of its own (as a round keeps its batches): the
    round's bytes moved at memcpy speed, from the memory the round reads."""
    dtype, shape = buf.storage.block_spec(BATCH)
    blocks = [
        np.empty(shape, dtype=dtype).reshape(-1).view(np.uint8) for _ in range(buf.n_trainers)
    ]
    for block in blocks:
        block.fill(0)  # fault the pages in
    table = buf.storage.arrays()["table"].reshape(-1).view(np.uint8)
    nbytes = blocks[0].shape[0]
    span = max(1, table.shape[0] - nbytes)
    rng = np.random.default_rng(0)

    def round_() -> None:
        for block in blocks:
            start = int(rng.integers(0, span)) // 64 * 64
            part = table[start : start + nbytes]
            np.copyto(block[: part.shape[0]], part)

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
    """Timing rows and checks 1-7 for one workload and data kind."""
    capacity = capacity_for(workload, cfg["capacity"], cfg["table_budget"])
    specs = workload.specs()
    label = workload.label
    default = MultiAgentReplayBuffer(specs, capacity)  # no options: what a user gets
    dense = MultiAgentReplayBuffer(specs, capacity, next_obs="stored")
    buffers = [default, dense]
    half = None
    if label in FLOAT16_LIMITS and kind == "streams":
        half = MultiAgentReplayBuffer(half_specs(specs), capacity)  # float16 obs, default format
        buffers.append(half)
    caught = fill(buffers, workload, kind, seed=workload.n)
    neighbor = sampling._share_storage(default, Neighbor(NEIGHBOR_RUN), seed=1)
    cases = {
        "default": maddpg_round(default),
        "dense": maddpg_round(dense),
        "bare_row_gather": sampling._bare_gather(dense, workload.n_trainers),
        "default_stream": streaming_round(default),
        f"default+neighbor{NEIGHBOR_RUN}": maddpg_round(neighbor),
        f"bare_runs{NEIGHBOR_RUN}": sampling._bare_gather(
            dense, workload.n_trainers, run_length=NEIGHBOR_RUN
        ),
        "output_write_floor": output_write_floor(default),
        "memcpy_floor": memcpy_floor(default),
    }
    if half is not None:
        cases["float16"] = maddpg_round(half)
    for fn in cases.values():  # JIT compilation and first-touch faults, before calibrating
        fn()
    slowest = max(time_once(fn) for fn in cases.values())
    inner = max(1, min(100, math.ceil(cfg["min_sample_s"] / max(slowest, 1e-6))))
    timings = time_interleaved(
        cases, repeats=cfg["repeats"], warmup=1, inner=inner, rotate=True, keep_samples=True
    )
    floor_ms = 1e3 * sampling.useful_bytes_per_round(workload) / bandwidth
    formats = {case: default.next_obs for case in cases}
    formats.update({"dense": dense.next_obs, "bare_row_gather": "stored"})
    formats[f"bare_runs{NEIGHBOR_RUN}"] = "stored"
    if half is not None:
        formats["float16"] = f"{half.next_obs}, float16 obs"
    rows = [
        {
            "workload": label,
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
    ident: dict[str, Any] = {"workload": label, "kind": kind}
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
    if label in BARE_LIMITS:
        checks.append(
            check(
                "dense round / bare row gather",
                paired_ratio(timings["dense"], timings["bare_row_gather"]),
                BARE_LIMITS[label],
                **ident,
            )
        )
    if label in STREAM_BARE_LIMITS:
        checks.append(
            check(
                "iter_trainers round / bare row gather",
                paired_ratio(timings["default_stream"], timings["bare_row_gather"]),
                STREAM_BARE_LIMITS[label],
                **ident,
                note="default buffer; sample_for_trainers: "
                f"{paired_ratio(timings['default'], timings['bare_row_gather']):.3g}x",
            )
        )
    if label in NEIGHBOR_LIMITS:
        floor = paired_ratio(timings["output_write_floor"], timings["default"])
        round_ratio = paired_ratio(timings[f"default+neighbor{NEIGHBOR_RUN}"], timings["default"])
        bare_ratio = paired_ratio(timings[f"bare_runs{NEIGHBOR_RUN}"], timings["bare_row_gather"])
        checks.append(
            check(
                f"Neighbor({NEIGHBOR_RUN}) round / uniform round, default format",
                round_ratio,
                NEIGHBOR_LIMITS[label],
                **ident,
                note=f"writing the round's output blocks alone: {floor:.2f}x the uniform round",
            )
        )
        checks.append(
            check(
                f"Neighbor({NEIGHBOR_RUN}) ratio / bare kernel's runs ratio",
                round_ratio / bare_ratio,
                KEEP_LIMIT,
                **ident,
                note=f"round {round_ratio:.3g}x uniform; bare gather of {NEIGHBOR_RUN}-row runs "
                f"{bare_ratio:.3g}x random rows",
            )
        )
    if label in MEMCPY_LIMITS:
        checks.append(
            check(
                "default round / memcpy floor",
                paired_ratio(timings["default"], timings["memcpy_floor"]),
                MEMCPY_LIMITS[label],
                **ident,
                note="iter_trainers: "
                f"{paired_ratio(timings['default_stream'], timings['memcpy_floor']):.3g}x",
            )
        )
    if half is not None:
        checks.append(
            check(
                "float16 round / float32 round",
                paired_ratio(timings["float16"], timings["default"]),
                FLOAT16_LIMITS[label],
                **ident,
                note="float16 observations, float32 batches (widened in the gather)",
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
        check(
            "PER sample + update: cpprb / marlbuf",
            ratio,
            per_target(cfg["per_capacity"]),
            at_most=False,
            **ident,
        )
    ]


def per_target(capacity: int) -> float:
    """The PER check's target at ``capacity``: that of the largest capacity of
    :data:`PER_TARGETS` at or below it (the smallest one's below them all)."""
    fitting = [c for c in PER_TARGETS if c <= capacity]
    return PER_TARGETS[max(fitting) if fitting else min(PER_TARGETS)]


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
        kinds = ("streams",) if workload.label in cfg.get("streams_only", ()) else DATA_KINDS
        for kind in kinds:
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
            "streams_only": cfg.get("streams_only", []),
            "add_steps": cfg["add_steps"],
            "add_repeats": cfg["add_repeats"],
            "data_kinds": list(DATA_KINDS),
            "copy_bandwidth_GBps": bandwidth / 1e9,
            "threads": threads,
            "exit_status": "non-zero on a failed check, except with --quick",
        },
    }
