"""The torch backend (``MultiAgentReplayBuffer(..., device=...)``): the NumPy buffer's tests on
``device="cpu"`` (and on ``"cuda"`` where a GPU is present: tests marked ``cuda``).

The NumPy buffer is the reference: given the same writes and the same indices (``gather``), both
hold and return the same bits; samplers draw from the same distributions (chi-square) with the
same importance weights; files move between the two.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from datagen import random_step_data, step_slice

torch = pytest.importorskip("torch")

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer  # noqa: E402
from marlbuf.prioritized import LinearBeta, RunLengthPredictor  # noqa: E402
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Uniform  # noqa: E402
from marlbuf.torch_backend import DeviceBatch, TorchReplayBuffer, stack_span  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available())"),
]
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
SAMPLERS = [
    Uniform,
    lambda: Uniform(replace=False),
    lambda: Neighbor(4),
    Prioritized,
    PrioritizedNeighbor,
]
SPECS2 = {f"agent_{i}": AgentSpec(obs_shape=(3,), action_shape=(2,)) for i in range(2)}
#: half-precision fields (float16 obs of two agents, one float16 action)
HALF = {
    "p": AgentSpec(obs_shape=(5,), action_shape=(3,), obs_dtype=np.float16),
    "q": AgentSpec(
        obs_shape=(2, 3), action_shape=(2,), obs_dtype=np.float16, action_dtype=np.float16
    ),
    "r": AgentSpec(obs_shape=(4,), action_shape=(4,), n_discrete_actions=4),
}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small tensors on a busy 2-core machine: idle OpenMP threads spin and make every op
    milliseconds slower (the project runs torch with one thread, see quiet_threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def host(x):
    return x.detach().cpu().numpy()


def pair(specs, capacity, device="cpu", sampler=None, seed=1, next_obs="stored", **kw):
    """A NumPy buffer and a torch buffer built alike (``sampler`` a factory, the same
    ``next_obs`` mode), so their tables can be compared byte for byte."""
    kw = {"seed": seed, "next_obs": next_obs, **kw}
    a = MultiAgentReplayBuffer(specs, capacity, sampler=sampler() if sampler else None, **kw)
    b = MultiAgentReplayBuffer(
        specs, capacity, sampler=sampler() if sampler else None, device=device, **kw
    )
    return a, b


def assert_same_links(a, b):
    """The torch buffer ``b`` keeps the NumPy buffer ``a``'s links (observations stored once),
    and its device mirror holds them: every link entry and every side row in use."""
    if a.links is None:
        assert b.links is None
        return
    np.testing.assert_array_equal(b.links.next_slot, a.links.next_slot)
    np.testing.assert_array_equal(b.links.side_row, a.links.side_row)
    assert b.links.pending == a.links.pending
    np.testing.assert_array_equal(host(b._links[:, 0]), b.links.next_slot)
    np.testing.assert_array_equal(host(b._links[:, 1]), b.links.side_row)
    used = b.links.side_row[b.links.side_row >= 0]
    side = host(b.table[b._side_base + used, : b._side_words]).view(np.uint8)
    assert side.tobytes() == b.links.side[used].tobytes()


def assert_same_batch(a, b, specs):
    """A NumPy batch and a device batch hold the same bits in every field."""
    for f in FIELDS:
        for agent in specs:
            x, y = a.field(f)[agent], host(b.field(f)[agent])
            assert x.dtype == y.dtype and x.shape == y.shape, (f, agent)
            assert x.tobytes() == np.ascontiguousarray(y).tobytes(), (f, agent)


def chi2_pvalue(counts, expected):
    """Pearson's chi-square p-value (scipy when present, else the Wilson-Hilferty normal
    approximation, good to a few percent in the tail for dof >= 10)."""
    keep = expected > 0
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    try:
        from scipy.stats import chi2
    except ImportError:
        z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        return 0.5 * math.erfc(z / math.sqrt(2))
    return float(chi2.sf(stat, dof))


# --------------------------------------------------------------------------- construction
def test_device_keyword_dispatches_to_the_torch_backend(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 10, device="cpu")
    assert type(buf) is TorchReplayBuffer and isinstance(buf, MultiAgentReplayBuffer)
    assert buf.device == torch.device("cpu") and buf.layout == "interleaved"
    assert type(MultiAgentReplayBuffer(mixed_specs, 10)) is MultiAgentReplayBuffer
    assert type(MultiAgentReplayBuffer(mixed_specs, 10, device=None)) is MultiAgentReplayBuffer
    assert "TorchReplayBuffer(agents=3" in repr(buf)


def test_import_marlbuf_does_not_import_torch():
    code = (
        "import sys, numpy as np, marlbuf\n"
        "from marlbuf import AgentSpec, MultiAgentReplayBuffer\n"
        "MultiAgentReplayBuffer({'a': AgentSpec((3,), (2,))}, 8).add("
        "[np.zeros(3)], [np.zeros(2)], [0.0], [np.zeros(3)], [0.0])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"device": "tpu"}, ValueError, "device must be 'cpu', 'cuda' or 'cuda:k'"),
        ({"device": "meta"}, ValueError, "runs on 'cpu' and 'cuda' devices"),
        ({"device": 3}, TypeError, "device must be a string"),
        ({"device": "cpu", "layout": "agent_major"}, ValueError, "interleaved row table only"),
        ({"device": "cpu", "layout": "rows"}, ValueError, "layout must be one of"),
        ({"device": "cpu", "batch_layout": "x"}, ValueError, "batch_layout must be one of"),
        ({"device": "cpu", "parallel_gather": True}, ValueError, "leave parallel_gather=False"),
        ({"device": "cpu", "parallel_gather": "no"}, TypeError, "parallel_gather must be a bool"),
        ({"device": "cpu", "sampler": "uniform"}, TypeError, "sampler must be"),
        ({"device": "cpu", "seed": "x"}, TypeError, "seed must be"),
        ({"device": "cpu", "n_trainers": 0}, ValueError, "n_trainers must be >= 1"),
        ({"device": "cpu", "capacity": 0}, ValueError, "capacity must be at least 1"),
        ({"device": "cpu", "capacity": 10**15}, MemoryError, "needs .* GiB"),
        ({"device": "cpu", "sampler": Neighbor(64)}, ValueError, "longer than the buffer"),
        ({"device": "cpu", "sampler": PrioritizedNeighbor(run_lengths=(1, 2, 40))}, ValueError,
         "longest run"),
        ({"device": "cpu", "next_obs": "dense"}, ValueError, "next_obs must be one of"),
        ({"device": "cpu", "batch_dtype": "half"}, ValueError, "batch_dtype must be one of"),
    ],
)  # fmt: skip
def test_bad_constructor_arguments(mixed_specs, kwargs, exc, match):
    kwargs = {"capacity": 10, **kwargs}
    with pytest.raises(exc, match=match):
        MultiAgentReplayBuffer(mixed_specs, **kwargs)


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on machines without CUDA")
def test_cuda_without_a_gpu_says_so(mixed_specs):
    with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False.*device='cpu'"):
        MultiAgentReplayBuffer(mixed_specs, 10, device="cuda")


def test_unsupported_samplers_and_predictors(mixed_specs):
    class Custom(Uniform):
        pass

    with pytest.raises(TypeError, match="implements the samplers Uniform, Neighbor"):
        MultiAgentReplayBuffer(mixed_specs, 10, sampler=Custom(), device="cpu")

    class NoTable(RunLengthPredictor):
        def run_lengths_for(self, normalised):
            return np.ones(normalised.shape, np.int64)

        @property
        def max_run_length(self):
            return 1

        def config(self):
            return {}

    with pytest.raises(ValueError, match="step-function predictor"):
        MultiAgentReplayBuffer(
            mixed_specs, 10, sampler=PrioritizedNeighbor(predictor=NoTable()), device="cpu"
        )


def test_numpy_subclass_refuses_a_device(mixed_specs):
    class Mine(MultiAgentReplayBuffer):
        pass

    with pytest.raises(TypeError, match="selects the torch backend only"):
        Mine(mixed_specs, 10, device="cpu")


# --------------------------------------------------------------------------- stored data
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("capacity", "steps"), [(10, 3), (10, 10), (10, 23), (7, 50)])
@pytest.mark.parametrize("one_by_one", [False, True])
@pytest.mark.parametrize("next_obs", ["once", "stored"])
def test_same_table_and_gathers_as_numpy(mixed_specs, device, capacity, steps, one_by_one,
                                         next_obs):  # fmt: skip
    data = random_step_data(mixed_specs, steps, np.random.default_rng(steps))
    if one_by_one:  # every third step continues the previous one: links as well as side rows
        for t in range(1, steps, 3):
            for agent in mixed_specs:
                data["obs"][agent][t] = data["next_obs"][agent][t - 1]
    a, b = pair(mixed_specs, capacity, device, next_obs=next_obs)
    for buf in (a, b):
        if one_by_one:
            for t in range(steps):
                buf.add(**step_slice(data, t))
        else:
            buf.extend(**data)
    assert (len(b), b.cursor, b.total_writes, b.size) == (len(a), a.cursor, a.total_writes, a.size)
    np.testing.assert_array_equal(b.write_generation, a.write_generation)
    filled = len(a)  # the NumPy table's unwritten rows are uninitialised memory
    assert host(b.table[:filled]).view(np.uint64).tobytes() == a.storage.table[:filled].tobytes()
    assert_same_links(a, b)
    idx = np.random.default_rng(0).integers(0, len(a), 40)
    ga, gb = a.gather(idx), b.gather(idx)
    assert isinstance(gb, DeviceBatch) and gb.device.type == device
    assert_same_batch(ga, gb, mixed_specs)
    np.testing.assert_array_equal(host(gb.indices), ga.indices)
    np.testing.assert_array_equal(host(gb.generations), ga.generations)
    assert_same_batch(a.latest(len(a)), b.latest(len(b)), mixed_specs)
    for f in FIELDS:
        for agent in mixed_specs:
            np.testing.assert_array_equal(host(b.stored(f)[agent]), a.stored(f)[agent])
    for agent, (mean, std) in a.reward_stats().items():
        assert b.reward_stats()[agent] == pytest.approx((mean, std), rel=1e-12)


def test_add_envs_lists_and_discrete_actions(mixed_specs):
    a, b = pair(mixed_specs, 8)
    step = step_slice(random_step_data(mixed_specs, 1, np.random.default_rng(0)), 0)
    step["action"]["prey_0"] = 2
    for buf in (a, b):
        buf.add(**{f: [per[agent] for agent in mixed_specs] for f, per in step.items()})
    np.testing.assert_array_equal(host(b.gather([0]).action["prey_0"][0]), [0, 0, 1, 0])
    envs = random_step_data(mixed_specs, 3, np.random.default_rng(1))
    for buf in (a, b):
        buf.add_envs(**envs)
    assert_same_batch(a.gather(np.arange(4)), b.gather(np.arange(4)), mixed_specs)


def _one_step(specs):
    return step_slice(random_step_data(specs, 1, np.random.default_rng(0)), 0)


@pytest.mark.parametrize(
    ("mutate", "exc", "match"),
    [
        (lambda s: s["obs"].pop("pred_0"), ValueError, r"missing \['pred_0'\]"),
        (lambda s: s["obs"].update(pred_0=np.zeros(15)), ValueError, r"shape \(16,\); got \(15,\)"),
        (lambda s: s["reward"].update(pred_0=np.nan), ValueError, "NaN or inf"),
        (lambda s: s["obs"].update(pred_0=np.array(["x"] * 16)), TypeError, "must be numeric"),
        (lambda s: s.update(done="yes"), TypeError, "dict keyed by agent"),
        (lambda s: s["action"].update(prey_0=4), ValueError, r"outside \[0, 4\)"),
    ],
)
def test_bad_add_is_rejected_and_nothing_written(mixed_specs, mutate, exc, match):
    buf = MultiAgentReplayBuffer(mixed_specs, 4, device="cpu")
    buf.add(**_one_step(mixed_specs))
    before = buf.table.clone()
    step = _one_step(mixed_specs)
    mutate(step)
    with pytest.raises(exc, match=match):
        buf.add(**step)
    assert len(buf) == 1 and buf.cursor == 1 and buf.total_writes == 1
    assert torch.equal(buf.table, before)


def test_bad_extend(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 8, device="cpu")
    data = random_step_data(mixed_specs, 5, np.random.default_rng(0))
    data["reward"]["pred_1"] = data["reward"]["pred_1"][:4]
    with pytest.raises(ValueError, match="same number of timesteps"):
        buf.extend(**data)
    data = random_step_data(mixed_specs, 5, np.random.default_rng(0))
    data["action"]["pred_0"][3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        buf.extend(**data)
    with pytest.raises(ValueError, match="leading time axis"):
        buf.extend(**_one_step(mixed_specs))
    assert len(buf) == 0 and not buf.table.any()


# --------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("next_obs", ["once", "stored"])
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
def test_batches_hold_the_rows_of_their_indices(mixed_specs, device, sampler, next_obs,
                                                batch_layout):  # fmt: skip
    data = random_step_data(mixed_specs, 30, np.random.default_rng(0))
    for agent in mixed_specs:  # one episode of linked steps, with boundaries
        data["obs"][agent][1:20] = data["next_obs"][agent][:19]
    a, b = pair(mixed_specs, 24, device, sampler, next_obs=next_obs, batch_layout=batch_layout)
    a.extend(**data)
    b.extend(**data)
    batches = [b.sample(16, trainer=1), *b.sample_for_trainers(16), *b.iter_trainers(16)]
    for batch in batches:
        assert len(batch) == 16 and batch.indices.device.type == device
        assert_same_batch(a.gather(host(batch.indices)), batch, mixed_specs)
        np.testing.assert_array_equal(
            host(batch.generations), a.write_generation[host(batch.indices)]
        )
        assert (batch.weights is None) == (not a.sampler.weighted)
        if batch.weights is not None:
            assert batch.weights.dtype == torch.float32 and float(batch.weights.max()) == 1.0


def test_same_seed_same_draws_and_round_equals_stream(mixed_specs):
    data = random_step_data(mixed_specs, 50, np.random.default_rng(0))
    for make in SAMPLERS:
        runs = []
        for _ in range(3):
            buf = MultiAgentReplayBuffer(mixed_specs, 64, sampler=make(), seed=9, device="cpu")
            buf.extend(**data)
            runs.append(buf)
        rounds = [[host(x.indices) for x in runs[k].sample_for_trainers(16)] for k in (0, 1)]
        stream = [host(x.indices) for x in runs[2].iter_trainers(16)]
        for x, y, z in zip(*rounds, stream):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, z)


def test_sample_for_trainers_per_trainer_and_shared_index(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 100, seed=0, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 100, np.random.default_rng(0)))
    batches = buf.sample_for_trainers(32)
    assert [b.trainer for b in batches] == [0, 1, 2]
    assert not torch.equal(batches[0].indices, batches[1].indices)
    rows = stack_span(batches, "obs", "action")  # float32 and float64 obs: a stacked copy
    assert rows.shape == (3, 32, 16 + 6 + 14 + 5 + 5 + 4)
    for t, batch in enumerate(batches):
        assert torch.equal(rows[t], batch.concat("obs", "action"))
    same = {f"a{i}": AgentSpec((18,), (5,)) for i in range(3)}
    buf2 = MultiAgentReplayBuffer(same, 100, seed=0, device="cpu")
    buf2.extend(**random_step_data(same, 100, np.random.default_rng(0)))
    batches2 = buf2.sample_for_trainers(32)
    rows = stack_span(batches2, "obs", "action")
    assert rows.data_ptr() == batches2[0].block.data_ptr()  # a view of the round's rows
    for t, batch in enumerate(batches2):
        assert torch.equal(rows[t], batch.concat("obs", "action"))
    shared = buf.sample_for_trainers(32, shared_index=True)
    assert all(b is shared[0] for b in shared)
    assert len(buf.sample_for_trainers(32, n_trainers=2)) == 2


def test_concat_is_a_zero_copy_view(mixed_specs):
    specs = {f"a{i}": AgentSpec((18,), (5,)) for i in range(3)}
    buf = MultiAgentReplayBuffer(specs, 100, device="cpu")
    buf.extend(**random_step_data(specs, 10, np.random.default_rng(0)))
    batch = buf.sample(8)
    joint = batch.concat("obs", "action")
    assert joint.shape == (8, 69) and joint.data_ptr() == batch.block.data_ptr()
    expected = torch.cat([batch.obs[a] for a in specs] + [batch.action[a] for a in specs], 1)
    assert torch.equal(joint, expected)
    assert batch.block.data_ptr() % 64 == 0
    mixed = MultiAgentReplayBuffer(mixed_specs, 10, device="cpu")  # obs of float32 and float64
    mixed.extend(**random_step_data(mixed_specs, 10, np.random.default_rng(0)))
    b = mixed.sample(4)
    assert b.concat("obs").shape == (4, 16 + 6 + 14)
    with pytest.raises(ValueError, match="at least one field"):
        b.concat()
    lists = b.as_lists()
    assert [len(x) for x in lists] == [3] * 5 and lists[2][0].shape == (4,)
    assert b.agents == list(mixed_specs) and lists[0][1] is b.obs["pred_1"]


@pytest.mark.parametrize("device", DEVICES)
def test_per_agent_batches_are_contiguous_and_equal(mixed_specs, device):
    data = random_step_data(mixed_specs, 40, np.random.default_rng(0))
    rows = MultiAgentReplayBuffer(mixed_specs, 32, seed=5, device=device)
    per = MultiAgentReplayBuffer(mixed_specs, 32, seed=5, device=device, batch_layout="per_agent")
    ref = MultiAgentReplayBuffer(mixed_specs, 32, seed=5, batch_layout="per_agent")
    for buf in (rows, per, ref):
        buf.extend(**data)
    a, b = rows.sample(16), per.sample(16)
    assert torch.equal(a.indices, b.indices)
    for f in FIELDS:
        for agent in mixed_specs:
            assert b.field(f)[agent].is_contiguous()
            assert torch.equal(a.field(f)[agent], b.field(f)[agent])
    assert host(b.block).tobytes()[:64] == ref.gather(host(b.indices)).block.tobytes()[:64]
    assert torch.equal(a.concat("obs", "action"), b.concat("obs", "action"))
    again = per.sample(16, out=b)
    assert again.block.data_ptr() == b.block.data_ptr()
    assert_same_batch(ref.gather(host(again.indices)), again, mixed_specs)


def test_out_reuses_memory_and_checks_it(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 50, seed=0, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 50, np.random.default_rng(1)))
    first = buf.sample(16)
    second = buf.sample(16, out=first)
    assert second.block.data_ptr() == first.block.data_ptr()
    assert torch.equal(second.obs["pred_0"], buf.gather(second.indices).obs["pred_0"])
    round_ = buf.sample_for_trainers(16)
    again = buf.sample_for_trainers(16, out=round_)
    assert again[0].block.data_ptr() == round_[0].block.data_ptr()  # the round block reused
    with pytest.raises(ValueError, match=r"out holds a block of shape \(16, "):
        buf.sample(8, out=first)
    with pytest.raises(TypeError, match="out must be a DeviceBatch"):
        buf.sample(16, out=object())
    with pytest.raises(ValueError, match="more than once"):
        buf.sample_for_trainers(16, out=[first, first, second])
    with pytest.raises(ValueError, match="out must hold 3 batches"):
        buf.sample_for_trainers(16, out=[first])


def test_held_batches_are_never_overwritten_and_memory_is_recycled(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 64, seed=0, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 64, np.random.default_rng(0)))
    held = [buf.sample(16) for _ in range(30)]  # more than the pool keeps
    snapshots = [b.obs["pred_0"].clone() for b in held]
    for _ in range(30):
        buf.sample_for_trainers(16)
    for batch, snap in zip(held, snapshots):
        assert torch.equal(batch.obs["pred_0"], snap)
    del held, batch
    first = buf.sample(16)
    address = first.block.data_ptr()
    del first
    assert buf.sample(16).block.data_ptr() == address  # the pool handed the block out again
    kept = buf.sample(16).reward["prey_0"]  # a surviving view pins its block
    assert buf.sample(16).block.data_ptr() != kept.data_ptr()


def test_neighbor_runs(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 1000, sampler=Neighbor(8), seed=0, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 40, np.random.default_rng(0)))
    for _ in range(100):
        idx = host(buf.sample(16).indices)
        assert idx.max() < 40
        np.testing.assert_array_equal(np.diff(idx.reshape(-1, 8), axis=1), 1)
    with pytest.raises(ValueError, match=r"batch_size=64 needs distinct slots.*holds 40"):
        buf.sample(64)
    with pytest.raises(ValueError, match=r"run_length=8 must divide batch_size=12"):
        buf.sample(12)
    wrap = MultiAgentReplayBuffer(mixed_specs, 20, sampler=Neighbor(5), seed=0, device="cpu")
    ref = MultiAgentReplayBuffer(mixed_specs, 20)
    data = random_step_data(mixed_specs, 27, np.random.default_rng(0))
    wrap.extend(**data)
    ref.extend(**data)
    seen_wrap = False
    for _ in range(100):
        batch = wrap.sample(10)
        runs = host(batch.indices).reshape(-1, 5)
        np.testing.assert_array_equal(np.diff(runs, axis=1) % 20, 1)
        seen_wrap |= bool((runs[:, -1] < runs[:, 0]).any())
        assert_same_batch(ref.gather(host(batch.indices)), batch, mixed_specs)  # block gathers
    assert seen_wrap


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "sampler", [Uniform(), Uniform(replace=False), Neighbor(1), Neighbor(8), Neighbor(32)]
)
def test_full_buffer_slots_are_equally_likely(mixed_specs, device, sampler):
    capacity = 64
    buf = MultiAgentReplayBuffer(mixed_specs, capacity, sampler=sampler, seed=1234, device=device)
    buf.extend(**random_step_data(mixed_specs, capacity + 13, np.random.default_rng(0)))
    counts = np.zeros(capacity)
    for _ in range(200):
        for batch in buf.sample_for_trainers(32):
            np.add.at(counts, host(batch.indices), 1)
    assert chi2_pvalue(counts, np.full(capacity, counts.sum() / capacity)) > 1e-3


def test_uniform_without_replacement_has_no_duplicates(mixed_specs):
    buf = MultiAgentReplayBuffer(
        mixed_specs, 50, sampler=Uniform(replace=False), seed=0, device="cpu"
    )
    buf.extend(**random_step_data(mixed_specs, 30, np.random.default_rng(0)))
    for _ in range(20):
        idx = host(buf.sample(30).indices)
        assert len(set(idx.tolist())) == 30 and idx.max() < 30
    with pytest.raises(ValueError, match="batch_size=31"):
        buf.sample(31)


def test_bad_sample_arguments(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 100, sampler=Neighbor(8), device="cpu")
    with pytest.raises(ValueError, match="buffer is empty"):
        buf.sample(8)
    buf.extend(**random_step_data(mixed_specs, 50, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="batch_size must be a positive int; got batch_size=0"):
        buf.sample(0)
    with pytest.raises(ValueError, match=r"trainer must be in \[0, 3\)"):
        buf.sample(8, trainer=3)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 50\)"):
        buf.gather([0, 50])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 50\)"):
        buf.gather(torch.tensor([0, 50]))
    with pytest.raises(TypeError, match="1-D integer array"):
        buf.gather([0.5])
    with pytest.raises(TypeError, match="1-D integer array"):
        buf.gather(torch.zeros((2, 2), dtype=torch.int64))
    with pytest.raises(TypeError, match="keeps no priorities"):
        buf.update_priorities([0], [1.0])
    with pytest.raises(ValueError, match=r"n must be in \[1, 50\]"):
        buf.latest(51)
    with pytest.raises(ValueError, match="field must be one of"):
        buf.stored("obz")
    with pytest.raises(ValueError, match=r"n_trainers must be in \[1, 3\]"):
        buf.sample_for_trainers(8, n_trainers=4)


# --------------------------------------------------------------------------- prioritized
def steps(count, start=0):
    """``count`` timesteps whose obs encode their step number."""
    value = np.arange(start, start + count, dtype=np.float32)
    return {
        "obs": {a: np.repeat(value[:, None], 3, axis=1) for a in SPECS2},
        "action": {a: np.zeros((count, 2), np.float32) for a in SPECS2},
        "reward": {a: value.copy() for a in SPECS2},
        "next_obs": {a: np.zeros((count, 3), np.float32) for a in SPECS2},
        "done": {a: np.zeros(count, np.float32) for a in SPECS2},
    }


def ppair(sampler, capacity=64, filled=64, device="cpu", **kw):
    """A NumPy and a torch buffer with copies of ``sampler``, filled alike."""
    out = []
    for dev in (None, device):
        s = type(sampler)(**sampler.config())
        buf = MultiAgentReplayBuffer(SPECS2, capacity, sampler=s, seed=0, device=dev, **kw)
        if filled:
            buf.extend(**steps(filled))
        out.append(buf)
    return out


def set_priorities(bufs, priorities, trainer=0):
    idx = np.arange(priorities.shape[0], dtype=np.int64)
    for buf in bufs:
        buf.update_priorities(idx, priorities, trainer=trainer)


@pytest.mark.parametrize("device", DEVICES)
def test_per_frequencies_and_weights(device):
    a, b = ppair(Prioritized(alpha=0.6, beta=0.4), capacity=50, filled=40, device=device)
    priorities = np.random.default_rng(2).uniform(0.05, 3.0, size=40)
    set_priorities((a, b), priorities, trainer=1)
    np.testing.assert_allclose(
        host(b.device_sampler.leaf_view()[1]), a.sampler.trees.leaves(1), rtol=1e-14
    )
    counts = np.zeros(50)
    for _ in range(60):
        batch = b.sample(1000, trainer=1)
        counts += np.bincount(host(batch.indices), minlength=50)
    assert counts[40:].sum() == 0  # unwritten slots
    probability = (priorities + 1e-6) ** 0.6
    probability /= probability.sum()
    assert chi2_pvalue(counts[:40], probability * counts.sum()) > 1e-3
    batch = b.sample(200, trainer=1)
    raw = (40 * probability[host(batch.indices)]) ** -0.4
    np.testing.assert_allclose(host(batch.weights), raw / raw.max(), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("capacity", "filled"), [(48, 48), (48, 30), (53, 120)])
def test_locality_inclusion_probabilities_and_frequencies(device, capacity, filled):
    a, b = ppair(PrioritizedNeighbor(alpha=0.6, beta=0.5), capacity, filled, device)
    size = len(a)
    set_priorities((a, b), np.random.default_rng(4).uniform(0.0, 2.0, size=size))
    want = a.sampler.inclusion_probabilities(size)
    got = host(b.device_sampler.inclusion_probabilities(size))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    if capacity == 48 and filled == 48:
        return  # the frequencies of the filling and the wrapping case suffice
    # one row per batch at a random position: independent draws distributed as P(j)
    position_rng = np.random.default_rng(5)
    picked = np.empty(700, np.int64)
    for k in range(picked.shape[0]):
        idx = host(b.sample(64).indices)
        assert idx.max() < size
        picked[k] = idx[position_rng.integers(64)]
    counts = np.bincount(picked, minlength=capacity)
    assert chi2_pvalue(counts[:size], want[:size] * len(picked)) > 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("filled", [64, 40])
def test_locality_weights_equal_formula(device, filled):
    a, b = ppair(PrioritizedNeighbor(alpha=0.6, beta=0.8), 64, filled, device)
    set_priorities((a, b), np.random.default_rng(6).uniform(0.0, 3.0, size=filled))
    probability = a.sampler.inclusion_probabilities(filled)
    batch = b.sample(256)
    raw = (filled * probability[host(batch.indices)]) ** -0.8
    np.testing.assert_allclose(host(batch.weights), raw / raw.max(), rtol=1e-5)


def test_inherit_weights_and_runs():
    sampler = PrioritizedNeighbor(alpha=1.0, beta=0.7, weights="inherit", run_lengths=(3, 3, 3))
    a, b = ppair(sampler)
    set_priorities((a, b), np.random.default_rng(7).uniform(0.5, 3.0, size=64))
    batch = b.sample(129)
    idx = host(batch.indices)
    refs = idx[::3]
    np.testing.assert_array_equal(idx.reshape(43, 3), (refs[:, None] + [0, 1, 2]) % 64)
    leaves = a.sampler.trees.leaves(0)[refs]
    np.testing.assert_allclose(host(batch.weights), np.repeat((leaves.min() / leaves) ** 0.7, 3),
                               rtol=1e-6)  # fmt: skip


def test_runs_stop_at_the_write_head_and_wrap_once_full():
    sampler = PrioritizedNeighbor(thresholds=(0.5,), run_lengths=(1, 4))
    _, b = ppair(sampler, capacity=100, filled=6)
    for _ in range(30):
        batch = b.sample(64)
        assert int(batch.indices.max()) < 6
        assert torch.equal(batch.obs["agent_0"][:, 0].long(), batch.indices)
    a, b = ppair(sampler, capacity=10, filled=10)
    priorities = np.full(10, 0.01)
    priorities[9] = 1.0  # the last slot, long runs: 9, 0, 1, 2
    set_priorities((a, b), priorities)
    idx = host(b.sample(400).indices)
    assert np.any((idx[:-1] == 9) & (idx[1:] == 0))


def test_new_slots_enter_with_running_max_and_priority_modes():
    a, b = ppair(Prioritized(alpha=1.0, eps=0.0), capacity=20, filled=10)
    for buf in (a, b):
        buf.update_priorities(np.array([3, 4]), np.array([7.0, -2.0]), trainer=0)
        buf.extend(**steps(2, start=10))
    leaves = host(b.device_sampler.leaf_view())
    np.testing.assert_array_equal(leaves[0, 10:12], [7.0, 7.0])
    np.testing.assert_array_equal(leaves[1, 10:12], [1.0, 1.0])
    assert leaves[0, 4] == 2.0
    np.testing.assert_array_equal(leaves, np.stack([a.sampler.trees.leaves(t) for t in (0, 1)]))
    for priority in ("abs", "squared", "given"):
        _, b = ppair(Prioritized(alpha=1.0, eps=0.5, priority=priority), 8, 8)
        td = np.array([0.0, 2.0, 3.0])
        b.update_priorities(np.array([0, 1, 2]), torch.tensor(td), trainer=1)
        want = {"abs": td + 0.5, "squared": td**2 + 0.5, "given": td + 0.5}[priority]
        np.testing.assert_array_equal(host(b.device_sampler.leaf_view()[1, :3]), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [Prioritized, PrioritizedNeighbor])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_stale_updates_are_dropped(device, cls, as_tensor):
    _, b = ppair(cls(alpha=1.0, eps=0.0), capacity=16, filled=16, device=device)
    indices = np.array([0, 1, 2, 8, 9], np.int64)
    batch = b.gather(indices, trainer=0)
    b.extend(**steps(2, start=16))  # overwrites slots 0 and 1 (max priority 1)
    conv = (lambda x: torch.as_tensor(x, device=device)) if as_tensor else (lambda x: x)
    gens = batch.generations if as_tensor else host(batch.generations)
    b.update_priorities(conv(indices), conv(np.full(5, 5.0)), trainer=0, generations=gens)
    leaves = host(b.device_sampler.leaf_view()[0])
    np.testing.assert_array_equal(leaves[indices], [1.0, 1.0, 5.0, 5.0, 5.0])
    # without generations: the buffer remembers what it handed to trainer 0
    batch = b.gather(np.array([2, 3]), trainer=0)
    b.extend(**steps(2, start=18))  # overwrites slots 2 and 3
    b.update_priorities(conv(np.array([2, 3, 10])), conv(np.full(3, 9.0)), trainer=0)
    np.testing.assert_array_equal(host(b.device_sampler.leaf_view()[0])[[2, 3, 10]], [5, 5, 9])


def test_duplicate_indices_last_kept_entry_wins():
    a, b = ppair(Prioritized(alpha=1.0, eps=0.0))
    idx = np.array([5, 7, 5, 5, 7, 9])
    td = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    for buf in (a, b):
        buf.update_priorities(idx, td, trainer=0)
    np.testing.assert_array_equal(host(b.device_sampler.leaf_view()[0]), a.sampler.trees.leaves(0))
    assert host(b.device_sampler.leaf_view()[0])[[5, 7, 9]].tolist() == [4.0, 5.0, 6.0]
    assert float(b.device_sampler.max_priority[0]) == a.sampler.trees.max_priority[0] == 6.0


def test_batched_update_equals_per_trainer_updates():
    sampler = PrioritizedNeighbor(alpha=0.7)
    _, one = ppair(sampler, n_trainers=3)
    _, many = ppair(sampler, n_trainers=3)
    rng = np.random.default_rng(0)
    idx = [rng.integers(0, 64, 32) for _ in range(3)]
    td = [torch.tensor(rng.normal(size=32)) for _ in range(3)]
    for t in range(3):
        one.update_priorities(idx[t], td[t], trainer=t)
    many.update_priorities_for_trainers([torch.as_tensor(i) for i in idx], td, sync=False)
    many.check_priority_errors()
    for x, y in ((one.device_sampler.leaves, many.device_sampler.leaves),
                 (one.device_sampler.priorities, many.device_sampler.priorities)):  # fmt: skip
        assert torch.equal(x[:, :64], y[:, :64])
    assert torch.equal(one.device_sampler.max_priority, many.device_sampler.max_priority)
    with pytest.raises(ValueError, match="one entry per trainer"):
        many.update_priorities_for_trainers([], [])
    with pytest.raises(ValueError, match="same length"):
        many.update_priorities_for_trainers([idx[0], idx[1][:3]], [td[0], td[1][:3]])


@pytest.mark.parametrize("cls", [Prioritized, PrioritizedNeighbor])
@pytest.mark.parametrize(
    ("td", "error", "match"),
    [
        (np.array([1.0, np.nan, 1.0]), ValueError, r"finite; got td_errors\[1\]=nan"),
        (np.array([1.0, 1.0, np.inf]), ValueError, r"finite; got td_errors\[2\]=inf"),
        (np.array([1.0, 1.0]), ValueError, "td_errors must have shape"),
        (np.ones((3, 1)), ValueError, "td_errors must have shape"),
        (np.array(["a", "b", "c"]), TypeError, "td_errors must be a real numeric"),
    ],
)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_bad_td_errors_change_nothing(cls, td, error, match, as_tensor):
    if as_tensor and td.dtype.kind not in "f":
        pytest.skip("torch holds no strings")
    _, b = ppair(cls(), capacity=16, filled=16)
    sampler = b.device_sampler
    before = sampler.leaves.clone()
    value = torch.as_tensor(td) if as_tensor else td
    with pytest.raises(error, match=match):
        b.update_priorities(np.array([0, 1, 2]), value, trainer=0)
    assert torch.equal(sampler.leaves[:, :16], before[:, :16])
    assert float(sampler.max_priority[0]) == 1.0


def test_deferred_checks_raise_later_and_change_nothing():
    _, b = ppair(Prioritized(priority="given"), capacity=16, filled=10)
    sampler = b.device_sampler
    before = sampler.leaves.clone()
    b.update_priorities(torch.tensor([0, 12]), torch.tensor([1.0, 1.0]), sync=False)
    b.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, -1.0]), sync=False)
    b.update_priorities(torch.tensor([3]), torch.tensor([2.0]), sync=False)  # a valid one
    assert torch.equal(sampler.leaves[:, :3], before[:, :3])
    assert float(sampler.leaves[0, 3]) == pytest.approx(2.0**0.6)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\).*min 0, max 12"):
        b.check_priority_errors()
    b.check_priority_errors()  # reported once
    with pytest.raises(ValueError, match=r"priorities must be >= 0 with priority='given'"):
        b.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        b.update_priorities(np.array([0, 12]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"trainer must be in \[0, 2\)"):
        b.update_priorities(np.array([0, 1]), np.array([1.0, 1.0]), trainer=5)
    with pytest.raises(ValueError, match="generations must be an integer array"):
        b.update_priorities(np.array([0, 1]), np.array([1.0, 1.0]), generations=[0.5, 1.0])
    assert torch.equal(sampler.leaves[:, :3], before[:, :3])


def test_all_zero_priorities_and_linear_beta():
    _, b = ppair(Prioritized(eps=0.0), capacity=8, filled=0)
    with pytest.raises(ValueError, match="buffer is empty"):
        b.sample(4)
    b.extend(**steps(4))
    b.update_priorities(np.arange(4), np.zeros(4), trainer=0)
    with pytest.raises(ValueError, match="every priority of trainer 0 is 0"):
        b.sample(4, trainer=0)
    assert len(b.sample(4, trainer=1)) == 4
    _, b = ppair(Prioritized(beta=LinearBeta(0.5, 1.0, steps=2)), capacity=16, filled=16)
    sampler = b.device_sampler
    assert sampler.beta_for(0) == 0.5
    b.sample(4, trainer=0)
    assert sampler.beta_for(0) == 0.75 and sampler.beta_for(1) == 0.5
    b.sample_for_trainers(4)  # trainers at different points of the schedule in one round
    assert sampler.beta_for(0) == 1.0 and sampler.beta_for(1) == 0.75
    with pytest.raises(ValueError, match="shared_index"):
        b.sample_for_trainers(4, shared_index=True)


def test_zero_priority_slots_are_never_sampled():
    _, b = ppair(PrioritizedNeighbor(alpha=1.0, eps=0.0, priority="given"), 32, 32)
    priorities = np.zeros(32)
    priorities[[5, 20]] = 1.0
    set_priorities((b,), priorities)
    seen = set()
    for _ in range(20):
        seen |= set(host(b.sample(50).indices).tolist())
    assert seen <= {5, 6, 7, 8, 20, 21, 22, 23}  # runs of up to 4 from the two references


# --------------------------------------------------------------------------- persistence
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "sampler",
    [
        Uniform(),
        Neighbor(4),
        Prioritized(alpha=0.7, beta=LinearBeta(0.4, 1.0, steps=10), eps=1e-3, priority="squared"),
        PrioritizedNeighbor(beta={"schedule": "linear", "start": 0.3, "end": 0.9, "steps": 5}),
    ],
)
def test_save_on_torch_load_in_numpy_and_back(sampler, device, tmp_path):
    _, b = ppair(sampler, capacity=40, filled=70, device=device)
    if sampler.weighted:
        for trainer in range(2):
            batch = b.sample(16, trainer=trainer)
            td = torch.as_tensor(np.random.default_rng(trainer).normal(size=16), device=device)
            b.update_priorities(batch.indices, td, trainer=trainer, generations=batch.generations)
    path = tmp_path / "torch.npz"
    b.save(path)
    a = MultiAgentReplayBuffer.load(path)  # the NumPy buffer reads it
    assert type(a) is MultiAgentReplayBuffer and type(a.sampler) is type(sampler)
    assert a.storage.table.tobytes() == host(b.table[:40]).tobytes()
    assert (a.cursor, a.size, a.total_writes) == (b.cursor, b.size, b.total_writes)
    if sampler.weighted:
        state = b.device_sampler.state_dict()
        np.testing.assert_array_equal(a.sampler.trees.leaves(1), state["leaves"][1])
        np.testing.assert_array_equal(a.sampler.batches_drawn, state["batches_drawn"])
    a.save(tmp_path / "numpy.npz")
    for dev in ("cpu", device):  # and back, on either device
        c = TorchReplayBuffer.load(tmp_path / "numpy.npz", device=dev)
        assert torch.equal(c.table[:40].cpu(), b.table[:40].cpu())
        assert c.device_sampler.state_dict().keys() == b.device_sampler.state_dict().keys()
        for key, value in c.device_sampler.state_dict().items():
            np.testing.assert_array_equal(value, b.device_sampler.state_dict()[key])
    same = TorchReplayBuffer.load(path, device=device)  # same device type: the same draws
    for trainer in range(2):
        x, y = b.sample(32, trainer=trainer), same.sample(32, trainer=trainer)
        assert torch.equal(x.indices, y.indices)
        if x.weights is not None:
            assert torch.equal(x.weights, y.weights)


def test_agent_major_state_and_mismatches():
    specs = SPECS2
    a = MultiAgentReplayBuffer(specs, 20, layout="agent_major", seed=0)
    a.extend(**steps(25))
    b = MultiAgentReplayBuffer(specs, 20, device="cpu")
    b.load_state_dict(a.state_dict())
    assert_same_batch(a.gather(np.arange(20)), b.gather(np.arange(20)), specs)
    with pytest.raises(ValueError, match="capacity is 10 here, 20 in the state"):
        MultiAgentReplayBuffer(specs, 10, device="cpu").load_state_dict(a.state_dict())
    state = b.state_dict()
    state["storage"] = {"table": state["storage"]["table"][:3]}
    with pytest.raises(ValueError, match="storage array 'table' has shape"):
        b.load_state_dict(state)
    with pytest.raises(ValueError, match="not a marlbuf buffer state"):
        b.load_state_dict({"format": "x"})


def test_checkpoint_straight_into_the_table(tmp_path):
    from marlbuf import persistence

    _, b = ppair(Uniform(), capacity=30, filled=45)
    b.save(tmp_path / "b.npz")
    c = MultiAgentReplayBuffer(SPECS2, 30, device="cpu")
    persistence.load_into(c, tmp_path / "b.npz")
    assert torch.equal(c.table, b.table) and c.cursor == b.cursor
    assert torch.equal(c.sample(8).indices, b.sample(8).indices)


@contextlib.contextmanager
def _device_waits_raise() -> Iterator[None]:
    """Inside the block, any operation that waits for the GPU raises (torch's sync debug mode
    "error"); the mode is always reset. Some torch versions warn that the mode is a
    prototype when it is set: that notice is not a failure."""
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("default")


# --------------------------------------------------------------------------- CUDA specifics
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("half", [False, True])  # observations stored once (the default)
def test_cuda_round_never_waits_for_the_device(mixed_specs, half):
    specs = HALF if half else mixed_specs
    buf = MultiAgentReplayBuffer(specs, 256, sampler=PrioritizedNeighbor(), seed=0, device="cuda")
    buf.extend(**random_step_data(specs, 300, np.random.default_rng(0)))
    buf.sample_for_trainers(64)  # warm-up (prefix sums, lazy CUDA state)
    with _device_waits_raise():
        for _ in range(3):
            batches = buf.sample_for_trainers(64)
            td = torch.stack([b.weights.double() for b in batches])
            buf.update_priorities_for_trainers(
                [b.indices for b in batches], td, [b.generations for b in batches], sync=False
            )
    buf.check_priority_errors()


# --------------------------------------------------------------------------- trainers
def _learner_pair(algo, sampler, device="cpu", half=False):
    from marlbuf.algos import BatchedLearner, TrainConfig
    from marlbuf.algos.device import DeviceBatchedLearner
    from marlbuf.bench.workloads import Workload

    workload = Workload("predator_prey", 3)
    specs = workload.specs()
    if half:  # float16 observations, float32 batches (what --obs-dtype float16 stores)
        specs = {a: AgentSpec(s.obs_shape, s.action_shape, obs_dtype="float16")
                 for a, s in specs.items()}  # fmt: skip
    cfg = TrainConfig(algo=algo, batch_size=32, buffer_size=500, warmup_steps=32, device=device)
    dims = workload.obs_dims()
    host_learner = BatchedLearner(cfg, dims, 5, seed=3)
    device_learner = DeviceBatchedLearner(cfg, dims, 5, seed=3)
    a = MultiAgentReplayBuffer(specs, 300, sampler=sampler(), seed=0)
    b = MultiAgentReplayBuffer(specs, 300, sampler=sampler(), seed=0, device=device)
    data = random_step_data(specs, 300, np.random.default_rng(0))
    a.extend(**data)
    b.extend(**data)
    return host_learner, device_learner, a, b


@pytest.mark.parametrize(
    ("algo", "sampler", "half"),
    [("maddpg", Uniform, False), ("matd3", PrioritizedNeighbor, False), ("maddpg", Uniform, True)],
)
def test_device_learner_gives_the_batched_learners_numbers(algo, sampler, half):
    host_learner, device_learner, a, b = _learner_pair(algo, sampler, half=half)
    for _ in range(2):
        batches = b.sample_for_trainers(32)
        host_batches = []
        for batch in batches:
            hb = a.gather(host(batch.indices))
            hb.weights = None if batch.weights is None else host(batch.weights)
            host_batches.append(hb)
        want = host_learner.update(host_batches)
        got = device_learner.update_device(batches).to_host()
        np.testing.assert_allclose(got.critic_loss, want.critic_loss, rtol=1e-5)
        np.testing.assert_allclose(got.actor_loss, want.actor_loss, rtol=1e-5)
        for x, y in zip(got.td_errors, want.td_errors):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
        assert got.actor_updated == want.actor_updated
    for p, q in zip(device_learner.get_params(), host_learner.get_params()):
        for key in p:
            torch.testing.assert_close(p[key], q[key], rtol=1e-4, atol=1e-6)


def test_device_learner_on_batches_that_are_not_one_round():
    host_learner, device_learner, a, b = _learner_pair("maddpg", Uniform)
    batches = [b.sample(32, trainer=t) for t in range(4)]  # four rounds of one: stacked copies
    host_batches = [a.gather(host(x.indices)) for x in batches]
    got = device_learner.update_device(batches).to_host()
    want = host_learner.update(host_batches)
    np.testing.assert_allclose(got.critic_loss, want.critic_loss, rtol=1e-5)


def test_train_with_a_device_buffer_resumes_exactly(tmp_path):
    pytest.importorskip("mpe2")
    from marlbuf.algos.cli import main

    small = ["--batch-size", "32", "--buffer-size", "3000", "--warmup", "100", "--no-progress"]
    small += ["--buffer-device", "cpu", "--sampler", "prioritized_neighbor", "--no-plot"]
    small += ["--beta-anneal-rounds", "5"]  # else it follows --episodes, which differs here
    straight, split = tmp_path / "a", tmp_path / "b"
    assert main(["--episodes", "10", *small, "--out", str(straight)]) == 0
    assert main(["--episodes", "5", *small, "--out", str(split)]) == 0
    assert main(["--episodes", "10", "--resume", *small, "--out", str(split)]) == 0
    read = [(p / "episodes.csv").read_text().splitlines() for p in (straight, split)]
    returns = [[line.split(",")[2] for line in lines[1:]] for lines in read]
    assert len(returns[0]) == 10 and returns[0] == returns[1]


def test_training_with_observations_stored_once_gives_the_dense_numbers(monkeypatch):
    """A short run with a device buffer on the CPU in its default format (observations stored
    once) and with next_obs in every row: the same batches, so the same returns, losses and
    networks (same seeds). float16 observations train on a device buffer too."""
    pytest.importorskip("mpe2")
    from marlbuf.algos import TrainConfig
    from marlbuf.algos import runner as runner_module

    config = {"batch_size": 32, "buffer_size": 3000, "warmup_steps": 100, "algo": "matd3"}
    config |= {"buffer_device": "cpu", "sampler": "prioritized_neighbor"}
    results = []
    for next_obs in ("once", "stored"):
        make = MultiAgentReplayBuffer
        if next_obs == "stored":

            def make(*args, **kwargs):
                return MultiAgentReplayBuffer(*args, next_obs="stored", **kwargs)

        monkeypatch.setattr(runner_module, "MultiAgentReplayBuffer", make)
        runner = runner_module.Runner(TrainConfig(**config))
        assert runner.buffer.next_obs == next_obs
        returns = [r.ret for r in runner.train(8)]
        stats = runner.last_stats.to_host()
        results.append((returns, stats, runner.learner.get_params()))
        runner.close()
    (ret_a, stats_a, params_a), (ret_b, stats_b, params_b) = results
    assert ret_a == ret_b
    np.testing.assert_array_equal(stats_a.critic_loss, stats_b.critic_loss)
    for p, q in zip(params_a, params_b):
        for key in p:
            assert torch.equal(p[key], q[key]), key
    monkeypatch.undo()
    half = runner_module.Runner(TrainConfig(**config, obs_dtype="float16"))
    half.train(4)
    assert half.buffer.specs[half.agents[0]].obs_dtype == np.float16
    assert np.isfinite(half.last_stats.to_host().critic_loss).all()
    half.close()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (["--buffer-device", "cuda"], "buffer_device must be the learner's device"),
        (["--buffer-device", "tpu"], "buffer_device must be None, 'cpu' or 'cuda"),
        (["--buffer-device", "cpu", "--formulation", "loop"], "needs formulation='batched'"),
        (["--buffer-device", "cpu", "--layout", "agent_major"], "layout='interleaved'"),
    ],
)
def test_bad_buffer_device_options_exit_2(tmp_path, capsys, bad, match):
    from marlbuf.algos.cli import main

    out = tmp_path / "never"
    assert main(["--episodes", "1", "--no-progress", "--out", str(out), *bad]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_training_round_never_waits_for_the_device():
    _, learner, _, buf = _learner_pair("matd3", PrioritizedNeighbor, device="cuda")

    def round_() -> Any:
        batches = buf.sample_for_trainers(32)
        stats = learner.update_device(batches)
        buf.update_priorities_for_trainers(
            [b.indices for b in batches],
            stats.td_errors,
            [b.generations for b in batches],
            sync=False,
        )
        return stats

    round_()  # a warm-up round (lazy CUDA and optimizer state)
    with _device_waits_raise():
        for _ in range(3):
            stats = round_()
    buf.check_priority_errors()
    assert np.isfinite(stats.to_host().critic_loss).all()


# --------------------------------------------------------------------------- benchmarks
def _tiny_device_suite(monkeypatch):
    from marlbuf.bench import device as suite
    from marlbuf.bench.workloads import Workload

    tiny = {
        **suite.QUICK,
        "workloads": [Workload("cooperative_navigation", 3)],
        "cpu_workload": Workload("cooperative_navigation", 3),
        "capacity": 2_000,
        "repeats": 1,
        "per_capacity": 3_000,
        "e2e_capacity": 1_000,
        "e2e_batch": 64,
        "e2e_repeats": 1,
    }
    monkeypatch.setattr(suite, "QUICK", tiny)
    return suite


def test_device_suite_runs_tiny(monkeypatch):
    from marlbuf.bench import common

    suite = _tiny_device_suite(monkeypatch)
    payload = suite.run(quick=True, progress=False)
    cpu = [r for r in payload["rows"] if r["part"] == "cpu"]
    assert {r["case"] for r in cpu} >= {
        "numpy buffer",
        "torch backend (cpu)",
        "torch backend (cpu) lean",
    }
    assert all(r["ms_median"] > 0 for r in cpu)
    assert payload["summary"]["cpu"]["torch_cpu_vs_numpy"] > 0
    gpu = [r for r in payload["rows"] if r["part"] == "gpu"]
    assert {r["case"] for r in gpu} == set(suite.GPU_CASES)
    per = {r["case"] for r in payload["rows"] if r["part"] == "per"}
    e2e = {r["case"] for r in payload["rows"] if r["part"] == "e2e"}
    assert per == set(suite.PER_CASES) and e2e == set(suite.E2E_CONFIGS)
    if not HAS_CUDA:
        parts = [r for r in payload["rows"] if r["part"] != "cpu"]
        assert all(r["status"].startswith("not measured: no CUDA device") for r in parts)
    json_text = common.json.dumps(payload, default=common._json_default)
    assert "torch_cpu_vs_numpy" in json_text


def test_device_suite_gpu_parts_run_on_the_cpu(monkeypatch):
    # the GPU cases' code paths, run on the CPU: every marlbuf case is measured
    pytest.importorskip("mpe2")  # the end-to-end part's environments
    suite = _tiny_device_suite(monkeypatch)
    payload = suite.run(quick=True, progress=False, device="cpu")
    rows = {(r["part"], r["case"]): r for r in payload["rows"]}
    for case in ("device buffer", "device buffer+out", "device buffer+prioritized",
                 "device buffer+obs once"):  # fmt: skip
        assert rows["gpu", case]["status"] == "measured" and rows["gpu", case]["ms_median"] > 0
    assert rows["per", "device buffer prioritized"]["status"] == "measured"
    for case in suite.E2E_CONFIGS:
        assert rows["e2e", case]["status"] == "measured", rows["e2e", case]
        assert rows["e2e", case]["ms_median"] > 0
    assert payload["summary"]["e2e_speedup_vs_faithful"]["faithful"] == 1.0
    assert "not a GPU figure" in payload["config"]["gpu"]


def test_device_check_script_needs_no_mpe2_pettingzoo_or_matplotlib(tmp_path):
    # stand-ins that fail to import, ahead of the real packages on the path
    blocked = tmp_path / "blocked"
    for name in ("mpe2", "pettingzoo", "matplotlib"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{name} is blocked')\n"
        )
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OUT": str(out),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(blocked),
        "DEVICE_CHECK_QUICK": "1",
        "WHEELS": str(tmp_path / "no-wheels"),
    }
    done = subprocess.run(
        ["bash", str(root / "bench" / "device_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == (0 if HAS_CUDA else 1), done.stdout + done.stderr
    assert "cuda available" in (out / "environment.txt").read_text()
    tests = (out / "cuda-tests.txt").read_text()
    assert ("skipped" in tests or "passed" in tests) and "error" not in tests.lower()
    import json

    record = json.loads((out / "device-quick.json").read_text())
    assert record["summary"]["cpu"]["torch_cpu_vs_numpy"] > 0


# --------------------------------------------------------------------------- stored once
class Streams:
    """Per stream, the next step's obs: a step's next_obs becomes the stream's next obs unless
    the episode ends (then a reset, which may equal it by chance: few distinct values)."""

    def __init__(self, specs, rng):
        self.specs, self.rng = specs, rng
        self.current = {}

    def _obs(self):
        return {
            a: self.rng.integers(0, 2, s.obs_shape).astype(s.obs_dtype)
            for a, s in self.specs.items()
        }

    def steps(self, stream, count, p_end=0.2):
        out = []
        for _ in range(count):
            obs = self.current.get(stream) or self._obs()
            nxt = self._obs()
            end = self.rng.random() < p_end
            self.current[stream] = self._obs() if end else nxt
            out.append(
                {
                    "obs": obs,
                    "action": {
                        a: self.rng.standard_normal(s.action_shape).astype(s.action_dtype)
                        for a, s in self.specs.items()
                    },
                    "reward": {a: float(self.rng.standard_normal()) for a in self.specs},
                    "next_obs": nxt,
                    "done": {a: float(end) for a in self.specs},
                }
            )
        return out


def stacked(steps):
    return {f: {a: np.stack([np.asarray(x[f][a]) for x in steps]) for a in steps[0][f]}
            for f in FIELDS}  # fmt: skip


def assert_all_slots_equal(ref, buf, specs):
    if len(ref):
        every = np.arange(len(ref))
        assert_same_batch(ref.gather(every), buf.gather(every), specs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
@pytest.mark.parametrize("seed", range(4))
def test_stored_once_streams_equal_numpy(mixed_specs, device, batch_layout, seed):
    """Random writes (add on several streams, extend, add_envs) past wraparound, samples and
    state round trips: the torch buffer keeps the NumPy buffer's lean table and links, its
    device mirror holds them, and every batch equals the dense reference's, bit for bit."""
    rng = np.random.default_rng(seed)
    streams = Streams(mixed_specs, rng)
    capacity = int(rng.integers(5, 14))
    kw = {"batch_layout": batch_layout, "sampler": Neighbor(2), "seed": seed}
    lean = MultiAgentReplayBuffer(mixed_specs, capacity, **kw)
    dense = MultiAgentReplayBuffer(mixed_specs, capacity, next_obs="stored", **kw)
    dev = MultiAgentReplayBuffer(mixed_specs, capacity, device=device, **kw)
    assert dev.next_obs == "once" and dev.links is not None  # the NumPy buffer's default
    for _ in range(30):
        op = rng.choice(["add", "add", "extend", "add_envs", "state"])
        stream = int(rng.integers(0, 3))
        if op == "add":
            (step,) = streams.steps(stream, 1)
            for buf in (lean, dense, dev):
                buf.add(**step, stream=stream)
        elif op == "extend":
            data = stacked(streams.steps(stream, int(rng.integers(1, 2 * capacity))))
            for buf in (lean, dense, dev):
                buf.extend(**data, stream=stream)
        elif op == "add_envs":
            data = stacked([streams.steps(k, 1)[0] for k in range(stream + 1)])
            for buf in (lean, dense, dev):
                buf.add_envs(**data)
        else:
            fresh = MultiAgentReplayBuffer(mixed_specs, capacity, device=device, **kw)
            fresh.load_state_dict(dev.state_dict())
            dev = fresh
        assert_same_links(lean, dev)
        assert host(dev.table[: len(lean)]).tobytes() == lean.storage.table[: len(lean)].tobytes()
        assert_all_slots_equal(dense, dev, mixed_specs)
        if len(dense) >= 4:
            batch = dev.sample(4)
            assert_same_batch(dense.gather(host(batch.indices)), batch, mixed_specs)
    for agent in mixed_specs:
        np.testing.assert_array_equal(
            host(dev.stored("next_obs")[agent]), lean.stored("next_obs")[agent]
        )
        np.testing.assert_array_equal(host(dev.stored("obs")[agent]), lean.stored("obs")[agent])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_side_table_outgrows_its_reserve(mixed_specs, device, sampler):
    """Random steps are all episode ends: the side table holds a row per slot, far beyond the
    reserve (about capacity / 25); the table grows on the device and batches stay exact."""
    dense, dev = pair(mixed_specs, 300, device, sampler, seed=3, next_obs="once")
    reserve = dev._side_rows
    data = random_step_data(mixed_specs, 700, np.random.default_rng(0))
    dense.extend(**data)
    dev.extend(**data)
    for t in range(40):
        step = step_slice(random_step_data(mixed_specs, 1, np.random.default_rng(t)), 0)
        dense.add(**step, stream=1)
        dev.add(**step, stream=1)
    assert dev.links.side_rows_used > reserve and dev._side_rows >= dev.links.side.shape[0]
    assert_all_slots_equal(dense, dev, mixed_specs)
    for batch in dev.sample_for_trainers(32):
        assert_same_batch(dense.gather(host(batch.indices)), batch, mixed_specs)


