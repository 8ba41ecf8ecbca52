"""Prioritized experience replay: :class:`Prioritized` and the locality-aware
:class:`PrioritizedNeighbor`, each over one :class:`marlbuf.samplers.priority.PriorityState`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marlbuf import _config
from marlbuf._kernels import find_prefix, locality_sample, per_sample, sorted_uniforms
from marlbuf.prioritized import (
    LinearBeta,
    PriorityTrees,
    RunLengthPredictor,
    ThresholdPredictor,
)
from marlbuf.samplers.base import Sampler, check_order, not_enough_data
from marlbuf.samplers.priority import (
    HoldsPriorities,
    PriorityState,
    importance_weights,
    td_per_index,
)

if TYPE_CHECKING:
    from marlbuf.stores.torch_priority import TensorPriorityTrees

#: where :class:`Prioritized` keeps its priority trees (its ``index`` argument)
PRIORITY_INDEXES: tuple[str, ...] = ("host", "device")


class Prioritized(HoldsPriorities, Sampler):
    """Proportional prioritized experience replay (Schaul et al., 2016), one tree per trainer.

    Slot ``i`` is drawn with probability ``P(i) = p_i^alpha / sum_k p_k^alpha`` (independent
    draws, with replacement) from a float64 sum-tree; each trainer (critic) has its own tree
    over the shared storage. New slots enter every tree with that tree's running maximum
    priority (initially 1). Importance weights ``w_i = (N P(i))^-beta`` are divided by the
    batch's largest weight, so ``w <= 1``.

    Parameters
    ----------
    alpha : float, default 0.6
        Priority exponent, ``>= 0`` (0 is uniform sampling).
    beta : float, LinearBeta or dict, default 0.5
        Importance-sampling exponent in ``[0, 1]``, or a schedule advanced once per batch a
        trainer draws (:class:`marlbuf.prioritized.LinearBeta`, or its ``to_dict()``).
    eps : float, default 1e-6
        Added to every priority so that no slot starves; ``>= 0``.
    priority : {"abs", "squared", "given"}, default "abs"
        Priority from a TD error ``d``: ``|d| + eps``, ``d**2 + eps``, or ``d + eps`` when the
        caller passes priorities (then negative values are an error).
    order : {"random", "memory"}, default "random"
        ``"random"``: the order of independent draws. ``"memory"``: the ``B`` prefix-sum
        targets are drawn in ascending order (the order statistics of ``B`` uniforms, from
        exponential spacings), so the tree descents return slots in ascending slot (storage)
        order; the batch as a set has the same law (slot frequencies ``∝ p^alpha``), and
        weights and priority updates follow the indices. Not the default: in the measured
        MADDPG rounds the sorted targets cost about 2% more at 3-6 agents and gained nothing
        measurable at more (``docs/training.md``, "Choosing a run length").
    index : {"host", "device"}, default "host"
        Where the priority trees live. ``"host"``: float64 Numba sum trees in host memory;
        a torch buffer's TD errors are copied back to them. ``"device"``: on a torch buffer
        (``device=...``), float64 sum trees in tensors on that device
        (:class:`marlbuf.stores.torch_priority.TensorPriorityTrees`): an update is written on
        the device with work proportional to the batch (no copy of the TD errors, no wait),
        and a draw descends the trees on the device with the host generator's uniforms, so both
        indexes give the same batches. A buffer in host memory keeps host trees whatever this
        says (so a saved device buffer loads anywhere). With ``"device"``, a bad update (a
        non-finite TD error) changes nothing and raises at the next call that reads or changes
        priorities, or at once with ``update_priorities(..., sync=True)`` (the default).

    Examples
    --------
    >>> import numpy as np
    >>> from marlbuf import AgentSpec, MultiAgentReplayBuffer
    >>> specs = {f"agent_{i}": AgentSpec(obs_shape=(4,), action_shape=(2,)) for i in range(2)}
    >>> buf = MultiAgentReplayBuffer(specs, capacity=100, sampler=Prioritized(), seed=0)
    >>> z = lambda *s: {a: np.zeros((50, *s), np.float32) for a in specs}
    >>> buf.extend(obs=z(4), action=z(2), reward=z(), next_obs=z(4), done=z())
    >>> batch = buf.sample(8, trainer=1)
    >>> batch.weights.dtype, batch.weights.shape
    (dtype('float32'), (8,))
    >>> buf.update_priorities(batch.indices, np.ones(8), trainer=1, generations=batch.generations)
    """

    weighted: bool = True
    #: a prioritized sampler's state always holds its priorities
    loads_without_priorities = False
    #: whether the trees also keep the maximum priority (needed for ``p / max p``)
    _track_max: ClassVar[bool] = False

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float | LinearBeta | dict[str, Any] = 0.5,
        eps: float = 1e-6,
        priority: str = "abs",
        order: str = "random",
        index: str = "host",
    ) -> None:
        self.priority_state = PriorityState(alpha, beta, eps, priority)
        self.order = check_order(order)
        if not isinstance(index, str) or index not in PRIORITY_INDEXES:
            raise ValueError(
                f"index must be one of {PRIORITY_INDEXES} (where the priority trees live); got "
                f"index={index!r}"
            )
        self.index = index

    @property
    def priority(self) -> str:
        """How a TD error becomes a priority (``"abs"``, ``"squared"`` or ``"given"``)."""
        return self.priority_state.priority

    def bind(self, capacity: int, n_trainers: int) -> None:
        super().bind(capacity, n_trainers)
        self.priority_state.bind(self.capacity, self.n_trainers, self._track_max)

    def place_priorities(self, device: Any) -> None:
        """Called by the buffer once bound, with its torch device (``None``: host memory):
        with ``index="device"`` and a device, the trees move to tensors on it (empty: before
        any write)."""
        if self.index != "device" or device is None:
            return
        self.priority_state.place(device)

    @property
    def priorities_on_device(self) -> bool:
        """Whether the trees are tensors on a torch device (:meth:`place_priorities`)."""
        return self.priority_state.on_device

    def raise_pending_errors(self) -> None:
        """Raise the first error of the device updates made since the last check (each bad
        update wrote nothing); a no-op for host trees, whose updates raise at once."""
        self.priority_state.raise_pending_errors()

    def on_write(self, slots: np.ndarray) -> None:
        self.priority_state.trees.fill_new(slots)

    def priority_total(self, trainer: int = 0) -> float:
        """``sum_k p_k^alpha`` over ``trainer``'s slots (the root of its sum-tree): the
        normaliser of ``P(i)``, and how a sharded buffer splits a batch across shards."""
        return self.priority_state.trees.total(trainer)

    def sampling_probabilities(self, indices: Any, size: int, trainer: int = 0) -> np.ndarray:
        """The probability (float64, shape of ``indices``) with which a row of ``trainer``'s
        batch is each slot of ``indices`` (in ``[0, size)``, ``size`` the filled slots):
        ``P(i) = p_i^alpha / sum_k p_k^alpha``. The importance weights are
        ``(N P(i))^-beta`` over these; a sharded buffer scales them by the shard's share."""
        self._check_sampleable(1, size, trainer)
        return self.priority_state.trees.probabilities(trainer, np.asarray(indices, dtype=np.int64))

    def _check_sampleable(self, batch_size: int, size: int, trainer: int) -> None:
        if size < 1:
            raise not_enough_data(batch_size, size, 1, "prioritized rows")
        self.priority_state.check_drawable(trainer, self.priority_state.trees.total(trainer))

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        state = self.priority_state
        trees = state.trees
        if not isinstance(trees, PriorityTrees):
            return self._sample_on_device(trees, batch_size, size, rng, trainer)
        self._check_sampleable(batch_size, size, trainer)
        uniforms = self._uniforms(batch_size, rng)
        indices = np.empty(batch_size, dtype=np.int64)
        weights = np.empty(batch_size, dtype=np.float32)
        beta = state.beta_for(trainer)
        per_sample(trees.sums[trainer], trees.leaf_offset, uniforms, beta, indices, weights)
        state.drew(trainer)
        return indices, weights

    def _uniforms(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """The batch's uniforms in [0, 1) (ascending with ``order="memory"``): shape (B,)."""
        if self.order == "memory":
            uniforms = np.empty(batch_size, dtype=np.float64)
            sorted_uniforms(rng.standard_exponential(batch_size + 1), uniforms)
            return uniforms
        return rng.random(batch_size)

    def _sample_on_device(
        self,
        trees: TensorPriorityTrees,
        batch_size: int,
        size: int,
        rng: np.random.Generator,
        trainer: int,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`sample` from tensor trees: the host generator's uniforms, the descents on the
        device, and the indices, weights and tree total back in one wait."""
        state = self.priority_state
        state.raise_pending_errors()
        if size < 1:
            raise not_enough_data(batch_size, size, 1, "prioritized rows")
        uniforms = self._uniforms(batch_size, rng)
        indices, weights, total = trees.draw(trainer, uniforms, state.beta_for(trainer))
        state.check_drawable(trainer, total)
        state.drew(trainer)
        return indices, weights

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        state = self.priority_state
        if state.on_device:
            state.update_on_device(trainer, indices, td_errors, stale)
            return
        td = td_per_index(td_errors, indices.shape, "one per index")
        state.update(trainer, indices, td, stale)

    def config(self) -> dict[str, Any]:
        return {
            **self.priority_state.config(),
            "priority": self.priority,
            "order": self.order,
            "index": self.index,
        }


class PrioritizedNeighbor(Prioritized):
    """Information-prioritized locality-aware sampling (Gogineni et al., Sec. 5.2).

    Reference slots are drawn as in :class:`Prioritized`; a predictor maps each reference's
    normalised priority ``p / max p`` (``max p`` over the trainer's filled slots) to a run
    length, and the run of that many contiguous slots starting at the reference joins the
    batch. References are drawn until ``batch_size`` rows are filled; the last run is cut to
    fit. Runs follow the :class:`Neighbor` ring rules: while the buffer fills, a run stops at
    the newest slot (it never reaches an unwritten one); once full, runs wrap around the ring.

    Every row ``j`` is in a batch with the long-run per-row probability

    ``P(j) = sum_k P_ref(j - k) [len(j - k) > k] / E[len]``

    (``k`` over ``0 .. max run length - 1``; ``len`` after the write-head cut; ``E[len]`` under
    ``P_ref``), which :meth:`inclusion_probabilities` computes. With ``weights="exact"`` the
    importance weights are ``(N P(j))^-beta`` divided by the batch maximum (at most
    ``max run length`` leaf reads per row); ``weights="inherit"`` gives each row its
    reference's ``P_ref`` instead (cheaper, approximate). Every row's priority is then updated
    from its own TD error through ``update_priorities``.

    Parameters
    ----------
    alpha, beta, eps, priority
        As in :class:`Prioritized`.
    thresholds : sequence of float, default (0.33, 0.66)
        Bands of normalised priority (the paper's predictor; see :class:`ThresholdPredictor`).
    run_lengths : sequence of int, default (1, 2, 4)
        Run length per band.
    weights : {"exact", "inherit"}, default "exact"
        How importance weights are computed.
    predictor : RunLengthPredictor or dict, optional
        Replaces the threshold predictor built from ``thresholds``/``run_lengths`` (a dict is
        ``RunLengthPredictor.to_dict()`` output).

    Notes
    -----
    Rows come in draw order (there is no ``order`` argument): a batch uses a random number of
    references, the first ones drawn, so references drawn in ascending order would favour low
    slots; each run is already contiguous in memory.
    """

    _track_max: ClassVar[bool] = True
    WEIGHT_MODES: ClassVar[tuple[str, ...]] = ("exact", "inherit")

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float | LinearBeta | dict[str, Any] = 0.5,
        eps: float = 1e-6,
        thresholds: Any = (0.33, 0.66),
        run_lengths: Any = (1, 2, 4),
        weights: str = "exact",
        priority: str = "abs",
        predictor: RunLengthPredictor | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(alpha, beta, eps, priority, order="random")
        if weights not in self.WEIGHT_MODES:
            raise ValueError(f"weights must be one of {self.WEIGHT_MODES}; got weights={weights!r}")
        self.weights = str(weights)
        if predictor is None:
            predictor = ThresholdPredictor(thresholds, run_lengths)
        elif isinstance(predictor, dict):
            predictor = RunLengthPredictor.from_config(predictor)
        elif not isinstance(predictor, RunLengthPredictor):
            raise TypeError(
                "predictor must be a marlbuf.prioritized.RunLengthPredictor (or its to_dict()); "
                f"got predictor={predictor!r}"
            )
        self.predictor = predictor

    def bind(self, capacity: int, n_trainers: int) -> None:
        if capacity < self.predictor.max_run_length:
            raise ValueError(
                f"capacity={capacity} is shorter than the longest run "
                f"({self.predictor.max_run_length}); use a larger buffer or shorter runs"
            )
        super().bind(capacity, n_trainers)

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        self._check_sampleable(batch_size, size, trainer)
        uniforms = rng.random(batch_size)  # enough: every run has at least one row
        state = self.priority_state
        trees = state.host_trees()  # the runs read leaves and priorities on the host
        beta = state.beta_for(trainer)
        table = self.predictor.step_table()
        if table is None:
            indices, weights = self._sample_general(uniforms, size, trainer, beta)
        else:
            indices = np.empty(batch_size, dtype=np.int64)
            weights = np.empty(batch_size, dtype=np.float32)
            locality_sample(
                trees.sums[trainer],
                trees.maxes[trainer],
                trees.leaf_offset,
                self.capacity,
                size,
                uniforms,
                table[0],
                table[1],
                beta,
                self.weights == "inherit",
                _config.SEARCH_CHUNK_MIN,
                indices,
                weights,
                np.empty(batch_size, dtype=np.float64),
            )
        state.drew(trainer)
        return indices, weights

    def _run_lengths(self, normalised: np.ndarray) -> np.ndarray:
        lengths = np.asarray(self.predictor.run_lengths_for(normalised))
        longest = self.predictor.max_run_length
        if (
            lengths.shape != normalised.shape
            or lengths.dtype.kind not in "iu"
            or lengths.min() < 1
            or lengths.max() > longest
        ):
            raise ValueError(
                f"{self.predictor!r}.run_lengths_for must return ints in [1, {longest}] shaped "
                f"like its input {normalised.shape}; got {lengths.dtype} {lengths.shape}"
            )
        return lengths.astype(np.int64, copy=False)

    def _sample_general(
        self, uniforms: np.ndarray, size: int, trainer: int, beta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The same distribution as the fused kernel, for predictors without a step table."""
        batch_size = uniforms.shape[0]
        refs = np.empty(batch_size, dtype=np.int64)
        trees = self.priority_state.host_trees()
        targets = uniforms * trees.sums[trainer, 1]
        find_prefix(trees.sums[trainer], trees.leaf_offset, targets, refs)
        leaves = trees.leaves(trainer)
        priorities = trees.priorities(trainer)
        max_priority = trees.maxes[trainer, 1]
        full = size == self.capacity
        lengths = self._run_lengths(priorities[refs] / max_priority)
        if not full:
            lengths = np.minimum(lengths, size - refs)  # stop at the write head
        ends = np.cumsum(lengths)
        n_refs = int(np.searchsorted(ends, batch_size)) + 1  # first run reaching batch_size
        lengths = lengths[:n_refs].copy()
        lengths[-1] -= ends[n_refs - 1] - batch_size  # cut the last run
        run_refs = np.repeat(refs[:n_refs], lengths)
        offsets = np.arange(batch_size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        indices = (run_refs + offsets) % self.capacity
        if self.weights == "inherit":
            mass = leaves[run_refs]
        else:
            back = np.arange(self.predictor.max_run_length)
            starts = indices[:, None] - back  # runs starting here reach the row if len > k
            valid = starts >= 0 if not full else np.ones(starts.shape, dtype=bool)
            starts %= self.capacity
            reach = self._run_lengths(priorities[starts].ravel() / max_priority).reshape(
                starts.shape
            )
            mass = np.where(valid & (reach > back), leaves[starts], 0.0).sum(axis=1)
        return indices, importance_weights(mass, beta)

    def inclusion_probabilities(self, size: int, trainer: int = 0) -> np.ndarray:
        """Exact long-run per-row probability ``P(j)`` of every slot (shape (capacity,),
        float64, sums to 1; 0 for unwritten slots).

        ``P(j) = sum_k P_ref(j - k) [len(j - k) > k] / E[len]``: the expected share of batch
        rows equal to ``j`` when references are drawn without end. A real batch stops after
        ``batch_size`` rows and cuts its last run, which shifts each slot's expected count by
        ``O(max run length / batch_size)`` relative to ``batch_size * P(j)``.
        """
        self._check_sampleable(1, size, trainer)
        trees = self.priority_state.host_trees()
        leaves = trees.leaves(trainer)
        reference = leaves / leaves.sum()
        lengths = self._run_lengths(trees.priorities(trainer) / trees.maxes[trainer, 1])
        full = size == self.capacity
        slot = np.arange(self.capacity)
        if not full:
            lengths = np.where(slot < size, np.minimum(lengths, size - slot), 0)
        expected_length = float(np.dot(reference, lengths))
        mass = np.zeros(self.capacity, dtype=np.float64)
        for k in range(self.predictor.max_run_length):  # <= a handful of shifted adds
            reaching = reference * (lengths > k)
            if full:
                mass += np.roll(reaching, k)
            elif k < self.capacity:
                mass[k:] += reaching[: self.capacity - k]
        return mass / expected_length

    def sampling_probabilities(self, indices: Any, size: int, trainer: int = 0) -> np.ndarray:
        """The exact long-run inclusion probability ``P(j)`` of each slot of ``indices``
        (:meth:`inclusion_probabilities`, one O(capacity) pass), what ``weights="exact"``
        weights by."""
        return self.inclusion_probabilities(size, trainer)[np.asarray(indices, dtype=np.int64)]

    def config(self) -> dict[str, Any]:
        config = super().config()
        del config["order"]  # always draw order (see the class notes)
        del config["index"]  # host trees (the runs read the trees' leaves on the host)
        return {
            **config,
            "weights": self.weights,
            "predictor": self.predictor.to_dict(),
        }
