"""The modelled (trace-driven) cache/TLB columns: kernel vs naive twin, address streams."""

from __future__ import annotations

import numpy as np
import pytest
from naive import NaiveLRUCache

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.profiling import Profiler
from marlbuf.profiling.cachemodel import Geometry, LRUModel, SamplingModel, gather_addresses


@pytest.mark.parametrize(("n_sets", "ways"), [(1, 1), (1, 4), (4, 2), (16, 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_lru_kernel_matches_naive(n_sets: int, ways: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = LRUModel(Geometry("m", n_sets * ways, ways, 64, "test"))
    naive = NaiveLRUCache(n_sets, ways)
    for _ in range(3):  # state carries over between calls
        blocks = rng.integers(0, 3 * n_sets * ways, 500)
        assert model.misses(blocks * 64 + 5) == naive.access(blocks)


def test_lru_kernel_edge_cases() -> None:
    model = LRUModel(Geometry("m", 8, 2, 64, "test"))
    assert model.misses(np.zeros(0, dtype=np.int64)) == 0
    assert model.misses(np.array([0, 1, 63, 64], dtype=np.int64)) == 2  # two lines, cold
    with pytest.raises(ValueError, match="multiple of ways"):
        Geometry("bad", 10, 4, 64, "test")


def _buffer(layout: str) -> MultiAgentReplayBuffer:
    specs = {f"a{i}": AgentSpec(obs_shape=(6,), action_shape=(2,)) for i in range(2)}
    buf = MultiAgentReplayBuffer(specs, capacity=64, layout=layout, seed=0)
    z = lambda *shape: {a: np.zeros((64, *shape), np.float32) for a in specs}  # noqa: E731
    buf.extend(obs=z(6), action=z(2), reward=z(), next_obs=z(6), done=z())
    return buf


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_gather_addresses_cover_exactly_the_rows(layout: str) -> None:
    buf = _buffer(layout)
    indices = np.array([5, 0, 63, 5])
    addresses = gather_addresses(buf.storage, indices)
    arrays = list(buf.storage.arrays().values())
    expected_lines: set[int] = set()
    for array in arrays:
        row = array.strides[0]
        for i in indices:
            first = array.ctypes.data + int(i) * row
            expected_lines.update(range(first // 64, (first + row - 1) // 64 + 1))
    assert set((addresses // 64).tolist()) == expected_lines
    # every address lies inside a gathered row of one of the storage arrays
    inside = np.zeros(addresses.shape, dtype=bool)
    for array in arrays:
        row = array.strides[0]
        for i in indices:
            start = array.ctypes.data + int(i) * row
            inside |= (addresses >= start) & (addresses < start + row)
    assert inside.all()


def test_sampling_model_reaches_the_profiler_as_modelled() -> None:
    buf = _buffer("interleaved")
    model = SamplingModel(buf.storage)
    prof = Profiler(backend="time", null_repeats=0, software_events=False)
    with prof.phase("update_all_trainers"):
        with prof.phase("sampling"):
            batches = buf.sample_for_trainers(8)
    values = model.observe([b.indices for b in batches])
    assert values["model_LL_misses"] > 0
    prof.add_figures("update_all_trainers/sampling", values, model.metrics)
    rep = prof.report()
    assert rep["metrics"]["model_LL_misses"]["source"] == "modelled"
    sampling = next(r for r in rep["phases"] if r["name"] == "sampling")
    assert sampling["inclusive"]["model_LL_misses"] == values["model_LL_misses"]
    with pytest.raises(ValueError, match="describe every metric"):
        prof.add_figures("update_all_trainers/sampling", {"mystery": 1.0}, {})
