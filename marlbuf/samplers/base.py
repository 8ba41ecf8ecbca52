"""The sampler protocol: what every sampler declares and the hooks the buffer calls.

A sampler draws slot indices for one trainer; the buffer gathers the rows. What a draw's
indices mean is the sampler's *batch kind* (:data:`BATCH_KINDS`): rows (one transition per
index), sequences (training starts of fixed-length sequences) or episodes (first slots of
whole episodes). The buffer reads the kind and calls the hooks below; it never asks which
class a sampler is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from marlbuf import _config
from marlbuf._kernels import find_prefix

if TYPE_CHECKING:
    from collections.abc import Mapping

    from marlbuf.prioritized import PriorityTrees
    from marlbuf.writer import EpisodeIndex

#: name -> class, for rebuilding a sampler from ``Sampler.config()`` when a buffer is loaded.
SAMPLERS: dict[str, type[Sampler]] = {}

#: What a sampler's indices are: ``"rows"`` (one joint transition each), ``"sequences"``
#: (training starts of :class:`marlbuf.batch.SequenceBatch` rows) or ``"episodes"`` (first
#: slots of the whole episodes of a :class:`marlbuf.batch.EpisodeBatch`).
BATCH_KINDS: tuple[str, ...] = ("rows", "sequences", "episodes")

#: Orders a batch's indices can come in (the ``order`` argument of :class:`Uniform` and
#: :class:`Prioritized`): ``"random"``, the order they were drawn in; ``"memory"``, ascending slot
#: (storage) order, generated directly in that order (:mod:`marlbuf._kernels.ordered`).
ORDERS: tuple[str, ...] = ("random", "memory")


def check_order(order: Any) -> str:
    """``order`` checked against :data:`ORDERS`."""
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(
            f"order must be one of {ORDERS}; got order={order!r} (use 'memory' for indices in "
            "ascending slot order or 'random' for draw order)"
        )
    return order


def positive_int(name: str, value: Any) -> int:
    """``value`` of argument ``name`` checked: an int ``>= 1`` (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
    return int(value)


def check_flags(**flags: Any) -> None:
    """Every keyword a bool (a ``TypeError`` naming the first that is not)."""
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {name}={flag!r}")


def not_enough_data(batch_size: int, size: int, need: int, what: str) -> ValueError:
    """The error of a draw of ``batch_size`` that needs ``need`` of the ``size`` stored slots."""
    if size == 0:
        return ValueError(f"the buffer is empty: add transitions before sampling {batch_size} rows")
    return ValueError(
        f"batch_size={batch_size} needs {what} (at least {need} stored transitions) but the "
        f"buffer holds {size}; add more data or sample a smaller batch"
    )


class Sampler(ABC):
    """Base class: draws ``batch_size`` slot indices out of the ``size`` filled slots.

    Subclasses declare their :attr:`batch_kind`, set ``weighted = True`` when they return
    importance weights, and override :meth:`bind`, :meth:`on_write`, :meth:`update_priorities`
    and the state methods when they keep state. The buffer calls every hook of this class on
    every sampler (a default does nothing), so a sampler overrides the hooks it needs and the
    buffer never looks for them. Samplers are registered by class name for
    :meth:`from_config`.
    """

    #: what the indices of a draw are (one of :data:`BATCH_KINDS`): how the buffer gathers them
    batch_kind: ClassVar[str] = "rows"
    #: whether ``sample`` returns importance weights (prioritized samplers)
    weighted: bool = False
    #: whether the sampler reads the writer's episode index (sequence and episode samplers):
    #: the buffer then keeps one (:class:`marlbuf.writer.EpisodeIndex`) and calls
    #: :meth:`attach_episodes`
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

    @property
    def priorities_on_device(self) -> bool:
        """Whether the priorities are tensors on a torch device (see
        :meth:`place_priorities`)."""
        return False

    def place_priorities(self, device: Any) -> None:  # noqa: B027 - optional hook
        """Called once bound, with the store's torch device (``None``: host memory)."""

    def attach_episodes(self, episodes: EpisodeIndex) -> None:  # noqa: B027 - optional hook
        """Called at construction with the buffer's episode index (when
        :attr:`needs_episodes`)."""

    def rebuild(self, size: int) -> None:  # noqa: B027 - optional hook
        """Called once a loaded state's episode index is in place (``size`` filled slots)."""

    def handed(  # noqa: B027 - optional hook
        self, trainer: int, starts: np.ndarray, valid_steps: np.ndarray
    ) -> None:
        """Called when sequences starting at ``starts`` (shape (B,), int64) with
        ``valid_steps`` (shape (B,)) valid training steps were handed to ``trainer``."""

    def raise_pending_errors(self) -> None:  # noqa: B027 - optional hook
        """Raise the first error of priority updates not yet checked (none by default)."""

    def steps_per_row(self) -> int | None:
        """Gathered rows per batch row: 1 for ``"rows"``; ``None`` when it depends on the
        draw (an ``out=`` batch is then refused)."""
        return 1

    def check_batch_size(self, batch_size: int) -> int:
        """Validate ``batch_size`` for this sampler (before any data is looked at)."""
        return positive_int("batch_size", batch_size)

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

    def check_loaded(self, state: Mapping[str, Any], filled: int) -> None:  # noqa: B027
        """Check a loaded :meth:`state_dict` output, for a buffer whose slots ``[0, filled)``
        are written, before anything is restored: ``ValueError`` naming what does not fit;
        changes nothing. The buffer checks every part of a state before it changes any."""

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore :meth:`state_dict` output (accepted by :meth:`check_loaded`)."""

    @staticmethod
    def from_config(name: str, config: dict[str, Any]) -> Sampler:
        """Rebuild a sampler from its class name and :meth:`config`."""
        if name not in SAMPLERS:
            raise ValueError(f"unknown sampler {name!r}; known: {sorted(SAMPLERS)}")
        return SAMPLERS[name](**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def distinct(draws: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
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


def distinct_from_tree(
    draws: np.ndarray, trees: PriorityTrees, tree: int, rng: np.random.Generator
) -> np.ndarray:
    """``draws`` (shape (B,), int64, slots drawn from the sum-tree ``tree`` of ``trees``, with
    at least ``B`` nonzero leaves) made distinct: repeats are replaced by fresh draws from the
    tree until none is left (successive sampling in proportion to the leaves among the slots
    not yet drawn), the first occurrences keeping their places."""
    batch_size = draws.shape[0]
    total = trees.total(tree)
    while len(set(draws.tolist())) != batch_size:
        _, first = np.unique(draws, return_index=True)
        repeated = np.ones(batch_size, dtype=bool)
        repeated[first] = False
        fresh = np.empty(int(repeated.sum()), dtype=np.int64)
        find_prefix(trees.sums[tree], trees.leaf_offset, rng.random(fresh.shape[0]) * total, fresh)
        draws[repeated] = fresh
    return draws
