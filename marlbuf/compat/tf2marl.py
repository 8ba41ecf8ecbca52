"""tf2multiagentrl's ``EfficientReplayBuffer`` / ``PrioritizedReplayBuffer`` API on marlbuf.

In tf2multiagentrl every agent owns one of these buffers; each holds *all* agents' observations
and actions (the centralized critic's input) plus that agent's own reward, and samples with its
own indices. The adapters keep that constructor and return values (lists of per-agent float32
arrays, float32 reward and done) and store each timestep as one interleaved row, so a sample is
one gather of wide rows instead of 3N fancy-indexing copies.

Differences from the original, on purpose:

* ``len(buf)`` counts every stored transition. The original reports one fewer until the buffer
  is full, so it never samples the newest transition.
* The prioritized buffer allocates each observation array once (the original allocates the
  observation arrays a second time and never uses the copies).
* Randomness comes from ``seed`` (a NumPy ``Generator``), not the global ``np.random`` /
  ``random`` state.
* Returned arrays are views into one freshly gathered block per ``sample`` call (writeable,
  not shared with any other call) rather than separately allocated arrays.

Examples
--------
>>> import numpy as np
>>> from marlbuf.compat.tf2marl import EfficientReplayBuffer
>>> buf = EfficientReplayBuffer(1000, 2, np.array([[4], [4]]), [(2,), (2,)], seed=0)
>>> for step in range(20):
...     buf.add([np.zeros(4), np.ones(4)], [np.zeros(2), np.ones(2)], 0.5, [np.ones(4)] * 2, 0.0)
>>> obs_n, acts_n, rew, next_obs_n, done = buf.sample(8)
>>> len(obs_n), obs_n[1].shape, obs_n[1].dtype, rew.shape, len(buf)
(2, (8, 4), dtype('float32'), (8,), 20)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from marlbuf.batch import Batch
from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.compat import NotEnoughDataError
from marlbuf.compat._common import check_n_agents, check_shape_list, check_size
from marlbuf.prioritized import parse_beta
from marlbuf.samplers import Prioritized, Sampler, Uniform
from marlbuf.spec import AgentSpec

#: what ``sample`` returns: (obs_n, acts_n, rew, next_obs_n, done)
Sample = tuple[list[np.ndarray], list[np.ndarray], np.ndarray, list[np.ndarray], np.ndarray]
#: what the prioritized ``sample`` returns: (obs_n, acts_n, rew, next_obs_n, done, weights, indices)
PrioritizedSample = tuple[
    list[np.ndarray],
    list[np.ndarray],
    np.ndarray,
    list[np.ndarray],
    np.ndarray,
    np.ndarray,
    list[int],
]


def _scalar(name: str, value: Any) -> Any:
    if np.ndim(value) != 0:
        raise ValueError(
            f"{name} must be one scalar (a tf2marl buffer stores its own agent's {name}); "
            f"got shape {np.shape(value)}"
        )
    return value


class EfficientReplayBuffer:
    """tf2multiagentrl's ``EfficientReplayBuffer(size, n_agents, obs_shape_n, act_shape_n)``.

    Parameters
    ----------
    size : int or float
        Capacity in timesteps.
    n_agents : int
        Agents whose observations and actions each transition holds.
    obs_shape_n, act_shape_n : sequence of shapes
        Per agent, e.g. ``[(18,), (18,), (18,)]`` or tf2marl's ``np.array([[18], [18], [18]])``.
    sampler : Sampler, optional
        Index sampler (default ``Uniform(order="random")``: with replacement, in draw order, as
        the original).
    seed : int or numpy Generator, optional
        Source of randomness.
    layout : {"interleaved", "agent_major"}
        Storage layout.

    Notes
    -----
    Everything is stored as float32, as in the original.
    """

    def __init__(
        self,
        size: Any,
        n_agents: int,
        obs_shape_n: Sequence[Any],
        act_shape_n: Sequence[Any],
        *,
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
        layout: str = "interleaved",
        n_trainers: int = 1,
    ) -> None:
        n_agents = check_n_agents(n_agents)
        obs_shapes = check_shape_list("obs_shape_n", obs_shape_n, n_agents)
        act_shapes = check_shape_list("act_shape_n", act_shape_n, n_agents)
        specs = {
            f"agent_{i}": AgentSpec(obs_shape=o, action_shape=a)
            for i, (o, a) in enumerate(zip(obs_shapes, act_shapes))
        }
        self._n_agents = n_agents
        self._agents = list(specs)
        self.buffer = MultiAgentReplayBuffer(
            specs,
            check_size(size),
            layout=layout,
            sampler=Uniform(order="random") if sampler is None else sampler,
            seed=seed,
            n_trainers=n_trainers,
        )
        #: the batch of the last ``sample`` call (its ``indices`` are the slots drawn)
        self.last_batch: Batch | None = None

    def __len__(self) -> int:
        return len(self.buffer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.buffer.capacity}, n_agents={self._n_agents}, "
            f"len={len(self)}, sampler={self.buffer.sampler!r})"
        )

    def add(self, obs_t: Any, action: Any, reward: Any, obs_tp1: Any, done: Any) -> None:
        """Store one timestep.

        Parameters
        ----------
        obs_t, obs_tp1 : sequence of array_like
            One observation per agent.
        action : sequence of array_like
            One action per agent.
        reward, done : float
            This buffer's agent's reward and the episode's done flag.
        """
        reward = _scalar("reward", reward)
        done = _scalar("done", done)
        # every agent's reward/done slot holds the same scalar; samples read agent_0's
        self.buffer.add(
            obs=obs_t,
            action=action,
            reward=[reward] * self._n_agents,
            next_obs=obs_tp1,
            done=[done] * self._n_agents,
        )

    def _unpack(self, batch: Batch) -> Sample:
        first = self._agents[0]
        return (
            [batch.obs[a] for a in self._agents],
            [batch.action[a] for a in self._agents],
            batch.reward[first],
            [batch.next_obs[a] for a in self._agents],
            batch.done[first],
        )

    def _check_enough(self, batch_size: Any) -> None:
        if (
            isinstance(batch_size, (int, np.integer))
            and not isinstance(batch_size, bool)
            and batch_size > len(self)
        ):
            raise NotEnoughDataError(
                f"batch_size={batch_size} is more than the {len(self)} transitions stored "
                "(tf2marl refuses such batches too); add more data or sample fewer"
            )

    def sample(self, batch_size: int) -> Sample:
        """Draw ``batch_size`` transitions.

        Returns
        -------
        obs_n : list of ndarray, each (B, *obs_shape) float32
        acts_n : list of ndarray, each (B, *act_shape) float32
        rew : ndarray, shape (B,), float32
        next_obs_n : list of ndarray, each (B, *obs_shape) float32
        done : ndarray, shape (B,), float32
        """
        self._check_enough(batch_size)
        self.last_batch = self.buffer.sample(batch_size)
        return self._unpack(self.last_batch)

    def sample_index(self, indices: Any) -> Sample:
        """The transitions at explicit slot ``indices`` (as ``sample`` returns them)."""
        return self._unpack(self.buffer.gather(indices))


class PrioritizedReplayBuffer(EfficientReplayBuffer):
    """tf2multiagentrl's ``PrioritizedReplayBuffer(size, n_agents, obs_shape_n, act_shape_n,
    alpha)`` on marlbuf's prioritized sampler (float64 sum-tree, Numba kernels).

    Slots are drawn with probability ``p_i^alpha / sum_k p_k^alpha`` (with replacement); new
    slots get the largest priority seen so far (initially 1); ``update_priorities`` takes the
    priorities themselves (tf2marl passes ``td_loss + eps``), which must be positive.

    Parameters
    ----------
    size, n_agents, obs_shape_n, act_shape_n
        As :class:`EfficientReplayBuffer`.
    alpha : float
        Priority exponent, ``>= 0``.
    weights : {"original", "batch"}, default "original"
        ``"original"``: importance weights ``(N P(i))^-beta`` divided by the largest weight any
        stored slot could get (that of the smallest priority), as tf2marl and openai/baselines
        do. ``"batch"``: divided by the batch's largest weight (marlbuf's convention).
    seed, layout
        As :class:`EfficientReplayBuffer`.
    """

    WEIGHT_MODES = ("original", "batch")

    def __init__(
        self,
        size: Any,
        n_agents: int,
        obs_shape_n: Sequence[Any],
        act_shape_n: Sequence[Any],
        alpha: float,
        *,
        weights: str = "original",
        seed: int | np.random.Generator | None = None,
        layout: str = "interleaved",
    ) -> None:
        if weights not in self.WEIGHT_MODES:
            raise ValueError(f"weights must be one of {self.WEIGHT_MODES}; got weights={weights!r}")
        # eps=0 and priority="given": the tree holds exactly the priorities the trainer passes
        self.sampler = Prioritized(alpha=alpha, beta=0.0, eps=0.0, priority="given")
        super().__init__(
            size,
            n_agents,
            obs_shape_n,
            act_shape_n,
            sampler=self.sampler,
            seed=seed,
            layout=layout,
        )
        self.alpha = self.sampler.alpha
        self.weights = weights
        self._last_indices: list[int] | None = None
        self._last_generations: np.ndarray | None = None

    def sample(self, batch_size: int, beta: float = 0) -> PrioritizedSample:  # type: ignore[override]
        """Draw ``batch_size`` transitions in proportion to their priorities.

        Returns
        -------
        obs_n, acts_n, rew, next_obs_n, done
            As :meth:`EfficientReplayBuffer.sample`.
        weights : ndarray, shape (B,), float32
            Importance weights, at most 1.
        indices : list of int
            The slots drawn; pass them back to :meth:`update_priorities`.
        """
        self.sampler.beta = parse_beta(beta)
        batch = self.buffer.sample(batch_size)
        self.last_batch = batch
        assert batch.weights is not None  # a Prioritized sampler always returns weights
        weights = batch.weights
        if self.weights == "original":
            # priority ** alpha per slot (a host buffer: host trees)
            leaves = np.asarray(self.sampler.trees.leaves(0)[: len(self)])
            ratio = leaves[batch.indices] / leaves.min()
            weights = (ratio ** -self.sampler.beta_for(0)).astype(np.float32)
        indices: list[int] = batch.indices.tolist()
        self._last_indices, self._last_generations = indices, batch.generations
        return (*self._unpack(batch), weights, indices)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of the slots ``indices`` (a list or 1-D int array, as returned by
        :meth:`sample`) to ``priorities`` (same length, positive, finite).

        Updates for slots overwritten since they were sampled are dropped.
        """
        values = np.asarray(priorities)
        if np.ndim(indices) != 1 or values.shape != (len(indices),):
            raise ValueError(
                f"priorities must have one value per index ({np.shape(indices)}); got shape "
                f"{values.shape}"
            )
        if values.dtype.kind in "iuf" and not (values > 0).all():
            bad = values[~(values > 0)][:5].tolist()
            raise ValueError(
                f"priorities must be positive (tf2marl passes td_loss + eps); got {bad}"
            )
        if indices is self._last_indices:
            generations = self._last_generations  # the latest sample: judged by its draw
        else:
            # other indices set the priorities of their slots as they are now, as the original
            # does (it keeps no record of draws); out-of-range ones are refused by the buffer
            idx = np.asarray(indices)
            inside = idx.dtype.kind in "iu" and (idx.size == 0 or 0 <= idx.min() <= idx.max())
            inside = inside and (idx.size == 0 or int(idx.max()) < len(self.buffer))
            generations = self.buffer.write_generation[idx] if inside else None
        self.buffer.update_priorities(indices, values, trainer=0, generations=generations)


__all__ = ["EfficientReplayBuffer", "PrioritizedReplayBuffer"]
