"""A replay buffer sharded over Ray actors: stream-affine writers, exact global sampling.

See ``docs/distributed.md`` for the design and the exactness argument.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import ray

from marlbuf.batch import Batch, DrawnIndices
from marlbuf.build import build_storage
from marlbuf.config import BufferConfig, make_rng
from marlbuf.distributed._ray import (
    DEFAULT_TIMEOUT_S,
    code_fingerprint,
    get,
    get_all,
    worker_env,
)
from marlbuf.distributed._shard import ShardActor, sequence_steps, shard_config, unpack
from marlbuf.distributed.limiter import RateLimiter
from marlbuf.reading import update_each_trainer
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Sampler, Uniform
from marlbuf.samplers import Sequence as SequenceSampler
from marlbuf.spec import AgentSpec, FieldSpec
from marlbuf.staging import RowCodec
from marlbuf.stores.capabilities import refusal
from marlbuf.writer import NextObsLinks

MANIFEST_FORMAT = "marlbuf-sharded"
MANIFEST_VERSION = 1
MANIFEST = "manifest.json"

_RemoteShard = ray.remote(num_cpus=0, max_restarts=0)(ShardActor)

#: the samplers whose draw the learner splits across shards exactly (docs/distributed.md);
#: their exact classes, since a subclass may draw by another rule
SHARDED_SAMPLERS: tuple[type[Sampler], ...] = (
    Uniform,
    Neighbor,
    Prioritized,
    PrioritizedNeighbor,
    SequenceSampler,
)


def _shard_file(index: int) -> str:
    return f"shard-{index}.npz"


def _steps(kind: str, fields: Sequence[Any]) -> int:
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
        _check_next_obs(self.next_obs, next_obs, done, "add")
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
        _check_next_obs(self.next_obs, next_obs, done, "extend")
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
        _check_next_obs(self.next_obs, next_obs, done, "add_envs")
        local = self._local(first_stream, "first_stream")
        options = {"first_stream": local, "truncated": truncated, **fields}
        self._send("add_envs", (obs, action, reward, next_obs, done), options)

    def _send(self, kind: str, fields: tuple[Any, ...], options: dict[str, Any]) -> None:
        if self.limiter is not None:
            self.limiter.await_insert(_steps(kind, fields))
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


class _Round:
    """What the learner thread needs to assemble one sampled round."""

    def __init__(
        self,
        batch_size: int,
        trainers: tuple[int, ...],
        quotas: np.ndarray,
        scale: np.ndarray | None,
        betas: list[float],
        refs: list[tuple[int, Any]],
    ) -> None:
        self.batch_size = batch_size
        self.trainers = trainers
        self.quotas = quotas  # (K, T) rows per shard per trainer position
        self.scale = scale  # (K, T) share of trainer t's draws that went to shard k
        self.betas = betas
        self.refs = refs


#: what sampling from a closed :class:`ShardedReplayBuffer` says
_CLOSED = (
    "this ShardedReplayBuffer is closed (close() ended its shard actors); build a new one, or "
    "ShardedReplayBuffer.load(folder) from a folder written by save() before closing"
)


class ShardedReplayBuffer:
    """``n_shards`` Ray actors, each a :class:`~marlbuf.MultiAgentReplayBuffer` of
    ``shard_capacity`` transitions; writers keep environment streams whole, the learner samples
    the union exactly as one buffer holding all shards' data would.

    Parameters
    ----------
    specs : mapping of str to AgentSpec
        One spec per agent (as for ``MultiAgentReplayBuffer``).
    shard_capacity : int
        Transitions each shard keeps (the total is ``n_shards * shard_capacity``).
    n_shards : int
        Shard actors ``K`` (>= 1).
    layout, batch_layout, n_trainers
        As for ``MultiAgentReplayBuffer`` (every shard and every assembled batch use them).
    sampler : Sampler, default ``Uniform()``
        ``Uniform``, ``Neighbor``, ``Prioritized``, ``PrioritizedNeighbor`` or ``Sequence``
        (see :data:`SHARDED_SAMPLERS`; batches of a ``Sequence`` sampler are
        :class:`marlbuf.batch.SequenceBatch` objects); each shard gets its own instance.
        Global rules per sampler are in ``docs/distributed.md``; why other samplers are
        refused is in :data:`marlbuf.stores.capabilities.CAPABILITIES`.
    seed : int, numpy Generator or None
        Seeds the learner-side quota draws and, through spawned seeds, every shard.
    prefetch : bool, default True
        ``sample_for_trainers`` asks for the next round (same size and trainers) as soon as it
        hands one out, and assembles it in a background thread while the learner updates.
        With a prioritized sampler that round is drawn before this round's priority updates
        reach the shards (one round stale, as in Ape-X); ``prefetch=False`` draws on demand.
    timeout : float, default 60
        Seconds to wait for any shard's answer before raising :class:`ShardError`.
    rate_limiter : RateLimiter, optional
        Blocks writers or the learner to hold a samples-per-insert ratio.
    actor_options : mapping, optional
        Extra Ray options for the shard actors (e.g. ``{"resources": {...}}`` for placement).
    next_obs, batch_dtype, global_fields, alive, parallel_gather
        As for ``MultiAgentReplayBuffer``: every shard's buffer is built with them (each shard
        chooses its own format with ``next_obs="auto"``; batches are the same either way).
        ``next_obs="none"`` (no next observations: writes leave ``next_obs`` out, batches hold
        none) is chosen here, not by a first write: the learner assembles every shard's rows,
        so it must know the batches' format before any write.
        Writes take extra fields (declared in the specs), global fields and ``alive`` as
        keyword arguments, and batches carry ``extras``, ``globals`` and ``alive``.

    Notes
    -----
    ``batch.indices`` of a sampled batch are global ids ``shard * shard_capacity + slot``
    (:meth:`locate` splits them); pass them back to :meth:`update_priorities` unchanged. Rows
    of a batch are grouped by shard (shard 0's first).
    """

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        shard_capacity: int,
        n_shards: int,
        layout: str = "interleaved",
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
        n_trainers: int | None = None,
        batch_layout: str = "rows",
        prefetch: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        rate_limiter: RateLimiter | None = None,
        actor_options: Mapping[str, Any] | None = None,
        *,
        next_obs: str = "auto",
        batch_dtype: str = "float32",
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
        parallel_gather: bool = False,
        _load: tuple[Path, Mapping[str, Any]] | None = None,
    ) -> None:
        if isinstance(n_shards, bool) or not isinstance(n_shards, (int, np.integer)):
            raise TypeError(f"n_shards must be an int; got n_shards={n_shards!r}")
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1; got n_shards={n_shards}")
        if sampler is None:
            sampler = Uniform()
        if not isinstance(sampler, Sampler):
            raise TypeError(
                "sampler must be a marlbuf.samplers.Sampler (e.g. Uniform(), Prioritized()); "
                f"got sampler={sampler!r}"
            )
        if sampler.needs_episodes and not isinstance(sampler, SequenceSampler):
            raise TypeError(
                f"the sharded buffer does not sample whole episodes (sampler={sampler!r}): "
                "Episodes draws distinct episodes padded to the batch's longest, a property of "
                "the whole batch that per-shard draws do not have; use Sequence(length=..., "
                "pad=True) on the sharded buffer, or one MultiAgentReplayBuffer for Episodes"
            )
        if isinstance(sampler, SequenceSampler) and sampler.prioritized and not sampler.replace:
            raise ValueError(
                f"sampler={sampler!r}: prioritized sequences without replacement are drawn one "
                "after another in proportion to the priorities left, a draw the learner cannot "
                "split across shards exactly; use replace=True (independent draws) on the "
                "sharded buffer, or one MultiAgentReplayBuffer"
            )
        if type(sampler) not in SHARDED_SAMPLERS:
            raise ValueError(
                refusal("custom Sampler subclasses", "sharded", f"sampler={sampler!r}")
            )
        if not isinstance(prefetch, bool):
            raise TypeError(f"prefetch must be a bool; got prefetch={prefetch!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0; got timeout={timeout!r}")
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter; got {rate_limiter!r}")
        # the shards' configuration checks the arguments as every shard's constructor will
        config, _ = BufferConfig.from_arguments(
            specs,
            1,
            layout,
            sampler,
            n_trainers,
            next_obs,
            batch_layout,
            batch_dtype,
            global_fields,
            alive,
            parallel_gather,
        )
        self.shard_capacity = _check_capacity(shard_capacity)
        self._shard_config = config = replace(config, capacity=self.shard_capacity)
        self.specs = config.specs
        self.n_shards = int(n_shards)
        self.n_trainers = config.n_trainers
        self._n_agents = len(self.specs)
        # a capacity-1 store of the shards' row format knows the batch formats (block shapes,
        # views, a pool of recycled batch memory); it holds no data
        codec = RowCodec(config.specs, config.global_fields, config.alive)
        rows = config.initial_next_obs()
        self._storage = build_storage(
            replace(config, capacity=1),
            codec,
            rows,
            NextObsLinks(1, codec.obs_bytes) if rows == "once" else None,
        )
        self._storage.parallel_gather = bool(parallel_gather)
        self.sampler = sampler
        self.weighted = sampler.weighted
        #: steps per sequence of a Sequence sampler (quotas count sequences), else 0
        self._steps = sequence_steps(sampler)
        #: whether a batch is split by per-shard totals read each round (prioritized samplers'
        #: sum p^alpha, sequence samplers' start totals), else by the shards' sizes
        self._by_totals = isinstance(sampler, (Prioritized, SequenceSampler))
        self.prefetch = prefetch
        self.timeout = float(timeout)
        self.rate_limiter = rate_limiter
        self._actor_options = dict(actor_options or {})
        described = config.to_dict(batch_options=True)
        self._config: dict[str, Any] = {
            "shard_capacity": described.pop("capacity"),
            **described,
            "parallel_gather": bool(parallel_gather),
        }
        self.rng = make_rng(seed)
        root = np.random.SeedSequence(int(self.rng.integers(2**63)))
        self._shard_seeds = [int(s.generate_state(1)[0]) for s in root.spawn(self.n_shards)]
        self._batches_drawn = np.zeros(self.n_trainers, dtype=np.int64)
        self._max_priority = np.ones(self.n_trainers, dtype=np.float64)
        self._sizes = np.zeros(self.n_shards, dtype=np.int64)
        self._writes = np.zeros(self.n_shards, dtype=np.int64)
        self._checkpoint: Path | None = None
        if _load is not None:
            folder, manifest = _load
            self._restore_driver_state(manifest)
            self._checkpoint = folder
        self._actors: list[Any] = []
        self._writers: dict[int, ShardWriter] = {}
        self._updates: deque[tuple[int, Any]] = deque()
        self._lock = threading.RLock()
        self._executor: ThreadPoolExecutor | None = None
        self._next: tuple[tuple[int, tuple[int, ...]], Future[list[Batch]]] | None = None
        self._closed = False
        for k in range(self.n_shards):
            load_path = None if _load is None else str(_load[0] / _shard_file(k))
            self._actors.append(self._start(k, load_path))
        try:
            infos = get_all(
                [(k, a.info.remote()) for k, a in enumerate(self._actors)], self.timeout, "info"
            )
        except BaseException:
            self.close()
            raise
        self._check_code(infos)
        for k, info in enumerate(infos):
            self._note(k, info["size"], info["total_writes"])

    # ------------------------------------------------------------------ actors
    def _start(self, k: int, load_path: str | None) -> Any:
        # unnamed: an actor nobody holds a handle to any more is ended by Ray
        options: dict[str, Any] = {"runtime_env": worker_env()}
        options.update(self._actor_options)
        return _RemoteShard.options(**options).remote(
            k, self._config, self._shard_seeds[k], load_path
        )

    def _check_code(self, infos: Sequence[Mapping[str, Any]]) -> None:
        """Every shard must run this process's marlbuf: the same file, or (on another node)
        the same sources by fingerprint."""
        import marlbuf

        mine, code = os.path.realpath(marlbuf.__file__), code_fingerprint()
        for k, info in enumerate(infos):
            if info["marlbuf"] != mine and info["code"] != code:
                self.close()
                raise RuntimeError(
                    f"shard {k} runs other marlbuf code ({info['marlbuf']}) than this process "
                    f"({mine}); start Ray with marlbuf.distributed.init_ray() (or give the "
                    "workers the same PYTHONPATH, or install the same marlbuf on every node)"
                )

    @property
    def actors(self) -> list[Any]:
        """The shard actors' handles, in shard order."""
        return list(self._actors)

    def config(self) -> dict[str, Any]:
        """JSON-safe description of every shard (specs, capacity, layout, sampler, ...)."""
        return json.loads(json.dumps(self._config))

    def _hint(self, k: int | None) -> str:
        where = f" from {self._checkpoint}" if self._checkpoint else " (empty: no checkpoint yet)"
        return f"restart it with buffer.restart_shard({k}){where}"

    def _get(self, k: int, ref: Any, what: str) -> Any:
        return get(ref, self.timeout, what, k, self._hint(k))

    def _note(self, k: int, size: int, writes: int) -> None:
        self._sizes[k] = max(int(self._sizes[k]), int(size))
        self._writes[k] = max(int(self._writes[k]), int(writes))

    def ping(self, timeout: float | None = None) -> list[float]:
        """Round-trip seconds of every shard; :class:`ShardError` for one that is dead or does
        not answer within ``timeout`` (default: the buffer's)."""
        out = []
        wait = self.timeout if timeout is None else float(timeout)
        for k, actor in enumerate(self._actors):
            start = time.perf_counter()
            info = get(actor.info.remote(), wait, "ping", k, self._hint(k))
            self._note(k, info["size"], info["total_writes"])
            out.append(time.perf_counter() - start)
        return out

    # ------------------------------------------------------------------ sizes
    @property
    def sizes(self) -> np.ndarray:
        """Filled slots per shard as last reported (shape (K,), int64; a copy). Writes through
        this object are counted when acknowledged; writes through :class:`ShardWriter` handles
        held elsewhere are seen at the next sampling round or :meth:`refresh`."""
        return self._sizes.copy()

    def __len__(self) -> int:
        return int(self._sizes.sum())

    def refresh(self) -> np.ndarray:
        """Ask every shard for its size now; returns :attr:`sizes`."""
        self.ping()
        return self.sizes

    def shard_of(self, stream: int) -> int:
        """The shard that holds environment stream ``stream``: ``stream % n_shards``."""
        if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or stream < 0:
            raise ValueError(f"stream must be an int >= 0; got stream={stream!r}")
        return int(stream) % self.n_shards

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """Split global batch indices into ``(shard, slot)`` arrays (each shape (B,), int64)."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError(
                f"indices must be a 1-D integer array (batch.indices); got shape {idx.shape}, "
                f"dtype {idx.dtype}"
            )
        idx = idx.astype(np.int64, copy=False)
        limit = self.n_shards * self.shard_capacity
        if idx.size and (idx.min() < 0 or idx.max() >= limit):
            raise ValueError(
                f"indices must lie in [0, {limit}) (shard * shard_capacity + slot, as in "
                f"batch.indices); got min {idx.min()}, max {idx.max()}"
            )
        return idx // self.shard_capacity, idx % self.shard_capacity

    # ------------------------------------------------------------------ writing
    def writer(self, stream: int) -> ShardWriter:
        """A picklable writer for environment stream ``stream`` (bound to its shard), for a
        rollout actor; writers of streams on the same shard are distinct objects."""
        k = self.shard_of(stream)
        return ShardWriter(
            self._actors[k],
            k,
            self.timeout,
            self.rate_limiter,
            stream=stream,
            n_shards=self.n_shards,
            next_obs=self._config["next_obs"],
        )

    def _local_writer(self, k: int) -> ShardWriter:
        if k not in self._writers:
            self._writers[k] = ShardWriter(
                self._actors[k],
                k,
                self.timeout,
                self.rate_limiter,
                n_shards=self.n_shards,
                next_obs=self._config["next_obs"],
            )
        return self._writers[k]

    def add(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        stream: int = 0,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """One timestep of environment stream ``stream`` (to shard ``stream % n_shards``); the
        arguments as in :meth:`MultiAgentReplayBuffer.add` (``truncated=``, extra and global
        fields, ``alive=``). Asynchronous: see :class:`ShardWriter`."""
        self._local_writer(self.shard_of(stream)).add(
            obs, action, reward, next_obs, done, stream=stream, truncated=truncated, **fields
        )

    def extend(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        stream: int = 0,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """``T`` consecutive timesteps of stream ``stream`` (leading time axis, as
        :meth:`MultiAgentReplayBuffer.extend`, ``truncated=`` and fields likewise)."""
        self._local_writer(self.shard_of(stream)).extend(
            obs, action, reward, next_obs, done, stream=stream, truncated=truncated, **fields
        )

    def add_envs(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        streams: Sequence[int] | None = None,
        truncated: Any = False,
        first_stream: int | None = None,
        **fields: Any,
    ) -> None:
        """One step of ``E`` environments (leading environment axis, as
        :meth:`MultiAgentReplayBuffer.add_envs`, ``truncated=`` and fields likewise).

        Environment ``e`` is stream ``streams[e]``, or ``first_stream + e`` (default
        ``first_stream=0``, as one buffer numbers them). Each shard receives its environments
        in their order, in one call; the streams a shard receives in one call must be its
        consecutive streams (``s, s + n_shards, s + 2 n_shards, ...``), which consecutive
        stream ids always give.
        """
        _check_next_obs(self._config["next_obs"], next_obs, done, "add_envs")
        values = (obs, action, reward, next_obs, done)
        count = _steps("add_envs", values)
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
            raise ValueError(
                f"streams must hold one int per environment ({count}); got {streams!r}"
            )
        if (stream_ids < 0).any():
            raise ValueError(f"streams must be ints >= 0; got {streams!r}")
        shards = stream_ids % self.n_shards
        parts = []
        for k in np.unique(shards):
            sel = np.flatnonzero(shards == k)
            local = stream_ids[sel] // self.n_shards
            if (np.diff(local) != 1).any():
                raise ValueError(
                    f"the environments of shard {k} have streams {stream_ids[sel].tolist()}, not "
                    f"consecutive streams of that shard (s, s + {self.n_shards}, ...): number "
                    "the environments consecutively (first_stream=) or write each with add("
                    "..., stream=s)"
                )
            parts.append((int(k), sel))
        for k, sel in parts:
            whole = len(parts) == 1  # one shard takes every environment: sent as given
            o, a, r, n, d = (
                v if whole or v is None else _select(v, sel, self._n_agents) for v in values
            )
            self._local_writer(k).add_envs(
                o,
                a,
                r,
                n,
                d,
                first_stream=int(stream_ids[sel[0]]),
                truncated=truncated if whole else _select_flags(truncated, sel),
                **(fields if whole else self._select_fields(fields, sel)),
            )

    def _select_fields(self, fields: Mapping[str, Any], sel: np.ndarray) -> dict[str, Any]:
        """Environments ``sel`` of ``add_envs``'s keyword fields: a global field is one array
        with the environment axis first; extras and ``alive`` are per agent."""
        out = {}
        for name, value in fields.items():
            if name in self._shard_config.global_fields:
                out[name] = np.asarray(value)[sel]
            else:
                out[name] = _select(value, sel, self._n_agents)
        return out

    def flush(self) -> None:
        """Wait for every write and priority update sent through this object; raise the first
        error (a rejected write, NaN TD errors, a dead shard)."""
        for k, w in self._writers.items():
            size, writes = w.flush()
            self._note(k, size, writes)
        self._settle_updates(block=True)

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, trainer: int = 0) -> Batch:
        """One batch of ``batch_size`` rows for ``trainer``, drawn from all shards by the global
        rule of the sampler (synchronous: no prefetch)."""
        if self._closed:  # its shard actors are gone: restarting one would not help
            raise RuntimeError(_CLOSED)
        trainer = self._shard_config.check_trainer(trainer)
        batch_size = self._check_batch(batch_size)
        return self._draw(batch_size, (trainer,))[0]

    def sample_for_trainers(self, batch_size: int, n_trainers: int | None = None) -> list[Batch]:
        """The MADDPG round: trainer ``t`` gets its own ``batch_size`` rows from all shards.

        Every shard ships its part of the whole round in one packed array; the parts are
        copied into one preallocated block (``(T, B, row)`` for the interleaved layout, so the
        batched trainer stacks the round without copying). With ``prefetch`` the next round of
        the same size is requested at once and assembled in the background.
        """
        n = self._shard_config.check_n_trainers(n_trainers)
        batch_size = self._check_batch(batch_size)
        key = (batch_size, tuple(range(n)))
        pending, self._next = self._next, None
        if pending is not None and pending[0] != key:
            _discard(pending[1])
            pending = None
        future = pending[1] if pending is not None else self._submit(key)
        batches = future.result()
        if self.prefetch:
            self._next = (key, self._submit(key))
        return batches

    def iter_trainers(self, batch_size: int, n_trainers: int | None = None) -> Iterator[Batch]:
        """The round of :meth:`sample_for_trainers`, one batch at a time."""
        yield from self.sample_for_trainers(batch_size, n_trainers)

    def _check_batch(self, batch_size: Any) -> int:
        batch_size = self.sampler.check_batch_size(batch_size)
        if isinstance(self.sampler, Neighbor) and batch_size % self.sampler.run_length:
            raise ValueError(
                f"run_length={self.sampler.run_length} must divide batch_size={batch_size}; "
                f"choose a batch size that is a multiple of {self.sampler.run_length}"
            )
        return batch_size

    def _submit(self, key: tuple[int, tuple[int, ...]]) -> Future[list[Batch]]:
        if self._closed:
            raise RuntimeError(_CLOSED)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="marlbuf-prefetch")
        return self._executor.submit(self._draw, *key)

    def _draw(self, batch_size: int, trainers: tuple[int, ...]) -> list[Batch]:
        if self.rate_limiter is not None:
            self.rate_limiter.await_sample(batch_size)
        plan = self._issue(batch_size, trainers)
        packed = get_all(plan.refs, self.timeout, "sample_round", self._hint)
        return self._assemble(plan, packed)

    def _issue(self, batch_size: int, trainers: tuple[int, ...]) -> _Round:
        """Draw the per-shard quotas and send every shard its sampling call (under the lock,
        so that rounds and priority updates reach the shards in a consistent order)."""
        with self._lock:
            self._settle_updates(block=False)
            n_t = len(trainers)
            quotas = np.zeros((self.n_shards, n_t), dtype=np.int64)
            scale: np.ndarray | None = None
            betas: list[float] = []
            snapshot = self._sizes.tolist()
            if self._by_totals:
                stats = get_all(
                    [(k, a.stats.remote()) for k, a in enumerate(self._actors)],
                    self.timeout,
                    "stats",
                    self._hint,
                )
                for k, s in enumerate(stats):
                    self._note(k, int(s[0]), int(s[1]))
                totals = np.array([s[2:] for s in stats])[:, list(trainers)]  # (K, T)
                scale = np.zeros((self.n_shards, n_t), dtype=np.float64)
                for i, t in enumerate(trainers):
                    column = totals[:, i]
                    whole = column.sum()
                    if not whole > 0:
                        raise ValueError(self._nothing_to_draw(batch_size, t))
                    scale[:, i] = column / whole
                    quotas[:, i] = self._split(batch_size, column)
                    if self.weighted:
                        # the sampler's own schedule at the learner's count of t's batches
                        assert isinstance(self.sampler, (Prioritized, SequenceSampler))
                        betas.append(self.sampler.beta_at(int(self._batches_drawn[t])))
                        self._batches_drawn[t] += 1
            else:
                sizes = self._sizes.copy()
                if sizes.sum() == 0 or not self._enough(batch_size, sizes):
                    sizes = self.refresh()
                self._check_enough(batch_size, sizes)
                for i in range(n_t):
                    quotas[:, i] = self._quotas(batch_size, sizes)
                snapshot = sizes.tolist()
            max_priority = self._max_priority.copy() if self.weighted else None
            refs = []
            for k, actor in enumerate(self._actors):
                if quotas[k].any():
                    ref = actor.sample_round.remote(
                        trainers, quotas[k].tolist(), snapshot[k], max_priority
                    )
                    refs.append((k, ref))
            return _Round(batch_size, trainers, quotas, scale, betas, refs)

    def _nothing_to_draw(self, batch_size: int, trainer: int) -> str:
        """Why trainer ``trainer``'s totals are all 0."""
        sampler = self.sampler
        if isinstance(sampler, SequenceSampler) and not sampler.pad and not sampler.prioritized:
            return (
                f"no shard holds an episode with length={sampler.length} steps yet, so "
                "pad=False has no sequence start; add more data, use shorter sequences or "
                f"pad=True (batch_size={batch_size})"
            )
        return (
            f"no shard has data (or every priority of trainer {trainer} is 0): add "
            f"transitions before sampling (batch_size={batch_size})"
        )

    def _split(self, batch_size: int, totals: np.ndarray) -> np.ndarray:
        """Rows (sequences) per shard for one trainer from the shards' totals: independent
        draws, or distinct uniform starts (``Sequence(replace=False)``: the totals count the
        starts) split as ``B`` of all starts without replacement."""
        sampler = self.sampler
        if isinstance(sampler, SequenceSampler) and not sampler.replace:
            counts = np.rint(totals).astype(np.int64)
            if batch_size > counts.sum():
                raise ValueError(
                    f"batch_size={batch_size} distinct sequences (replace=False) but the shards "
                    f"hold {int(counts.sum())} starts ({counts.tolist()}); add more data, sample "
                    "fewer, or use replace=True"
                )
            return self.rng.multivariate_hypergeometric(counts, batch_size)
        return self.rng.multinomial(batch_size, totals / totals.sum())

    def _valid_starts(self, sizes: np.ndarray) -> np.ndarray:
        """Per shard, what the sampler draws from: slots, or a Neighbor's run starts."""
        if isinstance(self.sampler, Neighbor):
            n = self.sampler.run_length
            starts = np.where(sizes >= self.shard_capacity, sizes, sizes - n + 1)
            return np.maximum(starts, 0)
        return sizes

    def _enough(self, batch_size: int, sizes: np.ndarray) -> bool:
        if isinstance(self.sampler, Neighbor):
            return bool(self._valid_starts(sizes).sum() >= batch_size // self.sampler.run_length)
        if isinstance(self.sampler, Uniform) and not self.sampler.replace:
            return bool(sizes.sum() >= batch_size)  # as one buffer: distinct stored rows
        return bool(sizes.sum() > 0)

    def _check_enough(self, batch_size: int, sizes: np.ndarray) -> None:
        if sizes.sum() == 0:
            raise ValueError(
                f"the sharded buffer is empty: add transitions before sampling "
                f"(batch_size={batch_size})"
            )
        if not self._enough(batch_size, sizes):
            raise ValueError(
                f"batch_size={batch_size} needs more stored transitions than the shards hold "
                f"({sizes.tolist()}) for {self.sampler!r}; add more data or sample a smaller "
                "batch"
            )

    def _quotas(self, batch_size: int, sizes: np.ndarray) -> np.ndarray:
        """Rows per shard for one trainer: the global draw split exactly (see the docs)."""
        if isinstance(self.sampler, Neighbor):
            refs = self.rng.multivariate_hypergeometric(
                self._valid_starts(sizes), batch_size // self.sampler.run_length
            )
            return refs * self.sampler.run_length
        if isinstance(self.sampler, Uniform) and not self.sampler.replace:
            return self.rng.multivariate_hypergeometric(sizes, batch_size)
        return self.rng.multinomial(batch_size, sizes / sizes.sum())

    def _assemble(self, plan: _Round, packed: list[np.ndarray]) -> list[Batch]:
        """Copy every shard's part into the round's block and build the batches (sequence
        batches of ``B * L`` rows for a sequence sampler)."""
        storage = self._storage
        batch_size, trainers, steps = plan.batch_size, plan.trainers, self._steps
        n_t = len(trainers)
        parts: dict[int, list[Any]] = {}
        for (k, _), array in zip(plan.refs, packed):
            header, per_trainer = unpack(storage, array, plan.quotas[k], self.weighted, steps)
            self._note(k, int(header[0]), int(header[1]))
            parts[k] = per_trainer
        rows = storage.layout == "interleaved" and storage.batch_layout == "rows"
        per_item = steps or 1  # gathered rows per batch row (sequence)
        n_rows = batch_size * per_item
        dtype, shape = storage.block_spec(n_rows)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if rows:
            round_block = storage.pool.acquire(n_t * nbytes).view(dtype).reshape(n_t, *shape)
            blocks = [round_block[i] for i in range(n_t)]
        else:
            blocks = [storage.pool.acquire(nbytes).view(dtype).reshape(shape) for _ in trainers]
        batches: list[Batch] = []
        for i, t in enumerate(trainers):
            block = blocks[i]
            fields = storage.views(block, n_rows)
            indices = np.empty(batch_size, dtype=np.int64)
            generations = np.empty(batch_size, dtype=np.int64)
            probs = np.empty(batch_size, dtype=np.float64) if self.weighted else None
            mask = np.empty((batch_size, steps), dtype=bool) if steps else None
            slots = np.empty((batch_size, steps), dtype=np.int64) if steps else None
            at = 0
            for k in sorted(parts):
                part = parts[k][i]
                if part is None:
                    continue
                n = part.slots.shape[0]
                lo, hi = at * per_item, (at + n) * per_item
                if rows:
                    np.copyto(block[lo:hi], part.block)
                else:  # every field: the five, extras, globals and alive
                    for name, parts_of in storage.views(part.block, hi - lo).items():
                        for key, values in parts_of.items():
                            np.copyto(fields[name][key][lo:hi], values)
                indices[at : at + n] = part.slots + k * self.shard_capacity
                generations[at : at + n] = part.gens
                if probs is not None:
                    assert plan.scale is not None and part.probs is not None
                    probs[at : at + n] = part.probs * plan.scale[k, i]
                if mask is not None and slots is not None:
                    mask[at : at + n] = part.mask
                    # global ids of the steps' slots; -1 (masked) stays -1
                    slots[at : at + n] = np.where(
                        part.mask, part.steps + k * self.shard_capacity, -1
                    )
                at += n
            if at != batch_size:  # a shard answered a different quota: never expected
                raise RuntimeError(f"assembled {at} rows for trainer {t}; expected {batch_size}")
            weights = None
            if probs is not None:
                # w_i = (N P(i))^-beta / max_b (N P(b))^-beta = (min_b P(b) / P(i))^beta
                weights = ((probs.min() / probs) ** plan.betas[i]).astype(np.float32)
            # the batch of a gather of these rows (with extras, globals and alive), its indices
            # carrying their generations as a single buffer's do
            drawn = DrawnIndices.of(indices, generations)
            if mask is None or slots is None:
                batches.append(storage.make_batch(fields, block, drawn, generations, weights, t))
                continue
            # the shards zeroed the masked steps already (zeroed=True: nothing to redo)
            flat_slots = slots.reshape(-1)
            flat = storage.make_batch(fields, block, flat_slots, flat_slots, None, t)
            assert isinstance(self.sampler, SequenceSampler)
            batches.append(
                storage.make_sequences(
                    flat, mask, self.sampler.burn_in, slots, drawn, generations, weights, t, True
                )
            )
        return batches

    # ------------------------------------------------------------------ priorities
    def update_priorities(
        self,
        indices: Any,
        td_errors: Any,
        trainer: int = 0,
        generations: Any = None,
        sync: bool = True,
    ) -> None:
        """Feed TD errors back; each row's update goes to its (shard, slot).

        As :meth:`MultiAgentReplayBuffer.update_priorities`: updates for slots overwritten
        since they were sampled are dropped, judged by the generations ``batch.indices``
        carries (or ``generations=batch.generations`` for indices that travelled). Indices
        without generations set the priorities of their slots as the shards hold them now (the
        learner keeps no record of the shards' write generations). Indices,
        TD errors and generations may be torch tensors (copied to the host here).
        Asynchronous whatever ``sync`` says (it is accepted for the single buffer's
        signature): a failure is raised by a later call or :meth:`flush`.
        """
        if not self.weighted:
            raise TypeError(
                f"{type(self.sampler).__name__} keeps no priorities; update_priorities needs a "
                "prioritized sampler (marlbuf.samplers.Prioritized or PrioritizedNeighbor)"
            )
        if not isinstance(sync, bool):
            raise TypeError(f"sync must be a bool; got sync={sync!r}")
        trainer = self._shard_config.check_trainer(trainer)
        host = _host(indices)
        if generations is None and isinstance(indices, DrawnIndices):
            # exact: the generations of this very draw (entries reordered in place since are
            # judged by their slots' generations then; entries it did not draw are refused)
            generations = indices.generations_of(np.asarray(host, dtype=np.int64))
            if generations is None and indices.generations is not None:
                raise ValueError(
                    "indices were written to after the draw: they hold slots their batch did "
                    "not draw; leave batch.indices as drawn (reordering it in place is fine), "
                    "or pass generations= for the slots you update"
                )
        shards, slots = self.locate(host)
        td = _host(td_errors)
        # sequences: one error per sequence, or per training step (mixed on the shard)
        length = self.sampler.length if isinstance(self.sampler, SequenceSampler) else None
        shapes = [shards.shape] + ([] if length is None else [(*shards.shape, length)])
        if td.dtype.kind not in "iuf" or td.shape not in shapes:
            raise ValueError(
                f"td_errors must be a real array of shape {' or '.join(map(str, shapes))}, one "
                f"per index{'' if length is None else ' (or per training step)'}; got dtype "
                f"{td.dtype}, shape {td.shape}"
            )
        # per-step errors may be anything at masked steps: the shard checks the valid ones
        bad = np.flatnonzero(~np.isfinite(td)) if td.ndim == 1 else np.empty(0, np.int64)
        if bad.size:
            raise ValueError(
                f"td_errors must be finite; got td_errors[{bad[0]}]={td[bad[0]]} (check the "
                "critic's loss for divergence)"
            )
        gens = None
        if generations is not None:
            gens = _host(generations)
            if gens.shape != shards.shape or gens.dtype.kind not in "iu":
                raise ValueError(
                    f"generations must be an integer array of the shape of indices "
                    f"{shards.shape} (pass batch.generations); got shape {gens.shape}, dtype "
                    f"{gens.dtype}"
                )
        with self._lock:
            for k in np.unique(shards):
                sel = shards == k
                ref = self._actors[int(k)].update_priorities.remote(
                    trainer, slots[sel], td[sel], None if gens is None else gens[sel]
                )
                self._updates.append((int(k), (trainer, ref)))

    def update_priorities_for_trainers(
        self,
        indices: Sequence[Any],
        td_errors: Sequence[Any],
        generations: Sequence[Any] | None = None,
        sync: bool = True,
    ) -> None:
        """:meth:`update_priorities` for every trainer of a round: ``indices[t]`` and
        ``td_errors[t]`` (and ``generations[t]``) go to trainer ``t``, as
        :meth:`MultiAgentReplayBuffer.update_priorities_for_trainers`."""
        update_each_trainer(self.update_priorities, indices, td_errors, generations, sync)

    def _settle_updates(self, block: bool) -> None:
        """Collect finished priority updates (all of them with ``block``): fold the shards'
        running maximum priorities and raise the first error."""
        while self._updates:
            k, (trainer, ref) = self._updates[0]
            if not block:
                ready, _ = ray.wait([ref], timeout=0)
                if not ready:
                    return
            self._updates.popleft()
            largest = self._get(k, ref, "update_priorities")
            self._max_priority[trainer] = max(self._max_priority[trainer], largest)

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write every shard to ``folder/shard-<k>.npz`` (each written by its actor, atomically)
        and then ``folder/manifest.json``; also the checkpoint :meth:`restart_shard` uses.

        The folder must be reachable by every shard's node (shared storage on a cluster).
        Writes in flight elsewhere (other processes' writers) may or may not be included; a
        consistent snapshot needs the writers paused (each shard's file is consistent by
        itself either way).
        """
        folder = Path(folder).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        self.flush()
        with self._lock:
            calls = [
                (k, a.save.remote(str(folder / _shard_file(k)))) for k, a in enumerate(self._actors)
            ]
            results = get_all(
                calls,
                self.timeout,
                "save",
                self._hint,
            )
            for k, (size, writes) in enumerate(results):
                self._note(k, size, writes)
            manifest = {
                "format": MANIFEST_FORMAT,
                "version": MANIFEST_VERSION,
                "n_shards": self.n_shards,
                "config": self._config,
                "shards": [
                    {"file": _shard_file(k), "size": int(s), "total_writes": int(w)}
                    for k, (s, w) in enumerate(results)
                ],
                "driver": {
                    "rng": self.rng.bit_generator.state,
                    "shard_seeds": self._shard_seeds,
                    "batches_drawn": self._batches_drawn.tolist(),
                    "max_priority": self._max_priority.tolist(),
                },
            }
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, folder / MANIFEST)
        self._checkpoint = folder
        return folder

    @classmethod
    def load(
        cls,
        folder: str | os.PathLike[str],
        prefetch: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        rate_limiter: RateLimiter | None = None,
        actor_options: Mapping[str, Any] | None = None,
        next_obs: str | None = None,
    ) -> ShardedReplayBuffer:
        """Start a sharded buffer from a folder written by :meth:`save` (new shard actors, each
        loading its file; the learner's RNG, β schedule and maximum priorities restored).

        The shards get the saved options (layout, sampler, ``global_fields``, ...);
        ``next_obs`` (``"once"``, ``"stored"``, ``"auto"`` or ``"none"``) replaces the saved
        format, and every shard converts its file on load as
        :meth:`MultiAgentReplayBuffer.load_state_dict` does (the same batches either way;
        ``"none"`` drops the next observations, and a folder saved with ``"none"`` loads only
        as ``"none"``)."""
        folder = Path(folder).resolve()
        manifest = _read_manifest(folder)
        config = dict(manifest["config"])
        if next_obs is not None:
            config["next_obs"] = next_obs
        saved = shard_config(config)
        return cls(
            saved.specs,
            shard_capacity=int(saved.capacity),
            n_shards=int(manifest["n_shards"]),
            layout=saved.layout,
            sampler=saved.sampler(),
            n_trainers=int(saved.n_trainers),
            batch_layout=saved.batch_layout,
            prefetch=prefetch,
            timeout=timeout,
            rate_limiter=rate_limiter,
            actor_options=actor_options,
            next_obs=saved.next_obs,
            batch_dtype=saved.batch_dtype,
            global_fields=saved.global_fields,
            alive=saved.alive,
            parallel_gather=bool(config.get("parallel_gather", False)),
            _load=(folder, manifest),
        )

    def _restore_driver_state(self, manifest: Mapping[str, Any]) -> None:
        driver = manifest["driver"]
        self.rng.bit_generator.state = driver["rng"]
        self._shard_seeds = [int(s) for s in driver["shard_seeds"]]
        self._batches_drawn[:] = driver["batches_drawn"]
        self._max_priority[:] = driver["max_priority"]

    def restart_shard(self, shard: int, from_checkpoint: bool = True) -> None:
        """Replace shard ``shard``'s actor (dead or alive) by a new one loaded from the last
        :meth:`save` (``from_checkpoint=False``: an empty shard). Rows written to it since that
        checkpoint are lost; writers bound to the old actor fail and must be replaced
        (:meth:`writer`)."""
        k = int(shard)
        if not 0 <= k < self.n_shards:
            raise ValueError(f"shard must be in [0, {self.n_shards}); got shard={shard!r}")
        load_path = None
        if from_checkpoint:
            if self._checkpoint is None:
                raise ValueError(
                    f"no checkpoint to restart shard {k} from: call buffer.save(folder) first, "
                    "or pass from_checkpoint=False to restart it empty"
                )
            load_path = str(self._checkpoint / _shard_file(k))
        pending, self._next = self._next, None
        if pending is not None:  # outside the lock: the prefetch thread needs it to finish
            _discard(pending[1])
        with self._lock:
            self._updates = deque(u for u in self._updates if u[0] != k)
            self._writers.pop(k, None)
            try:
                ray.kill(self._actors[k], no_restart=True)
            except Exception:  # already gone
                pass
            self._actors[k] = self._start(k, load_path)
            info = self._get(k, self._actors[k].info.remote(), "info")
            self._check_code([info])
            self._sizes[k] = info["size"]
            self._writes[k] = info["total_writes"]

    def close(self) -> None:
        """End the prefetch thread and every shard actor (their data is lost unless saved)."""
        if self._closed:
            return
        self._closed = True
        if self._next is not None:
            _discard(self._next[1])
            self._next = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass

    def __enter__(self) -> ShardedReplayBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ShardedReplayBuffer(agents={len(self.specs)}, n_shards={self.n_shards}, "
            f"shard_capacity={self.shard_capacity}, sizes={self._sizes.tolist()}, "
            f"layout={self._shard_config.layout!r}, sampler={self.sampler!r})"
        )


def _check_next_obs(mode: str, next_obs: Any, done: Any, call: str) -> None:
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


def _host(values: Any) -> np.ndarray:
    """``values`` as a host array (a torch tensor on any device is copied; a
    :class:`marlbuf.batch.DrawnIndices` becomes a plain array)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values).view(np.ndarray)


def _discard(future: Future[Any]) -> None:
    """Wait for a prefetched round nobody will use; its errors are dropped (a later call
    meets the same failure and reports it)."""
    try:
        future.result()
    except Exception:
        pass


def _check_capacity(capacity: Any) -> int:
    if isinstance(capacity, (float, np.floating)) and float(capacity).is_integer():
        capacity = int(capacity)
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"shard_capacity must be an int; got shard_capacity={capacity!r}")
    if capacity < 1:
        raise ValueError(f"shard_capacity must be >= 1; got shard_capacity={capacity}")
    return int(capacity)


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no sharded buffer in {folder} (missing {MANIFEST})")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(
            f"{path} is not a marlbuf sharded-buffer manifest of version {MANIFEST_VERSION}; got "
            f"format={manifest.get('format')!r} version={manifest.get('version')!r}"
        )
    missing = [s["file"] for s in manifest["shards"] if not (folder / s["file"]).is_file()]
    if missing:
        raise FileNotFoundError(f"sharded buffer {folder} lacks shard files {missing}")
    return dict(manifest)


__all__ = ["ShardWriter", "ShardedReplayBuffer"]