def test_a_failed_side_growth_is_mended_by_the_next_gather(mixed_specs, monkeypatch):
    """The host links are committed before the device grows its side rows: if the growth
    fails, the write stands (and says so), and the next gather uploads the links whole."""
    lean, dev = pair(mixed_specs, 200, seed=0, next_obs="once")
    reserve = dev._side_rows
    data = random_step_data(mixed_specs, 200, np.random.default_rng(0))

    def refuse(nbytes, what):
        raise MemoryError(f"{what} needs more memory (test)")

    monkeypatch.setattr(dev, "_check_memory", refuse)
    with pytest.raises(MemoryError, match="side table of observations stored once"):
        dev.extend(**data)
    assert len(dev) == 200 and dev._links_stale and dev._side_rows == reserve
    monkeypatch.undo()
    lean.extend(**data)
    assert_all_slots_equal(lean, dev, mixed_specs)  # the gather uploaded the links first
    assert not dev._links_stale
    assert_same_links(lean, dev)


@pytest.mark.parametrize("device", DEVICES)
def test_stored_once_states_load_natively_both_ways(mixed_specs, device, tmp_path, monkeypatch):
    from marlbuf import torch_backend

    def no_conversion(*args):
        raise AssertionError("a state in the buffer's own format was converted")

    monkeypatch.setattr(torch_backend, "_dense_state", no_conversion)
    monkeypatch.setattr(torch_backend, "_lean_state", no_conversion)
    streams = Streams(mixed_specs, np.random.default_rng(5))
    first, more = stacked(streams.steps(0, 30)), stacked(streams.steps(0, 7))
    lean = MultiAgentReplayBuffer(mixed_specs, 16, seed=0, sampler=PrioritizedNeighbor())
    lean.extend(**first)
    dev = MultiAgentReplayBuffer(
        mixed_specs, 16, seed=0, sampler=PrioritizedNeighbor(), device=device
    )
    dev.load_state_dict(lean.state_dict())  # NumPy -> device, lean rows and links as they are
    assert host(dev.table[:16]).tobytes() == lean.storage.table.tobytes()
    assert_same_links(lean, dev)
    lean.save(tmp_path / "lean.npz")
    loaded = TorchReplayBuffer.load(tmp_path / "lean.npz", device=device)
    assert loaded.next_obs == "once"
    assert_same_links(lean, loaded)
    for buf in (lean, dev, loaded):
        buf.extend(**more)  # the stream continues: its pending step links across the load
    assert_same_links(lean, dev)
    assert_same_links(lean, loaded)
    dev.save(tmp_path / "dev.npz")  # device -> NumPy
    back = MultiAgentReplayBuffer.load(tmp_path / "dev.npz")
    assert back.next_obs == "once" and back.storage.table.tobytes() == lean.storage.table.tobytes()
    np.testing.assert_array_equal(back.links.side_row, lean.links.side_row)
    assert_all_slots_equal(lean, loaded, mixed_specs)
    assert_all_slots_equal(back, dev, mixed_specs)
    for trainer in range(2):
        x, y = dev.sample(8, trainer=trainer), loaded.sample(8, trainer=trainer)
        assert torch.equal(x.indices, y.indices)  # the same device generator state


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("source", ["once", "stored"])
def test_states_of_the_other_mode_are_converted(mixed_specs, layout, source):
    streams = Streams(mixed_specs, np.random.default_rng(6))
    data = stacked(streams.steps(0, 23))
    ref = MultiAgentReplayBuffer(mixed_specs, 16, seed=0, layout=layout, next_obs=source)
    ref.extend(**data)
    other = "stored" if source == "once" else "once"
    dev = MultiAgentReplayBuffer(mixed_specs, 16, seed=0, device="cpu", next_obs=other)
    dev.load_state_dict(ref.state_dict())
    assert (dev.cursor, dev.size, dev.total_writes) == (ref.cursor, ref.size, ref.total_writes)
    assert_all_slots_equal(ref, dev, mixed_specs)
    if other == "once":  # linked where consecutive, side rows at the episode ends
        assert 0 < dev.links.side_rows_used < 16
        more = stacked(streams.steps(0, 5))
        ref.extend(**more)
        dev.extend(**more)
        assert_all_slots_equal(ref, dev, mixed_specs)
        assert dev.links.side_rows_used < 16


