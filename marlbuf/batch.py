"""Sampled mini-batches."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marlbuf.spec import FIELDS


class DrawnIndices(np.ndarray):
    """The ``indices`` of a sampled batch: an int64 array that also knows the write generation
    of each slot when it was drawn (:attr:`generations`).

    ``update_priorities(batch.indices, td)`` reads them, so an update is judged against its own
    draw in any order of updates (an older batch updated after a newer batch of the same slots
    is still exact). The array keeps a private copy of its entries as drawn (:attr:`as_drawn`):
    reordered in place since (sorted, shuffled), each entry is still judged by its slot's
    generation at the draw; written to with slots the batch did not draw, it is refused with a
    ``ValueError`` naming ``generations=``. Indexing it (a slice, ``indices[order]``, a mask)
    keeps the generations of the entries taken. Any other array derived from it (a copy,
    arithmetic, a tensor, ``np.asarray`` of a list, a pickle) has ``generations = None``:
    ``update_priorities`` then takes the generations of the
    trainer's latest batch if the array holds exactly that batch's indices, in order, and
    refuses it otherwise (pass ``generations=`` for indices that come from elsewhere).
    """

    generations: np.ndarray | None
    #: the entries as drawn (a private copy; ``None`` for derived arrays)
    as_drawn: np.ndarray | None

    def __array_finalize__(self, obj: Any) -> None:
        self.generations = None  # a derived array: its entries may be reordered or filtered
        self.as_drawn = None

    def __getitem__(self, key: Any) -> Any:
        """Indexing (a slice, a reordering ``indices[order]``, a mask) keeps the generations
        of the entries it takes."""
        out = super().__getitem__(key)
        if isinstance(out, DrawnIndices) and self.generations is not None:
            out.generations = np.asarray(self.generations[key])
            out.as_drawn = None if self.as_drawn is None else np.asarray(self.as_drawn[key])
        return out

    @staticmethod
    def of(indices: np.ndarray, generations: np.ndarray) -> DrawnIndices:
        """``indices`` (shape (B,), int64) viewed as drawn at ``generations`` (shape (B,))."""
        drawn = indices.view(DrawnIndices)
        drawn.generations = generations
        drawn.as_drawn = indices.copy()
        return drawn

    def generations_of(self, entries: np.ndarray) -> np.ndarray | None:
        """The generations at the draw of ``entries`` (shape (B,), int64: this array's entries
        now, perhaps reordered in place since the draw): each entry's slot's generation then
        (the same for every entry of one slot), or ``None`` when an entry is no slot of the
        draw (written to since) or the array carries no generations."""
        if self.generations is None or self.as_drawn is None:
            return None
        drawn, generations = np.asarray(self.as_drawn), np.asarray(self.generations)
        if np.array_equal(drawn, entries):
            return generations
        if not drawn.shape[0]:
            return None
        order = np.argsort(drawn, kind="stable")
        slots = drawn[order]
        where = np.minimum(np.searchsorted(slots, entries), slots.shape[0] - 1)
        if np.any(slots[where] != entries):
            return None
        return np.ascontiguousarray(generations[order][where])


#: Why a batch of a buffer built with ``next_obs="none"`` holds no ``next_obs`` (the message of
#: every use of it)
NEXT_OBS_NOT_STORED = (
    "'next_obs' is not stored: this buffer was built with next_obs='none', so its rows hold no "
    "next observations and its batches have none. Read obs[:, t + 1] of a Sequence or "
    "Episodes batch (the next step of the episode, where mask is True), or build the buffer "
    "with next_obs='auto' (the default), 'once' or 'stored' and pass next_obs to its writes"
)


class NotGathered:
    """Stands in a batch for a field it does not hold: one that its ``fields=`` left out
    (``batch.next_obs`` of ``sample(B, fields=("obs", "action"))``), or ``next_obs`` of a
    buffer built with ``next_obs="none"``. Any use of it (indexing, iterating, ``len``,
    ``values()``) raises a ``ValueError`` that names the field and why: ``fields=``, or
    :data:`NEXT_OBS_NOT_STORED`.

    Parameters
    ----------
    name : str
        The field left out.
    chosen : tuple of str
        The fields the batch holds.
    stored : bool, default True
        Whether the buffer stores the field (``False``: ``next_obs`` of a ``next_obs="none"``
        buffer, which no ``fields=`` can bring back).
    """

    __slots__ = ("chosen", "name", "stored")

    def __init__(self, name: str, chosen: tuple[str, ...], stored: bool = True) -> None:
        self.name = name
        self.chosen = chosen
        self.stored = stored

    def refuse(self, *args: Any, **kwargs: Any) -> Any:
        """Raise the ``ValueError`` of every use."""
        if not self.stored:
            raise ValueError(NEXT_OBS_NOT_STORED)
        raise ValueError(
            f"{self.name!r} was not gathered: this batch was sampled with fields={self.chosen}; "
            f"add {self.name!r} to fields= (or leave fields=None for every field)"
        )

    __getitem__ = __iter__ = __len__ = __contains__ = refuse
    keys = values = items = get = refuse

    def __repr__(self) -> str:
        if not self.stored:
            return f"NotGathered({self.name!r}, not stored)"
        return f"NotGathered({self.name!r}, fields={self.chosen})"


def _action_indices(action: Any, agents: tuple[str, ...]) -> dict[str, Any]:
    """Per agent of ``agents``, the position of the 1 in its one-hot ``action`` (shape
    ``(..., K)``): int64 of shape ``(...)`` (0 where the row is all zeros: padding)."""
    if isinstance(action, NotGathered):
        action.refuse()
    out = {}
    for agent in agents:
        one_hot = action[agent]
        if isinstance(one_hot, np.ndarray):
            out[agent] = one_hot.argmax(axis=-1).astype(np.int64)
        else:  # a torch tensor: argmax gives int64 on its device
            out[agent] = one_hot.argmax(dim=-1)
    return out


@dataclass
class Batch:
    """One mini-batch: every agent's fields at the same ``B`` slots.

    Attributes
    ----------
    obs, next_obs : dict[str, ndarray]
        Per agent, shape ``(B, *obs_shape)``, the agent's obs dtype (float32 by default). A
        buffer built with ``next_obs="none"`` stores no next observations: ``next_obs`` is then
        a :class:`NotGathered` whose every use raises a ``ValueError`` naming that mode.
    action : dict[str, ndarray]
        Per agent, shape ``(B, *action_shape)``.
    reward, done : dict[str, ndarray]
        Per agent, shape ``(B,)``, float32.
    indices : DrawnIndices, shape (B,), int64
        The slots the rows came from (pass them back to ``update_priorities``); an ndarray
        that also carries the slots' write generations at the draw.
    generations : ndarray, shape (B,), int64
        Write generation of each slot when it was sampled: ``update_priorities`` uses it to
        drop updates for slots overwritten since.
    weights : ndarray, shape (B,), float32, or None
        Importance weights (max-normalised) for prioritized samplers; ``None`` otherwise.
    trainer : int or None
        The trainer this batch was drawn for (``sample_for_trainers``), else ``None``.
    extras : dict[str, dict[str, ndarray]]
        Per-agent extra fields (``AgentSpec(extras=...)``): name -> agent -> ``(B, *shape)``
        in the field's dtype (float16 as float32 unless ``batch_dtype="storage"``). Empty when
        none are declared.
    globals : dict[str, ndarray]
        Global fields (``global_fields=``): name -> ``(B, *shape)``. Empty when none.
    alive : dict[str, ndarray] or None
        Per agent, ``(B,)`` bool: whether the agent was alive at that step (buffers built with
        ``alive=True``; an absent agent's other fields are zeros unless given). ``None`` when
        the buffer does not track it.
    gathered_fields : tuple of str or None
        The fields the batch holds when the call chose some (``fields=``) or the buffer stores
        no next observations (every field but ``next_obs``), else ``None`` (every field). A
        left-out field of the five (and ``alive``) is a :class:`NotGathered` whose every use
        raises a ``ValueError`` naming ``fields=`` (``next_obs="none"`` for ``next_obs`` of such
        a buffer); left-out extras and global fields are missing from ``extras``/``globals``.
    discrete_agents : tuple of str
        Agents whose specs are discrete (``AgentSpec(n_discrete_actions=K)``, actions stored
        one-hot): see :attr:`action_index`.

    Extras and global fields are also attributes (``batch.hidden``, ``batch.state``).

    Every array views one gathered block of memory (``block``). With the ``interleaved``
    layout and ``batch_layout="rows"`` (the default) the block is ``B`` rows of the storage
    table and each per-agent array is a **strided** view: its row stride is the whole joint row
    (e.g. 28,352 bytes at 24 agents), so ``batch.concat("obs", "action")`` is zero-copy but a
    single agent's array is not C-contiguous (``torch.from_numpy(...).view(...)`` fails and a
    matmul on it may be slower). With ``batch_layout="per_agent"`` (or the ``agent_major``
    layout) every per-agent array is C-contiguous. The block is recycled for a later batch only
    once nothing references any of its arrays.
    """

    obs: dict[str, np.ndarray]
    action: dict[str, np.ndarray]
    reward: dict[str, np.ndarray]
    next_obs: dict[str, np.ndarray]
    done: dict[str, np.ndarray]
    indices: np.ndarray
    generations: np.ndarray
    weights: np.ndarray | None = None
    trainer: int | None = None
    block: np.ndarray | None = None  # the memory every array views (see the class docstring)
    extras: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    globals: dict[str, np.ndarray] = field(default_factory=dict)
    alive: dict[str, np.ndarray] | None = None
    gathered_fields: tuple[str, ...] | None = None
    discrete_agents: tuple[str, ...] = ()

    #: axes before each item's own shape: ``(B,)`` (a :class:`SequenceBatch`: ``(B, L)``)
    _leading_axes: ClassVar[int] = 1

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def action_index(self) -> dict[str, np.ndarray]:
        """The integer action of every discrete agent (``AgentSpec(n_discrete_actions=K)``):
        agent -> int64 array of shape ``(B,)`` (``(B, L)`` for sequences and episodes), the
        position of the 1 in the stored one-hot ``action`` (0 on masked steps, which are all
        zeros). Computed from the gathered one-hot on each access (one ``argmax``); agents
        with continuous actions are not in it."""
        return _action_indices(self.action, self.discrete_agents)

    def stacked(self, name: str) -> np.ndarray:
        """Every agent's ``name`` (a field, an extra field or ``"alive"``) on a new agent axis:
        shape ``(B, n_agents, *shape)``, or ``(B, L, n_agents, *shape)`` for sequences and
        episodes, for agents whose items share shape and dtype (a group of agents).

        A writable view of the batch's memory, without a copy, where the agents' arrays lie
        evenly spaced in it with equal strides (the gathered block of either batch layout
        places them so for agents with equal specs): writing to it writes the batch.
        Otherwise (uneven offsets) a new array.
        """
        arrays = list(self.field(name).values())
        first = arrays[0]
        if any(a.shape != first.shape or a.dtype != first.dtype for a in arrays):
            raise ValueError(
                f"stacked({name!r}) needs agents whose items share shape and dtype; got "
                f"{sorted({(a.shape[self._leading_axes :], str(a.dtype)) for a in arrays})}"
            )
        lead = self._leading_axes
        if len(arrays) > 1 and all(a.strides == first.strides for a in arrays):
            addresses = [a.__array_interface__["data"][0] for a in arrays]
            step = addresses[1] - addresses[0]
            if step > 0 and all(b - a == step for a, b in itertools.pairwise(addresses)):
                return np.lib.stride_tricks.as_strided(
                    first,
                    shape=(*first.shape[:lead], len(arrays), *first.shape[lead:]),
                    strides=(*first.strides[:lead], step, *first.strides[lead:]),
                    writeable=True,
                )
        return np.stack(arrays, axis=lead)

    if not TYPE_CHECKING:  # a runtime convenience; typed code reads batch.extras / .globals

        def __getattr__(self, name: str) -> Any:
            return _extra_attribute(self, name)

    @property
    def agents(self) -> list[str]:
        """Agent names, in spec order."""
        return list(self.obs)

    def field(self, name: str) -> dict[str, np.ndarray]:
        """The per-agent dict of one field (``"obs"``, ``"action"``, ..., an extra field's
        name, or ``"alive"``)."""
        if name in FIELDS or name == "alive":
            value = getattr(self, name)
            if isinstance(value, NotGathered):
                value.refuse()
            if value is not None:
                return value  # type: ignore[no-any-return,unused-ignore]
        if name in self.extras:
            return self.extras[name]
        if self.gathered_fields is not None and name not in self.gathered_fields:
            NotGathered(name, self.gathered_fields).refuse()
        raise ValueError(
            f"name must be one of {(*FIELDS, *self.extras)}"
            f"{' or alive' if self.alive is not None else ''}; got name={name!r}"
            + (f" (a global field: use batch.globals[{name!r}])" if name in self.globals else "")
        )

    def as_lists(self) -> tuple[list[np.ndarray], ...]:
        """The classic MADDPG format: ``(obs_n, act_n, rew_n, next_obs_n, done_n)``, each a
        list of per-agent arrays in agent order (the same arrays, no copy)."""
        return _as_lists(self)

    def concat(self, *fields: str) -> np.ndarray:
        """All agents' ``fields``, flattened and concatenated: shape ``(B, total_dim)``.

        ``batch.concat("obs", "action")`` is the centralized critic's input (every agent's
        observation, then every agent's action). With the interleaved layout and a common dtype
        this is a zero-copy view into the gathered rows; otherwise a new array.
        """
        if not fields:
            raise ValueError("concat needs at least one field name, e.g. concat('obs')")
        parts = [arr.reshape(len(self), -1) for name in fields for arr in self.field(name).values()]
        view = _contiguous_span(parts)
        return view if view is not None else np.concatenate(parts, axis=1)

    def to_torch(
        self, device: Any = "cpu", pin_memory: bool = False, non_blocking: bool = False
    ) -> TorchBatch:
        """The same batch as torch tensors (torch is imported only here).

        On CPU the tensors share memory with this batch (zero copy) and keep its strides: with
        the default ``batch_layout="rows"`` a per-agent tensor's row stride is the joint row (in
        elements), so ``.view()`` fails (use ``.reshape()``) and per-agent networks run on
        strided inputs; build the buffer with ``batch_layout="per_agent"`` to get contiguous
        tensors from the same single gather. For a CUDA ``device`` each array is copied once
        (contiguous on the device); ``pin_memory=True`` stages it in page-locked memory so that
        ``non_blocking=True`` overlaps the copy with compute.
        """
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "Batch.to_torch needs PyTorch: pip install 'marlbuf[algos]' "
                "(with torch==2.13.0 installed first on CPU-only machines)"
            ) from exc
        dev = torch.device(device)

        def convert(arr: np.ndarray) -> Any:
            tensor = torch.from_numpy(arr)
            if dev.type == "cpu":
                return tensor
            if pin_memory:
                tensor = tensor.pin_memory()
            return tensor.to(dev, non_blocking=non_blocking)

        def convert_field(value: Any) -> Any:
            if value is None or isinstance(value, NotGathered):
                return value
            return {a: convert(x) for a, x in value.items()}

        fields = {name: convert_field(getattr(self, name)) for name in FIELDS}
        return TorchBatch(
            **fields,
            indices=self.indices,
            generations=self.generations,
            weights=None if self.weights is None else convert(self.weights),
            trainer=self.trainer,
            concat_cache={},
            _source=self,
            _convert=convert,
            extras={n: {a: convert(x) for a, x in d.items()} for n, d in self.extras.items()},
            globals={n: convert(x) for n, x in self.globals.items()},
            alive=convert_field(self.alive),
            gathered_fields=self.gathered_fields,
            discrete_agents=self.discrete_agents,
        )


#: Batch attributes that describe the batch rather than hold one entry per gathered row
_BATCH_META = frozenset({"indices", "generations", "weights", "trainer", "block"})


@dataclass
class SequenceBatch(Batch):
    """``B`` sequences of ``L`` consecutive steps (:class:`marlbuf.samplers.Sequence`).

    Every per-step array of :class:`Batch` (each agent's ``obs``, ``action``, ``reward``,
    ``next_obs``, ``done``, and any other per-row field) has the leading axes ``(B, L)``:
    ``obs[agent]`` is ``(B, L, *obs_shape)``, ``reward[agent]`` is ``(B, L)``. Steps at masked
    positions are zero in every field.

    Attributes
    ----------
    mask : ndarray, shape (B, L), bool
        True where the step is a stored step of the sequence's episode.
    burn_in : int
        ``k``: positions ``[:, :k]`` are the burn-in steps (warm up a recurrent state), positions
        ``[:, k:]`` the ``length`` training steps.
    slots : ndarray, shape (B, L), int64
        Storage slot of every step; -1 where masked.
    indices : ndarray, shape (B,), int64
        The slot of each sequence's first training step (``slots[:, burn_in]``): pass them to
        ``update_priorities``.
    generations : ndarray, shape (B,), int64
        Write generations of ``indices`` when sampled.
    weights : ndarray, shape (B,), float32, or None
        Importance weights of prioritized sequences.

    The arrays view one gathered block of ``B * L`` rows (as in :class:`Batch`).
    """

    mask: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    burn_in: int = 0
    slots: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int64))

    _leading_axes: ClassVar[int] = 2

    def concat(self, *fields: str) -> np.ndarray:
        """All agents' ``fields`` per step, flattened and concatenated: shape
        ``(B, L, total_dim)`` (a zero-copy view where :meth:`Batch.concat` would be one)."""
        if not fields:
            raise ValueError("concat needs at least one field name, e.g. concat('obs')")
        n, steps = self.mask.shape
        parts = [arr.reshape(n * steps, -1) for name in fields for arr in self.field(name).values()]
        view = _contiguous_span(parts)
        joined = view if view is not None else np.concatenate(parts, axis=1)
        return joined.reshape(n, steps, -1)

    def to_torch(
        self, device: Any = "cpu", pin_memory: bool = False, non_blocking: bool = False
    ) -> TorchBatch:
        """:meth:`Batch.to_torch`; the result also carries ``mask`` (a bool tensor),
        ``burn_in`` and ``slots`` (NumPy)."""
        converted = super().to_torch(device, pin_memory, non_blocking)
        converted.mask = converted._convert(self.mask)  # type: ignore[attr-defined]
        converted.burn_in = self.burn_in  # type: ignore[attr-defined]
        converted.slots = self.slots  # type: ignore[attr-defined]
        return converted


@dataclass
class EpisodeBatch(SequenceBatch):
    """``B`` whole stored episodes from their first step (:class:`marlbuf.samplers.Episodes`).

    A :class:`SequenceBatch` (``burn_in`` is 0) whose row ``b`` holds episode ``b``'s steps
    ``0 .. L - 1``; ``L`` is the sampler's ``max_length``, or the batch's longest episode.

    Attributes
    ----------
    lengths : ndarray, shape (B,), int64
        Steps of each episode (an episode longer than a fixed ``max_length`` keeps its full
        length here; the batch holds its first ``L`` steps).
    indices : ndarray, shape (B,), int64
        The slot of each episode's first step: pass them to ``update_priorities`` (one value
        per episode).
    """

    lengths: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def filled(self) -> np.ndarray:
        """``mask`` (shape (B, L), bool): True at the stored steps of each episode, False on
        the padding (EPyMARL's name)."""
        return self.mask

    def to_torch(
        self, device: Any = "cpu", pin_memory: bool = False, non_blocking: bool = False
    ) -> TorchBatch:
        """:meth:`SequenceBatch.to_torch`; the result also carries ``lengths`` (NumPy)."""
        converted = super().to_torch(device, pin_memory, non_blocking)
        converted.lengths = self.lengths  # type: ignore[attr-defined]
        return converted


def _per_step(
    value: Any, shape: tuple[int, int], hidden: np.ndarray | None, zeroed: np.ndarray | None
) -> Any:
    """``value`` (an array of ``B * L`` rows, or a nested dict of them; anything else is
    returned as is) with its ``hidden`` rows zeroed (unless it lies in ``zeroed``, a block
    already zeroed) and reshaped to ``(B, L, ...)``. A module-level function, not a recursive
    closure: a closure that calls itself is a reference cycle, which would keep the batch's
    pooled block busy until the cyclic collector runs (each sample would then fault in a
    fresh block)."""
    if isinstance(value, dict):
        return {key: _per_step(item, shape, hidden, zeroed) for key, item in value.items()}
    n, steps = shape
    if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n * steps:
        if hidden is not None and not (zeroed is not None and np.may_share_memory(value, zeroed)):
            value[hidden] = 0
        return value.reshape(n, steps, *value.shape[1:])
    return value


def as_sequences(
    flat: Batch,
    mask: np.ndarray,
    burn_in: int,
    slots: np.ndarray,
    indices: np.ndarray,
    generations: np.ndarray,
    weights: np.ndarray | None,
    trainer: int | None,
    sequence_class: type[SequenceBatch] | None = None,
    zeroed: bool = False,
) -> SequenceBatch:
    """The :class:`SequenceBatch` of a batch ``flat`` gathered at the ``B * L`` slots of a
    sequence slot matrix, row-major (masked positions gathered from any valid slot).

    Every array attribute of ``flat`` with ``B * L`` rows, directly or inside (nested) dicts,
    is zeroed at the masked positions and reshaped to ``(B, L, ...)`` (views, no copy), so
    fields a :class:`Batch` gains later come out per step without changes here.
    ``sequence_class`` (default :class:`SequenceBatch`) is built from the result: it must have
    every field of ``flat``'s class.
    """
    n, steps = mask.shape
    rows = n * steps
    hidden = ~mask.reshape(-1)
    # zeroed: the gather wrote zeros at the masked positions already (slot -1)
    any_hidden = not zeroed and bool(hidden.any())
    block = flat.block
    whole_rows = block is not None and block.ndim == 2 and block.shape[0] == rows
    if any_hidden and whole_rows:
        assert block is not None
        block[hidden] = 0  # rows layout: every field of a masked step at once

    skip = block if whole_rows else None  # already zeroed as whole rows
    fields = {
        f.name: _per_step(getattr(flat, f.name), mask.shape, hidden if any_hidden else None, skip)
        for f in dataclasses.fields(flat)
        if f.name not in _BATCH_META
    }
    return (sequence_class or SequenceBatch)(
        **fields,
        indices=indices,
        generations=generations,
        weights=weights,
        trainer=trainer,
        block=block,
        mask=mask,
        burn_in=int(burn_in),
        slots=slots,
    )


@dataclass
class TorchBatch:
    """A :class:`Batch` as torch tensors; ``indices`` and ``generations`` stay NumPy.

    ``extras``, ``globals`` and ``alive`` are as in :class:`Batch`, as tensors (``alive`` a
    bool tensor per agent).
    """

    obs: dict[str, Any]
    action: dict[str, Any]
    reward: dict[str, Any]
    next_obs: dict[str, Any]
    done: dict[str, Any]
    indices: np.ndarray
    generations: np.ndarray
    weights: Any
    trainer: int | None
    concat_cache: dict[tuple[str, ...], Any]
    _source: Batch
    _convert: Any
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    globals: dict[str, Any] = field(default_factory=dict)
    alive: dict[str, Any] | None = None
    gathered_fields: tuple[str, ...] | None = None
    discrete_agents: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def action_index(self) -> dict[str, Any]:
        """:attr:`Batch.action_index` as int64 tensors on the batch's device."""
        return _action_indices(self.action, self.discrete_agents)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            return _extra_attribute(self, name)

    def as_lists(self) -> tuple[list[Any], ...]:
        """``(obs_n, act_n, rew_n, next_obs_n, done_n)`` as lists of per-agent tensors."""
        return _as_lists(self)

    def concat(self, *fields: str) -> Any:
        """Tensor form of :meth:`Batch.concat` (zero copy on CPU when the rows allow it)."""
        if fields not in self.concat_cache:
            self.concat_cache[fields] = self._convert(self._source.concat(*fields))
        return self.concat_cache[fields]


def _extra_attribute(batch: Any, name: str) -> Any:
    """``batch.<name>`` for an extra or global field (called only for unknown attributes)."""
    # read through __dict__: during copy/pickle this runs before the fields exist
    fields = batch.__dict__
    extras, globals_ = fields.get("extras") or {}, fields.get("globals") or {}
    if name in extras:
        return extras[name]
    if name in globals_:
        return globals_[name]
    chosen = fields.get("gathered_fields")
    if chosen is not None and not name.startswith("_"):
        raise AttributeError(
            f"{type(batch).__name__!r} object has no attribute {name!r}: an extra or global "
            f"field left out by fields={chosen} is not gathered (add it to fields=), and "
            f"other names are not fields of this batch"
        )
    raise AttributeError(
        f"{type(batch).__name__!r} object has no attribute {name!r} (extra fields: "
        f"{list(extras)}, global fields: {list(globals_)})"
    )


def _as_lists(batch: Batch | TorchBatch) -> tuple[list[Any], ...]:
    return tuple(list(getattr(batch, name).values()) for name in FIELDS)


def _contiguous_span(parts: list[np.ndarray]) -> np.ndarray | None:
    """If ``parts`` (2-D, same dtype, same row stride, unit column stride) sit side by side in
    memory, return one view covering them all; else ``None``."""
    first = parts[0]
    dtype, itemsize = first.dtype, first.dtype.itemsize
    row_stride = first.strides[0]
    expected = first.__array_interface__["data"][0]
    for part in parts:
        if part.dtype != dtype or part.strides[0] != row_stride:
            return None
        if part.shape[1] > 1 and part.strides[1] != itemsize:
            return None
        if part.__array_interface__["data"][0] != expected:
            return None
        expected += part.shape[1] * itemsize
    width = sum(p.shape[1] for p in parts)
    if len(parts) == 1:
        return first
    return np.lib.stride_tricks.as_strided(
        first, shape=(first.shape[0], width), strides=(row_stride, itemsize), writeable=False
    )
