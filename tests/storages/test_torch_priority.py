"""The device priority index (:class:`marlbuf.stores.torch_priority.TensorPriorityTrees`) against
the host index (:class:`marlbuf.prioritized.PriorityTrees` and the Numba kernels) driven by the
same operations: trees, running maxima, draws, refused updates and their messages, state.

On the CPU, and on CUDA where a GPU is present (tests marked ``cuda``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from naive import naive_stored_nodes  # noqa: E402

from marlbuf._kernels import apply_td_errors, find_prefix, per_sample, rebuild  # noqa: E402
from marlbuf._kernels.sumtree import (  # noqa: E402
    MODE_ABS,
    MODE_GIVEN,
    MODE_SQUARED,
    TD_NEGATIVE,
    TD_NOT_FINITE,
    TD_OK,
    TD_OVERFLOW,
)
from marlbuf.prioritized import PriorityTrees  # noqa: E402
from marlbuf.samplers import Prioritized  # noqa: E402
from marlbuf.stores.torch_priority import (  # noqa: E402
    TensorPriorityTrees,
    check_td_result,
    first_td_error,
)
from tests.storages.test_torch_store import _device_waits_raise  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available())"),
]
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
MODES = {"abs": MODE_ABS, "squared": MODE_SQUARED, "given": MODE_GIVEN}
#: How far apart two libraries' ``p ** alpha`` may be, in units in the last place, for
#: ``alpha`` other than 0 and 1. Bit equality is impossible there: NumPy's vectorised power
#: (``PriorityTrees.fill_new``/``set``) and the C library's ``pow`` (inside the Numba update
#: kernel) already disagree in the last bit of a few percent of values; torch uses SLEEF on the
#: CPU and libdevice on CUDA. Each is within about 1 ulp of the exact power (CUDA's double
#: ``pow``: 2 ulp), so two of them are within 2 (3 with CUDA).
POW_ULPS = {"cpu": 2, "cuda": 3}


class HostIndex:
    """The host index as the samplers drive it: :class:`PriorityTrees` and, for TD errors, the
    Numba kernel followed by the running-maximum update of ``samplers._apply_td_errors``."""

    def __init__(self, capacity: int, n_trees: int, alpha: float, track_max: bool) -> None:
        self.trees = PriorityTrees(capacity, n_trees, alpha, track_max)

    def apply(
        self,
        trainer: int,
        slots: np.ndarray,
        td: np.ndarray,
        stale: np.ndarray,
        mode: int,
        eps: float,
        alpha: float,
    ) -> tuple[int, int]:
        trees = self.trees
        code, position, largest = apply_td_errors(
            trees.sums[trainer],
            trees.maxes[trainer] if trees.track_max else trees.empty,
            trees.leaf_offset,
            slots,
            td,
            stale,
            mode,
            eps,
            alpha,
            trees.track_max,
        )
        if code == TD_OK:
            trees.max_priority[trainer] = max(trees.max_priority[trainer], largest)
        return code, position


def host(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def assert_bits_equal(got: Any, want: np.ndarray) -> None:
    """Equal float64 arrays bit for bit (``-0.0`` is not ``0.0`` here), shapes included."""
    got = host(got) if isinstance(got, torch.Tensor) else got
    assert got.dtype == want.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def stored(trees: Any, leaf_offset: int) -> Any:
    """The nodes a host tree stores (the root, the leaves, every third level above them), of
    trees of shape (n_trees, 2 * leaf_offset): the device index keeps a full binary tree, whose
    nodes at those places are the host's, bit for bit."""
    if trees.shape[-1] == 0:  # no max-trees
        return trees
    return trees[:, naive_stored_nodes(leaf_offset)]


def assert_same_trees(dev: TensorPriorityTrees, ref: PriorityTrees, device: str) -> None:
    """Raw priorities, max-trees and running maxima bit for bit; every sum node the sum of its
    children as Numba computes it; sum leaves bit for bit where the power is exact (alpha 0 or
    1), else within :data:`POW_ULPS`."""
    assert_bits_equal(dev.max_priority, ref.max_priority)
    assert_bits_equal(stored(host(dev.maxes), dev.leaf_offset), stored(ref.maxes, ref.leaf_offset))
    sums = host(dev.sums)
    for t in range(dev.n_trees):
        rebuilt = sums[t].copy()
        rebuild(rebuilt, dev.leaf_offset, False)
        assert_bits_equal(sums[t], rebuilt)
    assert not sums[:, 0].any()
    if dev.alpha in (0.0, 1.0):
        assert_bits_equal(stored(sums, dev.leaf_offset), stored(ref.sums, ref.leaf_offset))
    else:
        got, want = sums[:, dev.leaf_offset :], ref.sums[:, dev.leaf_offset :]
        ulps = np.abs(got - want) / np.spacing(np.maximum(got, want))
        assert ulps.max() <= POW_ULPS[device]


