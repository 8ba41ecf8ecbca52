"""Prioritized and prioritized-locality sampling: sum-tree kernels, distributions, weights,
stale updates, bad input and persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import (
    naive_binary_find,
    naive_find,
    naive_inclusion_probabilities,
    naive_locality_sample,
    naive_per_sample,
    naive_stored_nodes,
    naive_tree,
)
from scipy.stats import chisquare

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf._kernels import (
    fill_new_slots,
    find_prefix,
    locality_sample,
    per_sample,
    rebuild,
    set_leaves,
)
from marlbuf.prioritized import (
    LinearBeta,
    PriorityTrees,
    RunLengthPredictor,
    ThresholdPredictor,
)
from marlbuf.samplers import Prioritized, PrioritizedNeighbor, Sampler

SPECS = {f"agent_{i}": AgentSpec(obs_shape=(3,), action_shape=(2,)) for i in range(2)}
EMPTY = np.zeros(0, dtype=np.float64)


def steps(count: int, start: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """``count`` timesteps whose obs encode their step number (to check what was gathered)."""
    value = np.arange(start, start + count, dtype=np.float32)
    return {
        "obs": {a: np.repeat(value[:, None], 3, axis=1) for a in SPECS},
        "action": {a: np.zeros((count, 2), np.float32) for a in SPECS},
        "reward": {a: value.copy() for a in SPECS},
        "next_obs": {a: np.zeros((count, 3), np.float32) for a in SPECS},
        "done": {a: np.zeros(count, np.float32) for a in SPECS},
    }


def make_buffer(
    sampler: Sampler, capacity: int = 64, filled: int = 64, **kw
) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(SPECS, capacity=capacity, sampler=sampler, seed=0, **kw)
    if filled:
        buf.extend(**steps(filled))
    return buf


def set_priorities(buf: MultiAgentReplayBuffer, priorities: np.ndarray, trainer: int = 0) -> None:
    idx = np.arange(priorities.shape[0], dtype=np.int64)
    buf.update_priorities(idx, priorities, trainer=trainer, generations=buf.write_generation[idx])


def assert_binary_tree(tree: np.ndarray, leaves: np.ndarray, leaf_offset: int, is_max=False):
    """``tree`` holds the stored levels of the full binary tree of ``leaves`` bit for bit (the
    root and total included), and zeros in the levels it does not store."""
    stored = naive_stored_nodes(leaf_offset)
    np.testing.assert_array_equal(tree[stored], naive_tree(leaves, leaf_offset, is_max)[stored])
    assert not tree[~stored].any()


# --------------------------------------------------------------------------- sum-tree kernels
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 40),
    data=st.data(),
)
def test_tree_matches_naive_under_random_updates(capacity: int, data: st.DataObject) -> None:
    # integer priorities keep every sum exact, so tree and cumulative sums agree bit for bit
    trees = PriorityTrees(capacity, 1, alpha=1.0, track_max=True)
    leaves = np.zeros(capacity)
    n_batches = data.draw(st.integers(1, 6))
    for _ in range(n_batches):
        slots = np.asarray(
            data.draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=12)), np.int64
        )
        values = np.asarray(
            data.draw(st.lists(st.integers(0, 50), min_size=len(slots), max_size=len(slots))),
            np.float64,
        )
        set_leaves(trees.sums[0], trees.maxes[0], trees.leaf_offset, slots, values, values, True)
        for s, v in zip(slots, values):  # last duplicate wins
            leaves[s] = v
    assert_binary_tree(trees.sums[0], leaves, trees.leaf_offset)
    assert_binary_tree(trees.maxes[0], leaves, trees.leaf_offset, True)
    np.testing.assert_array_equal(trees.leaves(0), leaves)
    total = leaves.sum()
    assert trees.total(0) == total
    if total > 0:
        targets = np.arange(int(total)) + 0.5  # one target inside every unit of mass
        found = np.empty(targets.shape[0], np.int64)
        find_prefix(trees.sums[0], trees.leaf_offset, targets, found)
        np.testing.assert_array_equal(found, naive_find(leaves, targets))
        assert np.all(leaves[found] > 0)


def test_fill_new_slots_and_rebuild_match_naive() -> None:
    trees = PriorityTrees(13, 3, alpha=0.5, track_max=True)
    trees.max_priority[:] = [1.0, 4.0, 9.0]
    slots = np.array([0, 5, 12, 5], np.int64)
    trees.fill_new(slots)
    for t, value in enumerate([1.0, 4.0, 9.0]):
        leaves = np.zeros(13)
        leaves[[0, 5, 12]] = value
        assert_binary_tree(trees.sums[t], leaves**0.5, trees.leaf_offset)
        assert_binary_tree(trees.maxes[t], leaves, trees.leaf_offset, True)
    copy = trees.sums[1].copy()
    copy[1 : trees.leaf_offset] = -1.0
    rebuild(copy, trees.leaf_offset, False)
    stored = naive_stored_nodes(trees.leaf_offset)
    np.testing.assert_array_equal(copy[stored], trees.sums[1][stored])
    assert (copy[~stored][1:] == -1.0).all()  # levels not stored are left alone


def test_fill_new_slots_without_max_tree() -> None:
    trees = PriorityTrees(5, 2, alpha=1.0, track_max=False)
    fill_new_slots(
        trees.sums,
        trees.maxes,
        trees.leaf_offset,
        np.array([1, 3], np.int64),
        np.array([2.0, 3.0]),
        np.array([2.0, 3.0]),
        False,
    )
    assert trees.maxes.shape == (2, 0)
    assert trees.total(0) == 4.0 and trees.total(1) == 6.0


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 5, 8, 9, 16, 33, 64, 65, 100, 300, 1000, 5000])
def test_searches_are_those_of_the_binary_tree(capacity: int) -> None:
    """The same slot as a full binary tree's descent for the same targets, for every shape of
    the stored levels (leaf level 0 to 13; the root's line of 2, 4 or 8 nodes): real-valued
    priorities (rounding in the subtractions), zero leaves, targets at both ends of the total
    and at every prefix sum."""
    rng = np.random.default_rng(capacity)
    leaves = rng.random(capacity) ** 3 * 5.0
    leaves[rng.random(capacity) < 0.3] = 0.0
    leaves[0] = max(leaves[0], 1e-3)
    trees = PriorityTrees(capacity, 1, alpha=1.0, track_max=False)
    order = rng.permutation(capacity).astype(np.int64)
    set_leaves(trees.sums[0], EMPTY, trees.leaf_offset, order, leaves[order], EMPTY, False)
    binary = naive_tree(leaves, trees.leaf_offset)
    assert trees.total(0) == binary[1]
    assert_binary_tree(trees.sums[0], leaves, trees.leaf_offset)
    total = binary[1]
    edges = [0.0, np.nextafter(total, 0.0), total, *np.cumsum(leaves)]
    targets = np.concatenate([rng.random(3000) * total, edges])
    found = np.empty(targets.shape[0], np.int64)
    find_prefix(trees.sums[0], trees.leaf_offset, targets, found)
    np.testing.assert_array_equal(found, naive_binary_find(binary, trees.leaf_offset, targets))
    assert (leaves[found] > 0).all()


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_per_sample_matches_naive(beta: float) -> None:
    rng = np.random.default_rng(1)
    leaves = rng.integers(0, 20, size=37).astype(np.float64)
    trees = PriorityTrees(37, 1, alpha=1.0, track_max=False)
    set_leaves(trees.sums[0], EMPTY, trees.leaf_offset, np.arange(37), leaves, EMPTY, False)
    uniforms = rng.random(500)
    slots = np.empty(500, np.int64)
    weights = np.empty(500, np.float32)
    per_sample(trees.sums[0], trees.leaf_offset, uniforms, beta, slots, weights)
    want_slots, want_weights = naive_per_sample(leaves, uniforms, beta)
    np.testing.assert_array_equal(slots, want_slots)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6)


@pytest.mark.parametrize("min_chunk", [1, 7, 32])
@pytest.mark.parametrize("inherit", [False, True])
@pytest.mark.parametrize(("capacity", "size"), [(31, 31), (31, 17), (32, 5), (8, 8)])
def test_locality_sample_matches_naive(
    inherit: bool, capacity: int, size: int, min_chunk: int
) -> None:
    rng = np.random.default_rng(capacity + size)
    priorities = np.zeros(capacity)
    priorities[:size] = rng.integers(1, 12, size=size)
    leaves = priorities.copy()  # alpha = 1
    trees = PriorityTrees(capacity, 1, alpha=1.0, track_max=True)
    slots_all = np.arange(capacity, dtype=np.int64)
    set_leaves(
        trees.sums[0], trees.maxes[0], trees.leaf_offset, slots_all, leaves, priorities, True
    )
    thresholds = np.array([0.3, 0.7])
    run_lengths = np.array([1, 3, 4], np.int64)
    uniforms = rng.random(64)
    slots = np.empty(64, np.int64)
    weights = np.empty(64, np.float32)
    refs = locality_sample(
        trees.sums[0], trees.maxes[0], trees.leaf_offset, capacity, size, uniforms,
        thresholds, run_lengths, 0.7, inherit, min_chunk, slots, weights, np.empty(64),
    )  # fmt: skip
    want_slots, want_weights = naive_locality_sample(
        leaves, priorities, size, uniforms, thresholds, run_lengths, 0.7, inherit
    )
    np.testing.assert_array_equal(slots, want_slots)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6)
    assert 1 <= refs <= 64
    assert slots.max() < size  # never an unwritten slot


# --------------------------------------------------------------------------- distributions
def test_per_frequencies_follow_priorities_to_the_alpha() -> None:
    sampler = Prioritized(alpha=0.6, beta=0.5)
    buf = make_buffer(sampler, capacity=50, filled=40)
    priorities = np.random.default_rng(2).uniform(0.05, 3.0, size=40)
    set_priorities(buf, priorities)
    counts = np.zeros(50)
    for _ in range(100):
        batch = buf.sample(1000)
        counts += np.bincount(batch.indices, minlength=50)
    assert counts[40:].sum() == 0  # unwritten slots
    expected = (priorities + 1e-6) ** 0.6
    expected = expected / expected.sum() * counts.sum()
    assert chisquare(counts[:40], expected).pvalue > 1e-3


def test_per_weights_formula() -> None:
    sampler = Prioritized(alpha=0.7, beta=0.4)
    buf = make_buffer(sampler, capacity=30, filled=30)
    priorities = np.random.default_rng(3).uniform(0.1, 5.0, size=30)
    set_priorities(buf, priorities, trainer=1)
    batch = buf.sample(200, trainer=1)
    probability = (priorities + 1e-6) ** 0.7
    probability /= probability.sum()
    raw = (30 * probability[batch.indices]) ** -0.4
    np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-5)
    assert batch.weights.dtype == np.float32


@pytest.mark.parametrize(("capacity", "filled"), [(48, 48), (48, 30), (53, 120)])
def test_locality_frequencies_match_inclusion_probabilities(capacity: int, filled: int) -> None:
    sampler = PrioritizedNeighbor(alpha=0.6, beta=0.5)
    buf = make_buffer(sampler, capacity=capacity, filled=filled)
    size = len(buf)
    set_priorities(buf, np.random.default_rng(4).uniform(0.0, 2.0, size=size))
    probability = sampler.inclusion_probabilities(size)
    assert probability.sum() == pytest.approx(1.0)
    assert np.all(probability[size:] == 0)
    # Rows of one batch are correlated (a run puts neighbours in together), which breaks the
    # chi-square test's independence assumption on pooled counts. One row per batch, at a random
    # position, gives independent draws whose distribution is P(j) up to O(run / batch).
    position_rng = np.random.default_rng(5)
    batch_size, n_batches = 512, 12_000
    picked = np.empty(n_batches, np.int64)
    per_batch = np.zeros((n_batches, capacity))
    for b in range(n_batches):
        indices = buf.sample(batch_size).indices
        picked[b] = indices[position_rng.integers(batch_size)]
        per_batch[b] = np.bincount(indices, minlength=capacity)
    counts = np.bincount(picked, minlength=capacity)
    assert per_batch[:, size:].sum() == 0  # never an unwritten slot
    assert chisquare(counts[:size], probability[:size] * n_batches).pvalue > 1e-3
    # pooled counts: the mean per batch matches B * P(j) within the batch-to-batch noise
    mean = per_batch[:, :size].mean(axis=0)
    stderr = per_batch[:, :size].std(axis=0) / np.sqrt(n_batches)
    assert np.all(np.abs(mean - batch_size * probability[:size]) < 5 * stderr + 1e-3 * mean)


@pytest.mark.parametrize("size", [40, 23])
def test_inclusion_probabilities_match_brute_force(size: int) -> None:
    sampler = PrioritizedNeighbor(alpha=0.5, thresholds=(0.2, 0.5, 0.8), run_lengths=(1, 2, 3, 5))
    buf = make_buffer(sampler, capacity=40, filled=size)
    set_priorities(buf, np.random.default_rng(5).uniform(0.0, 1.0, size=size), trainer=1)
    want = naive_inclusion_probabilities(
        sampler.trees.leaves(1).copy(),
        sampler.trees.priorities(1).copy(),
        size,
        sampler.predictor.thresholds,
        sampler.predictor.run_lengths,
    )
    np.testing.assert_allclose(sampler.inclusion_probabilities(size, trainer=1), want, rtol=1e-12)


@pytest.mark.parametrize("filled", [64, 40])
def test_locality_weights_equal_formula(filled: int) -> None:
    sampler = PrioritizedNeighbor(alpha=0.6, beta=0.8)
    buf = make_buffer(sampler, capacity=64, filled=filled)
    set_priorities(buf, np.random.default_rng(6).uniform(0.0, 3.0, size=filled))
    probability = sampler.inclusion_probabilities(filled)
    batch = buf.sample(256)
    raw = (filled * probability[batch.indices]) ** -0.8
    np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-5)


def test_inherit_weights_use_reference_probability() -> None:
    # every run has length 3, so the references are rows 0, 3, 6, ...
    sampler = PrioritizedNeighbor(alpha=1.0, beta=0.7, weights="inherit", run_lengths=(3, 3, 3))
    buf = make_buffer(sampler, capacity=64, filled=64)
    set_priorities(buf, np.random.default_rng(7).uniform(0.5, 3.0, size=64))
    batch = buf.sample(129)
    refs = batch.indices[::3]
    np.testing.assert_array_equal(batch.indices.reshape(43, 3), (refs[:, None] + [0, 1, 2]) % 64)
    leaves = sampler.trees.leaves(0)[refs]
    want = np.repeat((leaves.min() / leaves) ** 0.7, 3)
    np.testing.assert_allclose(batch.weights, want, rtol=1e-6)


class CallablePredictor(RunLengthPredictor):
    """A threshold rule without a step table: forces the general (NumPy) sampling path."""

    def __init__(self, thresholds: list[float], run_lengths: list[int]) -> None:
        self.inner = ThresholdPredictor(thresholds, run_lengths)

    def run_lengths_for(self, normalised: np.ndarray) -> np.ndarray:
        return self.inner.run_lengths_for(normalised)

    @property
    def max_run_length(self) -> int:
        return self.inner.max_run_length

    def config(self) -> dict[str, list]:
        return self.inner.config()


@pytest.mark.parametrize("weights", ["exact", "inherit"])
@pytest.mark.parametrize("filled", [64, 45, 200])
def test_general_predictor_path_equals_fused_kernel(weights: str, filled: int) -> None:
    custom = CallablePredictor([0.33, 0.66], [1, 2, 4])
    fused = make_buffer(PrioritizedNeighbor(weights=weights), filled=filled)
    general = make_buffer(PrioritizedNeighbor(weights=weights, predictor=custom), filled=filled)
    td = np.random.default_rng(8).normal(size=len(fused))
    for buf in (fused, general):
        set_priorities(buf, td)
    for _ in range(3):
        a, b = fused.sample(100), general.sample(100)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_allclose(a.weights, b.weights, rtol=1e-6)


def test_runs_stop_at_the_write_head_while_filling() -> None:
    sampler = PrioritizedNeighbor(thresholds=(0.5,), run_lengths=(1, 4))
    buf = make_buffer(sampler, capacity=100, filled=6)
    for _ in range(50):
        batch = buf.sample(64)
        assert batch.indices.max() < 6
        np.testing.assert_array_equal(batch.obs["agent_0"][:, 0], batch.indices)


def test_runs_wrap_once_full() -> None:
    sampler = PrioritizedNeighbor(thresholds=(0.5,), run_lengths=(1, 4))
    buf = make_buffer(sampler, capacity=10, filled=10)
    priorities = np.full(10, 0.01)
    priorities[9] = 1.0  # the last slot, long runs: 9, 0, 1, 2
    set_priorities(buf, priorities)
    batch = buf.sample(400)
    assert np.any((batch.indices[:-1] == 9) & (batch.indices[1:] == 0))


# --------------------------------------------------------------------------- updates
def test_new_slots_enter_with_running_max() -> None:
    sampler = Prioritized(alpha=1.0, eps=0.0)
    buf = make_buffer(sampler, capacity=20, filled=10)
    buf.update_priorities(
        np.array([3, 4]),
        np.array([7.0, -2.0]),
        trainer=0,
        generations=buf.write_generation[np.array([3, 4])],
    )
    assert sampler.trees.max_priority[0] == 7.0 and sampler.trees.max_priority[1] == 1.0
    buf.extend(**steps(2, start=10))
    np.testing.assert_array_equal(sampler.trees.leaves(0)[10:12], [7.0, 7.0])
    np.testing.assert_array_equal(sampler.trees.leaves(1)[10:12], [1.0, 1.0])
    assert sampler.trees.leaves(0)[4] == 2.0  # |d| + eps


@pytest.mark.parametrize("cls", [Prioritized, PrioritizedNeighbor])
def test_stale_updates_are_dropped(cls: type[Prioritized]) -> None:
    sampler = cls(alpha=1.0, eps=0.0)
    buf = make_buffer(sampler, capacity=16, filled=16)
    indices = np.array([0, 1, 2, 8, 9], np.int64)
    batch = buf.gather(indices)
    buf.extend(**steps(2, start=16))  # overwrites slots 0 and 1 (max priority 1)
    buf.update_priorities(indices, np.full(5, 5.0), trainer=0, generations=batch.generations)
    np.testing.assert_array_equal(sampler.trees.leaves(0)[indices], [1.0, 1.0, 5.0, 5.0, 5.0])


@pytest.mark.parametrize("priority", ["abs", "squared", "given"])
def test_priority_modes(priority: str) -> None:
    sampler = Prioritized(alpha=1.0, eps=0.5, priority=priority)
    buf = make_buffer(sampler, capacity=8, filled=8)
    td = np.array([0.0, 2.0, 3.0])
    buf.update_priorities(
        np.array([0, 1, 2]), td, trainer=1, generations=buf.write_generation[np.array([0, 1, 2])]
    )
    want = {"abs": td + 0.5, "squared": td**2 + 0.5, "given": td + 0.5}[priority]
    np.testing.assert_array_equal(sampler.trees.leaves(1)[:3], want)


def test_no_drift_after_millions_of_small_updates() -> None:
    # half the slots hold priority exactly 0; the other half get 2e6 tiny random updates.
    # A delta-updated or float32 tree would leave rounding residue in the zero subtrees.
    capacity = 1024
    trees = PriorityTrees(capacity, 1, alpha=1.0, track_max=False)
    rng = np.random.default_rng(9)
    live = np.arange(1, capacity, 2, dtype=np.int64)
    for _ in range(2000):
        slots = rng.choice(live, size=1000)
        set_leaves(
            trees.sums[0], EMPTY, trees.leaf_offset, slots, rng.random(1000) * 1e-9, EMPTY, False
        )
    assert_binary_tree(trees.sums[0], trees.leaves(0), trees.leaf_offset)
    found = np.empty(200_000, np.int64)
    per_sample(
        trees.sums[0],
        trees.leaf_offset,
        rng.random(200_000),
        0.5,
        found,
        np.empty(200_000, np.float32),
    )
    assert np.all(found % 2 == 1)


def test_zero_priority_slots_are_never_sampled() -> None:
    sampler = PrioritizedNeighbor(alpha=1.0, eps=0.0, priority="given")
    buf = make_buffer(sampler, capacity=32, filled=32)
    priorities = np.zeros(32)
    priorities[[5, 20]] = 1.0
    set_priorities(buf, priorities)
    batch = Prioritized.sample(sampler, 500, 32, np.random.default_rng(0), 0)[0]
    assert set(batch.tolist()) <= {5, 20}


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cls", [Prioritized, PrioritizedNeighbor])
@pytest.mark.parametrize(
    ("td", "error"),
    [
        (np.array([1.0, np.nan, 1.0]), ValueError),
        (np.array([1.0, np.inf, 1.0]), ValueError),
        (np.array([1.0, 1.0]), ValueError),
        (np.ones((3, 1)), ValueError),
        (np.array(["a", "b", "c"]), TypeError),
    ],
)
def test_bad_td_errors_change_nothing(cls: type[Prioritized], td: np.ndarray, error: type) -> None:
    sampler = cls()
    buf = make_buffer(sampler, capacity=16, filled=16)
    before = sampler.trees.sums.copy()
    with pytest.raises(error, match="td_errors"):
        buf.update_priorities(
            np.array([0, 1, 2]),
            td,
            trainer=0,
            generations=buf.write_generation[np.array([0, 1, 2])],
        )
    np.testing.assert_array_equal(sampler.trees.sums, before)
    assert sampler.trees.max_priority[0] == 1.0


def test_negative_given_priorities_and_bad_indices() -> None:
    sampler = Prioritized(priority="given")
    buf = make_buffer(sampler, capacity=16, filled=10)
    before = sampler.trees.sums.copy()
    with pytest.raises(ValueError, match="priorities must be >= 0"):
        buf.update_priorities(
            np.array([0, 1]),
            np.array([1.0, -1.0]),
            generations=buf.write_generation[np.array([0, 1])],
        )
    with pytest.raises(ValueError, match="indices must lie"):
        buf.update_priorities(
            np.array([0, 12]),
            np.array([1.0, 1.0]),
            generations=buf.write_generation[np.array([0, 12])],
        )
    with pytest.raises(ValueError, match="trainer"):
        buf.update_priorities(
            np.array([0, 1]),
            np.array([1.0, 1.0]),
            trainer=5,
            generations=buf.write_generation[np.array([0, 1])],
        )
    np.testing.assert_array_equal(sampler.trees.sums, before)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"beta": 1.5}, "beta"),
        ({"beta": -0.1}, "beta"),
        ({"beta": {"schedule": "cosine"}}, "beta"),
        ({"eps": -1e-6}, "eps"),
        ({"priority": "huber"}, "priority"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, match: str) -> None:
    for cls in (Prioritized, PrioritizedNeighbor):
        with pytest.raises(ValueError, match=match):
            cls(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"thresholds": (0.6, 0.3)},
        {"thresholds": (0.3, 1.5)},
        {"thresholds": (0.3,), "run_lengths": (1, 2, 4)},
        {"run_lengths": (1, 0, 4)},
        {"weights": "approximate"},
    ],
)
def test_bad_locality_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PrioritizedNeighbor(**kwargs)


def test_bad_beta_types_and_capacity() -> None:
    with pytest.raises(TypeError, match="beta"):
        Prioritized(beta="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        LinearBeta(0.4, 1.0, steps=0)
    with pytest.raises(ValueError, match="longest run"):
        MultiAgentReplayBuffer(SPECS, capacity=3, sampler=PrioritizedNeighbor())
    with pytest.raises(TypeError, match="predictor"):
        PrioritizedNeighbor(predictor="threshold")  # type: ignore[arg-type]


def test_all_zero_priorities_and_empty_buffer() -> None:
    sampler = Prioritized(eps=0.0)
    buf = make_buffer(sampler, capacity=8, filled=0)
    with pytest.raises(ValueError, match="buffer is empty"):
        buf.sample(4)
    buf.extend(**steps(4))
    buf.update_priorities(
        np.arange(4), np.zeros(4), trainer=0, generations=buf.write_generation[np.arange(4)]
    )
    with pytest.raises(ValueError, match="every priority"):
        buf.sample(4, trainer=0)
    assert len(buf.sample(4, trainer=1)) == 4


# --------------------------------------------------------------------------- beta, state
def test_linear_beta_schedule_advances_per_trainer_batch() -> None:
    sampler = Prioritized(beta=LinearBeta(0.5, 1.0, steps=2))
    buf = make_buffer(sampler, capacity=16, filled=16)
    assert sampler.beta_for(0) == 0.5
    buf.sample(4, trainer=0)
    assert sampler.beta_for(0) == 0.75 and sampler.beta_for(1) == 0.5
    buf.sample_for_trainers(4)
    buf.sample(4, trainer=0)
    assert sampler.beta_for(0) == 1.0 and sampler.beta_for(1) == 0.75


@pytest.mark.parametrize(
    "sampler",
    [
        Prioritized(alpha=0.7, beta=LinearBeta(0.4, 1.0, steps=10), eps=1e-3, priority="squared"),
        PrioritizedNeighbor(beta={"schedule": "linear", "start": 0.3, "end": 0.9, "steps": 5}),
        PrioritizedNeighbor(weights="inherit", thresholds=(0.5,), run_lengths=(2, 8)),
    ],
)
def test_save_load_round_trip(sampler: Prioritized, tmp_path) -> None:
    buf = make_buffer(sampler, capacity=40, filled=70)
    for trainer in range(2):
        batch = buf.sample(16, trainer=trainer)
        td = np.random.default_rng(trainer).normal(size=16)
        buf.update_priorities(batch.indices, td, trainer=trainer, generations=batch.generations)
    rebuilt = type(sampler)(**sampler.config())
    assert rebuilt.config() == sampler.config()
    path = tmp_path / "buf.npz"
    buf.save(path)
    loaded = MultiAgentReplayBuffer.load(path)
    other = loaded.sampler
    assert isinstance(other, type(sampler))
    np.testing.assert_array_equal(other.trees.sums, sampler.trees.sums)
    np.testing.assert_array_equal(other.trees.maxes, sampler.trees.maxes)
    np.testing.assert_array_equal(other.trees.max_priority, sampler.trees.max_priority)
    np.testing.assert_array_equal(other.batches_drawn, sampler.batches_drawn)
    for trainer in range(2):
        a, b = buf.sample(32, trainer=trainer), loaded.sample(32, trainer=trainer)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)


def test_trainers_have_independent_trees() -> None:
    sampler = PrioritizedNeighbor(alpha=1.0)
    buf = make_buffer(sampler, capacity=32, filled=32, n_trainers=3)
    buf.update_priorities(
        np.arange(32), np.full(32, 1e-3), trainer=2, generations=buf.write_generation[np.arange(32)]
    )
    buf.update_priorities(
        np.array([7]), np.array([1e6]), trainer=2, generations=buf.write_generation[np.array([7])]
    )
    batches = buf.sample_for_trainers(64)
    assert len(batches) == 3 and [b.trainer for b in batches] == [0, 1, 2]
    assert np.mean(batches[2].indices == 7) > 0.2  # runs of 4 from slot 7: 7, 8, 9, 10
    assert np.mean(np.isin(batches[2].indices, [7, 8, 9, 10])) > 0.95
    assert np.mean(np.isin(batches[0].indices, [7, 8, 9, 10])) < 0.5
    with pytest.raises(ValueError, match="shared_index"):
        buf.sample_for_trainers(64, shared_index=True)


def test_predictor_round_trip_and_registry() -> None:
    predictor = ThresholdPredictor((0.25, 0.5, 0.75), (1, 2, 3, 8))
    again = RunLengthPredictor.from_config(predictor.to_dict())
    assert isinstance(again, ThresholdPredictor) and again.config() == predictor.config()
    np.testing.assert_array_equal(
        predictor.run_lengths_for(np.array([0.0, 0.25, 0.6, 0.75, 1.2])), [1, 2, 3, 8, 8]
    )
    with pytest.raises(ValueError, match="unknown predictor"):
        RunLengthPredictor.from_config({"type": "Nope"})


def test_benchmark_suite_runs_tiny(monkeypatch) -> None:
    from marlbuf.bench.suites import prioritized as suite
    from marlbuf.bench.tools import common
    from marlbuf.workloads import Workload

    tiny = {
        "per_capacity": 4_000,
        "per_repeats": 2,
        "capacity": 2_000,
        "repeats": 1,
        "workloads": [Workload("predator_prey", 3)],
    }
    monkeypatch.setattr(suite, "QUICK", tiny)
    payload = suite.run(quick=True)
    cases = {r["case"] for r in payload["rows"]}
    assert {"marlbuf_sampler", "numpy", "per_round", "locality_round"} <= cases
    assert all(r.get("us_median", r.get("ms_median", 0)) > 0 for r in payload["rows"])
    assert payload["summary"]["per_vs_numpy"] > 0
    assert payload["config"]["per_capacity"] == 4_000
    json.dumps(payload, default=common._json_default)


@pytest.mark.parametrize("name", ["per", "locality"])
def test_state_files_of_the_binary_trees_load_and_draw_alike(name: str) -> None:
    """A prioritized buffer saved by marlbuf before the trees stored every third level
    (``tests/data``, written with the full binary trees) loads, and draws what that version
    drew from it: the same slots, the same totals, the same weights (to float32 rounding: the
    weights' power is now taken in single precision)."""
    from pathlib import Path

    data = Path(__file__).parents[1] / "data"
    buf = MultiAgentReplayBuffer.load(data / f"prioritized_{name}.npz")
    with np.load(data / "prioritized_draws.npz") as drawn:
        for t in range(buf.n_trainers):
            trees = buf.sampler.trees
            leaves = trees.leaves(t)
            assert_binary_tree(trees.sums[t], leaves, trees.leaf_offset)
            assert trees.total(t) == float(drawn[f"{name}_total_{t}"])
            batch = buf.sample(32, trainer=t)
            np.testing.assert_array_equal(batch.indices, drawn[f"{name}_indices_{t}"])
            np.testing.assert_allclose(batch.weights, drawn[f"{name}_weights_{t}"], rtol=1e-6)
