"""The ring: where each transition goes, its write generation, and the buffer's locks."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf.writer.inputs import int_array, int_field


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

    def advance_one(self, slot: int, generation: int) -> np.ndarray:
        """Record one step written at ``slot`` (the cursor) with write ``generation`` (the
        kernels of ``add`` set its write generation themselves); returns the written slot as a
        shape (1,) int64 array (reused: read it before the next write)."""
        self.total_writes = generation + 1
        self.cursor = slot + 1 if slot + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1
        self._one_slot[0] = slot
        return self._one_slot

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
        """Restore :meth:`state_dict` output that :meth:`check_loaded` accepted (the front
        checks every part of a state before it changes any)."""
        size = int(state["size"])
        self.write_generation[:] = -1
        self.write_generation[:size] = np.asarray(state["write_generation"], dtype=np.int64)
        self.cursor = int(state["cursor"])
        self.size = size
        self.total_writes = int(state["total_writes"])

    @staticmethod
    def generations(capacity: int, size: int, cursor: int, total_writes: int) -> np.ndarray:
        """The write generation of every filled slot (shape (size,), int64) of a ring of
        ``capacity`` slots after ``total_writes`` writes: generation ``g`` lives in slot
        ``g % capacity``, so slots before the cursor hold the newest lap and the others the lap
        before it."""
        slots = np.arange(size, dtype=np.int64)
        lap_start = total_writes - cursor  # generation written at slot 0 in the current lap
        return np.where(slots < cursor, lap_start + slots, lap_start - capacity + slots)

    def check_loaded(self, state: Mapping[str, Any]) -> tuple[int, np.ndarray]:
        """Check a loaded buffer state's ring fields against each other: ``(size,
        write_generation)`` (shape (size,), int64).

        A ring of ``capacity`` slots writes generation ``g`` at slot ``g % capacity``, so
        ``cursor == total_writes % capacity``, ``size == min(total_writes, capacity)`` and
        every filled slot's write generation is determined (:meth:`generations`);
        ``total_writes`` is at most ``_config.MAX_TOTAL_WRITES``. Raises ``ValueError`` naming
        the field that disagrees; changes nothing.
        """
        capacity = self.capacity
        size = int_field(state, "size")
        cursor = int_field(state, "cursor")
        total = int_field(state, "total_writes")
        if not 0 <= total <= _config.MAX_TOTAL_WRITES:
            raise ValueError(
                f"state has total_writes={total}; expected 0 <= total_writes <= "
                f"{_config.MAX_TOTAL_WRITES} (corrupt state)"
            )
        if size != min(total, capacity) or cursor != total % capacity:
            raise ValueError(
                f"state has size={size}, cursor={cursor}, total_writes={total}; a ring of "
                f"capacity {capacity} after {total} writes has size={min(total, capacity)} and "
                f"cursor={total % capacity} (corrupt state)"
            )
        generations = int_array(state.get("write_generation"), "write_generation", (size,))
        expected = self.generations(capacity, size, cursor, total)
        if not np.array_equal(generations, expected):
            bad = int(np.flatnonzero(generations != expected)[0])
            raise ValueError(
                f"state's write_generation[{bad}] is {int(generations[bad])}; slot {bad} of a "
                f"ring after {total} writes holds generation {int(expected[bad])} (corrupt state)"
            )
        return size, expected


__all__ = ["RingWriter"]
