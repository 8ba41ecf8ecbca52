"""MultiAgentReplayBuffer: layouts, ring semantics, sampling, bad input."""

from __future__ import annotations

import naive
import numpy as np
import pytest
from datagen import random_step_data, step_slice

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, PrioritizedNeighbor, Uniform

LAYOUTS = ["interleaved", "agent_major"]


def on_host(x):
    """A tensor (a torch store's batch field) as a host array; arrays as they are."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def layouts(store):
    """The layouts of a store (``store``: the fixture's constructor keywords): a torch store's
    table is interleaved rows."""
    return ["interleaved"] if store else LAYOUTS


def fill(buf, data, steps, one_by_one=False):
    if one_by_one:
        for t in range(steps):
            buf.add(**step_slice(data, t))
    else:
        buf.extend(**data)


def assert_batch_matches(batch, ring, specs):
    """Every agent's fields at every index equal what the naive ring holds there."""
    for row, slot in enumerate(batch.indices):
        expected = ring.get(int(slot))
        for f in FIELDS:
            for agent in specs:
                np.testing.assert_array_equal(batch.field(f)[agent][row], expected[f][agent])


def naive_ring_from(data, specs, steps, capacity):
    ring = naive.NaiveRing(capacity)
    for t in range(steps):
        ring.add(
            {
                f: {a: np.asarray(x[t]).astype(specs[a].dtype(f)) for a, x in per.items()}
                for f, per in data.items()
            }
        )
    return ring


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("capacity", "steps"), [(10, 3), (10, 10), (10, 23), (7, 50)])
@pytest.mark.parametrize("one_by_one", [False, True])
def test_ring_semantics_match_naive(mixed_specs, layout, capacity, steps, one_by_one):
    rng = np.random.default_rng(steps)
    data = random_step_data(mixed_specs, steps, rng)
    buf = MultiAgentReplayBuffer(mixed_specs, capacity, layout=layout, seed=1)
    fill(buf, data, steps, one_by_one)
    ring = naive_ring_from(data, mixed_specs, steps, capacity)
    assert len(buf) == ring.size == min(steps, capacity)
    assert buf.cursor == ring.cursor
    assert buf.total_writes == steps
    batch = buf.gather(np.arange(len(buf)))
    assert_batch_matches(batch, ring, mixed_specs)
    for agent, spec in mixed_specs.items():
        assert batch.obs[agent].shape == (len(buf), *spec.obs_shape)
        assert batch.obs[agent].dtype == spec.obs_dtype
        assert batch.reward[agent].shape == (len(buf),)
        assert batch.done[agent].dtype == np.float32


def test_layouts_identical_bit_for_bit(mixed_specs):
    rng = np.random.default_rng(0)
    data = random_step_data(mixed_specs, 40, rng)
    bufs = [MultiAgentReplayBuffer(mixed_specs, 32, layout=lay, seed=5) for lay in LAYOUTS]
    for b in bufs:
        b.extend(**data)
    batches = [b.sample(32) for b in bufs]
    np.testing.assert_array_equal(batches[0].indices, batches[1].indices)
    for f in FIELDS:
        for agent in mixed_specs:
            a, b = (x.field(f)[agent] for x in batches)
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()
    for fields in [("obs",), ("obs", "action"), ("next_obs", "action", "done")]:
        np.testing.assert_array_equal(batches[0].concat(*fields), batches[1].concat(*fields))


def test_interleaved_alignment_and_zero_copy_concat():
    specs = {f"a{i}": AgentSpec((18,), (5,)) for i in range(3)}
    buf = MultiAgentReplayBuffer(specs, 100, layout="interleaved")
    table = buf.storage.table
    assert table.ctypes.data % 4096 == 0
    assert buf.storage.row_bytes % 64 == 0
    buf.extend(**random_step_data(specs, 10, np.random.default_rng(0)))
    batch = buf.sample(8)
    assert batch.block is not None and batch.block.ctypes.data % 64 == 0
    joint = batch.concat("obs", "action")
    assert joint.shape == (8, 3 * 18 + 3 * 5)
    assert np.shares_memory(joint, batch.block)  # the critic input is a view, not a copy
    expected = np.concatenate([batch.obs[a] for a in specs] + [batch.action[a] for a in specs], 1)
    np.testing.assert_array_equal(joint, expected)


