""":class:`MarlbufStorage`: marlbuf's interleaved rows as a TorchRL storage."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers import Storage, TensorStorage
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.compat import NotEnoughDataError
from marlbuf.compat._common import check_size
from marlbuf.compat.torchrl.layout import EXCLUDED_KEYS, TensorDictLayout
from marlbuf.samplers import Uniform

#: ``next_obs`` choices of :class:`MarlbufStorage` (marlbuf's, less ``"none"``, which a storage
#: takes by itself when its TensorDicts have nothing under ``"next"``)
NEXT_OBS_CHOICES = ("auto", "once", "stored")

#: where the rows of a storage live: NumPy arrays (in RAM or mapped files) or one torch tensor
BACKENDS = ("numpy", "torch")

#: version of the plain-data state this module writes (``state_dict``, ``dumps``)
STATE_VERSION = 1


class StorageIndexError(IndexError, ValueError):
    """An index outside the stored items: an ``IndexError``, as TorchRL's tensor storages raise,
    and a ``ValueError`` like every marlbuf input error."""


def to_torch_tree(value: Any) -> Any:
    """Plain data with every NumPy array as a torch tensor (same dtype, shared memory) and
    NumPy scalars as Python numbers: what ``torch.save``/``torch.load(weights_only=True)``
    round-trip without pickling NumPy objects (the inverse of :func:`to_numpy_tree`)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: to_torch_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_torch_tree(v) for v in value)
    return value


def to_numpy_tree(value: Any) -> Any:
    """:func:`to_torch_tree`'s output with every tensor as a NumPy array again."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Mapping):
        return {k: to_numpy_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy_tree(v) for v in value)
    return value


class MarlbufCheckpointer(StorageCheckpointerBase):
    """The checkpointer of :class:`MarlbufStorage` (``storage.dumps(path)``/``loads(path)``,
    and so ``TensorDictReplayBuffer.dumps``/``loads``): the layout as JSON and the rows as
    marlbuf's state file (``MultiAgentReplayBuffer.save``: no pickle, written atomically)."""

    def dumps(self, storage: MarlbufStorage, path: Any) -> None:
        if self._save_hooks:
            raise ValueError(
                "MarlbufStorage saves marlbuf rows, not TensorDicts: save hooks cannot apply; "
                "register none on this storage"
            )
        storage.save_folder(path)

    def loads(self, storage: MarlbufStorage, path: Any) -> None:
        if self._load_hooks:
            raise ValueError(
                "MarlbufStorage loads marlbuf rows, not TensorDicts: load hooks cannot apply; "
                "register none on this storage"
            )
        storage.load_folder(path)


