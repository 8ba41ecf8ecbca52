"""Kernels of the episode store of :mod:`marlbuf.compat.epymarl`: padded episodes in, padded
episodes out, without padding in between.

The store keeps the filled steps of each episode as consecutive rows of one byte table (the
store decides where each episode starts); a row holds every stored field of one step at a fixed
byte offset. :func:`store_episodes` checks a whole inserted batch
(the ``filled`` prefix of every episode, every float finite, every index of a one-hot field in
range) and only then writes its filled steps; :func:`gather_episodes` writes ``B`` episodes
into padded per-field outputs (zeros past each episode's end), one-hot encodes the index fields
a batch holds as one-hot, and writes the ``filled`` mask, in one pass. Fields are copied as
bytes, so one kernel serves every dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

#: What :func:`store_episodes` checks in a field (``checks[k]``): nothing, float32 or float64
#: values finite, int64 or int32 values in ``[0, limits[k])`` (indices of a one-hot field)
CHECK_NONE, CHECK_FLOAT32, CHECK_FLOAT64, CHECK_INDEX64, CHECK_INDEX32 = range(5)

#: ``problem[0]`` after :func:`store_episodes`: nothing wrong; ``filled`` is not a prefix of
#: as many 1s as the episode's length; an episode has no filled step or more than
#: ``max_length``; a value is not finite; an index is out of range
FINE, NOT_PREFIX, BAD_LENGTH, NOT_FINITE, OUT_OF_RANGE = range(5)


#: the exponent bits of float32 and float64: all ones for NaN and inf
_EXPONENT32 = np.uint32(0x7F800000)
_EXPONENT64 = np.uint64(0x7FF0000000000000)


@njit(cache=True, nogil=True)
def _row_fails(source: np.ndarray, check: int, limit: int, row: int) -> bool:
    """Whether an entry of ``source[row]`` (uint8 bytes of the field's dtype) fails ``check``.
    Each test is a min or max over the row's integers (NaN and inf have every exponent bit
    set; a negative index is a huge unsigned one), so the loops vectorize."""
    if check == CHECK_FLOAT32:
        bits32 = source.view(np.uint32)[row]
        least32 = _EXPONENT32
        for j in range(bits32.shape[0]):
            least32 = min(least32, ~bits32[j] & _EXPONENT32)
        return least32 == 0
    if check == CHECK_FLOAT64:
        bits64 = source.view(np.uint64)[row]
        least64 = _EXPONENT64
        for j in range(bits64.shape[0]):
            least64 = min(least64, ~bits64[j] & _EXPONENT64)
        return least64 == 0
    if check == CHECK_INDEX64:
        longs = source.view(np.uint64)[row]
        most64 = np.uint64(0)
        for j in range(longs.shape[0]):
            most64 = max(most64, longs[j])
        return bool(most64 >= np.uint64(limit))
    if check == CHECK_INDEX32:
        ints = source.view(np.uint32)[row]
        most32 = np.uint32(0)
        for j in range(ints.shape[0]):
            most32 = max(most32, ints[j])
        return bool(most32 >= np.uint32(limit))
    return False


@njit(cache=True, nogil=True)
def store_episodes(
    filled: np.ndarray,
    sources: Any,
    constant: np.ndarray,
    offsets: np.ndarray,
    checks: np.ndarray,
    limits: np.ndarray,
    max_length: int,
    table: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    problem: np.ndarray,
) -> bool:
    """Check ``E`` padded episodes and, if every check passes, store the filled steps of
    episode ``e`` as the rows ``starts[e] .. starts[e] + lengths[e] - 1`` of ``table``.

    Parameters
    ----------
    filled : ndarray, shape (E, T), int64
        The episodes' ``filled`` masks: nonzero for the steps ``0 .. lengths[e] - 1``, then 0.
    sources : tuple of ndarray, one per stored field
        Each field's values as bytes, C-contiguous uint8 of shape ``(E * T, width)`` (step ``t``
        of episode ``e`` in row ``e * T + t``), or ``(E, width)`` for an episode constant.
    constant : ndarray, shape (F,), bool
        Whether field ``k`` is an episode constant (stored with every step of its episode).
    offsets : ndarray, shape (F,), int64
        Byte offset of field ``k`` in a table row (its width is its source's).
    checks, limits : ndarray, shape (F,), int64
        :data:`CHECK_NONE` ... and the bound of an index check.
    max_length : int
        The most filled steps an episode may have.
    table : ndarray, shape (rows, row_bytes), uint8
        The rows; those an episode is given must lie inside it.
    starts, lengths : ndarray, shape (E,), int64
        Where each episode's first step goes, and its filled steps as counted by the caller
        (checked here against ``filled``).
    problem : ndarray, shape (4,), int64
        Out: :data:`FINE` or what is wrong, then the field, episode and step concerned.

    Returns
    -------
    bool
        Whether the episodes were stored (``False``: ``problem`` says why; nothing written).
    """
    n_episodes, steps = filled.shape
    problem[:] = 0
    for e in range(n_episodes):
        length = lengths[e]
        if length < 1 or length > max_length:
            problem[0], problem[2], problem[3] = BAD_LENGTH, e, length
            return False
        for t in range(steps):
            if (filled[e, t] != 0) != (t < length):
                problem[0], problem[2], problem[3] = NOT_PREFIX, e, t
                return False
    for k in range(len(sources)):
        if checks[k] == CHECK_NONE:
            continue
        source = sources[k]
        for e in range(n_episodes):
            for t in range(1 if constant[k] else lengths[e]):
                if _row_fails(source, checks[k], limits[k], e if constant[k] else e * steps + t):
                    problem[0], problem[1], problem[2], problem[3] = OUT_OF_RANGE, k, e, t
                    if checks[k] == CHECK_FLOAT32 or checks[k] == CHECK_FLOAT64:
                        problem[0] = NOT_FINITE
                    return False
    for e in range(n_episodes):
        for t in range(lengths[e]):
            dst = table[starts[e] + t]
            for k in range(len(sources)):
                src = sources[k][e] if constant[k] else sources[k][e * steps + t]
                out = dst[offsets[k] :]
                for j in range(src.shape[0]):
                    out[j] = src[j]
    return True


@njit(cache=True, nogil=True)
def gather_episodes(
    table: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    steps: int,
    offsets: np.ndarray,
    widths: np.ndarray,
    constant: np.ndarray,
    outs: Any,
    one_hot: np.ndarray,
    one_hot_outs: Any,
    filled: np.ndarray,
) -> None:
    """``B`` stored episodes as padded per-field outputs.

    Parameters
    ----------
    table : ndarray, shape (rows, row_bytes), uint8
        The rows (for index fields read as int64 by the one-hot encoding, ``row_bytes`` and
        their offsets are multiples of 8).
    starts, lengths : ndarray, shape (B,), int64
        Each episode's first row and filled steps (``1 .. steps``).
    steps : int
        ``T``, the padded length.
    offsets, widths : ndarray, shape (F,), int64
        Byte offset and width of field ``k`` in a row.
    constant : ndarray, shape (F,), bool
        Episode constants: ``outs[k]`` holds one entry per episode (its first step's).
    outs : tuple of ndarray, one per field
        uint8 of ``B * steps * widths[k]`` bytes (``B * widths[k]`` for a constant), C order
        ``(B, steps, ...)``: overwritten (zeros past each episode's end).
    one_hot : ndarray, shape (H, 3), int64
        Per one-hot output: the byte offset of its int64 indices in a row, how many (the group's
        members) and the number of classes.
    one_hot_outs : tuple of ndarray
        float32 of ``B * steps * members * classes`` entries each: overwritten (one entry per
        row of ``one_hot``; with none, any non-empty tuple of float32 arrays).
    filled : ndarray, shape (B * steps,), int64
        Overwritten: 1 on each episode's filled steps, else 0.
    """
    longs = table.view(np.int64)
    for b in range(starts.shape[0]):
        for t in range(steps):
            at = b * steps + t
            inside = t < lengths[b]
            filled[at] = 1 if inside else 0
            row = starts[b] + t if inside else starts[b]
            for k in range(len(outs)):
                width = widths[k]
                if constant[k]:
                    if t == 0:
                        outs[k][b * width : (b + 1) * width] = table[
                            row, offsets[k] : offsets[k] + width
                        ]
                    continue
                out = outs[k][at * width : (at + 1) * width]
                if inside:
                    src = table[row, offsets[k] : offsets[k] + width]
                    for j in range(width):
                        out[j] = src[j]
                else:
                    out[:] = 0
            for h in range(one_hot.shape[0]):
                members, classes = one_hot[h, 1], one_hot[h, 2]
                out32 = one_hot_outs[h][at * members * classes : (at + 1) * members * classes]
                out32[:] = 0
                if inside:
                    first = one_hot[h, 0] // 8
                    for m in range(members):
                        out32[m * classes + longs[row, first + m]] = 1
