"""Samplers: which slots a trainer's mini-batch comes from.

A sampler returns indices (and, for prioritized samplers, importance weights) for one trainer;
the buffer gathers the rows. Samplers with per-trainer state (priority trees) allocate it in
:meth:`Sampler.bind`. See DESIGN section 4 for the semantics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from marlbuf._kernels import neighbor_indices

#: name -> class, for rebuilding a sampler from ``Sampler.config()`` when a buffer is loaded.
SAMPLERS: dict[str, type[Sampler]] = {}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
    return int(value)


class Sampler(ABC):
    """Base class: draws ``batch_size`` slot indices out of the ``size`` filled slots.

    Subclasses set ``weighted = True`` when they return importance weights, and override
    :meth:`bind`, :meth:`on_write`, :meth:`update_priorities` and the state methods when they
    keep state. They are registered by class name for :meth:`from_config`.
    """

    #: whether ``sample`` returns importance weights (prioritized samplers)
    weighted: ClassVar[bool] = False

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
    return ValueError(
        f"batch_size={batch_size} needs {what} (at least {need} stored transitions) but the "
        f"buffer holds {size}; add more data or sample a smaller batch"
    )


class Uniform(Sampler):
    """Every filled slot equally likely.

    Parameters
    ----------
    replace : bool, default True
        Draw with replacement (as openai/maddpg's ``make_index``) or without.
    """

    def __init__(self, replace: bool = True) -> None:
        if not isinstance(replace, (bool, np.bool_)):
            raise TypeError(f"replace must be a bool; got replace={replace!r}")
        self.replace = bool(replace)

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if size < 1 or (not self.replace and batch_size > size):
            need = 1 if self.replace else batch_size
            raise _not_enough_data(batch_size, size, need, "distinct slots")
        if self.replace:
            return rng.integers(0, size, size=batch_size, dtype=np.int64), None
        return rng.choice(size, size=batch_size, replace=False).astype(np.int64), None

    def config(self) -> dict[str, Any]:
        return {"replace": self.replace}


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
