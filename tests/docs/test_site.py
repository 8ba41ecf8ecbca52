"""The documentation site's sources: the nav names pages that exist, and the benchmark pages
generated from the committed results name the machine and show figures that exist. (CI builds
the site itself with ``mkdocs build --strict``; this runs without MkDocs.)"""

from __future__ import annotations

import re
from pathlib import Path

from marlbuf.bench.tools import site

ROOT = Path(__file__).resolve().parents[2]


def test_nav_pages_exist() -> None:
    generated = set(site.pages())
    nav = re.findall(
        r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M
    )
    assert nav
    missing = [p for p in nav if p not in generated and not (ROOT / "docs" / p).is_file()]
    assert not missing, missing
    listed = {p for p in nav}
    unlisted = [
        str(p.relative_to(ROOT / "docs"))
        for p in (ROOT / "docs").rglob("*.md")
        if str(p.relative_to(ROOT / "docs")) not in listed
    ]
    assert not unlisted, f"pages missing from mkdocs.yml's nav: {unlisted}"


def test_benchmark_pages_name_the_machine_and_show_committed_figures() -> None:
    pages = site.pages()
    figures = site.figures()
    headline = pages["benchmarks/headline.md"]
    assert "per-agent NumPy arrays" in headline and "cpprb" in headline and "TorchRL" in headline
    assert re.search(r"^Machines?: ", headline, re.M)
    for path, text in pages.items():
        folder = Path(path).parent
        for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            target = (folder / link).as_posix()
            assert target in figures, f"{path}: {link} is not a committed figure"
            assert figures[target].is_file()
    assert "benchmarks/figures/headline.png" in figures
