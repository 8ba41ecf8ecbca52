"""Batch memory recycling: never overwrite memory that is still referenced, reuse what is not.

Gathered batches live in blocks that the storage's ``BlockPool`` recycles once nothing
references them. Anything derived from a batch without a copy must keep its block out of
recycling: one field, a slice of it, ``torch.from_numpy`` / DLPack tensors and capsules, the
zero-copy ``concat`` view, a ``memoryview``. Once everything is dropped, the same blocks are
used again and the pool stays bounded.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer

torch = pytest.importorskip("torch")

LAYOUTS = ["interleaved", "agent_major"]
SPECS = {
    "a0": AgentSpec(obs_shape=(7,), action_shape=(3,)),
    "a1": AgentSpec(obs_shape=(5,), action_shape=(2,), obs_dtype=np.float64),
    "a2": AgentSpec(obs_shape=(4,), action_shape=(4,), n_discrete_actions=4),
}
B = 16


def make_buffer(layout: str, capacity: int = 64) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(SPECS, capacity, layout=layout, seed=0)
    rng = np.random.default_rng(0)
    T = capacity
    buf.extend(
        obs={a: rng.standard_normal((T, *s.obs_shape)) for a, s in SPECS.items()},
        action={
            "a0": rng.standard_normal((T, 3)),
            "a1": rng.standard_normal((T, 2)),
            "a2": rng.integers(0, 4, T),
        },
        reward={a: rng.standard_normal(T) for a in SPECS},
        next_obs={a: rng.standard_normal((T, *s.obs_shape)) for a, s in SPECS.items()},
        done={a: (rng.random(T) < 0.5).astype(np.float32) for a in SPECS},
    )
    return buf


def as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.numpy().copy()
    if type(x).__name__ == "PyCapsule":
        return torch.from_dlpack(x).numpy().copy()
    return np.array(x, copy=True)


def churn(buf: MultiAgentReplayBuffer, rounds: int) -> None:
    """Many sampling rounds whose batches are dropped at once (their blocks become free)."""
    for i in range(rounds):
        for b in buf.sample_for_trainers(B):
            assert b.obs["a0"].shape == (B, 7)
        buf.sample(B if i % 2 else B // 2)
        kept = buf.sample(B)
        buf.sample(B, out=kept)


HOLDS = {
    "field": lambda b: b.next_obs["a1"],
    "slice": lambda b: b.obs["a0"][3:9, 1:],
    "column": lambda b: b.action["a0"][:, 1],
    "torch.from_numpy": lambda b: torch.from_numpy(b.obs["a0"]),
    "torch view of a view": lambda b: torch.from_numpy(b.reward["a1"])[2:5],
    "dlpack capsule": lambda b: b.action["a0"].__dlpack__(),
    "torch.from_dlpack": lambda b: torch.from_dlpack(b.obs["a1"]),
    "np.from_dlpack": lambda b: np.from_dlpack(b.done["a2"]),
    "concat": lambda b: b.concat("obs", "action"),
    "concat of one field": lambda b: b.concat("next_obs"),
    "memoryview": lambda b: memoryview(b.done["a0"]),
    "to_torch concat": lambda b: b.to_torch().concat("obs", "action"),
    "to_torch field": lambda b: b.to_torch().next_obs["a2"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("how", ["sample", "sample_for_trainers"])
def test_held_memory_is_never_overwritten(layout, how):
    buf = make_buffer(layout)
    held, expected = {}, {}
    for name, take in HOLDS.items():
        batch = buf.sample(B) if how == "sample" else buf.sample_for_trainers(B)[1]
        held[name] = take(batch)
        # reading a capsule consumes it: take the expected values from the batch instead
        source = batch.action["a0"] if name == "dlpack capsule" else held[name]
        expected[name] = as_numpy(source)
        del batch  # only the held object references the block now
    gc.collect()
    churn(buf, 60)
    changed = [name for name in HOLDS if not np.array_equal(as_numpy(held[name]), expected[name])]
    assert not changed, f"held data overwritten by later batches: {changed}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dropped_batches_are_recycled_and_the_pool_stays_bounded(layout):
    buf = make_buffer(layout)
    # private: the pool's block list is the only way to see allocations; weak references, so
    # that watching the blocks does not itself keep them out of recycling
    pool = buf.storage.pool
    churn(buf, 3)
    known = [weakref.ref(block) for _, block, _ in pool._blocks]
    allocated = 0
    for _ in range(100):
        churn(buf, 1)
        for _, block, _ in pool._blocks:
            if not any(ref() is block for ref in known):
                known.append(weakref.ref(block))
                allocated += 1
        assert len(pool._blocks) <= pool.max_blocks
    assert allocated == 0, f"{allocated} new blocks in 100 rounds whose batches were all dropped"
    # and a dropped batch's memory is what the next batch of the same size gets
    first = buf.sample(B)
    address = first.obs["a0"].__array_interface__["data"][0]
    del first
    assert buf.sample(B).obs["a0"].__array_interface__["data"][0] == address
