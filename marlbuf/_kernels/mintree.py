"""Min-tree kernels: the smallest leaf of a range of slots, kept up to date as leaves change.

Same flat layout as the sum-trees of :mod:`marlbuf._kernels.sumtree`: a tree over ``capacity``
leaves is a float64 array of ``2 * leaf_offset`` nodes (``leaf_offset`` the smallest power of two
``>= capacity``), node 1 the root, node ``n`` with children ``2n`` and ``2n + 1``, slot ``s`` at
``leaf_offset + s``. A node holds the minimum of its children; leaves of slots that hold nothing
are ``+inf`` so that they never win. A parent is recomputed from its two children (never
adjusted), so the tree is an exact function of its leaves.

Used where importance weights are normalised by the smallest priority of every stored slot
(TorchRL's ``PrioritizedSampler`` convention, :mod:`marlbuf.compat.torchrl`).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def set_min_leaves(
    tree: np.ndarray, leaf_offset: int, slots: np.ndarray, values: np.ndarray
) -> None:
    """Set ``tree``'s leaves at ``slots`` to ``values`` (in order: the last duplicate wins) and
    recompute their ancestors, one level at a time (the loads of one level overlap).

    Parameters
    ----------
    tree : ndarray, shape (2 * leaf_offset,), float64
        The min-tree; changed in place.
    leaf_offset : int
        Node number of slot 0's leaf.
    slots : ndarray, shape (n,), int64
        Slots in ``[0, leaf_offset)``.
    values : ndarray, shape (n,), float64
        New leaf values.
    """
    count = slots.shape[0]
    nodes = np.empty(count, dtype=np.int64)
    for i in range(count):
        nodes[i] = leaf_offset + slots[i]
        tree[nodes[i]] = values[i]
    level = leaf_offset
    while level > 1:
        for i in range(count):
            node = nodes[i] >> 1
            nodes[i] = node
            tree[node] = min(tree[2 * node], tree[2 * node + 1])
        level //= 2


@njit(cache=True, nogil=True)
def rebuild_min(tree: np.ndarray, leaf_offset: int) -> None:
    """Recompute every internal node of ``tree`` (shape (2 * leaf_offset,), float64) from its
    leaves, bottom-up (the same values as incremental updates)."""
    for node in range(leaf_offset - 1, 0, -1):
        tree[node] = min(tree[2 * node], tree[2 * node + 1])


@njit(cache=True, nogil=True)
def range_min(tree: np.ndarray, leaf_offset: int, start: int, stop: int) -> float:
    """The smallest leaf of slots ``[start, stop)`` (``+inf`` for an empty range).

    Parameters
    ----------
    tree : ndarray, shape (2 * leaf_offset,), float64
        The min-tree.
    leaf_offset : int
        Node number of slot 0's leaf.
    start, stop : int
        ``0 <= start <= stop <= leaf_offset``.
    """
    smallest = np.inf
    left = start + leaf_offset
    right = stop + leaf_offset
    while left < right:
        if left & 1:  # a right child: its own node is in the range, its parent is not
            smallest = min(smallest, tree[left])
            left += 1
        if right & 1:  # the node just before ``right`` is a left child outside the next level
            right -= 1
            smallest = min(smallest, tree[right])
        left >>= 1
        right >>= 1
    return smallest