# --------------------------------------------------------------------------- half precision
def _half_data(steps, seed):
    data = random_step_data(HALF, steps, np.random.default_rng(seed))  # in the spec dtypes
    for agent in HALF:  # linked steps: each obs is the previous step's next_obs
        data["obs"][agent][3:9] = data["next_obs"][agent][2:8]
    return data


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("next_obs", ["once", "stored"])
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
@pytest.mark.parametrize("batch_dtype", ["float32", "storage"])
def test_half_storage_gives_the_numpy_buffers_batches(device, next_obs, batch_layout,
                                                      batch_dtype):  # fmt: skip
    data = _half_data(40, 0)
    kw = {"next_obs": next_obs, "batch_layout": batch_layout, "batch_dtype": batch_dtype}
    a, b = pair(HALF, 32, device, lambda: Neighbor(2), **kw)
    a.extend(**data)
    b.extend(**data)
    assert host(b.table[:32]).tobytes() == a.storage.table.tobytes()  # float16 rows
    wide = torch.float32 if batch_dtype == "float32" else torch.float16
    batch = b.sample(16)
    assert batch.obs["q"].dtype == wide and batch.action["q"].dtype == wide
    assert batch.next_obs["p"].dtype == wide and batch.obs["r"].dtype == torch.float32
    assert_same_batch(a.gather(host(batch.indices)), batch, HALF)
    for batch in b.sample_for_trainers(8):
        assert_same_batch(a.gather(host(batch.indices)), batch, HALF)
    if batch_layout == "rows" and batch_dtype == "float32":
        joint = batch.concat("obs")  # float32 obs side by side in the batch row: a view
        assert joint.dtype == torch.float32 and joint.data_ptr() == batch.block.data_ptr()
    assert_all_slots_equal(a, b, HALF)


