"""The fast staging path: the common case of a write in the fewest Python operations.

When every field is *packed* (its agents' items share one dtype and sit back to back in a row),
:class:`FastStaging` writes each field into the staging rows with one ``np.concatenate`` (one
vectorised one-hot step for the integer actions of discrete agents), then runs the same NaN/inf
scan and discrete-action check as the complete path. Whatever it cannot prove valid it hands to
the complete path (:mod:`marlbuf.staging.checked`) by returning ``None``, so it never accepts a
write that path would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marlbuf.spec import ALIVE, FIELDS, AgentSpec, FieldSpec
from marlbuf.staging.checked import CheckedStaging, first_nonfinite_segment


class NotCommonCase(Exception):
    """Raised inside the fast staging path: hand the call to the complete path."""


#: the identity matrix that one-hot encodes integer actions is built only up to this size
#: (``n_discrete_actions`` of at most about 500 float32); larger ones are encoded in place
_ONE_HOT_TABLE = 1 << 20


class FastStaging(CheckedStaging):
    """The fast staging path over the complete one (:class:`CheckedStaging`)."""

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
    ) -> None:
        super().__init__(specs, global_fields, alive)
        self._min_discrete = 0
        self._eye: np.ndarray | None = None
        self._fast = self._fast_plan()
        self._fast_more = self._fast_plan_more()
        single_raw = self.single_row.view(np.uint8)
        self._single_more_regions = [
            single_raw[:, lo:hi].view(dt) for _, lo, hi, dt, _, _ in self._fast_more
        ]
        self._single_regions = (
            None
            if self._fast is None
            else [single_raw[:, lo:hi].view(dt) for _, lo, hi, dt, _, _ in self._fast]
        )

    def _fast_plan(self) -> list[tuple[str, int, int, np.dtype, list[tuple[int, ...]], Any]] | None:
        """Per field, what the fast path needs, or ``None`` when some field is not packed.

        Entries: ``(field, lo, hi, dtype, item shapes, one-hot plan)``; the one-hot plan is
        ``(positions, n_actions)`` (element offsets of each agent's action inside the field's
        region, and its number of discrete actions) when every agent's action is discrete.
        """
        plan = []
        n_agents = len(self.agents)
        for f in FIELDS:
            packed = self.packed_fields[f]
            if packed is None:
                return None
            lo, hi, dt = packed
            shapes = [s.shape for s in self.slots_by_field[f]]
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
            slots = self.slots_by_field[f]
            packed = self.packed_fields[f]
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
        or a list/tuple in agent order, when every field is packed (see ``packed_fields``): one
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
            rows = self.single_row  # add(), or extend() of one step: the persistent staging row
        else:
            rows = np.zeros((steps, self.row_words), dtype=np.uint64)
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, caught below
                self._fill_fast(plan, fields, steps, rows.view(np.uint8))
        except (NotCommonCase, AttributeError, TypeError, ValueError, KeyError, IndexError):
            return None  # not the common case: the complete path decides and explains
        for dt, starts, counts, _ in self.float_segments:
            if first_nonfinite_segment(rows, dt, starts, counts) >= 0:
                return None  # NaN/inf, or a value beyond the stored range: stage() says which
        if self.discrete_actions and self.find_bad_action(rows) is not None:
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
        ``NotCommonCase`` (or NumPy's own errors) for anything outside the common case."""
        agents = self.agents
        n_agents = len(agents)
        regions = self._single_regions if steps is None or steps == 1 else None
        if self.more:  # extras, global fields, alive: after the five fields
            self.fill_more(fields[len(FIELDS) :], steps, raw)
        for k, ((_, lo, hi, dt, shapes, onehot), value) in enumerate(zip(plan, fields)):
            items: Any
            if type(value) is dict:
                if len(value) != n_agents:
                    raise NotCommonCase
                items = [value[a] for a in agents]
            elif type(value) in (list, tuple):
                if len(value) != n_agents:
                    raise NotCommonCase
                items = value
            elif type(value) is np.ndarray and value.ndim and value.shape[0] == n_agents:
                items = value  # stacked (n_agents, ...): rows are the agents' items
            else:
                raise NotCommonCase
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
                        raise NotCommonCase
                    if any(isinstance(a, (bool, np.bool_)) for a in items):
                        raise NotCommonCase  # a bool is no action (np.array makes it an int)
                    acts = np.array(items)
                    if acts.dtype.kind not in "iu" or acts.shape != (n_agents,):
                        raise NotCommonCase
                    if self._eye is not None:  # every agent has n actions: rows of eye(n)
                        np.take(self._eye, acts, axis=0, out=region[0].reshape(n_agents, -1))
                    else:
                        region[0] = 0
                        region[0, positions + acts] = 1
                else:
                    if any(np.asarray(a).dtype.kind not in "iu" for a in items):
                        raise NotCommonCase  # e.g. one agent's bools: np.array makes ints
                    acts = np.array(items)
                    if acts.dtype.kind not in "iu" or acts.shape != (n_agents, steps):
                        raise NotCommonCase
                    if (acts < 0).any() or (acts >= ns[:, None]).any():
                        raise NotCommonCase
                    region[...] = 0
                    region[np.arange(steps)[None, :], positions[:, None] + acts] = 1
            elif shapes[0] == ():
                # one scalar per agent (reward, done): one array of all agents' values
                arr = np.array(items)
                if arr.dtype.kind not in "biuf":
                    raise NotCommonCase
                if steps is None:
                    if arr.shape != (n_agents,):
                        raise NotCommonCase
                    np.copyto(region[0], arr, casting="same_kind")
                else:
                    if arr.shape != (n_agents, steps):
                        raise NotCommonCase
                    np.copyto(region, arr.T, casting="same_kind")
            elif steps is None:
                if type(items) is np.ndarray:
                    if items.shape[1:] != shapes[0] or any(sh != shapes[0] for sh in shapes):
                        raise NotCommonCase
                    np.copyto(region[0], items.reshape(-1), casting="same_kind")
                    continue
                if [x.shape for x in items] != shapes:
                    raise NotCommonCase
                np.concatenate(items, out=region[0], casting="same_kind")
            else:
                if [x.shape for x in items] != [(steps, *sh) for sh in shapes]:
                    raise NotCommonCase
                np.concatenate(items, axis=1, out=region, casting="same_kind")

    def fill_more(self, values: Sequence[Any], steps: int | None, raw: np.ndarray) -> None:
        """:meth:`_fill_fast` for extras, global fields and the alive mask. Integer fields
        take only inputs that cast safely (a wrapped value would pass the NaN/inf scan)."""
        n_agents = len(self.agents)
        lead = () if steps is None else (steps,)
        n_rows = 1 if steps is None else steps
        regions = self._single_more_regions if steps is None or steps == 1 else None
        safe = self.safe_cast
        for k, ((f, lo, hi, dt, shapes, kind), value) in enumerate(zip(self._fast_more, values)):
            region = regions[k] if regions is not None else raw[:, lo:hi].view(dt)
            exact = dt.kind in "iu"
            if kind == "alive":
                if value is None:  # not given: every agent of a complete call is alive
                    region[...] = True
                    continue
                arr = np.array(self._fast_items(value))
                if arr.dtype != np.bool_ or arr.shape != (n_agents, *lead):
                    raise NotCommonCase
                region[...] = arr.T if steps is not None else arr
                continue
            if kind == "global":
                if type(value) is not np.ndarray or value.shape != lead + shapes[0]:
                    raise NotCommonCase
                if exact and not safe(value.dtype, dt):
                    raise NotCommonCase
                np.copyto(region, value.reshape(n_rows, -1), casting="same_kind")
                continue
            items = self._fast_items(value)
            if kind == "scalar":
                arr = np.array(items)
                if arr.dtype.kind not in "biuf" or arr.shape != (n_agents, *lead):
                    raise NotCommonCase
                if exact and not safe(arr.dtype, dt):
                    raise NotCommonCase
                np.copyto(region, arr.T if steps is not None else arr, casting="same_kind")
                continue
            if type(items) is np.ndarray:
                raise NotCommonCase  # stacked extras: the complete path splits them
            if [x.shape for x in items] != [lead + sh for sh in shapes]:
                raise NotCommonCase
            if exact and not all(safe(x.dtype, dt) for x in items):
                raise NotCommonCase
            if kind == "packed":
                if steps is None:
                    np.concatenate(items, out=region[0], casting="same_kind")
                else:
                    np.concatenate(items, axis=1, out=region, casting="same_kind")
                continue
            for s, x in zip(self.slots_by_field[f], items):  # "loose": one copy per agent
                part = raw[:, s.offset : s.offset + s.nbytes].view(s.dtype)
                np.copyto(part.reshape(n_rows, *s.shape), x.reshape(n_rows, *s.shape), "same_kind")

    def _fast_items(self, value: Any) -> Any:
        """Every agent's item of a per-agent field in agent order, or ``NotCommonCase``."""
        if type(value) is dict:
            if len(value) != len(self.agents):
                raise NotCommonCase
            return [value[a] for a in self.agents]
        if type(value) in (list, tuple):
            if len(value) != len(self.agents):
                raise NotCommonCase
            return value
        if type(value) is np.ndarray and value.ndim and value.shape[0] == len(self.agents):
            return value
        raise NotCommonCase
