"""Time per 100 env steps of MADDPG training, environment included: faithful vs marlbuf.

100 steps of the full loop (action selection, env step, buffer add for every step, and the one
update round that falls in every 100 steps), for the same two configurations as
:mod:`marlbuf.bench.update`:

* **baseline** — per-agent networks (action selection one actor at a time, per-agent update
  loop) over per-agent NumPy arrays (``agent_major``);
* **marlbuf** — stacked actors and the batched learner over the ``interleaved`` layout.

Both use the same environment (:mod:`marlbuf.envs`) and the paper's hyperparameters; the buffer
is pre-filled with synthetic transitions so every measured window holds exactly one update.
"""

from __future__ import annotations

from typing import Any

from marlbuf.bench.common import quiet_threads
from marlbuf.bench.update import CONFIGS, FULL_WORKLOADS, make_runner, median_rows, time_rounds
from marlbuf.bench.workloads import Workload

SUITE = "end_to_end"

QUICK_WORKLOADS = [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)]
LOOP_PHASES = (
    "action_selection",
    "env_step",
    "buffer_add",
    "update_all_trainers",
    "sampling",
    "target_q",
    "q_p_loss",
)
STEPS = 100


def run(quick: bool = False) -> dict[str, Any]:
    threads = quiet_threads()
    workloads = QUICK_WORKLOADS if quick else FULL_WORKLOADS
    batch_size = 256 if quick else 1024
    repeats = 2 if quick else 3
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for workload in workloads:
        capacity = 3000 if quick else (20_000 if workload.n >= 12 else 50_000)
        runners = {
            name: make_runner(workload, overrides, batch_size, capacity)
            for name, overrides in CONFIGS.items()
        }
        samples = time_rounds(runners, repeats, lambda r: r.run_steps(STEPS))
        for runner in runners.values():
            assert runner.update_rounds == repeats + 1  # one round per window
            runner.close()
        del runners
        workload_rows = median_rows(workload, samples, LOOP_PHASES)
        base = workload_rows[0]
        for row in workload_rows:
            row["steps"] = STEPS
            row["speedup_vs_baseline"] = base["total_s"] / row["total_s"]
            row["env_share"] = row["env_step_s"] / row["total_s"]
            row["capacity"] = capacity
        rows += workload_rows
        summary[f"speedup_{workload.label}"] = round(workload_rows[1]["speedup_vs_baseline"], 3)
    return {
        "rows": rows,
        "summary": summary,
        "config": {
            "batch_size": batch_size,
            "repeats": repeats,
            "steps_per_window": STEPS,
            "capacity": "3000 (quick) / 50000 (N < 12) / 20000 (N >= 12)",
            "threads": threads,
            "configs": CONFIGS,
            "what": "seconds per 100 env steps incl. env and one update round, median, by phase",
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
