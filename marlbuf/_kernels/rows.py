"""Row gather/scatter and locality index maths."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from marlbuf._kernels.memops import move_words, prefetch_words, store_fence, zero_words


@njit(cache=True, nogil=True)
def gather_rows(table: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
    """Copy ``table[indices[i]]`` into ``out[i]`` for every ``i``.

    Parameters
    ----------
    table : ndarray, shape (capacity, width), any dtype, C-contiguous
        Source rows (an interleaved table viewed as 8-byte words, or one agent's field).
    indices : ndarray, shape (batch,), int64
        Row numbers, each in ``[0, capacity)`` (checked by the caller), or -1 for an output row
        of zeros (the masked steps of a sequence batch).
    out : ndarray, shape (batch, width), same dtype as ``table``, C-contiguous
        Destination; overwritten.

    Notes
    -----
    The inner loop is a straight word copy that LLVM turns into vector moves; it runs without the
    GIL, so a caller may overlap a gather with other Python work in a thread. Any dtype (the
    ``agent_major`` layout's per-agent arrays); tables of 8-byte words (the interleaved rows)
    take :func:`gather_words`, which prefetches, copies runs of consecutive slots as one span
    and streams large outputs.
    """
    width = table.shape[1]
    for i in range(indices.shape[0]):
        dst = out[i]
        if indices[i] < 0:
            dst[:] = 0  # a memset
            continue
        src = table[indices[i]]
        for w in range(width):
            dst[w] = src[w]


@njit(cache=True, nogil=True)
def gather_words(
    table: np.ndarray,
    indices: np.ndarray,
    out: np.ndarray,
    ahead: int,
    prefetch_lines: int,
    streaming: bool,
) -> None:
    """:func:`gather_rows` for tables of 8-byte words (the interleaved rows): ``out[i] =
    table[indices[i]]``, or zeros where ``indices[i]`` is -1.

    Three things make it faster than a plain loop over the words:

    * **Prefetch.** Before row ``i`` is copied, the first ``prefetch_lines`` cache lines of
      row ``i + ahead`` are requested. A row's copy takes few instructions, but its lines are
      random cache misses; without the hint the CPU can only overlap the misses of the few rows
      its reorder window holds.
    * **Runs as one span.** Consecutive slots (``indices[i + 1] == indices[i] + 1``, as neighbor
      sampling and sequences draw them) are contiguous in both the table and the output, so a
      run is copied as one span of lines.
    * **Streaming stores** (``streaming``): whole output lines are written with non-temporal
      stores, which skip reading the line into the cache first (a plain store's
      read-for-ownership makes the copy move each output byte twice) and do not evict the
      cache. For outputs larger than the cache, which would not stay there anyway.

    Parameters
    ----------
    table : ndarray, shape (capacity, width), uint64, C-contiguous
        Source rows.
    indices : ndarray, shape (batch,), int64
        Row numbers in ``[0, capacity)`` (checked by the caller), or -1 for a row of zeros.
    out : ndarray, shape (batch, width), uint64, C-contiguous
        Destination; overwritten.
    ahead : int
        How many rows ahead of the one copied the prefetches run, ``>= 1``.
    prefetch_lines : int
        Lines prefetched per row, ``>= 1``.
    streaming : bool
        Write whole output lines with non-temporal stores.
    """
    n = indices.shape[0]
    width = np.uint64(table.shape[1])
    source = table.reshape(-1)
    target = out.reshape(-1)
    lines = np.uint64(prefetch_lines)
    fetched = 0  # rows prefetched so far
    i = 0
    while i < n:
        slot = indices[i]
        stop = i + 1  # the run of consecutive slots [i, stop)
        if slot >= 0:
            while stop < n and indices[stop] == indices[stop - 1] + 1:
                stop += 1
        while fetched < min(n, i + ahead + 1):
            if indices[fetched] >= 0:
                prefetch_words(source, np.uint64(indices[fetched]) * width, width, lines)
            fetched += 1
        begin = np.uint64(i) * width
        if slot < 0:
            zero_words(target, begin, begin + width)
        else:
            count = np.uint64(stop - i) * width
            move_words(target, begin, source, np.uint64(slot) * width, count, streaming)
        i = stop
    if streaming:
        store_fence()


@njit(cache=True, nogil=True)
def scatter_rows(table: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    """Copy ``rows[i]`` into ``table[slots[i]]`` for every ``i`` (the writer's commit).

    Parameters
    ----------
    table : ndarray, shape (capacity, width), C-contiguous
        Destination storage; rows at ``slots`` are overwritten.
    slots : ndarray, shape (n,), int64
        Ring slots, each in ``[0, capacity)``; later entries win on duplicates.
    rows : ndarray, shape (n, width), same dtype as ``table``, C-contiguous
        New contents.
    """
    width = table.shape[1]
    for i in range(slots.shape[0]):
        src = rows[i]
        dst = table[slots[i]]
        for w in range(width):
            dst[w] = src[w]


@njit(cache=True, nogil=True)
def neighbor_indices(refs: np.ndarray, run_length: int, capacity: int, out: np.ndarray) -> None:
    """Expand reference points into runs of contiguous slots (cache-locality sampling).

    ``out[r * run_length + k] = (refs[r] + k) mod capacity`` — the run starts at (and includes)
    its reference and wraps around the ring (Gogineni et al., Sec. 5.1, "neighbor sampling").

    Parameters
    ----------
    refs : ndarray, shape (n_refs,), int64
        Reference slots in ``[0, capacity)``.
    run_length : int
        Slots per run, ``>= 1``.
    capacity : int
        Ring size; indices wrap modulo it.
    out : ndarray, shape (n_refs * run_length,), int64
        Destination; overwritten.
    """
    for r in range(refs.shape[0]):
        base = r * run_length
        for k in range(run_length):
            slot = refs[r] + k
            if slot >= capacity:  # wrap from the last slot to slot 0
                slot -= capacity
            out[base + k] = slot


@njit(cache=True, nogil=True)
def first_nonfinite(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> int:
    """Index of the first segment holding a NaN or inf in any row, or -1.

    Rows are scanned in memory order (each row once, every segment of it), each segment's
    words reduced without a branch (``x - x`` is 0 for every finite ``x``, NaN for NaN and
    inf), and the lowest flagged segment is returned: the answer of a segment-by-segment
    scan, at the speed of one pass over the rows.

    Parameters
    ----------
    values : ndarray, shape (rows, width), float32 or float64
        Staged rows viewed in the segments' dtype.
    starts, counts : ndarray, shape (n_segments,), int64
        Each segment covers ``values[:, starts[s] : starts[s] + counts[s]]``.
    """
    n_segments = starts.shape[0]
    flagged = np.zeros(n_segments, dtype=np.bool_)
    zero = values.dtype.type(0)
    for r in range(values.shape[0]):
        row = values[r]
        for s in range(n_segments):
            lo = starts[s]
            acc = zero
            for w in range(lo, lo + counts[s]):
                acc += row[w] - row[w]  # stays 0 unless some word is NaN or inf
            if acc != 0:
                flagged[s] = True
    for s in range(n_segments):
        if flagged[s]:
            return s
    return -1


@njit(cache=True, nogil=True, parallel=True)
def gather_rows_parallel(table: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
    """:func:`gather_rows` with the rows split across Numba's threads (opt-in).

    Each thread writes disjoint output rows, so there is no race. Worth it only for wide rows
    on an otherwise idle core (measured on a quiet 2-core VM: 1.4x for the 28 KB rows of
    24-agent cooperative navigation, 0.9x for 576-byte rows); see
    ``_config.PARALLEL_GATHER_MIN_BYTES``.
    """
    width = table.shape[1]
    for i in prange(indices.shape[0]):
        dst = out[i]
        if indices[i] < 0:
            dst[:] = 0  # a memset
            continue
        src = table[indices[i]]
        for w in range(width):
            dst[w] = src[w]
