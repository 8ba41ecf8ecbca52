"""Samplers: which slots a trainer's mini-batch comes from.

A sampler returns indices (and, for prioritized samplers, importance weights) for one trainer;
the buffer gathers the rows. Samplers with per-trainer state (priority trees) allocate it in
:meth:`Sampler.bind`. Each sampler's docstring states its semantics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marlbuf import _config
from marlbuf._kernels import (
    apply_td_errors,
    fill_new_slots,
    find_prefix,
    locality_sample,
    merge_distinct,
    neighbor_indices,
    per_sample,
    rebuild,
    selection_sample,
    sorted_slots,
    sorted_uniforms,
)
from marlbuf._kernels.sumtree import MODE_ABS, MODE_GIVEN, MODE_SQUARED
from marlbuf.prioritized import (
    LinearBeta,
    PriorityTrees,
    RunLengthPredictor,
    ThresholdPredictor,
    check_priority_args,
    finite_float,
    raise_td_error,
)
from marlbuf.writer import EpisodeIndex

if TYPE_CHECKING:
    from marlbuf.stores.torch_priority import TensorPriorityTrees

#: name -> class, for rebuilding a sampler from ``Sampler.config()`` when a buffer is loaded.
SAMPLERS: dict[str, type[Sampler]] = {}


#: Orders a batch's indices can come in (the ``order`` argument of :class:`Uniform` and
#: :class:`Prioritized`): ``"random"``, the order they were drawn in; ``"memory"``, ascending slot
#: (storage) order, generated directly in that order (:mod:`marlbuf._kernels.ordered`).
ORDERS: tuple[str, ...] = ("random", "memory")


def _check_order(order: Any) -> str:
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(
            f"order must be one of {ORDERS}; got order={order!r} (use 'memory' for indices in "
            "ascending slot order or 'random' for draw order)"
        )
    return order


def ascending_uniform(
    batch_size: int, size: int, rng: np.random.Generator, replace: bool
) -> np.ndarray:
    """Uniform slots of ``[0, size)`` drawn directly in ascending order, in ``O(B)``.

    With replacement: the sorted sample of ``B`` i.i.d. uniform slots, from ``B + 1``
    exponential spacings. Without: a uniform ``B``-subset, strictly increasing: the distinct
    values of i.i.d. draws (in sorted chunks) until ``B`` are seen, or selection sampling over
    every slot when ``B`` exceeds :data:`marlbuf._config.SELECTION_SAMPLING_FRACTION` of
    ``size``.

    Parameters
    ----------
    batch_size : int
        ``B >= 1`` (``<= size`` without replacement; checked by the caller).
    size : int
        Slots to draw from, ``>= 1``.
    rng : numpy.random.Generator
        Source of every random number (the same state gives the same slots).
    replace : bool
        With or without replacement.

    Returns
    -------
    ndarray, shape (B,), int64
        Non-decreasing slots (strictly increasing without replacement).
    """
    out = np.empty(batch_size, dtype=np.int64)
    if replace:
        sorted_slots(rng.standard_exponential(batch_size + 1), size, out)
        return out
    if batch_size > _config.SELECTION_SAMPLING_FRACTION * size:
        selection_sample(rng.random(size), batch_size, out)
        return out
    spare = np.empty(batch_size, dtype=np.int64)
    draws = np.empty(batch_size, dtype=np.int64)
    kept = 0
    while kept < batch_size:  # each chunk draws as many values as are missing: never too many
        chunk = draws[: batch_size - kept]
        sorted_slots(rng.standard_exponential(chunk.shape[0] + 1), size, chunk)
        kept = merge_distinct(out, kept, chunk, spare)
        out, spare = spare, out
    return out


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
    return int(value)


def _apply_td_errors(
    trees: PriorityTrees,
    trainer: int,
    indices: np.ndarray,
    td: np.ndarray,
    stale: np.ndarray,
    mode: int,
    eps: float,
    alpha: float,
    track_max: bool,
    setting: str,
) -> None:
    """Set trainer ``trainer``'s priorities at ``indices`` (shape (n,), int64) from ``td``
    (shape (n,), real) in ``mode`` (``MODE_ABS``, ...), skipping ``stale`` entries (shape
    (n,), bool), and raise the running maximum. One kernel validates every entry first, so
    bad input writes nothing and raises a ``ValueError`` naming the entry; ``setting`` names
    the sampler's options in the overflow message."""
    td = np.ascontiguousarray(td, dtype=np.float64)
    code, position, largest = apply_td_errors(
        trees.sums[trainer],
        trees.maxes[trainer] if track_max else trees.empty,
        trees.leaf_offset,
        np.ascontiguousarray(indices, dtype=np.int64),
        td,
        np.ascontiguousarray(stale, dtype=np.bool_),
        mode,
        eps,
        alpha,
        track_max,
    )
    raise_td_error(code, position, td, setting)
    trees.max_priority[trainer] = max(trees.max_priority[trainer], largest)