class MarlbufStorage(TensorStorage):
    """A TorchRL storage of marlbuf rows: ``LazyTensorStorage``'s place in a
    ``TensorDictReplayBuffer``, with next observations stored once and one gather per sample.

    Built lazily from the first TensorDict written, as ``LazyTensorStorage`` is: nested keys,
    agent groups with a leading ``n_agents`` axis, ``("next", ...)`` keys, any dtypes and
    shapes (see :mod:`marlbuf.compat.torchrl.layout`). Every key ``k`` that also appears as
    ``("next", *k)`` is stored once where the next step's ``k`` equals it. ``get(index)`` is one
    gather that returns a TensorDict equal, bit for bit, to ``LazyTensorStorage``'s at the same
    indices; on the CPU its leaves are contiguous tensors viewing the gathered block (no further
    copy). Keys named in ``exclude_keys`` are never stored (``td_error``, ``index``, importance
    weights: what TorchRL's buffers and losses write into TensorDicts).

    Writes go where TorchRL's round-robin writer (the default of ``TensorDictReplayBuffer``)
    puts them, in ring order; writes at chosen indices (``rb[i] = data``,
    ``TensorDictMaxValueWriter``) are refused with a ``ValueError``.

    Parameters
    ----------
    max_size : int
        Capacity in items (transitions).
    device : str or torch.device, default "cpu"
        Where sampled TensorDicts live. ``"cpu"``: rows in NumPy arrays (marlbuf's host store,
        or mapped files with ``path=``). A CUDA device: rows in one tensor on it (marlbuf's
        torch store), sampled TensorDicts of device tensors. ``"auto"``: the device of the
        first data written.
    next_obs : {"auto", "once", "stored"}, default "auto"
        marlbuf's format for the ``("next", ...)`` leaves that have a partner outside
        ``"next"``: ``"once"`` stores them once (a side row where a step's next value differs
        from the following step's), ``"stored"`` in every row, ``"auto"`` lets the first write
        decide (see :class:`marlbuf.MultiAgentReplayBuffer`). TensorDicts with nothing under
        ``"next"`` need no choice.
    path : str or path-like, optional
        Keep the rows in memory-mapped files in this folder (new or empty; its parent must
        exist): capacity bounded by disk, not RAM (marlbuf's ``path=``). The folder belongs to
        the storage: emptying the storage (``rb.empty()``) deletes what it wrote there.
    exclude_keys : sequence of str, default :data:`~marlbuf.compat.torchrl.layout.EXCLUDED_KEYS`
        Names of leaves (the last part of a key, or of a TensorDict holding it) never stored.
    backend : {"numpy", "torch"}, optional
        Where rows live: NumPy arrays (default on the CPU; the only one with ``path=``) or one
        torch tensor (the default, and the only one, on other devices).
    contiguous : bool, default True
        ``True``: every leaf of a sampled TensorDict is a contiguous tensor (as
        ``LazyTensorStorage``'s are), written so by the gather. ``False``: the gather copies
        whole rows (marlbuf's fastest gather, about twice as fast for wide rows) and every leaf
        is a strided view into them: its row stride is the whole row, so ``.view()`` on it
        fails (``.reshape()`` works) and operations read it strided.
    checkpointer : StorageCheckpointerBase, optional
        Defaults to :class:`MarlbufCheckpointer`.

    Attributes
    ----------
    buffer : MultiAgentReplayBuffer or None
        The rows: a marlbuf buffer (``buffer.nbytes``, ``buffer.next_obs``), ``None`` before the
        first write and after emptying.
    layout : TensorDictLayout or None
        The structure of the stored TensorDicts, fixed by the first write.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import TensorDictReplayBuffer
    >>> from marlbuf.compat.torchrl import MarlbufStorage
    >>> obs = torch.arange(33.0).reshape(11, 1, 3).expand(11, 2, 3)
    >>> data = TensorDict({"agents": {"observation": obs[:-1]},
    ...                    "next": {"agents": {"observation": obs[1:]}}}, batch_size=[10])
    >>> rb = TensorDictReplayBuffer(storage=MarlbufStorage(100, next_obs="once"), batch_size=4)
    >>> rb.extend(data).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> rb.storage.get(torch.tensor([2, 9]))["next", "agents", "observation"][:, 0]
    tensor([[ 9., 10., 11.],
            [30., 31., 32.]])
    >>> rb.storage.buffer.next_obs  # the next observations are the following obs, stored once
    'once'
    """

    _default_checkpointer = MarlbufCheckpointer
    supports_conditional_update = False
    #: torch device of the rows and samples (``"auto"`` until the first write settles it)
    device: Any

    def __init__(
        self,
        max_size: int,
        *,
        device: Any = "cpu",
        next_obs: str = "auto",
        path: str | os.PathLike[str] | None = None,
        exclude_keys: Sequence[str] = EXCLUDED_KEYS,
        backend: str | None = None,
        contiguous: bool = True,
        checkpointer: StorageCheckpointerBase | None = None,
    ) -> None:
        capacity = check_size(max_size)
        if next_obs not in NEXT_OBS_CHOICES:
            raise ValueError(
                f"next_obs must be one of {NEXT_OBS_CHOICES}; got next_obs={next_obs!r}"
            )
        if isinstance(exclude_keys, str) or not all(isinstance(k, str) for k in exclude_keys):
            raise TypeError(
                f"exclude_keys must be a sequence of key names (str); got {exclude_keys!r}"
            )
        if not isinstance(contiguous, bool):
            raise TypeError(f"contiguous must be a bool; got contiguous={contiguous!r}")
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got backend={backend!r}")
        if device != "auto":
            device = torch.device(device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(
                    f"device={str(device)!r} but torch.cuda.is_available() is False: use "
                    "device='cpu' (rows in host memory)"
                )
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            if device.type != "cpu" and backend == "numpy":
                raise ValueError(
                    f"backend='numpy' keeps rows in host memory; device={str(device)!r} needs "
                    "backend='torch' (or leave backend out)"
                )
        if path is not None and (backend == "torch" or (device != "auto" and device.type != "cpu")):
            raise ValueError(
                "path= keeps rows in memory-mapped NumPy files: it needs device='cpu' and "
                f"backend='numpy'; got device={device!r}, backend={backend!r}"
            )
        # set before TorchRL's constructor, which reads the length and the initialized flag
        self.buffer: MultiAgentReplayBuffer | None = None
        self.layout: TensorDictLayout | None = None
        super().__init__(None, capacity, device=device, ndim=1)
        self.checkpointer = checkpointer
        self.next_obs = next_obs
        self.path = None if path is None else Path(path)
        self.exclude_keys = tuple(exclude_keys)
        self.backend = backend
        self.contiguous = contiguous

    # ------------------------------------------------------------------ TorchRL's sizes
    @property
    def _len(self) -> int:
        return 0 if self.buffer is None else len(self.buffer)

    @_len.setter
    def _len(self, value: int) -> None:
        if value != self._len:
            raise ValueError(
                f"MarlbufStorage's length is the number of rows written ({self._len}); it "
                f"cannot be set to {value} (writes at chosen indices are not supported: use "
                "the default round-robin writer)"
            )

    def __len__(self) -> int:
        return self._len

    @property
    def _total_shape(self) -> torch.Size | None:
        return None if self.layout is None else torch.Size([self.max_size])

    @property
    def shape(self) -> torch.Size:
        return torch.Size([len(self)])

    @property
    def initialized(self) -> bool:
        """Whether the first write fixed the structure (``LazyTensorStorage``'s flag)."""
        return self.layout is not None

    @initialized.setter
    def initialized(self, value: bool) -> None:
        if value != self.initialized:
            raise ValueError("MarlbufStorage is initialized by its first write")

    def contains(self, item: Any) -> Any:
        size = len(self)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            item = int(item) + size if item < 0 else int(item)
            return 0 <= item < size
        if isinstance(item, torch.Tensor):
            index = torch.where(item < 0, item + size, item)
            return (index >= 0) & (index < size)
        raise TypeError(f"contains takes an int or an integer tensor; got {type(item).__name__}")

    def flatten(self) -> MarlbufStorage:
        return self

    # ------------------------------------------------------------------ writing
    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                "MarlbufStorage stores TensorDicts (use it in a TensorDictReplayBuffer); got "
                f"{type(data).__name__}"
            )
        slots, single = _slots(cursor)
        if single:
            data = data.unsqueeze(0)
        if not data.batch_dims or data.batch_size[0] != slots.shape[0]:
            raise ValueError(
                f"cursor names {slots.shape[0]} items but the data's batch size is "
                f"{tuple(data.batch_size)}"
            )
        if not set_cursor:
            raise ValueError(
                "MarlbufStorage writes in ring order (the round-robin writer's): overwriting "
                "items at chosen indices (storage[index] = data, rb[index] = data) is not "
                "supported"
            )
        layout = self.layout
        if layout is None:
            layout = TensorDictLayout.from_data(data, 1, self.exclude_keys)
        tensors = layout.check(data, 1)
        buffer, created = self.buffer, False
        device = self._resolved_device(_data_device(data))
        if buffer is None:
            buffer, created = self._make_buffer(layout, device), True
        steps = slots.shape[0]
        expected = (buffer.cursor + np.arange(steps, dtype=np.int64)) % self.max_size
        try:
            if not np.array_equal(slots, expected):
                shown = slots[:8].tolist()
                raise ValueError(
                    f"MarlbufStorage writes in ring order: the next {steps} slots are "
                    f"{expected[:8].tolist()}{'...' if steps > 8 else ''}, got "
                    f"{shown}{'...' if steps > 8 else ''}. Use the default round-robin writer "
                    "(TensorDictRoundRobinWriter); writers that choose slots "
                    "(TensorDictMaxValueWriter, write_at) are not supported"
                )
            buffer.extend(**layout.marlbuf_fields(tensors, steps))
        except BaseException:
            if created:
                self._discard(buffer)
            raise
        self.layout, self.buffer, self.device = layout, buffer, device
        set_last = getattr(self, "_set_last_cursor", None)
        if set_last is not None:
            set_last(cursor)
        else:
            self._last_cursor = cursor
        bump = getattr(self, "_bump_mutation_revision", None)
        if bump is not None:
            bump()

    def _resolved_device(self, data_device: torch.device) -> torch.device:
        """The rows' device: this storage's, or with ``device="auto"`` the data's."""
        return data_device if self.device == "auto" else self.device

    def _make_buffer(self, layout: TensorDictLayout, device: torch.device) -> Any:
        """A new marlbuf buffer for ``layout`` with its rows on ``device``."""
        backend = self.backend or ("numpy" if device.type == "cpu" else "torch")
        if device.type != "cpu" and backend == "numpy":
            raise ValueError(
                f"backend='numpy' keeps rows in host memory; the data is on {device}: pass "
                "device='cpu' (rows on the host) or leave backend out"
            )
        return MultiAgentReplayBuffer(
            layout.specs,
            self.max_size,
            sampler=Uniform(),
            seed=0,
            n_trainers=1,
            batch_layout="per_agent" if self.contiguous else "rows",
            next_obs=self.next_obs if layout.has_next else "none",
            path=self.path,
            global_fields=layout.global_fields,
            device=None if backend == "numpy" else device,
        )

    def _discard(self, buffer: MultiAgentReplayBuffer) -> None:
        """Drop a buffer this storage made (a failed first write, emptying): a memory-mapped
        one is closed and its folder's files deleted (the folder was empty before)."""
        buffer.close()
        folder = buffer.path
        if folder is not None:
            shutil.rmtree(folder)
            os.mkdir(folder)

    # ------------------------------------------------------------------ reading
    def get(self, index: Any) -> TensorDictBase:
        if self.layout is None:
            raise NotEnoughDataError(
                "Cannot get elements out of an empty MarlbufStorage: extend the replay buffer first"
            )
        flat, lead = _indices(index, len(self))
        device = None if self.device == "auto" else self.device
        if flat.shape[0] == 0 or self.buffer is None:  # no index, or an emptied storage
            return self.layout.empty(lead, device)
        # contiguous leaves: the chosen fields carved into arrays of their own; strided ones:
        # whole rows (the default gather, the fastest: one copy per row and section)
        fields = self.layout.gather_fields if self.contiguous else None
        batch = self.buffer.gather(flat, fields=fields)
        return self.layout.tensordict(batch, lead, device)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain data and tensors (``torch.save`` and ``torch.load(weights_only=True)`` take
        it): the layout, and marlbuf's buffer state with its arrays as tensors."""
        return {
            "marlbuf_storage": STATE_VERSION,
            "max_size": self.max_size,
            "layout": None if self.layout is None else self.layout.to_dict(),
            "buffer": None if self.buffer is None else to_torch_tree(self.buffer.state_dict()),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        layout, buffer_state = self._checked_state(state_dict)
        self._restore(layout, None if buffer_state is None else to_numpy_tree(buffer_state))

    def _checked_state(self, state: Any) -> tuple[TensorDictLayout | None, Any]:
        if not isinstance(state, Mapping) or "marlbuf_storage" not in state:
            raise ValueError(
                "not a MarlbufStorage state (its state_dict() output): a LazyTensorStorage's "
                "state cannot be loaded into a MarlbufStorage; extend the buffer with its data "
                "instead"
            )
        if state["marlbuf_storage"] != STATE_VERSION:
            raise ValueError(
                f"MarlbufStorage state version {state['marlbuf_storage']!r}; this marlbuf "
                f"reads version {STATE_VERSION}"
            )
        if state.get("max_size") != self.max_size:
            raise ValueError(
                f"the state is of a storage of max_size={state.get('max_size')!r}; this one "
                f"has max_size={self.max_size}"
            )
        layout = None if state["layout"] is None else TensorDictLayout.from_dict(state["layout"])
        if layout is None and state.get("buffer") is not None:
            raise ValueError("the state holds rows but no layout")
        return layout, state.get("buffer")

    def _restore(self, layout: TensorDictLayout | None, buffer_state: Any) -> None:
        """Replace the content by ``buffer_state`` (marlbuf's state, or ``None``: empty) of
        ``layout``; nothing changes when it fails."""
        if buffer_state is None:
            self._empty()
            self.layout = layout
            return
        if layout is None:
            raise ValueError("a MarlbufStorage state with rows must hold their layout")
        old = self.buffer
        if old is not None and self.path is not None:
            if self.layout is None or self.layout.to_dict() != layout.to_dict():
                raise ValueError(
                    "a MarlbufStorage with path= loads states of its own layout only (its "
                    "files are laid out already); load into a new storage"
                )
            old.load_state_dict(buffer_state)
            return
        device = self._resolved_device(torch.device("cpu"))
        new = self._make_buffer(layout, device)
        try:
            new.load_state_dict(buffer_state)
        except BaseException:
            self._discard(new)
            raise
        self.layout, self.buffer, self.device = layout, new, device

    def save_folder(self, path: Any) -> None:
        """Write this storage into folder ``path`` (created if missing): ``layout.json`` and,
        unless empty, ``rows.npz`` (``MultiAgentReplayBuffer.save``)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "marlbuf_storage": STATE_VERSION,
            "max_size": self.max_size,
            "layout": None if self.layout is None else self.layout.to_dict(),
            "buffer": None if self.buffer is None else "rows.npz",
        }
        if self.buffer is not None:
            self.buffer.save(folder / "rows.npz", overwrite=True)
        tmp = folder / "layout.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, folder / "layout.json")

    def load_folder(self, path: Any) -> None:
        """Replace the content by what :meth:`save_folder` wrote to ``path`` (the file is read
        into a marlbuf buffer, then copied into this storage's: it takes up to three times the
        rows' memory while it runs)."""
        folder = Path(path)
        try:
            meta = json.loads((folder / "layout.json").read_text())
        except FileNotFoundError as exc:
            raise ValueError(
                f"{folder} holds no MarlbufStorage (no layout.json): was it written by "
                "MarlbufStorage.dumps?"
            ) from exc
        layout, rows = self._checked_state(meta)
        if rows is None:
            self._restore(layout, None)
            return
        loaded = MultiAgentReplayBuffer.load(folder / "rows.npz")
        self._restore(layout, loaded.state_dict())

    def _empty(self) -> None:
        if self.buffer is not None:
            buffer, self.buffer = self.buffer, None
            self._discard(buffer)
        bump = getattr(self, "_bump_mutation_revision", None)
        if bump is not None:
            bump()

    def _init(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("MarlbufStorage is initialized by its first write")

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:
            raise RuntimeError(
                "MarlbufStorage cannot be shared between processes (its rows are in this "
                "process's memory); write from the process that owns the buffer"
            )
        if self.path is not None and self.buffer is not None:
            raise TypeError(
                "a MarlbufStorage with path= is not picklable (its rows are open files): "
                "save it with dumps(folder) instead"
            )
        state = Storage.__getstate__(self)
        state["buffer"] = None if self.buffer is None else self.buffer.state_dict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        buffer_state = state.pop("buffer")
        restore = getattr(Storage, "__setstate__", None)
        if restore is not None:
            restore(self, state)
        else:
            self.__dict__.update(state)
        self.buffer = None
        if buffer_state is not None and self.layout is not None:
            self.buffer = self._make_buffer(self.layout, self.device)
            self.buffer.load_state_dict(buffer_state)

    def __repr__(self) -> str:
        rows = "not written yet" if self.buffer is None else repr(self.buffer)
        return (
            f"MarlbufStorage(max_size={self.max_size}, len={len(self)}, device={self.device}, "
            f"rows={rows})"
        )


def _data_device(data: TensorDictBase) -> torch.device:
    """The device of ``data`` (of its first leaf when the TensorDict has none)."""
    if data.device is not None:
        return torch.device(data.device)
    for value in data.values(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _slots(cursor: Any) -> tuple[np.ndarray, bool]:
    """The slots a write names (int64, 1-D) and whether it names a single item."""
    if isinstance(cursor, (int, np.integer)) and not isinstance(cursor, bool):
        return np.array([int(cursor)], dtype=np.int64), True
    if isinstance(cursor, torch.Tensor):
        if cursor.ndim == 0:
            return np.array([int(cursor)], dtype=np.int64), True
        cursor = cursor.detach().cpu().numpy()
    if isinstance(cursor, range):
        cursor = np.arange(cursor.start, cursor.stop, cursor.step, dtype=np.int64)
    slots = np.asarray(cursor)
    if slots.ndim != 1 or slots.dtype.kind not in "iu":
        raise TypeError(
            f"cursor must be an int or a 1-D integer index; got {type(cursor).__name__} of "
            f"shape {slots.shape}"
        )
    return slots.astype(np.int64, copy=False), False


def _indices(index: Any, size: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """The item indices of ``get`` as flat int64 slots in ``[0, size)``, and the shape of the
    index (``()`` for one item): negative indices count from ``size``, as in a truncated
    ``LazyTensorStorage``; slices resolve against ``size``."""
    lead: tuple[int, ...]
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        flat, lead = np.array([int(index)], dtype=np.int64), ()
    elif isinstance(index, slice):
        flat = np.arange(*index.indices(size), dtype=np.int64)
        lead = (flat.shape[0],)
    else:
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        elif isinstance(index, range):
            index = np.arange(index.start, index.stop, index.step, dtype=np.int64)
        elif isinstance(index, tuple):
            raise TypeError(
                "MarlbufStorage is one-dimensional (ndim=1): index it with an int, a slice or "
                f"an integer array, not a tuple; got {index!r:.80}"
            )
        array = np.asarray(index)
        if array.dtype == np.bool_:
            if array.shape != (size,):
                raise StorageIndexError(
                    f"a boolean index must have shape ({size},) (one flag per stored item); "
                    f"got {array.shape}"
                )
            array = np.flatnonzero(array)
        if array.dtype.kind not in "iu" and array.size:
            raise TypeError(f"index must hold integers; got dtype {array.dtype}")
        lead = tuple(array.shape)
        flat = array.reshape(-1).astype(np.int64, copy=False)
    flat = np.where(flat < 0, flat + size, flat)
    if flat.size and (flat.min() < 0 or flat.max() >= size):
        bad = flat[(flat < 0) | (flat >= size)][0]
        raise StorageIndexError(
            f"index {int(bad)} is outside the {size} stored items (indices lie in [0, {size}), "
            "negative ones count from the end)"
        )
    return flat, lead
