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
def _widen_units(
    out: np.ndarray, dst0: Any, source: np.ndarray, row: int, src0: Any, count: Any, lut: Any
) -> None:
    for k in range(count):
        out[dst0 + k] = lut[source[row, src0 + k]]


@njit(inline="always")
def _zero_units(out: np.ndarray, dst0: Any, count: Any) -> None:
    for k in range(count):
        out[dst0 + k] = 0


@njit(inline="always")
def _segment(
    rows: np.ndarray,
    nexts: np.ndarray,
    out: np.ndarray,
    indices: np.ndarray,
    lo: int,
    hi: int,
    src0: Any,
    dst0: int,
    step: int,
    length: Any,
    from_next: bool,
    widen: bool,
    lut: np.ndarray,
) -> None:
    """One plan segment for the rows ``[lo, hi)`` staged in ``rows`` / ``nexts``."""
    source = nexts if from_next else rows
    for i in range(lo, hi):
        dst = np.uint64(dst0 + i * step)
        if indices[i] < 0:
            _zero_units(out, dst, length)
        elif widen:
            _widen_units(out, dst, source, i - lo, src0, length, lut)
        else:
            _copy_units(out, dst, source, i - lo, src0, length)


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
) -> None:
    """:func:`gather_plan`, fast: the same plan and the same result, bit for bit.

    The rows are worked on in blocks of ``block_rows``. For a block, the stored rows (and,
    with links, the next-observation sections from the successor rows or the side table) are
    first copied whole into a small staging area that stays in cache: long copies that stream
    at memory speed. Then the plan runs segment by segment over the block, reading the staging
    area: a segment's kind, offsets and source are decided once per block, and each row's copy
    is a short loop with unsigned offsets (no negative-index wraparound test). Applying the
    plan straight to the table instead interleaves short copies with cache misses, and per
    element decisions (what :func:`gather_plan` does) cost more than the copies.

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
    # where[i]: successor slot + 1, or -1 - side row (read first: the misses overlap)
    where = np.zeros(n, dtype=np.int64)
    if links:
        for i in range(n):
            slot = indices[i]
            if slot >= 0:
                successor = next_slot[slot]
                where[i] = successor + 1 if successor >= 0 else -1 - side_row[slot]
    width = np.uint64(row_words)
    nwidth = np.uint64(next_words)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        for i in range(lo, hi):
            slot = indices[i]
            if slot < 0:
                continue  # every segment writes zeros for it
            for k in range(width):
                staged[i - lo, k] = table64[slot, k]
            if links:
                at = where[i]
                if at > 0:
                    for k in range(nwidth):
                        staged_next[i - lo, k] = table64[at - 1, k]
                else:
                    for k in range(nwidth):
                        staged_next[i - lo, k] = side64[-1 - at, k]
        for s in range(seg_kind.shape[0]):
            kind = seg_kind[s]
            src0 = np.uint64(seg_src[s])
            length = np.uint64(seg_len[s])
            dst0 = seg_dst[s]
            step = seg_step[s]
            from_next = seg_next[s] != 0
            if kind == COPY64:
                _segment(staged, staged_next, out64, indices, lo, hi, src0, dst0, step, length,
                         from_next, False, half_lut)  # fmt: skip
            elif kind == COPY32:
                _segment(rows32, nexts32, out32, indices, lo, hi, src0, dst0, step, length,
                         from_next, False, half_lut)  # fmt: skip
            elif kind == COPY8:
                _segment(rows8, nexts8, out8, indices, lo, hi, src0, dst0, step, length,
                         from_next, False, half_lut)  # fmt: skip
            else:
                _segment(rows16, nexts16, out32, indices, lo, hi, src0, dst0, step, length,
                         from_next, True, half_lut)  # fmt: skip


@njit(cache=True, nogil=True)
def gather_spans(
    table64: np.ndarray,
    indices: np.ndarray,
    seg_kind: np.ndarray,
    seg_src: np.ndarray,
    seg_dst: np.ndarray,
    seg_len: np.ndarray,
    seg_step: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out8: np.ndarray,
) -> None:
    """:func:`gather_plan` for plans of copies from the gathered row itself (kinds
    :data:`COPY64`, :data:`COPY32`, :data:`COPY8`; no next observations, no float16
    conversion): each segment is copied straight from the table row, without the staging area
    of :func:`gather_segments`. For batches of a few chosen fields (``fields=``) the segments
    are a part of the row, and staging whole rows would copy the rest for nothing.

    Parameters
    ----------
    table64 : ndarray, shape (capacity, row_words), uint64
        The storage table.
    indices : ndarray, shape (n,), int64
        Slots to gather; -1 writes zeros in every segment of that row.
    seg_kind, seg_src, seg_dst, seg_len, seg_step : ndarray, shape (n_segments,), int64
        The plan, as for :func:`gather_plan` (``seg_next`` all 0, no ``HALF_TO_FLOAT``).
    out64, out32, out8 : ndarray, uint64 / uint32 / uint8
        Views of one output block.
    """
    rows32 = table64.view(np.uint32).reshape(table64.shape[0], -1)
    rows8 = table64.view(np.uint8).reshape(table64.shape[0], -1)
    for i in range(indices.shape[0]):
        slot = indices[i]
        for s in range(seg_kind.shape[0]):
            kind = seg_kind[s]
            src0 = np.uint64(seg_src[s])
            dst = np.uint64(seg_dst[s] + i * seg_step[s])
            length = np.uint64(seg_len[s])
            if kind == COPY64:
                if slot < 0:
                    _zero_units(out64, dst, length)
                else:
                    _copy_units(out64, dst, table64, slot, src0, length)
            elif kind == COPY32:
                if slot < 0:
                    _zero_units(out32, dst, length)
                else:
                    _copy_units(out32, dst, rows32, slot, src0, length)
            elif slot < 0:
                _zero_units(out8, dst, length)
            else:
                _copy_units(out8, dst, rows8, slot, src0, length)
