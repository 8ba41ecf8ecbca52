"""The writer: where each transition goes and what the buffer knows about its slots.

It owns the ring arithmetic (cursor, fill level), the per-slot *write generation* (the value of
a global write counter when the slot was last written: a stale priority update or a sample taken
before an overwrite is recognised by comparing generations), and the buffer's locks.

Concurrency model: a buffer may be used by one or more writer threads and any number of sampling
threads at once. Writers serialize on ``write_lock`` while they validate and stage (staging has
one scratch row); the commit of staged rows into storage, the metadata update and every read of
the storage (index draw + gather, ``latest``, ``gather``, ``update_priorities``, ``state_dict``)
happen under ``lock``. So a sampler sees a row either entirely before or entirely after a write,
never a mix, and validation of staged rows (the costly part of a multi-step write) does not
block samplers. ``add``'s common case stages nothing: one kernel checks the step and stores it
under ``lock`` (:func:`marlbuf._kernels.store_dense_step` / ``store_lean_step``, a few
microseconds), so it needs no ``write_lock``. The gather kernels release the GIL, so a trainer
thread can run while another thread gathers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import link_rows, link_step, next_is_obs, release_slots, sequence_slots
from marlbuf._kernels.episodes import episode_heads, episode_tails, link_stream_steps
from marlbuf._kernels.staging import DENSE_NEXT_OBS, OBS_BYTES


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
        size = _int_field(state, "size")
        cursor = _int_field(state, "cursor")
        total = _int_field(state, "total_writes")
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
        generations = _int_array(state.get("write_generation"), "write_generation", (size,))
        expected = self.generations(capacity, size, cursor, total)
        if not np.array_equal(generations, expected):
            bad = int(np.flatnonzero(generations != expected)[0])
            raise ValueError(
                f"state's write_generation[{bad}] is {int(generations[bad])}; slot {bad} of a "
                f"ring after {total} writes holds generation {int(expected[bad])} (corrupt state)"
            )
        return size, expected


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
        #: ``next_slot`` and ``side_row`` as the rows of one array (what the kernels take)
        self.pointers = np.full((2, self.capacity), -1, dtype=np.int64)
        self.next_slot = self.pointers[0]
        self.side_row = self.pointers[1]
        # the side table grows by doubling: start small when rows are huge (a few MiB at most)
        rows = min(initial_rows, self.capacity + 1, max(2, (4 << 20) // max(1, width)))
        self.side = np.zeros((max(1, rows), width), np.uint8)
        self.free: list[int] = list(range(self.side.shape[0] - 1, -1, -1))  # a stack
        self.pending: dict[int, tuple[int, int]] = {}
        self._geometries: dict[int, np.ndarray] = {}

    @property
    def side(self) -> np.ndarray:
        """The side table (shape (side_rows, side_row_bytes), uint8)."""
        return self._side

    @side.setter
    def side(self, table: np.ndarray) -> None:
        self._side = table
        #: the same table as 8-byte words (what the one-step kernels take)
        self.side_words = table.view(np.uint64)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for view in ("side_words", "next_slot", "side_row"):  # rebuilt from the copy's arrays
            del state[view]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.side = state["_side"]
        self.next_slot = self.pointers[0]
        self.side_row = self.pointers[1]

    @property
    def side_rows_used(self) -> int:
        """Side-table rows in use (one per stream plus one per stored boundary)."""
        return self.side.shape[0] - len(self.free)

    @property
    def nbytes(self) -> int:
        return int(self.next_slot.nbytes + self.side_row.nbytes + self.side.nbytes)

    def reserve(self, count: int) -> None:
        """Grow the side table (doubling) until ``count`` rows are free."""
        while len(self.free) < count:
            old = self.side.shape[0]
            grown = np.zeros((2 * old, self.side.shape[1]), dtype=np.uint8)
            grown[:old] = self.side
            self.side = grown
            self.free.extend(range(2 * old - 1, old - 1, -1))

    def _allocate(self, count: int) -> np.ndarray:
        """``count`` free side rows (reserved by :meth:`reserve`)."""
        self.reserve(count)
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

        ``row`` is the staged dense row (uint8, shape (row_bytes,)). The comparison and the
        side-row copy run in :func:`marlbuf._kernels.link_step`; ``next_obs_start`` is the
        codec's (``row``'s next_obs section).
        """
        if not self.free:
            self.reserve(1)  # before anything changes (MemoryError leaves the links intact)
        prev = self.pending.pop(stream, None)
        prev_slot, prev_generation = prev if prev is not None else (-1, -1)
        self.apply_step_code(
            link_step(
                row.view(np.uint64),
                slot,
                self._geometry(next_obs_start),
                self.side_words,
                self.next_slot,
                self.side_row,
                write_generation,
                prev_slot,
                prev_generation,
                self.free[-1],
            )
        )
        self.pending[stream] = (slot, generation)

    def apply_step_code(self, code: int) -> None:
        """Update the free stack as :func:`marlbuf._kernels.link_step` says (its return value)."""
        if code >= 0:
            self.free.append(code)
        elif code == -2:
            self.free.pop()

    def _geometry(self, next_obs_start: int) -> np.ndarray:
        """:func:`marlbuf._kernels.link_step`'s row geometry for a row whose next_obs section
        starts at byte ``next_obs_start`` (only its obs length and next_obs offset are read)."""
        geometry = self._geometries.get(next_obs_start)
        if geometry is None:
            geometry = np.zeros(6, dtype=np.int64)
            geometry[OBS_BYTES] = self.obs_bytes
            geometry[DENSE_NEXT_OBS] = next_obs_start // 8
            self._geometries[next_obs_start] = geometry
        return geometry

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
        words = rows.view(np.uint64)  # staged rows are whole words; sections start on words
        next_word = next_obs_start // 8
        one_stream = isinstance(streams, (int, np.integer))
        # which new rows need a side row (the comparisons run in next_is_obs): decided, and
        # the table grown, before anything changes, so a MemoryError leaves the links as they
        # were
        n = slots.shape[0]
        same = np.zeros(max(n - 1, 0), dtype=bool)  # all False: rows of distinct streams
        needed = n
        if one_stream and n > 1:
            needed = int(next_is_obs(words, self.obs_bytes, next_word, same))
        self.reserve(needed)
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
            if self.side[row, : self.obs_bytes].tobytes() == obs[first].tobytes():
                self.next_slot[slot] = slots[first]
                self.side_row[slot] = -1
                self.free.append(int(row))
        # 2. release what the overwritten slots held (and clear their links)
        released = np.empty(n, dtype=np.int64)
        count = release_slots(slots, self.pointers, released)
        if count:
            self.free.extend(released[:count].tolist())
        # 3. the new rows: within one stream, row t links to row t + 1 when equal; the others
        #    keep their next_obs in a side row
        link_rows(
            words,
            slots,
            same,
            self._allocate(needed),
            self.side_words,
            self.pointers,
            self.obs_bytes,
            next_word,
        )
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

    @staticmethod
    def side_rows_bound(capacity: int) -> int:
        """The most rows a next-observation side table of a ring of ``capacity`` slots can
        have: a write of up to ``capacity`` rows reserves its side rows before the rows it
        overwrites free theirs (``2 * capacity`` in use), and the table grows by doubling."""
        return max(64, 4 * (capacity + 1))

    def check_loaded(self, links: Mapping[str, Any], size: int, generations: np.ndarray) -> None:
        """Check a loaded state's next-observation links (``next_obs="once"``) as a whole.

        Every filled slot (``[0, size)``, write ``generations``) has its next observation
        either in a later slot (``next_slot``: a filled slot written after it, the successor
        of no other slot) or in a side row of its own (``side_row``), never both; unfilled
        slots have neither. Side rows in use and ``free`` ones are distinct and together are
        every row of the side table (rows as wide as this table's, at most
        :meth:`side_rows_bound`). ``pending`` holds one ``(stream, slot, generation)`` per
        stream, distinct non-negative int64 streams; where the slot still holds that
        generation, it is the stream's newest step: its next observation is in a side row.
        Raises ``ValueError`` naming what disagrees; changes nothing.
        """
        capacity, width = self.capacity, self.side.shape[1]
        if not isinstance(links, Mapping):
            raise ValueError("state's links must be a mapping (corrupt state)")
        keys = ("next_slot", "side_row", "side", "free", "pending")
        missing = [k for k in keys if k not in links]
        if missing:
            raise ValueError(f"state's next_obs links lack {missing} (corrupt state)")
        next_slot = _int_array(links["next_slot"], "links next_slot", (capacity,))
        side_row = _int_array(links["side_row"], "links side_row", (capacity,))
        side = np.asarray(links["side"])
        rows = side.shape[0] if side.ndim == 2 else -1
        if side.ndim != 2 or side.shape[1] != width or side.dtype != np.uint8:
            raise ValueError(
                f"state's next_obs side table has shape {side.shape}, dtype {side.dtype}; "
                f"expected (rows, {width}) uint8 (corrupt state)"
            )
        if rows > self.side_rows_bound(capacity):
            raise ValueError(
                f"state's next_obs side table has {rows} rows; a buffer of capacity {capacity} "
                f"never has more than {self.side_rows_bound(capacity)} (corrupt state)"
            )
        for name, values, bound in (("next_slot", next_slot, size), ("side_row", side_row, rows)):
            if values.size and (int(values.min()) < -1 or int(values.max()) >= bound):
                raise ValueError(
                    f"state's links {name} point outside [-1, {bound}) (corrupt state)"
                )
        if np.any(next_slot[size:] != -1) or np.any(side_row[size:] != -1):
            raise ValueError(
                "state's links give next observations to unfilled slots (corrupt state)"
            )
        filled_next, filled_side = next_slot[:size], side_row[:size]
        if np.any((filled_next >= 0) == (filled_side >= 0)):
            bad = int(np.flatnonzero((filled_next >= 0) == (filled_side >= 0))[0])
            raise ValueError(
                f"state's slot {bad} has next_slot={int(filled_next[bad])} and "
                f"side_row={int(filled_side[bad])}; a filled slot has exactly one (corrupt state)"
            )
        linked = np.flatnonzero(filled_next >= 0)
        successors = filled_next[linked]
        if successors.size and (
            np.any(generations[successors] <= generations[linked])
            or np.unique(successors).size != successors.size
        ):
            raise ValueError(
                "state's next_slot links a slot to one written before it, or two slots to one "
                "successor (corrupt state)"
            )
        used = filled_side[filled_side >= 0]
        free = np.asarray(links["free"])
        if free.ndim != 1 or (free.size and free.dtype.kind not in "iu"):
            raise ValueError(f"state's links free has shape {free.shape}; expected (n,) integers")
        free = free.astype(np.int64, copy=False)
        every = np.concatenate([used, free])
        if (
            every.size != rows
            or (every.size and (int(every.min()) < 0 or int(every.max()) >= rows))
            or np.unique(every).size != every.size
        ):
            raise ValueError(
                f"state's side rows in use ({used.size}) and free ({free.size}) are not the "
                f"{rows} rows of its side table, each once (corrupt state)"
            )
        pending = np.asarray(links["pending"])
        if pending.size == 0:
            return
        if pending.ndim != 2 or pending.shape[1] != 3 or pending.dtype.kind not in "iu":
            raise ValueError(
                f"state's pending links have shape {pending.shape}; expected (streams, 3) integers"
            )
        streams, slots, gens = (pending[:, k].astype(np.int64) for k in range(3))
        if pending.dtype.kind == "u" and int(pending.max()) > _config.MAX_STREAM:
            raise ValueError("state's pending links hold values beyond int64 (corrupt state)")
        if (
            int(streams.min()) < 0
            or np.unique(streams).size != streams.size
            or int(slots.min()) < 0
            or int(slots.max()) >= capacity
            or int(gens.min()) < 0
        ):
            raise ValueError(
                "state's pending links need distinct streams >= 0, slots in "
                f"[0, {capacity}) and generations >= 0 (corrupt state)"
            )
        current = slots < size
        live = current.copy()
        live[current] = generations[slots[current]] == gens[current]
        if np.any(side_row[slots[live]] < 0) or np.unique(slots[live]).size != int(live.sum()):
            raise ValueError(
                "state's pending links name a stored step whose next observation is not in a side "
                "row, or one step for two streams (corrupt state)"
            )

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


