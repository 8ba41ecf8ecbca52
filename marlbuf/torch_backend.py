"""The torch backend: the interleaved row table as one torch tensor, on a GPU or on the host.

``MultiAgentReplayBuffer(specs, capacity, ..., device="cuda")`` returns a
:class:`TorchReplayBuffer` (``device="cpu"`` runs the same code on the host). It has the public
API of the NumPy buffer; what differs is where the data lives and what a batch holds:

* **Storage** - one ``int64`` tensor on the device holding rows in exactly the interleaved
  format of the NumPy buffer's table (the bits of its ``uint64`` table): lean rows without
  next_obs when observations are stored once (``next_obs="once"``, the default, as in the NumPy
  buffer), dense rows with ``next_obs="stored"``; float16 fields stay float16.
  ``add``/``extend``/``add_envs`` validate and stage on the host with the same
  :class:`marlbuf.staging.RowCodec` (same checks, same messages); the staged rows then travel
  to the device through two pinned host buffers with ``non_blocking=True`` copies (a CUDA event
  per buffer keeps a buffer from being refilled before its copy has run).
* **Observations stored once** - the links (successor slot or side row per slot) are kept on
  the host by the NumPy buffer's own :class:`marlbuf.writer.NextObsLinks` and mirrored to the
  device at each commit (the changed entries only, through the same pinned buffers); the side
  rows live in table rows after the ring. A gather reads every next_obs with one
  ``index_select`` from the successor's row or the side row (``torch.where`` of the links).
* **Sampling** - indices are drawn on the device from a seeded ``torch.Generator``: ``Uniform``
  by ``randint``/``randperm`` (``order="memory"``: sorted uniforms from exponential spacings, or
  a sorted ``randperm`` prefix without replacement), ``Neighbor`` references by ``randperm``
  (with dense float32 rows each run is then one contiguous block of rows),
  ``Prioritized``/``PrioritizedNeighbor`` from float64 prefix sums (see
  :class:`_DevicePrioritized`). With dense float32 rows a batch is one
  ``index_select`` of whole rows into a preallocated output (a whole MADDPG round is one
  ``index_select`` into one ``(T * B, row)`` block); other formats take one per merged segment
  of the NumPy buffer's gather plan (three for lean float32 rows). Nothing in ``sample``,
  ``sample_for_trainers`` or ``update_priorities(..., sync=False)`` waits for the device
  (except a prioritized sampler with ``eps ** alpha == 0``, which checks for an all-zero total
  on the host).
* **Batches** - :class:`DeviceBatch`: the structure of :class:`marlbuf.batch.Batch` with torch
  tensors (per-agent tensors are views of the gathered rows; ``indices``, ``generations`` and
  ``weights`` are device tensors). Batch rows are the NumPy buffer's: dense, with float16
  fields converted to float32 in the gather unless ``batch_dtype="storage"``.

Files written by :meth:`TorchReplayBuffer.save` are the NumPy buffer's files (same format, plus
the torch generator's state): a buffer saved on one device loads on another, and
``MultiAgentReplayBuffer.load`` reads them as a NumPy buffer (and the other way round).

torch is imported by this module only; ``import marlbuf`` does not need it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "MultiAgentReplayBuffer(..., device=...) needs PyTorch: pip install 'marlbuf[algos]' "
        "(or use device=None, the NumPy buffer)"
    ) from exc

from marlbuf import _config, persistence
from marlbuf._kernels import scatter_lean
from marlbuf._kernels.plan import COPY8, COPY32, COPY64, HALF_TO_FLOAT
from marlbuf.batch import Batch
from marlbuf.buffer import (
    NEXT_OBS_MODES,
    MultiAgentReplayBuffer,
    _check_arguments,
    _check_header,
    make_rng,
    row_options_of,
)
from marlbuf.memory import check_fits_in_memory, estimate
from marlbuf.prioritized import LinearBeta, checked_tree_state
from marlbuf.samplers import (
    Neighbor,
    Prioritized,
    PrioritizedNeighbor,
    Sampler,
    Uniform,
    _not_enough_data,
)
from marlbuf.spec import FIELDS, AgentSpec, FieldSpec, extra_names, normalize_specs
from marlbuf.staging import RowCodec
from marlbuf.storage import (
    BATCH_DTYPES,
    BATCH_LAYOUTS,
    LAYOUTS,
    BlockPool,
    _ring_ranges,
    _widened,
    build_plan,
)
from marlbuf.writer import NextObsLinks, RingWriter

Tensor = torch.Tensor

#: check codes of priority-update entries (the first bad entry of a call names its error)
_OK, _NOT_FINITE, _NEGATIVE, _OVERFLOW, _BAD_INDEX = 0, 1, 2, 3, 4


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype (``float32`` -> ``torch.float32``)."""
    try:
        return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
    except TypeError as exc:
        raise TypeError(
            f"the torch backend cannot hold dtype {np.dtype(dtype)} (torch has no such dtype); "
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
            f"the torch backend runs on 'cpu' and 'cuda' devices; got device={str(dev)!r}"
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
    codec : RowCodec
        The buffer's row format (offsets of every (field, agent) in a row).
    lean : bool, default False
        Describe the codec's lean rows (observations stored once: no ``next_obs`` section)
        instead of its dense rows.
    """

    def __init__(self, codec: RowCodec, lean: bool = False) -> None:
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
        self._by_field = {f: [s for s in self.slots if s[0] == f] for f in FIELDS}
        self._spans: dict[tuple[str, ...], tuple[int, int, torch.dtype] | None] = {}
        self._carvings: dict[int, tuple[list[tuple[str, str, int, int, Any, torch.dtype]], int]]
        self._carvings = {}

    def views(self, rows: Tensor) -> dict[str, dict[str, Tensor]]:
        """Per field, per agent, views of ``rows`` (shape (n, row_words), int64): shape
        ``(n, *shape)``, the spec's dtype, row stride = the whole row."""
        n = rows.shape[0]
        typed: dict[torch.dtype, Tensor] = {}
        out: dict[str, dict[str, Tensor]] = {f: {} for f in FIELDS}
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
            for field_name in FIELDS:
                for _, agent, _, count, shape, dt in self._by_field[field_name]:
                    nbytes = n * count * _itemsize(dt)
                    layout.append((field_name, agent, offset, count, shape, dt))
                    offset += -(-nbytes // align) * align
            self._carvings = {n: (layout, offset)}  # one batch size at a time, as NumPy
        return self._carvings[n]

    def carve(self, block: Tensor, n: int) -> dict[str, dict[str, Tensor]]:
        """Per-agent C-contiguous views of a byte ``block`` carved for ``n`` rows."""
        layout, _ = self.carving(n)
        out: dict[str, dict[str, Tensor]] = {f: {} for f in FIELDS}
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
        for field_name in FIELDS:
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


#: row width of :func:`running_max`'s two-level scan
_SCAN_ROW = 1024


def running_max(x: Tensor) -> Tensor:
    """Inclusive running maximum of a 1-D tensor (``torch.cummax(x, 0).values``), computed as
    a scan of rows of :data:`_SCAN_ROW` elements carried across rows.

    Equal to ``cummax`` element for element (a maximum does not round). On a GPU,
    ``cummax`` along one long row runs in a single thread block (milliseconds at 10^6
    elements); the rows here are scanned in parallel and only the ``n / 1024`` row ends
    are scanned in one block.
    """
    n = int(x.shape[0])
    if n <= 4 * _SCAN_ROW:
        return torch.cummax(x, 0).values
    rows = n // _SCAN_ROW
    head = torch.cummax(x[: rows * _SCAN_ROW].view(rows, _SCAN_ROW), dim=1).values
    carry = torch.cummax(head[:, -1], 0).values  # running maximum of the row ends
    head[1:] = torch.maximum(head[1:], carry[:-1, None])
    if rows * _SCAN_ROW == n:
        return head.view(-1)
    tail = torch.maximum(torch.cummax(x[rows * _SCAN_ROW :], 0).values, carry[-1])
    return torch.cat([head.view(-1), tail])


def _itemsize(dt: torch.dtype) -> int:
    return torch.empty(0, dtype=dt).element_size()


# --------------------------------------------------------------------------------- batches
@dataclass
class _Round:
    """One MADDPG round gathered together: trainer ``t``'s rows are ``rows[t]``.

    Attributes
    ----------
    rows : Tensor, shape (T, B, row_words), int64
    indices, generations : Tensor, shape (T, B), int64
    weights : Tensor, shape (T, B), float32, or None
    """

    rows: Tensor
    indices: Tensor
    generations: Tensor
    weights: Tensor | None


class DeviceBatch:
    """One mini-batch of a :class:`TorchReplayBuffer`: the structure of
    :class:`marlbuf.batch.Batch`, as torch tensors on the buffer's device.

    Attributes
    ----------
    obs, next_obs : dict[str, Tensor]
        Per agent, shape ``(B, *obs_shape)``, the spec's dtype.
    action : dict[str, Tensor]
        Per agent, shape ``(B, *action_shape)``.
    reward, done : dict[str, Tensor]
        Per agent, shape ``(B,)``.
    indices : Tensor, shape (B,), int64
        The slots the rows came from, on the device (pass them back to ``update_priorities``).
    generations : Tensor, shape (B,), int64
        Write generation of each slot when it was sampled.
    weights : Tensor, shape (B,), float32, or None
        Max-normalised importance weights (prioritized samplers).
    trainer : int or None
        The trainer the batch was drawn for.
    block : Tensor
        The memory every field views: ``(B, row_words)`` int64 rows with
        ``batch_layout="rows"`` (per-agent tensors are strided views, ``concat`` of adjacent
        fields is a zero-copy view), a byte block of C-contiguous per-agent arrays with
        ``batch_layout="per_agent"``.

    The per-agent dicts are built on first access (a learner that reads ``concat`` spans never
    pays for 5N views). The memory is never reused while any tensor of the batch is alive.
    """

    def __init__(
        self,
        layout: RowLayout,
        block: Tensor,
        per_agent: bool,
        indices: Tensor,
        generations: Tensor,
        weights: Tensor | None,
        trainer: int | None,
        round_: _Round | None = None,
        position: int = 0,
    ) -> None:
        self.layout = layout
        self.block = block
        self.per_agent = per_agent
        self.indices = indices
        self.generations = generations
        self.weights = weights
        self.trainer = trainer
        self.round = round_  # set when the batch is slice ``position`` of one gathered round
        self.position = position
        self._fields: dict[str, dict[str, Tensor]] | None = None

    def _views(self) -> dict[str, dict[str, Tensor]]:
        if self._fields is None:
            n = len(self)
            if self.per_agent:
                self._fields = self.layout.carve(self.block, n)
            else:
                self._fields = self.layout.views(self.block)
        return self._fields

    @property
    def obs(self) -> dict[str, Tensor]:
        return self._views()["obs"]

    @property
    def action(self) -> dict[str, Tensor]:
        return self._views()["action"]

    @property
    def reward(self) -> dict[str, Tensor]:
        return self._views()["reward"]

    @property
    def next_obs(self) -> dict[str, Tensor]:
        return self._views()["next_obs"]

    @property
    def done(self) -> dict[str, Tensor]:
        return self._views()["done"]

    @property
    def device(self) -> torch.device:
        return self.block.device

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        return (
            f"DeviceBatch(rows={len(self)}, agents={len(self.layout.agents)}, "
            f"device={str(self.device)!r}, trainer={self.trainer})"
        )

    @property
    def agents(self) -> list[str]:
        """Agent names, in spec order."""
        return list(self.layout.agents)

    def field(self, name: str) -> dict[str, Tensor]:
        """The per-agent dict of one field (``"obs"``, ``"action"``, ...)."""
        if name not in FIELDS:
            raise ValueError(f"name must be one of {FIELDS}; got name={name!r}")
        return self._views()[name]

    def as_lists(self) -> tuple[list[Tensor], ...]:
        """``(obs_n, act_n, rew_n, next_obs_n, done_n)``: lists of per-agent tensors in agent
        order (the same tensors, no copy)."""
        views = self._views()
        return tuple(list(views[name].values()) for name in FIELDS)

    def concat(self, *fields: str) -> Tensor:
        """All agents' ``fields``, flattened and concatenated: shape ``(B, total_dim)``.

        With ``batch_layout="rows"`` and fields that sit side by side in the row with one dtype
        (``concat("obs", "action")``, the centralized critic's input), a zero-copy view of the
        gathered rows; otherwise a new tensor.
        """
        if not fields:
            raise ValueError("concat needs at least one field name, e.g. concat('obs')")
        for name in fields:
            if name not in FIELDS:
                raise ValueError(f"fields must be among {FIELDS}; got {name!r}")
        span = None if self.per_agent else self.layout.span(tuple(fields))
        if span is not None:
            start, count, dt = span
            return self.block.view(dt)[:, start : start + count]
        n = len(self)
        parts = [x.reshape(n, -1) for name in fields for x in self.field(name).values()]
        return torch.cat(parts, dim=1)

    def to_numpy(self) -> Batch:
        """A host copy as a NumPy :class:`marlbuf.batch.Batch` (copies every field; for checks
        and debugging, not for the training loop)."""
        fields = {
            name: {a: x.detach().cpu().numpy().copy() for a, x in self.field(name).items()}
            for name in FIELDS
        }
        return Batch(
            fields["obs"],
            fields["action"],
            fields["reward"],
            fields["next_obs"],
            fields["done"],
            indices=self.indices.cpu().numpy().copy(),
            generations=self.generations.cpu().numpy().copy(),
            weights=None if self.weights is None else self.weights.cpu().numpy().copy(),
            trainer=self.trainer,
        )


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
    first = batches[0].round
    if first is None or first.rows.shape[0] != len(batches) or batches[0].per_agent:
        return None
    if all(b.round is first and b.position == t for t, b in enumerate(batches)):
        return first.rows
    return None


def round_of(batches: Sequence[DeviceBatch]) -> _Round | None:
    """The :class:`_Round` the batches make up (see :func:`round_rows`), or ``None``."""
    first = batches[0].round
    if first is None or first.indices.shape[0] != len(batches):
        return None
    if all(b.round is first and b.position == t for t, b in enumerate(batches)):
        return first
    return None


# --------------------------------------------------------------------------------- samplers
@dataclass
class _Draw:
    """Indices drawn for ``K`` trainers: ``indices`` (K, B) int64, ``weights`` (K, B) float32
    or None, ``refs`` (K, R) int64 neighbor references (rows ``refs + 0 .. run - 1``) or None."""

    indices: Tensor
    weights: Tensor | None
    refs: Tensor | None


class _DeviceSampler:
    """Index draws on the device for one buffer (configured by a :class:`Sampler`)."""

    weighted = False
    run_length = 0  # > 0: draws come in contiguous runs of this many rows (block gathers)

    def __init__(self, sampler: Sampler, capacity: int, n_trainers: int, device: Any) -> None:
        self.sampler = sampler
        self.capacity = capacity
        self.n_trainers = n_trainers
        self.device = device

    def draw(self, trainers: range, batch_size: int, size: int, gen: torch.Generator) -> _Draw:
        raise NotImplementedError

    def on_write(self, ranges: list[tuple[int, int, int]]) -> None:
        """Slots ``lo:hi`` of each range were (over)written."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (nothing for stateless samplers)."""


def _sorted_uniforms(k: int, batch_size: int, gen: torch.Generator, device: Any) -> Tensor:
    """(k, B) float64: per row the order statistics of B i.i.d. uniforms, from B + 1 exponential
    spacings (as :func:`marlbuf._kernels.sorted_uniforms`). A parallel prefix sum need not be
    monotone to the last bit, so a running maximum keeps every row non-decreasing."""
    spacings = torch.empty((k, batch_size + 1), dtype=torch.float64, device=device)
    partial = spacings.exponential_(generator=gen).cumsum(dim=1)
    return torch.cummax(partial[:, :-1] / partial[:, -1:], dim=1).values


class _DeviceUniform(_DeviceSampler):
    def __init__(self, sampler: Uniform, capacity: int, n_trainers: int, device: Any) -> None:
        super().__init__(sampler, capacity, n_trainers, device)
        self.replace = sampler.replace
        self.ordered = sampler.order == "memory"

    def draw(self, trainers: range, batch_size: int, size: int, gen: torch.Generator) -> _Draw:
        if size < 1 or batch_size > size:
            what = "as many rows" if self.replace else "distinct slots"
            raise _not_enough_data(batch_size, size, batch_size, what)
        if self.ordered and self.replace:  # ascending slots: floor of sorted uniforms
            uniforms = _sorted_uniforms(len(trainers), batch_size, gen, self.device)
            slots = (uniforms * size).to(torch.int64).clamp_(max=size - 1)
            return _Draw(slots, None, None)
        if self.ordered:  # a uniform subset, sorted
            subsets = [
                torch.randperm(size, generator=gen, device=self.device)[:batch_size]
                for _ in trainers
            ]
            return _Draw(torch.stack(subsets).sort(dim=1).values, None, None)
        rows = []
        for _ in trainers:
            if self.replace:
                rows.append(
                    torch.randint(0, size, (batch_size,), generator=gen, device=self.device)
                )
            else:
                rows.append(torch.randperm(size, generator=gen, device=self.device)[:batch_size])
        return _Draw(torch.stack(rows), None, None)


class _DeviceNeighbor(_DeviceSampler):
    def __init__(self, sampler: Neighbor, capacity: int, n_trainers: int, device: Any) -> None:
        super().__init__(sampler, capacity, n_trainers, device)
        self.run_length = sampler.run_length
        self.offsets = torch.arange(self.run_length, device=device)

    def draw(self, trainers: range, batch_size: int, size: int, gen: torch.Generator) -> _Draw:
        run = self.run_length
        n_refs = batch_size // run
        if size == 0 or batch_size > size:
            raise _not_enough_data(batch_size, size, batch_size, "distinct slots")
        full = size == self.capacity
        n_starts = size if full else size - run + 1  # valid reference slots
        if n_starts < n_refs:
            raise _not_enough_data(batch_size, size, n_refs + run - 1, f"{n_refs} distinct runs")
        refs = torch.stack(
            [torch.randperm(n_starts, generator=gen, device=self.device)[:n_refs] for _ in trainers]
        )
        indices = (refs[..., None] + self.offsets) % self.capacity
        return _Draw(indices.view(len(trainers), batch_size), None, refs)


class _DevicePrioritized(_DeviceSampler):
    """Proportional (and prioritized-locality) sampling from float64 prefix sums on the device.

    Per trainer ``t`` the device holds ``leaves[t]`` (``priority ** alpha`` per slot, float64)
    and, for :class:`PrioritizedNeighbor`, the raw ``priorities[t]``. A draw searches
    ``uniform * total`` in the inclusive prefix sums of ``leaves[t]`` (``torch.searchsorted``),
    which is the sum-tree's distribution: slot ``i`` is drawn with probability
    ``leaves[i] / total``. The prefix sums are recomputed lazily, for a trainer whose leaves
    changed since its last draw: O(capacity) per trainer and priority update (one scan of 8
    bytes per slot: about 20 us per million slots on a current GPU; on the host the NumPy
    buffer's sum-tree, O(B log capacity), is the better choice). On a GPU a ``cummax`` pass
    after the scan makes the sums monotone and gives every zero leaf an empty interval (a
    parallel scan may otherwise round two equal prefix sums differently); ``torch.cumsum`` on
    the host is a sequential loop and already exact in that sense.

    Updates are batched over trainers and never wait for the device (see
    :meth:`TorchReplayBuffer.update_priorities`). Each trainer's leaves and priorities carry one
    extra column (index ``capacity``) that absorbs the writes of duplicate and dropped entries,
    so every real slot is written at most once per update (the last kept duplicate wins, as in
    the NumPy samplers).
    """

    weighted = True

    def __init__(self, sampler: Prioritized, capacity: int, n_trainers: int, device: Any) -> None:
        super().__init__(sampler, capacity, n_trainers, device)
        self.alpha = sampler.alpha
        self.beta = sampler.beta
        self.eps = sampler.eps
        self.priority = sampler.priority
        self.locality = isinstance(sampler, PrioritizedNeighbor)
        self.ordered = sampler.order == "memory"  # never with locality (draw order there)
        f64 = torch.float64
        shape = (n_trainers, capacity + 1)  # + the column that absorbs dropped writes
        self.leaves = torch.zeros(shape, dtype=f64, device=device)
        self.priorities = torch.zeros(shape if self.locality else (0, 0), dtype=f64, device=device)
        self.max_priority = torch.ones(n_trainers, dtype=f64, device=device)
        self.batches_drawn = np.zeros(n_trainers, dtype=np.int64)  # beta schedule position
        self._cum = torch.zeros((n_trainers, capacity), dtype=f64, device=device)
        self._max = torch.ones(n_trainers, dtype=f64, device=device)  # max priority (locality)
        self._dirty = [True] * n_trainers
        self._trainer_ids = torch.arange(n_trainers, device=device)
        # every filled slot has mass >= eps ** alpha (new slots: >= 1): a positive total needs
        # no check on the device unless that bound is 0
        self._total_may_be_zero = not (self.eps**self.alpha > 0.0)
        self.inherit = False
        if self.locality:
            assert isinstance(sampler, PrioritizedNeighbor)
            table = sampler.predictor.step_table()
            if table is None:
                raise ValueError(
                    f"the torch backend needs a step-function predictor (ThresholdPredictor, or "
                    f"a RunLengthPredictor whose step_table() is not None); got "
                    f"predictor={sampler.predictor!r}"
                )
            self.thresholds = torch.as_tensor(table[0], dtype=f64).to(device)
            self.run_lengths = torch.as_tensor(table[1], dtype=torch.int64).to(device)
            self.longest = int(table[1].max())
            self.back = torch.arange(self.longest, device=device)
            self.inherit = sampler.weights == "inherit"

    # ------------------------------------------------------------------ state
    def beta_for(self, trainer: int) -> float:
        """β of ``trainer``'s next batch."""
        if isinstance(self.beta, LinearBeta):
            return self.beta(int(self.batches_drawn[trainer]))
        return self.beta

    def leaf_view(self) -> Tensor:
        """``priority ** alpha`` per trainer and slot: shape (n_trainers, capacity), float64."""
        return self.leaves[:, : self.capacity]

    def priority_view(self) -> Tensor:
        """Raw priority per trainer and slot (``PrioritizedNeighbor`` only)."""
        return self.priorities[:, : self.capacity]

    def on_write(self, ranges: list[tuple[int, int, int]]) -> None:
        mass = (self.max_priority**self.alpha)[:, None]
        for lo, hi, _ in ranges:
            self.leaves[:, lo:hi] = mass
            if self.locality:
                self.priorities[:, lo:hi] = self.max_priority[:, None]
        self._dirty = [True] * self.n_trainers

    def _refresh(self, trainers: range) -> None:
        """Recompute the prefix sums (and max priority) of trainers whose leaves changed."""
        cap = self.capacity
        for t in trainers:
            if not self._dirty[t]:
                continue
            leaves = self.leaves[t, :cap]
            torch.cumsum(leaves, dim=0, out=self._cum[t])
            if self.device.type != "cpu":
                # a parallel scan may round a later prefix below an earlier one, and an empty
                # slot must not own any target: flatten both with a running maximum
                self._cum[t] = running_max(self._cum[t].masked_fill(leaves == 0.0, 0.0))
            if self.locality:
                self._max[t] = self.priorities[t, :cap].max()
            self._dirty[t] = False

    def _check_sampleable(self, batch_size: int, size: int, trainers: range) -> None:
        if size < 1:
            raise _not_enough_data(batch_size, size, 1, "prioritized rows")
        if self._total_may_be_zero:  # eps ** alpha == 0: a total of 0 is possible (host check)
            for t in trainers:
                if not float(self._cum[t, -1]) > 0.0:
                    raise ValueError(
                        f"every priority of trainer {t} is 0 (eps={self.eps} and all TD errors "
                        "were 0); use eps > 0 so that every slot stays sampleable"
                    )

    # ------------------------------------------------------------------ draws
    def draw(self, trainers: range, batch_size: int, size: int, gen: torch.Generator) -> _Draw:
        self._refresh(trainers)
        self._check_sampleable(batch_size, size, trainers)
        rows = slice(trainers.start, trainers.stop)
        if self.ordered:  # ascending targets: the searches return ascending slots
            uniforms = _sorted_uniforms(len(trainers), batch_size, gen, self.device)
        else:
            uniforms = torch.stack(
                [
                    torch.rand(batch_size, generator=gen, device=self.device, dtype=torch.float64)
                    for _ in trainers
                ]
            )
        cum = self._cum[rows]
        total = cum[:, -1:]
        below = torch.nextafter(total, torch.zeros_like(total))  # largest target < total
        targets = torch.minimum(uniforms * total, below)
        refs = torch.searchsorted(cum, targets, right=True)  # (K, B): slot holding the target
        leaves = self.leaves[rows]
        if not self.locality:
            mass = torch.gather(leaves, 1, refs)
            indices = refs
        else:
            indices, mass = self._runs(rows, refs, size)
        ratio = mass.amin(dim=1, keepdim=True) / mass
        betas = [self.beta_for(t) for t in trainers]  # host floats: no transfer
        if len(set(betas)) == 1:
            weights = ratio ** betas[0]
        else:
            weights = torch.stack([ratio[i] ** beta for i, beta in enumerate(betas)])
        for t in trainers:
            self.batches_drawn[t] += 1
        return _Draw(indices, weights.to(torch.float32), None)

    def _reach(self, rows: slice, slots: Tensor) -> Tensor:
        """Run length a run starting at each of ``slots`` (K, ...) would have (no write-head
        cut): the step function of its normalised priority ``p / max p``."""
        k = slots.shape[0]
        prio = torch.gather(self.priorities[rows], 1, slots.reshape(k, -1)).view(slots.shape)
        normalised = prio / self._max[rows].view(k, *([1] * (slots.dim() - 1)))
        return self.run_lengths[torch.bucketize(normalised, self.thresholds, right=True)]

    def _runs(self, rows: slice, refs: Tensor, size: int) -> tuple[Tensor, Tensor]:
        """Expand references (K, B) into runs, cut to B rows; returns slots and their masses."""
        k, batch = refs.shape
        cap = self.capacity
        full = size == cap
        lengths = self._reach(rows, refs)
        if not full:
            lengths = torch.minimum(lengths, size - refs)  # stop at the write head
        ends = torch.cumsum(lengths, dim=1)  # every run has >= 1 row: ends[:, -1] >= B
        position = torch.arange(batch, device=self.device).expand(k, batch).contiguous()
        run = torch.searchsorted(ends, position, right=True)  # run holding each batch row
        start = torch.gather(ends, 1, run) - torch.gather(lengths, 1, run)
        run_ref = torch.gather(refs, 1, run)
        indices = (run_ref + position - start) % cap
        leaves = self.leaves[rows]
        if self.inherit:
            return indices, torch.gather(leaves, 1, run_ref)
        # exact mass: runs starting `back` slots earlier reach the row if longer than `back`
        starts = indices[..., None] - self.back  # (K, B, L)
        valid = starts >= 0 if not full else torch.ones_like(starts, dtype=torch.bool)
        starts = starts % cap
        reach = self._reach(rows, starts)
        start_mass = torch.gather(leaves, 1, starts.view(k, -1)).view(starts.shape)
        mass = torch.where(valid & (reach > self.back), start_mass, 0.0).sum(dim=2)
        return indices, mass

    def inclusion_probabilities(self, size: int, trainer: int = 0) -> Tensor:
        """Exact long-run per-row probability of every slot (shape (capacity,), float64, on
        the device); see :meth:`marlbuf.samplers.PrioritizedNeighbor.inclusion_probabilities`
        (for ``Prioritized``: ``leaves / total``)."""
        self._refresh(range(trainer, trainer + 1))
        self._check_sampleable(1, size, range(trainer, trainer + 1))
        cap = self.capacity
        leaves = self.leaves[trainer, :cap]
        reference = leaves / leaves.sum()
        if not self.locality:
            return reference
        lengths = self._reach(
            slice(trainer, trainer + 1), torch.arange(cap, device=self.device)[None]
        )[0]
        full = size == cap
        slot = torch.arange(cap, device=self.device)
        if not full:
            lengths = torch.where(slot < size, torch.minimum(lengths, size - slot), 0)
        expected_length = torch.dot(reference, lengths.to(torch.float64))
        mass = torch.zeros(cap, dtype=torch.float64, device=self.device)
        for k in range(self.longest):
            reaching = reference * (lengths > k)
            if full:
                mass += torch.roll(reaching, k)
            elif k < cap:
                mass[k:] += reaching[: cap - k]
        return mass / expected_length

    # ------------------------------------------------------------------ updates
    def apply(
        self,
        trainers: range,
        slots: Tensor,
        td_errors: Tensor,
        stale: Tensor,
        ok: Tensor | None,
    ) -> Tensor:
        """Set the priorities of ``slots`` (K, B, in ``[0, capacity)``) from ``td_errors``
        (K, B, float64) for trainers ``trainers``, dropping ``stale`` (K, B) entries, and the
        whole call when ``ok`` (a device bool, or None: checked already) is False.

        Returns the per-entry check code (K, B), int64, ``_OK`` where the entry is valid
        (the caller turns the first bad one into its error)."""
        k, batch = slots.shape
        rows = slice(trainers.start, trainers.stop)
        td = td_errors
        finite = torch.isfinite(td)
        if self.priority == "abs":
            priority = td.abs() + self.eps
        elif self.priority == "squared":
            priority = td * td + self.eps
        else:
            priority = td + self.eps
        mass = priority**self.alpha
        code = torch.where(finite, _OK, _NOT_FINITE)
        if self.priority == "given":
            code = torch.where((code == _OK) & (td < 0), _NEGATIVE, code)
        overflow = ~(torch.isfinite(priority) & torch.isfinite(mass))
        code = torch.where((code == _OK) & overflow, _OVERFLOW, code)
        all_ok = (code == _OK).all()
        if ok is not None:
            all_ok = all_ok & ok
        keep = ~stale & all_ok
        # the last kept entry of each slot writes; every other entry writes the spare column
        position = torch.arange(batch, device=self.device).expand(k, batch)
        key = slots * (2 * batch) + keep.to(torch.int64) * batch + position
        sorted_key, order = torch.sort(key, dim=1)
        sorted_slot = sorted_key // (2 * batch)
        last = torch.ones_like(sorted_key, dtype=torch.bool)
        last[:, :-1] = sorted_slot[:, 1:] != sorted_slot[:, :-1]
        writes = last & torch.gather(keep, 1, order)
        width = self.capacity + 1
        row_base = self._trainer_ids[rows][:, None] * width
        target = row_base + torch.where(writes, sorted_slot, self.capacity)
        self.leaves.view(-1).index_put_((target.view(-1),), torch.gather(mass, 1, order).view(-1))
        if self.locality:
            self.priorities.view(-1).index_put_(
                (target.view(-1),), torch.gather(priority, 1, order).view(-1)
            )
        largest = torch.where(keep, priority, 0.0).amax(dim=1)
        self.max_priority[rows] = torch.maximum(self.max_priority[rows], largest)
        for t in trainers:
            self._dirty[t] = True
        return code

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        def host(x: Tensor) -> np.ndarray:
            return x.detach().to("cpu", copy=True).numpy()

        state: dict[str, Any] = {
            "leaves": host(self.leaf_view()),
            "max_priority": host(self.max_priority),
        }
        if self.locality:
            state["priorities"] = host(self.priority_view())
        state["batches_drawn"] = self.batches_drawn.copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        drawn = np.asarray(state.get("batches_drawn"), dtype=np.int64)
        if drawn.shape != (self.n_trainers,):
            raise ValueError(
                f"sampler state 'batches_drawn' has shape {drawn.shape}; "
                f"expected {(self.n_trainers,)}"
            )
        arrays, max_priority = checked_tree_state(
            state, self.n_trainers, self.capacity, self.locality
        )
        self.leaf_view().copy_(torch.from_numpy(arrays["leaves"]))
        if self.locality:
            self.priority_view().copy_(torch.from_numpy(arrays["priorities"]))
        self.max_priority.copy_(torch.from_numpy(max_priority))
        self.batches_drawn[:] = drawn
        self._dirty = [True] * self.n_trainers


def _device_sampler(
    sampler: Sampler, capacity: int, n_trainers: int, device: torch.device
) -> _DeviceSampler:
    """The device implementation of ``sampler`` (checked against the capacity as ``bind``
    checks it, without allocating the NumPy sampler's host trees)."""
    if type(sampler) is Uniform:
        sampler.bind(capacity, n_trainers)
        return _DeviceUniform(sampler, capacity, n_trainers, device)
    if type(sampler) is Neighbor:
        sampler.bind(capacity, n_trainers)  # refuses a run longer than the ring
        return _DeviceNeighbor(sampler, capacity, n_trainers, device)
    if type(sampler) in (Prioritized, PrioritizedNeighbor):
        assert isinstance(sampler, Prioritized)
        if isinstance(sampler, PrioritizedNeighbor) and capacity < sampler.predictor.max_run_length:
            raise ValueError(
                f"capacity={capacity} is shorter than the longest run "
                f"({sampler.predictor.max_run_length}); use a larger buffer or shorter runs"
            )
        return _DevicePrioritized(sampler, capacity, n_trainers, device)
    if sampler.needs_episodes:
        raise TypeError(
            f"the torch backend does not sample sequences (sampler={sampler!r}); use "
            "device=None for Sequence and move batches with batch.to_torch(device)"
        )
    raise TypeError(
        "the torch backend implements the samplers Uniform, Neighbor, Prioritized and "
        f"PrioritizedNeighbor; got sampler={sampler!r} (use device=None for other samplers)"
    )


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
        """A device copy of the 1-D int64 host array ``src`` (on the CPU: ``src`` itself as a
        tensor; the caller uses it at once and never writes ``src`` again)."""
        if self.device.type != "cuda":
            return torch.from_numpy(src)
        out = torch.empty(src.shape[0], dtype=torch.int64, device=self.device)
        self.upload(out.view(-1, 1), src.reshape(-1, 1))
        return out


class _TableStorage:
    """The device table seen through the NumPy storage interface that persistence uses.

    ``arrays()`` returns host views of the table on the CPU (a load reads straight into the
    tensor's memory) and nothing on a CUDA device (a load reads into host arrays first).
    """

    layout = "interleaved"

    def __init__(self, buffer: TorchReplayBuffer) -> None:
        self._buffer = buffer

    @property
    def batch_layout(self) -> str:
        return self._buffer.batch_layout

    @property
    def nbytes(self) -> int:
        return self._buffer.capacity * self._buffer.table_row_bytes

    def arrays(self) -> dict[str, np.ndarray]:
        buf = self._buffer
        if buf.device.type != "cpu":
            return {}
        return {"table": buf.table[: buf.capacity].numpy().view(np.uint64)}


# --------------------------------------------------------------------------------- the buffer
def _dense_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A state of observations stored once as the same state with next_obs in every row."""
    from marlbuf.buffer import MultiAgentReplayBuffer

    sampler = state["sampler"]
    host = MultiAgentReplayBuffer(
        {a: AgentSpec.from_dict(s) for a, s in state["specs"].items()},
        capacity=int(state["capacity"]),
        layout=state["layout"],
        sampler=Sampler.from_config(sampler["type"], sampler["config"]),
        n_trainers=int(state["n_trainers"]),
        next_obs="once",
        batch_dtype="storage",  # rows in the stored dtypes
    )
    host.load_state_dict(state)
    size = host.size
    batch = host.gather(np.arange(size, dtype=np.int64))
    if host.layout == "interleaved":
        storage = {"table": batch.block}
    else:
        storage = {f"{f}/{a}": batch.field(f)[a] for f in FIELDS for a in host.specs}
    return {**state, "next_obs": "stored", "links": {}, "storage": storage}


def _dense_rows(codec: RowCodec, state: Mapping[str, Any]) -> np.ndarray:
    """The stored rows of a state with next_obs in every row, as dense interleaved rows
    (shape (size, row_words), uint64; an ``agent_major`` state is interleaved on the host)."""
    size = int(state["size"])
    storage = state["storage"]
    if state["layout"] == "interleaved":
        return np.ascontiguousarray(storage["table"], dtype=np.uint64)
    rows = np.zeros((size, codec.row_words), dtype=np.uint64)
    views = codec.views(rows)
    for f in FIELDS:
        for a in codec.agents:
            views[f][a][...] = np.asarray(storage[f"{f}/{a}"])
    return rows


def _lean_state(codec: RowCodec, state: Mapping[str, Any]) -> dict[str, Any]:
    """A state with next_obs in every row as the same state with observations stored once:
    lean rows, and links built by the writer's own comparison over the stored transitions in
    write order (as one stream: a transition links to the next one written when its next_obs
    equals that one's obs, byte for byte, so every batch stays the same)."""
    dense = _dense_rows(codec, state)
    size = dense.shape[0]
    lean = np.zeros((size, codec.lean_row_bytes // 8), dtype=np.uint64)
    if size:
        scatter_lean(lean, np.arange(size, dtype=np.int64), dense, *_lean_words(codec))
    capacity = int(state["capacity"])
    links = NextObsLinks(capacity, codec.obs_bytes)
    generations = np.asarray(state["write_generation"], dtype=np.int64)
    if size:
        order = np.argsort(generations, kind="stable")  # oldest first: write order
        links.commit(
            order,
            dense[order].view(np.uint8),
            0,
            generations[order],
            codec.next_obs_start,
            np.full(capacity, -1, dtype=np.int64),
        )
    storage = {"table": lean}
    return {
        **state,
        "layout": "interleaved",
        "next_obs": "once",
        "storage": storage,
        "links": links.state_dict(copy=False),
    }


def _lean_words(codec: RowCodec) -> tuple[int, int, int, int]:
    """:func:`marlbuf._kernels.scatter_lean`'s section arguments for ``codec``'s rows."""
    done_lean, done_dense, done_bytes = codec.done_span
    return -(-codec.head_bytes // 8), done_lean // 8, done_dense // 8, -(-done_bytes // 8)


#: torch dtypes of the gather plan's segment kinds (source and destination units)
_UNIT_DTYPES = {
    COPY64: (torch.int64, torch.int64),
    COPY32: (torch.int32, torch.int32),
    COPY8: (torch.uint8, torch.uint8),
    HALF_TO_FLOAT: (torch.float16, torch.float32),
}


class TorchReplayBuffer(MultiAgentReplayBuffer):
    """A :class:`MultiAgentReplayBuffer` whose row table, index draws, gathers and priorities
    live on a torch device (see the module docstring).

    Built by ``MultiAgentReplayBuffer(..., device=...)`` (or directly). Parameters are those of
    :class:`MultiAgentReplayBuffer`, except:

    Parameters
    ----------
    layout : {"interleaved"}
        The torch backend keeps the interleaved row table only.
    next_obs : {"once", "stored"}, default "once"
        As in the NumPy buffer: ``"once"`` stores lean rows and the next-observation links
        (mirrored on the device, with the side rows after the ring in the table); batches are
        the same, bit for bit.
    batch_dtype : {"float32", "storage"}, default "float32"
        As in the NumPy buffer: float16 fields arrive as float32 (converted in the gather,
        exactly) or, with ``"storage"``, as float16.
    sampler : Uniform, Neighbor, Prioritized or PrioritizedNeighbor
        Used for its configuration; the state (priorities, β schedule position) lives in
        :attr:`device_sampler` on the device (the sampler's NumPy trees are never allocated).
        ``PrioritizedNeighbor`` needs a step-function predictor.
    parallel_gather : bool, default False
        ``True`` is refused: it selects Numba threads of the NumPy gather.
    device : str or torch.device, default "cpu"
        ``"cuda"``, ``"cuda:k"`` or ``"cpu"``.
    cuda_graphs : bool, default False
        On a CUDA device, replay each deferred priority update
        (``update_priorities(..., sync=False)`` with device tensors, once the buffer is full)
        as a captured CUDA graph: one launch instead of some 80 (1.8x faster sample + update in
        ``marlbuf bench device``). Opt-in: its equality with the eager update is tested
        (``-m cuda``) but was not yet run on a GPU; without it every update launches its
        kernels one by one (the same computation).

    Notes
    -----
    Every operation is enqueued on the device's current stream of the calling thread; threads
    that share a buffer should share a stream (the default stream does). ``gather`` of device
    indices, ``reward_stats``, ``state_dict``/``save`` and ``update_priorities(..., sync=True)``
    with device tensors wait for the device; ``add``/``extend``, ``sample``,
    ``sample_for_trainers``, ``iter_trainers`` and ``update_priorities(..., sync=False)`` do not.
    """

    _device_backend: ClassVar[bool] = True  # MultiAgentReplayBuffer.__new__: no re-dispatch

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        layout: str = "interleaved",
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
        n_trainers: int | None = None,
        parallel_gather: bool = False,
        batch_layout: str = "rows",
        next_obs: str = "once",
        batch_dtype: str = "float32",
        *,
        global_fields: Mapping[str, Any] | None = None,
        alive: bool = False,
        device: Any = "cpu",
        cuda_graphs: bool = False,
    ) -> None:
        self.specs = normalize_specs(specs)
        if not isinstance(cuda_graphs, bool):
            raise TypeError(f"cuda_graphs must be a bool; got cuda_graphs={cuda_graphs!r}")
        declared = [
            what
            for what, used in (
                ("per-agent extra fields (AgentSpec(extras=...))", bool(extra_names(self.specs))),
                ("global_fields=", bool(global_fields)),
                ("alive=True", alive is not False),
            )
            if used
        ]
        if declared:
            raise ValueError(
                f"the torch backend (device={str(device)!r}) stores the five transition fields "
                f"only; got {', '.join(declared)}: these are host-buffer features for now (build "
                "the buffer with device=None and move batches with Batch.to_torch)"
            )
        self.global_fields: dict[str, FieldSpec] = {}
        self.alive = False
        if next_obs not in NEXT_OBS_MODES:
            raise ValueError(f"next_obs must be one of {NEXT_OBS_MODES}; got next_obs={next_obs!r}")
        if batch_dtype not in BATCH_DTYPES:
            raise ValueError(
                f"batch_dtype must be one of {BATCH_DTYPES}; got batch_dtype={batch_dtype!r}"
            )
        capacity, sampler, n_trainers = _check_arguments(
            self.specs, capacity, sampler, n_trainers, parallel_gather
        )
        if parallel_gather:
            raise ValueError(
                "parallel_gather=True selects Numba threads of the NumPy gather; the torch "
                "backend gathers with torch kernels: leave parallel_gather=False"
            )
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}; got layout={layout!r}")
        if layout != "interleaved":
            raise ValueError(
                f"the torch backend (device={str(device)!r}) keeps the interleaved row table "
                f"only; got layout={layout!r}: use layout='interleaved' (batch_layout="
                "'per_agent' gives contiguous per-agent tensors) or device=None"
            )
        if batch_layout not in BATCH_LAYOUTS:
            raise ValueError(
                f"batch_layout must be one of {BATCH_LAYOUTS}; got batch_layout={batch_layout!r}"
            )
        for spec in self.specs.values():
            for f in FIELDS:
                torch_dtype(spec.dtype(f))  # a dtype torch has, or a clear error
        self.device = check_device(device)
        self.capacity = capacity
        self.n_trainers = int(n_trainers)
        self.sampler = sampler
        self.device_sampler = _device_sampler(sampler, capacity, self.n_trainers, self.device)
        self.next_obs = next_obs
        self.batch_dtype = batch_dtype
        self._codec = RowCodec(self.specs)  # staging (dense rows), as in the NumPy buffer
        once = next_obs == "once"
        self.links: NextObsLinks | None = None  # made once the memory check has passed
        batch_specs = (
            {a: _widened(s) for a, s in self.specs.items()}
            if batch_dtype == "float32"
            else dict(self.specs)
        )
        batch_codec = self._codec if batch_specs == self.specs else RowCodec(batch_specs)
        #: the rows of gathered batches (dense, in the batch dtypes: the NumPy buffer's)
        self.row_layout = RowLayout(batch_codec)
        self.row_words = batch_codec.row_words
        self.row_bytes = batch_codec.row_bytes
        #: the rows of the table (lean when observations are stored once)
        self.table_layout = RowLayout(self._codec, lean=once)
        self.table_row_words = self.table_layout.row_words
        self.table_row_bytes = self.table_layout.row_bytes
        self._batch_layout = batch_layout
        self._segments = self._gather_segments(batch_codec, once)
        # Neighbor runs of plain rows are gathered as blocks of `run` rows: the first run - 1
        # rows are mirrored after the last slot so that a run that wraps is one block too
        plain = self._segments is None
        self._mirror = max(0, self.device_sampler.run_length - 1) if plain else 0
        # the side table of observations stored once lives in table rows after the ring, so
        # that every next_obs is gathered by one index_select; its reserve is the memory
        # estimate's (one row per expected episode end and stream), grown when exceeded
        needed = estimate(
            self.specs,
            capacity,
            "interleaved",
            next_obs,
            prioritized=self.device_sampler.weighted,
            n_trainers=self.n_trainers,
        )
        self._side_words = -(-self._codec.obs_bytes // 8)
        self._side_base = capacity + self._mirror
        self._side_rows = needed.side_table_bytes // (8 * self._side_words)
        self._check_memory(
            (self._side_base + self._side_rows) * self.table_row_bytes + needed.metadata_bytes,
            f"interleaved storage for capacity={capacity}",
        )
        if once:
            #: the host links (the NumPy buffer's own writer part), mirrored on the device
            self.links = NextObsLinks(capacity, self._codec.obs_bytes)
            self._side_rows = max(self._side_rows, self.links.side.shape[0])
        rows = self._side_base + self._side_rows
        self.table = torch.zeros(
            (rows, self.table_row_words), dtype=torch.int64, device=self.device
        )
        self._windows: Tensor | None = None
        self._make_windows()
        #: the device mirror of the links: per slot, (next_slot, side_row) of the host links
        self._links: Tensor | None = None
        if self.links is not None:
            self._links = torch.full((capacity, 2), -1, dtype=torch.int64, device=self.device)
        self._links_stale = False  # the device links await a full upload (a failed growth)
        self._gens = torch.full((capacity,), -1, dtype=torch.int64, device=self.device)
        self._handed: Tensor | None = None
        if self.device_sampler.weighted:
            self._handed = torch.full(
                (self.n_trainers, capacity), -1, dtype=torch.int64, device=self.device
            )
        self.storage = _TableStorage(self)  # type: ignore[assignment]
        self._uploader = _Uploader(self.device)
        # batch memory on the host is recycled by the NumPy buffer's block pool (a fresh 29 MB
        # block costs more in page faults than the gather); on a GPU the caching allocator
        # does that job
        self._pool = BlockPool(2 * self.n_trainers + 2) if self.device.type == "cpu" else None
        self.rng = make_rng(seed)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(self.rng.integers(0, 2**63 - 1)))
        self.writer = RingWriter(self.capacity)
        self._pending: Tensor | None = None  # first deferred priority-update error
        self._pending_one = True  # whether it came from update_priorities (one trainer)
        #: captured CUDA graphs of deferred priority updates (None: not used; see
        #: ``_graphed_record``), and why graphs were turned off, if they were
        self._graphs: dict[tuple, tuple] | None = (
            {} if cuda_graphs and self.device.type == "cuda" else None
        )
        self.graph_error: str | None = None

    def _gather_segments(
        self, batch_codec: RowCodec, once: bool
    ) -> list[tuple[torch.dtype, torch.dtype, int, int, int, bool]] | None:
        """How a table row becomes a batch row: ``None`` when they are the same (one
        ``index_select`` of whole rows), else segments ``(source unit dtype, destination unit
        dtype, source offset, destination offset, length, from_next)`` in units of their
        dtypes, from the NumPy buffer's gather plan (:func:`marlbuf.storage.build_plan`);
        ``from_next`` segments read the row holding the next observation (the successor slot
        or a side row), at the obs offsets."""
        if not once and batch_codec is self._codec:
            return None
        stored = self._codec.lean_slots if once else self._codec.slots
        obs_slots = {fs.agent: fs for fs in self._codec.slots if fs.field == "obs"}
        step = batch_codec.row_bytes
        targets = [(fs.field, fs.agent, fs.offset, step, fs.dtype) for fs in batch_codec.slots]
        kind, src, dst, length, _, from_next = build_plan(stored, obs_slots, targets, once)
        return [
            (*_UNIT_DTYPES[int(k)], int(s), int(d), int(n), bool(x))
            for k, s, d, n, x in zip(kind, src, dst, length, from_next)
        ]

    def _make_windows(self) -> None:
        """The view whose "rows" are runs of ``run`` table rows (Neighbor block gathers)."""
        run = self.device_sampler.run_length
        if run > 1 and self._segments is None:
            self._windows = self.table.as_strided(
                (self.capacity, run * self.table_row_words), (self.table_row_words, 1)
            )

    def _check_memory(self, nbytes: int, what: str) -> None:
        if self.device.type == "cpu":
            check_fits_in_memory(nbytes, what)
            return
        free, _ = torch.cuda.mem_get_info(self.device)
        if nbytes > free:
            gib = 1024**3
            raise MemoryError(
                f"{what} needs {nbytes / gib:.2f} GiB but only {free / gib:.2f} GiB of "
                f"{self.device} memory is free; reduce capacity (or the number of agents / "
                "observation size)"
            )

    # ----------------------------------------------------------------------------- basics
    @property
    def layout(self) -> str:
        """Always ``"interleaved"``."""
        return "interleaved"

    @property
    def batch_layout(self) -> str:
        """``"rows"`` (strided views of gathered rows) or ``"per_agent"`` (contiguous)."""
        return self._batch_layout

    @property
    def nbytes(self) -> int:
        """Bytes held on the device by the row table (with the side rows of observations
        stored once) and the next-observation links."""
        links = 0 if self._links is None else self._links.numel() * 8
        return int(self.table.numel() * 8) + links

    def __repr__(self) -> str:
        return (
            f"TorchReplayBuffer(agents={len(self.specs)}, capacity={self.capacity}, "
            f"size={self.size}, device={str(self.device)!r}, sampler={self.sampler!r})"
        )

    # ----------------------------------------------------------------------------- writing
    def _commit(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray = 0,
        truncated: bool | np.ndarray | None = None,
    ) -> None:
        """Write validated staging rows (host) into the device table, and the metadata.

        ``truncated`` is accepted for the NumPy buffer's signature (no sampler here reads
        episodes). With observations stored once the links are updated on the host by the NumPy
        buffer's own :class:`~marlbuf.writer.NextObsLinks` (the same calls, so the same links),
        the rows are stored lean, and the entries the commit changed are mirrored to the device."""
        writer = self.writer
        links = self.links
        with writer.lock:
            skip, slots = writer.plan(steps)
            src = rows[skip:] if skip else rows
            if skip and not isinstance(streams, int):
                streams = streams[skip:]  # those environments' steps are overwritten at once
            first = writer.total_writes + skip  # write generation of src[0]
            previous = None
            if links is not None:
                previous = self._previous_slots(streams)
                if steps == 1 and isinstance(streams, int):
                    links.commit_one(
                        writer.cursor,
                        src.view(np.uint8)[0],
                        streams,
                        writer.total_writes,
                        self._codec.next_obs_start,
                        writer.write_generation,
                    )
                else:
                    links.commit(
                        slots,
                        src.view(np.uint8),
                        streams,
                        first + np.arange(slots.shape[0]),
                        self._codec.next_obs_start,
                        writer.write_generation,
                    )
                table_rows = np.empty((src.shape[0], self.table_row_words), dtype=np.uint64)
                scatter_lean(
                    table_rows,
                    np.arange(src.shape[0], dtype=np.int64),
                    src,
                    *_lean_words(self._codec),
                )
            else:
                table_rows = src
            ranges = _ring_ranges(slots)
            for lo, hi, s0 in ranges:
                self._uploader.upload(self.table[lo:hi], table_rows[s0 : s0 + hi - lo])
                if hi - lo == 1:
                    self._gens[lo].fill_(first + s0)
                else:
                    start = first + s0
                    self._gens[lo:hi] = torch.arange(start, start + hi - lo, device=self.device)
            if self._mirror and any(lo < self._mirror for lo, _, _ in ranges):
                self._refresh_mirror()
            changed = slots if previous is None else np.concatenate([previous, slots])
            writer.advance(slots, steps, skip)
            self.device_sampler.on_write(ranges)
            if links is not None:
                self._mirror_links(changed, slots)

    def _previous_slots(self, streams: int | np.ndarray) -> np.ndarray:
        """The slots of the writing streams' newest transitions (those a commit may link)."""
        assert self.links is not None
        pending = self.links.pending
        ids = [int(streams)] if isinstance(streams, (int, np.integer)) else streams.tolist()
        slots = [pending[s][0] for s in ids if s in pending]
        return np.array(slots, dtype=np.int64)

    def _refresh_mirror(self) -> None:
        cap, m = self.capacity, self._mirror
        self.table[cap : cap + m].copy_(self.table[:m])

    # ----------------------------------------------------------------------------- links
    def _grow_side(self, needed: int) -> None:
        """Make room for ``needed`` side rows in the table (a new table, the rows copied on the
        device: the reserve is exceeded only by unusually many episode ends)."""
        if needed <= self._side_rows:
            return
        rows = max(needed, 2 * self._side_rows)
        total = self._side_base + rows
        self._check_memory(
            total * self.table_row_bytes,
            f"the side table of observations stored once ({rows} rows)",
        )
        table = torch.zeros((total, self.table_row_words), dtype=torch.int64, device=self.device)
        table[: self.table.shape[0]].copy_(self.table)
        self.table = table
        self._side_rows = rows
        self._make_windows()

    def _mirror_links(self, changed: np.ndarray, written: np.ndarray) -> None:
        """Copy the link entries of ``changed`` slots, and the side rows the ``written`` slots
        hold, from the host links to the device: one packed array through the pinned staging
        buffers (side rows in more when many), then ``index_copy_`` on the device."""
        links = self.links
        assert links is not None and self._links is not None
        try:
            self._grow_side(links.side.shape[0])
        except BaseException:
            self._links_stale = True  # the host links are right; the next gather uploads them
            raise
        if self._links_stale:
            self._upload_links()
            return
        k = changed.shape[0]
        entries = np.empty((3, k), dtype=np.int64)  # slots, then (next_slot, side_row) pairs
        entries[0] = changed
        pairs = entries[1:].reshape(k, 2)
        pairs[:, 0] = links.next_slot[changed]
        pairs[:, 1] = links.side_row[changed]
        held = links.side_row[written]
        held = held[held >= 0]
        side = links.side.view(np.int64)
        width = self._side_words
        # side rows per transfer: what fits in one staging buffer (the first also carries the
        # link entries)
        per_chunk = max(1, self._uploader.chunk_words // (width + 1))
        first = max(0, (self._uploader.chunk_words - 3 * k) // (width + 1))
        stop = min(first, held.shape[0])
        ids = held[:stop]
        packed = np.concatenate([entries.reshape(-1), ids + self._side_base, side[ids].reshape(-1)])
        values = self._uploader.to_device(packed)
        self._links.index_copy_(0, values[:k], values[k : 3 * k].view(k, 2))
        self._copy_side_rows(values[3 * k :], stop)
        for start in range(stop, held.shape[0], per_chunk):
            ids = held[start : start + per_chunk]
            packed = np.concatenate([ids + self._side_base, side[ids].reshape(-1)])
            self._copy_side_rows(self._uploader.to_device(packed), ids.shape[0])

    def _copy_side_rows(self, values: Tensor, count: int) -> None:
        """``values`` on the device: ``count`` table rows, then their side-row contents."""
        if count:
            width = self._side_words
            contents = values[count:].view(count, width)
            self.table[:, :width].index_copy_(0, values[:count], contents)

    def _upload_links(self) -> None:
        """Copy the host links, whole, to the device (after a load, or a failed growth)."""
        links = self.links
        assert links is not None and self._links is not None
        self._grow_side(links.side.shape[0])
        both = np.stack([links.next_slot, links.side_row], axis=1)
        self._uploader.upload(self._links, both)
        side = links.side.view(np.int64)
        base = self._side_base
        self._uploader.upload(self.table[base : base + side.shape[0], : self._side_words], side)
        self._links_stale = False

    # ----------------------------------------------------------------------------- sampling
    def _new_rows(self, n: int) -> Tensor:
        """Fresh (n, row_words) int64 memory for gathered (batch) rows."""
        if self._pool is not None:
            raw = self._pool.acquire(n * self.row_bytes)
            return torch.from_numpy(raw.view(np.int64).reshape(n, self.row_words))
        return torch.empty((n, self.row_words), dtype=torch.int64, device=self.device)

    def _new_bytes(self, nbytes: int) -> Tensor:
        if self._pool is not None:
            return torch.from_numpy(self._pool.acquire(nbytes))
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def _gather_into(self, dst: Tensor, draw: _Draw, first: int, stop: int) -> None:
        """Batch rows of trainers ``first .. stop - 1`` of ``draw`` into ``dst`` ((stop -
        first) * B rows): one ``index_select`` of whole rows (or of whole runs for neighbor
        draws) when table rows are batch rows, else the segments of the gather plan."""
        if self._segments is None:
            if draw.refs is not None and self._windows is not None:
                refs = draw.refs[first:stop].reshape(-1)
                out = dst.view(refs.shape[0], -1)
                torch.index_select(self._windows, 0, refs, out=out)
            else:
                torch.index_select(self.table, 0, draw.indices[first:stop].reshape(-1), out=dst)
            return
        slots = draw.indices[first:stop].reshape(-1)
        sources = slots
        if self._links is not None:
            # the row holding each next observation: the successor slot, or the slot's side row
            successor, side_row = self._links.index_select(0, slots).unbind(1)
            sources = torch.where(successor >= 0, successor, side_row + self._side_base)
        for src_dtype, dst_dtype, src, dst_at, length, from_next in self._segments:
            rows = sources if from_next else slots
            part = self.table.view(src_dtype)[:, src : src + length]
            out = dst.view(dst_dtype)[:, dst_at : dst_at + length]
            if src_dtype == dst_dtype:
                torch.index_select(part, 0, rows, out=out)
            else:  # float16 storage, float32 batch: exact
                out.copy_(part.index_select(0, rows))

    def _batches(
        self,
        draw: _Draw,
        trainers: range,
        with_trainer: bool,
        out: Sequence[Tensor | None] | Tensor | None,
    ) -> list[DeviceBatch]:
        """The batches of ``draw`` (one per trainer of ``trainers``), gathered under the lock.

        ``out``: a ``(K * B, row_words)`` round block, per-trainer blocks, or None (fresh)."""
        if self._links_stale:
            self._upload_links()
        k, batch = draw.indices.shape
        flat = draw.indices.reshape(-1)
        generations = self._gens.index_select(0, flat).view(k, batch)
        if self._handed is not None and with_trainer:
            handed = self._handed[trainers.start : trainers.stop]
            handed.scatter_(1, draw.indices, generations)
        weights = draw.weights
        tr = [t if with_trainer else None for t in trainers]
        if self._batch_layout == "rows" and (out is None or isinstance(out, Tensor)):
            block = self._new_rows(k * batch) if out is None else out
            self._gather_into(block, draw, 0, k)
            rows = block.view(k, batch, self.row_words)
            rnd = _Round(rows, draw.indices, generations, weights)
            return [
                DeviceBatch(
                    self.row_layout,
                    rows[i],
                    False,
                    draw.indices[i],
                    generations[i],
                    None if weights is None else weights[i],
                    tr[i],
                    rnd,
                    i,
                )
                for i in range(k)
            ]
        batches = []
        for i in range(k):
            given = None if out is None else out[i]
            if self._batch_layout == "rows":
                block = self._new_rows(batch) if given is None else given
                self._gather_into(block, draw, i, i + 1)
            else:
                rows_i = self._new_rows(batch)
                self._gather_into(rows_i, draw, i, i + 1)
                _, nbytes = self.row_layout.carving(batch)
                block = self._new_bytes(nbytes) if given is None else given
                self.row_layout.fill_per_agent(rows_i, block)
            batches.append(
                DeviceBatch(
                    self.row_layout,
                    block,
                    self._batch_layout == "per_agent",
                    draw.indices[i],
                    generations[i],
                    None if weights is None else weights[i],
                    tr[i],
                )
            )
        return batches

    def sample(  # type: ignore[override]
        self, batch_size: int, trainer: int = 0, out: DeviceBatch | None = None
    ) -> DeviceBatch:
        """Draw one batch of ``batch_size`` joint transitions on the device (see
        :meth:`MultiAgentReplayBuffer.sample`); returns a :class:`DeviceBatch`."""
        trainer = self._check_trainer(trainer)
        batch_size = self.sampler.check_batch_size(batch_size)
        out_block = None if out is None else self._out_block(out, batch_size)
        with self.writer.lock:
            self._check_enough(batch_size)
            trainers = range(trainer, trainer + 1)
            draw = self.device_sampler.draw(trainers, batch_size, self.size, self.generator)
            given = None if out_block is None else [out_block]
            return self._batches(draw, trainers, True, given)[0]

    def _out_block(self, out: Any, batch_size: int) -> Tensor:  # type: ignore[override]
        if not isinstance(out, DeviceBatch):
            raise TypeError(f"out must be a DeviceBatch from this buffer; got {type(out).__name__}")
        if self._batch_layout == "rows":
            shape: tuple[int, ...] = (batch_size, self.row_words)
            dtype = torch.int64
        else:
            shape, dtype = (self.row_layout.carving(batch_size)[1],), torch.uint8
        block = out.block
        if block.dtype != dtype or tuple(block.shape) != shape or block.device != self.device:
            raise ValueError(
                f"out holds a block of shape {tuple(block.shape)} dtype {block.dtype} on "
                f"{block.device}, but a batch of {batch_size} rows of this buffer needs shape "
                f"{shape} dtype {dtype} on {self.device}: pass a batch of the same size from this "
                "buffer (same specs and batch_layout), or no out="
            )
        if not block.is_contiguous():
            raise ValueError("out's block must be contiguous")
        return block

    def sample_for_trainers(  # type: ignore[override]
        self,
        batch_size: int,
        n_trainers: int | None = None,
        shared_index: bool = False,
        out: Sequence[DeviceBatch] | None = None,
    ) -> list[DeviceBatch]:
        """The MADDPG sampling round on the device (see
        :meth:`MultiAgentReplayBuffer.sample_for_trainers`): every trainer's indices are drawn
        in trainer order (the same draws as :meth:`iter_trainers`), then the whole round is
        gathered by one ``index_select`` into one ``(T * B, row_words)`` block, of which
        trainer ``t``'s batch is slice ``t`` (:func:`stack_span` then stacks fields of the
        round without a copy).

        ``out``: the batches of an earlier round of the same size; when they are one whole
        round, its block is reused as a whole. The round's block is freed (or recycled) once no
        tensor of any of its batches is referenced.
        """
        n_trainers = self._check_n_trainers(n_trainers)
        batch_size = self.sampler.check_batch_size(batch_size)
        blocks: Sequence[Tensor] | Tensor | None = None
        if out is not None:
            out = list(out)
            if len(out) != n_trainers:
                raise ValueError(f"out must hold {n_trainers} batches; got {len(out)}")
            checked = [self._out_block(b, batch_size) for b in out]
            addresses = [b.data_ptr() for b in checked]
            if not shared_index and len(set(addresses)) != len(addresses):
                raise ValueError(
                    "out holds the same batch (or memory) more than once, so trainers would "
                    "overwrite each other's rows; pass distinct batches (a shared_index=True "
                    "round's output can only be reused by another shared_index=True round)"
                )
            whole = round_of(out)
            if (
                whole is not None
                and not shared_index
                and self._batch_layout == "rows"
                and whole.rows.is_contiguous()
                and whole.rows.shape == (n_trainers, batch_size, self.row_words)
            ):
                blocks = whole.rows.view(n_trainers * batch_size, self.row_words)
            else:
                blocks = checked
        if shared_index:
            if self.device_sampler.weighted:
                raise ValueError(
                    "shared_index=True cannot be combined with a prioritized sampler: each "
                    "trainer has its own priority tree"
                )
            given = None if blocks is None else blocks
            if isinstance(given, list):
                given = given[:1]
            with self.writer.lock:
                self._check_enough(batch_size)
                draw = self.device_sampler.draw(range(0, 1), batch_size, self.size, self.generator)
                batch = self._batches(draw, range(0, 1), True, given)[0]
            return [batch] * n_trainers
        trainers = range(0, n_trainers)
        with self.writer.lock:
            self._check_enough(batch_size)
            draw = self._draw_round(trainers, batch_size)
            return self._batches(draw, trainers, True, blocks)

    def _draw_round(self, trainers: range, batch_size: int) -> _Draw:
        """Draws of several trainers, in trainer order (the same numbers as one by one)."""
        sampler = self.device_sampler
        if isinstance(sampler, _DevicePrioritized):
            return sampler.draw(trainers, batch_size, self.size, self.generator)
        parts = [
            sampler.draw(range(t, t + 1), batch_size, self.size, self.generator) for t in trainers
        ]
        return _Draw(
            torch.cat([p.indices for p in parts]),
            None,
            None if parts[0].refs is None else torch.cat([p.refs for p in parts]),  # type: ignore[misc]
        )

    def iter_trainers(  # type: ignore[override]
        self, batch_size: int, n_trainers: int | None = None
    ) -> Iterator[DeviceBatch]:
        """The round as a stream (same draws as :meth:`sample_for_trainers`)."""
        n_trainers = self._check_n_trainers(n_trainers)
        for t in range(n_trainers):
            yield self.sample(batch_size, t)

    # ----------------------------------------------------------------------------- reads
    def _index_tensor(self, indices: Any, name: str = "indices") -> tuple[Tensor, bool]:
        """``indices`` as a 1-D int64 device tensor; host input is range-checked here (the
        second value says whether it was), device input by the caller."""
        if isinstance(indices, Tensor):
            if (
                indices.dim() != 1
                or indices.dtype.is_floating_point
                or indices.dtype
                in (
                    torch.bool,
                    torch.complex64,
                    torch.complex128,
                )
            ):
                raise TypeError(
                    f"{name} must be a 1-D integer array; got shape {tuple(indices.shape)}, "
                    f"dtype {indices.dtype}"
                )
            return indices.to(self.device, torch.int64, non_blocking=True), False
        idx = self._check_indices(indices)  # NumPy's checks and messages
        return torch.from_numpy(idx).to(self.device, non_blocking=True), True

    def _check_range_now(self, idx: Tensor) -> None:
        """Range check of device indices (waits for the device)."""
        if idx.numel():
            low, high = int(idx.min()), int(idx.max())
            if low < 0 or high >= self.size:
                raise ValueError(
                    f"indices must lie in [0, {self.size}) (the filled slots); "
                    f"got min {low}, max {high}"
                )

    def gather(self, indices: Any, trainer: int | None = None) -> DeviceBatch:  # type: ignore[override]
        """The joint batch at explicit ``indices`` (shape (B,), ints in ``[0, len(self))``: a
        list, NumPy array or tensor; device tensors are range-checked on the host, which waits
        for the device)."""
        if trainer is not None:
            trainer = self._check_trainer(trainer)
        with self.writer.lock:
            idx, checked = self._index_tensor(indices)
            if not checked:
                self._check_range_now(idx)
            draw = _Draw(idx[None], None, None)
            t = 0 if trainer is None else trainer
            batch = self._batches(draw, range(t, t + 1), trainer is not None, [None])[0]
            batch.trainer = trainer
            return batch

    def latest(self, n: int) -> DeviceBatch:  # type: ignore[override]
        """The newest ``n`` joint transitions, oldest first (``n <= len(self)``)."""
        with self.writer.lock:
            n = self._check_latest(n)
            start = self.cursor - n
            idx = torch.arange(start, start + n, device=self.device) % self.capacity
            draw = _Draw(idx[None], None, None)
            return self._batches(draw, range(0, 1), False, [None])[0]

    def stored(self, field: str) -> dict[str, Tensor]:  # type: ignore[override]
        """Views of one field over the filled slots, per agent (tensors on the device, in ring
        order, in the stored dtypes; treat them as read-only: they see later writes until the
        side table of observations stored once outgrows its reserve). ``next_obs`` with
        observations stored once is assembled by a gather of every filled slot (a copy in
        the batch dtypes, as in the NumPy buffer)."""
        if field not in FIELDS:
            raise ValueError(f"field must be one of {FIELDS}; got field={field!r}")
        with self.writer.lock:
            if field == "next_obs" and self.links is not None:
                # not stored as such: assembled by a gather of every filled slot (a copy)
                return self.gather(np.arange(self.size, dtype=np.int64)).next_obs
            return self.table_layout.views(self.table[: self.size])[field]

    def reward_stats(self) -> dict[str, tuple[float, float]]:
        """Mean and standard deviation of every stored reward, per agent, in float64 (waits
        for the device)."""
        with self.writer.lock:
            if self.size == 0:
                raise ValueError("reward_stats needs data: the buffer is empty")
            out = {}
            for agent, values in self.stored("reward").items():
                v = values.to(torch.float64)
                out[agent] = (float(v.mean()), float(v.std(unbiased=False)))
            return out

    # ----------------------------------------------------------------------------- priorities
    def update_priorities(
        self,
        indices: Any,
        td_errors: Any,
        trainer: int = 0,
        generations: Any = None,
        *,
        sync: bool = True,
    ) -> None:
        """Feed TD errors back to the prioritized sampler on the device (see
        :meth:`MultiAgentReplayBuffer.update_priorities`: the same stale guard, checks and
        messages).

        ``indices``, ``td_errors`` and ``generations`` may be NumPy arrays (checked on the
        host, no wait for the device) or tensors (``batch.indices``, a TD-error tensor:
        checked on the device). ``sync=True`` makes a device check raise here (it waits for the
        device); with ``sync=False`` nothing waits: a call whose device check fails changes
        nothing, and :meth:`check_priority_errors` raises its error later.
        """
        trainer = self._check_trainer(trainer)
        self._update(
            range(trainer, trainer + 1),
            [indices],
            [td_errors],
            None if generations is None else [generations],
            sync,
            one=True,
        )

    def update_priorities_for_trainers(
        self,
        indices: Any,
        td_errors: Any,
        generations: Any = None,
        *,
        sync: bool = True,
    ) -> None:
        """:meth:`update_priorities` of trainers ``0 .. K - 1`` in one batched device update.

        Parameters
        ----------
        indices : sequence of K arrays/tensors of shape (B,), or a (K, B) tensor
            Trainer ``t``'s sampled slots (``batch.indices`` of a round).
        td_errors : the same shapes, real numbers
            Trainer ``t``'s TD errors.
        generations : the same shapes, optional
            ``batch.generations`` (exact stale guard); by default the write generations the
            buffer handed to each trainer.
        sync : bool, default True
            As in :meth:`update_priorities`.
        """
        k = len(indices)
        if not 1 <= k <= self.n_trainers:
            raise ValueError(
                f"indices must hold one entry per trainer (1 to {self.n_trainers}); got {k}"
            )
        if len(td_errors) != k or (generations is not None and len(generations) != k):
            raise ValueError(
                f"td_errors (and generations) must hold {k} entries, one per trainer like "
                f"indices; got {len(td_errors)}"
            )
        self._update(
            range(0, k),
            list(indices),
            list(td_errors),
            None if generations is None else list(generations),
            sync,
            one=False,
        )

    def _update(
        self,
        trainers: range,
        indices: list[Any],
        td_errors: list[Any],
        generations: list[Any] | None,
        sync: bool,
        one: bool,
    ) -> None:
        sampler = self.device_sampler
        if not isinstance(sampler, _DevicePrioritized):
            raise TypeError(
                f"{type(self.sampler).__name__} keeps no priorities; update_priorities needs a "
                "prioritized sampler (marlbuf.samplers.Prioritized or PrioritizedNeighbor)"
            )
        with self.writer.lock:
            idx_rows, td_rows, gen_rows = [], [], []
            host_checked = True
            for i in range(len(trainers)):
                idx, checked = self._index_tensor(indices[i])
                shape = tuple(idx.shape)
                if generations is not None:
                    gen_rows.append(self._generation_tensor(generations[i], shape))
                td, td_checked = self._td_tensor(td_errors[i], shape, sampler)
                host_checked &= checked and td_checked
                idx_rows.append(idx)
                td_rows.append(td)
            widths = {int(x.shape[0]) for x in idx_rows}
            if len(widths) != 1:
                raise ValueError(
                    f"every trainer's indices must have the same length; got {sorted(widths)}"
                )
            if not widths.pop():
                return  # nothing to update
            idx = idx_rows[0][None] if len(idx_rows) == 1 else torch.stack(idx_rows)
            td = td_rows[0][None] if len(td_rows) == 1 else torch.stack(td_rows)
            given = None
            if generations is not None:
                given = gen_rows[0][None] if len(gen_rows) == 1 else torch.stack(gen_rows)
            if not host_checked and not sync:
                graphed = self._graphed_record(trainers, idx, td, given)
                if graphed is not None:  # the whole device update, replayed as one graph
                    self._defer(graphed, one)
                    return
            code, in_range = self._update_body(trainers, idx, td, given, not host_checked)
            if host_checked:
                return
            record = self._error_record(trainers, idx, td, code, in_range)
            if sync:
                self._raise_record(record.tolist(), one)
            else:
                self._defer(record, one)

    def _defer(self, record: Tensor, one: bool) -> None:
        """Keep ``record`` as the pending error unless an earlier one is pending (on the
        device: nothing waits)."""
        if self._pending is None:
            self._pending = record.clone()
            self._pending_one = one
        else:  # keep the first error
            first_ok = self._pending[0] == _OK
            self._pending = torch.where(first_ok, record, self._pending)

    def _update_body(
        self,
        trainers: range,
        idx: Tensor,
        td: Tensor,
        given: Tensor | None,
        check_range: bool,
        force_stale: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The device part of a priority update: stale guard, range check and the sampler's
        ``apply``; returns the per-entry check code and the range verdict (or None).
        ``force_stale`` (a bool tensor) marks every entry stale when true: the update then
        changes nothing (a CUDA graph's warm-up)."""
        sampler = self.device_sampler
        assert isinstance(sampler, _DevicePrioritized)
        safe = idx.clamp(0, self.capacity - 1)  # memory-safe reads whatever the input
        current = self._gens[safe]
        if given is not None:
            gens = given
        elif self._handed is not None:
            handed = torch.gather(self._handed[trainers.start : trainers.stop], 1, safe)
            gens = torch.where(handed < 0, current, handed)  # never handed out: a gather
        else:
            gens = current
        stale = gens != current
        if force_stale is not None:
            stale = stale | force_stale
        in_range = None
        if check_range:
            bad = (idx < 0) | (idx >= self.size)
            in_range = ~bad.any()
        return sampler.apply(trainers, safe, td, stale, in_range), in_range

    def _graphed_record(
        self, trainers: range, idx: Tensor, td: Tensor, given: Tensor | None
    ) -> Tensor | None:
        """Run a deferred device update as a replay of a captured CUDA graph and return its
        error record, or None where graphs do not apply (not CUDA, graphs off, the buffer not
        full — its size is part of the graph —, or torch's sync debug mode is on, under which
        a capture would wait for the device).

        One priority update is some 80 small kernels; launched one by one from Python, their
        launch cost is several times their GPU time. A graph per (trainers, batch shape,
        generations given) replays them with one launch after copying the inputs into its
        static tensors. A capture that fails turns graphs off for this buffer (the eager path
        is the same computation)."""
        if (
            self._graphs is None
            or self.device.type != "cuda"
            or self.size != self.capacity
            or torch.cuda.get_sync_debug_mode() != 0
        ):
            return None
        key = (trainers.start, trainers.stop, tuple(idx.shape), given is not None)
        graph = self._graphs.get(key)
        if graph is None:
            try:
                graph = self._capture(trainers, tuple(idx.shape), given is not None)
            except Exception as exc:  # any failure: the eager path computes the same
                self._graphs = None
                self.graph_error = f"{type(exc).__name__}: {exc}"
                return None
            self._graphs[key] = graph
        static_idx, static_td, static_given, record, cuda_graph = graph
        static_idx.copy_(idx)
        static_td.copy_(td)
        if static_given is not None and given is not None:
            static_given.copy_(given)
        cuda_graph.replay()
        sampler = self.device_sampler
        assert isinstance(sampler, _DevicePrioritized)
        for t in trainers:  # what apply() notes on the host at each call
            sampler._dirty[t] = True
        return record

    def _capture(self, trainers: range, shape: tuple[int, ...], with_given: bool) -> tuple:
        """Capture one deferred priority update (see :meth:`_graphed_record`)."""
        dev = self.device
        static_idx = torch.zeros(shape, dtype=torch.int64, device=dev)
        static_td = torch.zeros(shape, dtype=torch.float64, device=dev)
        static_given = torch.zeros(shape, dtype=torch.int64, device=dev) if with_given else None
        warm_up = torch.ones((), dtype=torch.bool, device=dev)
        record = torch.zeros(6, dtype=torch.float64, device=dev)

        def body() -> None:
            code, in_range = self._update_body(
                trainers, static_idx, static_td, static_given, True, warm_up
            )
            record.copy_(self._error_record(trainers, static_idx, static_td, code, in_range))

        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            body()  # warm-up: every entry stale, so nothing changes
        torch.cuda.current_stream(dev).wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            body()
        warm_up.fill_(False)  # the replays update
        return static_idx, static_td, static_given, record, cuda_graph

    def _td_tensor(
        self, td_errors: Any, shape: tuple[int, ...], sampler: Any
    ) -> tuple[Tensor, bool]:
        """TD errors as a float64 device tensor of ``shape``; host input is fully checked here
        (the second value says so), device input by the device check."""
        if isinstance(td_errors, Tensor):
            if td_errors.dtype in (torch.bool, torch.complex64, torch.complex128):
                raise TypeError(
                    f"td_errors must be a real numeric array; got dtype {td_errors.dtype}"
                )
            if tuple(td_errors.shape) != shape:
                raise ValueError(
                    f"td_errors must have shape {shape}, one per index; got shape "
                    f"{tuple(td_errors.shape)}"
                )
            return td_errors.to(self.device, torch.float64, non_blocking=True), False
        td = np.asarray(td_errors)
        if td.dtype.kind not in "iuf":
            raise TypeError(
                f"td_errors must be a real numeric array; got dtype {td.dtype} ({td_errors!r:.80})"
            )
        if td.shape != shape:
            raise ValueError(
                f"td_errors must have shape {shape}, one per index; got shape {td.shape}"
            )
        td = np.ascontiguousarray(td, dtype=np.float64)
        _check_td_on_host(td, sampler)
        return torch.from_numpy(td).to(self.device, non_blocking=True), True

    def _generation_tensor(self, generations: Any, shape: tuple[int, ...]) -> Tensor:
        if isinstance(generations, Tensor):
            ok = tuple(generations.shape) == shape and not (
                generations.dtype.is_floating_point or generations.dtype == torch.bool
            )
            kind = str(generations.dtype)
            got = tuple(generations.shape)
            gens: Tensor | None = generations if ok else None
        else:
            arr = np.asarray(generations)
            ok = arr.shape == shape and arr.dtype.kind in "iu"
            kind, got = str(arr.dtype), arr.shape
            gens = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int64)) if ok else None
        if gens is None:
            raise ValueError(
                f"generations must be an integer array of the shape of indices {shape} "
                f"(pass batch.generations); got shape {got}, dtype {kind}"
            )
        return gens.to(self.device, torch.int64, non_blocking=True)

    def _error_record(
        self, trainers: range, idx: Tensor, td: Tensor, code: Tensor, in_range: Tensor | None
    ) -> Tensor:
        """``[code, trainer, position, value, min index, max index]`` of the first bad entry
        (code ``_OK`` if none), float64 on the device."""
        batch = code.shape[1]
        bad = code != _OK
        flat = torch.argmax(bad.view(-1).to(torch.int8))  # first bad entry (0 if none)
        row, position = flat // batch, flat % batch
        at = flat.view(1)  # index_select, not x[t]: a 0-d tensor index may read it on the host
        first_code = code.view(-1).index_select(0, at)[0]
        value = td.view(-1).index_select(0, at)[0]
        trainer = row + trainers.start
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        if in_range is not None:
            first_code = torch.where(in_range, first_code, _BAD_INDEX)
            low, high = idx.min().to(torch.float64), idx.max().to(torch.float64)
        else:
            low = high = zero
        return torch.stack(
            [
                first_code.to(torch.float64),
                trainer.to(torch.float64),
                position.to(torch.float64),
                value,
                low,
                high,
            ]
        )

    def _raise_record(self, record: list[float], one: bool) -> None:
        code, trainer, position, value, low, high = record
        where = "" if one else f" of trainer {int(trainer)}"
        pos = int(position)
        if code == _BAD_INDEX:
            raise ValueError(
                f"indices must lie in [0, {self.size}) (the filled slots){where}; "
                f"got min {int(low)}, max {int(high)}"
            )
        if code == _NOT_FINITE:
            raise ValueError(
                f"td_errors must be finite; got td_errors[{pos}]={value}{where} (check the "
                "critic's loss for divergence)"
            )
        if code == _NEGATIVE:
            raise ValueError(
                f"priorities must be >= 0 with priority='given'; got "
                f"td_errors[{pos}]={value}{where}"
            )
        if code == _OVERFLOW:
            sampler = self.device_sampler
            assert isinstance(sampler, _DevicePrioritized)
            raise ValueError(
                f"td_errors[{pos}]={value}{where} overflows float64 as a priority "
                f"(priority={sampler.priority!r}, alpha={sampler.alpha}); scale the TD errors "
                "down"
            )

    def check_priority_errors(self) -> None:
        """Raise the first error of the ``update_priorities(..., sync=False)`` calls since the
        last check (those calls changed nothing), then forget it. Waits for the device."""
        with self.writer.lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._raise_record(pending.tolist(), getattr(self, "_pending_one", True))

    # ----------------------------------------------------------------------------- state
    def _state(self, copy: bool) -> dict[str, Any]:
        """The NumPy buffer's state (same keys and arrays, host memory), plus the torch
        generator's state under ``"device_rng"``. On the CPU with ``copy=False`` the table is a
        view of the tensor's memory; on a GPU it is copied to the host. The links of
        observations stored once are the host's own (the device holds a mirror)."""
        filled = self.size
        table = self.table[:filled]
        if self.device.type == "cpu":
            host = table.numpy().view(np.uint64)
            host = host.copy() if copy else host
        else:
            host = table.cpu().numpy().view(np.uint64)
        return {
            "format": _config.SAVE_FORMAT,
            "version": _config.SAVE_VERSION,
            "specs": {a: s.to_dict() for a, s in self.specs.items()},
            "capacity": self.capacity,
            "layout": self.layout,
            "next_obs": self.next_obs,
            "global_fields": {},
            "alive": False,
            "n_trainers": self.n_trainers,
            "sampler": {
                "type": type(self.sampler).__name__,
                "config": self.sampler.config(),
                "state": self.device_sampler.state_dict(),
            },
            **self.writer.state_dict(copy=copy),
            "rng": self.rng.bit_generator.state,
            "device_rng": {
                "device_type": self.device.type,
                "state": self.generator.get_state().numpy().copy(),
            },
            "storage": {"table": host},
            "links": {} if self.links is None else self.links.state_dict(copy=copy),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state of this buffer, of another device's, or of a NumPy buffer (either
        layout, either next_obs mode) with the same specs, capacity and number of trainers.

        The torch generator continues exactly when the state comes from the same device type;
        otherwise it is reseeded from the restored NumPy generator state (deterministic).
        A state in this buffer's next_obs mode loads as it is (observations stored once: the
        lean rows and the links, which are then mirrored to the device). A state in the other
        mode is converted on the host first (a temporary copy of the data): stored-once rows
        are expanded to rows with their next_obs, or rows with their next_obs are made lean
        with links built by the writer's comparison over the transitions in write order.
        Every part is checked before anything changes.
        """
        _check_header(state)
        global_fields, alive = row_options_of(state)
        if global_fields or alive or any(s.get("extras") for s in state["specs"].values()):
            raise ValueError(
                "the state holds extra fields, global fields or an alive mask, which the torch "
                "backend does not store; load it into a NumPy buffer (device=None)"
            )
        specs = {a: AgentSpec.from_dict(s) for a, s in state["specs"].items()}
        mismatch = [
            (k, mine, theirs)
            for k, mine, theirs in (
                ("specs", self.specs, specs),
                ("capacity", self.capacity, state["capacity"]),
                ("n_trainers", self.n_trainers, state["n_trainers"]),
            )
            if mine != theirs
        ]
        if mismatch:
            key, mine, theirs = mismatch[0]
            raise ValueError(
                f"state_dict does not fit this buffer: {key} is {mine!r} here, {theirs!r} in "
                "the state; build the buffer with TorchReplayBuffer.load instead"
            )
        if state["layout"] not in LAYOUTS:
            raise ValueError(
                f"state_dict has layout {state['layout']!r}; expected 'interleaved' or "
                "'agent_major'"
            )
        self.writer.check_state(state)
        mode = state.get("next_obs", "stored")
        if mode not in NEXT_OBS_MODES:
            raise ValueError(f"state_dict has next_obs={mode!r}; expected one of {NEXT_OBS_MODES}")
        if mode != self.next_obs:
            self._check_storage(state, mode)
            state = _dense_state(state) if mode == "once" else _lean_state(self._codec, state)
        self._check_storage(state, self.next_obs)
        if self.links is not None:
            self.links.check_state(state["links"])
        size = int(state["size"])
        with self.writer.lock:
            self._load_rows(state["layout"], state["storage"], size)
            self.writer.load_state_dict(state)
            if self.links is not None:
                self.links.load_state_dict(state["links"])
                self._upload_links()
            self._gens.fill_(-1)
            self._gens[:size] = torch.from_numpy(self.writer.write_generation[:size].copy()).to(
                self.device
            )
            if self._mirror:
                self._refresh_mirror()
            if self._handed is not None:
                self._handed.fill_(-1)
            self.rng.bit_generator.state = state["rng"]
            device_rng = state.get("device_rng")
            if (
                isinstance(device_rng, Mapping)
                and device_rng.get("device_type") == self.device.type
            ):
                saved = np.asarray(device_rng["state"], dtype=np.uint8)
                self.generator.set_state(torch.from_numpy(saved.copy()))
            else:
                self.generator.manual_seed(int(self.rng.integers(0, 2**63 - 1)))
            self.device_sampler.load_state_dict(state["sampler"]["state"])
            self._pending = None

    def _check_storage(self, state: Mapping[str, Any], mode: str) -> None:
        """Raise ``ValueError`` unless ``state``'s storage arrays are those of its layout in
        next_obs ``mode``, for its size."""
        size = int(state["size"])
        storage = state["storage"]
        expected: dict[str, tuple[tuple[int, ...], np.dtype]]
        if state["layout"] == "interleaved":
            words = self._codec.lean_row_bytes // 8 if mode == "once" else self._codec.row_words
            expected = {"table": ((size, words), np.dtype(np.uint64))}
        else:
            expected = {
                f"{f}/{a}": ((size, *s.shape(f)), s.dtype(f))
                for f in FIELDS
                if not (mode == "once" and f == "next_obs")
                for a, s in self.specs.items()
            }
        if set(storage) != set(expected):
            raise ValueError(
                f"state_dict storage arrays {sorted(storage)} do not match the "
                f"{state['layout']!r} layout's {sorted(expected)}"
            )
        for key, (shape, dtype) in expected.items():
            src = np.asarray(storage[key])
            if src.shape != shape or src.dtype != dtype:
                raise ValueError(
                    f"state_dict storage array {key!r} has shape {src.shape} dtype {src.dtype}; "
                    f"expected {shape} {dtype}"
                )

    def _load_rows(self, layout: str, storage: Mapping[str, Any], size: int) -> None:
        """Copy stored rows ``[0, size)`` into the table (chunks; agent_major states are turned
        into table rows on the host first)."""
        chunk = max(1, _config.DEVICE_STAGING_BYTES // self.table_row_bytes)
        if layout == "interleaved":
            src = np.asarray(storage["table"])
            dst = self.table[:size]
            if self.device.type == "cpu" and src.size and dst.data_ptr() == src.ctypes.data:
                return  # read straight into the table by persistence
            for start in range(0, size, chunk):
                stop = min(size, start + chunk)
                self._uploader.upload(self.table[start:stop], np.ascontiguousarray(src[start:stop]))
            return
        raw_slots = self._codec.lean_slots if self.links is not None else self._codec.slots
        for start in range(0, size, chunk):
            stop = min(size, start + chunk)
            rows = np.zeros((stop - start, self.table_row_words), dtype=np.uint64)
            raw = rows.view(np.uint8)
            for fs in raw_slots:
                part = raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype)
                part[...] = np.asarray(storage[f"{fs.field}/{fs.agent}"])[start:stop].reshape(
                    stop - start, -1
                )
            self._uploader.upload(self.table[start:stop], rows)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the buffer to an ``.npz`` file of the NumPy buffer's format (see
        :meth:`MultiAgentReplayBuffer.save`); ``MultiAgentReplayBuffer.load`` reads it too. On a
        GPU the filled table is copied to host memory first."""
        persistence.write_state(self._state(copy=False), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], device: Any = "cpu") -> TorchReplayBuffer:
        """Rebuild a buffer written by :meth:`save` of either backend on ``device``."""
        built: list[TorchReplayBuffer] = []

        def build(header: dict[str, Any]) -> dict[str, np.ndarray]:
            _check_header(header)
            sampler = header["sampler"]
            buf = cls(
                {a: AgentSpec.from_dict(s) for a, s in header["specs"].items()},
                capacity=int(header["capacity"]),
                sampler=Sampler.from_config(sampler["type"], sampler["config"]),
                n_trainers=int(header["n_trainers"]),
                next_obs=header.get("next_obs", "stored"),
                device=device,
            )
            built.append(buf)
            return persistence.storage_destinations(buf, header)

        state = persistence.read_state(path, build)
        buf = built[0]
        buf.load_state_dict(state)
        return buf


def _check_td_on_host(td: np.ndarray, sampler: _DevicePrioritized) -> None:
    """The NumPy sampler's TD-error checks (first offending entry, same messages)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if sampler.priority == "abs":
            priority = np.abs(td) + sampler.eps
        elif sampler.priority == "squared":
            priority = td * td + sampler.eps
        else:
            priority = td + sampler.eps
        mass = priority**sampler.alpha
    code = np.where(np.isfinite(td), _OK, _NOT_FINITE)
    if sampler.priority == "given":
        code = np.where((code == _OK) & (td < 0), _NEGATIVE, code)
    overflow = ~(np.isfinite(priority) & np.isfinite(mass))
    code = np.where((code == _OK) & overflow, _OVERFLOW, code)
    bad = np.flatnonzero(code != _OK)
    if not bad.size:
        return
    position = int(bad[0])
    value = td[position]
    if code[position] == _NOT_FINITE:
        raise ValueError(
            f"td_errors must be finite; got td_errors[{position}]={value} (check the "
            "critic's loss for divergence)"
        )
    if code[position] == _NEGATIVE:
        raise ValueError(
            f"priorities must be >= 0 with priority='given'; got td_errors[{position}]={value}"
        )
    raise ValueError(
        f"td_errors[{position}]={value} overflows float64 as a priority "
        f"(priority={sampler.priority!r}, alpha={sampler.alpha}); scale the TD errors down"
    )


__all__ = [
    "DeviceBatch",
    "RowLayout",
    "TorchReplayBuffer",
    "check_device",
    "round_of",
    "round_rows",
    "stack_span",
    "torch_dtype",
]
