"""Next observations stored once: the links from a transition to its successor's obs, and
the side table of the next observations that are no stored obs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels.links import (
    DENSE_NEXT_OBS,
    OBS_BYTES,
    link_rows,
    link_step,
    next_is_obs,
    release_slots,
)
from marlbuf.writer.inputs import int_array


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
        next_slot = int_array(links["next_slot"], "links next_slot", (capacity,))
        side_row = int_array(links["side_row"], "links side_row", (capacity,))
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
        array instead of copying it (for arrays nobody else holds, as read from a file). The
        state is one that :meth:`check_loaded` accepted (the front checks every part of a
        state before it changes any)."""
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


__all__ = ["NextObsLinks"]
