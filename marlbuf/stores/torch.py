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

torch is imported by this module only; ``import marlbuf`` does not need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from marlbuf.batch import Batch, DrawnIndices, NotGathered
from marlbuf.memory import check_fits_in_memory
from marlbuf.rows import RowGeometry, RowViews
from marlbuf.spec import ALIVE, FIELDS, GLOBAL
from marlbuf.stores.base import FieldSelection, Storage, StoreOptions, build_plan, ring_ranges

Tensor = torch.Tensor

#: torch dtypes of the gather plan's segment kinds (source and destination units)
_UNIT_DTYPES = {
    COPY64: (torch.int64, torch.int64),
    COPY32: (torch.int32, torch.int32),
    COPY8: (torch.uint8, torch.uint8),
    HALF_TO_FLOAT: (torch.float16, torch.float32),
}


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


def _not_gathered(codec: RowGeometry | FieldSelection, name: str) -> NotGathered:
    """What stands for the field ``name`` that batches of rows ``codec`` do not hold (left
    out by ``fields=``, or not stored: ``next_obs`` of ``next_obs="none"``)."""
    if isinstance(codec, FieldSelection):
        return codec.not_gathered(name)
    return NotGathered(name, codec.field_names)


def _itemsize(dt: torch.dtype) -> int:
    return torch.empty(0, dtype=dt).element_size()


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


# --------------------------------------------------------------------------------- batches
@dataclass
class _Round:
    """One MADDPG round gathered as one block: trainer ``t``'s rows are ``rows[t]``.

    Attributes
    ----------
    rows : Tensor, shape (T, B, row_words), int64
    indices, generations : ndarray, shape (T, B), int64 (host)
    weights : Tensor, shape (T, B), float32, or None
    """

    rows: Tensor
    indices: np.ndarray
    generations: np.ndarray
    weights: Tensor | None


