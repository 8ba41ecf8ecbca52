"""Observations stored once are exact: every batch equals the dense format's, bit for bit.

Random streams of steps (terminations, resets whose first obs differs from the previous
next_obs, coincidentally equal values, several environments writing step by step or through
``add_envs``, wraparound, a buffer not yet full, neighbor runs across episode ends, save/load
and ``state_dict``) are written to a lean buffer and to a dense reference buffer
(``next_obs="stored"``), and every field of every slot and every sampled batch is compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, PrioritizedNeighbor, Uniform

SPECS = {
    "a": AgentSpec(obs_shape=(3,), action_shape=(2,)),
    "b": AgentSpec(obs_shape=(2, 2), action_shape=(3,), obs_dtype=np.float64),
    "c": AgentSpec(obs_shape=(1,), action_shape=(4,), n_discrete_actions=4),
}


class Streams:
    """Per stream, the next step's obs: a step's next_obs becomes the following obs unless the
    episode ends, when the next obs is a reset (which may equal it by chance)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.current: dict[int, dict[str, np.ndarray]] = {}

    def _obs(self) -> dict[str, np.ndarray]:
        # few distinct values, so equal observations across boundaries happen by chance
        return {
            a: self.rng.integers(0, 2, s.obs_shape).astype(s.obs_dtype) for a, s in SPECS.items()
        }

    def step(self, stream: int, p_end: float) -> dict[str, dict]:
        obs = self.current.get(stream) or self._obs()
        nxt = self._obs()
        end = self.rng.random() < p_end
        self.current[stream] = self._obs() if end else nxt
        return {
            "obs": obs,
            "action": {
                "a": self.rng.standard_normal(2).astype(np.float32),
                "b": self.rng.standard_normal(3).astype(np.float32),
                "c": int(self.rng.integers(0, 4)),
            },
            "reward": {a: float(self.rng.standard_normal()) for a in SPECS},
            "next_obs": nxt,
            "done": {a: bool(end) for a in SPECS},
        }


def stack(steps: list[dict]) -> dict:
    return {f: {a: np.stack([np.asarray(s[f][a]) for s in steps]) for a in SPECS} for f in FIELDS}


def assert_same(lean: MultiAgentReplayBuffer, dense: MultiAgentReplayBuffer) -> None:
    assert len(lean) == len(dense)
    if not len(dense):
        return
    every = np.arange(len(dense))
    x, y = lean.gather(every), dense.gather(every)
    for f in FIELDS:
        for agent in SPECS:
            assert x.field(f)[agent].tobytes() == y.field(f)[agent].tobytes(), (f, agent)


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "extend", "add_envs", "sample", "reload", "state"]),
        st.integers(0, 3),  # stream / environments
        st.integers(1, 9),  # steps
        st.floats(0, 1),  # episode-end probability
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations, capacity=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_lean_equals_dense(tmp_path, layout, batch_layout, ops, capacity, seed):
    rng = np.random.default_rng(seed)
    streams = Streams(rng)
    run = 2 if capacity >= 2 else 1
    kwargs = {"layout": layout, "batch_layout": batch_layout, "sampler": Neighbor(run), "seed": 1}
    lean = MultiAgentReplayBuffer(SPECS, capacity, next_obs="once", **kwargs)
    dense = MultiAgentReplayBuffer(SPECS, capacity, next_obs="stored", **kwargs)
    for op, k, steps, p_end in ops:
        if op == "add":
            step = streams.step(k, p_end)
            for buf in (lean, dense):
                buf.add(**step, stream=k)
        elif op == "extend":
            data = stack([streams.step(k, p_end) for _ in range(steps)])
            for buf in (lean, dense):
                buf.extend(**data, stream=k)
        elif op == "add_envs":
            data = stack([streams.step(e, p_end) for e in range(k + 1)])
            for buf in (lean, dense):
                buf.add_envs(**data)
        elif op == "sample" and len(dense) >= 2 * run:
            x, y = lean.sample(2 * run), dense.sample(2 * run)
            np.testing.assert_array_equal(x.indices, y.indices)
            for f in FIELDS:
                for agent in SPECS:
                    assert x.field(f)[agent].tobytes() == y.field(f)[agent].tobytes()
        elif op == "reload":
            path = tmp_path / "lean.npz"
            lean.save(path)
            lean = MultiAgentReplayBuffer.load(path)
        elif op == "state":
            fresh = MultiAgentReplayBuffer(SPECS, capacity, next_obs="once", **kwargs)
            fresh.load_state_dict(lean.state_dict())
            lean = fresh
        assert_same(lean, dense)


