"""Whole stored episodes for episode-based learners: :class:`Episodes`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marlbuf._kernels import find_prefix
from marlbuf.prioritized import LinearBeta, PriorityTrees
from marlbuf.samplers.base import (
    Sampler,
    check_flags,
    distinct,
    distinct_from_tree,
    positive_int,
)
from marlbuf.samplers.priority import (
    HoldsPriorities,
    PriorityState,
    importance_weights,
    td_per_index,
)

if TYPE_CHECKING:
    from marlbuf.writer import EpisodeIndex


class Episodes(HoldsPriorities, Sampler):
    """Whole stored episodes from their first step, for episode-based learners (QMIX, VDN,
    MAPPO with recurrent agents, as EPyMARL's episode buffer serves them).

    A batch holds ``B`` *complete* episodes: episodes that have ended (every agent done, a step
    written with ``truncated=True``, or a stream break, see :class:`marlbuf.writer.EpisodeIndex`)
    and whose every step is still stored. An episode the ring has overwritten in part is never
    drawn, nor one still being written. Episodes are drawn uniformly, without replacement by
    default (``B`` distinct episodes), or (``prioritized=True``) in proportion to
    ``priority ** alpha`` with importance weights, as in :class:`Prioritized` (new episodes get
    the trainer's running maximum, initially 1; one sum-tree per trainer).
    ``buffer.complete_episodes`` counts the episodes a draw chooses from.

    Row ``b`` of a batch holds episode ``b``'s steps ``0 .. L - 1`` and zeros past its end:
    ``L`` is ``max_length``, or the longest episode of the batch (``max_length=None``).
    Batches are :class:`marlbuf.batch.EpisodeBatch`: the per-step arrays have the leading axes
    ``(B, L)``; ``mask`` (also ``filled``) ``(B, L)`` bool, ``lengths`` ``(B,)``, ``slots``
    ``(B, L)``, and ``indices`` (the first steps' slots) for ``update_priorities``.

    Parameters
    ----------
    max_length : int or None, default None
        Steps per row (``>= 1``). ``None``: the batch's longest episode. An episode longer
        than ``max_length`` is cut to its first ``max_length`` steps (its ``lengths`` entry
        keeps the full length).
    replace : bool, default False
        Draw with replacement. ``False``: ``B`` distinct episodes (``B`` must not exceed the
        complete episodes stored); with ``prioritized=True`` the batch is drawn by successive
        draws in proportion to priority among the episodes not yet in it (duplicates of
        independent draws are redrawn), and the weights are those of independent draws.
    prioritized : bool, default False
        Draw by priority and return importance weights.
    alpha, beta, eps
        As in :class:`Prioritized` (``beta`` may be a :class:`marlbuf.prioritized.LinearBeta`).

    Examples
    --------
    >>> import numpy as np
    >>> from marlbuf import AgentSpec, MultiAgentReplayBuffer
    >>> specs = {f"agent_{i}": AgentSpec(obs_shape=(4,), action_shape=(2,)) for i in range(2)}
    >>> buf = MultiAgentReplayBuffer(specs, 100, sampler=Episodes(), seed=0)
    >>> for length in (3, 5, 4):  # three episodes, each one extend ending with truncated
    ...     z = lambda *s: {a: np.zeros((length, *s), np.float32) for a in specs}
    ...     end = np.arange(length) == length - 1
    ...     buf.extend(obs=z(4), action=z(2), reward=z(), next_obs=z(4), done=z(), truncated=end)
    >>> batch = buf.sample(2)
    >>> buf.complete_episodes, batch.obs["agent_0"].shape[0], batch.mask.shape[1] <= 5
    (3, 2, True)
    """

    batch_kind: ClassVar[str] = "episodes"
    needs_episodes: ClassVar[bool] = True

    def __init__(
        self,
        max_length: int | None = None,
        replace: bool = False,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float | LinearBeta | dict[str, Any] = 0.4,
        eps: float = 1e-6,
    ) -> None:
        self.max_length = None if max_length is None else positive_int("max_length", max_length)
        check_flags(replace=replace, prioritized=prioritized)
        self.replace = bool(replace)
        self.prioritized = bool(prioritized)
        self.weighted = self.prioritized
        self.priority_state = PriorityState(alpha, beta, eps, what="episode")
        self.episodes: EpisodeIndex | None = None

    def bind(self, capacity: int, n_trainers: int) -> None:
        if self.max_length is not None and self.max_length > capacity:
            raise ValueError(
                f"max_length={self.max_length} is longer than the buffer's capacity={capacity}; "
                "use a larger buffer or a shorter max_length"
            )
        super().bind(capacity, n_trainers)
        if self.prioritized:
            self.priority_state.bind(self.capacity, self.n_trainers)

    def steps_per_row(self) -> int | None:
        """``max_length`` (``None``: each batch is as long as its longest episode)."""
        return self.max_length

    @property
    def trees(self) -> PriorityTrees | None:
        """The priority trees (prioritized episodes), else ``None``."""
        return self.priority_state.host_trees() if self.prioritized else None

    def attach_episodes(self, episodes: EpisodeIndex) -> None:
        """Read the buffer's episode index (called by the buffer at construction); a
        prioritized sampler also follows the episodes that become complete."""
        self.episodes = episodes
        if self.prioritized:
            episodes.listener = self._on_complete

    def _index(self) -> EpisodeIndex:
        if self.episodes is None:
            raise RuntimeError("Episodes is used by a buffer that keeps no episode index")
        return self.episodes

    def _on_complete(self, first_slots: np.ndarray | None) -> None:
        """New complete episodes enter every tree with its running maximum; ``None``: the set
        was rebuilt (a state was loaded), so every other leaf is set to 0."""
        if not self.prioritized:
            return
        state = self.priority_state
        if first_slots is not None:
            state.trees.fill_new(first_slots)
            return
        state.reset_leaves(self._index().complete_position >= 0)

    def on_write(self, slots: np.ndarray) -> None:
        if not self.prioritized:
            return
        # written slots hold no episode start any more, unless one completed in this write
        cleared = slots[self._index().complete_position[slots] < 0]
        if cleared.shape[0]:
            self.priority_state.clear(cleared)

    def check_batch_size(self, batch_size: int) -> int:
        return positive_int("batch_size", batch_size)

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        index = self._index()
        stored = index.n_complete
        if stored == 0:
            raise ValueError(
                f"no complete episode is stored, so there is nothing to sample "
                f"(batch_size={batch_size}): an episode counts once it ends (every agent done "
                "or truncated=True on its last step) and while its first step is stored"
            )
        if not self.replace and batch_size > stored:
            raise ValueError(
                f"batch_size={batch_size} distinct episodes (replace=False) but the buffer "
                f"holds {stored} complete episodes; add more episodes, sample fewer, or use "
                "Episodes(replace=True)"
            )
        if not self.prioritized:
            positions = rng.integers(0, stored, size=batch_size, dtype=np.int64)
            if not self.replace:
                positions = distinct(positions, stored, rng)
            return index.complete[positions], None
        return self._sample_prioritized(batch_size, rng, trainer)

    def _sample_prioritized(
        self, batch_size: int, rng: np.random.Generator, trainer: int
    ) -> tuple[np.ndarray, np.ndarray]:
        state = self.priority_state
        trees = state.host_trees()
        total = trees.total(trainer)
        state.check_drawable(trainer, total)
        starts = np.empty(batch_size, dtype=np.int64)
        find_prefix(trees.sums[trainer], trees.leaf_offset, rng.random(batch_size) * total, starts)
        if not self.replace:
            starts = distinct_from_tree(starts, trees, trainer, rng)
        weights = importance_weights(trees.leaves(trainer)[starts], state.beta_for(trainer))
        state.drew(trainer)
        return starts, weights

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        """One priority per episode: ``|td| + eps`` for each first slot in ``indices`` (an
        update for a slot that no longer starts a complete episode is dropped)."""
        if not self.prioritized:
            super().update_priorities(indices, td_errors, trainer, stale)
            return
        td = td_per_index(td_errors, indices.shape, "one value per episode")
        stale = stale | (self._index().complete_position[indices] < 0)
        self.priority_state.update(trainer, indices, td, stale)

    def config(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "replace": self.replace,
            "prioritized": self.prioritized,
            **self.priority_state.config(),
        }
