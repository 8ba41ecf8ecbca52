"""MADDPG and MATD3 trainers on any marlbuf layout and sampler (extra ``[algos]``).

::

    from marlbuf.algos import Runner, TrainConfig

    cfg = TrainConfig(algo="maddpg", env="cooperative_navigation", n_agents=3)
    runner = Runner(cfg)                 # env, MultiAgentReplayBuffer, learner
    records = runner.train(episodes=100)  # one record per episode

The learners come in two formulations with the same numbers: :class:`LoopLearner` (one set of
tensors per agent, the readable reference) and :class:`BatchedLearner` (weights stacked over
agents, one ``baddbmm`` per layer). See ``docs/training.md``.
"""

from marlbuf.algos.config import TrainConfig
from marlbuf.algos.maddpg import BatchedLearner, Learner, LoopLearner, UpdateStats, make_learner
from marlbuf.algos.runner import (
    PHASES,
    EpisodeRecord,
    NullProfiler,
    PhaseTimer,
    Runner,
    build_sampler,
    make_env,
)

__all__ = [
    "PHASES",
    "BatchedLearner",
    "EpisodeRecord",
    "Learner",
    "LoopLearner",
    "NullProfiler",
    "PhaseTimer",
    "Runner",
    "TrainConfig",
    "UpdateStats",
    "build_sampler",
    "make_env",
    "make_learner",
]