class EpisodeIndex:
    """Which stored steps form an episode, in order: the bookkeeping of sequence sampling.

    Every step is written by a *stream* (an environment copy, as for :class:`NextObsLinks`).
    A stream's steps belong to its *open* episode until one of them ends it: a step where every
    agent's ``done`` is true (termination) or one passed with ``truncated=True`` (truncation).
    The stream's next step begins a new episode. Episode ids are unique over the buffer's life
    (a counter), so steps of two streams or two episodes never share one.

    **Stream breaks.** A step whose ``obs`` differs (byte for byte, as stored) from the
    ``next_obs`` of the stream's previous step, when that step was neither done nor truncated,
    cannot continue its episode: two environments are being written in turn on one stream. The
    open episode then ends at the previous step and the new step begins a new one, so a
    sequence never mixes environments; :attr:`breaks` counts these steps (the buffer warns).
    The comparison needs the previous step's ``next_obs``, kept per open stream
    (:attr:`last_next`); it is part of the state (:meth:`state_dict`), so a reload changes no
    comparison. A state written before it was saved gets it from the stored rows where the
    stream's newest step is still stored (else that stream's next step is not compared).

    Per slot the index keeps the stored step's episode id, its step number in the episode and
    links to the slots of the previous and next step of that episode. The ring overwrites the
    oldest slot first, so links may point at slots overwritten since: a link counts only while
    its target still holds the same episode at step -1 (``prev_slot``) / +1 (``next_slot``),
    which :func:`marlbuf._kernels.sequence_slots` checks on every read. A sequence therefore
    never contains an overwritten step, a step of another episode or of another stream.

    **Complete episodes.** An episode that has ended and whose first step is still stored is
    stored whole (the ring overwrites the oldest slot first, so its later steps are newer). The
    index keeps the set of their first slots (:attr:`complete`, the draws of
    :class:`marlbuf.samplers.Episodes`) with each one's length.

    Parameters
    ----------
    capacity : int
        Slots of the ring.
    obs_bytes : int, default 0
        Bytes of a staged row's observation section (its first ``obs_bytes`` bytes); 0 turns
        the stream-break check off.
    next_obs_start : int, default 0
        Byte offset of the staged row's next_obs section (``obs_bytes`` long).

    Attributes
    ----------
    episode : ndarray, shape (capacity,), int64
        Episode id of the step in each slot; -1 for never-written slots.
    step : ndarray, shape (capacity,), int64
        Position of that step in its episode (0 for the first).
    prev_slot, next_slot : ndarray, shape (capacity,), int64
        Slot of the previous / next step of the same episode, or -1 (none stored yet, or the
        episode begins / ends here).
    length : ndarray, shape (capacity,), int64
        At the first slot of a complete stored episode, its number of steps; 0 elsewhere.
    complete : ndarray, shape (capacity,), int64
        ``complete[:n_complete]``: the first slots of the complete stored episodes, in no
        particular order (a set with O(1) insertion and removal; ``complete_position`` is each
        slot's place in it, or -1).
    n_complete : int
        Complete episodes stored.
    open : dict[int, tuple[int, int, int, int]]
        Per stream with an unfinished episode: ``(episode id, step number of its newest step,
        that step's slot or -1, its write generation)``.
    next_episode : int
        The id of the next episode to begin.
    breaks : int
        Steps that began a new episode because of a stream break.
    listener : callable or None
        Called with the first slots (shape (k,), int64) of episodes that became complete, and
        with ``None`` after the set was rebuilt from a loaded state (a sampler that keeps
        per-episode state, such as priorities, re-reads :attr:`complete` then).
    """

    def __init__(self, capacity: int, obs_bytes: int = 0, next_obs_start: int = 0) -> None:
        self.capacity = int(capacity)
        self.episode = np.full(self.capacity, -1, dtype=np.int64)
        self.step = np.zeros(self.capacity, dtype=np.int64)
        self.prev_slot = np.full(self.capacity, -1, dtype=np.int64)
        self.next_slot = np.full(self.capacity, -1, dtype=np.int64)
        self.length = np.zeros(self.capacity, dtype=np.int64)
        self.complete = np.zeros(self.capacity, dtype=np.int64)
        self.complete_position = np.full(self.capacity, -1, dtype=np.int64)
        self.n_complete = 0
        self.open: dict[int, tuple[int, int, int, int]] = {}
        self.next_episode = 0
        self.obs_bytes = int(obs_bytes)
        self.next_obs_start = int(next_obs_start)
        #: per stream with an open episode, the next_obs bytes of its newest step
        self.last_next: dict[int, bytes] = {}
        self.breaks = 0
        self.listener: Callable[[np.ndarray | None], None] | None = None
        self._next_saved = False
        self._heads = np.zeros(1, dtype=np.int64)
        self._no_rows = np.zeros((1, 1), dtype=np.uint8)  # the kernel's rows when none compare

    @property
    def nbytes(self) -> int:
        return int(
            self.episode.nbytes
            + self.step.nbytes
            + self.prev_slot.nbytes
            + self.next_slot.nbytes
            + self.length.nbytes
            + self.complete.nbytes
            + self.complete_position.nbytes
        )

    # ------------------------------------------------------------ complete episodes
    def _forget(self, slot: int) -> None:
        """Take ``slot`` (a complete episode's first slot, about to be overwritten) out of the
        set: the set's last entry moves into its place."""
        position = int(self.complete_position[slot])
        last = self.n_complete - 1
        moved = int(self.complete[last])
        self.complete[position] = moved
        self.complete_position[moved] = position
        self.complete_position[slot] = -1
        self.length[slot] = 0
        self.n_complete = last

    def _release(self, slots: np.ndarray) -> None:
        """Forget the complete episodes whose first slot is among ``slots`` (shape (T,),
        int64: about to be overwritten)."""
        if slots.shape[0] == 1:
            if self.complete_position[slots[0]] >= 0:
                self._forget(int(slots[0]))
            return
        for slot in slots[self.complete_position[slots] >= 0].tolist():
            self._forget(slot)

    def _finish(self, last_slots: np.ndarray) -> None:
        """Record the episodes that ended at ``last_slots`` (shape (k,), int64, stored slots, or
        -1 for none) as complete where their first step is still stored (call after the index
        holds the call's steps: a walk through a slot overwritten since fails its link
        check)."""
        if last_slots.shape[0] == 1:
            heads = self._heads
        else:
            heads = np.empty(last_slots.shape[0], dtype=np.int64)
        episode_heads(last_slots, self.episode, self.step, self.prev_slot, heads)
        added = []
        for head, last in zip(heads.tolist(), last_slots.tolist()):
            if head < 0 or self.complete_position[head] >= 0:
                continue
            self.complete[self.n_complete] = head
            self.complete_position[head] = self.n_complete
            self.n_complete += 1
            self.length[head] = self.step[last] + 1
            added.append(head)
        if added and self.listener is not None:
            self.listener(np.array(added, dtype=np.int64))

    def _close(
        self, last: tuple[int, int, int, int], write_generation: np.ndarray, overwritten: Any
    ) -> int:
        """The newest slot of an open episode ``last`` (an :attr:`open` entry) that a stream
        break ends, or -1 when it is no longer stored (or is among ``overwritten``)."""
        slot, generation = last[2], last[3]
        if slot < 0 or write_generation[slot] != generation or bool(np.any(overwritten == slot)):
            return -1
        return slot

    def _broken(self, stream: int, obs: bytes) -> bool:
        """Whether a step of ``stream`` with observation bytes ``obs`` breaks the stream (it
        does not continue the open episode's newest step)."""
        expected = self.last_next.get(stream)
        return expected is not None and expected != obs

    def complete_slots(self) -> np.ndarray:
        """The first slots of the complete stored episodes (shape (n_complete,), int64, a view:
        read it before the next write)."""
        return self.complete[: self.n_complete]

    def stored_episodes(self, size: int) -> int:
        """Episodes with at least one step among the ``size`` filled slots (complete, cut by
        the ring, or still open): the stored steps whose previous step is not stored."""
        if size == 0:
            return 0
        prev = self.prev_slot[:size]
        linked = prev >= 0
        back = np.where(linked, prev, 0)
        linked &= self.episode[back] == self.episode[:size]
        linked &= self.step[back] == self.step[:size] - 1
        return int(size - np.count_nonzero(linked))

    def rebuild_complete(self, size: int, order: np.ndarray | None = None) -> None:
        """Recompute the complete episodes from the links (after a state was loaded): see
        :func:`complete_episodes`. ``order`` (the set as saved, shape (k,), int64) keeps the
        saved order where it holds the same slots, so that draws continue as they would have."""
        self.length[:] = 0
        self.complete_position[:] = -1
        open_ids = np.array([entry[0] for entry in self.open.values()], dtype=np.int64)
        heads, tails = complete_episodes(self.episode, self.step, self.next_slot, size, open_ids)
        if order is not None:
            order = np.asarray(order, dtype=np.int64).reshape(-1)
            if order.shape == heads.shape and np.array_equal(np.sort(order), heads):
                heads = order
                episode_tails(heads, self.episode, self.step, self.next_slot, tails)
        count = heads.shape[0]
        self.complete[:count] = heads
        self.complete_position[heads] = np.arange(count, dtype=np.int64)
        self.length[heads] = self.step[tails] + 1
        self.n_complete = count
        if self.listener is not None:
            self.listener(None)

    def _continue(
        self, stream: int, write_generation: np.ndarray, overwritten: np.ndarray
    ) -> tuple[int, int, int]:
        """``(episode id, step number, previous slot or -1)`` of the next step of ``stream``
        (a new episode if it has none open); links the open episode's newest slot forward is
        left to the caller. ``overwritten`` are the slots this call writes."""
        last = self.open.pop(stream, None)
        if last is None:
            episode = self.next_episode
            self.next_episode += 1
            return episode, 0, -1
        episode, step, slot, generation = last
        if slot < 0 or write_generation[slot] != generation or bool(np.any(overwritten == slot)):
            slot = -1  # overwritten since (or by this very call): nothing to link back to
        return episode, step + 1, slot

    def commit_one(
        self,
        slot: int,
        ends: bool,
        stream: int,
        generation: int,
        write_generation: np.ndarray,
        row: np.ndarray | None = None,
        quiet: bool = True,
        full: bool = True,
    ) -> None:
        """:meth:`commit` for one step (``add``), with scalars only. Call before the storage
        write; ``write_generation`` is the pre-write state and ``generation`` the new step's.
        ``row`` (the staged row, uint8, shape (row_bytes,)) is compared for stream breaks;
        ``quiet`` and ``full`` are as in :meth:`commit`."""
        if self.complete_position[slot] >= 0:
            self._forget(slot)
        last = self.open.pop(stream, None)
        closed = -1
        check = row is not None and self.obs_bytes > 0
        if last is not None and check and full:
            assert row is not None
            if self._broken(stream, row[: self.obs_bytes].tobytes()):
                self.breaks += 1
                closed = self._close(last, write_generation, slot)
                last = None
        prev = -1
        if last is None:
            episode, step = self.next_episode, 0
            self.next_episode += 1
        else:
            episode, step, prev, gen = last
            step += 1
            if prev < 0 or prev == slot or write_generation[prev] != gen:
                prev = -1
            else:
                self.next_slot[prev] = slot
        self.episode[slot] = episode
        self.step[slot] = step
        self.prev_slot[slot] = prev
        self.next_slot[slot] = -1
        if not ends:
            self.open[stream] = (episode, step, slot, generation)
        if not ends and check and quiet:
            assert row is not None
            start = self.next_obs_start
            self.last_next[stream] = row[start : start + self.obs_bytes].tobytes()
        else:
            self.last_next.pop(stream, None)
        if closed >= 0:
            self._finish(np.array([closed], dtype=np.int64))
        if ends:
            self._heads[0] = slot
            self._finish(self._heads.copy())

    def commit(
        self,
        slots: np.ndarray,
        ends: np.ndarray,
        streams: int | np.ndarray,
        skip: int,
        first_generation: int,
        write_generation: np.ndarray,
        rows: np.ndarray | None = None,
        quiet: np.ndarray | None = None,
        full: np.ndarray | None = None,
    ) -> None:
        """Record the steps of one call about to be written (call before the storage write).

        Parameters
        ----------
        slots : ndarray, shape (T - skip,), int64
            Where the kept steps go (:meth:`RingWriter.plan`).
        ends : ndarray, shape (T,), bool
            Per step of the call (skipped ones included), whether it ends its episode.
        streams : int or ndarray, shape (T,), int64
            One stream for every step (``add``/``extend``: consecutive steps of it) or one
            distinct stream per step (``add_envs``).
        skip : int
            Leading steps of the call overwritten by the call itself (``T > capacity``): they
            still count for step numbers and episode ends, but are not stored.
        first_generation : int
            Write generation of the call's first step (``total_writes`` before the call).
        write_generation : ndarray, shape (capacity,), int64
            The pre-write generations (to tell whether a stream's newest slot is still stored).
        rows : ndarray, shape (T, row_bytes), uint8, optional
            The staged rows, compared for stream breaks (``None``: no check).
        quiet : ndarray, shape (T,), bool, optional
            Whether each step's next_obs may be compared with the obs of the stream's next step:
            no agent done and every agent present (default: all True).
        full : ndarray, shape (T,), bool, optional
            Whether each step's obs may be compared: every agent present (default: all True).
        """
        if rows is not None:
            quiet = np.ones(ends.shape[0], dtype=bool) if quiet is None else quiet
            full = np.ones(ends.shape[0], dtype=bool) if full is None else full
        self._release(slots)
        check = rows is not None and self.obs_bytes > 0
        if isinstance(streams, (int, np.integer)):
            self._commit_stream(
                slots,
                ends,
                int(streams),
                skip,
                first_generation,
                write_generation,
                rows if check else None,
                quiet,
                full,
            )
            return
        total = int(ends.shape[0])
        kept = total - skip
        observed, following = self.obs_bytes, self.next_obs_start
        episode = np.empty(kept, dtype=np.int64)
        step = np.empty(kept, dtype=np.int64)
        prev = np.full(kept, -1, dtype=np.int64)
        links: list[tuple[int, int]] = []  # (older slot, its new successor)
        closed: list[int] = []  # newest slots of episodes a stream break ended
        for k in range(total):
            stream = int(streams[k])
            if check and stream in self.open and full is not None and full[k]:
                assert rows is not None
                if self._broken(stream, rows[k, :observed].tobytes()):
                    self.breaks += 1
                    closed.append(self._close(self.open.pop(stream), write_generation, slots))
            ep, st, back = self._continue(stream, write_generation, slots)
            slot = int(slots[k - skip]) if k >= skip else -1
            if k >= skip:
                episode[k - skip], step[k - skip] = ep, st
                if back >= 0:
                    prev[k - skip] = back
                    links.append((back, slot))
            if not ends[k]:
                self.open[stream] = (ep, st, slot, first_generation + k)
            if not ends[k] and check and quiet is not None and quiet[k]:
                assert rows is not None
                self.last_next[stream] = rows[k, following : following + observed].tobytes()
            else:
                self.last_next.pop(stream, None)
        for older, newer in links:
            self.next_slot[older] = newer
        self.episode[slots] = episode
        self.step[slots] = step
        self.prev_slot[slots] = prev
        self.next_slot[slots] = -1
        lasts = np.concatenate(
            [np.array(closed, dtype=np.int64), slots[np.asarray(ends[skip:], dtype=bool)]]
        )
        if lasts.shape[0]:
            self._finish(lasts)

    def _commit_stream(
        self,
        slots: np.ndarray,
        ends: np.ndarray,
        stream: int,
        skip: int,
        first_generation: int,
        write_generation: np.ndarray,
        rows: np.ndarray | None,
        quiet: np.ndarray | None,
        full: np.ndarray | None,
    ) -> None:
        """:meth:`commit` for consecutive steps of one stream: the first step's break check
        here, the rest in one kernel call (:func:`marlbuf._kernels.episodes.link_stream_steps`:
        breaks inside the call, ids, step numbers and links)."""
        total = int(ends.shape[0])
        ends = np.array(ends, dtype=np.bool_)  # breaks are set in it
        closed = -1
        observed, following = self.obs_bytes, self.next_obs_start
        if rows is not None:
            assert quiet is not None and full is not None
            if (
                stream in self.open
                and full[0]
                and self._broken(stream, rows[0, :observed].tobytes())
            ):
                self.breaks += 1
                closed = self._close(self.open.pop(stream), write_generation, slots)
        else:
            rows, observed = self._no_rows, 0
            quiet = full = np.ones(total, dtype=np.bool_)
        open_episode, open_step, back = -1, 0, -1
        if stream in self.open:  # the first step continues the stream's open episode
            open_episode = self.open[stream][0]
            _, first_step, back = self._continue(stream, write_generation, slots)
            open_step = first_step - 1
        self.open.pop(stream, None)
        items, compared, start = rows, observed, following
        if not (observed | following | rows.shape[1]) % 8:  # compare 8-byte words
            items, compared, start = rows.view(np.uint64), observed // 8, following // 8
        self.next_episode, last_episode, last_step, breaks = link_stream_steps(
            np.ascontiguousarray(slots, dtype=np.int64),
            ends,
            int(skip),
            int(open_episode),
            int(open_step),
            int(back),
            int(self.next_episode),
            items,
            int(compared),
            int(start),
            np.ascontiguousarray(quiet, dtype=np.bool_),
            np.ascontiguousarray(full, dtype=np.bool_),
            self.episode,
            self.step,
            self.prev_slot,
            self.next_slot,
        )
        self.breaks += breaks
        if not ends[-1]:
            gen = first_generation + total - 1
            self.open[stream] = (last_episode, last_step, int(slots[-1]), gen)
        if not ends[-1] and observed and quiet[-1]:
            self.last_next[stream] = rows[-1, following : following + observed].tobytes()
        else:
            self.last_next.pop(stream, None)
        lasts = slots[ends[skip:]]
        if closed >= 0:
            lasts = np.concatenate([np.array([closed], dtype=np.int64), lasts])
        if lasts.shape[0]:
            self._finish(lasts)

    def sequences(self, starts: np.ndarray, before: int, after: int) -> np.ndarray:
        """The slot matrix of sequences around ``starts`` (shape (B,), int64, stored slots):
        shape (B, before + 1 + after), int64, -1 where masked (see
        :func:`marlbuf._kernels.sequence_slots`)."""
        out = np.empty((starts.shape[0], before + 1 + after), dtype=np.int64)
        sequence_slots(
            np.ascontiguousarray(starts, dtype=np.int64),
            int(before),
            int(after),
            self.episode,
            self.step,
            self.prev_slot,
            self.next_slot,
            out,
        )
        return out

    def state_dict(self, size: int, copy: bool = True) -> dict[str, Any]:
        """The filled part (slots ``[0, size)``) and the open episodes."""

        def part(array: np.ndarray) -> np.ndarray:
            return array[:size].copy() if copy else array[:size]

        open_rows = np.array(
            [[s, *entry] for s, entry in sorted(self.open.items())], dtype=np.int64
        ).reshape(-1, 5)
        streams = sorted(self.last_next)
        held = np.frombuffer(b"".join(self.last_next[s] for s in streams), dtype=np.uint8)
        return {
            "episode": part(self.episode),
            "step": part(self.step),
            "prev_slot": part(self.prev_slot),
            "next_slot": part(self.next_slot),
            "open": open_rows,
            "next_episode": int(self.next_episode),
            "complete": self.complete[: self.n_complete].copy(),
            # the stream-break check's memory: per open stream, its newest step's next_obs
            "next_streams": np.array(streams, dtype=np.int64),
            "next_obs": held.reshape(len(streams), self.obs_bytes).copy(),
            "breaks": int(self.breaks),
        }

    def check_state(
        self,
        state: Mapping[str, Any],
        size: int,
        generations: np.ndarray | None = None,
        stored_next: StoredNext | None = None,
    ) -> None:
        """Raise ``ValueError`` unless :meth:`load_state_dict` would accept ``state``.

        Besides shapes and ranges, the parts are checked against each other: an open episode
        whose newest step is still stored (its slot holds its write generation, of the filled
        slots' ``generations``, shape (size,), int64) holds that episode and step there; the
        saved set of complete episodes is the one the links give (:func:`complete_episodes`);
        and the saved next observation of each open stream is the stored one
        (``stored_next``), present exactly when that step may be compared.
        """
        keys = ("episode", "step", "prev_slot", "next_slot", "open", "next_episode")
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"state's episode index lacks {missing} (corrupt state)")
        arrays = {k: np.asarray(state[k]) for k in keys[:4]}
        for key, array in arrays.items():
            if array.shape != (size,) or array.dtype.kind not in "iu":
                raise ValueError(
                    f"state's episode index {key!r} has shape {array.shape}, dtype "
                    f"{array.dtype}; expected ({size},) integers"
                )
        # the kernels follow the links without bounds checks: -1 or a filled slot only
        for key in ("prev_slot", "next_slot"):
            links = arrays[key]
            if links.size and (links.min() < -1 or links.max() >= size):
                raise ValueError(f"state's episode links {key!r} point outside the filled slots")
        open_rows = np.asarray(state["open"])
        if open_rows.size and (
            open_rows.ndim != 2 or open_rows.shape[1] != 5 or open_rows.dtype.kind not in "iu"
        ):
            raise ValueError(
                f"state's open episodes have shape {open_rows.shape}, dtype {open_rows.dtype}; "
                "expected (streams, 5) integers"
            )
        open_rows = open_rows.reshape(-1, 5).astype(np.int64)
        if open_rows.size and (open_rows[:, 3].min() < -1 or open_rows[:, 3].max() >= size):
            raise ValueError("state's open episodes point outside the filled slots")
        next_episode = state["next_episode"]
        if isinstance(next_episode, bool) or not isinstance(next_episode, (int, np.integer)):
            raise ValueError(f"state's next_episode must be an int; got {next_episode!r}")
        if arrays["episode"].size and int(arrays["episode"].max()) >= int(next_episode):
            raise ValueError("state's episode ids reach its next_episode (corrupt state)")
        episode, step = arrays["episode"].astype(np.int64), arrays["step"].astype(np.int64)
        if size and (episode.min() < 0 or step.min() < 0):
            raise ValueError(
                "state's episode index has a filled slot without an episode or with a negative "
                "step (corrupt state)"
            )
        # an (episode, step) pair is written once: the links are followed by these pairs
        pairs = episode * (int(step.max(initial=0)) + 1) + step
        if size and np.unique(pairs).shape[0] != size:
            raise ValueError(
                "state's episode index holds one step of an episode in two slots (corrupt state)"
            )
        if open_rows.size:
            streams, ids, steps = open_rows[:, 0], open_rows[:, 1], open_rows[:, 2]
            if (
                streams.min() < 0
                or np.unique(streams).shape[0] != streams.shape[0]
                or np.unique(ids).shape[0] != ids.shape[0]
                or ids.min() < 0
                or ids.max() >= int(next_episode)
                or steps.min() < 0
            ):
                raise ValueError(
                    "state's open episodes name a negative or repeated stream, one episode for "
                    "two streams, an episode id outside [0, next_episode) or a negative step "
                    "(corrupt state)"
                )
        held = _held_open(open_rows, size, generations)
        if held.size and (
            np.any(episode[open_rows[held, 3]] != open_rows[held, 1])
            or np.any(step[open_rows[held, 3]] != open_rows[held, 2])
        ):
            bad = int(open_rows[held][0, 0])
            raise ValueError(
                f"state's open episode of stream {bad} names a stored slot that holds another "
                "step (corrupt state)"
            )
        breaks = np.asarray(state.get("breaks", 0))
        if breaks.shape != () or breaks.dtype.kind not in "iu" or int(breaks) < 0:
            raise ValueError(
                f"state's episode index has breaks={breaks!r}; expected an int >= 0 (corrupt state)"
            )
        if "complete" in state:  # the set of complete episodes, in the order draws use
            complete = np.asarray(state["complete"])
            if complete.ndim != 1 or (complete.size and complete.dtype.kind not in "iu"):
                raise ValueError(
                    f"state's complete episodes have shape {complete.shape}, dtype "
                    f"{complete.dtype}; expected (k,) integers"
                )
            heads, _ = complete_episodes(
                episode, step, arrays["next_slot"].astype(np.int64), size, open_rows[:, 1]
            )
            if complete.shape != heads.shape or not np.array_equal(np.sort(complete), heads):
                raise ValueError(
                    f"state's set of complete episodes ({complete.shape[0]} first slots) is not "
                    f"the one its episode links give ({heads.shape[0]}: the stored episodes that "
                    "have ended and begin with step 0) (corrupt state)"
                )
        self._stream_next(state, open_rows, size, generations, stored_next)

    def _stream_next(
        self,
        state: Mapping[str, Any],
        open_rows: np.ndarray,
        size: int,
        generations: np.ndarray | None,
        stored_next: StoredNext | None,
    ) -> dict[int, bytes]:
        """:attr:`last_next` of a state, checked: the saved one (``next_streams``,
        ``next_obs``), which must agree with the stored newest step of every open stream where
        it is still stored; for a state saved without it, the stored one (streams whose newest
        step was overwritten are then not compared)."""
        if not self.obs_bytes:
            return {}
        held = _held_open(open_rows, size, generations)
        slots = open_rows[held, 3]
        stored: dict[int, bytes | None] = {}
        if stored_next is not None and slots.size:
            values, quiet = stored_next(slots)
            for stream, value, compared in zip(open_rows[held, 0].tolist(), values, quiet):
                stored[stream] = value.tobytes() if compared else None
        if "next_streams" not in state:  # saved before the index kept it
            return {s: v for s, v in stored.items() if v is not None}
        streams = np.asarray(state["next_streams"])
        values = np.asarray(state.get("next_obs"))
        if (
            streams.ndim != 1
            or (streams.size and streams.dtype.kind not in "iu")
            or values.shape != (streams.shape[0], self.obs_bytes)
            or values.dtype != np.uint8
        ):
            raise ValueError(
                f"state's stream-break record has streams of shape {streams.shape} and next "
                f"observations of shape {values.shape}, dtype {values.dtype}; expected (k,) "
                f"integers and (k, {self.obs_bytes}) uint8 (corrupt state)"
            )
        saved = {int(s): values[k].tobytes() for k, s in enumerate(streams.tolist())}
        if len(saved) != streams.shape[0] or not set(saved) <= set(open_rows[:, 0].tolist()):
            raise ValueError(
                "state's stream-break record names a stream twice, or one without an open "
                "episode (corrupt state)"
            )
        for stream, value in stored.items():
            if saved.get(stream) != value:
                raise ValueError(
                    f"state's stream-break record of stream {stream} disagrees with the stream's "
                    "newest stored step (its next_obs, or whether it may be compared) "
                    "(corrupt state)"
                )
        return saved

    def settle_stream_next(
        self, size: int, generations: np.ndarray, stored_next: StoredNext
    ) -> None:
        """Check :attr:`last_next` against the stored rows once they are the loaded state's (a
        memory-mapped checkpoint, loaded without ``stored_next`` before its log was replayed):
        as :meth:`check_state` does; a state saved without the record gets it from the rows."""
        open_rows = np.array(
            [[s, *entry] for s, entry in sorted(self.open.items())], dtype=np.int64
        ).reshape(-1, 5)
        if not self._next_saved:
            derived = self._stream_next({}, open_rows, size, generations, stored_next)
            self.last_next = {**derived, **self.last_next}  # replayed writes know better
            return
        held = _held_open(open_rows, size, generations)
        if not held.size:
            return
        values, quiet = stored_next(open_rows[held, 3])
        for stream, value, compared in zip(open_rows[held, 0].tolist(), values, quiet):
            expected = value.tobytes() if compared else None
            if self.last_next.get(stream) != expected:
                raise ValueError(
                    f"the checkpoint's stream-break record of stream {stream} disagrees with "
                    "the stream's newest stored step (its next_obs, or whether it may be "
                    "compared) (corrupt state)"
                )

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        size: int,
        generations: np.ndarray | None = None,
        stored_next: StoredNext | None = None,
    ) -> None:
        """Restore :meth:`state_dict` output, checked by :meth:`check_state` (with the same
        ``generations`` and ``stored_next``)."""
        self.check_state(state, size, generations, stored_next)
        for key in ("episode", "step", "prev_slot", "next_slot"):
            target = getattr(self, key)
            target[:] = -1 if key != "step" else 0
            target[:size] = np.asarray(state[key], dtype=np.int64)
        rows = np.asarray(state["open"], dtype=np.int64).reshape(-1, 5)
        self.open = {
            int(s): (int(e), int(st), int(sl), int(g)) for s, e, st, sl, g in rows.tolist()
        }
        self.next_episode = int(state["next_episode"])
        self.last_next = self._stream_next(state, rows, size, generations, stored_next)
        #: whether the loaded state held the stream-break record (checked, not derived, by
        #: :meth:`settle_stream_next`)
        self._next_saved = "next_streams" in state
        self.breaks = int(np.asarray(state.get("breaks", 0)))
        self.rebuild_complete(size, state.get("complete"))

    def reconstruct(self, size: int, ends: np.ndarray, successor: np.ndarray | None) -> None:
        """Rebuild the index of a state saved without one (no stream or truncation record).

        ``ends`` (shape (size,), bool) marks the stored steps where every agent is done.
        ``successor`` (shape (capacity,), int64, or ``None``) is the next step of the same
        stream where known (:attr:`NextObsLinks.next_slot`: exact within a stream); without it
        every slot is its own one-step episode. Episodes are cut after every ``ends`` step; no
        episode is left open (each stream's next write begins a new one).
        """
        prev = np.full(size, -1, dtype=np.int64)
        nxt = np.full(size, -1, dtype=np.int64)
        if successor is not None and size:
            after = successor[:size]
            linked = np.flatnonzero((after >= 0) & (after < size) & ~ends)
            nxt[linked] = after[linked]
            prev[after[linked]] = linked
        # list ranking by pointer doubling: each slot's first step (head) and distance to it
        head = np.where(prev >= 0, prev, np.arange(size, dtype=np.int64))
        distance = (prev >= 0).astype(np.int64)
        for _ in range(2 + int(size).bit_length()):  # enough rounds for any chain of size
            if not np.any(head[head] != head):
                break
            distance = distance + distance[head]
            head = head[head]
        else:  # a cycle: links no stream could have written (corrupt state)
            prev[:] = -1
            nxt[:] = -1
            head = np.arange(size, dtype=np.int64)
            distance = np.zeros(size, dtype=np.int64)
        _, episode = np.unique(head, return_inverse=True)
        self.episode[:] = -1
        self.step[:] = 0
        self.prev_slot[:] = -1
        self.next_slot[:] = -1
        self.episode[:size] = episode.reshape(-1)
        self.step[:size] = distance
        self.prev_slot[:size] = prev
        self.next_slot[:size] = nxt
        self.open = {}
        self.next_episode = int(episode.max()) + 1 if size else 0
        self.last_next = {}
        self.breaks = 0
        self.rebuild_complete(size)


