"""``marlbuf bench``: run benchmark suites, write JSON + markdown, compare two runs.

Usage::

    marlbuf bench --quick                  # every suite at small sizes (the README's main job)
    marlbuf bench sampling --out results   # results into ./results (default ./bench-results)
    marlbuf bench guard --quick            # the default path's same-run checks, in seconds
    marlbuf bench sampling prioritized     # named suites at full size
    marlbuf bench --list                   # suites, whether they can run here, their options
    marlbuf bench compare A.json B.json    # time ratio table between two result files
    marlbuf bench report [--quick]         # rebuild REPORT.md and figures from the result files
    marlbuf bench dropin --device cuda     # a suite option (see below)
    marlbuf bench distributed --actors 1 2 4 8

Suite options (``SUITE_OPTIONS``): ``--device DEVICE`` and ``--actors K [K ...]`` are handed to
a suite's ``run()`` under their own name (``run(quick, device="cuda")``) when given, and only
then. A suite takes an option when its ``run()`` has a parameter of that name (``--list`` shows
which); naming an option that a chosen suite does not take is an error that names the suites
that do, before anything runs (so ``marlbuf bench --device cuda``, every suite, is refused:
name the suites). Options follow the suite names (``--actors`` takes every number after it).
What a suite does with an option is in its module docstring: with ``--device`` the ``device``
suite measures its GPU cases on that device and ``dropin`` runs the consumers' networks there;
with ``--actors`` the ``distributed`` suite measures each number of rollout actors (and shards)
listed. The result file is the suite's usual one; the payload's ``options`` records what was
given.

A suite whose payload lists ``failed_checks`` (the ``guard`` suite: ratios past their limits)
makes the command exit with status 1 after writing its results, except with ``--quick``, where
the failures are printed but the status stays 0 (small sizes on a noisy machine).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

from marlbuf.bench.common import markdown_table, write_result
from marlbuf.cli import ArgumentParser

#: Where results go unless ``--out`` says otherwise: a folder in the current directory (the
#: package's own folder may be a read-only site-packages).
DEFAULT_OUT = Path("bench-results")

OUT_HELP = "result folder (default: ./bench-results in the current folder)"

#: suite name -> module (each exposes SUITE and run(quick) -> payload)
SUITES: dict[str, str] = {
    "guard": "marlbuf.bench.guard",
    "sampling": "marlbuf.bench.sampling",
    "layout": "marlbuf.bench.layout",
    "prioritized": "marlbuf.bench.prioritized",
    "adapters": "marlbuf.bench.adapters",
    "envs": "marlbuf.bench.envs",
    "update": "marlbuf.bench.update",
    "end_to_end": "marlbuf.bench.end_to_end",
    "counters": "marlbuf.bench.counters",
    "peers": "marlbuf.bench.peers",
    "rewards": "marlbuf.bench.rewards",
    "dropin": "marlbuf.bench.dropin",
    "locality": "marlbuf.bench.locality",
    "memory": "marlbuf.bench.memory",
    "device": "marlbuf.bench.device",
    "recurrent": "marlbuf.bench.recurrent",
    "distributed": "marlbuf.bench.distributed",
    "concurrency": "marlbuf.bench.concurrency",
    "precision": "marlbuf.bench.precision",
    "sequences": "marlbuf.bench.sequences",
    "offline": "marlbuf.bench.offline",
}

#: suites a full run without named suites leaves out: the reward study trains 45 MADDPG runs
#: (about 30 minutes on 2 cores), the locality sweep 30 more (reusing the reward study's runs
#: where identical), the precision check 6 (float16 storage); name them to run them
#: (``marlbuf bench rewards locality precision``)
LONG_SUITES = ("rewards", "locality", "precision", "recurrent")


#: Suite options: name -> argparse settings of ``--<name>``. A given option is passed to the
#: ``run()`` of every chosen suite, all of which must take it (a parameter of that name).
SUITE_OPTIONS: dict[str, dict[str, Any]] = {
    "device": {
        "metavar": "DEVICE",
        "help": "torch device of a suite's device cases, e.g. cuda or cuda:1 (suites device, "
        "dropin; not given: each suite's default)",
    },
    "actors": {
        "metavar": "K",
        "type": int,
        "nargs": "+",
        "help": "numbers of rollout actors (and shards) to measure, e.g. 1 2 4 8 (suite "
        "distributed; not given: the suite's default)",
    },
}


def suite_options(module: Any) -> list[str]:
    """The :data:`SUITE_OPTIONS` a suite module's ``run()`` takes."""
    parameters = inspect.signature(module.run).parameters
    return [name for name in SUITE_OPTIONS if name in parameters]


