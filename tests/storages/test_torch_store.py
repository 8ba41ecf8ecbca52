"""The torch store (``MultiAgentReplayBuffer(..., device=...)``): the NumPy buffer's tests on
``device="cpu"`` (and on ``"cuda"`` where a GPU is present: tests marked ``cuda``).

The NumPy buffer is the reference. A device buffer is the same front (writer, links, samplers,
priorities, stale guard, state files) with its rows in a :class:`TorchStorage`: given the same
seed and writes, both hold the same table bits and return the same batches, bit for bit, with
the batch's fields (and weights) as tensors on the device and its indices and generations on
the host; files move between the two. What every store does alike is tested once over stores:
test_protocol.py (every sampler and next_obs format), test_stores.py (every capability), and
the tests that take the ``store`` fixture (test_buffer.py, test_half.py). This file keeps what
is the torch store's own: device placement, tensors and their dtypes, pooled and pinned
memory, tensor TD errors and deferred updates, CUDA waits, the device learner and suite.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from datagen import random_actions, random_step_data, step_slice

torch = pytest.importorskip("torch")

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer  # noqa: E402
from marlbuf.batch import DrawnIndices  # noqa: E402
from marlbuf.prioritized import LinearBeta  # noqa: E402
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Uniform  # noqa: E402
from marlbuf.stores.torch import DeviceBatch, TorchStorage, stack_span  # noqa: E402

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


def host(x: Any) -> np.ndarray:
    """A tensor (any device) as a host array; host arrays (batch indices) as they are."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def dev_table(buf: Any) -> Any:
    """The torch store's table: ``(capacity + 1, row_words)`` int64 on the device."""
    assert isinstance(buf.storage, TorchStorage)
    return buf.storage.table


def table_bytes(buf: Any, n: int) -> bytes:
    """The first ``n`` rows of a buffer's interleaved table, on either store, as bytes."""
    table = buf.storage.table
    if isinstance(table, torch.Tensor):
        return host(table[:n]).view(np.uint64).tobytes()
    return np.asarray(table[:n]).tobytes()


def leaves(buf: Any, trainer: int) -> np.ndarray:
    """A copy of the leaves of ``trainer``'s priority tree (host, on every store)."""
    return buf.sampler.trees.leaves(trainer).copy()


def max_priority(buf: Any) -> np.ndarray:
    return buf.sampler.trees.max_priority.copy()