def test_discrete_actions_stored_one_hot(mixed_specs, store):
    buf = MultiAgentReplayBuffer(mixed_specs, 10, **store)
    step = step_slice(random_step_data(mixed_specs, 1, np.random.default_rng(0)), 0)
    step["action"]["prey_0"] = 2
    buf.add(**step)
    np.testing.assert_array_equal(on_host(buf.gather([0]).action["prey_0"][0]), [0, 0, 1, 0])
    step["action"]["prey_0"] = 4
    with pytest.raises(ValueError, match=r"action\['prey_0'\].*outside \[0, 4\)"):
        buf.add(**step)


def test_lists_in_agent_order_are_accepted(mixed_specs, store):
    rng = np.random.default_rng(3)
    step = step_slice(random_step_data(mixed_specs, 1, rng), 0)
    a = MultiAgentReplayBuffer(mixed_specs, 4, **store)
    b = MultiAgentReplayBuffer(mixed_specs, 4, **store)
    a.add(**step)
    b.add(**{f: [per[agent] for agent in mixed_specs] for f, per in step.items()})
    np.testing.assert_array_equal(on_host(a.storage.table[:1]), on_host(b.storage.table[:1]))
    envs = random_step_data(mixed_specs, 3, rng)  # one step of three environments
    a.add_envs(**envs)
    b.add_envs(**{f: [per[agent] for agent in mixed_specs] for f, per in envs.items()})
    np.testing.assert_array_equal(on_host(a.storage.table[:4]), on_host(b.storage.table[:4]))
    assert len(a) == 4


@pytest.mark.parametrize("layout", LAYOUTS)
def test_same_seed_same_indices(mixed_specs, layout):
    data = random_step_data(mixed_specs, 50, np.random.default_rng(0))
    runs = []
    for _ in range(2):
        buf = MultiAgentReplayBuffer(mixed_specs, 64, layout=layout, sampler=Neighbor(4), seed=9)
        buf.extend(**data)
        runs.append([b.indices for b in buf.sample_for_trainers(16)])
    for x, y in zip(*runs):
        np.testing.assert_array_equal(x, y)


def test_sample_for_trainers_draws_per_trainer_and_shared_index(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 100, seed=0)
    buf.extend(**random_step_data(mixed_specs, 100, np.random.default_rng(0)))
    batches = buf.sample_for_trainers(32)
    assert [b.trainer for b in batches] == [0, 1, 2]
    assert not np.array_equal(batches[0].indices, batches[1].indices)
    shared = buf.sample_for_trainers(32, shared_index=True)
    assert all(b is shared[0] for b in shared)
    assert len(buf.sample_for_trainers(32, n_trainers=2)) == 2


def test_out_reuses_arrays(mixed_specs):
    for layout in LAYOUTS:
        buf = MultiAgentReplayBuffer(mixed_specs, 50, layout=layout, seed=0)
        buf.extend(**random_step_data(mixed_specs, 50, np.random.default_rng(1)))
        first = buf.sample(16)
        obs_before = first.obs["pred_0"]
        second = buf.sample(16, out=first)
        assert np.shares_memory(second.obs["pred_0"], obs_before)
        fresh = buf.gather(second.indices)
        np.testing.assert_array_equal(second.obs["pred_0"], fresh.obs["pred_0"])


# ------------------------------------------------------------------------- samplers


def test_neighbor_runs_while_filling_never_reach_unwritten_slots(mixed_specs, store):
    buf = MultiAgentReplayBuffer(mixed_specs, 1000, sampler=Neighbor(run_length=8), seed=0, **store)
    buf.extend(**random_step_data(mixed_specs, 40, np.random.default_rng(0)))
    for _ in range(200):
        idx = buf.sample(16).indices
        assert idx.max() < 40
        runs = idx.reshape(-1, 8)
        np.testing.assert_array_equal(np.diff(runs, axis=1), 1)  # contiguous runs


def test_neighbor_wraps_once_full(mixed_specs, store):
    buf = MultiAgentReplayBuffer(mixed_specs, 20, sampler=Neighbor(run_length=5), seed=0, **store)
    buf.extend(**random_step_data(mixed_specs, 27, np.random.default_rng(0)))
    seen_wrap = False
    for _ in range(300):
        runs = buf.sample(10).indices.reshape(-1, 5)
        np.testing.assert_array_equal(np.diff(runs, axis=1) % 20, 1)
        seen_wrap |= bool((runs[:, -1] < runs[:, 0]).any())
    assert seen_wrap


