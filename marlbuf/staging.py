"""Validation and staging of incoming transitions (the writer's front half).

Every ``add``/``extend`` is first written into *staging rows* in the interleaved row format
(:func:`marlbuf.spec.interleaved_row_layout`), checked there, and only then committed to the
storage — whatever its layout. So validation is one mechanism for both layouts, a rejected call
leaves the storage untouched, and the costly checks run over whole rows at once: shapes and
dtypes per agent (cheap tuple and dict look-ups), NaN/inf by one Numba scan of the staged
floats instead of one ``np.isfinite`` per agent and field.

``add``'s common case is checked whole by a one-step kernel (:mod:`marlbuf._kernels.staging`)
that reads the caller's items directly (:meth:`RowCodec.step_items`, :class:`StepPlan`) and
writes only after every check passed: into the staging row (:meth:`RowCodec.stage_step`) or,
for the buffer, straight into the storage. Whatever a faster path does not take goes to the
next one, and :meth:`RowCodec.stage` explains any rejection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
from numba.core import errors as numba_errors

from marlbuf import _config
from marlbuf._kernels import (
    first_nonfinite,
    first_nonfinite_half,
    stage_leading_step,
    stage_step,
)
from marlbuf._kernels.actions import first_bad_action
from marlbuf._kernels.links import (
    DENSE_DONE,
    DENSE_NEXT_OBS,
    DONE_WORDS,
    LEAN_DONE,
    LEAN_HEAD,
    OBS_BYTES,
)
from marlbuf._kernels.staging import (
    PLAN_ACTION,
    PLAN_DISCRETE,
    PLAN_DONE,
    PLAN_DONE_LEAN,
    PLAN_NEXT_OBS,
    PLAN_OBS,
    PLAN_OBS_DIMS,
    PLAN_REWARD,
)
from marlbuf.rows import RowGeometry, RowViews
from marlbuf.spec import (
    ALIVE,
    FIELDS,
    GLOBAL,
    AgentSpec,
    FieldSlot,
    FieldSpec,
)


class _Missing:
    """The value of a declared extra or global field that a call did not pass."""

    def __repr__(self) -> str:
        return "MISSING"


#: Stands for an extra or global field that ``add``/``extend``/``add_envs`` did not receive.
MISSING: Any = _Missing()


class _NotCommonCase(Exception):
    """Raised inside the fast staging path: hand the call to the complete path."""


#: ``add``'s five fields as the one-step kernels take them: per field, the agents' items
StepItems = tuple[
    tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]
]


class StepPlan(NamedTuple):
    """What the one-step kernels (:mod:`marlbuf._kernels.staging`) need for one codec."""

    #: per agent, offsets and item shapes (:data:`marlbuf._kernels.staging.PLAN_OBS` onwards)
    plan: np.ndarray
    #: the dtype the five fields are stored in
    dtype: np.dtype
    #: the staging row of ``add`` in the stored dtype
    row: np.ndarray
    #: a dict of every agent's items -> the tuple of them in agent order
    getter: Any
    n_agents: int
    #: the padding of a dense and of a lean row (element ranges)
    dense_gaps: np.ndarray
    lean_gaps: np.ndarray


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


#: the identity matrix that one-hot encodes integer actions is built only up to this size
#: (``n_discrete_actions`` of at most about 500 float32); larger ones are encoded in place
_ONE_HOT_TABLE = 1 << 20


class RowCodec(RowGeometry):
    """The staging of one set of specs' rows: validation of incoming fields and the staging
    rows they are written into, over the row format (:class:`marlbuf.rows.RowGeometry`)."""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
    ) -> None:
        super().__init__(specs, global_fields, alive)
        lean_start, dense_start = self.done_span[0], self.done_span[1]
        self._by_field: dict[str, list[FieldSlot]] = {f: [] for f in self.field_names}
        for s in self.slots:
            self._by_field[s.field].append(s)
        # a field whose agents all share one dtype, with 1-D (or scalar) items packed back to
        # back, can be staged with a single assignment of the concatenated inputs (a global
        # field is one item: always)
        self._packed: dict[str, tuple[int, int, np.dtype] | None] = {}
        for f, slots in self._by_field.items():
            same = all(s.dtype == slots[0].dtype and len(s.shape) <= 1 for s in slots)
            adjacent = all(a.offset + a.nbytes == b.offset for a, b in pairwise(slots))
            end = slots[-1].offset + slots[-1].nbytes
            packed = (same and adjacent) or f in self.global_fields
            self._packed[f] = (slots[0].offset, end, slots[0].dtype) if packed else None
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
        # the same scan for the fields after the five (extras, globals, alive), which the
        # one-step kernel does not stage
        self._more_segments = [
            (dt, starts[keep], counts[keep], [s for s, k in zip(segs, keep) if k])
            for dt, starts, counts, segs in self._segments
            for keep in [np.array([s.field not in FIELDS for s in segs], dtype=bool)]
            if keep.any()
        ]
        #: discrete agents' action items, for the check that a vector action is one action
        #: (:meth:`_first_bad_action`)
        self._discrete = _discrete_plan(self)
        #: the geometry of a row for the one-step commit kernels (8-byte words unless said
        #: otherwise; see :data:`marlbuf._kernels.links.LEAN_HEAD`)
        self.lean_words = np.zeros(6, dtype=np.int64)
        words = lambda nbytes: -(-nbytes // 8)  # noqa: E731 - sections start on words
        self.lean_words[LEAN_HEAD] = words(self.head_bytes)
        self.lean_words[LEAN_DONE] = lean_start // 8
        self.lean_words[DENSE_DONE] = dense_start // 8
        self.lean_words[DONE_WORDS] = words(self.done_span[2])
        self.lean_words[OBS_BYTES] = self.obs_bytes
        self.lean_words[DENSE_NEXT_OBS] = self.next_obs_start // 8
        self._castable: dict[tuple[Any, ...], bool] = {}
        # one persistent staging row for add(): padding stays zero. Callers serialize staging
        # (the buffer's writer lock), so one row is enough.
        self._single = np.zeros((1, self.row_words), dtype=np.uint64)
        #: the staging row of add() as one row of words (what the commit kernels take)
        #: the plan of the one-step kernels (``None``: turned off for these specs)
        self.step_plan = self._step_plan()
        #: whether these specs are written by the one-step kernels (the five fields stored in
        #: one dtype, float32 or float64), even once an input turned them off (step_failed)
        self.one_step_specs = self.step_plan is not None
        self._single_views = self.views(self._single)  # the complete path's, built once
        self._fast = self._fast_plan()
        self._fast_more = self._fast_plan_more()
        single_raw = self._single.view(np.uint8)
        self._single_more_regions = [
            single_raw[:, lo:hi].view(dt) for _, lo, hi, dt, _, _ in self._fast_more
        ]
        self._single_regions = (
            None
            if self._fast is None
            else [single_raw[:, lo:hi].view(dt) for _, lo, hi, dt, _, _ in self._fast]
        )

    # ------------------------------------------------------------------ one step
    def _step_plan(self) -> StepPlan | None:
        """What the one-step kernels need (:class:`StepPlan`), or ``None`` when the five fields
        are not all stored in one dtype they write (float32 or float64)."""
        five = [s for s in self.slots if s.field in FIELDS]
        dtypes = {s.dtype for s in five}
        if len(dtypes) != 1:
            return None
        (dt,) = dtypes
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            return None
        where = {(s.field, s.agent): s for s in five}
        done_lean = {s.agent: s for s in self.lean_slots if s.field == "done"}
        ndim = max(1, *(len(s.shape) for s in five if s.field in ("obs", "action")))
        action_dims = PLAN_OBS_DIMS + 1 + ndim  # obs and action shapes take 1 + ndim columns
        plan = np.zeros((len(self.agents), action_dims + 1 + ndim), dtype=np.int64)
        columns = {
            "obs": PLAN_OBS,
            "action": PLAN_ACTION,
            "reward": PLAN_REWARD,
            "next_obs": PLAN_NEXT_OBS,
            "done": PLAN_DONE,
        }
        for k, agent in enumerate(self.agents):
            for f, column in columns.items():
                plan[k, column] = where[f, agent].offset // dt.itemsize
            plan[k, PLAN_DONE_LEAN] = done_lean[agent].offset // dt.itemsize
            plan[k, PLAN_DISCRETE] = self.specs[agent].n_discrete_actions or 0
            for column, shape in (
                (PLAN_OBS_DIMS, where["obs", agent].shape),
                (action_dims, where["action", agent].shape),
            ):
                plan[k, column] = len(shape)
                plan[k, column + 1 : column + 1 + len(shape)] = shape
        agents = self.agents
        getter: Any = itemgetter(*agents) if len(agents) > 1 else (lambda d: (d[agents[0]],))
        # the padding of a stored row, which the store kernels zero (rows with fields beyond
        # the five are not stored by them)
        lean = [s for s in self.lean_slots if s.field in FIELDS]
        return StepPlan(
            plan=plan,
            dtype=dt,
            row=self._single.view(dt).reshape(-1),
            getter=getter,
            n_agents=len(agents),
            dense_gaps=_gaps(five, self.row_bytes, dt.itemsize),
            lean_gaps=_gaps(lean, self.lean_row_bytes, dt.itemsize),
        )

    def step_items(self, values: Sequence[Any]) -> StepItems | None:
        """``add``'s five field values as the one-step kernels take them — per field, a tuple of
        the agents' items in agent order — or ``None`` where they cannot: another dtype
        stored, a field that does not hold exactly the buffer's agents, observations that are
        not arrays.

        A field may be any ``Mapping`` keyed by agent (a ``dict``, ``defaultdict``,
        ``OrderedDict``, ``MappingProxyType``, a dict subclass: what environments return), a
        list or tuple in agent order, or one array stacked over the agents (its first axis).
        Items are read, never converted here; the kernels read NumPy arrays, NumPy scalars,
        0-d arrays, Python numbers and bools."""
        step = self.step_plan
        if step is None:
            return None
        get, n = step.getter, step.n_agents
        obs, action, reward, next_obs, done = values[:5]
        try:
            if (
                type(obs) is dict
                and type(action) is dict
                and type(reward) is dict
                and type(next_obs) is dict
                and type(done) is dict
            ):
                if not len(obs) == len(action) == len(reward) == len(next_obs) == len(done) == n:
                    return None
                items = (get(obs), get(action), get(reward), get(next_obs), get(done))
            else:  # per field: a plain dict as above, anything else by _step_items
                items = (
                    get(obs) if type(obs) is dict and len(obs) == n else _step_items(obs, n, get),
                    get(action)
                    if type(action) is dict and len(action) == n
                    else _step_items(action, n, get),
                    get(reward)
                    if type(reward) is dict and len(reward) == n
                    else _step_items(reward, n, get),
                    get(next_obs)
                    if type(next_obs) is dict and len(next_obs) == n
                    else _step_items(next_obs, n, get),
                    get(done)
                    if type(done) is dict and len(done) == n
                    else _step_items(done, n, get),
                )
        except (KeyError, _NotCommonCase):
            return None
        if type(items[0][0]) is not np.ndarray or type(items[3][0]) is not np.ndarray:
            return None  # e.g. lists: the NumPy paths convert them
        # a list item would reach Numba as a reflected list, and a ragged nested one crashes
        # its unboxing: lists take the NumPy paths, which convert and check them (one set of the
        # items' types: the cheapest scan measured, about 4 us at 24 agents)
        o, a, r, no, d = items
        if list in {*map(type, o), *map(type, a), *map(type, r), *map(type, no), *map(type, d)}:
            return None
        return items

    def step_failed(self, exc: Exception) -> None:
        """A one-step kernel raised ``exc`` instead of checking the step. Values Numba cannot
        type (a Python int beyond 64 bits, an unknown object) raise before any compilation,
        or fail to compile, and the complete checks then reject them. Values it types but
        cannot compile (float16 items) would fail to compile on every call: the one-step
        kernels are turned off for this codec, and the NumPy paths take every later step."""
        if not isinstance(exc, (TypeError, ValueError, numba_errors.TypingError)):
            self.step_plan = None

    def slow_reason(self, values: Sequence[Any]) -> str | None:
        """Why the one-step kernels did not take a valid step given as ``values`` (in
        :attr:`field_names` order), as a clause naming the input and the fix; ``None`` where
        no input is to blame: specs the kernels do not write (the five fields stored in more
        than one dtype, or in float16: a memory option, staged by NumPy), an absent agent of an
        ``alive=True`` buffer, a number the kernels cannot type. For
        :class:`marlbuf.buffer.SlowWriteWarning`."""
        if not self.one_step_specs:
            return None  # the specs' choice (several stored dtypes, float16), not the input
        globals_ = set(self.global_fields)
        for name, value in zip(self.field_names, values):
            if value is MISSING or value is None or name == ALIVE:
                continue
            if name in globals_:
                pairs: list[tuple[str, Any]] = [("", value)]
            elif isinstance(value, Mapping):
                pairs = [(a, value[a]) for a in self.agents if a in value]
            elif isinstance(value, (list, tuple, np.ndarray)) and len(value) == len(self.agents):
                pairs = list(zip(self.agents, value))
            else:
                return None  # the complete checks refuse it, or it is not a per-agent value
            for agent, item in pairs:
                why = _unread(name, item)
                if why is not None:
                    label = name if name in globals_ else f"{name}[{agent!r}]"
                    return f"{label} {why}"
        if self.step_plan is None:
            return (
                "an earlier input the one-step kernels cannot compile (float16 arrays) turned "
                "them off for this buffer: pass float32 or float64 arrays"
            )
        return None

    def stage_step(
        self, values: Sequence[Any], items: StepItems | None = None, leading: bool = False
    ) -> np.ndarray | None:
        """``add``'s common case staged by one kernel call, or ``None`` to take
        :meth:`stage_fast`.

        ``values`` are the field values in :attr:`field_names` order; ``items`` their
        :meth:`step_items` when already made. :func:`marlbuf._kernels.stage_step` reads every
        item of the five fields straight from the caller's dicts, checks shapes, dtypes,
        discrete action ranges and that every stored float is finite, and only then writes
        them into the staging row, one-hot encoding integer actions. Whatever it does not take
        it declines; the slower paths then decide, and :meth:`stage` explains any rejection.
        Extras, global fields and the alive mask are staged as by :meth:`stage_fast` and
        scanned for NaN/inf. Returns the staging row (shape (1, row_words), uint64).

        ``leading=True``: the values of a one-step ``extend``/``add_envs`` (every item with a
        leading axis of length 1; :func:`marlbuf._kernels.stage_leading_step`).
        """
        step = self.step_plan
        if step is None:
            return None
        if items is None:
            items = self.step_items(values)
            if items is None:
                return None
        kernel = stage_leading_step if leading else stage_step
        try:
            if not kernel(*items, step.row, step.plan):
                return None
        except Exception as exc:  # a value Numba cannot type: the other paths decide
            self.step_failed(exc)
            return None
        if self.more:
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, scanned
                    self._fill_more(
                        values[len(FIELDS) :], 1 if leading else None, self._single.view(np.uint8)
                    )
            except (_NotCommonCase, AttributeError, TypeError, ValueError, KeyError, IndexError):
                return None
            for dt, starts, counts, _ in self._more_segments:
                if _first_nonfinite(self._single, dt, starts, counts) >= 0:
                    return None
        return self._single

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
                if (ns == ns[0]).all() and int(ns[0]) ** 2 * dt.itemsize <= _ONE_HOT_TABLE:
                    self._eye = np.eye(int(ns[0]), dtype=dt)
                positions = np.concatenate([[0], np.cumsum(ns)[:-1]]).astype(np.int64)
                onehot = (positions, ns)
            plan.append((f, lo, hi, dt, shapes, onehot))
        assert len(plan) == len(FIELDS) and n_agents > 0
        return plan

    def _fast_plan_more(self) -> list[tuple[str, int, int, np.dtype, list[tuple[int, ...]], str]]:
        """The fast path's plan for the fields after the five (extras, globals, alive).

        Entries: ``(field, lo, hi, dtype, item shapes, kind)``; kind ``"scalar"`` (one scalar
        per agent), ``"packed"`` (1-D items of one dtype, back to back), ``"loose"`` (anything
        else: one copy per agent), ``"global"`` or ``"alive"``.
        """
        plan = []
        for f in self.keywords:
            slots = self._by_field[f]
            packed = self._packed[f]
            lo, hi, dt = packed if packed is not None else (0, 0, slots[0].dtype)
            shapes = [s.shape for s in slots]
            if f == ALIVE:
                kind = "alive"
            elif f in self.global_fields:
                kind = "global"
            elif packed is None:
                kind = "loose"
            elif all(sh == () for sh in shapes):
                kind = "scalar"
            else:
                kind = "packed"
            plan.append((f, lo, hi, dt, shapes, kind))
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
        if plan is None or len(fields) != len(self.field_names):
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
        if self._discrete and self._first_bad_action(rows) is not None:
            return None  # a discrete action vector that is not one action: stage() says which
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
        if self.more:  # extras, global fields, alive: after the five fields
            self._fill_more(fields[len(FIELDS) :], steps, raw)
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
                    if any(isinstance(a, (bool, np.bool_)) for a in items):
                        raise _NotCommonCase  # a bool is no action (np.array makes it an int)
                    acts = np.array(items)
                    if acts.dtype.kind not in "iu" or acts.shape != (n_agents,):
                        raise _NotCommonCase
                    if self._eye is not None:  # every agent has n actions: rows of eye(n)
                        np.take(self._eye, acts, axis=0, out=region[0].reshape(n_agents, -1))
                    else:
                        region[0] = 0
                        region[0, positions + acts] = 1
                else:
                    if any(np.asarray(a).dtype.kind not in "iu" for a in items):
                        raise _NotCommonCase  # e.g. one agent's bools: np.array makes ints
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

    def _fill_more(self, values: Sequence[Any], steps: int | None, raw: np.ndarray) -> None:
        """:meth:`_fill_fast` for extras, global fields and the alive mask. Integer fields
        take only inputs that cast safely (a wrapped value would pass the NaN/inf scan)."""
        n_agents = len(self.agents)
        lead = () if steps is None else (steps,)
        n_rows = 1 if steps is None else steps
        regions = self._single_more_regions if steps is None or steps == 1 else None
        safe = self._safe_cast
        for k, ((f, lo, hi, dt, shapes, kind), value) in enumerate(zip(self._fast_more, values)):
            region = regions[k] if regions is not None else raw[:, lo:hi].view(dt)
            exact = dt.kind in "iu"
            if kind == "alive":
                if value is None:  # not given: every agent of a complete call is alive
                    region[...] = True
                    continue
                arr = np.array(self._fast_items(value))
                if arr.dtype != np.bool_ or arr.shape != (n_agents, *lead):
                    raise _NotCommonCase
                region[...] = arr.T if steps is not None else arr
                continue
            if kind == "global":
                if type(value) is not np.ndarray or value.shape != lead + shapes[0]:
                    raise _NotCommonCase
                if exact and not safe(value.dtype, dt):
                    raise _NotCommonCase
                np.copyto(region, value.reshape(n_rows, -1), casting="same_kind")
                continue
            items = self._fast_items(value)
            if kind == "scalar":
                arr = np.array(items)
                if arr.dtype.kind not in "biuf" or arr.shape != (n_agents, *lead):
                    raise _NotCommonCase
                if exact and not safe(arr.dtype, dt):
                    raise _NotCommonCase
                np.copyto(region, arr.T if steps is not None else arr, casting="same_kind")
                continue
            if type(items) is np.ndarray:
                raise _NotCommonCase  # stacked extras: the complete path splits them
            if [x.shape for x in items] != [lead + sh for sh in shapes]:
                raise _NotCommonCase
            if exact and not all(safe(x.dtype, dt) for x in items):
                raise _NotCommonCase
            if kind == "packed":
                if steps is None:
                    np.concatenate(items, out=region[0], casting="same_kind")
                else:
                    np.concatenate(items, axis=1, out=region, casting="same_kind")
                continue
            for s, x in zip(self._by_field[f], items):  # "loose": one copy per agent
                part = raw[:, s.offset : s.offset + s.nbytes].view(s.dtype)
                np.copyto(part.reshape(n_rows, *s.shape), x.reshape(n_rows, *s.shape), "same_kind")

    def _fast_items(self, value: Any) -> Any:
        """Every agent's item of a per-agent field in agent order, or ``_NotCommonCase``."""
        if type(value) is dict:
            if len(value) != len(self.agents):
                raise _NotCommonCase
            return [value[a] for a in self.agents]
        if type(value) in (list, tuple):
            if len(value) != len(self.agents):
                raise _NotCommonCase
            return value
        if type(value) is np.ndarray and value.ndim and value.shape[0] == len(self.agents):
            return value
        raise _NotCommonCase

    def _safe_cast(self, src: np.dtype, dst: np.dtype) -> bool:
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
            rows, views = self._single, self._single_views
            rows[...] = 0  # a rejected fast attempt may have left values behind
        else:
            rows = np.zeros((steps, self.row_words), dtype=np.uint64)
            views = self.views(rows)
        lead = () if steps is None else (steps,)
        alive = self._alive_mask(fields, lead) if self.alive else None
        required = None if alive is None else {a for a, mask in alive.items() if bool(mask.any())}
        for f in self.agent_fields:
            arrays = self._checked_arrays(f, fields.get(f, MISSING), lead, required)
            packed = self._packed[f]
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
        if self._discrete:
            bad = self._first_bad_action(rows)
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
        for s, item in zip(self._by_field[field], self._agent_items(field, value, required)):
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
        (s,) = self._by_field[name]
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
        elif s.dtype.kind in "iu" and field not in FIELDS and not self._safe_cast(src, s.dtype):
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

    def _first_bad_action(self, rows: np.ndarray) -> tuple[FieldSlot, int] | None:
        """The first discrete agent's action in staged ``rows`` (shape (T, row_words), uint64)
        that is no action, as ``(its slot, the row)``, or ``None``: a vector action must be
        probabilities (each in [0, 1], summing to 1 within :func:`discrete_tolerance`; one-hot
        vectors and integer actions, which are staged one-hot, are). Agents not alive at a step
        are not checked."""
        raw = rows.view(np.uint8)
        for dt, columns, starts, slots, limits, alive in self._discrete:
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
        for dt, starts, counts, segs in self._segments:
            bad = _first_nonfinite(rows, dt, starts, counts)
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
    codec: RowCodec,
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