def assert_same_state(x: Any, y: Any, where: str = "state") -> None:
    """Two (nested) sampler states hold the same keys and values."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), where
        for key in x:
            assert_same_state(x[key], y[key], f"{where}[{key!r}]")
    else:
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x), err_msg=where)


def pair(specs, capacity, device="cpu", sampler=None, seed=1, next_obs="stored", **kw):
    """A NumPy buffer and a torch buffer built alike (``sampler`` a factory, the same
    ``next_obs`` mode and seed): the same table bytes and the same batches."""
    kw = {"seed": seed, "next_obs": next_obs, **kw}
    a = MultiAgentReplayBuffer(specs, capacity, sampler=sampler() if sampler else None, **kw)
    b = MultiAgentReplayBuffer(
        specs, capacity, sampler=sampler() if sampler else None, device=device, **kw
    )
    return a, b


def assert_same_links(a, b):
    """The torch buffer ``b`` keeps the NumPy buffer ``a``'s links (observations stored once):
    every link entry, the pending steps and every side row in use."""
    if a.links is None:
        assert b.links is None
        return
    np.testing.assert_array_equal(b.links.next_slot, a.links.next_slot)
    np.testing.assert_array_equal(b.links.side_row, a.links.side_row)
    assert b.links.pending == a.links.pending
    used = a.links.side_row[a.links.side_row >= 0]
    assert b.links.side[used].tobytes() == a.links.side[used].tobytes()


def assert_same_batch(a, b, specs):
    """A NumPy batch and a device batch hold the same bits in every field."""
    for f in FIELDS:
        for agent in specs:
            x, y = a.field(f)[agent], host(b.field(f)[agent])
            assert x.dtype == y.dtype and x.shape == y.shape, (f, agent)
            assert x.tobytes() == np.ascontiguousarray(y).tobytes(), (f, agent)


def assert_same_draw(a, b, device):
    """``b`` (a device batch) is ``a`` (a NumPy batch of the same seed): the same fields, the
    same host indices with their generations, the same weights as a float32 device tensor."""
    assert isinstance(b, DeviceBatch) and b.device.type == device and b.trainer == a.trainer
    assert isinstance(b.indices, DrawnIndices) and isinstance(b.generations, np.ndarray)
    np.testing.assert_array_equal(b.indices, a.indices)
    np.testing.assert_array_equal(b.generations, a.generations)
    np.testing.assert_array_equal(b.indices.generations, a.generations)
    if a.weights is None:
        assert b.weights is None
    else:
        assert isinstance(b.weights, torch.Tensor) and b.weights.dtype == torch.float32
        assert b.weights.device.type == device
        np.testing.assert_array_equal(host(b.weights), a.weights)
    assert_same_batch(a, b, a.obs)


# --------------------------------------------------------------------------- construction
def test_device_keyword_selects_the_torch_store(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 10, device="cpu")
    assert type(buf) is MultiAgentReplayBuffer and isinstance(buf.storage, TorchStorage)
    assert buf.device == torch.device("cpu") and buf.layout == "interleaved"
    assert "device='cpu'" in repr(buf)
    for numpy_buf in (
        MultiAgentReplayBuffer(mixed_specs, 10),
        MultiAgentReplayBuffer(mixed_specs, 10, device=None),
    ):
        assert numpy_buf.device is None and not isinstance(numpy_buf.storage, TorchStorage)
        assert "device=" not in repr(numpy_buf)

    class Mine(MultiAgentReplayBuffer):  # a subclass keeps its class and gets the store
        pass

    mine = Mine(mixed_specs, 10, device="cpu")
    assert type(mine) is Mine and isinstance(mine.storage, TorchStorage)


def test_import_marlbuf_does_not_import_torch():
    code = (
        "import sys, numpy as np, marlbuf\n"
        "from marlbuf import AgentSpec, MultiAgentReplayBuffer\n"
        "MultiAgentReplayBuffer({'a': AgentSpec((3,), (2,))}, 8).add("
        "[np.zeros(3)], [np.zeros(2)], [0.0], [np.zeros(3)], [0.0])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"device": "tpu"}, ValueError, "device must be 'cpu', 'cuda' or 'cuda:k'"),
        ({"device": "meta"}, ValueError, "runs on 'cpu' and 'cuda' devices"),
        ({"device": 3}, TypeError, "device must be a string"),
        ({"device": "cpu", "layout": "agent_major"}, ValueError,
         r"layout='agent_major' is not available with device='cpu' \(torch store\)"),
        ({"device": "cpu", "parallel_gather": True}, ValueError, "leave parallel_gather=False"),
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
    assert table_bytes(b, filled) == table_bytes(a, filled)
    assert_same_links(a, b)
    idx = np.random.default_rng(0).integers(0, len(a), 40)
    ga, gb = a.gather(idx), b.gather(idx)
    assert isinstance(gb, DeviceBatch) and gb.device.type == device
    assert_same_batch(ga, gb, mixed_specs)
    assert isinstance(gb.indices, np.ndarray) and isinstance(gb.generations, np.ndarray)
    np.testing.assert_array_equal(gb.indices, ga.indices)
    np.testing.assert_array_equal(gb.generations, ga.generations)
    assert_same_batch(a.latest(len(a)), b.latest(len(b)), mixed_specs)
    for f in FIELDS:
        for agent in mixed_specs:
            np.testing.assert_array_equal(host(b.stored(f)[agent]), a.stored(f)[agent])
    for agent, (mean, std) in a.reward_stats().items():
        assert b.reward_stats()[agent] == pytest.approx((mean, std), rel=1e-12)


# --------------------------------------------------------------------------- sampling
def test_sample_for_trainers_per_trainer_and_shared_index(mixed_specs):
    buf: Any = MultiAgentReplayBuffer(mixed_specs, 100, seed=0, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 100, np.random.default_rng(0)))
    batches = buf.sample_for_trainers(32)
    assert [b.trainer for b in batches] == [0, 1, 2]
    assert not np.array_equal(batches[0].indices, batches[1].indices)
    rows = stack_span(batches, "obs", "action")  # float32 and float64 obs: a stacked copy
    assert rows.shape == (3, 32, 16 + 6 + 14 + 5 + 5 + 4)
    for t, batch in enumerate(batches):
        assert torch.equal(rows[t], batch.concat("obs", "action"))
    same = {f"a{i}": AgentSpec((18,), (5,)) for i in range(3)}
    buf2: Any = MultiAgentReplayBuffer(same, 100, seed=0, device="cpu")
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
    buf: Any = MultiAgentReplayBuffer(specs, 100, device="cpu")
    buf.extend(**random_step_data(specs, 10, np.random.default_rng(0)))
    batch = buf.sample(8)
    joint = batch.concat("obs", "action")
    assert joint.shape == (8, 69) and joint.data_ptr() == batch.block.data_ptr()
    expected = torch.cat([batch.obs[a] for a in specs] + [batch.action[a] for a in specs], 1)
    assert torch.equal(joint, expected)
    assert batch.block.data_ptr() % 64 == 0
    mixed: Any = MultiAgentReplayBuffer(mixed_specs, 10, device="cpu")  # obs of float32 and float64
    mixed.extend(**random_step_data(mixed_specs, 10, np.random.default_rng(0)))
    b = mixed.sample(4)
    assert b.concat("obs").shape == (4, 16 + 6 + 14)
    with pytest.raises(ValueError, match="at least one field"):
        b.concat()
    lists = b.as_lists()
    assert [len(x) for x in lists] == [3] * 5 and lists[2][0].shape == (4,)
    assert b.agents == list(mixed_specs) and lists[0][1] is b.obs["pred_1"]
    half: Any = MultiAgentReplayBuffer(HALF, 10, device="cpu")  # float16 rows, float32 batches
    half.extend(**random_step_data(HALF, 10, np.random.default_rng(0)))
    widened = half.sample(4)
    joint = widened.concat("obs")  # the widened obs side by side in the batch row: a view
    assert joint.dtype == torch.float32 and joint.data_ptr() == widened.block.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_per_agent_batches_are_contiguous_and_equal(mixed_specs, device):
    data = random_step_data(mixed_specs, 40, np.random.default_rng(0))
    rows: Any = MultiAgentReplayBuffer(mixed_specs, 32, seed=5, device=device)
    per: Any = MultiAgentReplayBuffer(
        mixed_specs, 32, seed=5, device=device, batch_layout="per_agent"
    )
    ref: Any = MultiAgentReplayBuffer(mixed_specs, 32, seed=5, batch_layout="per_agent")
    for buf in (rows, per, ref):
        buf.extend(**data)
    a, b = rows.sample(16), per.sample(16)
    np.testing.assert_array_equal(a.indices, b.indices)
    for f in FIELDS:
        for agent in mixed_specs:
            assert b.field(f)[agent].is_contiguous()
            assert torch.equal(a.field(f)[agent], b.field(f)[agent])
    # the NumPy buffer's carving of the block (padding between the arrays is not compared)
    assert host(b.block).tobytes()[:64] == ref.sample(16).block.tobytes()[:64]
    assert torch.equal(a.concat("obs", "action"), b.concat("obs", "action"))
    again = per.sample(16, out=b)
    assert again.block.data_ptr() == b.block.data_ptr()
    assert_same_batch(ref.sample(16), again, mixed_specs)


def test_out_reuses_memory_and_checks_it(mixed_specs):
    buf: Any = MultiAgentReplayBuffer(mixed_specs, 50, seed=0, device="cpu")
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
    buf: Any = MultiAgentReplayBuffer(mixed_specs, 64, seed=0, device="cpu")
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


def test_gather_takes_index_tensors(mixed_specs):
    """Indices as tensors are checked as arrays are (the other argument checks are the front's,
    run on every store in test_buffer.py)."""
    buf = MultiAgentReplayBuffer(mixed_specs, 100, device="cpu")
    buf.extend(**random_step_data(mixed_specs, 50, np.random.default_rng(0)))
    np.testing.assert_array_equal(buf.gather(torch.tensor([3, 49])).indices, [3, 49])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 50\)"):
        buf.gather(torch.tensor([0, 50]))
    with pytest.raises(TypeError, match="1-D integer array"):
        buf.gather(torch.zeros((2, 2), dtype=torch.int64))


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


def assert_same_priorities(a, b):
    """Every trainer's tree leaves and max priority equal (NumPy buffer ``a``, device ``b``)."""
    for trainer in range(a.n_trainers):
        np.testing.assert_array_equal(leaves(b, trainer), leaves(a, trainer))
    np.testing.assert_array_equal(max_priority(b), max_priority(a))


