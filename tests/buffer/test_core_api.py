"""The write fast path, batch layouts, ``out=`` safety, ``as_lists``, held views and the stale
guard (reading without sampling and the rounds of every trainer: test_reading.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from datagen import random_step_data

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, Prioritized, Uniform

LAYOUTS = ["interleaved", "agent_major"]


@pytest.fixture
def discrete_specs():
    return {f"a{i}": AgentSpec((3 + i,), (4,), n_discrete_actions=4) for i in range(3)}


def _python_step(specs, rng, discrete):
    """One step as a PettingZoo user writes it: dicts, Python floats/bools, int actions."""
    return {
        "obs": {a: rng.standard_normal(s.obs_shape).astype(np.float32) for a, s in specs.items()},
        "action": {
            a: int(rng.integers(0, 4)) if discrete else rng.standard_normal(s.action_shape)
            for a, s in specs.items()
        },
        "reward": {a: float(rng.standard_normal()) for a in specs},
        "next_obs": {
            a: rng.standard_normal(s.obs_shape).astype(np.float64) for a, s in specs.items()
        },
        "done": {a: bool(rng.random() < 0.3) for a in specs},
    }


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("discrete", [True, False])
def test_fast_add_equals_complete_path(discrete_specs, layout, discrete):
    """The fast path stores exactly what the complete (per-item) path stores."""
    specs = (
        discrete_specs
        if discrete
        else {a: AgentSpec(s.obs_shape, (4,)) for a, s in discrete_specs.items()}
    )
    rng = np.random.default_rng(1)
    steps = [_python_step(specs, rng, discrete) for _ in range(20)]
    fast = MultiAgentReplayBuffer(specs, 16, layout=layout)
    slow = MultiAgentReplayBuffer(specs, 16, layout=layout)
    for step in steps:
        fast.add(**step)
        rows, _ = slow._codec.stage(step, None)  # the complete path, forced
        slow._writes.commit(rows, 1, 0)
    for key, arr in fast.storage.arrays().items():
        assert arr.tobytes() == slow.storage.arrays()[key].tobytes(), key
    assert fast.cursor == slow.cursor == 4 and len(fast) == 16


@pytest.mark.parametrize("next_obs", ["once", "stored"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_extend_and_add_envs_equal_adds(discrete_specs, layout, next_obs):
    rng = np.random.default_rng(2)
    steps = [_python_step(discrete_specs, rng, True) for _ in range(7)]
    stacked = {
        f: {a: np.stack([np.asarray(s[f][a]) for s in steps]) for a in discrete_specs}
        for f in FIELDS
    }
    by_add = MultiAgentReplayBuffer(discrete_specs, 5, layout=layout, next_obs=next_obs)
    for s in steps:
        by_add.add(**s)
    for method in ("extend", "add_envs"):
        other = MultiAgentReplayBuffer(discrete_specs, 5, layout=layout, next_obs=next_obs)
        getattr(other, method)(**stacked)
        for key, arr in by_add.storage.arrays().items():
            assert arr.tobytes() == other.storage.arrays()[key].tobytes(), (method, key)
        np.testing.assert_array_equal(other.write_generation, by_add.write_generation)


def test_fast_path_rejects_what_the_complete_path_rejects(discrete_specs):
    buf = MultiAgentReplayBuffer(discrete_specs, 8)
    step = _python_step(discrete_specs, np.random.default_rng(3), True)
    buf.add(**step)
    before = buf.storage.table.copy()
    bad = dict(step, action={**step["action"], "a2": 4})
    with pytest.raises(ValueError, match=r"action\['a2'\] holds discrete actions outside"):
        buf.add(**bad)
    bad = dict(step, reward={**step["reward"], "a1": "1.0"})
    with pytest.raises(TypeError, match=r"reward\['a1'\] must be numeric"):
        buf.add(**bad)
    bad = dict(step, next_obs={**step["next_obs"], "a2": np.full(5, 1e39)})
    with pytest.raises(ValueError, match=r"next_obs\['a2'\] holds 1e\+39, outside the range"):
        buf.add(**bad)
    bad = dict(step, obs={**step["obs"], "a0": np.full(3, np.nan, np.float32)})
    with pytest.raises(ValueError, match=r"obs\['a0'\] contains NaN or inf"):
        buf.add(**bad)
    # an agent of 3 values and one of 5 swapped: the total matches, the shapes do not
    bad = dict(step, obs={**step["obs"], "a0": np.zeros(4, np.float32), "a1": np.zeros(3)})
    with pytest.raises(ValueError, match=r"obs\['a0'\] must have shape \(3,\)"):
        buf.add(**bad)
    assert buf.storage.table.tobytes() == before.tobytes() and len(buf) == 1


def test_integer_action_without_discrete_spec_says_what_to_do():
    buf = MultiAgentReplayBuffer({"a": AgentSpec((2,), (5,))}, 4)
    with pytest.raises(ValueError, match=r"n_discrete_actions=5.*from_spaces"):
        buf.add([np.zeros(2)], [3], [0.0], [np.zeros(2)], [False])


def test_capacity_accepts_integral_floats_and_explains_zero():
    specs = {"a": AgentSpec((2,), (1,))}
    assert MultiAgentReplayBuffer(specs, 1e3).capacity == 1000
    with pytest.raises(TypeError, match="integral float"):
        MultiAgentReplayBuffer(specs, 10.5)
    with pytest.raises(ValueError, match="pass capacity=1"):
        MultiAgentReplayBuffer(specs, 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_agent_batches_are_contiguous_and_equal(mixed_specs, layout):
    data = random_step_data(mixed_specs, 40, np.random.default_rng(4))
    rows = MultiAgentReplayBuffer(mixed_specs, 32, layout=layout, seed=9)
    per_agent = MultiAgentReplayBuffer(
        mixed_specs, 32, layout=layout, seed=9, batch_layout="per_agent"
    )
    for b in (rows, per_agent):
        b.extend(**data)
    for _ in range(3):
        x, y = rows.sample(16), per_agent.sample(16)
        np.testing.assert_array_equal(x.indices, y.indices)
        for f in FIELDS:
            for agent in mixed_specs:
                arr = y.field(f)[agent]
                assert arr.flags.c_contiguous
                assert arr.tobytes() == np.ascontiguousarray(x.field(f)[agent]).tobytes()
        np.testing.assert_array_equal(x.concat("obs", "action"), y.concat("obs", "action"))


def test_as_lists_is_the_classic_format(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 32, seed=0)
    buf.extend(**random_step_data(mixed_specs, 20, np.random.default_rng(5)))
    batch = buf.sample(8)
    obs_n, act_n, rew_n, next_obs_n, done_n = batch.as_lists()
    agents = list(mixed_specs)
    for i, a in enumerate(agents):
        assert obs_n[i] is batch.obs[a] and act_n[i] is batch.action[a]
        assert rew_n[i] is batch.reward[a] and next_obs_n[i] is batch.next_obs[a]
        assert done_n[i] is batch.done[a]
    torch = pytest.importorskip("torch")
    t_lists = batch.to_torch().as_lists()
    assert all(isinstance(x, torch.Tensor) for part in t_lists for x in part)
    np.testing.assert_array_equal(t_lists[0][1].numpy(), obs_n[1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_checks_size_layout_and_buffer(mixed_specs, layout):
    data = random_step_data(mixed_specs, 40, np.random.default_rng(7))
    buf = MultiAgentReplayBuffer(mixed_specs, 32, layout=layout, seed=1)
    narrow_specs = {a: AgentSpec((1,), (1,)) for a in mixed_specs}
    narrow = MultiAgentReplayBuffer(narrow_specs, 32, layout=layout, seed=1)
    buf.extend(**data)
    narrow.extend(**random_step_data(narrow_specs, 40, np.random.default_rng(8)))
    with pytest.raises(ValueError, match="same size and fields= from this buffer"):
        buf.sample(16, out=narrow.sample(16))
    with pytest.raises(ValueError, match="pass a batch of the same size"):
        buf.sample(16, out=buf.sample(8))
    prev = buf.sample(16)
    again = buf.sample(16, out=prev)
    assert again.block is prev.block
    shared = buf.sample_for_trainers(16, shared_index=True)
    with pytest.raises(ValueError, match="same batch"):
        buf.sample_for_trainers(16, out=shared)


def test_neighbor_longer_than_capacity_is_refused():
    with pytest.raises(ValueError, match=r"run_length=1048576 is longer than the buffer"):
        MultiAgentReplayBuffer({"a": AgentSpec((1,), (1,))}, 2, sampler=Neighbor(1 << 20))


def test_batch_larger_than_data_only_with_replacement(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 32)
    buf.extend(**random_step_data(mixed_specs, 2, np.random.default_rng(9)))
    assert len(buf.sample(1024)) == 1024  # Uniform() draws with replacement: any batch size
    sampler = Uniform(replace=False)
    buf.sampler = sampler
    sampler.bind(32, 3)
    with pytest.raises(ValueError, match="buffer holds 2"):
        buf.sample(1024)


def test_stale_guard_without_generations(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 8, sampler=Prioritized(), seed=2)
    data = random_step_data(mixed_specs, 8, np.random.default_rng(10))
    buf.extend(**data)
    batch = buf.sample(4, trainer=0)
    buf.extend(**data)  # every slot overwritten
    before = buf.sampler.trees.leaves(0).copy()
    buf.update_priorities(batch.indices, np.full(4, 100.0), trainer=0)
    np.testing.assert_array_equal(buf.sampler.trees.leaves(0), before)
    fresh = buf.sample(4, trainer=0)
    buf.update_priorities(fresh.indices, np.full(4, 100.0), trainer=0)
    assert not np.array_equal(buf.sampler.trees.leaves(0), before)


def test_held_views_are_never_recycled(mixed_specs):
    torch = pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(mixed_specs, 64, seed=3)
    buf.extend(**random_step_data(mixed_specs, 64, np.random.default_rng(11)))
    b = buf.sample(32)
    keep = b.next_obs["pred_1"]
    part = keep[3:9, 1:]
    tensor = torch.from_numpy(b.obs["pred_0"])
    capsule = torch.from_dlpack(b.action["prey_0"])
    snap = [x.copy() for x in (keep, part, tensor.numpy(), capsule.numpy())]
    del b
    gc.collect()
    for _ in range(20):
        buf.sample(32)
    for held, expect in zip((keep, part, tensor.numpy(), capsule.numpy()), snap):
        np.testing.assert_array_equal(held, expect)
    del keep, part, tensor, capsule
    gc.collect()
    for _ in range(50):
        buf.sample(32)
    assert len(buf.storage.pool._blocks) <= buf.storage.pool.max_blocks  # private: bounded pool


def test_stacked_arrays_take_the_fast_path_and_store_the_same():
    specs = {f"a{i}": AgentSpec((4,), (3,), n_discrete_actions=3) for i in range(3)}
    rng = np.random.default_rng(14)
    obs = rng.standard_normal((3, 4)).astype(np.float32)
    nxt = rng.standard_normal((3, 4))
    acts = np.array([0, 2, 1])
    rew = np.array([0.5, -1.0, 2.0])
    done = np.array([False, True, False])
    stacked = MultiAgentReplayBuffer(specs, 4)
    codec = stacked._codec
    assert codec.stage_fast((obs, acts, rew, nxt, done), None) is not None
    stacked.add(obs, acts, rew, nxt, done)
    as_dicts = MultiAgentReplayBuffer(specs, 4)
    names = list(specs)
    as_dicts.add(
        {a: obs[i] for i, a in enumerate(names)},
        {a: int(acts[i]) for i, a in enumerate(names)},
        {a: float(rew[i]) for i, a in enumerate(names)},
        {a: nxt[i] for i, a in enumerate(names)},
        {a: bool(done[i]) for i, a in enumerate(names)},
    )
    assert stacked.storage.table[:1].tobytes() == as_dicts.storage.table[:1].tobytes()
    assert stacked.links.side.tobytes() == as_dicts.links.side.tobytes()
