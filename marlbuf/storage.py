"""Storage layouts: where the transitions live and how a batch of slots is gathered.

Two layouts hold the same data and return the same batches, bit for bit:

* :class:`AgentMajorStorage` — per agent, per field, one preallocated array (the layout of
  openai/maddpg, SB3, cpprb): a joint batch of N agents costs 5N small gathers.
* :class:`InterleavedStorage` — one 2-D table ``[capacity, row_bytes]``; a row holds every
  agent's fields for one timestep (key-value layout, Gogineni et al. Sec. 5.3), so a joint batch
  is one gather of wide rows.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import (
    HALF_TO_FLOAT_BITS,
    gather_lean_rows,
    gather_next_field,
    gather_rows,
    gather_rows_parallel,
    gather_segments,
    gather_spans,
    gather_words,
    scatter_lean,
    scatter_rows,
)
from marlbuf._kernels.plan import COPY8, COPY32, COPY64, HALF_TO_FLOAT
from marlbuf.batch import Batch, NotGathered, as_sequences
from marlbuf.spec import ALIVE, FIELDS, GLOBAL, AgentSpec, FieldSlot, FieldSpec
from marlbuf.staging import RowCodec, RowViews
from marlbuf.writer import NextObsLinks


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose first byte sits on an ``alignment``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)


#: ``allocate(name, shape, dtype)`` returns a new, page-aligned, writeable C-ordered storage array
#: (``name`` is its key in :meth:`Storage.arrays`); memory-mapped buffers pass one that maps files
Allocator = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]


def allocate_in_memory(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The default :data:`Allocator`: :func:`aligned_empty` on a page boundary."""
    return aligned_empty(shape, dtype, _config.ARRAY_ALIGN_BYTES)


_BYTES = np.dtype(np.uint8)


class _Lease:
    """The owner of one pooled block while a batch uses it.

    Every array handed out for a batch is a view whose ``base`` chain ends at a lease (NumPy
    collapses view chains to the first object that is not an array), and ``torch.from_numpy``,
    DLPack capsules and ``memoryview`` all keep that chain alive. So the lease is destroyed
    exactly when nothing can reach the block's memory any more, and its ``__del__`` hands the
    block back to the pool. No interpreter reference-count constant is involved. The lease
    keeps the raw memory alive itself, so a batch outlives its buffer safely.
    """

    __slots__ = ("__array_interface__", "__weakref__", "_pool", "_raw", "_token")

    def __init__(
        self,
        raw: np.ndarray,
        address: int,
        nbytes: int,
        pool: BlockPool,
        token: int,
        dtype: np.dtype = _BYTES,
        shape: tuple[int, ...] | None = None,
    ):
        self._raw = raw
        self._pool = pool
        self._token = token
        self.__array_interface__ = {
            "data": (address, False),
            "shape": (nbytes,) if shape is None else shape,
            "typestr": dtype.str,
            "version": 3,
        }

    def __del__(self) -> None:
        self._pool._release(self._token)


class BlockPool:
    """Recycles gathered-batch memory once nobody references it any more.

    A fresh output block of a MADDPG round at N = 24 is 29 MB; allocating it anew for each
    batch costs more than the gather itself (the kernel first faults in every new page). A
    block is handed out wrapped in a :class:`_Lease`; when the last view of it dies, the lease
    marks the block free. Blocks still referenced are never touched: correctness does not
    depend on the caller dropping batches, only the speed does. At most ``max_blocks`` blocks
    are kept; beyond that a new block is allocated and the oldest is forgotten (it stays valid
    for whoever still holds it).
    """

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        # (token, raw uint8 memory, address of its first 64-byte-aligned byte)
        self._blocks: list[tuple[int, np.ndarray, int]] = []
        self._busy: set[int] = set()  # tokens of blocks some batch still references
        self._next_token = 0  # tokens are never reused (ids of freed arrays may be)
        # a lease may die in any thread, also inside acquire (a garbage collection started by
        # an allocation there): re-entrant, so that such a release cannot deadlock
        self._lock = threading.RLock()

    def _release(self, token: int) -> None:
        with self._lock:
            self._busy.discard(token)

    def acquire(
        self, nbytes: int, dtype: np.dtype = _BYTES, shape: tuple[int, ...] | None = None
    ) -> np.ndarray:
        """A 64-byte-aligned array of ``nbytes`` that no one else references: ``uint8`` of
        shape ``(nbytes,)``, or of ``dtype`` and ``shape`` (which must cover ``nbytes``
        exactly) when given."""
        align = _config.ROW_ALIGN_BYTES
        with self._lock:
            chosen: tuple[int, np.ndarray, int] | None = None
            for block in self._blocks:
                if block[1].nbytes == nbytes + align and block[0] not in self._busy:
                    chosen = block
                    break
            if chosen is None:
                raw = np.empty(nbytes + align, dtype=np.uint8)
                address = raw.ctypes.data
                chosen = (self._next_token, raw, address + (-address) % align)
                self._next_token += 1
                self._blocks.append(chosen)
                if len(self._blocks) > self.max_blocks:
                    # forget the oldest: it stays valid for its holder, it is just not recycled
                    forgotten = self._blocks.pop(0)[0]
                    self._busy.discard(forgotten)
            token, raw, address = chosen
            self._busy.add(token)
        return np.asarray(_Lease(raw, address, nbytes, self, token, dtype, shape))


def available_memory_bytes() -> int | None:
    """The memory this process may still allocate, or ``None`` where unknown: the least of
    ``MemAvailable`` (``/proc/meminfo``, Linux), what the process's address-space and data
    limits (``RLIMIT_AS``, ``RLIMIT_DATA``) leave above its current size, and what its cgroup's
    ``memory.max`` leaves above ``memory.current``."""
    limits = [_meminfo("MemAvailable"), *_rlimit_headroom(), _cgroup_headroom()]
    known = [limit for limit in limits if limit is not None]
    return max(0, min(known)) if known else None


