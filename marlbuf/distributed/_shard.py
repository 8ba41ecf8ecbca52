"""One shard: a :class:`~marlbuf.MultiAgentReplayBuffer` inside a Ray actor, and the packed
format in which it ships a sampling round to the learner (one array through the object store).

Packed round (``uint8``, every section starting on a 64-byte boundary)::

    header   int64[8]: size, total_writes (at sampling time), 0, ...
    then, for every trainer position i with quota n_i > 0, in order:
      block  the gathered batch block of r_i rows (``Storage.block_spec(r_i)``): r_i = n_i,
             or n_i * L for a sequence sampler of L steps per sequence
      slots  int64[n_i]  shard-local slots (a sequence's training start)
      gens   int64[n_i]  write generations of those slots
      probs  float64[n_i] (weighted samplers only) the rows' shard-local probabilities
      mask   bool[n_i, L] (sequence samplers only) the sequences' masks
      steps  int64[n_i, L] (sequence samplers only) the shard-local slot of every step, or -1
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

import marlbuf
from marlbuf import persistence
from marlbuf.batch import Batch, SequenceBatch
from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.config import BufferConfig
from marlbuf.distributed._ray import code_fingerprint
from marlbuf.samplers import Prioritized, Sampler
from marlbuf.samplers import Sequence as SequenceSampler
from marlbuf.stores.base import Storage

ALIGN = 64
HEADER_WORDS = 8
_EMPTY = np.empty(0, dtype=np.int64)


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def block_nbytes(storage: Storage, n: int) -> int:
    """Bytes of the block that holds an ``n``-row batch of ``storage``."""
    dtype, shape = storage.block_spec(n)
    return math.prod(shape) * dtype.itemsize


class Offsets(NamedTuple):
    """Where one trainer position's part of a packed round lies (byte offsets)."""

    n: int  #: rows, or sequences
    rows: int  #: gathered rows: ``n``, or ``n * steps``
    block: int
    block_nbytes: int
    slots: int
    gens: int
    probs: int
    mask: int
    steps: int


class Part(NamedTuple):
    """Views of one trainer position's part of a packed round."""

    block: np.ndarray  #: the gathered block (``Storage.block_spec(rows)``)
    slots: np.ndarray  #: (n,) int64, shard-local
    gens: np.ndarray  #: (n,) int64
    probs: np.ndarray | None  #: (n,) float64, weighted samplers only
    mask: np.ndarray | None  #: (n, L) bool, sequence samplers only
    steps: np.ndarray | None  #: (n, L) int64 shard-local slots or -1, sequence samplers only


def pack_layout(
    storage: Storage, quotas: Sequence[int], weighted: bool, steps: int = 0
) -> tuple[list[Offsets | None], int]:
    """Offsets of a packed round (``None`` where the quota is 0) and the total bytes;
    ``steps``: ``L`` for a sequence sampler (quotas count sequences), else 0."""
    offset = HEADER_WORDS * 8
    out: list[Offsets | None] = []
    for n in quotas:
        n = int(n)
        if n == 0:
            out.append(None)
            continue
        rows = n * steps if steps else n
        nbytes = block_nbytes(storage, rows)
        block = offset
        slots = block + _up(nbytes)
        gens = slots + _up(8 * n)
        probs = gens + _up(8 * n)
        mask = probs + (_up(8 * n) if weighted else 0)
        step_slots = mask + (_up(rows) if steps else 0)
        offset = step_slots + (_up(8 * rows) if steps else 0)
        out.append(Offsets(n, rows, block, nbytes, slots, gens, probs, mask, step_slots))
    return out, offset


def views(packed: np.ndarray, storage: Storage, at: Offsets, weighted: bool, steps: int) -> Part:
    """The views of one part of ``packed`` (see the module docstring)."""
    dtype, shape = storage.block_spec(at.rows)
    n = at.n
    return Part(
        packed[at.block : at.block + at.block_nbytes].view(dtype).reshape(shape),
        packed[at.slots : at.slots + 8 * n].view(np.int64),
        packed[at.gens : at.gens + 8 * n].view(np.int64),
        packed[at.probs : at.probs + 8 * n].view(np.float64) if weighted else None,
        packed[at.mask : at.mask + at.rows].view(np.bool_).reshape(n, steps) if steps else None,
        packed[at.steps : at.steps + 8 * at.rows].view(np.int64).reshape(n, steps)
        if steps
        else None,
    )


def unpack(
    storage: Storage, packed: np.ndarray, quotas: Sequence[int], weighted: bool, steps: int = 0
) -> tuple[np.ndarray, list[Part | None]]:
    """Header (int64[8]) and per trainer position the :class:`Part` views of a packed round
    (``None`` where the quota is 0)."""
    layout, total = pack_layout(storage, quotas, weighted, steps)
    if packed.dtype != np.uint8 or packed.shape != (total,):
        raise ValueError(
            f"a packed round of quotas {list(quotas)} has {total} bytes; got {packed.dtype} "
            f"{packed.shape} (shard and learner disagree on the batch format)"
        )
    header = packed[: HEADER_WORDS * 8].view(np.int64)
    parts = [None if at is None else views(packed, storage, at, weighted, steps) for at in layout]
    return header, parts


