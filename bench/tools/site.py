"""The documentation site's benchmark pages, generated from committed result files.

``mkdocs build`` calls :func:`pages` and :func:`figures` through ``scripts/docs_hooks.py``:
the pages are rendered from the ``<suite>.json`` files of ``bench/results`` by the same code
that writes ``REPORT.md`` (:mod:`marlbuf.bench.tools.report`), so the site never holds a figure the
result files do not; the plots are the committed PNG files, copied as they are. Nothing is
measured or drawn here, and nothing is fetched: the build runs offline.
"""

from __future__ import annotations

import json
from pathlib import Path

from marlbuf.bench.tools import report
from marlbuf.bench.tools.common import result_path

#: The committed results (``marlbuf bench SUITE --out bench/results`` writes them).
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"

#: Where the generated pages and the figures go inside the site.
SITE_FOLDER = "benchmarks"

#: The suites the headline reads, for the machine line above it.
HEADLINE_SUITES = ("sampling", "peers", "memory", "prioritized", "sequences", "end_to_end")

#: Folders of committed figures, as they are named inside the site's benchmarks folder.
FIGURE_FOLDERS = ("figures", "profile_callgrind", "profile_callgrind_sampling", "profile_time")


def _suites() -> list[str]:
    from marlbuf.bench.cli import SUITES

    return list(SUITES)


def _figures_of(results_dir: Path) -> list[Path]:
    return sorted((results_dir / "figures").glob("*.png"))


def headline_page(results_dir: Path = RESULTS_DIR) -> str:
    """The headline page: the machines, then marlbuf against the buffers a user would otherwise
    use (the report's headline section), with its figures."""
    records = [
        json.loads(path.read_text())
        for name in HEADLINE_SUITES
        if (path := result_path(name, False, results_dir)).is_file()
    ]
    lines, _ = report.headline_section(results_dir, False, _figures_of(results_dir))
    # the report's heading becomes the page title; its figures sit beside the page
    body = lines[1:]
    return "\n".join(
        [
            "# Headline: marlbuf against the buffer you would otherwise use",
            "",
            "Generated from the committed result files of `bench/results` (full sizes). "
            "Every figure is a ratio of two cases timed in the same process, so it carries "
            "over between machines better than a time does; each suite records the machine "
            "it ran on:",
            "",
            report.machine_line(records),
            *body,
            "The [full report](report.md) has every suite's tables and configuration; "
            "[the benchmark suite](../benchmarks.md) says how to rerun them.",
            "",
        ]
    )


def report_page(results_dir: Path = RESULTS_DIR) -> str:
    """The full report of the committed full-size results (``REPORT.md``'s text)."""
    return report.render_report(results_dir, False, _suites(), figures=_figures_of(results_dir))


def pages(results_dir: Path = RESULTS_DIR) -> dict[str, str]:
    """The generated pages: their path inside the site's sources, and their markdown."""
    return {
        f"{SITE_FOLDER}/headline.md": headline_page(results_dir),
        f"{SITE_FOLDER}/report.md": report_page(results_dir),
    }


def figures(results_dir: Path = RESULTS_DIR) -> dict[str, Path]:
    """The committed figures: their path inside the site, and the file."""
    return {
        f"{SITE_FOLDER}/{folder}/{path.name}": path
        for folder in FIGURE_FOLDERS
        for path in sorted((results_dir / folder).glob("*.png"))
    }
