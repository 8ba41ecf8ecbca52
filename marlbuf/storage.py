"""Host memory for the stores: page-aligned arrays (the default :data:`Allocator`), the
:class:`BlockPool` that recycles gathered batches' memory, and how much memory this process may
still take (:func:`available_memory_bytes`).

The stores themselves live in :mod:`marlbuf.stores`.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable

import numpy as np

from marlbuf import _config


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