def sequence_steps(sampler: Sampler) -> int:
    """``L``, the steps of a sequence, for a sequence sampler; 0 for row samplers."""
    return sampler.steps if isinstance(sampler, SequenceSampler) else 0


def shard_config(config: Mapping[str, Any]) -> BufferConfig:
    """The shards' :class:`~marlbuf.config.BufferConfig` from the sharded buffer's JSON-safe
    ``config`` (a manifest written before ``next_obs``, ``batch_dtype``, ``global_fields`` and
    ``alive`` were recorded gets their defaults: ``next_obs="auto"``)."""
    return BufferConfig.from_dict({"next_obs": "auto", **config}, capacity_key="shard_capacity")


def build_buffer(config: Mapping[str, Any], seed: Any) -> MultiAgentReplayBuffer:
    """The shard's buffer from the sharded buffer's JSON-safe ``config`` (see
    :func:`shard_config`; ``parallel_gather`` defaults to False)."""
    saved = shard_config(config)
    return MultiAgentReplayBuffer(
        saved.specs,
        capacity=int(saved.capacity),
        layout=saved.layout,
        sampler=saved.sampler(),
        seed=seed,
        n_trainers=int(saved.n_trainers),
        parallel_gather=bool(config.get("parallel_gather", False)),
        batch_layout=saved.batch_layout,
        next_obs=saved.next_obs,
        batch_dtype=saved.batch_dtype,
        global_fields=saved.global_fields,
        alive=saved.alive,
    )


