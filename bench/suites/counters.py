"""Suite ``counters``: the profiler on the MADDPG sampling phase, per layout, sampler and agent
count (the paper's Fig. 4 view, with whatever counters this machine offers).

Every case keeps its own :class:`marlbuf.profiling.Profiler` (backend ``auto``: hardware
counters where a PMU opens, else time plus software events); rounds are interleaved across the
cases (case A, B, C, A, B, C, ...) so that machine noise hits all of them alike, and ratios are
taken against the uniform sampler of the same layout and agent count, measured in the same run.
Simulated cache misses need valgrind: ``marlbuf profile --backend callgrind --workload
sampling`` (see ``docs/profiling.md``).
"""

from __future__ import annotations

from typing import Any

from marlbuf.bench.tools.common import quiet_threads
from marlbuf.profiling import NullProfiler, Profiler
from marlbuf.profiling.workloads import Case, SamplingWorkload

SUITE = "counters"

FULL: dict[str, Any] = {
    "agents": [3, 6, 12, 24],
    "layouts": ["agent_major", "interleaved"],
    "samplers": ["uniform", "neighbor"],
    "fill_steps": None,  # min(1e6, 256 MiB of transitions)
    "batch_size": 1024,
    "run_length": 16,
    "rounds": 10,
    "model": True,  # modelled LL/dTLB misses of the gathered rows (computed outside the phase)
}
QUICK: dict[str, Any] = {**FULL, "agents": [3], "fill_steps": 20_000, "rounds": 3}


def _sampling_row(report: dict[str, Any], rounds: int) -> dict[str, Any]:
    row = next(r for r in report["phases"] if r["name"] == "sampling")
    out: dict[str, Any] = {}
    for metric, value in row["inclusive"].items():
        source = report["metrics"][metric]["source"]
        out[f"{metric}_per_round"] = value / rounds
        out[f"{metric}_source"] = source
    return out


def run(quick: bool = False) -> dict[str, Any]:
    """Profile the sampling phase of every case; rows per case, neighbor/uniform ratios."""
    settings = QUICK if quick else FULL
    threads = quiet_threads()
    cases = [
        Case("cooperative_navigation", n, layout, sampler)
        for n in settings["agents"]
        for layout in settings["layouts"]
        for sampler in settings["samplers"]
    ]
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    # one agent count at a time: all its cases' buffers in memory together, rounds interleaved
    for n in settings["agents"]:
        group = [c for c in cases if c.n_agents == n]
        workloads = {
            c: SamplingWorkload(
                c,
                settings["batch_size"],
                settings["run_length"],
                settings["fill_steps"],
                seed=0,
                model=settings["model"],
            )
            for c in group
        }
        profilers = {}
        for case, workload in workloads.items():
            workload.attach(NullProfiler())
            workload.round()  # JIT and page warm-up, unprofiled
            profilers[case] = Profiler(backend="auto", null_repeats=50)
            workload.attach(profilers[case])
        for _ in range(settings["rounds"]):
            for workload in workloads.values():
                workload.round()
        for case, workload in workloads.items():
            report = profilers[case].report()
            rows.append(
                {
                    "layout": case.layout,
                    "sampler": case.sampler,
                    "n_agents": n,
                    "backend": report["backend"],
                    **workload.describe(),
                    **_sampling_row(report, settings["rounds"]),
                }
            )
        del workloads
    for row in rows:
        if row["sampler"] != "neighbor":
            continue
        base = next(
            r
            for r in rows
            if r["sampler"] == "uniform"
            and (r["layout"], r["n_agents"]) == (row["layout"], row["n_agents"])
        )
        key = f"{row['layout']}/N={row['n_agents']}"
        summary[key] = {
            f"neighbor_over_uniform_{m.removesuffix('_per_round')}": row[m] / base[m]
            for m in row
            if m.endswith("_per_round") and base.get(m)
        }
    for row in rows:
        if row["layout"] != "interleaved":
            continue
        base = next(
            r
            for r in rows
            if r["layout"] == "agent_major"
            and (r["sampler"], r["n_agents"]) == (row["sampler"], row["n_agents"])
        )
        key = f"{row['sampler']}/N={row['n_agents']}"
        summary[key] = {
            f"interleaved_over_agent_major_{m.removesuffix('_per_round')}": row[m] / base[m]
            for m in row
            if m.endswith("_per_round") and base.get(m)
        }
    return {"rows": rows, "summary": summary, "config": {**settings, "threads": threads}}
