"""Profile tables fit 100 columns, times in milliseconds, three significant figures, no
exponents (a callgrind report has 12 metrics)."""

from __future__ import annotations

import re

from marlbuf.profiling.profiler import OUTSIDE, format_table, sig3

SIMULATED = ["Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw", "D1_misses"]


def _report() -> dict:
    metrics = {"wall_s": {"source": "time", "unit": "s"}, "cpu_s": {"source": "time", "unit": "s"}}
    metrics |= {m: {"source": "simulated", "unit": "count"} for m in [*SIMULATED, "LL_misses"]}
    figures = {"wall_s": 0.001897, "cpu_s": 12.5} | {
        m: 43541.0 * (k + 1) ** 3 for k, m in enumerate([*SIMULATED, "LL_misses"])
    }
    phases = [
        {
            "name": name,
            "path": path,
            "depth": depth,
            "calls": 3,
            "inclusive": figures,
            "exclusive": figures,
            "multiplexed_segments": 0,
        }
        for name, path, depth in [
            ("update_all_trainers", "update_all_trainers", 0),
            ("sampling", "update_all_trainers/sampling", 1),
            (OUTSIDE, OUTSIDE, 0),
        ]
    ]
    return {
        "metrics": metrics,
        "phases": phases,
        "backend": "callgrind",
        "null_repeats": 8,
        "notes": [],
    }


def test_wide_report_fits_100_columns_in_consistent_units() -> None:
    text = format_table(_report())
    table = [ln for ln in text.splitlines() if not ln.startswith(("note:", "backend:"))]
    assert max(len(ln) for ln in table if not ln.startswith("sources:")) <= 100
    assert text.count("phase ") >= 2  # split into column groups, each with the phase column
    assert "wall ms" in text and "wall_s" not in text
    assert "1.9" in text and "0.001897" not in text  # 1.897 ms, three significant figures
    assert not re.search(r"\d[eE][+-]\d", text)  # no exponents
    assert "43.5k" in text and "sources: time: wall ms, cpu ms; simulated: Ir" in text


def test_sig3() -> None:
    assert [sig3(v) for v in (0.001897, 27.94, 673.0, 43541.0, 1.234e6, 0.0)] == [
        "0.0019",
        "27.9",
        "673",
        "43.5k",
        "1.23M",
        "0",
    ]
