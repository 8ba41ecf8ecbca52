"""The environment half of the MADDPG consumers: mpe2's ``simple_spread`` through its
PettingZoo parallel API, unmodified.

``env.step(actions)`` returns dicts keyed by agent: observations (float32 arrays), rewards (a
``collections.defaultdict`` of Python floats), terminations and truncations (bools). The loops
hand exactly these to their buffers' write paths, as PettingZoo codebases do; an episode ends
when ``env.agents`` is empty (every agent truncated at step 25), and the loop resets.

:class:`EnvLoop` times the consumer's buffer and learner calls separately (``timers``:
``write``, the write path; ``sample``, a trainer's sampling call up to the tensors its update
reads; ``update``, the networks' forward and backward passes and optimiser steps), so that the
drop-in suite can report the buffer's own time and the time its batches add to the update.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np


def parallel_env(n_agents: int, continuous: bool = True) -> Any:
    """mpe2's cooperative navigation (``simple_spread_v3``) for ``n_agents`` agents, 25-step
    episodes, as a PettingZoo parallel env."""
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=n_agents, max_cycles=25, continuous_actions=continuous)


def env_dims(env: Any) -> tuple[list[str], list[int], list[int]]:
    """The agents (in order), their observation sizes and action sizes."""
    agents = list(env.possible_agents)
    obs = [int(env.observation_space(a).shape[0]) for a in agents]
    spaces = [env.action_space(a) for a in agents]
    act = [int(space.shape[0]) if space.shape else int(space.n) for space in spaces]
    return agents, obs, act


class EnvLoop:
    """Steps a PettingZoo parallel env and hands its output to the consumer's write path.

    Subclasses define ``select_actions(obs) -> {agent: action}``, ``store(obs, actions,
    rewards, next_obs, terminations)``, ``stored_steps()`` and ``update_round()``.

    Parameters
    ----------
    env : PettingZoo ParallelEnv
    seed : int
        The first ``reset``'s seed (later resets continue the env's generator).
    update_every, warmup : int
        Environment steps between update rounds, and stored steps before the first.
    """

    def __init__(self, env: Any, seed: int, update_every: int, warmup: int) -> None:
        self.env = env
        self.agents, self.obs_dims, self.action_dims = env_dims(env)
        self.n_agents = len(self.agents)
        self.update_every, self.warmup = update_every, warmup
        self.obs, _ = env.reset(seed=seed)
        self.steps = 0
        self.updates = 0
        self.episode_returns: list[float] = []
        self._return = 0.0
        #: seconds spent in the write path, in sampling calls and in updates
        self.timers = {"write": 0.0, "sample": 0.0, "update": 0.0}

    def select_actions(self, obs: dict[str, np.ndarray]) -> dict[str, Any]:
        raise NotImplementedError

    def store(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, dones: Any) -> None:
        raise NotImplementedError

    def stored_steps(self) -> int:
        raise NotImplementedError

    def update_round(self) -> None:
        raise NotImplementedError

    def env_step(self) -> None:
        """One environment step, its output stored unmodified; a reset when it ended."""
        actions = self.select_actions(self.obs)
        next_obs, rewards, terminations, _, _ = self.env.step(actions)
        start = perf_counter()
        self.store(self.obs, actions, rewards, next_obs, terminations)
        self.timers["write"] += perf_counter() - start
        self._return += sum(rewards.values())
        self.obs = next_obs
        if not self.env.agents:  # every agent truncated: the episode is over
            self.episode_returns.append(self._return)
            self._return = 0.0
            self.obs, _ = self.env.reset()
        self.steps += 1

    def run_steps(self, n_steps: int) -> None:
        """``n_steps`` environment steps with an update round every ``update_every`` steps."""
        for _ in range(n_steps):
            self.env_step()
            if self.steps % self.update_every == 0 and self.stored_steps() >= self.warmup:
                self.update_round()


__all__ = ["EnvLoop", "env_dims", "parallel_env"]
