"""The callgrind backend end to end: one tiny workload run under valgrind, several checks.

The run takes ~10-20 s (valgrind's start-up and the instrumented phases); it is shared by the
tests of this file. Skipped where valgrind is missing or the machine is not x86-64.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import marlbuf
from marlbuf.profiling import callgrind as cg

VALGRIND = shutil.which("valgrind")
pytestmark = [
    pytest.mark.slow,  # valgrind runs Python some 50 times slower
    pytest.mark.skipif(VALGRIND is None, reason="valgrind is not installed (apt install valgrind)"),
    pytest.mark.skipif(not cg.supported(), reason="client requests are implemented for x86-64"),
]

K = 100  # iterations of the fixed loop; the second phase runs 2K

WORKLOAD = textwrap.dedent(
    f"""
    import json, sys
    import numpy as np
    from marlbuf.profiling import Profiler

    rows, width, batch, reps, run_length = 32768, 32, 1024, 4, 64
    # a float32 table starting 16 bytes past a cache line (numpy's usual placement of large
    # arrays): a random 128-byte row then straddles 3 lines instead of 2
    raw = np.zeros(rows * width * 4 + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + 16
    table = raw[start : start + rows * width * 4].view(np.float32).reshape(rows, width)
    table[:] = 1.0
    rng = np.random.default_rng(0)
    random_idx = [rng.integers(0, rows, batch) for _ in range(reps)]
    neighbor_idx = [
        (rng.integers(0, rows - run_length, batch // run_length)[:, None]
         + np.arange(run_length)).ravel()
        for _ in range(reps)
    ]
    out = np.empty((batch, width), np.float32)
    small = np.zeros(16)

    prof = Profiler()
    with prof.phase("loop_k"):
        for _ in range({K}):
            small += 1.0
    with prof.phase("loop_2k"):
        for _ in range({2 * K}):
            small += 1.0
    for r in range(reps):
        with prof.phase("gathers"):
            with prof.phase("random"):
                np.take(table, random_idx[r], axis=0, out=out)
            with prof.phase("neighbor"):
                np.take(table, neighbor_idx[r], axis=0, out=out)
    with open(sys.argv[1], "w") as fh:
        json.dump(prof.report(), fh)
    """
)


@pytest.fixture(scope="module")
def callgrind_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cg.warm_up()  # compile the client-request kernel natively: never under valgrind
    work = tmp_path_factory.mktemp("callgrind")
    script = work / "workload.py"
    script.write_text(WORKLOAD)
    result = work / "report.json"
    env = dict(os.environ)
    root = str(Path(marlbuf.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    assert VALGRIND is not None
    cmd = cg.valgrind_command(
        [sys.executable, str(script), str(result)], work / "callgrind.out.%p", VALGRIND
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.read_text())
    return report


def _phase(report: dict[str, Any], path: str) -> dict[str, Any]:
    return next(r for r in report["phases"] if r["path"] == path)


def test_backend_and_labels(callgrind_report: dict[str, Any]) -> None:
    rep = callgrind_report
    assert rep["backend"] == "callgrind"
    sources = {m: meta["source"] for m, meta in rep["metrics"].items()}
    for m in ("Ir", "D1mr", "DLmr", "LL_misses", "D1_misses"):
        assert sources[m] == "simulated"
    assert sources["wall_s"] == "time"
    assert "hardware" not in sources.values()
    assert any("no hardware prefetcher and no TLB" in n for n in rep["notes"])
    assert "LL cache: 33554432 B, 64 B, 16-way associative" in rep["simulated_caches"]
    assert rep["null_phase"]["Ir"] > 0  # the boundary code itself costs instructions


def test_fixed_loop_twice_as_long_counts_twice_the_instructions(
    callgrind_report: dict[str, Any],
) -> None:
    once = _phase(callgrind_report, "loop_k")["exclusive"]["Ir"]
    twice = _phase(callgrind_report, "loop_2k")["exclusive"]["Ir"]
    assert 1.8 < twice / once < 2.2


def test_random_gather_misses_more_than_neighbor_gather(callgrind_report: dict[str, Any]) -> None:
    random = _phase(callgrind_report, "gathers/random")
    neighbor = _phase(callgrind_report, "gathers/neighbor")
    assert random["calls"] == neighbor["calls"] == 4
    assert random["exclusive"]["LL_misses"] > 1.2 * neighbor["exclusive"]["LL_misses"]


def test_nested_sums(callgrind_report: dict[str, Any]) -> None:
    parent = _phase(callgrind_report, "gathers")
    children = [_phase(callgrind_report, p) for p in ("gathers/random", "gathers/neighbor")]
    for m in ("Ir", "LL_misses"):
        expected = parent["exclusive"][m] + sum(c["inclusive"][m] for c in children)
        assert parent["inclusive"][m] == pytest.approx(expected)
    rep = callgrind_report
    corrected = sum(r["exclusive"]["Ir"] for r in rep["phases"])
    assert corrected + rep["total_overhead"]["Ir"] == pytest.approx(
        rep["total_raw"]["Ir"], rel=0.02
    )


def test_marlbuf_profile_relaunches_itself_under_callgrind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """One command: warm the kernels natively, rerun under valgrind, read the result back;
    valgrind's own messages go to OUT/valgrind.log, and a table that fits in the simulated
    last-level cache is warned about, once on stderr and in the table."""
    from marlbuf.profiling.cli import main

    root = str(Path(marlbuf.__file__).resolve().parent.parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    out = tmp_path / "prof"
    argv = ["--workload", "sampling", "--backend", "callgrind", "--agents", "2"]
    argv += ["--layout", "agent_major", "--sampler", "uniform", "--batch-size", "64"]
    argv += ["--fill", "4000", "--updates", "2", "--no-plots", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "profile.json").read_text())
    (run,) = result["runs"]
    assert run["report"]["backend"] == "callgrind"
    sampling = next(r for r in run["report"]["phases"] if r["name"] == "sampling")
    assert sampling["calls"] == 2
    assert sampling["inclusive"]["Ir"] > 0
    assert run["report"]["metrics"]["LL_misses"]["source"] == "simulated"
    assert not list(out.glob("callgrind*"))  # dumps went to a temporary folder, now removed
    captured = capfd.readouterr()
    banner = [ln for ln in (captured.out + captured.err).splitlines() if ln.startswith("==")]
    assert not banner, banner[:3]  # valgrind's banner and summary are not in the output...
    assert "Callgrind" in (out / "valgrind.log").read_text()  # ...but in its log
    assert captured.err.count("fits in the simulated 32 MiB last-level cache") == 1
    table = (out / "profile.md").read_text()
    assert "> warning: the filled table of agent_major/uniform/N=2" in table
    assert "==" not in table