def same_draws(dev: TensorPriorityTrees, trainer: int, uniforms: np.ndarray, beta: float) -> None:
    """The device draw equals ``per_sample`` over the same tree (loaded from the device's state:
    equal leaves give equal trees, bit for bit)."""
    ref = PriorityTrees(dev.capacity, dev.n_trees, dev.alpha, dev.track_max)
    ref.load_state_dict(dev.state_dict())
    assert_bits_equal(stored(host(dev.sums), dev.leaf_offset), stored(ref.sums, ref.leaf_offset))
    slots = np.empty(uniforms.shape[0], dtype=np.int64)
    weights = np.empty(uniforms.shape[0], dtype=np.float32)
    per_sample(ref.sums[trainer], ref.leaf_offset, uniforms, beta, slots, weights)
    got_slots, got_weights = dev.sample(trainer, uniforms, beta)
    assert got_slots.dtype == torch.int64 and got_weights.dtype == torch.float32
    np.testing.assert_array_equal(host(got_slots), slots)
    np.testing.assert_allclose(host(got_weights), weights, rtol=1e-6)


def edge_uniforms(rng: np.random.Generator, count: int) -> np.ndarray:
    """Random draws plus the ends of [0, 1): the first and the last leaf, rounding at the
    right end of the tree."""
    return np.concatenate([[0.0, np.nextafter(1.0, 0.0), 0.5], rng.random(count)])


# --------------------------------------------------------------------------- random sequences
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("capacity", "n_trees", "track_max"),
    [(1, 1, True), (5, 2, False), (37, 3, True), (64, 1, True)],
)
def test_random_operations_build_the_numba_trees(
    device: str, alpha: float, mode: str, capacity: int, n_trees: int, track_max: bool
) -> None:
    """fill_new, set and TD updates (repeated slots, stale entries, some refused, eps 0 or
    not), compared after every operation; then draws over the result."""
    rng = np.random.default_rng([capacity, n_trees, int(10 * alpha), MODES[mode]])
    dev = TensorPriorityTrees(capacity, n_trees, alpha, track_max, device)
    ref = HostIndex(capacity, n_trees, alpha, track_max)
    for step in range(24):
        op = step % 3
        trainer = int(rng.integers(n_trees))
        slots = rng.integers(0, capacity, size=int(rng.integers(1, 2 * capacity + 3)))
        scale = 10.0 ** rng.uniform(-3, 3)
        if op == 0:
            on_device = torch.as_tensor(slots, device=device) if step % 2 else slots
            dev.fill_new(on_device)
            ref.trees.fill_new(slots)
        elif op == 1:
            priorities = rng.exponential(scale, slots.shape[0])
            priorities[rng.random(slots.shape[0]) < 0.2] = [0.0, -0.0][step % 2]  # max of ±0
            dev.set(trainer, slots, priorities)
            ref.trees.set(trainer, slots, priorities)
        else:
            td = rng.standard_normal(slots.shape[0]) * scale
            if mode == "given":
                td = np.abs(td)
            td[rng.random(td.shape[0]) < 0.2] = 0.0
            if step % 4 == 2:  # refused: nothing may be written
                td[int(rng.integers(td.shape[0]))] = [np.nan, np.inf, -np.inf][rng.integers(3)]
            stale = rng.random(slots.shape[0]) < 0.3
            eps = [1e-6, 0.0][step % 2]
            code, position = dev.apply_td_errors(
                trainer, slots, torch.as_tensor(td, device=device), stale, MODES[mode], eps, alpha
            )
            assert code.device == position.device == dev.sums.device and code.dim() == 0
            assert (int(code), int(position)) == ref.apply(
                trainer, slots, td, stale, MODES[mode], eps, alpha
            )
        assert_same_trees(dev, ref.trees, device)
    for trainer in range(n_trees):
        uniforms = edge_uniforms(rng, 64)
        if ref.trees.total(trainer) > 0.0:
            same_draws(dev, trainer, uniforms, beta=0.4)
            if alpha in (0.0, 1.0):  # the very trees the host index built
                slots = np.empty(uniforms.shape[0], dtype=np.int64)
                weights = np.empty(uniforms.shape[0], dtype=np.float32)
                per_sample(ref.trees.sums[trainer], dev.leaf_offset, uniforms, 0.4, slots, weights)
                np.testing.assert_array_equal(host(dev.sample(trainer, uniforms, 0.4)[0]), slots)


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_slots_keep_the_last_non_stale_write(device: str) -> None:
    dev = TensorPriorityTrees(6, 1, 1.0, True, device)
    dev.fill_new(np.arange(6))
    slots = np.array([2, 4, 2, 2, 4, 5])
    td = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    stale = np.array([False, False, False, True, True, True])  # slot 5: only a stale write
    code, _ = dev.apply_td_errors(0, slots, td, stale, MODE_GIVEN, 0.0, 1.0)
    assert int(code) == TD_OK
    assert host(dev.leaves(0)).tolist() == [1.0, 1.0, 3.0, 1.0, 2.0, 1.0]
    assert host(dev.priorities(0)).tolist() == [1.0, 1.0, 3.0, 1.0, 2.0, 1.0]
    assert float(dev.max_priority[0]) == 3.0  # the stale 6.0 does not count
    assert dev.total(0) == 9.0 and float(dev.total_tensor(0)) == 9.0
    dev.set(0, np.array([1, 1]), np.array([7.0, 0.5]))
    assert host(dev.leaves(0))[1] == 0.5 and float(dev.max_priority[0]) == 7.0


