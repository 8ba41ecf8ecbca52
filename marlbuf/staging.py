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
from marlbuf._kernels import first_nonfinite, first_nonfinite_half
from marlbuf.spec import FIELDS, AgentSpec, FieldSlot, interleaved_row_layout

RowViews = dict[str, dict[str, np.ndarray]]


class _NotCommonCase(Exception):
    """Raised inside the fast staging path: hand the call to the complete path."""


class RowCodec:
    """Interleaved row format of one set of specs: offsets, views and validation."""

    def __init__(self, specs: Mapping[str, AgentSpec]) -> None:
        self.specs = dict(specs)
        self.agents = list(self.specs)
        self.slots, self.row_bytes = interleaved_row_layout(self.specs, _config.ROW_ALIGN_BYTES)
        self.row_words = self.row_bytes // 8
        # observations stored once: the obs section is [0, obs_bytes); the next_obs section
        # [next_obs_start, next_obs_start + obs_bytes) has the same internal layout. The lean
        # row keeps obs, action, reward at the same offsets and lays out done after them.
        obs_slots = [s for s in self.slots if s.field == "obs"]
        nobs_slots = [s for s in self.slots if s.field == "next_obs"]
        self.next_obs_start = nobs_slots[0].offset
        self.obs_bytes = obs_slots[-1].offset + obs_slots[-1].nbytes
        assert all(
            n.offset - self.next_obs_start == o.offset for o, n in zip(obs_slots, nobs_slots)
        )
        lean_fields = tuple(f for f in FIELDS if f != "next_obs")
        self.lean_slots, self.lean_row_bytes = interleaved_row_layout(
            self.specs, _config.ROW_ALIGN_BYTES, lean_fields
        )
        reward_slots = [s for s in self.slots if s.field == "reward"]
        #: obs, action and reward: the same bytes [0, head_bytes) in both formats
        self.head_bytes = reward_slots[-1].offset + reward_slots[-1].nbytes
        done_dense = [s for s in self.slots if s.field == "done"]
        done_lean = [s for s in self.lean_slots if s.field == "done"]
        #: (lean offset, dense offset, bytes) of the done section, which moves between formats
        self.done_span: tuple[int, int, int] = (
            done_lean[0].offset,
            done_dense[0].offset,
            done_dense[-1].offset + done_dense[-1].nbytes - done_dense[0].offset,
        )
        assert all(
            dl.offset - done_lean[0].offset == dd.offset - done_dense[0].offset
            for dl, dd in zip(done_lean, done_dense)
        )
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
        self._min_discrete = 0
        self._eye: np.ndarray | None = None
        # float segments, per float dtype, for the NaN/inf scan: (starts, counts, slot per seg)
        self._segments: list[tuple[np.dtype, np.ndarray, np.ndarray, list[FieldSlot]]] = []
        for dt in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
            segs = [s for s in self.slots if s.dtype == dt]
            if segs:
                starts = np.array([s.offset // dt.itemsize for s in segs], dtype=np.int64)
                counts = np.array([s.nbytes // dt.itemsize for s in segs], dtype=np.int64)
                self._segments.append((dt, starts, counts, segs))
        self._castable: dict[tuple[np.dtype, np.dtype], bool] = {}
        # one persistent staging row for add(): padding stays zero. Callers serialize staging
        # (the buffer's writer lock), so one row is enough.
        self._single = np.zeros((1, self.row_words), dtype=np.uint64)
        self._single_views = self.views(self._single)  # the complete path's, built once
        self._fast = self._fast_plan()
        single_raw = self._single.view(np.uint8)
        self._single_regions = (
            None
            if self._fast is None
            else [single_raw[:, lo:hi].view(dt) for _, lo, hi, dt, _, _ in self._fast]
        )

    # ------------------------------------------------------------------ fast path
    def _fast_plan(self) -> list[tuple[str, int, int, np.dtype, list[tuple[int, ...]], Any]] | None:
        """Per field, what the fast path needs, or ``None`` when some field is not packed.

        Entries: ``(field, lo, hi, dtype, item shapes, one-hot plan)``; the one-hot plan is
        ``(positions, n_actions)`` (element offsets of each agent's action inside the field's
        region, and its number of discrete actions) when every agent's action is discrete.
        """
        plan = []
        n_agents = len(self.agents)
        for f in FIELDS:
            packed = self._packed[f]
            if packed is None:
                return None
            lo, hi, dt = packed
            shapes = [s.shape for s in self._by_field[f]]
            onehot = None
            if f == "action" and all(sp.n_discrete_actions for sp in self.specs.values()):
                ns = np.array([sp.n_discrete_actions for sp in self.specs.values()], np.int64)
                self._min_discrete = int(ns.min())  # one bound for the single-step check
                if (ns == ns[0]).all():
                    self._eye = np.eye(int(ns[0]), dtype=dt)
                positions = np.concatenate([[0], np.cumsum(ns)[:-1]]).astype(np.int64)
                onehot = (positions, ns)
            plan.append((f, lo, hi, dt, shapes, onehot))
        assert len(plan) == len(FIELDS) and n_agents > 0
        return plan

    def stage_fast(self, fields: Sequence[Any], steps: int | None) -> np.ndarray | None:
        """The common case in the fewest Python operations, or ``None`` to take :meth:`stage`.

        ``fields`` are the five field values in :data:`FIELDS` order, each a dict keyed by agent
        or a list/tuple in agent order, when every field is packed (see ``_packed``): one
        ``np.concatenate`` per field writes every agent's values into the staging row(s),
        integer actions of discrete agents are one-hot encoded in one vectorized step.
        Whatever it cannot prove valid it hands to :meth:`stage` (returns ``None``), whose checks
        and messages are complete: the fast path never accepts anything :meth:`stage` would
        reject, because it only stages rows and the same NaN/inf scan runs on them before
        anything is committed (a value beyond the stored range becomes inf when cast).
        """
        plan = self._fast
        if plan is None:
            return None
        if steps is None or steps == 1:
            rows = self._single  # add(), or extend() of one step: the persistent staging row
        else:
            rows = np.zeros((steps, self.row_words), dtype=np.uint64)
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, caught below
                self._fill_fast(plan, fields, steps, rows.view(np.uint8))
        except (_NotCommonCase, AttributeError, TypeError, ValueError, KeyError, IndexError):
            return None  # not the common case: the complete path decides and explains
        for dt, starts, counts, _ in self._segments:
            if _first_nonfinite(rows, dt, starts, counts) >= 0:
                return None  # NaN/inf, or a value beyond the stored range: stage() says which
        return rows

    def _fill_fast(
        self,
        plan: list[tuple[str, int, int, np.dtype, list[tuple[int, ...]], Any]],
        fields: Sequence[Any],
        steps: int | None,
        raw: np.ndarray,
    ) -> None:
        """Stage ``fields`` into the staging rows ``raw`` (uint8 view); raises
        ``_NotCommonCase`` (or NumPy's own errors) for anything outside the common case."""
        agents = self.agents
        n_agents = len(agents)
        regions = self._single_regions if steps is None or steps == 1 else None
        for k, ((_, lo, hi, dt, shapes, onehot), value) in enumerate(zip(plan, fields)):
            items: Any
            if type(value) is dict:
                if len(value) != n_agents:
                    raise _NotCommonCase
                items = [value[a] for a in agents]
            elif type(value) in (list, tuple):
                if len(value) != n_agents:
                    raise _NotCommonCase
                items = value
            elif type(value) is np.ndarray and value.ndim and value.shape[0] == n_agents:
                items = value  # stacked (n_agents, ...): rows are the agents' items
            else:
                raise _NotCommonCase
            region = regions[k] if regions is not None else raw[:, lo:hi].view(dt)
            first = items[0]
            index_like = not isinstance(first, (np.ndarray, list)) or (
                isinstance(first, np.ndarray) and first.dtype.kind in "iu"
            )
            if onehot is not None and index_like:
                # discrete actions given as indices: one-hot them in one vectorized step
                positions, ns = onehot
                if steps is None:
                    # bounds by Python's min/max: far cheaper than ufuncs on a handful of ints
                    if min(items) < 0 or max(items) >= self._min_discrete:
                        raise _NotCommonCase
                    acts = np.array(items)
                    if acts.dtype.kind not in "iu" or acts.shape != (n_agents,):
                        raise _NotCommonCase
                    if self._eye is not None:  # every agent has n actions: rows of eye(n)
                        np.take(self._eye, acts, axis=0, out=region[0].reshape(n_agents, -1))
                    else:
                        region[0] = 0
                        region[0, positions + acts] = 1
                else:
                    acts = np.array(items)
                    if acts.dtype.kind not in "iu" or acts.shape != (n_agents, steps):
                        raise _NotCommonCase
                    if (acts < 0).any() or (acts >= ns[:, None]).any():
                        raise _NotCommonCase
                    region[...] = 0
                    region[np.arange(steps)[None, :], positions[:, None] + acts] = 1
            elif shapes[0] == ():
                # one scalar per agent (reward, done): one array of all agents' values
                arr = np.array(items)
                if arr.dtype.kind not in "biuf":
                    raise _NotCommonCase
                if steps is None:
                    if arr.shape != (n_agents,):
                        raise _NotCommonCase
                    np.copyto(region[0], arr, casting="same_kind")
                else:
                    if arr.shape != (n_agents, steps):
                        raise _NotCommonCase
                    np.copyto(region, arr.T, casting="same_kind")
            elif steps is None:
                if type(items) is np.ndarray:
                    if items.shape[1:] != shapes[0] or any(sh != shapes[0] for sh in shapes):
                        raise _NotCommonCase
                    np.copyto(region[0], items.reshape(-1), casting="same_kind")
                    continue
                if [x.shape for x in items] != shapes:
                    raise _NotCommonCase
                np.concatenate(items, out=region[0], casting="same_kind")
            else:
                if [x.shape for x in items] != [(steps, *sh) for sh in shapes]:
                    raise _NotCommonCase
                np.concatenate(items, axis=1, out=region, casting="same_kind")

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
            rows[...] = 0  # a rejected fast attempt may have left values behind
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
            if (
                s.dtype.kind == "f"
                and arr.size
                and (src.kind in "iu" or src.itemsize > s.dtype.itemsize)
            ):
                self._check_range(field, s, arr)
            out.append(arr)
        return out

    def _check_range(self, field: str, s: FieldSlot, arr: np.ndarray) -> None:
        """Finite values beyond the stored float dtype's range would be stored as inf."""
        limit = float(np.finfo(s.dtype).max)
        with np.errstate(invalid="ignore"):
            finite = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
            if finite.size and float(np.abs(finite).max()) > limit:
                raise ValueError(
                    f"{field}[{s.agent!r}] holds {float(np.abs(finite).max()):g}, outside the "
                    f"range of the stored {s.dtype} (±{limit:g}); rescale it or declare a wider "
                    "dtype in the AgentSpec"
                )

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
        hint = ""
        if field == "action" and n is None and arr.dtype.kind in "iu" and arr.shape == lead:
            hint = (
                ". An integer action needs a discrete agent: pass AgentSpec(..., "
                f"n_discrete_actions={s.shape[0] if s.shape else 'n'}) or build the specs with "
                "AgentSpec.from_spaces / specs_from_env"
            )
        raise ValueError(
            f"{field}[{s.agent!r}] must have shape {lead + s.shape}; got {arr.shape}{hint}"
        )

    def _check_finite(self, rows: np.ndarray) -> None:
        for dt, starts, counts, segs in self._segments:
            bad = _first_nonfinite(rows, dt, starts, counts)
            if bad >= 0:
                s = segs[bad]
                raise ValueError(
                    f"{s.field}[{s.agent!r}] contains NaN or inf; clean the data before adding "
                    "it (or mask the transition out)"
                )


def _first_nonfinite(rows: np.ndarray, dt: np.dtype, starts: np.ndarray, counts: np.ndarray) -> int:
    """The first segment of ``rows`` (viewed as ``dt``) holding a NaN or inf, or -1."""
    if dt.itemsize == 2:  # Numba has no float16 arithmetic: test the bits
        return int(first_nonfinite_half(rows.view(np.uint16), starts, counts))
    return int(first_nonfinite(rows.view(dt), starts, counts))


def steps_of(codec: RowCodec, fields: Mapping[str, Any]) -> int:
    """The common leading length ``T`` of ``extend``'s arguments (checked consistent).

    When the lengths disagree, the most common length is taken as the intended one and the
    error names the first item that differs from it.
    """
    lengths: list[tuple[str, str, int]] = []
    for f in FIELDS:
        for s, item in zip(codec._by_field[f], codec._agent_items(f, fields[f])):
            shape = item.shape if type(item) is np.ndarray else np.shape(item)
            discrete_index = f == "action" and codec.specs[s.agent].n_discrete_actions
            if len(shape) != len(s.shape) + 1 and not (discrete_index and len(shape) == 1):
                raise ValueError(
                    f"extend needs a leading time axis: {f}[{s.agent!r}] must have shape "
                    f"{('T', *s.shape)}; got {tuple(shape)}. Use add() for one timestep"
                )
            lengths.append((f, s.agent, int(shape[0])))
    counts: dict[int, int] = {}
    for _, _, t in lengths:
        counts[t] = counts.get(t, 0) + 1
    steps = max(counts, key=lambda t: counts[t])
    for f, agent, t in lengths:
        if t != steps:
            raise ValueError(
                "every extend argument needs the same number of timesteps; "
                f"{f}[{agent!r}] has {t}, the others {steps}"
            )
    if not steps:
        raise ValueError("extend needs at least one timestep; got T=0")
    return steps


__all__ = ["RowCodec", "steps_of"]
