"""Locality that keeps learning: which neighbor run length is fast *and* keeps the reward?

The reward study (:mod:`marlbuf.bench.suites.rewards`) found that plain neighbor sampling with runs
of 16 and 64 loses final return on cooperative navigation. This suite sweeps the run length n over
:data:`RUN_LENGTHS` and measures both sides of the trade:

* **time** — the MADDPG sampling round (``sample_for_trainers``: N trainers x B = 1024, every
  agent's fields gathered per trainer) on the interleaved layout, for ``Neighbor(n)`` and for
  ``Uniform(order="random")`` (the same-run baseline, in draw order as the reward study's
  ``uniform`` runs) sharing one buffer's storage, repeats interleaved
  (the :mod:`marlbuf.bench.suites.sampling` machinery); ratio = time / uniform's time, of the
  medians and of the minima.
* **return** — MADDPG trained with ``neighbor_<n>`` and ``uniform`` under exactly the reward study's
  protocol (:data:`marlbuf.bench.suites.rewards.SETTINGS`, its episodes, seeds and final-return
  definition), on cooperative navigation with 3 and 6 agents. Runs whose spec is identical to a run
  in ``bench/results/rewards.json`` are reused from there (``n`` = 16, 64 and uniform); one of them
  is retrained to check that the reused numbers are reproduced.

The verdict per (env, n) is the reward study's (:func:`marlbuf.bench.suites.rewards.summarize`):
"loses reward" when the mean lies below every uniform seed, every seed is lower than uniform's
same seed and Welch t <= -2. The **recommended run length** is the fastest one (geometric mean
of the time ratios over the timing workloads) that does not lose reward on any environment.

A third part, **order**, times the other kind of locality, which changes no distribution:
batches gathered in ascending slot order (``order="memory"``, the same distribution as a set)
against draw order (``order="random"``), for ``Uniform`` and ``Prioritized``
(:data:`ORDER_SAMPLERS`), per workload, capacity and storage format (:data:`ORDER_STORAGES`);
the ratio memory / random of the same sampler, paired within each round. Its reward side is the
reward study's ``uniform_memory`` case.

Run ``python -m marlbuf.bench.suites.locality [--quick] [--cache PATH] [--part
rewards|timing|order|all]`` or ``marlbuf bench locality``; the figure is :func:`plot`
(``figures/locality.png``). A single part run by hand writes ``locality-<part>[-quick].json``,
leaving the full record in place.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.suites import rewards
from marlbuf.bench.suites.sampling import BATCH, FILL_CHUNK, _marlbuf_round, _share_storage
from marlbuf.bench.tools.common import (
    RESULTS_DIR,
    markdown_table,
    paired_ratio,
    quiet_threads,
    time_interleaved,
)
from marlbuf.memory import estimate
from marlbuf.samplers import ORDERS, Neighbor, Prioritized, Sampler, Uniform
from marlbuf.workloads import Workload, episode_steps, random_steps

SUITE = "locality"
#: Neighbor run lengths swept (each divides the timing batch 1024 and the reward batch 256).
RUN_LENGTHS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
#: Parts of the suite, in the order they run.
PARTS = ("rewards", "timing", "order")
#: The order part's samplers; each is timed in every order of :data:`marlbuf.samplers.ORDERS`
#: (cases ``<sampler>_<order>``, e.g. ``uniform_memory``), against its own ``random`` case.
ORDER_SAMPLERS: dict[str, Callable[..., Sampler]] = {
    "uniform": Uniform,
    "prioritized": Prioritized,
}
#: The order part's storage formats: label -> the buffer's ``next_obs``.
ORDER_STORAGES: dict[str, str] = {"once": "once", "stored": "stored"}
#: A paired round-time ratio (memory / random) up to this counts as "not slower" (noise).
ORDER_NOISE = 1.02

FULL: dict[str, Any] = {
    "run_lengths": RUN_LENGTHS,
    "timing": {
        "workloads": [
            Workload("cooperative_navigation", 3),
            Workload("cooperative_navigation", 24),
            Workload("predator_prey", 24),
        ],
        "capacity": 100_000,
        "repeats": 41,
    },
    "rewards": {
        "envs": ["CN-3", "CN-6"],
        "seeds": [0, 1, 2],
        "episodes": rewards.FULL["episodes"],
        "block": rewards.FULL["block"],
        "settings": {},  # the reward study's SETTINGS, unchanged
        # finished runs with an identical spec are read from this result file
        "reuse_from": "rewards.json",
        # how many of the reused runs are trained again to check they are reproduced
        "repeat_check": 1,
        # retrain every reused uniform run too: a baseline trained where the new runs are
        # (floating-point results differ between CPUs), used for a second set of verdicts
        "repeat_uniform": True,
    },
    "order": {
        "workloads": [
            Workload("cooperative_navigation", 3),
            Workload("cooperative_navigation", 6),
            Workload("cooperative_navigation", 12),
            Workload("cooperative_navigation", 24),
            Workload("predator_prey", 24),
        ],
        "capacities": [100_000, 1_000_000],
        "storages": list(ORDER_STORAGES),
        "samplers": list(ORDER_SAMPLERS),
        "repeats": 41,
        # one buffer at a time; a capacity whose table would exceed this is lowered (and the
        # row says so): 1e6 rows of CN-24 are 28 GB, more than a 24 GiB machine has
        "table_budget_bytes": 6_000_000_000,
        # the draws alone (no gather), B = 1024 out of these many filled slots
        "draw_sizes": [100_000, 1_000_000],
        "draw_repeats": 41,
        "draw_inner": 20,
    },
}
#: ``marlbuf bench --quick``: CN-3 only, tiny buffer, one seed of 60 episodes at batch 64.
QUICK: dict[str, Any] = {
    "run_lengths": (1, 4, 16, 64),
    "timing": {
        "workloads": [Workload("cooperative_navigation", 3)],
        "capacity": 5_000,
        "repeats": 3,
    },
    "rewards": {
        "envs": ["CN-3"],
        "seeds": [0],
        "episodes": rewards.QUICK["episodes"],
        "block": rewards.QUICK["block"],
        "settings": rewards.QUICK["settings"],
        "reuse_from": None,
        "repeat_check": 0,
        "repeat_uniform": False,
    },
    "order": {
        "workloads": [Workload("cooperative_navigation", 3)],
        "capacities": [5_000],
        "storages": list(ORDER_STORAGES),
        "samplers": list(ORDER_SAMPLERS),
        "repeats": 3,
        "table_budget_bytes": 100_000_000,
        "draw_sizes": [5_000],
        "draw_repeats": 3,
        "draw_inner": 2,
    },
}


def label(run_length: int) -> str:
    """Sampler label of a run length (the reward study's naming): ``neighbor_<n>``."""
    return f"{rewards.NEIGHBOR_PREFIX}{run_length}"


# ----------------------------------------------------------------------------------- timing


def time_rounds(
    workloads: Sequence[Workload],
    run_lengths: Sequence[int],
    capacity: int,
    repeats: int,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Sampling-round time of uniform and every ``Neighbor(n)``, interleaved layout, per workload.

    The cases share one buffer's storage (filled with random transitions of the workload's
    sizes) and are timed in the same interleaved repeats; one row per (workload, case)."""
    rows: list[dict[str, Any]] = []
    for workload in workloads:
        if progress:
            print(f"[locality] {workload.label}: filling {capacity} steps ...", flush=True)
        specs = workload.specs()
        storage = MultiAgentReplayBuffer(specs, capacity, layout="interleaved", seed=0)
        rng = np.random.default_rng(0)
        for start in range(0, capacity, FILL_CHUNK):
            storage.extend(**random_steps(specs, min(FILL_CHUNK, capacity - start), rng))
        samplers: dict[str, Sampler] = {"uniform": Uniform(order="random")}
        samplers.update({label(n): Neighbor(n) for n in run_lengths})
        fns = {
            name: _marlbuf_round(_share_storage(storage, sampler, seed=i), "")
            for i, (name, sampler) in enumerate(samplers.items())
        }
        timings = time_interleaved(fns, repeats=repeats, warmup=1, rotate=True, keep_samples=True)
        base = timings["uniform"]
        for name, t in timings.items():
            n = None if name == "uniform" else int(name[len(rewards.NEIGHBOR_PREFIX) :])
            rows.append(
                {
                    "workload": workload.label,
                    "n_trainers": workload.n_trainers,
                    "case": name,
                    "run_length": n,
                    "references": BATCH // n if n else BATCH,
                    "ms_median": 1e3 * t["median"],
                    "ms_min": 1e3 * t["min"],
                    "ms_max": 1e3 * t["max"],
                    "first_call_ms": 1e3 * t["first_call"],
                    "time_vs_uniform": t["median"] / base["median"],
                    "time_vs_uniform_min": t["min"] / base["min"],
                    # ratio to uniform within each round, then the median over rounds
                    "time_vs_uniform_paired": paired_ratio(t, base),
                }
            )
        if progress:
            print(
                f"[locality] {workload.label}: "
                + ", ".join(f"{k} {1e3 * v['median']:.2f} ms" for k, v in timings.items()),
                flush=True,
            )
        del storage, fns
        gc.collect()
    return rows


# ------------------------------------------------------------------------------------ order


def order_capacity(workload: Workload, capacity: int, next_obs: str, budget: int) -> int:
    """``capacity``, lowered to a multiple of the fill chunk when the table of ``next_obs``
    rows would exceed ``budget`` bytes."""
    row = estimate(workload.specs(), 1, next_obs=next_obs).table_row_bytes
    fitting = budget // row // FILL_CHUNK * FILL_CHUNK
    return int(min(capacity, max(FILL_CHUNK, fitting)))


#: The draws timed alone by :func:`time_draws`: label -> (sampler kind, constructor arguments).
DRAW_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "uniform": ("uniform", {}),
    "uniform_no_replacement": ("uniform", {"replace": False}),
    "prioritized": ("prioritized", {}),
}


def time_draws(
    sizes: Sequence[int], repeats: int, inner: int, progress: bool = True
) -> list[dict[str, Any]]:
    """The index draw alone (``sampler.sample(B, size, rng)``, no gather) in both orders, per
    :data:`DRAW_CASES` entry and filled size: what drawing in ascending order costs or saves
    (prioritized: the tree descents included, every priority 1). One row per (case, size,
    order), with the ratio memory / random of the medians."""
    rows: list[dict[str, Any]] = []
    for size in sizes:
        fns: dict[str, Any] = {}
        for label, (kind, kwargs) in DRAW_CASES.items():
            for order in ORDERS:
                sampler = ORDER_SAMPLERS[kind](**kwargs, order=order)
                sampler.bind(size, 1)
                sampler.on_write(np.arange(size, dtype=np.int64))
                rng = np.random.default_rng(0)
                fns[f"{label}/{order}"] = partial(sampler.sample, BATCH, size, rng)
        timings = time_interleaved(fns, repeats=repeats, warmup=1, inner=inner, rotate=True)
        for name, t in timings.items():
            label, order = name.split("/")
            rows.append(
                {
                    "case": label,
                    "order": order,
                    "size": size,
                    "batch_size": BATCH,
                    "us_median": 1e6 * t["median"],
                    "us_min": 1e6 * t["min"],
                    "time_vs_random": t["median"] / timings[f"{label}/random"]["median"],
                }
            )
        if progress:
            print(
                f"[locality/order] draws from {size} slots: "
                + ", ".join(f"{k} {1e6 * v['median']:.1f} us" for k, v in timings.items()),
                flush=True,
            )
    return rows


def time_orders(
    workloads: Sequence[Workload],
    capacities: Sequence[int],
    storages: Sequence[str],
    repeats: int,
    table_budget_bytes: int,
    progress: bool = True,
    samplers: Sequence[str] = ("uniform",),
) -> list[dict[str, Any]]:
    """Round time of batches in ascending slot order vs draw order, per sampler of
    :data:`ORDER_SAMPLERS`, workload, capacity and storage format: every case shares one buffer
    (filled with 25-step episode streams, see :func:`marlbuf.workloads.episode_steps`)
    and is timed in the same rotated interleaved repeats; one row per (workload, capacity,
    storage, case), its ratios to the same sampler's ``random`` case."""
    cases = {f"{kind}_{order}": (kind, order) for kind in samplers for order in ORDERS}
    rows: list[dict[str, Any]] = []
    for workload in workloads:
        specs = workload.specs()
        for requested in capacities:
            for storage in storages:
                next_obs = ORDER_STORAGES[storage]
                capacity = order_capacity(workload, requested, next_obs, table_budget_bytes)
                where = f"{workload.label} {storage} {capacity}"
                if progress:
                    print(f"[locality/order] {where}: filling ...", flush=True)
                buf = MultiAgentReplayBuffer(
                    specs, capacity, layout="interleaved", seed=0, next_obs=next_obs
                )
                rng = np.random.default_rng(0)
                for start in range(0, capacity, FILL_CHUNK):
                    steps = min(FILL_CHUNK, capacity - start)
                    buf.extend(**episode_steps(specs, steps, rng, first=start))
                fns = {}
                for i, (name, (kind, order)) in enumerate(cases.items()):
                    handle = _share_storage(buf, ORDER_SAMPLERS[kind](order=order), seed=i)
                    # a sampler bound after the fill: give it the stored slots (priority 1)
                    handle.sampler.on_write(np.arange(len(buf), dtype=np.int64))
                    fns[name] = _marlbuf_round(handle, "")
                timings = time_interleaved(
                    fns, repeats=repeats, warmup=1, rotate=True, keep_samples=True
                )
                for name, t in timings.items():
                    kind, order = cases[name]
                    base = timings[f"{kind}_random"]
                    rows.append(
                        {
                            "workload": workload.label,
                            "n_trainers": workload.n_trainers,
                            "capacity": capacity,
                            "requested_capacity": requested,
                            "storage": storage,
                            "case": name,
                            "sampler": kind,
                            "order": order,
                            "ms_median": 1e3 * t["median"],
                            "ms_min": 1e3 * t["min"],
                            "ms_max": 1e3 * t["max"],
                            "first_call_ms": 1e3 * t["first_call"],
                            "time_vs_random": t["median"] / base["median"],
                            "time_vs_random_min": t["min"] / base["min"],
                            "time_vs_random_paired": paired_ratio(t, base),
                        }
                    )
                if progress:
                    print(
                        f"[locality/order] {where}: "
                        + ", ".join(f"{k} {1e3 * v['median']:.2f} ms" for k, v in timings.items())
                        + " (paired memory/random: "
                        + ", ".join(
                            f"{r['sampler']} {r['time_vs_random_paired']:.3f}"
                            for r in rows[-len(cases) :]
                            if r["order"] == "memory"
                        )
                        + ")",
                        flush=True,
                    )
                del buf, fns
                gc.collect()
    return rows


def order_verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The order part's reading per sampler: memory / random per (workload, storage,
    capacity), the largest paired ratio, and whether memory order is never slower (every paired
    ratio <= :data:`ORDER_NOISE`), i.e. whether it may be that sampler's default."""
    kinds = list(dict.fromkeys(r["sampler"] for r in rows))
    return {kind: _order_verdict([r for r in rows if r["sampler"] == kind]) for kind in kinds}


