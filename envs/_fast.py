"""Vectorized physics, rewards and observations for mpe2's simple_spread and simple_tag.

mpe2 steps its world with Python loops over entity pairs (collision forces), recomputes
pairwise collision tests inside every agent's reward and builds each observation from per-entity
NumPy calls: O(E²) tiny NumPy calls per step. This module does the same arithmetic on whole
arrays, **operation for operation**, so the results are bit-identical to mpe2 1.1.1 (the test
suite steps both side by side and compares states, observations and rewards exactly):

* every elementwise operation is the one mpe2 applies, in the same order and precision
  (``np.logaddexp``, ``np.sqrt`` and the arithmetic ufuncs give the same bits on arrays as on
  scalars);
* forces are accumulated entity by entity in mpe2's pair order with ``np.add.accumulate``
  (sequential), never with ``np.sum`` (pairwise summation rounds differently);
* collision counts enter rewards as exact small integers, and the sums mpe2 builds in
  Python (coverage reward, prey boundary penalty) are still built in Python, in mpe2's order.

:class:`FastMPE` installs itself on one mpe2 ``raw_env`` (instance attributes on its world and
scenario). Only the configurations :func:`marlbuf.envs.make` builds are supported; anything else
(scripted, noisy or non-silent agents, movable landmarks, partial observability, curricula) is
refused at construction.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _sequential_sum(start: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """``start[i] + terms[i, 0] + terms[i, 1] + ...`` added left to right (as mpe2's loop does).

    Parameters
    ----------
    start : np.ndarray, shape (n, 2), float64
    terms : np.ndarray, shape (n, m, 2), float64

    Returns
    -------
    np.ndarray, shape (n, 2), float64
    """
    if terms.shape[1] == 0:
        return start
    stacked = np.concatenate([start[:, None, :], terms], axis=1)
    return np.add.accumulate(stacked, axis=1)[:, -1, :]


def _off_diagonal(square: np.ndarray) -> np.ndarray:
    """``(n, n, ...)`` -> ``(n, n - 1, ...)``: row i without column i, order kept."""
    n = square.shape[0]
    keep = ~np.eye(n, dtype=bool)
    return square[keep].reshape(n, n - 1, *square.shape[2:])


def _distances(from_pos: np.ndarray, to_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``delta[i, j] = from_pos[i] - to_pos[j]`` and its length, as mpe2 computes them
    (``np.sqrt(np.sum(np.square(delta)))``; a sum of two squares is the same either way)."""
    delta = from_pos[:, None, :] - to_pos[None, :, :]
    squared = np.square(delta)
    return delta, np.sqrt(squared[..., 0] + squared[..., 1])


class FastMPE:
    """Array-at-a-time world step, rewards and observations for one mpe2 ``raw_env``.

    Parameters
    ----------
    raw_env : mpe2 SimpleEnv
        A ``simple_spread_v3.raw_env`` or ``simple_tag_v3.raw_env`` built by
        :func:`marlbuf.envs.make`.
    name : {"cooperative_navigation", "predator_prey"}
    """

    def __init__(self, raw_env: Any, name: str) -> None:
        world = raw_env.world
        scenario = raw_env.scenario
        self._check_supported(world, scenario)
        self.name = name
        self.world = world
        self.agents = list(world.agents)
        self.landmarks = list(world.landmarks)
        self.entities = self.agents + self.landmarks
        self.n_agents = len(self.agents)
        self._agent_index = {id(agent): i for i, agent in enumerate(self.agents)}
        self.sizes = np.array([e.size for e in self.entities], dtype=np.float64)
        self.colliders = np.array(
            [i for i, e in enumerate(self.entities) if e.collide], dtype=np.int64
        )
        # which agents take part in collisions, and where they sit among the colliders
        self._agent_collider_rows = np.array(
            [k for k, i in enumerate(self.colliders) if i < self.n_agents], dtype=np.int64
        )
        self.masses = np.array([a.mass for a in self.agents], dtype=np.float64)
        self.max_speed = np.array(
            [np.inf if a.max_speed is None else a.max_speed for a in self.agents],
            dtype=np.float64,
        )
        self.generation = 0  # bumped by every world step and reset; reward caches key on it
        self._cache: dict[str, Any] = {}
        world.step = self.world_step
        if name == "cooperative_navigation":
            scenario.global_reward = self.spread_global_reward
            scenario.reward = self.spread_reward
        else:
            self.is_predator = np.array([a.adversary for a in self.agents], dtype=bool)
            self._boundary_landmarks = [lm.boundary for lm in self.landmarks]
            scenario.adversary_reward = self.tag_predator_reward
            scenario.agent_reward = self.tag_prey_reward

    @staticmethod
    def _check_supported(world: Any, scenario: Any) -> None:
        problems = []
        if any(a.action_callback is not None for a in world.agents):
            problems.append("scripted agents")
        if any(a.u_noise or a.c_noise for a in world.agents):
            problems.append("action/communication noise")
        if not all(a.movable and a.silent for a in world.agents):
            problems.append("immovable or communicating agents")
        if any(lm.movable for lm in world.landmarks):
            problems.append("movable landmarks")
        if world.dim_p != 2:
            problems.append(f"dim_p={world.dim_p}")
        if getattr(scenario, "curriculum", False):
            problems.append("curriculum")
        if getattr(scenario, "num_agent_neighbors", None) is not None or (
            getattr(scenario, "num_landmark_neighbors", None) is not None
        ):
            problems.append("partial observability")
        if problems:
            raise ValueError(
                "the vectorized MPE step supports the configurations make() builds; this "
                f"world has {', '.join(problems)}: use make(..., fast=False)"
            )

    # ----------------------------------------------------------------------------- physics
    def world_step(self) -> None:
        """mpe2's ``World.step`` (action forces, collision forces, integration, comm state)."""
        world = self.world
        n = self.n_agents
        # apply_action_force: u + noise, where noise is the float 0.0 for noiseless agents
        forces = np.array([a.action.u for a in self.agents], dtype=np.float64) + 0.0
        positions = np.array([e.state.p_pos for e in self.entities], dtype=np.float64)
        # apply_environment_force: every colliding pair (a < b) pushes a by +f and b by -f;
        # for entity e the contributions arrive in ascending order of the other entity j,
        # each equal to the force computed with delta = p_e - p_j
        collider_pos = positions[self.colliders]
        if len(self.colliders) > 1 and len(self._agent_collider_rows):
            delta, dist = _distances(collider_pos, collider_pos)
            np.fill_diagonal(dist, 1.0)  # self-pairs are skipped below; avoid 0/0
            dist_min = self.sizes[self.colliders][:, None] + self.sizes[self.colliders][None, :]
            k = world.contact_margin
            penetration = np.logaddexp(0, -(dist - dist_min) / k) * k
            pair_force = world.contact_force * delta / dist[..., None] * penetration[..., None]
            rows = self._agent_collider_rows
            per_agent = _off_diagonal(pair_force)[rows]  # (agents that collide, C - 1, 2)
            collider_agents = self.colliders[rows]
            forces[collider_agents] = _sequential_sum(forces[collider_agents], per_agent)
        # integrate_state (agents are the only movable entities)
        agent_pos = positions[:n]
        velocity = np.array([a.state.p_vel for a in self.agents], dtype=np.float64)
        new_pos = agent_pos + velocity * world.dt
        velocity = velocity * (1 - world.damping)
        velocity = velocity + (forces / self.masses[:, None]) * world.dt
        speed = np.sqrt(np.square(velocity[:, 0]) + np.square(velocity[:, 1]))
        too_fast = speed > self.max_speed
        if too_fast.any():
            velocity[too_fast] = (
                velocity[too_fast] / speed[too_fast, None] * self.max_speed[too_fast, None]
            )
        for i, agent in enumerate(self.agents):
            agent.state.p_pos = new_pos[i]
            agent.state.p_vel = velocity[i]
            agent.state.c = np.zeros(world.dim_c)  # update_agent_state for silent agents
        self.generation += 1

    def invalidate(self) -> None:
        """Forget cached rewards (call after changing the world outside ``world_step``)."""
        self.generation += 1

    def _cached(self, key: str, compute: Any) -> Any:
        entry = self._cache.get(key)
        if entry is None or entry[0] != self.generation:
            entry = (self.generation, compute())
            self._cache[key] = entry
        return entry[1]

    def _agent_positions(self) -> np.ndarray:
        return np.array([a.state.p_pos for a in self.agents], dtype=np.float64)

    def _collision_matrix(self) -> np.ndarray:
        """``(n_agents, n_agents)`` bool: mpe2's ``is_collision`` for every agent pair."""
        _, dist = _distances(self._agent_positions(), self._agent_positions())
        sizes = self.sizes[: self.n_agents]
        return dist < sizes[:, None] + sizes[None, :]

    # ----------------------------------------------------------------------------- rewards
    def spread_global_reward(self, world: Any) -> float:
        """simple_spread's coverage reward ``-sum_l min_a |p_a - p_l|`` (same Python sum)."""

        def compute() -> float:
            landmarks = np.array([lm.state.p_pos for lm in self.landmarks], dtype=np.float64)
            _, dist = _distances(self._agent_positions(), landmarks)  # (agents, landmarks)
            reward = 0
            for closest in dist.min(axis=0):
                reward -= closest
            return reward

        return self._cached("spread_global", compute)

    def spread_reward(self, agent: Any, world: Any) -> float:
        """simple_spread's local reward: minus one per *other* agent overlapping ``agent``."""
        if not agent.collide:
            return 0
        overlaps = self._cached("spread_overlaps", self._other_overlaps)
        return 0.0 - float(overlaps[self._agent_index[id(agent)]])

    def _other_overlaps(self) -> np.ndarray:
        # mpe2 tests every other agent, whether or not that one collides
        collide = self._collision_matrix()
        np.fill_diagonal(collide, False)
        return collide.sum(axis=1)

    def tag_predator_reward(self, agent: Any, world: Any) -> int:
        """simple_tag's predator reward: +10 per colliding (prey, predator) pair, shared."""
        if not agent.collide:
            return 0
        return self._cached("tag_predator", lambda: 10 * int(self._tag_contacts().sum()))

    def tag_prey_reward(self, agent: Any, world: Any) -> float:
        """simple_tag's prey reward: -10 per predator touching it, minus the boundary penalty."""
        reward: Any = 0
        if agent.collide:
            contacts = self._cached("tag_contacts", self._tag_contacts)
            reward -= 10 * int(contacts[:, self._agent_index[id(agent)]].sum())
        for p in range(world.dim_p):
            reward -= self._bound(abs(agent.state.p_pos[p]))
        return reward

    def _tag_contacts(self) -> np.ndarray:
        """``(n_agents, n_agents)`` bool: predator i touches prey j (mpe2 checks only the
        rewarded agent's ``collide`` flag, in the reward functions)."""
        collide = self._collision_matrix()
        return collide & self.is_predator[:, None] & ~self.is_predator[None, :]

    @staticmethod
    def _bound(x: Any) -> Any:
        # simple_tag's penalty for leaving the screen, same expressions and types
        if x < 0.9:
            return 0
        if x < 1.0:
            return (x - 0.9) * 10
        return min(np.exp(2 * x - 2), 10)

    # ----------------------------------------------------------------------------- observations
    def observations(self) -> list[np.ndarray]:
        """Every agent's observation (float32, agent order), as ``raw_env.observe`` gives it."""
        positions = self._agent_positions()
        velocity = np.array([a.state.p_vel for a in self.agents], dtype=np.float64)
        n = self.n_agents
        if self.name == "cooperative_navigation":
            landmarks = [lm.state.p_pos for lm in self.landmarks]
            comm = np.array([a.state.c for a in self.agents], dtype=np.float64)
            parts = [velocity, positions]
            parts.append(self._relative(np.array(landmarks, dtype=np.float64), positions))
            if n > 1:
                others = _off_diagonal(positions[None, :, :] - positions[:, None, :])
                parts.append(others.reshape(n, -1))
                parts.append(_off_diagonal(np.broadcast_to(comm, (n, n, comm.shape[1]))))
                parts[-1] = parts[-1].reshape(n, -1)
            table = np.concatenate(parts, axis=1).astype(np.float32)
            return list(table)
        visible = [
            lm.state.p_pos
            for lm, boundary in zip(self.landmarks, self._boundary_landmarks)
            if not boundary
        ]
        parts = [velocity, positions]
        parts.append(self._relative(np.array(visible, dtype=np.float64), positions))
        if n > 1:
            others = _off_diagonal(positions[None, :, :] - positions[:, None, :])
            parts.append(others.reshape(n, -1))
        table = np.concatenate(parts, axis=1)
        prey = ~self.is_predator
        prey_velocity = velocity[prey]  # every agent sees the velocities of the prey but itself
        out: list[np.ndarray] = []
        prey_rank = np.cumsum(prey) - 1
        for i in range(n):
            if prey[i]:
                seen = np.delete(prey_velocity, prey_rank[i], axis=0)
            else:
                seen = prey_velocity
            out.append(np.concatenate([table[i], seen.reshape(-1)]).astype(np.float32))
        return out

    @staticmethod
    def _relative(targets: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``(n, 2 * len(targets))``: ``targets[l] - positions[i]`` for every agent i."""
        if len(targets) == 0:
            return np.zeros((len(positions), 0))
        return (targets[None, :, :] - positions[:, None, :]).reshape(len(positions), -1)