def options_error(names: list[str], given: dict[str, Any]) -> str | None:
    """Why the given suite options do not fit the chosen suites (``None``: they do). A suite
    that cannot be imported here is skipped when it runs, so it refuses nothing."""

    def takes(name: str, option: str) -> bool | None:
        module = _load(name)
        return None if isinstance(module, str) else option in suite_options(module)

    problems = []
    for option in given:
        refusing = [name for name in names if takes(name, option) is False]
        if refusing:
            taking = [name for name in SUITES if takes(name, option)]
            problems.append(
                f"--{option} is not an option of suite(s) {', '.join(refusing)}; the suites "
                f"that take it: {', '.join(taking) or 'none'} (name only those)"
            )
    return "; ".join(problems) or None


def _load(name: str) -> Any:
    """The suite's module, or an explanation why it cannot run here."""
    try:
        return importlib.import_module(SUITES[name])
    except ImportError as exc:
        return f"unavailable: {exc}"


#: Row fields that hold a time, with their unit, in the order compare looks for them.
TIME_FIELDS = (("ms_median", "ms"), ("s_median", "s"), ("us_median", "µs"))


class MixedSizesError(ValueError):
    """Two result files of different sizes (quick and full) compared without saying so."""


def compare(path_a: Path, path_b: Path, allow_mixed_sizes: bool = False) -> str:
    """Markdown table of B's median time over A's for every case present in both runs.

    Raises :class:`MixedSizesError` when one file holds quick sizes and the other full ones,
    unless ``allow_mixed_sizes``: their times are not comparable.
    """
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    sizes = {p: "quick" if r.get("quick") else "full" for p, r in ((path_a, a), (path_b, b))}
    mixed = sizes[path_a] != sizes[path_b]
    if mixed and not allow_mixed_sizes:
        raise MixedSizesError(
            f"{path_a} holds {sizes[path_a]} sizes but {path_b} {sizes[path_b]} sizes; their "
            "times are not comparable (pass --allow-mixed-sizes to compare them anyway)"
        )

    def keyed(record: dict[str, Any]) -> dict[tuple[str, ...], tuple[float, str]]:
        out = {}
        for row in record.get("rows", []):
            field = next(((k, u) for k, u in TIME_FIELDS if k in row), None)
            if field is None:
                continue
            ident = tuple(v for v in row.values() if isinstance(v, str))
            out[ident] = (float(row[field[0]]), field[1])
        return out

    ka, kb = keyed(a), keyed(b)
    rows = []
    for k in ka:
        if k in kb and ka[k][0] > 0 and ka[k][1] == kb[k][1]:
            unit = ka[k][1]
            rows.append(
                {
                    "case": " / ".join(k),
                    f"A ({unit})": ka[k][0],
                    f"B ({unit})": kb[k][0],
                    "B/A (time ratio)": kb[k][0] / ka[k][0],
                }
            )
    if not rows:
        return "no common cases between the two runs"
    header = (
        f"A = {path_a} ({a.get('created', '?')}, {sizes[path_a]} sizes), "
        f"B = {path_b} ({b.get('created', '?')}, {sizes[path_b]} sizes); "
        "median time per case, B/A below 1: B is faster"
    )
    if mixed:
        header += "\n\nWARNING: quick and full sizes mixed; ratios compare different workloads."
    tables = []
    for _, unit in TIME_FIELDS:
        part = [r for r in rows if f"A ({unit})" in r]
        if part:
            columns = ["case", f"A ({unit})", f"B ({unit})", "B/A (time ratio)"]
            tables.append(markdown_table(part, columns))
    return header + "\n\n" + "\n\n".join(tables)


def quiet_third_party_logs() -> None:
    """Third-party libraries' INFO lines out of our output: TorchRL logs every storage it
    initialises, Ray its start-up (their warnings and errors still show)."""
    import logging
    import os

    # TorchRL sets its logger's level from this variable when it is imported
    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")

    for name in ("torchrl", "ray", "tensordict"):
        logging.getLogger(name).setLevel(logging.WARNING if name != "ray" else logging.ERROR)


