"""Two versions of marlbuf measured pairwise in one run: every case of the named suites.

``python -m marlbuf.bench.pairwise --base PATH [--suites sampling prioritized] [--rounds 3]``
runs each suite alternately with the marlbuf found at ``PATH`` (a checkout or an unpacked
release: its folder holds the ``marlbuf`` package) and with this one (the installed one, or the
folder given by ``--head``), ``rounds`` times each, in
subprocesses (``PYTHONPATH=PATH`` selects the base). For every case both versions measured, it
reports the median over rounds of this version's time divided by the base's, per timing
column, and whether it lies within ``--tolerance`` (default 5%). Alternating the versions
round by round exposes both to the same machine state, so the ratio is a same-run figure.

A case is identified by the values of its row that are not timings (workload, case name,
capacity, ...); timing columns are those ending in ``_median``, plus the drop-in suite's
``write_us``, ``sample_ms`` and ``update_ms``.

Whole suite runs are minutes apart, and a shared machine drifts between them (the same code
measured 0.6x to 1.5x of itself in consecutive runs on a 2-core VM). ``--normalize KEY=VALUE``
divides every timing by the same run's timing of the row that differs only in ``KEY`` and has
``KEY=VALUE`` (a baseline whose code both versions share, e.g. ``case=copy_floor``, the bare
memory copy, or a peer library's case): the reported figure is then the ratio of the two
versions' same-run ratios, which the drift cancels out of.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import RESULTS_DIR, markdown_table, run_conditions

#: timing columns outside the ``*_median`` convention (the drop-in suite's)
EXTRA_TIMINGS = ("write_us", "sample_ms", "update_ms")


def _is_timing(key: str) -> bool:
    return key.endswith("_median") or key in EXTRA_TIMINGS


def _identity(row: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The values of a row that name its case (everything that is not a measurement)."""
    return tuple(
        sorted(
            (k, v)
            for k, v in row.items()
            if isinstance(v, (str, int, bool))
            and not isinstance(v, float)
            and not _is_timing(k)
            and not k.endswith(("_ms", "_us", "_min", "_max"))
            and "vs" not in k
            and "speedup" not in k
        )
    )


def _environment(base: Path | None) -> dict[str, str]:
    """The environment of a measured subprocess: passive OpenMP waits, and the marlbuf at
    ``base`` first on the path (``None``: the installed one, whatever ``PYTHONPATH`` said)."""
    env = dict(os.environ)
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    if base is not None:
        env["PYTHONPATH"] = str(base)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _run_suite(suite: str, base: Path | None, quick: bool, out: Path) -> list[dict[str, Any]]:
    """One run of ``suite`` with the base (``base``) or this version (``None``)."""
    env = _environment(base)
    command = [sys.executable, "-m", "marlbuf", "bench", suite, "--out", str(out)]
    if quick:
        command.append("--quick")
    subprocess.run(command, check=True, env=env, cwd=tempfile.gettempdir(), capture_output=True)
    name = f"{suite}-quick.json" if quick else f"{suite}.json"
    payload = json.loads((out / name).read_text())
    rows = [r for key in ("rows", "write_rows") for r in payload.get(key) or []]
    return [r for r in rows if isinstance(r, dict)]


def _normalized(
    rows: dict[Any, dict[str, Any]], normalize: tuple[str, str] | None
) -> dict[Any, dict[str, Any]]:
    """``rows`` with every timing divided by that of its group's ``normalize`` row (the row
    that differs only in that key and has that value); rows without one are dropped."""
    if normalize is None:
        return rows
    key, value = normalize
    out = {}
    for case, row in rows.items():
        group = tuple((k, v) for k, v in case if k != key)
        base = next(
            (
                r
                for c, r in rows.items()
                if str(dict(c).get(key)) == value
                and tuple((k, v) for k, v in c if k != key) == group
            ),
            None,
        )
        if base is None or base is row:
            continue
        out[case] = {
            k: (float(v) / float(base[k]) if _is_timing(k) and base.get(k) else v)
            for k, v in row.items()
        }
    return out