class DeviceBatch:
    """One mini-batch of a buffer on a torch store: the structure of
    :class:`marlbuf.batch.Batch`, as torch tensors on the buffer's device.

    Attributes
    ----------
    obs, next_obs : dict[str, Tensor]
        Per agent, shape ``(B, *obs_shape)``, the spec's dtype (float16 as float32 unless
        ``batch_dtype="storage"``). A buffer built with ``next_obs="none"`` has no next
        observations: reading ``next_obs`` raises a ``ValueError`` naming that mode.
    action : dict[str, Tensor]
        Per agent, shape ``(B, *action_shape)``.
    reward, done : dict[str, Tensor]
        Per agent, shape ``(B,)``.
    extras : dict[str, dict[str, Tensor]]
        Per-agent extra fields: name -> agent -> ``(B, *shape)``.
    globals : dict[str, Tensor]
        Global fields: name -> ``(B, *shape)``.
    alive : dict[str, Tensor] or None
        Per agent, ``(B,)`` bool (buffers built with ``alive=True``).
    indices : DrawnIndices, shape (B,), int64, on the host
        The slots the rows came from, with their write generations at the draw (pass them
        back to ``update_priorities``).
    generations : ndarray, shape (B,), int64, on the host
        Write generation of each slot when it was sampled.
    weights : Tensor, shape (B,), float32, or None
        Max-normalised importance weights (prioritized samplers), on the device.
    trainer : int or None
        The trainer the batch was drawn for.
    block : Tensor
        The memory every field views: ``(B, row_words)`` int64 rows with
        ``batch_layout="rows"`` (per-agent tensors are strided views, ``concat`` of adjacent
        fields is a zero-copy view), a byte block of C-contiguous per-agent arrays with
        ``batch_layout="per_agent"``.

    The per-field dicts are built on first access (a learner that reads ``concat`` spans never
    pays for the per-agent views). The memory is never reused while a tensor of it is alive.
    A batch gathered with ``fields=`` holds the chosen fields only (``layout`` describes their
    rows); reading a left-out one raises a ``ValueError`` naming ``fields=``.
    ``action_index`` gives the integer actions of discrete agents as int64 tensors (see
    :attr:`marlbuf.batch.Batch.action_index`).
    """

    def __init__(
        self,
        layout: RowLayout,
        block: Tensor,
        per_agent: bool,
        indices: np.ndarray,
        generations: np.ndarray,
        weights: Tensor | None,
        trainer: int | None,
        round_: _Round | None = None,
        position: int = 0,
        discrete_agents: tuple[str, ...] = (),
    ) -> None:
        self.layout = layout
        self.discrete_agents = discrete_agents
        self.block = block
        self.per_agent = per_agent
        self.indices = indices
        self.generations = generations
        self.weights = weights
        self.trainer = trainer
        self.round = round_  # set when the batch is slice ``position`` of one gathered round
        self.position = position
        self._fields: dict[str, dict[str, Tensor]] | None = None

    def _rows(self) -> int:
        """Gathered rows in the block (``B``; ``B * L`` for sequences)."""
        return int(self.indices.shape[0])

    def _shaped(self, views: dict[str, dict[str, Tensor]]) -> dict[str, dict[str, Tensor]]:
        return views

    def _views(self) -> dict[str, dict[str, Tensor]]:
        if self._fields is None:
            n = self._rows()
            raw = (
                self.layout.carve(self.block, n)
                if self.per_agent
                else self.layout.views(self.block)
            )
            self._fields = self._shaped(raw)
        return self._fields

    def _part(self, name: str) -> dict[str, Tensor]:
        """The per-agent views of field ``name``, or the error of a field left out by
        ``fields=``."""
        part = self._views().get(name)
        if part is None:
            _not_gathered(self.layout.codec, name).refuse()
        return part  # type: ignore[return-value]

    @property
    def obs(self) -> dict[str, Tensor]:
        return self._part("obs")

    @property
    def action(self) -> dict[str, Tensor]:
        return self._part("action")

    @property
    def reward(self) -> dict[str, Tensor]:
        return self._part("reward")

    @property
    def next_obs(self) -> dict[str, Tensor]:
        return self._part("next_obs")

    @property
    def done(self) -> dict[str, Tensor]:
        return self._part("done")

    @property
    def action_index(self) -> dict[str, Tensor]:
        """Per discrete agent, its integer action (int64, shape ``(B,)`` or ``(B, L)``, on the
        device): the argmax of the gathered one-hot (0 on masked steps)."""
        action = self.action if self.discrete_agents else {}
        return {a: action[a].argmax(dim=-1) for a in self.discrete_agents}

    @property
    def extras(self) -> dict[str, dict[str, Tensor]]:
        views = self._views()
        return {name: views[name] for name in self.layout.codec.extra_names}

    @property
    def globals(self) -> dict[str, Tensor]:
        views = self._views()
        return {name: views[name][GLOBAL] for name in self.layout.codec.global_fields}

    @property
    def alive(self) -> dict[str, Tensor] | None:
        if self.layout.codec.alive:
            return self._views()[ALIVE]
        if ALIVE in getattr(self.layout.codec, "left_out", ()):
            _not_gathered(self.layout.codec, ALIVE).refuse()
        return None

    def __getattr__(self, name: str) -> Any:
        # extra and global fields as attributes (batch.hidden, batch.state), as on Batch
        if name.startswith("_") or name in ("layout", "block"):
            raise AttributeError(name)
        codec = self.layout.codec
        if name in codec.extra_names:
            return self.extras[name]
        if name in codec.global_fields:
            return self.globals[name]
        if name in getattr(codec, "left_out", ()):
            raise AttributeError(
                f"{name!r} was not gathered: this batch was sampled with "
                f"fields={codec.field_names}; add {name!r} to fields="
            )
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r} (extra fields: "
            f"{list(codec.extra_names)}, global fields: {list(codec.global_fields)})"
        )

    @property
    def device(self) -> torch.device:
        return self.block.device

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rows={len(self)}, agents={len(self.layout.agents)}, "
            f"device={str(self.device)!r}, trainer={self.trainer})"
        )

    @property
    def agents(self) -> list[str]:
        """Agent names, in spec order."""
        return list(self.layout.agents)

    def field(self, name: str) -> dict[str, Tensor]:
        """The per-agent dict of one field (``"obs"``, ``"action"``, ..., an extra field's
        name, or ``"alive"``)."""
        codec = self.layout.codec
        if name in getattr(codec, "left_out", ()):
            _not_gathered(codec, name).refuse()
        names = (*FIELDS, *codec.extra_names) + ((ALIVE,) if codec.alive else ())
        if name not in names:
            raise ValueError(f"name must be one of {names}; got name={name!r}")
        return self._part(name)

    def as_lists(self) -> tuple[list[Tensor], ...]:
        """``(obs_n, act_n, rew_n, next_obs_n, done_n)``: lists of per-agent tensors in agent
        order (the same tensors, no copy)."""
        return tuple(list(self._part(name).values()) for name in FIELDS)

    def concat(self, *fields: str) -> Tensor:
        """All agents' ``fields``, flattened and concatenated: shape ``(B, total_dim)``.

        With ``batch_layout="rows"`` and fields that sit side by side in the row with one dtype
        (``concat("obs", "action")``, the centralized critic's input), a zero-copy view of the
        gathered rows; otherwise a new tensor.
        """
        if not fields:
            raise ValueError("concat needs at least one field name, e.g. concat('obs')")
        for name in fields:
            self.field(name)  # a clear error for an unknown name
        span = None if self.per_agent else self.layout.span(tuple(fields))
        if span is not None:
            start, count, dt = span
            return self._lead(self.block.view(dt)[:, start : start + count])
        parts = [x.reshape(*self._lead_shape(), -1) for n in fields for x in self.field(n).values()]
        return torch.cat(parts, dim=-1)

    def _lead(self, rows: Tensor) -> Tensor:
        return rows

    def _lead_shape(self) -> tuple[int, ...]:
        return (len(self),)

    def to_numpy(self) -> Batch:
        """A host copy as a NumPy :class:`marlbuf.batch.Batch` (copies every field; for checks
        and debugging, not for the training loop)."""

        def host(x: Tensor) -> np.ndarray:
            return x.detach().cpu().numpy().copy()

        codec = self.layout.codec
        chosen = codec.field_names if hasattr(codec, "left_out") else None
        alive_left_out = ALIVE in getattr(codec, "left_out", ())
        alive = None if alive_left_out else self.alive
        fields: dict[str, Any] = {
            name: {a: host(x) for a, x in self.field(name).items()}
            if chosen is None or name in chosen
            else _not_gathered(codec, name)
            for name in FIELDS
        }
        return Batch(
            obs=fields["obs"],
            action=fields["action"],
            reward=fields["reward"],
            next_obs=fields["next_obs"],
            done=fields["done"],
            indices=DrawnIndices.of(np.array(self.indices), np.array(self.generations)),
            generations=np.array(self.generations),
            weights=None if self.weights is None else host(self.weights),
            trainer=self.trainer,
            extras={n: {a: host(x) for a, x in d.items()} for n, d in self.extras.items()},
            globals={n: host(x) for n, x in self.globals.items()},
            alive=_not_gathered(codec, ALIVE)  # type: ignore[arg-type]
            if alive_left_out
            else (None if alive is None else {a: host(x) for a, x in alive.items()}),
            gathered_fields=chosen,
            discrete_agents=self.discrete_agents,
        )


