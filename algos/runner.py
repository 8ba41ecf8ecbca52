"""The training loop: environment, buffer and learner wired together, phase by phase.

Every step of the loop sits inside a named phase so a profiler can attach::

    action_selection, env_step, buffer_add,
    update_all_trainers ⊃ {sampling, target_q, q_p_loss, priority_update}

A profiler is any object with ``phase(name) -> context manager``. Without one the runner uses
:class:`NullProfiler`, whose ``phase`` returns one shared ``contextlib.nullcontext`` (a method
call and a no-op ``with``; nothing is timed or allocated).

Example
-------
>>> from marlbuf.algos import Runner, TrainConfig
>>> cfg = TrainConfig(batch_size=32, buffer_size=2000, warmup_steps=100)
>>> runner = Runner(cfg)
>>> records = runner.train(episodes=8)
>>> len(records), runner.total_steps, runner.update_rounds
(8, 200, 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from marlbuf import persistence
from marlbuf.algos.config import TrainConfig
from marlbuf.algos.device import DeviceBatchedLearner, DeviceUpdateStats
from marlbuf.algos.maddpg import BatchedLearner, Learner, LoopLearner, UpdateStats, make_learner
from marlbuf.algos.nets import torch
from marlbuf.algos.stacking import RoundBlock
from marlbuf.batch import Batch
from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, Sampler, Uniform
from marlbuf.stores.torch import DeviceBatch, round_of

#: Phase names, fixed; the profiler and every report use these.
PHASES = (
    "action_selection",
    "env_step",
    "buffer_add",
    "update_all_trainers",
    "sampling",
    "target_q",
    "q_p_loss",
    "priority_update",
)

CHECKPOINT_FORMAT = "marlbuf-checkpoint"
CHECKPOINT_VERSION = 1

_NULL_CONTEXT = contextlib.nullcontext()


class NullProfiler:
    """The profiler used when none is given: ``phase`` returns a shared no-op context."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return _NULL_CONTEXT