def test_half_range_and_nan_checks_are_the_numpy_buffers():
    buf = MultiAgentReplayBuffer(HALF, 8, device="cpu")
    data = random_step_data(HALF, 2, np.random.default_rng(2))
    data["obs"]["q"] = data["obs"]["q"].astype(np.float32)
    data["obs"]["q"][0, 1, 1] = 70000.0
    with pytest.raises(ValueError, match=r"obs\['q'\] holds 70000, outside the range"):
        buf.extend(**data)
    step = step_slice(random_step_data(HALF, 1, np.random.default_rng(3)), 0)
    step["next_obs"]["p"] = np.array([0, 0, np.inf, 0, 0], dtype=np.float16)
    with pytest.raises(ValueError, match=r"next_obs\['p'\] contains NaN or inf"):
        buf.add(**step)
    assert len(buf) == 0 and not buf.table.any()


def test_lean_half_rows_and_the_memory_estimate():
    from marlbuf.memory import estimate

    specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
    half = {a: AgentSpec((144,), (5,), obs_dtype=np.float16) for a in specs}
    dense = MultiAgentReplayBuffer(specs, 1000, next_obs="stored", device="cpu")
    lean = MultiAgentReplayBuffer(specs, 1000, device="cpu")
    lean_half = MultiAgentReplayBuffer(half, 1000, device="cpu")
    assert lean.table_row_bytes == estimate(specs, 1000).table_row_bytes
    assert dense.table_row_bytes == estimate(specs, 1000, next_obs="stored").table_row_bytes
    assert lean.nbytes / dense.nbytes < 0.56  # lean rows and the side-table reserve
    assert lean_half.nbytes / dense.nbytes < 0.3
    assert lean.row_bytes == dense.row_bytes  # batches are dense rows either way


