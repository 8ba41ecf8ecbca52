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

import ast
import functools
import importlib
import importlib.util
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

import marlbuf
from marlbuf.cli import ArgumentParser

#: the folder of the ``marlbuf`` package (its subpackages' sources are found from it)
_PACKAGE_ROOT = Path(marlbuf.__file__).resolve().parent

#: Where results go unless ``--out`` says otherwise: a folder in the current directory (the
#: package's own folder may be a read-only site-packages).
DEFAULT_OUT = Path("bench-results")

OUT_HELP = "result folder (default: ./bench-results in the current folder)"

#: suite name -> module (each exposes SUITE and run(quick) -> payload)
SUITES: dict[str, str] = {
    "guard": "marlbuf.bench.suites.guard",
    "sampling": "marlbuf.bench.suites.sampling",
    "layout": "marlbuf.bench.suites.layout",
    "prioritized": "marlbuf.bench.suites.prioritized",
    "adapters": "marlbuf.bench.suites.adapters",
    "envs": "marlbuf.bench.suites.envs",
    "update": "marlbuf.bench.suites.update",
    "end_to_end": "marlbuf.bench.suites.end_to_end",
    "counters": "marlbuf.bench.suites.counters",
    "peers": "marlbuf.bench.suites.peers",
    "rewards": "marlbuf.bench.suites.rewards",
    "dropin": "marlbuf.bench.suites.dropin",
    "locality": "marlbuf.bench.suites.locality",
    "memory": "marlbuf.bench.suites.memory",
    "device": "marlbuf.bench.suites.device",
    "recurrent": "marlbuf.bench.suites.recurrent",
    "distributed": "marlbuf.bench.suites.distributed",
    "concurrency": "marlbuf.bench.suites.concurrency",
    "precision": "marlbuf.bench.suites.precision",
    "sequences": "marlbuf.bench.suites.sequences",
    "torchrl": "marlbuf.bench.suites.torchrl_buffers",
    "first_calls": "marlbuf.bench.suites.first_calls",
    "offline": "marlbuf.bench.suites.offline",
    "log_checksums": "marlbuf.bench.suites.log_checksums",
    "snapshot_lock": "marlbuf.bench.suites.snapshot_lock",
}

#: suites a full run without named suites leaves out: the reward study trains 45 MADDPG runs
#: (about 30 minutes on 2 cores), the locality sweep 30 more (reusing the reward study's runs
#: where identical), the precision check 6 (float16 storage); name them to run them
#: (``marlbuf bench rewards locality precision``)
LONG_SUITES = ("rewards", "locality", "precision", "recurrent")
#: suites that measure one mechanism of the library for its maintainers (the redo log's
#: checksums, the snapshot lock's cost): run only when named, never by a run of all suites
NAMED_ONLY = ("log_checksums", "snapshot_lock")


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


def describe(name: str) -> tuple[list[str], str | None]:
    """A suite's options (:func:`suite_options`) and why it cannot run here (``None``: it
    can), read from its source without importing it (a suite imports torch, Ray or
    matplotlib, which take seconds): the parameters of its ``run()``, and the first package
    it imports at module level, directly or through marlbuf modules it imports so, that is
    not installed. A module imported already is asked directly."""
    module_name = SUITES[name]
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        return suite_options(loaded), None
    path = _source_path(module_name)
    if path is None:
        return [], f"unavailable: no module named {module_name!r}"
    options: list[str] = []
    source = path.read_text()
    at = source.find("\ndef run(")
    if at >= 0:  # the signature alone, parsed as a function of its own
        depth, end = 0, at + len("\ndef run")
        while end < len(source):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
            end += 1
        signature = ast.parse(source[at + 1 : end + 1] + ": pass").body[0]
        assert isinstance(signature, ast.FunctionDef)
        arguments = signature.args.args + signature.args.kwonlyargs
        options = [o for o in SUITE_OPTIONS if o in {a.arg for a in arguments}]
    missing = _missing_import(module_name)
    return options, None if missing is None else f"unavailable: No module named {missing!r}"


def _source_path(module_name: str) -> Path | None:
    """The source file of a ``marlbuf`` module, found without importing it or its parent
    packages (a parent may import Ray): ``None`` where there is none."""
    parts = module_name.split(".")
    if parts[0] != "marlbuf":
        return None
    folder = _PACKAGE_ROOT.joinpath(*parts[1:])
    for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _source_tree(module_name: str) -> ast.Module | None:
    """The head of a ``marlbuf`` module's source, parsed (``None``: no such module), not
    imported: the lines before its first top-level function or class (where its module-level
    imports are; an import below them is not seen)."""
    path = _source_path(module_name)
    if path is None:
        return None
    lines = path.read_text().splitlines(keepends=True)
    head = next(
        (i for i, line in enumerate(lines) if line.startswith(("def ", "class ", "@"))),
        len(lines),
    )
    try:
        return ast.parse("".join(lines[:head]))
    except SyntaxError:  # cut inside a string (a docstring's example): the whole module
        return ast.parse("".join(lines))


