"""``marlbuf profile``: time and cache counters per training phase, swept over agent counts,
layouts and samplers; JSON, a markdown table and the paper's Figs. 2-4 as PNG.

With ``--backend callgrind`` the command warms Numba's cache natively, then runs itself again
under ``valgrind --tool=callgrind --cache-sim=yes`` with pinned cache sizes, and plots the
result natively.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from marlbuf.cli import ArgumentParser, error
from marlbuf.profiling import callgrind
from marlbuf.profiling.perf_events import CounterGroup, PerfEventError
from marlbuf.profiling.plots import HEADLINE_METRICS
from marlbuf.profiling.profiler import (
    BACKENDS,
    NullProfiler,
    Profiler,
    format_table,
    sig3,
    write_json,
)
from marlbuf.profiling.workloads import (
    ENV_ALIASES,
    SAMPLER_NAMES,
    Case,
    SamplingWorkload,
    TrainWorkload,
)
from marlbuf.stores.host import LAYOUTS

_CHILD_ENV = "MARLBUF_PROFILE_UNDER_VALGRIND"
RESULT_NAME = "profile.json"
#: valgrind's own messages of a callgrind run, kept in the output folder
VALGRIND_LOG = "valgrind.log"
#: Env steps per profiled round under callgrind (each step is 3 phases, 6 dumps of ~0.1 s).
CALLGRIND_COLLECT_STEPS = 5


PROG = "marlbuf profile"


def build_parser() -> ArgumentParser:
    """The ``marlbuf profile`` argument parser (``--help`` shows every default)."""
    parser = ArgumentParser(PROG, __doc__)
    parser.add_argument(
        "--algo", default="maddpg", choices=["maddpg", "matd3"], help="trainer (train workload)"
    )
    parser.add_argument(
        "--env",
        default="cooperative_navigation",
        help="cooperative_navigation (cn) or predator_prey (pp)",
    )
    parser.add_argument("--agents", type=int, nargs="+", default=[3], help="agent counts to sweep")
    parser.add_argument(
        "--layout",
        nargs="+",
        default=["interleaved"],
        help=f"storage layouts, any of: {', '.join(sorted(LAYOUTS))}",
    )
    parser.add_argument(
        "--sampler",
        nargs="+",
        default=["uniform"],
        help=f"samplers, any of: {', '.join(SAMPLER_NAMES)}",
    )
    parser.add_argument(
        "--run-length",
        type=int,
        default=16,
        help="neighbor sampler run length (default 16: the profiler measures what runs of "
        "contiguous rows do to the caches, and runs of 1 are uniform draws; marlbuf train "
        "defaults to 1, which keeps uniform's return)",
    )
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per trainer")
    parser.add_argument("--updates", type=int, default=5, help="profiled update rounds per case")
    parser.add_argument(
        "--warmup-updates", type=int, default=1, help="rounds run before the profiler starts"
    )
    parser.add_argument(
        "--fill",
        type=int,
        default=None,
        help="transitions in the (full) buffer (default: min(1e6, 256 MiB worth))",
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
        help="train workload: env steps per profiled round (default: the trainer's "
        "update_every, 100; with --backend callgrind: 5, since every step costs 6 callgrind "
        "dumps)",
    )
    parser.add_argument(
        "--model",
        action="store_true",
        help="add modelled LL-cache and dTLB misses of the sampling phase's address stream",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=BACKENDS,
        help="hardware: PMU counters (refused where there is none); callgrind: simulated "
        "caches under valgrind; time: wall time and software events; auto: hardware where "
        "available, else time",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds buffers and samplers")
    parser.add_argument("--out", type=Path, default=Path("runs/profile"), help="output folder")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--keep-dumps",
        action="store_true",
        help="keep callgrind's per-phase dump files (in OUT/callgrind; otherwise they go to a "
        "temporary folder that is removed, also on Ctrl-C or SIGTERM)",
    )
    return parser


def check_args(args: argparse.Namespace) -> str | None:
    """Normalise ``args`` in place; the first user error as one sentence, or ``None``."""
    args.env = ENV_ALIASES.get(args.env, args.env)
    if args.env not in ("cooperative_navigation", "predator_prey"):
        return (
            f"--env must be cooperative_navigation or predator_prey (or cn, pp); got {args.env!r}"
        )
    for n in args.agents:
        if n < 1:
            return f"--agents must be positive; got {n}"
    for layout in args.layout:
        if layout not in LAYOUTS:
            return f"--layout must be among {', '.join(sorted(LAYOUTS))}; got {layout!r}"
    for sampler in args.sampler:
        if sampler not in SAMPLER_NAMES:
            return f"--sampler must be among {', '.join(SAMPLER_NAMES)}; got {sampler!r}"
    for name, value in (
        ("--updates", args.updates),
        ("--batch-size", args.batch_size),
        ("--run-length", args.run_length),
    ):
        if value < 1:
            return f"{name} must be >= 1; got {value}"
    if args.warmup_updates < 0:
        return f"--warmup-updates must be >= 0; got {args.warmup_updates}"
    for name, value in (("--fill", args.fill), ("--collect-steps", args.collect_steps)):
        if value is not None and value < 1:
            return f"{name} must be >= 1; got {value}"
    if args.batch_size % args.run_length and "neighbor" in args.sampler:
        return f"--run-length ({args.run_length}) must divide --batch-size ({args.batch_size})"
    if not args.no_plots:
        try:  # checked before any work: the plots come at the end of a long run
            import matplotlib  # noqa: F401
        except ImportError:
            return "the plots need matplotlib: pip install 'marlbuf[bench]', or pass --no-plots"
    if args.backend == "hardware":
        reason = hardware_unavailable()
        if reason is not None:
            return (
                f"--backend hardware: the hardware counters do not open here ({reason}); "
                "use --backend callgrind (simulated caches) or --backend time"
            )
    return None


def hardware_unavailable() -> str | None:
    """Why the hardware backend's counter group does not open here, or ``None`` if it does."""
    try:
        group = CounterGroup(list(Profiler.hardware_events))
    except PerfEventError as exc:
        return str(exc.strerror or exc)
    group.close()
    return None


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
                f"{k} {sig3(v)}"
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
    """Every case's phase table, then the sampling summary; warnings (a table that fits in
    the simulated cache) first."""
    lines = [f"# {result['command']}", ""]
    warnings = result_cache_warnings(result)
    if warnings:
        lines += [f"> {w}" for w in warnings] + [""]
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