class Sampler(ABC):
    """Base class: draws ``batch_size`` slot indices out of the ``size`` filled slots.

    Subclasses set ``weighted = True`` when they return importance weights, and override
    :meth:`bind`, :meth:`on_write`, :meth:`update_priorities` and the state methods when they
    keep state. They are registered by class name for :meth:`from_config`.
    """

    #: whether ``sample`` returns importance weights (prioritized samplers)
    weighted: bool = False
    #: whether the sampler reads the writer's episode index (sequence samplers): the buffer
    #: then keeps one (:class:`marlbuf.writer.EpisodeIndex`) and calls :meth:`attach_episodes`
    needs_episodes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        SAMPLERS[cls.__name__] = cls

    def bind(self, capacity: int, n_trainers: int) -> None:
        """Allocate per-trainer state for a buffer of ``capacity`` slots (default: none)."""
        self.capacity = int(capacity)
        self.n_trainers = int(n_trainers)

    def on_write(self, slots: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Called after ``slots`` (shape (T,), int64) were (over)written with new data."""

    def check_batch_size(self, batch_size: int) -> int:
        """Validate ``batch_size`` for this sampler (before any data is looked at)."""
        return _positive_int("batch_size", batch_size)

    @abstractmethod
    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Indices (shape (B,), int64, all in filled slots) and weights ((B,) float32 or None).

        ``size`` is the number of filled slots. While the buffer fills, slots ``[0, size)`` hold
        data; once full (``size == capacity``) every slot does.
        """

    def sample_share(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """This buffer's share of one draw over several buffers (the shards of
        :class:`marlbuf.distributed.ShardedReplayBuffer`): as :meth:`sample` (the default). A
        sampler may answer otherwise where a share obeys a rule that one buffer's draw does
        not."""
        return self.sample(batch_size, size, rng, trainer)

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        """Feed TD errors back (prioritized samplers only).

        ``indices`` (shape (B,), int64) are in range; ``td_errors`` is whatever the caller
        passed (validate it: shape (B,), finite); ``stale`` (shape (B,), bool) marks slots
        overwritten since they were sampled, whose updates must be dropped.
        """
        raise TypeError(
            f"{type(self).__name__} keeps no priorities; update_priorities needs a prioritized "
            "sampler (marlbuf.samplers.Prioritized or PrioritizedNeighbor)"
        )

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-safe): ``type(self)(**self.config())`` is equivalent."""

    def state_dict(self) -> dict[str, Any]:
        """Mutable state (arrays and JSON-safe values); empty for stateless samplers."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore :meth:`state_dict` output."""

    @staticmethod
    def from_config(name: str, config: dict[str, Any]) -> Sampler:
        """Rebuild a sampler from its class name and :meth:`config`."""
        if name not in SAMPLERS:
            raise ValueError(f"unknown sampler {name!r}; known: {sorted(SAMPLERS)}")
        return SAMPLERS[name](**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def _not_enough_data(batch_size: int, size: int, need: int, what: str) -> ValueError:
    if size == 0:
        return ValueError(f"the buffer is empty: add transitions before sampling {batch_size} rows")
    return ValueError(
        f"batch_size={batch_size} needs {what} (at least {need} stored transitions) but the "
        f"buffer holds {size}; add more data or sample a smaller batch"
    )


def _raise_max_priority(trees: PriorityTrees | TensorPriorityTrees, priorities: Any) -> None:
    """Raise every tree's running maximum priority to at least ``priorities[t]`` (checked:
    shape (n_trees,), finite, > 0)."""
    values = np.asarray(priorities, dtype=np.float64)
    if values.shape != (trees.n_trees,) or not (np.isfinite(values) & (values > 0)).all():
        raise ValueError(
            f"priorities must hold one finite priority > 0 per trainer, shape "
            f"({trees.n_trees},); got {priorities!r:.120}"
        )
    trees.raise_max(values)


def _batches_drawn(state: dict[str, Any], n_trainers: int) -> np.ndarray:
    """The ``batches_drawn`` counters of a prioritized sampler's state, checked."""
    drawn = np.asarray(state.get("batches_drawn"), dtype=np.int64)
    if drawn.shape != (n_trainers,):
        raise ValueError(
            f"sampler state 'batches_drawn' has shape {drawn.shape}; expected {(n_trainers,)}"
        )
    return drawn


class Uniform(Sampler):
    """Every filled slot equally likely.

    Parameters
    ----------
    replace : bool, default True
        Draw with replacement (as openai/maddpg's ``make_index``) or without. With replacement
        a batch may be larger than the stored data (any batch size from a non-empty buffer, as
        a hand-written buffer drawing ``rng.integers(0, size, B)`` allows); without, it holds
        distinct slots, so a batch larger than the stored data is refused.
    order : {"memory", "random"}, default "memory"
        Order of a batch's indices. ``"memory"``: ascending slot order, so the gather reads
        the storage front to back; the batch has the same distribution as a *set* (that of the
        sorted ``"random"`` sample: with replacement, repeated slots sit next to each other;
        without, a uniform subset), but its rows are not exchangeable by position (a prefix
        of the batch holds its lowest slots). Once the ring has wrapped, ascending slot order
        is storage order, not age. A learner that treats a mini-batch as a set (MADDPG, TD
        learners: losses are means over the batch) is unaffected. ``"random"``: the order of
        independent draws (a prefix is itself a uniform sample); as openai/maddpg's
        ``make_index``. The default because the measured MADDPG sampling rounds were never
        slower in memory order (1-8% faster up to 12 agents; see ``docs/training.md``,
        "Choosing a run length"), and drawing the sorted sample costs less than drawing the
        unsorted one.

    Examples
    --------
    >>> import numpy as np
    >>> indices, _ = Uniform().sample(6, 100, np.random.default_rng(2))
    >>> indices.tolist()  # ascending (a slot drawn twice would appear twice, side by side)
    [2, 7, 19, 35, 63, 94]
    """

    def __init__(self, replace: bool = True, order: str = "memory") -> None:
        if not isinstance(replace, (bool, np.bool_)):
            raise TypeError(f"replace must be a bool; got replace={replace!r}")
        self.replace = bool(replace)
        self.order = _check_order(order)

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if size < 1 or (batch_size > size and not self.replace):
            raise _not_enough_data(batch_size, size, batch_size, "distinct slots")
        if self.order == "memory":
            return ascending_uniform(batch_size, size, rng, self.replace), None
        if self.replace:
            return rng.integers(0, size, size=batch_size, dtype=np.int64), None
        return rng.choice(size, size=batch_size, replace=False).astype(np.int64), None

    def config(self) -> dict[str, Any]:
        return {"replace": self.replace, "order": self.order}


class Neighbor(Sampler):
    """Cache-locality neighbor sampling (Gogineni et al., Sec. 5.1).

    ``R = batch_size / run_length`` reference slots are drawn uniformly without replacement;
    each contributes a run of ``run_length`` contiguous slots starting at (and including) the
    reference. While the buffer fills, references come from ``[0, size - run_length]`` so no
    run reaches an unwritten slot; once full, runs wrap around the ring, which keeps every slot
    equally likely. Runs may cross episode boundaries: each row is a self-contained transition.

    Parameters
    ----------
    run_length : int
        Contiguous slots per reference (the paper's ``n``); must divide the batch size.
    """

    def __init__(self, run_length: int = 16) -> None:
        self.run_length = _positive_int("run_length", run_length)

    def bind(self, capacity: int, n_trainers: int) -> None:
        if self.run_length > capacity:
            raise ValueError(
                f"run_length={self.run_length} is longer than the buffer's capacity={capacity}; "
                "use a run length of at most the capacity"
            )
        super().bind(capacity, n_trainers)

    def check_batch_size(self, batch_size: int) -> int:
        batch_size = super().check_batch_size(batch_size)
        if batch_size % self.run_length:
            raise ValueError(
                f"run_length={self.run_length} must divide batch_size={batch_size}; choose a "
                f"batch size that is a multiple of {self.run_length}"
            )
        return batch_size

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        n_refs = batch_size // self.run_length
        if size == 0 or batch_size > size:
            raise _not_enough_data(batch_size, size, batch_size, "distinct slots")
        full = size == self.capacity
        n_starts = size if full else size - self.run_length + 1  # valid reference slots
        if n_starts < n_refs:
            need = n_refs + self.run_length - 1
            raise _not_enough_data(batch_size, size, need, f"{n_refs} distinct runs")
        refs = rng.choice(n_starts, size=n_refs, replace=False).astype(np.int64)
        out = np.empty(batch_size, dtype=np.int64)
        neighbor_indices(refs, self.run_length, self.capacity, out)
        return out, None

    def config(self) -> dict[str, Any]:
        return {"run_length": self.run_length}


_PRIORITY_MODE_CODES = {"abs": MODE_ABS, "squared": MODE_SQUARED, "given": MODE_GIVEN}

#: where :class:`Prioritized` keeps its priority trees (its ``index`` argument)
PRIORITY_INDEXES: tuple[str, ...] = ("host", "device")


class Prioritized(Sampler):
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
        self.alpha, self.beta, self.eps, self.priority = check_priority_args(
            alpha, beta, eps, priority
        )
        self.order = _check_order(order)
        if not isinstance(index, str) or index not in PRIORITY_INDEXES:
            raise ValueError(
                f"index must be one of {PRIORITY_INDEXES} (where the priority trees live); got "
                f"index={index!r}"
            )
        self.index = index

    def bind(self, capacity: int, n_trainers: int) -> None:
        super().bind(capacity, n_trainers)
        self.trees: PriorityTrees | TensorPriorityTrees = PriorityTrees(
            self.capacity, self.n_trainers, self.alpha, self._track_max
        )
        self.batches_drawn = np.zeros(self.n_trainers, dtype=np.int64)  # beta schedule position
        #: results of device updates not yet checked: (code, position, td errors)
        self._unchecked: list[tuple[Any, Any, Any]] = []

    def place_priorities(self, device: Any) -> None:
        """Called by the buffer once bound, with its torch device (``None``: host memory):
        with ``index="device"`` and a device, the trees move to tensors on it (empty: before
        any write)."""
        if self.index != "device" or device is None:
            return
        from marlbuf.stores.torch_priority import TensorPriorityTrees

        self.trees = TensorPriorityTrees(
            self.capacity, self.n_trainers, self.alpha, self._track_max, device
        )

    @property
    def priorities_on_device(self) -> bool:
        """Whether the trees are tensors on a torch device (:meth:`place_priorities`)."""
        return not isinstance(self.trees, PriorityTrees)

    def raise_pending_errors(self) -> None:
        """Raise the first error of the device updates made since the last check (each bad
        update wrote nothing); a no-op for host trees, whose updates raise at once."""
        if not self._unchecked:
            return
        pending, self._unchecked = self._unchecked, []
        from marlbuf.stores.torch_priority import first_td_error

        code, position, td = first_td_error(pending)
        raise_td_error(code, position, td, self._setting())

    def _setting(self) -> str:
        return f"priority={self.priority!r}, alpha={self.alpha}"

    def on_write(self, slots: np.ndarray) -> None:
        self.trees.fill_new(slots)

    def beta_for(self, trainer: int) -> float:
        """β of ``trainer``'s next batch."""
        return self.beta_at(int(self.batches_drawn[trainer]))

    def beta_at(self, batches_drawn: int) -> float:
        """β of the batch a trainer draws after ``batches_drawn`` earlier ones: the constant
        ``beta``, or the :class:`marlbuf.prioritized.LinearBeta` schedule at that step (for a
        caller that counts batches itself, such as the learner of a sharded buffer)."""
        if isinstance(self.beta, LinearBeta):
            return self.beta(int(batches_drawn))
        return self.beta

    def priority_total(self, trainer: int = 0) -> float:
        """``sum_k p_k^alpha`` over ``trainer``'s slots (the root of its sum-tree): the
        normaliser of ``P(i)``, and how a sharded buffer splits a batch across shards."""
        return self.trees.total(trainer)

    def max_priority(self, trainer: int = 0) -> float:
        """``trainer``'s running maximum priority: what a newly written slot gets (starts at
        1, raised by every priority update and by :meth:`raise_max_priority`)."""
        return float(self.trees.max_priority[trainer])

    def raise_max_priority(self, priorities: Any) -> None:
        """Raise every trainer's running maximum priority to at least ``priorities[t]``
        (shape (n_trainers,), finite, > 0; lower values leave it alone): new slots then enter
        with the maximum known elsewhere (the other shards of a sharded buffer)."""
        _raise_max_priority(self.trees, priorities)

    def sampling_probabilities(self, indices: Any, size: int, trainer: int = 0) -> np.ndarray:
        """The probability (float64, shape of ``indices``) with which a row of ``trainer``'s
        batch is each slot of ``indices`` (in ``[0, size)``, ``size`` the filled slots):
        ``P(i) = p_i^alpha / sum_k p_k^alpha``. The importance weights are
        ``(N P(i))^-beta`` over these; a sharded buffer scales them by the shard's share."""
        self._check_sampleable(1, size, trainer)
        return self.trees.probabilities(trainer, np.asarray(indices, dtype=np.int64))

    def _check_sampleable(self, batch_size: int, size: int, trainer: int) -> None:
        if size < 1:
            raise _not_enough_data(batch_size, size, 1, "prioritized rows")
        if not self.trees.total(trainer) > 0.0:
            raise ValueError(
                f"every priority of trainer {trainer} is 0 (eps={self.eps} and all TD errors "
                "were 0); use eps > 0 so that every slot stays sampleable"
            )

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if not isinstance(self.trees, PriorityTrees):
            return self._sample_on_device(self.trees, batch_size, size, rng, trainer)
        self._check_sampleable(batch_size, size, trainer)
        uniforms = self._uniforms(batch_size, rng)
        indices = np.empty(batch_size, dtype=np.int64)
        weights = np.empty(batch_size, dtype=np.float32)
        beta = self.beta_for(trainer)
        per_sample(
            self.trees.sums[trainer], self.trees.leaf_offset, uniforms, beta, indices, weights
        )
        self.batches_drawn[trainer] += 1
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
        self.raise_pending_errors()
        if size < 1:
            raise _not_enough_data(batch_size, size, 1, "prioritized rows")
        uniforms = self._uniforms(batch_size, rng)
        indices, weights, total = trees.draw(trainer, uniforms, self.beta_for(trainer))
        if not total > 0.0:
            self._check_sampleable(batch_size, size, trainer)  # raises: every priority is 0
        self.batches_drawn[trainer] += 1
        return indices, weights

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        if not isinstance(self.trees, PriorityTrees):
            self.raise_pending_errors()
            code, position = self.trees.apply_td_errors(
                trainer,
                indices,
                td_errors,
                stale,
                _PRIORITY_MODE_CODES[self.priority],
                self.eps,
                self.alpha,
            )
            self._unchecked.append((code, position, td_errors))
            return
        td = np.asarray(td_errors)
        if td.dtype.kind not in "iuf":
            raise TypeError(
                f"td_errors must be a real numeric array; got dtype {td.dtype} ({td_errors!r:.80})"
            )
        if td.shape != indices.shape:
            raise ValueError(
                f"td_errors must have shape {indices.shape}, one per index; got shape {td.shape}"
            )
        _apply_td_errors(
            self.trees,
            trainer,
            indices,
            td,
            stale,
            _PRIORITY_MODE_CODES[self.priority],
            self.eps,
            self.alpha,
            self._track_max,
            self._setting(),
        )

    def config(self) -> dict[str, Any]:
        beta = self.beta.to_dict() if isinstance(self.beta, LinearBeta) else self.beta
        return {
            "alpha": self.alpha,
            "beta": beta,
            "eps": self.eps,
            "priority": self.priority,
            "order": self.order,
            "index": self.index,
        }

    def state_dict(self) -> dict[str, Any]:
        self.raise_pending_errors()
        return {**self.trees.state_dict(), "batches_drawn": self.batches_drawn.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        drawn = _batches_drawn(state, self.n_trainers)
        self.trees.load_state_dict(state)
        self.batches_drawn[:] = drawn


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
    #: the runs read leaves and priorities on the host: always host trees (no ``index``)
    trees: PriorityTrees
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
        beta = self.beta_for(trainer)
        table = self.predictor.step_table()
        if table is None:
            indices, weights = self._sample_general(uniforms, size, trainer, beta)
        else:
            indices = np.empty(batch_size, dtype=np.int64)
            weights = np.empty(batch_size, dtype=np.float32)
            locality_sample(
                self.trees.sums[trainer],
                self.trees.maxes[trainer],
                self.trees.leaf_offset,
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
        self.batches_drawn[trainer] += 1
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
        targets = uniforms * self.trees.sums[trainer, 1]
        find_prefix(self.trees.sums[trainer], self.trees.leaf_offset, targets, refs)
        leaves = self.trees.leaves(trainer)
        priorities = self.trees.priorities(trainer)
        max_priority = self.trees.maxes[trainer, 1]
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
        weights = ((mass.min() / mass) ** beta).astype(np.float32)
        return indices, weights

    def inclusion_probabilities(self, size: int, trainer: int = 0) -> np.ndarray:
        """Exact long-run per-row probability ``P(j)`` of every slot (shape (capacity,),
        float64, sums to 1; 0 for unwritten slots).

        ``P(j) = sum_k P_ref(j - k) [len(j - k) > k] / E[len]``: the expected share of batch
        rows equal to ``j`` when references are drawn without end. A real batch stops after
        ``batch_size`` rows and cuts its last run, which shifts each slot's expected count by
        ``O(max run length / batch_size)`` relative to ``batch_size * P(j)``.
        """
        self._check_sampleable(1, size, trainer)
        leaves = self.trees.leaves(trainer)
        reference = leaves / leaves.sum()
        lengths = self._run_lengths(self.trees.priorities(trainer) / self.trees.maxes[trainer, 1])
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


class Sequence(Sampler):
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
        self.length = _positive_int("length", length)
        if isinstance(burn_in, bool) or not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
            raise ValueError(f"burn_in must be an int >= 0; got burn_in={burn_in!r}")
        self.burn_in = int(burn_in)
        for name, flag in (("pad", pad), ("prioritized", prioritized), ("replace", replace)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool; got {name}={flag!r}")
        self.replace = bool(replace)
        self.pad = bool(pad)
        self.prioritized = bool(prioritized)
        self.weighted = self.prioritized
        self.eta = finite_float("eta", eta, 0.0, 1.0)
        self.alpha, self.beta, self.eps, _ = check_priority_args(alpha, beta, eps, "abs")
        self.episodes: EpisodeIndex | None = None

    @property
    def steps(self) -> int:
        """``L = burn_in + length``: steps per sequence."""
        return self.burn_in + self.length

    def bind(self, capacity: int, n_trainers: int) -> None:
        if self.steps > capacity:
            raise ValueError(
                f"a sequence of burn_in + length = {self.steps} steps does not fit a buffer of "
                f"capacity={capacity}; use a larger buffer or shorter sequences"
            )
        super().bind(capacity, n_trainers)
        #: per slot, whether it may start a sequence (pad=False: length steps stored)
        self.startable = np.zeros(self.capacity if not self.pad else 0, dtype=bool)
        self.trees: PriorityTrees | None = None
        if self.prioritized:
            self.trees = PriorityTrees(self.capacity, self.n_trainers, self.alpha, False)
        elif not self.pad:  # one tree of 0/1 leaves: uniform draws over the valid starts
            self.trees = PriorityTrees(self.capacity, 1, 1.0, False)
        #: per trainer and start slot, the valid training steps when it was last handed out
        self.valid_steps = np.zeros(
            (self.n_trainers, self.capacity) if self.prioritized else (0, 0), dtype=np.int32
        )
        self.batches_drawn = np.zeros(self.n_trainers, dtype=np.int64)
        self._fresh_priorities = False
        self._zeros = np.zeros(self.trees.n_trees if self.trees is not None else 0, np.float64)

    def attach_episodes(self, episodes: EpisodeIndex) -> None:
        """Read the buffer's episode index (called by the buffer at construction)."""
        self.episodes = episodes

    def _index(self) -> EpisodeIndex:
        if self.episodes is None:
            raise RuntimeError("Sequence is used by a buffer that keeps no episode index")
        return self.episodes

    def _set(self, slots: np.ndarray, valid: bool) -> None:
        """Leaves of ``slots`` in every tree: the running max (valid starts) or 0."""
        trees = self.trees
        if trees is None or not slots.shape[0]:
            return
        if valid:
            trees.fill_new(slots)
        else:
            zeros = self._zeros
            fill_new_slots(trees.sums, trees.maxes, trees.leaf_offset, slots, zeros, zeros, False)

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
        return self.trees.total(trainer if self.prioritized else 0) if self.trees else 1.0

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if size < 1:
            raise _not_enough_data(batch_size, size, 1, "sequences")
        if self.trees is not None and not self._n_starts(trainer) > 0.0:
            if not self.pad and not self.startable[:size].any():
                raise ValueError(
                    f"no stored episode has length={self.length} steps yet, so pad=False has no "
                    "sequence start; add more data, use shorter sequences or pad=True"
                )
            raise ValueError(
                f"every priority of trainer {trainer} is 0 (eps={self.eps} and all TD errors "
                "were 0); use eps > 0 so that every start stays sampleable"
            )
        if not self.replace:
            self._check_distinct(batch_size, size, trainer)
        if self.trees is None:  # uniform, pad=True: every stored slot
            draws = rng.integers(0, size, size=batch_size, dtype=np.int64)
            return (draws if self.replace else _distinct(draws, size, rng)), None
        starts = np.empty(batch_size, dtype=np.int64)
        if not self.prioritized:
            targets = rng.random(batch_size) * self.trees.total(0)
            find_prefix(self.trees.sums[0], self.trees.leaf_offset, targets, starts)
            if not self.replace:
                starts = _distinct_from_tree(starts, self.trees.sums[0], self.trees, 0, rng)
            return starts, None
        weights = np.empty(batch_size, dtype=np.float32)
        beta = self.beta_at(int(self.batches_drawn[trainer]))
        per_sample(
            self.trees.sums[trainer],
            self.trees.leaf_offset,
            rng.random(batch_size),
            beta,
            starts,
            weights,
        )
        if not self.replace:
            starts = _distinct_from_tree(starts, self.trees.sums[trainer], self.trees, trainer, rng)
            mass = self.trees.leaves(trainer)[starts]
            weights = ((mass.min() / mass) ** beta).astype(np.float32)
        self.batches_drawn[trainer] += 1
        return starts, weights

    def _check_distinct(self, batch_size: int, size: int, trainer: int) -> None:
        """Refuse ``batch_size`` distinct starts beyond the starts there are."""
        if self.trees is None:
            count = size
        else:
            leaves = self.trees.leaves(trainer if self.prioritized else 0)
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
        return float(size) if self.trees is None else self._n_starts(trainer)

    def sampling_probabilities(self, indices: Any, size: int, trainer: int = 0) -> np.ndarray:
        """The probability (float64, shape of ``indices``) with which a sequence of
        ``trainer``'s batch starts at each slot of ``indices`` (valid starts, in
        ``[0, size)``): ``weight(s) / start_total`` (see :meth:`start_total`)."""
        idx = np.asarray(indices, dtype=np.int64)
        total = self.start_total(size, trainer)
        if self.trees is None:
            return np.full(idx.shape, 1.0 / total)
        return self.trees.leaves(trainer if self.prioritized else 0)[idx] / total

    def beta_at(self, batches_drawn: int) -> float:
        """β of the batch a trainer draws after ``batches_drawn`` earlier ones (prioritized
        sequences), as :meth:`Prioritized.beta_at`."""
        if isinstance(self.beta, LinearBeta):
            return self.beta(int(batches_drawn))
        return self.beta

    def max_priority(self, trainer: int = 0) -> float:
        """``trainer``'s running maximum priority (prioritized sequences): what a new start
        gets, as :meth:`Prioritized.max_priority`."""
        if not self.prioritized or self.trees is None:
            raise TypeError(f"{self!r} keeps no priorities (prioritized=False)")
        return float(self.trees.max_priority[trainer])

    def raise_max_priority(self, priorities: Any) -> None:
        """Raise every trainer's running maximum priority to at least ``priorities[t]``
        (shape (n_trainers,), finite, > 0), as :meth:`Prioritized.raise_max_priority`."""
        if not self.prioritized or self.trees is None:
            raise TypeError(f"{self!r} keeps no priorities (prioritized=False)")
        _raise_max_priority(self.trees, priorities)

    def handed(self, trainer: int, starts: np.ndarray, valid_steps: np.ndarray) -> None:
        """Record the valid training steps (shape (B,)) of sequences handed to ``trainer``, for
        the R2D2 mix of a later ``update_priorities`` with per-step errors."""
        if self.prioritized:
            self.valid_steps[trainer, starts] = valid_steps

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        if not self.prioritized or self.trees is None:
            super().update_priorities(indices, td_errors, trainer, stale)
            return
        td = np.asarray(td_errors)
        n = indices.shape[0]
        if td.dtype.kind not in "iuf":
            raise TypeError(
                f"td_errors must be a real numeric array; got dtype {td.dtype} ({td_errors!r:.80})"
            )
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
        _apply_td_errors(
            self.trees,
            trainer,
            indices,
            td,
            stale,
            MODE_ABS,
            self.eps,
            self.alpha,
            False,
            f"alpha={self.alpha}",
        )

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
        if self.trees is None:
            return
        trees = self.trees
        valid = self.startable if not self.pad else np.arange(self.capacity) < size
        for t in range(trees.n_trees):
            leaves = trees.leaves(t)
            if not self.prioritized or self._fresh_priorities:
                leaves[:] = np.where(valid, trees.max_priority[t] ** trees.alpha, 0.0)
            else:
                leaves[~valid] = 0.0
            rebuild(trees.sums[t], trees.leaf_offset, False)
        self._fresh_priorities = False

    def config(self) -> dict[str, Any]:
        beta = self.beta.to_dict() if isinstance(self.beta, LinearBeta) else self.beta
        return {
            "length": self.length,
            "burn_in": self.burn_in,
            "pad": self.pad,
            "prioritized": self.prioritized,
            "eta": self.eta,
            "alpha": self.alpha,
            "beta": beta,
            "eps": self.eps,
            "replace": self.replace,
        }

    def state_dict(self) -> dict[str, Any]:
        if not self.prioritized or self.trees is None:
            return {}  # the 0/1 tree of pad=False is rebuilt from the episode index
        return {**self.trees.state_dict(), "batches_drawn": self.batches_drawn.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output. A prioritized sequence sampler also accepts an
        empty state (one saved by another sampler): every start then gets priority 1. The
        buffer calls :meth:`rebuild` once the episode index is loaded."""
        if not self.prioritized or self.trees is None:
            return
        if not state:
            self.trees.max_priority[:] = 1.0
            self.batches_drawn[:] = 0
            self._fresh_priorities = True
            return
        drawn = _batches_drawn(state, self.n_trainers)
        self.trees.load_state_dict(state)
        self.batches_drawn[:] = drawn
        self._fresh_priorities = False


def _distinct(draws: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` (shape (B,), int64, i.i.d. uniform in ``[0, size)``, ``B <= size``) made
    distinct: a repeated value is replaced by a fresh draw until none repeats, which gives a
    uniform sample without replacement in random order (the distinct values of i.i.d. draws in
    the order they first appear). Selection by a random permutation once ``B`` is a large
    share of ``size`` (where repeats would take many rounds)."""
    batch_size = draws.shape[0]
    if batch_size > _config.SELECTION_SAMPLING_FRACTION * size:
        return rng.permutation(size)[:batch_size].astype(np.int64)
    while True:
        if len(set(draws.tolist())) == batch_size:  # the common case, without sorting
            return draws
        _, first = np.unique(draws, return_index=True)
        repeated = np.ones(batch_size, dtype=bool)
        repeated[first] = False
        draws[repeated] = rng.integers(0, size, size=int(repeated.sum()), dtype=np.int64)


def _distinct_from_tree(
    draws: np.ndarray, sums: np.ndarray, trees: PriorityTrees, tree: int, rng: np.random.Generator
) -> np.ndarray:
    """``draws`` (shape (B,), int64, slots drawn from sum-tree ``sums``, row ``tree`` of
    ``trees``, with at least ``B`` nonzero leaves) made distinct: repeats are replaced by fresh
    draws from the tree until none is left (successive sampling in proportion to the leaves
    among the slots not yet drawn), the first occurrences keeping their places."""
    batch_size = draws.shape[0]
    total = trees.total(tree)
    while len(set(draws.tolist())) != batch_size:
        _, first = np.unique(draws, return_index=True)
        repeated = np.ones(batch_size, dtype=bool)
        repeated[first] = False
        fresh = np.empty(int(repeated.sum()), dtype=np.int64)
        find_prefix(sums, trees.leaf_offset, rng.random(fresh.shape[0]) * total, fresh)
        draws[repeated] = fresh
    return draws


class Episodes(Sampler):
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
        self.max_length = None if max_length is None else _positive_int("max_length", max_length)
        for name, flag in (("replace", replace), ("prioritized", prioritized)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool; got {name}={flag!r}")
        self.replace = bool(replace)
        self.prioritized = bool(prioritized)
        self.weighted = self.prioritized
        self.alpha, self.beta, self.eps, _ = check_priority_args(alpha, beta, eps, "abs")
        self.episodes: EpisodeIndex | None = None

    def bind(self, capacity: int, n_trainers: int) -> None:
        if self.max_length is not None and self.max_length > capacity:
            raise ValueError(
                f"max_length={self.max_length} is longer than the buffer's capacity={capacity}; "
                "use a larger buffer or a shorter max_length"
            )
        super().bind(capacity, n_trainers)
        self.trees: PriorityTrees | None = None
        if self.prioritized:
            self.trees = PriorityTrees(self.capacity, self.n_trainers, self.alpha, False)
        self.batches_drawn = np.zeros(self.n_trainers, dtype=np.int64)
        self._fresh_priorities = False
        self._zeros = np.zeros(self.n_trainers if self.prioritized else 0, dtype=np.float64)

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
        trees = self.trees
        if trees is None:
            return
        if first_slots is not None:
            trees.fill_new(first_slots)
            return
        index = self._index()
        valid = index.complete_position >= 0
        for t in range(trees.n_trees):
            leaves = trees.leaves(t)
            if self._fresh_priorities:
                leaves[:] = np.where(valid, trees.max_priority[t] ** trees.alpha, 0.0)
            else:
                leaves[~valid] = 0.0
            rebuild(trees.sums[t], trees.leaf_offset, False)
        self._fresh_priorities = False

    def on_write(self, slots: np.ndarray) -> None:
        trees = self.trees
        if trees is None:
            return
        # written slots hold no episode start any more, unless one completed in this write
        cleared = slots[self._index().complete_position[slots] < 0]
        if cleared.shape[0]:
            zeros = self._zeros
            fill_new_slots(trees.sums, trees.maxes, trees.leaf_offset, cleared, zeros, zeros, False)

    def check_batch_size(self, batch_size: int) -> int:
        return _positive_int("batch_size", batch_size)

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
        if self.trees is None:
            positions = rng.integers(0, stored, size=batch_size, dtype=np.int64)
            if not self.replace:
                positions = _distinct(positions, stored, rng)
            return index.complete[positions], None
        return self._sample_prioritized(batch_size, rng, trainer)

    def _sample_prioritized(
        self, batch_size: int, rng: np.random.Generator, trainer: int
    ) -> tuple[np.ndarray, np.ndarray]:
        trees = self.trees
        assert trees is not None
        total = trees.total(trainer)
        if not total > 0.0:
            raise ValueError(
                f"every priority of trainer {trainer} is 0 (eps={self.eps} and all TD errors "
                "were 0); use eps > 0 so that every episode stays sampleable"
            )
        starts = np.empty(batch_size, dtype=np.int64)
        find_prefix(trees.sums[trainer], trees.leaf_offset, rng.random(batch_size) * total, starts)
        if not self.replace:
            starts = _distinct_from_tree(starts, trees.sums[trainer], trees, trainer, rng)
        mass = trees.leaves(trainer)[starts]
        beta = (
            self.beta(int(self.batches_drawn[trainer]))
            if isinstance(self.beta, LinearBeta)
            else self.beta
        )
        weights = ((mass.min() / mass) ** beta).astype(np.float32)
        self.batches_drawn[trainer] += 1
        return starts, weights

    def update_priorities(
        self, indices: np.ndarray, td_errors: np.ndarray, trainer: int, stale: np.ndarray
    ) -> None:
        """One priority per episode: ``|td| + eps`` for each first slot in ``indices`` (an
        update for a slot that no longer starts a complete episode is dropped)."""
        if self.trees is None:
            super().update_priorities(indices, td_errors, trainer, stale)
            return
        td = np.asarray(td_errors)
        if td.dtype.kind not in "iuf":
            raise TypeError(
                f"td_errors must be a real numeric array; got dtype {td.dtype} ({td_errors!r:.80})"
            )
        if td.shape != indices.shape:
            raise ValueError(
                f"td_errors must have shape {indices.shape}, one value per episode; got shape "
                f"{td.shape}"
            )
        stale = stale | (self._index().complete_position[indices] < 0)
        _apply_td_errors(
            self.trees,
            trainer,
            indices,
            td,
            stale,
            MODE_ABS,
            self.eps,
            self.alpha,
            False,
            f"alpha={self.alpha}",
        )

    def config(self) -> dict[str, Any]:
        beta = self.beta.to_dict() if isinstance(self.beta, LinearBeta) else self.beta
        return {
            "max_length": self.max_length,
            "replace": self.replace,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "beta": beta,
            "eps": self.eps,
        }

    def state_dict(self) -> dict[str, Any]:
        if self.trees is None:
            return {}
        return {**self.trees.state_dict(), "batches_drawn": self.batches_drawn.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output. A prioritized sampler also accepts an empty
        state (one saved by another sampler): every episode then gets priority 1 when the
        buffer rebuilds the episode index."""
        if self.trees is None:
            return
        if not state:
            self.trees.max_priority[:] = 1.0
            self.batches_drawn[:] = 0
            self._fresh_priorities = True
            return
        drawn = _batches_drawn(state, self.n_trainers)
        self.trees.load_state_dict(state)
        self.batches_drawn[:] = drawn
        self._fresh_priorities = False
