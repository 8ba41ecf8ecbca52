"""Every code block of README.md and of the site's sources (docs/, every page) runs as written.

Each ```python block is executed in a fresh namespace inside an empty temporary working
folder, with warnings raised as errors (what a user copying the block would see as a warning
fails here). Each ```bash block's ``marlbuf ...`` command lines run through the console
script's ``main`` in that block's own temporary folder, in order; a bash block holding any
other command must be tagged ``skip``. Every inline ``marlbuf <command> ...`` of the prose is
parsed (not run): its options and suite names must exist (single capitals K, N, M, X stand
for values; spans with ``...``, ``[``, ``|``, SUITE or COMMAND are read as prose).

Tag convention: HTML comments (invisible in the rendered page) on the lines directly above a
block's opening fence, one tag per comment; arguments other than a skip reason are split as a
shell splits them (quote an argument holding blanks)::

    <!-- docs-test: skip REASON -->
        Not run. For code of another project shown for comparison ("Before" blocks), shell
        commands other than ``marlbuf`` (setup scripts), or hardware this suite cannot assume.
        The reason is required and should name where the behaviour is tested instead.
    <!-- docs-test: continue -->
        Runs in the names left by the previous python block of the same file (a narrative
        split into parts; copy the parts in order).
    <!-- docs-test: replace OLD NEW -->
        The test runs the block with the text OLD replaced by NEW: smaller sizes for a
        long-running block, e.g. ``<!-- docs-test: replace episodes=4000 episodes=3 -->``.
        OLD must occur in the block, so a tag never goes stale silently.
    <!-- docs-test: append COMMAND ARGS... -->
        Bash blocks: ARGS are appended to every ``marlbuf COMMAND`` line (the last value of a
        repeated option wins), e.g. ``<!-- docs-test: append train --episodes 3 -->``.
    <!-- docs-test: needs MODULE -->
        Skipped where MODULE cannot be imported, or where MODULE is ``cuda`` and no CUDA device
        is present.
    <!-- docs-test: slow REASON -->
        Runs only with ``pytest -m slow`` (a block that starts processes or a cluster and takes
        more than a few seconds even at its smallest); a block that continues it is slow too.
        The reason is required.

Keep untagged blocks fast (a few seconds at most): the default run runs them on every CI job.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TAG = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
KNOWN_TAGS = ("skip", "continue", "replace", "append", "needs", "slow")


@dataclass
class Block:
    """One fenced code block and the tags written above it."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    tags: list[list[str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def tag(self, name: str) -> list[list[str]]:
        return [args for tag, *args in self.tags if tag == name]


def collect(path: Path) -> list[Block]:
    """The fenced blocks of one markdown file, with the tags of the lines above each."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang = match.group(1), match.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]]
        tags = []
        above = i - 1
        while above >= 0 and (tag := TAG.match(lines[above])):
            name, _, rest = tag.group(1).partition(" ")
            # a skip reason is free text; other tags' arguments are split as a shell does
            tags.insert(0, [name, rest.strip()] if name == "skip" else [name, *shlex.split(rest)])
            above -= 1
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", tags))
        i = end + 1
    return blocks


BLOCKS = [b for path in DOC_FILES for b in collect(path)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
BASH = [b for b in BLOCKS if b.lang in ("bash", "sh", "shell", "console")]


def prepared(block: Block) -> str:
    """The block's code with its ``replace`` tags applied."""
    code = block.code
    for args in block.tag("replace"):
        assert len(args) == 2, f"{block.name}: replace takes OLD NEW, got {args}"
        old, new = args
        assert old in code, f"{block.name}: replace tag's {old!r} is not in the block"
        code = code.replace(old, new)
    return code


def skip_if_tagged(block: Block) -> None:
    for args in block.tag("skip"):
        assert args[0], f"{block.name}: a skip tag needs a reason"
        pytest.skip(f"tagged skip: {' '.join(args)}")
    for module, *_ in block.tag("needs"):
        if module == "cuda":
            torch = pytest.importorskip("torch")
            if not torch.cuda.is_available():
                pytest.skip("needs a CUDA device")
        elif importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")


def test_tags_are_known() -> None:
    for block in BLOCKS:
        for tag in block.tags:
            assert tag and tag[0] in KNOWN_TAGS, f"{block.name}: unknown docs-test tag {tag}"
            if tag[0] == "continue":
                assert block.lang == "python", f"{block.name}: continue is for python blocks"


