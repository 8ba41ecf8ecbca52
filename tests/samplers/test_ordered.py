"""Memory-ordered draws (``order="memory"``): the kernels against their NumPy twins, the
distributions (slot counts, order statistics, uniform subsets, priorities and weights), ascending
output, seeding, persistence and bad arguments."""

from __future__ import annotations

import itertools
import math

import naive
import numpy as np
import pytest
from datagen import random_step_data
from scipy import stats

from marlbuf import AgentSpec, MultiAgentReplayBuffer, _config
from marlbuf._kernels import merge_distinct, selection_sample, sorted_slots, sorted_uniforms
from marlbuf.samplers import (
    ORDERS,
    Prioritized,
    PrioritizedNeighbor,
    Sampler,
    Uniform,
    ascending_uniform,
)

SPECS = {f"agent_{i}": AgentSpec(obs_shape=(3,), action_shape=(2,)) for i in range(2)}
#: a p-value below this fails a distribution test (one false alarm in 1000 runs per test)
ALPHA = 1e-3


def fill(sampler: Sampler, capacity: int, filled: int, seed: int = 0) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(SPECS, capacity, sampler=sampler, seed=seed)
    buf.extend(**random_step_data(SPECS, filled, np.random.default_rng(seed)))
    return buf


# ------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("batch", [1, 2, 17, 1024])
def test_sorted_uniforms_matches_naive(batch: int) -> None:
    exponentials = np.random.default_rng(batch).standard_exponential(batch + 1)
    out = np.empty(batch)
    sorted_uniforms(exponentials, out)
    np.testing.assert_array_equal(out, naive.sorted_uniforms(exponentials))
    assert np.all(np.diff(out) >= 0) and 0.0 <= out[0] and out[-1] <= 1.0


@pytest.mark.parametrize(("batch", "size"), [(1, 1), (5, 1), (7, 3), (64, 100), (1024, 10**6)])
def test_sorted_slots_matches_naive(batch: int, size: int) -> None:
    exponentials = np.random.default_rng(size).standard_exponential(batch + 1)
    out = np.empty(batch, np.int64)
    sorted_slots(exponentials, size, out)
    np.testing.assert_array_equal(out, naive.sorted_slots(exponentials, size))
    assert np.all(np.diff(out) >= 0) and out.min() >= 0 and out.max() < size


def test_sorted_slots_clamps_a_vanishing_last_spacing() -> None:
    # U_(B) = 1 when the last spacing is 0: the slot is clamped to size - 1, never size
    exponentials = np.array([0.5, 0.25, 0.0])
    out = np.empty(2, np.int64)
    sorted_slots(exponentials, 10, out)
    np.testing.assert_array_equal(out, [6, 9])
    np.testing.assert_array_equal(out, naive.sorted_slots(exponentials, 10))