def test_neighbor_needs_enough_data(mixed_specs, store):
    buf = MultiAgentReplayBuffer(mixed_specs, 100, sampler=Neighbor(run_length=8), **store)
    buf.extend(**random_step_data(mixed_specs, 10, np.random.default_rng(0)))
    buf.sample(8)  # refs in [0, 2]: one run fits
    with pytest.raises(ValueError, match=r"batch_size=32 needs distinct slots.*holds 10"):
        buf.sample(32)


def _chi_square_uniform(counts):
    from scipy import stats

    expected = np.full(counts.shape, counts.sum() / counts.size)
    return stats.chisquare(counts, expected).pvalue


@pytest.mark.parametrize(
    "sampler", [Uniform(), Uniform(replace=False), Neighbor(1), Neighbor(8), Neighbor(32)]
)
def test_full_buffer_slots_are_equally_likely(mixed_specs, sampler):
    capacity = 64
    buf = MultiAgentReplayBuffer(mixed_specs, capacity, sampler=sampler, seed=1234)
    buf.extend(**random_step_data(mixed_specs, capacity + 13, np.random.default_rng(0)))
    counts = np.zeros(capacity)
    for _ in range(1500):
        np.add.at(counts, buf.sample(32).indices, 1)
    assert _chi_square_uniform(counts) > 1e-3


def test_uniform_without_replacement_has_no_duplicates(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 50, sampler=Uniform(replace=False), seed=0)
    buf.extend(**random_step_data(mixed_specs, 30, np.random.default_rng(0)))
    for _ in range(50):
        idx = buf.sample(30).indices
        assert len(set(idx.tolist())) == 30 and idx.max() < 30
    with pytest.raises(ValueError, match="batch_size=31"):
        buf.sample(31)


# ------------------------------------------------------------------------- bad input


def _one_step(specs):
    return step_slice(random_step_data(specs, 1, np.random.default_rng(0)), 0)


@pytest.mark.parametrize(
    ("mutate", "exc", "match"),
    [
        (lambda s: s["obs"].pop("pred_0"), ValueError, r"missing \['pred_0'\]"),
        (lambda s: s["obs"].update(ghost=np.zeros(16)), ValueError, r"unexpected \['ghost'\]"),
        (lambda s: s["obs"].update(pred_0=np.zeros(15)), ValueError, r"shape \(16,\); got \(15,\)"),
        (lambda s: s["reward"].update(pred_0=np.nan), ValueError, "NaN or inf"),
        (lambda s: s["next_obs"].update(prey_0=np.full(14, np.inf)), ValueError, "NaN or inf"),
        (lambda s: s["obs"].update(pred_0=np.array(["x"] * 16)), TypeError, "must be numeric"),
        (lambda s: s.update(done="yes"), TypeError, "dict keyed by agent"),
        (lambda s: s.update(reward=[1.0, 2.0]), ValueError, "one entry per agent"),
        (lambda s: s["action"].update(prey_0=4), ValueError, r"outside \[0, 4\)"),
    ],
)
def test_bad_add_is_rejected_and_nothing_written(mixed_specs, store, mutate, exc, match):
    for layout in layouts(store):
        buf = MultiAgentReplayBuffer(mixed_specs, 4, layout=layout, **store)
        buf.add(**_one_step(mixed_specs))
        before = {k: v.copy() for k, v in buf.storage.arrays().items()}
        step = _one_step(mixed_specs)
        mutate(step)
        with pytest.raises(exc, match=match):
            buf.add(**step)
        assert len(buf) == 1 and buf.cursor == 1 and buf.total_writes == 1
        rows = None if store else 1  # a torch table starts zeroed: every row is unchanged
        for k, v in buf.storage.arrays().items():
            np.testing.assert_array_equal(v[:rows], before[k][:rows])


def test_float_to_int_storage_is_a_type_error():
    specs = {"a": AgentSpec((3,), (2,), obs_dtype=np.int32)}
    buf = MultiAgentReplayBuffer(specs, 4)
    with pytest.raises(TypeError, match=r"obs\['a'\] has dtype float64.*int32"):
        buf.add(
            obs={"a": np.zeros(3)},
            action={"a": np.zeros(2)},
            reward={"a": 0.0},
            next_obs={"a": np.zeros(3, np.int32)},
            done={"a": False},
        )