def _order_verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    memory = [r for r in rows if r["order"] == "memory"]
    ratios = {
        f"{r['workload']}/{r['storage']}/{r['capacity']}": round(r["time_vs_random_paired"], 3)
        for r in memory
    }
    paired = [r["time_vs_random_paired"] for r in memory]
    worst = max(memory, key=lambda r: r["time_vs_random_paired"]) if memory else None
    return {
        "rule": f"memory order may be the default if no paired ratio (memory / random, median "
        f"of per-round ratios) exceeds {ORDER_NOISE}",
        "paired_ratios": ratios,
        "max_paired_ratio": max(paired) if paired else None,
        "min_paired_ratio": min(paired) if paired else None,
        "geomean_paired_ratio": float(np.exp(np.mean(np.log(paired)))) if paired else None,
        "worst_case": (
            f"{worst['workload']}/{worst['storage']}/{worst['capacity']}" if worst else None
        ),
        "never_slower": bool(paired) and max(paired) <= ORDER_NOISE,
    }


# ---------------------------------------------------------------------------------- rewards


def reward_specs(cfg: dict[str, Any], run_lengths: Sequence[int]) -> list[dict[str, Any]]:
    """The training runs: uniform and every ``neighbor_<n>``, built exactly as the reward
    study builds its specs (so identical runs have identical cache keys)."""
    settings = {**rewards.SETTINGS, **cfg.get("settings", {})}
    samplers = ["uniform"] + [label(n) for n in run_lengths]
    return [
        rewards.run_spec(env, sampler, seed, int(cfg["episodes"]), int(cfg["block"]), settings)
        for seed in cfg["seeds"]
        for env in cfg["envs"]
        for sampler in samplers
    ]