class ShardActor:
    """The body of one shard actor (wrapped by ``ray.remote`` in :mod:`.sharded`).

    Ray runs one method at a time per actor, so a sampling call sees no write in the middle.

    Parameters
    ----------
    index : int
        The shard's position.
    config : mapping
        ``ShardedReplayBuffer.config()`` (specs, capacity per shard, layout, sampler, ...).
    seed : int or None
        This shard's seed (derived from the sharded buffer's seed).
    load_path : str, optional
        A file written by :meth:`save` to restore (data, cursor, priorities, RNG state).
    """

    def __init__(
        self, index: int, config: Mapping[str, Any], seed: Any, load_path: str | None = None
    ) -> None:
        self.index = int(index)
        # carriers of out= blocks (views into the packed round) for sample / sample_prefix
        self._out = Batch({}, {}, {}, {}, {}, indices=_EMPTY, generations=_EMPTY)
        self._out_sequences = SequenceBatch(
            {}, {}, {}, {}, {}, indices=_EMPTY, generations=_EMPTY, mask=np.zeros((0, 0), bool)
        )
        self._packed = np.empty(0, dtype=np.uint8)
        # a bad argument must reach the learner as itself: Ray reports an exception raised here
        # only as "the actor died", so it is kept and raised by the first call (info)
        self._init_error: Exception | None = None
        try:
            self.buf = build_buffer(config, seed)
            if load_path is not None:
                persistence.load_into(self.buf, load_path)
            sampler = self.buf.sampler
            self.weighted = sampler.weighted
            #: steps per sequence (``L``) of a sequence sampler, else 0
            self.steps = sequence_steps(sampler)
            #: the sampler when it keeps priorities (totals, maxima, probabilities)
            self.priorities: Prioritized | SequenceSampler | None = (
                sampler
                if self.weighted and isinstance(sampler, (Prioritized, SequenceSampler))
                else None
            )
        except (ValueError, TypeError, MemoryError, OSError) as exc:
            self._init_error = exc

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        """Where this worker imported marlbuf from, its pid, size and writes."""
        if self._init_error is not None:
            raise self._init_error
        return {
            "marlbuf": str(os.path.realpath(marlbuf.__file__)),
            "code": code_fingerprint(),
            "pid": os.getpid(),
            "size": self.buf.size,
            "total_writes": self.buf.total_writes,
        }

    def stats(self) -> np.ndarray:
        """``[size, total_writes, total of trainer 0, ...]`` (float64): the totals the learner
        splits a batch by, for prioritized samplers (``sum p^alpha``) and sequence samplers
        (:meth:`marlbuf.samplers.Sequence.start_total`); none for the others."""
        sampler, n_trainers = self.buf.sampler, self.buf.n_trainers
        totals: list[float] = []
        if isinstance(sampler, Prioritized):
            totals = [sampler.priority_total(t) for t in range(n_trainers)]
        elif isinstance(sampler, SequenceSampler):
            totals = [sampler.start_total(self.buf.size, t) for t in range(n_trainers)]
        return np.array([self.buf.size, self.buf.total_writes, *totals], dtype=np.float64)

    # ------------------------------------------------------------------ writing
    def write(
        self, kind: str, fields: tuple[Any, ...], options: Mapping[str, Any] | None = None
    ) -> tuple[int, int]:
        """``add`` / ``extend`` / ``add_envs`` one call's five fields, with ``options`` (the
        keyword arguments of that method: ``stream``/``first_stream``, ``truncated``, extra and
        global fields, ``alive``); returns (size, total_writes)."""
        more = dict(options or {})
        if kind == "add":
            self.buf.add(*fields, **more)
        elif kind == "extend":
            self.buf.extend(*fields, **more)
        elif kind == "add_envs":
            self.buf.add_envs(*fields, **more)
        else:
            raise ValueError(f"kind must be 'add', 'extend' or 'add_envs'; got kind={kind!r}")
        return self.buf.size, self.buf.total_writes

    # ------------------------------------------------------------------ sampling
    def sample_round(
        self,
        trainers: Sequence[int],
        quotas: Sequence[int],
        snapshot: int,
        max_priority: Sequence[float] | None = None,
    ) -> np.ndarray:
        """Sample ``quotas[i]`` rows (sequences) for trainer ``trainers[i]`` and pack them
        (module doc).

        ``snapshot`` (uniform and neighbor samplers): the filled-slot count the learner based
        the quotas on; rows come from those slots only, so the global draw is exact for that
        state even when writes landed since. ``max_priority`` (prioritized samplers): the
        learner's running maximum priority per trainer (all shards), given to new rows.
        """
        buf = self.buf
        if max_priority is not None and self.priorities is not None:
            self.priorities.raise_max_priority(max_priority)
        layout, total = pack_layout(buf.storage, quotas, self.weighted, self.steps)
        # one buffer reused by every round (grown when needed): Ray copies the returned slice
        # into the object store before this actor runs its next call, and fresh memory each
        # round would pay a page fault per 4 KiB (as much as the gather itself)
        if self._packed.shape[0] < total:
            self._packed = np.empty(total, dtype=np.uint8)
        packed = self._packed[:total]
        header = packed[: HEADER_WORDS * 8].view(np.int64)
        header[:] = 0
        for trainer, at in zip(trainers, layout):
            if at is None:
                continue
            n = at.n
            part = views(packed, buf.storage, at, self.weighted, self.steps)
            self._out.block = self._out_sequences.block = part.block
            if self.steps:
                # sequences (gathered straight into the block, masked steps zeroed) from every
                # stored start: the learner split the batch by the start totals it read
                sequences = buf.sample(n, int(trainer), out=self._out_sequences)
                assert isinstance(sequences, SequenceBatch) and part.mask is not None
                part.mask[:] = sequences.mask
                part.steps[:] = sequences.slots  # type: ignore[index]
                batch: Batch = sequences
            elif self.weighted:
                # drawn from every slot by priority: the learner split the batch by the
                # totals it read, and the probabilities below are those of this draw
                batch = buf.sample(n, int(trainer), out=self._out)
            else:
                # rows from the slots the learner counted (fewer than stored only while the
                # shard fills and writes landed since); a uniform draw with replacement may
                # take more rows than this shard holds (the global batch fits the union)
                counted = min(int(snapshot), buf.size)
                batch = buf.sample_prefix(n, counted, int(trainer), out=self._out)
            part.slots[:] = batch.indices
            part.gens[:] = batch.generations
            if part.probs is not None:
                part.probs[:] = self._probabilities(batch.indices, int(trainer))
            del batch
        self._out.block = self._out_sequences.block = None
        header[0] = buf.size
        header[1] = buf.total_writes
        return packed

    def _probabilities(self, slots: np.ndarray, trainer: int) -> np.ndarray:
        """Shard-local probability of each sampled row: ``p^alpha / total`` (PER, prioritized
        sequences), or the exact long-run inclusion probability (prioritized-locality)."""
        assert self.priorities is not None
        return self.priorities.sampling_probabilities(slots, self.buf.size, trainer)

    # ------------------------------------------------------------------ priorities
    def update_priorities(
        self, trainer: int, slots: np.ndarray, td_errors: np.ndarray, generations: Any
    ) -> float:
        """Feed TD errors back; returns the trainer's running maximum priority afterwards.
        ``generations`` ``None``: the slots as they are now (the learner has no record)."""
        if generations is None:
            inside = slots.size == 0 or (slots.min() >= 0 and slots.max() < self.buf.size)
            generations = self.buf.write_generation[slots] if inside else None
        self.buf.update_priorities(slots, td_errors, trainer=trainer, generations=generations)
        assert self.priorities is not None
        return self.priorities.max_priority(trainer)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str) -> tuple[int, int]:
        """``MultiAgentReplayBuffer.save(path)``; returns (size, total_writes)."""
        self.buf.save(path)
        return self.buf.size, self.buf.total_writes


__all__ = ["Part", "ShardActor", "build_buffer", "pack_layout", "sequence_steps", "unpack"]
