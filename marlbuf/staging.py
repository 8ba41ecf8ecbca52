"""Validation and staging of incoming transitions (the writer's front half).

Every ``add``/``extend`` is first written into *staging rows* in the interleaved row format
(:func:`marlbuf.spec.interleaved_row_layout`), checked there, and only then committed to the
storage — whatever its layout. So validation is one mechanism for both layouts, a rejected call
leaves the storage untouched, and the costly checks run over whole rows at once: shapes and
dtypes per agent (cheap tuple and dict look-ups), NaN/inf by one Numba scan of the staged
floats instead of one ``np.isfinite`` per agent and field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import first_nonfinite
from marlbuf.spec import FIELDS, AgentSpec, FieldSlot, interleaved_row_layout

RowViews = dict[str, dict[str, np.ndarray]]


class RowCodec:
    """Interleaved row format of one set of specs: offsets, views and validation."""

    def __init__(self, specs: Mapping[str, AgentSpec]) -> None:
        self.specs = dict(specs)
        self.agents = list(self.specs)
        self.slots, self.row_bytes = interleaved_row_layout(self.specs, _config.ROW_ALIGN_BYTES)
        self.row_words = self.row_bytes // 8
        self._by_field: dict[str, list[FieldSlot]] = {f: [] for f in FIELDS}
        for s in self.slots:
            self._by_field[s.field].append(s)
        # a field whose agents all share one dtype, with 1-D (or scalar) items packed back to
        # back, can be staged with a single assignment of the concatenated inputs
        self._packed: dict[str, tuple[int, int, np.dtype] | None] = {}
        for f, slots in self._by_field.items():
            same = all(s.dtype == slots[0].dtype and len(s.shape) <= 1 for s in slots)
            adjacent = all(a.offset + a.nbytes == b.offset for a, b in pairwise(slots))
            end = slots[-1].offset + slots[-1].nbytes
            self._packed[f] = (slots[0].offset, end, slots[0].dtype) if same and adjacent else None
        # float segments, per float dtype, for the NaN/inf scan: (starts, counts, slot per seg)
        self._segments: list[tuple[np.dtype, np.ndarray, np.ndarray, list[FieldSlot]]] = []
        for dt in (np.dtype(np.float32), np.dtype(np.float64)):
            segs = [s for s in self.slots if s.dtype == dt]
            if segs:
                starts = np.array([s.offset // dt.itemsize for s in segs], dtype=np.int64)
                counts = np.array([s.nbytes // dt.itemsize for s in segs], dtype=np.int64)
                self._segments.append((dt, starts, counts, segs))
        self._castable: dict[tuple[np.dtype, np.dtype], bool] = {}
        # one persistent staging row for add(): views built once, padding stays zero
        self._single = np.zeros((1, self.row_words), dtype=np.uint64)
        self._single_views = self.views(self._single)

    # ------------------------------------------------------------------ views
    def views(self, rows: np.ndarray) -> RowViews:
        """Per field, per agent, strided views of ``rows`` (shape (n, row_words), uint64)."""
        raw = rows.view(np.uint8)
        n = rows.shape[0]
        out: RowViews = {f: {} for f in FIELDS}
        for s in self.slots:
            part = raw[:, s.offset : s.offset + s.nbytes].view(s.dtype)
            out[s.field][s.agent] = part.reshape((n, *s.shape))
        return out

    # ------------------------------------------------------------------ staging
    def stage(self, fields: Mapping[str, Any], steps: int | None) -> tuple[np.ndarray, RowViews]:
        """Validate ``fields`` (field -> per-agent values) and write them into staging rows.

        ``steps=None`` is one timestep (``add``): items have the spec's shapes. Otherwise items
        have a leading time axis of length ``steps`` (``extend``). Returns the staged rows
        (shape (T, row_words), uint64) and their per-field views. Raises ``ValueError`` /
        ``TypeError`` naming the field and agent on any bad value; nothing is stored either way.
        """
        if steps is None:
            rows, views = self._single, self._single_views
        else:
            rows = np.zeros((steps, self.row_words), dtype=np.uint64)
            views = self.views(rows)
        lead = () if steps is None else (steps,)
        for f in FIELDS:
            arrays = self._checked_arrays(f, fields[f], lead)
            packed = self._packed[f]
            if packed is not None:
                lo, hi, dt = packed
                region = rows.view(np.uint8)[:, lo:hi].view(dt)
                if steps is None:
                    region[0] = np.concatenate([a.reshape(-1) for a in arrays])
                else:
                    region[...] = np.concatenate([a.reshape(steps, -1) for a in arrays], axis=1)
            else:
                for agent, arr in zip(self.agents, arrays):
                    views[f][agent][...] = arr
        self._check_finite(rows)
        return rows, views

    def _agent_items(self, field: str, value: Any) -> list[Any]:
        if isinstance(value, Mapping):
            if len(value) != len(self.agents) or any(a not in value for a in self.agents):
                missing = [a for a in self.agents if a not in value]
                extra = [a for a in value if a not in self.specs]
                raise ValueError(
                    f"{field} must have exactly the agents {self.agents}; "
                    f"missing {missing}, unexpected {extra}"
                )
            return [value[a] for a in self.agents]
        if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
            if len(value) != len(self.agents):
                raise ValueError(
                    f"{field} given as a sequence must have one entry per agent "
                    f"({len(self.agents)}); got {len(value)}"
                )
            return list(value)
        raise TypeError(
            f"{field} must be a dict keyed by agent name (or a list in agent order); "
            f"got {type(value).__name__}"
        )

    def _checked_arrays(self, field: str, value: Any, lead: tuple[int, ...]) -> list[np.ndarray]:
        """Per agent, the input as an array of exactly ``lead + shape``, castable to storage."""
        out = []
        for s, item in zip(self._by_field[field], self._agent_items(field, value)):
            arr = item if type(item) is np.ndarray else np.asarray(item)
            expected = lead + s.shape
            if arr.shape != expected:
                arr = self._reshape_special(field, s, arr, lead)
            src = arr.dtype
            key = (src, s.dtype)
            ok = self._castable.get(key)
            if ok is None:
                ok = src.kind in "biuf" and bool(np.can_cast(src, s.dtype, casting="same_kind"))
                self._castable[key] = ok
            if not ok:
                if src.kind not in "biuf":
                    raise TypeError(
                        f"{field}[{s.agent!r}] must be numeric; got dtype {src} "
                        f"({type(item).__name__})"
                    )
                raise TypeError(
                    f"{field}[{s.agent!r}] has dtype {src}, which does not cast safely to the "
                    f"stored {s.dtype}; convert it or declare the dtype in the AgentSpec"
                )
            out.append(arr)
        return out

    def _reshape_special(
        self, field: str, s: FieldSlot, arr: np.ndarray, lead: tuple[int, ...]
    ) -> np.ndarray:
        """Integer actions of a discrete agent become one-hot; anything else is a shape error."""
        spec = self.specs[s.agent]
        n = spec.n_discrete_actions
        if field == "action" and n is not None and arr.dtype.kind in "iu" and arr.shape == lead:
            if arr.size and (arr.min() < 0 or arr.max() >= n):
                raise ValueError(
                    f"action[{s.agent!r}] holds discrete actions outside [0, {n}); got {arr!r}"
                )
            return np.eye(n, dtype=s.dtype)[arr]
        if lead and arr.ndim != len(lead) + len(s.shape):
            raise ValueError(
                f"extend needs a leading time axis: {field}[{s.agent!r}] must have shape "
                f"{('T', *s.shape)}; got {arr.shape}. Use add() for one timestep"
            )
        raise ValueError(f"{field}[{s.agent!r}] must have shape {lead + s.shape}; got {arr.shape}")

    def _check_finite(self, rows: np.ndarray) -> None:
        for dt, starts, counts, segs in self._segments:
            values = rows.view(dt)
            bad = first_nonfinite(values, starts, counts)
            if bad >= 0:
                s = segs[bad]
                raise ValueError(
                    f"{s.field}[{s.agent!r}] contains NaN or inf; clean the data before adding "
                    "it (or mask the transition out)"
                )


def steps_of(codec: RowCodec, fields: Mapping[str, Any]) -> int:
    """The common leading length ``T`` of ``extend``'s arguments (checked consistent)."""
    steps: int | None = None
    for f in FIELDS:
        for s, item in zip(codec._by_field[f], codec._agent_items(f, fields[f])):
            shape = item.shape if type(item) is np.ndarray else np.shape(item)
            discrete_index = f == "action" and codec.specs[s.agent].n_discrete_actions
            if len(shape) != len(s.shape) + 1 and not (discrete_index and len(shape) == 1):
                raise ValueError(
                    f"extend needs a leading time axis: {f}[{s.agent!r}] must have shape "
                    f"{('T', *s.shape)}; got {tuple(shape)}. Use add() for one timestep"
                )
            if steps is None:
                steps = int(shape[0])
            elif shape[0] != steps:
                raise ValueError(
                    "every extend argument needs the same number of timesteps; "
                    f"{f}[{s.agent!r}] has {shape[0]}, expected {steps}"
                )
    if not steps:
        raise ValueError("extend needs at least one timestep; got T=0")
    return steps


__all__ = ["RowCodec", "steps_of"]
