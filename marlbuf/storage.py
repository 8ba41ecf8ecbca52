"""Storage layouts: where the transitions live and how a batch of slots is gathered.

Two layouts hold the same data and return the same batches, bit for bit:

* :class:`AgentMajorStorage` — per agent, per field, one preallocated array (the layout of
  openai/maddpg, SB3, cpprb): a joint batch of N agents costs 5N small gathers.
* :class:`InterleavedStorage` — one 2-D table ``[capacity, row_bytes]``; a row holds every
  agent's fields for one timestep (key-value layout, Gogineni et al. Sec. 5.3), so a joint batch
  is one gather of wide rows.
"""

from __future__ import annotations

import math
import sys
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import gather_rows, gather_rows_parallel, scatter_rows
from marlbuf.spec import FIELDS, AgentSpec
from marlbuf.staging import RowCodec, RowViews


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose first byte sits on an ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)


class BlockPool:
    """Recycles gathered-batch memory once nobody references it any more.

    A fresh output block of a MADDPG round at N = 24 is 29 MB; allocating it anew each time
    costs more than the gather itself (the kernel zero-fills every new page: measured 382 ms per
    round with fresh blocks vs 87 ms with reused ones). A batch's arrays are views whose
    ``base`` is the block, and ``torch.from_numpy`` tensors keep those views alive, so a block
    whose reference count shows only the pool's own references is provably unused and can be
    overwritten. Blocks still referenced are never touched: correctness does not depend on the
    caller dropping batches, only the speed does.
    """

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._blocks: list[np.ndarray] = []  # uint8 owners, page-aligned inside
        self._lock = threading.Lock()  # gathers may run in background threads (nogil kernels)

    def acquire(self, nbytes: int) -> np.ndarray:
        """A 64-byte-aligned ``uint8`` array of ``nbytes`` that no one else references."""
        align = _config.ROW_ALIGN_BYTES
        with self._lock:
            chosen = None
            for owner in self._blocks:
                # references: the list, ``owner`` and getrefcount's argument -> 3 means unused
                if owner.nbytes == nbytes + align and sys.getrefcount(owner) == 3:
                    chosen = owner
                    break
            if chosen is None:
                chosen = np.empty(nbytes + align, dtype=np.uint8)
                self._blocks.append(chosen)
                if len(self._blocks) > self.max_blocks:
                    # forget the oldest: it stays valid for whoever holds it; we stop recycling it
                    del self._blocks[0]
            start = (-chosen.ctypes.data) % align
            return chosen[start : start + nbytes]


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (Linux), or ``None`` where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse (``MemoryError``) or warn before allocating ``nbytes`` that will not fit."""
    available = available_memory_bytes()
    if available is None:
        return
    gib = 1024**3
    if nbytes > available:
        raise MemoryError(
            f"{what} needs {nbytes / gib:.2f} GiB but only {available / gib:.2f} GiB is "
            "available; reduce capacity (or the number of agents / observation size)"
        )
    if nbytes > _config.MEMORY_WARN_FRACTION * available:
        warnings.warn(
            f"{what} needs {nbytes / gib:.2f} GiB of the {available / gib:.2f} GiB available; "
            "the machine may start swapping",
            ResourceWarning,
            stacklevel=4,
        )


def _ring_ranges(slots: np.ndarray) -> list[tuple[int, int, int]]:
    """Split consecutive ring slots into ``(dst_start, dst_stop, src_start)`` slices (at most 2)."""
    first, count = int(slots[0]), int(slots.shape[0])
    capacity_wrap = int(slots[-1]) < first  # the run passed the end of the ring
    if not capacity_wrap:
        return [(first, first + count, 0)]
    head = int(np.argmin(slots))  # position where the slots wrapped to 0
    return [(first, first + head, 0), (0, count - head, head)]


class Storage(ABC):
    """Preallocated storage for ``capacity`` joint transitions of every agent."""

    layout: str = ""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
    ) -> None:
        self.specs = dict(specs)
        self.capacity = int(capacity)
        self.pool = BlockPool(pool_blocks)  # recycled memory for gathered batches
        self.parallel_gather = False  # opt-in: threads for large gathers (see _gather_kernel)
        self.codec = codec if codec is not None else RowCodec(self.specs)

    def _gather_kernel(self, out_nbytes: int) -> Any:
        """The serial kernel, or the threaded one when opted in and the output is large."""
        if self.parallel_gather and out_nbytes >= _config.PARALLEL_GATHER_MIN_BYTES:
            return gather_rows_parallel
        return gather_rows

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held by the storage arrays."""

    @abstractmethod
    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews) -> None:
        """Store validated staging ``rows`` (shape (T, row_words), uint64, interleaved row
        format; ``views`` are their per-field views) at ring ``slots`` (shape (T,), consecutive
        modulo capacity)."""

    @abstractmethod
    def gather(
        self, indices: np.ndarray, reuse: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray | None]:
        """Rows at ``indices`` (shape (B,), int64, in range): per field, per agent, arrays of
        shape (B, *shape); plus the gathered block (interleaved) or ``None``. ``reuse`` holds
        output arrays of a previous gather of the same batch size to overwrite."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The storage arrays by name (views, for saving)."""


