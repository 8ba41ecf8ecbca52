"""*Modelled* cache and TLB misses of the sampling phase, from its own address stream.

Callgrind simulates caches but no TLB and no prefetcher, and this machine has no PMU. The rows a
sampling round gathers are known exactly (the indices, the layout, the arrays' addresses), so
their addresses can be run through a trace-driven model: a set-associative LRU cache of 64-byte
lines (the last level, the geometry pinned for callgrind) and a data TLB of 4 KiB pages and one
of 2 MiB pages (NumPy asks the kernel for transparent huge pages on large arrays; whether it got
them is in ``/proc/self/smaps``). Every figure is labelled ``modelled``: only the gather's reads
of the source rows are modelled (not the index reads, not the writes of the batch), in the
kernel's order (per trainer; for ``agent_major`` per field and agent, then per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marlbuf._kernels.cachemodel import lru_misses
from marlbuf.profiling.profiler import Metric
from marlbuf.stores.base import Storage
from marlbuf.stores.host import AgentMajorStorage, InterleavedStorage


@dataclass(frozen=True)
class Geometry:
    """A set-associative structure: ``entries`` blocks of ``block_bytes``, ``ways`` per set."""

    name: str
    entries: int
    ways: int
    block_bytes: int
    description: str

    def __post_init__(self) -> None:
        if self.entries % self.ways:
            raise ValueError(f"{self.name}: entries ({self.entries}) must be a multiple of ways")


#: The models reported by default (documented in docs/profiling.md).
DEFAULT_GEOMETRIES = (
    Geometry("model_LL_misses", 32 * 1024**2 // 64, 16, 64, "32 MiB 16-way LRU, 64 B lines"),
    Geometry("model_dTLB_misses_4k", 64, 4, 4096, "64-entry 4-way LRU dTLB, 4 KiB pages"),
    Geometry("model_dTLB_misses_2m", 64, 4, 2 * 1024**2, "64-entry 4-way LRU dTLB, 2 MiB pages"),
)


class LRUModel:
    """One set-associative LRU structure with persistent state."""

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        n_sets = geometry.entries // geometry.ways
        self.tags = np.full((n_sets, geometry.ways), -1, dtype=np.int64)
        self.last_use = np.full((n_sets, geometry.ways), -1, dtype=np.int64)
        self.clock = np.zeros(1, dtype=np.int64)

    def misses(self, addresses: np.ndarray) -> int:
        """Misses of the byte ``addresses`` (shape (n,), int64), in order."""
        blocks = np.ascontiguousarray(addresses // self.geometry.block_bytes, dtype=np.int64)
        return int(lru_misses(blocks, self.tags, self.last_use, self.clock))


def _row_addresses(base: int, row_bytes: int, indices: np.ndarray, step: int) -> np.ndarray:
    """Byte addresses, ``step`` apart, covering every row at ``indices`` (plus each row's last
    byte), row after row."""
    offsets = np.arange(0, row_bytes, step, dtype=np.int64)
    if offsets[-1] != row_bytes - 1:
        offsets = np.append(offsets, row_bytes - 1)
    starts = base + indices.astype(np.int64) * row_bytes
    return (starts[:, None] + offsets[None, :]).ravel()


def gather_addresses(storage: Storage, indices: np.ndarray, step: int = 64) -> np.ndarray:
    """The source addresses one gather of ``indices`` reads, in the kernel's order.

    One address per ``step`` bytes of every row (and its last byte), enough to touch every
    line and page the row spans when ``step`` is at most the line size.
    """
    if isinstance(storage, InterleavedStorage):
        table = storage.table
        return _row_addresses(table.ctypes.data, storage.row_bytes, indices, step)
    if isinstance(storage, AgentMajorStorage):
        parts = []
        for array in storage.arrays().values():  # fields x agents: the gather's loop order
            parts.append(_row_addresses(array.ctypes.data, array.strides[0], indices, step))
        return np.concatenate(parts)
    raise TypeError(f"no address model for storage {type(storage).__name__}")


class SamplingModel:
    """Modelled misses of successive sampling rounds over one buffer's storage."""

    def __init__(self, storage: Storage, geometries: Sequence[Geometry] = DEFAULT_GEOMETRIES):
        self.storage = storage
        self.models = [LRUModel(g) for g in geometries]

    @property
    def metrics(self) -> dict[str, Metric]:
        return {
            m.geometry.name: Metric(
                "modelled",
                "count",
                f"{m.geometry.description}: the gather's source-row reads only",
            )
            for m in self.models
        }

    def observe(self, index_arrays: Sequence[np.ndarray]) -> dict[str, float]:
        """Feed one round (one index array per trainer, in order); misses per model."""
        totals = dict.fromkeys((m.geometry.name for m in self.models), 0.0)
        for indices in index_arrays:
            addresses = gather_addresses(self.storage, np.asarray(indices))
            for model in self.models:
                totals[model.geometry.name] += model.misses(addresses)
        return totals