#: A table this many times the simulated last-level cache is what ``--fill`` is advised to
#: reach: then nearly every uniform draw misses, as in a buffer of the paper's size.
CACHE_MULTIPLE = 4


def fits_in_cache_warnings(cases: list[tuple[str, int, int]]) -> list[str]:
    """Why cases whose filled table fits in the simulated last-level cache say little about
    locality, and the ``--fill`` that makes them a real test: one warning per table size.

    ``cases`` holds (label, table bytes, transitions) of the cases that fit."""
    cache = callgrind.simulated_ll_bytes()
    groups: dict[tuple[int, int], list[str]] = {}
    for label, table_bytes, fill_steps in cases:
        groups.setdefault((table_bytes, fill_steps), []).append(label)
    warnings = []
    for (table_bytes, fill_steps), labels in groups.items():
        advised = -(-CACHE_MULTIPLE * cache * fill_steps // max(table_bytes, 1))
        warnings.append(
            f"warning: the filled table of {', '.join(labels)} ({table_bytes / 2**20:.1f} MiB, "
            f"{fill_steps:,} transitions) fits in the simulated {cache // 2**20} MiB last-level "
            "cache: after the first round every row is cached, so the samplers' LL misses "
            "cannot differ (neighbor / uniform comes out near 1); pass --fill "
            f"{advised} or more ({CACHE_MULTIPLE}x the cache), or leave --fill at its default"
        )
    return warnings


def cache_fit_warnings(args: argparse.Namespace) -> list[str]:
    """Before a callgrind run: the cases whose table would fit in the simulated last-level
    cache even with next_obs stored in every row (the largest format)."""
    from marlbuf.memory import estimate
    from marlbuf.profiling.workloads import default_fill_steps
    from marlbuf.workloads import Workload

    fitting = []
    for case in _cases(args):
        specs = Workload(case.env, case.n_agents).specs()
        fill = args.fill if args.fill is not None else default_fill_steps(specs)
        sizes = estimate(specs, fill, case.layout, next_obs="stored")
        table = sizes.storage_bytes + sizes.side_table_bytes
        if table <= callgrind.simulated_ll_bytes():
            fitting.append((case.label, table, fill))
    return fits_in_cache_warnings(fitting)


def result_cache_warnings(result: dict[str, Any]) -> list[str]:
    """After a callgrind run: the cases whose filled table (``buffer_bytes``) fit in the
    simulated last-level cache."""
    if result.get("config", {}).get("backend") != "callgrind":
        return []
    return fits_in_cache_warnings(
        [
            (run["label"], int(run["buffer_bytes"]), int(run["fill_steps"]))
            for run in result.get("runs", [])
            if int(run.get("buffer_bytes", 0)) <= callgrind.simulated_ll_bytes()
        ]
    )


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
        return error(PROG, "--backend callgrind needs valgrind (e.g. 'apt install valgrind')")
    if not callgrind.supported():
        return error(PROG, "the callgrind backend is implemented for x86-64 only")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    args.warned = cache_fit_warnings(args)  # before minutes under valgrind
    for warning in args.warned:
        print(f"{PROG}: {warning}", file=sys.stderr)
    print("warming Numba's cache natively ...", file=sys.stderr)
    _warm_numba_cache(args)
    with contextlib.ExitStack() as cleanup:
        if args.keep_dumps:
            dumps = out / "callgrind"
            if dumps.exists():
                shutil.rmtree(dumps)
            dumps.mkdir()
        else:
            # dumps are many and large (one per phase boundary): a temporary folder, removed
            # however this process ends short of SIGKILL (main turns SIGTERM into an exception;
            # on an exception subprocess.run kills valgrind before the folder goes)
            temp = tempfile.TemporaryDirectory(
                prefix="marlbuf-callgrind-", ignore_cleanup_errors=True
            )
            dumps = Path(cleanup.enter_context(temp))
        log = dumps / VALGRIND_LOG
        cmd = callgrind.valgrind_command(
            [sys.executable, "-m", "marlbuf", "profile", *argv, "--no-plots"],
            dumps / "callgrind.out.%p",
            valgrind,
            log_file=log,
        )
        env = dict(os.environ, **{_CHILD_ENV: "1"})
        print("running under callgrind:", " ".join(cmd), file=sys.stderr)
        proc = _run_to_the_end(cmd, env)
        if log.is_file():  # valgrind's own messages, kept out of the output and the table
            shutil.copyfile(log, out / VALGRIND_LOG)
    if proc.returncode != 0:
        print(
            f"marlbuf profile: the callgrind run failed (exit {proc.returncode}); valgrind's "
            f"messages: {out / VALGRIND_LOG}",
            file=sys.stderr,
        )
        return proc.returncode
    print(
        f"valgrind's own messages (its start-up warnings about the host's cache, which the "
        f"pinned --I1/--D1/--LL replace; any 'brk segment overflow', harmless: Python then "
        f"allocates with mmap): {out / VALGRIND_LOG}",
        file=sys.stderr,
    )
    result = json.loads((out / RESULT_NAME).read_text())
    _finish_outputs(args, result)
    return 0


def _finish_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    out: Path = args.out
    if not getattr(args, "warned", None):  # the table has them; stderr had them before the run
        for warning in result_cache_warnings(result):
            print(f"{PROG}: {warning}", file=sys.stderr)
    (out / "profile.md").write_text(markdown(result))
    if not args.no_plots:
        from marlbuf.profiling.plots import plot_phase_breakdown, plot_sampling_counters

        plot_phase_breakdown(result, out / "phases.png")
        plot_sampling_counters(result, out / "sampling_counters.png")
    print(markdown(result))
    print(f"results in {out}/", file=sys.stderr)


def _run_to_the_end(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run(cmd, env=env)``, whose child never outlives an interrupt: Ctrl-C or
    SIGTERM while the child is being started is held until ``Popen`` has returned (a signal
    inside its constructor would leave the started child running, unknown to anyone), then
    raised as usual; on any exception the child is killed and reaped."""
    held: list[int] = []
    in_main = threading.current_thread() is threading.main_thread()
    signums = (signal.SIGINT, signal.SIGTERM)
    previous = (
        {s: signal.signal(s, lambda signum, _: held.append(signum)) for s in signums}
        if in_main
        else {}
    )
    try:
        proc = subprocess.Popen(cmd, env=env)
    finally:
        for signum, handler in previous.items():  # None: not set from Python (the default)
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    try:
        for caught in held:  # what arrived during the start, as it would have been raised
            if caught == signal.SIGINT:
                raise KeyboardInterrupt
            _on_sigterm(caught, None)
        return subprocess.CompletedProcess(cmd, proc.wait())
    except BaseException:
        proc.kill()
        proc.wait()
        raise


class Terminated(BaseException):
    """SIGTERM, raised as an exception so that ``finally`` blocks and ``with`` exits run (the
    default action ends the process at once and would leave temporary files behind)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``marlbuf profile``; returns the exit status."""
    handle_sigterm = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if handle_sigterm else None
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{PROG}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if handle_sigterm:
            # None: the previous handler was not set from Python; the default is what it was
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv
    message = check_args(args)
    if message is not None:
        return error(PROG, message)
    under_valgrind = os.environ.get(_CHILD_ENV) == "1"
    if args.backend == "callgrind" and not callgrind.under_callgrind():
        if under_valgrind:
            return error(PROG, "expected to run under callgrind")
        return _relaunch_under_callgrind(args, argv)
    result = run_cases(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(result, args.out / RESULT_NAME)
    if under_valgrind:
        return 0  # the native parent writes the table and the plots
    _finish_outputs(args, result)
    return 0
