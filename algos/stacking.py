"""Zero-copy stacking of per-trainer batches into ``(T, B, width)`` arrays.

The batched trainer wants every trainer's critic input as one ``(T, B, width)`` tensor. When the
buffer is interleaved and the trainers' batches were gathered into consecutive slices of one
block (:class:`RoundBlock`), that tensor is a strided view of the gathered rows and costs
nothing; otherwise :func:`stack_fields` falls back to ``np.stack`` (one copy).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf.batch import Batch
from marlbuf.storage import aligned_empty


def _address(arr: np.ndarray) -> int:
    return int(arr.__array_interface__["data"][0])


def _root(arr: np.ndarray) -> np.ndarray:
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


class RoundBlock:
    """One preallocated ``(n_trainers, batch_size, row_words)`` uint64 block whose slices serve
    as the ``out=`` batches of :meth:`MultiAgentReplayBuffer.sample_for_trainers`.

    Only meaningful for the interleaved layout; for other layouts :meth:`out` returns ``None``
    (the buffer allocates as usual).
    """

    def __init__(self, buffer: object, n_trainers: int, batch_size: int) -> None:
        storage = getattr(buffer, "storage", None)
        self.batches: list[Batch] | None = None
        if getattr(storage, "layout", None) != "interleaved":
            return
        row_words = int(storage.batch_codec.row_words)  # type: ignore[union-attr]
        block = aligned_empty(
            (n_trainers, batch_size, row_words), np.dtype(np.uint64), _config.ROW_ALIGN_BYTES
        )
        empty = np.empty(0, dtype=np.int64)
        self.batches = [
            Batch({}, {}, {}, {}, {}, indices=empty, generations=empty, block=block[t])
            for t in range(n_trainers)
        ]

    def out(self) -> list[Batch] | None:
        """Batches to pass as ``out=`` (the previous round's, whose blocks are reused)."""
        return self.batches

    def keep(self, batches: list[Batch]) -> None:
        """Remember this round's batches for the next round's ``out=``."""
        if self.batches is not None:
            self.batches = batches


def stack_views(views: Sequence[np.ndarray]) -> np.ndarray | None:
    """One ``(K, *shape)`` view over ``K`` same-shaped arrays that sit at equally spaced
    addresses inside one writeable allocation; ``None`` when they do not (the caller copies).
    """
    first = views[0]
    if any(
        v.shape != first.shape or v.strides != first.strides or v.dtype != first.dtype
        for v in views
    ):
        return None
    roots = [_root(v) for v in views]
    root = roots[0]
    if any(r is not root for r in roots) or not (root.flags.writeable and root.flags.c_contiguous):
        return None
    addresses = [_address(v) for v in views]
    step = addresses[1] - addresses[0] if len(views) > 1 else 0
    if step < 0 or any(b - a != step for a, b in itertools.pairwise(addresses)):
        return None
    itemsize = first.dtype.itemsize
    if any(s % itemsize for s in (step, *first.strides)) or first.strides[-1] < 0:
        return None
    return _view_at(
        root, addresses[0], (len(views), *first.shape), (step, *first.strides), first.dtype
    )


def _view_at(
    root: np.ndarray, address: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
) -> np.ndarray:
    """A view of ``root``'s memory starting at ``address`` (NumPy checks it stays inside)."""
    flat = root.reshape(-1).view(np.uint8)
    return np.ndarray(
        shape=shape, dtype=dtype, buffer=flat[address - _address(flat) :], strides=strides
    )


def merge_leading(arr: np.ndarray) -> np.ndarray:
    """``arr.reshape(-1, *arr.shape[2:])`` for a (T, B, ...) array: a view when the first two
    axes are evenly strided (as in a :class:`RoundBlock`), else a copy."""
    root = _root(arr)
    if (
        arr.strides[0] == arr.shape[1] * arr.strides[1]
        and root.flags.writeable
        and root.flags.c_contiguous
    ):
        shape = (arr.shape[0] * arr.shape[1], *arr.shape[2:])
        return _view_at(root, _address(arr), shape, arr.strides[1:], arr.dtype)
    return np.ascontiguousarray(arr).reshape(-1, *arr.shape[2:])


def stack_or_copy(views: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`stack_views` when possible, else ``np.stack`` (one copy)."""
    stacked = stack_views(views)
    return np.stack(views) if stacked is None else stacked


def stack_fields(batches: Sequence[Batch], *fields: str) -> np.ndarray:
    """``np.stack([b.concat(*fields) for b in batches])``, shape ``(T, B, width)``: a view when
    the batches were gathered into one :class:`RoundBlock` (no copy), else a copy. Treat the
    result as read-only."""
    views = [b.concat(*fields) for b in batches]
    if any(not v.flags.writeable for v in views):
        # concat's multi-field views are read-only as_strided views; rebuild them over the block
        views = [_writeable_span(b, v) for b, v in zip(batches, views)]
    return stack_or_copy(views)


def _writeable_span(batch: Batch, view: np.ndarray) -> np.ndarray:
    """The same memory as ``view`` (a read-only span of ``batch.block``) as a writeable view."""
    if batch.block is None:
        return np.array(view)
    raw = batch.block.view(np.uint8).reshape(batch.block.shape[0], -1)
    offset = _address(view) - _address(raw)
    if offset < 0 or view.strides[0] != raw.strides[0]:
        return np.array(view)
    width = view.shape[1] * view.dtype.itemsize
    return raw[:, offset : offset + width].view(view.dtype)