def _gaps(slots: list[FieldSlot], row_bytes: int, itemsize: int) -> np.ndarray:
    """The element ranges (shape (g, 2), int64, in units of ``itemsize``) of a row of
    ``row_bytes`` that no slot covers: its padding."""
    covered = np.zeros(row_bytes // itemsize, dtype=bool)
    for s in slots:
        covered[s.offset // itemsize : (s.offset + s.nbytes) // itemsize] = True
    edges = np.flatnonzero(np.diff(np.concatenate([[True], covered, [True]]).astype(np.int8)))
    return edges.reshape(-1, 2).astype(np.int64)


def _step_items(value: Any, n: int, get: Any) -> tuple[Any, ...]:
    """One field's items in agent order as a tuple (what the one-step kernels take), from
    anything but a plain dict (which the caller reads itself): a list or tuple of ``n`` items,
    an array stacked over ``n`` agents (its rows, as views), or any other ``Mapping`` keyed by
    agent (read by ``get``, the agents' item getter, from a plain copy: a ``defaultdict``
    never makes up a missing agent, and a dict subclass is read as ``dict.get`` reads it,
    as the complete checks do)."""
    kind = type(value)
    if kind is list or kind is tuple:
        if len(value) != n:
            raise _NotCommonCase
        return tuple(value)
    if kind is np.ndarray:
        if value.ndim == 0 or value.shape[0] != n:
            raise _NotCommonCase
        return tuple(value)
    if (isinstance(value, dict) or isinstance(value, Mapping)) and len(value) == n:
        return get(dict(value))
    raise _NotCommonCase


def _unread(field: str, item: Any) -> str | None:
    """Why the one-step kernels do not read ``item`` of ``field`` (a clause with the fix), or
    ``None`` when they read it: NumPy arrays of bools, integers, float32 or float64 (0-d ones
    too, outside obs and next_obs), and Python or NumPy bools, integers and floats."""
    kind = type(item)
    if kind is np.ndarray:
        if item.dtype.kind in "biu" or item.dtype in (np.float32, np.float64):
            return None
        return f"has dtype {item.dtype}: pass float32 or float64 arrays (x.astype(np.float32))"
    if isinstance(item, (bool, int, float, np.bool_, np.integer, np.float32, np.float64)):
        return None if field not in ("obs", "next_obs") else "is a number, not an array"
    if isinstance(item, (list, tuple)):
        return f"is a {kind.__name__}: pass a NumPy array (np.asarray(x, dtype=np.float32))"
    name = f"{kind.__module__}.{kind.__qualname__}"
    if kind.__module__.partition(".")[0] == "torch":
        return f"is a {name}: pass NumPy arrays (tensor.cpu().numpy()) or numbers (tensor.item())"
    return f"is a {name}: pass a NumPy array or a number"


def _first_nonfinite(rows: np.ndarray, dt: np.dtype, starts: np.ndarray, counts: np.ndarray) -> int:
    """The first segment of ``rows`` (viewed as ``dt``) holding a NaN or inf, or -1."""
    if dt.itemsize == 2:  # Numba has no float16 arithmetic: test the bits
        return int(first_nonfinite_half(rows.view(np.uint16), starts, counts))
    return int(first_nonfinite(rows.view(dt), starts, counts))


def steps_of(codec: RowCodec, fields: Mapping[str, Any]) -> int:
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
        for s, item in zip(codec._by_field[f], codec._agent_items(f, value, lenient)):
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


__all__ = ["MISSING", "RowCodec", "steps_of"]
