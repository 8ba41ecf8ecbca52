"""The paper's MADDPG workloads as data: agent counts and observation sizes per environment.

Kept free of mpe2 so that ``marlbuf memory``, the benchmarks and the profiler run with only the
core installed; the environments (:mod:`marlbuf.envs`) take their sizes from here too. The
numbers match MPE's observation layout (tests check them against the real environments):

* cooperative navigation (``simple_spread``), N agents and N landmarks: every agent sees
  ``6N`` floats (own velocity and position, N landmarks, N-1 other positions, N-1 comm channels
  of 2) — 18/36/72/144 at N = 3/6/12/24.
* predator-prey (``simple_tag``), N predators, M prey, L landmarks: own velocity and position
  (4), landmarks (2L), other agents' positions (2(N+M-1)), prey velocities (2M for a predator,
  2(M-1) for a prey) — 16/14 at 3+1+2, 98/96 at 24+8+8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marlbuf.spec import AgentSpec

ACTION_DIM = 5  # MPE continuous / Gumbel-softmax action vector


def predator_prey_sizes(n_predators: int) -> tuple[int, int]:
    """Paper defaults: M = max(1, N // 3) prey and L = max(2, N // 3) landmarks."""
    return max(1, n_predators // 3), max(2, n_predators // 3)


@dataclass(frozen=True)
class Workload:
    """One environment configuration of the MADDPG sampling workload."""

    env: str  # "cooperative_navigation" or "predator_prey"
    n: int  # agents (cooperative navigation) or predators (predator-prey)

    @property
    def label(self) -> str:
        if self.env == "cooperative_navigation":
            return f"CN-{self.n}"
        prey, _ = predator_prey_sizes(self.n)
        return f"PP-{self.n}+{prey}"

    def obs_dims(self) -> list[int]:
        """Observation size of every trained agent, in agent order (predators first)."""
        if self.env == "cooperative_navigation":
            return [6 * self.n] * self.n
        prey, landmarks = predator_prey_sizes(self.n)
        common = 4 + 2 * landmarks + 2 * (self.n + prey - 1)
        return [common + 2 * prey] * self.n + [common + 2 * (prey - 1)] * prey

    def specs(self) -> dict[str, AgentSpec]:
        """Buffer specs: one per trained agent (prey are trained too in predator-prey)."""
        return {
            f"agent_{i}": AgentSpec(obs_shape=(d,), action_shape=(ACTION_DIM,))
            for i, d in enumerate(self.obs_dims())
        }

    @property
    def n_trainers(self) -> int:
        return len(self.obs_dims())


def random_steps(
    specs: dict[str, AgentSpec], steps: int, rng: np.random.Generator
) -> dict[str, dict[str, np.ndarray]]:
    """``steps`` timesteps of random data for ``MultiAgentReplayBuffer.extend``."""
    return {
        "obs": {a: rng.random((steps, *s.obs_shape), np.float32) for a, s in specs.items()},
        "action": {a: rng.random((steps, *s.action_shape), np.float32) for a, s in specs.items()},
        "reward": {a: rng.random(steps, np.float32) for a in specs},
        "next_obs": {a: rng.random((steps, *s.obs_shape), np.float32) for a, s in specs.items()},
        "done": {a: (rng.random(steps) < 0.04).astype(np.float32) for a in specs},
    }


def episode_steps(
    specs: dict[str, AgentSpec],
    steps: int,
    rng: np.random.Generator,
    episode_length: int = 25,
    first: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
    """Like :func:`random_steps`, but shaped like an environment's stream: every step's
    ``next_obs`` is the next step's ``obs`` except at the end of each ``episode_length``-step
    episode (truncation, as MPE), where the next obs is a reset. ``first`` is the global step
    number of the first step (so consecutive calls continue the episodes). Values are
    representable in float16, so float32 and float16 storage hold the same data.
    """
    chain = {
        a: rng.random((steps + 1, *s.obs_shape), np.float32).astype(np.float16).astype(np.float32)
        for a, s in specs.items()
    }
    ends = (first + np.arange(steps) + 1) % episode_length == 0
    next_obs = {a: c[1:].copy() for a, c in chain.items()}
    for a, nxt in next_obs.items():  # at an episode end the next obs is the terminal one, and
        nxt[ends] = (
            rng.random((int(ends.sum()), *specs[a].obs_shape), np.float32)
            .astype(np.float16)
            .astype(np.float32)
        )  # the following step starts from a reset (chain[t + 1])
    return {
        "obs": {a: c[:-1] for a, c in chain.items()},
        "action": {a: rng.random((steps, *s.action_shape), np.float32) for a, s in specs.items()},
        "reward": {a: rng.random(steps, np.float32) for a in specs},
        "next_obs": next_obs,
        "done": {a: ends.astype(np.float32) for a in specs},
    }


#: the two kinds of data the default format is measured on: ``"streams"`` (MPE-like: every
#: step's next_obs is the following step's obs, except at an episode end every 25 steps) and
#: ``"independent"`` (next_obs unrelated to the following obs, as in a shuffled dataset)
DATA_KINDS = ("streams", "independent")


def steps_of_kind(
    kind: str,
    specs: dict[str, AgentSpec],
    steps: int,
    rng: np.random.Generator,
    first: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
    """``steps`` timesteps of one of the :data:`DATA_KINDS` for ``extend``: streams from
    :func:`episode_steps` (``first`` continues their episodes), independent transitions from
    :func:`random_steps`."""
    if kind == "streams":
        return episode_steps(specs, steps, rng, first=first)
    if kind == "independent":
        return random_steps(specs, steps, rng)
    raise ValueError(f"kind must be one of {DATA_KINDS}; got kind={kind!r}")


PAPER_WORKLOADS = [
    Workload("cooperative_navigation", 3),
    Workload("cooperative_navigation", 6),
    Workload("cooperative_navigation", 12),
    Workload("cooperative_navigation", 24),
    Workload("predator_prey", 3),
    Workload("predator_prey", 24),
]