#: ``stored_next(slots)`` of :meth:`EpisodeIndex.check_state`: for filled slots (shape (k,),
#: int64) of the state being loaded, the next_obs section of each stored step as the writer
#: staged it (shape (k, obs_bytes), uint8) and whether the stream-break check compares it
#: (shape (k,), bool: no agent done, every agent present)
StoredNext = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _held_open(open_rows: np.ndarray, size: int, generations: np.ndarray | None) -> np.ndarray:
    """Which open episodes (rows of a state's ``open``: stream, id, step, slot, generation)
    still have their newest step stored: positions into ``open_rows`` (shape (k,), int64)."""
    if generations is None or not open_rows.size:
        return np.zeros(0, dtype=np.int64)
    slots, gens = open_rows[:, 3], open_rows[:, 4]
    inside = (slots >= 0) & (slots < size)
    held = inside.copy()
    held[inside] = generations[slots[inside]] == gens[inside]
    return np.flatnonzero(held)


def complete_episodes(
    episode: np.ndarray,
    step: np.ndarray,
    next_slot: np.ndarray,
    size: int,
    open_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The complete stored episodes of an episode index: ``(first slots, last slots)`` (each
    shape (k,), int64, first slots ascending).

    An episode is complete when its step 0 is stored (the ring overwrites the oldest slot
    first, so every later step is stored too) and it has ended: its id is not an open
    episode's (``open_ids``, shape (m,), int64; the episode of a stream's unfinished steps).
    The last slot is found by following ``next_slot`` while each target holds the same episode
    at the next step, so a slot overwritten since counts for nothing.
    """
    heads = np.flatnonzero((step[:size] == 0) & (episode[:size] >= 0)).astype(np.int64)
    tails = np.empty(heads.shape[0], dtype=np.int64)
    if heads.shape[0]:
        episode_tails(heads, episode, step, next_slot, tails)
    ended = ~np.isin(episode[heads], np.asarray(open_ids, dtype=np.int64))
    return heads[ended], tails[ended]


def _int_field(state: Mapping[str, Any], key: str, where: str = "state") -> int:
    value = state.get(key) if isinstance(state, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where} has {key}={value!r}; expected an int (corrupt state)")
    return int(value)


def _int_array(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or array.shape != shape:
        raise ValueError(
            f"state's {name} has shape {array.shape}, dtype {array.dtype}; expected {shape} "
            "integers (corrupt state)"
        )
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"state's {name} holds values beyond int64 (corrupt state)")
    return array.astype(np.int64, copy=False)


__all__ = ["EpisodeIndex", "NextObsLinks", "RingWriter", "StoredNext", "complete_episodes"]
