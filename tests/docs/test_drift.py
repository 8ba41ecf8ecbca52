"""The documentation stays in step with the code: every option table of the docs against its
command's parser (each documented default is the parser's, every option is documented), the
prose that states a default, and no reference to an issue tracker outside the repository."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Option tables: (document, the heading above the table, the module whose build_parser()
#: parses the command, a module the parser needs to import).
OPTION_TABLES = [
    ("docs/training.md", "## Options", "marlbuf.algos.cli", "torch"),
    ("docs/profiling.md", "### Options of `marlbuf profile`", "marlbuf.profiling.cli", None),
    ("docs/benchmarks.md", "### Options of `marlbuf bench`", "marlbuf.bench.cli", None),
]


def option_table(path: str, heading: str) -> list[tuple[list[str], str]]:
    """The rows of the ``| flag | default | meaning |`` table after ``heading``: the flags of
    each row and its default cell."""
    text = (ROOT / path).read_text()
    assert heading in text, f"{path} has no section {heading!r}"
    rows, started = [], False
    for line in text[text.index(heading) :].splitlines()[1:]:
        if line.startswith("| flag | default |"):
            started = True
            continue
        if started and not line.startswith("|"):
            break
        if started and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append((re.findall(r"`(--[a-z][a-z-]*)", cells[0]), cells[1]))
    assert rows, f"no option table under {heading!r} in {path}"
    return rows


def documented_value(cell: str) -> tuple[str, Any]:
    """A default cell read as ("value", a literal) or ("words", a description of a default the
    command computes, where the parser's default is None)."""
    text = cell.strip()
    plain = text.strip("`")
    if text in ("off", "on"):
        return "value", text == "on"
    try:
        return "value", float(plain)
    except ValueError:
        pass
    if re.fullmatch(r"`[^`\s<>]+`", text):
        return "value", plain.removeprefix("./")
    return "words", text


def assert_same(flag: str, kind: str, documented: Any, default: Any) -> None:
    if kind == "words":
        assert default is None, f"{flag}: documented as {documented!r}, parser default {default!r}"
        return
    if isinstance(default, bool) or isinstance(documented, bool):
        assert default is documented, f"{flag}: documented {documented}, parser {default!r}"
    elif isinstance(documented, float):
        values = default if isinstance(default, list) else [default]
        assert len(values) == 1 and float(values[0]) == documented, (flag, documented, default)
    else:
        values = default if isinstance(default, list) else [default]
        shown = " ".join(str(v) for v in values).removeprefix("./")
        assert shown == documented, f"{flag}: documented {documented!r}, parser {default!r}"


@pytest.mark.parametrize(("path", "heading", "module", "needs"), OPTION_TABLES)
def test_documented_defaults_match_the_parsers(
    path: str, heading: str, module: str, needs: str | None
) -> None:
    if needs is not None:
        pytest.importorskip(needs)
    parser = importlib.import_module(module).build_parser()
    actions = {
        option: action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
    }
    documented = set()
    for flags, cell in option_table(path, heading):
        parts = [p.strip() for p in cell.split(", ")] if len(flags) > 1 else [cell]
        assert len(parts) == len(flags), f"{path}: one default per flag in {flags}: {cell!r}"
        for flag, part in zip(flags, parts):
            assert flag in actions, f"{path} documents {flag}, which {module} does not take"
            assert_same(flag, *documented_value(part), actions[flag].default)
            documented.add(flag)
    undocumented = {
        action.option_strings[-1]
        for action in actions.values()
        if not set(action.option_strings) & documented
    }
    assert not undocumented, f"{path} leaves out {sorted(undocumented)}"


def test_prose_that_states_a_default_matches_the_parser() -> None:
    """``marlbuf train --sampler neighbor`` defaults to ``--run-length 1``, wherever said."""
    modules = {"train": ("marlbuf.algos.cli", "torch"), "profile": ("marlbuf.profiling.cli", None)}
    pattern = re.compile(r"`marlbuf (\w+)[^`]*` defaults to `(--[a-z-]+) ([^`]+)`")
    found = 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for command, flag, value in pattern.findall(" ".join(path.read_text().split())):
            module, needs = modules[command]
            if needs is not None and importlib.util.find_spec(needs) is None:
                continue
            parser = importlib.import_module(module).build_parser()
            default = next(a.default for a in parser._actions if flag in a.option_strings)
            assert str(default) == value, f"{path.name}: {command} {flag} {value} != {default}"
            found += 1
    assert found or importlib.util.find_spec("torch") is None


#: Text files of the repository that describe it (code, tests, docs, scripts, configuration).
TEXT_SUFFIXES = {".py", ".md", ".toml", ".ipynb", ".sh", ".cfg", ".yml", ".yaml", ".txt", ""}


def repository_text_files() -> list[Path]:
    skip = {".venv", ".venv-ci", ".git", "__pycache__", "results", "runs", "build", "dist"}
    files = []
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        if parts & skip or any(p.endswith(".egg-info") for p in parts) or not path.is_file():
            continue
        if path.suffix in TEXT_SUFFIXES and path.stat().st_size < 2_000_000:
            files.append(path)
    return files


def test_no_reference_to_an_issue_tracker_outside_the_repository() -> None:
    # built from parts, so that this file does not match itself
    word = "iss" + "ue"
    tracker = re.compile(rf"\({word}s? #?\d+|\b{word}s? #?\d+\b|\b{word}'s targets", re.I)
    offenders = []
    for path in repository_text_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if tracker.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not offenders, "\n".join(offenders)
