"""The general gather: stored rows -> batch, by a plan of segments.

One kernel serves every storage/batch combination other than the plain dense row copy
(:func:`marlbuf._kernels.rows.gather_rows`): lean rows (observations stored once, the next_obs
read from the successor row or the side table), half-precision fields converted to float32,
and per-agent contiguous outputs. A *plan* lists segments; for every gathered row each segment
copies or converts one span.

Segment kinds (units of ``seg_src``, ``seg_dst``, ``seg_len``, ``seg_step``):

* :data:`COPY64` -- copy 8-byte words;
* :data:`COPY32` -- copy 4-byte words;
* :data:`COPY8` -- copy bytes;
* :data:`HALF_TO_FLOAT` -- convert float16 to float32 (source in 2-byte units, destination in
  4-byte units, length in elements) through a 65,536-entry table built from NumPy's own
  conversion, so the result equals ``astype(np.float32)`` bit for bit (NaN payloads included).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from marlbuf._kernels.memops import (
    copy_words,
    move_words,
    prefetch_words,
    store_fence,
    widen_span,
)
from marlbuf._kernels.once import next_sources, prefetch_next

COPY64 = 0
COPY32 = 1
COPY8 = 2
HALF_TO_FLOAT = 3

#: float32 bit patterns of every float16 bit pattern
HALF_TO_FLOAT_BITS = (
    np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
)


@njit(cache=True, nogil=True)
def gather_plan(
    table64: np.ndarray,
    table32: np.ndarray,
    table16: np.ndarray,
    table8: np.ndarray,
    side64: np.ndarray,
    side32: np.ndarray,
    side16: np.ndarray,
    side8: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    seg_kind: np.ndarray,
    seg_src: np.ndarray,
    seg_dst: np.ndarray,
    seg_len: np.ndarray,
    seg_step: np.ndarray,
    seg_next: np.ndarray,
    half_lut: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out8: np.ndarray,
) -> None:
    """Gather ``indices`` by the plan into ``out``.

    Parameters
    ----------
    table64, table32, table16, table8 : ndarray, shape (capacity, row_units)
        The storage table viewed as uint64, uint32, uint16 and uint8 rows.
    side64, side32, side16, side8 : ndarray, shape (side_rows, side_units)
        The next_obs side table in the same four views (any one-row array without links).
    indices : ndarray, shape (batch,), int64
        Filled slots (checked by the caller), or -1 for an output row whose every segment is
        zero (the masked steps of a sequence batch).
    next_slot, side_row : ndarray, shape (capacity,), int64
        Observations stored once: successor slot or -1 and the side row (unused when no
        segment has ``seg_next``).
    seg_kind, seg_src, seg_dst, seg_len, seg_step, seg_next : ndarray, shape (n_segments,), int64
        Per segment: kind, source offset in a stored row (or in the obs section for a next_obs
        segment), destination offset of row 0 in ``out``, length, destination step per row,
        and whether the source is the next observation.
    half_lut : ndarray, shape (65536,), uint32
        :data:`HALF_TO_FLOAT_BITS`.
    out64, out32, out8 : ndarray, shape (n_units,)
        The output block viewed flat as uint64, uint32 and uint8.
    """
    # rows are indexed two-dimensionally (no row views in the loops: a view per segment costs
    # reference counting that dominates short segments)
    for i in range(indices.shape[0]):
        slot = indices[i]
        if slot < 0:
            for s in range(seg_kind.shape[0]):
                kind = seg_kind[s]
                dst0 = seg_dst[s] + i * seg_step[s]
                stop = dst0 + seg_len[s]
                if kind == COPY64:
                    out64[dst0:stop] = 0
                elif kind == COPY8:
                    out8[dst0:stop] = 0
                else:  # COPY32 and half -> float32 both write 32-bit units
                    out32[dst0:stop] = 0
            continue
        successor = next_slot[slot] if next_slot.shape[0] else 0
        for s in range(seg_kind.shape[0]):
            kind = seg_kind[s]
            length = seg_len[s]
            src0 = seg_src[s]
            dst0 = seg_dst[s] + i * seg_step[s]
            side = False
            row = slot
            if seg_next[s]:
                if successor < 0:
                    side = True
                    row = side_row[slot]
                else:
                    row = successor
            if kind == COPY64:
                if side:
                    for k in range(length):
                        out64[dst0 + k] = side64[row, src0 + k]
                else:
                    for k in range(length):
                        out64[dst0 + k] = table64[row, src0 + k]
            elif kind == COPY32:
                if side:
                    for k in range(length):
                        out32[dst0 + k] = side32[row, src0 + k]
                else:
                    for k in range(length):
                        out32[dst0 + k] = table32[row, src0 + k]
            elif kind == COPY8:
                if side:
                    for k in range(length):
                        out8[dst0 + k] = side8[row, src0 + k]
                else:
                    for k in range(length):
                        out8[dst0 + k] = table8[row, src0 + k]
            elif side:
                for k in range(length):
                    out32[dst0 + k] = half_lut[side16[row, src0 + k]]
            else:
                for k in range(length):
                    out32[dst0 + k] = half_lut[table16[row, src0 + k]]


@njit(cache=True, nogil=True)
def first_nonfinite_half(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> int:
    """:func:`marlbuf._kernels.rows.first_nonfinite` for float16 segments, on their bits.

    Parameters
    ----------
    values : ndarray, shape (rows, width), uint16
        Staged rows viewed as 2-byte units.
    starts, counts : ndarray, shape (n_segments,), int64
        Each segment covers ``values[:, starts[s] : starts[s] + counts[s]]``.
    """
    n_segments = starts.shape[0]
    flagged = np.zeros(n_segments, dtype=np.bool_)
    for r in range(values.shape[0]):  # rows in memory order, as first_nonfinite
        row = values[r]
        for s in range(n_segments):
            lo = starts[s]
            bad = False
            for w in range(lo, lo + counts[s]):
                bad |= row[w] & 0x7C00 == 0x7C00  # all exponent bits set: inf or NaN
            if bad:
                flagged[s] = True
    for s in range(n_segments):
        if flagged[s]:
            return s
    return -1


@njit(inline="always")
def _copy_units(
    out: np.ndarray, dst0: Any, source: np.ndarray, row: int, src0: Any, count: Any
) -> None:
    for k in range(count):
        out[dst0 + k] = source[row, src0 + k]


@njit(inline="always")
def _zero_units(out: np.ndarray, dst0: Any, count: Any) -> None:
    for k in range(count):
        out[dst0 + k] = 0


@njit(inline="always")
def _segment_rows(
    kind: Any,
    rows64: np.ndarray,
    rows32: np.ndarray,
    rows16: np.ndarray,
    rows8: np.ndarray,
    indices: np.ndarray,
    lo: int,
    hi: int,
    src: Any,
    dst0: Any,
    step: Any,
    count: Any,
    half_lut: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out8: np.ndarray,
) -> None:
    """One plan segment for the rows ``[lo, hi)`` staged in ``rows64`` (and its unit views):
    row ``i`` of the batch is staged row ``i - lo``; a masked row (index -1) gets zeros. The
    kind is decided once, outside the row loops (a test per row keeps the loop from being
    specialised). Word segments are plain loops: here they are a row's slice of one agent's
    field, short and at any alignment, which vector lines copy more slowly."""
    src0 = np.uint64(src)
    length = np.uint64(count)
    if kind == COPY64:
        for i in range(lo, hi):
            dst = np.uint64(dst0 + i * step)
            if indices[i] < 0:
                _zero_units(out64, dst, length)
            else:
                _copy_units(out64, dst, rows64, i - lo, src0, length)
    elif kind == COPY32:
        for i in range(lo, hi):
            dst = np.uint64(dst0 + i * step)
            if indices[i] < 0:
                _zero_units(out32, dst, length)
            else:
                _copy_units(out32, dst, rows32, i - lo, src0, length)
    elif kind == COPY8:
        for i in range(lo, hi):
            dst = np.uint64(dst0 + i * step)
            if indices[i] < 0:
                _zero_units(out8, dst, length)
            else:
                _copy_units(out8, dst, rows8, i - lo, src0, length)
    else:  # float16 -> float32, in 32-bit units
        for i in range(lo, hi):
            dst = np.uint64(dst0 + i * step)
            if indices[i] < 0:
                _zero_units(out32, dst, length)
            else:
                widen_span(out32, dst, rows16[i - lo], src0, length, half_lut, False)


@njit(cache=True, nogil=True)
def gather_segments(
    table64: np.ndarray,
    side64: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    seg_kind: np.ndarray,
    seg_src: np.ndarray,
    seg_dst: np.ndarray,
    seg_len: np.ndarray,
    seg_step: np.ndarray,
    seg_next: np.ndarray,
    half_lut: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out8: np.ndarray,
    block_rows: int,
    ahead: int,
    prefetch_lines: int,
) -> None:
    """:func:`gather_plan`, fast: the same plan and the same result, bit for bit.

    The rows are worked on in blocks of ``block_rows``. For a block, the stored rows (and,
    with links, the next-observation sections from the successor rows or the side table) are
    first copied whole into a small staging area that stays in cache: long copies that stream
    at memory speed, as vector lines, with the rows ``ahead`` of the one copied prefetched.
    Then the plan runs segment by segment over the block, reading the staging area: a
    segment's kind, offsets and source are decided once per block, and float16 -> float32
    segments are widened 16 values per vector (:func:`marlbuf._kernels.memops.widen_span`,
    exact as ``astype``). Applying the plan straight to the table instead interleaves short
    copies with cache misses, and per element decisions (what :func:`gather_plan` does) cost
    more than the copies. The kernel of per-agent batches: their segments are many short
    slices written into as many arrays, for which plain stores are faster than streaming ones
    (rows batches take :func:`gather_spans`).

    Parameters
    ----------
    table64 : ndarray, shape (capacity, row_words), uint64
        The storage table.
    side64 : ndarray, shape (side_rows, side_words), uint64
        The next_obs side table (any one-row array without links).
    indices, next_slot, side_row, seg_*, half_lut, out64, out32, out8
        As for :func:`gather_plan` (next_slot empty: no links).
    block_rows : int
        Rows per block (``_config.GATHER_BLOCK_BYTES`` over the row size).
    ahead, prefetch_lines : int
        How many rows ahead of the one staged the prefetches run, and lines prefetched per
        row.
    """
    n = indices.shape[0]
    links = next_slot.shape[0] > 0
    row_words = table64.shape[1]
    next_words = side64.shape[1] if links else 1
    block = max(1, min(block_rows, n))
    staged = np.zeros((block, row_words), dtype=np.uint64)
    staged_next = np.zeros((block, next_words), dtype=np.uint64)
    rows32 = staged.view(np.uint32)
    rows16 = staged.view(np.uint16)
    rows8 = staged.view(np.uint8)
    nexts32 = staged_next.view(np.uint32)
    nexts16 = staged_next.view(np.uint16)
    nexts8 = staged_next.view(np.uint8)
    where = next_sources(indices, next_slot, side_row)
    width = np.uint64(row_words)
    nwidth = np.uint64(next_words)
    lines = np.uint64(prefetch_lines)
    zero = np.uint64(0)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        for i in range(lo, hi):
            later = i + ahead
            if later < n and indices[later] >= 0:
                prefetch_words(table64[indices[later]], zero, width, lines)
                if links:
                    prefetch_next(table64, side64, where[later], nwidth, lines)
            slot = indices[i]
            if slot < 0:
                continue  # every segment writes zeros for it
            copy_words(staged[i - lo], zero, table64[slot], zero, width)
            if links:
                at = where[i]
                nxt = table64[at - 1] if at > 0 else side64[-1 - at]
                copy_words(staged_next[i - lo], zero, nxt, zero, nwidth)
        for s in range(seg_kind.shape[0]):
            # the source views are chosen once per segment, not per row: a choice between two
            # arrays inside the row loop costs reference counting on every row
            if seg_next[s]:
                _segment_rows(seg_kind[s], staged_next, nexts32, nexts16, nexts8, indices, lo,
                              hi, seg_src[s], seg_dst[s], seg_step[s], seg_len[s], half_lut,
                              out64, out32, out8)  # fmt: skip
            else:
                _segment_rows(seg_kind[s], staged, rows32, rows16, rows8, indices, lo, hi,
                              seg_src[s], seg_dst[s], seg_step[s], seg_len[s], half_lut, out64,
                              out32, out8)  # fmt: skip


@njit(inline="always")
def _apply_segment(
    kind: Any,
    rows64: np.ndarray,
    rows32: np.ndarray,
    rows16: np.ndarray,
    rows8: np.ndarray,
    row: Any,
    src0: Any,
    dst: Any,
    length: Any,
    half_lut: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out8: np.ndarray,
    streaming: bool,
) -> None:
    """One segment of one gathered row, from row ``row`` of one source (the table or the side
    table, in its four unit views)."""
    if kind == COPY64:
        move_words(out64, dst, rows64[row], src0, length, streaming)
    elif kind == COPY32:
        _copy_units(out32, dst, rows32, row, src0, length)
    elif kind == COPY8:
        _copy_units(out8, dst, rows8, row, src0, length)
    else:
        widen_span(out32, dst, rows16[row], src0, length, half_lut, streaming)


@njit(cache=True, nogil=True)
def gather_spans(
    table64: np.ndarray,
    side64: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    seg_kind: np.ndarray,
    seg_src: np.ndarray,
    seg_dst: np.ndarray,
    seg_len: np.ndarray,
    seg_step: np.ndarray,
    seg_next: np.ndarray,
    half_lut: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out8: np.ndarray,
    ahead: int,
    prefetch_lines: int,
    streaming: bool,
) -> None:
    """:func:`gather_plan` row by row, each segment copied or widened straight from its source
    (the row, or its next observation: the successor's obs section or the side row), without
    the staging area of :func:`gather_segments`: the kernel of plans of a few long segments
    (rows batches: float16 widening, chosen fields). Spans move as vector lines, float16 is
    widened 16 values per vector, rows ``ahead`` are prefetched (the row and its next-observation
    source), and with ``streaming`` whole output lines are written with non-temporal stores
    (:mod:`marlbuf._kernels.memops`). Plans of many short segments (per-agent batches) are
    faster through :func:`gather_segments`, which decides a segment's kind once per block.

    Parameters
    ----------
    table64 : ndarray, shape (capacity, row_words), uint64
        The storage table.
    side64 : ndarray, shape (side_rows, side_words), uint64
        The next_obs side table (any one-row array when no segment reads next observations).
    indices, next_slot, side_row, seg_*, half_lut, out64, out32, out8
        As for :func:`gather_plan` (``next_slot`` empty: no links; then no segment has
        ``seg_next``).
    ahead, prefetch_lines : int
        How many rows ahead of the one gathered the prefetches run, and lines per source.
    streaming : bool
        Non-temporal stores for the output's whole lines.
    """
    n = indices.shape[0]
    capacity = table64.shape[0]
    table32 = table64.view(np.uint32).reshape(capacity, -1)
    table16 = table64.view(np.uint16).reshape(capacity, -1)
    table8 = table64.view(np.uint8).reshape(capacity, -1)
    side_rows = side64.shape[0]
    side32 = side64.view(np.uint32).reshape(side_rows, -1)
    side16 = side64.view(np.uint16).reshape(side_rows, -1)
    side8 = side64.view(np.uint8).reshape(side_rows, -1)
    links = next_slot.shape[0] > 0
    where = next_sources(indices, next_slot, side_row)
    width = np.uint64(table64.shape[1])
    nwidth = np.uint64(side64.shape[1])
    lines = np.uint64(prefetch_lines)
    zero = np.uint64(0)
    for i in range(n):
        later = i + ahead
        if later < n and indices[later] >= 0:
            prefetch_words(table64[indices[later]], zero, width, lines)
            if links:
                prefetch_next(table64, side64, where[later], nwidth, lines)
        slot = indices[i]
        at = where[i]
        for s in range(seg_kind.shape[0]):
            kind = seg_kind[s]
            src0 = np.uint64(seg_src[s])
            dst = np.uint64(seg_dst[s] + i * seg_step[s])
            length = np.uint64(seg_len[s])
            if slot < 0:
                if kind == COPY64:
                    _zero_units(out64, dst, length)
                elif kind == COPY8:
                    _zero_units(out8, dst, length)
                else:  # COPY32 and half -> float32 both write 32-bit units
                    _zero_units(out32, dst, length)
            elif seg_next[s] and at < 0:
                _apply_segment(kind, side64, side32, side16, side8, -1 - at, src0, dst, length,
                               half_lut, out64, out32, out8, streaming)  # fmt: skip
            else:
                row = at - 1 if seg_next[s] else slot
                _apply_segment(kind, table64, table32, table16, table8, row, src0, dst, length,
                               half_lut, out64, out32, out8, streaming)  # fmt: skip
    if streaming:
        store_fence()
