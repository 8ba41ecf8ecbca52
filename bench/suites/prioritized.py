"""Prioritized sampling benchmarks.

Two comparisons, each timed side by side in one process (``time_interleaved``):

1. **PER machinery at capacity 1e6**: one ``sample(B=1024)`` plus one
   ``update_priorities(1024)`` with fresh TD errors, for

   * ``marlbuf_sampler``: :class:`marlbuf.samplers.Prioritized` alone (indices + weights),
   * ``marlbuf_buffer``: the same through ``MultiAgentReplayBuffer`` (gather of a one-agent,
     five-float transition, generation check, validation),
   * ``cpprb``: ``cpprb.PrioritizedReplayBuffer`` holding the same five floats per step
     (skipped with a message when cpprb is not installed: ``pip install 'marlbuf[peers]'``),
   * ``numpy``: a priority array with ``cumsum`` + ``searchsorted`` per batch.

2. **The MADDPG sampling round** (``buf.sample_for_trainers(1024)``: one prioritized batch per
   trainer, all agents gathered) with :class:`PrioritizedNeighbor` vs :class:`Prioritized`, for
   cooperative navigation and predator-prey with N = 3, 6, 12 (predator-prey also trains its
   prey: N + M trainers), both storage layouts, capacity 1e5. Both samplers use the same
   storage; their trees hold the same priorities. Two priority states:

   * ``uniform``: every slot's normalised priority ``p / max p`` uniform in ``(0, 1)`` (runs of
     1, 2 and 4 rows all occur; 2.6 rows per reference on average under ``P_ref`` with
     alpha 0.6),
   * ``fresh``: every slot at the running maximum, as right after writing (every run has 4
     rows: the best case for the locality sampler).

   Also timed: the same round writing into batches from an earlier round
   (``sample_for_trainers(1024, out=...)``: no fresh pages to fault in), and the index
   generation alone (``sampler.sample`` for every trainer, no gather), also with
   ``weights="inherit"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.tools.common import markdown_table, quiet_threads, time_interleaved, write_result
from marlbuf.samplers import Prioritized, PrioritizedNeighbor
from marlbuf.workloads import Workload, random_steps

SUITE = "prioritized"

BATCH = 1024
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6


# ------------------------------------------------------------------------------ part 1: PER
class NumpyPER:
    """Proportional PER the plain-NumPy way: a priority array, cumulative sums per batch."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.mass = np.ones(capacity, dtype=np.float64)  # priority ** alpha
        self.rng = rng

    def sample(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        cumulative = np.cumsum(self.mass)
        targets = self.rng.random(batch_size) * cumulative[-1]
        indices = np.searchsorted(cumulative, targets, side="right")
        mass = self.mass[indices]
        weights = (mass.min() / mass) ** BETA
        return indices, weights.astype(np.float32)

    def update(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        self.mass[indices] = (np.abs(td_errors) + EPS) ** ALPHA


def bench_per(capacity: int, repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Part 1: sample + update_priorities at ``capacity``, ours vs cpprb vs NumPy."""
    rng = np.random.default_rng(0)
    td_pool = rng.normal(size=(64, BATCH))  # fresh TD errors for every call, same for all cases
    counter = {"i": 0}

    def next_td() -> np.ndarray:
        counter["i"] += 1
        return td_pool[counter["i"] % td_pool.shape[0]]

    initial = np.abs(rng.normal(size=capacity)) + EPS
    all_slots = np.arange(capacity, dtype=np.int64)
    no_stale = np.zeros(capacity, dtype=bool)
    batch_fresh = np.zeros(BATCH, dtype=bool)

    sampler = Prioritized(alpha=ALPHA, beta=BETA, eps=EPS)
    sampler.bind(capacity, 1)
    sampler.on_write(all_slots)
    sampler.update_priorities(all_slots, initial, 0, no_stale)

    def marlbuf_sampler() -> None:
        indices, _ = sampler.sample(BATCH, capacity, rng, 0)
        sampler.update_priorities(indices, next_td(), 0, batch_fresh)

    spec = {"agent": AgentSpec(obs_shape=(1,), action_shape=(1,))}
    buf = MultiAgentReplayBuffer(
        spec, capacity, sampler=Prioritized(alpha=ALPHA, beta=BETA, eps=EPS), seed=1
    )
    zeros = np.zeros((capacity, 1), dtype=np.float32)
    buf.extend(
        obs={"agent": zeros},
        action={"agent": zeros},
        reward={"agent": zeros[:, 0]},
        next_obs={"agent": zeros},
        done={"agent": zeros[:, 0]},
    )
    buf.update_priorities(
        all_slots, initial, trainer=0, generations=buf.write_generation[all_slots]
    )

    def marlbuf_buffer() -> None:
        batch = buf.sample(BATCH)
        buf.update_priorities(batch.indices, next_td(), trainer=0, generations=batch.generations)

    numpy_per = NumpyPER(capacity, rng)
    numpy_per.update(all_slots, initial)

    def numpy_baseline() -> None:
        indices, _ = numpy_per.sample(BATCH)
        numpy_per.update(indices, next_td())

    cases = {
        "marlbuf_sampler": marlbuf_sampler,
        "marlbuf_buffer": marlbuf_buffer,
        "numpy": numpy_baseline,
    }
    notes: dict[str, Any] = {}
    try:
        from cpprb import PrioritizedReplayBuffer
    except ImportError:
        notes["cpprb"] = "skipped: cpprb not installed (pip install 'marlbuf[peers]')"
    else:
        fields: dict[str, dict[str, Any]] = {
            "obs": {},
            "act": {},
            "rew": {},
            "next_obs": {},
            "done": {},
        }
        peer = PrioritizedReplayBuffer(capacity, fields, alpha=ALPHA, eps=EPS)
        column = np.zeros(capacity, dtype=np.float32)
        peer.add(obs=column, act=column, rew=column, next_obs=column, done=column)
        peer.update_priorities(all_slots, initial)

        def cpprb_case() -> None:
            sample = peer.sample(BATCH, BETA)
            peer.update_priorities(sample["indexes"], np.abs(next_td()))

        cases["cpprb"] = cpprb_case
    timings = time_interleaved(cases, repeats=repeats, warmup=3)
    ours = timings["marlbuf_sampler"]["median"]
    rows = [
        {
            "part": "per",
            "case": name,
            "capacity": capacity,
            "batch": BATCH,
            "us_median": 1e6 * t["median"],
            "us_min": 1e6 * t["min"],
            "us_max": 1e6 * t["max"],
            "time_vs_marlbuf_sampler": t["median"] / ours,
        }
        for name, t in timings.items()
    ]
    summary: dict[str, Any] = {
        "per_vs_numpy": timings["numpy"]["median"] / ours,
        "per_buffer_vs_numpy": timings["numpy"]["median"] / timings["marlbuf_buffer"]["median"],
    }
    if "cpprb" in timings:
        summary["per_vs_cpprb"] = timings["cpprb"]["median"] / ours
        summary["per_buffer_vs_cpprb"] = (
            timings["cpprb"]["median"] / timings["marlbuf_buffer"]["median"]
        )
    summary.update(notes)
    return rows, summary


# ------------------------------------------------------------------------- part 2: MADDPG
def _set_priorities(
    samplers: list[Prioritized], n_trainers: int, capacity: int, scenario: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    slots = np.arange(capacity, dtype=np.int64)
    no_stale = np.zeros(capacity, dtype=bool)
    for sampler in samplers:
        sampler.trees.max_priority[:] = 1.0
        sampler.trees.fill_new(slots)  # every slot at the running max (1)
    if scenario == "fresh":
        return
    for trainer in range(n_trainers):
        td = rng.uniform(0.0, 1.0, size=capacity)  # p / max p ~ uniform (max p stays 1)
        for sampler in samplers:
            sampler.update_priorities(slots, td, trainer, no_stale)


def bench_maddpg(
    workloads: list[Workload], capacity: int, repeats: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Part 2: ``sample_for_trainers(1024)`` with PrioritizedNeighbor vs Prioritized."""
    rows: list[dict[str, Any]] = []  # one per timed case
    comparisons: list[dict[str, Any]] = []  # one per (workload, layout, scenario): the ratios
    for workload in workloads:
        specs = workload.specs()
        for layout in ("interleaved", "agent_major"):
            per = Prioritized(alpha=ALPHA, beta=BETA, eps=EPS)
            locality = PrioritizedNeighbor(alpha=ALPHA, beta=BETA, eps=EPS)
            buf = MultiAgentReplayBuffer(specs, capacity, layout=layout, sampler=per, seed=0)
            locality.bind(capacity, buf.n_trainers)
            inherit = PrioritizedNeighbor(alpha=ALPHA, beta=BETA, eps=EPS, weights="inherit")
            inherit.bind(capacity, buf.n_trainers)
            data_rng = np.random.default_rng(1)
            chunk = min(capacity, 20_000)
            for _ in range(0, capacity, chunk):
                buf.extend(**random_steps(specs, chunk, data_rng))

            def round_with(sampler: Prioritized, buf: MultiAgentReplayBuffer = buf) -> Any:
                def run() -> None:
                    buf.sampler = sampler
                    buf.sample_for_trainers(BATCH)

                return run

            def reused_round_with(sampler: Prioritized, buf: MultiAgentReplayBuffer = buf) -> Any:
                buf.sampler = sampler
                out = buf.sample_for_trainers(BATCH)  # batches overwritten on every call

                def run() -> None:
                    buf.sampler = sampler
                    buf.sample_for_trainers(BATCH, out=out)

                return run

            def indices_with(sampler: Prioritized, buf: MultiAgentReplayBuffer = buf) -> Any:
                def run() -> None:
                    for trainer in range(buf.n_trainers):
                        sampler.sample(BATCH, capacity, buf.rng, trainer)

                return run

            for scenario in ("uniform", "fresh"):
                samplers = [per, locality, inherit]
                _set_priorities(samplers, buf.n_trainers, capacity, scenario, seed=2)
                timings = time_interleaved(
                    {
                        "per_round": round_with(per),
                        "locality_round": round_with(locality),
                        "per_round_out": reused_round_with(per),
                        "locality_round_out": reused_round_with(locality),
                        "per_indices": indices_with(per),
                        "locality_indices": indices_with(locality),
                        "locality_inherit_indices": indices_with(inherit),
                    },
                    repeats=repeats,
                    warmup=2,
                )
                lengths = locality.predictor.run_lengths_for(locality.trees.priorities(0))
                reference = locality.trees.leaves(0) / locality.trees.total(0)
                ident = {
                    "part": "maddpg",
                    "workload": workload.label,
                    "layout": layout,
                    "scenario": scenario,
                }
                for name, t in timings.items():
                    per_case = name.replace("locality_inherit_", "per_").replace(
                        "locality_", "per_"
                    )
                    baseline = timings[per_case]["median"]
                    rows.append(
                        {
                            **ident,
                            "case": name,
                            "trainers": workload.n_trainers,
                            "ms_median": 1e3 * t["median"],
                            "ms_min": 1e3 * t["min"],
                            "ms_max": 1e3 * t["max"],
                            "time_vs_per": t["median"] / baseline,
                        }
                    )
                comparisons.append(
                    {
                        "part": "maddpg",
                        "workload": workload.label,
                        "env": workload.env,
                        "n": workload.n,
                        "trainers": workload.n_trainers,
                        "layout": layout,
                        "scenario": scenario,
                        "capacity": capacity,
                        "batch": BATCH,
                        "rows_per_reference": float(np.dot(reference, lengths)),
                        "per_round_s": timings["per_round"]["median"],
                        "locality_round_s": timings["locality_round"]["median"],
                        "per_indices_s": timings["per_indices"]["median"],
                        "locality_indices_s": timings["locality_indices"]["median"],
                        "per_round_out_s": timings["per_round_out"]["median"],
                        "locality_round_out_s": timings["locality_round_out"]["median"],
                        "round_speedup": timings["per_round"]["median"]
                        / timings["locality_round"]["median"],
                        "round_out_speedup": timings["per_round_out"]["median"]
                        / timings["locality_round_out"]["median"],
                        "indices_speedup": timings["per_indices"]["median"]
                        / timings["locality_indices"]["median"],
                        "inherit_indices_speedup": timings["per_indices"]["median"]
                        / timings["locality_inherit_indices"]["median"],
                        # share of PER's sampling round spent drawing indices (the rest is the
                        # gather): bounds what fewer tree searches can gain
                        "per_index_share": timings["per_indices"]["median"]
                        / timings["per_round"]["median"],
                    }
                )
            buf.sampler = per
            del buf
    summary: dict[str, Any] = {}
    for layout in ("interleaved", "agent_major"):
        for scenario in ("uniform", "fresh"):
            chosen = [r for r in comparisons if r["layout"] == layout and r["scenario"] == scenario]
            if chosen:
                key = f"locality_vs_per_round_{layout}_{scenario}"
                speedups = [r["round_speedup"] for r in chosen]
                summary[key + "_min"] = min(speedups)
                summary[key + "_median"] = float(np.median(speedups))
                out_speedups = [r["round_out_speedup"] for r in chosen]
                summary[f"locality_vs_per_round_out_{layout}_{scenario}_median"] = float(
                    np.median(out_speedups)
                )
                summary[f"per_index_share_{layout}_{scenario}_median"] = float(
                    np.median([r["per_index_share"] for r in chosen])
                )
                summary[f"locality_inherit_vs_per_indices_{layout}_{scenario}_median"] = float(
                    np.median([r["inherit_indices_speedup"] for r in chosen])
                )
                index_speedups = [r["indices_speedup"] for r in chosen]
                summary[f"locality_vs_per_indices_{layout}_{scenario}_median"] = float(
                    np.median(index_speedups)
                )
    return rows, comparisons, summary


#: sizes of a full run (recorded in bench/results/prioritized.json) and of ``--quick``
FULL: dict[str, Any] = {
    "per_capacity": 1_000_000,
    "per_repeats": 200,
    "capacity": 100_000,
    "repeats": 20,
    "workloads": [
        Workload(env, n) for env in ("cooperative_navigation", "predator_prey") for n in (3, 6, 12)
    ],
}
QUICK: dict[str, Any] = {
    "per_capacity": 100_000,
    "per_repeats": 30,
    "capacity": 20_000,
    "repeats": 3,
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
}


def run(quick: bool = False, progress: bool = False) -> dict[str, Any]:
    """Both parts; ``quick`` shrinks capacities, workloads and repeats (well under a minute)."""
    threads = quiet_threads()
    sizes = QUICK if quick else FULL
    per_capacity, maddpg_capacity = sizes["per_capacity"], sizes["capacity"]
    workloads = sizes["workloads"]
    if progress:
        print(f"[prioritized] PER at capacity {per_capacity}", flush=True)
    per_rows, per_summary = bench_per(per_capacity, repeats=sizes["per_repeats"])
    if progress:
        print(f"[prioritized] MADDPG round, {len(workloads)} workloads", flush=True)
    maddpg_rows, comparisons, maddpg_summary = bench_maddpg(
        workloads, maddpg_capacity, repeats=sizes["repeats"]
    )
    columns = ["workload", "layout", "scenario", "rows_per_reference", "per_index_share"]
    columns += ["round_speedup", "round_out_speedup", "indices_speedup", "inherit_indices_speedup"]
    markdown = (
        markdown_table(per_rows, ["case", "capacity", "us_median", "time_vs_marlbuf_sampler"])
        + "\n\nPrioritizedNeighbor vs Prioritized (speedup = PER time / locality time):\n\n"
        + markdown_table(comparisons, columns)
    )
    return {
        "rows": per_rows + maddpg_rows,
        "comparisons": comparisons,
        "markdown": markdown,
        "summary": {**per_summary, **maddpg_summary},
        "config": {
            "batch": BATCH,
            "alpha": ALPHA,
            "beta": BETA,
            "eps": EPS,
            "per_capacity": per_capacity,
            "maddpg_capacity": maddpg_capacity,
            "workloads": [w.label for w in workloads],
            "locality_sampler": "PrioritizedNeighbor(thresholds=(0.33, 0.66), "
            "run_lengths=(1, 2, 4), weights='exact')",
            "threads": threads,
        },
    }


if __name__ == "__main__":
    import json
    import sys

    is_quick = "--quick" in sys.argv
    payload = run(quick=is_quick)
    print(payload["markdown"])
    print(json.dumps(payload["summary"], indent=1))
    print(write_result(SUITE, payload, quick=is_quick))
