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
import threading
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import gather_rows, gather_rows_parallel, gather_segments, scatter_rows
from marlbuf.spec import FIELDS, AgentSpec
from marlbuf.staging import RowCodec, RowViews


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose first byte sits on an ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)


class _Lease:
    """The owner of one pooled block while a batch uses it.

    Every array handed out for a batch is a view whose ``base`` chain ends at a lease (NumPy
    collapses view chains to the first object that is not an array), and ``torch.from_numpy``,
    DLPack capsules and ``memoryview`` all keep that chain alive. So the lease is garbage
    collected exactly when nothing can reach the block's memory any more; a
    ``weakref.finalize`` then hands the block back to the pool. No interpreter reference-count
    constant is involved. The lease keeps the raw memory alive itself, so a batch outlives its
    buffer safely.
    """

    __slots__ = ("__array_interface__", "__weakref__", "_raw")

    def __init__(self, raw: np.ndarray, start: int, nbytes: int) -> None:
        self._raw = raw
        self.__array_interface__ = {
            "data": (raw.ctypes.data + start, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }


class BlockPool:
    """Recycles gathered-batch memory once nobody references it any more.

    A fresh output block of a MADDPG round at N = 24 is 29 MB; allocating it anew for each
    batch costs more than the gather itself (the kernel first faults in every new page). A
    block is handed out wrapped in a :class:`_Lease`; when the last view of it dies, the lease's
    finalizer marks the block free. Blocks still referenced are never touched: correctness does
    not depend on the caller dropping batches, only the speed does. At most ``max_blocks``
    blocks are kept; beyond that a new block is allocated and the oldest is forgotten (it stays
    valid for whoever still holds it).
    """

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._blocks: list[tuple[int, np.ndarray]] = []  # (token, raw uint8 memory)
        self._busy: set[int] = set()  # tokens of blocks some batch still references
        self._next_token = 0  # tokens are never reused (ids of freed arrays may be)
        # finalizers run in whichever thread drops the last reference; acquire may run in a
        # sampling thread: both take this lock
        self._lock = threading.Lock()

    def _release(self, token: int) -> None:
        with self._lock:
            self._busy.discard(token)

    def acquire(self, nbytes: int) -> np.ndarray:
        """A 64-byte-aligned ``uint8`` array of ``nbytes`` that no one else references."""
        align = _config.ROW_ALIGN_BYTES
        with self._lock:
            chosen: tuple[int, np.ndarray] | None = None
            for token, raw in self._blocks:
                if raw.nbytes == nbytes + align and token not in self._busy:
                    chosen = (token, raw)
                    break
            if chosen is None:
                chosen = (self._next_token, np.empty(nbytes + align, dtype=np.uint8))
                self._next_token += 1
                self._blocks.append(chosen)
                if len(self._blocks) > self.max_blocks:
                    # forget the oldest: it stays valid for its holder, it is just not recycled
                    forgotten, _ = self._blocks.pop(0)
                    self._busy.discard(forgotten)
            token, raw = chosen
            self._busy.add(token)
        start = (-raw.ctypes.data) % align
        lease = _Lease(raw, start, nbytes)
        weakref.finalize(lease, self._release, token)
        return np.asarray(lease)


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


BATCH_LAYOUTS = ("rows", "per_agent")


class Storage(ABC):
    """Preallocated storage for ``capacity`` joint transitions of every agent.

    A gather writes into one block of memory (recycled by :class:`BlockPool`, or the ``out``
    block of an earlier batch) and returns per-field, per-agent views of it. Two batch layouts:

    * ``"rows"`` (interleaved only): the block is ``B`` table rows; each agent's field is a
      strided view whose row stride is the whole joint row, and ``Batch.concat`` of several
      fields is a zero-copy view (the centralized critic's input).
    * ``"per_agent"``: each agent's field is its own C-contiguous ``(B, *shape)`` array inside
      the block, written by the gather kernel in the same pass (what per-agent networks want).
      The ``agent_major`` layout always gathers this way.
    """

    layout: str = ""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
        batch_layout: str = "rows",
    ) -> None:
        self.specs = dict(specs)
        self.capacity = int(capacity)
        self.pool = BlockPool(pool_blocks)  # recycled memory for gathered batches
        self.parallel_gather = False  # opt-in: threads for large gathers (see _gather_kernel)
        self.codec = codec if codec is not None else RowCodec(self.specs)
        if batch_layout not in BATCH_LAYOUTS:
            raise ValueError(
                f"batch_layout must be one of {BATCH_LAYOUTS}; got batch_layout={batch_layout!r}"
            )
        self.batch_layout = batch_layout
        self._carvings: dict[int, tuple[list[tuple[str, str, int, int, np.dtype, tuple]], int]] = {}

    def _gather_kernel(self, out_nbytes: int) -> Any:
        """The serial kernel, or the threaded one when opted in and the output is large."""
        if self.parallel_gather and out_nbytes >= _config.PARALLEL_GATHER_MIN_BYTES:
            return gather_rows_parallel
        return gather_rows

    def _carving(self, n: int) -> tuple[list[tuple[str, str, int, int, np.dtype, tuple]], int]:
        """Per-agent output arrays of an ``n``-row batch inside one block: ``(field, agent,
        byte offset, nbytes, dtype, shape)`` each starting on a cache line, and the total."""
        if n not in self._carvings:
            align = _config.ROW_ALIGN_BYTES
            layout, offset = [], 0
            for field_name in FIELDS:
                for agent, spec in self.specs.items():
                    shape = spec.shape(field_name)
                    dtype = spec.dtype(field_name)
                    nbytes = n * math.prod(shape) * dtype.itemsize
                    layout.append((field_name, agent, offset, nbytes, dtype, (n, *shape)))
                    offset += -(-nbytes // align) * align  # every array starts on a cache line
            self._carvings = {n: (layout, offset)}  # keep one: batch sizes rarely vary
        return self._carvings[n]

    def _carve(self, block: np.ndarray, n: int) -> dict[str, dict[str, np.ndarray]]:
        layout, _ = self._carving(n)
        out: dict[str, dict[str, np.ndarray]] = {f: {} for f in FIELDS}
        for field_name, agent, offset, nbytes, dtype, shape in layout:
            out[field_name][agent] = block[offset : offset + nbytes].view(dtype).reshape(shape)
        return out

    def block_spec(self, n: int) -> tuple[np.dtype, tuple[int, ...]]:
        """dtype and shape of the memory block that holds an ``n``-row batch."""
        if self.layout == "interleaved" and self.batch_layout == "rows":
            return np.dtype(np.uint64), (n, self.codec.row_words)
        return np.dtype(np.uint8), (self._carving(n)[1],)

    def check_out_block(self, block: Any, n: int) -> np.ndarray:
        """``block`` (the ``block`` of a batch passed as ``out=``) if this storage can gather
        ``n`` rows into it, else a ``ValueError`` that says what differs.

        The check is what keeps ``out=`` memory-safe: the kernels trust their output's size.
        """
        dtype, shape = self.block_spec(n)
        if not isinstance(block, np.ndarray):
            raise ValueError(
                "out must be a Batch returned by this buffer's sample/gather (it has no "
                f"gathered block); got block={type(block).__name__}"
            )
        if block.dtype != dtype or block.shape != shape:
            raise ValueError(
                f"out holds a block of shape {block.shape} dtype {block.dtype}, but a batch of "
                f"{n} rows of this buffer needs shape {shape} dtype {dtype}: pass a batch of the "
                "same size from this buffer (same specs, layout and batch_layout), or no out="
            )
        if not (block.flags.c_contiguous and block.flags.writeable):
            raise ValueError("out's block must be C-contiguous and writeable")
        return block

    def views(self, block: np.ndarray, n: int) -> dict[str, dict[str, np.ndarray]]:
        """Per field, per agent arrays of an ``n``-row batch held in ``block`` (dtype and shape
        of :meth:`block_spec`, C-contiguous; read-only memory gives read-only views): the same
        views :meth:`gather` returns for that block. Used to read or fill batch blocks that
        were gathered elsewhere (another process) or are assembled from several parts."""
        dtype, shape = self.block_spec(n)
        if (
            not isinstance(block, np.ndarray)
            or block.dtype != dtype
            or block.shape != shape
            or not block.flags.c_contiguous
        ):
            got = (
                f"shape {block.shape} dtype {block.dtype}"
                if isinstance(block, np.ndarray)
                else type(block).__name__
            )
            raise ValueError(
                f"block must be a C-contiguous array of shape {shape} dtype {dtype} (a batch of "
                f"{n} rows of this storage); got {got}"
            )
        if self.layout == "interleaved" and self.batch_layout == "rows":
            return self.codec.views(block)
        return self._carve(block, n)

    def _new_block(self, n: int) -> np.ndarray:
        dtype, shape = self.block_spec(n)
        raw = self.pool.acquire(math.prod(shape) * dtype.itemsize)
        return raw.view(dtype).reshape(shape)

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held by the storage arrays."""

    @abstractmethod
    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        """Store validated staging ``rows`` (shape (T, row_words), uint64, interleaved row
        format; ``views`` are their per-field views, or ``None`` to derive them) at ring
        ``slots`` (shape (T,), consecutive modulo capacity)."""

    @abstractmethod
    def gather(
        self, indices: np.ndarray, out_block: np.ndarray | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        """Rows at ``indices`` (shape (B,), int64, in range): per field, per agent, arrays of
        shape (B, *shape) viewing one block, and that block. ``out_block`` (already checked by
        :meth:`check_out_block`) is overwritten instead of taking a block from the pool."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The storage arrays by name (views, for saving)."""

    @abstractmethod
    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        """Read-only view of one agent's field over slots ``[0, count)``."""


class AgentMajorStorage(Storage):
    """Per agent, per field, one ``(capacity, *shape)`` array (page-aligned)."""

    layout = "agent_major"

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
        batch_layout: str = "rows",
    ) -> None:
        super().__init__(specs, capacity, pool_blocks, codec, batch_layout)
        self.batch_layout = "per_agent"  # the only way this layout gathers
        total = sum(
            capacity * math.prod(spec.shape(f)) * spec.dtype(f).itemsize
            for spec in self.specs.values()
            for f in FIELDS
        )
        check_fits_in_memory(total, f"agent_major storage for capacity={capacity}")
        self._data: dict[str, dict[str, np.ndarray]] = {
            f: {
                agent: aligned_empty(
                    (capacity, *spec.shape(f)), spec.dtype(f), _config.ARRAY_ALIGN_BYTES
                )
                for agent, spec in self.specs.items()
            }
            for f in FIELDS
        }
        # (field, agent, 2-D source view) for the gather loop, built once
        self._flat = [
            (f, a, arr.reshape(capacity, -1)) for f in FIELDS for a, arr in self._data[f].items()
        ]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for per_agent in self._data.values() for a in per_agent.values())

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        if views is None:
            views = self.codec.views(rows)
        ranges = _ring_ranges(slots)
        for f in FIELDS:
            for agent, dst in self._data[f].items():
                src = views[f][agent]
                for lo, hi, s0 in ranges:
                    dst[lo:hi] = src[s0 : s0 + (hi - lo)]

    def gather(
        self, indices: np.ndarray, out_block: np.ndarray | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        n = indices.shape[0]
        block = self._new_block(n) if out_block is None else out_block
        out = self._carve(block, n)
        for field_name, agent, src in self._flat:
            dst = out[field_name][agent]
            self._gather_kernel(dst.nbytes)(src, indices, dst.reshape(n, -1))
        return out, block

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"{f}/{a}": arr for f in FIELDS for a, arr in self._data[f].items()}

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        view = self._data[field_name][agent][:count]
        view.flags.writeable = False
        return view


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
        batch_layout: str = "rows",
    ) -> None:
        super().__init__(specs, capacity, pool_blocks, codec, batch_layout)
        self.row_bytes = self.codec.row_bytes
        self.row_words = self.codec.row_words
        check_fits_in_memory(
            capacity * self.row_bytes, f"interleaved storage for capacity={capacity}"
        )
        self.table = aligned_empty(
            (capacity, self.row_words), np.dtype(np.uint64), _config.ARRAY_ALIGN_BYTES
        )
        # per_agent gathers: byte offset and length of every (field, agent) inside a row, in
        # the carving's order (FIELDS x agents, the same order as the codec's slots)
        slots = {(fs.field, fs.agent): fs for fs in self.codec.slots}
        order = [slots[(f, a)] for f in FIELDS for a in self.specs]
        self._seg_src = np.array([fs.offset for fs in order], dtype=np.int64)
        self._seg_len = np.array([fs.nbytes for fs in order], dtype=np.int64)
        self._seg_dst: dict[int, np.ndarray] = {}
        self._seg_unit: tuple[np.dtype, np.ndarray, np.ndarray] = (
            np.dtype(np.uint8),
            self._seg_src,
            self._seg_len,
        )

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        scatter_rows(self.table, slots, rows)

    def gather(
        self, indices: np.ndarray, out_block: np.ndarray | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        n = indices.shape[0]
        block = self._new_block(n) if out_block is None else out_block
        if self.batch_layout == "rows":
            self._gather_kernel(block.nbytes)(self.table, indices, block)
            return self.codec.views(block), block
        if n not in self._seg_dst:
            layout, _ = self._carving(n)
            dst = np.array([entry[2] for entry in layout], dtype=np.int64)
            # copy in the widest word that divides every offset and length (4 bytes for
            # float32 fields): byte loops over short segments do not vectorize
            unit = 8
            while any(int(x) % unit for x in (*self._seg_src, *self._seg_len, *dst)):
                unit //= 2
            self._seg_dst = {n: dst // unit}
            self._seg_unit = (np.dtype(f"u{unit}"), self._seg_src // unit, self._seg_len // unit)
        word, seg_src, seg_len = self._seg_unit
        gather_segments(
            self.table.view(word), indices, seg_src, self._seg_dst[n], seg_len, block.view(word)
        )
        return self._carve(block, n), block

    def arrays(self) -> dict[str, np.ndarray]:
        return {"table": self.table}

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        view = self.codec.views(self.table[:count])[field_name][agent]
        view.flags.writeable = False
        return view


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
    batch_layout: str = "rows",
) -> Storage:
    """Build the storage for ``layout`` (``"interleaved"`` or ``"agent_major"``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}; got layout={layout!r}")
    return LAYOUTS[layout](specs, capacity, pool_blocks, codec, batch_layout)
