"""The episode index: which episode and step each stored slot holds, per stream."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marlbuf._kernels import sequence_slots
from marlbuf._kernels.episodes import episode_heads, episode_tails, link_stream_steps


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

    def check_loaded(
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
        as :meth:`check_loaded` does; a state saved without the record gets it from the rows."""
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
        """Restore :meth:`state_dict` output that :meth:`check_loaded` accepted with the same
        ``generations`` and ``stored_next`` (the front checks every part of a state before it
        changes any)."""
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


#: ``stored_next(slots)`` of :meth:`EpisodeIndex.check_loaded`: for filled slots (shape (k,),
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


__all__ = ["EpisodeIndex", "StoredNext", "complete_episodes"]