@pytest.mark.parametrize("priority", ["abs", "squared", "given"])
@pytest.mark.parametrize("cls", [Prioritized, PrioritizedNeighbor])
def test_tensor_td_errors_give_the_numpy_buffers_priorities(cls, priority):
    """TD errors as tensors (float64, float32, with tensor indices) change the priorities as
    the same arrays do on the NumPy buffer; new slots enter with the max priority; the next
    draws and weights are the NumPy buffer's."""
    a, b = ppair(cls(alpha=1.0, eps=0.5, priority=priority), capacity=20, filled=10)
    idx = np.array([0, 1, 2, 4])
    for dtype, trainer in ((np.float64, 1), (np.float32, 0)):
        td = np.array([0.0, 2.0, 3.0, 7.0], dtype=dtype)
        a.update_priorities(idx, td, trainer=trainer, generations=a.write_generation[idx])
        b.update_priorities(
            torch.as_tensor(idx),
            torch.as_tensor(td),
            trainer=trainer,
            generations=b.write_generation[torch.as_tensor(idx)],
        )
    want = {"abs": [0.5, 2.5, 3.5], "squared": [0.5, 4.5, 9.5], "given": [0.5, 2.5, 3.5]}
    np.testing.assert_array_equal(leaves(b, 1)[:3], want[priority])
    for buf in (a, b):
        buf.extend(**steps(2, start=10))
    assert_same_priorities(a, b)
    np.testing.assert_array_equal(leaves(b, 1)[10:12], leaves(b, 1)[4])  # the max priority
    for trainer in range(2):
        assert_same_draw(a.sample(32, trainer=trainer), b.sample(32, trainer=trainer), "cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [Prioritized, PrioritizedNeighbor])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_stale_updates_are_dropped(device, cls, as_tensor):
    a, b = ppair(cls(alpha=1.0, eps=0.0), capacity=16, filled=16, device=device)
    conv = (lambda x: torch.as_tensor(np.asarray(x), device=device)) if as_tensor else np.array
    indices = np.array([0, 1, 2, 8, 9], np.int64)
    for buf in (a, b):
        batch = buf.gather(indices, trainer=0)
        buf.extend(**steps(2, start=16))  # overwrites slots 0 and 1 (max priority 1)
        buf.update_priorities(
            conv(indices), conv(np.full(5, 5.0)), trainer=0, generations=conv(batch.generations)
        )
        np.testing.assert_array_equal(leaves(buf, 0)[indices], [1.0, 1.0, 5.0, 5.0, 5.0])
        # batch.indices carry the generations of their draw (updated after a newer batch)
        old = buf.gather(np.array([2, 3, 10]), trainer=0)
        buf.extend(**steps(2, start=18))  # overwrites slots 2 and 3 (max priority 5)
        newer = buf.gather(np.array([10, 11]), trainer=0)
        buf.update_priorities(newer.indices, conv(np.full(2, 7.0)), trainer=0)
        buf.update_priorities(old.indices, conv(np.full(3, 9.0)), trainer=0)
        np.testing.assert_array_equal(leaves(buf, 0)[[2, 3, 10, 11]], [5.0, 5.0, 9.0, 7.0])
        # plain indices (a copy, or a tensor of them): judged against trainer 0's latest draw
        latest = buf.gather(np.array([4, 5]), trainer=0)
        buf.extend(**steps(2, start=20))  # overwrites slots 4 and 5 (max priority 9)
        buf.update_priorities(conv(np.array(latest.indices)), conv(np.full(2, 3.0)), trainer=0)
        np.testing.assert_array_equal(leaves(buf, 0)[[4, 5]], [9.0, 9.0])
    assert_same_priorities(a, b)


def test_batched_update_equals_per_trainer_updates():
    sampler = PrioritizedNeighbor(alpha=0.7)
    ref, one = ppair(sampler, n_trainers=3)
    _, many = ppair(sampler, n_trainers=3)
    rng = np.random.default_rng(0)
    idx = [rng.integers(0, 64, 32) for _ in range(3)]
    td = [torch.tensor(rng.normal(size=32)) for _ in range(3)]
    for t in range(3):
        ref.update_priorities(
            idx[t], td[t].numpy(), trainer=t, generations=ref.write_generation[idx[t]]
        )
        one.update_priorities(idx[t], td[t], trainer=t, generations=one.write_generation[idx[t]])
    many.update_priorities_for_trainers(
        [torch.as_tensor(i) for i in idx],
        torch.stack(td),
        [many.write_generation[i] for i in idx],
        sync=False,
    )  # a (T, B) tensor: split along its first axis
    many.check_priority_errors()
    assert_same_priorities(ref, one)
    assert_same_priorities(ref, many)
    with pytest.raises(ValueError, match="one entry per trainer"):
        many.update_priorities_for_trainers([], [torch.ones(3)])
    with pytest.raises(ValueError, match="one entry per trainer"):
        many.update_priorities_for_trainers(idx[:2], td[:2], generations=[None])


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
    a, b = ppair(cls(), capacity=16, filled=16)
    value = torch.as_tensor(td) if as_tensor else td
    with pytest.raises(error, match=match):
        b.update_priorities(
            np.array([0, 1, 2]),
            value,
            trainer=0,
            generations=b.write_generation[np.array([0, 1, 2])],
        )
    assert_same_priorities(a, b)
    assert max_priority(b)[0] == 1.0


def test_deferred_checks_raise_later_and_change_nothing():
    a, b = ppair(Prioritized(priority="given"), capacity=16, filled=10)
    # indices, trainer and generations are checked at the call, even with sync=False
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\).*min 0, max 12"):
        b.update_priorities(
            torch.tensor([0, 12]),
            torch.tensor([1.0, 1.0]),
            sync=False,
            generations=b.write_generation[torch.tensor([0, 12])],
        )
    with pytest.raises(ValueError, match=r"trainer must be in \[0, 2\)"):
        b.update_priorities(
            np.array([0, 1]),
            torch.tensor([1.0, 1.0]),
            trainer=5,
            sync=False,
            generations=b.write_generation[np.array([0, 1])],
        )
    with pytest.raises(ValueError, match="generations must be an integer array"):
        b.update_priorities(
            np.array([0, 1]), torch.tensor([1.0, 1.0]), generations=[0.5, 1.0], sync=False
        )
    # the TD errors when the update is applied: at the next call that reads priorities
    b.update_priorities(
        torch.tensor([0, 1]),
        torch.tensor([1.0, -1.0]),
        sync=False,
        generations=b.write_generation[torch.tensor([0, 1])],
    )
    assert_same_priorities(a, b)  # nothing applied yet
    with pytest.raises(ValueError, match=r"priorities must be >= 0 with priority='given'"):
        b.check_priority_errors()
    b.check_priority_errors()  # reported once
    assert_same_priorities(a, b)
    # a deferred update is applied before the next draw: the draws of a synchronous one
    a.update_priorities(
        np.array([3, 5]),
        np.array([2.0, 4.0]),
        trainer=1,
        generations=a.write_generation[np.array([3, 5])],
    )
    b.update_priorities(
        np.array([3, 5]),
        torch.tensor([2.0, 4.0]),
        trainer=1,
        sync=False,
        generations=b.write_generation[np.array([3, 5])],
    )
    assert_same_draw(a.sample(16, trainer=1), b.sample(16, trainer=1), "cpu")
    assert_same_priorities(a, b)
    # a bad one raises at the next sample, which draws nothing: the next draws are unchanged
    b.update_priorities(
        np.array([3]),
        torch.tensor([float("nan")]),
        sync=False,
        generations=b.write_generation[np.array([3])],
    )
    with pytest.raises(ValueError, match=r"finite; got td_errors\[0\]=nan"):
        b.sample(16)
    assert_same_draw(a.sample(16), b.sample(16), "cpu")
    # synchronous updates raise at once
    with pytest.raises(ValueError, match=r"priorities must be >= 0 with priority='given'"):
        b.update_priorities(
            torch.tensor([0, 1]),
            torch.tensor([1.0, -1.0]),
            generations=b.write_generation[torch.tensor([0, 1])],
        )
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        b.update_priorities(
            np.array([0, 12]),
            np.array([1.0, 1.0]),
            generations=b.write_generation[np.array([0, 12])],
        )
    assert_same_priorities(a, b)


