"""Memory advice: the MemoryError lists every format that fits, the near-full warning is
visible, and ``marlbuf memory`` compares the formats with this machine's RAM."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer, build, memory_cli
from marlbuf.memory import MemoryWarning, estimate, format_options, largest_capacity

SPECS = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
CAPACITY = 2_000_000


def _available(monkeypatch: pytest.MonkeyPatch, nbytes: float) -> None:
    monkeypatch.setattr(build, "available_memory_bytes", lambda: int(nbytes))


def test_memory_error_lists_every_format_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    once = estimate(SPECS, CAPACITY)
    half = estimate({a: AgentSpec((144,), (5,), obs_dtype=np.float16) for a in SPECS}, CAPACITY)
    # room for the float16 rows, not for the float32 ones
    _available(monkeypatch, 0.8 * once.total_bytes)
    with pytest.raises(MemoryError) as info:
        MultiAgentReplayBuffer(SPECS, CAPACITY)
    message = str(info.value)
    assert "next_obs='once' + AgentSpec(obs_dtype=np.float16)" in message
    assert f"{half.total_bytes / 2**30:.2f} GiB" in message
    assert "path='DIR'" in message and "of disk" in message
    assert "lower capacity to" in message
    assert "next_obs='stored'): " not in message  # the dense format does not fit: not listed


def test_near_full_buffer_warns_visibly(monkeypatch: pytest.MonkeyPatch) -> None:
    small = {"a": AgentSpec((4,), (2,))}
    # rows this small are stored dense (storing observations once would not save memory)
    _available(monkeypatch, 1.1 * estimate(small, 1000, next_obs="stored").total_bytes)
    with pytest.warns(MemoryWarning, match="may start swapping"):
        MultiAgentReplayBuffer(small, 1000)
    assert issubclass(MemoryWarning, UserWarning)
    # shown under Python's default filters (a ResourceWarning is not)
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        MultiAgentReplayBuffer(small, 1000)
    assert any(issubclass(w.category, MemoryWarning) for w in caught)


def test_format_options_and_capacity() -> None:
    names = [o.name for o in format_options(SPECS, 1000)]
    assert names == [
        "dense",
        "stored once",
        "dense, float16 obs",
        "stored once, float16 obs",
        "stored once, in mapped files",
        "no next_obs",
        "no next_obs, float16 obs",
    ]
    mapped = format_options(SPECS, 1000)[4]
    assert mapped.ram_bytes == mapped.estimate.total_bytes - mapped.estimate.storage_bytes
    assert largest_capacity(1000.0, 1_234_567_000) == 1_200_000
    assert largest_capacity(1000.0, 50_000) == 50


@pytest.mark.parametrize("env", ["pp", "predator_prey", "cn"])
def test_memory_command_table(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert memory_cli.main(["--env", env, "--agents", "6", "--capacity", "1e5"]) == 0
    out = capsys.readouterr().out
    assert "stored once (default)" in out and "of RAM available" in out
    assert "--obs-dtype float16" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_memory_command_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert memory_cli.main(["--agents", "0"]) == 2
    assert "--agents must be an integer >= 1; got --agents 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        memory_cli.main(["--env", "mars"])
    assert "cooperative_navigation (cn) or predator_prey (pp)" in capsys.readouterr().err