@pytest.mark.parametrize("device", DEVICES)
def test_td_errors_that_require_grad_update_outside_the_graph(device: str) -> None:
    dev = TensorPriorityTrees(4, 1, 1.0, True, device)
    dev.fill_new(np.arange(4))
    weights = torch.tensor([2.0, -3.0], device=device, requires_grad=True)
    td = weights * 1.0  # not a leaf of the graph, as a critic's TD errors are not
    dev.apply_td_errors(0, [0, 2], td, None, MODE_ABS, 0.0, 1.0)
    dev.set(0, [1], td[:1])
    assert not (dev.sums.requires_grad or dev.maxes.requires_grad or dev.max_priority.requires_grad)
    assert host(dev.leaves(0)).tolist() == [2.0, 2.0, 3.0, 1.0]


@pytest.mark.parametrize("device", DEVICES)
def test_an_update_visits_only_the_paths_of_its_slots(device: str) -> None:
    """At 2**20 + 3 slots (a tree of 2**22 nodes) batches of 1024 updates: the trees stay the
    Numba trees. (The work is O(B log capacity) by construction: the parents written are those
    of the sorted batch, level by level; no operation but load_state_dict spans the capacity.)"""
    capacity = 2**20 + 3
    rng = np.random.default_rng(5)
    dev = TensorPriorityTrees(capacity, 1, 1.0, True, device)
    ref = HostIndex(capacity, 1, 1.0, True)
    written = rng.integers(0, capacity, 4096)
    dev.fill_new(written)
    ref.trees.fill_new(written)
    for _ in range(8):
        slots = rng.choice(written, 1024)
        td = rng.standard_normal(1024)
        stale = rng.random(1024) < 0.1
        dev.apply_td_errors(0, slots, td, stale, MODE_ABS, 1e-6, 1.0)
        ref.apply(0, slots, td, stale, MODE_ABS, 1e-6, 1.0)
    assert_same_trees(dev, ref.trees, device)
    same_draws(dev, 0, edge_uniforms(rng, 256), beta=0.5)