class PhaseTimer:
    """A minimal profiler: inclusive wall time and entry count per phase name.

    ``totals[name]`` accumulates seconds over every entry (nested phases are counted in their
    parents too); ``snapshot()`` and differences of snapshots give per-episode figures.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.counts: dict[str, int] = dict.fromkeys(PHASES, 0)

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start
            self.counts[name] = self.counts.get(name, 0) + 1

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


def episode_seed(seed: int, episode: int, evaluation: bool = False) -> int:
    """The environment seed of episode ``episode`` of a run seeded ``seed``. Each episode is
    reseeded, so a resumed run replays exactly what an uninterrupted one would; evaluation
    episodes have seeds of their own."""
    words = [seed, episode, 1] if evaluation else [seed, episode]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def build_sampler(config: TrainConfig) -> Sampler:
    """The buffer sampler named by ``config.sampler`` with its options."""
    order: dict[str, Any] = {} if config.sample_order is None else {"order": config.sample_order}
    if config.sampler == "uniform":
        return Uniform(**order)
    if config.sampler == "neighbor":
        return Neighbor(run_length=config.run_length)
    from marlbuf.prioritized import LinearBeta
    from marlbuf.samplers import Prioritized, PrioritizedNeighbor

    beta = LinearBeta(config.beta, config.beta_final, steps=config.beta_anneal_rounds)
    if config.sampler == "prioritized":
        return Prioritized(
            alpha=config.alpha,
            beta=beta,
            eps=config.priority_eps,
            index=config.priority_index,
            **order,
        )
    return PrioritizedNeighbor(alpha=config.alpha, beta=beta, eps=config.priority_eps)


def make_env(config: TrainConfig) -> Any:
    """The MPE task of ``config`` (needs the ``[envs]`` extra)."""
    from marlbuf.envs import make

    fast = config.env_impl == "fast"  # "mpe2": mpe2's code untouched (no vectorized step, no
    # shared predator reward cache)
    if config.env == "cooperative_navigation":
        return make(
            "cooperative_navigation",
            n_agents=config.n_agents,
            seed=config.seed,
            fast=fast,
            shared_predator_reward=fast,
        )
    return make(
        "predator_prey",
        n_predators=config.n_agents,
        n_prey=config.n_prey,
        seed=config.seed,
        fast=fast,
        shared_predator_reward=fast,
    )


@dataclass
class EpisodeRecord:
    """One finished episode, as logged.

    ``ret`` is the sum over agents of their returns (what openai/maddpg prints as "mean episode
    reward"); ``ret_original`` the same in the original MPE's reward units.
    """

    episode: int
    steps: int
    ret: float
    ret_original: float
    agent_returns: list[float]
    update_rounds: int
    wall_s: float
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode": self.episode,
            "steps": self.steps,
            "return": self.ret,
            "return_original": self.ret_original,
            "agent_returns": self.agent_returns,
            "update_rounds": self.update_rounds,
            "wall_s": self.wall_s,
            "phases": self.phases,
        }


class Runner:
    """Builds the environment, the buffer and the learner of ``config`` and runs the loop.

    Parameters
    ----------
    config : TrainConfig
    profiler : object with ``phase(name) -> context manager``, optional
        Receives every phase (see module docstring); default :class:`NullProfiler`.
    env : environment, optional
        Replaces ``make_env(config)`` (any object with the :mod:`marlbuf.envs` interface).
    """

    def __init__(self, config: TrainConfig, profiler: Any = None, env: Any = None) -> None:
        config.validate()
        self.config = config
        self.profiler = NullProfiler() if profiler is None else profiler
        if not callable(getattr(self.profiler, "phase", None)):
            raise TypeError(
                "profiler must have a method phase(name) returning a context manager; "
                f"got profiler={profiler!r}"
            )
        torch.set_num_threads(config.threads)
        self.env = make_env(config) if env is None else env
        if self.config.episode_length != 25:
            raise ValueError(
                "the MPE tasks truncate episodes at 25 steps; episode_length must be 25, got "
                f"episode_length={config.episode_length}"
            )
        self.agents: list[str] = list(self.env.agents)
        self.n_trainers = len(self.agents)
        action_dims = set(getattr(self.env, "action_dims", [5] * self.n_trainers))
        if len(action_dims) != 1:
            raise ValueError(f"every agent needs the same action size; got {sorted(action_dims)}")
        specs = self.env.specs()
        if config.obs_dtype != "float32":  # half-precision storage, float32 batches
            dtype = config.obs_dtype
            specs = {a: dataclasses.replace(s, obs_dtype=dtype) for a, s in specs.items()}
        self.buffer = MultiAgentReplayBuffer(
            specs,
            capacity=config.buffer_size,
            layout=config.layout,
            sampler=build_sampler(config),
            seed=config.seed,
            device=config.buffer_device,  # None: NumPy arrays; else a torch store there
        )
        if config.buffer_device is None:
            self.learner: Learner = make_learner(config, self.env.obs_dims, action_dims.pop())
        else:
            self.learner = DeviceBatchedLearner(
                config, self.env.obs_dims, action_dims.pop(), seed=config.seed
            )
        host_buffer = None if config.buffer_device is not None else self.buffer
        self.round_block = RoundBlock(host_buffer, self.n_trainers, config.batch_size)
        self._device_batches: list[DeviceBatch] | None = None  # the last device round
        self._pool: ThreadPoolExecutor | None = None
        if config.overlap_gather:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marlbuf-gather")
        self.total_steps = 0
        self.episodes = 0
        self.update_rounds = 0
        self.last_stats: UpdateStats | DeviceUpdateStats | None = None
        self._obs: list[np.ndarray] | None = None
        self._episode_start = time.perf_counter()

    # ------------------------------------------------------------------ phases
    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The profiler's context for ``name`` (a shared no-op without a profiler)."""
        return self.profiler.phase(name)

    # ------------------------------------------------------------------ env interaction
    def _start_episode(self) -> None:
        self._obs = self.env.reset(seed=episode_seed(self.config.seed, self.episodes))
        self._episode_start = time.perf_counter()

    def _interact(self, random_policy: bool) -> dict[str, Any]:
        """Act, step the env, store the transition; returns the env's ``info``."""
        if self._obs is None:
            self._start_episode()
        obs = self._obs
        assert obs is not None
        with self.phase("action_selection"):
            if random_policy:
                actions = list(self.env.random_actions())
            else:
                actions = self.learner.act(obs)
        with self.phase("env_step"):
            next_obs, reward, done, info = self.env.step(actions)
        with self.phase("buffer_add"):
            self.buffer.add(obs, actions, reward, next_obs, done)
        self.total_steps += 1
        self._obs = next_obs
        return info

    def _finish_episode(self, info: dict[str, Any]) -> EpisodeRecord:
        if self.buffer.device is not None:
            self.buffer.check_priority_errors()  # the device rounds' deferred updates
        record = EpisodeRecord(
            episode=self.episodes,
            steps=self.total_steps,
            ret=float(np.sum(info["episode_return"])),
            ret_original=float(np.sum(info["original_return"])),
            agent_returns=[float(r) for r in info["episode_return"]],
            update_rounds=self.update_rounds,
            wall_s=time.perf_counter() - self._episode_start,
        )
        self.episodes += 1
        self._obs = None
        return record

    def step(self, random_policy: bool = False) -> EpisodeRecord | None:
        """One step of the full loop: act, step, store, and update every trainer when due.
        Returns the finished episode's record on its last step, else ``None``."""
        info = self._interact(random_policy)
        if self.update_due():
            self.update_round()
        return self._finish_episode(info) if info["episode_over"] else None

    def update_due(self) -> bool:
        """openai/maddpg's rule: every ``update_every`` steps once the warm-up is stored."""
        cfg = self.config
        return len(self.buffer) >= cfg.effective_warmup and self.total_steps % cfg.update_every == 0

    def collect(self, n_steps: int, random_policy: bool = False) -> list[EpisodeRecord]:
        """``n_steps`` of env interaction only (no updates): phases ``action_selection``,
        ``env_step``, ``buffer_add``. Returns the episodes that finished."""
        records = []
        for _ in range(int(n_steps)):
            info = self._interact(random_policy)
            if info["episode_over"]:
                records.append(self._finish_episode(info))
        return records

    def run_steps(self, n_steps: int) -> list[EpisodeRecord]:
        """``n_steps`` steps of the full loop (updates every ``update_every`` steps)."""
        records = []
        for _ in range(int(n_steps)):
            record = self.step()
            if record is not None:
                records.append(record)
        return records

    def train(
        self,
        episodes: int,
        on_episode: Callable[[EpisodeRecord], Any] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[EpisodeRecord]:
        """Run ``episodes`` more whole episodes; ``on_episode`` sees each record, and
        ``should_stop()`` (checked between episodes) ends training early.

        ``episodes`` counts from now, as ``collect`` and ``run_steps`` do; ``marlbuf train
        --episodes`` is instead the run's total (a resumed run continues until it has that
        many): ``runner.train(total - runner.episodes)`` is its equivalent here."""
        records = []
        for _ in range(int(episodes)):
            if should_stop is not None and should_stop():
                break
            record = None
            while record is None:
                record = self.step()
            records.append(record)
            if on_episode is not None:
                on_episode(record)
        return records

    def evaluate(self, episodes: int, random_policy: bool = False) -> list[float]:
        """Returns (original MPE units, sum over agents) of ``episodes`` episodes of the current
        policy, with its exploration noise, on fixed evaluation seeds; nothing is stored or
        trained and the training episode sequence is unchanged. The same seeds every call, so
        two policies are compared on the same episodes."""
        if self._obs is not None:
            raise RuntimeError("evaluate between episodes (the current one is unfinished)")
        returns = []
        for episode in range(int(episodes)):
            obs = self.env.reset(seed=episode_seed(self.config.seed, episode, evaluation=True))
            while True:
                if random_policy:
                    actions = list(self.env.random_actions())
                else:
                    actions = self.learner.act(obs)
                obs, _, _, info = self.env.step(actions)
                if info["episode_over"]:
                    returns.append(float(np.sum(info["original_return"])))
                    break
        return returns

    # ------------------------------------------------------------------ updates
    def update_round(self) -> UpdateStats | DeviceUpdateStats:
        """One update of every trainer (phase ``update_all_trainers``)."""
        with self.phase("update_all_trainers"):
            if isinstance(self.learner, DeviceBatchedLearner):
                stats: UpdateStats | DeviceUpdateStats = self._device_round()
            elif isinstance(self.learner, BatchedLearner):
                stats = self._batched_round()
            else:
                stats = self._loop_round()
        self.update_rounds += 1
        self.last_stats = stats
        return stats

    def _batched_round(self) -> UpdateStats:
        cfg = self.config
        with self.phase("sampling"):
            batches = self.buffer.sample_for_trainers(
                cfg.batch_size, shared_index=cfg.shared_index, out=self.round_block.out()
            )
            self.round_block.keep(batches)
        stats = self.learner.update(batches, self.phase)
        if self.buffer.sampler.weighted:
            with self.phase("priority_update"):
                for t, batch in enumerate(batches):
                    self._update_priorities(t, batch, stats.td_errors[t])
        return stats

    def _device_round(self) -> DeviceUpdateStats:
        """The round with a device buffer: draws, gathers, learner and priority updates all on
        the buffer's device, nothing read back (see :mod:`marlbuf.algos.device`)."""
        cfg = self.config
        buffer = self.buffer
        learner = self.learner
        assert buffer.device is not None and isinstance(learner, DeviceBatchedLearner)
        with self.phase("sampling"):
            batches = cast(
                "list[DeviceBatch]",
                buffer.sample_for_trainers(
                    cfg.batch_size, shared_index=cfg.shared_index, out=self._device_batches
                ),
            )
            self._device_batches = batches  # the next round gathers into the same block
        stats = learner.update_device(batches, self.phase)
        if buffer.sampler.weighted:
            with self.phase("priority_update"):
                whole = round_of(batches)
                indices: Any = whole.indices if whole is not None else [b.indices for b in batches]
                gens: Any = (
                    whole.generations if whole is not None else [b.generations for b in batches]
                )
                buffer.update_priorities_for_trainers(indices, stats.td_errors, gens, sync=False)
        return stats

    def _loop_round(self) -> UpdateStats:
        cfg = self.config
        learner = self.learner
        assert isinstance(learner, LoopLearner)
        learner.begin_round(cfg.batch_size)
        critic, actor, tds = [], [], []
        shared: Batch | None = None
        pending: Future[Batch] | None = None
        for t in range(self.n_trainers):
            with self.phase("sampling"):
                if cfg.shared_index:
                    if shared is None:
                        shared = self.buffer.sample(cfg.batch_size, 0)
                    batch = shared
                elif pending is not None:
                    batch = pending.result()
                else:
                    batch = self.buffer.sample(cfg.batch_size, t)
                pending = None
                if self._pool is not None and t + 1 < self.n_trainers and not cfg.shared_index:
                    # the next trainer's gather runs while this trainer updates (nogil kernels)
                    pending = self._pool.submit(self.buffer.sample, cfg.batch_size, t + 1)
            c, a, td = learner.update_trainer(t, batch, self.phase)
            if self.buffer.sampler.weighted:
                with self.phase("priority_update"):
                    self._update_priorities(t, batch, td)
            critic.append(c)
            actor.append(a)
            tds.append(td)
        with self.phase("q_p_loss"):
            updated = learner.end_round()
        return UpdateStats(np.array(critic), np.array(actor), tds, updated)

    def _update_priorities(self, trainer: int, batch: Batch, td: np.ndarray) -> None:
        self.buffer.update_priorities(
            batch.indices, td, trainer=trainer, generations=batch.generations
        )

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write networks, optimizers, buffer, counters and RNG states to directory ``path``
        (atomically: a temporary directory renamed over the old one). Call it between
        episodes; :meth:`load_checkpoint` then continues exactly."""
        if self._obs is not None:
            raise RuntimeError(
                "save_checkpoint is only exact between episodes; finish the episode first"
            )
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        torch.save(self.learner.state_dict(), tmp / "learner.pt")
        self.buffer.save(tmp / "buffer.npz")
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "config": self.config.to_dict(),
            "total_steps": self.total_steps,
            "episodes": self.episodes,
            "update_rounds": self.update_rounds,
        }
        (tmp / "runner.json").write_text(json.dumps(meta, indent=1))
        old = path.with_name(path.name + ".old")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        if old.exists():
            shutil.rmtree(old)
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore :meth:`save_checkpoint` output into this runner (same configuration)."""
        path = Path(path)
        meta_path = path / "runner.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"no checkpoint at {path} (missing runner.json)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
            raise ValueError(
                f"{path} is not a marlbuf checkpoint of version {CHECKPOINT_VERSION}; got "
                f"format={meta.get('format')!r} version={meta.get('version')!r}"
            )
        saved = TrainConfig.from_dict(meta["config"])
        mine = self.config.to_dict()
        ignored = {"threads", "device", "extra", "overlap_gather"}  # do not change the numbers
        diff = {
            k: (v, mine[k]) for k, v in saved.to_dict().items() if k not in ignored and mine[k] != v
        }
        if diff:
            raise ValueError(
                f"checkpoint {path} was written with a different configuration "
                f"(field: (checkpoint, now)) {diff}; resume with the same options"
            )
        state = torch.load(path / "learner.pt", map_location=self.learner.device, weights_only=True)
        self.learner.load_state_dict(state)
        # straight into this runner's buffer: no second buffer of the checkpoint's size
        persistence.load_into(self.buffer, path / "buffer.npz")
        self.total_steps = int(meta["total_steps"])
        self.episodes = int(meta["episodes"])
        self.update_rounds = int(meta["update_rounds"])
        self._obs = None

    def close(self) -> None:
        """Stop the gather thread (if any) and close the environment."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
