"""Zero-copy stacking of per-trainer batches into ``(T, B, width)`` arrays.

The batched trainer wants every trainer's critic input as one ``(T, B, width)`` tensor. When the
buffer is interleaved and the trainers' batches were gathered into consecutive slices of one
block (:class:`RoundBlock`), that tensor is a strided view of the gathered rows and costs
nothing; otherwise :func:`stack_fields` falls back to ``np.stack`` (one copy).
"""

from __future__ import annotations

from collections.abc import Sequence

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
        row_words = int(storage.row_words)  # type: ignore[union-attr]
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


def stack_fields(batches: Sequence[Batch], *fields: str) -> np.ndarray:
    """``np.stack([b.concat(*fields) for b in batches])``, shape ``(T, B, width)``, as a view
    when the batches' views are equally spaced inside one allocation (no copy), else a copy.

    The view is writeable only in the sense NumPy requires for ``torch.from_numpy``; callers
    must treat it as read-only.
    """
    views = [b.concat(*fields) for b in batches]
    first = views[0]
    if len(views) == 1:
        return first[None] if first.flags.writeable else np.stack(views)
    same_form = all(
        v.shape == first.shape and v.strides == first.strides and v.dtype == first.dtype
        for v in views
    )
    roots = {id(_root(b.block)) for b in batches if b.block is not None}
    if not same_form or len(roots) != 1 or any(b.block is None for b in batches):
        return np.stack(views)
    root = _root(batches[0].block)  # type: ignore[arg-type]
    if not (root.flags.writeable and root.flags.c_contiguous):
        return np.stack(views)
    addresses = [_address(v) for v in views]
    step = addresses[1] - addresses[0]
    if step < 0 or any(b - a != step for a, b in zip(addresses, addresses[1:])):
        return np.stack(views)
    itemsize = first.dtype.itemsize
    if first.strides[1] != itemsize and first.shape[1] > 1:
        return np.stack(views)
    raw = root.reshape(-1).view(np.uint8)
    start = addresses[0] - _address(raw)
    rows, width = first.shape
    span = np.lib.stride_tricks.as_strided(
        raw[start:],
        shape=(len(views), rows, width * itemsize),
        strides=(step, first.strides[0], 1),
    )
    return span.view(first.dtype)
