"""Readable benchmark output: REPORT tables, case legend, quick verdicts withheld, compare's
units and size check, the default result folder, third-party logs kept out."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from marlbuf.bench import cli, common, report


def _write(tmp_path: Path, suite: str, quick: bool, **payload: object) -> Path:
    return common.write_result(suite, payload, quick=quick, out_dir=tmp_path)


def test_report_has_sections_only_for_suites_that_ran(tmp_path: Path) -> None:
    rows = [
        {"workload": "CN-3", "case": "lean16s+neighbor64+stream", "ms_median": 0.123456789},
        {"workload": "CN-3", "case": "interleaved+uniform", "ms_median": 1234.5678},
    ]
    for row in rows:  # what the sampling figure plots
        row["time_vs_interleaved_uniform"] = row["ms_median"] / 1234.5678
    markdown = common.markdown_table(rows, ["workload", "case", "ms_median"])
    _write(
        tmp_path,
        "sampling",
        True,
        rows=rows,
        markdown=markdown,
        summary={"CN-3": {"time_vs_uniform": 0.87654321, "copy_bandwidth_GBps": 12.3456}},
        config={"capacity": 20000, "seeds": [0], "workloads": ["CN-3", "CN-6"]},
    )
    _write(
        tmp_path,
        "precision",
        True,
        rows=[{"case": "uniform"}],
        markdown="| sampler | final_mean | verdict |\n|---|---|---|\n| neighbor | -1.5 | loses |",
        summary={"CN-3/neighbor": {"final_mean": -1.5, "verdict": "loses reward"}},
        config={"seeds": [0]},
    )
    text = cli.write_report(tmp_path, quick=True, notes={"peers": "skipped: no cpprb"}).read_text()
    assert "## sampling" in text and "## precision" in text and "## peers" in text
    assert "## layout" not in text and "no result yet" not in text
    assert "Suites without results in this folder" in text
    assert "**Quick sizes.**" in text
    # three significant figures, units in the headers, no raw JSON
    assert "| median (ms) |" in text and "0.123 |" in text and "1,235 |" in text
    assert "0.877" in text and "0.87654321" not in text and "GB/s" in text
    assert "```" not in text
    # the case legend explains the parts of the names
    assert "`lean16s`: observations stored once, in float16" in text
    assert "`neighbor<n>`" in text and "`stream`" in text
    # one seed: verdicts withheld, in the summary and in the suite's own table
    assert "loses" not in text and report.WITHHELD in text
    assert "capacity | 20,000" in text


def test_number_formats() -> None:
    assert report.number(0.000123456) == "0.000123"
    assert report.number(43543.2) == "43,543"
    assert report.number(12) == "12" and report.number(12000) == "12,000"
    assert report.number(None) == "—" and report.number(True) == "yes"
    assert report.header_with_unit("ms_median").strip() == "median (ms)"
    assert report.header_with_unit("copy_bandwidth_GBps").strip() == "copy_bandwidth (GB/s)"
    assert report.header_with_unit("case") == "case"


def test_compare_shows_units_and_refuses_mixed_sizes(tmp_path: Path, capsys) -> None:
    rows_a = [{"workload": "CN-3", "case": "x", "ms_median": 2.0}]
    rows_b = [{"workload": "CN-3", "case": "x", "ms_median": 1.0}]
    quick = _write(tmp_path / "a", "demo", True, rows=rows_a)
    full = _write(tmp_path / "b", "demo", False, rows=rows_b)
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", str(quick), str(full)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "quick sizes" in err and "--allow-mixed-sizes" in err
    assert cli.main(["compare", str(quick), str(full), "--allow-mixed-sizes"]) == 0
    out = capsys.readouterr().out
    assert "| A (ms) | B (ms) | B/A (time ratio) |" in out and "WARNING" in out


def test_results_default_to_the_current_folder() -> None:
    assert cli.DEFAULT_OUT == Path("bench-results")
    assert not cli.DEFAULT_OUT.is_absolute()


def test_third_party_info_logs_are_silenced() -> None:
    previous = {n: logging.getLogger(n).level for n in ("torchrl", "ray")}
    try:
        cli.quiet_third_party_logs()
        assert not logging.getLogger("torchrl").isEnabledFor(logging.INFO)
        assert not logging.getLogger("ray").isEnabledFor(logging.WARNING)
    finally:
        for name, level in previous.items():
            logging.getLogger(name).setLevel(level)
