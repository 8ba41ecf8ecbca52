"""``marlbuf bench``: run benchmark suites, write JSON + markdown, compare two runs.

Usage::

    marlbuf bench --quick                  # every suite at small sizes (the README's main job)
    marlbuf bench guard --quick            # the default path's same-run checks, in seconds
    marlbuf bench sampling prioritized     # named suites at full size
    marlbuf bench --list                   # suites and whether they can run here
    marlbuf bench compare A.json B.json    # ratio table between two result files
    marlbuf bench report [--quick]         # rebuild REPORT.md and figures from the result files

A suite whose payload lists ``failed_checks`` (the ``guard`` suite: ratios past their limits)
makes the command exit with status 1 after writing its results, except with ``--quick``, where
the failures are printed but the status stays 0 (small sizes on a noisy machine).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from marlbuf.bench.common import RESULTS_DIR, markdown_table, result_path, write_result
from marlbuf.cli import ArgumentParser

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
}

#: suites a full run without named suites leaves out: the reward study trains 45 MADDPG runs
#: (about 30 minutes on 2 cores), the locality sweep 30 more (reusing the reward study's runs
#: where identical), the precision check 6 (float16 storage); name them to run them
#: (``marlbuf bench rewards locality precision``)
LONG_SUITES = ("rewards", "locality", "precision", "recurrent")


def _load(name: str) -> Any:
    """The suite's module, or an explanation why it cannot run here."""
    try:
        return importlib.import_module(SUITES[name])
    except ImportError as exc:
        return f"unavailable: {exc}"


def compare(path_a: Path, path_b: Path) -> str:
    """Markdown table of B's median time over A's for every case present in both runs."""
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))

    def keyed(record: dict[str, Any]) -> dict[tuple[str, ...], float]:
        out = {}
        for row in record.get("rows", []):
            time_key = next((k for k in ("ms_median", "s_median", "us_median") if k in row), None)
            if time_key is None:
                continue
            ident = tuple(v for v in row.values() if isinstance(v, str))
            out[ident] = float(row[time_key])
        return out

    ka, kb = keyed(a), keyed(b)
    rows = [
        {"case": " / ".join(k), "A": ka[k], "B": kb[k], "B/A": kb[k] / ka[k]}
        for k in ka
        if k in kb and ka[k] > 0
    ]
    if not rows:
        return "no common cases between the two runs"
    header = f"A = {path_a} ({a.get('created', '?')}), B = {path_b} ({b.get('created', '?')})"
    return header + "\n\n" + markdown_table(rows, ["case", "A", "B", "B/A"])


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "report":
        parser = ArgumentParser("marlbuf bench report", "Rebuild REPORT.md and the figures.")
        parser.add_argument("--quick", action="store_true", help="the quick results")
        parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="result folder")
        ns = parser.parse_args(args_list[1:])
        print(f"report: {write_report(ns.out, ns.quick)}")
        return 0
    if args_list and args_list[0] == "compare":
        parser = ArgumentParser("marlbuf bench compare", "Ratio table between two runs.")
        parser.add_argument("a", type=Path, help="baseline result JSON")
        parser.add_argument("b", type=Path, help="new result JSON")
        ns = parser.parse_args(args_list[1:])
        for p in (ns.a, ns.b):
            if not p.is_file():
                parser.error(f"no such result file: {p}")
        print(compare(ns.a, ns.b))
        return 0

    parser = ArgumentParser("marlbuf bench", __doc__)
    parser.add_argument(
        "suites",
        nargs="*",
        help=f"suites to run (default: all but {list(LONG_SUITES)}; with --quick: all): "
        f"{list(SUITES)}",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (minutes, not hours)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="result folder")
    parser.add_argument("--list", action="store_true", help="list suites and exit")
    ns = parser.parse_args(args_list)
    unknown = [s for s in ns.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    if ns.list:
        for name in SUITES:
            mod = _load(name)
            print(f"{name:<12} {'ok' if not isinstance(mod, str) else mod}")
        return 0

    names = ns.suites or [s for s in SUITES if ns.quick or s not in LONG_SUITES]
    if not ns.suites and not ns.quick:
        print(f"full run: leaving out {list(LONG_SUITES)} (name them to run them)", flush=True)
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
            payload = mod.run(quick=ns.quick)
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
    """``REPORT[-quick].md``: every suite's table and summary from the result files on disk,
    plus the figures (drawn anew). ``notes`` explain suites without a result in this run."""
    notes = notes or {}
    kind = "quick" if quick else "full"
    report = [f"# marlbuf benchmark report ({kind} sizes)", ""]
    for name in SUITES:
        path = result_path(name, quick, results_dir)
        report += [f"## {name}", ""]
        if name in notes:
            report += [notes[name], ""]
        if not path.is_file():
            report += [
                f"no result yet: run `marlbuf bench {name}{' --quick' if quick else ''}`",
                "",
            ]
            continue
        record = json.loads(path.read_text())
        report += [
            f"`{path.name}`, {record.get('created', '?')}, config: "
            f"`{json.dumps(record.get('config', {}), default=str)[:400]}`",
            "",
        ]
        if record.get("markdown"):
            report += [record["markdown"], ""]
        if record.get("summary"):
            report += ["```", json.dumps(record["summary"], indent=1, default=str), "```", ""]
    try:
        from marlbuf.bench.plots import make_all

        figures = make_all(results_dir, quick=quick)
        report += ["## figures", ""]
        report += [f"![{p.stem}]({p.parent.name}/{p.name})" for p in figures] + [""]
    except ImportError as exc:  # matplotlib missing: results stay usable without figures
        report += [f"figures skipped: {exc}", ""]
    out = Path(results_dir) / f"REPORT{'-quick' if quick else ''}.md"
    out.write_text("\n".join(report))
    return out
