"""Writing to a sharded buffer: :class:`ShardWriter`, the writer of one shard that a rollout
actor holds; the check of a write's ``next_obs`` at the call; and how one ``add_envs`` call is
split into the calls of the shards that hold its environments' streams.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from marlbuf.distributed._ray import get
from marlbuf.distributed.limiter import RateLimiter


def write_steps(kind: str, fields: Sequence[Any]) -> int:
    """Transitions in one write (for the rate limiter): 1 for ``add``, else the leading axis
    of the first agent's reward."""
    if kind == "add":
        return 1
    reward = fields[2]
    first = next(iter(reward.values())) if isinstance(reward, Mapping) else reward[0]
    return int(np.shape(first)[0])


class ShardWriter:
    """A writer bound to one shard: what a rollout actor holds (picklable, cheap to send).

    Made for one environment stream (:meth:`ShardedReplayBuffer.writer`); its writes belong to
    that stream unless ``stream=`` names another stream of the same shard. The methods take
    what :meth:`MultiAgentReplayBuffer.add`/``extend``/``add_envs`` take (``truncated=``,
    extra and global fields and ``alive=`` as keyword arguments).

    Writes are asynchronous: ``add``/``extend``/``add_envs`` return once the call is queued;
    at most ``max_inflight`` calls are outstanding (the oldest is awaited first). An invalid
    write raises its ``ValueError``/``TypeError`` at a later call or at :meth:`flush`, and
    writes nothing (the shard's buffer validates before it stores).

    Streams of one shard are the ids ``s`` with ``s % n_shards == shard``; the shard's buffer
    keeps stream ``s`` as its own stream ``s // n_shards`` (consecutive on each shard).

    ``next_obs`` (the sharded buffer's option) is checked here, at the call: writes leave
    ``next_obs`` out exactly when it is ``"none"``.
    """

    def __init__(
        self,
        actor: Any,
        shard: int,
        timeout: float,
        limiter: RateLimiter | None,
        max_inflight: int = 8,
        stream: int | None = None,
        n_shards: int = 1,
        next_obs: str = "auto",
    ) -> None:
        self.actor = actor
        self.next_obs = next_obs
        self.shard = int(shard)
        self.timeout = float(timeout)
        self.limiter = limiter
        self.max_inflight = int(max_inflight)
        self.n_shards = int(n_shards)
        #: the environment stream this writer was made for (its writes' default)
        self.stream = self.shard if stream is None else int(stream)
        self._pending: deque[Any] = deque()
        self.size = 0  # shard size after the last acknowledged write
        self.total_writes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pending"] = deque()  # outstanding calls belong to the sending process
        return state

    def __repr__(self) -> str:
        return (
            f"ShardWriter(shard={self.shard}, stream={self.stream}, pending={len(self._pending)})"
        )

    def _local(self, stream: Any, name: str) -> int:
        """The shard's own id of environment stream ``stream`` (``None``: this writer's)."""
        if stream is None:
            stream = self.stream
        if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or stream < 0:
            raise TypeError(f"{name} must be a non-negative int; got {name}={stream!r}")
        if int(stream) % self.n_shards != self.shard:
            raise ValueError(
                f"{name}={stream} lives on shard {int(stream) % self.n_shards} "
                f"({name} % n_shards={self.n_shards}), not on this writer's shard {self.shard}; "
                f"ask the ShardedReplayBuffer for writer({stream}), or write through it"
            )
        return int(stream) // self.n_shards

    def add(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        stream: int | None = None,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """One timestep of ``stream`` (default: this writer's), as
        :meth:`MultiAgentReplayBuffer.add`."""
        check_next_obs(self.next_obs, next_obs, done, "add")
        options = {"stream": self._local(stream, "stream"), "truncated": truncated, **fields}
        self._send("add", (obs, action, reward, next_obs, done), options)

    def extend(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        stream: int | None = None,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """``T`` consecutive timesteps of ``stream`` (default: this writer's), as
        :meth:`MultiAgentReplayBuffer.extend`."""
        check_next_obs(self.next_obs, next_obs, done, "extend")
        options = {"stream": self._local(stream, "stream"), "truncated": truncated, **fields}
        self._send("extend", (obs, action, reward, next_obs, done), options)

    def add_envs(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        first_stream: int | None = None,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """One step of ``E`` environments, as :meth:`MultiAgentReplayBuffer.add_envs`.

        Environment ``e`` is stream ``first_stream + e * n_shards`` (``first_stream`` defaults
        to this writer's stream): the streams of this shard, in order.
        """
        check_next_obs(self.next_obs, next_obs, done, "add_envs")
        local = self._local(first_stream, "first_stream")
        options = {"first_stream": local, "truncated": truncated, **fields}
        self._send("add_envs", (obs, action, reward, next_obs, done), options)

    def _send(self, kind: str, fields: tuple[Any, ...], options: dict[str, Any]) -> None:
        if self.limiter is not None:
            self.limiter.await_insert(write_steps(kind, fields))
        self._pending.append(self.actor.write.remote(kind, fields, options))
        while len(self._pending) > self.max_inflight:
            self._ack(self._pending.popleft())

    def _ack(self, ref: Any) -> None:
        size, writes = get(
            ref,
            self.timeout,
            "a write",
            self.shard,
            "ask the ShardedReplayBuffer for a new writer after restart_shard()",
        )
        self.size, self.total_writes = max(self.size, size), max(self.total_writes, writes)

    def flush(self) -> tuple[int, int]:
        """Wait until every queued write is stored; returns the shard's (size, total_writes).
        Raises the first failed write's error."""
        try:
            while self._pending:
                self._ack(self._pending.popleft())
        finally:
            self._pending.clear()
        return self.size, self.total_writes


def check_next_obs(mode: str, next_obs: Any, done: Any, call: str) -> None:
    """A write's ``next_obs`` and ``done`` checked at the call against the sharded buffer's
    ``next_obs`` option ``mode`` (the shards would refuse it too, but only later)."""
    if done is None:
        raise TypeError(
            f"{call}() missing the required argument done"
            + (" (next_obs='none': pass done by keyword)" if mode == "none" else "")
        )
    if mode == "none" and next_obs is not None:
        raise ValueError(
            f"{call}() got next_obs, but this sharded buffer stores no next observations "
            f"(next_obs='none'): leave next_obs out ({call}(obs, action, reward, done=done)), "
            "or build it with next_obs='auto', 'once' or 'stored' to keep them"
        )
    if mode != "none" and next_obs is None:
        raise ValueError(
            f"{call}() got no next_obs, but this sharded buffer keeps next observations "
            f"(next_obs={mode!r}): pass next_obs=..., or build it with next_obs='none' (a "
            "sharded buffer takes that format at construction, never from a first write)"
        )


def _select(field: Any, sel: np.ndarray, n_agents: int) -> Any:
    """Environments ``sel`` of one per-agent add_envs field: a dict keyed by agent, a sequence
    in agent order, or one stacked array of shape ``(E, n_agents, ...)`` (an array whose first
    axis is ``n_agents`` is read in agent order, as the buffer reads it)."""
    if isinstance(field, Mapping):
        return {a: np.asarray(v)[sel] for a, v in field.items()}
    if isinstance(field, np.ndarray) and field.ndim >= 2 and field.shape[0] != n_agents:
        return field[sel]
    return [np.asarray(v)[sel] for v in field]


def _select_flags(truncated: Any, sel: np.ndarray) -> Any:
    """Environments ``sel`` of add_envs's ``truncated``: a bool for all stays, an array of
    shape (E,) or per agent (a dict, or a sequence of (E,) arrays) is cut along E."""
    if isinstance(truncated, Mapping):
        return {a: np.asarray(v)[..., sel] for a, v in truncated.items()}
    flags = np.asarray(truncated)
    return truncated if flags.ndim == 0 else flags[..., sel]


class EnvPart(NamedTuple):
    """One shard's part of an ``add_envs`` call: the arguments of its writer's ``add_envs``."""

    shard: int
    first_stream: int
    #: ``obs``, ``action``, ``reward``, ``next_obs``, ``done`` of the shard's environments
    values: tuple[Any, ...]
    truncated: Any
    fields: Mapping[str, Any]


def split_envs(
    values: tuple[Any, ...],
    streams: Sequence[int] | None,
    first_stream: int | None,
    truncated: Any,
    fields: Mapping[str, Any],
    n_shards: int,
    n_agents: int,
    global_fields: Mapping[str, Any],
) -> Iterator[EnvPart]:
    """The parts of one ``add_envs`` call, shard by shard (see
    ``ShardedReplayBuffer.add_envs``): the streams are checked before the first part, and each
    part is cut from the call's arrays when it is taken."""
    count = write_steps("add_envs", values)
    if streams is not None and first_stream is not None:
        raise ValueError(
            f"pass streams= or first_stream=, not both; got streams={streams!r}, "
            f"first_stream={first_stream!r}"
        )
    if streams is None:
        first = 0 if first_stream is None else first_stream
        if isinstance(first, bool) or not isinstance(first, (int, np.integer)) or first < 0:
            raise TypeError(f"first_stream must be a non-negative int; got {first_stream!r}")
        stream_ids = int(first) + np.arange(count)
    else:
        stream_ids = np.asarray(streams)
    if stream_ids.shape != (count,) or stream_ids.dtype.kind not in "iu":
        raise ValueError(f"streams must hold one int per environment ({count}); got {streams!r}")
    if (stream_ids < 0).any():
        raise ValueError(f"streams must be ints >= 0; got {streams!r}")
    shards = stream_ids % n_shards
    parts = []
    for k in np.unique(shards):
        sel = np.flatnonzero(shards == k)
        local = stream_ids[sel] // n_shards
        if (np.diff(local) != 1).any():
            raise ValueError(
                f"the environments of shard {k} have streams {stream_ids[sel].tolist()}, not "
                f"consecutive streams of that shard (s, s + {n_shards}, ...): number "
                "the environments consecutively (first_stream=) or write each with add("
                "..., stream=s)"
            )
        parts.append((int(k), sel))
    for k, sel in parts:
        whole = len(parts) == 1  # one shard takes every environment: sent as given
        yield EnvPart(
            k,
            int(stream_ids[sel[0]]),
            tuple(v if whole or v is None else _select(v, sel, n_agents) for v in values),
            truncated if whole else _select_flags(truncated, sel),
            fields if whole else _select_fields(fields, sel, n_agents, global_fields),
        )


def _select_fields(
    fields: Mapping[str, Any], sel: np.ndarray, n_agents: int, global_fields: Mapping[str, Any]
) -> dict[str, Any]:
    """Environments ``sel`` of ``add_envs``'s keyword fields: a global field is one array
    with the environment axis first; extras and ``alive`` are per agent."""
    out = {}
    for name, value in fields.items():
        if name in global_fields:
            out[name] = np.asarray(value)[sel]
        else:
            out[name] = _select(value, sel, n_agents)
    return out
