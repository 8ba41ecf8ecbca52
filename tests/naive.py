"""Slow, obviously-correct NumPy references for every kernel and for buffer semantics.

Each function here is the readable twin of a Numba kernel or of a buffer behaviour; tests compare
the fast path against it. Sections are headed by the issue that added them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# ------------------------------------------------------------------ drop-in adapters (issue 4)
# Re-statements of the ORIGINAL buffers' semantics (not their code), to drive next to the
# adapters with the original trainers' call sequences.


class OpenAIListBuffer:
    """openai/maddpg's per-agent buffer: a list of ``(obs, act, rew, obs_next, done)`` tuples
    used as a ring; ``sample_index`` stacks the items at the indices with ``np.array``."""

    def __init__(self, size: float) -> None:
        self.items: list[tuple[Any, ...]] = []
        self.capacity = int(size)
        self.next_slot = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, obs: Any, act: Any, rew: Any, obs_next: Any, done: Any) -> None:
        item = (obs, act, rew, obs_next, done)
        if self.next_slot == len(self.items):
            self.items.append(item)  # still filling
        else:
            self.items[self.next_slot] = item  # overwrite the oldest
        self.next_slot = (self.next_slot + 1) % self.capacity

    def make_index(self, batch_size: int, rng: np.random.Generator) -> list[int]:
        return [int(rng.integers(0, len(self.items))) for _ in range(batch_size)]

    def latest_index_unshuffled(self, batch_size: int) -> list[int]:
        return [(self.next_slot - 1 - i) % self.capacity for i in range(batch_size)]

    def sample_index(self, idxes: Any) -> tuple[np.ndarray, ...]:
        columns: list[list[Any]] = [[], [], [], [], []]
        for i in idxes:
            for column, value in zip(columns, self.items[i]):
                column.append(value)
        return tuple(np.array(column) for column in columns)

    def collect(self) -> tuple[np.ndarray, ...]:
        return self.sample_index(range(len(self.items)))


class Tf2marlNaiveBuffer:
    """tf2multiagentrl's ``EfficientReplayBuffer``: per-agent float32 arrays for obs, actions and
    next obs, one float32 reward and done per slot; the length counts every stored slot (the
    original's off-by-one while filling is *not* reproduced)."""

    def __init__(self, size: int, obs_dims: list[int], act_dims: list[int]) -> None:
        self.capacity = size
        self.obs = [np.zeros((size, d), np.float32) for d in obs_dims]
        self.acts = [np.zeros((size, d), np.float32) for d in act_dims]
        self.next_obs = [np.zeros((size, d), np.float32) for d in obs_dims]
        self.reward = np.zeros(size, np.float32)
        self.done = np.zeros(size, np.float32)
        self.next_slot = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs_n: Any, act_n: Any, reward: float, next_obs_n: Any, done: float) -> None:
        slot = self.next_slot
        for agent in range(len(self.obs)):
            self.obs[agent][slot] = obs_n[agent]
            self.acts[agent][slot] = act_n[agent]
            self.next_obs[agent][slot] = next_obs_n[agent]
        self.reward[slot] = reward
        self.done[slot] = done
        self.next_slot = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample_index(self, indices: Any) -> tuple[Any, ...]:
        idx = np.asarray(indices)
        return (
            [o[idx] for o in self.obs],
            [a[idx].copy() for a in self.acts],
            self.reward[idx],
            [o[idx] for o in self.next_obs],
            self.done[idx],
        )
