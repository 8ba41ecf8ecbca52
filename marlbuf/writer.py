"""The writer: where each transition goes and what the buffer knows about its slots.

It owns the ring arithmetic (cursor, fill level), the per-slot *write generation* (the value of
a global write counter when the slot was last written: a stale priority update or a sample taken
before an overwrite is recognised by comparing generations), and the buffer's locks.

Concurrency model: a buffer may be used by one or more writer threads and any number of sampling
threads at once. Writers serialize on ``write_lock`` while they validate and stage (staging has
one scratch row); the commit of staged rows into storage, the metadata update and every read of
the storage (index draw + gather, ``latest``, ``gather``, ``update_priorities``, ``state_dict``)
happen under ``lock``. So a sampler sees a row either entirely before or entirely after a write,
never a mix, and validation (the costly part of a write) does not block samplers. The gather
kernels release the GIL, so a trainer thread can run while another thread gathers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np


class RingWriter:
    """Ring bookkeeping for ``capacity`` slots.

    Attributes
    ----------
    cursor : int
        Next slot to write; once full, the oldest slot.
    size : int
        Filled slots (``<= capacity``). While filling, slots ``[0, size)`` hold data.
    total_writes : int
        Transitions ever written; also the generation the next write receives.
    write_generation : ndarray, shape (capacity,), int64
        ``total_writes`` at the time each slot was written; ``-1`` for never-written slots.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.cursor = 0
        self.size = 0
        self.total_writes = 0
        self.write_generation = np.full(self.capacity, -1, dtype=np.int64)
        self.lock = threading.RLock()  # storage reads and commits
        self.write_lock = threading.Lock()  # validation + staging, one writer at a time
        self._one_slot = np.zeros(1, dtype=np.int64)

    def plan(self, steps: int) -> tuple[int, np.ndarray]:
        """Where ``steps`` new transitions go: ``(skip, slots)``.

        With ``steps > capacity`` the first ``skip`` transitions would be overwritten by later
        ones of the same call at once, so only the last ``capacity`` are written, at ``slots``
        (shape (steps - skip,), int64, consecutive modulo capacity).
        """
        if steps == 1:  # add(): no temporary arrays
            self._one_slot[0] = self.cursor
            return 0, self._one_slot
        skip = max(0, steps - self.capacity)
        count = steps - skip
        start = (self.cursor + skip) % self.capacity
        return skip, (start + np.arange(count, dtype=np.int64)) % self.capacity  # wraps

    def advance(self, slots: np.ndarray, steps: int, skip: int) -> None:
        """Record that ``slots`` (from :meth:`plan`) were written by a call of ``steps``."""
        if steps == 1:
            self.write_generation[self.cursor] = self.total_writes
        else:
            first = self.total_writes + skip
            self.write_generation[slots] = first + np.arange(slots.shape[0], dtype=np.int64)
        self.total_writes += steps
        self.cursor = (self.cursor + steps) % self.capacity
        self.size = min(self.size + steps, self.capacity)

    def newest(self, count: int) -> np.ndarray:
        """The ``count`` most recently written slots, oldest first (shape (count,), int64)."""
        return (self.cursor - count + np.arange(count, dtype=np.int64)) % self.capacity

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        gens = self.write_generation[: self.size]
        return {
            "cursor": self.cursor,
            "size": self.size,
            "total_writes": self.total_writes,
            "write_generation": gens.copy() if copy else gens,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        size = int(state["size"])
        cursor = int(state["cursor"])
        gens = np.asarray(state["write_generation"], dtype=np.int64)
        if not 0 <= size <= self.capacity or not 0 <= cursor < self.capacity:
            raise ValueError(
                f"state has size={size}, cursor={cursor}; a buffer of capacity {self.capacity} "
                f"needs 0 <= size <= {self.capacity} and 0 <= cursor < {self.capacity}"
            )
        if gens.shape != (size,):
            raise ValueError(f"state's write_generation has shape {gens.shape}; expected ({size},)")
        self.write_generation[:] = -1
        self.write_generation[:size] = gens
        self.cursor = cursor
        self.size = size
        self.total_writes = int(state["total_writes"])


__all__ = ["RingWriter"]
