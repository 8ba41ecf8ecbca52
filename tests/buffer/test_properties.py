"""Property-based tests (hypothesis) of add/extend/sample invariants."""

from __future__ import annotations

import naive
import numpy as np
import pytest
from datagen import random_step_data
from hypothesis import event, given, settings
from hypothesis import strategies as st

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, Uniform

SPECS = {
    "a": AgentSpec((3,), (2,)),
    "b": AgentSpec((5,), (1,), obs_dtype=np.float64),
}


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 12),
    chunks=st.lists(st.integers(1, 15), min_size=1, max_size=6),
    layout=st.sampled_from(["interleaved", "agent_major"]),
    seed=st.integers(0, 2**16),
)
def test_extend_chunks_match_naive_ring(capacity, chunks, layout, seed):
    rng = np.random.default_rng(seed)
    buf = MultiAgentReplayBuffer(SPECS, capacity, layout=layout, seed=seed)
    ring = naive.NaiveRing(capacity)
    for steps in chunks:
        data = random_step_data(SPECS, steps, rng)
        buf.extend(**data)
        for t in range(steps):
            ring.add({f: {a: x[t] for a, x in per.items()} for f, per in data.items()})
        assert (len(buf), buf.cursor) == (ring.size, ring.cursor)
    batch = buf.gather(np.arange(len(buf)))
    for slot in range(len(buf)):
        for f in FIELDS:
            for agent, spec in SPECS.items():
                expected = np.asarray(ring.get(slot)[f][agent]).astype(spec.dtype(f))
                np.testing.assert_array_equal(batch.field(f)[agent][slot], expected)
    # write generations are unique and increase with the write order
    gens = buf.write_generation[: len(buf)]
    assert len(set(gens.tolist())) == len(buf)
    assert gens.max() == buf.total_writes - 1


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(4, 40),
    steps=st.integers(1, 80),
    run_length=st.sampled_from([1, 2, 4]),
    n_refs=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_samples_only_filled_slots(capacity, steps, run_length, n_refs, seed):
    """Every draw returns filled slots. Uniform (with replacement) always draws; Neighbor
    refuses exactly when the stored slots hold fewer than ``n_refs`` runs of ``run_length``
    (the batch is larger than the data, or fewer valid run starts than runs)."""
    size = min(steps, capacity)
    batch_size = n_refs * run_length
    starts = size if size == capacity else size - run_length + 1  # valid run starts
    neighbor_draws = batch_size <= size and starts >= n_refs
    event("Neighbor draws" if neighbor_draws else "Neighbor refuses: too few runs stored")
    for sampler in (Uniform(), Neighbor(run_length)):
        buf = MultiAgentReplayBuffer(SPECS, capacity, sampler=sampler, seed=seed)
        buf.extend(**random_step_data(SPECS, steps, np.random.default_rng(seed)))
        assert len(buf) == size
        if isinstance(sampler, Neighbor) and not neighbor_draws:
            with pytest.raises(ValueError, match="needs"):
                buf.sample(batch_size)
            continue
        idx = buf.sample(batch_size).indices
        assert idx.shape == (batch_size,) and idx.dtype == np.int64
        assert idx.min() >= 0 and idx.max() < len(buf)
