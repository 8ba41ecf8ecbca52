"""One shard: a :class:`~marlbuf.MultiAgentReplayBuffer` inside a Ray actor, and the packed
format in which it ships a sampling round to the learner (one array through the object store).

Packed round (``uint8``, every section starting on a 64-byte boundary)::

    header   int64[8]: size, total_writes (at sampling time), 0, ...
    then, for every trainer position i with quota n_i > 0, in order:
      block  the gathered batch block of n_i rows (``Storage.block_spec(n_i)``)
      slots  int64[n_i]  shard-local slots
      gens   int64[n_i]  write generations of those slots
      probs  float64[n_i] (prioritized samplers only) the rows' shard-local probabilities
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import marlbuf
from marlbuf import persistence
from marlbuf.batch import Batch
from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.distributed._ray import code_fingerprint
from marlbuf.samplers import Prioritized, Sampler
from marlbuf.spec import AgentSpec, FieldSpec
from marlbuf.storage import Storage

ALIGN = 64
HEADER_WORDS = 8
_EMPTY = np.empty(0, dtype=np.int64)


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def block_nbytes(storage: Storage, n: int) -> int:
    """Bytes of the block that holds an ``n``-row batch of ``storage``."""
    dtype, shape = storage.block_spec(n)
    return math.prod(shape) * dtype.itemsize


def pack_layout(
    storage: Storage, quotas: Sequence[int], weighted: bool
) -> tuple[list[tuple[int, int, int, int, int, int] | None], int]:
    """Offsets of a packed round: per trainer position ``(n, block, block_nbytes, slots, gens,
    probs)`` (``None`` where the quota is 0) and the total bytes."""
    offset = HEADER_WORDS * 8
    out: list[tuple[int, int, int, int, int, int] | None] = []
    for n in quotas:
        n = int(n)
        if n == 0:
            out.append(None)
            continue
        nbytes = block_nbytes(storage, n)
        block = offset
        slots = block + _up(nbytes)
        gens = slots + _up(8 * n)
        probs = gens + _up(8 * n)
        offset = probs + (_up(8 * n) if weighted else 0)
        out.append((n, block, nbytes, slots, gens, probs))
    return out, offset


def unpack(
    storage: Storage, packed: np.ndarray, quotas: Sequence[int], weighted: bool
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None]]:
    """Header (int64[8]) and per trainer position ``(block, slots, gens, probs)`` views of a
    packed round (``None`` where the quota is 0)."""
    layout, total = pack_layout(storage, quotas, weighted)
    if packed.dtype != np.uint8 or packed.shape != (total,):
        raise ValueError(
            f"a packed round of quotas {list(quotas)} has {total} bytes; got {packed.dtype} "
            f"{packed.shape} (shard and learner disagree on the batch format)"
        )
    header = packed[: HEADER_WORDS * 8].view(np.int64)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None] = []
    dtype_shape = {}
    for entry in layout:
        if entry is None:
            parts.append(None)
            continue
        n, block, nbytes, slots, gens, probs = entry
        if n not in dtype_shape:
            dtype_shape[n] = storage.block_spec(n)
        dtype, shape = dtype_shape[n]
        parts.append(
            (
                packed[block : block + nbytes].view(dtype).reshape(shape),
                packed[slots : slots + 8 * n].view(np.int64),
                packed[gens : gens + 8 * n].view(np.int64),
                packed[probs : probs + 8 * n].view(np.float64) if weighted else None,
            )
        )
    return header, parts


def build_buffer(config: Mapping[str, Any], seed: Any) -> MultiAgentReplayBuffer:
    """The shard's buffer from the sharded buffer's JSON-safe ``config`` (a manifest written
    before ``next_obs``, ``batch_dtype``, ``global_fields``, ``alive`` and ``parallel_gather``
    were recorded gets their defaults)."""
    return MultiAgentReplayBuffer(
        {a: AgentSpec.from_dict(s) for a, s in config["specs"].items()},
        capacity=int(config["shard_capacity"]),
        layout=config["layout"],
        sampler=Sampler.from_config(config["sampler"]["type"], config["sampler"]["config"]),
        seed=seed,
        n_trainers=int(config["n_trainers"]),
        parallel_gather=bool(config.get("parallel_gather", False)),
        batch_layout=config["batch_layout"],
        next_obs=config.get("next_obs", "auto"),
        batch_dtype=config.get("batch_dtype", "float32"),
        global_fields={
            name: FieldSpec.from_dict(fs) for name, fs in config.get("global_fields", {}).items()
        },
        alive=bool(config.get("alive", False)),
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
        self._out = Batch({}, {}, {}, {}, {}, indices=_EMPTY, generations=_EMPTY)
        self._packed = np.empty(0, dtype=np.uint8)
        # a bad argument must reach the learner as itself: Ray reports an exception raised here
        # only as "the actor died", so it is kept and raised by the first call (info)
        self._init_error: Exception | None = None
        try:
            self.buf = build_buffer(config, seed)
            if load_path is not None:
                persistence.load_into(self.buf, load_path)
            self.weighted = self.buf.sampler.weighted
            #: the buffer's sampler when it is a prioritized one (priority totals, maxima)
            self.prioritized = (
                self.buf.sampler if isinstance(self.buf.sampler, Prioritized) else None
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
        """``[size, total_writes, total of trainer 0's tree, ...]`` (float64; totals only for
        prioritized samplers)."""
        totals: list[float] = []
        if self.prioritized is not None:
            totals = [self.prioritized.priority_total(t) for t in range(self.buf.n_trainers)]
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
        """Sample ``quotas[i]`` rows for trainer ``trainers[i]`` and pack them (module doc).

        ``snapshot`` (uniform and neighbor samplers): the filled-slot count the learner based
        the quotas on; rows come from those slots only, so the global draw is exact for that
        state even when writes landed since. ``max_priority`` (prioritized samplers): the
        learner's running maximum priority per trainer (all shards), given to new rows.
        """
        buf = self.buf
        if max_priority is not None and self.prioritized is not None:
            self.prioritized.raise_max_priority(max_priority)
        layout, total = pack_layout(buf.storage, quotas, self.weighted)
        # one buffer reused by every round (grown when needed): Ray copies the returned slice
        # into the object store before this actor runs its next call, and fresh memory each
        # round would pay a page fault per 4 KiB (as much as the gather itself)
        if self._packed.shape[0] < total:
            self._packed = np.empty(total, dtype=np.uint8)
        packed = self._packed[:total]
        header = packed[: HEADER_WORDS * 8].view(np.int64)
        header[:] = 0
        for trainer, entry in zip(trainers, layout):
            if entry is None:
                continue
            n, block_at, nbytes, slots_at, gens_at, probs_at = entry
            dtype, shape = buf.storage.block_spec(n)
            block = packed[block_at : block_at + nbytes].view(dtype).reshape(shape)
            self._out.block = block
            if self.weighted:
                # drawn from every slot by priority: the learner split the batch by the
                # totals it read, and the probabilities below are those of this draw
                batch = buf.sample(n, int(trainer), out=self._out)
            else:
                # rows from the slots the learner counted (fewer than stored only while the
                # shard fills and writes landed since); a uniform draw with replacement may
                # take more rows than this shard holds (the global batch fits the union)
                counted = min(int(snapshot), buf.size)
                batch = buf.sample_prefix(n, counted, int(trainer), out=self._out)
            packed[slots_at : slots_at + 8 * n].view(np.int64)[:] = batch.indices
            packed[gens_at : gens_at + 8 * n].view(np.int64)[:] = batch.generations
            if self.weighted:
                packed[probs_at : probs_at + 8 * n].view(np.float64)[:] = self._probabilities(
                    batch.indices, int(trainer)
                )
            del batch
        self._out.block = None
        header[0] = buf.size
        header[1] = buf.total_writes
        return packed

    def _probabilities(self, slots: np.ndarray, trainer: int) -> np.ndarray:
        """Shard-local probability of each sampled row: ``p^alpha / total`` (PER), or the exact
        long-run inclusion probability (prioritized-locality)."""
        assert self.prioritized is not None
        return self.prioritized.sampling_probabilities(slots, self.buf.size, trainer)

    # ------------------------------------------------------------------ priorities
    def update_priorities(
        self, trainer: int, slots: np.ndarray, td_errors: np.ndarray, generations: Any
    ) -> float:
        """Feed TD errors back; returns the trainer's running maximum priority afterwards."""
        self.buf.update_priorities(slots, td_errors, trainer=trainer, generations=generations)
        assert self.prioritized is not None
        return self.prioritized.max_priority(trainer)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str) -> tuple[int, int]:
        """``MultiAgentReplayBuffer.save(path)``; returns (size, total_writes)."""
        self.buf.save(path)
        return self.buf.size, self.buf.total_writes


__all__ = ["ShardActor", "build_buffer", "pack_layout", "unpack"]
