"""Kernels of the observations-stored-once format (the gather of lean rows into batches is
:func:`marlbuf._kernels.plan.gather_plan`).

A lean row holds a transition without its ``next_obs``. A slot's next observation is the
``obs`` section of its *successor* slot (``next_slot[slot] >= 0``) or, where they differ
(episode end, reset, the newest transition of a stream), a row of the *side table*
(``side[side_row[slot]]``), which holds the next_obs section bytes. See
:mod:`marlbuf.writer` for how the links are kept exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
    width = table.shape[1]
    for i in range(slots.shape[0]):
        dst = table[slots[i]]
        src = rows[i]
        for w in range(head_words):
            dst[w] = src[w]
        for w in range(head_words, done_lean):  # padding stays zero, as in staged rows
            dst[w] = 0
        for w in range(done_words):
            dst[done_lean + w] = src[done_dense + w]
        for w in range(done_lean + done_words, width):
            dst[w] = 0


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