def test_side_table_holds_only_boundaries():
    """One side row per episode end still stored plus one per stream: about capacity / 25 for
    MPE's 25-step episodes, not one per slot."""
    rng = np.random.default_rng(0)
    streams = Streams(rng)
    buf = MultiAgentReplayBuffer(SPECS, 1000, sampler=Uniform())
    for t in range(3000):
        step = streams.step(0, 0.0)
        if t % 25 == 24:  # truncation: the next obs is a reset
            streams.current[0] = {a: np.full(s.obs_shape, 7, s.obs_dtype) for a, s in SPECS.items()}
        buf.add(**step)
    assert 40 <= buf.links.side_rows_used <= 42


def test_prioritized_neighbor_runs_cross_episode_ends_exactly():
    rng = np.random.default_rng(1)
    streams = Streams(rng)
    steps = [streams.step(t % 2, 0.3) for t in range(40)]
    bufs = [
        MultiAgentReplayBuffer(SPECS, 32, next_obs=mode, sampler=PrioritizedNeighbor(), seed=3)
        for mode in ("once", "stored")
    ]
    for t, step in enumerate(steps):
        for buf in bufs:
            buf.add(**step, stream=t % 2)
    for _ in range(5):
        x, y = (b.sample(16, trainer=1) for b in bufs)
        np.testing.assert_array_equal(x.indices, y.indices)
        assert x.next_obs["b"].tobytes() == y.next_obs["b"].tobytes()
        for b, batch in zip(bufs, (x, y)):
            b.update_priorities(batch.indices, np.abs(batch.reward["a"]) + 0.1, trainer=1)


def test_lean_rows_are_half_the_dense_rows_for_mpe():
    specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
    lean = MultiAgentReplayBuffer(specs, 10)
    dense = MultiAgentReplayBuffer(specs, 10, next_obs="stored")
    assert lean.storage.table.nbytes / dense.storage.table.nbytes < 0.52


def test_version_1_files_load_as_dense_when_the_layout_is_unchanged(tmp_path):
    """Files of marlbuf 0.1 (format version 1: next_obs in every row) still load."""
    specs = {f"agent_{i}": AgentSpec(obs_shape=(18,), action_shape=(5,)) for i in range(3)}
    dense = MultiAgentReplayBuffer(specs, 16, next_obs="stored", seed=0)
    rng = np.random.default_rng(0)
    obs = {a: rng.standard_normal(18) for a in specs}
    for _ in range(20):
        nxt = {a: rng.standard_normal(18) for a in specs}
        act = {a: rng.standard_normal(5) for a in specs}
        dense.add(obs, act, {a: 0.0 for a in specs}, nxt, {a: False for a in specs})
        obs = nxt
    state = dense.state_dict()
    state["version"] = 1
    del state["next_obs"], state["links"]
    restored = MultiAgentReplayBuffer(specs, 16, next_obs="stored")
    restored.load_state_dict(state)
    assert restored.gather(np.arange(16)).next_obs["agent_1"].tobytes() == (
        dense.gather(np.arange(16)).next_obs["agent_1"].tobytes()
    )
    mixed = dict(SPECS)  # its next_obs section moved to a word boundary in version 2
    old = MultiAgentReplayBuffer(mixed, 4, next_obs="stored").state_dict()
    old["version"] = 1
    with pytest.raises(ValueError, match="row layout this marlbuf no longer has"):
        MultiAgentReplayBuffer(mixed, 4, next_obs="stored").load_state_dict(old)


@pytest.mark.parametrize("key", ["next_slot", "side_row"])
@pytest.mark.parametrize("value", [-7, 10**6])
def test_corrupt_links_are_refused_before_any_gather(key, value):
    """The gather kernels index without bounds checks: out-of-range links must never load."""
    buf = MultiAgentReplayBuffer(SPECS, 8, seed=0)
    streams = Streams(np.random.default_rng(2))
    for _ in range(10):
        buf.add(**streams.step(0, 0.3))
    state = buf.state_dict()
    state["links"][key] = state["links"][key].copy()
    state["links"][key][3] = value
    fresh = MultiAgentReplayBuffer(SPECS, 8, seed=0)
    with pytest.raises(ValueError, match=r"point outside \[-1, \d+\)"):
        fresh.load_state_dict(state)
    assert len(fresh) == 0
