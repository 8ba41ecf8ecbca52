"""Sum-tree (and max-tree) kernels for prioritized sampling.

A tree over ``capacity`` leaves is a flat float64 array of ``2 * leaf_offset`` nodes, where
``leaf_offset`` is the smallest power of two ``>= capacity``: node 1 is the root, node ``n`` has
children ``2n`` and ``2n + 1``, and slot ``s`` is the leaf ``leaf_offset + s`` (node 0 and the
leaves past ``capacity`` stay 0). A sum-tree node holds the sum of its children, a max-tree node
their maximum.

Why float64, and why parents are *recomputed* from their children instead of adjusted by a
delta: a float32 tree, or one updated by adding ``new - old`` up the path, drifts after
millions of updates until a subtree whose leaves are all zero carries a small positive sum and
gets sampled. Recomputing ``parent = left + right`` makes every node an exact function of the
current leaves (the tree equals a fresh rebuild, bit for bit), so there is no drift at all.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _propagate(sum_tree: np.ndarray, max_tree: np.ndarray, node: int, track_max: bool) -> None:
    """Recompute the ancestors of ``node`` from their children (sum, and max if tracked)."""
    node >>= 1
    while node >= 1:
        left = 2 * node
        sum_tree[node] = sum_tree[left] + sum_tree[left + 1]
        if track_max:
            max_tree[node] = max(max_tree[left], max_tree[left + 1])
        node >>= 1


@njit(cache=True, nogil=True)
def set_leaves(
    sum_tree: np.ndarray,
    max_tree: np.ndarray,
    leaf_offset: int,
    slots: np.ndarray,
    sum_values: np.ndarray,
    max_values: np.ndarray,
    track_max: bool,
) -> None:
    """Batched leaf update: ``leaf[slots[i]] = values[i]`` for every ``i``, then fix ancestors.

    Parameters
    ----------
    sum_tree : ndarray, shape (2 * leaf_offset,), float64
        Sum-tree, updated in place.
    max_tree : ndarray, shape (2 * leaf_offset,) or (0,), float64
        Max-tree, updated in place when ``track_max``; ignored otherwise.
    leaf_offset : int
        Node number of slot 0's leaf (a power of two ``>= capacity``).
    slots : ndarray, shape (n,), int64
        Slots in ``[0, capacity)``; on duplicates the last entry wins.
    sum_values : ndarray, shape (n,), float64
        New sum-tree leaves (``priority ** alpha``), ``>= 0``.
    max_values : ndarray, shape (n,) or (0,), float64
        New max-tree leaves (raw priorities) when ``track_max``.
    track_max : bool
        Whether the max-tree is kept.
    """
    for i in range(slots.shape[0]):
        node = leaf_offset + slots[i]
        sum_tree[node] = sum_values[i]
        if track_max:
            max_tree[node] = max_values[i]
        _propagate(sum_tree, max_tree, node, track_max)


@njit(cache=True, nogil=True)
def fill_new_slots(
    sum_trees: np.ndarray,
    max_trees: np.ndarray,
    leaf_offset: int,
    slots: np.ndarray,
    sum_value: np.ndarray,
    max_value: np.ndarray,
    track_max: bool,
) -> None:
    """Give freshly written ``slots`` one priority per tree (every trainer's running max).

    Parameters
    ----------
    sum_trees : ndarray, shape (n_trees, 2 * leaf_offset), float64
        One sum-tree per trainer, updated in place.
    max_trees : ndarray, shape (n_trees, 2 * leaf_offset) or (n_trees, 0), float64
        One max-tree per trainer (when ``track_max``).
    leaf_offset : int
        Node number of slot 0's leaf.
    slots : ndarray, shape (n,), int64
        Slots just (over)written, in ``[0, capacity)``.
    sum_value : ndarray, shape (n_trees,), float64
        Sum-tree leaf value per tree (``max_priority ** alpha``).
    max_value : ndarray, shape (n_trees,), float64
        Max-tree leaf value per tree (``max_priority``).
    track_max : bool
        Whether the max-trees are kept.
    """
    for t in range(sum_trees.shape[0]):
        sum_tree = sum_trees[t]
        max_tree = max_trees[t]
        for i in range(slots.shape[0]):
            node = leaf_offset + slots[i]
            sum_tree[node] = sum_value[t]
            if track_max:
                max_tree[node] = max_value[t]
            _propagate(sum_tree, max_tree, node, track_max)


@njit(cache=True, nogil=True)
def rebuild(tree: np.ndarray, leaf_offset: int, is_max: bool) -> None:
    """Recompute every internal node of ``tree`` (shape (2 * leaf_offset,), float64) from its
    leaves, bottom-up: sums, or maxima when ``is_max``. Gives the same bits as incremental
    updates, since both compute each node from its two children."""
    for node in range(leaf_offset - 1, 0, -1):
        left = 2 * node
        if is_max:
            tree[node] = max(tree[left], tree[left + 1])
        else:
            tree[node] = tree[left] + tree[left + 1]


@njit(cache=True, nogil=True)
def _find(sum_tree: np.ndarray, leaf_offset: int, target: float) -> int:
    """The slot whose prefix-sum interval holds ``target`` (``0 <= target <= total``).

    Descend left when ``target`` is below the left sum *or the right subtree is empty*: the
    second test keeps rounding in ``target - left`` from ever steering into a zero subtree, so
    a leaf with priority 0 (an unwritten slot, or a zero priority) is never returned while the
    total is positive.
    """
    node = 1
    while node < leaf_offset:
        left = 2 * node
        left_sum = sum_tree[left]
        if target < left_sum or sum_tree[left + 1] <= 0.0:
            node = left
        else:
            target -= left_sum
            node = left + 1
    return node - leaf_offset


@njit(cache=True, nogil=True)
def find_prefix(
    sum_tree: np.ndarray, leaf_offset: int, targets: np.ndarray, out_slots: np.ndarray
) -> None:
    """Batched prefix-sum search: ``out_slots[i]`` is the slot whose interval
    ``[sum of earlier leaves, that + its leaf)`` holds ``targets[i]``.

    Parameters
    ----------
    sum_tree : ndarray, shape (2 * leaf_offset,), float64
        Sum-tree with a positive total.
    leaf_offset : int
        Node number of slot 0's leaf.
    targets : ndarray, shape (n,), float64
        Prefix sums in ``[0, total)`` (``uniform * total`` for proportional sampling).
    out_slots : ndarray, shape (n,), int64
        Destination; overwritten.
    """
    for i in range(targets.shape[0]):
        out_slots[i] = _find(sum_tree, leaf_offset, targets[i])


@njit(cache=True, nogil=True)
def per_sample(
    sum_tree: np.ndarray,
    leaf_offset: int,
    uniforms: np.ndarray,
    beta: float,
    out_slots: np.ndarray,
    out_weights: np.ndarray,
) -> None:
    """Proportional prioritized sampling with max-normalised importance weights.

    ``w_i = (N P(i))^-beta / max_b (N P(b))^-beta = (min_b p_b / p_i)^beta`` where ``p`` are the
    sampled leaves (``priority ** alpha``): ``N`` and the total cancel in the normalisation.

    Parameters
    ----------
    sum_tree : ndarray, shape (2 * leaf_offset,), float64
        Sum-tree with a positive total.
    leaf_offset : int
        Node number of slot 0's leaf.
    uniforms : ndarray, shape (B,), float64
        Draws in ``[0, 1)``, one per row.
    beta : float
        Importance-sampling exponent in ``[0, 1]``.
    out_slots : ndarray, shape (B,), int64
        Sampled slots; overwritten.
    out_weights : ndarray, shape (B,), float32
        Importance weights, ``<= 1``; overwritten.
    """
    total = sum_tree[1]
    smallest = np.inf
    for i in range(uniforms.shape[0]):
        slot = _find(sum_tree, leaf_offset, uniforms[i] * total)
        out_slots[i] = slot
        leaf = sum_tree[leaf_offset + slot]
        if leaf < smallest:
            smallest = leaf
    for i in range(uniforms.shape[0]):
        out_weights[i] = (smallest / sum_tree[leaf_offset + out_slots[i]]) ** beta


@njit(cache=True, nogil=True)
def _run_length(normalised: float, thresholds: np.ndarray, run_lengths: np.ndarray) -> int:
    """Step function: ``run_lengths[m]`` for the number ``m`` of thresholds ``<= normalised``."""
    m = 0
    while m < thresholds.shape[0] and normalised >= thresholds[m]:
        m += 1
    return run_lengths[m]


@njit(cache=True, nogil=True)
def locality_sample(
    sum_tree: np.ndarray,
    max_tree: np.ndarray,
    leaf_offset: int,
    capacity: int,
    size: int,
    uniforms: np.ndarray,
    thresholds: np.ndarray,
    run_lengths: np.ndarray,
    beta: float,
    inherit: bool,
    out_slots: np.ndarray,
    out_weights: np.ndarray,
    scratch: np.ndarray,
) -> int:
    """Prioritized-locality sampling (Gogineni et al., Sec. 5.2): prioritized reference slots,
    each expanded into a run whose length a step function of its normalised priority gives.

    References are drawn (``uniforms[r] * total``) until ``B`` rows are filled; the last run is
    truncated. While filling (``size < capacity``) a run stops at the write head (slot
    ``size - 1``); once full, runs wrap around the ring.

    Weights: with ``inherit`` every row gets its reference's probability; otherwise each row
    ``j`` gets the exact (unnormalised) inclusion mass
    ``sum_k p(j - k) [len(j - k) > k]`` over ``k < max(run_lengths)`` (``j - k`` wraps only when
    full). Truncation at the write head never changes this sum: it only cuts rows past
    ``size - 1``. ``E[len]``, ``N`` and the total cancel in the max-normalisation.

    Parameters
    ----------
    sum_tree, max_tree : ndarray, shape (2 * leaf_offset,), float64
        Sum of ``priority ** alpha`` and max of raw priorities; positive totals.
    leaf_offset : int
        Node number of slot 0's leaf.
    capacity, size : int
        Ring size and filled slots.
    uniforms : ndarray, shape (B,), float64
        Draws in ``[0, 1)``; at most ``B`` are used (every run has at least one row).
    thresholds : ndarray, shape (M - 1,), float64
        Increasing thresholds on ``priority / max priority``.
    run_lengths : ndarray, shape (M,), int64
        Run length per band, each in ``[1, capacity]``.
    beta : float
        Importance-sampling exponent.
    inherit : bool
        Weights from the reference's probability instead of the exact inclusion probability.
    out_slots : ndarray, shape (B,), int64
        Sampled slots; overwritten.
    out_weights : ndarray, shape (B,), float32
        Max-normalised weights; overwritten.
    scratch : ndarray, shape (B,), float64
        Work space for the per-row probability masses.

    Returns
    -------
    int
        Number of references drawn.
    """
    batch = out_slots.shape[0]
    total = sum_tree[1]
    max_priority = max_tree[1]
    full = size == capacity
    longest = 0
    for m in range(run_lengths.shape[0]):
        longest = max(longest, run_lengths[m])
    rows = 0
    refs = 0
    while rows < batch:
        ref = _find(sum_tree, leaf_offset, uniforms[refs] * total)
        refs += 1
        length = _run_length(max_tree[leaf_offset + ref] / max_priority, thresholds, run_lengths)
        if not full:
            length = min(length, size - ref)  # stop at the write head while filling
        ref_mass = sum_tree[leaf_offset + ref]
        for k in range(min(length, batch - rows)):  # the last run is truncated
            slot = ref + k
            if slot >= capacity:  # wrap past the last slot (only once full)
                slot -= capacity
            out_slots[rows] = slot
            scratch[rows] = ref_mass
            rows += 1
    if not inherit:
        for b in range(batch):
            row = out_slots[b]
            mass = 0.0
            for k in range(longest):
                start = row - k  # a run starting here would reach `row` if longer than k
                if start < 0:
                    if not full:
                        break  # nothing before slot 0 while filling
                    start += capacity
                normalised = max_tree[leaf_offset + start] / max_priority
                if _run_length(normalised, thresholds, run_lengths) > k:
                    mass += sum_tree[leaf_offset + start]
            scratch[b] = mass
    smallest = np.inf
    for b in range(batch):
        smallest = min(smallest, scratch[b])
    for b in range(batch):
        out_weights[b] = (smallest / scratch[b]) ** beta
    return refs