@pytest.mark.parametrize("seed", range(8))
def test_merge_distinct_matches_naive(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_kept, n_new = rng.integers(0, 20), rng.integers(0, 20)
    kept = np.unique(rng.integers(0, 30, n_kept))
    new = np.sort(rng.integers(0, 30, n_new))  # repeats of its own and of kept
    out = np.full(len(kept) + n_new, -7, np.int64)
    padded = np.concatenate([kept, np.full(3, -1, np.int64)])  # entries past n_kept are ignored
    n = merge_distinct(padded, len(kept), new, out)
    np.testing.assert_array_equal(out[:n], naive.merge_distinct(kept, new))


@pytest.mark.parametrize(("size", "count"), [(1, 0), (1, 1), (10, 3), (10, 10), (100, 37)])
def test_selection_sample_matches_naive(size: int, count: int) -> None:
    uniforms = np.random.default_rng(size + count).random(size)
    out = np.empty(count, np.int64)
    selection_sample(uniforms, count, out)
    np.testing.assert_array_equal(out, naive.selection_sample(uniforms, count))
    assert len(np.unique(out)) == count and np.all(np.diff(out) > 0)


# ------------------------------------------------------------------- uniform, replacement
def test_memory_order_slot_counts_are_uniform() -> None:
    rng = np.random.default_rng(0)
    size = 97
    counts = np.zeros(size)
    for _ in range(400):
        indices = ascending_uniform(256, size, rng, True)
        assert np.all(np.diff(indices) >= 0)
        counts += np.bincount(indices, minlength=size)
    assert stats.chisquare(counts).pvalue > ALPHA


def order_statistic_pmf(k: int, batch: int, size: int) -> np.ndarray:
    """Exact law of the k-th smallest (1-based) of ``batch`` i.i.d. uniform slots of
    ``[0, size)``: ``P(X_(k) <= x) = P(Binomial(batch, (x + 1) / size) >= k)``."""
    x = np.arange(size)
    cdf = stats.binom.sf(k - 1, batch, (x + 1) / size)
    return np.diff(np.concatenate([[0.0], cdf]))


def binned_chisquare(observed: np.ndarray, probability: np.ndarray, n: int) -> float:
    """Chi-square p-value with neighbouring cells merged until each expects at least 5."""
    expected = probability * n
    obs_bins, exp_bins = [], []
    acc_o = acc_e = 0.0
    for o, e in zip(observed, expected):
        acc_o += o
        acc_e += e
        if acc_e >= 5:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    obs_bins[-1] += acc_o
    exp_bins[-1] += acc_e
    exp = np.array(exp_bins)
    return float(stats.chisquare(obs_bins, exp / exp.sum() * sum(obs_bins)).pvalue)


@pytest.mark.parametrize("k", [1, 8, 16])  # the minimum, the median, the maximum
def test_order_statistics_follow_the_exact_law(k: int) -> None:
    batch, size, n_batches = 16, 40, 20_000
    rng = np.random.default_rng(k)
    picked = np.array([ascending_uniform(batch, size, rng, True)[k - 1] for _ in range(n_batches)])
    observed = np.bincount(picked, minlength=size)
    pmf = order_statistic_pmf(k, batch, size)
    assert pmf.sum() == pytest.approx(1.0)
    assert binned_chisquare(observed, pmf, n_batches) > ALPHA


def test_memory_order_is_the_law_of_sorted_random_draws() -> None:
    # two-sample check on a middle order statistic: ordered draws vs sorted rng.integers
    batch, size, n = 32, 1000, 6000
    rng = np.random.default_rng(11)
    ordered = [ascending_uniform(batch, size, rng, True)[batch // 2] for _ in range(n)]
    sorted_random = [np.sort(rng.integers(0, size, batch))[batch // 2] for _ in range(n)]
    assert stats.ks_2samp(ordered, sorted_random).pvalue > ALPHA


# ---------------------------------------------------------------- uniform, no replacement
@pytest.mark.parametrize(
    ("size", "batch", "fraction"),
    [
        (7, 3, 1.0),  # merging sorted chunks of draws (B / size never above the fraction)
        (7, 3, 0.0),  # selection sampling (always above)
        (12, 2, 1.0),
        (12, 2, 0.0),
    ],
)
def test_distinct_draws_are_uniform_over_subsets(
    monkeypatch: pytest.MonkeyPatch, size: int, batch: int, fraction: float
) -> None:
    monkeypatch.setattr(_config, "SELECTION_SAMPLING_FRACTION", fraction)
    rng = np.random.default_rng(size * 10 + batch)
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(size), batch))}
    counts = np.zeros(len(subsets))
    for _ in range(300 * len(subsets)):
        indices = ascending_uniform(batch, size, rng, False)
        assert np.all(np.diff(indices) > 0)  # strictly ascending: no repeats
        counts[subsets[tuple(indices.tolist())]] += 1
    assert len(subsets) == math.comb(size, batch)
    assert stats.chisquare(counts).pvalue > ALPHA


@pytest.mark.parametrize(("size", "batch"), [(2000, 64), (200, 60), (64, 64)])
def test_distinct_draws_include_every_slot_with_probability_b_over_size(
    size: int, batch: int
) -> None:
    sampler = Uniform(replace=False, order="memory")
    rng = np.random.default_rng(size)
    n_batches = 3000
    counts = np.zeros(size)
    for _ in range(n_batches):
        indices, weights = sampler.sample(batch, size, rng)
        assert weights is None and indices.dtype == np.int64 and indices.shape == (batch,)
        assert np.all(np.diff(indices) > 0) and indices[0] >= 0 and indices[-1] < size
        counts[indices] += 1
    p = batch / size
    if p == 1.0:
        assert np.all(counts == n_batches)
        return
    # inclusion indicators of a uniform subset: variance p(1 - p), covariance -p(1 - p)/(n - 1),
    # so the scaled sum of squares is chi-square with size - 1 degrees of freedom
    statistic = np.sum((counts - n_batches * p) ** 2) / (
        n_batches * p * (1 - p) * size / (size - 1)
    )
    assert stats.chi2.sf(statistic, size - 1) > ALPHA
    assert stats.chi2.cdf(statistic, size - 1) > ALPHA  # not too even either


# ------------------------------------------------------------------------- buffer-level
@pytest.mark.parametrize("replace", [True, False])
def test_uniform_memory_order_in_a_buffer(replace: bool) -> None:
    buf = fill(Uniform(replace=replace, order="memory"), capacity=50, filled=30)
    for _ in range(50):
        batch = buf.sample(16)
        assert batch.indices.max() < 30  # only filled slots while the ring fills
        assert np.all(np.diff(batch.indices) >= (0 if replace else 1))
        np.testing.assert_array_equal(
            batch.reward["agent_0"], buf.gather(batch.indices).reward["agent_0"]
        )
    rounds = buf.sample_for_trainers(8)
    assert all(np.all(np.diff(b.indices) >= 0) for b in rounds)


def test_wrapped_ring_ascends_in_slot_order_not_age() -> None:
    buf = fill(Uniform(replace=False, order="memory"), capacity=20, filled=27)  # cursor at 7
    indices = buf.sample(20).indices
    np.testing.assert_array_equal(indices, np.arange(20))  # slot 0 is newer than slot 7


@pytest.mark.parametrize(
    "make",
    [
        lambda order: Uniform(order=order),
        lambda order: Uniform(replace=False, order=order),
        lambda order: Prioritized(order=order),
    ],
)
def test_same_seed_same_indices(make) -> None:
    a = fill(make("memory"), 64, 64, seed=5)
    b = fill(make("memory"), 64, 64, seed=5)
    for _ in range(5):
        np.testing.assert_array_equal(a.sample(32).indices, b.sample(32).indices)
    other = fill(make("random"), 64, 64, seed=5)
    assert not np.array_equal(other.sample(32).indices, a.sample(32).indices)


@pytest.mark.parametrize(
    "sampler",
    [
        Uniform(order="memory"),
        Uniform(replace=False, order="random"),
        Prioritized(order="memory"),
        Prioritized(order="random"),
    ],
)
def test_order_survives_save_and_load(tmp_path, sampler: Sampler) -> None:
    buf = fill(sampler, 32, 40)
    assert buf.sampler.config()["order"] == sampler.order
    assert Sampler.from_config(type(sampler).__name__, sampler.config()).order == sampler.order
    buf.save(tmp_path / "b.npz")
    loaded = MultiAgentReplayBuffer.load(tmp_path / "b.npz")
    assert loaded.sampler.order == sampler.order and repr(loaded.sampler) == repr(buf.sampler)
    np.testing.assert_array_equal(loaded.sample(8).indices, buf.sample(8).indices)


@pytest.mark.parametrize("cls", [Uniform, Prioritized])
@pytest.mark.parametrize("bad", ["sorted", "MEMORY", None, 1])
def test_bad_order_names_the_argument_value_and_choices(cls, bad) -> None:
    with pytest.raises(
        ValueError, match=r"order must be one of \('random', 'memory'\); got order="
    ):
        cls(order=bad)


def test_prioritized_neighbor_keeps_draw_order() -> None:
    sampler = PrioritizedNeighbor()
    assert sampler.order == "random" and "order" not in sampler.config()
    assert Sampler.from_config("PrioritizedNeighbor", sampler.config()).order == "random"
    with pytest.raises(TypeError):
        PrioritizedNeighbor(order="memory")  # type: ignore[call-arg]
    assert ORDERS == ("random", "memory")


# --------------------------------------------------------------------------- prioritized
def set_priorities(buf: MultiAgentReplayBuffer, priorities: np.ndarray, trainer: int = 0) -> None:
    idx = np.arange(len(priorities))
    buf.update_priorities(idx, priorities, trainer=trainer, generations=buf.write_generation[idx])


def test_prioritized_memory_order_frequencies_follow_priorities() -> None:
    buf = fill(Prioritized(alpha=0.6, beta=0.5, order="memory"), capacity=50, filled=40)
    priorities = np.random.default_rng(2).uniform(0.05, 3.0, size=40)
    set_priorities(buf, priorities)
    counts = np.zeros(50)
    for _ in range(100):
        indices = buf.sample(1000).indices
        assert np.all(np.diff(indices) >= 0)
        counts += np.bincount(indices, minlength=50)
    assert counts[40:].sum() == 0  # unwritten slots
    expected = (priorities + 1e-6) ** 0.6
    assert stats.chisquare(counts[:40], expected / expected.sum() * counts.sum()).pvalue > ALPHA


def test_prioritized_memory_order_weights_follow_the_formula() -> None:
    buf = fill(Prioritized(alpha=0.7, beta=0.4, order="memory"), capacity=30, filled=30)
    priorities = np.random.default_rng(3).uniform(0.1, 5.0, size=30)
    set_priorities(buf, priorities, trainer=1)
    batch = buf.sample(200, trainer=1)
    assert np.all(np.diff(batch.indices) >= 0)
    probability = (priorities + 1e-6) ** 0.7
    probability /= probability.sum()
    raw = (30 * probability[batch.indices]) ** -0.4
    np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-5)
    assert batch.weights.dtype == np.float32 and batch.weights.max() == 1.0
    # priority updates follow the indices: a slot set to 0 (eps only) is then rarely drawn
    buf.update_priorities(batch.indices, np.zeros(200), trainer=1, generations=batch.generations)
    assert set(buf.sample(200, trainer=1).indices) <= set(range(30))


def test_prioritized_memory_order_skips_zero_priority_slots() -> None:
    buf = fill(Prioritized(alpha=1.0, eps=0.0, priority="given", order="memory"), 64, 64)
    priorities = np.zeros(64)
    priorities[[0, 5, 63]] = [1.0, 2.0, 3.0]
    set_priorities(buf, priorities)
    for _ in range(20):
        indices = buf.sample(500).indices
        assert set(indices.tolist()) <= {0, 5, 63} and np.all(np.diff(indices) >= 0)


# --------------------------------------------------------------------------- torch backend
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device"),
        ],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("sampler", "strict"),
    [
        (Uniform(order="memory"), False),
        (Uniform(replace=False, order="memory"), True),
        (Prioritized(order="memory"), False),
    ],
)
def test_torch_store_draws_in_memory_order(sampler: Sampler, strict: bool, device: str) -> None:
    pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(SPECS, 40, sampler=sampler, seed=0, device=device)
    buf.extend(**random_step_data(SPECS, 30, np.random.default_rng(0)))
    counts = np.zeros(40)
    for _ in range(200):
        for batch in buf.sample_for_trainers(20):
            indices = np.asarray(batch.indices)  # host indices on every store
            assert np.all(np.diff(indices) >= (1 if strict else 0))
            counts += np.bincount(indices, minlength=40)
    assert counts[30:].sum() == 0  # only filled slots
    assert stats.chisquare(counts[:30]).pvalue > ALPHA  # fresh priorities: all equal