def reusable_rows(path: Path | None) -> list[dict[str, Any]]:
    """Finished runs of an earlier reward-study result file (main grid and supplement)."""
    if path is None or not Path(path).is_file():
        return []
    record = json.loads(Path(path).read_text())
    found = list(record.get("rows", []))
    found += (record.get("supplement") or {}).get("rows", [])
    return [row for row in found if "spec" in row]


def train_rewards(
    cfg: dict[str, Any],
    run_lengths: Sequence[int],
    results_dir: Path,
    workers: int = rewards.WORKERS,
    progress: bool = True,
    cache: Path | None = None,
) -> dict[str, Any]:
    """Train (or reuse) every run; returns rows, the reward study's table, provenance."""
    specs = reward_specs(cfg, run_lengths)
    reuse_path = Path(results_dir) / cfg["reuse_from"] if cfg.get("reuse_from") else None
    reuse = reusable_rows(reuse_path)
    reused = {rewards.spec_key(r["spec"]): r for r in reuse}
    wanted = {rewards.spec_key(s) for s in specs}
    reused = {k: r for k, r in reused.items() if k in wanted}
    # retrain a few reused runs (neighbor ones first) under a distinct key: same protocol
    candidates = sorted(
        (s for s in specs if rewards.spec_key(s) in reused), key=lambda s: s["sampler"] == "uniform"
    )
    chosen = candidates[: cfg["repeat_check"]]
    if cfg.get("repeat_uniform"):
        chosen += [s for s in candidates if s["sampler"] == "uniform" and s not in chosen]
    checks = [{**s, "repeat_of": cfg["reuse_from"]} for s in chosen]
    in_cache = rewards.load_cache(cache)
    todo = checks + specs  # checks first: a mismatch is known before the long part
    from_cache = sum(rewards.spec_key(s) in in_cache for s in todo)
    start = time.perf_counter()
    rows_all = rewards.train_all(
        todo, workers=workers, progress=progress, cache=cache, reuse=reuse, desc=SUITE
    )
    wall = time.perf_counter() - start
    check_rows, rows = rows_all[: len(checks)], rows_all[len(checks) :]
    repeat_checks = []
    for row in check_rows:
        original = reused[
            rewards.spec_key({k: v for k, v in row["spec"].items() if k != "repeat_of"})
        ]
        repeat_checks.append(
            {
                "env": row["env"],
                "sampler": row["sampler"],
                "seed": row["seed"],
                "reused_final_return": original["final_return"],
                "retrained_final_return": row["final_return"],
                "identical_curve": row["curve"] == original["curve"],
                "max_abs_curve_diff": float(
                    np.max(np.abs(np.subtract(row["curve"], original["curve"])))
                ),
            }
        )
    table, summary = rewards.summarize(rows)
    # the same verdicts against the retrained uniform runs (every seed retrained), if any
    retrained = [r for r in check_rows if r["sampler"] == "uniform"]
    alt_table: list[dict[str, Any]] = []
    if retrained and {(r["env"], r["seed"]) for r in retrained} == {
        (r["env"], r["seed"]) for r in rows if r["sampler"] == "uniform"
    }:
        alt_table, _ = rewards.summarize(retrained + [r for r in rows if r["sampler"] != "uniform"])
    trained_here = [
        r for r in rows_all if rewards.spec_key(r["spec"]) not in reused
    ]  # includes the checks and runs read back from this suite's own cache
    return {
        "rows": rows,
        "table": table,
        "summary": summary,
        "repeat_checks": repeat_checks,
        "table_vs_retrained_uniform": alt_table,
        "provenance": {
            "runs": len(rows),
            "reused_from_result_file": len(reused),
            "reused_from": str(cfg["reuse_from"]) if reused else None,
            "read_from_cache": from_cache,
            "trained_by_this_suite": len(trained_here),
            "cpu_s_of_this_suite_runs": float(sum(r["train_wall_s"] for r in trained_here)),
            "wall_s_this_invocation": wall,
        },
    }


