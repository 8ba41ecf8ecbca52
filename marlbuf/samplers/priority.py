"""The priority state every prioritized sampler shares.

:class:`PriorityState` is prioritized replay's bookkeeping, written once: one float64 sum-tree
per trainer (:class:`marlbuf.prioritized.PriorityTrees`, or tensor trees on a torch device),
the exponent α, the β schedule and each trainer's place in it, ε, the checks of TD errors,
the running maximum priority new entries get, and the state that is saved and loaded.
:class:`~marlbuf.samplers.Prioritized`, :class:`~marlbuf.samplers.PrioritizedNeighbor`, a
prioritized :class:`~marlbuf.samplers.Sequence` and prioritized
:class:`~marlbuf.samplers.Episodes` each hold one and differ only in what a tree's leaves
stand for (a slot, a sequence start, an episode's first slot) and how a batch is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from marlbuf._kernels import apply_td_errors, fill_new_slots, rebuild
from marlbuf._kernels.sumtree import MODE_ABS, MODE_GIVEN, MODE_SQUARED
from marlbuf.prioritized import (
    LinearBeta,
    PriorityTrees,
    check_priority_args,
    checked_tree_state,
    raise_td_error,
)

if TYPE_CHECKING:
    from marlbuf.stores.torch_priority import TensorPriorityTrees

#: the kernels' code of each ``priority`` mode (see :data:`marlbuf.prioritized.PRIORITY_MODES`)
MODE_CODES = {"abs": MODE_ABS, "squared": MODE_SQUARED, "given": MODE_GIVEN}


def real_td(td_errors: Any) -> np.ndarray:
    """``td_errors`` as a NumPy array of real numbers (a ``TypeError`` otherwise)."""
    td = np.asarray(td_errors)
    if td.dtype.kind not in "iuf":
        raise TypeError(
            f"td_errors must be a real numeric array; got dtype {td.dtype} ({td_errors!r:.80})"
        )
    return td


def td_per_index(td_errors: Any, shape: tuple[int, ...], each: str) -> np.ndarray:
    """``td_errors`` checked by :func:`real_td` and for ``shape`` (``each`` says what one
    value is for, in the error)."""
    td = real_td(td_errors)
    if td.shape != shape:
        raise ValueError(f"td_errors must have shape {shape}, {each}; got shape {td.shape}")
    return td


def clear_slots(trees: PriorityTrees, slots: np.ndarray, zeros: np.ndarray) -> None:
    """Set the leaves of ``slots`` (shape (T,), int64) to 0 in every tree of ``trees``
    (``zeros``: shape (n_trees,), float64, all 0)."""
    fill_new_slots(trees.sums, trees.maxes, trees.leaf_offset, slots, zeros, zeros, False)


def reset_leaves(trees: PriorityTrees, valid: np.ndarray, fill: bool) -> None:
    """Make every tree of ``trees`` agree with ``valid`` (shape (capacity,), bool: the slots
    that may be drawn): 0 elsewhere and, with ``fill``, each tree's running maximum
    ``** alpha`` at every valid slot (else the valid leaves keep their values)."""
    for t in range(trees.n_trees):
        leaves = trees.leaves(t)
        if fill:
            leaves[:] = np.where(valid, trees.max_priority[t] ** trees.alpha, 0.0)
        else:
            leaves[~valid] = 0.0
        rebuild(trees.sums[t], trees.leaf_offset, False)


def importance_weights(mass: np.ndarray, beta: float) -> np.ndarray:
    """``(N P(i))^-beta`` divided by the batch maximum, from each row's probability mass
    ``mass`` (shape (B,), float64, > 0): float32 of shape (B,)."""
    weights: np.ndarray = ((mass.min() / mass) ** beta).astype(np.float32)
    return weights


class PriorityState:
    """Priorities of one prioritized sampler: trees, α, β schedule, ε, TD checks, running
    maximum, batches drawn per trainer, and their state.

    Parameters
    ----------
    alpha, beta, eps
        As in :class:`marlbuf.samplers.Prioritized` (checked here).
    priority : {"abs", "squared", "given"} or None, default None
        How a TD error becomes a priority; ``None``: ``"abs"``, an option the sampler does not
        offer (error messages then leave it out).
    what : str, default "slot"
        What a leaf stands for, in error messages (``"slot"``, ``"start"``, ``"episode"``).

    Attributes
    ----------
    trees : PriorityTrees or TensorPriorityTrees
        One tree per trainer (after :meth:`bind`).
    batches_drawn : ndarray, shape (n_trainers,), int64
        Each trainer's position in the β schedule.
    fresh : bool
        A loaded state carried no priorities: the next :meth:`reset_leaves` gives every valid
        entry the running maximum.
    """

    def __init__(
        self, alpha: Any, beta: Any, eps: Any, priority: str | None = None, what: str = "slot"
    ) -> None:
        self.alpha, self.beta, self.eps, self.priority = check_priority_args(
            alpha, beta, eps, "abs" if priority is None else priority
        )
        self.mode = MODE_CODES[self.priority]
        self.what = what
        self.setting = (
            f"alpha={self.alpha}"
            if priority is None
            else f"priority={self.priority!r}, alpha={self.alpha}"
        )

    def bind(self, capacity: int, n_trainers: int, track_max: bool = False) -> None:
        """One tree per trainer over ``capacity`` leaves, every running maximum 1."""
        self.track_max = bool(track_max)
        self.trees: PriorityTrees | TensorPriorityTrees = PriorityTrees(
            capacity, n_trainers, self.alpha, self.track_max
        )
        self.batches_drawn = np.zeros(n_trainers, dtype=np.int64)
        self.fresh = False
        self.zeros = np.zeros(n_trainers, dtype=np.float64)
        #: results of device updates not yet checked: (code, position, td errors)
        self.unchecked: list[tuple[Any, Any, Any]] = []

    def place(self, device: Any) -> None:
        """Move the (still empty) trees to tensors on the torch ``device``."""
        from marlbuf.stores.torch_priority import TensorPriorityTrees

        trees = self.trees
        self.trees = TensorPriorityTrees(
            trees.capacity, trees.n_trees, self.alpha, self.track_max, device
        )

    @property
    def on_device(self) -> bool:
        """Whether the trees are tensors on a torch device (:meth:`place`)."""
        return not isinstance(self.trees, PriorityTrees)

    def host_trees(self) -> PriorityTrees:
        """The trees, which must be host trees (every sampler but a device ``Prioritized``)."""
        trees = self.trees
        assert isinstance(trees, PriorityTrees)
        return trees

    def config(self) -> dict[str, Any]:
        """``alpha``, ``beta`` (a schedule as its ``to_dict()``) and ``eps``, JSON-safe."""
        beta = self.beta.to_dict() if isinstance(self.beta, LinearBeta) else self.beta
        return {"alpha": self.alpha, "beta": beta, "eps": self.eps}

    def beta_at(self, batches_drawn: int) -> float:
        """β of the batch a trainer draws after ``batches_drawn`` earlier ones."""
        if isinstance(self.beta, LinearBeta):
            return self.beta(int(batches_drawn))
        return self.beta

    def beta_for(self, trainer: int) -> float:
        """β of ``trainer``'s next batch."""
        return self.beta_at(int(self.batches_drawn[trainer]))

    def drew(self, trainer: int) -> None:
        """``trainer`` drew a batch: one step along the β schedule."""
        self.batches_drawn[trainer] += 1

    def max_priority(self, trainer: int) -> float:
        """``trainer``'s running maximum priority."""
        return float(self.trees.max_priority[trainer])

    def raise_max_priority(self, priorities: Any) -> None:
        """Raise every tree's running maximum priority to at least ``priorities[t]`` (checked:
        shape (n_trees,), finite, > 0)."""
        trees = self.trees
        values = np.asarray(priorities, dtype=np.float64)
        if values.shape != (trees.n_trees,) or not (np.isfinite(values) & (values > 0)).all():
            raise ValueError(
                f"priorities must hold one finite priority > 0 per trainer, shape "
                f"({trees.n_trees},); got {priorities!r:.120}"
            )
        trees.raise_max(values)

    def check_drawable(self, trainer: int, total: float) -> None:
        """Refuse a draw from ``trainer``'s tree whose ``total`` mass is 0."""
        if not total > 0.0:
            raise ValueError(
                f"every priority of trainer {trainer} is 0 (eps={self.eps} and all TD errors "
                f"were 0); use eps > 0 so that every {self.what} stays sampleable"
            )

    def update(self, trainer: int, indices: np.ndarray, td: np.ndarray, stale: np.ndarray) -> None:
        """Set ``trainer``'s priorities at ``indices`` (shape (n,), int64) from ``td`` (shape
        (n,), real), skipping ``stale`` entries (shape (n,), bool), and raise the running
        maximum. One kernel validates every entry first, so bad input writes nothing and
        raises a ``ValueError`` naming the entry."""
        trees = self.host_trees()
        td = np.ascontiguousarray(td, dtype=np.float64)
        code, position, largest = apply_td_errors(
            trees.sums[trainer],
            trees.maxes[trainer] if self.track_max else trees.empty,
            trees.leaf_offset,
            np.ascontiguousarray(indices, dtype=np.int64),
            td,
            np.ascontiguousarray(stale, dtype=np.bool_),
            self.mode,
            self.eps,
            self.alpha,
            self.track_max,
        )
        raise_td_error(code, position, td, self.setting)
        trees.max_priority[trainer] = max(trees.max_priority[trainer], largest)

    def update_on_device(
        self, trainer: int, indices: np.ndarray, td_errors: Any, stale: np.ndarray
    ) -> None:
        """:meth:`update` on tensor trees: written on the device, checked later
        (:meth:`raise_pending_errors`)."""
        self.raise_pending_errors()
        trees: Any = self.trees
        code, position = trees.apply_td_errors(
            trainer, indices, td_errors, stale, self.mode, self.eps, self.alpha
        )
        self.unchecked.append((code, position, td_errors))

    def raise_pending_errors(self) -> None:
        """Raise the first error of the device updates made since the last check (each bad
        update wrote nothing); a no-op for host trees, whose updates raise at once."""
        if not self.unchecked:
            return
        pending, self.unchecked = self.unchecked, []
        from marlbuf.stores.torch_priority import first_td_error

        code, position, td = first_td_error(pending)
        raise_td_error(code, position, td, self.setting)

    def clear(self, slots: np.ndarray) -> None:
        """Leaves of ``slots`` (shape (T,), int64) set to 0 in every tree."""
        clear_slots(self.host_trees(), slots, self.zeros)

    def reset_leaves(self, valid: np.ndarray) -> None:
        """Trees consistent with ``valid`` (see :func:`reset_leaves`): the running maximum at
        every valid entry after a state without priorities was loaded, else 0 at the others."""
        reset_leaves(self.host_trees(), valid, self.fresh)
        self.fresh = False

    def state_dict(self) -> dict[str, Any]:
        """The trees' leaves and maxima, and ``batches_drawn``."""
        self.raise_pending_errors()
        return {**self.trees.state_dict(), "batches_drawn": self.batches_drawn.copy()}

    def check_loaded(
        self, state: Mapping[str, Any], filled: int | None = None, allow_empty: bool = False
    ) -> np.ndarray:
        """Check a loaded :meth:`state_dict` output as a whole and return its
        ``batches_drawn``; changes nothing. The trees' leaves (and maxima) must fit the trees,
        be finite and non-negative, and 0 from entry ``filled`` on (entries never written);
        the running maxima finite and positive (:func:`marlbuf.prioritized.checked_tree_state`).
        With ``allow_empty`` an empty state (saved by a sampler without priorities) passes."""
        if allow_empty and isinstance(state, Mapping) and not state:
            return np.zeros_like(self.batches_drawn)
        trees = self.trees
        checked_tree_state(state, trees.n_trees, trees.capacity, self.track_max, filled)
        return self.checked_batches_drawn(state)

    def checked_batches_drawn(self, state: Mapping[str, Any]) -> np.ndarray:
        """A state's ``batches_drawn``, checked: shape (n_trainers,), integers >= 0."""
        if not isinstance(state, Mapping):
            raise ValueError(f"sampler state must be a mapping; got {type(state).__name__}")
        try:
            drawn = np.asarray(state.get("batches_drawn"), dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"sampler state 'batches_drawn' is not integers ({exc})") from exc
        if drawn.shape != self.batches_drawn.shape or np.any(drawn < 0):
            raise ValueError(
                f"sampler state 'batches_drawn' has shape {drawn.shape}; expected "
                f"{self.batches_drawn.shape}, each >= 0"
            )
        return drawn

    def load_state_dict(self, state: Mapping[str, Any], allow_empty: bool = False) -> None:
        """Restore :meth:`state_dict` output; each part is checked before anything changes
        (the trees check theirs in their ``load_state_dict``, as :meth:`check_loaded` does).
        With ``allow_empty``, an empty state (saved by a sampler without priorities) sets every
        running maximum to 1 and marks the state :attr:`fresh`."""
        if allow_empty and isinstance(state, Mapping) and not state:
            self.trees.max_priority[:] = 1.0
            self.batches_drawn[:] = 0
            self.fresh = True
            return
        drawn = self.checked_batches_drawn(state)
        self.trees.load_state_dict(state)  # checks the tree state first, then restores
        self.batches_drawn[:] = drawn
        self.fresh = False