# ------------------------------------------------------------------------------- trainers
def test_defaults_uniform_memory_prioritized_random() -> None:
    assert Uniform().order == "memory" and Uniform(replace=False).order == "memory"
    assert Prioritized().order == "random"
    assert Uniform().config() == {"replace": True, "order": "memory"}
    # a configuration saved before the option existed rebuilds with today's default
    assert Sampler.from_config("Uniform", {"replace": True}).order == "memory"


def test_drop_in_adapters_keep_the_originals_draw_order() -> None:
    from marlbuf.compat.maddpg import ReplayBuffer
    from marlbuf.compat.tf2marl import EfficientReplayBuffer

    assert ReplayBuffer(1e3).store.sampler.order == "random"
    tf2 = EfficientReplayBuffer(1e3, 2, [(3,), (3,)], [(2,), (2,)])
    assert tf2.buffer.sampler.order == "random"


def test_train_config_sample_order() -> None:
    from marlbuf.algos.config import LEGACY_SAMPLE_ORDER, TrainConfig

    assert TrainConfig().sample_order is None
    assert TrainConfig(sample_order="memory").sample_order == "memory"
    with pytest.raises(ValueError, match=r"sample_order must be one of .*got sample_order='up'"):
        TrainConfig(sample_order="up")
    saved = TrainConfig(sample_order="memory").to_dict()
    assert TrainConfig.from_dict(saved).sample_order == "memory"
    del saved["sample_order"]  # a configuration written before the field existed
    assert TrainConfig.from_dict(saved).sample_order == LEGACY_SAMPLE_ORDER == "random"