def test_a_bad_deferred_update_does_not_drop_the_valid_ones_after_it():
    a, b = ppair(Prioritized(priority="given"), capacity=16, filled=10)
    b.update_priorities(
        np.array([0, 1]),
        torch.tensor([1.0, -1.0]),
        trainer=0,
        sync=False,
        generations=b.write_generation[np.array([0, 1])],
    )
    b.update_priorities(
        np.array([3]),
        torch.tensor([2.0]),
        trainer=1,
        sync=False,
        generations=b.write_generation[np.array([3])],
    )  # valid
    with pytest.raises(ValueError, match="priorities must be >= 0"):
        b.check_priority_errors()
    with pytest.raises(ValueError, match="priorities must be >= 0"):  # the same two calls
        a.update_priorities(
            np.array([0, 1]),
            np.array([1.0, -1.0]),
            trainer=0,
            generations=a.write_generation[np.array([0, 1])],
        )
    a.update_priorities(
        np.array([3]), np.array([2.0]), trainer=1, generations=a.write_generation[np.array([3])]
    )
    assert_same_priorities(a, b)


@pytest.mark.parametrize(
    "device",
    [None, "cpu", pytest.param("cuda", marks=CUDA)],
)
def test_a_deferred_update_reads_the_td_errors_of_the_call(device):
    """A learner may write its TD-error tensor again before the next draw: the deferred update
    applies the values it was given (as a synchronous one)."""
    a, b = ppair(Prioritized(alpha=1.0, eps=0.0), capacity=16, filled=10, device=device)
    td = torch.tensor([2.0, 3.0], device=device or "cpu")
    a.update_priorities(
        np.array([0, 1]), np.array([2.0, 3.0]), generations=a.write_generation[np.array([0, 1])]
    )
    b.update_priorities(
        np.array([0, 1]), td, sync=False, generations=b.write_generation[np.array([0, 1])]
    )
    td.fill_(7.0)  # the learner's next round, in place
    b.check_priority_errors()
    assert_same_priorities(a, b)