# --------------------------------------------------------------------------------- frontier


def frontier(
    run_lengths: Sequence[int],
    timing_rows: Sequence[dict[str, Any]],
    table: Sequence[dict[str, Any]],
    alt_table: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One row per run length: time ratios per timing workload and the return difference,
    per-seed differences, t and verdict per environment; ``qualifies`` = loses on none.

    ``alt_table`` (the same summary against another uniform baseline) adds
    ``*_alt_<env>`` columns and ``qualifies_alt``."""
    times = {(r["workload"], r["case"]): r for r in timing_rows}
    workloads = list(dict.fromkeys(r["workload"] for r in timing_rows))
    by_env = {(t["env"], t["sampler"]): t for t in table}
    envs = list(dict.fromkeys(t["env"] for t in table))
    out = []
    for n in run_lengths:
        name = label(n)
        row: dict[str, Any] = {"run_length": n, "sampler": name}
        ratios = []
        for w in workloads:
            timing = times.get((w, name))
            if timing is not None:
                row[f"time_{w}"] = timing["time_vs_uniform"]
                row[f"time_min_{w}"] = timing["time_vs_uniform_min"]
                row[f"time_paired_{w}"] = timing.get("time_vs_uniform_paired")
                ratios.append(timing["time_vs_uniform"])
        row["time_geomean"] = float(np.exp(np.mean(np.log(ratios)))) if ratios else None
        verdicts = []
        for env in envs:
            entry = by_env.get((env, name))
            if entry is None or "verdict" not in entry:
                continue
            row[f"diff_{env}"] = entry["diff_vs_uniform"]
            row[f"diff_pct_{env}"] = entry["diff_vs_uniform_pct"]
            row[f"paired_{env}"] = entry["paired_diffs"]
            row[f"t_{env}"] = entry["welch_t"]
            row[f"verdict_{env}"] = entry["verdict"]
            verdicts.append(entry["verdict"])
        row["reward_envs"] = len(verdicts)
        row["loses"] = any(v == rewards.LOSES for v in verdicts)
        row["qualifies"] = bool(verdicts) and len(verdicts) == len(envs) and not row["loses"]
        alt = {(t["env"], t["sampler"]): t for t in alt_table}
        alt_verdicts = []
        for env in envs:
            entry = alt.get((env, name))
            if entry is not None and "verdict" in entry:
                row[f"diff_pct_alt_{env}"] = entry["diff_vs_uniform_pct"]
                row[f"t_alt_{env}"] = entry["welch_t"]
                row[f"verdict_alt_{env}"] = entry["verdict"]
                alt_verdicts.append(entry["verdict"])
        if alt_verdicts:
            row["qualifies_alt"] = len(alt_verdicts) == len(envs) and rewards.LOSES not in (
                alt_verdicts
            )
        out.append(row)
    return out


def recommend(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run length (lowest ``time_geomean``) that loses reward on no environment.

    ``default_run_length`` is that run length if it is longer than 1; when no run length > 1
    qualifies it is 1 (the neighbor sampler then draws B distinct slots, no runs)."""
    qualifying = [r for r in rows if r["qualifies"] and r.get("time_geomean") is not None]
    best = min(qualifying, key=lambda r: r["time_geomean"]) if qualifying else None
    longer = [r for r in qualifying if r["run_length"] > 1]
    return {
        "rule": "fastest run length (geometric mean of median time ratios vs uniform) whose "
        f"verdict is not {rewards.LOSES!r} on any environment",
        "qualifying": [r["run_length"] for r in qualifying],
        "losing": [r["run_length"] for r in rows if r["loses"]],
        "recommended_run_length": best["run_length"] if best else None,
        "recommended_time_geomean": best["time_geomean"] if best else None,
        "any_longer_than_1_qualifies": bool(longer),
        "default_run_length": best["run_length"] if (best and longer) else 1,
    }


def _fmt_pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}%"


