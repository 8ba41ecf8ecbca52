"""Sum-tree (and max-tree) kernels for prioritized sampling.

A tree over ``capacity`` leaves is a flat float64 array of ``2 * leaf_offset`` nodes, where
``leaf_offset`` is the smallest power of two ``>= capacity``: node 1 is the root, node ``n`` has
children ``2n`` and ``2n + 1``, and slot ``s`` is the leaf ``leaf_offset + s`` (node 0 and the
leaves past ``capacity`` stay 0). A sum-tree node holds the sum of its children, a max-tree node
their maximum.

**Stored levels: one line per step.** Counting from the leaves (level ``D = log2(leaf_offset)``),
only every third level is stored: ``D, D - 3, D - 6, ...`` down to ``top = D % 3``, and the
root. The 8 descendants ``8n .. 8n + 7`` of a stored node ``n`` three levels down are one
64-byte cache line (the arrays start on a line), so a search reads one line per three levels
and an update writes one node per three levels: 7 lines instead of 20 levels at a million
slots, where the deep levels miss every cache. The two levels in between are not stored (their
nodes stay 0): a step recomputes them from the line, as ``(c0 + c1) + (c2 + c3)`` and so on,
which are the very additions a binary tree stores, so every stored node, the total, every
search and every weight are bit for bit those of the full binary tree (tested against it).
The root is the sum of the ``2**top`` nodes of level ``top`` (of level 3 when ``top`` is 0).

Why float64, and why parents are *recomputed* from their children instead of adjusted by a
delta: a float32 tree, or one updated by adding ``new - old`` up the path, drifts after
millions of updates until a subtree whose leaves are all zero carries a small positive sum and
gets sampled. Recomputing every stored node from its line makes it an exact function of the
current leaves (the tree equals a fresh rebuild, bit for bit), so there is no drift at all.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from marlbuf._config import SEARCH_PREFETCH_AHEAD
from marlbuf._kernels.memops import prefetch


@njit(inline="always")
def _shape(leaf_offset: int) -> tuple[int, int]:
    """``(D, top)``: the leaves' level ``log2(leaf_offset)`` and the highest stored level below
    the root, ``D % 3`` (0: level 3's line is the root's)."""
    depth = 0
    width = leaf_offset
    while width > 1:
        width >>= 1
        depth += 1
    return depth, depth % 3


@njit(inline="always")
def _combine(a: float, b: float, is_max: bool) -> float:
    return max(a, b) if is_max else a + b


@njit(inline="always")
def _from_line(tree: np.ndarray, base: int, is_max: bool) -> float:
    """The node three levels above the line ``tree[base : base + 8]``, pairwise as a binary
    tree adds (or takes maxima)."""
    low = _combine(
        _combine(tree[base], tree[base + 1], is_max),
        _combine(tree[base + 2], tree[base + 3], is_max),
        is_max,
    )
    high = _combine(
        _combine(tree[base + 4], tree[base + 5], is_max),
        _combine(tree[base + 6], tree[base + 7], is_max),
        is_max,
    )
    return _combine(low, high, is_max)


@njit(inline="always")
def _root(tree: np.ndarray, top: int, is_max: bool) -> float:
    """The root from its stored descendants (``top``: their level)."""
    if top == 1:
        return _combine(tree[2], tree[3], is_max)
    if top == 2:
        return _combine(
            _combine(tree[4], tree[5], is_max), _combine(tree[6], tree[7], is_max), is_max
        )
    return _from_line(tree, 8, is_max)


@njit(inline="always")
def _refresh(tree: np.ndarray, node: int, top: int, is_max: bool) -> None:
    """Recompute the stored ``node`` from its stored descendants."""
    tree[node] = _root(tree, top, is_max) if node == 1 else _from_line(tree, 8 * node, is_max)


@njit(inline="always")
def _parent(node: int, level: int, top: int) -> tuple[int, int]:
    """The stored ancestor of the stored ``node`` (at ``level``) and its level."""
    if level >= top + 3:
        return node >> 3, level - 3
    return 1, 0


@njit(cache=True, nogil=True)
def _propagate(sum_tree: np.ndarray, max_tree: np.ndarray, node: int, track_max: bool) -> None:
    """Recompute the stored ancestors of the leaf ``node`` (sum, and max if tracked)."""
    depth, top = _shape(sum_tree.shape[0] >> 1)
    level = depth
    while node > 1:
        node, level = _parent(node, level, top)
        _refresh(sum_tree, node, top, False)
        if track_max:
            _refresh(max_tree, node, top, True)


@njit(cache=True, nogil=True)
def _set_many(
    sum_tree: np.ndarray,
    max_tree: np.ndarray,
    leaf_offset: int,
    slots: np.ndarray,
    sum_values: np.ndarray,
    max_values: np.ndarray,
    count: int,
    track_max: bool,
) -> None:
    """Set ``count`` leaves (in order: the last duplicate wins), then recompute their stored
    ancestors one stored level at a time, so the loads of a level overlap (see
    :func:`_find_many`). A node equal to the one before it in the list is not recomputed again
    (sorted slots share their upper ancestors); one shared by entries further apart is
    recomputed more than once, always to the same value."""
    nodes = np.empty(count, dtype=np.int64)
    for i in range(count):
        nodes[i] = leaf_offset + slots[i]
        sum_tree[nodes[i]] = sum_values[i]
        if track_max:
            max_tree[nodes[i]] = max_values[i]
    depth, top = _shape(leaf_offset)
    sum_bits = sum_tree.view(np.uint64)  # prefetch takes words
    level = depth
    while level > 0:
        parent_level = 0
        previous = -1
        for i in range(count):
            later = i + SEARCH_PREFETCH_AHEAD
            if later < count:  # the line a later entry's parent is computed from
                prefetch(sum_bits, np.uint64(nodes[later] & ~7))
            node, parent_level = _parent(nodes[i], level, top)
            nodes[i] = node
            if node == previous:
                continue
            previous = node
            _refresh(sum_tree, node, top, False)
            if track_max:
                _refresh(max_tree, node, top, True)
        level = parent_level


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
    _set_many(
        sum_tree, max_tree, leaf_offset, slots, sum_values, max_values, slots.shape[0], track_max
    )


#: codes returned by :func:`apply_td_errors`
TD_OK = 0
TD_NOT_FINITE = 1
TD_NEGATIVE = 2
TD_OVERFLOW = 3
#: ``mode`` of :func:`apply_td_errors`: priority = |d| + eps, d * d + eps, d + eps (d >= 0)
MODE_ABS = 0
MODE_SQUARED = 1
MODE_GIVEN = 2


@njit(cache=True, nogil=True)
def apply_td_errors(
    sum_tree: np.ndarray,
    max_tree: np.ndarray,
    leaf_offset: int,
    slots: np.ndarray,
    td_errors: np.ndarray,
    stale: np.ndarray,
    mode: int,
    eps: float,
    alpha: float,
    track_max: bool,
) -> tuple[int, int, float]:
    """Validate TD errors, turn them into priorities and set the non-stale ones.

    Everything is checked before anything is written, so bad input changes nothing.

    Parameters
    ----------
    sum_tree, max_tree : ndarray, shape (2 * leaf_offset,) (max_tree: or (0,)), float64
        One trainer's trees, updated in place.
    leaf_offset : int
        Node number of slot 0's leaf.
    slots : ndarray, shape (n,), int64
        Sampled slots, in range (checked by the caller).
    td_errors : ndarray, shape (n,), float64
        TD errors (or priorities, with ``MODE_GIVEN``).
    stale : ndarray, shape (n,), bool
        Slots overwritten since they were sampled: their updates are dropped.
    mode : int
        ``MODE_ABS``, ``MODE_SQUARED`` or ``MODE_GIVEN``.
    eps, alpha : float
        Priority offset and exponent (leaves hold ``priority ** alpha``).
    track_max : bool
        Whether the max-tree is kept.

    Returns
    -------
    (code, position, largest) : (int, int, float)
        ``TD_OK`` and the largest priority set (0 if none), or an error code and the position of
        the first offending entry (then nothing was written).
    """
    count = slots.shape[0]
    priorities = np.empty(count, dtype=np.float64)
    masses = np.empty(count, dtype=np.float64)
    kept = np.empty(count, dtype=np.int64)
    n_kept = 0
    largest = 0.0
    for i in range(count):
        value = td_errors[i]
        if not np.isfinite(value):
            return TD_NOT_FINITE, i, 0.0
        if mode == MODE_ABS:
            priority = abs(value) + eps
        elif mode == MODE_SQUARED:
            priority = value * value + eps
        else:
            if value < 0.0:
                return TD_NEGATIVE, i, 0.0
            priority = value + eps
        mass = priority**alpha
        if not (np.isfinite(priority) and np.isfinite(mass)):
            return TD_OVERFLOW, i, 0.0
        if not stale[i]:
            kept[n_kept] = slots[i]
            priorities[n_kept] = priority
            masses[n_kept] = mass
            n_kept += 1
            largest = max(largest, priority)
    _set_many(sum_tree, max_tree, leaf_offset, kept, masses, priorities, n_kept, track_max)
    return TD_OK, -1, largest


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
    """Recompute every stored internal node of ``tree`` (shape (2 * leaf_offset,), float64)
    from its leaves, bottom-up: sums, or maxima when ``is_max``. Gives the same bits as
    incremental updates, since both compute each node from the same line the same way. Nodes
    of the levels that are not stored are left as they are."""
    depth, top = _shape(leaf_offset)
    level = depth - 3
    while level >= top and level >= 0:
        first = 1 << level
        for node in range(first, 2 * first):
            tree[node] = _from_line(tree, 8 * node, is_max)
        level -= 3
    if top != 0:
        tree[1] = _root(tree, top, is_max)


@njit(inline="always")
def _step(remaining: float, left: float, right: float) -> tuple[float, int]:
    """One binary decision: go right when the target is not below the left sum and the right
    subtree is not empty (the second test keeps rounding in ``target - left`` from ever steering
    into a zero subtree, so a leaf with priority 0 is never returned while the total is
    positive); branch-free on purpose: the direction is a coin flip the predictor cannot learn."""
    go_right = (remaining >= left) & (right > 0.0)
    return remaining - left * go_right, go_right


@njit(cache=True, nogil=True)
def _find_many(
    sum_tree: np.ndarray,
    leaf_offset: int,
    targets: np.ndarray,
    out_slots: np.ndarray,
    start: int,
    stop: int,
) -> None:
    """For each of ``targets[start:stop]`` (in ``[0, total]``), the slot whose prefix-sum
    interval holds it, into ``out_slots[start:stop]``.

    Each step reads one line of 8 stored nodes and takes the three binary decisions a full
    binary tree would take below the current node, recomputing the two unstored levels from the
    line exactly as the binary tree stores them: the same decisions on the same values, so the
    same slots as a binary descent (:func:`_step`).

    All targets descend together, one stored level at a time: the loads of one level are
    independent of each other, so the CPU overlaps their cache misses instead of waiting on
    each search's chain of dependent loads; the line of the target ``SEARCH_PREFETCH_AHEAD``
    places ahead is prefetched, so that more misses overlap than the CPU's reorder window holds.
    """
    count = stop - start
    remaining = targets[start:stop].copy()
    nodes = np.ones(count, dtype=np.int64)
    depth, top = _shape(leaf_offset)
    if top == 1:
        for i in range(count):
            remaining[i], go = _step(remaining[i], sum_tree[2], sum_tree[3])
            nodes[i] = 2 + go
    elif top == 2:
        for i in range(count):
            r, go = _step(remaining[i], sum_tree[4] + sum_tree[5], sum_tree[6] + sum_tree[7])
            half = 4 + 2 * go
            remaining[i], go = _step(r, sum_tree[half], sum_tree[half + 1])
            nodes[i] = half + go
    bits = sum_tree.view(np.uint64)  # prefetch takes words
    level = top
    while level < depth:
        for i in range(count):
            later = i + SEARCH_PREFETCH_AHEAD
            if later < count:  # the line this level reads for a later target
                prefetch(bits, np.uint64(8 * nodes[later]))
            base = 8 * nodes[i]
            r, go = _step(
                remaining[i],
                (sum_tree[base] + sum_tree[base + 1]) + (sum_tree[base + 2] + sum_tree[base + 3]),
                (sum_tree[base + 4] + sum_tree[base + 5])
                + (sum_tree[base + 6] + sum_tree[base + 7]),
            )
            quarter = base + 4 * go
            r, go = _step(
                r,
                sum_tree[quarter] + sum_tree[quarter + 1],
                sum_tree[quarter + 2] + sum_tree[quarter + 3],
            )
            pair = quarter + 2 * go
            remaining[i], go = _step(r, sum_tree[pair], sum_tree[pair + 1])
            nodes[i] = pair + go
        level += 3
    for i in range(count):
        out_slots[start + i] = nodes[i] - leaf_offset


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
    _find_many(sum_tree, leaf_offset, targets, out_slots, 0, targets.shape[0])


@njit(inline="always")
def _weight(ratio: float, beta: float) -> np.float32:
    """``ratio ** beta`` for a ratio in ``(0, 1]``, in single precision: the weights are float32,
    and ``powf`` costs a third of a double ``pow`` (within two float32 units in the last place
    of the double result; a ratio of 1 gives exactly 1)."""
    return np.float32(ratio) ** np.float32(beta)


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
    _find_many(sum_tree, leaf_offset, uniforms * sum_tree[1], out_slots, 0, uniforms.shape[0])
    smallest = np.inf
    for i in range(uniforms.shape[0]):
        smallest = min(smallest, sum_tree[leaf_offset + out_slots[i]])
    for i in range(uniforms.shape[0]):
        out_weights[i] = _weight(smallest / sum_tree[leaf_offset + out_slots[i]], beta)


@njit(cache=True, nogil=True)
def _run_length(priority: float, cutoffs: np.ndarray, run_lengths: np.ndarray) -> int:
    """Step function: ``run_lengths[m]`` for the number ``m`` of cutoffs ``<= priority``
    (cutoffs increase, so counting them all needs no data-dependent branch)."""
    band = 0
    for m in range(cutoffs.shape[0]):
        band += priority >= cutoffs[m]
    return run_lengths[band]


@njit(cache=True, nogil=True)
def _priority_cutoffs(thresholds: np.ndarray, max_priority: float) -> np.ndarray:
    """For each threshold ``t``, the smallest float ``c`` with ``c / max_priority >= t``.

    Correctly rounded division is monotone in the numerator, so ``p >= c`` holds exactly when
    ``p / max_priority >= t``: the bands are those of the normalised priority, bit for bit,
    without a division per slot.
    """
    cutoffs = np.empty(thresholds.shape[0], dtype=np.float64)
    for m in range(thresholds.shape[0]):
        cutoff = thresholds[m] * max_priority
        while cutoff / max_priority < thresholds[m]:
            cutoff = np.nextafter(cutoff, np.inf)
        while np.nextafter(cutoff, -np.inf) / max_priority >= thresholds[m]:
            cutoff = np.nextafter(cutoff, -np.inf)
        cutoffs[m] = cutoff
    return cutoffs


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
    min_chunk: int,
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
    min_chunk : int
        Smallest number of references searched together (``_config.SEARCH_CHUNK_MIN``).
    out_slots : ndarray, shape (B,), int64
        Sampled slots; overwritten.
    out_weights : ndarray, shape (B,), float32
        Max-normalised weights; overwritten.
    scratch : ndarray, shape (B,), float64
        Work space for the per-row probability masses.

    Returns
    -------
    int
        Number of references used.
    """
    batch = out_slots.shape[0]
    total = sum_tree[1]
    max_priority = max_tree[1]
    full = size == capacity
    longest = 0
    for m in range(run_lengths.shape[0]):
        longest = max(longest, run_lengths[m])
    cutoffs = _priority_cutoffs(thresholds, max_priority)
    targets = uniforms * total
    ref_slots = np.empty(batch, dtype=np.int64)
    ref_priority = np.empty(batch, dtype=np.float64)
    window_reach = np.empty(2 * longest, dtype=np.int64)
    window_mass = np.empty(2 * longest, dtype=np.float64)
    rows = 0
    searched = 0
    used = 0
    while rows < batch:
        # Search references in chunks (one level at a time, see _find_many), sized by the runs
        # seen so far; references searched but not needed are dropped, which changes nothing
        # since the draws are consumed in order.
        remaining = batch - rows
        if rows == 0:
            chunk = remaining // longest  # cannot overshoot
        else:
            chunk = (remaining * used) // rows + 1  # refs still needed at this batch's mean run
        chunk = min(max(chunk, min(remaining, min_chunk), 1), batch - searched)
        _find_many(sum_tree, leaf_offset, targets, ref_slots, searched, searched + chunk)
        # the references' raw priorities in one short loop: independent loads whose cache
        # misses overlap (inside the long run loop below they were waited for one by one;
        # measured 15% faster)
        for c in range(searched, searched + chunk):
            ref_priority[c] = max_tree[leaf_offset + ref_slots[c]]
        searched += chunk
        while used < searched and rows < batch:
            ref = ref_slots[used]
            length = _run_length(ref_priority[used], cutoffs, run_lengths)
            used += 1
            if not full:
                length = min(length, size - ref)  # stop at the write head while filling
            n_rows = min(length, batch - rows)  # the last run is truncated
            if not inherit:
                # run lengths and masses of the slots ref - (longest - 1) .. ref + n_rows - 1:
                # every run that can reach one of this run's rows starts there
                for w in range(longest - 1 + n_rows):
                    start = ref - (longest - 1) + w
                    if start < 0:
                        if not full:  # nothing before slot 0 while filling
                            window_reach[w] = 0
                            window_mass[w] = 0.0
                            continue
                        start += capacity
                    elif start >= capacity:  # wrap past the last slot (only once full)
                        start -= capacity
                    window_reach[w] = _run_length(
                        max_tree[leaf_offset + start], cutoffs, run_lengths
                    )
                    window_mass[w] = sum_tree[leaf_offset + start]
            ref_mass = sum_tree[leaf_offset + ref]
            for k in range(n_rows):
                slot = ref + k
                if slot >= capacity:  # wrap past the last slot (only once full)
                    slot -= capacity
                out_slots[rows] = slot
                if inherit:
                    scratch[rows] = ref_mass
                else:
                    # exact mass: runs starting `back` slots earlier reach this row if longer
                    mass = 0.0
                    for back in range(longest):
                        w = longest - 1 + k - back
                        mass += window_mass[w] * (window_reach[w] > back)  # branch-free
                    scratch[rows] = mass
                rows += 1
    smallest = np.inf
    for b in range(batch):
        smallest = min(smallest, scratch[b])
    for b in range(batch):
        out_weights[b] = _weight(smallest / scratch[b], beta)
    return used
