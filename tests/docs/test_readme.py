"""The README: a landing page that fits on a few screens, whose quickstart runs as written with
the default sampler, and whose headline table holds the committed results' figures."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    quickstart = re.search(r"## Quickstart\n\n```python\n(.*?)```", text, re.S)
    assert quickstart and "sampler=" not in quickstart.group(1)  # the default sampler
    for link in re.findall(r"\]\(((?:docs|bench)/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_headline_table_matches_the_committed_results():
    """Each cell of the README's headline table is what the committed result files give."""
    from marlbuf.bench.tools import report

    data = report.headline_data(ROOT / "bench" / "results", quick=False)
    rounds, memory = data["round"], data["memory"]
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", text, re.M)
    assert [n for n, _ in rows] == ["3", "12", "24"]
    for n, rest in rows:
        cells = [c.strip().strip("*") for c in rest.split(" | ")]
        workload = f"CN-{n}"
        expected = [
            report.times(rounds[baseline][workload])
            for baseline in (
                "per-agent NumPy arrays",
                "cpprb (one buffer of every field)",
                "TorchRL (one buffer of every field)",
            )
        ]
        assert cells[:3] == expected, (workload, cells, expected)
        entry = memory[workload]
        once, half, dense = (report.number(entry[k]) for k in ("once", "once+float16", "dense"))
        assert cells[3] == f"{once} ({half}) / {dense} GiB", (workload, cells[3])