class DeviceSequenceBatch(DeviceBatch):
    """``B`` sequences of ``L`` steps on a torch store (:class:`marlbuf.samplers.Sequence`):
    :class:`marlbuf.batch.SequenceBatch` as torch tensors.

    Every per-step tensor has the leading axes ``(B, L)``; masked steps are zero in every
    field (the gather reads them from the table's row of zeros). ``mask`` is a ``(B, L)`` bool
    tensor on the device; ``slots`` ``(B, L)`` int64 and ``indices`` ``(B,)`` (the training
    starts, for ``update_priorities``) stay on the host.
    """

    def __init__(
        self,
        flat: DeviceBatch,
        mask: np.ndarray,
        burn_in: int,
        slots: np.ndarray,
        indices: np.ndarray,
        generations: np.ndarray,
        weights: Tensor | None,
        trainer: int | None,
        device_mask: Tensor,
    ) -> None:
        super().__init__(
            flat.layout,
            flat.block,
            flat.per_agent,
            indices,
            generations,
            weights,
            trainer,
            discrete_agents=flat.discrete_agents,
        )
        self.mask = device_mask
        self.burn_in = int(burn_in)
        self.slots = slots
        self._steps = int(mask.shape[1])

    def _rows(self) -> int:
        return len(self) * self._steps

    def _lead_shape(self) -> tuple[int, ...]:
        return (len(self), self._steps)

    def _lead(self, rows: Tensor) -> Tensor:
        return rows.reshape(len(self), self._steps, -1)

    def _shaped(self, views: dict[str, dict[str, Tensor]]) -> dict[str, dict[str, Tensor]]:
        n, steps = len(self), self._steps
        return {
            name: {a: x.reshape(n, steps, *x.shape[1:]) for a, x in per.items()}
            for name, per in views.items()
        }


def stack_span(batches: Sequence[DeviceBatch], *fields: str) -> Tensor:
    """``torch.stack([b.concat(*fields) for b in batches])``, shape ``(T, B, width)``: a view
    of the gathered rows when the batches are one round of ``sample_for_trainers`` in trainer
    order (no copy), else a stacked copy."""
    rows = round_rows(batches)
    if rows is not None:
        span = batches[0].layout.span(tuple(fields))
        if span is not None:
            start, count, dt = span
            return rows.view(dt)[..., start : start + count]
    return torch.stack([b.concat(*fields) for b in batches])


def round_rows(batches: Sequence[DeviceBatch]) -> Tensor | None:
    """The ``(T, B, row_words)`` rows of the round the batches make up, when they are exactly
    one round of ``sample_for_trainers`` (batch ``t`` at position ``t``) in ``rows`` layout;
    else ``None``."""
    whole = round_of(batches)
    if whole is None or batches[0].per_agent:
        return None
    return whole.rows


def round_of(batches: Sequence[DeviceBatch]) -> _Round | None:
    """The :class:`_Round` the batches make up (see :func:`round_rows`), or ``None``."""
    first = getattr(batches[0], "round", None)
    if first is None or first.indices.shape[0] != len(batches):
        return None
    if all(b.round is first and b.position == t for t, b in enumerate(batches)):
        return first
    return None


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
        whole = _Round(rows, np.stack(draws), np.stack(generations), stacked)
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