def compare(
    suite: str,
    base: Path,
    rounds: int,
    quick: bool,
    tolerance: float,
    normalize: tuple[str, str] | None = None,
    head: Path | None = None,
) -> dict[str, Any]:
    """Per case and timing column, the median ratio (this / base) over ``rounds`` pairs (of
    the timings divided by the same run's ``normalize`` case, when given). ``head``: the folder
    of the version measured as "this" (``None``: the installed marlbuf)."""
    ratios: dict[tuple[Any, str], list[float]] = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # alternate which version goes first, so neither always runs on a warmer machine
            order = (
                [("base", base), ("this", head)] if r % 2 == 0 else [("this", head), ("base", base)]
            )
            runs: dict[str, dict[Any, dict[str, Any]]] = {}
            for label, path in order:
                out = Path(tmp) / f"{label}-{r}"
                out.mkdir()
                measured = {_identity(r): r for r in _run_suite(suite, path, quick, out)}
                runs[label] = _normalized(measured, normalize)
            for case, mine in runs["this"].items():
                theirs = runs["base"].get(case)
                if theirs is None:
                    continue
                for key, value in mine.items():
                    other = theirs.get(key)
                    if _is_timing(key) and isinstance(value, (int, float)) and other:
                        ratios.setdefault((case, key), []).append(float(value) / float(other))
    rows = []
    for (case, key), values in sorted(ratios.items(), key=lambda item: str(item[0])):
        ratio = float(np.median(values))
        rows.append(
            {
                "case": ", ".join(f"{k}={v}" for k, v in case),
                "timing": key,
                "ratio_this_vs_base": round(ratio, 3),
                "ratios": [round(v, 3) for v in values],
                "within_tolerance": bool(ratio <= 1 + tolerance),
            }
        )
    return {
        "suite": f"pairwise-{suite}",
        "quick": quick,
        "base": str(base),
        "rounds": rounds,
        "tolerance": tolerance,
        "normalized_by": None if normalize is None else "=".join(normalize),
        "seconds": round(time.time() - started, 1),
        "rows": rows,
        "slower_than_tolerance": [r for r in rows if not r["within_tolerance"]],
        "markdown": markdown_table(
            rows, ["case", "timing", "ratio_this_vs_base", "within_tolerance"]
        ),
    }


WORKER = Path(__file__).with_name("pairwise_worker.py")


