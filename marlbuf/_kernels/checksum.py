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

#: starts ``first`` away from zero, so that a block of zero words does not sum to zero
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


__all__ = ["CHECKSUM_SEED", "word_checksum"]
