"""The check that discrete agents' vector actions are actions (probabilities), on staged
rows."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def first_bad_action(
    rows: np.ndarray, columns: np.ndarray, starts: np.ndarray, limits: np.ndarray
) -> int:
    """The first (row, agent) whose action is not probabilities, as ``row * agents + agent``,
    or -1.

    Parameters
    ----------
    rows : ndarray, shape (T, row_items), float32 or float64
        Staged rows viewed in the actions' dtype.
    columns : ndarray, shape (m,), intp
        The columns of every checked agent's action, agent after agent.
    starts : ndarray, shape (agents,), intp
        Where each agent's columns start in ``columns``.
    limits : ndarray, shape (agents,), float64
        How far each agent's action may sum from 1.
    """
    agents = starts.shape[0]
    for t in range(rows.shape[0]):
        for a in range(agents):
            stop = columns.shape[0] if a + 1 == agents else starts[a + 1]
            total = 0.0
            inside = 0
            for c in range(starts[a], stop):
                value = np.float64(rows[t, columns[c]])
                if 0.0 <= value <= 1.0:  # False for NaN
                    inside += 1
                total += value
            if inside < stop - starts[a] or not abs(total - 1.0) <= limits[a]:
                return t * agents + a
    return -1


__all__ = ["first_bad_action"]
