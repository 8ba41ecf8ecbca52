"""``marlbuf profile``: time and cache counters per training phase, swept over agent counts,
layouts and samplers; JSON, a markdown table and the paper's Figs. 2-4 as PNG.

With ``--backend callgrind`` the command warms Numba's cache natively, then runs itself again
under ``valgrind --tool=callgrind --cache-sim=yes`` with pinned cache sizes, and plots the
result natively.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from marlbuf.profiling import callgrind
from marlbuf.profiling.plots import HEADLINE_METRICS
from marlbuf.profiling.profiler import BACKENDS, NullProfiler, Profiler, format_table, write_json
from marlbuf.profiling.workloads import (
    ENV_ALIASES,
    SAMPLER_NAMES,
    Case,
    SamplingWorkload,
    TrainWorkload,
)
from marlbuf.storage import LAYOUTS

_CHILD_ENV = "MARLBUF_PROFILE_UNDER_VALGRIND"
RESULT_NAME = "profile.json"
#: Env steps per profiled round under callgrind (each step is 3 phases, 6 dumps of ~0.1 s).
CALLGRIND_COLLECT_STEPS = 5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marlbuf profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--algo", default="maddpg", choices=["maddpg", "matd3"])
    parser.add_argument(
        "--env",
        default="cooperative_navigation",
        help="cooperative_navigation (cn) or predator_prey (pp)",
    )
    parser.add_argument("--agents", type=int, nargs="+", default=[3], help="agent counts to sweep")
    parser.add_argument("--layout", nargs="+", default=["interleaved"], help="storage layouts")
    parser.add_argument(
        "--sampler", nargs="+", default=["uniform"], help="samplers (uniform, neighbor, ...)"
    )
    parser.add_argument("--run-length", type=int, default=16, help="neighbor sampler run length")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--updates", type=int, default=5, help="profiled update rounds per case")
    parser.add_argument(
        "--warmup-updates", type=int, default=1, help="rounds run before the profiler starts"
    )
    parser.add_argument(
        "--fill",
        type=int,
        default=None,
        help="transitions in the (full) buffer; default min(1e6, 256 MiB worth)",
    )
    parser.add_argument(
        "--workload",
        default="train",
        choices=["train", "sampling"],
        help="the training loop (needs [algos,envs]) or the MADDPG sampling round alone",
    )
    parser.add_argument(
        "--collect-steps",
        type=int,
        default=None,
        help="train workload: env steps per profiled round (default: the trainer's update_every, "
        "100; with --backend callgrind: 5, since every step costs 6 callgrind dumps)",
    )
    parser.add_argument(
        "--model",
        action="store_true",
        help="add modelled LL-cache and dTLB misses of the sampling phase's address stream",
    )
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/profile"), help="output folder")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--keep-dumps",
        action="store_true",
        help="keep callgrind's per-phase dump files (in OUT/callgrind)",
    )
    return parser


def _check(args: argparse.Namespace) -> None:
    args.env = ENV_ALIASES.get(args.env, args.env)
    if args.env not in ("cooperative_navigation", "predator_prey"):
        raise SystemExit(f"--env must be cooperative_navigation or predator_prey; got {args.env!r}")
    for n in args.agents:
        if n < 1:
            raise SystemExit(f"--agents must be positive; got {n}")
    for layout in args.layout:
        if layout not in LAYOUTS:
            raise SystemExit(f"--layout must be among {sorted(LAYOUTS)}; got {layout!r}")
    for sampler in args.sampler:
        if sampler not in SAMPLER_NAMES:
            raise SystemExit(f"--sampler must be among {list(SAMPLER_NAMES)}; got {sampler!r}")
    for name, value in (("--updates", args.updates), ("--batch-size", args.batch_size)):
        if value < 1:
            raise SystemExit(f"{name} must be >= 1; got {value}")
    if args.batch_size % args.run_length and "neighbor" in args.sampler:
        raise SystemExit(
            f"--run-length ({args.run_length}) must divide --batch-size ({args.batch_size})"
        )


def _cases(args: argparse.Namespace) -> list[Case]:
    return [
        Case(args.env, n, layout, sampler)
        for n in args.agents
        for layout in args.layout
        for sampler in args.sampler
    ]


def _make_workload(args: argparse.Namespace, case: Case) -> SamplingWorkload | TrainWorkload:
    if args.workload == "sampling":
        return SamplingWorkload(
            case, args.batch_size, args.run_length, args.fill, args.seed, args.model
        )
    collect_steps = args.collect_steps
    if collect_steps is None and args.backend == "callgrind":
        collect_steps = CALLGRIND_COLLECT_STEPS
    return TrainWorkload(
        case,
        args.algo,
        args.batch_size,
        args.run_length,
        args.fill,
        args.seed,
        collect_steps,
        args.model,
    )


def run_cases(args: argparse.Namespace) -> dict[str, Any]:
    """Profile every case in this process with ``args.backend``; the result document."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    runs = []
    cases = _cases(args)
    for i, case in enumerate(cases):
        started = time.perf_counter()
        workload = _make_workload(args, case)
        for _ in range(args.warmup_updates):
            workload.attach(NullProfiler())
            workload.round()
        profiler = Profiler(backend=args.backend)
        workload.attach(profiler)
        for _ in range(args.updates):
            workload.round()
        # under callgrind, stop simulating: the next case's set-up (buffer fill, warm-up) is not
        # to be simulated; its profiler switches the simulation on again
        profiler.finish(stop_simulation=True)
        report = profiler.report()
        runs.append(
            {
                "env": case.env,
                "n_agents": case.n_agents,
                "layout": case.layout,
                "sampler": case.sampler,
                "label": case.label,
                **workload.describe(),
                "updates": args.updates,
                "report": report,
            }
        )
        print(
            f"[{i + 1}/{len(cases)}] {case.label}: {report['backend']} backend, "
            f"{time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        del workload
    return {
        "schema": "marlbuf-profile-sweep/1",
        "command": "marlbuf profile " + " ".join(getattr(args, "argv", [])),
        "config": {
            "algo": args.algo,
            "env": args.env,
            "agents": args.agents,
            "layouts": args.layout,
            "samplers": args.sampler,
            "run_length": args.run_length,
            "batch_size": args.batch_size,
            "updates": args.updates,
            "warmup_updates": args.warmup_updates,
            "workload": args.workload,
            "collect_steps": args.collect_steps,
            "model": args.model,
            "backend": args.backend,
            "seed": args.seed,
        },
        "runs": runs,
        "summary": summarize(runs),
    }


def _sampling_inclusive(report: dict[str, Any]) -> dict[str, Any]:
    for row in report["phases"]:
        if row["name"] == "sampling" and row["path"] != "<outside>":
            figures: dict[str, Any] = row["inclusive"]
            return figures
    return {}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per layout and agent count, per headline metric: the sampling phase's figure per update
    round for each sampler (with the metric's source) and the neighbor/uniform ratio."""
    summary: dict[str, Any] = {}
    for run in runs:
        report = run["report"]
        figures = _sampling_inclusive(report)
        entry = summary.setdefault(f"{run['layout']}/N={run['n_agents']}", {})
        for metric in HEADLINE_METRICS:
            if figures.get(metric) is None:
                continue
            per = entry.setdefault(metric, {"source": report["metrics"][metric]["source"]})
            per[run["sampler"]] = figures[metric] / run["updates"]
    for entry in summary.values():
        for per in entry.values():
            if per.get("uniform") and per.get("neighbor") is not None:
                per["neighbor_over_uniform"] = per["neighbor"] / per["uniform"]
    return summary


def _summary_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| case | metric [source] | per round: samplers | neighbor / uniform |",
        "|---|---|---|---|",
    ]
    for case, entry in summary.items():
        for metric, per in entry.items():
            values = ", ".join(
                f"{k} {v:.4g}"
                for k, v in per.items()
                if k not in ("source", "neighbor_over_uniform")
            )
            ratio = per.get("neighbor_over_uniform")
            lines.append(
                f"| {case} | {metric} [{per['source']}] | {values} | "
                f"{'' if ratio is None else f'{ratio:.2f}'} |"
            )
    return lines


def markdown(result: dict[str, Any]) -> str:
    """Every case's phase table, then the sampling summary."""
    lines = [f"# {result['command']}", ""]
    for run in result["runs"]:
        lines += [
            f"## {run['label']} ({run['env']}, {run['n_trainers']} trainers, "
            f"buffer {run['fill_steps']} steps / {run['buffer_bytes'] / 2**20:.0f} MiB, "
            f"{run['updates']} rounds)",
            "",
            "```",
            format_table(run["report"]),
            "```",
            "",
        ]
    lines += ["## Sampling phase per update round", ""]
    lines += _summary_table(result["summary"])
    lines += [""]
    return "\n".join(lines)


def _warm_numba_cache(args: argparse.Namespace) -> None:
    """Compile every kernel the cases use (natively; compiling under valgrind is very slow)."""
    callgrind.warm_up()
    for case in _cases(args):
        small: SamplingWorkload | TrainWorkload
        if args.workload == "sampling":
            small = SamplingWorkload(
                case, args.batch_size, args.run_length, 4 * args.batch_size, 0, args.model
            )
        else:
            small = TrainWorkload(
                case,
                args.algo,
                args.batch_size,
                args.run_length,
                4 * args.batch_size,
                0,
                collect_steps=2,
                model=args.model,
            )
        small.attach(NullProfiler())
        small.round()


def _relaunch_under_callgrind(args: argparse.Namespace, argv: list[str]) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print(
            "marlbuf profile: --backend callgrind needs valgrind (e.g. 'apt install valgrind')",
            file=sys.stderr,
        )
        return 2
    if not callgrind.supported():
        print(
            "marlbuf profile: the callgrind backend is implemented for x86-64 only", file=sys.stderr
        )
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print("warming Numba's cache natively ...", file=sys.stderr)
    _warm_numba_cache(args)
    # dumps are many and large (one per phase boundary): a temporary folder unless kept
    if args.keep_dumps:
        dumps = out / "callgrind"
        if dumps.exists():
            shutil.rmtree(dumps)
        dumps.mkdir()
    else:
        dumps = Path(tempfile.mkdtemp(prefix="marlbuf-callgrind-"))
    cmd = callgrind.valgrind_command(
        [sys.executable, "-m", "marlbuf", "profile", *argv, "--no-plots"],
        dumps / "callgrind.out.%p",
        valgrind,
    )
    env = dict(os.environ, **{_CHILD_ENV: "1"})
    print("running under callgrind:", " ".join(cmd), file=sys.stderr)
    try:
        proc = subprocess.run(cmd, env=env)
    finally:
        if not args.keep_dumps:
            shutil.rmtree(dumps, ignore_errors=True)
    if proc.returncode != 0:
        print(
            f"marlbuf profile: the callgrind run failed (exit {proc.returncode})", file=sys.stderr
        )
        return proc.returncode
    result = json.loads((out / RESULT_NAME).read_text())
    _finish_outputs(args, result)
    return 0


def _finish_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    out: Path = args.out
    (out / "profile.md").write_text(markdown(result))
    if not args.no_plots:
        from marlbuf.profiling.plots import plot_phase_breakdown, plot_sampling_counters

        plot_phase_breakdown(result, out / "phases.png")
        plot_sampling_counters(result, out / "sampling_counters.png")
    print(markdown(result))
    print(f"results in {out}/", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``marlbuf profile``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    _check(args)
    under_valgrind = os.environ.get(_CHILD_ENV) == "1"
    if args.backend == "callgrind" and not callgrind.under_callgrind():
        if under_valgrind:
            print("marlbuf profile: expected to run under callgrind", file=sys.stderr)
            return 2
        return _relaunch_under_callgrind(args, argv)
    result = run_cases(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(result, args.out / RESULT_NAME)
    if under_valgrind:
        return 0  # the native parent writes the table and the plots
    _finish_outputs(args, result)
    return 0
