"""The store contract: :class:`Storage`, the base of every store, and what it is built from.

A store owns the row table of a buffer and its gathers. It is built from one
:class:`StoreOptions` (the row format, capacity, batch options, links, allocator, device); the
registry in :mod:`marlbuf.stores` maps a store's name to its class. The base class holds what
every store shares: the batch formats (:class:`FieldSelection`, :class:`RowViewPlan`, the gather
plans of :func:`build_plan`), the block pool of gathered batches and the batch builders.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import (
    gather_rows,
    gather_rows_parallel,
    gather_words,
)
from marlbuf._kernels.plan import COPY8, COPY32, COPY64, HALF_TO_FLOAT
from marlbuf.batch import Batch, NotGathered, as_sequences
from marlbuf.rows import RowGeometry, RowViews
from marlbuf.spec import ALIVE, FIELDS, GLOBAL, AgentSpec, FieldSlot, FieldSpec
from marlbuf.storage import Allocator, BlockPool, allocate_in_memory

if TYPE_CHECKING:
    from marlbuf.writer import NextObsLinks


def copy_options(row_bytes: int, out_nbytes: int) -> tuple[int, int, bool]:
    """The copy settings of a row gather (:func:`marlbuf._kernels.gather_words` and the other
    row kernels): rows prefetched ahead of the one copied and lines per row
    (``_config.PREFETCH_AHEAD_BYTES``, ``PREFETCH_LINES``), and whether a block of
    ``out_nbytes`` is written with streaming stores (``_config.STREAMING_STORE_MIN_BYTES``)."""
    ahead = max(1, -(-_config.PREFETCH_AHEAD_BYTES // max(1, row_bytes)))
    return ahead, _config.PREFETCH_LINES, out_nbytes >= _config.STREAMING_STORE_MIN_BYTES


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
    :meth:`marlbuf.rows.RowGeometry.views`: the same shapes, strides and memory, and their base
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
    row format, described as :class:`marlbuf.rows.RowGeometry` describes the full one.

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
    codec : RowGeometry
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
        codec: RowGeometry,
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


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """What every store is built from: ``StoreClass(options)`` (see
    :func:`marlbuf.stores.make_store`).

    Parameters
    ----------
    codec : RowGeometry
        The row format of the buffer's specs (its ``specs``, global fields and alive mask).
    capacity : int
        Slots of the ring.
    pool_blocks : int
        Gathered batch blocks the :class:`marlbuf.storage.BlockPool` keeps for reuse.
    batch_layout : str
        One of :data:`BATCH_LAYOUTS`.
    links : NextObsLinks or None
        Observations stored once: the next-observation links (``None``: dense rows, or none).
    batch_dtype : str
        One of :data:`BATCH_DTYPES`.
    allocate : Allocator or None
        Makes the host arrays (``None``: page-aligned memory; a mapped folder maps files).
    device : Any
        A device store's device (``"cpu"``, ``"cuda:k"``, a ``torch.device``); ``None`` on
        the host.
    stores_next_obs : bool
        ``False``: rows without next observations (``next_obs="none"``).
    """

    codec: RowGeometry
    capacity: int
    pool_blocks: int = 8
    batch_layout: str = "rows"
    links: NextObsLinks | None = None
    batch_dtype: str = "float32"
    allocate: Allocator | None = None
    device: Any = None
    stores_next_obs: bool = True


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

    def __init__(self, options: StoreOptions) -> None:
        #: what the store was built from (a new store of the same kind: ``dataclasses.replace``)
        self.options = options
        codec, links, stores_next_obs = options.codec, options.links, options.stores_next_obs
        batch_dtype, batch_layout = options.batch_dtype, options.batch_layout
        specs = codec.specs
        self.specs = dict(specs)
        #: makes the storage arrays (in memory, or mapped files: see :mod:`marlbuf.mapped`)
        self.allocate = options.allocate if options.allocate is not None else allocate_in_memory
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
        self.capacity = int(options.capacity)
        self.pool = BlockPool(options.pool_blocks)  # recycled memory for gathered batches
        self.parallel_gather = False  # opt-in: threads for large gathers (see _gather_kernel)
        #: the row format: per-agent fields, then global fields and the alive mask
        self.codec = codec
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
            RowGeometry(self.batch_specs, batch_globals, self.codec.alive)
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