def _start_worker(base: Path | None) -> tuple[subprocess.Popen[str], list[str]]:
    env = _environment(base)
    worker = subprocess.Popen(
        [sys.executable, str(WORKER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert worker.stdout is not None
    ready = worker.stdout.readline().split()
    if not ready or ready[0] != "ready":
        raise RuntimeError(f"the pairwise worker did not start ({base or 'this version'})")
    return worker, ready[1:]


def _ask(worker: subprocess.Popen[str], case: str) -> float:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(case + "\n")
    worker.stdin.flush()
    answer = worker.stdout.readline().split()
    return float(answer[0]) if answer else math.nan


def compare_core(
    base: Path,
    rounds: int,
    tolerance: float,
    only: list[str] | None = None,
    head: Path | None = None,
) -> dict[str, Any]:
    """The core operations (``pairwise_worker.py``) with both versions in two long-lived
    processes, asked in turn case by case (ABAB...; the first asked alternates by round): the
    median of per-round ratios this / base per case (``head``: as for :func:`compare`)."""
    started = time.time()
    theirs, names = _start_worker(base)
    mine, _ = _start_worker(head)
    rows = []
    try:
        for case in names:
            if only and not any(part in case for part in only):
                continue
            ratios: list[float] = []
            times: dict[str, list[float]] = {"base": [], "this": []}
            for r in range(rounds):
                order = [("base", theirs), ("this", mine)]
                for label, worker in order if r % 2 == 0 else order[::-1]:
                    times[label].append(_ask(worker, case))
                ratios.append(times["this"][-1] / times["base"][-1])
            ratio = float(np.median(ratios))
            rows.append(
                {
                    "case": case.replace("~", " "),
                    "base_ms": round(1000 * float(np.median(times["base"])), 4),
                    "this_ms": round(1000 * float(np.median(times["this"])), 4),
                    "ratio_this_vs_base": round(ratio, 3),
                    "ratios": [round(v, 3) for v in ratios],
                    "within_tolerance": bool(ratio <= 1 + tolerance),
                }
            )
            print(f"{ratio:6.3f}x  {case.replace('~', ' ')}", flush=True)
    finally:
        for worker in (theirs, mine):
            if worker.stdin is not None:
                worker.stdin.write("quit\n")
                worker.stdin.close()
            worker.wait(timeout=60)
    from marlbuf.profiling.info import machine_info

    return {
        "suite": "pairwise-core",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # the machine, its copy bandwidth and load average as the timings end
        "machine": {**machine_info(), **run_conditions()},
        "base": str(base),
        "rounds": rounds,
        "tolerance": tolerance,
        "seconds": round(time.time() - started, 1),
        "rows": rows,
        "slower_than_tolerance": [r for r in rows if not r["within_tolerance"]],
        "markdown": markdown_table(
            rows, ["case", "base_ms", "this_ms", "ratio_this_vs_base", "within_tolerance"]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m marlbuf.bench.pairwise", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base", type=Path, required=True, help="folder holding the base marlbuf")
    parser.add_argument(
        "--head",
        type=Path,
        default=None,
        help="folder holding the marlbuf measured as 'this' (default: the installed one)",
    )
    parser.add_argument(
        "--suites",
        nargs="+",
        default=["sampling", "prioritized", "sequences", "dropin"],
        help="suites to compare (default: sampling prioritized sequences dropin)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs per suite (default 3)")
    parser.add_argument("--quick", action="store_true", help="the suites' small sizes")
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="allowed slowdown (default 0.05: 5%%)"
    )
    parser.add_argument(
        "--normalize",
        action="append",
        default=[],
        metavar="SUITE:KEY=VALUE",
        help="divide a suite's timings by its same-run baseline row (repeatable), e.g. "
        "sampling:case=copy_floor",
    )
    parser.add_argument(
        "--core",
        action="store_true",
        help="compare the core operations in two long-lived processes asked in turn (the "
        "finest alternation; see pairwise_worker.py) instead of whole suite runs",
    )
    parser.add_argument(
        "--cases", nargs="*", default=None, help="with --core: only cases containing these words"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="result folder")
    args = parser.parse_args(argv)
    baselines: dict[str, tuple[str, str]] = {}
    for item in args.normalize:
        suite, _, pair = item.partition(":")
        key, _, value = pair.partition("=")
        if not (suite and key and value):
            parser.error(f"--normalize takes SUITE:KEY=VALUE; got --normalize {item}")
        baselines[suite] = (key, value)
    for flag, folder in (("--base", args.base), ("--head", args.head)):
        if folder is not None and not (folder / "marlbuf" / "__init__.py").is_file():
            parser.error(f"{flag} must be a folder holding the marlbuf package; got {folder}")
    head = None if args.head is None else args.head.resolve()
    if args.core:
        result = compare_core(args.base.resolve(), args.rounds, args.tolerance, args.cases, head)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pairwise-core.json").write_text(json.dumps(result, indent=1))
        print(f"core: {len(result['slower_than_tolerance'])} of {len(result['rows'])} past")
        return 1 if result["slower_than_tolerance"] else 0
    worst = 0
    for suite in args.suites:
        result = compare(
            suite,
            args.base.resolve(),
            args.rounds,
            args.quick,
            args.tolerance,
            baselines.get(suite),
            head,
        )
        suffix = "-quick" if args.quick else ""
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"pairwise-{suite}{suffix}.json").write_text(json.dumps(result, indent=1))
        slower = result["slower_than_tolerance"]
        print(f"{suite}: {len(result['rows'])} timings, {len(slower)} past the tolerance")
        for row in slower:
            print(f"  {row['ratio_this_vs_base']:.3f}x  {row['timing']}  {row['case']}")
        worst = max(worst, len(slower))
    return 1 if worst else 0


if __name__ == "__main__":
    raise SystemExit(main())