@pytest.mark.parametrize("n", [1, 7, 4096, 4097, 5000, 1024 * 9, 1024 * 9 + 1, 100_003])
def test_running_max_equals_cummax(n):
    from marlbuf.torch_backend import running_max

    gen = torch.Generator().manual_seed(n)
    x = torch.rand(n, generator=gen, dtype=torch.float64)
    x[torch.rand(n, generator=gen) < 0.3] = 0.0  # flat stretches, as empty slots give
    np.testing.assert_array_equal(running_max(x).numpy(), torch.cummax(x, 0).values.numpy())
    y = torch.cumsum(x, 0)
    y[::3] -= 1e-12  # a scan that rounded a later prefix below an earlier one
    np.testing.assert_array_equal(running_max(y).numpy(), torch.cummax(y, 0).values.numpy())


def test_cuda_graphs_is_a_checked_opt_in(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 8, device="cpu", cuda_graphs=True)
    assert buf._graphs is None  # CUDA only: the CPU runs every update eagerly
    with pytest.raises(TypeError, match="cuda_graphs must be a bool"):
        MultiAgentReplayBuffer(mixed_specs, 8, device="cpu", cuda_graphs="yes")


def test_a_warm_up_update_with_every_entry_stale_changes_nothing(mixed_specs):
    # the CUDA graph of a priority update is warmed up with every entry forced stale
    buf = MultiAgentReplayBuffer(mixed_specs, 64, sampler=Prioritized(), seed=0, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 80, np.random.default_rng(0)))
    batch = buf.sample(16)
    sampler = buf.device_sampler
    leaves, top = sampler.leaf_view().clone(), sampler.max_priority.clone()
    idx, td = batch.indices[None], torch.rand(1, 16, dtype=torch.float64) * 50
    code, in_range = buf._update_body(range(0, 1), idx, td, None, True, torch.tensor(True))
    # (dropped writes land in the spare column after the leaves)
    assert torch.equal(sampler.leaf_view(), leaves) and torch.equal(sampler.max_priority, top)
    assert bool(in_range) and (code == 0).all()
    buf._update_body(range(0, 1), idx, td, None, True, torch.tensor(False))
    assert not torch.equal(sampler.leaf_view(), leaves)  # without the flag: an update


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("sampler_cls", [Prioritized, PrioritizedNeighbor])
def test_cuda_graphed_priority_updates_equal_eager_ones(mixed_specs, sampler_cls):
    data = random_step_data(mixed_specs, 300, np.random.default_rng(0))
    bufs = []
    for graphs in (True, False):
        buf = MultiAgentReplayBuffer(
            mixed_specs, 256, sampler=sampler_cls(), seed=0, device="cuda", cuda_graphs=graphs
        )
        buf.extend(**data)
        bufs.append(buf)
    graphed, eager = bufs
    k = graphed.n_trainers
    gen = torch.Generator(device="cuda").manual_seed(3)
    for round_ in range(12):
        td = torch.rand(k, 32, generator=gen, device="cuda", dtype=torch.float64) * 4
        if round_ == 7:
            td[1, 5] = float("nan")  # a deferred error: reported later, changes nothing
        draws = []
        for buf in bufs:
            batches = buf.sample_for_trainers(32)
            use_gens = round_ % 2 == 0
            buf.update_priorities_for_trainers(
                [b.indices for b in batches],
                td,
                [b.generations for b in batches] if use_gens else None,
                sync=False,
            )
            draws.append(torch.stack([b.indices for b in batches]))
        assert torch.equal(draws[0], draws[1])
        if round_ == 7:
            for buf in bufs:
                with pytest.raises(ValueError, match="td_errors must be finite"):
                    buf.check_priority_errors()
    assert graphed.graph_error is None and len(graphed._graphs) == 2  # with and without gens
    a, b = graphed.device_sampler, eager.device_sampler
    assert torch.equal(a.leaf_view(), b.leaf_view())
    assert torch.equal(a.max_priority, b.max_priority)
    with _device_waits_raise():  # a replay waits for nothing
        batches = graphed.sample_for_trainers(32)
        graphed.update_priorities_for_trainers(
            [x.indices for x in batches], td, [x.generations for x in batches], sync=False
        )
    graphed.check_priority_errors()
