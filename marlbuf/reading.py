"""Reading a buffer: sampling rounds, gathers, episodes, and priority feedback.

:class:`Reader` does the work behind :class:`marlbuf.MultiAgentReplayBuffer`'s reading
methods over the parts it is given (the storage, the ring writer, the sampler, the episode
index, the generator), never the buffer itself. A draw's indices are gathered as the sampler's
batch kind says (:data:`marlbuf.samplers.BATCH_KINDS`): rows, sequences or whole episodes.

Priority feedback is judged here: each update's slots are compared with their write
generations at the draw, so an update for a slot overwritten since is dropped (see
:meth:`Reader.update_priorities`), and updates from a device may wait for their copies
(``sync=False``) until the next call that reads priorities.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from marlbuf._kernels.drawn import judge_update
from marlbuf.batch import Batch, DrawnIndices, EpisodeBatch, SequenceBatch
from marlbuf.config import check_n_trainers, check_trainer
from marlbuf.samplers import Sampler
from marlbuf.spec import GLOBAL
from marlbuf.stores.base import FieldSelection, Storage, check_fields
from marlbuf.writer import EpisodeIndex, RingWriter

#: an empty int64 array: nothing to compare indices with (``generations=`` was given)
_NO_SLOTS = np.zeros(0, dtype=np.int64)
#: why indices written to after their draw are refused
_CHANGED_IN_PLACE = (
    "indices were written to after the draw: they hold slots their batch did not draw, so "
    "the write generations they carry say nothing about those slots (a slot overwritten since "
    "would be given another step's priority). Leave batch.indices as drawn (reordering it in "
    "place is fine), or pass generations= for the slots you update (generations="
    "buffer.write_generation[indices] to set the priorities of the slots as they are now)"
)


def _untrusted(trainer: int, why: str) -> str:
    """Why indices without write generations are refused for ``trainer``."""
    return (
        f"indices carry no write generations (a copy, slice, tensor or list of a batch's "
        f"indices, or slots never drawn) and {why} (trainer {trainer}), so the buffer cannot "
        "tell whether their slots were overwritten since they were drawn: pass "
        "generations=batch.generations of the batch they came from, or "
        "generations=buffer.write_generation[indices] to set the priorities of the slots as "
        "they are now"
    )


def host_array(value: Any) -> np.ndarray:
    """``value`` as a NumPy array; a torch tensor (any device) is copied to the host."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return np.asarray(value.detach().cpu().numpy())
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


def _check_enough(size: int, batch_size: int) -> None:
    if size == 0:
        raise ValueError(
            f"the buffer is empty: add transitions before sampling (batch_size={batch_size})"
        )