def test_a_checkpoint_holds_the_deferred_updates(tmp_path):
    a, b = ppair(Prioritized(alpha=1.0, eps=0.0), capacity=16, filled=10)
    a.update_priorities(
        np.array([0, 1]), np.array([2.0, 3.0]), generations=a.write_generation[np.array([0, 1])]
    )
    b.update_priorities(
        np.array([0, 1]),
        torch.tensor([2.0, 3.0]),
        sync=False,
        generations=b.write_generation[np.array([0, 1])],
    )
    b.save(tmp_path / "b.npz")  # a checkpoint right after a round's deferred update
    assert_same_state(a.sampler.state_dict(), b.state_dict()["sampler"]["state"])
    assert_same_priorities(a, MultiAgentReplayBuffer.load(tmp_path / "b.npz", device="cpu"))


def test_all_zero_priorities_and_linear_beta():
    _, b = ppair(Prioritized(eps=0.0), capacity=8, filled=0)
    with pytest.raises(ValueError, match="buffer is empty"):
        b.sample(4)
    b.extend(**steps(4))
    b.update_priorities(
        np.arange(4), torch.zeros(4), trainer=0, generations=b.write_generation[np.arange(4)]
    )
    with pytest.raises(ValueError, match="every priority of trainer 0 is 0"):
        b.sample(4, trainer=0)
    assert len(b.sample(4, trainer=1)) == 4
    a, b = ppair(Prioritized(beta=LinearBeta(0.5, 1.0, steps=2)), capacity=16, filled=16)
    td = np.random.default_rng(3).uniform(0.1, 2.0, 16)
    a.update_priorities(np.arange(16), td, trainer=0, generations=a.write_generation[np.arange(16)])
    b.update_priorities(
        np.arange(16), torch.as_tensor(td), trainer=0, generations=b.write_generation[np.arange(16)]
    )
    sampler: Any = b.sampler
    assert sampler.beta_for(0) == 0.5
    assert_same_draw(a.sample(4, trainer=0), b.sample(4, trainer=0), "cpu")
    assert sampler.beta_for(0) == 0.75 and sampler.beta_for(1) == 0.5
    # trainers at different points of the schedule in one round (one gathered block)
    for x, y in zip(a.sample_for_trainers(4), b.sample_for_trainers(4), strict=True):
        assert_same_draw(x, y, "cpu")
    assert sampler.beta_for(0) == 1.0 and sampler.beta_for(1) == 0.75
    with pytest.raises(ValueError, match="shared_index"):
        b.sample_for_trainers(4, shared_index=True)


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
    ref, b = ppair(sampler, capacity=40, filled=70, device=device)
    if sampler.weighted:
        for trainer in range(2):
            for buf in (ref, b):
                batch = buf.sample(16, trainer=trainer)
                td = np.random.default_rng(trainer).normal(size=16)
                value = td if buf is ref else torch.as_tensor(td, device=device)
                buf.update_priorities(batch.indices, value, trainer=trainer)
    path = tmp_path / "torch.npz"
    b.save(path)
    a = MultiAgentReplayBuffer.load(path)  # the NumPy buffer reads it
    assert a.device is None and not isinstance(a.storage, TorchStorage)
    assert type(a.sampler) is type(sampler) and a.next_obs == b.next_obs
    assert table_bytes(a, 40) == table_bytes(b, 40) == table_bytes(ref, 40)
    assert (a.cursor, a.size, a.total_writes) == (b.cursor, b.size, b.total_writes)
    assert_same_state(b.sampler.state_dict(), a.sampler.state_dict())
    a.save(tmp_path / "numpy.npz")
    loaded = []
    for dev in ("cpu", device):  # and back, on either device
        c = MultiAgentReplayBuffer.load(tmp_path / "numpy.npz", device=dev)
        assert isinstance(c.storage, TorchStorage) and c.device.type == dev
        assert torch.equal(dev_table(c)[:40].cpu(), dev_table(b)[:40].cpu())
        assert_same_state(b.sampler.state_dict(), c.sampler.state_dict())
        loaded.append(c)
    loaded.append(MultiAgentReplayBuffer.load(path, device=device))
    for trainer in range(2):  # every copy continues with the same draws
        want = ref.sample(32, trainer=trainer)
        assert_same_draw(want, b.sample(32, trainer=trainer), device)
        np.testing.assert_array_equal(a.sample(32, trainer=trainer).indices, want.indices)
        for c in loaded:
            assert_same_draw(want, c.sample(32, trainer=trainer), c.device.type)


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
    c = MultiAgentReplayBuffer(SPECS2, 30, device="cpu", next_obs=b.next_obs)
    persistence.load_into(c, tmp_path / "b.npz")
    assert torch.equal(dev_table(c), dev_table(b)) and c.cursor == b.cursor
    np.testing.assert_array_equal(c.sample(8).indices, b.sample(8).indices)


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
@pytest.mark.parametrize("half", [False, True])
def test_cuda_round_never_waits_for_the_device(mixed_specs, half):
    """A round (host draws, indices and weights sent with non-blocking copies, one gather),
    then deferred priority updates of device TD errors (non-blocking copies to pinned memory,
    applied at the next draw): no operation waits for the device (observations stored once,
    so the side rows of episode ends travel with the indices)."""
    specs = HALF if half else mixed_specs
    buf: Any = MultiAgentReplayBuffer(
        specs, 256, sampler=PrioritizedNeighbor(), seed=0, device="cuda", next_obs="once"
    )
    buf.extend(**random_step_data(specs, 300, np.random.default_rng(0)))
    buf.sample_for_trainers(64)  # warm-up (pinned staging buffers, lazy CUDA state)
    with _device_waits_raise():
        for _ in range(3):
            batches = buf.sample_for_trainers(64)
            assert all(b.block.is_cuda and isinstance(b.indices, np.ndarray) for b in batches)
            td = torch.stack([b.weights.double() for b in batches])
            buf.update_priorities_for_trainers(
                [b.indices for b in batches], td, [b.generations for b in batches], sync=False
            )
    buf.check_priority_errors()


