"""``add``'s one-kernel path (check and store one step in one call) against the general path.

A default-like buffer writes through :func:`marlbuf._kernels.store_lean_step` /
``store_dense_step``; a twin buffer is forced through the complete checks
(:meth:`RowCodec.stage`) and the general commit (:meth:`WritePath.commit`). After the same
calls both hold the same bytes, write generations, ring state and next-observation links;
every rejected step raises the same error on both and changes nothing.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer, NextObsWarning
from marlbuf.buffer import SlowWriteWarning
from marlbuf.writer.commit import StepTarget

SPECS = {
    f"agent_{i}": AgentSpec(obs_shape=(5,), action_shape=(4,), n_discrete_actions=4)
    for i in range(3)
}


def general(buf: MultiAgentReplayBuffer) -> MultiAgentReplayBuffer:
    """Force ``buf`` through the complete checks and the general commit."""
    codec = buf._codec
    codec.step_items = lambda values: None  # type: ignore[method-assign]
    codec.stage_step = lambda values, items=None, leading=False: None  # type: ignore[method-assign]
    codec.stage_fast = lambda values, steps: None  # type: ignore[method-assign]
    writes = buf._writes
    writes.target = lambda: StepTarget(writes.storage, None, False, None)  # type: ignore[method-assign]
    return buf


def state(buf: MultiAgentReplayBuffer) -> dict[str, Any]:
    filled = buf.size  # slots never written hold whatever the allocation held
    out: dict[str, Any] = {
        "storage": {k: v[:filled].tobytes() for k, v in buf.storage.arrays().items()},
        "ring": (buf.cursor, buf.size, buf.total_writes),
        "write_generation": buf.write_generation.tobytes(),
    }
    links = buf.links
    if links is not None:
        out["links"] = (
            links.next_slot.tobytes(),
            links.side_row.tobytes(),
            links.side.tobytes(),
            list(links.free),
            dict(links.pending),
        )
    return out


def steps(rng: np.random.Generator, count: int, mixed: bool = False) -> list[dict[str, Any]]:
    """Steps of two interleaved streams with episode ends, resets and independent steps."""
    current = {s: {a: rng.standard_normal(5).astype(np.float32) for a in SPECS} for s in (0, 1)}
    out = []
    for t in range(count):
        stream = int(rng.integers(2))
        nxt = {a: rng.standard_normal(5).astype(np.float32) for a in SPECS}
        reward: dict[str, Any] = {a: float(rng.standard_normal()) for a in SPECS}
        action: dict[str, Any] = {a: int(rng.integers(4)) for a in SPECS}
        done: dict[str, Any] = {a: bool(t % 9 == 8) for a in SPECS}
        obs: dict[str, Any] = dict(current[stream])
        if mixed and t % 3 == 0:  # item types mixed within a field, and other dtypes
            reward["agent_1"] = np.float32(reward["agent_1"])
            action["agent_2"] = np.int64(action["agent_2"])
            done["agent_0"] = np.float32(done["agent_0"])
            obs["agent_0"] = obs["agent_0"].astype(np.float64)
        if mixed and t % 5 == 0:  # one-hot actions, lists in agent order
            action = {a: np.eye(4, dtype=np.float32)[action[a]] for a in SPECS}
        out.append(
            {
                "obs": obs if not (mixed and t % 7 == 0) else list(obs.values()),
                "action": action,
                "reward": reward,
                "next_obs": nxt,
                "done": done,
                "stream": stream,
            }
        )
        current[stream] = nxt if t % 11 else {a: rng.random(5).astype(np.float32) for a in SPECS}
    return out


@pytest.mark.parametrize("next_obs", ["auto", "stored"])
@pytest.mark.parametrize("mixed", [False, True])
def test_one_kernel_add_matches_the_general_path(next_obs, mixed):
    """Same bytes, links and ring state after the same adds, wrapping the ring twice."""
    fast = MultiAgentReplayBuffer(SPECS, 16, seed=0, next_obs=next_obs)
    slow = general(MultiAgentReplayBuffer(SPECS, 16, seed=0, next_obs=next_obs))
    calls = 0
    kernel = fast._writes.store_step

    def counted(*args: Any) -> bool:
        nonlocal calls
        taken = kernel(*args)
        calls += taken
        return taken

    fast._writes.store_step = counted  # type: ignore[method-assign]
    for step in steps(np.random.default_rng(int(mixed)), 40, mixed):
        fast.add(**step)
        slow.add(**step)
        assert state(fast) == state(slow)
    assert calls >= 30  # the one-kernel path took the steps (bar the growth of the side table)
    for trainer in range(3):
        a, b = fast.gather(np.arange(16), trainer), slow.gather(np.arange(16), trainer)
        for field in ("obs", "action", "reward", "next_obs", "done"):
            for agent in SPECS:
                assert a.field(field)[agent].tobytes() == b.field(field)[agent].tobytes()


def snapshot(buf: MultiAgentReplayBuffer) -> dict[str, Any]:
    return state(buf)


def valid() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {
        "obs": {a: rng.standard_normal(5).astype(np.float32) for a in SPECS},
        "action": {a: 1 for a in SPECS},
        "reward": {a: 0.5 for a in SPECS},
        "next_obs": {a: rng.standard_normal(5).astype(np.float32) for a in SPECS},
        "done": {a: False for a in SPECS},
    }


def bad(field: str, agent: str, value: Any) -> dict[str, Any]:
    step = valid()
    step[field] = dict(step[field])
    step[field][agent] = value
    return step


REJECTED = {
    "nan obs": bad("obs", "agent_1", np.array([0, np.nan, 0, 0, 0], np.float32)),
    "inf next_obs": bad("next_obs", "agent_2", np.array([np.inf, 0, 0, 0, 0], np.float32)),
    "beyond float32": bad("obs", "agent_0", np.array([3.5e38, 0, 0, 0, 0])),
    "nan reward": bad("reward", "agent_0", float("nan")),
    "huge reward": bad("reward", "agent_2", 1e300),
    "inf done": bad("done", "agent_1", np.float64(np.inf)),
    "action out of range": bad("action", "agent_0", 4),
    "negative action": bad("action", "agent_1", -1),
    "bool action": bad("action", "agent_2", True),
    "float action": bad("action", "agent_0", 1.0),
    "two actions at once": bad("action", "agent_1", np.array([1.0, 1.0, 0.0, 0.0], np.float32)),
    "no action": bad("action", "agent_2", np.zeros(4)),
    "negative probability": bad("action", "agent_0", np.array([1.5, -0.5, 0.0, 0.0])),
    "short obs": bad("obs", "agent_0", np.zeros(4, np.float32)),
    "2-D obs": bad("obs", "agent_0", np.zeros((1, 5), np.float32)),
    "string reward": bad("reward", "agent_0", "1.0"),
    "complex reward": bad("reward", "agent_1", 1 + 1j),
    "big int reward": bad("reward", "agent_1", 10**30),
    "None done": bad("done", "agent_0", None),
    "unknown agent": {**valid(), "reward": {**valid()["reward"], "agent_9": 1.0}},
    "missing agent": {**valid(), "done": {"agent_0": False, "agent_1": False}},
}


@pytest.mark.parametrize("next_obs", ["auto", "stored"])
@pytest.mark.parametrize("case", list(REJECTED))
def test_rejected_steps_raise_as_the_complete_path_and_change_nothing(next_obs, case):
    fast = MultiAgentReplayBuffer(SPECS, 8, seed=0, next_obs=next_obs)
    slow = general(MultiAgentReplayBuffer(SPECS, 8, seed=0, next_obs=next_obs))
    for step in steps(np.random.default_rng(0), 11):  # filled, wrapped, links in use
        fast.add(**step)
        slow.add(**step)
    before = snapshot(fast)
    with pytest.raises((ValueError, TypeError)) as expected:
        slow.add(**REJECTED[case])
    with pytest.raises(type(expected.value)) as got:
        fast.add(**REJECTED[case])
    assert str(got.value) == str(expected.value)
    assert snapshot(fast) == before
    fast.add(**valid())  # and the buffer still writes
    slow.add(**valid())
    assert state(fast) == state(slow)


def test_half_precision_inputs_turn_the_kernel_off_and_are_stored_as_before():
    """float16 items cannot be compiled by Numba: the kernel is turned off for the buffer (one
    failed compilation), and the NumPy paths store the step as the complete path does."""
    fast = MultiAgentReplayBuffer(SPECS, 8, seed=0)
    slow = general(MultiAgentReplayBuffer(SPECS, 8, seed=0))
    step = valid()
    step["obs"] = {a: x.astype(np.float16) for a, x in step["obs"].items()}
    with pytest.warns(SlowWriteWarning, match=r"obs\['agent_0'\] has dtype float16") as caught:
        for _ in range(3):
            fast.add(**step)
    assert len(caught) == 1  # once per buffer
    with pytest.warns(SlowWriteWarning):  # the twin takes the complete path: said there too
        for _ in range(3):
            slow.add(**step)
    assert fast._codec.step_plan is None
    assert state(fast) == state(slow)


def test_independent_adds_still_warn_about_the_side_table():
    """A default buffer fed independent transitions one add at a time warns once (the check
    runs when a side row is taken)."""
    rng = np.random.default_rng(1)
    buf = MultiAgentReplayBuffer(SPECS, 2048, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(1100):
            step = valid()
            step["obs"] = {a: rng.random(5).astype(np.float32) for a in SPECS}
            buf.add(**step)
    assert [type(w.message) for w in caught] == [NextObsWarning]


@pytest.mark.parametrize("field", ["obs", "action", "reward", "next_obs", "done"])
@pytest.mark.parametrize("next_obs", ["once", "stored"])
def test_a_ragged_nested_list_is_refused_not_crashed(field: str, next_obs: str) -> None:
    """A nested list reaches no compiled code (Numba's unboxing of a ragged reflected list
    crashes the process): the NumPy path refuses it with the field and agent named."""
    specs = {"ag0": AgentSpec(obs_shape=(3,), action_shape=(1,))}
    buf = MultiAgentReplayBuffer(specs, 17, next_obs=next_obs)
    step = {
        "obs": {"ag0": np.zeros(3)},
        "action": {"ag0": np.zeros(1)},
        "reward": {"ag0": 0.0},
        "next_obs": {"ag0": np.ones(3)},
        "done": {"ag0": 0.0},
    }
    buf.add(**step)
    step[field] = {"ag0": [[1.0], [2.0, 3.0]]}
    with pytest.raises(ValueError, match=rf"{field}\['ag0'\]"):
        buf.add(**step)
    assert len(buf) == 1
