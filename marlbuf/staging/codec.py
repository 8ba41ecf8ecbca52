"""The row codec: staging by one kernel call per ``add``, over the fast and complete paths.

:class:`RowCodec` is what the writer holds. ``add``'s common case is checked whole by a one-step
kernel (:mod:`marlbuf._kernels.staging`) that reads the caller's items directly
(:meth:`RowCodec.step_items`, :class:`StepPlan`) and writes only after every check passed: into
the staging row (:meth:`RowCodec.stage_step`) or, for the buffer, straight into the storage.
What it does not take goes to the fast path (:class:`marlbuf.staging.fast.FastStaging`), then to
the complete path (:class:`marlbuf.staging.checked.CheckedStaging`), which explains any
rejection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
from numba.core import errors as numba_errors

from marlbuf._kernels import stage_leading_step, stage_step
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
from marlbuf.spec import ALIVE, FIELDS, AgentSpec, FieldSlot, FieldSpec
from marlbuf.staging.checked import MISSING, first_nonfinite_segment
from marlbuf.staging.fast import FastStaging, NotCommonCase

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


class RowCodec(FastStaging):
    """The staging of one set of specs' rows: the one-step kernels' path over the fast path
    (:class:`~marlbuf.staging.fast.FastStaging`) and the complete path
    (:class:`~marlbuf.staging.checked.CheckedStaging`), over the row format
    (:class:`marlbuf.rows.RowGeometry`)."""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
    ) -> None:
        super().__init__(specs, global_fields, alive)
        lean_start, dense_start = self.done_span[0], self.done_span[1]
        # the NaN/inf scan of the fields after the five (extras, globals, alive), which the
        # one-step kernel does not stage
        self._more_segments = [
            (dt, starts[keep], counts[keep], [s for s, k in zip(segs, keep) if k])
            for dt, starts, counts, segs in self.float_segments
            for keep in [np.array([s.field not in FIELDS for s in segs], dtype=bool)]
            if keep.any()
        ]
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
        #: the plan of the one-step kernels (``None``: turned off for these specs)
        self.step_plan = self._step_plan()
        #: whether these specs are written by the one-step kernels (the five fields stored in
        #: one dtype, float32 or float64), even once an input turned them off (step_failed)
        self.one_step_specs = self.step_plan is not None

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
            row=self.single_row.view(dt).reshape(-1),
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
        except (KeyError, NotCommonCase):
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
                    self.fill_more(
                        values[len(FIELDS) :],
                        1 if leading else None,
                        self.single_row.view(np.uint8),
                    )
            except (NotCommonCase, AttributeError, TypeError, ValueError, KeyError, IndexError):
                return None
            for dt, starts, counts, _ in self._more_segments:
                if first_nonfinite_segment(self.single_row, dt, starts, counts) >= 0:
                    return None
        return self.single_row


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
            raise NotCommonCase
        return tuple(value)
    if kind is np.ndarray:
        if value.ndim == 0 or value.shape[0] != n:
            raise NotCommonCase
        return tuple(value)
    if (isinstance(value, dict) or isinstance(value, Mapping)) and len(value) == n:
        return get(dict(value))
    raise NotCommonCase


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