def _meminfo(key: str, path: str = "/proc/meminfo") -> int | None:
    """A ``kB`` value of ``/proc/meminfo`` (or ``/proc/self/status``), in bytes."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def copy_options(row_bytes: int, out_nbytes: int) -> tuple[int, int, bool]:
    """The copy settings of a row gather (:func:`marlbuf._kernels.gather_words` and the other
    row kernels): rows prefetched ahead of the one copied and lines per row
    (``_config.PREFETCH_AHEAD_BYTES``, ``PREFETCH_LINES``), and whether a block of
    ``out_nbytes`` is written with streaming stores (``_config.STREAMING_STORE_MIN_BYTES``)."""
    ahead = max(1, -(-_config.PREFETCH_AHEAD_BYTES // max(1, row_bytes)))
    return ahead, _config.PREFETCH_LINES, out_nbytes >= _config.STREAMING_STORE_MIN_BYTES


def _rlimit_headroom() -> list[int | None]:
    """Bytes left under ``RLIMIT_AS`` (above ``VmSize``) and ``RLIMIT_DATA`` (above
    ``VmData``); ``None`` where there is no limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return []
    out: list[int | None] = []
    for name, used in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        limit = getattr(resource, name, None)
        soft = resource.getrlimit(limit)[0] if limit is not None else resource.RLIM_INFINITY
        if soft == resource.RLIM_INFINITY:
            out.append(None)
            continue
        size = _meminfo(used, "/proc/self/status")
        out.append(None if size is None else soft - size)
    return out


