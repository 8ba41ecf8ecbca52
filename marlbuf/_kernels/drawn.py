"""The stale-update guard of priority updates: which drawn slots were overwritten since their
draw, and whether the indices of a batch are still the ones drawn."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def judge_update(
    indices: np.ndarray,
    as_drawn: np.ndarray,
    generations: np.ndarray,
    write_generation: np.ndarray,
    stale: np.ndarray,
) -> bool:
    """Set ``stale[i]`` where slot ``indices[i]`` no longer holds write ``generations[i]`` (it
    was overwritten since the draw), after checking that ``indices`` are ``as_drawn``, entry
    for entry; returns ``False`` (``stale`` untouched) when they are not.

    Parameters
    ----------
    indices : ndarray, shape (B,), int64
        Slots of an update, each in ``[0, capacity)``.
    as_drawn : ndarray, shape (B,) or (0,), int64
        The indices as they were drawn (the entries ``generations`` belong to), or empty for
        no check.
    generations : ndarray, shape (B,), int64
        The write generation of each slot at the draw.
    write_generation : ndarray, shape (capacity,), int64
        The write generation of every slot now.
    stale : ndarray, shape (B,), bool
        Destination.
    """
    count = indices.shape[0]
    if as_drawn.shape[0] == count:
        for i in range(count):
            if indices[i] != as_drawn[i]:
                return False
    elif as_drawn.shape[0] != 0:
        return False
    for i in range(count):
        stale[i] = generations[i] != write_generation[indices[i]]
    return True


__all__ = ["judge_update"]