# --------------------------------------------------------------------------- searches
@pytest.mark.parametrize("device", DEVICES)
def test_prefix_search_follows_the_host_rules_at_boundaries_and_zeros(device: str) -> None:
    """Targets on interval boundaries go right (``>=``), zero leaves are never found, and a
    target at or past the total ends at the last non-zero leaf."""
    leaves = np.array([[0.0, 2.0, 0.0, 0.0, 3.0, 1.0, 0.0, 0.0, 0.0]])
    dev = TensorPriorityTrees(9, 1, 1.0, False, device)
    dev.load_state_dict({"leaves": leaves, "max_priority": np.ones(1)})
    targets = np.array([0.0, 1.0, 2.0, np.nextafter(2.0, 0.0), 5.0, 5.5, 6.0, 7.0, 1e-300])
    want = np.empty(targets.shape[0], dtype=np.int64)
    find_prefix(host(dev.sums)[0], dev.leaf_offset, targets, want)
    got = host(dev.find_prefix(0, targets))
    np.testing.assert_array_equal(got, want)
    assert got.tolist() == [1, 1, 4, 1, 5, 5, 5, 5, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_capacity_one_is_its_own_root(device: str) -> None:
    dev = TensorPriorityTrees(1, 2, 0.6, True, device)
    ref = HostIndex(1, 2, 0.6, True)
    for tree in (dev, ref.trees):
        tree.fill_new(np.array([0, 0]))
    td = np.array([4.0, 9.0])
    dev.apply_td_errors(1, np.array([0, 0]), td, np.zeros(2, bool), MODE_ABS, 0.0, 0.6)
    ref.apply(1, np.array([0, 0]), td, np.zeros(2, bool), MODE_ABS, 0.0, 0.6)
    assert_same_trees(dev, ref.trees, device)
    assert dev.sums.shape == (2, 2) and float(dev.max_priority[1]) == 9.0
    slots, weights = dev.sample(1, np.array([0.0, 0.7]), 1.0)
    assert host(slots).tolist() == [0, 0] and host(weights).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("device", DEVICES)
def test_draw_frequencies_and_weights_follow_the_priorities(device: str) -> None:
    """200,000 draws: slot frequencies against ``P(i) = p_i^alpha / sum_k p_k^alpha`` (a
    chi-square test with a fixed seed), and every weight ``(P_i / min_b P_b)^-beta``."""
    capacity, alpha, beta, draws = 37, 0.6, 0.4, 200_000
    rng = np.random.default_rng(11)
    priorities = rng.uniform(0.05, 5.0, capacity)
    dev = TensorPriorityTrees(capacity, 1, alpha, False, device)
    dev.set(0, np.arange(capacity), priorities)
    slots, weights = dev.sample(0, torch.as_tensor(rng.random(draws), device=device), beta)
    probability = priorities**alpha / (priorities**alpha).sum()
    counts = np.bincount(host(slots), minlength=capacity)
    try:
        from scipy.stats import chisquare
    except ImportError:  # a loose bound instead: 5 standard deviations of every count
        expected = draws * probability
        assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))
    else:
        assert chisquare(counts, draws * probability).pvalue > 1e-3
    sampled = host(dev.leaves(0))[host(slots)] / dev.total(0)
    np.testing.assert_allclose(host(weights), (sampled / sampled.min()) ** -beta, rtol=1e-6)
    assert host(weights).max() == 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_draw_brings_slots_weights_and_total_to_the_host(device: str) -> None:
    dev = TensorPriorityTrees(10, 2, 0.6, False, device)
    dev.set(1, np.arange(10), np.arange(1.0, 11.0))
    uniforms = np.random.default_rng(2).random(20)
    slots, weights, total = dev.draw(1, uniforms, 0.5)
    want_slots, want_weights = dev.sample(1, uniforms, 0.5)
    assert slots.dtype == np.int64 and weights.dtype == np.float32 and isinstance(total, float)
    np.testing.assert_array_equal(slots, host(want_slots))
    np.testing.assert_array_equal(weights, host(want_weights))
    assert total == dev.total(1)
    probabilities = dev.probabilities(1, np.array([[0, 9]]))
    assert probabilities.shape == (1, 2)
    np.testing.assert_array_equal(probabilities[0], host(dev.leaves(1))[[0, 9]] / total)


