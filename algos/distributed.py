"""Distributed training on Ray: ``K`` rollout actors, one learner on a sharded buffer.

Each rollout actor owns an environment copy (its own seed) and a policy snapshot, runs whole
episodes with it and writes each episode to its own shard through a
:class:`~marlbuf.distributed.ShardWriter` (stream ``k`` -> shard ``k``). The learner (this
process) keeps the single-process schedule: one update round of every trainer per
``update_every`` environment steps counted over all actors, once ``warmup`` transitions are
stored; rounds come from :meth:`ShardedReplayBuffer.sample_for_trainers` (exact global draws,
prefetched). Every ``weights_every`` rounds the learner puts its weights into the object store
once and each actor picks the new version up with its next episode request, so actors act with
a policy at most ``weights_every`` rounds (plus the episodes in flight) old.

Needs the ``[distributed]`` extra (Ray) besides ``[algos]`` and ``[envs]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from marlbuf.algos.config import TrainConfig
from marlbuf.algos.maddpg import Learner, UpdateStats, make_learner
from marlbuf.algos.nets import torch
from marlbuf.algos.runner import EpisodeRecord, NullProfiler, build_sampler, episode_seed, make_env
from marlbuf.distributed import ShardedReplayBuffer, ShardError, ShardWriter, init_ray
from marlbuf.distributed._ray import get, worker_env

#: Episode requests queued per actor (one running, one waiting): actors keep stepping while
#: the learner updates.
PIPELINE_DEPTH = 2


def actor_seed(seed: int, actor: int) -> int:
    """The environment seed of rollout actor ``actor`` in a run seeded ``seed``."""
    return int(np.random.SeedSequence([seed, 7919, actor]).generate_state(1)[0] % 2**31)


class RolloutActor:
    """One rollout worker (wrapped by ``ray.remote``): environment, policy snapshot, writer.

    Parameters
    ----------
    config : dict
        ``TrainConfig.to_dict()`` of the run.
    index : int
        This actor's number (its stream and shard).
    writer : ShardWriter
        Where its episodes go.
    """

    def __init__(self, config: dict[str, Any], index: int, writer: ShardWriter) -> None:
        cfg = TrainConfig.from_dict(config)
        torch.set_num_threads(1)
        self.index = int(index)
        self.seed = actor_seed(cfg.seed, self.index)
        self.env = make_env(dataclasses.replace(cfg, seed=self.seed))
        dims = set(getattr(self.env, "action_dims", [5]))
        self.learner = make_learner(
            dataclasses.replace(cfg, seed=self.seed), self.env.obs_dims, dims.pop()
        )
        self.writer = writer
        self.version = -1
        self.episodes = 0

    def collect(self, episodes: int, weights: Any, version: int) -> dict[str, Any]:
        """Run ``episodes`` episodes with the current snapshot (``weights``, when given, replace
        it first) and store each one with one ``extend``; returns records and timings."""
        if weights is not None:
            self.learner.set_params(weights)
            self.version = int(version)
        start = time.perf_counter()
        env_s = act_s = 0.0
        records, steps = [], 0
        for _ in range(int(episodes)):
            obs = self.env.reset(seed=episode_seed(self.seed, self.episodes))
            o, a, r, n, d = [], [], [], [], []
            ep_start = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                actions = self.learner.act(obs)
                t1 = time.perf_counter()
                next_obs, reward, done, info = self.env.step(actions)
                env_s += time.perf_counter() - t1
                act_s += t1 - t0
                o.append(obs)
                a.append(actions)
                r.append(reward)
                n.append(next_obs)
                d.append(done)
                obs = next_obs
                if info["episode_over"]:
                    break
            rewards = np.asarray(r, dtype=np.float32)
            dones = np.asarray(d, dtype=np.float32)
            agents = range(len(o[0]))
            self.writer.extend(
                obs=[np.stack([step[i] for step in o]) for i in agents],
                action=[np.stack([step[i] for step in a]) for i in agents],
                reward=[rewards[:, i] for i in agents],
                next_obs=[np.stack([step[i] for step in n]) for i in agents],
                done=[dones[:, i] for i in agents],
            )
            steps += len(o)
            self.episodes += 1
            records.append(
                {
                    "steps": len(o),
                    "ret": float(np.sum(info["episode_return"])),
                    "ret_original": float(np.sum(info["original_return"])),
                    "agent_returns": [float(x) for x in info["episode_return"]],
                    "wall_s": time.perf_counter() - ep_start,
                }
            )
        size, _ = self.writer.flush()
        return {
            "actor": self.index,
            "records": records,
            "steps": steps,
            "version": self.version,
            "shard_size": size,
            "wall_s": time.perf_counter() - start,
            "env_s": env_s,
            "act_s": act_s,
        }

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


_RemoteRollout = ray.remote(num_cpus=1, max_restarts=0)(RolloutActor)


class DistributedRunner:
    """The learner of a distributed run: shards, rollout actors, update schedule.

    Parameters
    ----------
    config : TrainConfig
        As for :class:`~marlbuf.algos.Runner`; ``buffer_size`` is the total capacity, split
        evenly over the shards (one per actor).
    n_actors : int
        Rollout actors ``K`` (>= 1), each with one shard.
    ray_address : str, optional
        ``None`` starts a local Ray instance limited to ``K`` CPUs (one per actor; the shards
        reserve none); ``"auto"`` or an address joins a running cluster.
    weights_every : int, default 10
        Update rounds between policy broadcasts.
    profiler : object with ``phase(name)``, optional
        Receives the learner's phases (``sampling``, ``update_all_trainers``, ...).
    timeout : float, default 120
        Seconds to wait for any actor before reporting it dead.
    """

    def __init__(
        self,
        config: TrainConfig,
        n_actors: int,
        ray_address: str | None = None,
        weights_every: int = 10,
        profiler: Any = None,
        timeout: float = 120.0,
    ) -> None:
        config.validate()
        for name, value in (("n_actors", n_actors), ("weights_every", weights_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        if config.shared_index:
            raise ValueError(
                "shared_index is not supported by the sharded buffer; drop --shared-index"
            )
        if config.overlap_gather:
            raise ValueError("overlap_gather does not apply to distributed training")
        self.config = config
        self.n_actors = n_actors
        self.weights_every = weights_every
        self.timeout = float(timeout)
        self.profiler = NullProfiler() if profiler is None else profiler
        torch.set_num_threads(config.threads)
        env = make_env(config)
        specs, obs_dims = env.specs(), list(env.obs_dims)
        action_dims = set(getattr(env, "action_dims", [5] * len(obs_dims)))
        self.agents: list[str] = list(env.agents)
        env.close()
        self.n_trainers = len(self.agents)
        self._started_ray = init_ray(
            address=ray_address,
            num_cpus=n_actors if ray_address is None else None,
            object_store_memory=_store_bytes(config, specs) if ray_address is None else None,
            logging_level=logging.ERROR,  # Ray's INFO/WARNING start-up lines are not ours
        )
        self.buffer = ShardedReplayBuffer(
            specs,
            shard_capacity=math.ceil(config.buffer_size / n_actors),
            n_shards=n_actors,
            layout=config.layout,
            sampler=build_sampler(config),
            seed=config.seed,
            timeout=self.timeout,
        )
        self.learner: Learner = make_learner(config, obs_dims, action_dims.pop())
        self.actors: list[Any] = [
            _RemoteRollout.options(runtime_env=worker_env()).remote(
                config.to_dict(), k, self.buffer.writer(k)
            )
            for k in range(n_actors)
        ]
        self.total_steps = 0
        self.episodes = 0
        self.update_rounds = 0
        self.last_stats: UpdateStats | None = None
        self.collect_stats = {"env_s": 0.0, "act_s": 0.0, "wall_s": 0.0}
        self._next_update = config.update_every
        self._version = 0
        self._weights = ray.put(self.learner.get_params())
        self._sent = [-1] * n_actors

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return self.profiler.phase(name)

    # ------------------------------------------------------------------ the loop
    def train(
        self,
        episodes: int,
        on_episode: Callable[[EpisodeRecord], Any] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[EpisodeRecord]:
        """Run ``episodes`` more episodes over all actors, updating as they arrive."""
        records: list[EpisodeRecord] = []
        inflight: dict[Any, int] = {}
        submitted = 0

        def submit(k: int) -> None:
            nonlocal submitted
            fresh = self._sent[k] != self._version
            ref = self.actors[k].collect.remote(1, self._weights if fresh else None, self._version)
            self._sent[k] = self._version
            inflight[ref] = k
            submitted += 1

        for _ in range(PIPELINE_DEPTH):
            for k in range(self.n_actors):
                if submitted < episodes:
                    submit(k)
        stopping = False
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.timeout)
            if not ready:
                raise ShardError(
                    None,
                    f"no rollout actor returned an episode within {self.timeout:g} s; the "
                    "actors are dead or the machine is overloaded",
                )
            k = inflight.pop(ready[0])
            result = get(ready[0], self.timeout, "collect", None, f"rollout actor {k} failed")
            for key in self.collect_stats:
                self.collect_stats[key] += result[key]
            for item in result["records"]:
                self.total_steps += item["steps"]
                record = EpisodeRecord(
                    episode=self.episodes,
                    steps=self.total_steps,
                    ret=item["ret"],
                    ret_original=item["ret_original"],
                    agent_returns=item["agent_returns"],
                    update_rounds=self.update_rounds,
                    wall_s=item["wall_s"],
                )
                self.episodes += 1
                records.append(record)
                if on_episode is not None:
                    on_episode(record)
            if should_stop is not None and should_stop():
                stopping = True
            if not stopping and submitted < episodes:
                submit(k)
            self._updates_due()
        return records

    def _updates_due(self) -> None:
        """The single-process rule over all actors' steps: a round at every multiple of
        ``update_every`` once the warm-up is stored."""
        cfg = self.config
        while self._next_update <= self.total_steps:
            # reported steps are stored (each actor flushes before it reports), so at step m
            # the shards hold at least m transitions: as in one process (where the buffer
            # holds m transitions at step m until full), a round is due at every multiple m of
            # update_every with m >= warmup, whatever else is in flight
            if self._next_update >= cfg.effective_warmup:
                self.update_round()
            self._next_update += cfg.update_every

    def update_round(self) -> UpdateStats:
        """One update of every trainer on a round from the sharded buffer."""
        cfg = self.config
        with self.phase("update_all_trainers"):
            with self.phase("sampling"):
                batches = self.buffer.sample_for_trainers(cfg.batch_size)
            stats = self.learner.update(batches, self.phase)
            if self.buffer.weighted:
                with self.phase("priority_update"):
                    for t, batch in enumerate(batches):
                        self.buffer.update_priorities(
                            batch.indices,
                            stats.td_errors[t],
                            trainer=t,
                            generations=batch.generations,
                        )
        del batches
        self.update_rounds += 1
        self.last_stats = stats
        if self.update_rounds % self.weights_every == 0:
            self._weights = ray.put(self.learner.get_params())
            self._version += 1
        return stats

    def close(self) -> None:
        """End the actors, the shards and (if this runner started it) Ray."""
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self.actors = []
        self.buffer.close()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def _store_bytes(config: TrainConfig, specs: dict[str, Any]) -> int:
    """Object store for a local run: three rounds of batches in flight plus weights."""
    from marlbuf.buffer import MultiAgentReplayBuffer

    probe = MultiAgentReplayBuffer(specs, 1, layout=config.layout)
    dtype, shape = probe.storage.block_spec(config.batch_size)
    round_bytes = int(np.prod(shape)) * dtype.itemsize * len(specs)
    return max(512 * 2**20, 3 * round_bytes + 256 * 2**20)


__all__ = ["DistributedRunner", "RolloutActor", "actor_seed", "main_distributed"]


def main_distributed(args: Any, config: TrainConfig, episodes: int, out: Any) -> int:
    """``marlbuf train --actors K``: the distributed branch of :func:`marlbuf.algos.cli.main`.

    Writes ``config.json``, ``episodes.csv``/``episodes.jsonl`` (the same columns as the
    single-process run; ``t_*`` are the learner's phases while that episode arrived, the
    actors' own time is in ``wall_s``), ``learner.pt`` (the final weights and optimizer
    state) and ``rewards.png``.
    """
    import csv
    import json
    import sys

    from marlbuf.algos.cli import (
        CSV_FIELDS,
        PROG,
        _remove_run,
        flags_in,
        log_episode,
        no_update_note,
        plot_rewards,
        warmup_line,
    )
    from marlbuf.algos.runner import PhaseTimer
    from marlbuf.cli import error

    if args.resume:
        return error(PROG, "--resume is not supported with --actors (start a new run)")
    if args.actors < 1:
        return error(PROG, f"--actors must be >= 1 for a distributed run; got {args.actors}")
    if args.weights_every < 1:
        return error(PROG, f"--weights-every must be >= 1; got {args.weights_every}")
    timer = PhaseTimer()
    try:
        runner = DistributedRunner(
            config, args.actors, args.ray_address, args.weights_every, profiler=timer
        )
    except (ValueError, TypeError) as exc:
        return error(PROG, flags_in(str(exc)))
    _remove_run(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps({**config.to_dict(), "actors": args.actors}, indent=1)
    )
    print(
        f"marlbuf train: {config.algo} on {config.env}, {runner.n_trainers} trainers, "
        f"{args.actors} rollout actors + 1 learner on {args.actors} shards "
        f"({config.layout}/{config.sampler}); {episodes} episodes; out {out}",
        file=sys.stderr,
    )
    print(f"marlbuf train: {warmup_line(config, episodes)}", file=sys.stderr)
    start = time.perf_counter()
    last = timer.snapshot()
    status = 0
    with (
        open(out / "episodes.csv", "w", newline="") as csv_file,
        open(out / "episodes.jsonl", "w") as jsonl_file,
    ):
        writer = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS + [f"t_{p}" for p in timer.totals])
        writer.writeheader()

        def on_episode(record: EpisodeRecord) -> None:
            nonlocal last
            now = timer.snapshot()
            record.phases = {k: now[k] - last.get(k, 0.0) for k in now}
            last = now
            log_episode(record, jsonl_file, writer)

        try:
            runner.train(episodes, on_episode=on_episode)
            torch.save(runner.learner.state_dict(), out / "learner.pt")
        except KeyboardInterrupt:
            print("marlbuf train: aborted", file=sys.stderr)
            status = 130
        except ShardError as exc:
            print(f"marlbuf train: {exc}", file=sys.stderr)
            status = 1
        finally:
            runner.close()
    elapsed = time.perf_counter() - start
    print(
        f"marlbuf train: {runner.episodes} episodes, {runner.total_steps} steps, "
        f"{runner.update_rounds} update rounds on {args.actors} actors; {elapsed:.1f} s "
        f"({runner.total_steps / max(elapsed, 1e-9):.0f} env steps/s)",
        file=sys.stderr,
    )
    if status == 0 and runner.update_rounds == 0:
        print(f"marlbuf train: {no_update_note(config, runner.total_steps)}", file=sys.stderr)
    if not args.no_plot and status == 0:
        title = f"{config.algo} {config.env} N={config.n_agents} ({args.actors} actors)"
        if plot_rewards(out / "episodes.csv", out / "rewards.png", title):
            print(f"marlbuf train: reward curve in {out / 'rewards.png'}", file=sys.stderr)
    return status
