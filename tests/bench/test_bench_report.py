"""Readable benchmark output: the report opens with the machine and the headline (marlbuf
against the usual buffers, in plain words), then the guard's checks explained; REPORT tables,
case legend, quick verdicts withheld, compare's units, size check and warnings (machine, load,
copy bandwidth, overlapping spreads), the figures' layout, the default result folder,
third-party logs kept out."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from marlbuf.bench import cli
from marlbuf.bench.tools import common, report
from marlbuf.workloads import Workload


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
    assert text.count("indicate, they do not decide") == 1
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


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, re.M)


@pytest.mark.slow
def test_quick_report_opens_with_the_headline(monkeypatch, tmp_path: Path) -> None:
    """``bench --quick`` (two real suites at tiny sizes): the report's first section is the
    headline, in plain words, with same-run ratios; the quick note comes once, before it,
    with the machine and its copy bandwidth."""
    from marlbuf.bench.suites import memory, sampling

    monkeypatch.setattr(
        sampling,
        "QUICK",
        {"workloads": [Workload("cooperative_navigation", 3)], "capacity": 3_000, "repeats": 2},
    )
    tiny = dict(memory.QUICK, workloads=[Workload("cooperative_navigation", 3)])
    monkeypatch.setattr(memory, "QUICK", dict(tiny, measure_capacity=1_000))
    assert cli.main(["sampling", "memory", "--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "REPORT-quick.md").read_text()
    sections = _sections(text)
    assert sections[0].startswith("Headline: marlbuf against")
    opening = text[: text.index("## ")]
    assert "indicate, they do not decide" in opening and "copy bandwidth" in opening
    assert text.count("indicate, they do not decide") == 1
    headline = text[text.index("## Headline") : text.index("## ", text.index("## Headline") + 3)]
    assert "cooperative navigation, 3 agents" in headline
    assert "per-agent NumPy arrays" in headline and "openai/maddpg's list of tuples" in headline
    assert "lean+uniform_memory" not in headline and "numpy_per_agent" not in headline
    # the ×faster figure is the rows' own same-run ratio
    rows = json.loads((tmp_path / "sampling-quick.json").read_text())["rows"]
    ms = {r["case"]: r["ms_median"] for r in rows}
    expected = report.times(ms["numpy_per_agent"] / ms["lean+uniform_memory"])
    assert f"| cooperative navigation, 3 agents | {expected} |" in headline
    assert "**Memory**" in headline
    if (tmp_path / "figures-quick" / "headline.png").is_file():
        assert "![headline](figures-quick/headline.png)" in headline
    assert sections.index("sampling") > 0 and sections.index("memory") > 0


def test_guard_checks_have_their_own_explained_section(tmp_path: Path) -> None:
    checks = [
        common.check("default round / dense round", 1.04, 1.1, workload="CN-3", kind="streams"),
        common.check("PER sample + update: cpprb / marlbuf", 2.5, 3.5, at_most=False),
    ]
    _write(
        tmp_path,
        "guard",
        True,
        rows=[{"workload": "CN-3", "case": "default", "ms_median": 1.0}],
        checks=checks,
        markdown=common.checks_markdown(checks) + "\n\nMADDPG rounds:\n\n| a |\n|---|\n| 1 |",
        summary={"passed": 1, "failed": 1},
        config={"copy_bandwidth_GBps": 13.41},
    )
    text = cli.write_report(tmp_path, quick=True).read_text()
    sections = _sections(text)
    assert sections[:2] == [
        "Headline: marlbuf against the buffer you would otherwise use",
        "Checks: the default path against its limits (`guard`)",
    ]
    checks_part = text[text.index("## Checks") : text.index("## guard")]
    assert "1 passed, 1 failed" in checks_part and "copies 13.4 GB/s" in checks_part
    assert "- **default round / dense round**: the MADDPG round" in checks_part
    assert "| PER sample + update: cpprb / marlbuf |" in checks_part and "FAIL" in checks_part
    assert "not a verdict" in checks_part
    # the guard's own section keeps its other tables, not the checks again
    guard_part = text[text.index("## guard") :]
    assert "| check |" not in guard_part and "MADDPG rounds" in guard_part


def test_case_names_read_in_plain_words() -> None:
    assert report.plain_case("lean16s+neighbor64+stream") == (
        "observations stored once in float16, float16 batches, neighbor runs of 64, one batch "
        "alive at a time"
    )
    assert report.plain_case("lean+uniform_memory") == "marlbuf, defaults"
    assert report.plain_case("torchrl_pad/L=32") == (
        "TorchRL SliceSampler, padded, sequences of 32 steps"
    )
    assert report.plain_workload("PP-24+8") == "predator-prey, 24 predators + 8 prey"
    # every term the glossary explains has a plain reading (the patterns under their names)
    assert set(report.CASE_TERMS) - {"neighbor", "L"} == set(report.PLAIN_TERMS) - {"neighbor<n>"}
    assert report.times(6.849) == "6.85×" and report.times(0.774) == "0.774× (slower)"


def _machine(path: Path, **changes: object) -> Path:
    record = json.loads(path.read_text())
    record["machine"].update(changes)
    path.write_text(json.dumps(record))
    return path


def test_compare_warns_about_machine_load_bandwidth_and_noise(tmp_path: Path, capsys) -> None:
    row = {"workload": "CN-3", "case": "x", "ms_median": 2.0, "ms_min": 1.8, "ms_max": 2.4}
    apart = {"workload": "CN-3", "case": "y", "ms_median": 1.0, "ms_min": 0.9, "ms_max": 1.1}
    a = _write(tmp_path / "a", "demo", True, rows=[row, apart])
    b = _write(
        tmp_path / "b",
        "demo",
        True,
        rows=[
            dict(row, ms_median=2.2, ms_min=2.1, ms_max=2.5),
            dict(apart, ms_median=3.0, ms_min=2.8, ms_max=3.3),
        ],
    )
    machine = json.loads(a.read_text())["machine"]
    assert machine["copy_bandwidth_GBps"] > 0 and len(machine["load_average_1_5_15_min"]) == 3
    cores = machine["cores_usable"]
    same = dict(load_average_1_5_15_min=[0.5 * cores, 0, 0], copy_bandwidth_GBps=10.0)
    _machine(a, **same)
    _machine(b, **same)
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "different" not in out  # same machine, load and bandwidth: no such warning
    assert "overlaps in 1 of 2 cases" in out
    assert re.search(r"\| CN-3 / x \| 2 \| 2.2 \| 1.1 \| yes \|", out)
    assert re.search(r"\| CN-3 / y \| 1 \| 3 \| 3 \| no \|", out)
    _machine(
        b,
        cpu_model="another CPU",
        load_average_1_5_15_min=[2.5 * cores, 0, 0],
        copy_bandwidth_GBps=6.0,
    )
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "WARNING: different machines: A ran on" in out and "another CPU" in out
    assert "WARNING: different load" in out and "WARNING: different copy bandwidth" in out
    old = _write(tmp_path / "c", "demo", True, rows=[row])
    record = json.loads(old.read_text())
    del record["machine"]["load_average_1_5_15_min"]
    old.write_text(json.dumps(record))
    assert cli.main(["compare", str(old), str(a)]) == 0
    assert "A does not record the machine's load" in capsys.readouterr().out


def test_stacked_phase_figures_keep_labels_clear_of_the_title(monkeypatch, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from marlbuf.bench.tools import plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path, dpi=110: figures.append(fig) or path)
    rows = [
        {"workload": w, "config": c, "total_s": 1.0, "sampling_s": 0.2, "target_q_s": 0.3}
        for w in ("CN-3", "CN-24")
        for c in ("baseline", "marlbuf", "marlbuf_shared_index")
    ]
    plots.plot_update({"rows": rows, "quick": True, "config": {"batch_size": 256}}, tmp_path)
    (fig,) = figures
    ax = fig.axes[0]
    assert not [t for t in ax.texts if t.get_rotation()]  # no rotated labels inside the axes
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = ax.title.get_window_extent(renderer)
    labels = [t.get_window_extent(renderer) for t in ax.get_xticklabels() + ax.texts]
    assert not any(title.overlaps(box) for box in labels)
    assert "B = 256" in ax.get_title() and [t.get_text() for t in ax.get_xticklabels()][:2] == [
        "baseline",
        "marlbuf",
    ]


def test_reward_figures_say_seed_and_fit_their_titles(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from marlbuf.bench.suites import rewards
    from marlbuf.bench.tools import plots

    row = {
        "env": "CN-3",
        "sampler": "uniform",
        "seed": 0,
        "metric": "return",
        "block": 10,
        "curve": [-700.0, -650.0, -600.0],
    }
    path = rewards.plot({"rows": [row], "quick": True}, tmp_path)
    assert path.is_file()
    assert plots.seeds(1) == "1 seed" and plots.seeds(3) == "3 seeds"
    long = "MADDPG reward by sampler: mean over seeds, band = min-max over seeds (quick sizes)"
    assert all(len(line) <= 60 for line in plots.wrapped(long, 5.2, 12).splitlines())
