"""``Prioritized(index="device")``: the priority index in tensors on the buffer's device, wired
through the one front. Its batches are the host index's (the same uniforms, bit-identical
trees), its updates are checked as the host ones (later, with ``sync=False``), and its state
loads into either index.

The trees themselves are tested against the Numba trees in
``tests/storages/test_torch_priority.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf import MultiAgentReplayBuffer  # noqa: E402
from marlbuf.prioritized import LinearBeta  # noqa: E402
from marlbuf.samplers import Prioritized, PrioritizedNeighbor  # noqa: E402
from marlbuf.stores.torch_priority import TensorPriorityTrees  # noqa: E402
from tests.storages.test_stores import (  # noqa: E402
    DEVICES,
    _skip_without_cuda,
    episodes,
    host,
    make_specs,
)


def pair(device: str, capacity: int = 64, **sampler: Any) -> tuple[Any, Any]:
    """A NumPy buffer with host trees and a torch buffer with device trees, same seed."""
    specs = make_specs()
    ref = MultiAgentReplayBuffer(
        specs, capacity, sampler=Prioritized(**sampler), seed=3, n_trainers=3
    )
    buf = MultiAgentReplayBuffer(
        specs,
        capacity,
        sampler=Prioritized(index="device", **sampler),
        seed=3,
        device=device,
        n_trainers=3,
    )
    assert isinstance(buf.sampler.trees, TensorPriorityTrees)
    assert not isinstance(ref.sampler.trees, TensorPriorityTrees)
    return ref, buf


def feed(ref: Any, buf: Any, steps: int, seed: int) -> None:
    data = episodes(make_specs(), steps, seed)
    ref.extend(**data)
    buf.extend(**data)


def assert_same_draw(want: Any, got: Any) -> None:
    np.testing.assert_array_equal(host(got.indices), want.indices)
    np.testing.assert_allclose(host(got.weights), want.weights, rtol=1e-6)
    np.testing.assert_array_equal(host(got.obs["agent_0"]), want.obs["agent_0"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["random", "memory"])
@pytest.mark.parametrize("priority", ["abs", "squared", "given"])
def test_device_index_draws_the_host_index_batches(device: str, order: str, priority: str) -> None:
    """Writes that wrap the ring (stale updates dropped), duplicate indices, every trainer,
    updates from host arrays and from tensors, with and without waiting."""
    _skip_without_cuda(device)
    ref, buf = pair(device, order=order, priority=priority, beta=LinearBeta(0.4, 1.0, steps=5))
    feed(ref, buf, 40, 0)
    rng = np.random.default_rng(0)
    for step in range(12):
        trainer = step % 3
        want, got = ref.sample(32, trainer), buf.sample(32, trainer)
        assert_same_draw(want, got)
        td = rng.standard_normal(32) * 3
        if priority == "given":
            td = np.abs(td)
        td[:4] = td[4]  # repeated values at repeated indices are usual; mix in duplicates
        ref.update_priorities(want.indices, td, trainer=trainer)
        sync = step % 2 == 0
        values = torch.as_tensor(td, device=device) if step % 3 else td
        buf.update_priorities(got.indices, values, trainer=trainer, sync=sync)
        if step == 5:  # overwrite half the ring: updates of the earlier draws become stale
            feed(ref, buf, 30, step)
    # leaves are priority ** alpha: the host index itself raises to a power with two libraries
    # (NumPy's and the C library's) and torch with a third, each within an ulp of the exact
    # power, so at alpha 0.6 a leaf may differ in its last bit (test_torch_priority.py)
    for trainer in range(3):
        assert buf.sampler.priority_total(trainer) == pytest.approx(
            ref.sampler.priority_total(trainer), rel=1e-14
        )
        assert buf.sampler.max_priority(trainer) == ref.sampler.max_priority(trainer)
        slots = np.arange(len(ref))
        np.testing.assert_allclose(
            buf.sampler.sampling_probabilities(slots, len(buf), trainer),
            ref.sampler.sampling_probabilities(slots, len(ref), trainer),
            rtol=1e-14,
        )
    state = buf.state_dict()["sampler"]["state"]
    want_state = ref.state_dict()["sampler"]["state"]
    np.testing.assert_allclose(state["leaves"], want_state["leaves"], rtol=1e-15)
    for key in ("max_priority", "batches_drawn"):
        np.testing.assert_array_equal(state[key], want_state[key])


@pytest.mark.parametrize("device", DEVICES)
def test_a_round_and_its_updates(device: str) -> None:
    _skip_without_cuda(device)
    ref, buf = pair(device)
    feed(ref, buf, 60, 1)
    want, got = ref.sample_for_trainers(16), buf.sample_for_trainers(16)
    for w, g in zip(want, got):
        assert_same_draw(w, g)
    td = np.random.default_rng(1).random((3, 16)) + 0.1
    ref.update_priorities_for_trainers([w.indices for w in want], td)
    buf.update_priorities_for_trainers(
        [g.indices for g in got], torch.as_tensor(td, device=device), sync=False
    )
    for w, g in zip(ref.sample_for_trainers(16), buf.sample_for_trainers(16)):
        assert_same_draw(w, g)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bad_update_writes_nothing_and_raises_now_or_at_the_next_call(device: str) -> None:
    _skip_without_cuda(device)
    _, buf = pair(device)
    buf.extend(**episodes(make_specs(), 40, 0))
    batch = buf.sample(8)
    before = buf.state_dict()["sampler"]["state"]["leaves"].copy()
    bad = torch.ones(8, device=device)
    bad[3] = float("nan")
    with pytest.raises(ValueError, match=r"td_errors must be finite; got td_errors\[3\]=nan"):
        buf.update_priorities(batch.indices, bad)
    np.testing.assert_array_equal(buf.state_dict()["sampler"]["state"]["leaves"], before)
    # without waiting: the next call that reads priorities raises, once; nothing was written
    buf.update_priorities(batch.indices, bad, sync=False)
    with pytest.raises(ValueError, match="finite"):
        buf.sample(8)
    np.testing.assert_array_equal(buf.state_dict()["sampler"]["state"]["leaves"], before)
    buf.sample(8)
    buf.update_priorities(batch.indices, -bad.nan_to_num(1.0), sync=False)  # abs: fine
    buf.check_priority_errors()
    with pytest.raises(TypeError, match="td_errors"):
        buf.update_priorities(batch.indices, np.array(["a"] * 8))
    with pytest.raises(ValueError, match="shape"):
        buf.update_priorities(batch.indices, torch.ones(7, device=device))
    huge = np.full(8, 1e308)
    with pytest.raises(ValueError, match="overflows float64"):
        sampler = Prioritized(index="device", priority="squared")
        other = MultiAgentReplayBuffer(make_specs(), 64, sampler=sampler, device=device)
        other.extend(**episodes(make_specs(), 40, 0))
        other.update_priorities(other.sample(8).indices, huge)


@pytest.mark.parametrize("device", DEVICES)
def test_state_loads_into_either_index(device: str, tmp_path: Any) -> None:
    _skip_without_cuda(device)
    ref, buf = pair(device)
    feed(ref, buf, 50, 2)
    for trainer in range(3):
        got = buf.sample(16, trainer)
        buf.update_priorities(got.indices, np.arange(16.0) + trainer, trainer=trainer)
    buf.save(tmp_path / "b.npz")
    on_device = MultiAgentReplayBuffer.load(tmp_path / "b.npz", device=device)
    on_host = MultiAgentReplayBuffer.load(tmp_path / "b.npz")
    assert on_device.sampler.config()["index"] == "device"
    assert isinstance(on_device.sampler.trees, TensorPriorityTrees)
    assert not isinstance(on_host.sampler.trees, TensorPriorityTrees)  # host memory: host trees
    for trainer in range(3):
        want, got = on_host.sample(16, trainer), on_device.sample(16, trainer)
        assert_same_draw(want, got)
        assert_same_draw(want, buf.sample(16, trainer))


def test_index_is_checked_and_the_locality_sampler_keeps_host_trees() -> None:
    with pytest.raises(ValueError, match=r"index must be one of \('host', 'device'\)"):
        Prioritized(index="gpu")
    assert "index" not in PrioritizedNeighbor().config()
    assert Prioritized(index="device").config()["index"] == "device"
    # a host buffer keeps host trees whatever index says
    buf = MultiAgentReplayBuffer(make_specs(), 32, sampler=Prioritized(index="device"))
    assert not buf.sampler.priorities_on_device


def test_training_with_device_priorities_follows_the_host_index() -> None:
    """``marlbuf train --sampler prioritized --buffer-device cpu --priority-index device``:
    tensor trees, and the run of the host index (the same draws; weights within float32
    rounding, so losses and returns agree closely, not bit for bit)."""
    pytest.importorskip("mpe2")
    from marlbuf.algos import TrainConfig
    from marlbuf.algos.runner import Runner

    config: dict[str, Any] = {"batch_size": 32, "buffer_size": 3000, "warmup_steps": 100}
    config |= {"buffer_device": "cpu", "sampler": "prioritized"}
    runs = []
    for index in ("host", "device"):
        runner = Runner(TrainConfig(**config, priority_index=index))
        assert isinstance(runner.buffer.sampler.trees, TensorPriorityTrees) == (index == "device")
        returns = [r.ret for r in runner.train(16)]  # three update rounds
        runs.append((returns, runner.buffer.state_dict()["sampler"]["state"]["leaves"]))
        runner.close()
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-4)
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=1e-3)
    with pytest.raises(ValueError, match="priority_index must be 'host' or 'device'"):
        TrainConfig(**config, priority_index="gpu")
