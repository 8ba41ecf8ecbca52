"""Checksums of the redo log of memory-mapped buffers (:mod:`marlbuf.mapped`), and the kernel
that writes a log record: the staged rows copied into the mapped log and checksummed in the
same pass, so that logging a write reads its rows once.

**Log format 4** (this version's records). A checksum is two 64-bit words computed over 4
lanes: word ``i`` of a segment goes to lane ``i % 4``, where ``first[lane] += word`` and then
``second[lane] += first[lane]`` (sums modulo 2**64); the four lanes are independent, so the
loop runs four additions at a time. The result is ``(CHECKSUM_SEED + sum of the four firsts,
fold of the four seconds)``: any one changed word changes the first word (its sum changes by
the difference, never 0 modulo 2**64), and words moved to other places change the second. It
detects the damage a log suffers (flipped bits, zeroed or stale blocks, a record cut short),
not a forgery.

A record is whole 8-byte words: a header of :data:`RECORD_HEAD_WORDS` words (magic, checkpoint
id, sequence number, the write generation of its first step, steps, stream or -1, flags, payload
words, the payload's checksum, then the checksum of these ten words), the payload (the staged
rows, then one stream per row when the stream is -1, then one truncation flag per row when
flag bit 0 is set), and a trailer of :data:`RECORD_TAIL_WORDS` words (magic, sequence number,
payload words, the payload's checksum, the header's checksum, then the checksum of these seven
words): the length and the checksums at both ends. :func:`write_record` writes the payload,
then the header, then the trailer, so a record cut short has no valid trailer.

**Log format 3** (files of earlier versions, read only): :func:`record_checksum`, one Fletcher
sum over the payload's words folded into one word.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: starts ``first`` away from zero, so that a block of zero words does not sum to zero; also
#: the odd multiplier of the format-3 fold
CHECKSUM_SEED = 0x9E3779B97F4A7C15
#: the first word of a record's header and of its trailer (log format 4)
RECORD_MAGIC = int.from_bytes(b"MBUFREC4", "little")
TRAILER_MAGIC = int.from_bytes(b"MBUFEND4", "little")
#: words of a record's header: 10 fields and their checksum (2 words)
RECORD_HEAD_WORDS = 12
#: words of a record's trailer: 7 fields and their checksum (2 words)
RECORD_TAIL_WORDS = 9
#: header fields, by word
HEAD_MAGIC, HEAD_ID, HEAD_SEQ, HEAD_FIRST, HEAD_STEPS, HEAD_STREAM, HEAD_FLAGS = range(7)
HEAD_PAYLOAD_WORDS, HEAD_PAYLOAD_SUM, HEAD_SUM = 7, 8, 10
#: trailer fields, by word
TAIL_MAGIC, TAIL_SEQ, TAIL_PAYLOAD_WORDS, TAIL_PAYLOAD_SUM, TAIL_HEAD_SUM, TAIL_SUM = (
    0,
    1,
    2,
    3,
    5,
    7,
)


@njit(cache=True, nogil=True)
def _rotl(value: np.uint64, bits: int) -> np.uint64:
    return (value << np.uint64(bits)) | (value >> np.uint64(64 - bits))


@njit(cache=True, nogil=True)
def _fold(lanes: tuple) -> tuple[np.uint64, np.uint64]:
    """``(first, second)`` of the lane sums ``(a0, a1, a2, a3, b0, b1, b2, b3)``."""
    a0, a1, a2, a3, b0, b1, b2, b3 = lanes
    first = np.uint64(CHECKSUM_SEED) + a0 + a1 + a2 + a3
    second = b0 ^ _rotl(b1, 16) ^ _rotl(b2, 32) ^ _rotl(b3, 48)
    return first, second


@njit(cache=True, nogil=True)
def _sum_segment(src: np.ndarray, lanes: tuple) -> tuple:
    """``lanes`` after the words of ``src`` (shape (n,), uint64)."""
    a0, a1, a2, a3, b0, b1, b2, b3 = lanes
    n = src.shape[0]
    whole = n - n % 4
    for i in range(0, whole, 4):
        a0 += src[i]
        a1 += src[i + 1]
        a2 += src[i + 2]
        a3 += src[i + 3]
        b0 += a0
        b1 += a1
        b2 += a2
        b3 += a3
    if whole < n:
        a0 += src[whole]
        b0 += a0
    if whole + 1 < n:
        a1 += src[whole + 1]
        b1 += a1
    if whole + 2 < n:
        a2 += src[whole + 2]
        b2 += a2
    return a0, a1, a2, a3, b0, b1, b2, b3


@njit(cache=True, nogil=True)
def _copy_segment(dst: np.ndarray, at: int, src: np.ndarray, lanes: tuple) -> tuple:
    """:func:`_sum_segment` of ``src`` (shape (n,), uint64), copying it to ``dst[at:at+n]`` in
    the same pass."""
    a0, a1, a2, a3, b0, b1, b2, b3 = lanes
    n = src.shape[0]
    whole = n - n % 4
    out = dst[at : at + n]
    for i in range(0, whole, 4):
        w0 = src[i]
        w1 = src[i + 1]
        w2 = src[i + 2]
        w3 = src[i + 3]
        out[i] = w0
        out[i + 1] = w1
        out[i + 2] = w2
        out[i + 3] = w3
        a0 += w0
        a1 += w1
        a2 += w2
        a3 += w3
        b0 += a0
        b1 += a1
        b2 += a2
        b3 += a3
    for i in range(whole, n):
        out[i] = src[i]
    if whole < n:
        a0 += src[whole]
        b0 += a0
    if whole + 1 < n:
        a1 += src[whole + 1]
        b1 += a1
    if whole + 2 < n:
        a2 += src[whole + 2]
        b2 += a2
    return a0, a1, a2, a3, b0, b1, b2, b3


@njit(cache=True, nogil=True)
def _zero_lanes() -> tuple:
    z = np.uint64(0)
    return z, z, z, z, z, z, z, z


@njit(cache=True, nogil=True)
def checksum(words: np.ndarray) -> tuple[np.uint64, np.uint64]:
    """The checksum ``(first, second)`` of ``words`` (shape (n,), uint64), one segment."""
    return _fold(_sum_segment(words, _zero_lanes()))


@njit(cache=True, nogil=True)
def payload_checksum(
    rows: np.ndarray, streams: np.ndarray, flags: np.ndarray
) -> tuple[np.uint64, np.uint64]:
    """The checksum of a record's payload: the segments ``rows`` (shape (n, row_words),
    uint64, C-ordered), ``streams`` and ``flags`` (each shape (n,) or (0,), int64, read as
    uint64), as :func:`write_record` computes it."""
    lanes = _sum_segment(rows.reshape(rows.size), _zero_lanes())
    lanes = _sum_segment(streams.view(np.uint64), lanes)
    lanes = _sum_segment(flags.view(np.uint64), lanes)
    return _fold(lanes)


@njit(cache=True, nogil=True)
def write_record(
    log: np.ndarray,
    at: int,
    rows: np.ndarray,
    streams: np.ndarray,
    flags: np.ndarray,
    ident: int,
    seq: int,
    first_generation: int,
    stream: int,
    flag_bits: int,
) -> int:
    """Write one log record at word ``at`` of ``log`` (shape (words,), uint64: the mapped log,
    room checked by the caller) and return the word after it.

    ``rows`` (shape (n, row_words), uint64, C-ordered) are the call's staged rows, ``streams``
    (shape (n,) int64 when ``stream`` is -1, else (0,)) its per-row streams and ``flags`` (shape
    (n,) int64 when ``flag_bits & 1``, else (0,)) its truncation flags; ``ident`` is the
    checkpoint's id, ``seq`` the record's sequence number and ``first_generation`` the write
    generation of its first step. The payload is copied and checksummed in one pass, then the
    header and the trailer are written (see the module docstring).
    """
    steps = rows.shape[0]
    body = at + RECORD_HEAD_WORDS
    flat = rows.reshape(rows.size)
    lanes = _copy_segment(log, body, flat, _zero_lanes())
    lanes = _copy_segment(log, body + flat.shape[0], streams.view(np.uint64), lanes)
    lanes = _copy_segment(
        log, body + flat.shape[0] + streams.shape[0], flags.view(np.uint64), lanes
    )
    payload = flat.shape[0] + streams.shape[0] + flags.shape[0]
    p_first, p_second = _fold(lanes)
    head = log[at : at + RECORD_HEAD_WORDS]
    head[HEAD_MAGIC] = np.uint64(RECORD_MAGIC)
    head[HEAD_ID] = np.uint64(ident)
    head[HEAD_SEQ] = np.uint64(seq)
    head[HEAD_FIRST] = np.uint64(first_generation)
    head[HEAD_STEPS] = np.uint64(steps)
    head[HEAD_STREAM] = np.uint64(stream)  # -1 (a stream per row) as its two's complement
    head[HEAD_FLAGS] = np.uint64(flag_bits)
    head[HEAD_PAYLOAD_WORDS] = np.uint64(payload)
    head[HEAD_PAYLOAD_SUM] = p_first
    head[HEAD_PAYLOAD_SUM + 1] = p_second
    h_first, h_second = _fold(_sum_segment(head[:HEAD_SUM], _zero_lanes()))
    head[HEAD_SUM] = h_first
    head[HEAD_SUM + 1] = h_second
    end = body + payload
    tail = log[end : end + RECORD_TAIL_WORDS]
    tail[TAIL_MAGIC] = np.uint64(TRAILER_MAGIC)
    tail[TAIL_SEQ] = np.uint64(seq)
    tail[TAIL_PAYLOAD_WORDS] = np.uint64(payload)
    tail[TAIL_PAYLOAD_SUM] = p_first
    tail[TAIL_PAYLOAD_SUM + 1] = p_second
    tail[TAIL_HEAD_SUM] = h_first
    tail[TAIL_HEAD_SUM + 1] = h_second
    t_first, t_second = _fold(_sum_segment(tail[:TAIL_SUM], _zero_lanes()))
    tail[TAIL_SUM] = t_first
    tail[TAIL_SUM + 1] = t_second
    return end + RECORD_TAIL_WORDS


@njit(cache=True, nogil=True)
def word_checksum(words: np.ndarray, state: np.ndarray) -> None:
    """Log format 3: add ``words`` (shape (n,), uint64) to the running checksum ``state``
    (shape (2,), uint64: ``first``, ``second``; start from ``[CHECKSUM_SEED, 0]``). Sums wrap
    modulo 2**64."""
    first = state[0]
    second = state[1]
    for i in range(words.shape[0]):
        first += words[i]
        second += first
    state[0] = first
    state[1] = second


@njit(cache=True, nogil=True)
def record_checksum(rows: np.ndarray, streams: np.ndarray, flags: np.ndarray) -> np.uint64:
    """Log format 3: the checksum of a record's payload in one call: the words of ``rows``
    (shape (n, row_words), uint64, C-ordered), then ``streams`` and ``flags`` (each shape (n,)
    or (0,), int64, read as uint64), as :func:`word_checksum` from ``[CHECKSUM_SEED, 0]`` would
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


__all__ = [
    "CHECKSUM_SEED",
    "RECORD_HEAD_WORDS",
    "RECORD_MAGIC",
    "RECORD_TAIL_WORDS",
    "TRAILER_MAGIC",
    "checksum",
    "payload_checksum",
    "record_checksum",
    "word_checksum",
    "write_record",
]
