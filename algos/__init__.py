"""MADDPG and MATD3 trainers on any marlbuf layout and sampler (extra ``[algos]``).

::

    from marlbuf.algos import Runner, TrainConfig

    cfg = TrainConfig(algo="maddpg", env="cooperative_navigation", n_agents=3)
    runner = Runner(cfg)                 # env, MultiAgentReplayBuffer, learner
    records = runner.train(episodes=100)  # one record per episode

The learners come in two formulations with the same numbers: :class:`LoopLearner` (one set of
tensors per agent, the readable reference) and :class:`BatchedLearner` (weights stacked over
agents, one ``baddbmm`` per layer). See ``docs/training.md``.

The names are imported from their modules when first used, so that ``marlbuf train --help``
and :class:`TrainConfig` need no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: the public names of the package -> the module that defines each
_EXPORTS = {
    "PHASES": "marlbuf.algos.runner",
    "BatchedLearner": "marlbuf.algos.maddpg",
    "EpisodeRecord": "marlbuf.algos.runner",
    "Learner": "marlbuf.algos.maddpg",
    "LoopLearner": "marlbuf.algos.maddpg",
    "NullProfiler": "marlbuf.algos.runner",
    "PhaseTimer": "marlbuf.algos.runner",
    "Runner": "marlbuf.algos.runner",
    "TrainConfig": "marlbuf.algos.config",
    "UpdateStats": "marlbuf.algos.maddpg",
    "build_sampler": "marlbuf.algos.runner",
    "make_env": "marlbuf.algos.runner",
    "make_learner": "marlbuf.algos.maddpg",
}

if TYPE_CHECKING:
    from marlbuf.algos.config import TrainConfig
    from marlbuf.algos.maddpg import (
        BatchedLearner,
        Learner,
        LoopLearner,
        UpdateStats,
        make_learner,
    )
    from marlbuf.algos.runner import (
        PHASES,
        EpisodeRecord,
        NullProfiler,
        PhaseTimer,
        Runner,
        build_sampler,
        make_env,
    )


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marlbuf.algos' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