def _cgroup_headroom() -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (version 2), if limited."""
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((line.strip()[3:] for line in fh if line.startswith("0::")), None)
        if path is None:
            return None
        folder = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(folder, "memory.max")) as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(folder, "memory.current")) as fh:
            return int(limit) - int(fh.read().strip())
    except (OSError, ValueError):
        return None


def ring_ranges(slots: np.ndarray) -> list[tuple[int, int, int]]:
    """Split consecutive ring slots into ``(dst_start, dst_stop, src_start)`` slices (at most 2)."""
    first, count = int(slots[0]), int(slots.shape[0])
    capacity_wrap = int(slots[-1]) < first  # the run passed the end of the ring
    if not capacity_wrap:
        return [(first, first + count, 0)]
    head = int(np.argmin(slots))  # position where the slots wrapped to 0
    return [(first, first + head, 0), (0, count - head, head)]


BATCH_LAYOUTS = ("rows", "per_agent")
#: ``"float32"``: half-precision fields are converted inside the gather; ``"storage"``: batches
#: keep the stored dtypes (convert on the device)
BATCH_DTYPES = ("float32", "storage")


def _widened(spec: AgentSpec) -> AgentSpec:
    """``spec`` with every float16 field (extras included) as float32 (the dtypes of float32
    batches)."""
    half = np.dtype(np.float16)
    wide: dict[str, Any] = {
        name: np.dtype(np.float32)
        for name in ("obs_dtype", "action_dtype", "reward_dtype", "done_dtype")
        if getattr(spec, name) == half
    }
    if any(fs.dtype == half for fs in spec.extras.values()):
        wide["extras"] = _widened_fields(spec.extras)
    return dataclasses.replace(spec, **wide) if wide else spec


def _widened_fields(fields: Mapping[str, FieldSpec]) -> dict[str, FieldSpec]:
    """``fields`` with float16 ones as float32."""
    half = np.dtype(np.float16)
    return {
        name: FieldSpec(fs.shape, np.float32) if fs.dtype == half else fs
        for name, fs in fields.items()
    }


def build_plan(
    stored: list[FieldSlot],
    obs_slots: dict[str, FieldSlot],
    targets: list[tuple[str, str, int, int, np.dtype]],
    once: bool,
) -> np.ndarray:
    """The segments of :func:`marlbuf._kernels.gather_plan` for one storage/batch pairing.

    Parameters
    ----------
    stored : list of FieldSlot
        Where every stored (field, agent) sits in a stored row.
    obs_slots : dict
        Per agent, its obs slot in a stored row (the source of next_obs when ``once``).
    targets : list of (field, agent, destination byte offset of row 0, byte step per row, dtype)
        Where every (field, agent) of the batch goes.
    once : bool
        Observations stored once: next_obs segments read the successor's obs section.

    Returns
    -------
    ndarray, shape (6, n_segments), int64
        Rows: kind, src, dst, len, step, from_next (units per kind, see ``gather_plan``).
    Adjacent segments of the same kind and source are merged (padding gaps of up to 7 bytes
    that are equal in source and destination are copied along), so a rows batch of a lean
    table is three or four copies per row.
    """
    by_key = {(fs.field, fs.agent): fs for fs in stored}
    raw = []  # (is_half, from_next, src byte, dst byte, nbytes or elements, step bytes)
    for field_name, agent, dst, step, dtype in targets:
        from_next = once and field_name == "next_obs"
        fs = obs_slots[agent] if from_next else by_key[(field_name, agent)]
        half = fs.dtype == np.float16 and dtype == np.float32
        raw.append(
            [half, from_next, fs.offset, dst, fs.nbytes, step, fs.nbytes // fs.dtype.itemsize]
        )
    merged: list[list[Any]] = []
    for seg in raw:
        if merged:
            last = merged[-1]
            same = last[0] == seg[0] and last[1] == seg[1] and last[5] == seg[5]
            src_gap = seg[2] - (last[2] + last[4])
            if last[0]:  # half: contiguous elements only, destination in float32 units
                dst_gap = seg[3] - (last[3] + 2 * last[4])
                if same and src_gap == 0 and dst_gap == 0:
                    last[4] += seg[4]
                    last[6] += seg[6]
                    continue
            else:
                dst_gap = seg[3] - (last[3] + last[4])
                if same and src_gap == dst_gap and 0 <= src_gap < 8:
                    last[4] += src_gap + seg[4]
                    continue
        merged.append(list(seg))
    plan = []
    for half, from_next, src, dst, nbytes, step, elements in merged:
        if half:
            plan.append((HALF_TO_FLOAT, src // 2, dst // 4, elements, step // 4, int(from_next)))
            continue
        for kind, unit in ((COPY64, 8), (COPY32, 4), (COPY8, 1)):
            if not (src % unit or dst % unit or nbytes % unit or step % unit):
                plan.append(
                    (kind, src // unit, dst // unit, nbytes // unit, step // unit, int(from_next))
                )
                break
    return np.array(plan, dtype=np.int64).T.copy()


class RowViewPlan:
    """Per-field, per-agent strided views of gathered rows, made by indexing.

    The block of a rows batch is viewed once per dtype present (``rows.view(np.float32)``:
    shape ``(n, row_bytes // 4)``), and each (field, agent) array is a prebuilt basic index of
    that view: ``typed[:, 5]`` for a scalar, ``typed[:, 20:38]`` for a vector (reshaped for
    items of more dimensions). Indexing with a prebuilt key costs about a quarter of an
    ``np.ndarray(shape, dtype, buffer, offset, strides)`` construction, and a MADDPG batch
    makes five such arrays per agent. The views are those of
    :meth:`marlbuf.staging.RowCodec.views`: the same shapes, strides and memory, and their base
    chain ends where the block's does.

    Parameters
    ----------
    slots : sequence of FieldSlot
        Where each (field, agent) sits in a row (byte offsets).
    field_names : sequence of str
        The keys of the returned dict, in order.
    row_bytes : int
        Bytes per row (a multiple of 8).
    """

    def __init__(self, slots: Sequence[FieldSlot], field_names: Sequence[str], row_bytes: int):
        self.field_names = tuple(field_names)
        #: (field, agent) of every slot, in slot order (the order of the returned dicts)
        self._keys = [(fs.field, fs.agent) for fs in slots]
        by_dtype: dict[np.dtype, list[tuple[int, Any, tuple[int, ...] | None]]] = {}
        #: slots that indexing cannot express (an item size that does not divide the row or the
        #: offset): built by one ``np.ndarray`` call each
        self._direct: list[tuple[int, int, tuple[int, ...], np.dtype, tuple[int, ...]]] = []
        for position, fs in enumerate(slots):
            size = fs.dtype.itemsize
            if row_bytes % size or fs.offset % size:
                self._direct.append((position, fs.offset, fs.shape, fs.dtype, _item_strides(fs)))
                continue
            first = fs.offset // size
            key: Any = (
                (slice(None), first)
                if fs.shape == ()
                else (slice(None), slice(first, first + math.prod(fs.shape)))
            )
            inner = fs.shape if len(fs.shape) > 1 else None
            by_dtype.setdefault(fs.dtype, []).append((position, key, inner))
        self._by_dtype = list(by_dtype.items())

    def views(self, rows: np.ndarray) -> RowViews:
        """The views of ``rows`` (shape (n, row_words), uint64, C-contiguous)."""
        n = rows.shape[0]
        made: list[Any] = [None] * len(self._keys)
        for dtype, items in self._by_dtype:
            typed = rows.view(dtype)
            for position, key, inner in items:
                view = typed[key]
                made[position] = view if inner is None else view.reshape((n, *inner))
        if self._direct:
            row_bytes = rows.shape[1] * rows.itemsize
            for position, offset, shape, dtype, strides in self._direct:
                made[position] = np.ndarray((n, *shape), dtype, rows, offset, (row_bytes, *strides))
        out: RowViews = {f: {} for f in self.field_names}
        for (field_name, agent), view in zip(self._keys, made):
            out[field_name][agent] = view
        return out


class FieldSelection:
    """The fields one batch gathers (``fields=`` of ``sample``/``gather``/...): a restricted
    row format, described as :class:`marlbuf.staging.RowCodec` describes the full one.

    The chosen (field, agent) slots keep the batch codec's order (field-major, agents in spec
    order, then globals and the alive mask), each at the first offset with the alignment its
    full row gives it modulo 8 bytes (so its itemsize too): fields that were neighbours in the
    stored row stay neighbours at the same word phase, and the gather plan merges them into one
    copy. A row is padded to whole 8-byte words only, so a batch of a few fields holds (and
    copies) only their bytes.
    ``batch_layout="rows"`` batches are rows of this format, ``"per_agent"`` batches carve the
    chosen arrays only, each on a cache line.

    A storage that keeps no next observations (``next_obs="none"``) gathers every batch as a
    selection: its default one holds every field but ``next_obs``, padded like a table row.

    Parameters
    ----------
    codec : RowCodec
        The row format of full batches (the storage's ``batch_codec``).
    names : tuple of str
        The chosen field names, in ``codec.field_names`` order, not all of them.
    not_stored : tuple of str, default ()
        Fields of ``codec`` the storage does not keep (``("next_obs",)`` for
        ``next_obs="none"``): left out of every selection, and named as not stored (not as
        left out by ``fields=``) when a batch's user reaches for them.
    row_align : int, default 8
        A row's width is padded to a multiple of this many bytes (a multiple of 8).
    """

    def __init__(
        self,
        codec: RowCodec,
        names: tuple[str, ...],
        not_stored: tuple[str, ...] = (),
        row_align: int = 8,
    ) -> None:
        self.names = names
        #: the names of ``codec`` that batches of this selection leave out
        self.left_out = tuple(f for f in codec.field_names if f not in names)
        #: the left-out names the storage does not keep at all
        self.not_stored = tuple(f for f in not_stored if f in self.left_out)
        self.agents = list(codec.agents)
        self.field_names = names
        self.extra_names = tuple(n for n in codec.extra_names if n in names)
        self.global_fields = {n: fs for n, fs in codec.global_fields.items() if n in names}
        self.alive = codec.alive and ALIVE in names
        self.slots: list[FieldSlot] = []
        offset = 0
        for fs in codec.slots:
            if fs.field in names:
                unit = max(8, fs.dtype.itemsize)
                offset += (fs.offset - offset) % unit  # the full row's phase within a word
                self.slots.append(dataclasses.replace(fs, offset=offset))
                offset += fs.nbytes
        # whole words (the block is uint64 rows), or whole cache lines as a table row is padded
        self.row_bytes = max(row_align, -(-offset // row_align) * row_align)
        self.row_words = self.row_bytes // 8
        # a selection's rows are never lean (duck-typed for the torch store's RowLayout)
        self.lean_slots, self.lean_row_bytes = self.slots, self.row_bytes
        self._view_plan = RowViewPlan(self.slots, self.field_names, self.row_bytes)

    def not_gathered(self, name: str) -> NotGathered:
        """What stands in a batch of this selection for the left-out field ``name``."""
        return NotGathered(name, self.names, name not in self.not_stored)

    def views(self, rows: np.ndarray) -> RowViews:
        """Per chosen field, per agent, strided views of ``rows`` (shape (n, row_words),
        uint64, C-contiguous): see :class:`RowViewPlan`."""
        return self._view_plan.views(rows)

    def carving(self, n: int) -> tuple[list[tuple[str, str, int, int, np.dtype, tuple]], int]:
        """Per-agent arrays of an ``n``-row per-agent batch: ``(field, agent, byte offset,
        nbytes, dtype, shape)``, each on a cache line, and the block's size in bytes."""
        align = _config.ROW_ALIGN_BYTES
        layout, offset = [], 0
        for fs in self.slots:
            nbytes = n * fs.nbytes
            layout.append((fs.field, fs.agent, offset, nbytes, fs.dtype, (n, *fs.shape)))
            offset += -(-nbytes // align) * align
        return layout, max(offset, align)


def _item_strides(fs: FieldSlot) -> tuple[int, ...]:
    """C-order strides of one item of the slot ``fs`` (shape ``fs.shape``, ``fs.dtype``)."""
    strides, step = [], fs.dtype.itemsize
    for size in reversed(fs.shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def check_fields(fields: Any, names: tuple[str, ...]) -> tuple[str, ...] | None:
    """``fields`` (the ``fields=`` argument: ``None`` or a tuple of field names) as the chosen
    names in ``names`` order, or ``None`` for every field (also when all are chosen).

    Raises
    ------
    TypeError
        ``fields`` is not ``None``, a tuple or a list of strings.
    ValueError
        It is empty, or names a field that ``names`` (the buffer's fields) does not hold.
    """
    if fields is None:
        return None
    if not isinstance(fields, (tuple, list)) or not all(isinstance(f, str) for f in fields):
        raise TypeError(
            f"fields must be None or a tuple of field names, e.g. fields=('obs', 'action'); "
            f"got fields={fields!r}"
        )
    unknown = [f for f in fields if f not in names]
    if unknown or not fields:
        raise ValueError(
            f"fields must name at least one of this buffer's fields {names}; got "
            f"fields={tuple(fields)!r}" + (f" (unknown: {unknown})" if unknown else "")
        )
    chosen = tuple(f for f in names if f in fields)
    return None if len(chosen) == len(names) else chosen


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

    ``stores_next_obs=False`` (``next_obs="none"``): the rows hold no next observations (the
    lean row of observations stored once, without links or side table), and every batch is
    gathered as :attr:`default_select`, the :class:`FieldSelection` of every other field: its
    ``next_obs`` is a :class:`marlbuf.batch.NotGathered` that names ``next_obs="none"``.
    """

    #: whether ``gather`` accepts the index -1 and writes zeros there (else every index must be
    #: a filled slot)
    zero_fills = False

    layout: str = ""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
        batch_layout: str = "rows",
        links: NextObsLinks | None = None,
        batch_dtype: str = "float32",
        allocate: Allocator | None = None,
        *,
        stores_next_obs: bool = True,
    ) -> None:
        self.specs = dict(specs)
        #: makes the storage arrays (in memory, or mapped files: see :mod:`marlbuf.mapped`)
        self.allocate = allocate if allocate is not None else allocate_in_memory
        #: observations stored once when set (see :class:`marlbuf.writer.NextObsLinks`)
        self.links = links
        if links is not None and not stores_next_obs:
            raise ValueError("a storage without next observations has no next-observation links")
        #: whether rows hold next observations (or their links); ``False``: ``next_obs="none"``
        self.stores_next_obs = bool(stores_next_obs)
        #: whether stored rows are lean (no next_obs section): stored once, or not at all
        self.lean = links is not None or not stores_next_obs
        if batch_dtype not in BATCH_DTYPES:
            raise ValueError(
                f"batch_dtype must be one of {BATCH_DTYPES}; got batch_dtype={batch_dtype!r}"
            )
        self.batch_dtype = batch_dtype
        self.capacity = int(capacity)
        self.pool = BlockPool(pool_blocks)  # recycled memory for gathered batches
        self.parallel_gather = False  # opt-in: threads for large gathers (see _gather_kernel)
        #: the row format: per-agent fields, then global fields and the alive mask
        self.codec = codec if codec is not None else RowCodec(self.specs)
        #: the specs of gathered batches: half-precision fields become float32 unless batches
        #: are delivered in storage precision
        self.batch_specs = (
            {a: _widened(spec) for a, spec in self.specs.items()}
            if batch_dtype == "float32"
            else dict(self.specs)
        )
        batch_globals = (
            _widened_fields(self.codec.global_fields)
            if batch_dtype == "float32"
            else dict(self.codec.global_fields)
        )
        self.converts = self.batch_specs != self.specs or batch_globals != self.codec.global_fields
        #: the row format of gathered batches (``batch_layout="rows"``)
        self.batch_codec = (
            RowCodec(self.batch_specs, batch_globals, self.codec.alive)
            if self.converts
            else self.codec
        )
        if batch_layout not in BATCH_LAYOUTS:
            raise ValueError(
                f"batch_layout must be one of {BATCH_LAYOUTS}; got batch_layout={batch_layout!r}"
            )
        self.batch_layout = batch_layout
        self._carvings: dict[int, tuple[list[tuple[str, str, int, int, np.dtype, tuple]], int]] = {}
        self._selections: dict[tuple[str, ...], FieldSelection] = {}
        self._not_stored: tuple[str, ...] = () if stores_next_obs else ("next_obs",)
        #: the fields batches can hold (``fields=`` chooses among them): every field of a row,
        #: ``next_obs`` only where it is stored
        self.field_names = tuple(
            f for f in self.batch_codec.field_names if f not in self._not_stored
        )
        #: what a batch gathers without ``fields=``: ``None`` (every field, the default
        #: gathers) or, without next observations, the selection of every stored field, padded
        #: like a table row
        self.default_select = (
            None
            if stores_next_obs
            else FieldSelection(
                self.batch_codec, self.field_names, self._not_stored, _config.ROW_ALIGN_BYTES
            )
        )
        #: whether a batch row is a table row, byte for byte (one word copy per row)
        self.rows_are_batch_rows = not self.converts and (
            not self.lean
            or (
                self.default_select is not None
                and self.default_select.row_bytes == self.codec.lean_row_bytes
                and [(fs.field, fs.agent, fs.offset) for fs in self.default_select.slots]
                == [(fs.field, fs.agent, fs.offset) for fs in self.codec.lean_slots]
            )
        )
        #: the views of a rows batch of every field (see :class:`RowViewPlan`)
        self._row_views = RowViewPlan(
            self.batch_codec.slots, self.batch_codec.field_names, self.batch_codec.row_bytes
        )
        #: agents whose actions are one-hot (``AgentSpec(n_discrete_actions=K)``): their
        #: batches offer ``action_index``
        self.discrete_agents = tuple(
            a for a, spec in self.specs.items() if spec.n_discrete_actions is not None
        )

    def selection(self, names: tuple[str, ...]) -> FieldSelection:
        """The :class:`FieldSelection` of the chosen ``names`` (checked by
        :func:`check_fields`), built once per choice."""
        found = self._selections.get(names)
        if found is None:
            if len(self._selections) >= _config.MAX_FIELD_SELECTIONS:
                self._selections.clear()  # a learner uses a few choices; bound the cache
            found = self._selections[names] = FieldSelection(
                self.batch_codec, names, self._not_stored
            )
        return found

    def _gather_kernel(self, out_nbytes: int) -> Any:
        """The serial kernel, or the threaded one when opted in and the output is large."""
        if self.parallel_gather and out_nbytes >= _config.PARALLEL_GATHER_MIN_BYTES:
            return gather_rows_parallel
        return gather_rows

    def _gather_table_rows(self, table: np.ndarray, indices: np.ndarray, block: np.ndarray) -> None:
        """``block[i] = table[indices[i]]`` (uint64 rows of one width; -1: zeros): the
        threaded kernel when opted in and the block is large, else :func:`gather_words`."""
        if self.parallel_gather and block.nbytes >= _config.PARALLEL_GATHER_MIN_BYTES:
            gather_rows_parallel(table, indices, block)
            return
        gather_words(table, indices, block, *copy_options(table.shape[1] * 8, block.nbytes))

    def _carving(self, n: int) -> tuple[list[tuple[str, str, int, int, np.dtype, tuple]], int]:
        """Per-agent output arrays of an ``n``-row batch inside one block: ``(field, agent,
        byte offset, nbytes, dtype, shape)`` each starting on a cache line, and the total."""
        if n not in self._carvings:
            align = _config.ROW_ALIGN_BYTES
            layout, offset = [], 0
            # in row order: field-major, agents in spec order, then globals and alive
            for fs in self.batch_codec.slots:
                nbytes = n * fs.nbytes
                layout.append((fs.field, fs.agent, offset, nbytes, fs.dtype, (n, *fs.shape)))
                offset += -(-nbytes // align) * align  # every array starts on a cache line
            self._carvings = {n: (layout, offset)}  # keep one: batch sizes rarely vary
        return self._carvings[n]

    def _carve(self, block: np.ndarray, n: int) -> dict[str, dict[str, np.ndarray]]:
        layout, _ = self._carving(n)
        out: dict[str, dict[str, np.ndarray]] = {f: {} for f in self.batch_codec.field_names}
        for field_name, agent, offset, nbytes, dtype, shape in layout:
            out[field_name][agent] = block[offset : offset + nbytes].view(dtype).reshape(shape)
        return out

    def block_spec(
        self, n: int, select: FieldSelection | None = None
    ) -> tuple[np.dtype, tuple[int, ...]]:
        """dtype and shape of the memory block that holds an ``n``-row batch (of the fields of
        ``select``, or every field: :attr:`default_select`'s)."""
        if select is None:
            select = self.default_select
        if self.layout == "interleaved" and self.batch_layout == "rows":
            words = self.batch_codec.row_words if select is None else select.row_words
            return np.dtype(np.uint64), (n, words)
        if select is not None:
            return np.dtype(np.uint8), (select.carving(n)[1],)
        return np.dtype(np.uint8), (self._carving(n)[1],)

    def check_out_block(self, block: Any, n: int, select: FieldSelection | None = None) -> Any:
        """``block`` (the ``block`` of a batch passed as ``out=``) if this storage can gather
        ``n`` rows (of the fields of ``select``) into it, else a ``ValueError`` that says what
        differs.

        The check is what keeps ``out=`` memory-safe: the kernels trust their output's size.
        """
        dtype, shape = self.block_spec(n, select)
        if not isinstance(block, np.ndarray):
            raise ValueError(
                "out must be a Batch returned by this buffer's sample/gather (it has no "
                f"gathered block); got block={type(block).__name__}"
            )
        if block.dtype != dtype or block.shape != shape:
            raise ValueError(
                f"out holds a block of shape {block.shape} dtype {block.dtype}, but a batch of "
                f"{n} rows of this buffer needs shape {shape} dtype {dtype}: pass a batch of the "
                "same size and fields= from this buffer (same specs, layout and batch_layout), "
                "or no out="
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
        if self.default_select is not None:
            return self._select_views(block, n, self.default_select)
        if self.layout == "interleaved" and self.batch_layout == "rows":
            return self._row_views.views(block)
        return self._carve(block, n)

    def _select_views(
        self, block: np.ndarray, n: int, select: FieldSelection
    ) -> dict[str, dict[str, np.ndarray]]:
        """The per-field, per-agent arrays of an ``n``-row batch of ``select``'s fields held in
        ``block``: strided views of its rows, or the arrays carved from it."""
        if self.layout == "interleaved" and self.batch_layout == "rows":
            return select.views(block)
        out: dict[str, dict[str, np.ndarray]] = {f: {} for f in select.field_names}
        for field_name, agent, offset, nbytes, dtype, shape in select.carving(n)[0]:
            out[field_name][agent] = block[offset : offset + nbytes].view(dtype).reshape(shape)
        return out

    def _new_block(self, n: int, select: FieldSelection | None = None) -> np.ndarray:
        dtype, shape = self.block_spec(n, select)
        return self.pool.acquire(math.prod(shape) * dtype.itemsize, dtype, shape)

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
        self, indices: np.ndarray, out_block: Any = None, select: FieldSelection | None = None
    ) -> tuple[dict[str, dict[str, Any]], Any]:
        """Rows at ``indices`` (shape (B,), int64, in range): per field, per agent, arrays of
        shape (B, *shape) viewing one block, and that block. ``out_block`` (already checked by
        :meth:`check_out_block`) is overwritten instead of taking a block from the pool.
        ``select`` gathers only its fields (into a block of its format); ``None``: every field
        (the default gathers, untouched by selections)."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The storage arrays by name (views, for saving; a device store gives host copies)."""

    def check_saved(self, saved: Mapping[str, Any], size: int) -> None:
        """A ``ValueError`` unless ``saved`` (a state's ``"storage"``) holds exactly this
        storage's arrays (:meth:`arrays`), each with ``size`` rows of its shape and dtype."""
        arrays = self.arrays()
        if set(saved) != set(arrays):
            raise ValueError(
                f"state_dict storage arrays {sorted(saved)} do not match this layout's "
                f"{sorted(arrays)}"
            )
        for key, dst in arrays.items():
            src = np.asarray(saved[key])
            if src.shape != (size, *dst.shape[1:]) or src.dtype != dst.dtype:
                raise ValueError(
                    f"state_dict storage array {key!r} has shape {src.shape} dtype {src.dtype}; "
                    f"expected {(size, *dst.shape[1:])} {dst.dtype}"
                )

    def restore(self, arrays: Mapping[str, Any], size: int) -> None:
        """Write the filled part ``[0, size)`` of saved storage ``arrays`` (checked against
        :meth:`arrays` by the caller) into this storage; arrays that are already the storage's
        own memory (a load that read straight into it) are left alone."""
        if size == 0:
            return  # nothing to write (and a read-only store's arrays must not be touched)
        for key, dst in self.arrays().items():
            src = arrays[key]
            if not np.shares_memory(dst, src):
                dst[:size] = src

    def to_host_later(self, values: Any) -> Callable[[], np.ndarray]:
        """Start copying ``values`` (a torch tensor) to the host; the returned function gives
        the host array, waiting for the copy if it is still running (here: copied at once, so
        that a caller reusing its tensor does not change the update)."""
        host = np.array(values.detach().cpu().numpy())
        return lambda: host

    def block_address(self, block: Any) -> int:
        """Where a gathered ``block`` starts in memory (tells distinct ``out=`` blocks apart)."""
        return int(block.__array_interface__["data"][0])

    def make_batch(
        self,
        fields: Mapping[str, Any],
        block: Any,
        indices: np.ndarray,
        generations: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        select: FieldSelection | None = None,
    ) -> Any:
        """The batch of one :meth:`gather` (``fields`` and ``block`` as it returned them) at
        ``indices`` (shape (B,), a :class:`marlbuf.batch.DrawnIndices`) drawn at
        ``generations``, with importance ``weights`` (shape (B,), float32, or ``None``);
        ``select`` as given to the gather (left-out fields are :class:`NotGathered`)."""
        codec = self.batch_codec
        more: dict[str, Any] = {}
        if select is None:
            select = self.default_select
        if select is not None:
            absent = {
                name: select.not_gathered(name) for name in (*FIELDS, ALIVE) if name not in fields
            }
            more = {
                "extras": {name: fields[name] for name in select.extra_names},
                "globals": {name: fields[name][GLOBAL] for name in select.global_fields},
                "alive": fields[ALIVE] if select.alive else None,
                "gathered_fields": select.names,
            }
            if codec.alive and not select.alive:
                more["alive"] = absent[ALIVE]
            fields = {**{f: absent.get(f) for f in FIELDS}, **fields}
        elif codec.more:
            more = {
                "extras": {name: fields[name] for name in codec.extra_names},
                "globals": {name: fields[name][GLOBAL] for name in codec.global_fields},
                "alive": fields[ALIVE] if codec.alive else None,
            }
        if self.discrete_agents:
            more["discrete_agents"] = self.discrete_agents
        return Batch(
            obs=fields["obs"],
            action=fields["action"],
            reward=fields["reward"],
            next_obs=fields["next_obs"],
            done=fields["done"],
            indices=indices,
            generations=generations,
            weights=weights,
            trainer=trainer,
            block=block,
            **more,
        )

    def make_sequences(
        self,
        flat: Any,
        mask: np.ndarray,
        burn_in: int,
        slots: np.ndarray,
        indices: np.ndarray,
        generations: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        zeroed: bool,
    ) -> Any:
        """The sequence batch of a batch ``flat`` gathered at the ``B * L`` slots of the
        ``(B, L)`` slot matrix ``slots`` (see :func:`marlbuf.batch.as_sequences`)."""
        return as_sequences(
            flat, mask, burn_in, slots, indices, generations, weights, trainer, zeroed=zeroed
        )

    def gather_round(
        self,
        draws: Sequence[np.ndarray],
        weights: Sequence[np.ndarray | None],
        generations: Sequence[np.ndarray],
        trainers: Sequence[int | None],
        drawn: Sequence[np.ndarray],
        blocks: Sequence[Any] | None = None,
    ) -> list[Any] | None:
        """A whole MADDPG round gathered at once, or ``None``: the caller gathers each
        trainer's batch on its own (host stores: every batch is its own recycled block)."""
        return None

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
        links: NextObsLinks | None = None,
        batch_dtype: str = "float32",
        allocate: Allocator | None = None,
        *,
        stores_next_obs: bool = True,
    ) -> None:
        super().__init__(
            specs,
            capacity,
            pool_blocks,
            codec,
            batch_layout,
            links,
            batch_dtype,
            allocate,
            stores_next_obs=stores_next_obs,
        )
        self.batch_layout = "per_agent"  # the only way this layout gathers
        # no next_obs arrays when observations are stored once (or not at all)
        self.fields = tuple(
            f for f in self.codec.field_names if not (self.lean and f == "next_obs")
        )
        # one array per (field, agent): "obs/agent_0", ...; a global field's is its name
        self._data: dict[str, dict[str, np.ndarray]] = {f: {} for f in self.fields}
        for fs in self.codec.slots:
            if fs.field in self._data:
                name = fs.field if fs.agent == GLOBAL else f"{fs.field}/{fs.agent}"
                self._data[fs.field][fs.agent] = self.allocate(
                    name, (capacity, *fs.shape), fs.dtype
                )
        # (field, agent, 2-D source view) for the gather loop, built once
        self._flat = [
            (f, a, arr.reshape(capacity, -1))
            for f in self.fields
            for a, arr in self._data[f].items()
        ]
        # observations stored once: each agent's next_obs comes from its obs array (successor)
        # or its part of the side table, copied in the widest word that divides both
        self._next: list[tuple[str, np.dtype, int]] = []
        if links is not None:
            nobs = {fs.agent: fs for fs in self.codec.slots if fs.field == "next_obs"}
            for agent in self.specs:
                fs = nobs[agent]
                relative = fs.offset - self.codec.next_obs_start
                unit = 8
                while fs.nbytes % unit or relative % unit:
                    unit //= 2
                self._next.append((agent, np.dtype(f"u{unit}"), relative // unit))

    @property
    def nbytes(self) -> int:
        data = sum(a.nbytes for per_agent in self._data.values() for a in per_agent.values())
        return data + (self.links.nbytes if self.links is not None else 0)

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        if views is None:
            views = self.codec.views(rows)
        ranges = ring_ranges(slots)
        for f in self.fields:
            for agent, dst in self._data[f].items():
                src = views[f][agent]
                for lo, hi, s0 in ranges:
                    dst[lo:hi] = src[s0 : s0 + (hi - lo)]

    def gather(
        self,
        indices: np.ndarray,
        out_block: np.ndarray | None = None,
        select: FieldSelection | None = None,
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        n = indices.shape[0]
        if select is None:
            select = self.default_select
        block = self._new_block(n, select) if out_block is None else out_block
        if select is None:
            out = self._carve(block, n)
            flat = self._flat
            next_fields = self._next
        else:  # the chosen fields only, carved from a block of their own
            out = self._select_views(block, n, select)
            flat = [x for x in self._flat if x[0] in out]
            next_fields = self._next if "next_obs" in out else []
        for field_name, agent, src in flat:
            dst = out[field_name][agent]
            # Numba has no float16: half-precision arrays are moved as their 2-byte patterns
            bits = src.view(np.uint16) if src.dtype == np.float16 else src
            if dst.dtype == src.dtype:
                self._gather_kernel(dst.nbytes)(bits, indices, dst.reshape(n, -1).view(bits.dtype))
            else:  # half precision to float32: gathered, then widened (a second pass)
                narrow = np.empty((n, src.shape[1]), dtype=src.dtype)
                self._gather_kernel(narrow.nbytes)(bits, indices, narrow.view(np.uint16))
                np.copyto(dst.reshape(n, -1), narrow)
        links = self.links
        if links is not None:
            for agent, word, side_offset in next_fields:
                dst = out["next_obs"][agent]
                obs = self._data["obs"][agent].reshape(self.capacity, -1)
                narrow = dst if dst.dtype == obs.dtype else np.empty((n, obs.shape[1]), obs.dtype)
                gather_next_field(
                    obs.view(word),
                    links.side.view(word),
                    indices,
                    links.next_slot,
                    links.side_row,
                    side_offset,
                    narrow.reshape(n, -1).view(word),
                )
                if narrow is not dst:
                    np.copyto(dst.reshape(n, -1), narrow)
        return out, block

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            f if a == GLOBAL else f"{f}/{a}": arr
            for f in self.fields
            for a, arr in self._data[f].items()
        }

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        if field_name in self._not_stored:
            NotGathered(field_name, self.field_names, False).refuse()
        if field_name not in self._data:  # next_obs stored once: assembled by a gather
            fields, _ = self.gather(np.arange(count, dtype=np.int64))
            view = fields[field_name][agent]
        else:
            view = self._data[field_name][agent][:count]
        view.flags.writeable = False
        return view


class InterleavedStorage(Storage):
    """One page-aligned table ``[capacity, row_bytes]``; a row is one timestep of every agent.

    The row is field-major (all agents' obs, then all actions, rewards, next obs, dones; see
    :func:`marlbuf.spec.interleaved_row_layout`) and padded to a whole number of cache lines. The
    table is kept as 8-byte words so that the gather kernel moves words, not bytes.
    """

    #: ``gather`` writes a row of zeros for the index -1 (sequence batches' masked steps)
    zero_fills = True

    layout = "interleaved"

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        pool_blocks: int = 8,
        codec: RowCodec | None = None,
        batch_layout: str = "rows",
        links: NextObsLinks | None = None,
        batch_dtype: str = "float32",
        allocate: Allocator | None = None,
        *,
        stores_next_obs: bool = True,
    ) -> None:
        super().__init__(
            specs,
            capacity,
            pool_blocks,
            codec,
            batch_layout,
            links,
            batch_dtype,
            allocate,
            stores_next_obs=stores_next_obs,
        )
        self.row_bytes = self.codec.row_bytes  # a gathered (dense) row
        self.row_words = self.codec.row_words
        # a stored row: dense, or lean (no next_obs) when observations are stored once or not
        # at all
        self.table_row_bytes = self.codec.lean_row_bytes if self.lean else self.row_bytes
        self.table = self.allocate(
            "table", (capacity, self.table_row_bytes // 8), np.dtype(np.uint64)
        )
        codec = self.codec
        done_lean, done_dense, done_bytes = codec.done_span
        words = lambda nbytes: -(-nbytes // 8)  # noqa: E731 - sections start on words
        self._lean_args = (
            words(codec.head_bytes),
            done_lean // 8,
            done_dense // 8,
            words(done_bytes),
        )
        # the default gather (lean rows -> dense rows batch, no conversion): three block copies
        # per row, in 8-byte words (see gather_lean_rows)
        next_bytes = codec.obs_bytes
        whole, rest = divmod(next_bytes, 8)
        next_words = whole if rest else whole - 1  # the last (partial) word goes through a mask
        last_mask = (1 << (8 * rest)) - 1 if rest else (1 << 64) - 1
        self._lean_rows_args = tuple(
            np.uint64(x)
            for x in (
                words(codec.head_bytes),
                codec.next_obs_start // 8,
                next_words,
                last_mask,
                done_lean // 8,
                done_dense // 8,
                words(done_bytes),
            )
        )
        #: rows per block of the general gather (its staging area stays in cache)
        self._block_rows = max(
            _config.GATHER_BLOCK_MIN_ROWS, _config.GATHER_BLOCK_BYTES // self.table_row_bytes
        )
        self._plans: dict[int, np.ndarray] = {}
        self._selected_plans: dict[tuple[str, ...], dict[int, tuple[np.ndarray, bool]]] = {}
        self._no_links = np.zeros(0, dtype=np.int64)
        self._no_side = np.zeros((1, 8), dtype=np.uint8)

    def _plan(self, n: int) -> np.ndarray:
        """The gather plan for ``n``-row batches (rows batches: the same for every ``n``)."""
        key = 0 if self.batch_layout == "rows" else n
        if key not in self._plans:
            stored = self.codec.lean_slots if self.lean else self.codec.slots
            obs_slots = {fs.agent: fs for fs in self.codec.slots if fs.field == "obs"}
            if self.batch_layout == "rows":
                step = self.batch_codec.row_bytes
                targets = [
                    (fs.field, fs.agent, fs.offset, step, fs.dtype) for fs in self.batch_codec.slots
                ]
            else:
                layout, _ = self._carving(n)
                targets = [
                    (f, a, offset, nbytes // n, dtype) for f, a, offset, nbytes, dtype, _ in layout
                ]
            self._plans = {key: build_plan(stored, obs_slots, targets, self.links is not None)}
        return self._plans[key]

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes) + (self.links.nbytes if self.links is not None else 0)

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        if not self.lean:
            scatter_rows(self.table, slots, rows)
        else:
            scatter_lean(self.table, slots, rows, *self._lean_args)

    def gather(
        self,
        indices: np.ndarray,
        out_block: np.ndarray | None = None,
        select: FieldSelection | None = None,
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        if select is None:
            select = self.default_select  # None unless next observations are not stored
        if select is not None:
            return self._gather_selected(indices, out_block, select)
        n = indices.shape[0]
        block = self._new_block(n) if out_block is None else out_block
        rows = self.batch_layout == "rows"
        if rows and self.links is None and not self.converts:
            # stored rows are batch rows: one straight word copy per row
            self._gather_table_rows(self.table, indices, block)
            return self._row_views.views(block), block
        links = self.links
        if rows and links is not None and not self.converts:
            # observations stored once, rows batch: head, next_obs and tail as block copies
            head, next_dst, next_words, last_mask, tail_src, tail_dst, tail = self._lean_rows_args
            gather_lean_rows(
                self.table,
                links.side.view(np.uint64),
                indices,
                links.next_slot,
                links.side_row,
                head,
                next_dst,
                next_words,
                last_mask,
                tail_src,
                tail_dst,
                tail,
                block,
                *copy_options(self.table_row_bytes, block.nbytes),
            )
            return self._row_views.views(block), block
        # rows batch: a few long segments, run straight from the table; per-agent arrays:
        # many short ones, run over staged blocks of rows
        self._run_plan(indices, self._plan(n), links, block.reshape(-1), rows, staged=not rows)
        if rows:
            return self._row_views.views(block), block
        return self._carve(block, n), block

    def _gather_selected(
        self, indices: np.ndarray, out_block: np.ndarray | None, select: FieldSelection
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        """:meth:`gather` of the fields of ``select``: the general kernel with a plan of the
        chosen (field, agent) slots into a block of the selection's format (next observations
        are looked up only when ``next_obs`` is chosen)."""
        n = indices.shape[0]
        block = self._new_block(n, select) if out_block is None else out_block
        rows = self.batch_layout == "rows"
        if rows and select is self.default_select and self.rows_are_batch_rows:
            # next_obs="none", rows batch: stored rows are batch rows, one word copy per row
            self._gather_table_rows(self.table, indices, block)
            return select.views(block), block
        plan, direct = self._selected_plan(select, n)
        # next observations are looked up only when chosen; a plan that copies out of the row
        # itself runs straight from the table (staging whole rows would copy the fields left
        # out for nothing), as does any plan of a rows batch (a few long segments)
        links = self.links if "next_obs" in select.names else None
        self._run_plan(indices, plan, links, block.reshape(-1), rows, staged=not (rows or direct))
        return self._select_views(block, n, select), block

    def _run_plan(
        self,
        indices: np.ndarray,
        plan: np.ndarray,
        links: NextObsLinks | None,
        flat: np.ndarray,
        rows: bool,
        staged: bool,
    ) -> None:
        """Run the gather ``plan`` (:func:`build_plan`'s rows) for ``indices`` into the flat
        batch block ``flat``: with ``staged``, over staged blocks of rows (``gather_segments``:
        plans of many short segments), else row by row straight from the table
        (``gather_spans``); ``links``: where next observations live (``None`` when the plan
        reads none). Streaming stores only for ``rows`` batches: per-agent arrays are written
        as many short runs into as many arrays, which streaming stores make slower."""
        kind, src, dst, length, step, from_next = plan
        side = links.side if links is not None else self._no_side
        # every batch block is a whole number of 8-byte words (rows of words, or per-agent
        # arrays each starting on a cache line), so all three views cover it
        arguments = (
            self.table,
            side.view(np.uint64),
            indices,
            self._no_links if links is None else links.next_slot,
            self._no_links if links is None else links.side_row,
            kind,
            src,
            dst,
            length,
            step,
            from_next,
            HALF_TO_FLOAT_BITS,
            flat.view(np.uint64),
            flat.view(np.uint32),
            flat.view(np.uint8),
        )
        ahead, lines, streaming = copy_options(self.table_row_bytes, flat.nbytes)
        if staged:
            gather_segments(*arguments, self._block_rows, ahead, lines)
        else:
            gather_spans(*arguments, ahead, lines, streaming and rows)

    def _selected_plan(self, select: FieldSelection, n: int) -> tuple[np.ndarray, bool]:
        """The gather plan of ``select``'s fields for ``n``-row batches (kept per selection
        and, for per-agent batches, per ``n``), and whether it only copies out of the row
        itself (no next observations, no float16 conversion: run straight from the table)."""
        plans = self._selected_plans.setdefault(select.names, {})
        key = 0 if self.batch_layout == "rows" else n
        if key not in plans:
            stored = self.codec.lean_slots if self.lean else self.codec.slots
            obs_slots = {fs.agent: fs for fs in self.codec.slots if fs.field == "obs"}
            if self.batch_layout == "rows":
                targets = [
                    (fs.field, fs.agent, fs.offset, select.row_bytes, fs.dtype)
                    for fs in select.slots
                ]
            else:
                targets = [
                    (f, a, offset, nbytes // n, dtype)
                    for f, a, offset, nbytes, dtype, _ in select.carving(n)[0]
                ]
            plans.clear()  # one batch size at a time, as the default plans
            plan = build_plan(stored, obs_slots, targets, self.links is not None)
            direct = not (plan[5].any() or (plan[0] == HALF_TO_FLOAT).any())
            plans[key] = (plan, bool(direct))
        return plans[key]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"table": self.table}

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        if field_name in self._not_stored:
            NotGathered(field_name, self.field_names, False).refuse()
        if not self.lean:
            view = self.codec.views(self.table[:count])[field_name][agent]
        elif field_name == "next_obs":  # stored once: assembled by a gather
            fields, _ = self.gather(np.arange(count, dtype=np.int64))
            view = fields[field_name][agent]
        else:
            fs = next(x for x in self.codec.lean_slots if (x.field, x.agent) == (field_name, agent))
            raw = self.table[:count].view(np.uint8)
            view = (
                raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype).reshape(count, *fs.shape)
            )
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
    links: NextObsLinks | None = None,
    batch_dtype: str = "float32",
    allocate: Allocator | None = None,
    *,
    stores_next_obs: bool = True,
) -> Storage:
    """Build the storage for ``layout`` (``"interleaved"`` or ``"agent_major"``); ``allocate``
    makes its arrays (default: page-aligned memory); ``stores_next_obs=False``: rows without
    next observations (``next_obs="none"``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}; got layout={layout!r}")
    return LAYOUTS[layout](
        specs,
        capacity,
        pool_blocks,
        codec,
        batch_layout,
        links,
        batch_dtype,
        allocate,
        stores_next_obs=stores_next_obs,
    )
