"""One MADDPG update round (every trainer once), split by phase: faithful vs marlbuf.

* **baseline** — the structure of openai/maddpg: per-agent NumPy arrays (``agent_major``),
  each trainer draws its own indices and gathers every agent's fields (N² gathers), then its
  own per-agent networks update (:class:`marlbuf.algos.LoopLearner`).
* **marlbuf** — the ``interleaved`` layout gathered into one round block (N wide-row gathers,
  zero-copy critic inputs) and the batched learner (weights stacked over trainers).

Both run the same update maths (tested equal to 1e-10 in float64) from the same weights on the
same kind of data, in the same process, repeats interleaved. Buffers hold synthetic
transitions of the paper's observation sizes (an update does not care where the data came
from); one torch thread.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import markdown_table, quiet_threads
from marlbuf.workloads import PAPER_WORKLOADS, Workload, random_steps

SUITE = "update"

#: (label, TrainConfig overrides) of the two configurations compared.
CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": {"formulation": "loop", "layout": "agent_major"},
    "marlbuf": {"formulation": "batched", "layout": "interleaved"},
}

#: Extra configurations measured at the largest sizes (full run only): the background-thread
#: gather of the loop formulation against the same loop without it, and the shared-index
#: deviation of the batched trainer.
EXTRA_CONFIGS: dict[str, dict[str, Any]] = {
    "loop_interleaved": {"formulation": "loop", "layout": "interleaved"},
    "loop_interleaved_overlap": {
        "formulation": "loop",
        "layout": "interleaved",
        "overlap_gather": True,
    },
    "marlbuf_shared_index": {
        "formulation": "batched",
        "layout": "interleaved",
        "shared_index": True,
    },
}
#: The baseline on mpe2's own environment code (used by the end_to_end suite, where the env
#: step is part of what is timed).
FAITHFUL: dict[str, Any] = {**CONFIGS["baseline"], "env_impl": "mpe2"}
ALL_CONFIGS = {**CONFIGS, **EXTRA_CONFIGS, "faithful": FAITHFUL}
EXTRA_FOR = ("CN-24", "PP-24+8")

FULL_WORKLOADS = PAPER_WORKLOADS  # CN 3/6/12/24, PP 3+1 and 24+8
#: Sizes of the quick run (``marlbuf bench --quick``); tests patch it smaller.
QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
    "batch_size": 256,
    "capacity": 3000,
    "repeats": 2,
}

TABLE_COLUMNS = [
    "workload",
    "config",
    "total_s",
    "sampling_s",
    "target_q_s",
    "q_p_loss_s",
    "speedup_vs_baseline",
]
UPDATE_PHASES = ("update_all_trainers", "sampling", "target_q", "q_p_loss", "priority_update")


def make_runner(
    workload: Workload, overrides: dict[str, Any], batch_size: int, capacity: int, **extra: Any
) -> Any:
    """A :class:`~marlbuf.algos.Runner` for ``workload`` with ``capacity`` synthetic
    transitions already stored (so every round samples from a full-size buffer)."""
    from marlbuf.algos import PhaseTimer, Runner, TrainConfig

    config = TrainConfig(
        env=workload.env,
        n_agents=workload.n,
        batch_size=batch_size,
        buffer_size=capacity,
        warmup_steps=batch_size,
        seed=0,
        **overrides,
        **extra,
    )
    runner = Runner(config, profiler=PhaseTimer())
    specs = runner.buffer.specs
    rng = np.random.default_rng(0)
    chunk = 5000
    for start in range(0, capacity, chunk):
        steps = min(chunk, capacity - start)
        data = random_steps(specs, steps, rng)
        runner.buffer.extend(**data)
    return runner


def time_rounds(
    runners: dict[str, Any], repeats: int, step: Any
) -> dict[str, dict[str, list[float]]]:
    """Call ``step(runner)`` for each runner in turn, ``repeats`` times after one warm-up;
    per runner, per phase (and ``"total"``), the seconds of each repeat."""
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in runners}
    for rep in range(repeats + 1):
        for name, runner in runners.items():
            timer = runner.profiler
            before = timer.snapshot()
            start = time.perf_counter()
            step(runner)
            total = time.perf_counter() - start
            if rep == 0:
                continue  # warm-up: JIT, page faults, allocator
            after = timer.snapshot()
            samples[name].setdefault("total", []).append(total)
            for phase in after:
                samples[name].setdefault(phase, []).append(after[phase] - before.get(phase, 0.0))
    return samples


def median_rows(
    workload: Workload, samples: dict[str, dict[str, list[float]]], phases: tuple[str, ...]
) -> list[dict[str, Any]]:
    rows = []
    for name, per_phase in samples.items():
        row: dict[str, Any] = {
            "workload": workload.label,
            "env": workload.env,
            "n": workload.n,
            "trainers": workload.n_trainers,
            "config": name,
            **ALL_CONFIGS[name],
            "total_s": float(np.median(per_phase["total"])),
            "total_min_s": float(np.min(per_phase["total"])),
            "repeats": len(per_phase["total"]),
        }
        for phase in phases:
            row[f"{phase}_s"] = float(np.median(per_phase.get(phase, [0.0])))
        rows.append(row)
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    threads = quiet_threads()
    workloads = QUICK["workloads"] if quick else FULL_WORKLOADS
    batch_size = QUICK.get("batch_size", 256) if quick else 1024
    repeats = QUICK["repeats"] if quick else 5
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for workload in workloads:
        capacity = QUICK["capacity"] if quick else (20_000 if workload.n >= 12 else 50_000)
        configs = dict(CONFIGS)
        if not quick and workload.label in EXTRA_FOR:
            configs.update(EXTRA_CONFIGS)
        runners = {
            name: make_runner(workload, overrides, batch_size, capacity)
            for name, overrides in configs.items()
        }
        samples = time_rounds(runners, repeats, lambda r: r.update_round())
        for runner in runners.values():
            runner.close()
        del runners
        workload_rows = median_rows(workload, samples, UPDATE_PHASES)
        base, ours = workload_rows[:2]
        speedup = base["total_s"] / ours["total_s"]
        for row in workload_rows:
            row["speedup_vs_baseline"] = base["total_s"] / row["total_s"]
            row["capacity"] = capacity
        rows += workload_rows
        summary[f"speedup_{workload.label}"] = round(speedup, 3)
        by_name = {row["config"]: row for row in workload_rows}
        if "loop_interleaved_overlap" in by_name:
            summary[f"overlap_gain_{workload.label}"] = round(
                by_name["loop_interleaved"]["total_s"]
                / by_name["loop_interleaved_overlap"]["total_s"],
                3,
            )
            summary[f"shared_index_speedup_{workload.label}"] = round(
                base["total_s"] / by_name["marlbuf_shared_index"]["total_s"], 3
            )
    return {
        "rows": rows,
        "markdown": markdown_table(rows, TABLE_COLUMNS),
        "summary": summary,
        "config": {
            "batch_size": batch_size,
            "repeats": repeats,
            "capacity": "3000 (quick) / 50000 (N < 12) / 20000 (N >= 12)",
            "threads": threads,
            "configs": CONFIGS,
            "extra_configs": {"workloads": list(EXTRA_FOR), **EXTRA_CONFIGS},
            "what": "one update round (every trainer once), median seconds, by phase",
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
