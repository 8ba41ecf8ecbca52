"""The copyable TorchRL MADDPG example (``examples/torchrl_maddpg*.py``) at a tiny size: both
buffers train, with the same sampled indices their losses are identical, and the swap is the
few lines ``docs/torchrl.md`` shows."""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torchrl")
pytest.importorskip("mpe2")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BEFORE, AFTER = "torchrl_maddpg", "torchrl_maddpg_marlbuf"

# TorchRL warns when it wraps a PettingZoo release other than the one it was tested with, and
# about its own deprecated names at import: neither is this library's to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:PettingZoo in TorchRL is tested:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def swap_diff() -> list[str]:
    """The unified diff between the two examples, without its file header lines."""
    before = (EXAMPLES / f"{BEFORE}.py").read_text().splitlines()
    after = (EXAMPLES / f"{AFTER}.py").read_text().splitlines()
    diff = difflib.unified_diff(
        before, after, f"examples/{BEFORE}.py", f"examples/{AFTER}.py", lineterm="", n=0
    )
    return list(diff)


def test_the_swap_is_at_most_five_lines_and_the_docs_show_it() -> None:
    diff = swap_diff()
    changed = [line for line in diff[2:] if line[:1] == "+"]
    assert 0 < len(changed) <= 5, changed
    shown = (ROOT / "docs" / "torchrl.md").read_text()
    for line in diff[2:]:
        if line[:1] in "+-":
            assert line in shown, f"docs/torchrl.md does not show the diff line {line!r}"


def test_both_buffers_train_with_identical_losses() -> None:
    tiny = {
        "n_iters": 2,
        "frames_per_batch": 75,
        "minibatch_size": 32,
        "learning_starts": 32,
        "updates_per_iter": 3,
        "memory_size": 500,
        "hidden": 16,
    }
    records = []
    for name in (BEFORE, AFTER):
        module = load(name)
        records.append(module.train(module.Config(**tiny)).record)
    assert len(records[0]["losses"]) == 6
    assert records[0]["losses"] == records[1]["losses"]  # same indices, same rows, same losses


@pytest.mark.slow
def test_the_torchrl_bench_suite_runs_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    from marlbuf.bench import cli
    from marlbuf.bench.suites import torchrl_buffers

    assert cli.SUITES["torchrl"] == "marlbuf.bench.suites.torchrl_buffers"
    tiny = {
        "agents": [3],
        "capacity": 2_000,
        "repeats": 2,
        "per_capacities": [5_000],
        "per_repeats": 2,
        "run": {
            "n_iters": 2,
            "frames_per_batch": 50,
            "updates_per_iter": 2,
            "minibatch_size": 32,
            "learning_starts": 32,
            "memory_size": 500,
            "hidden": 16,
        },
        "run_repeats": 1,
    }
    monkeypatch.setattr(torchrl_buffers, "QUICK", tiny)
    payload = torchrl_buffers.run(quick=True, progress=False)
    parts = {row["part"] for row in payload["rows"]}
    assert parts == {
        "storage get",
        "rb.sample()",
        "bytes per transition",
        "prioritized sample+update",
        "example whole run",
    }
    assert payload["summary"]["whole_run"]["losses_identical"] is True
    assert 0 < payload["summary"]["memory_vs_torchrl"]["CN-3"] < 1
