"""The checksum of redo-log records (:mod:`marlbuf.mapped`): a Fletcher-style sum over 64-bit
words, at about memory speed, where ``zlib.crc32`` runs at about 2 GB/s.

Two running sums modulo 2**64: ``first`` adds every word, ``second`` adds ``first`` after each
word, so any single changed word changes ``first``, and reordered words change ``second``. It
detects the damage a log suffers (flipped bits, zeroed or stale blocks, a record cut short),
not a forgery; the record's header keeps a CRC-32 of its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: starts ``first`` away from zero, so that a block of zero words does not sum to zero; also
#: the odd multiplier that folds ``second`` into the result
CHECKSUM_SEED = 0x9E3779B97F4A7C15


@njit(cache=True, nogil=True)
def word_checksum(words: np.ndarray, state: np.ndarray) -> None:
    """Add ``words`` (shape (n,), uint64) to the running checksum ``state`` (shape (2,),
    uint64: ``first``, ``second``; start from ``[CHECKSUM_SEED, 0]``). Sums wrap modulo
    2**64."""
    first = state[0]
    second = state[1]
    for i in range(words.shape[0]):
        first += words[i]
        second += first
    state[0] = first
    state[1] = second


@njit(cache=True, nogil=True)
def record_checksum(rows: np.ndarray, streams: np.ndarray, flags: np.ndarray) -> np.uint64:
    """The checksum of a log record's payload in one call: the words of ``rows`` (shape
    (n, row_words), uint64, C-ordered), then ``streams`` and ``flags`` (each shape (n,) or
    (0,), int64, read as uint64), as :func:`word_checksum` from ``[CHECKSUM_SEED, 0]`` would
    sum them, folded into one value: ``first ^ (second * CHECKSUM_SEED)`` modulo 2**64."""
    seed = np.uint64(CHECKSUM_SEED)
    first = seed
    second = np.uint64(0)
    for i in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            first += rows[i, j]
            second += first
    for i in range(streams.shape[0]):
        first += np.uint64(streams[i])
        second += first
    for i in range(flags.shape[0]):
        first += np.uint64(flags[i])
        second += first
    return first ^ (second * seed)


__all__ = ["CHECKSUM_SEED", "record_checksum", "word_checksum"]