class HoldsPriorities:
    """What a sampler holding a :class:`PriorityState` (``priority_state``) shows of it:
    ``alpha``, ``beta`` (settable: a new constant or schedule), ``eps``, the trees, the β
    schedule and the running maximum."""

    priority_state: PriorityState
    #: whether the sampler keeps priorities (a sampler where they are an option says so)
    weighted: bool
    #: whether a state without priorities (saved by the same sampler with
    #: ``prioritized=False``) loads: every entry then gets priority 1
    loads_without_priorities: bool = True

    def state_dict(self) -> dict[str, Any]:
        """The priority state (:meth:`PriorityState.state_dict`); empty without priorities."""
        return self.priority_state.state_dict() if self.weighted else {}

    def check_loaded(self, state: Mapping[str, Any], filled: int) -> None:
        """Check a loaded :meth:`state_dict` output for a buffer whose slots ``[0, filled)``
        are written (:meth:`PriorityState.check_loaded`); changes nothing."""
        if self.weighted:
            self.priority_state.check_loaded(state, filled, self.loads_without_priorities)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output. Where :attr:`loads_without_priorities`, an
        empty state (one saved without priorities) gives every entry priority 1 once the
        buffer rebuilds its index."""
        if self.weighted:
            self.priority_state.load_state_dict(state, self.loads_without_priorities)

    @property
    def alpha(self) -> float:
        """Priority exponent."""
        return self.priority_state.alpha

    @property
    def beta(self) -> float | LinearBeta:
        """Importance-sampling exponent, or its schedule."""
        return self.priority_state.beta

    @beta.setter
    def beta(self, value: float | LinearBeta) -> None:
        self.priority_state.beta = value

    @property
    def eps(self) -> float:
        """Added to every priority."""
        return self.priority_state.eps

    @property
    def trees(self) -> Any:
        """The priority trees (one per trainer)."""
        return self.priority_state.trees

    @property
    def batches_drawn(self) -> np.ndarray:
        """Batches each trainer drew: its place in the β schedule (shape (n_trainers,))."""
        return self.priority_state.batches_drawn

    def beta_for(self, trainer: int) -> float:
        """β of ``trainer``'s next batch."""
        return self.priority_state.beta_for(trainer)

    def beta_at(self, batches_drawn: int) -> float:
        """β of the batch a trainer draws after ``batches_drawn`` earlier ones: the constant
        ``beta``, or the :class:`marlbuf.prioritized.LinearBeta` schedule at that step (for a
        caller that counts batches itself, such as the learner of a sharded buffer)."""
        return self.priority_state.beta_at(batches_drawn)

    def _keeps_priorities(self) -> PriorityState:
        if not self.weighted:
            raise TypeError(f"{self!r} keeps no priorities (prioritized=False)")
        return self.priority_state

    def max_priority(self, trainer: int = 0) -> float:
        """``trainer``'s running maximum priority: what a new slot (start, episode) gets
        (starts at 1, raised by every priority update and by :meth:`raise_max_priority`)."""
        return self._keeps_priorities().max_priority(trainer)

    def raise_max_priority(self, priorities: Any) -> None:
        """Raise every trainer's running maximum priority to at least ``priorities[t]``
        (shape (n_trainers,), finite, > 0; lower values leave it alone): new slots then enter
        with the maximum known elsewhere (the other shards of a sharded buffer)."""
        self._keeps_priorities().raise_max_priority(priorities)
