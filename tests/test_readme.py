"""The README's quickstart runs as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    match = re.search(r"## Quickstart\n\n```python\n(.*?)```", text, re.S)
    assert match, "README has no Quickstart python block"
    monkeypatch.chdir(tmp_path)  # it saves buffer.npz in the working directory
    exec(compile(match.group(1), "README quickstart", "exec"), {})
    assert (tmp_path / "buffer.npz").is_file()


def test_readme_gives_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "bash scripts/setup.sh && .venv/bin/marlbuf bench --quick" in text
    assert "bash scripts/setup.sh && .venv/bin/pytest" in text
    assert ".venv/bin/pytest" in (ROOT / ".ci" / "run").read_text()
