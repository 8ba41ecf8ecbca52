"""The checks of the write arguments that the staging does not see (``stream``, ``truncated``,
the leading length of ``extend``/``add_envs``), and the readers of staged rows that the commit
needs besides the rows themselves (whether a step ends its episode, and the flags of the
stream-break check)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf.spec import ALIVE
from marlbuf.staging import RowCodec

#: Largest stream id (``stream=``, ``first_stream + k``): stream ids are stored as int64.
MAX_STREAM = _config.MAX_STREAM


def check_stream(stream: Any) -> int:
    """A stream id (``stream=`` or ``first_stream=``): an int in ``[0, 2**63 - 1]`` (stored as
    int64)."""
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or stream < 0:
        raise TypeError(f"stream must be a non-negative int; got stream={stream!r}")
    if stream > MAX_STREAM:
        raise ValueError(
            f"stream ids are int64: at most {MAX_STREAM}; got stream={stream!r}. "
            "Number environments from 0 (add_envs(first_stream=...) counts up from it)"
        )
    return int(stream)


def check_truncated(
    truncated: Any, agents: list[str], steps: int | None, per_env: bool = False
) -> bool | np.ndarray | None:
    """``truncated`` of ``add`` (``steps=None``: a bool back) or of ``extend``/``add_envs``
    (shape (steps,) bool back, or ``None`` when no step is truncated), checked.

    Accepted: a bool; per agent, a dict (a subset of the agents; missing ones count as not
    truncated) or a sequence in agent order, any True counting; with ``steps``, each value with
    a leading axis of ``steps`` (a plain (steps,) array is per step, (n_agents, steps) per
    agent). For ``add_envs`` (``per_env``) a bool applies to every environment; ``extend``
    refuses ``True`` (it would end an episode at every step).
    """
    if truncated is False or truncated is None:
        return None if steps is not None else False
    if truncated is True and steps is None:
        return True
    where = "add" if steps is None else ("add_envs" if per_env else "extend")
    lead = () if steps is None else (steps,)
    if isinstance(truncated, Mapping):
        unknown = [k for k in truncated if k not in agents]
        if unknown:
            raise ValueError(
                f"truncated has unknown agent {unknown[0]!r}; {where} expects agents {agents}"
            )
        values = [_truncation_flags(v, lead, f"truncated[{a!r}]") for a, v in truncated.items()]
        flags = np.zeros(lead, dtype=bool)
        for value in values:
            flags = flags | value
    else:
        array = _truncation_flags(truncated, None, "truncated")
        if array.shape == () and steps is not None and array and not per_env:
            raise ValueError(
                f"truncated=True in extend would end an episode at each of its {steps} steps; "
                f"pass an array of shape ({steps},) (e.g. True at the last step only)"
            )
        if array.shape == ():
            flags = np.broadcast_to(array, lead).copy() if lead else array
        elif lead and array.shape == lead:  # one flag per step (1-D is never per agent here)
            flags = array
        elif array.shape == (len(agents), *lead):  # per agent, in agent order
            flags = np.asarray(array.any(axis=0))
        else:
            per_agent = (len(agents), *lead)
            shapes = f"{lead} (per step) or {per_agent} (per agent)" if lead else f"{per_agent}"
            raise ValueError(
                f"truncated has shape {array.shape}; {where} expects a bool, a dict of agents, "
                f"or an array of shape {shapes}"
            )
    if steps is None:
        return bool(flags)
    flags = np.asarray(flags, dtype=bool).reshape(steps)
    return flags if flags.any() else None


def _truncation_flags(value: Any, lead: tuple[int, ...] | None, name: str) -> np.ndarray:
    """``value`` as a bool array (of shape ``lead`` unless ``lead`` is None), or a clear error:
    bools, or numbers that are 0 or 1."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be bools; got {value!r:.80}") from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be bools (or 0/1); got dtype {array.dtype} ({value!r:.80})")
    if array.dtype.kind != "b":
        if not np.all((array == 0) | (array == 1)):
            raise ValueError(f"{name} must be bools (or 0/1); got {value!r:.80}")
        array = array != 0
    if lead is not None and array.shape != lead:
        raise ValueError(f"{name} has shape {array.shape}; expected {lead}")
    return array


def leading_length(obs: Any) -> int | None:
    """The leading length of the first agent's observations, if cheaply known (else None)."""
    first = next(iter(obs.values()), None) if isinstance(obs, Mapping) else None
    if first is None and type(obs) in (list, tuple) and obs:
        first = obs[0]
    if type(first) is np.ndarray and first.ndim and first.shape[0] > 0:
        return int(first.shape[0])
    return None


