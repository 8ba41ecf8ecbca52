"""The torch store's tensors: NumPy dtypes as torch dtypes, checked devices, and the
interleaved row format as torch views (:class:`RowLayout`), built once per buffer and shared by
its batches.

Imported through :mod:`marlbuf.stores.torch` (which says which extra installs torch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from marlbuf import _config
from marlbuf.rows import RowGeometry
from marlbuf.stores.base import FieldSelection

Tensor = torch.Tensor


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype (``float32`` -> ``torch.float32``)."""
    try:
        return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
    except TypeError as exc:
        raise TypeError(
            f"the torch store cannot hold dtype {np.dtype(dtype)} (torch has no such dtype); "
            "declare another dtype in the AgentSpec or use device=None"
        ) from exc


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` of type ``cpu`` or ``cuda`` (with an index), or a clear
    error: a ``TypeError`` for a non-string, a ``ValueError`` for an unknown or absent device."""
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(
                f"device must be 'cpu', 'cuda' or 'cuda:k'; got device={device!r}"
            ) from exc
    else:
        raise TypeError(
            f"device must be a string such as 'cuda' or 'cpu' (or a torch.device), or None for "
            f"the NumPy buffer; got device={device!r}"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"the torch store runs on 'cpu' and 'cuda' devices; got device={str(dev)!r}"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={str(dev)!r} was requested but torch.cuda.is_available() is False on "
                "this machine; use device='cpu' (the same code on the host) or device=None "
                "(the NumPy buffer)"
            )
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(
                f"device={str(dev)!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
        dev = torch.device("cuda", index)
    return dev


# --------------------------------------------------------------------------------- row views
class RowLayout:
    """The interleaved row format as torch views: built once per buffer, shared by its batches.

    Parameters
    ----------
    codec : RowGeometry
        The buffer's row format (offsets of every (field, agent) in a row).
    lean : bool, default False
        Describe the codec's lean rows (observations stored once: no ``next_obs`` section)
        instead of its dense rows.
    """

    def __init__(self, codec: RowGeometry | FieldSelection, lean: bool = False) -> None:
        self.codec = codec
        self.agents = list(codec.agents)
        self.row_bytes = codec.lean_row_bytes if lean else codec.row_bytes
        self.row_words = self.row_bytes // 8
        # (field, agent, element offset in its dtype, element count, shape, torch dtype)
        self.slots: list[tuple[str, str, int, int, tuple[int, ...], torch.dtype]] = []
        for s in codec.lean_slots if lean else codec.slots:
            dt = torch_dtype(s.dtype)
            itemsize = s.dtype.itemsize
            self.slots.append(
                (s.field, s.agent, s.offset // itemsize, s.nbytes // itemsize, s.shape, dt)
            )
        self._by_field: dict[str, list[tuple[str, str, int, int, tuple[int, ...], torch.dtype]]]
        self._by_field = {f: [s for s in self.slots if s[0] == f] for f in codec.field_names}
        self._spans: dict[tuple[str, ...], tuple[int, int, torch.dtype] | None] = {}
        self._carvings: dict[int, tuple[list[tuple[str, str, int, int, Any, torch.dtype]], int]]
        self._carvings = {}

    def views(self, rows: Tensor) -> dict[str, dict[str, Tensor]]:
        """Per field, per agent, views of ``rows`` (shape (n, row_words), int64): shape
        ``(n, *shape)``, the spec's dtype, row stride = the whole row."""
        n = rows.shape[0]
        typed: dict[torch.dtype, Tensor] = {}
        out: dict[str, dict[str, Tensor]] = {f: {} for f in self.codec.field_names}
        for field_name, agent, start, count, shape, dt in self.slots:
            base = typed.get(dt)
            if base is None:
                base = typed[dt] = rows.view(dt)
            out[field_name][agent] = base[:, start : start + count].view(n, *shape)
        return out

    def span(self, fields: tuple[str, ...]) -> tuple[int, int, torch.dtype] | None:
        """``(element offset, element count, dtype)`` of ``fields`` (every agent, in order) when
        they sit side by side in a row with one dtype, else ``None``."""
        if fields not in self._spans:
            parts = [s for f in fields for s in self._by_field[f]]
            dt = parts[0][5]
            start = parts[0][2]
            expected = start
            ok = True
            for _, _, offset, count, _, dtype in parts:
                if dtype != dt or offset != expected:
                    ok = False
                    break
                expected += count
            self._spans[fields] = (start, expected - start, dt) if ok else None
        return self._spans[fields]

    def field_block(self, rows: Tensor, field_name: str, first: int, stop: int) -> Tensor | None:
        """Agents ``first .. stop - 1`` of one field as one view ``(..., G, *shape)`` of
        ``rows`` (shape (..., row_words), int64), when they share shape and dtype (then they
        are adjacent in the row); else ``None``."""
        parts = self._by_field[field_name][first:stop]
        _, _, start, count, shape, dt = parts[0]
        if any(p[4] != shape or p[5] != dt for p in parts):
            return None
        typed = rows.view(dt)[..., start : start + count * len(parts)]
        return typed.view(*rows.shape[:-1], len(parts), *shape)

    # -------------------------------------------------------------- per-agent batches
    def carving(self, n: int) -> tuple[list[tuple[str, str, int, int, Any, torch.dtype]], int]:
        """Per-agent arrays of an ``n``-row batch inside one byte block, as the NumPy buffer
        carves it: ``(field, agent, byte offset, element count, shape, dtype)``, each on a cache
        line, and the block's size in bytes."""
        if n not in self._carvings:
            align = _config.ROW_ALIGN_BYTES
            layout, offset = [], 0
            for field_name in self.codec.field_names:
                for _, agent, _, count, shape, dt in self._by_field[field_name]:
                    nbytes = n * count * _itemsize(dt)
                    layout.append((field_name, agent, offset, count, shape, dt))
                    offset += -(-nbytes // align) * align
            self._carvings = {n: (layout, offset)}  # one batch size at a time, as NumPy
        return self._carvings[n]

    def carve(self, block: Tensor, n: int) -> dict[str, dict[str, Tensor]]:
        """Per-agent C-contiguous views of a byte ``block`` carved for ``n`` rows."""
        layout, _ = self.carving(n)
        out: dict[str, dict[str, Tensor]] = {f: {} for f in self.codec.field_names}
        for field_name, agent, offset, count, shape, dt in layout:
            part = block[offset : offset + n * count * _itemsize(dt)]
            out[field_name][agent] = part.view(dt).view(n, *shape)
        return out

    def fill_per_agent(self, rows: Tensor, block: Tensor) -> None:
        """Copy ``rows`` (shape (n, row_words), int64) into the per-agent ``block`` (bytes):
        one strided copy per run of agents of one field with equal shape and dtype."""
        n = rows.shape[0]
        layout, _ = self.carving(n)
        where = {(f, a): (offset, count) for f, a, offset, count, _, _ in layout}
        for field_name in self.codec.field_names:
            parts = self._by_field[field_name]
            first = 0
            while first < len(parts):
                stop = first + 1
                while (
                    stop < len(parts)
                    and parts[stop][4:] == parts[first][4:]
                    and parts[stop][2] == parts[stop - 1][2] + parts[stop - 1][3]
                ):
                    stop += 1
                _, agent, start, count, _, dt = parts[first]
                size = _itemsize(dt)
                offset, _ = where[(field_name, agent)]
                stride = -(-(n * count * size) // _config.ROW_ALIGN_BYTES)
                stride = stride * _config.ROW_ALIGN_BYTES // size  # next agent's array
                typed = block.view(dt)
                dst = typed.as_strided(
                    (stop - first, n, count),
                    (stride, count, 1),
                    typed.storage_offset() + offset // size,
                )
                src = rows.view(dt)[:, start : start + count * (stop - first)]
                dst.copy_(src.view(n, stop - first, count).transpose(0, 1))
                first = stop


def _itemsize(dt: torch.dtype) -> int:
    return torch.empty(0, dtype=dt).element_size()
