"""The torch store's batches: :class:`DeviceBatch` and :class:`DeviceSequenceBatch`, the
structure of :class:`marlbuf.batch.Batch` with torch tensors on the device, built lazily from
the gathered rows (a learner that reads ``concat`` spans never pays for the per-agent views);
and a MADDPG round gathered as one block (:class:`Round`, :func:`round_of`, :func:`round_rows`,
:func:`stack_span`).

Imported through :mod:`marlbuf.stores.torch` (which says which extra installs torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marlbuf.batch import Batch, DrawnIndices, NotGathered
from marlbuf.rows import RowGeometry
from marlbuf.spec import ALIVE, FIELDS, GLOBAL
from marlbuf.stores.base import FieldSelection
from marlbuf.stores.torch_rows import RowLayout

Tensor = torch.Tensor


def _not_gathered(codec: RowGeometry | FieldSelection, name: str) -> NotGathered:
    """What stands for the field ``name`` that batches of rows ``codec`` do not hold (left
    out by ``fields=``, or not stored: ``next_obs`` of ``next_obs="none"``)."""
    if isinstance(codec, FieldSelection):
        return codec.not_gathered(name)
    return NotGathered(name, codec.field_names)


@dataclass
class Round:
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
        round_: Round | None = None,
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


def round_of(batches: Sequence[DeviceBatch]) -> Round | None:
    """The :class:`Round` the batches make up (see :func:`round_rows`), or ``None``."""
    first = getattr(batches[0], "round", None)
    if first is None or first.indices.shape[0] != len(batches):
        return None
    if all(b.round is first and b.position == t for t, b in enumerate(batches)):
        return first
    return None
