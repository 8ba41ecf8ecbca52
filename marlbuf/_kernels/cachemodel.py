"""A set-associative LRU cache model over a stream of block numbers (trace-driven).

Used by :mod:`marlbuf.profiling.cachemodel` to give *modelled* cache-line and TLB misses of the
sampling phase's address stream (a TLB is a cache of page numbers). State persists between
calls, so successive batches see each other's warm/cold state.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def lru_misses(
    blocks: np.ndarray, tags: np.ndarray, last_use: np.ndarray, clock: np.ndarray
) -> int:
    """Run ``blocks`` through an LRU set-associative cache; returns the number of misses.

    Parameters
    ----------
    blocks : ndarray, shape (n,), int64
        Block numbers in access order (address // line size, or // page size for a TLB).
        A block maps to set ``block % n_sets``.
    tags : ndarray, shape (n_sets, ways), int64
        Block held by each way, ``-1`` when empty; updated in place.
    last_use : ndarray, shape (n_sets, ways), int64
        Clock value of each way's last access; updated in place.
    clock : ndarray, shape (1,), int64
        Access counter, advanced by ``n``; updated in place.

    Returns
    -------
    int
        Accesses whose block was not in its set (cold, capacity and conflict misses).
    """
    n_sets, ways = tags.shape
    misses = 0
    now = clock[0]
    for i in range(blocks.shape[0]):
        block = blocks[i]
        s = block % n_sets
        now += 1
        hit = -1
        oldest = 0
        for w in range(ways):
            if tags[s, w] == block:
                hit = w
                break
            if last_use[s, w] < last_use[s, oldest]:
                oldest = w
        if hit >= 0:
            last_use[s, hit] = now
        else:
            misses += 1
            tags[s, oldest] = block  # empty ways have last_use -1: they are filled first
            last_use[s, oldest] = now
    clock[0] = now
    return misses