def chain_of(block: Block, blocks: list[Block]) -> list[Block]:
    """``block`` and the blocks of ``blocks`` it continues, in file order."""
    chain = [block]
    index = blocks.index(block)
    while chain[0].tag("continue"):
        index -= 1
        assert index >= 0 and blocks[index].path == block.path, (
            f"{block.name}: continue tag without a python block above it in the same file"
        )
        chain.insert(0, blocks[index])
    return chain


def cases(blocks: list[Block]) -> list:
    """``blocks`` as parameters, marked slow where a block of their chain is tagged slow."""
    out = []
    for block in blocks:
        chain = chain_of(block, blocks) if block.lang == "python" else [block]
        slow = [args for part in chain for args in part.tag("slow")]
        assert all(args and args[0] for args in slow), f"{block.name}: a slow tag needs a reason"
        marks = [pytest.mark.slow] if slow else []
        out.append(pytest.param(block, marks=marks, id=block.name))
    return out


@pytest.mark.parametrize("block", cases(PYTHON))
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_if_tagged(block)
    chain = chain_of(block, PYTHON)  # the blocks this one continues, in file order
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for part in chain:
            if part is not block and part.tag("skip"):
                pytest.skip(f"continues {part.name}, which is tagged skip")
            exec(compile(prepared(part), part.name, "exec"), namespace)


def command_lines(code: str) -> list[list[str]]:
    """A shell block's commands as argument lists: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


@pytest.mark.parametrize("block", cases(BASH))
def test_cli_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from marlbuf import cli

    skip_if_tagged(block)
    commands = command_lines(prepared(block))
    for words in commands:
        assert words[0] == "marlbuf", (
            f"{block.name}: runs {words[0]!r}; only marlbuf command lines run here, tag the "
            "block '<!-- docs-test: skip REASON -->' if it must show other commands"
        )
    monkeypatch.chdir(tmp_path)
    for words in commands:
        argv = words[1:]
        for command, *extra in block.tag("append"):
            if argv and argv[0] == command:
                argv = [*argv, *extra]
        status = cli.main(argv)
        assert status == 0, f"{block.name}: marlbuf {' '.join(argv)} exited with {status}"


#: Placeholders the prose uses in inline commands, and values that parse in their place.
PLACEHOLDERS = {"K": "2", "N": "10", "M": "5", "X": "runs/x"}


def inline_commands() -> list[tuple[str, list[str]]]:
    """Every ``marlbuf <command> ...`` written inline in the docs, as an argument list (prose
    that names no command, error messages and elided commands left out)."""
    from marlbuf import cli

    found = []
    for path in DOC_FILES:
        for match in re.finditer(r"`(marlbuf [^`]+)`", path.read_text()):
            text = " ".join(match.group(1).split())
            if any(mark in text for mark in ("...", "|", "[", ": error", "SUITE", "COMMAND")):
                continue
            words = [PLACEHOLDERS.get(w, w) for w in shlex.split(text)[1:]]
            if words and words[0] in cli.COMMANDS:
                found.append((f"{path.relative_to(ROOT)}: {text}", words))
    return found


INLINE = inline_commands()


@pytest.mark.parametrize("words", [w for _, w in INLINE], ids=[name for name, _ in INLINE])
def test_inline_command_parses(words: list[str]) -> None:
    """Inline commands name options and suites that exist (parsed, not run)."""
    import importlib

    from marlbuf.bench import cli as bench_cli

    command, args = words[0], words[1:]
    if command == "bench" and args and args[0] in ("compare", "report"):
        sub = {"compare": bench_cli.build_compare_parser, "report": bench_cli.build_report_parser}
        sub[args[0]]().parse_args(args[1:])
        return
    if command == "bench":
        ns = bench_cli.build_parser().parse_args(args)
        unknown = set(ns.suites) - set(bench_cli.SUITES)
        assert not unknown, f"unknown suites {unknown}"
        given = {o: getattr(ns, o) for o in bench_cli.SUITE_OPTIONS if getattr(ns, o) is not None}
        names = ns.suites or list(bench_cli.SUITES)
        assert bench_cli.options_error(names, given) is None  # options their suites take
        return
    if command not in ("train", "profile"):
        assert not args, f"marlbuf {command} takes its options from --help: {args}"
        return
    module = {"train": "marlbuf.algos.cli", "profile": "marlbuf.profiling.cli"}[command]
    parser = importlib.import_module(module).build_parser()
    try:
        parser.parse_args(args)
    except SystemExit as exc:  # --help exits 0; a bad option exits 2
        assert exc.code == 0, f"marlbuf {' '.join(words)} does not parse"