def with_hint(exc: ValueError, hint: str) -> ValueError:
    """``exc`` with ``hint`` appended to its message (``exc`` itself when there is none)."""
    return ValueError(f"{exc}{hint}") if hint else exc


def done_reader(codec: RowCodec) -> Any:
    """A function of staged rows (shape (T, row_words), uint64) that returns, per row, whether
    every agent's ``done`` is nonzero (shape (T,), bool): the termination of an episode. With
    an alive mask, agents that are not alive at the step do not count (a step without any
    alive agent ends its episode)."""
    slots = [fs for fs in codec.slots if fs.field == "done"]
    first, last = slots[0], slots[-1]
    packed = all(fs.dtype == first.dtype and len(fs.shape) == 0 for fs in slots) and all(
        a.offset + a.nbytes == b.offset for a, b in itertools.pairwise(slots)
    )
    if codec.alive:
        alive = [fs for fs in codec.slots if fs.field == ALIVE]
        alive_lo, alive_hi = alive[0].offset, alive[-1].offset + alive[-1].nbytes

        def read_alive(rows: np.ndarray) -> np.ndarray:
            raw = rows.view(np.uint8)
            mask = raw[:, alive_lo:alive_hi].view(np.bool_)
            every = np.ones(rows.shape[0], dtype=bool)
            for k, fs in enumerate(slots):
                flags = raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype)
                every &= (flags[:, 0] != 0) | ~mask[:, k]
            return every

        return read_alive
    if packed:  # one view of all agents' flags
        lo, hi = first.offset, last.offset + last.nbytes

        def read(rows: np.ndarray) -> np.ndarray:
            flags = rows.view(np.uint8)[:, lo:hi].view(first.dtype)
            return np.asarray((flags != 0).all(axis=1))

        return read

    def read_each(rows: np.ndarray) -> np.ndarray:
        raw = rows.view(np.uint8)
        every = np.ones(rows.shape[0], dtype=bool)
        for fs in slots:
            flags = raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype)
            every &= (flags != 0).all(axis=1)
        return every

    return read_each


def break_flag_reader(codec: RowCodec) -> Any:
    """A function of staged rows (shape (T, row_words), uint64) that returns, per row, the
    flags of the stream-break check (:meth:`marlbuf.writer.EpisodeIndex.commit`): ``quiet``
    (no agent done and every agent present: the step's next_obs must be the obs of the stream's
    next step) and ``full`` (every agent present: the step's obs may be compared), both shape
    (T,), bool. An agent that is done, or that joins or leaves, may see an observation its
    previous next_obs did not predict without any environment switch."""
    # a flag is set where any of its bytes is (a float -0.0 done counts as done: the check is
    # then skipped, which never cuts an episode); adjacent fields are read as one byte range
    done = _byte_ranges([fs for fs in codec.slots if fs.field == "done"])
    alive = _byte_ranges([fs for fs in codec.slots if fs.field == ALIVE] if codec.alive else [])

    def read(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raw = rows.view(np.uint8)
        full = np.ones(rows.shape[0], dtype=bool)
        for lo, hi in alive:  # one byte per agent, 1 where present
            full &= raw[:, lo:hi].all(axis=1)
        quiet = full.copy()
        for lo, hi in done:
            quiet &= ~raw[:, lo:hi].any(axis=1)
        return quiet, full

    return read


def _byte_ranges(slots: list[Any]) -> list[tuple[int, int]]:
    """The byte ranges ``(start, stop)`` of row fields ``slots`` (with ``offset`` and
    ``nbytes``), adjacent ones merged."""
    ranges: list[tuple[int, int]] = []
    for fs in sorted(slots, key=lambda fs: fs.offset):
        if ranges and ranges[-1][1] == fs.offset:
            ranges[-1] = (ranges[-1][0], fs.offset + fs.nbytes)
        else:
            ranges.append((fs.offset, fs.offset + fs.nbytes))
    return ranges


def int_field(state: Mapping[str, Any], key: str, where: str = "state") -> int:
    value = state.get(key) if isinstance(state, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where} has {key}={value!r}; expected an int (corrupt state)")
    return int(value)


def int_array(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or array.shape != shape:
        raise ValueError(
            f"state's {name} has shape {array.shape}, dtype {array.dtype}; expected {shape} "
            "integers (corrupt state)"
        )
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"state's {name} holds values beyond int64 (corrupt state)")
    return array.astype(np.int64, copy=False)


__all__ = [
    "MAX_STREAM",
    "break_flag_reader",
    "check_stream",
    "check_truncated",
    "done_reader",
    "int_array",
    "int_field",
    "leading_length",
    "with_hint",
]
