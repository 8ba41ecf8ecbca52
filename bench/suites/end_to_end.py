"""Time per 100 env steps of MADDPG training, environment included: faithful vs marlbuf.

100 steps of the full loop (action selection, env step, buffer add for every step, and the one
update round that falls in every 100 steps), for the same two configurations as
:mod:`marlbuf.bench.suites.update`:

* **baseline** — per-agent networks (action selection one actor at a time, per-agent update
  loop) over per-agent NumPy arrays (``agent_major``);
* **marlbuf** — stacked actors and the batched learner over the ``interleaved`` layout.

Both use the same environment (:mod:`marlbuf.envs`, vectorized step) and the paper's
hyperparameters; the buffer is pre-filled with synthetic transitions so every measured window
holds exactly one update. A third configuration, **faithful**, is the baseline running mpe2's
own (unvectorized) environment code — what the original trainers ran — so the whole-system
gain, environment included, is reported too (``speedup_vs_faithful``).
"""

from __future__ import annotations

from typing import Any

from marlbuf.algos.runner import PHASES
from marlbuf.bench.suites.update import (
    CONFIGS,
    FAITHFUL,
    FULL_WORKLOADS,
    make_runner,
    median_rows,
    time_rounds,
)
from marlbuf.bench.tools.common import markdown_table, quiet_threads
from marlbuf.workloads import Workload

SUITE = "end_to_end"

#: Sizes of the quick run (``marlbuf bench --quick``); tests patch it smaller.
QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
    "batch_size": 256,
    "capacity": 3000,
    "repeats": 2,
}
LOOP_PHASES = tuple(p for p in PHASES if p != "priority_update")  # uniform runs only
STEPS = 100

#: Short learning runs compared across samplers (full run only): cooperative navigation with 3
#: agents, the fast-learning settings of the seeded learning test.
CURVE_SAMPLERS = ("uniform", "neighbor", "prioritized", "prioritized_neighbor")
CURVE_SETTINGS: dict[str, Any] = {
    "batch_size": 128,
    "warmup_steps": 1250,
    "update_every": 5,
    "run_length": 16,
}
CURVE_EPISODES = 500


def reward_curves(episodes: int = CURVE_EPISODES) -> list[dict[str, Any]]:
    """One seeded run per sampler: returns of the untrained and the trained policy on the same
    40 evaluation episodes, the training curve in 50-episode means, and the wall time."""
    import time

    import numpy as np

    from marlbuf.algos import Runner, TrainConfig

    rows = []
    for sampler in CURVE_SAMPLERS:
        config = TrainConfig(
            sampler=sampler,
            buffer_size=20_000,
            seed=0,
            beta_anneal_rounds=episodes * 25 // CURVE_SETTINGS["update_every"],
            **CURVE_SETTINGS,
        )
        runner = Runner(config)
        untrained = float(np.mean(runner.evaluate(40)))
        start = time.perf_counter()
        returns = [r.ret_original for r in runner.train(episodes)]
        wall = time.perf_counter() - start
        trained = float(np.mean(runner.evaluate(40)))
        means = [float(np.mean(returns[i : i + 50])) for i in range(0, len(returns), 50)]
        rows.append(
            {
                "sampler": sampler,
                "episodes": episodes,
                "untrained_return": untrained,
                "trained_return": trained,
                "curve_50ep_means": means,
                "train_wall_s": wall,
            }
        )
        runner.close()
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    threads = quiet_threads()
    workloads = QUICK["workloads"] if quick else FULL_WORKLOADS
    batch_size = QUICK.get("batch_size", 256) if quick else 1024
    repeats = QUICK["repeats"] if quick else 3
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for workload in workloads:
        capacity = QUICK["capacity"] if quick else (20_000 if workload.n >= 12 else 50_000)
        configs = {**CONFIGS, "faithful": FAITHFUL}
        runners = {
            name: make_runner(workload, overrides, batch_size, capacity)
            for name, overrides in configs.items()
        }
        samples = time_rounds(runners, repeats, lambda r: r.run_steps(STEPS))
        for runner in runners.values():
            assert runner.update_rounds == repeats + 1  # one round per window
            runner.close()
        del runners
        workload_rows = median_rows(workload, samples, LOOP_PHASES)
        base = workload_rows[0]
        faithful = next(r for r in workload_rows if r["config"] == "faithful")
        for row in workload_rows:
            row["steps"] = STEPS
            row["speedup_vs_baseline"] = base["total_s"] / row["total_s"]
            row["speedup_vs_faithful"] = faithful["total_s"] / row["total_s"]
            row["env_share"] = row["env_step_s"] / row["total_s"]
            row["capacity"] = capacity
        rows += workload_rows
        ours = next(r for r in workload_rows if r["config"] == "marlbuf")
        summary[f"speedup_{workload.label}"] = round(ours["speedup_vs_baseline"], 3)
        summary[f"speedup_vs_faithful_{workload.label}"] = round(ours["speedup_vs_faithful"], 3)
    curves = [] if quick else reward_curves()
    for curve in curves:
        summary[f"trained_return_{curve['sampler']}"] = round(curve["trained_return"], 1)
    columns = ["workload", "config", "total_s", "action_selection_s", "env_step_s"]
    columns += ["update_all_trainers_s", "speedup_vs_baseline", "speedup_vs_faithful"]
    return {
        "rows": rows,
        "markdown": markdown_table(rows, columns),
        "reward_curves": curves,
        "summary": summary,
        "config": {
            "batch_size": batch_size,
            "repeats": repeats,
            "steps_per_window": STEPS,
            "capacity": "3000 (quick) / 50000 (N < 12) / 20000 (N >= 12)",
            "threads": threads,
            "configs": {**CONFIGS, "faithful": FAITHFUL},
            "what": "seconds per 100 env steps incl. env and one update round, median, by phase",
            "reward_curves": {
                "env": "cooperative_navigation, 3 agents, seed 0",
                "episodes": CURVE_EPISODES,
                **CURVE_SETTINGS,
            },
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
