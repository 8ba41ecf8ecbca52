"""Slow, obviously-correct NumPy references for every kernel and for buffer semantics.

Each function here is the readable twin of a Numba kernel or of a buffer behaviour; tests compare
the fast path against it. Sections are headed by the issue that added them.
"""

from __future__ import annotations

import numpy as np

# ------------------------------------------------------------------ buffer core (issue 2)


def gather_rows(table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``table[indices]``, one row at a time."""
    return np.stack([table[i].copy() for i in indices]) if len(indices) else table[:0].copy()


def scatter_rows(table: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A copy of ``table`` with ``rows[i]`` written at ``slots[i]`` in order."""
    out = table.copy()
    for slot, row in zip(slots, rows):
        out[slot] = row
    return out


def neighbor_indices(refs: np.ndarray, run_length: int, capacity: int) -> np.ndarray:
    """Runs of ``run_length`` slots starting at each reference, wrapping modulo capacity."""
    return np.array(
        [(int(r) + k) % capacity for r in refs for k in range(run_length)], dtype=np.int64
    )


class NaiveRing:
    """A list-based ring buffer of joint transitions with the semantics of
    ``MultiAgentReplayBuffer`` (cursor, size, overwrite-oldest)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: list[dict | None] = [None] * capacity
        self.cursor = 0
        self.size = 0

    def add(self, transition: dict) -> None:
        self.slots[self.cursor] = transition
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def get(self, slot: int) -> dict:
        item = self.slots[slot]
        assert item is not None, "read of an unwritten slot"
        return item


# ---------------------------------------------------------------------------------------------
# Issue #7 (profiling): the valgrind client-request kernel. On a real CPU the magic sequence is
# a no-op, so the request's answer is the caller's default.
# ---------------------------------------------------------------------------------------------
def client_request_outside_valgrind(block: np.ndarray, default: int) -> int:
    """What ``client_request_kernel`` returns when no valgrind runs: ``default``."""
    return int(default)
