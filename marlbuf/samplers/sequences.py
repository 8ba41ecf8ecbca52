"""Sequences of consecutive steps for recurrent learners: :class:`Sequence`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marlbuf import _config
from marlbuf._kernels import find_prefix, per_sample
from marlbuf.prioritized import LinearBeta, PriorityTrees, finite_float
from marlbuf.samplers.base import (
    Sampler,
    check_flags,
    distinct,
    distinct_from_tree,
    not_enough_data,
    positive_int,
)
from marlbuf.samplers.priority import (
    HoldsPriorities,
    PriorityState,
    clear_slots,
    importance_weights,
    real_td,
    reset_leaves,
)

if TYPE_CHECKING:
    from marlbuf.writer import EpisodeIndex


class Sequence(HoldsPriorities, Sampler):
    """Sequences of consecutive steps of one episode, for recurrent learners (R2D2-style).

    A batch holds ``B`` sequences of ``L = burn_in + length`` steps each. The *training start*
    ``s`` of a sequence is drawn from the stored slots: every stored slot (``pad=True``), or
    only slots whose episode has ``length - 1`` more steps stored (``pad=False``), uniformly
    or (``prioritized=True``) in proportion to ``priority ** alpha``. Around it the sequence
    holds the ``burn_in`` steps before ``s`` in its episode, ``s`` and the ``length - 1`` steps
    after it. Steps the episode does not have (it begins less than ``burn_in`` steps before
    ``s``, or ends before ``s + length - 1``), or that are no longer or not yet stored, are
    masked: their ``mask`` entry is False, ``slots`` is -1 and every field is zero. A sequence
    never mixes two episodes or two streams (see :class:`marlbuf.writer.EpisodeIndex`: an
    episode ends where every (alive) agent is done or the step was written with
    ``truncated=True``).
    Starts are drawn with replacement (independent draws) by default, so the batch may be
    larger than the number of stored starts; ``replace=False`` draws ``B`` distinct starts.

    Batches are :class:`marlbuf.batch.SequenceBatch`: every per-step array has the leading axes
    ``(B, L)``, ``mask`` (B, L) bool, ``slots`` (B, L) int64, ``burn_in``, and ``indices`` (B,)
    the training starts (column ``burn_in``), which ``update_priorities`` takes.

    Prioritized sequences (Kapturowski et al., 2019, R2D2): one priority per start slot (new
    starts get the trainer's running maximum, initially 1), one sum-tree per trainer,
    importance weights ``(N P(i))^-beta`` divided by the batch maximum. ``update_priorities``
    takes either one value per sequence, shape (B,), used as ``|td| + eps``, or the per-step TD
    errors, shape (B, length) (the training part ``[:, burn_in:]``), mixed as
    ``eta * max_t |td_t| + (1 - eta) * mean_t |td_t| + eps`` over the steps that were valid
    (``mask``) when the batch was drawn; masked entries are ignored (they may be anything).

    Parameters
    ----------
    length : int
        Training steps per sequence (``>= 1``).
    burn_in : int, default 0
        Steps before the training start, to warm up a recurrent state (``>= 0``).
    pad : bool, default True
        ``True``: any stored step may start a sequence (the tail is masked where the episode
        ends sooner). ``False``: only starts with ``length`` steps of their episode stored.
    prioritized : bool, default False
        Draw starts by priority (one tree per trainer) and return importance weights.
    eta : float, default 0.9
        R2D2's mix of the maximum and the mean of per-step TD errors, in ``[0, 1]``.
    alpha, beta, eps
        As in :class:`Prioritized` (``beta`` may be a :class:`marlbuf.prioritized.LinearBeta`).
    replace : bool, default True
        ``False``: ``B`` distinct starts (``B`` must not exceed the starts there are): uniform
        starts are a uniform sample without replacement; drawn from a tree (``pad=False`` or
        prioritized) a start drawn twice is drawn again, which is successive sampling in
        proportion to the tree's values among the starts not yet drawn (importance weights
        stay those of independent draws).

    Examples
    --------
    >>> import numpy as np
    >>> from marlbuf import AgentSpec, MultiAgentReplayBuffer
    >>> specs = {f"agent_{i}": AgentSpec(obs_shape=(4,), action_shape=(2,)) for i in range(2)}
    >>> buf = MultiAgentReplayBuffer(specs, 100, sampler=Sequence(length=5, burn_in=2), seed=0)
    >>> z = lambda *s: {a: np.zeros((30, *s), np.float32) for a in specs}
    >>> buf.extend(obs=z(4), action=z(2), reward=z(), next_obs=z(4), done=z())
    >>> batch = buf.sample(8)
    >>> batch.obs["agent_0"].shape, batch.mask.shape, batch.burn_in
    ((8, 7, 4), (8, 7), 2)
    """

    batch_kind: ClassVar[str] = "sequences"
    needs_episodes: ClassVar[bool] = True

    def __init__(
        self,
        length: int,
        burn_in: int = 0,
        pad: bool = True,
        prioritized: bool = False,
        eta: float = 0.9,
        alpha: float = 0.6,
        beta: float | LinearBeta | dict[str, Any] = 0.4,
        eps: float = 1e-6,
        replace: bool = True,
    ) -> None:
        self.length = positive_int("length", length)
        if isinstance(burn_in, bool) or not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
            raise ValueError(f"burn_in must be an int >= 0; got burn_in={burn_in!r}")
        self.burn_in = int(burn_in)
        check_flags(pad=pad, prioritized=prioritized, replace=replace)
        self.replace = bool(replace)
        self.pad = bool(pad)
        self.prioritized = bool(prioritized)
        self.weighted = self.prioritized
        self.eta = finite_float("eta", eta, 0.0, 1.0)
        self.priority_state = PriorityState(alpha, beta, eps, what="start")
        self.episodes: EpisodeIndex | None = None

    @property
    def steps(self) -> int:
        """``L = burn_in + length``: steps per sequence."""
        return self.burn_in + self.length

    def steps_per_row(self) -> int:
        """``L``: a sequence batch is ``B * L`` gathered rows."""
        return self.steps

    def bind(self, capacity: int, n_trainers: int) -> None:
        if self.steps > capacity:
            raise ValueError(
                f"a sequence of burn_in + length = {self.steps} steps does not fit a buffer of "
                f"capacity={capacity}; use a larger buffer or shorter sequences"
            )
        super().bind(capacity, n_trainers)
        #: per slot, whether it may start a sequence (pad=False: length steps stored)
        self.startable = np.zeros(self.capacity if not self.pad else 0, dtype=bool)
        #: the tree starts are drawn from: the priorities, one tree of 0/1 leaves (uniform
        #: draws over the valid starts of pad=False), or none (uniform, pad=True)
        self._tree: PriorityTrees | None = None
        if self.prioritized:
            self.priority_state.bind(self.capacity, self.n_trainers)
            self._tree = self.priority_state.host_trees()
        elif not self.pad:
            self._tree = PriorityTrees(self.capacity, 1, 1.0, False)
        #: per trainer and start slot, the valid training steps when it was last handed out
        self.valid_steps = np.zeros(
            (self.n_trainers, self.capacity) if self.prioritized else (0, 0), dtype=np.int32
        )
        self._zeros = np.zeros(self._tree.n_trees if self._tree is not None else 0, np.float64)

    @property
    def trees(self) -> PriorityTrees | None:
        """The tree starts are drawn from (see :meth:`bind`), ``None`` for uniform starts of
        ``pad=True``."""
        return self._tree

    def attach_episodes(self, episodes: EpisodeIndex) -> None:
        """Read the buffer's episode index (called by the buffer at construction)."""
        self.episodes = episodes

    def _index(self) -> EpisodeIndex:
        if self.episodes is None:
            raise RuntimeError("Sequence is used by a buffer that keeps no episode index")
        return self.episodes

    def _set(self, slots: np.ndarray, valid: bool) -> None:
        """Leaves of ``slots`` in every tree: the running max (valid starts) or 0."""
        trees = self._tree
        if trees is None or not slots.shape[0]:
            return
        if valid:
            trees.fill_new(slots)
        else:
            clear_slots(trees, slots, self._zeros)

    def on_write(self, slots: np.ndarray) -> None:
        if self.pad or self.length == 1:
            self._set(slots, True)
            if not self.pad:
                self.startable[slots] = True
            return
        # pad=False: a slot becomes a start once its episode's (length - 1)-th next step is
        # written, i.e. when it is the (length - 1)-th predecessor of a new slot; it stops
        # being one when overwritten (its successors are newer, so they outlive it)
        self.startable[slots] = False
        self._set(slots, False)
        index = self._index()
        slots = slots[index.step[slots] >= self.length - 1]  # early steps have no such ancestor
        if not slots.shape[0]:
            return
        ancestors = index.sequences(slots, self.length - 1, 0)[:, 0]
        ancestors = ancestors[ancestors >= 0]
        self.startable[ancestors] = True
        self._set(ancestors, True)

    def _n_starts(self, trainer: int) -> float:
        tree = self._tree
        return tree.total(trainer if self.prioritized else 0) if tree is not None else 1.0

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if size < 1:
            raise not_enough_data(batch_size, size, 1, "sequences")
        tree = self._tree
        if tree is not None and not self._n_starts(trainer) > 0.0:
            if not self.pad and not self.startable[:size].any():
                raise ValueError(
                    f"no stored episode has length={self.length} steps yet, so pad=False has no "
                    "sequence start; add more data, use shorter sequences or pad=True"
                )
            self.priority_state.check_drawable(trainer, 0.0)
        if not self.replace:
            self._check_distinct(batch_size, size, trainer)
        if tree is None:  # uniform, pad=True: every stored slot
            draws = rng.integers(0, size, size=batch_size, dtype=np.int64)
            return (draws if self.replace else distinct(draws, size, rng)), None
        starts = np.empty(batch_size, dtype=np.int64)
        if not self.prioritized:
            targets = rng.random(batch_size) * tree.total(0)
            find_prefix(tree.sums[0], tree.leaf_offset, targets, starts)
            if not self.replace:
                starts = distinct_from_tree(starts, tree, 0, rng)
            return starts, None
        state = self.priority_state
        weights = np.empty(batch_size, dtype=np.float32)
        beta = state.beta_for(trainer)
        uniforms = rng.random(batch_size)
        per_sample(tree.sums[trainer], tree.leaf_offset, uniforms, beta, starts, weights)
        if not self.replace:
            starts = distinct_from_tree(starts, tree, trainer, rng)
            weights = importance_weights(tree.leaves(trainer)[starts], beta)
        state.drew(trainer)
        return starts, weights

    def _check_distinct(self, batch_size: int, size: int, trainer: int) -> None:
        """Refuse ``batch_size`` distinct starts beyond the starts there are."""
        if self._tree is None:
            count = size
        else:
            leaves = self._tree.leaves(trainer if self.prioritized else 0)
            count = int(np.count_nonzero(leaves))
        if batch_size > count:
            raise ValueError(
                f"batch_size={batch_size} distinct sequences (replace=False) but {count} "
                "starts can be drawn; add more data, sample fewer, or use replace=True"
            )

    def start_total(self, size: int, trainer: int = 0) -> float:
        """The mass ``trainer``'s starts are drawn by: the stored slots ``size`` (uniform,
        ``pad=True``), the number of valid starts (``pad=False``), or ``sum_s p_s^alpha``
        (``prioritized=True``). A start ``s`` is drawn with probability ``weight(s) /
        start_total``; a sharded buffer splits a batch across shards by these totals."""
        return float(size) if self._tree is None else self._n_starts(trainer)

    def sampling_probabilities(self, indices: Any, size: int, trainer: int = 0) -> np.ndarray:
        """The probability (float64, shape of ``indices``) with which a sequence of
        ``trainer``'s batch starts at each slot of ``indices`` (valid starts, in
        ``[0, size)``): ``weight(s) / start_total`` (see :meth:`start_total`)."""
        idx = np.asarray(indices, dtype=np.int64)
        total = self.start_total(size, trainer)
        if self._tree is None:
            return np.full(idx.shape, 1.0 / total)
        return self._tree.leaves(trainer if self.prioritized else 0)[idx] / total

    def handed(self, trainer: int, starts: np.ndarray, valid_steps: np.ndarray) -> None:
        """Record the valid training steps (shape (B,)) of sequences handed to ``trainer``, for
        the R2D2 mix of a later ``update_priorities`` with per-step errors."""
        if self.prioritized:
            self.valid_steps[trainer, starts] = valid_steps

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        if not self.prioritized:
            super().update_priorities(indices, td_errors, trainer, stale)
            return
        td = real_td(td_errors)
        n = indices.shape[0]
        if td.shape == (n, self.length):
            td = self._r2d2_mix(indices, td.astype(np.float64, copy=False), trainer)
        elif td.shape != (n,):
            raise ValueError(
                f"td_errors must have shape ({n},) (one priority per sequence) or "
                f"({n}, {self.length}) (per training step, length={self.length}); got shape "
                f"{td.shape}"
            )
        if not self.pad:  # a slot that cannot start a sequence never gets a priority
            stale = stale | ~self.startable[indices]
        self.priority_state.update(trainer, indices, td, stale)

    def _r2d2_mix(self, indices: np.ndarray, td: np.ndarray, trainer: int) -> np.ndarray:
        """``eta * max + (1 - eta) * mean`` of ``|td|`` (shape (n, length)) over each row's
        valid training steps (as recorded when the sequence was handed out; for slots never
        handed to this trainer, the steps stored now)."""
        counts = self.valid_steps[trainer, indices].astype(np.int64)
        unknown = counts == 0
        if unknown.any():
            slots = self._index().sequences(indices[unknown], 0, self.length - 1)
            counts[unknown] = (slots >= 0).sum(axis=1)
        valid = np.arange(self.length) < counts[:, None]
        bad = valid & ~np.isfinite(td)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ValueError(
                f"td_errors must be finite at valid steps; got td_errors[{row}, {col}]="
                f"{td[row, col]} (check the critic's loss for divergence)"
            )
        magnitude = np.where(valid, np.abs(np.where(valid, td, 0.0)), 0.0)
        largest = magnitude.max(axis=1)
        mean = magnitude.sum(axis=1) / counts
        mixed: np.ndarray = self.eta * largest + (1.0 - self.eta) * mean
        return mixed

    def rebuild(self, size: int) -> None:
        """Recompute which slots may start a sequence from the episode index (after a state
        was loaded) and keep the trees consistent with it: 0 for every other slot."""
        index = self._index()
        self.valid_steps[:] = 0  # hand-out records of the previous contents
        if not self.pad:
            self.startable[:] = False
            chunk = max(1, _config.SEQUENCE_REBUILD_SLOTS // self.length)
            for lo in range(0, size, chunk):
                starts = np.arange(lo, min(size, lo + chunk), dtype=np.int64)
                self.startable[starts] = index.sequences(starts, 0, self.length - 1)[:, -1] >= 0
        if self._tree is None:
            return
        valid = self.startable if not self.pad else np.arange(self.capacity) < size
        if self.prioritized:
            self.priority_state.reset_leaves(valid)
        else:
            reset_leaves(self._tree, valid, True)

    def config(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "burn_in": self.burn_in,
            "pad": self.pad,
            "prioritized": self.prioritized,
            "eta": self.eta,
            **self.priority_state.config(),
            "replace": self.replace,
        }
