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
        self.check_state(state)
        size = int(state["size"])
        self.write_generation[:] = -1
        self.write_generation[:size] = np.asarray(state["write_generation"], dtype=np.int64)
        self.cursor = int(state["cursor"])
        self.size = size
        self.total_writes = int(state["total_writes"])

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` unless :meth:`load_state_dict` would accept ``state``."""
        size = int(state["size"])
        cursor = int(state["cursor"])
        gens = np.asarray(state["write_generation"])
        if not 0 <= size <= self.capacity or not 0 <= cursor < self.capacity:
            raise ValueError(
                f"state has size={size}, cursor={cursor}; a buffer of capacity {self.capacity} "
                f"needs 0 <= size <= {self.capacity} and 0 <= cursor < {self.capacity}"
            )
        if gens.shape != (size,) or gens.dtype.kind not in "iu":
            raise ValueError(
                f"state's write_generation has shape {gens.shape}, dtype {gens.dtype}; "
                f"expected ({size},) integers"
            )


class NextObsLinks:
    """Where every stored transition's ``next_obs`` lives when observations are stored once.

    A transition's next observation is, except at an episode boundary, the ``obs`` written at
    the next step of the *same stream* (an environment copy: ``add``/``extend`` write stream 0
    unless told otherwise, ``add_envs`` writes stream ``k`` for environment ``k``). At write
    time the writer compares the new transition's ``obs`` with the ``next_obs`` held for the
    stream's previous transition, byte for byte after conversion to the stored dtype:

    * equal: the previous slot *links* to the new one (``next_slot[prev] = new``) and its side
      row is freed — its next_obs is read from the new slot's obs section;
    * different (termination, truncation, reset, anything): the previous slot keeps its side
      row, which holds its true next_obs.

    Each new transition's own next_obs goes to a side row until its successor arrives (the
    newest transition of every stream always has one). Nothing depends on done flags, and the
    result is exact in every case; the side table holds one row per stream plus one per
    boundary still stored.

    Links never dangle: a successor is written after its predecessor, the ring overwrites the
    oldest slot first, so a predecessor is always overwritten (and its link dropped) before its
    successor. A slot being overwritten releases its side row; a stream whose previous slot was
    overwritten starts afresh (its next write cannot link back).

    Attributes
    ----------
    next_slot : ndarray, shape (capacity,), int64
        The successor slot, or -1 (the side table holds the next_obs).
    side_row : ndarray, shape (capacity,), int64
        The side-table row of a slot whose ``next_slot`` is -1 (else -1).
    side : ndarray, shape (side_rows, side_row_bytes), uint8
        Next_obs sections; grows by doubling, freed rows are reused.
    pending : dict[int, tuple[int, int]]
        Per stream, ``(slot, write generation)`` of its newest transition.
    """

    def __init__(self, capacity: int, obs_bytes: int, initial_rows: int = 64) -> None:
        self.capacity = int(capacity)
        self.obs_bytes = int(obs_bytes)
        width = -(-self.obs_bytes // 8) * 8  # whole words, so kernels may copy words
        self.next_slot = np.full(self.capacity, -1, dtype=np.int64)
        self.side_row = np.full(self.capacity, -1, dtype=np.int64)
        self.side = np.zeros((max(1, min(initial_rows, self.capacity + 1)), width), np.uint8)
        self.free: list[int] = list(range(self.side.shape[0] - 1, -1, -1))  # a stack
        self.pending: dict[int, tuple[int, int]] = {}

    @property
    def side_rows_used(self) -> int:
        """Side-table rows in use (one per stream plus one per stored boundary)."""
        return self.side.shape[0] - len(self.free)

    @property
    def nbytes(self) -> int:
        return int(self.next_slot.nbytes + self.side_row.nbytes + self.side.nbytes)

    def _reserve(self, count: int) -> None:
        """Grow the side table (doubling) until ``count`` rows are free."""
        while len(self.free) < count:
            old = self.side.shape[0]
            grown = np.zeros((2 * old, self.side.shape[1]), dtype=np.uint8)
            grown[:old] = self.side
            self.side = grown
            self.free.extend(range(2 * old - 1, old - 1, -1))

    def _allocate(self, count: int) -> np.ndarray:
        """``count`` free side rows (reserved by :meth:`_reserve`)."""
        self._reserve(count)
        taken = self.free[len(self.free) - count :]
        del self.free[len(self.free) - count :]
        return np.array(taken[::-1], dtype=np.int64)

    def commit_one(
        self,
        slot: int,
        row: np.ndarray,
        stream: int,
        generation: int,
        next_obs_start: int,
        write_generation: np.ndarray,
    ) -> None:
        """:meth:`commit` for one transition (``add``), in the fewest operations.

        ``row`` is the staged dense row (uint8, shape (row_bytes,)).
        """
        if not self.free:
            self._reserve(1)  # before anything changes (MemoryError leaves the links intact)
        obs_bytes = self.obs_bytes
        prev = self.pending.pop(stream, None)
        if prev is not None:
            prev_slot, gen = prev
            if prev_slot != slot and write_generation[prev_slot] == gen:
                held = int(self.side_row[prev_slot])
                if self.side[held, :obs_bytes].tobytes() == row[:obs_bytes].tobytes():
                    self.next_slot[prev_slot] = slot
                    self.side_row[prev_slot] = -1
                    self.free.append(held)
        old = int(self.side_row[slot])
        if old >= 0:
            self.free.append(old)
        self.next_slot[slot] = -1
        new = self.free.pop()
        self.side[new, :obs_bytes] = row[next_obs_start : next_obs_start + obs_bytes]
        self.side_row[slot] = new
        self.pending[stream] = (slot, generation)

    def commit(
        self,
        slots: np.ndarray,
        rows: np.ndarray,
        streams: np.ndarray | int,
        generations: np.ndarray,
        next_obs_start: int,
        write_generation: np.ndarray,
    ) -> None:
        """Update the links for staged dense ``rows`` (uint8, shape (n, row_bytes)) about to be
        written at ``slots`` with write ``generations`` (shape (n,), int64), by ``streams``
        (one int for all rows, in write order, or shape (n,) of distinct streams, one row
        each). Call before the storage write; ``write_generation`` is the pre-write state."""
        obs = rows[:, : self.obs_bytes]
        nobs = rows[:, next_obs_start : next_obs_start + self.obs_bytes]
        one_stream = isinstance(streams, (int, np.integer))
        # which new rows need a side row: decided (and the table grown) before anything changes,
        # so a MemoryError leaves the links as they were
        n = slots.shape[0]
        needs_side = np.ones(n, dtype=bool)
        same = None
        if one_stream and n > 1:
            same = (nobs[:-1] == obs[1:]).all(axis=1)
            needs_side[:-1] = ~same
        rows_needed = np.flatnonzero(needs_side)
        self._reserve(rows_needed.shape[0])
        stream_ids = (
            [int(streams)] if isinstance(streams, (int, np.integer)) else [int(x) for x in streams]
        )
        firsts = [0] if one_stream else list(range(len(stream_ids)))
        # 1. link each stream's previous transition to its first new row (if still stored,
        #    not overwritten by this write, and its next_obs equals the new obs)
        overwritten = set(slots.tolist()) if slots.shape[0] <= 64 else None
        for stream, first in zip(stream_ids, firsts):
            prev = self.pending.pop(stream, None)
            if prev is None:
                continue
            slot, gen = prev
            if write_generation[slot] != gen:
                continue  # overwritten since: nothing to link
            if overwritten is not None and slot in overwritten:
                continue
            if overwritten is None and np.any(slots == slot):
                continue
            row = self.side_row[slot]
            if np.array_equal(self.side[row, : self.obs_bytes], obs[first]):
                self.next_slot[slot] = slots[first]
                self.side_row[slot] = -1
                self.free.append(int(row))
        # 2. release what the overwritten slots held
        held = self.side_row[slots]
        released = held[held >= 0]
        if released.size:
            self.free.extend(released.tolist())
        self.next_slot[slots] = -1
        self.side_row[slots] = -1
        # 3. the new rows: within one stream, row t links to row t + 1 when equal
        if same is not None:
            self.next_slot[slots[:-1][same]] = slots[1:][same]
        side_rows = self._allocate(rows_needed.shape[0])
        self.side[side_rows, : self.obs_bytes] = nobs[rows_needed]
        self.side_row[slots[rows_needed]] = side_rows
        # 4. each stream's newest transition waits for its successor
        if one_stream:
            self.pending[stream_ids[0]] = (int(slots[-1]), int(generations[-1]))
        else:
            for k, stream in enumerate(stream_ids):
                self.pending[stream] = (int(slots[k]), int(generations[k]))

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        used = self.side.shape[0]
        pending = np.array(
            [[s, slot, gen] for s, (slot, gen) in sorted(self.pending.items())], dtype=np.int64
        ).reshape(-1, 3)

        def part(array: np.ndarray) -> np.ndarray:
            return array.copy() if copy else array

        return {
            "next_slot": part(self.next_slot),
            "side_row": part(self.side_row),
            "side": part(self.side[:used]),
            "free": np.array(self.free, dtype=np.int64),
            "pending": pending,
        }

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` unless :meth:`load_state_dict` would accept ``state``."""
        next_slot = np.asarray(state["next_slot"])
        side_row = np.asarray(state["side_row"])
        side = np.asarray(state["side"])
        if next_slot.shape != (self.capacity,) or side_row.shape != (self.capacity,):
            raise ValueError(
                f"state's next_obs links have shapes {next_slot.shape}, {side_row.shape}; "
                f"expected ({self.capacity},)"
            )
        if side.ndim != 2 or side.shape[1] != self.side.shape[1] or side.dtype != np.uint8:
            raise ValueError(
                f"state's next_obs side table has shape {side.shape}, dtype {side.dtype}; "
                f"expected (rows, {self.side.shape[1]}) uint8"
            )
        # the gather kernels index with these without bounds checks: every value must be -1 or
        # a valid row
        if (
            side_row.max(initial=-1) >= side.shape[0]
            or next_slot.max(initial=-1) >= self.capacity
            or side_row.min(initial=-1) < -1
            or next_slot.min(initial=-1) < -1
        ):
            raise ValueError("state's next_obs links point outside the table (corrupt state)")

    def load_state_dict(self, state: Mapping[str, Any], adopt: bool = False) -> None:
        """Restore :meth:`state_dict` output; ``adopt=True`` keeps the state's side table
        array instead of copying it (for arrays nobody else holds, as read from a file)."""
        self.check_state(state)
        side = np.asarray(state["side"])
        self.next_slot[:] = state["next_slot"]
        self.side_row[:] = state["side_row"]
        if not side.shape[0]:
            side = np.zeros((1, self.side.shape[1]), dtype=np.uint8)
            free = [0]
        else:
            free = [int(x) for x in np.asarray(state["free"]).tolist()]
            side = (
                side if adopt and side.flags.c_contiguous and side.flags.writeable else side.copy()
            )
        self.side = side
        self.free = free
        pending = np.asarray(state["pending"], dtype=np.int64).reshape(-1, 3).tolist()
        self.pending = {int(s): (int(slot), int(gen)) for s, slot, gen in pending}


__all__ = ["NextObsLinks", "RingWriter"]
