"""The figures notebook executes on the quick results (so it never rots)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from marlbuf.bench.suites import sampling
    from marlbuf.bench.tools import common
    from marlbuf.workloads import Workload

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


def _results_folder_function():
    """The notebook's ``results_folder`` as a function (its defining cell, run alone)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / "figures.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if "def results_folder" in c.source)
    definition = source[source.index("def results_folder") : source.index("RESULTS = ")]
    namespace: dict = {}
    prelude = (
        "import os\nfrom pathlib import Path\nfrom marlbuf.bench.tools.common import RESULTS_DIR\n"
    )
    exec(prelude + definition, namespace)
    return namespace["results_folder"]


def test_notebook_reads_what_bench_quick_writes_by_default(tmp_path, monkeypatch):
    from marlbuf.bench import cli
    from marlbuf.bench.tools.common import RESULTS_DIR

    results_folder = _results_folder_function()
    monkeypatch.delenv("MARLBUF_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert results_folder() == RESULTS_DIR  # nothing run here yet: the committed results
    written = tmp_path / cli.DEFAULT_OUT  # where `marlbuf bench --quick` writes
    written.mkdir()
    (written / "sampling-quick.json").write_text("{}")
    assert results_folder().resolve() == written  # started in the repository
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert results_folder().resolve() == written  # started in notebooks/
    monkeypatch.setenv("MARLBUF_RESULTS", str(tmp_path / "other"))
    assert results_folder() == tmp_path / "other"