# --------------------------------------------------------------------------- trainers
def _learner_pair(algo, sampler, device="cpu", half=False):
    from marlbuf.algos import BatchedLearner, TrainConfig
    from marlbuf.algos.device import DeviceBatchedLearner
    from marlbuf.workloads import Workload

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
        host_batches = a.sample_for_trainers(32)  # the same seed: the same draws and weights
        batches: Any = b.sample_for_trainers(32)
        for x, y in zip(host_batches, batches, strict=True):
            assert_same_draw(x, y, "cpu")
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
    n = b.n_trainers
    batches: Any = [b.sample(32, trainer=t) for t in range(n)]  # rounds of one: stacked copies
    host_batches = [a.sample(32, trainer=t) for t in range(n)]
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

    config: dict[str, Any] = {
        "batch_size": 32,
        "buffer_size": 3000,
        "warmup_steps": 100,
        "algo": "matd3",
    }
    config |= {"buffer_device": "cpu", "sampler": "prioritized_neighbor"}
    results = []
    for next_obs in ("once", "stored"):
        make: Any = MultiAgentReplayBuffer
        if next_obs == "stored":

            def make_stored(*args: Any, **kwargs: Any) -> Any:
                return MultiAgentReplayBuffer(*args, **{**kwargs, "next_obs": "stored"})

            make = make_stored

        monkeypatch.setattr(runner_module, "MultiAgentReplayBuffer", make)
        runner = runner_module.Runner(TrainConfig(**config))
        assert runner.buffer.next_obs == next_obs
        returns = [r.ret for r in runner.train(8)]
        stats = cast(Any, runner.last_stats).to_host()
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
    assert np.isfinite(cast(Any, half.last_stats).to_host().critic_loss).all()
    half.close()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (["--buffer-device", "cuda"],
         "--buffer-device must be the learner's device (the round's batches stay where they are "
         "gathered); got --buffer-device='cuda', --device='cpu'"),
        (["--buffer-device", "tpu"],
         "--buffer-device must be None, 'cpu' or 'cuda[:k]'; got --buffer-device='tpu'"),
        (["--buffer-device", "cpu", "--formulation", "loop"],
         "--buffer-device needs --formulation='batched' and --layout='interleaved' (the device "
         "buffer's round); got --formulation='loop', --layout='interleaved'"),
        (["--buffer-device", "cpu", "--layout", "agent_major"],
         "--buffer-device needs --formulation='batched' and --layout='interleaved' (the device "
         "buffer's round); got --formulation='batched', --layout='agent_major'"),
    ],
)  # fmt: skip
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
        batches: Any = buf.sample_for_trainers(32)
        stats = learner.update_device(batches)  # TD errors (T, B) on the device
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
    from marlbuf.bench.suites import device as suite
    from marlbuf.workloads import Workload

    tiny = {
        **suite.QUICK,
        "workloads": [Workload("cooperative_navigation", 3)],
        "cpu_workload": Workload("cooperative_navigation", 3),
        "capacity": 2_000,
        "repeats": 1,
        "per_capacities": (3_000, 5_000),
        "per_trainers": 3,
        "per_repeats": 1,
        "e2e_capacity": 1_000,
        "e2e_batch": 64,
        "e2e_repeats": 1,
    }
    monkeypatch.setattr(suite, "QUICK", tiny)
    return suite


