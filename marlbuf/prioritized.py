"""Building blocks of the prioritized samplers: priority trees, β schedules, run-length predictors.

The samplers themselves (:class:`marlbuf.samplers.Prioritized` and
:class:`marlbuf.samplers.PrioritizedNeighbor`) live in :mod:`marlbuf.samplers`; this module
holds what they are made of, so that it can be used and tested on its own:

* :class:`PriorityTrees` - one float64 sum-tree (and, for the locality sampler, one max-tree)
  per trainer over the shared ring of slots, with batched Numba updates and searches.
* :class:`LinearBeta` - the importance-sampling exponent annealed linearly ``start -> end``.
* :class:`RunLengthPredictor` and :class:`ThresholdPredictor` - map a reference slot's
  normalised priority ``p / max p`` to the length of the run sampled from it.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlbuf._kernels import fill_new_slots, rebuild, set_leaves
from marlbuf._kernels.sumtree import TD_NEGATIVE, TD_NOT_FINITE, TD_OVERFLOW


def finite_float(name: str, value: Any, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number; got {name}={value!r}")
    value = float(value)
    if not (math.isfinite(value) and low <= value <= high):
        bounds = f"[{low}, {high}]" if math.isfinite(high) else f">= {low}"
        raise ValueError(f"{name} must be finite and {bounds}; got {name}={value!r}")
    return value


# --------------------------------------------------------------------------------- beta
@dataclass(frozen=True)
class LinearBeta:
    """β annealed linearly from ``start`` to ``end`` over ``steps`` batches, then held.

    The step is the number of batches the trainer has drawn so far (each trainer counts its
    own), so ``LinearBeta(0.4, 1.0, steps=n_updates)`` reaches 1 at the end of training as in
    Schaul et al. (2016), Sec. 3.4.

    Parameters
    ----------
    start : float
        β of the first batch, in ``[0, 1]``.
    end : float, default 1.0
        Final β, in ``[0, 1]``.
    steps : int
        Batches over which β moves from ``start`` to ``end``; ``>= 1``.

    Examples
    --------
    >>> beta = LinearBeta(0.5, 1.0, steps=4)
    >>> [beta(s) for s in range(6)]
    [0.5, 0.625, 0.75, 0.875, 1.0, 1.0]
    """

    start: float
    end: float = 1.0
    steps: int = 100_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", finite_float("beta start", self.start, 0.0, 1.0))
        object.__setattr__(self, "end", finite_float("beta end", self.end, 0.0, 1.0))
        steps = self.steps
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(f"beta steps must be a positive int; got steps={steps!r}")
        object.__setattr__(self, "steps", int(steps))

    def __call__(self, step: int) -> float:
        """β after ``step`` batches."""
        fraction = min(max(step, 0) / self.steps, 1.0)
        return self.start + (self.end - self.start) * fraction

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, accepted back by the samplers' ``beta`` argument."""
        return {"schedule": "linear", "start": self.start, "end": self.end, "steps": self.steps}


def parse_beta(beta: Any) -> float | LinearBeta:
    """A constant β in ``[0, 1]``, a :class:`LinearBeta`, or its :meth:`LinearBeta.to_dict`."""
    if isinstance(beta, LinearBeta):
        return beta
    if isinstance(beta, Mapping):
        if beta.get("schedule") != "linear":
            raise ValueError(
                "beta given as a dict must be LinearBeta.to_dict() output "
                f"({{'schedule': 'linear', 'start': ..., 'end': ..., 'steps': ...}}); got {beta!r}"
            )
        args = {k: v for k, v in beta.items() if k != "schedule"}
        try:
            return LinearBeta(**args)
        except TypeError as exc:
            raise ValueError(f"beta dict has unexpected keys: {beta!r} ({exc})") from exc
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"beta must be a float in [0, 1] or a LinearBeta schedule; got beta={beta!r}"
        )
    return finite_float("beta", beta, 0.0, 1.0)


# --------------------------------------------------------------------------------- predictors
#: name -> class, for rebuilding a predictor from its ``config()``.
PREDICTORS: dict[str, type[RunLengthPredictor]] = {}