def test_bad_extend(mixed_specs, store):
    buf = MultiAgentReplayBuffer(mixed_specs, 8, **store)
    data = random_step_data(mixed_specs, 5, np.random.default_rng(0))
    data["reward"]["pred_1"] = data["reward"]["pred_1"][:4]
    with pytest.raises(ValueError, match="same number of timesteps"):
        buf.extend(**data)
    data = random_step_data(mixed_specs, 5, np.random.default_rng(0))
    data["action"]["pred_0"][3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        buf.extend(**data)
    assert len(buf) == 0
    with pytest.raises(ValueError, match="leading time axis"):
        buf.extend(**_one_step(mixed_specs))
    assert len(buf) == 0 and buf.total_writes == 0
    if store:  # a torch table starts zeroed (a host one is uninitialised): still all zeros
        assert not any(np.asarray(v).any() for v in buf.storage.arrays().values())


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"capacity": 0}, ValueError, "capacity must be at least 1 transition; got capacity=0"),
        ({"capacity": -3}, ValueError, "capacity must be at least 1"),
        ({"capacity": 2.5}, TypeError, "capacity must be an int"),
        ({"capacity": 10, "layout": "rows"}, ValueError, "layout must be one of"),
        ({"capacity": 10, "sampler": "uniform"}, TypeError, "sampler must be"),
        ({"capacity": 10, "seed": "x"}, TypeError, "seed must be"),
        ({"capacity": 10, "n_trainers": 0}, ValueError, "n_trainers must be >= 1"),
        ({"capacity": 10**15}, MemoryError, "needs .* GiB"),
        ({"capacity": 10, "batch_layout": "x"}, ValueError, "batch_layout must be one of"),
        ({"capacity": 10, "parallel_gather": "no"}, TypeError, "parallel_gather must be a bool"),
        ({"capacity": 10, "sampler": Neighbor(64)}, ValueError, "longer than the buffer"),
        ({"capacity": 10, "sampler": PrioritizedNeighbor(run_lengths=(1, 2, 40))}, ValueError,
         "longest run"),
        ({"capacity": 10, "next_obs": "dense"}, ValueError, "next_obs must be one of"),
        ({"capacity": 10, "batch_dtype": "half"}, ValueError, "batch_dtype must be one of"),
    ],
)  # fmt: skip
def test_bad_constructor_arguments(mixed_specs, store, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MultiAgentReplayBuffer(mixed_specs, **kwargs, **store)


def test_bad_specs():
    with pytest.raises(TypeError, match="specs must be a mapping"):
        MultiAgentReplayBuffer([AgentSpec((3,), (2,))], 10)
    with pytest.raises(ValueError, match="at least one agent"):
        MultiAgentReplayBuffer({}, 10)
    with pytest.raises(TypeError, match=r"specs\['a'\] must be an AgentSpec"):
        MultiAgentReplayBuffer({"a": (3, 2)}, 10)
    with pytest.raises(ValueError, match="obs_shape must be a tuple of positive ints"):
        AgentSpec(obs_shape=(0,), action_shape=(2,))
    with pytest.raises(TypeError, match="obs_dtype must be a bool, integer or float"):
        AgentSpec(obs_shape=(3,), action_shape=(2,), obs_dtype=np.complex64)


def test_bad_sample_arguments(mixed_specs, store):
    buf = MultiAgentReplayBuffer(mixed_specs, 100, sampler=Neighbor(8), **store)
    with pytest.raises(ValueError, match="buffer is empty"):
        buf.sample(8)  # empty buffer
    buf.extend(**random_step_data(mixed_specs, 50, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="run_length=8 must divide batch_size=12"):
        buf.sample(12)
    with pytest.raises(ValueError, match="batch_size must be a positive int; got batch_size=0"):
        buf.sample(0)
    with pytest.raises(ValueError, match=r"trainer must be in \[0, 3\)"):
        buf.sample(8, trainer=3)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 50\)"):
        buf.gather([0, 50])
    with pytest.raises(TypeError, match="1-D integer array"):
        buf.gather([0.5])
    with pytest.raises(TypeError, match="keeps no priorities"):
        buf.update_priorities([0], [1.0], generations=buf.write_generation[[0]])
    with pytest.raises(ValueError, match=r"n must be in \[1, 50\]"):
        buf.latest(51)
    with pytest.raises(ValueError, match="field must be one of"):
        buf.stored("obz")
    with pytest.raises(ValueError, match=r"n_trainers must be in \[1, 3\]"):
        buf.sample_for_trainers(8, n_trainers=4)
    with pytest.raises(ValueError, match="run_length must be a positive int"):
        Neighbor(0)
    uniform = MultiAgentReplayBuffer(mixed_specs, 10)
    with pytest.raises(ValueError, match="buffer is empty"):
        uniform.sample(4)


def test_from_spaces():
    gym = pytest.importorskip("gymnasium")
    obs = gym.spaces.Box(-1, 1, (18,))
    spec = AgentSpec.from_spaces(obs, gym.spaces.Box(0, 1, (5,)))
    assert spec.obs_shape == (18,) and spec.action_shape == (5,) and spec.n_discrete_actions is None
    disc = AgentSpec.from_spaces(obs, gym.spaces.Discrete(5))
    assert disc.action_shape == (5,) and disc.n_discrete_actions == 5
    with pytest.raises(TypeError, match="action_space must be a Box or Discrete"):
        AgentSpec.from_spaces(obs, gym.spaces.MultiBinary(3))
    with pytest.raises(TypeError, match="observation_space must be a Box"):
        AgentSpec.from_spaces(gym.spaces.Discrete(3), gym.spaces.Discrete(5))


# ------------------------------------------------------------------------- block recycling


@pytest.mark.parametrize("layout", LAYOUTS)
def test_held_batches_are_never_overwritten(mixed_specs, layout):
    buf = MultiAgentReplayBuffer(mixed_specs, 64, layout=layout, seed=0)
    buf.extend(**random_step_data(mixed_specs, 64, np.random.default_rng(0)))
    held = [buf.sample(16) for _ in range(30)]  # more than the pool keeps
    snapshots = [b.obs["pred_0"].copy() for b in held]
    for _ in range(30):
        buf.sample_for_trainers(16)
    for batch, snap in zip(held, snapshots):
        np.testing.assert_array_equal(batch.obs["pred_0"], snap)
        np.testing.assert_array_equal(batch.obs["pred_0"], buf.gather(batch.indices).obs["pred_0"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_released_batch_memory_is_recycled(mixed_specs, layout):
    buf = MultiAgentReplayBuffer(mixed_specs, 64, layout=layout, seed=0)
    buf.extend(**random_step_data(mixed_specs, 64, np.random.default_rng(0)))
    first = buf.sample(16)
    address = first.obs["pred_0"].__array_interface__["data"][0]
    del first
    second = buf.sample(16)
    assert second.obs["pred_0"].__array_interface__["data"][0] == address
    kept_view = second.reward["prey_0"]  # any surviving view pins the block
    del second
    third = buf.sample(16)
    assert not np.shares_memory(third.obs["pred_0"], kept_view.base)


def test_torch_tensors_pin_their_block(mixed_specs):
    torch = pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(mixed_specs, 64, seed=0)
    buf.extend(**random_step_data(mixed_specs, 64, np.random.default_rng(0)))
    tensors = buf.sample(16).to_torch()
    expected = tensors.obs["pred_0"].clone()
    joint = tensors.concat("obs", "action")
    assert isinstance(joint, torch.Tensor) and joint.shape == (16, 16 + 6 + 14 + 5 + 5 + 4)
    for _ in range(10):
        buf.sample(16)
    assert torch.equal(tensors.obs["pred_0"], expected)


@pytest.mark.parametrize("module_name", ["marlbuf.buffer", "marlbuf.spec", "marlbuf.samplers"])
def test_docstring_examples_run(module_name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_parallel_gather_gives_the_same_batches(mixed_specs, layout, monkeypatch):
    from marlbuf import _config

    monkeypatch.setattr(_config, "PARALLEL_GATHER_MIN_BYTES", 0)  # force the threaded kernel
    data = random_step_data(mixed_specs, 80, np.random.default_rng(0))
    serial = MultiAgentReplayBuffer(mixed_specs, 64, layout=layout, seed=3)
    threaded = MultiAgentReplayBuffer(mixed_specs, 64, layout=layout, seed=3, parallel_gather=True)
    for buf in (serial, threaded):
        buf.extend(**data)
    a, b = serial.sample(48), threaded.sample(48)
    for f in FIELDS:
        for agent in mixed_specs:
            np.testing.assert_array_equal(a.field(f)[agent], b.field(f)[agent])
    with pytest.raises(TypeError, match="parallel_gather must be a bool"):
        MultiAgentReplayBuffer(mixed_specs, 8, parallel_gather="yes")