def frontier_markdown(rows: Sequence[dict[str, Any]], workloads: Sequence[str]) -> str:
    """The frontier as a markdown table (time ratio: of medians [of minima] (median of per-round
    ratios); return diff, t, verdict)."""
    envs = sorted(
        {
            k[len("verdict_") :]
            for r in rows
            for k in r
            if k.startswith("verdict_") and not k.startswith("verdict_alt_")
        }
    )
    display = []
    for r in rows:
        d: dict[str, Any] = {"run length": r["run_length"]}
        for w in workloads:
            if f"time_{w}" in r:
                paired = r.get(f"time_paired_{w}")
                d[f"time {w}"] = f"{r[f'time_{w}']:.2f} [{r[f'time_min_{w}']:.2f}]" + (
                    f" ({paired:.2f})" if paired is not None else ""
                )
        for env in envs:
            if f"verdict_{env}" in r:
                d[f"return {env}"] = (
                    f"{r[f'diff_{env}']:+.1f} ({_fmt_pct(r[f'diff_pct_{env}'])}), "
                    f"t {r[f't_{env}']:+.1f}: {r[f'verdict_{env}']}"
                )
        d["qualifies"] = "yes" if r["qualifies"] else "no"
        if "qualifies_alt" in r:
            d["vs retrained uniform"] = ", ".join(
                f"{env} {r[f'diff_pct_alt_{env}']:+.1f}% (t {r[f't_alt_{env}']:+.1f})"
                for env in envs
                if f"verdict_alt_{env}" in r
            ) + (": qualifies" if r["qualifies_alt"] else ": loses")
        display.append(d)
    columns = list(dict.fromkeys(k for d in display for k in d))
    return markdown_table(display, columns)


