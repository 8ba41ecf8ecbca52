"""The figures notebook executes on the quick results (so it never rots)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from marlbuf.bench import common, sampling
    from marlbuf.bench.workloads import Workload

    # tiny quick results in a scratch folder, so the test never depends on committed files
    monkeypatch.setattr(
        sampling,
        "QUICK",
        {"workloads": [Workload("cooperative_navigation", 3)], "capacity": 2_000, "repeats": 2},
    )
    common.write_result("sampling", sampling.run(quick=True, progress=False), True, tmp_path)
    monkeypatch.setenv("MARLBUF_RESULTS", str(tmp_path))
    monkeypatch.setenv("MARLBUF_QUICK", "1")
    monkeypatch.setenv("MARLBUF_FIGURES", str(tmp_path / "figures"))
    nb = nbformat.read(ROOT / "notebooks" / "figures.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, resources={"metadata": {"path": str(ROOT / "notebooks")}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert (tmp_path / "figures" / "sampling.png").is_file()