def test_device_suite_runs_tiny(monkeypatch):
    from marlbuf.bench.tools import common

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
    per = {(r["capacity"], r["case"], r["op"]) for r in payload["rows"] if r["part"] == "per"}
    e2e = {r["case"] for r in payload["rows"] if r["part"] == "e2e"}
    assert per == {(c, case, op) for c in (3_000, 5_000) for case in suite.PER_CASES
                   for op in suite.PER_OPS}  # fmt: skip
    assert e2e == set(suite.E2E_CONFIGS)
    # every target is reported; these sizes reach none of them
    assert [t["workload"] for t in payload["targets"]] == [
        "capacity 1,000,000", "capacity 10,000,000", "CN-24"
    ]  # fmt: skip
    assert all(t["status"] == "not measured" and t["note"] for t in payload["targets"])
    if not HAS_CUDA:
        parts = [r for r in payload["rows"] if r["part"] != "cpu"]
        assert all(r["status"].startswith("not measured: no CUDA device") for r in parts)
        assert all("no CUDA device" in t["note"] for t in payload["targets"][:2])
    json_text = common.json.dumps(payload, default=common._json_default)
    assert "torch_cpu_vs_numpy" in json_text


@pytest.mark.slow
def test_device_suite_gpu_parts_run_on_the_cpu(monkeypatch):
    # the GPU cases' code paths, run on the CPU: every marlbuf case is measured
    pytest.importorskip("mpe2")  # the end-to-end part's environments
    suite = _tiny_device_suite(monkeypatch)
    payload = suite.run(quick=True, progress=False, device="cpu")
    rows = {(r["part"], r["case"], r.get("op"), r.get("capacity")): r for r in payload["rows"]}
    for case in ("device buffer", "device buffer+out", "device buffer+prioritized",
                 "device buffer+prioritized index=device", "device buffer+obs once"):  # fmt: skip
        row = rows["gpu", case, None, None]
        assert row["status"] == "measured" and row["ms_median"] > 0
    for capacity in (3_000, 5_000):
        for case in ("marlbuf index=host", "marlbuf index=device"):
            for op in suite.PER_OPS:
                row = rows["per", case, op, capacity]
                assert row["status"] == "measured" and row["ms_median"] > 0, row
        summary = payload["summary"]["per_round"][str(capacity)]["sample + update"]
        assert summary["marlbuf index=device ms"] > 0
    rows = {(r["part"], r["case"]): r for r in payload["rows"]}
    for case in suite.E2E_CONFIGS:
        assert rows["e2e", case]["status"] == "measured", rows["e2e", case]
        assert rows["e2e", case]["ms_median"] > 0
    assert payload["summary"]["e2e_speedup_vs_faithful"]["faithful"] == 1.0
    assert "not a GPU figure" in payload["config"]["gpu"]


def test_device_suite_skips_a_capacity_that_does_not_fit(monkeypatch):
    from marlbuf.bench.suites import device as suite
    from marlbuf.workloads import Workload

    needed = suite.per_bytes_needed(Workload("cooperative_navigation", 3), 10_000_000, 8, False)
    # two marlbuf tables of 1e7 CN-3 rows (576 bytes each) and TorchRL's, on the device; the
    # host index's 8 float64 sum and max trees of 2**24 leaves on the host
    assert needed["device"] > 16 * 2**30 and needed["host"] > 4 * 2**30
    monkeypatch.setattr(suite, "available_memory_bytes", lambda: 24 * 2**30)
    assert "more than a quarter of the 24.0 GiB available" in suite.memory_shortfall(needed, "cpu")
    small = suite.per_bytes_needed(Workload("cooperative_navigation", 3), 100_000, 8, False)
    assert suite.memory_shortfall(small, "cpu") is None