class RunLengthPredictor(ABC):
    """Maps normalised priorities ``p / max p`` (in ``[0, 1]``) to run lengths (Gogineni et al.,
    Sec. 5.2: the "predictor" of prioritized-locality sampling).

    Subclass it to try another rule; implement :meth:`run_lengths_for`, :attr:`max_run_length`
    and :meth:`config`. Subclasses are registered by class name, so a buffer saved with a custom
    predictor loads again once the class is imported. A subclass that is a step function can
    return its table from :meth:`step_table` to use the fused Numba kernel; otherwise the sampler
    calls :meth:`run_lengths_for` on NumPy arrays (slower, same distribution).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        PREDICTORS[cls.__name__] = cls

    @abstractmethod
    def run_lengths_for(self, normalised: np.ndarray) -> np.ndarray:
        """Run length (int64, ``1 <= len <= max_run_length``) for each normalised priority.

        Parameters
        ----------
        normalised : ndarray, shape (n,), float64
            ``priority / max priority over the buffer``, in ``[0, 1]`` (new slots may be
            slightly above 1: they enter with the running maximum).
        """

    @property
    @abstractmethod
    def max_run_length(self) -> int:
        """The longest run this predictor returns."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-safe)."""

    def step_table(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(thresholds (M-1,) float64, run_lengths (M,) int64)`` if this predictor is the step
        function ``run_lengths[#thresholds <= x]``, else ``None``."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """``{"type": class name, **config()}``, accepted by :meth:`from_config`."""
        return {"type": type(self).__name__, **self.config()}

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> RunLengthPredictor:
        """Rebuild a predictor from :meth:`to_dict` output."""
        name = config.get("type")
        if name not in PREDICTORS:
            raise ValueError(
                f"unknown predictor type {name!r}; known: {sorted(PREDICTORS)} (import the "
                "module that defines a custom predictor before loading)"
            )
        return PREDICTORS[name](**{k: v for k, v in config.items() if k != "type"})

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class ThresholdPredictor(RunLengthPredictor):
    """Step-function predictor: ``run_lengths[m]`` where ``m`` counts thresholds ``<= p/max p``.

    The paper's default, ``thresholds=(0.33, 0.66), run_lengths=(1, 2, 4)``: a reference with
    normalised priority below 0.33 contributes one row, from 0.33 up to (not including) 0.66 two
    rows, from 0.66 on four rows.

    Parameters
    ----------
    thresholds : sequence of float
        Strictly increasing, each in ``(0, 1]``.
    run_lengths : sequence of int
        One more than ``thresholds``; each ``>= 1``.

    Examples
    --------
    >>> ThresholdPredictor().run_lengths_for(np.array([0.1, 0.33, 0.5, 0.66, 1.0])).tolist()
    [1, 2, 2, 4, 4]
    """

    def __init__(
        self,
        thresholds: Sequence[float] = (0.33, 0.66),
        run_lengths: Sequence[int] = (1, 2, 4),
    ) -> None:
        try:
            values = [finite_float("threshold", t, 0.0, 1.0) for t in thresholds]
            lengths = list(run_lengths)
        except TypeError as exc:
            raise TypeError(
                "thresholds must be a sequence of floats and run_lengths a sequence of ints; "
                f"got thresholds={thresholds!r}, run_lengths={run_lengths!r}"
            ) from exc
        if any(b <= a for a, b in itertools.pairwise(values)) or any(t <= 0 for t in values):
            raise ValueError(
                f"thresholds must be strictly increasing and in (0, 1]; got {thresholds!r}"
            )
        if len(lengths) != len(values) + 1:
            raise ValueError(
                f"run_lengths needs one entry more than thresholds ({len(values) + 1}); got "
                f"run_lengths={run_lengths!r} for thresholds={thresholds!r}"
            )
        for length in lengths:
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
                raise ValueError(f"run_lengths must be positive ints; got {run_lengths!r}")
        self.thresholds = np.asarray(values, dtype=np.float64)
        self.run_lengths = np.asarray(lengths, dtype=np.int64)

    def run_lengths_for(self, normalised: np.ndarray) -> np.ndarray:
        band = np.searchsorted(self.thresholds, np.asarray(normalised), side="right")
        return self.run_lengths[band]

    @property
    def max_run_length(self) -> int:
        return int(self.run_lengths.max())

    def step_table(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.thresholds, self.run_lengths

    def config(self) -> dict[str, Any]:
        return {
            "thresholds": [float(t) for t in self.thresholds],
            "run_lengths": [int(n) for n in self.run_lengths],
        }


# --------------------------------------------------------------------------------- trees
class PriorityTrees:
    """One float64 sum-tree of ``priority ** alpha`` per trainer, over ``capacity`` slots, and
    optionally one max-tree of the raw priorities (for ``p / max p``).

    The trees store every third level of a binary tree, 8 sibling nodes per cache line
    (:mod:`marlbuf._kernels.sumtree`): the same totals, searches and weights as a full binary
    tree, bit for bit, with a third of its levels to read and write.

    Parameters
    ----------
    capacity : int
        Slots (leaves).
    n_trees : int
        Trees (one per trainer: each critic has its own TD errors).
    alpha : float
        Priority exponent; leaves hold ``priority ** alpha``.
    track_max : bool
        Also keep a max-tree of raw priorities per trainer.

    Attributes
    ----------
    sums : ndarray, shape (n_trees, 2 * leaf_offset), float64
        The sum-trees (root at column 1, slot ``s`` at column ``leaf_offset + s``; the nodes
        of levels that are not stored are 0).
    maxes : ndarray, shape (n_trees, 2 * leaf_offset) or (n_trees, 0), float64
        The max-trees, if tracked.
    max_priority : ndarray, shape (n_trees,), float64
        Running maximum of the raw priorities ever set (starts at 1): new slots get it.
    """

    def __init__(self, capacity: int, n_trees: int, alpha: float, track_max: bool) -> None:
        self.capacity = int(capacity)
        self.n_trees = int(n_trees)
        self.alpha = float(alpha)
        self.track_max = bool(track_max)
        self.leaf_offset = 1 << max(0, (self.capacity - 1).bit_length())  # power of two >= cap
        width = 2 * self.leaf_offset
        self.sums = _line_aligned_zeros(self.n_trees, width)
        self.maxes = _line_aligned_zeros(self.n_trees, width if self.track_max else 0)
        self.max_priority = np.ones(self.n_trees, dtype=np.float64)
        self.empty = np.zeros(0, dtype=np.float64)

    def leaves(self, trainer: int) -> np.ndarray:
        """View of one trainer's ``priority ** alpha`` per slot: shape (capacity,), float64."""
        return self.sums[trainer, self.leaf_offset : self.leaf_offset + self.capacity]

    def priorities(self, trainer: int) -> np.ndarray:
        """View of one trainer's raw priority per slot (max-tree leaves; needs ``track_max``)."""
        return self.maxes[trainer, self.leaf_offset : self.leaf_offset + self.capacity]

    def total(self, trainer: int) -> float:
        return float(self.sums[trainer, 1])

    def probabilities(self, trainer: int, slots: np.ndarray) -> np.ndarray:
        """``P(i) = p_i^alpha / sum_k p_k^alpha`` of one trainer at ``slots`` (int64, any
        shape): float64 of that shape."""
        return self.leaves(trainer)[slots] / self.total(trainer)

    def raise_max(self, priorities: np.ndarray) -> None:
        """Raise every tree's running maximum to at least ``priorities[t]`` (shape
        (n_trees,), float64, checked by the caller)."""
        np.maximum(self.max_priority, priorities, out=self.max_priority)

    def fill_new(self, slots: np.ndarray) -> None:
        """Every tree gives ``slots`` (shape (T,), int64) its running max priority."""
        fill_new_slots(
            self.sums,
            self.maxes,
            self.leaf_offset,
            slots,
            self.max_priority**self.alpha,
            self.max_priority,
            self.track_max,
        )

    def set(self, trainer: int, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set raw ``priorities`` (shape (n,), float64, finite, >= 0) at ``slots`` (shape (n,),
        int64, in range) in one trainer's trees and raise its running max."""
        if slots.shape[0] == 0:
            return
        set_leaves(
            self.sums[trainer],
            self.maxes[trainer] if self.track_max else self.empty,
            self.leaf_offset,
            slots,
            priorities**self.alpha,
            priorities if self.track_max else self.empty,
            self.track_max,
        )
        self.max_priority[trainer] = max(self.max_priority[trainer], float(priorities.max()))

    def state_dict(self) -> dict[str, Any]:
        """Leaves only (the internal nodes are rebuilt bit-identically on load)."""
        state: dict[str, Any] = {
            "leaves": self.sums[:, self.leaf_offset : self.leaf_offset + self.capacity].copy(),
            "max_priority": self.max_priority.copy(),
        }
        if self.track_max:
            state["priorities"] = self.maxes[
                :, self.leaf_offset : self.leaf_offset + self.capacity
            ].copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        arrays, max_priority = checked_tree_state(
            state, self.n_trees, self.capacity, self.track_max
        )
        self.sums[:, self.leaf_offset : self.leaf_offset + self.capacity] = arrays["leaves"]
        for t in range(self.n_trees):
            rebuild(self.sums[t], self.leaf_offset, False)
        if self.track_max:
            self.maxes[:, self.leaf_offset : self.leaf_offset + self.capacity] = arrays[
                "priorities"
            ]
            for t in range(self.n_trees):
                rebuild(self.maxes[t], self.leaf_offset, True)
        self.max_priority[:] = max_priority


def _line_aligned_zeros(rows: int, width: int) -> np.ndarray:
    """``np.zeros((rows, width))`` (float64) starting on a 64-byte cache line, so that every
    stored line of 8 sibling nodes (:mod:`marlbuf._kernels.sumtree`) is one line."""
    raw = np.zeros(rows * width + 8, dtype=np.float64)
    start = (-raw.ctypes.data % 64) // 8
    return raw[start : start + rows * width].reshape(rows, width)


def checked_tree_state(
    state: Mapping[str, Any],
    n_trees: int,
    capacity: int,
    with_priorities: bool,
    filled: int | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The arrays of a priority-tree state, checked: ``leaves`` (and ``priorities`` when
    ``with_priorities``), shape (n_trees, capacity), finite and non-negative, float64, and 0
    from entry ``filled`` on when given (a draw of an entry never written would return
    uninitialised rows); ``max_priority``, shape (n_trees,), finite and positive. A
    ``ValueError`` names what does not fit."""
    if not isinstance(state, Mapping):
        raise ValueError(f"sampler state must be a mapping; got {type(state).__name__}")
    shape = (n_trees, capacity)
    keys = ("leaves", "priorities") if with_priorities else ("leaves",)
    arrays = {}
    for key in keys:
        if key not in state:
            raise ValueError(f"sampler state lacks {key!r}; was it saved by this sampler?")
        arr = np.asarray(state[key], dtype=np.float64)
        if arr.shape != shape:
            raise ValueError(f"sampler state {key!r} has shape {arr.shape}; expected {shape}")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError(f"sampler state {key!r} holds negative or non-finite values")
        if filled is not None and np.any(arr[:, filled:] != 0):
            raise ValueError(
                f"sampler state {key!r} gives priorities to entries never written (from "
                f"{filled}); a prioritized sampler draws only written slots (corrupt state)"
            )
        arrays[key] = arr
    try:
        max_priority = np.asarray(state.get("max_priority"), dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sampler state 'max_priority' is not numbers ({exc})") from exc
    if max_priority.shape != (n_trees,):
        raise ValueError(
            f"sampler state 'max_priority' has shape {max_priority.shape}; expected {(n_trees,)}"
        )
    if not np.all(np.isfinite(max_priority)) or np.any(max_priority <= 0):
        raise ValueError("sampler state 'max_priority' must be finite and > 0 (corrupt state)")
    return arrays, max_priority


#: how a TD error ``d`` becomes a priority: ``|d| + eps``, ``d**2 + eps``, or ``d + eps`` where the
#: caller passes priorities themselves (then ``d`` must be ``>= 0``)
PRIORITY_MODES = ("abs", "squared", "given")


def check_priority_args(
    alpha: Any, beta: Any, eps: Any, priority: Any
) -> tuple[float, float | LinearBeta, float, str]:
    """Validate the prioritized samplers' shared constructor arguments."""
    alpha_value = finite_float("alpha", alpha, 0.0)
    beta_value = parse_beta(beta)
    eps_value = finite_float("eps", eps, 0.0)
    if priority not in PRIORITY_MODES:
        raise ValueError(
            f"priority must be one of {PRIORITY_MODES} (|d|+eps, d**2+eps, or the values are "
            f"priorities themselves, +eps); got priority={priority!r}"
        )
    return alpha_value, beta_value, eps_value, str(priority)


def raise_td_error(code: int, position: int, td: Any, setting: str) -> None:
    """Raise the ``ValueError`` of a priority update's result ``code`` (``0``: none; else
    ``TD_NOT_FINITE``, ``TD_NEGATIVE`` or ``TD_OVERFLOW`` of :mod:`marlbuf._kernels.sumtree`)
    at entry ``position`` of the TD errors ``td`` (any indexable: array or tensor);
    ``setting`` names the sampler's options in the overflow message."""
    if code == 0:
        return
    value = float(td[position])
    if code == TD_NOT_FINITE:
        raise ValueError(
            f"td_errors must be finite; got td_errors[{position}]={value} (check the "
            "critic's loss for divergence)"
        )
    if code == TD_NEGATIVE:
        raise ValueError(
            f"priorities must be >= 0 with priority='given'; got td_errors[{position}]={value}"
        )
    if code == TD_OVERFLOW:
        raise ValueError(
            f"td_errors[{position}]={value} overflows float64 as a priority "
            f"({setting}); scale the TD errors down"
        )
    raise ValueError(f"unknown priority update result {code} at td_errors[{position}]")