def _top_level_imports(tree: ast.Module, package: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of the imports run when the module is imported: at its top level
    and in its top-level ``if``/``try`` blocks (``if TYPE_CHECKING:`` excluded), not in
    functions or classes. Relative imports resolved against ``package``."""
    found: list[tuple[str, list[str]]] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend((a.name, []) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, module] if module else base)
                found.append((module, [a.name for a in node.names]))
            elif isinstance(node, ast.If) and not ast.unparse(node.test).endswith("TYPE_CHECKING"):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's names imported on first use (its ``_EXPORTS`` table), if it has one."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["_EXPORTS"]
            and isinstance(node.value, ast.Dict)
        ):
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in table.items()}
    return {}


@functools.cache
def _missing_import(module_name: str) -> str | None:
    """The first package ``module_name`` needs at import (see :func:`describe`) that is not
    installed, or ``None`` (an import cycle counts as nothing missing)."""
    if module_name in _VISITING:
        return None
    _VISITING.add(module_name)
    try:
        return _first_missing(module_name)
    finally:
        _VISITING.discard(module_name)


#: marlbuf's subpackages with dependencies of their own (extras)
_ABOVE_THE_CORE = ("algos", "bench", "compat", "distributed", "envs", "profiling")


@functools.cache
def _installed(package: str) -> bool:
    """Whether a top-level package can be found (it is not imported)."""
    return package in sys.modules or importlib.util.find_spec(package) is not None


#: the modules :func:`_missing_import` is inside of (an import cycle stops there)
_VISITING: set[str] = set()


def _first_missing(module_name: str) -> str | None:
    tree = _source_tree(module_name)
    if tree is None:
        return None
    path = _source_path(module_name)
    is_package = path is not None and path.name == "__init__.py"
    package = module_name if is_package else module_name.rpartition(".")[0]
    for module, names in _top_level_imports(tree, package):
        top = module.partition(".")[0]
        if top == "__future__":
            continue
        if top != "marlbuf":
            if not _installed(top):
                return top
            continue
        exports = _lazy_exports(_source_tree(module) or ast.Module(body=[], type_ignores=[]))
        targets = [module, *(exports[n] for n in names if n in exports)]
        targets += [f"{module}.{n}" for n in names if n not in exports]
        for target in targets:
            if target.split(".")[1:2] and target.split(".")[1] not in _ABOVE_THE_CORE:
                continue  # the core needs NumPy and Numba only, which marlbuf requires
            if _source_tree(target) is not None:
                missing = _missing_import(target)
                if missing is not None:
                    return missing
    return None


def options_error(names: list[str], given: dict[str, Any]) -> str | None:
    """Why the given suite options do not fit the chosen suites (``None``: they do). A suite
    that cannot be imported here is skipped when it runs, so it refuses nothing."""

    def takes(name: str, option: str) -> bool | None:
        options, why_not = describe(name)
        return None if why_not is not None else option in options

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
        from marlbuf.cli import missing_extra

        return f"unavailable: {missing_extra(exc) or exc}"


#: Row fields that hold a time, with their unit, in the order compare looks for them.
TIME_FIELDS = (("ms_median", "ms"), ("s_median", "s"), ("us_median", "µs"))


class MixedSizesError(ValueError):
    """Two result files of different sizes (quick and full) compared without saying so."""


def compare(path_a: Path, path_b: Path, allow_mixed_sizes: bool = False) -> str:
    """Markdown table of B's median time over A's for every case present in both runs.

    Warns (lines ``WARNING: ...`` above the table) when the two runs differ in machine,
    versions, load or copy bandwidth (:func:`marlbuf.bench.tools.report.compare_warnings`), and when
    the spread of repeats (min-max) of A and of B overlaps, which a column marks per case.

    Raises :class:`MixedSizesError` when one file holds quick sizes and the other full ones,
    unless ``allow_mixed_sizes``: their times are not comparable.
    """
    from marlbuf.bench.tools import report
    from marlbuf.bench.tools.common import markdown_table

    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    sizes = {p: "quick" if r.get("quick") else "full" for p, r in ((path_a, a), (path_b, b))}
    mixed = sizes[path_a] != sizes[path_b]
    if mixed and not allow_mixed_sizes:
        raise MixedSizesError(
            f"{path_a} holds {sizes[path_a]} sizes but {path_b} {sizes[path_b]} sizes; their "
            "times are not comparable (pass --allow-mixed-sizes to compare them anyway)"
        )

    def keyed(record: dict[str, Any]) -> dict[tuple[str, ...], tuple[float, str, Any]]:
        out = {}
        for row in record.get("rows", []):
            field = next(((k, u) for k, u in TIME_FIELDS if k in row), None)
            if field is None:
                continue
            ident = tuple(v for v in row.values() if isinstance(v, str) and v)
            out[ident] = (float(row[field[0]]), field[1], report.spread(row, field[0]))
        return out

    ka, kb = keyed(a), keyed(b)
    rows = []
    for k in ka:
        if k in kb and ka[k][0] > 0 and ka[k][1] == kb[k][1]:
            unit = ka[k][1]
            overlap = report.spreads_overlap(ka[k][2], kb[k][2])
            rows.append(
                {
                    "case": " / ".join(k),
                    f"A ({unit})": ka[k][0],
                    f"B ({unit})": kb[k][0],
                    "B/A (time ratio)": kb[k][0] / ka[k][0],
                    "spreads overlap": "—" if overlap is None else ("yes" if overlap else "no"),
                }
            )
    if not rows:
        return "no common cases between the two runs"
    header = (
        f"A = {path_a} ({a.get('created', '?')}, {sizes[path_a]} sizes), "
        f"B = {path_b} ({b.get('created', '?')}, {sizes[path_b]} sizes); "
        "median time per case, B/A below 1: B is faster"
    )
    warnings = report.compare_warnings(a, b)
    if mixed:
        warnings.insert(0, "quick and full sizes mixed; ratios compare different workloads")
    overlapping = sum(r["spreads overlap"] == "yes" for r in rows)
    if overlapping:
        warnings.append(
            f"the spread of repeats (min-max) of A and of B overlaps in {overlapping} of "
            f"{len(rows)} cases (column 'spreads overlap'): their difference is within the "
            "noise of these runs"
        )
    header += "".join(f"\n\nWARNING: {w}." for w in warnings)
    tables = []
    for _, unit in TIME_FIELDS:
        part = [r for r in rows if f"A ({unit})" in r]
        if part:
            columns = ["case", f"A ({unit})", f"B ({unit})", "B/A (time ratio)", "spreads overlap"]
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
        f"{', '.join(LONG_SUITES)}; with --quick: all; {', '.join(NAMED_ONLY)} only when named)",
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


def build_report_parser() -> ArgumentParser:
    """The parser of ``marlbuf bench report [--quick] [--out DIR]``."""
    parser = ArgumentParser("marlbuf bench report", "Rebuild REPORT.md and the figures.")
    parser.add_argument("--quick", action="store_true", help="the quick results")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=OUT_HELP)
    return parser


def build_compare_parser() -> ArgumentParser:
    """The parser of ``marlbuf bench compare A B [--allow-mixed-sizes]``."""
    parser = ArgumentParser(
        "marlbuf bench compare",
        "Median time per case of run B over run A (B/A), with a warning where the runs differ "
        "in machine, versions, load or copy bandwidth, or the spread of repeats overlaps.",
    )
    parser.add_argument("a", type=Path, help="baseline result file (JSON)")
    parser.add_argument("b", type=Path, help="new result file (JSON)")
    parser.add_argument(
        "--allow-mixed-sizes",
        action="store_true",
        help="compare a quick result with a full one (their sizes differ)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "report":
        ns = build_report_parser().parse_args(args_list[1:])
        print(f"report: {write_report(ns.out, ns.quick)}")
        return 0
    if args_list and args_list[0] == "compare":
        parser = build_compare_parser()
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
            options, why_not = describe(name)
            if why_not is not None:
                print(f"{name:<12} {why_not}")
                continue
            listed = " ".join(f"--{o}" for o in options)
            print(f"{name:<12} ok" + (f" (options: {listed})" if listed else ""))
        return 0

    names = ns.suites or [
        s for s in SUITES if s not in NAMED_ONLY and (ns.quick or s not in LONG_SUITES)
    ]
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
    from marlbuf.bench.tools.common import write_result

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
    note from this run), the figures drawn anew (:mod:`marlbuf.bench.tools.report`)."""
    from marlbuf.bench.tools import report

    figures, figures_error = None, None
    try:
        from marlbuf.bench.tools.plots import make_all

        figures = make_all(results_dir, quick=quick)
    except ImportError as exc:  # matplotlib missing: results stay usable without figures
        figures_error = str(exc)
    return report.write_report(results_dir, quick, SUITES, notes, figures, figures_error)
