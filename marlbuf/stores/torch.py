"""The torch store: the interleaved row table as one torch tensor, on a GPU or on the host.

``MultiAgentReplayBuffer(specs, capacity, ..., device="cuda")`` (or ``"cpu"``, ``"cuda:k"``)
keeps its rows in a :class:`TorchStorage` instead of a NumPy table. Everything else is the one
front's: the checks and staging of ``add``/``extend``/``add_envs``, the ring writer and its
write generations, the next-observation links, the episode index of sequence samplers, every
sampler (the same draws for the same seed), the stale-priority guard, and the state files.
What the store owns:

* **The table** - one ``int64`` tensor on the device holding rows in exactly the interleaved
  format of the NumPy table (the bits of its ``uint64`` rows): lean rows without next_obs when
  observations are stored once, dense rows otherwise; float16 fields stay float16. One extra
  row of zeros after the ring is where the index -1 (a masked step of a sequence batch) reads.
* **Writes** - staged and checked on the host; lean rows are compacted on the host, then the
  rows travel to the device through two pinned host buffers with ``non_blocking=True`` copies
  (a CUDA event per buffer keeps it from being refilled before its copy has run).
* **Gathers** - the indices drawn on the host travel to the device the same way (a copy that
  does not wait for the device), and a batch is one ``index_select`` of whole rows when table
  rows are batch rows, else one per merged segment of the NumPy gather plan
  (:func:`marlbuf.stores.base.build_plan`; three for lean float32 rows). A next observation comes
  from the successor's row (the host links say which) or, at an episode boundary, from the side
  row, sent with the indices.
* **Batches** - :class:`DeviceBatch` (and :class:`DeviceSequenceBatch`): the structure of
  :class:`marlbuf.batch.Batch` with torch tensors on the device, built lazily (a learner that
  reads ``concat`` spans never pays for the per-agent views). ``indices`` and ``generations``
  stay on the host (they go back to ``update_priorities``); ``weights`` are on the device.

The store's tensors (dtypes, devices, row views) are in :mod:`marlbuf.stores.torch_rows`, its
batches in :mod:`marlbuf.stores.torch_batches`; this module re-exports their public names.
torch is imported by these modules and :mod:`marlbuf.stores.torch_priority` only, and only once
a buffer asks for a device: ``import marlbuf`` does not need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "MultiAgentReplayBuffer(..., device=...) needs PyTorch: pip install 'marlbuf[algos]' "
        "(or use device=None, the NumPy store)"
    ) from exc

from marlbuf import _config
from marlbuf._kernels import scatter_lean
from marlbuf._kernels.plan import COPY8, COPY32, COPY64, HALF_TO_FLOAT
from marlbuf.batch import NotGathered
from marlbuf.memory import check_fits_in_memory
from marlbuf.rows import RowViews
from marlbuf.stores.base import FieldSelection, Storage, StoreOptions, build_plan, ring_ranges
from marlbuf.stores.torch_batches import (
    DeviceBatch,
    DeviceSequenceBatch,
    Round,
    round_of,
    round_rows,
    stack_span,
)
from marlbuf.stores.torch_rows import RowLayout, check_device, torch_dtype

Tensor = torch.Tensor

#: torch dtypes of the gather plan's segment kinds (source and destination units)
_UNIT_DTYPES = {
    COPY64: (torch.int64, torch.int64),
    COPY32: (torch.int32, torch.int32),
    COPY8: (torch.uint8, torch.uint8),
    HALF_TO_FLOAT: (torch.float16, torch.float32),
}


# --------------------------------------------------------------------------------- uploads
class _Uploader:
    """Copies host arrays (staged rows, link updates) to the device.

    On a CUDA device the data go through two pinned host buffers used in turn: each chunk is
    copied into a pinned buffer, sent with ``copy_(..., non_blocking=True)`` on the device's
    current stream, and an event recorded after it; before a pinned buffer is refilled its
    event is waited for (normally long done). On the CPU the data are copied directly.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.chunk_words = max(1, _config.DEVICE_STAGING_BYTES // 8)
        self._pinned: list[Tensor] = []  # flat int64
        self._host: list[np.ndarray] = []
        self._events: list[Any] = []
        self._turn = 0

    def _buffers(self, words: int) -> None:
        """Pinned buffers of at least ``words`` int64 each (a row wider than the staging size
        gets buffers of its own width)."""
        if self._pinned and self._pinned[0].shape[0] >= words:
            return
        for event in self._events:
            event.synchronize()  # copies out of the old buffers have finished
        size = max(self.chunk_words, words)
        self._pinned, self._host, self._events = [], [], []
        for _ in range(2):
            pinned = torch.empty(size, dtype=torch.int64).pin_memory()
            self._pinned.append(pinned)
            self._host.append(pinned.numpy())
            self._events.append(torch.cuda.Event())

    def upload(self, dst: Tensor, src: np.ndarray) -> None:
        """``dst[:] = src``: ``dst`` a (n, w) int64 tensor on the device (any strides),
        ``src`` (n, w) int64 or uint64 on the host (C-contiguous)."""
        src = src.view(np.int64)
        if self.device.type != "cuda":
            dst.copy_(torch.from_numpy(src))
            return
        total, width = src.shape
        self._buffers(width)
        chunk_rows = max(1, self._pinned[0].shape[0] // width)
        stream = torch.cuda.current_stream(self.device)
        done = 0
        while done < total:
            k = self._turn
            self._turn ^= 1
            count = min(chunk_rows, total - done)
            self._events[k].synchronize()  # the previous copy out of this buffer has finished
            host = self._host[k][: count * width].reshape(count, width)
            np.copyto(host, src[done : done + count])
            pinned = self._pinned[k][: count * width].view(count, width)
            dst[done : done + count].copy_(pinned, non_blocking=True)
            self._events[k].record(stream)
            done += count

    def to_device(self, src: np.ndarray) -> Tensor:
        """A device copy of the int64 host array ``src`` for one gather (indices, links, side
        rows, weights). On the CPU: ``src`` itself as a tensor (the caller uses it at once and
        never writes ``src`` again). On CUDA: through a pinned block of torch's caching host
        allocator with a non-blocking copy; the allocator records the copy's stream, so the
        block is reused only once the copy has run, and nothing here waits for the device
        (the two staging buffers of :meth:`upload` would wait for the previous round's copies
        after two uploads)."""
        if self.device.type != "cuda":
            return torch.from_numpy(src)
        return torch.from_numpy(src).pin_memory().to(self.device, non_blocking=True)

    #: 2-D arrays (side rows) go the same way
    rows_to_device = to_device


# --------------------------------------------------------------------------------- the store
class TorchStorage(Storage):
    """The interleaved row table as one ``int64`` tensor on ``device`` (see the module
    docstring), built from :class:`marlbuf.stores.base.StoreOptions`; its ``device``
    (``None``: the CPU) is checked by :func:`check_device`."""

    #: the index -1 reads the table's row of zeros (masked steps of sequence batches)
    zero_fills = True

    layout = "interleaved"

    def __init__(self, options: StoreOptions) -> None:
        super().__init__(options)
        self.device = check_device("cpu" if options.device is None else options.device)
        for fs in self.codec.slots:
            torch_dtype(fs.dtype)  # a dtype torch has, or a clear error
        lean = self.lean
        #: the rows of the table (lean when observations are stored once or not at all) and of
        #: batches (without next_obs when it is not stored: the default selection's rows)
        self.table_layout = RowLayout(self.codec, lean=lean)
        batch_format = self.batch_codec if self.default_select is None else self.default_select
        self.row_layout = RowLayout(batch_format)
        self.table_row_bytes = self.table_layout.row_bytes
        self.row_words = batch_format.row_words
        self._segments = self._plan_segments(lean)
        self._selections_built: dict[
            tuple[str, ...],
            tuple[RowLayout, list[tuple[torch.dtype, torch.dtype, int, int, int, bool]]],
        ] = {}
        done_lean, done_dense, done_bytes = self.codec.done_span
        self._lean_args = (
            -(-self.codec.head_bytes // 8),
            done_lean // 8,
            done_dense // 8,
            -(-done_bytes // 8),
        )
        rows = self.capacity + 1  # the ring, then the row of zeros the index -1 reads
        self._check_memory(rows * self.table_row_bytes)
        self.table = torch.zeros(
            (rows, self.table_layout.row_words), dtype=torch.int64, device=self.device
        )
        self._uploader = _Uploader(self.device)
        # batch memory on the host is recycled by the block pool (a fresh block costs more in
        # page faults than the gather); on a GPU the caching allocator does that job
        self._host_blocks = self.device.type == "cpu"

    def _plan_segments(
        self, lean: bool
    ) -> list[tuple[torch.dtype, torch.dtype, int, int, int, bool]] | None:
        """How a table row becomes a batch row: ``None`` when they are the same (one
        ``index_select`` of whole rows), else segments ``(source unit dtype, destination unit
        dtype, source offset, destination offset, length, from_next)`` in units of their
        dtypes, from the NumPy gather plan; ``from_next`` segments read the row holding the
        next observation, at the obs offsets."""
        if self.rows_are_batch_rows:
            return None
        stored = self.codec.lean_slots if lean else self.codec.slots
        obs_slots = {fs.agent: fs for fs in self.codec.slots if fs.field == "obs"}
        batch_format = self.batch_codec if self.default_select is None else self.default_select
        step = batch_format.row_bytes
        targets = [(fs.field, fs.agent, fs.offset, step, fs.dtype) for fs in batch_format.slots]
        once = self.links is not None
        kind, src, dst, length, _, from_next = build_plan(stored, obs_slots, targets, once)
        return [
            (*_UNIT_DTYPES[int(k)], int(s), int(d), int(n), bool(x))
            for k, s, d, n, x in zip(kind, src, dst, length, from_next)
        ]

    def _check_memory(self, nbytes: int) -> None:
        what = f"the torch table for capacity={self.capacity} on {self.device}"
        if self.device.type == "cpu":
            check_fits_in_memory(nbytes, what)
            return
        free, _ = torch.cuda.mem_get_info(self.device)
        if nbytes > free:
            gib = 1024**3
            raise MemoryError(
                f"{what} needs {nbytes / gib:.2f} GiB but only {free / gib:.2f} GiB of device "
                "memory is free; reduce capacity, store observations once (next_obs='once') or "
                "in float16 (AgentSpec(obs_dtype=np.float16))"
            )

    @property
    def nbytes(self) -> int:
        links = 0 if self.links is None else self.links.nbytes
        return int(self.table.numel() * 8) + links

    # ------------------------------------------------------------------------- writes
    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        if self.lean:  # lean rows (no next_obs section), compacted on the host
            lean = np.zeros((rows.shape[0], self.table_layout.row_words), dtype=np.uint64)
            scatter_lean(lean, np.arange(rows.shape[0], dtype=np.int64), rows, *self._lean_args)
            rows = lean
        for dst_start, dst_stop, src_start in ring_ranges(slots):
            count = dst_stop - dst_start
            self._uploader.upload(
                self.table[dst_start:dst_stop], rows[src_start : src_start + count]
            )

    # ------------------------------------------------------------------------- gathers
    def _new_rows(self, n: int, words: int | None = None) -> Tensor:
        """Fresh (n, words) int64 memory for batch rows (default: full batch rows)."""
        words = self.row_words if words is None else words
        if self._host_blocks:
            raw = self.pool.acquire(n * words * 8)
            return torch.from_numpy(raw.view(np.int64).reshape(n, words))
        return torch.empty((n, words), dtype=torch.int64, device=self.device)

    def _new_bytes(self, nbytes: int) -> Tensor:
        if self._host_blocks:
            return torch.from_numpy(self.pool.acquire(nbytes))
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def _selected(
        self, select: FieldSelection
    ) -> tuple[RowLayout, list[tuple[torch.dtype, torch.dtype, int, int, int, bool]]]:
        """The row views and gather segments of ``select``'s rows (built once per selection)."""
        found = self._selections_built.get(select.names)
        if found is None:
            stored = self.codec.lean_slots if self.lean else self.codec.slots
            obs_slots = {fs.agent: fs for fs in self.codec.slots if fs.field == "obs"}
            targets = [
                (fs.field, fs.agent, fs.offset, select.row_bytes, fs.dtype) for fs in select.slots
            ]
            once = self.links is not None
            kind, src, dst, length, _, from_next = build_plan(stored, obs_slots, targets, once)
            segments = [
                (*_UNIT_DTYPES[int(k)], int(s), int(d), int(n), bool(x))
                for k, s, d, n, x in zip(kind, src, dst, length, from_next)
            ]
            if len(self._selections_built) >= _config.MAX_FIELD_SELECTIONS:
                self._selections_built.clear()
            found = self._selections_built[select.names] = (RowLayout(select), segments)
        return found

    def _gather_selected(
        self, indices: np.ndarray, out_block: Any, select: FieldSelection
    ) -> tuple[dict[str, dict[str, Any]], Tensor]:
        """:meth:`gather` of the fields of ``select`` (rows of its format, or its per-agent
        arrays carved from them)."""
        n = int(indices.shape[0])
        layout, segments = self._selected(select)
        per_agent = self.batch_layout == "per_agent"
        if per_agent or out_block is None:
            rows = self._new_rows(n, select.row_words)
        else:
            rows = out_block
        self.gather_rows(indices, rows, segments)
        if not per_agent:
            return {}, rows
        _, nbytes = layout.carving(n)
        block = self._new_bytes(nbytes) if out_block is None else out_block
        layout.fill_per_agent(rows, block)
        return {}, block

    def gather(
        self, indices: np.ndarray, out_block: Any = None, select: FieldSelection | None = None
    ) -> tuple[dict[str, dict[str, Any]], Tensor]:
        # the default selection (next_obs="none") is this store's batch format already
        if select is not None and select is not self.default_select:
            return self._gather_selected(indices, out_block, select)
        n = int(indices.shape[0])
        per_agent = self.batch_layout == "per_agent"
        rows = self._new_rows(n) if per_agent or out_block is None else out_block
        self.gather_rows(indices, rows)
        if not per_agent:
            return {}, rows
        _, nbytes = self.row_layout.carving(n)
        block = self._new_bytes(nbytes) if out_block is None else out_block
        self.row_layout.fill_per_agent(rows, block)
        return {}, block

    def gather_rows(
        self,
        indices: np.ndarray,
        dst: Tensor,
        segments: list[tuple[torch.dtype, torch.dtype, int, int, int, bool]] | None = None,
    ) -> None:
        """Batch rows at ``indices`` (shape (n,), int64 on the host, filled slots or -1 for a
        row of zeros) into ``dst`` (shape (n, row_words), int64, on the device); ``segments``
        (of a field selection, rows of its format) instead of the full batch rows'."""
        if indices.shape[0] and indices.min() < 0:
            indices = np.where(indices < 0, self.capacity, indices)
        idx = self._uploader.to_device(np.ascontiguousarray(indices, dtype=np.int64))
        if segments is None:
            segments = self._segments
            if segments is None:
                torch.index_select(self.table, 0, idx, out=dst)
                return
            links = self.links
        else:  # a selection: next observations are looked up only when it holds some
            links = self.links if any(seg[5] for seg in segments) else None
        sources = idx
        side_at: Tensor | None = None
        side: Tensor | None = None
        if links is not None:
            # where each next observation lives: the successor's row, else the side row
            filled = indices < self.capacity
            successor = np.where(
                filled, links.next_slot[np.where(filled, indices, 0)], self.capacity
            )
            at = np.flatnonzero(successor < 0)
            successor[at] = self.capacity  # read zeros there, then the side rows go in
            sources = self._uploader.to_device(successor)
            if at.shape[0]:
                side_rows = links.side[links.side_row[indices[at]]]
                side = self._uploader.rows_to_device(np.ascontiguousarray(side_rows).view(np.int64))
                side_at = self._uploader.to_device(at.astype(np.int64))
        # every field byte is written by a segment (padding bytes are left as they were)
        for src_dtype, dst_dtype, src, dst_at, length, from_next in segments:
            rows = sources if from_next else idx
            part = self.table.view(src_dtype)[:, src : src + length]
            out = dst.view(dst_dtype)[:, dst_at : dst_at + length]
            if src_dtype == dst_dtype:
                torch.index_select(part, 0, rows, out=out)
            else:  # float16 storage, float32 batch: exact
                out.copy_(part.index_select(0, rows))
            if from_next and side is not None and side_at is not None:
                out[side_at] = side.view(src_dtype)[:, src : src + length].to(dst_dtype)

    def check_out_block(self, block: Any, n: int, select: FieldSelection | None = None) -> Any:
        """``block`` (of a batch passed as ``out=``) if this store can gather ``n`` rows (of
        the fields of ``select``) into it, else a ``ValueError`` that says what differs."""
        shape: tuple[int, ...]
        if select is self.default_select:
            select = None  # the store's batch format (rows without next_obs where not stored)
        layout = self.row_layout if select is None else self._selected(select)[0]
        if self.batch_layout == "rows":
            words = self.row_words if select is None else select.row_words
            shape, dtype = (n, words), torch.int64
        else:
            shape, dtype = (layout.carving(n)[1],), torch.uint8
        if not isinstance(block, Tensor):
            raise ValueError(
                "out must be a DeviceBatch returned by this buffer's sample/gather; got block="
                f"{type(block).__name__}"
            )
        if tuple(block.shape) != shape or block.dtype != dtype or block.device != self.device:
            raise ValueError(
                f"out holds a block of shape {tuple(block.shape)} dtype {block.dtype} on "
                f"{block.device}, but a batch of {n} rows of this buffer needs shape {shape} "
                f"dtype {dtype} on {self.device}: pass a batch of the same size and fields= "
                "from this buffer"
            )
        if not block.is_contiguous():
            raise ValueError("out's block must be contiguous")
        return block

    def to_host_later(self, values: Any) -> Any:
        """A copy of the tensor ``values`` to pinned host memory that does not wait for the
        device (CUDA); the returned function waits for it and gives the host array."""
        if self.device.type != "cuda" or values.device.type != "cuda":
            # a copy now: numpy() of a host tensor shares its memory, and the caller may write
            # the tensor again before the update is applied (as a CUDA copy enqueued now reads
            # the values of now)
            host = values.detach().to("cpu", copy=True).numpy()
            return lambda: host
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values.detach(), non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(values.device))

        def ready() -> np.ndarray:
            done.synchronize()
            return host.numpy()

        return ready

    def block_address(self, block: Any) -> int:
        return int(block.data_ptr())

    def weights_to_device(self, weights: np.ndarray | None) -> Tensor | None:
        """``weights`` (shape (B,), float32, host) as a device tensor (``None`` stays)."""
        if weights is None:
            return None
        flat = np.ascontiguousarray(weights, dtype=np.float32).reshape(-1)
        words = np.zeros(-(-flat.shape[0] // 2), dtype=np.int64)
        words.view(np.float32)[: flat.shape[0]] = flat
        return (
            self._uploader.to_device(words).view(torch.float32)[: flat.shape[0]].view(weights.shape)
        )

    def make_batch(
        self,
        fields: Mapping[str, Any],
        block: Any,
        indices: np.ndarray,
        generations: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        select: FieldSelection | None = None,
    ) -> DeviceBatch:
        return DeviceBatch(
            self.row_layout
            if select is None or select is self.default_select
            else self._selected(select)[0],
            block,
            self.batch_layout == "per_agent",
            indices,
            generations,
            self.weights_to_device(weights),
            trainer,
            discrete_agents=self.discrete_agents,
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
    ) -> DeviceSequenceBatch:
        mask_words = np.zeros(-(-mask.size // 8), dtype=np.int64)
        mask_words.view(np.bool_)[: mask.size] = mask.reshape(-1)
        device_mask = self._uploader.to_device(mask_words).view(torch.bool)[: mask.size]
        return DeviceSequenceBatch(
            flat,
            mask,
            burn_in,
            slots,
            indices,
            generations,
            self.weights_to_device(weights),
            trainer,
            device_mask.view(*mask.shape),
        )

    def gather_round(
        self,
        draws: Sequence[np.ndarray],
        weights: Sequence[np.ndarray | None],
        generations: Sequence[np.ndarray],
        trainers: Sequence[int | None],
        drawn: Sequence[np.ndarray],
        blocks: Sequence[Any] | None = None,
    ) -> list[DeviceBatch] | None:
        """A MADDPG round of ``rows`` batches gathered as one block: a new one, or the block
        of the earlier round whose batches' blocks are ``blocks`` (checked ``out=`` blocks);
        ``None`` where the caller gathers per trainer (per-agent batches, or ``blocks`` that
        are not one round's)."""
        if self.batch_layout != "rows" or not draws:
            return None
        k, n = len(draws), int(draws[0].shape[0])
        if blocks is None:
            rows = self._new_rows(k * n).view(k, n, self.row_words)
        else:  # the blocks must be the trainers' slices of one earlier round, in order
            first = blocks[0]
            step = n * self.row_words * first.element_size()
            storage = first.untyped_storage()
            end = first.data_ptr() + k * step
            if end > storage.data_ptr() + storage.nbytes() or any(
                b.untyped_storage().data_ptr() != storage.data_ptr()
                or b.data_ptr() != first.data_ptr() + t * step
                for t, b in enumerate(blocks)
            ):
                return None
            rows = torch.as_strided(
                first, (k, n, self.row_words), (n * self.row_words, self.row_words, 1)
            )
        self.gather_rows(np.concatenate(draws), rows.view(k * n, self.row_words))
        stacked = None if weights[0] is None else self.weights_to_device(np.stack(weights))  # type: ignore[arg-type]
        whole = Round(rows, np.stack(draws), np.stack(generations), stacked)
        return [
            DeviceBatch(
                self.row_layout,
                rows[t],
                False,
                drawn[t],
                generations[t],
                None if stacked is None else stacked[t],
                trainers[t],
                whole,
                t,
                self.discrete_agents,
            )
            for t in range(k)
        ]

    # ------------------------------------------------------------------------- state
    def arrays(self) -> dict[str, np.ndarray]:
        table = self.table[: self.capacity]
        host = table.numpy() if self.device.type == "cpu" else table.cpu().numpy()
        return {"table": host.view(np.uint64)}

    def restore(self, arrays: Mapping[str, Any], size: int) -> None:
        src = np.ascontiguousarray(np.asarray(arrays["table"]), dtype=np.uint64)
        if self.device.type == "cpu" and np.shares_memory(self.table.numpy(), src):
            return  # load() read straight into the table
        if size:
            self._uploader.upload(self.table[:size], src[:size])

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        if field_name in self._not_stored:
            NotGathered(field_name, self.field_names, False).refuse()
        if self.links is not None and field_name == "next_obs":  # stored once: a gather
            rows = torch.empty((count, self.row_words), dtype=torch.int64, device=self.device)
            self.gather_rows(np.arange(count, dtype=np.int64), rows)
            view = self.row_layout.views(rows)[field_name][agent]
        else:
            view = self.table_layout.views(self.table[:count])[field_name][agent]
        host = view.detach().cpu().numpy().copy()
        host.flags.writeable = False
        return host


__all__ = [
    "DeviceBatch",
    "DeviceSequenceBatch",
    "RowLayout",
    "TorchStorage",
    "check_device",
    "round_of",
    "round_rows",
    "stack_span",
    "torch_dtype",
]
