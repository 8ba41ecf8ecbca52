"""A minimal install (NumPy and Numba only): ``import marlbuf`` and the README's quickstart run
(its lines that need PyTorch say so), and every command of the console script run without its
extra prints one line naming the extra to install, never a traceback.

The optional packages are hidden from a child interpreter by an import hook that makes them
missing (``ModuleNotFoundError``, as on a machine without them), so the test runs where they
are installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marlbuf.cli import EXTRA_OF, missing_extra

ROOT = Path(__file__).resolve().parents[2]

#: Every optional top-level package marlbuf may import (the extras' and their own).
OPTIONAL = sorted(EXTRA_OF)

HIDE = """
import importlib.abc, os, sys
HIDDEN = set(os.environ["MARLBUF_TEST_HIDDEN"].split(","))

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())

# where a package is not installed, find_spec answers None and its metadata is missing
import importlib.metadata, importlib.util
_find_spec, _version = importlib.util.find_spec, importlib.metadata.version

def find_spec(name, package=None):
    if name.partition(".")[0] in HIDDEN:
        return None
    return _find_spec(name, package)

def version(name):
    if name.replace("-", "_") in HIDDEN:
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)

importlib.util.find_spec, importlib.metadata.version = find_spec, version
"""


def _minimal(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MARLBUF_TEST_HIDDEN": ",".join(OPTIONAL),
    }
    return subprocess.run(
        [sys.executable, "-c", HIDE + code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_extras_map_matches_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def names(extra: str) -> set[str]:
        return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0] for r in extras[extra]}

    for extra in ("algos", "envs", "bench", "peers", "distributed"):
        for name in names(extra):  # every package of an extra is known...
            assert name in EXTRA_OF, name
    for name, extra in EXTRA_OF.items():  # ...and named with an extra that installs it
        assert name in names(extra) or (name == "tensordict" and "torchrl" in names(extra))


def test_missing_extra_names_the_extra() -> None:
    try:
        try:
            raise ModuleNotFoundError("No module named 'mpe2'", name="mpe2")
        except ImportError as inner:
            raise ImportError("something needs mpe2") from inner
    except ImportError as exc:
        assert missing_extra(exc) == "needs 'mpe2' (not installed): pip install 'marlbuf[envs]'"
    own = ImportError("plots need matplotlib: pip install 'marlbuf[bench]'", name="matplotlib")
    assert missing_extra(own) == "plots need matplotlib: pip install 'marlbuf[bench]'"
    assert missing_extra(ModuleNotFoundError("x", name="marlbuf.nothing")) is None
    assert missing_extra(ImportError("cannot import name 'x'")) is None


def test_import_and_quickstart_need_only_numpy_and_numba(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    quickstart = re.search(r"## Quickstart\n\n```python\n(.*?)```", text, re.S)
    assert quickstart, "README has no Quickstart python block"
    lines = quickstart.group(1).splitlines()
    # a line that uses torch says so, and only those lines are left out on a minimal install
    torch_lines = [line for line in lines if "torch" in line]
    assert all("needs PyTorch" in line for line in torch_lines), torch_lines
    minimal = "\n".join(line for line in lines if "needs PyTorch" not in line)
    code = (
        "import sys\n"
        "import marlbuf\n"
        f"hidden = {OPTIONAL!r}\n"
        "assert not [m for m in sys.modules if m.partition('.')[0] in hidden]\n"
        f"exec(compile({minimal!r}, 'README quickstart', 'exec'), {{}})\n"
        "assert not [m for m in sys.modules if m.partition('.')[0] in hidden]\n"
        "print('quickstart ran')\n"
    )
    done = _minimal(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "quickstart ran" in done.stdout and (tmp_path / "buffer.npz").is_file()
    if torch_lines:  # where torch is needed, the error says which extra installs it
        code = (
            "import numpy as np\n"
            "from marlbuf import AgentSpec, MultiAgentReplayBuffer\n"
            "buf = MultiAgentReplayBuffer({'a': AgentSpec((2,), (1,))}, 8)\n"
            "z = {'a': np.zeros(2)}\n"
            "buf.add(z, {'a': np.zeros(1)}, {'a': 0.0}, z, {'a': 0.0})\n"
            "try:\n"
            "    buf.sample(1).to_torch()\n"
            "except ImportError as exc:\n"
            "    print(exc)\n"
        )
        done = _minimal(code, tmp_path)
        assert "pip install 'marlbuf[algos]'" in done.stdout, done.stdout + done.stderr


#: Commands of the console script, each run as a user without the extras would: (arguments,
#: the extra its one-line error names, or None where it runs without one).
COMMANDS = [
    (["info"], None),
    (["memory"], None),
    (["bench", "--list"], None),
    (["train", "--episodes", "1"], "algos"),
    (["profile", "--agents", "3", "--updates", "1", "--fill", "2000", "--no-plots"], "algos"),
    (["profile", "--workload", "sampling", "--agents", "3", "--updates", "1"], "bench"),
]


@pytest.mark.parametrize(("argv", "extra"), COMMANDS, ids=lambda v: " ".join(v) if v else "")
def test_commands_without_their_extra_print_one_line(
    argv: list[str], extra: str | None, tmp_path: Path
) -> None:
    if argv[0] in ("train", "profile"):
        argv = [*argv, "--out", str(tmp_path / "out")]
    code = f"import sys\nfrom marlbuf.cli import main\nsys.exit(main({argv!r}))\n"
    done = _minimal(code, tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    if extra is None:
        assert done.returncode == 0, done.stderr
        return
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert errors[0].startswith(f"marlbuf {argv[0]}: error: ")
    assert f"marlbuf[{extra}" in errors[0], errors[0]


def test_train_help_without_torch_is_help_or_one_line(tmp_path: Path) -> None:
    done = _minimal(
        "import sys\nfrom marlbuf.cli import main\nsys.exit(main(['train', '--help']))\n", tmp_path
    )
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:  # the parser needs no torch
        assert "usage: marlbuf train" in done.stdout
    else:
        errors = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and "marlbuf[algos]" in errors[0], done.stderr
