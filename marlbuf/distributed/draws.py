"""The global draw of a sharded buffer: how one batch is split into per-shard quotas so that
the union of the shards' draws is the draw one buffer holding every shard's rows would make,
and how the shards' packed parts become the learner's batches (``docs/distributed.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from marlbuf.batch import Batch, DrawnIndices
from marlbuf.distributed._shard import sequence_steps, unpack
from marlbuf.samplers import Neighbor, Prioritized, Sampler, Uniform
from marlbuf.samplers import Sequence as SequenceSampler
from marlbuf.stores.base import Storage


class Round:
    """What the learner thread needs to assemble one sampled round."""

    def __init__(
        self,
        batch_size: int,
        trainers: tuple[int, ...],
        quotas: np.ndarray,
        scale: np.ndarray | None,
        betas: list[float],
        refs: list[tuple[int, Any]],
    ) -> None:
        self.batch_size = batch_size
        self.trainers = trainers
        self.quotas = quotas  # (K, T) rows per shard per trainer position
        self.scale = scale  # (K, T) share of trainer t's draws that went to shard k
        self.betas = betas
        self.refs = refs


class GlobalDraw:
    """Quotas and assembly of a sharded buffer's rounds, for one sampler.

    Parameters
    ----------
    sampler : Sampler
        The sharded buffer's sampler (one of the samplers its draw can split exactly).
    rng : numpy.random.Generator
        The learner's generator: every quota is drawn from it.
    shard_capacity : int
        Slots per shard (a batch's global index is ``shard * shard_capacity + slot``).
    storage : Storage
        A store of the shards' row format that holds no data: it knows the batch formats
        (block shapes, views, a pool of recycled batch memory).
    """

    def __init__(
        self, sampler: Sampler, rng: np.random.Generator, shard_capacity: int, storage: Storage
    ) -> None:
        self.sampler = sampler
        self.rng = rng
        self.shard_capacity = shard_capacity
        self.storage = storage
        self.weighted = sampler.weighted
        #: steps per sequence of a Sequence sampler (quotas count sequences), else 0
        self.steps = sequence_steps(sampler)
        #: whether a batch is split by per-shard totals read each round (prioritized samplers'
        #: sum p^alpha, sequence samplers' start totals), else by the shards' sizes
        self.by_totals = isinstance(sampler, (Prioritized, SequenceSampler))

    def check_batch(self, batch_size: Any) -> int:
        """``batch_size`` as the sampler takes it (a ``Neighbor``'s: a multiple of its run
        length)."""
        batch_size = self.sampler.check_batch_size(batch_size)
        if isinstance(self.sampler, Neighbor) and batch_size % self.sampler.run_length:
            raise ValueError(
                f"run_length={self.sampler.run_length} must divide batch_size={batch_size}; "
                f"choose a batch size that is a multiple of {self.sampler.run_length}"
            )
        return batch_size

    def split_by_totals(
        self,
        batch_size: int,
        trainers: tuple[int, ...],
        totals: np.ndarray,
        batches_drawn: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, list[float]]:
        """Quotas of every trainer position from the shards' ``totals`` (shape (K, T)): the
        quotas (shape (K, T), int64), each shard's share of each trainer's total (the weights'
        scale, shape (K, T), float64) and, for a weighted sampler, each trainer's beta at its
        count of batches in ``batches_drawn`` (shape (n_trainers,), int64), which is counted
        up."""
        n_shards, n_t = totals.shape[0], len(trainers)
        quotas = np.zeros((n_shards, n_t), dtype=np.int64)
        scale = np.zeros((n_shards, n_t), dtype=np.float64)
        betas: list[float] = []
        for i, t in enumerate(trainers):
            column = totals[:, i]
            whole = column.sum()
            if not whole > 0:
                raise ValueError(self.nothing_to_draw(batch_size, t))
            scale[:, i] = column / whole
            quotas[:, i] = self.split(batch_size, column)
            if self.weighted:
                # the sampler's own schedule at the learner's count of t's batches
                assert isinstance(self.sampler, (Prioritized, SequenceSampler))
                betas.append(self.sampler.beta_at(int(batches_drawn[t])))
                batches_drawn[t] += 1
        return quotas, scale, betas

    def split_by_sizes(self, batch_size: int, n_trainers: int, sizes: np.ndarray) -> np.ndarray:
        """Quotas of ``n_trainers`` trainer positions from the shards' ``sizes`` (shape (K,)):
        shape (K, n_trainers), int64."""
        self.check_enough(batch_size, sizes)
        quotas = np.zeros((len(sizes), n_trainers), dtype=np.int64)
        for i in range(n_trainers):
            quotas[:, i] = self.quotas(batch_size, sizes)
        return quotas

    def nothing_to_draw(self, batch_size: int, trainer: int) -> str:
        """Why trainer ``trainer``'s totals are all 0."""
        sampler = self.sampler
        if isinstance(sampler, SequenceSampler) and not sampler.pad and not sampler.prioritized:
            return (
                f"no shard holds an episode with length={sampler.length} steps yet, so "
                "pad=False has no sequence start; add more data, use shorter sequences or "
                f"pad=True (batch_size={batch_size})"
            )
        return (
            f"no shard has data (or every priority of trainer {trainer} is 0): add "
            f"transitions before sampling (batch_size={batch_size})"
        )

    def split(self, batch_size: int, totals: np.ndarray) -> np.ndarray:
        """Rows (sequences) per shard for one trainer from the shards' totals: independent
        draws, or distinct uniform starts (``Sequence(replace=False)``: the totals count the
        starts) split as ``B`` of all starts without replacement."""
        sampler = self.sampler
        if isinstance(sampler, SequenceSampler) and not sampler.replace:
            counts = np.rint(totals).astype(np.int64)
            if batch_size > counts.sum():
                raise ValueError(
                    f"batch_size={batch_size} distinct sequences (replace=False) but the shards "
                    f"hold {int(counts.sum())} starts ({counts.tolist()}); add more data, sample "
                    "fewer, or use replace=True"
                )
            return self.rng.multivariate_hypergeometric(counts, batch_size)
        return self.rng.multinomial(batch_size, totals / totals.sum())

    def valid_starts(self, sizes: np.ndarray) -> np.ndarray:
        """Per shard, what the sampler draws from: slots, or a Neighbor's run starts."""
        if isinstance(self.sampler, Neighbor):
            n = self.sampler.run_length
            starts = np.where(sizes >= self.shard_capacity, sizes, sizes - n + 1)
            return np.maximum(starts, 0)
        return sizes

    def enough(self, batch_size: int, sizes: np.ndarray) -> bool:
        if isinstance(self.sampler, Neighbor):
            return bool(self.valid_starts(sizes).sum() >= batch_size // self.sampler.run_length)
        if isinstance(self.sampler, Uniform) and not self.sampler.replace:
            return bool(sizes.sum() >= batch_size)  # as one buffer: distinct stored rows
        return bool(sizes.sum() > 0)

    def check_enough(self, batch_size: int, sizes: np.ndarray) -> None:
        if sizes.sum() == 0:
            raise ValueError(
                f"the sharded buffer is empty: add transitions before sampling "
                f"(batch_size={batch_size})"
            )
        if not self.enough(batch_size, sizes):
            raise ValueError(
                f"batch_size={batch_size} needs more stored transitions than the shards hold "
                f"({sizes.tolist()}) for {self.sampler!r}; add more data or sample a smaller "
                "batch"
            )

    def quotas(self, batch_size: int, sizes: np.ndarray) -> np.ndarray:
        """Rows per shard for one trainer: the global draw split exactly (see the docs)."""
        if isinstance(self.sampler, Neighbor):
            refs = self.rng.multivariate_hypergeometric(
                self.valid_starts(sizes), batch_size // self.sampler.run_length
            )
            return refs * self.sampler.run_length
        if isinstance(self.sampler, Uniform) and not self.sampler.replace:
            return self.rng.multivariate_hypergeometric(sizes, batch_size)
        return self.rng.multinomial(batch_size, sizes / sizes.sum())

    def assemble(
        self, plan: Round, packed: list[np.ndarray], note: Callable[[int, int, int], Any]
    ) -> list[Batch]:
        """Copy every shard's part into the round's block and build the batches (sequence
        batches of ``B * L`` rows for a sequence sampler); ``note(shard, size, total_writes)``
        is told each shard's counts at its draw."""
        storage = self.storage
        batch_size, trainers, steps = plan.batch_size, plan.trainers, self.steps
        n_t = len(trainers)
        parts: dict[int, list[Any]] = {}
        for (k, _), array in zip(plan.refs, packed):
            header, per_trainer = unpack(storage, array, plan.quotas[k], self.weighted, steps)
            note(k, int(header[0]), int(header[1]))
            parts[k] = per_trainer
        rows = storage.layout == "interleaved" and storage.batch_layout == "rows"
        per_item = steps or 1  # gathered rows per batch row (sequence)
        n_rows = batch_size * per_item
        dtype, shape = storage.block_spec(n_rows)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if rows:
            round_block = storage.pool.acquire(n_t * nbytes).view(dtype).reshape(n_t, *shape)
            blocks = [round_block[i] for i in range(n_t)]
        else:
            blocks = [storage.pool.acquire(nbytes).view(dtype).reshape(shape) for _ in trainers]
        batches: list[Batch] = []
        for i, t in enumerate(trainers):
            block = blocks[i]
            fields = storage.views(block, n_rows)
            indices = np.empty(batch_size, dtype=np.int64)
            generations = np.empty(batch_size, dtype=np.int64)
            probs = np.empty(batch_size, dtype=np.float64) if self.weighted else None
            mask = np.empty((batch_size, steps), dtype=bool) if steps else None
            slots = np.empty((batch_size, steps), dtype=np.int64) if steps else None
            at = 0
            for k in sorted(parts):
                part = parts[k][i]
                if part is None:
                    continue
                n = part.slots.shape[0]
                lo, hi = at * per_item, (at + n) * per_item
                if rows:
                    np.copyto(block[lo:hi], part.block)
                else:  # every field: the five, extras, globals and alive
                    for name, parts_of in storage.views(part.block, hi - lo).items():
                        for key, values in parts_of.items():
                            np.copyto(fields[name][key][lo:hi], values)
                indices[at : at + n] = part.slots + k * self.shard_capacity
                generations[at : at + n] = part.gens
                if probs is not None:
                    assert plan.scale is not None and part.probs is not None
                    probs[at : at + n] = part.probs * plan.scale[k, i]
                if mask is not None and slots is not None:
                    mask[at : at + n] = part.mask
                    # global ids of the steps' slots; -1 (masked) stays -1
                    slots[at : at + n] = np.where(
                        part.mask, part.steps + k * self.shard_capacity, -1
                    )
                at += n
            if at != batch_size:  # a shard answered a different quota: never expected
                raise RuntimeError(f"assembled {at} rows for trainer {t}; expected {batch_size}")
            weights = None
            if probs is not None:
                # w_i = (N P(i))^-beta / max_b (N P(b))^-beta = (min_b P(b) / P(i))^beta
                weights = ((probs.min() / probs) ** plan.betas[i]).astype(np.float32)
            # the batch of a gather of these rows (with extras, globals and alive), its indices
            # carrying their generations as a single buffer's do
            drawn = DrawnIndices.of(indices, generations)
            if mask is None or slots is None:
                batches.append(storage.make_batch(fields, block, drawn, generations, weights, t))
                continue
            # the shards zeroed the masked steps already (zeroed=True: nothing to redo)
            flat_slots = slots.reshape(-1)
            flat = storage.make_batch(fields, block, flat_slots, flat_slots, None, t)
            assert isinstance(self.sampler, SequenceSampler)
            batches.append(
                storage.make_sequences(
                    flat, mask, self.sampler.burn_in, slots, drawn, generations, weights, t, True
                )
            )
        return batches