# --------------------------------------------------------------------------- refused updates
LARGEST = float(np.finfo(np.float64).max)
BAD = [
    # mode, alpha, td, stale positions, code, position
    ("abs", 0.6, [1.0, 2.0, np.nan, 1.0, 1.0, 1.0], [], TD_NOT_FINITE, 2),
    ("abs", 0.6, [np.inf, 2.0, 1.0, 1.0, 1.0, 1.0], [], TD_NOT_FINITE, 0),
    ("squared", 1.0, [1.0, 2.0, 3.0, -np.inf, 1.0, 1.0], [3], TD_NOT_FINITE, 3),  # stale too
    ("given", 0.6, [1.0, -1.0, 1.0, 1.0, np.nan, 1.0], [], TD_NEGATIVE, 1),
    ("given", 0.0, [1.0, 1.0, 1.0, 1.0, 1.0, -0.5], [5], TD_NEGATIVE, 5),
    ("squared", 0.6, [1.0, 1.0, 1e200, 1.0, np.nan, 1.0], [], TD_OVERFLOW, 2),
    ("abs", 2.0, [1.0, 1.0, 1.0, 1.0, 1e200, 1.0], [], TD_OVERFLOW, 4),  # p**alpha overflows
    ("given", 1.0, [1.0, 1.0, 1.0, 1.0, 1.0, LARGEST], [], TD_OVERFLOW, 5),  # d + eps overflows
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mode", "alpha", "td", "stale_at", "code", "position"), BAD)
def test_a_bad_entry_writes_nothing_and_raises_the_host_message(
    device: str,
    mode: str,
    alpha: float,
    td: list[float],
    stale_at: list[int],
    code: int,
    position: int,
) -> None:
    slots = np.array([0, 3, 5, 3, 1, 2])
    values = np.array(td)
    stale = np.isin(np.arange(6), stale_at)
    eps = 1e300 if td[-1] == LARGEST else 1e-6
    dev = TensorPriorityTrees(6, 1, alpha, True, device)
    dev.fill_new(np.arange(6))
    dev.apply_td_errors(0, np.arange(6), np.arange(6.0), None, MODES[mode], eps, alpha)
    before = [t.clone() for t in (dev.sums, dev.maxes, dev.max_priority)]
    result = dev.apply_td_errors(0, slots, values, stale, MODES[mode], eps, alpha)
    assert (int(result[0]), int(result[1])) == (code, position)
    for tensor, old in zip((dev.sums, dev.maxes, dev.max_priority), before):
        assert torch.equal(tensor, old)
    ref = HostIndex(6, 1, alpha, True)
    assert ref.apply(0, slots, values, stale, MODES[mode], eps, alpha) == (code, position)
    sampler = Prioritized(alpha=alpha, eps=eps, priority=mode)
    sampler.bind(6, 1)
    sampler.on_write(np.arange(6))
    with pytest.raises(ValueError) as host_error:
        sampler.update_priorities(slots, values, 0, stale)
    setting = f"priority={mode!r}, alpha={float(alpha)}"
    with pytest.raises(ValueError) as device_error:
        check_td_result(*result, torch.as_tensor(values, device=device), setting)
    assert str(device_error.value) == str(host_error.value)
    assert first_td_error([(0, -1, None), (*result, values), (TD_OVERFLOW, 0, None)]) == (
        code,
        position,
        values,
    )


def test_check_td_result_names_float32_values_as_the_host_does() -> None:
    td = torch.tensor([0.1, float("nan")], dtype=torch.float32)
    dev = TensorPriorityTrees(2, 1, 0.6, False, "cpu")
    result = dev.apply_td_errors(0, [0, 1], td, None, MODE_ABS, 1e-6, 0.6)
    check_td_result(torch.tensor(0), torch.tensor(-1), td, "")  # fine: nothing raised
    with pytest.raises(ValueError, match=r"td_errors\[1\]=nan \(check the critic"):
        check_td_result(*result, td, "")
    assert first_td_error([]) == (TD_OK, -1, None)
    assert first_td_error([(torch.tensor(0), torch.tensor(-1), td)]) == (TD_OK, -1, None)


def test_bad_arguments_are_refused_with_the_argument_named() -> None:
    with pytest.raises(ValueError, match="capacity must be a positive int; got capacity=0"):
        TensorPriorityTrees(0, 1, 0.6, False, "cpu")
    with pytest.raises(ValueError, match="alpha must be finite"):
        TensorPriorityTrees(4, 1, -1.0, False, "cpu")
    dev = TensorPriorityTrees(4, 1, 0.6, False, "cpu")
    with pytest.raises(ValueError, match="mode must be MODE_ABS"):
        dev.apply_td_errors(0, [1], [1.0], None, 7, 0.0, 0.6)
    with pytest.raises(ValueError, match=r"of one length; got shapes \(2,\), \(1,\)"):
        dev.apply_td_errors(0, [1, 2], [1.0], None, MODE_ABS, 0.0, 0.6)
    for td in (np.array(["a"]), [True], torch.ones(1, dtype=torch.complex64)):
        with pytest.raises(TypeError, match="td_errors must be a real numeric array; got dtype"):
            dev.apply_td_errors(0, [1], td, None, MODE_ABS, 0.0, 0.6)
    with pytest.raises(ValueError, match="track_max=True"):
        dev.priorities(0)
    code, position = dev.apply_td_errors(0, [], [], None, MODE_ABS, 0.0, 0.6)
    assert (int(code), int(position)) == (TD_OK, -1)
    dev.fill_new([])
    dev.set(0, [], [])
    assert dev.sample(0, np.zeros(0), 0.5)[1].shape == (0,) and dev.total(0) == 0.0


# --------------------------------------------------------------------------- state
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("capacity", "track_max"), [(1, True), (37, True), (37, False)])
def test_state_loads_into_either_index(device: str, capacity: int, track_max: bool) -> None:
    rng = np.random.default_rng(capacity)
    ref = HostIndex(capacity, 2, 0.6, track_max)
    ref.trees.fill_new(np.arange(capacity))
    for trainer in range(2):
        slots = rng.integers(0, capacity, 50)
        ref.apply(trainer, slots, rng.standard_normal(50) * 4, rng.random(50) < 0.2, 0, 1e-6, 0.6)
    dev = TensorPriorityTrees(capacity, 2, 0.6, track_max, device)
    dev.load_state_dict(ref.trees.state_dict())  # the leaves, rebuilt: the same trees
    offset = dev.leaf_offset
    assert_bits_equal(stored(host(dev.sums), offset), stored(ref.trees.sums, offset))
    assert_bits_equal(stored(host(dev.maxes), offset), stored(ref.trees.maxes, offset))
    assert_bits_equal(dev.max_priority, ref.trees.max_priority)
    dev.set(1, np.array([0]), np.array([9.0]))
    state = dev.state_dict()
    want = PriorityTrees(capacity, 2, 0.6, track_max).state_dict()
    assert state.keys() == want.keys()
    for key in state:
        assert isinstance(state[key], np.ndarray)
        assert (state[key].shape, state[key].dtype) == (want[key].shape, want[key].dtype)
    back = PriorityTrees(capacity, 2, 0.6, track_max)
    back.load_state_dict(state)
    assert_bits_equal(stored(host(dev.sums), offset), stored(back.sums, offset))
    assert_bits_equal(stored(host(dev.maxes), offset), stored(back.maxes, offset))
    again = TensorPriorityTrees(capacity, 2, 0.6, track_max, device)
    again.load_state_dict(state)
    assert torch.equal(again.sums, dev.sums) and torch.equal(again.maxes, dev.maxes)
    with pytest.raises(ValueError, match="'leaves' has shape"):
        again.load_state_dict({**state, "leaves": state["leaves"][:1]})


# --------------------------------------------------------------------------- CUDA specifics
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available())")
def test_updates_and_draws_never_wait_for_the_device() -> None:
    dev = TensorPriorityTrees(1000, 2, 0.6, True, "cuda")
    slots = torch.arange(1000, device="cuda")
    td = torch.randn(256, device="cuda", dtype=torch.float32)
    indices = torch.randint(0, 1000, (256,), device="cuda")
    stale = torch.rand(256, device="cuda") < 0.1
    uniforms = torch.rand(256, device="cuda", dtype=torch.float64)
    dev.fill_new(slots)  # warm-up: lazy CUDA state
    dev.sample(0, uniforms, 0.5)
    with _device_waits_raise():
        dev.fill_new(slots[:100])
        code, position = dev.apply_td_errors(1, indices, td, stale, MODE_ABS, 1e-6, 0.6)
        dev.set(0, indices, td.double().abs())
        dev.raise_max(torch.full((2,), 3.0, device="cuda", dtype=torch.float64))
        dev.sample(1, uniforms, 0.5)
        dev.total_tensor(1)
    check_td_result(code, position, td, "")