@pytest.mark.slow
def test_device_check_script_needs_no_mpe2_pettingzoo_matplotlib_or_ray(tmp_path):
    # stand-ins that fail to import, ahead of the real packages on the path
    blocked = tmp_path / "blocked"
    for name in ("mpe2", "pettingzoo", "matplotlib", "ray"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{name} is blocked')\n"
        )
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OUT": str(out),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(blocked),
        "DEVICE_CHECK_QUICK": "1",
        "WHEELS": str(tmp_path / "no-wheels"),
        # the script's test step runs this file: here only its CUDA tests (this run is checking
        # the script; the CPU tests run in the enclosing session)
        "PYTEST_ADDOPTS": "-m cuda",
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
    # the dropin suite with the networks on the GPU: without CUDA (or mpe2) not measured
    dropin = json.loads((out / "dropin-quick.json").read_text())
    assert dropin["options"] == {"device": "cuda"} and dropin["rows"]
    if not HAS_CUDA:
        assert all("no CUDA device" in r["status"] for r in dropin["rows"])
    assert {t["status"] for t in dropin["targets"]} == {"not measured"}
    log = (out / "suites.txt").read_text()
    assert "[distributed] skipped" in log and "Ray" in log  # Ray blocked: skipped, said why
    for step in ("tests", "device", "dropin", "distributed"):
        assert f"device_check: step {step}: exit status" in log
    assert len(list(out.iterdir())) <= 8  # what a device run can carry back


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
                    "action": {a: random_actions(s, 1, self.rng)[0] for a, s in self.specs.items()},
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
    state round trips: the torch buffer keeps the NumPy buffer's lean table and links, and
    every batch equals the dense reference's, bit for bit."""
    rng = np.random.default_rng(seed)
    streams = Streams(mixed_specs, rng)
    capacity = int(rng.integers(5, 14))
    kw = {"batch_layout": batch_layout, "sampler": Neighbor(2), "seed": seed}
    lean = MultiAgentReplayBuffer(mixed_specs, capacity, next_obs="once", **kw)
    dense = MultiAgentReplayBuffer(mixed_specs, capacity, next_obs="stored", **kw)
    dev = MultiAgentReplayBuffer(mixed_specs, capacity, device=device, next_obs="once", **kw)
    assert dev.next_obs == "once" and dev.links is not None
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
            fresh = MultiAgentReplayBuffer(
                mixed_specs, capacity, device=device, next_obs="once", **kw
            )
            fresh.load_state_dict(dev.state_dict())
            dev = fresh
        assert_same_links(lean, dev)
        assert table_bytes(dev, len(lean)) == table_bytes(lean, len(lean))
        assert_all_slots_equal(dense, dev, mixed_specs)
        if len(dense) >= 4:
            batch = dev.sample(4)
            assert_same_batch(dense.gather(batch.indices), batch, mixed_specs)
    for agent in mixed_specs:
        np.testing.assert_array_equal(
            host(dev.stored("next_obs")[agent]), lean.stored("next_obs")[agent]
        )
        np.testing.assert_array_equal(host(dev.stored("obs")[agent]), lean.stored("obs")[agent])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_side_table_outgrows_its_reserve(mixed_specs, device, sampler):
    """Random steps are all episode ends: the side table holds a row per slot, far beyond its
    first rows; the side rows of a batch travel with its indices and batches stay exact."""
    lean, dev = pair(mixed_specs, 300, device, sampler, seed=3, next_obs="once")
    reserve = dev.links.side.shape[0]
    data = random_step_data(mixed_specs, 700, np.random.default_rng(0))
    lean.extend(**data)
    dev.extend(**data)
    for t in range(40):
        step = step_slice(random_step_data(mixed_specs, 1, np.random.default_rng(t)), 0)
        lean.add(**step, stream=1)
        dev.add(**step, stream=1)
    assert dev.links.side_rows_used > reserve
    assert_same_links(lean, dev)
    assert_all_slots_equal(lean, dev, mixed_specs)
    for x, y in zip(lean.sample_for_trainers(32), dev.sample_for_trainers(32), strict=True):
        assert_same_draw(x, y, device)


@pytest.mark.parametrize("device", DEVICES)
def test_stored_once_states_load_natively_both_ways(mixed_specs, device, tmp_path, monkeypatch):
    from marlbuf import state as state_module

    convert_state = state_module.convert_state

    def native_only(state, codec, layout, next_obs):
        source = (state["layout"], state.get("next_obs", "stored"))
        assert source == (layout, next_obs), "a state in the buffer's own format was converted"
        return convert_state(state, codec, layout, next_obs)

    monkeypatch.setattr(state_module, "convert_state", native_only)
    streams = Streams(mixed_specs, np.random.default_rng(5))
    first, more = stacked(streams.steps(0, 30)), stacked(streams.steps(0, 7))
    kw: dict[str, Any] = {"seed": 0, "sampler": PrioritizedNeighbor(), "next_obs": "once"}
    lean = MultiAgentReplayBuffer(mixed_specs, 16, **kw)
    lean.extend(**first)
    dev = MultiAgentReplayBuffer(mixed_specs, 16, device=device, **kw)
    dev.load_state_dict(lean.state_dict())  # NumPy -> device, lean rows and links as they are
    assert table_bytes(dev, 16) == table_bytes(lean, 16)
    assert_same_links(lean, dev)
    lean.save(tmp_path / "lean.npz")
    loaded = MultiAgentReplayBuffer.load(tmp_path / "lean.npz", device=device)
    assert loaded.next_obs == "once" and isinstance(loaded.storage, TorchStorage)
    assert_same_links(lean, loaded)
    for buf in (lean, dev, loaded):
        buf.extend(**more)  # the stream continues: its pending step links across the load
    assert_same_links(lean, dev)
    assert_same_links(lean, loaded)
    dev.save(tmp_path / "dev.npz")  # device -> NumPy
    back = MultiAgentReplayBuffer.load(tmp_path / "dev.npz")
    assert back.next_obs == "once" and table_bytes(back, 16) == table_bytes(lean, 16)
    assert_same_links(lean, back)
    assert_all_slots_equal(lean, loaded, mixed_specs)
    assert_all_slots_equal(back, dev, mixed_specs)
    for trainer in range(2):  # the same sampler and generator states: the same draws
        want = lean.sample(8, trainer=trainer)
        for buf in (dev, loaded):
            assert_same_draw(want, buf.sample(8, trainer=trainer), device)
        assert_same_batch(want, back.sample(8, trainer=trainer), mixed_specs)


# --------------------------------------------------------------------------- half precision
def test_lean_half_rows_and_the_memory_estimate():
    from marlbuf.memory import estimate

    specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
    half = {a: AgentSpec((144,), (5,), obs_dtype=np.float16) for a in specs}
    dense: Any = MultiAgentReplayBuffer(specs, 1000, next_obs="stored", device="cpu")
    lean: Any = MultiAgentReplayBuffer(specs, 1000, device="cpu")
    lean_half = MultiAgentReplayBuffer(half, 1000, device="cpu")
    assert lean.storage.table_row_bytes == estimate(specs, 1000).table_row_bytes
    assert dense.storage.table_row_bytes == estimate(specs, 1000, next_obs="stored").table_row_bytes
    assert lean.nbytes / dense.nbytes < 0.56  # lean rows and the side table
    assert lean_half.nbytes / dense.nbytes < 0.3
    # batches are dense rows either way
    assert lean.storage.batch_codec.row_bytes == dense.storage.batch_codec.row_bytes
