"""Uniform draws generated in ascending order (memory-ordered batches).

A learner that treats a mini-batch as a set gets the same distribution whether its rows come in
draw order or in slot order; gathered in ascending slot order, the rows are read front to back
through the storage. These kernels produce the ascending draws directly, in ``O(B)``, instead of
drawing in random order and sorting afterwards.

* With replacement (:func:`sorted_uniforms`, :func:`sorted_slots`): the order statistics of
  ``B`` i.i.d. uniforms on ``[0, 1)`` have the law of the normalised partial sums of ``B + 1``
  i.i.d. standard exponentials, ``U_(k) = (E_1 + ... + E_k) / (E_1 + ... + E_{B+1})``. Slots
  are ``floor(U_(k) * size)``: exactly the law of a sorted sample of ``B`` i.i.d. uniform
  integers in ``[0, size)`` (up to the float64 resolution of ``U``).
* Without replacement (:func:`merge_distinct`): the distinct values of a sequence of i.i.d.
  uniform draws, stopped when ``B`` distinct values have been seen, are a uniform ``B``-subset.
  The caller draws the sequence in sorted chunks (each chunk as long as the number of values
  still missing, so the stop is never overshot) and merges every chunk into the sorted set of
  values seen so far, dropping repeats. When ``B`` is a large fraction of ``size`` the repeats
  make this slow; :func:`selection_sample` (Fan-Muller selection sampling, ``O(size)``) takes
  over there.

The random numbers come from the caller (a NumPy ``Generator``), so a seed fixes the draws.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def sorted_uniforms(exponentials: np.ndarray, out: np.ndarray) -> None:
    """The order statistics of ``B`` i.i.d. uniforms, from ``B + 1`` exponential spacings.

    ``out[k] = (E_0 + ... + E_k) / (E_0 + ... + E_B)``: non-decreasing, in ``[0, 1]`` (equal to
    1 only when the last spacing is below the float64 resolution of the sum).

    Parameters
    ----------
    exponentials : ndarray, shape (B + 1,), float64
        I.i.d. standard exponential draws (``rng.standard_exponential(B + 1)``).
    out : ndarray, shape (B,), float64
        Destination; overwritten.
    """
    count = out.shape[0]
    total = 0.0
    for i in range(count + 1):
        total += exponentials[i]
    partial = 0.0
    for i in range(count):
        partial += exponentials[i]
        out[i] = partial / total


@njit(cache=True, nogil=True)
def sorted_slots(exponentials: np.ndarray, size: int, out: np.ndarray) -> None:
    """A sorted sample of ``B`` i.i.d. uniform slots in ``[0, size)``, from exponential spacings.

    ``out[k] = min(floor(U_(k) * size), size - 1)`` with ``U_(k)`` as in
    :func:`sorted_uniforms`: non-decreasing (partial sums, the scaling and the floor are all
    monotone in floating point).

    Parameters
    ----------
    exponentials : ndarray, shape (B + 1,), float64
        I.i.d. standard exponential draws.
    size : int
        Number of slots to draw from (``>= 1``).
    out : ndarray, shape (B,), int64
        Destination; overwritten.
    """
    count = out.shape[0]
    total = 0.0
    for i in range(count + 1):
        total += exponentials[i]
    scale = size / total
    last = size - 1
    partial = 0.0
    for i in range(count):
        partial += exponentials[i]
        slot = np.int64(partial * scale)  # truncation = floor: the product is >= 0
        out[i] = min(slot, last)


@njit(cache=True, nogil=True)
def merge_distinct(kept: np.ndarray, n_kept: int, new: np.ndarray, out: np.ndarray) -> int:
    """Merge sorted ``new`` values into the sorted distinct ``kept[:n_kept]``, dropping repeats.

    Parameters
    ----------
    kept : ndarray, shape (>= n_kept,), int64
        Strictly increasing in its first ``n_kept`` entries.
    n_kept : int
        Entries of ``kept`` in use.
    new : ndarray, shape (m,), int64
        Non-decreasing; may repeat values of its own or of ``kept``.
    out : ndarray, shape (>= n_kept + m,), int64
        Destination (not ``kept``): the strictly increasing union in its first entries.

    Returns
    -------
    int
        Number of entries written to ``out``.
    """
    i = 0
    j = 0
    n = 0
    count_new = new.shape[0]
    while i < n_kept or j < count_new:
        if j == count_new or (i < n_kept and kept[i] <= new[j]):
            value = kept[i]
            i += 1
        else:
            value = new[j]
            j += 1
        if n == 0 or out[n - 1] != value:
            out[n] = value
            n += 1
    return n


@njit(cache=True, nogil=True)
def selection_sample(uniforms: np.ndarray, count: int, out: np.ndarray) -> None:
    """Selection sampling (Fan and Muller, 1962; Knuth's Algorithm S): a uniform ``count``-subset
    of ``[0, size)`` in ascending order, ``size = uniforms.shape[0]``.

    Slot ``t`` is taken when ``(size - t) * uniforms[t] < count - taken``, i.e. with probability
    ``(count - taken) / (size - t)``; the loop stops once ``count`` slots are taken.

    Parameters
    ----------
    uniforms : ndarray, shape (size,), float64
        I.i.d. uniforms on ``[0, 1)``, one per slot (those past the last taken slot are unused).
    count : int
        Slots to take, ``0 <= count <= size``.
    out : ndarray, shape (count,), int64
        Destination; overwritten with strictly increasing slots.
    """
    size = uniforms.shape[0]
    taken = 0
    for t in range(size):
        if taken == count:
            break
        if (size - t) * uniforms[t] < count - taken:
            out[taken] = t
            taken += 1
