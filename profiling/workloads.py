"""What ``marlbuf profile`` runs: the MADDPG sampling round alone, or the whole training loop.

Both start from a buffer that is already full (random transitions, ``fill_steps`` of them, the
ring wrapped), as late in training: the sampling phase then sees the footprint that makes its
cache behaviour matter. Everything up to the first profiled round (filling, JIT compilation, a
warm-up round) runs before the profiler starts, so under callgrind it is not simulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, Sampler, Uniform
from marlbuf.spec import FIELDS, AgentSpec
from marlbuf.workloads import Workload, random_steps

#: Default buffer footprint: the paper's capacity of 1e6 steps, capped at this many bytes so a
#: sweep to 24 agents fits in memory (and stays far larger than any last-level cache).
DEFAULT_FILL_BYTES = 256 * 1024**2
PAPER_CAPACITY = 1_000_000
_FILL_CHUNK = 8192

SAMPLER_NAMES = ("uniform", "neighbor", "prioritized", "prioritized_neighbor")
ENV_ALIASES = {"cn": "cooperative_navigation", "pp": "predator_prey"}


@dataclass(frozen=True)
class Case:
    """One profiled configuration."""

    env: str
    n_agents: int
    layout: str
    sampler: str

    @property
    def label(self) -> str:
        return f"{self.layout}/{self.sampler}/N={self.n_agents}"


def bytes_per_step(specs: dict[str, AgentSpec]) -> int:
    """Bytes of one joint transition (every agent's fields, unpadded)."""
    return sum(
        math.prod(spec.shape(f)) * spec.dtype(f).itemsize for spec in specs.values() for f in FIELDS
    )


def default_fill_steps(specs: dict[str, AgentSpec]) -> int:
    """min(1e6, 256 MiB of transitions): the buffer size profiled by default."""
    return int(min(PAPER_CAPACITY, DEFAULT_FILL_BYTES // bytes_per_step(specs)))


def make_sampler(name: str, run_length: int) -> Sampler:
    """``uniform`` or ``neighbor`` (prioritized samplers through ``marlbuf.samplers`` names)."""
    if name == "uniform":
        return Uniform()
    if name == "neighbor":
        return Neighbor(run_length=run_length)
    from marlbuf import samplers

    classes = {"prioritized": "Prioritized", "prioritized_neighbor": "PrioritizedNeighbor"}
    if name in classes and hasattr(samplers, classes[name]):
        sampler: Sampler = getattr(samplers, classes[name])()
        return sampler
    raise ValueError(
        f"sampler must be one of uniform, neighbor, prioritized, prioritized_neighbor "
        f"(where installed); got sampler={name!r}"
    )


def fill_buffer(buf: MultiAgentReplayBuffer, steps: int, seed: int) -> None:
    """Write ``steps`` random joint transitions (one random chunk written repeatedly: the
    content does not matter to the memory system, and it keeps the fill cheap)."""
    chunk = random_steps(buf.specs, min(_FILL_CHUNK, steps), np.random.default_rng(seed))
    written = 0
    while written < steps:
        n = min(_FILL_CHUNK, steps - written)
        if n == _FILL_CHUNK or n == len(chunk["reward"][buf.agents[0]]):
            part = chunk
        else:
            part = {f: {a: v[:n] for a, v in per.items()} for f, per in chunk.items()}
        buf.extend(**part)
        written += n


class _ModelHook:
    """Records the indices every ``buffer.sample`` and ``sample_for_trainers`` call draws (thin
    wrappers on the instance,
    inside the sampling phase) and, after the round, outside any phase, runs them through the
    :class:`~marlbuf.profiling.cachemodel.SamplingModel` and adds the *modelled* misses to the
    sampling phase."""

    def __init__(self, buffer: MultiAgentReplayBuffer) -> None:
        from marlbuf.profiling.cachemodel import SamplingModel

        self.model = SamplingModel(buffer.storage)
        self.recorded: list[np.ndarray] = []
        draw = buffer.sample

        def recording_sample(*args: Any, **kwargs: Any) -> Any:
            batch = draw(*args, **kwargs)
            self.recorded.append(batch.indices)
            return batch

        buffer.sample = recording_sample  # type: ignore[method-assign]
        draw_round = buffer.sample_for_trainers

        def recording_round(*args: Any, **kwargs: Any) -> Any:
            batches = draw_round(*args, **kwargs)
            self.recorded.extend(batch.indices for batch in batches)
            return batches

        buffer.sample_for_trainers = recording_round  # type: ignore[method-assign]

    def flush(self, profiler: Any) -> None:
        if self.recorded and hasattr(profiler, "add_figures"):
            values = self.model.observe(self.recorded)
            profiler.add_figures(SAMPLING_PATH, values, self.model.metrics)
        self.recorded = []


SAMPLING_PATH = "update_all_trainers/sampling"


class SamplingWorkload:
    """The MADDPG sampling round alone: every trainer draws its own batch of all agents.

    Phases per round: ``update_all_trainers`` ⊃ ``sampling`` (the other update phases need the
    trainers; use the ``train`` workload for them).
    """

    kind = "sampling"

    def __init__(
        self,
        case: Case,
        batch_size: int,
        run_length: int,
        fill_steps: int | None,
        seed: int,
        model: bool = False,
    ) -> None:
        workload = Workload(case.env, case.n_agents)
        specs = workload.specs()
        self.fill_steps = default_fill_steps(specs) if fill_steps is None else int(fill_steps)
        self.batch_size = batch_size
        self.n_trainers = workload.n_trainers
        self.buffer = MultiAgentReplayBuffer(
            specs,
            capacity=self.fill_steps,
            layout=case.layout,
            sampler=make_sampler(case.sampler, run_length),
            seed=seed,
        )
        fill_buffer(self.buffer, self.fill_steps, seed)
        self._profiler: Any = None
        self._model = _ModelHook(self.buffer) if model else None

    def attach(self, profiler: Any) -> None:
        self._profiler = profiler

    def round(self) -> None:
        phase: Callable[[str], Any] = self._profiler.phase
        with phase("update_all_trainers"):
            with phase("sampling"):
                self.buffer.sample_for_trainers(self.batch_size)
        if self._model is not None:
            self._model.flush(self._profiler)

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.kind,
            "n_trainers": self.n_trainers,
            "fill_steps": self.fill_steps,
            "buffer_bytes": self.buffer.nbytes,
            "batch_size": self.batch_size,
        }


class TrainWorkload:
    """The training loop of ``marlbuf.algos.Runner``: per round, ``collect_steps`` env steps
    (default ``update_every``, 100; phases ``action_selection``, ``env_step``, ``buffer_add``)
    and one update of every trainer (``update_all_trainers`` ⊃ ``sampling``, ``target_q``,
    ``q_p_loss``, ``priority_update``).
    """

    kind = "train"

    def __init__(
        self,
        case: Case,
        algo: str,
        batch_size: int,
        run_length: int,
        fill_steps: int | None,
        seed: int,
        collect_steps: int | None = None,
        model: bool = False,
    ) -> None:
        try:
            from marlbuf.algos import Runner, TrainConfig
        except ImportError as exc:  # torch/mpe2 missing, or no trainers in this checkout
            raise ImportError(
                "the 'train' workload needs the trainers: pip install 'marlbuf[algos,envs]' "
                f"({exc}); '--workload sampling' profiles the buffer alone"
            ) from exc
        specs = Workload(case.env, case.n_agents).specs()
        self.fill_steps = default_fill_steps(specs) if fill_steps is None else int(fill_steps)
        self.batch_size = batch_size
        config = TrainConfig(
            algo=algo,
            env=case.env,
            n_agents=case.n_agents,
            layout=case.layout,
            sampler=case.sampler,
            run_length=run_length,
            batch_size=batch_size,
            buffer_size=self.fill_steps,
            # the buffer is filled here, and rounds are driven directly: the runner's warm-up
            # rule only has to fit the buffer
            warmup_steps=min(self.fill_steps, 25 * batch_size),
            seed=seed,
        )
        self.config = config
        # env steps per profiled round: the trainer's update_every unless told otherwise (under
        # callgrind every step costs 6 dumps, so the CLI collects fewer steps there)
        self.collect_steps = config.update_every if collect_steps is None else int(collect_steps)
        self.runner = Runner(config)
        self.n_trainers = self.runner.n_trainers
        fill_buffer(self.runner.buffer, self.fill_steps, seed)
        self.runner.collect(config.episode_length, random_policy=True)  # env and action warm-up
        self._model = _ModelHook(self.runner.buffer) if model else None

    def attach(self, profiler: Any) -> None:
        self.runner.profiler = profiler

    def round(self) -> None:
        self.runner.collect(self.collect_steps)
        self.runner.update_round()
        if self._model is not None:
            self._model.flush(self.runner.profiler)

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.kind,
            "algo": self.config.algo,
            "n_trainers": self.n_trainers,
            "fill_steps": self.fill_steps,
            "buffer_bytes": self.runner.buffer.nbytes,
            "batch_size": self.batch_size,
            "update_every": self.config.update_every,
            "collect_steps_per_round": self.collect_steps,
            "formulation": self.config.formulation,
            "torch_threads": self.config.threads,
        }
