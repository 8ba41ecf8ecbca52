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
from marlbuf.distributed._shard import ShardActor, shard_config
from marlbuf.distributed.checkpoint import read_manifest, shard_file, write_manifest
from marlbuf.distributed.checks import (
    check_capacity,
    check_learner_options,
    check_n_shards,
    check_sampler,
)
from marlbuf.distributed.draws import GlobalDraw, Round
from marlbuf.distributed.limiter import RateLimiter
from marlbuf.distributed.writers import ShardWriter, check_next_obs, split_envs
from marlbuf.reading import update_each_trainer
from marlbuf.samplers import Sampler
from marlbuf.samplers import Sequence as SequenceSampler
from marlbuf.spec import AgentSpec, FieldSpec
from marlbuf.staging import RowCodec
from marlbuf.writer import NextObsLinks

_RemoteShard = ray.remote(num_cpus=0, max_restarts=0)(ShardActor)

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
        (see :data:`marlbuf.distributed.checks.SHARDED_SAMPLERS`; batches of a ``Sequence``
        sampler are :class:`marlbuf.batch.SequenceBatch` objects); each shard gets its own
        instance.
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
        n_shards = check_n_shards(n_shards)
        sampler = check_sampler(sampler)
        check_learner_options(prefetch, timeout, rate_limiter)
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
        self.shard_capacity = check_capacity(shard_capacity)
        self._shard_config = config = replace(config, capacity=self.shard_capacity)
        self.specs = config.specs
        self.n_shards = int(n_shards)
        self.n_trainers = config.n_trainers
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
        self._global_draw = GlobalDraw(sampler, self.rng, self.shard_capacity, self._storage)
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
            load_path = None if _load is None else str(_load[0] / shard_file(k))
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
        check_next_obs(self._config["next_obs"], next_obs, done, "add_envs")
        parts = split_envs(
            (obs, action, reward, next_obs, done),
            streams,
            first_stream,
            truncated,
            fields,
            self.n_shards,
            len(self.specs),
            self._shard_config.global_fields,
        )
        for part in parts:
            o, a, r, n, d = part.values
            self._local_writer(part.shard).add_envs(
                o,
                a,
                r,
                n,
                d,
                first_stream=part.first_stream,
                truncated=part.truncated,
                **part.fields,
            )

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
        batch_size = self._global_draw.check_batch(batch_size)
        return self._draw(batch_size, (trainer,))[0]

    def sample_for_trainers(self, batch_size: int, n_trainers: int | None = None) -> list[Batch]:
        """The MADDPG round: trainer ``t`` gets its own ``batch_size`` rows from all shards.

        Every shard ships its part of the whole round in one packed array; the parts are
        copied into one preallocated block (``(T, B, row)`` for the interleaved layout, so the
        batched trainer stacks the round without copying). With ``prefetch`` the next round of
        the same size is requested at once and assembled in the background.
        """
        n = self._shard_config.check_n_trainers(n_trainers)
        batch_size = self._global_draw.check_batch(batch_size)
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
        return self._global_draw.assemble(plan, packed, self._note)

    def _issue(self, batch_size: int, trainers: tuple[int, ...]) -> Round:
        """Draw the per-shard quotas and send every shard its sampling call (under the lock,
        so that rounds and priority updates reach the shards in a consistent order)."""
        with self._lock:
            self._settle_updates(block=False)
            scale: np.ndarray | None = None
            betas: list[float] = []
            snapshot = self._sizes.tolist()
            if self._global_draw.by_totals:
                stats = get_all(
                    [(k, a.stats.remote()) for k, a in enumerate(self._actors)],
                    self.timeout,
                    "stats",
                    self._hint,
                )
                for k, s in enumerate(stats):
                    self._note(k, int(s[0]), int(s[1]))
                totals = np.array([s[2:] for s in stats])[:, list(trainers)]  # (K, T)
                quotas, scale, betas = self._global_draw.split_by_totals(
                    batch_size, trainers, totals, self._batches_drawn
                )
            else:
                sizes = self._sizes.copy()
                if sizes.sum() == 0 or not self._global_draw.enough(batch_size, sizes):
                    sizes = self.refresh()
                quotas = self._global_draw.split_by_sizes(batch_size, len(trainers), sizes)
                snapshot = sizes.tolist()
            max_priority = self._max_priority.copy() if self.weighted else None
            refs = []
            for k, actor in enumerate(self._actors):
                if quotas[k].any():
                    ref = actor.sample_round.remote(
                        trainers, quotas[k].tolist(), snapshot[k], max_priority
                    )
                    refs.append((k, ref))
            return Round(batch_size, trainers, quotas, scale, betas, refs)

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
                (k, a.save.remote(str(folder / shard_file(k)))) for k, a in enumerate(self._actors)
            ]
            results = get_all(
                calls,
                self.timeout,
                "save",
                self._hint,
            )
            for k, (size, writes) in enumerate(results):
                self._note(k, size, writes)
            driver = {
                "rng": self.rng.bit_generator.state,
                "shard_seeds": self._shard_seeds,
                "batches_drawn": self._batches_drawn.tolist(),
                "max_priority": self._max_priority.tolist(),
            }
        write_manifest(folder, self._config, results, driver)
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
        manifest = read_manifest(folder)
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
            load_path = str(self._checkpoint / shard_file(k))
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


__all__ = ["ShardWriter", "ShardedReplayBuffer"]
