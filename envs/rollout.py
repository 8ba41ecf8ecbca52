"""Random-policy (or any-policy) rollouts that optionally fill a replay buffer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marlbuf.envs.mpe import MPEEnv

#: A policy maps the observations (list of float32 arrays, agent order) to actions (anything
#: :meth:`MPEEnv.step` accepts).
Policy = Callable[[list[np.ndarray]], Any]


@dataclass
class RolloutStats:
    """What :func:`rollout` did."""

    steps: int = 0  #: env steps (= joint transitions) taken
    episodes: int = 0  #: episodes finished
    episode_returns: list[np.ndarray] = field(default_factory=list)  #: per finished episode
    original_returns: list[np.ndarray] = field(default_factory=list)  #: same, original units


def rollout(
    env: MPEEnv,
    n_steps: int,
    policy: Policy | None = None,
    buffer: Any = None,
    rng: np.random.Generator | None = None,
) -> RolloutStats:
    """Run ``n_steps`` env steps from a fresh episode, resetting at every episode end.

    Parameters
    ----------
    env : MPEEnv
        From :func:`marlbuf.envs.make`; :meth:`MPEEnv.reset` is called first.
    n_steps : int
        Steps to take (episodes are 25 steps; the last one may be left unfinished).
    policy : callable, optional
        ``policy(obs) -> actions``. Default: uniform random actions from
        :meth:`MPEEnv.random_actions` (seeded by ``make(seed=...)``, or by ``rng``).
    buffer : MultiAgentReplayBuffer, optional
        Built from ``env.specs()``; receives every transition through ``add(obs, action,
        reward, next_obs, done)`` with ``done`` = terminations only, as the original trainers
        store it (truncation at step 25 is not a terminal state).
    rng : numpy Generator, optional
        For the default random policy, instead of the env's own generator.

    Returns
    -------
    RolloutStats
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 0:
        raise ValueError(f"n_steps must be a non-negative int; got n_steps={n_steps!r}")
    if buffer is not None and list(getattr(buffer, "agents", [])) != env.agents:
        raise ValueError(
            "buffer must be built from env.specs() (same agents, same order); got buffer "
            f"agents {getattr(buffer, 'agents', None)}, env agents {env.agents}"
        )
    stats = RolloutStats()
    obs = env.reset()
    for _ in range(int(n_steps)):
        actions = env.random_actions(rng) if policy is None else policy(obs)
        next_obs, reward, done, info = env.step(actions)
        if buffer is not None:
            buffer.add(obs, actions, reward, next_obs, done)
        stats.steps += 1
        if info["episode_over"]:
            stats.episodes += 1
            stats.episode_returns.append(info["episode_return"])
            stats.original_returns.append(info["original_return"])
            obs = env.reset()
        else:
            obs = next_obs
    return stats
