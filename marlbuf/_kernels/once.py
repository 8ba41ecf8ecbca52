"""Kernels of the observations-stored-once format (the gather of lean rows into batches is
:func:`marlbuf._kernels.plan.gather_plan`).

A lean row holds a transition without its ``next_obs``. A slot's next observation is the
``obs`` section of its *successor* slot (``next_slot[slot] >= 0``) or, where they differ
(episode end, reset, the newest transition of a stream), a row of the *side table*
(``side[side_row[slot]]``), which holds the next_obs section bytes. See
:mod:`marlbuf.writer` for how the links are kept exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from marlbuf._kernels.memops import move_words, prefetch_words, store_fence, zero_words


@njit(cache=True, nogil=True)
def scatter_lean(
    table: np.ndarray,
    slots: np.ndarray,
    rows: np.ndarray,
    head_words: int,
    done_lean: int,
    done_dense: int,
    done_words: int,
) -> None:
    """Store staged dense rows as lean rows (the writer's commit).

    All offsets and lengths are in 8-byte words: the moving sections start on words
    (:data:`marlbuf.spec.SECTION_ALIGN`), and the bytes a word copy carries past a section's end
    are row padding.

    Parameters
    ----------
    table : ndarray, shape (capacity, lean_row_words), uint64
        Lean storage; rows at ``slots`` are overwritten.
    slots : ndarray, shape (n,), int64
        Ring slots in ``[0, capacity)``.
    rows : ndarray, shape (n, dense_row_words), uint64
        Staged dense rows (zero padding).
    head_words : int
        obs, action and reward: words ``[0, head_words)`` of both formats.
    done_lean, done_dense, done_words : int
        Word offset of the done section in a lean and in a dense row, and its length.
    """
    for i in range(slots.shape[0]):
        store_lean_row(table[slots[i]], rows[i], head_words, done_lean, done_dense, done_words)


@njit(inline="always")
def store_lean_row(
    dst: np.ndarray,
    src: np.ndarray,
    head_words: Any,
    done_lean: Any,
    done_dense: Any,
    done_words: Any,
) -> None:
    """One staged dense row ``src`` as the lean row ``dst`` (words; see :func:`scatter_lean`)."""
    _copy_words(dst, 0, src, 0, head_words)
    _zero_words(dst, head_words, done_lean)  # padding stays zero, as in staged rows
    _copy_words(dst, done_lean, src, done_dense, done_words)
    _zero_words(dst, done_lean + done_words, dst.shape[0])


@njit(cache=True, nogil=True)
def gather_next_field(
    field: np.ndarray,
    side: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    side_offset: int,
    out: np.ndarray,
) -> None:
    """One agent's next_obs for the ``agent_major`` layout: ``field[next_slot[slot]]`` or the
    agent's part of the side row.

    Parameters
    ----------
    field : ndarray, shape (capacity, width), words
        The agent's obs array viewed as words of a size that divides ``width`` bytes and
        ``side_offset`` bytes.
    side : ndarray, shape (side_rows, side_width), same word dtype
        Side table (next_obs sections).
    indices, next_slot, side_row : ndarray, int64
        Per slot: the successor slot whose obs is this slot's next_obs, else -1 and the side
        table row that holds it.
    side_offset : int
        The agent's offset inside a next_obs section, in words.
    out : ndarray, shape (batch, width), same word dtype
    """
    width = field.shape[1]
    for i in range(indices.shape[0]):
        slot = indices[i]
        successor = next_slot[slot]
        dst = out[i]
        if successor >= 0:
            src = field[successor]
            for w in range(width):
                dst[w] = src[w]
        else:
            row = side[side_row[slot]]
            for w in range(width):
                dst[w] = row[side_offset + w]


@njit(inline="always")
def _copy_words(dst: np.ndarray, dst0: Any, src: np.ndarray, src0: Any, count: Any) -> None:
    """``dst[dst0 : dst0 + count] = src[src0 : src0 + count]`` as a plain loop (unsigned
    offsets: no negative-index wraparound test, so LLVM vectorises it)."""
    for w in range(count):
        dst[dst0 + w] = src[src0 + w]


@njit(inline="always")
def _zero_words(dst: np.ndarray, lo: Any, hi: Any) -> None:
    for w in range(lo, hi):
        dst[w] = 0


@njit(inline="always")
def next_sources(indices: np.ndarray, next_slot: np.ndarray, side_row: np.ndarray) -> np.ndarray:
    """Where each gathered row's next observation lives: ``successor + 1``, or ``-1 - side
    row``, or 0 for a masked row (index -1); empty links (``next_slot`` of length 0): zeros.

    One pass of its own before the copies: the link reads are independent, so their cache
    misses overlap, and the copy pass then knows every address (in one pass each successor's
    address would wait for its own link read, serialising two misses per row).
    """
    n = indices.shape[0]
    where = np.zeros(n, dtype=np.int64)
    if next_slot.shape[0] > 0:
        for i in range(n):
            slot = indices[i]
            if slot >= 0:
                successor = next_slot[slot]
                where[i] = successor + 1 if successor >= 0 else -1 - side_row[slot]
    return where


@njit(inline="always")
def prefetch_next(table: np.ndarray, side: np.ndarray, at: Any, count: Any, max_lines: Any) -> None:
    """Prefetch the first ``count`` words (at most ``max_lines`` lines) of the next-observation
    source ``at`` (:func:`next_sources`: the successor's row, or the side row)."""
    zero = np.uint64(0)
    if at > 0:
        prefetch_words(table[at - 1], zero, count, max_lines)
    else:
        prefetch_words(side[-1 - at], zero, count, max_lines)


@njit(cache=True, nogil=True)
def gather_lean_rows(
    table: np.ndarray,
    side: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    head_words: np.uint64,
    next_dst: np.uint64,
    next_words: np.uint64,
    last_mask: np.uint64,
    tail_src: np.uint64,
    tail_dst: np.uint64,
    tail_words: np.uint64,
    out: np.ndarray,
    ahead: int,
    prefetch_lines: int,
    streaming: bool,
) -> None:
    """Lean rows -> dense batch rows: the default gather (observations stored once, rows batch,
    no dtype conversion), three block copies per row.

    A dense row is ``[head | pad | next_obs | pad | tail | pad]``; a lean row is
    ``[head | tail | pad]``. Per gathered row the kernel copies the head (obs, action, reward)
    and the tail (done onwards) from the row itself and the next_obs section from the
    successor's obs section (``next_slot[slot] >= 0``) or the side row, and writes zeros in
    every padding word, so the block equals a dense gather bit for bit. All offsets and
    lengths are in 8-byte words and unsigned; spans move as whole vector lines
    (:mod:`marlbuf._kernels.memops`).

    A first pass reads every row's link (the link reads are independent, so their cache misses
    overlap); the copy pass then knows every source address, and prefetches the row and the
    next-observation source ``ahead`` rows before copying them: a lean row's copy is three
    spans and the padding, more instructions than a dense row's, so without the hint fewer
    rows' misses fit the CPU's reorder window and the gather waits on them one row at a time.

    Parameters
    ----------
    table : ndarray, shape (capacity, lean_row_words), uint64
        Lean storage.
    side : ndarray, shape (side_rows, side_words), uint64
        Side table of next_obs sections (zero past the section's last byte).
    indices : ndarray, shape (batch,), int64
        Filled slots, or -1 for an output row of zeros (masked sequence steps).
    next_slot, side_row : ndarray, shape (capacity,), int64
        Per slot, the successor slot or -1, and the side row where it is -1.
    head_words : uint64
        Words ``[0, head_words)`` are the same in both row formats.
    next_dst, next_words, last_mask : uint64
        The next_obs section starts at word ``next_dst`` of a dense row; ``next_words`` whole
        words are copied, then one more word masked by ``last_mask`` (the low bytes that belong
        to the section; all ones when the section ends on a word: the last word is always
        written through the mask, which keeps the loops free of a branch).
    tail_src, tail_dst, tail_words : uint64
        The tail: ``tail_words`` words from word ``tail_src`` of a lean row to word
        ``tail_dst`` of a dense row.
    out : ndarray, shape (batch, row_words), uint64
        Dense batch rows; overwritten.
    ahead : int
        How many rows ahead of the one copied the prefetches run, ``>= 1``.
    prefetch_lines : int
        Lines prefetched per source span, ``>= 1``.
    streaming : bool
        Write the output's whole lines with non-temporal stores
        (:func:`marlbuf._kernels.memops.stream_words`).
    """
    n = indices.shape[0]
    where = next_sources(indices, next_slot, side_row)
    row_words = np.uint64(out.shape[1])
    lean_words = np.uint64(table.shape[1])
    section = next_words + np.uint64(1)
    lines = np.uint64(prefetch_lines)
    zero = np.uint64(0)
    for i in range(n):
        ahead_row = i + ahead
        if ahead_row < n and indices[ahead_row] >= 0:
            prefetch_words(table[indices[ahead_row]], zero, lean_words, lines)
            prefetch_next(table, side, where[ahead_row], section, lines)
        slot = indices[i]
        dst = out[i]
        if slot < 0:
            zero_words(dst, zero, row_words)
            continue
        src = table[slot]
        move_words(dst, zero, src, zero, head_words, streaming)
        zero_words(dst, head_words, next_dst)
        at = where[i]
        nxt = table[at - 1] if at > 0 else side[-1 - at]
        move_words(dst, next_dst, nxt, zero, next_words, streaming)
        end = next_dst + next_words
        dst[end] = nxt[next_words] & last_mask
        zero_words(dst, end + np.uint64(1), tail_dst)
        move_words(dst, tail_dst, src, tail_src, tail_words, streaming)
        zero_words(dst, tail_dst + tail_words, row_words)
    if streaming:
        store_fence()
