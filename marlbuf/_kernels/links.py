"""Kernels of the next-observation links (observations stored once): the link from a stored
transition to its successor's slot where that step's obs is the transition's next_obs, the side
rows of the next observations that are no stored obs, and the lean row stored beside them
(:class:`marlbuf.writer.NextObsLinks` keeps the arrays and the free stack of side rows).

One step: :func:`link_slot` (the link update, given the new obs section), :func:`link_step`
(that, then the staged next_obs copied to its side row) and :func:`commit_lean_step` (that, then
the lean row stored). Many rows: :func:`next_is_obs`, :func:`release_slots` and
:func:`link_rows`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from marlbuf._kernels.once import store_lean_row

#: Entries of the ``lean`` geometry array (8-byte words unless said otherwise): head words
#: (obs, action, reward), the done section's word offset in a lean and in a dense row, its
#: length, the obs section's length in bytes, and the next_obs section's word offset in a dense
#: row.
LEAN_HEAD, LEAN_DONE, DENSE_DONE, DONE_WORDS, OBS_BYTES, DENSE_NEXT_OBS = range(6)


@njit(cache=True, nogil=True)
def link_slot(
    obs_words: np.ndarray,
    slot: int,
    obs_bytes: int,
    side: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    write_generation: np.ndarray,
    prev_slot: int,
    prev_generation: int,
    spare: int,
) -> tuple[int, int]:
    """The link update of :func:`link_step` given the new obs section as words
    (``obs_words[:ceil(obs_bytes / 8)]``, bytes past ``obs_bytes`` ignored); returns its code
    and the side row that takes the new next_obs."""
    whole = obs_bytes // 8
    tail_bits = 8 * (obs_bytes - 8 * whole)
    tail = (np.uint64(1) << np.uint64(tail_bits)) - np.uint64(1) if tail_bits else np.uint64(0)
    linked = False
    held = -1
    if prev_slot >= 0 and prev_slot != slot and write_generation[prev_slot] == prev_generation:
        held = side_row[prev_slot]
        if held >= 0:
            held_row = side[held]
            same = True
            for w in range(whole):
                if held_row[w] != obs_words[w]:
                    same = False
                    break
            if same and tail_bits and ((held_row[whole] ^ obs_words[whole]) & tail) != 0:
                same = False
            if same:
                next_slot[prev_slot] = slot
                side_row[prev_slot] = -1
                linked = True
    old = side_row[slot]
    next_slot[slot] = -1
    if old >= 0:
        new = old
        code = held if linked else -1
    elif linked:
        new = held
        code = -1
    else:
        new = spare
        code = -2
    side_row[slot] = new
    return code, new


@njit(cache=True, nogil=True)
def link_step(
    row: np.ndarray,
    slot: int,
    lean: np.ndarray,
    side: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    write_generation: np.ndarray,
    prev_slot: int,
    prev_generation: int,
    spare: int,
) -> int:
    """Update the next-observation links for one staged dense ``row`` about to be stored at
    ``slot`` (:meth:`marlbuf.writer.NextObsLinks.commit_one`); call before ``write_generation``
    records the new write.

    The stream's previous transition (``prev_slot``, -1 for none, written with
    ``prev_generation``) links to ``slot`` when it is still stored, is not ``slot`` itself and
    its side row holds exactly the new obs section; its side row is then freed. The new
    transition's next_obs section goes to a side row: the one ``slot`` held before, else the
    freed one, else ``spare`` (the top of the caller's free stack).

    Parameters
    ----------
    row : ndarray, shape (row_words,), uint64
        The staged dense row (obs section at byte 0).
    lean : ndarray, int64
        Row geometry (:data:`LEAN_HEAD` and the entries after it).
    side : ndarray, shape (side_rows, side_words), uint64
        The side table; only the first ``obs_bytes`` bytes of a side row are written.
    next_slot, side_row, write_generation : ndarray, shape (capacity,), int64
        The links and the write generations (pre-write).

    Returns
    -------
    int
        What the caller's free stack must do: ``-1`` nothing, ``-2`` pop ``spare`` (taken),
        ``r >= 0`` push ``r`` (freed, not reused).
    """
    obs_bytes = lean[OBS_BYTES]
    code, new = link_slot(
        row,
        slot,
        obs_bytes,
        side,
        next_slot,
        side_row,
        write_generation,
        prev_slot,
        prev_generation,
        spare,
    )
    whole = obs_bytes // 8
    tail_bits = 8 * (obs_bytes - 8 * whole)
    dst = side[new]
    src = row[lean[DENSE_NEXT_OBS] :]
    for w in range(whole):
        dst[w] = src[w]
    if tail_bits:
        tail = (np.uint64(1) << np.uint64(tail_bits)) - np.uint64(1)
        dst[whole] = (dst[whole] & ~tail) | (src[whole] & tail)
    return code


@njit(cache=True, nogil=True)
def commit_lean_step(
    table: np.ndarray,
    row: np.ndarray,
    slot: int,
    generation: int,
    write_generation: np.ndarray,
    lean: np.ndarray,
    side: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    prev_slot: int,
    prev_generation: int,
    spare: int,
) -> int:
    """:func:`link_step`, then the staged dense ``row`` stored lean at ``table[slot]`` (as
    :func:`marlbuf._kernels.scatter_lean` stores it) and its write ``generation`` recorded;
    returns :func:`link_step`'s free-stack instruction."""
    code = link_step(
        row,
        slot,
        lean,
        side,
        next_slot,
        side_row,
        write_generation,
        prev_slot,
        prev_generation,
        spare,
    )
    store_lean_row(
        table[slot], row, lean[LEAN_HEAD], lean[LEAN_DONE], lean[DENSE_DONE], lean[DONE_WORDS]
    )
    write_generation[slot] = generation
    return code


# ----------------------------------------------------------------------------- many rows
@njit(cache=True, nogil=True)
def next_is_obs(rows: np.ndarray, obs_bytes: int, next_word: int, same: np.ndarray) -> int:
    """Within consecutive staged dense rows of one stream, whether each row's next_obs section
    is byte for byte the next row's obs section (``same[t]`` for ``t < n - 1``); returns how
    many rows keep their next_obs in a side row (``n`` minus the matches: the last row always
    does).

    Parameters
    ----------
    rows : ndarray, shape (n, row_words), uint64
        Staged dense rows (obs section at word 0, next_obs section at word ``next_word``).
    obs_bytes : int
        Length of the obs (and next_obs) section in bytes; the bytes after it in the last
        word are ignored.
    same : ndarray, shape (max(n - 1, 0),), bool
        Overwritten.
    """
    whole = obs_bytes // 8
    tail_bits = 8 * (obs_bytes - 8 * whole)
    tail = (np.uint64(1) << np.uint64(tail_bits)) - np.uint64(1) if tail_bits else np.uint64(0)
    n = rows.shape[0]
    kept = n
    for t in range(n - 1):
        diff = np.uint64(0)
        for w in range(whole):
            diff |= rows[t, next_word + w] ^ rows[t + 1, w]
        if tail_bits:
            diff |= (rows[t, next_word + whole] ^ rows[t + 1, whole]) & tail
        same[t] = diff == 0
        kept -= diff == 0
    return kept


@njit(cache=True, nogil=True)
def release_slots(slots: np.ndarray, pointers: np.ndarray, released: np.ndarray) -> int:
    """Before ``slots`` are overwritten: the side rows they hold go to ``released`` (in slot
    order; returns how many), and their links are cleared (``pointers``: shape (2, capacity),
    int64, the links' ``next_slot`` and ``side_row``)."""
    count = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        held = pointers[1, slot]
        if held >= 0:
            released[count] = held
            count += 1
        pointers[0, slot] = -1
        pointers[1, slot] = -1
    return count


@njit(cache=True, nogil=True)
def link_rows(
    rows: np.ndarray,
    slots: np.ndarray,
    same: np.ndarray,
    side_rows: np.ndarray,
    side: np.ndarray,
    pointers: np.ndarray,
    obs_bytes: int,
    next_word: int,
) -> None:
    """The links of staged dense ``rows`` (shape (n, row_words), uint64) written at ``slots``
    (shape (n,), int64, cleared by :func:`release_slots`): row ``t`` links to row ``t + 1``
    where ``same[t]`` (shape (n - 1,), bool; all False for rows of distinct streams), every
    other row's next_obs section goes to the next of ``side_rows`` (in row order: exactly as
    many as :func:`next_is_obs` counted), of which only the first ``obs_bytes`` bytes are
    written (``side``: shape (side_rows, side_words), uint64)."""
    whole = obs_bytes // 8
    tail_bits = 8 * (obs_bytes - 8 * whole)
    tail = (np.uint64(1) << np.uint64(tail_bits)) - np.uint64(1) if tail_bits else np.uint64(0)
    n = rows.shape[0]
    j = 0
    for t in range(n):
        if t < n - 1 and same[t]:
            pointers[0, slots[t]] = slots[t + 1]
            continue
        dst = side[side_rows[j]]
        src = rows[t, next_word:]
        for w in range(whole):
            dst[w] = src[w]
        if tail_bits:
            dst[whole] = (dst[whole] & ~tail) | (src[whole] & tail)
        pointers[1, slots[t]] = side_rows[j]
        j += 1
