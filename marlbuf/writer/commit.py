"""The commit engine: validated steps become stored rows, links, episode steps and generations.

:class:`WritePath` owns everything a write changes and the policy of how next observations are
stored. It is given its parts, never the buffer: the row codec (checks and staging), the ring
(:class:`~marlbuf.writer.ring.RingWriter`: cursor, write generations, locks), the store, the
next-observation links and the episode index (each ``None`` where the buffer keeps none), the
sampler's write hook, the redo log of a memory-mapped folder (:class:`WriteLog`, attached once
the folder is live) and two hooks of the front for the format policy (a new store for another
``next_obs`` format, and whether dense rows would fit in memory).

Two paths write a step:

* the **one-step path** of ``add`` (and of a one-step ``extend``/``add_envs``): one kernel call
  checks the caller's values and stores them straight into the row table under the ring's
  ``lock`` (:func:`marlbuf._kernels.store_dense_step` / ``store_lean_step``), or one kernel
  stores a staged row (:func:`marlbuf._kernels.commit_dense_step` /
  :func:`marlbuf._kernels.links.commit_lean_step`). :class:`StepTarget` says which, for the
  store it was made for;
* the **general commit** (:meth:`WritePath.commit`) of staged rows (``extend``, ``add_envs``,
  memory-mapped buffers, sequence samplers, steps the kernels decline): the redo record first,
  then the links, the episode index, the rows, the ring and the sampler hook.

Either way a write that raises changes nothing: everything that can fail runs before the first
change.
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, NamedTuple, Protocol

import numpy as np

from marlbuf import _config
from marlbuf._kernels import (
    commit_dense_step,
    commit_lean_step,
    store_dense_leading_step,
    store_dense_step,
    store_lean_leading_step,
    store_lean_step,
)
from marlbuf._kernels.staging import STEP_DECLINED
from marlbuf.staging import RowCodec, StepItems, steps_of
from marlbuf.writer.episodes import EpisodeIndex
from marlbuf.writer.inputs import (
    MAX_STREAM,
    break_flag_reader,
    check_truncated,
    done_reader,
    leading_length,
    with_hint,
)
from marlbuf.writer.links import NextObsLinks
from marlbuf.writer.ring import RingWriter

#: the store kernels of a one-step ``extend``/``add_envs`` (items with a leading axis of 1)
LEADING_KERNELS = (store_dense_leading_step, store_lean_leading_step)
#: the store kernels of ``add``
STEP_KERNELS = (store_dense_step, store_lean_step)
#: ``NextObsLinks.pending`` of a stream without a pending transition (no slot, no generation)
_NO_PENDING = (-1, -1)


class StreamBreakWarning(UserWarning):
    """A step's ``obs`` differs from the ``next_obs`` of the previous step written on the same
    stream, and that step was neither done nor truncated: several environments are written in
    turn on one stream. The episode index ends the episode there (a sequence or episode never
    mixes environments). Raised once per buffer; write each environment on its own stream
    (``add(..., stream=k)``) or use ``add_envs``."""


class NextObsWarning(UserWarning):
    """Most stored steps of a buffer with observations stored once keep their ``next_obs`` in
    the side table: the data are not streams of consecutive steps (or several environments
    are written in turn on one stream), so the format costs memory and time instead of saving
    them. Raised once per buffer."""


class NextObsDroppedWarning(UserWarning):
    """A ``next_obs="auto"`` buffer's first write left ``next_obs`` out, so the buffer chose
    ``next_obs="none"``: it stores no next observations from then on, and reading them raises.
    Raised once per buffer, before anything is stored; build the buffer with
    ``next_obs="none"`` to choose this format without the warning, or pass ``next_obs=`` to
    every write to keep next observations."""


class SlowWriteWarning(UserWarning):
    """A valid step of ``add`` (or a one-step ``extend``/``add_envs``) was not taken by the
    one-kernel write path because of how one of its inputs is given (a list where an array is
    expected, a torch tensor, a dtype the kernels do not read, specs whose five fields are
    stored in different dtypes), so it was staged by NumPy or the complete checks: several
    times slower. The message names the input and the fix. Raised once per buffer."""


class RowStore(Protocol):
    """What the commit engine uses of a store (:class:`marlbuf.stores.base.Storage`)."""

    layout: str
    stores_next_obs: bool

    def write(self, slots: np.ndarray, rows: np.ndarray, views: Any) -> None: ...


class WriteLog(Protocol):
    """The redo log of a memory-mapped folder, as the commit engine calls it: ``log`` before
    a commit changes anything (a crash never sees half a write), ``committed`` after it."""

    def log(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray,
        truncated: bool | np.ndarray | None = None,
    ) -> None: ...

    def committed(self) -> None: ...


class StepTarget(NamedTuple):
    """What the one-step path needs to write one step into the store it was made for."""

    #: the store this target was made for (a new store needs a new target)
    storage: Any
    #: the store's row table (shape (capacity, row_words), uint64) when a commit kernel can
    #: store a staged row there (interleaved rows in RAM), else ``None`` (the general commit)
    rows: np.ndarray | None
    #: whether the store kernels may check and store a step straight from the caller's values
    #: (also: no episode index, no fields beyond the five; a redo log is told apart per call)
    direct: bool
    #: the row table viewed in the dtype of the five fields (what the store kernels write);
    #: ``None`` unless ``direct``
    typed: np.ndarray | None


class WritePath:
    """The commit engine of one buffer and its ``next_obs`` format policy (module docstring).

    Parameters
    ----------
    codec : RowCodec
        Checks and stages the write arguments (five fields, extras, global fields, alive).
    ring : RingWriter
        Cursor, fill level, write generations and the locks (``write_lock`` while staging,
        ``lock`` for every change).
    storage : store
        Where the rows go (:class:`marlbuf.stores.base.Storage` or another store).
    links : NextObsLinks or None
        The next-observation links (``next_obs="once"``), else ``None``.
    episodes : EpisodeIndex or None
        The episode index of a sampler that draws sequences or episodes, else ``None``.
    next_obs : {"once", "stored", "none"}
        The format the store holds (for ``"auto"``, the one assumed until the first write).
    on_write : callable or None
        The sampler's hook, called with the slots of every commit (shape (k,), int64) under
        ``ring.lock``; ``None`` where the sampler does nothing.
    new_store : callable
        ``new_store(next_obs)``: a new, empty store of the same layout and options for another
        format (``"stored"`` or ``"none"``; without links).
    dense_fits : callable
        ``dense_fits()``: whether the buffer's dense rows (``"stored"``) fit in the memory
        available.
    auto : bool
        ``next_obs="auto"`` in RAM or on a device: the first write may still choose
        ``"none"`` (when it leaves ``next_obs`` out).
    choose_format : bool
        Whether a first ``extend`` of independent transitions may still choose ``"stored"``.
    """

    #: the redo log of a memory-mapped folder (``None``: nothing logged)
    log: WriteLog | None = None

    def __init__(
        self,
        codec: RowCodec,
        ring: RingWriter,
        storage: Any,
        links: NextObsLinks | None,
        episodes: EpisodeIndex | None,
        next_obs: str,
        on_write: Callable[[np.ndarray], None] | None,
        new_store: Callable[[str], Any],
        dense_fits: Callable[[], bool],
        *,
        auto: bool = False,
        choose_format: bool = False,
    ) -> None:
        self.codec = codec
        self.ring = ring
        self.storage = storage
        self.links = links
        self.episodes = episodes
        self.next_obs = next_obs
        self.on_write = on_write
        self.new_store = new_store
        self.dense_fits = dense_fits
        #: ``next_obs="auto"`` in RAM or on a device: a first write without next_obs (while
        #: nothing was written yet) makes the buffer ``next_obs="none"``
        self.auto_none = auto
        #: ``next_obs="auto"`` not yet decided by a committed write (nor by a loaded state):
        #: every write goes through :meth:`stand_in` and the general commit, which decides
        self.deciding = auto
        #: ``next_obs="auto"`` before the first write chose between ``"once"`` and ``"stored"``
        self.choose_format = choose_format
        #: whether a write's ``next_obs`` goes through :meth:`stand_in` even when given:
        #: buffers without next observations, and ``"auto"`` buffers still deciding
        self.stand_ins = next_obs == "none" or auto
        #: per thread, whether the write being made left ``next_obs`` out (read by the first
        #: commit of an ``"auto"`` buffer, which then chooses ``"none"``)
        self.write_call = threading.local()
        #: whether the side-table, stream-break and slow-write warnings were given
        self.format_warned = False
        self.breaks_warned = False
        self.slow_warned = False
        #: environments of the latest ``add_envs`` call (0: none yet)
        self.declared_envs = 0
        #: what the one-step path needs, for the store it was made for (see :meth:`target`)
        self.step: StepTarget | None = None
        self.done_reader = done_reader(codec)
        self.break_flags = break_flag_reader(codec)

    # ----------------------------------------------------------------------------- calls
    def stand_in(self, obs: Any, next_obs: Any, done: Any, call: str) -> Any:
        """What a write passes as ``next_obs`` when it leaves it out or the buffer stores none
        (``next_obs="none"``): ``obs`` itself, staged in the next_obs section of the staging
        rows and dropped by the lean row (so the staging paths stay those of every format);
        else a clear error. While an ``"auto"`` buffer is still deciding, every write comes
        here: it notes whether this call left ``next_obs`` out, and the call's commit (only
        once the call is validated: a rejected write changes nothing) chooses the format. Called
        only when ``next_obs`` or ``done`` is missing, or the buffer stores no next
        observations or is deciding: one check per call, none per row."""
        if done is None:
            if self.next_obs == "none" and next_obs is not None:
                raise TypeError(
                    f"{call}() missing the required argument done; a buffer with "
                    f"next_obs='none' takes no next_obs, so pass done by keyword: "
                    f"{call}(obs, action, reward, done=done)"
                )
            raise TypeError(f"{call}() missing the required argument done")
        if self.deciding:
            self.write_call.none = next_obs is None
            self.write_call.call = call
            return obs if next_obs is None else next_obs
        if next_obs is None:
            if self.next_obs == "none":
                return obs
            if self.auto_none:
                how = (
                    f"next_obs='auto' chose {self.next_obs!r} at this buffer's first write, "
                    "which passed next_obs"
                )
            elif self.log is not None:
                how = (
                    f"this memory-mapped buffer was built with next_obs={self.next_obs!r} (its "
                    "files are laid out when it is built, so next_obs='auto' cannot drop "
                    "next_obs at the first write)"
                )
            else:
                how = f"this buffer was built with next_obs={self.next_obs!r}"
            raise ValueError(
                f"{call}() got no next_obs, but {how} and keeps next observations: pass "
                "next_obs=..., or build the buffer with next_obs='none' to store none (for "
                "learners that never read next_obs)"
            )
        chosen = ", chosen by its first write, which had none" if self.auto_none else ""
        raise ValueError(
            f"{call}() got next_obs, but this buffer stores no next observations "
            f"(next_obs='none'{chosen}): leave next_obs out ({call}(obs, action, reward, "
            "done=done)), or build the buffer with next_obs='auto', 'once' or 'stored' to keep "
            "them"
        )

    def add(self, values: tuple[Any, ...], stream: int, truncated: Any) -> None:
        """Write one step of ``add`` (``values``: the arranged fields, in
        :attr:`RowCodec.field_names` order; ``stream`` checked, ``truncated`` a checked bool):
        stored by one kernel call, else staged (one kernel, NumPy per field, or the complete
        checks, which explain a bad value) and committed."""
        codec = self.codec
        step = self.step
        if step is None or step.storage is not self.storage:
            step = self.step = self.target()
        items = None
        if step.direct and self.log is None:
            # the common case: checked and stored by one kernel call under the storage lock
            # (no staging row, so the writer lock is not needed)
            items = codec.step_items(values)
            if items is not None and self.store_step(step, items, stream):
                return
        with self.ring.write_lock:
            # else staged (one kernel, or NumPy per field, or the complete checks), committed
            try:
                rows = codec.stage_step(values, items)
                if rows is None:
                    rows = codec.stage_fast(values, None)
                    if rows is None:
                        rows, _ = codec.stage(dict(zip(codec.field_names, values)), None)
                    if not self.slow_warned:
                        self.warn_slow_step(values, "add")
            except ValueError as exc:
                raise with_hint(exc, self.leading_axis_hint("add", values[0])) from exc
            if step.rows is None:
                self.commit(rows, 1, stream, truncated)
            else:
                self.commit_step(step, rows, stream, bool(truncated))

    def add_one(self, values: tuple[Any, ...], stream: int, truncated: Any, per_env: bool) -> bool:
        """A one-step ``extend`` or ``add_envs`` (every item with a leading axis of length 1)
        written as ``add`` writes a step: checked and stored by one kernel call, or staged by
        one kernel and committed as one step. ``False`` where the kernels decline it (nothing
        changed: the general path then decides and explains)."""
        codec = self.codec
        items = codec.step_items(values)
        if items is None:
            return False
        step = self.step
        if step is None or step.storage is not self.storage:
            step = self.step = self.target()
        cut = (
            None
            if truncated is False or truncated is None
            else check_truncated(truncated, codec.agents, 1, per_env=per_env)
        )
        if step.direct and self.log is None:
            if self.store_step(step, items, stream, LEADING_KERNELS):
                return True
        with self.ring.write_lock:
            rows = codec.stage_step(values, items, leading=True)
            if rows is None:
                return False
            if step.rows is None:
                self.commit(rows, 1, stream, cut)
            else:
                self.commit_step(step, rows, stream, cut is not None)
        return True

    def extend(self, values: tuple[Any, ...], stream: int, truncated: Any) -> None:
        """Write the ``T`` consecutive steps of ``extend`` on ``stream`` (checked); ``values``:
        the arranged fields, each with a leading time axis."""
        obs = values[0]
        # one step of per-agent dicts (the common case): add's path at once
        first = next(iter(obs.values()), None) if type(obs) is dict else None
        if type(first) is np.ndarray and first.ndim and first.shape[0] == 1:
            if self.add_one(values, stream, truncated, False):
                return
        values = self.unstacked(values)
        one = leading_length(values[0]) == 1
        if one and first is None and self.add_one(values, stream, truncated, False):
            return  # one step given otherwise (lists, stacked arrays, other mappings)
        self.write_steps(values, stream, 0, truncated)
        if one and not self.slow_warned:
            self.warn_slow_step(values, "extend")

    def add_envs(self, values: tuple[Any, ...], first_stream: int, truncated: Any) -> None:
        """Write one step of ``K`` environments, environment ``k`` on stream
        ``first_stream + k`` (checked); ``values``: the arranged fields, each with a leading
        environment axis."""
        obs = values[0]
        # one environment of per-agent dicts (the common case): add's path at once
        first = next(iter(obs.values()), None) if type(obs) is dict else None
        one = type(first) is np.ndarray and first.ndim > 0 and first.shape[0] == 1
        unstacked = not one
        if unstacked:
            values = self.unstacked(values)
            one = leading_length(values[0]) == 1
        if one and self.add_one(values, first_stream, truncated, True):
            self.declared_envs = 1  # one environment, as the general path records it
            return
        if not unstacked:
            values = self.unstacked(values)
        self.write_steps(values, None, first_stream, truncated)
        if one and not self.slow_warned:
            self.warn_slow_step(values, "add_envs")

    def write_steps(
        self,
        fields: tuple[Any, ...],
        stream: int | None,
        first_stream: int = 0,
        truncated: Any = False,
    ) -> None:
        """Stage and commit the steps of ``extend`` (one ``stream``) or ``add_envs``
        (``stream=None``: one stream per step from ``first_stream``)."""
        # the fast path checks every item's shape against the first observation's length, so
        # the complete length check (a loop over every item) runs only when it declines
        codec = self.codec
        call = "extend" if stream is not None else "add_envs"
        guess = leading_length(fields[0])
        with self.ring.write_lock:
            try:
                rows = None if guess is None else codec.stage_fast(fields, guess)
                if rows is None:
                    named = dict(zip(codec.field_names, fields))
                    steps = steps_of(codec, named)
                    rows, _ = codec.stage(named, steps)
                else:
                    steps = int(rows.shape[0])  # the guessed length, confirmed by the fast path
            except ValueError as exc:
                raise with_hint(exc, self.leading_axis_hint(call, fields[0])) from exc
            if stream is None and first_stream + steps - 1 > MAX_STREAM:
                raise ValueError(
                    f"add_envs numbers its {steps} environments' streams from first_stream="
                    f"{first_stream}, past the largest stream id {MAX_STREAM} "
                    "(int64); pass a smaller first_stream"
                )
            streams: int | np.ndarray = (
                stream if stream is not None else first_stream + np.arange(steps, dtype=np.int64)
            )
            cut = check_truncated(truncated, codec.agents, steps, per_env=stream is None)
            if stream is not None and 1 < steps == self.declared_envs:
                self.refuse_environments(rows, steps, cut)
            self.commit(rows, steps, streams, cut)
            if stream is None:
                self.declared_envs = steps

    def unstacked(self, fields: tuple[Any, ...]) -> tuple[Any, ...]:
        """``fields`` of ``extend``/``add_envs`` with every per-agent field given as one stacked
        array of shape ``(K, n_agents, ...)`` split into its agents' ``(K, ...)`` views.

        An array whose first axis is the number of agents is left alone: it is read in agent
        order, as before (a stacked array of exactly ``n_agents`` steps or environments must be
        given per agent)."""
        codec = self.codec
        n_agents = len(codec.agents)
        out = list(fields)
        for k, (name, value) in enumerate(zip(codec.field_names, fields)):
            if (
                name not in codec.global_fields
                and isinstance(value, np.ndarray)
                and value.ndim >= 2
                and value.shape[1] == n_agents
                and value.shape[0] != n_agents
            ):
                out[k] = [value[:, i] for i in range(n_agents)]
        return tuple(out)

    def leading_axis_hint(self, call: str, obs: Any) -> str:
        """What to call instead, for a shape error of ``call`` whose ``obs`` has one leading
        axis more than ``call`` takes ("" when it has not)."""
        specs = self.codec.specs
        agents = self.codec.agents
        first = obs.get(agents[0]) if isinstance(obs, Mapping) else None
        if first is None and isinstance(obs, np.ndarray) and obs.ndim >= 1:
            if obs.shape[0] == len(specs):
                first = obs[0]
            elif obs.ndim >= 2:  # a stacked (K, n_agents, ...) array
                first = obs[:, 0]
        ndim = len(specs[agents[0]].obs_shape)
        try:
            shape = np.shape(first) if first is not None else ()
        except (ValueError, TypeError):  # not one array (a ragged list): no hint to give
            return ""
        if call == "add" and len(shape) == ndim + 1:
            return (
                f"; obs has a leading axis of {shape[0]}: for one step of {shape[0]} vectorized "
                f"environments use add_envs (environment k is stream first_stream + k), for "
                f"{shape[0]} consecutive steps of one environment use extend"
            )
        if call != "add" and len(shape) == ndim + 2:
            return (
                f"; obs has two leading axes {shape[:2]}: {call} takes one leading "
                f"{'time' if call == 'extend' else 'environment'} axis (per agent, or one "
                "stacked (K, n_agents, ...) array); write each environment's steps with "
                "extend(..., stream=k), or each step of all environments with add_envs"
            )
        return ""

    def refuse_environments(self, rows: np.ndarray, steps: int, truncated: Any) -> None:
        """Refuse an ``extend`` of as many steps as ``add_envs`` had environments when every
        step breaks the stream (its obs differs from the next_obs of the previous step, which
        no agent ended and which was not truncated): one step of every environment given as
        consecutive steps of one stream. Without next observations (``next_obs="none"``) no
        step can be told to break its stream: nothing is refused."""
        if self.next_obs == "none":
            return
        codec = self.codec
        raw = rows.view(np.uint8)
        obs = raw[1:, : codec.obs_bytes]
        previous_next = raw[:-1, codec.next_obs_start : codec.next_obs_start + codec.obs_bytes]
        quiet, full = self.break_flags(rows)
        breaks = ~(obs == previous_next).all(axis=1) & quiet[:-1] & full[1:]
        if truncated is not None and truncated is not False:
            breaks &= ~np.asarray(truncated, dtype=bool)[:-1]
        if not breaks.all():
            return
        raise ValueError(
            f"extend got {steps} steps, the number of environments add_envs wrote, and no "
            "step's obs is the previous step's next_obs: this looks like one step of "
            f"{steps} environments given as {steps} consecutive steps of one stream. Use "
            "add_envs for it (environment k is stream first_stream + k), or extend each "
            "environment's own steps with stream=k"
        )

    # ----------------------------------------------------------------------------- commit
    def commit(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray,
        truncated: bool | np.ndarray | None = None,
    ) -> None:
        """Write validated staging rows (shape (steps, row_words), uint64) of ``streams`` (one
        stream, or shape (steps,) int64: one per row); the only place the store and the
        metadata change besides the one-step path.

        ``truncated`` (bool for one step, shape (steps,) bool, or ``None`` for none) marks
        truncated steps for the episode index."""
        ring = self.ring
        episodes = self.episodes
        ends = None
        if episodes is not None:  # before anything changes: a failure here changes nothing
            ends = self.done_reader(rows)
            if truncated is not None and truncated is not False:
                ends = ends | truncated
        with ring.lock:
            if self.deciding:  # next_obs="auto": the first write chooses the format
                self.decide(rows, steps, streams)
            log = self.log
            if log is not None:  # the redo record first: a crash never sees half a write
                log.log(rows, steps, streams, truncated)
            skip, slots = ring.plan(steps)
            kept = rows[skip:] if skip else rows
            every_stream = streams  # the episode index counts the skipped steps too
            if skip and not isinstance(streams, int):
                streams = streams[skip:]  # those environments' steps are overwritten at once
            links = self.links
            if links is not None and steps == 1 and isinstance(streams, int):
                links.commit_one(
                    ring.cursor,
                    kept.view(np.uint8)[0],
                    streams,
                    ring.total_writes,
                    self.codec.next_obs_start,
                    ring.write_generation,
                )
            elif links is not None:
                generations = ring.total_writes + skip + np.arange(slots.shape[0])
                links.commit(
                    slots,
                    kept.view(np.uint8),
                    streams,
                    generations,
                    self.codec.next_obs_start,
                    ring.write_generation,
                )
            if episodes is not None and ends is not None:
                breaks = episodes.breaks
                if steps == 1 and isinstance(streams, int):
                    episodes.commit_one(
                        ring.cursor,
                        bool(ends[0]),
                        streams,
                        ring.total_writes,
                        ring.write_generation,
                        rows.view(np.uint8)[0],
                        *(bool(flag[0]) for flag in self.break_flags(rows)),
                    )
                else:
                    episodes.commit(
                        slots,
                        ends,
                        every_stream,
                        skip,
                        ring.total_writes,
                        ring.write_generation,
                        rows.view(np.uint8),
                        *self.break_flags(rows),
                    )
                if episodes.breaks != breaks and not self.breaks_warned:
                    self.warn_stream_break()
            self.storage.write(slots, kept, None)
            ring.advance(slots, steps, skip)
            if self.on_write is not None:
                self.on_write(slots)
            if log is not None:
                log.committed()
            if links is not None and not self.format_warned:
                self.check_side_share()

    def replay(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray,
        truncated: bool | np.ndarray | None = None,
    ) -> None:
        """:meth:`commit` of a write logged by the process that made it (a memory-mapped
        folder's redo log, run again on reopening): that process gave the warnings."""
        warned = self.breaks_warned, self.format_warned
        self.breaks_warned = self.format_warned = True
        try:
            self.commit(rows, steps, streams, truncated)
        finally:
            self.breaks_warned, self.format_warned = warned

    def target(self) -> StepTarget:
        """What the one-step path needs to write one step into the current store."""
        storage = self.storage
        table = getattr(storage, "table", None)
        kernel = (
            storage.stores_next_obs  # the kernels store dense rows or rows with links
            and storage.layout == "interleaved"
            and type(table) is np.ndarray
            and table.dtype == np.uint64
            and table.flags.c_contiguous
            and not self.deciding  # the first write of "auto" chooses in commit
        )
        plan = self.codec.step_plan
        direct = kernel and plan is not None and self.episodes is None and not self.codec.more
        typed = None
        if direct and table is not None and plan is not None:
            typed = table.view(plan.dtype)
        return StepTarget(storage, table if kernel else None, direct, typed)

    def store_step(
        self,
        step: StepTarget,
        items: StepItems,
        stream: int,
        kernels: tuple[Any, Any] = STEP_KERNELS,
    ) -> bool:
        """Check and store one step (``items``: :meth:`RowCodec.step_items`) by one kernel call
        under the ring's lock (:func:`marlbuf._kernels.store_dense_step` /
        :func:`~marlbuf._kernels.store_lean_step`); ``False`` when the kernel declined it
        (nothing changed: the caller stages it, and the complete checks explain).
        ``kernels``: the dense and lean kernels (:data:`LEADING_KERNELS` for the items of a
        one-step ``extend``/``add_envs``)."""
        typed = step.typed
        store_dense, store_lean = kernels
        plan = self.codec.step_plan
        if plan is None:
            return False  # turned off since (see RowCodec.step_failed)
        ring = self.ring
        links = self.links
        with ring.lock:
            slot = ring.cursor
            generation = ring.total_writes
            try:
                if links is None:
                    if not store_dense(
                        *items,
                        plan.plan,
                        plan.dense_gaps,
                        typed,
                        slot,
                        generation,
                        ring.write_generation,
                    ):
                        return False
                else:
                    free = links.free
                    if not free:
                        return False  # the side table must grow: after the checks, staged
                    pending = links.pending
                    prev_slot, prev_generation = pending.get(stream, _NO_PENDING)
                    code = store_lean(
                        *items,
                        plan.plan,
                        plan.lean_gaps,
                        typed,
                        slot,
                        generation,
                        ring.write_generation,
                        links.side_words,
                        links.pointers,
                        prev_slot,
                        prev_generation,
                        free[-1],
                    )
                    if code == STEP_DECLINED:
                        return False
                    if code >= 0:  # NextObsLinks.apply_step_code, inline
                        free.append(code)
                    elif code == -2:
                        free.pop()
                    pending[stream] = (slot, generation)
            except Exception as exc:  # a value Numba cannot type (nothing ran): the others
                self.codec.step_failed(exc)
                return False
            self.advance_one(slot, generation)
            # the side-table share grows only when a side row is taken (or the size reaches
            # the warning's minimum)
            if (
                links is not None
                and (code == -2 or ring.size == _config.SIDE_TABLE_WARN_ROWS)
                and self.side_share_due()
            ):
                self.check_side_share()
        return True

    def commit_step(self, step: StepTarget, rows: np.ndarray, stream: int, truncated: bool) -> None:
        """:meth:`commit` of one staged step into interleaved rows: the link update
        (observations stored once), the row store and its write generation in one kernel call
        (:func:`marlbuf._kernels.links.commit_lean_step` /
        :func:`marlbuf._kernels.commit_dense_step`), the rest of the bookkeeping with
        scalars."""
        table: Any = step.rows  # not None: the caller commits here only where it is a table
        ring = self.ring
        row = rows[0]
        episodes = self.episodes
        ends = False
        if episodes is not None:  # before anything changes: a failure here changes nothing
            ends = truncated or bool(self.done_reader(rows)[0])
        with ring.lock:
            log = self.log
            if log is not None:  # the redo record first: a crash never sees half a write
                log.log(rows, 1, stream, truncated)
            slot = ring.cursor
            generation = ring.total_writes
            links = self.links
            if links is not None and not links.free:
                links.reserve(1)  # before anything changes (MemoryError changes nothing)
            if episodes is not None:
                breaks = episodes.breaks
                quiet, full = self.break_flags(rows)
                episodes.commit_one(
                    slot,
                    ends,
                    stream,
                    generation,
                    ring.write_generation,
                    rows.view(np.uint8)[0],
                    bool(quiet[0]),
                    bool(full[0]),
                )
                if episodes.breaks != breaks and not self.breaks_warned:
                    self.warn_stream_break()
            if links is None:
                commit_dense_step(table, row, slot, generation, ring.write_generation)
            else:
                prev = links.pending.get(stream)
                prev_slot, prev_generation = prev if prev is not None else _NO_PENDING
                code = commit_lean_step(
                    table,
                    row,
                    slot,
                    generation,
                    ring.write_generation,
                    self.codec.lean_words,
                    links.side_words,
                    links.next_slot,
                    links.side_row,
                    prev_slot,
                    prev_generation,
                    links.free[-1],
                )
                if code != -1:
                    links.apply_step_code(code)
                links.pending[stream] = (slot, generation)
            self.advance_one(slot, generation)
            if log is not None:
                log.committed()
            if links is not None and self.side_share_due():
                self.check_side_share()

    def advance_one(self, slot: int, generation: int) -> None:
        """The bookkeeping after one step was stored at ``slot`` (under the ring's lock)."""
        self.choose_format = False  # a first write of one step keeps the format
        slots = self.ring.advance_one(slot, generation)
        if self.on_write is not None:
            self.on_write(slots)

    # ----------------------------------------------------------------------------- format
    def decide(self, rows: np.ndarray, steps: int, streams: int | np.ndarray) -> None:
        """The first commit of a ``next_obs="auto"`` buffer (under ``ring.lock``, the call
        validated, nothing stored yet) chooses its format: ``"none"`` when the call left
        ``next_obs`` out, ``"stored"`` for an ``extend`` of independent transitions (see
        :meth:`independent`), else the format it has. Writers that race to be the first write,
        one with and one without ``next_obs``, are not told apart: the first to commit
        decides."""
        if getattr(self.write_call, "none", False) and self.auto_none:
            if self.next_obs != "none":
                # warned before the format changes: where warnings are errors, the call raises
                # here and nothing changed (nothing is stored before this decision)
                call = getattr(self.write_call, "call", "a write")
                warnings.warn(
                    f"{call}() got no next_obs, so this next_obs='auto' buffer now stores none "
                    "(next_obs='none'): batches will hold no next observations and later writes "
                    "must leave next_obs out. To keep next observations, pass next_obs=... to "
                    "every write; to choose this format without this warning, build the buffer "
                    "with next_obs='none'",
                    NextObsDroppedWarning,
                    stacklevel=_user_stacklevel(),
                )
            self.drop_next_obs()
        elif self.choose_format and steps > 1 and isinstance(streams, int):
            if self.independent(rows):
                self.store_next_obs()
        self.decided()

    def decided(self) -> None:
        """The format is final: writes take their usual paths from now on."""
        self.deciding = self.choose_format = False
        self.stand_ins = self.next_obs == "none"
        self.step = None  # the one-step target, recomputed for the chosen store

    def independent(self, rows: np.ndarray) -> bool:
        """Whether most of the consecutive staged ``rows`` (one stream) have a ``next_obs``
        that differs from the following row's ``obs`` (independent transitions)."""
        raw = rows.view(np.uint8)
        codec = self.codec
        obs = raw[1:, : codec.obs_bytes]
        previous_next = raw[:-1, codec.next_obs_start : codec.next_obs_start + codec.obs_bytes]
        linked = int(np.count_nonzero((previous_next == obs).all(axis=1)))
        return 2 * linked < rows.shape[0] - 1

    def drop_next_obs(self) -> None:
        """Make this ``next_obs="auto"`` buffer, still empty, ``next_obs="none"`` (its first
        write has no next observations): a store of lean rows without links takes the place of
        the one built for the format ``"auto"`` assumed, and the episode index stops looking
        for stream breaks (which it finds by comparing obs with the previous next_obs)."""
        self.switch_format("none")
        if self.episodes is not None:
            self.episodes.obs_bytes = 0

    def store_next_obs(self) -> None:
        """Switch the (still empty) buffer to ``next_obs="stored"``, if its dense rows fit in
        memory (else it keeps ``"once"``, and the side-table warning explains)."""
        if self.dense_fits():
            self.switch_format("stored")

    def switch_format(self, next_obs: str) -> None:
        """Give the (still empty) buffer a new store of the same layout and options whose rows
        keep next observations (``"stored"``) or not (``"none"``), without links."""
        self.storage = self.new_store(next_obs)
        self.links = None
        self.next_obs = next_obs

    def format_state(self) -> tuple[Any, ...]:
        """What :meth:`restore_format` puts back: the store, links, format and policy (taken
        before a loaded state may change the format, in case it is rejected)."""
        obs_bytes = None if self.episodes is None else self.episodes.obs_bytes
        return self.storage, self.links, self.next_obs, self.choose_format, obs_bytes

    def restore_format(self, before: tuple[Any, ...]) -> None:
        """Put back what :meth:`format_state` returned."""
        self.storage, self.links, self.next_obs, self.choose_format, obs_bytes = before
        if self.episodes is not None and obs_bytes is not None:
            self.episodes.obs_bytes = obs_bytes

    # ----------------------------------------------------------------------------- warnings
    def side_share_due(self) -> bool:
        """Whether :meth:`check_side_share` would warn now (cheaply: checked after every
        one-step write)."""
        links = self.links
        if links is None or self.format_warned:
            return False
        size = self.ring.size
        return size >= _config.SIDE_TABLE_WARN_ROWS and 2 * links.side_rows_used > size

    def check_side_share(self) -> None:
        """Warn once when most stored steps keep their next_obs in the side table."""
        size = self.ring.size
        links = self.links
        if links is None or size < _config.SIDE_TABLE_WARN_ROWS or 2 * links.side_rows_used <= size:
            return
        self.format_warned = True
        warnings.warn(
            f"{links.side_rows_used} of the {size} stored steps keep their next_obs in the side "
            "table: this buffer stores observations once (next_obs='once'), which saves memory "
            "only when a step's next_obs is the obs of the next step written on the same "
            "stream. Write each environment on its own stream (add(..., stream=k), or "
            "add_envs for vectorized environments); for independent transitions (a dataset, "
            "shuffled steps) build the buffer with next_obs='stored'",
            NextObsWarning,
            stacklevel=5,
        )

    def warn_slow_step(self, values: tuple[Any, ...], call: str) -> None:
        """Warn once that a valid step took a staging path slower than the one-kernel write
        path, naming the input that sent it there and the fix (:class:`SlowWriteWarning`).
        Nothing is said where no input is to blame (an absent agent of an ``alive=True``
        buffer, a value the kernels cannot type)."""
        self.slow_warned = True
        reason = self.codec.slow_reason(values)
        if reason is None:
            return
        warnings.warn(
            f"{call}() wrote a valid step through a slower staging path (several times the "
            f"one-kernel write) because {reason}. This warning is given once per buffer",
            SlowWriteWarning,
            stacklevel=4,
        )

    def warn_stream_break(self) -> None:
        """Warn once that a stream break ended an episode (see :class:`StreamBreakWarning`)."""
        self.breaks_warned = True
        warnings.warn(
            "a step's obs differs from the next_obs of the previous step written on the same "
            "stream, which was neither done nor truncated: several environments seem to be "
            "written in turn on one stream. The episode was ended there, so sequences and "
            "episodes never mix environments, but they are cut short. Write each environment "
            "on its own stream (add(..., stream=k)) or all of them at once with add_envs",
            StreamBreakWarning,
            stacklevel=5,
        )


def _user_stacklevel() -> int:
    """The ``stacklevel`` of a ``warnings.warn`` call made by this module's caller that names
    the first frame outside the ``marlbuf`` package (the user's call, however deep the write
    path that reached the warning)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    here = inspect.currentframe()
    frame: FrameType | None = None if here is None else here.f_back  # warns: stacklevel 1
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
        level += 1
    return level


__all__ = [
    "LEADING_KERNELS",
    "NextObsDroppedWarning",
    "NextObsWarning",
    "RowStore",
    "SlowWriteWarning",
    "StepTarget",
    "StreamBreakWarning",
    "WriteLog",
    "WritePath",
]