@pytest.mark.parametrize(
    ("sampler", "order", "expected"),
    [
        ("uniform", "memory", "memory"),
        ("uniform", "random", "random"),
        ("prioritized", "memory", "memory"),
        ("prioritized_neighbor", "memory", "random"),  # runs: always draw order
        ("uniform", None, "memory"),  # None: each sampler's own default
        ("prioritized", None, "random"),
    ],
)
def test_trainers_build_the_ordered_sampler(sampler: str, order: str, expected: str) -> None:
    pytest.importorskip("torch")
    from marlbuf.algos import TrainConfig, build_sampler

    built = build_sampler(TrainConfig(sampler=sampler, sample_order=order))
    assert built.order == expected  # type: ignore[attr-defined]


def test_train_cli_flag_sets_the_order() -> None:
    pytest.importorskip("torch")
    from marlbuf.algos.cli import build_parser, config_from_args

    args = build_parser().parse_args(["--sample-order", "memory"])
    assert config_from_args(args).sample_order == "memory"
    default = config_from_args(build_parser().parse_args([]))
    from marlbuf.algos.config import TrainConfig

    assert default.sample_order == TrainConfig().sample_order


def test_drop_in_make_index_larger_than_the_data_keeps_memory_order() -> None:
    from marlbuf.compat.maddpg import make_buffers

    buffers = make_buffers(2, 100, sampler=Uniform(order="memory"), seed=0)
    for _ in range(5):  # 5 steps, then an index of 16 (with replacement, as the original)
        obs = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
        act = [np.zeros(2, np.float32), np.zeros(2, np.float32)]
        for i, buf in enumerate(buffers):
            buf.add(obs[i], act[i], 0.0, obs[i], False)
    index = buffers[0].make_index(16)
    assert len(index) == 16 and index == sorted(index) and max(index) < 5
