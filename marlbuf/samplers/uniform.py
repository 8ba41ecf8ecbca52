"""Samplers without priorities: :class:`Uniform` and the cache-locality :class:`Neighbor`."""

from __future__ import annotations

from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf._kernels import merge_distinct, neighbor_indices, selection_sample, sorted_slots
from marlbuf.samplers.base import Sampler, check_order, not_enough_data, positive_int


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
        self.order = check_order(order)

    def sample(
        self, batch_size: int, size: int, rng: np.random.Generator, trainer: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if size < 1 or (batch_size > size and not self.replace):
            raise not_enough_data(batch_size, size, batch_size, "distinct slots")
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
        self.run_length = positive_int("run_length", run_length)

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
            raise not_enough_data(batch_size, size, batch_size, "distinct slots")
        full = size == self.capacity
        n_starts = size if full else size - self.run_length + 1  # valid reference slots
        if n_starts < n_refs:
            need = n_refs + self.run_length - 1
            raise not_enough_data(batch_size, size, need, f"{n_refs} distinct runs")
        refs = rng.choice(n_starts, size=n_refs, replace=False).astype(np.int64)
        out = np.empty(batch_size, dtype=np.int64)
        neighbor_indices(refs, self.run_length, self.capacity, out)
        return out, None

    def config(self) -> dict[str, Any]:
        return {"run_length": self.run_length}
