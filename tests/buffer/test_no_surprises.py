"""What a new user would trip over in the first hour, each pinned by a test: an automatic format
choice that drops data warns, ``repr`` tells the format and the store, and sampling with
replacement takes any batch size (the minimal install and the commands without their extras:
``test_minimal_install.py``; where ``train`` starts updating: ``test_algos_cli.py``; callgrind's
cache warning: ``test_profiling_callgrind.py``)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer, NextObsDroppedWarning
from marlbuf.samplers import Uniform


def specs() -> dict[str, AgentSpec]:
    return {f"a{i}": AgentSpec((12,), (2,)) for i in range(2)}


def steps(count: int, next_obs: bool = True, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    chain = {a: rng.standard_normal((count + 1, 12)).astype(np.float32) for a in specs()}
    data: dict[str, Any] = {
        "obs": {a: c[:-1] for a, c in chain.items()},
        "action": {a: np.zeros((count, 2), np.float32) for a in chain},
        "reward": {a: np.arange(count, dtype=np.float32) for a in chain},
        "done": {a: np.zeros(count, np.float32) for a in chain},
    }
    if next_obs:
        data["next_obs"] = {a: c[1:] for a, c in chain.items()}
    return data


def test_a_first_write_without_next_obs_warns_once_before_dropping_them() -> None:
    buf = MultiAgentReplayBuffer(specs(), 64)
    assert "next_obs='auto'" in repr(buf)
    # where warnings are errors the call raises, and nothing changed: the format is still open
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NextObsDroppedWarning):
            buf.extend(**steps(4, next_obs=False))
    assert len(buf) == 0 and "next_obs='auto'" in repr(buf)
    with pytest.warns(NextObsDroppedWarning) as caught:
        buf.extend(**steps(4, next_obs=False))
    (warning,) = caught
    message = str(warning.message)
    assert "next_obs='none'" in message and "pass next_obs=..." in message
    assert Path(warning.filename).name == Path(__file__).name  # points at the user's call
    assert buf.next_obs == "none" and len(buf) == 4 and "next_obs='none'" in repr(buf)
    with warnings.catch_warnings():  # once: later writes are quiet
        warnings.simplefilter("error")
        buf.extend(**steps(4, next_obs=False))
    # choosing the format explicitly, or writing next_obs, never warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MultiAgentReplayBuffer(specs(), 64, next_obs="none").extend(**steps(4, next_obs=False))
        kept = MultiAgentReplayBuffer(specs(), 64)
        kept.extend(**steps(4))
    assert kept.next_obs == "once"


def test_repr_shows_format_layout_store_size_and_capacity(tmp_path: Path) -> None:
    buf = MultiAgentReplayBuffer(specs(), 64, layout="agent_major", next_obs="stored")
    buf.extend(**steps(5))
    text = repr(buf)
    for part in (
        "size=5",
        "capacity=64",
        "next_obs='stored'",
        "layout='agent_major'",
        "store='ram'",
        "sampler=Uniform(",
    ):
        assert part in text, text
    with MultiAgentReplayBuffer(specs(), 64, path=tmp_path / "mapped") as mapped:
        mapped.extend(**steps(3))
        text = repr(mapped)
        assert "store='mapped'" in text and str(tmp_path / "mapped") in text
        assert "next_obs='once'" in text and "size=3" in text
    pytest.importorskip("torch")
    device = MultiAgentReplayBuffer(specs(), 64, device="cpu")
    assert "store='torch', device='cpu'" in repr(device)


@pytest.mark.parametrize("order", ["memory", "random"])
def test_uniform_with_replacement_samples_any_batch_size(order: str) -> None:
    stored = 10
    buf = MultiAgentReplayBuffer(specs(), 64, sampler=Uniform(order=order), seed=0)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    buf.extend(**steps(stored))
    batch = buf.sample(1024)  # more rows than stored, as a hand-written buffer allows
    assert len(batch) == 1024 and 0 <= batch.indices.min() and batch.indices.max() < stored
    np.testing.assert_array_equal(batch.reward["a0"], batch.indices)  # rows match their slots
    if order == "memory":
        assert (np.diff(batch.indices) >= 0).all()
    assert all(len(b) == 1024 for b in buf.sample_for_trainers(1024))
    # every stored slot equally likely
    stats = pytest.importorskip("scipy.stats")
    counts = np.bincount(
        np.concatenate([buf.sample(1024).indices for _ in range(20)]), minlength=stored
    )
    assert stats.chisquare(counts).pvalue > 1e-4


def test_uniform_without_replacement_refuses_more_rows_than_stored() -> None:
    buf = MultiAgentReplayBuffer(specs(), 64, sampler=Uniform(replace=False), seed=0)
    buf.extend(**steps(10))
    assert len(np.unique(buf.sample(10).indices)) == 10
    with pytest.raises(ValueError, match=re.escape("batch_size=11 needs distinct slots")):
        buf.sample(11)