def build_parser() -> ArgumentParser:
    """The parser of ``marlbuf bench [SUITE ...] [options]`` (suite options included)."""
    parser = ArgumentParser("marlbuf bench", (__doc__ or "").replace("``", ""))
    parser.add_argument(
        "suites",
        nargs="*",
        help=f"suites to run, any of: {', '.join(SUITES)} (default: all but "
        f"{', '.join(LONG_SUITES)}; with --quick: all)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, one seed (minutes, not hours): figures that indicate, not decide",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=OUT_HELP)
    parser.add_argument("--list", action="store_true", help="list suites and exit")
    for option, settings in SUITE_OPTIONS.items():
        parser.add_argument(f"--{option}", default=None, **settings)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "report":
        parser = ArgumentParser("marlbuf bench report", "Rebuild REPORT.md and the figures.")
        parser.add_argument("--quick", action="store_true", help="the quick results")
        parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=OUT_HELP)
        ns = parser.parse_args(args_list[1:])
        print(f"report: {write_report(ns.out, ns.quick)}")
        return 0
    if args_list and args_list[0] == "compare":
        parser = ArgumentParser(
            "marlbuf bench compare", "Median time per case of run B over run A (B/A)."
        )
        parser.add_argument("a", type=Path, help="baseline result file (JSON)")
        parser.add_argument("b", type=Path, help="new result file (JSON)")
        parser.add_argument(
            "--allow-mixed-sizes",
            action="store_true",
            help="compare a quick result with a full one (their sizes differ)",
        )
        ns = parser.parse_args(args_list[1:])
        for p in (ns.a, ns.b):
            if not p.is_file():
                parser.error(f"no such result file: {p}")
        try:
            print(compare(ns.a, ns.b, ns.allow_mixed_sizes))
        except MixedSizesError as exc:
            parser.error(str(exc))
        return 0

    parser = build_parser()
    ns = parser.parse_args(args_list)
    unknown = [s for s in ns.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    if ns.list:
        for name in SUITES:
            mod = _load(name)
            if isinstance(mod, str):
                print(f"{name:<12} {mod}")
                continue
            options = " ".join(f"--{o}" for o in suite_options(mod))
            print(f"{name:<12} ok" + (f" (options: {options})" if options else ""))
        return 0

    names = ns.suites or [s for s in SUITES if ns.quick or s not in LONG_SUITES]
    given = {o: getattr(ns, o) for o in SUITE_OPTIONS if getattr(ns, o) is not None}
    problem = options_error(names, given) if given else None
    if problem:
        parser.error(problem)
    if not ns.suites and not ns.quick:
        print(f"full run: leaving out {', '.join(LONG_SUITES)} (name them to run them)", flush=True)
    if ns.quick:
        print(
            "quick sizes: one seed and few repeats; the ratios indicate, verdicts are not "
            "conclusive (run without --quick for figures to quote)",
            flush=True,
        )
    quiet_third_party_logs()
    notes: dict[str, str] = {}  # suite -> why it has no fresh result in this run
    failed = []
    past_limits = []  # suites with failed checks (an error outside --quick)
    for position, name in enumerate(names, 1):
        print(f"== suite {position}/{len(names)}: {name}", flush=True)  # sweep progress
        mod = _load(name)
        if isinstance(mod, str):
            # a suite whose optional extra is missing: say so, go on with the others
            print(f"[{name}] skipped ({mod})", flush=True)
            notes[name] = f"skipped: {mod}"
            continue
        start = time.perf_counter()
        try:
            payload = mod.run(quick=ns.quick, **given)
            if given:
                payload = {**payload, "options": given}
        except Exception as exc:  # report and continue with the other suites
            failed.append(name)
            print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            notes[name] = f"FAILED: {type(exc).__name__}: {exc}"
            continue
        path = write_result(name, payload, ns.quick, ns.out)
        print(f"[{name}] {time.perf_counter() - start:.1f} s -> {path}", flush=True)
        if payload.get("failed_checks"):
            past_limits.append(name)
            consequence = "reported only (--quick)" if ns.quick else "the exit status will be 1"
            print(
                f"[{name}] {len(payload['failed_checks'])} check(s) FAILED, {consequence}: "
                + "; ".join(payload["failed_checks"]),
                file=sys.stderr,
                flush=True,
            )
    report_path = write_report(Path(ns.out), ns.quick, notes)
    print(f"report: {report_path}")
    return 1 if failed or (past_limits and not ns.quick) else 0


def write_report(results_dir: Path, quick: bool, notes: dict[str, str] | None = None) -> Path:
    """``REPORT[-quick].md``: a section per suite with a result file in ``results_dir`` (or a
    note from this run), the figures drawn anew (:mod:`marlbuf.bench.report`)."""
    from marlbuf.bench import report

    figures, figures_error = None, None
    try:
        from marlbuf.bench.plots import make_all

        figures = make_all(results_dir, quick=quick)
    except ImportError as exc:  # matplotlib missing: results stay usable without figures
        figures_error = str(exc)
    return report.write_report(results_dir, quick, SUITES, notes, figures, figures_error)
