"""The complete staging path: every check of an incoming write, with a message that names the
field, the agent, the value and the fix.

:class:`CheckedStaging` turns a call's fields (dicts keyed by agent, sequences in agent order,
arrays stacked over the agents; extras, global fields and the alive mask) into staging rows,
refusing anything the stored format cannot hold exactly: shapes (integer actions of discrete
agents one-hot encoded), dtypes that do not cast safely, values beyond the stored range,
NaN/inf (one Numba scan of the staged floats), discrete action vectors that are no action,
agents missing without an alive mask. The faster paths above it
(:mod:`marlbuf.staging.fast`, :mod:`marlbuf.staging.codec`) hand it whatever they cannot prove
valid, so its messages explain every rejection. :func:`steps_of` checks the common leading
length of ``extend``'s arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import first_nonfinite, first_nonfinite_half
from marlbuf._kernels.actions import first_bad_action
from marlbuf.rows import RowGeometry, RowViews
from marlbuf.spec import ALIVE, FIELDS, GLOBAL, AgentSpec, FieldSlot, FieldSpec


class _Missing:
    """The value of a declared extra or global field that a call did not pass."""

    def __repr__(self) -> str:
        return "MISSING"


#: Stands for an extra or global field that ``add``/``extend``/``add_envs`` did not receive.
MISSING: Any = _Missing()


def _as_array(name: str, value: Any) -> np.ndarray:
    """``np.asarray(value)``, or a ``ValueError`` naming ``name`` for a value NumPy cannot make
    one array of (a ragged nested list)."""
    try:
        return np.asarray(value)
    except ValueError as exc:
        raise ValueError(
            f"{name} must be an array (or a number) of the field's shape; got "
            f"{type(value).__name__} that is not one array ({exc}); pass a NumPy array"
        ) from None


class CheckedStaging(RowGeometry):
    """The complete staging path over the row format (:class:`marlbuf.rows.RowGeometry`): the
    checks of incoming fields and the staging rows they are written into."""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
    ) -> None:
        super().__init__(specs, global_fields, alive)
        self.slots_by_field: dict[str, list[FieldSlot]] = {f: [] for f in self.field_names}
        for s in self.slots:
            self.slots_by_field[s.field].append(s)
        # a field whose agents all share one dtype, with 1-D (or scalar) items packed back to
        # back, can be staged with a single assignment of the concatenated inputs (a global
        # field is one item: always)
        self.packed_fields: dict[str, tuple[int, int, np.dtype] | None] = {}
        for f, slots in self.slots_by_field.items():
            same = all(s.dtype == slots[0].dtype and len(s.shape) <= 1 for s in slots)
            adjacent = all(a.offset + a.nbytes == b.offset for a, b in pairwise(slots))
            end = slots[-1].offset + slots[-1].nbytes
            packed = (same and adjacent) or f in self.global_fields
            self.packed_fields[f] = (slots[0].offset, end, slots[0].dtype) if packed else None
        # float segments, per float dtype, for the NaN/inf scan: (starts, counts, slot per seg)
        self.float_segments: list[tuple[np.dtype, np.ndarray, np.ndarray, list[FieldSlot]]] = []
        for dt in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
            segs = [s for s in self.slots if s.dtype == dt]
            if segs:
                starts = np.array([s.offset // dt.itemsize for s in segs], dtype=np.int64)
                counts = np.array([s.nbytes // dt.itemsize for s in segs], dtype=np.int64)
                self.float_segments.append((dt, starts, counts, segs))
        #: discrete agents' action items, for the check that a vector action is one action
        #: (:meth:`find_bad_action`)
        self.discrete_actions = _discrete_plan(self)
        self._castable: dict[tuple[Any, ...], bool] = {}
        # one persistent staging row for add(): padding stays zero. Callers serialize staging
        # (the buffer's writer lock), so one row is enough.
        self.single_row = np.zeros((1, self.row_words), dtype=np.uint64)
        self._single_views = self.views(self.single_row)  # the complete path's, built once

    def safe_cast(self, src: np.dtype, dst: np.dtype) -> bool:
        """Whether every ``src`` value is exactly representable in ``dst`` (cached)."""
        key = (src, dst, "safe")
        ok = self._castable.get(key)
        if ok is None:
            ok = src.kind in "biu" and bool(np.can_cast(src, dst, casting="safe"))
            self._castable[key] = ok
        return ok

    # ------------------------------------------------------------------ views
    def arrange(self, values: tuple[Any, ...], keywords: Mapping[str, Any], method: str) -> tuple:
        """The five field values followed by the keyword fields, in :attr:`field_names` order.

        ``keywords`` are the extra keyword arguments of ``method`` (``add``, ``extend`` or
        ``add_envs``): extras and global fields (:data:`MISSING` where not passed) and, with an
        alive mask, ``alive`` (``None`` where not passed). Raises ``TypeError`` naming any
        keyword that is not a declared field.
        """
        unknown = [k for k in keywords if k not in self.keywords]
        if unknown:
            hint = ""
            if ALIVE in unknown and not self.alive:
                hint = "; alive= needs a buffer built with MultiAgentReplayBuffer(..., alive=True)"
            raise TypeError(
                f"{method}() got unexpected keyword argument(s) {unknown}; this buffer declares "
                f"the extra fields {list(self.extra_names)} (AgentSpec(extras=...)) and the "
                f"global fields {list(self.global_fields)} (global_fields=...){hint}"
            )
        return values + tuple(
            keywords.get(f, None if f == ALIVE else MISSING) for f in self.keywords
        )

    # ------------------------------------------------------------------ staging
    def stage(self, fields: Mapping[str, Any], steps: int | None) -> tuple[np.ndarray, RowViews]:
        """Validate ``fields`` (field -> per-agent values) and write them into staging rows.

        ``steps=None`` is one timestep (``add``): items have the spec's shapes. Otherwise items
        have a leading time axis of length ``steps`` (``extend``). Extras are per-agent values
        like the five fields; a global field's value is one array of its shape (with the
        leading axis); ``alive`` (with an alive mask) is per agent, a bool or ``(steps,)``
        bools. Returns the staged rows (shape (T, row_words), uint64) and their per-field
        views. Raises ``ValueError`` / ``TypeError`` naming the field and agent on any bad
        value; nothing is stored either way.

        With an alive mask, an agent missing from ``obs`` (or given as ``None``) is not alive
        unless ``alive`` says otherwise; an agent that is not alive at any step may be missing
        from any field (what is missing is stored as zeros), one alive at some step must be in
        every per-agent field. Without it every agent is required everywhere.
        """
        if steps is None:
            rows, views = self.single_row, self._single_views
            rows[...] = 0  # a rejected fast attempt may have left values behind
        else:
            rows = np.zeros((steps, self.row_words), dtype=np.uint64)
            views = self.views(rows)
        lead = () if steps is None else (steps,)
        alive = self._alive_mask(fields, lead) if self.alive else None
        required = None if alive is None else {a for a, mask in alive.items() if bool(mask.any())}
        for f in self.agent_fields:
            arrays = self._checked_arrays(f, fields.get(f, MISSING), lead, required)
            packed = self.packed_fields[f]
            if packed is not None and all(a is not None for a in arrays):
                lo, hi, dt = packed
                region = rows.view(np.uint8)[:, lo:hi].view(dt)
                if steps is None:
                    region[0] = np.concatenate([a.reshape(-1) for a in arrays])  # type: ignore[union-attr]
                else:
                    region[...] = np.concatenate(
                        [a.reshape(steps, -1) for a in arrays],  # type: ignore[union-attr]
                        axis=1,
                    )
            else:
                for agent, arr in zip(self.agents, arrays):
                    if arr is not None:  # an agent that is not alive and not given: zeros
                        views[f][agent][...] = arr
        for name in self.global_fields:
            views[name][GLOBAL][...] = self._checked_global(name, fields.get(name, MISSING), lead)
        if alive is not None:
            for agent, mask in alive.items():
                views[ALIVE][agent][...] = mask
        self._check_finite(rows)
        if self.discrete_actions:
            bad = self.find_bad_action(rows)
            if bad is not None:
                slot, step = bad
                n = self.specs[slot.agent].n_discrete_actions
                values = rows.view(np.uint8)[step, slot.offset : slot.offset + slot.nbytes]
                where = "" if steps is None else f" at step {step}"
                raise ValueError(
                    f"action[{slot.agent!r}] of a discrete agent ({n} actions) is "
                    f"{values.view(slot.dtype).tolist()}{where}"
                    ", which is no action: a discrete action is an integer in "
                    f"[0, {n}), a one-hot vector or a vector of probabilities (each in [0, 1], "
                    "summing to 1)"
                )
        return rows, views

    def _alive_mask(
        self, fields: Mapping[str, Any], lead: tuple[int, ...]
    ) -> dict[str, np.ndarray]:
        """Per agent, its alive flags (shape ``lead``, bool): ``alive`` where given, else
        whether the agent is in ``obs``."""
        given = {
            a
            for a, item in zip(self.agents, self._agent_items("obs", fields["obs"], set()))
            if item is not None
        }
        explicit = fields.get(ALIVE)
        items = (
            [None] * len(self.agents)
            if explicit is None
            else self._agent_items(ALIVE, explicit, set())
        )
        out = {}
        for agent, item in zip(self.agents, items):
            if item is None:
                out[agent] = np.full(lead, agent in given, dtype=np.bool_)
                continue
            arr = item if type(item) is np.ndarray else np.asarray(item)
            if arr.dtype.kind not in "biu" or (
                arr.dtype.kind != "b" and arr.size and not np.isin(arr, (0, 1)).all()
            ):
                raise TypeError(
                    f"alive[{agent!r}] must be a bool (or 0/1){' per step' if lead else ''}; "
                    f"got {item!r}"
                )
            if arr.shape != lead:
                raise ValueError(f"alive[{agent!r}] must have shape {lead}; got {arr.shape}")
            out[agent] = arr.astype(np.bool_)
        return out

    def _agent_items(self, field: str, value: Any, required: set[str] | None) -> list[Any]:
        """Per agent (in agent order), its item of ``field``; ``None`` for an agent that is not
        given. ``required=None``: every agent is required (no alive mask); otherwise the agents
        that must be given (alive at some step)."""
        agents = self.agents
        if value is MISSING:
            needed = agents if required is None else [a for a in agents if a in required]
            if needed:
                raise ValueError(self._missing_field_message(field, needed))
            return [None] * len(agents)
        if isinstance(value, Mapping):
            extra = [a for a in value if a not in self.specs]
            items = [value.get(a) for a in agents]
            missing = [a for a, x in zip(agents, items) if x is None]
            if required is None and (missing or extra):
                raise ValueError(
                    f"{field} must have exactly the agents {agents}; missing {missing}, "
                    f"unexpected {extra}"
                    + (
                        ". To store agents that are absent at some steps (dead, or gone from "
                        "a PettingZoo env), build the buffer with alive=True"
                        if missing and not extra
                        else ""
                    )
                )
            if extra:
                raise ValueError(
                    f"{field} has entries for unknown agents {extra}; the agents are {agents}"
                )
        elif isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
            if len(value) != len(agents):
                raise ValueError(
                    f"{field} given as a sequence must have one entry per agent "
                    f"({len(agents)}); got {len(value)}"
                )
            items = list(value)
            missing = (
                [a for a, x in zip(agents, items) if x is None] if required is not None else []
            )
        else:
            raise TypeError(
                f"{field} must be a dict keyed by agent name (or a list in agent order); "
                f"got {type(value).__name__}"
            )
        if required is not None:
            absent_required = [a for a in missing if a in required]
            if absent_required:
                raise ValueError(
                    f"{field} has no entry for {absent_required}, alive at this step (in obs, or "
                    "alive=True given); pass it. An agent left out of obs (or given alive=False) "
                    "is stored absent: zero-filled where not given, alive False"
                )
        return items

    def _missing_field_message(self, field: str, agents: list[str]) -> str:
        if field in self.global_fields:
            fs = self.global_fields[field]
            return (
                f"{field}= is missing: this buffer declares the global field {field!r} "
                f"(shape {fs.shape}, {fs.dtype}); pass {field}=<array of that shape> (with a "
                "leading T axis for extend, K for add_envs)"
            )
        return (
            f"{field}= is missing: this buffer declares the extra field {field!r} for every "
            f"agent; pass {field}={{agent: value}} for {agents}"
        )

    def _checked_arrays(
        self, field: str, value: Any, lead: tuple[int, ...], required: set[str] | None = None
    ) -> list[np.ndarray | None]:
        """Per agent, the input as an array of exactly ``lead + shape``, castable to storage
        (``None`` for an agent not given; see :meth:`_agent_items`)."""
        out: list[np.ndarray | None] = []
        for s, item in zip(self.slots_by_field[field], self._agent_items(field, value, required)):
            if item is None and required is not None:
                out.append(None)
                continue
            arr = item if type(item) is np.ndarray else _as_array(f"{field}[{s.agent!r}]", item)
            expected = lead + s.shape
            if arr.shape != expected:
                arr = self._reshape_special(field, s, arr, lead)
            self._check_item(f"{field}[{s.agent!r}]", field, s, arr, item)
            out.append(arr)
        return out

    def _checked_global(self, name: str, value: Any, lead: tuple[int, ...]) -> np.ndarray:
        """The global field ``name`` as an array of exactly ``lead + shape``."""
        if value is MISSING:
            raise ValueError(self._missing_field_message(name, []))
        (s,) = self.slots_by_field[name]
        arr = value if type(value) is np.ndarray else _as_array(name, value)
        if arr.shape != lead + s.shape:
            axis = " (with a leading T axis for extend, K for add_envs)" if lead else ""
            raise ValueError(
                f"global field {name} must have shape {lead + s.shape}{axis}; got {arr.shape}"
            )
        self._check_item(name, name, s, arr, value)
        return arr

    def _check_item(self, label: str, field: str, s: FieldSlot, arr: np.ndarray, item: Any) -> None:
        """Raise unless ``arr`` converts to the stored dtype of ``s`` without losing values."""
        src = arr.dtype
        key = (src, s.dtype)
        ok = self._castable.get(key)
        if ok is None:
            ok = src.kind in "biuf" and bool(np.can_cast(src, s.dtype, casting="same_kind"))
            self._castable[key] = ok
        if not ok:
            if src.kind not in "biuf":
                raise TypeError(f"{label} must be numeric; got dtype {src} ({type(item).__name__})")
            where = "the AgentSpec" if field in FIELDS else "its FieldSpec"
            raise TypeError(
                f"{label} has dtype {src}, which does not cast safely to the stored {s.dtype}; "
                f"convert it or declare the dtype in {where}"
            )
        if not arr.size:
            return
        if s.dtype.kind == "f" and (src.kind in "iu" or src.itemsize > s.dtype.itemsize):
            self._check_range(label, s, arr)
        elif s.dtype.kind in "iu" and field not in FIELDS and not self.safe_cast(src, s.dtype):
            info = np.iinfo(s.dtype)
            low, high = int(arr.min()), int(arr.max())
            if low < info.min or high > info.max:
                raise ValueError(
                    f"{label} holds {low if low < info.min else high}, outside the range of the "
                    f"stored {s.dtype} [{info.min}, {info.max}]; declare a wider dtype in its "
                    "FieldSpec"
                )

    def _check_range(self, label: str, s: FieldSlot, arr: np.ndarray) -> None:
        """Finite values beyond the stored float dtype's range would be stored as inf."""
        limit = float(np.finfo(s.dtype).max)
        with np.errstate(invalid="ignore"):
            finite = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
            if finite.size and float(np.abs(finite).max()) > limit:
                where = "the AgentSpec" if s.field in FIELDS else "its FieldSpec"
                raise ValueError(
                    f"{label} holds {float(np.abs(finite).max()):g}, outside the range of the "
                    f"stored {s.dtype} (±{limit:g}); rescale it or declare a wider dtype in "
                    f"{where}"
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
            one_hot = np.zeros((*arr.shape, n), dtype=s.dtype)  # not eye(n): n may be large
            np.put_along_axis(one_hot, arr[..., None].astype(np.intp), 1, axis=-1)
            return one_hot
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

    def find_bad_action(self, rows: np.ndarray) -> tuple[FieldSlot, int] | None:
        """The first discrete agent's action in staged ``rows`` (shape (T, row_words), uint64)
        that is no action, as ``(its slot, the row)``, or ``None``: a vector action must be
        probabilities (each in [0, 1], summing to 1 within :func:`discrete_tolerance`; one-hot
        vectors and integer actions, which are staged one-hot, are). Agents not alive at a step
        are not checked."""
        raw = rows.view(np.uint8)
        for dt, columns, starts, slots, limits, alive in self.discrete_actions:
            if alive is None and dt != np.float16:  # one kernel pass (Numba has no float16)
                found = first_bad_action(raw.view(dt), columns, starts, limits)
                if found < 0:
                    continue
                return slots[found % len(slots)], found // len(slots)
            values = raw.view(dt)[:, columns].astype(np.float64)  # (T, actions of all agents)
            outside = ~((values >= 0) & (values <= 1))
            bad = np.logical_or.reduceat(outside, starts, axis=1)
            sums = np.add.reduceat(values, starts, axis=1)
            bad |= ~(np.abs(sums - 1.0) <= limits)
            if alive is not None:
                bad &= raw[:, alive] != 0
            if bad.any():
                step, agent = (int(x[0]) for x in np.nonzero(bad))
                return slots[agent], step
        return None

    def _check_finite(self, rows: np.ndarray) -> None:
        for dt, starts, counts, segs in self.float_segments:
            bad = first_nonfinite_segment(rows, dt, starts, counts)
            if bad >= 0:
                s = segs[bad]
                raise ValueError(
                    f"{s.field}[{s.agent!r}] contains NaN or inf; clean the data before adding "
                    "it (or mask the transition out)"
                )


def discrete_tolerance(slot: FieldSlot, dtype: np.dtype) -> float:
    """How far the sum of a discrete agent's vector action, stored as ``dtype``, may be from 1
    (rounding of probabilities summed in the stored dtype)."""
    n = slot.shape[0] if slot.shape else 1
    return _config.DISCRETE_SUM_TOLERANCE + 4 * n * float(np.finfo(dtype).eps)


def _discrete_plan(
    codec: CheckedStaging,
) -> list[tuple[np.dtype, np.ndarray, np.ndarray, list[FieldSlot], np.ndarray, np.ndarray | None]]:
    """Per action dtype of the discrete agents: the dtype, the columns of their actions in a
    row viewed in it, where each agent's columns start among them, their slots, the tolerance
    of each one's sum, and the byte of each agent's alive flag (``None`` without an alive
    mask)."""
    alive = {s.agent: s.offset for s in codec.slots if s.field == ALIVE}
    groups: dict[np.dtype, list[FieldSlot]] = {}
    for slot in codec.slots:
        if slot.field == "action" and codec.specs[slot.agent].n_discrete_actions:
            groups.setdefault(slot.dtype, []).append(slot)
    plan = []
    for dt, slots in groups.items():
        columns = np.concatenate(
            [s.offset // dt.itemsize + np.arange(s.nbytes // dt.itemsize) for s in slots]
        ).astype(np.intp)
        sizes = [s.nbytes // dt.itemsize for s in slots]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
        flags = np.array([alive[s.agent] for s in slots], dtype=np.intp) if codec.alive else None
        limits = np.array([discrete_tolerance(s, dt) for s in slots])
        plan.append((dt, columns, starts, slots, limits, flags))
    return plan


def first_nonfinite_segment(
    rows: np.ndarray, dt: np.dtype, starts: np.ndarray, counts: np.ndarray
) -> int:
    """The first segment of ``rows`` (viewed as ``dt``) holding a NaN or inf, or -1."""
    if dt.itemsize == 2:  # Numba has no float16 arithmetic: test the bits
        return int(first_nonfinite_half(rows.view(np.uint16), starts, counts))
    return int(first_nonfinite(rows.view(dt), starts, counts))


def steps_of(codec: CheckedStaging, fields: Mapping[str, Any]) -> int:
    """The common leading length ``T`` of ``extend``'s arguments (checked consistent).

    When the lengths disagree, the most common length is taken as the intended one and the
    error names the first item that differs from it. Items that are not given (an agent left
    out of a buffer with an alive mask, an extra not passed) are skipped; :meth:`RowCodec.stage`
    decides whether they may be missing.
    """
    lengths: list[tuple[str, int]] = []
    lenient: set[str] | None = set() if codec.alive else None
    for f in codec.agent_fields:
        value = fields.get(f, MISSING)
        if value is MISSING:
            continue
        for s, item in zip(codec.slots_by_field[f], codec._agent_items(f, value, lenient)):
            if item is None and lenient is not None:
                continue
            shape = item.shape if type(item) is np.ndarray else np.shape(item)
            discrete_index = f == "action" and codec.specs[s.agent].n_discrete_actions
            if len(shape) != len(s.shape) + 1 and not (discrete_index and len(shape) == 1):
                raise ValueError(
                    f"extend needs a leading time axis: {f}[{s.agent!r}] must have shape "
                    f"{('T', *s.shape)}; got {tuple(shape)}. Use add() for one timestep"
                )
            lengths.append((f"{f}[{s.agent!r}]", int(shape[0])))
    for name, fs in codec.global_fields.items():
        value = fields.get(name, MISSING)
        if value is MISSING:
            continue
        shape = np.shape(value)
        if len(shape) != len(fs.shape) + 1:
            raise ValueError(
                f"extend needs a leading time axis: global field {name} must have shape "
                f"{('T', *fs.shape)}; got {tuple(shape)}. Use add() for one timestep"
            )
        lengths.append((name, int(shape[0])))
    if codec.alive and fields.get(ALIVE) is not None:
        for agent, item in zip(codec.agents, codec._agent_items(ALIVE, fields[ALIVE], set())):
            if item is not None:
                shape = np.shape(item)
                if len(shape) != 1:
                    raise ValueError(
                        f"alive[{agent!r}] needs one flag per timestep, shape ('T',); "
                        f"got {tuple(shape)}"
                    )
                lengths.append((f"alive[{agent!r}]", int(shape[0])))
    if not lengths:
        raise ValueError(
            "extend got no per-step values: every agent is missing from obs (store at least "
            "one agent's values, or pass alive= with a leading time axis)"
        )
    counts: dict[int, int] = {}
    for _, t in lengths:
        counts[t] = counts.get(t, 0) + 1
    steps = max(counts, key=lambda t: counts[t])
    for label, t in lengths:
        if t != steps:
            raise ValueError(
                f"every extend argument needs the same number of timesteps; {label} has {t}, "
                f"the others {steps}"
            )
    if not steps:
        raise ValueError("extend needs at least one timestep; got T=0")
    return steps