class Reader:
    """The reading side of one buffer, over its parts.

    Parameters
    ----------
    storage : callable
        Returns the buffer's current :class:`marlbuf.stores.base.Storage` (a buffer whose
        ``next_obs`` format is decided by its first write replaces its store).
    writer : RingWriter
        The ring: size, write generations, the lock every read holds.
    sampler : callable
        Returns the buffer's bound sampler (its attribute, which may be replaced by one bound
        to the same capacity and trainers).
    episodes : EpisodeIndex or None
        The episode index (sequence and episode samplers).
    rng : numpy.random.Generator
        The buffer's generator: every draw's random numbers.
    n_trainers : int
        Trainers (one priority tree each).
    on_device : bool
        Whether the store is on a torch device (names its batch types in errors, and a
        round is gathered at once).
    agents : tuple of str
        Agent names, in order.
    global_fields : collection of str
        Names of the global fields.
    field_names : tuple of str
        Every readable field name (of :meth:`stored`).
    """

    def __init__(
        self,
        storage: Callable[[], Storage],
        writer: RingWriter,
        sampler: Callable[[], Sampler],
        episodes: EpisodeIndex | None,
        rng: np.random.Generator,
        n_trainers: int,
        on_device: bool,
        agents: tuple[str, ...],
        global_fields: Any,
        field_names: tuple[str, ...],
    ) -> None:
        self.storage = storage
        self.writer = writer
        self._sampler = sampler
        self.episodes = episodes
        self.rng = rng
        self.n_trainers = n_trainers
        self.on_device = on_device
        self.agents = agents
        self.global_fields = global_fields
        self.field_names = field_names
        #: per batch kind, how a draw's indices are gathered
        self._gathers = {
            "rows": self._gather,
            "sequences": self._gather_sequences,
            "episodes": self._gather_episodes,
        }
        # per trainer, the indices of its latest batch (prioritized samplers only): a plain
        # copy of them passed to update_priorities without generations= is judged against
        # that draw (batch.indices itself carries its generations)
        self.last_drawn: list[DrawnIndices | None] = [None] * (
            n_trainers if sampler().weighted else 0
        )
        #: updates of ``update_priorities(..., sync=False)`` waiting for their device copies:
        #: (trainer, indices, generations, a function returning the host TD errors)
        #: an entry ``(-1, None, None, error)`` keeps the error of an update applied by a later
        #: call for the next call that reads priorities
        self.deferred: list[tuple[int, Any, Any, Any]] = []

    @property
    def sampler(self) -> Sampler:
        """The buffer's sampler."""
        return self._sampler()

    def forget(self) -> None:
        """Forget the latest draws and the waiting updates: they were meant for a state that
        a loaded one replaces."""
        self.last_drawn = [None] * len(self.last_drawn)
        self.deferred = []

    # ------------------------------------------------------------------------- sampling
    def sample(
        self, batch_size: int, trainer: Any, out: Any, fields: tuple[str, ...] | None
    ) -> Batch:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.sample`."""
        trainer = check_trainer(trainer, self.n_trainers)
        sampler = self.sampler
        batch_size = sampler.check_batch_size(batch_size)
        select = None if fields is None else self.selection(fields)
        out_block = None if out is None else self.out_block(out, batch_size, select)
        with self.writer.lock:
            _check_enough(self.writer.size, batch_size)
            if self.deferred:
                self.apply_deferred_updates()
            indices, weights = sampler.sample(batch_size, self.writer.size, self.rng, trainer)
            gather = self._gathers[sampler.batch_kind]
            return gather(indices, weights, trainer, out_block, select)

    def selection(self, fields: Any) -> FieldSelection | None:
        """The storage's selection of ``fields`` (checked), ``None`` for every stored field
        (the storage's default gather)."""
        storage = self.storage()
        if (
            not storage.stores_next_obs
            and isinstance(fields, (tuple, list))
            and "next_obs" in fields
        ):
            raise ValueError(
                f"fields={tuple(fields)!r} names 'next_obs', but this buffer stores no next "
                "observations (next_obs='none'); choose among its fields "
                f"{storage.field_names}, or build the buffer with next_obs='auto', 'once' or "
                "'stored' to keep them"
            )
        names = check_fields(fields, storage.field_names)
        return None if names is None else storage.selection(names)

    def out_block(self, out: Any, batch_size: int, select: FieldSelection | None = None) -> Any:
        """The memory of ``out=`` (a batch of an earlier call), checked for this draw."""
        kind = "DeviceBatch" if self.on_device else "Batch"
        storage = self.storage()
        # a sequence batch (of any store) holds its mask; read from the instance dict, since a
        # Batch's attribute fallback (extra fields) costs microseconds per miss
        sequence = "mask" in getattr(out, "__dict__", ())
        sampler = self.sampler
        if sampler.batch_kind == "sequences":  # a sequence batch is B * L gathered rows
            if not sequence or not hasattr(out, "block"):
                raise TypeError(
                    f"out must be a {kind.replace('Batch', 'SequenceBatch')} from this "
                    f"buffer's sample (it samples sequences); got {type(out).__name__}"
                )
            steps = sampler.steps_per_row()
            assert steps is not None
            return storage.check_out_block(out.block, batch_size * steps, select)
        if sampler.batch_kind == "episodes":
            steps = sampler.steps_per_row()
            if steps is None or not isinstance(out, EpisodeBatch):
                raise TypeError(
                    "out= with an Episodes sampler needs Episodes(max_length=...) (batches of a "
                    "fixed shape) and an EpisodeBatch from this buffer's sample; got "
                    f"max_length={steps}, out={type(out).__name__}"
                )
            return storage.check_out_block(out.block, batch_size * steps, select)
        if sequence or not hasattr(out, "block"):
            raise TypeError(f"out must be a {kind} from this buffer; got {type(out).__name__}")
        return storage.check_out_block(out.block, batch_size, select)

    def sample_for_trainers(
        self,
        batch_size: int,
        n_trainers: int | None,
        shared_index: bool,
        out: Sequence[Any] | None,
        fields: tuple[str, ...] | None,
    ) -> list[Batch]:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.sample_for_trainers`."""
        n_trainers = check_n_trainers(n_trainers, self.n_trainers)
        select = None if fields is None else self.selection(fields)
        if out is not None:
            out = list(out)
            if len(out) != n_trainers:
                raise ValueError(f"out must hold {n_trainers} batches; got {len(out)}")
            blocks = [self.out_block(b, batch_size, select) for b in out]
            storage = self.storage()
            addresses = [storage.block_address(b) for b in blocks]
            if not shared_index and len(set(addresses)) != len(addresses):
                raise ValueError(
                    "out holds the same batch (or memory) more than once, so trainers would "
                    "overwrite each other's rows; pass distinct batches (a shared_index=True "
                    "round's output can only be reused by another shared_index=True round)"
                )
        if shared_index:
            if self.sampler.weighted:
                raise ValueError(
                    "shared_index=True cannot be combined with a prioritized sampler: each "
                    "trainer has its own priority tree"
                )
            batch = self.sample(batch_size, 0, None if out is None else out[0], fields)
            return [batch] * n_trainers
        if self.sampler.batch_kind == "rows" and self.on_device:
            return self._round(batch_size, n_trainers, None if out is None else blocks, select)
        return [
            self.sample(batch_size, t, None if out is None else out[t], fields)
            for t in range(n_trainers)
        ]

    def _round(
        self,
        batch_size: int,
        n_trainers: int,
        blocks: list[Any] | None,
        select: FieldSelection | None = None,
    ) -> list[Any]:
        """The round with the draws of :meth:`sample` in trainer order, gathered at once where
        the store does that (a device store: one ``index_select`` of ``n_trainers *
        batch_size`` rows into one block, or into the checked ``out=`` ``blocks`` of an earlier
        round), else trainer by trainer."""
        sampler = self.sampler
        batch_size = sampler.check_batch_size(batch_size)
        with self.writer.lock:
            _check_enough(self.writer.size, batch_size)
            if self.deferred:
                self.apply_deferred_updates()
            draws, weights, generations, drawn = [], [], [], []
            for t in range(n_trainers):
                indices, w = sampler.sample(batch_size, self.writer.size, self.rng, t)
                indices = np.ascontiguousarray(indices)
                gens = self.writer.write_generation[indices]
                draws.append(indices)
                weights.append(w)
                generations.append(gens)
                drawn.append(DrawnIndices.of(indices, gens))
            batches = (
                None
                if select is not None  # a round block holds whole rows: gather per trainer
                else self.storage().gather_round(
                    draws, weights, generations, list(range(n_trainers)), drawn, blocks
                )
            )
            if batches is None:  # gathered per trainer, from the same draws
                return [
                    self._gather(
                        draws[t], weights[t], t, None if blocks is None else blocks[t], select
                    )
                    for t in range(n_trainers)
                ]
            if self.last_drawn:
                self.last_drawn[:n_trainers] = drawn
            return batches

    def iter_trainers(
        self, batch_size: int, n_trainers: int | None, fields: tuple[str, ...] | None
    ) -> Iterator[Batch]:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.iter_trainers`."""
        n_trainers = check_n_trainers(n_trainers, self.n_trainers)
        if fields is not None:
            self.selection(fields)
        return (self.sample(batch_size, t, None, fields) for t in range(n_trainers))

    def sample_prefix(
        self,
        batch_size: int,
        size: Any,
        trainer: Any,
        out: Batch | None,
        fields: tuple[str, ...] | None,
    ) -> Batch:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.sample_prefix`."""
        trainer = check_trainer(trainer, self.n_trainers)
        sampler = self.sampler
        batch_size = sampler.check_batch_size(batch_size)
        select = None if fields is None else self.selection(fields)
        out_block = None if out is None else self.out_block(out, batch_size, select)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size must be an int; got size={size!r}")
        with self.writer.lock:
            stored = self.writer.size
            _check_enough(stored, batch_size)
            whole = sampler.weighted or self.episodes is not None
            if whole and size != stored:
                raise ValueError(
                    f"size must be len(self)={stored}: {sampler!r} draws from every "
                    f"stored slot; got size={size}"
                )
            if not 1 <= size <= stored:
                raise ValueError(
                    f"size must be in [1, {stored}] (the stored slots); got size={size}"
                )
            if self.deferred:
                self.apply_deferred_updates()
            indices, weights = sampler.sample_share(batch_size, int(size), self.rng, trainer)
            gather = self._gathers[sampler.batch_kind]
            return gather(indices, weights, trainer, out_block, select)

    # -------------------------------------------------------------------------- gathers
    def gather(self, indices: Any, trainer: int | None, fields: tuple[str, ...] | None) -> Batch:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.gather`."""
        if trainer is not None:
            trainer = check_trainer(trainer, self.n_trainers)
        select = None if fields is None else self.selection(fields)
        with self.writer.lock:
            checked = self.check_indices(indices)
            if not checked.size:
                raise ValueError(
                    "indices is empty; gather needs at least one index (a batch of no "
                    "transitions has no rows to gather)"
                )
            return self._gather(checked, None, trainer, None, select)

    def latest(self, n: Any) -> Batch:
        """The newest ``n`` joint transitions, oldest first (checked: ``1 <= n <= size``)."""
        with self.writer.lock:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
                raise TypeError(f"n must be an int; got n={n!r}")
            size = self.writer.size
            if not 0 < n <= size:
                raise ValueError(f"n must be in [1, {size}] (the stored transitions); got n={n}")
            return self._gather(self.writer.newest(int(n)), None, None, None)

    def stored(self, field: str) -> Any:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.stored`."""
        names = self.field_names
        if field not in names:
            raise ValueError(f"field must be one of {names}; got field={field!r}")
        with self.writer.lock:
            size = self.writer.size
            storage = self.storage()
            if field in self.global_fields:
                return storage.read_field(field, GLOBAL, size)
            return {a: storage.read_field(field, a, size) for a in self.agents}

    def reward_stats(self) -> dict[str, tuple[float, float]]:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.reward_stats`."""
        with self.writer.lock:
            if self.writer.size == 0:
                raise ValueError("reward_stats needs data: the buffer is empty")
            out = {}
            for agent, values in self.stored("reward").items():
                v = values.astype(np.float64)
                out[agent] = (float(v.mean()), float(v.std()))
            return out

    def check_indices(self, indices: Any) -> np.ndarray:
        """``indices`` as a 1-D int64 array of filled slots, or a clear error."""
        idx = np.asarray(indices)
        if idx.shape == (0,):  # [] is float64 to NumPy: no values, so no wrong type
            return np.empty(0, dtype=np.int64)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError(
                f"indices must be a 1-D integer array; got shape {idx.shape}, dtype {idx.dtype}"
            )
        size = self.writer.size
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            raise ValueError(
                f"indices must lie in [0, {size}) (the filled slots); "
                f"got min {idx.min()}, max {idx.max()}"
            )
        return np.ascontiguousarray(idx, dtype=np.int64)

    def _gather(
        self,
        indices: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> Batch:
        """Gather under ``writer.lock`` (held by the caller)."""
        storage = self.storage()
        indices = np.ascontiguousarray(indices)
        if select is None:
            fields, block = storage.gather(indices, out_block)
        else:
            fields, block = storage.gather(indices, out_block, select)
        generations = self.writer.write_generation[indices]
        drawn = DrawnIndices.of(indices, generations)
        if self.last_drawn and trainer is not None:
            self.last_drawn[trainer] = drawn
        if select is None:
            return storage.make_batch(fields, block, drawn, generations, weights, trainer)
        return storage.make_batch(fields, block, drawn, generations, weights, trainer, select)

    def _gather_sequences(
        self,
        starts: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> SequenceBatch:
        """The sequences around training ``starts`` (shape (B,), int64), under ``writer.lock``:
        the (B, L) slot matrix from the episode links (O(B * L)), one gather of its B * L rows
        (masked positions read the start's row and are zeroed), every array reshaped to
        (B, L, ...)."""
        sequence: Any = self.sampler  # batch kind "sequences": a Sequence sampler
        assert self.episodes is not None
        burn_in = sequence.burn_in
        slots = self.episodes.sequences(starts, burn_in, sequence.length - 1)
        batch = self._slot_matrix(starts, slots, burn_in, weights, trainer, out_block, select)
        if self.last_drawn and trainer is not None:
            sequence.handed(trainer, starts, (slots[:, burn_in:] >= 0).sum(axis=1))
        return batch

    def _slot_matrix(
        self,
        starts: np.ndarray,
        slots: np.ndarray,
        burn_in: int,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None,
    ) -> Any:
        """One gather of the (B, L) slot matrix ``slots`` (-1 where masked) of the sequences
        beginning at ``starts`` (under ``writer.lock``), as a sequence batch whose first
        ``burn_in`` steps are burn-in; ``starts`` are recorded as ``trainer``'s latest draw."""
        storage = self.storage()
        mask = slots >= 0
        # storages whose gather writes zeros for slot -1 skip the masked steps' copies
        zeroed = storage.zero_fills
        flat = (slots if zeroed else np.where(mask, slots, starts[:, None])).reshape(-1)
        gathered = self._gather(flat, None, None, out_block, select)
        generations = self.writer.write_generation[starts]
        drawn = DrawnIndices.of(starts, generations)
        if self.last_drawn and trainer is not None:
            self.last_drawn[trainer] = drawn
        return storage.make_sequences(
            gathered, mask, burn_in, slots, drawn, generations, weights, trainer, zeroed
        )

    def _gather_episodes(
        self,
        starts: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> EpisodeBatch:
        """Whole episodes from their first slots ``starts`` (shape (B,), int64), under
        ``writer.lock``: padded to the sampler's ``max_length`` or the longest of them."""
        assert self.episodes is not None
        lengths = self.episodes.length[starts]
        steps = self.sampler.steps_per_row()
        if steps is None:
            steps = int(lengths.max())
        slots = self.episodes.sequences(starts, 0, steps - 1)
        return self._episode_batch(starts, slots, lengths, weights, trainer, out_block, select)

    def _episode_batch(
        self,
        starts: np.ndarray,
        slots: np.ndarray,
        lengths: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> EpisodeBatch:
        """One gather of the (B, L) slot matrix ``slots`` (-1 where masked) starting at
        ``starts``, as an :class:`marlbuf.batch.EpisodeBatch` (under ``writer.lock``)."""
        batch = self._slot_matrix(starts, slots, 0, weights, trainer, out_block, select)
        if type(batch) is SequenceBatch:  # a dataclass: its fields are its instance dict
            return EpisodeBatch(**vars(batch), lengths=lengths)
        batch.lengths = lengths  # a store's own sequence batch (device tensors) carries them
        return batch

    def gather_sequences(
        self, starts: Any, length: int, fields: tuple[str, ...] | None
    ) -> EpisodeBatch:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.gather_sequences`."""
        if self.episodes is None:
            raise TypeError(
                f"gather_sequences needs the episode index, which a buffer keeps when its "
                f"sampler samples sequences or episodes; got sampler={self.sampler!r} (build "
                "the buffer with sampler=Episodes() or Sequence(...))"
            )
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"length must be a positive int; got length={length!r}")
        select = None if fields is None else self.selection(fields)
        with self.writer.lock:
            idx = self.check_indices(starts)
            slots = self.episodes.sequences(idx, 0, int(length) - 1)
            lengths = np.count_nonzero(slots >= 0, axis=1).astype(np.int64)
            return self._episode_batch(idx, slots, lengths, None, None, None, select)

    def episode_index(self, what: str) -> EpisodeIndex:
        """The episode index, or a ``TypeError`` saying that ``what`` needs one."""
        if self.episodes is None:
            raise TypeError(
                f"{what} needs the episode index, which a buffer keeps when its sampler samples "
                f"sequences or episodes; got sampler={self.sampler!r} (build the buffer with "
                "sampler=Episodes() or Sequence(...))"
            )
        return self.episodes

    def stored_episodes(self) -> int:
        """See :attr:`marlbuf.MultiAgentReplayBuffer.stored_episodes`."""
        index = self.episode_index("stored_episodes")
        with self.writer.lock:
            return index.stored_episodes(self.writer.size)

    # ------------------------------------------------------------------------ priorities
    def update_priorities(
        self, indices: Any, td_errors: Any, trainer: Any, generations: Any, sync: Any
    ) -> None:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.update_priorities`."""
        trainer = check_trainer(trainer, self.n_trainers)
        if not isinstance(sync, bool):
            raise TypeError(f"sync must be a bool; got sync={sync!r}")
        # tensor trees (``Prioritized(index="device")``) take the TD errors where they are and
        # check them later; host trees take host TD errors, now or, from a device without
        # waiting, at the next call that reads priorities
        sampler = self.sampler
        on_device = sampler.priorities_on_device
        defer = not on_device and not sync and hasattr(td_errors, "detach")
        with self.writer.lock:
            if not (on_device or defer) and self.deferred:
                # earlier deferred updates first, in order; an error of theirs waits for the
                # next call that reads priorities, and this update is still applied
                self.settle_deferred()
            idx = self.check_indices(host_array(indices))
            gens, stale = self._judged(trainer, indices, idx, generations)
            if defer:  # judged again when applied (the slots may be overwritten meanwhile)
                ready = self.storage().to_host_later(td_errors)
                self.deferred.append((trainer, idx.copy(), gens.copy(), ready))
                return
            values = td_errors if on_device else host_array(td_errors)
            sampler.update_priorities(idx, values, trainer, stale)
            if on_device and sync:
                sampler.raise_pending_errors()

    def _stale(self, idx: np.ndarray, generations: np.ndarray) -> np.ndarray:
        """Which of the slots ``idx`` were overwritten since their draw at ``generations``
        (shape of ``idx``, bool; under ``writer.lock``)."""
        stale = np.empty(idx.shape[0], dtype=np.bool_)
        judge_update(idx, _NO_SLOTS, generations, self.writer.write_generation, stale)
        return stale

    def apply_deferred_updates(self) -> None:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.apply_deferred_updates`."""
        with self.writer.lock:
            self.sampler.raise_pending_errors()
        if not self.deferred:
            return
        with self.writer.lock:
            error = self._apply_deferred()
            if error is not None:
                raise error

    def _apply_deferred(self) -> ValueError | None:
        """Apply the waiting deferred updates (under ``writer.lock``); the first error among
        them (or kept from an earlier application) is returned, not raised."""
        pending, self.deferred = self.deferred, []
        sampler = self.sampler
        first_error: ValueError | None = None
        for trainer, idx, gens, ready in pending:
            if idx is None:  # the error of an update applied by an earlier call, still unseen
                first_error = first_error or ready
                continue
            try:
                sampler.update_priorities(idx, ready(), trainer, self._stale(idx, gens))
            except ValueError as exc:
                first_error = first_error or exc
        return first_error

    def settle_deferred(self) -> None:
        """Apply the waiting deferred updates (if any) and keep their first error for the next
        call that reads priorities (an update or a checkpoint must not raise another call's
        error)."""
        if not self.deferred:
            return
        error = self._apply_deferred()
        if error is not None:
            self.deferred.append((-1, None, None, error))

    def _update_generations(
        self, trainer: int, indices: Any, idx: np.ndarray, generations: Any
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """What an update of ``idx`` (checked indices) is judged by: ``(generations, the
        indices they belong to, whether idx may be a reordering of those)`` (the second empty
        when ``generations=`` was given: nothing to compare). See :meth:`update_priorities`."""
        if generations is not None:
            gens = host_array(generations)
            if gens.shape != idx.shape or gens.dtype.kind not in "iu":
                raise ValueError(
                    f"generations must be an integer array of the shape of indices "
                    f"{idx.shape} (pass batch.generations); got shape {gens.shape}, "
                    f"dtype {gens.dtype}"
                )
            return gens.astype(np.int64, copy=False), _NO_SLOTS, False
        if isinstance(indices, DrawnIndices) and indices.as_drawn is not None:
            assert indices.generations is not None
            return indices.generations, indices.as_drawn, True  # its own draw
        latest = self.last_drawn[trainer] if self.last_drawn else None
        if latest is None or latest.as_drawn is None or latest.generations is None:
            raise ValueError(_untrusted(trainer, "no batch was drawn for it since"))
        return latest.generations, latest.as_drawn, False

    def _judged(
        self, trainer: int, indices: Any, idx: np.ndarray, generations: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(generations, stale)`` of an update of ``idx``: the write generations it is
        judged against and which of its slots were overwritten since (shape of ``idx``, bool);
        a ``ValueError`` naming ``generations=`` for indices that cannot be trusted."""
        gens, as_drawn, own = self._update_generations(trainer, indices, idx, generations)
        stale = np.empty(idx.shape[0], dtype=np.bool_)
        current = self.writer.write_generation
        if judge_update(idx, as_drawn, gens, current, stale):
            return gens, stale
        if not own:  # plain indices that are not the trainer's latest batch, in order
            raise ValueError(
                _untrusted(trainer, "they are not its latest batch's indices, in order")
            )
        # batch.indices changed in place since its draw: each entry that is a slot of that
        # draw takes the slot's generation then (the same for every entry of a slot)
        assert isinstance(indices, DrawnIndices)
        remapped = indices.generations_of(idx)
        if remapped is None:
            raise ValueError(_CHANGED_IN_PLACE)
        judge_update(idx, _NO_SLOTS, remapped, current, stale)
        return remapped, stale


def update_each_trainer(
    update: Callable[..., None], indices: Any, td_errors: Any, generations: Any, sync: bool
) -> None:
    """``update(indices[t], td_errors[t], trainer=t, generations=generations[t], sync=sync)``
    for every trainer ``t`` of a round (``update_priorities_for_trainers`` of any buffer),
    after checking that the three hold one entry per trainer."""
    n = len(indices)
    if len(td_errors) != n or (generations is not None and len(generations) != n):
        raise ValueError(
            f"indices, td_errors and generations must hold one entry per trainer; got "
            f"{n}, {len(td_errors)} and "
            f"{'None' if generations is None else len(generations)}"
        )
    for t in range(n):
        update(
            indices[t],
            td_errors[t],
            trainer=t,
            generations=None if generations is None else generations[t],
            sync=sync,
        )