# ---------------------------------------------------------------------------------- the suite


def run(
    quick: bool = False,
    progress: bool = True,
    workers: int = rewards.WORKERS,
    cache: Path | None = None,
    parts: Sequence[str] = PARTS,
    results_dir: Path = RESULTS_DIR,
) -> dict[str, Any]:
    """Both parts (or those in ``parts``), the frontier and the recommendation."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"parts must be among {list(PARTS)}; got {unknown}")
    cfg = QUICK if quick else FULL
    run_lengths = tuple(cfg["run_lengths"])
    threads = quiet_threads()
    reward_part: dict[str, Any] = {"rows": [], "table": [], "summary": {}, "repeat_checks": []}
    timing_rows: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    if "rewards" in parts:
        start = time.perf_counter()
        reward_part = train_rewards(
            cfg["rewards"], run_lengths, results_dir, workers, progress, cache
        )
        walls["rewards"] = time.perf_counter() - start
    if "timing" in parts:
        start = time.perf_counter()
        t = cfg["timing"]
        timing_rows = time_rounds(
            t["workloads"], run_lengths, t["capacity"], t["repeats"], progress
        )
        walls["timing"] = time.perf_counter() - start
    order_rows: list[dict[str, Any]] = []
    order_draws: list[dict[str, Any]] = []
    order_cfg = cfg.get("order")
    if "order" in parts and order_cfg:
        start = time.perf_counter()
        order_rows = time_orders(
            order_cfg["workloads"],
            order_cfg["capacities"],
            order_cfg["storages"],
            order_cfg["repeats"],
            order_cfg["table_budget_bytes"],
            progress,
            order_cfg.get("samplers", ("uniform",)),
        )
        if order_cfg.get("draw_sizes"):
            order_draws = time_draws(
                order_cfg["draw_sizes"],
                order_cfg["draw_repeats"],
                order_cfg["draw_inner"],
                progress,
            )
        walls["order"] = time.perf_counter() - start
    order = order_verdict(order_rows)
    workloads = list(dict.fromkeys(r["workload"] for r in timing_rows))
    alt_table = reward_part.get("table_vs_retrained_uniform") or []
    front = frontier(run_lengths, timing_rows, reward_part["table"], alt_table)
    rec = recommend(front)
    if alt_table:
        alt_rows = [{**r, "qualifies": r.get("qualifies_alt", False)} for r in front]
        alt_rows = [{**r, "loses": not r["qualifies"]} for r in alt_rows]
        rec["vs_retrained_uniform"] = {
            k: v
            for k, v in recommend(alt_rows).items()
            if k in ("qualifying", "recommended_run_length", "default_run_length")
        }
    baseline = {
        t["env"]: {
            "final_mean": t["final_mean"],
            "final_std": t["final_std"],
            "final_min": t["final_min"],
            "final_max": t["final_max"],
            "finals": t["finals"],
        }
        for t in reward_part["table"]
        if t["sampler"] == "uniform"
    }
    timing_md = markdown_table(
        timing_rows,
        [
            "workload",
            "case",
            "ms_median",
            "ms_min",
            "time_vs_uniform",
            "time_vs_uniform_min",
            "time_vs_uniform_paired",
        ],
    )
    order_md = markdown_table(
        [r for r in order_rows if r["order"] == "memory"],
        [
            "sampler",
            "workload",
            "storage",
            "capacity",
            "ms_median",
            "time_vs_random",
            "time_vs_random_min",
            "time_vs_random_paired",
        ],
    )
    rc = cfg["rewards"]
    return {
        "rows": timing_rows,
        "order_rows": order_rows,
        "order_draws": order_draws,
        "order": order,
        "frontier": front,
        "recommendation": rec,
        "uniform_baseline": baseline,
        "reward_rows": reward_part["rows"],
        "reward_table": reward_part["table"],
        "reward_repeat_checks": reward_part["repeat_checks"],
        "reward_table_vs_retrained_uniform": alt_table,
        "summary": {
            **{k: rec[k] for k in ("recommended_run_length", "default_run_length", "qualifying")},
            "losing": rec["losing"],
            "frontier": {
                str(r["run_length"]): {
                    k: (round(v, 3) if isinstance(v, float) else v)
                    for k, v in r.items()
                    if k.startswith(("time_", "diff_pct_", "verdict_"))
                    and not k.startswith(("time_min_", "time_paired_"))
                }
                for r in front
            },
            "repeat_checks_identical": [c["identical_curve"] for c in reward_part["repeat_checks"]],
            "vs_retrained_uniform": rec.get("vs_retrained_uniform"),
            "order": {
                kind: {
                    k: verdict[k]
                    for k in (
                        "never_slower",
                        "max_paired_ratio",
                        "geomean_paired_ratio",
                        "worst_case",
                    )
                }
                for kind, verdict in order.items()
            },
        },
        "markdown": frontier_markdown(front, workloads)
        + "\n\n"
        + timing_md
        + ("\n\nMemory order vs draw order:\n\n" + order_md if order_rows else ""),
        "config": {
            "run_lengths": list(run_lengths),
            "parts": list(parts),
            "timing": {
                "batch_size": BATCH,
                "layout": "interleaved",
                "capacity": cfg["timing"]["capacity"],
                "repeats": cfg["timing"]["repeats"],
                "workloads": [w.label for w in cfg["timing"]["workloads"]],
                "what": "one MADDPG sampling round (sample_for_trainers); every case shares "
                "one buffer's storage; repeats interleaved, the order rotated each round; "
                "ratios vs uniform of the medians, of the minima, and the median of the "
                "per-round ratios (paired)",
                "threads": threads,
            },
            "order": (
                {
                    "batch_size": BATCH,
                    "layout": "interleaved",
                    "workloads": [w.label for w in order_cfg["workloads"]],
                    "capacities": list(order_cfg["capacities"]),
                    "storages": {s: ORDER_STORAGES[s] for s in order_cfg["storages"]},
                    "samplers": list(order_cfg.get("samplers", ("uniform",))),
                    "repeats": order_cfg["repeats"],
                    "table_budget_bytes": order_cfg["table_budget_bytes"],
                    "draw_sizes": list(order_cfg.get("draw_sizes", [])),
                    "draw_repeats": order_cfg.get("draw_repeats"),
                    "draw_inner": order_cfg.get("draw_inner"),
                    "data": "25-step episode streams (episode_steps)",
                    "what": "one MADDPG sampling round (sample_for_trainers) per sampler in "
                    "memory order and in draw order, every case sharing one buffer's storage "
                    "(prioritized: fresh trees, every priority 1); repeats interleaved, the "
                    "order rotated each round; ratio memory / random of the same sampler: of "
                    "the medians, of the minima, and the median of the per-round ratios",
                }
                if order_cfg
                else None
            ),
            "rewards": {
                "envs": list(rc["envs"]),
                "seeds": list(rc["seeds"]),
                "episodes": rc["episodes"],
                "block": rc["block"],
                "settings": {**rewards.SETTINGS, **rc.get("settings", {})},
                "final_fraction": rewards.FINAL_FRACTION,
                "protocol": "the rewards suite's (bench/suites/rewards.py), unchanged",
                "workers": workers,
                **reward_part.get("provenance", {}),
            },
            "wall_s": walls,
        },
    }


def plot(record: dict[str, Any], out_dir: Path | str) -> Path:
    """The frontier: return difference vs uniform (%) against sampling-time ratio, one panel
    per reward environment, one line per timing workload; hollow markers lose reward; the
    band is uniform's seed range. Writes ``<out_dir>/locality.png``."""
    from marlbuf.bench.tools.plots import _plt

    plt = _plt()
    front = record.get("frontier", [])
    workloads = list(dict.fromkeys(r["workload"] for r in record.get("rows", [])))
    envs = list(record.get("uniform_baseline", {}))
    fig, axes = plt.subplots(1, max(1, len(envs)), figsize=(6.0 * max(1, len(envs)), 4.6))
    axes = np.atleast_1d(axes)
    for ax, env in zip(axes, envs or [None]):
        if env is None:
            ax.set_title("no reward runs in this record")
            continue
        base = record["uniform_baseline"][env]
        scale = 100.0 / abs(base["final_mean"]) if base["final_mean"] else 1.0
        low = (base["final_min"] - base["final_mean"]) * scale
        high = (base["final_max"] - base["final_mean"]) * scale
        ax.axhspan(low, high, color="grey", alpha=0.2, label="uniform's seed range")
        ax.axhline(0.0, color="grey", lw=0.8)
        for i, w in enumerate(workloads):
            pts = [r for r in front if f"time_{w}" in r and f"diff_pct_{env}" in r]
            if not pts:
                continue
            xs = [r[f"time_{w}"] for r in pts]
            ys = [r[f"diff_pct_{env}"] for r in pts]
            color = f"C{i}"
            ax.plot(xs, ys, "-", color=color, lw=1.0, alpha=0.6)
            for r, x, y in zip(pts, xs, ys):
                paired = np.array(r[f"paired_{env}"]) * scale
                yerr = (
                    [[max(0.0, y - paired.min())], [max(0.0, paired.max() - y)]]
                    if len(paired)
                    else None
                )
                loses = r[f"verdict_{env}"] == rewards.LOSES
                ax.errorbar(
                    x,
                    y,
                    yerr=yerr,
                    fmt="o",
                    color=color,
                    mfc="white" if loses else color,
                    ms=6,
                    capsize=2,
                    lw=0.8,
                )
                if i == 0:
                    ax.annotate(
                        str(r["run_length"]),
                        (x, y),
                        textcoords="offset points",
                        xytext=(4, 4),
                        fontsize=8,
                    )
            ax.plot([], [], "o-", color=color, label=f"time on {w}")
        ax.plot([1.0], [0.0], "k*", ms=9, label="uniform")
        ax.plot([], [], "o", mfc="white", color="k", label="loses reward")
        ax.set_title(f"{env}: neighbor run length n (labels)")
        ax.set_xlabel("sampling-round time / uniform (median; lower is faster)")
        ax.set_ylabel("final return vs uniform (%; bars: per-seed min-max)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    quick = " (quick sizes)" if record.get("quick") else ""
    fig.suptitle(f"Neighbor run length: sampling time vs reward{quick}", fontsize=10)
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "locality.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":  # pragma: no cover
    import argparse

    from marlbuf.bench.tools.common import write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=rewards.WORKERS)
    parser.add_argument("--cache", type=Path, default=None, help="JSON-lines file of finished runs")
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    ns = parser.parse_args()
    chosen = PARTS if ns.part == "all" else (ns.part,)
    payload = run(quick=ns.quick, workers=ns.workers, cache=ns.cache, parts=chosen)
    print(payload["markdown"])
    print(json.dumps(payload["recommendation"], indent=1))
    print(json.dumps(payload["order"], indent=1))
    # one part alone gets a file of its own: the suite's record (every part) stays as it is
    path = write_result(SUITE if ns.part == "all" else f"{SUITE}-{ns.part}", payload, ns.quick)
    print(path)
    if ns.part == "all":
        print(
            plot(
                json.loads(path.read_text()),
                RESULTS_DIR / ("figures-quick" if ns.quick else "figures"),
            )
        )
