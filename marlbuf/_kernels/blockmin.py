"""Block minima: the smallest priority of the written slots, kept as priorities change.

Used where importance weights are normalised by the smallest priority stored (TorchRL's
``PrioritizedSampler`` convention, :mod:`marlbuf.compat.torchrl`). The slots are cut into
blocks of ``block_size``; per block the state holds its minimum over written slots
(``block_min``, ``+inf`` for a block with none), the slot that holds it (``block_arg``) and
whether it must be recomputed (``dirty``).

Why blocks, not a min-tree: a min-tree's update rewrites ``log2(capacity)`` nodes per slot,
the lower ones cache misses at 1e6 slots, as many as the sum-tree's own update. Here an update
touches only the block arrays (a few KiB, in cache): a new value below its block's minimum
replaces it; a new value on the slot that held the minimum, and above it, marks the block dirty
(rare: one slot in ``block_size``); a dirty block is recomputed from the leaves (one sequential
pass over ``block_size`` values) before the minimum is read.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def lower_block_mins(
    block_min: np.ndarray,
    block_arg: np.ndarray,
    dirty: np.ndarray,
    slots: np.ndarray,
    values: np.ndarray,
    block_size: int,
) -> None:
    """Record that ``slots`` now hold ``values`` (in order: a repeated slot's last value is its
    value; pass the leaves as they are after the update).

    Parameters
    ----------
    block_min : ndarray, shape (n_blocks,), float64
        Minimum of each block's written slots (``+inf``: none); changed in place.
    block_arg : ndarray, shape (n_blocks,), int64
        The slot holding each block's minimum (``-1``: none); changed in place.
    dirty : ndarray, shape (n_blocks,), bool
        Blocks to recompute; set here where the minimum's slot rose.
    slots : ndarray, shape (n,), int64
        Written slots, in ``[0, n_blocks * block_size)``.
    values : ndarray, shape (n,), float64
        Their values now.
    block_size : int
        Slots per block.
    """
    for i in range(slots.shape[0]):
        slot = slots[i]
        block = slot // block_size
        if values[i] <= block_min[block]:
            block_min[block] = values[i]
            block_arg[block] = slot
        elif block_arg[block] == slot:  # the minimum's slot rose: the block's minimum is stale
            dirty[block] = True


@njit(cache=True, nogil=True)
def refresh_block_mins(
    leaves: np.ndarray,
    written: np.ndarray,
    block_min: np.ndarray,
    block_arg: np.ndarray,
    dirty: np.ndarray,
    block_size: int,
) -> float:
    """Recompute the dirty blocks from ``leaves`` over the ``written`` slots, and return the
    smallest value of every written slot (``+inf`` when none is written).

    Parameters
    ----------
    leaves : ndarray, shape (capacity,), float64
        Every slot's value.
    written : ndarray, shape (capacity,), int64
        A slot is written where ``written >= 0`` (write generations, ``-1`` for never).
    block_min, block_arg, dirty : ndarray
        As in :func:`lower_block_mins`; the dirty blocks are recomputed and cleared.
    block_size : int
        Slots per block.
    """
    capacity = leaves.shape[0]
    smallest = np.inf
    for block in range(block_min.shape[0]):
        if dirty[block]:
            low = np.inf
            arg = -1
            for slot in range(block * block_size, min((block + 1) * block_size, capacity)):
                if written[slot] >= 0 and leaves[slot] < low:
                    low = leaves[slot]
                    arg = slot
            block_min[block] = low
            block_arg[block] = arg
            dirty[block] = False
        smallest = min(smallest, block_min[block])
    return smallest