class AgentMajorStorage(Storage):
    """Per agent, per field, one ``(capacity, *shape)`` array (page-aligned)."""

    layout = "agent_major"

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
    ) -> None:
        super().__init__(specs, capacity, pool_blocks, codec)
        total = sum(
            capacity * math.prod(spec.shape(f)) * spec.dtype(f).itemsize
            for spec in self.specs.values()
            for f in FIELDS
        )
        check_fits_in_memory(total, f"agent_major storage for capacity={capacity}")
        self._keys = [f"{f}/{a}" for f in FIELDS for a in self.specs]
        self._data: dict[str, dict[str, np.ndarray]] = {
            f: {
                agent: aligned_empty(
                    (capacity, *spec.shape(f)), spec.dtype(f), _config.ARRAY_ALIGN_BYTES
                )
                for agent, spec in self.specs.items()
            }
            for f in FIELDS
        }

        # (key, field, agent, 2-D source view) for the gather loop, built once
        self._flat = [
            (f"{f}/{a}", f, a, arr.reshape(capacity, -1))
            for f in FIELDS
            for a, arr in self._data[f].items()
        ]
        self._out_layouts: dict[int, tuple[list[Any], int]] = {}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for per_agent in self._data.values() for a in per_agent.values())

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews) -> None:
        ranges = _ring_ranges(slots)
        for f in FIELDS:
            for agent, dst in self._data[f].items():
                src = views[f][agent]
                for lo, hi, s0 in ranges:
                    dst[lo:hi] = src[s0 : s0 + (hi - lo)]

    def gather(
        self, indices: np.ndarray, reuse: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray | None]:
        n = indices.shape[0]
        if reuse is not None and all(
            reuse.get(k) is not None and reuse[k].shape[0] == n for k in self._keys
        ):
            outputs = reuse
        else:
            outputs = self._output_arrays(n)
        out: dict[str, dict[str, np.ndarray]] = {f: {} for f in FIELDS}
        for key, field_name, agent, src in self._flat:
            dst = outputs[key]
            self._gather_kernel(dst.nbytes)(src, indices, dst.reshape(n, -1))
            out[field_name][agent] = dst
        return out, None

    def _output_arrays(self, n: int) -> dict[str, np.ndarray]:
        """Every field's output array for ``n`` rows, carved from one pooled block."""
        if n not in self._out_layouts:
            align = _config.ROW_ALIGN_BYTES
            layout, offset = [], 0
            for key, field_name, agent, _ in self._flat:
                src = self._data[field_name][agent]
                nbytes = n * src[0].nbytes
                layout.append((key, offset, nbytes, src.dtype, (n, *src.shape[1:])))
                offset += -(-nbytes // align) * align  # every array starts on a cache line
            self._out_layouts = {n: (layout, offset)}  # keep one: batch sizes rarely vary
        layout, total = self._out_layouts[n]
        block = self.pool.acquire(total)
        return {
            key: block[offset : offset + nbytes].view(dtype).reshape(shape)
            for key, offset, nbytes, dtype, shape in layout
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"{f}/{a}": arr for f in FIELDS for a, arr in self._data[f].items()}


class InterleavedStorage(Storage):
    """One page-aligned table ``[capacity, row_bytes]``; a row is one timestep of every agent.

    The row is field-major (all agents' obs, then all actions, rewards, next obs, dones; see
    :func:`marlbuf.spec.interleaved_row_layout`) and padded to a whole number of cache lines. The
    table is kept as 8-byte words so that the gather kernel moves words, not bytes.
    """

    layout = "interleaved"

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
    ) -> None:
        super().__init__(specs, capacity, pool_blocks, codec)
        self.row_bytes = self.codec.row_bytes
        self.row_words = self.codec.row_words
        check_fits_in_memory(
            capacity * self.row_bytes, f"interleaved storage for capacity={capacity}"
        )
        self.table = aligned_empty(
            (capacity, self.row_words), np.dtype(np.uint64), _config.ARRAY_ALIGN_BYTES
        )

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews) -> None:
        scatter_rows(self.table, slots, rows)

    def gather(
        self, indices: np.ndarray, reuse: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray | None]:
        n = indices.shape[0]
        block = reuse.get("block") if reuse is not None else None
        if block is None or block.shape[0] != n:
            raw = self.pool.acquire(n * self.row_bytes)
            block = raw.view(np.uint64).reshape(n, self.row_words)
        self._gather_kernel(block.nbytes)(self.table, indices, block)
        return self.codec.views(block), block

    def arrays(self) -> dict[str, np.ndarray]:
        return {"table": self.table}


LAYOUTS: dict[str, type[Storage]] = {
    AgentMajorStorage.layout: AgentMajorStorage,
    InterleavedStorage.layout: InterleavedStorage,
}


def make_storage(
    layout: str,
    specs: Mapping[str, AgentSpec],
    capacity: int,
    pool_blocks: int = 8,
    codec: RowCodec | None = None,
) -> Storage:
    """Build the storage for ``layout`` (``"interleaved"`` or ``"agent_major"``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}; got layout={layout!r}")
    return LAYOUTS[layout](specs, capacity, pool_blocks, codec)
