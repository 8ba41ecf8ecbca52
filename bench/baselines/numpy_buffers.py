"""The two baselines every buffer gain is quoted against.

* :class:`ListOfTuplesBuffer` — the openai/maddpg buffer the paper measured: a Python list of
  ``(obs, action, reward, next_obs, done)`` tuples per agent, sampled with a per-index Python
  loop that stacks the rows (``make_index`` + ``sample_index``).
* :class:`NumpyPerAgentBuffer` — a strong NumPy baseline: per agent, per field, a preallocated
  array, sampled with fancy indexing (what a careful user writes without marlbuf).

Both follow the MADDPG pattern in :func:`maddpg_round`-style loops in the suites: every trainer
draws its own index array and gathers every agent's fields at it.
"""

from __future__ import annotations

import random

import numpy as np

from marlbuf.spec import AgentSpec


class ListOfTuplesBuffer:
    """One agent's openai/maddpg-style replay buffer (list of tuples, ring overwrite)."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.maxsize = int(size)
        self.storage: list[tuple] = []
        self.next_idx = 0
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.storage)

    def add(self, obs_t, action, reward, obs_tp1, done) -> None:
        item = (obs_t, action, reward, obs_tp1, done)
        if self.next_idx >= len(self.storage):
            self.storage.append(item)
        else:
            self.storage[self.next_idx] = item
        self.next_idx = (self.next_idx + 1) % self.maxsize

    def make_index(self, batch_size: int) -> list[int]:
        """Uniform indices with replacement, drawn one by one as the original does."""
        return [self.rng.randint(0, len(self.storage) - 1) for _ in range(batch_size)]

    def sample_index(self, indices: list[int]) -> tuple[np.ndarray, ...]:
        """Stack the rows at ``indices``: per-index Python loop, then ``np.array`` per field."""
        obs, actions, rewards, next_obs, dones = [], [], [], [], []
        for i in indices:
            o, a, r, o2, d = self.storage[i]
            obs.append(np.asarray(o))
            actions.append(np.asarray(a))
            rewards.append(r)
            next_obs.append(np.asarray(o2))
            dones.append(d)
        return (
            np.array(obs),
            np.array(actions),
            np.array(rewards),
            np.array(next_obs),
            np.array(dones),
        )


class NumpyPerAgentBuffer:
    """Per agent, per field, a preallocated array; sampled with fancy indexing."""

    def __init__(self, specs: dict[str, AgentSpec], capacity: int, seed: int = 0) -> None:
        self.capacity = int(capacity)
        self.agents = list(specs)
        self.data = {
            "obs": {a: np.empty((capacity, *s.obs_shape), s.obs_dtype) for a, s in specs.items()},
            "action": {
                a: np.empty((capacity, *s.action_shape), s.action_dtype) for a, s in specs.items()
            },
            "reward": {a: np.empty(capacity, np.float32) for a in specs},
            "next_obs": {
                a: np.empty((capacity, *s.obs_shape), s.obs_dtype) for a, s in specs.items()
            },
            "done": {a: np.empty(capacity, np.float32) for a in specs},
        }
        self.size = 0
        self.cursor = 0
        self.rng = np.random.default_rng(seed)

    def extend(self, **fields: dict[str, np.ndarray]) -> None:
        steps = next(iter(fields["reward"].values())).shape[0]
        slots = (self.cursor + np.arange(steps)) % self.capacity
        for name, per_agent in fields.items():
            for agent, values in per_agent.items():
                self.data[name][agent][slots] = values
        self.cursor = int((self.cursor + steps) % self.capacity)
        self.size = min(self.size + steps, self.capacity)

    def sample_joint(self, batch_size: int) -> dict[str, dict[str, np.ndarray]]:
        """One trainer's joint batch: one index array, every agent's fields gathered."""
        idx = self.rng.integers(0, self.size, batch_size)
        return {
            name: {a: arr[idx] for a, arr in per_agent.items()}
            for name, per_agent in self.data.items()
        }
