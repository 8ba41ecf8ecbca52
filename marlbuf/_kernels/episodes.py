"""Episode-link kernels: the slot matrix of sequence sampling.

The writer keeps, per slot, the episode id and step number of the stored step and links to the
slots of the previous and next step of the same episode (:class:`marlbuf.writer.EpisodeIndex`).
A link counts only while its target still holds the same episode at the neighbouring step, so a
slot overwritten since the link was made never enters a sequence.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def sequence_slots(
    starts: np.ndarray,
    before: int,
    after: int,
    episode: np.ndarray,
    step: np.ndarray,
    prev_slot: np.ndarray,
    next_slot: np.ndarray,
    out: np.ndarray,
) -> None:
    """The slots of ``before`` predecessors, the start and ``after`` successors of each start.

    Row ``b`` of ``out`` is ``[p_before, ..., p_1, starts[b], n_1, ..., n_after]`` where ``p_j``
    is the ``j``-th previous and ``n_j`` the ``j``-th next step of the start's episode, or -1
    where the episode (or what is still stored of it) ends first. Each step follows one link
    and checks that its target holds the same episode at step -1 / +1: O(B * L) in all.

    Parameters
    ----------
    starts : ndarray, shape (B,), int64
        Slots holding data, in ``[0, capacity)``.
    before, after : int
        Predecessors and successors per row, ``>= 0``.
    episode, step, prev_slot, next_slot : ndarray, shape (capacity,), int64
        The episode index (links are -1 or in ``[0, capacity)``).
    out : ndarray, shape (B, before + 1 + after), int64
        Destination; overwritten.
    """
    for b in range(starts.shape[0]):
        start = starts[b]
        out[b, before] = start
        current = start
        for j in range(before - 1, -1, -1):
            if current >= 0:
                linked = prev_slot[current]
                if (
                    linked >= 0
                    and episode[linked] == episode[current]
                    and step[linked] == step[current] - 1
                ):
                    current = linked
                else:
                    current = -1
            out[b, j] = current
        current = start
        for j in range(before + 1, before + 1 + after):
            if current >= 0:
                linked = next_slot[current]
                if (
                    linked >= 0
                    and episode[linked] == episode[current]
                    and step[linked] == step[current] + 1
                ):
                    current = linked
                else:
                    current = -1
            out[b, j] = current


@njit(cache=True, nogil=True)
def episode_heads(
    last_slots: np.ndarray,
    episode: np.ndarray,
    step: np.ndarray,
    prev_slot: np.ndarray,
    out: np.ndarray,
) -> None:
    """The slot of the first step of each episode ending at ``last_slots``, if all of it is
    still stored.

    Follows ``prev_slot`` links from each last step back to step 0, checking every link as
    :func:`sequence_slots` does (the target holds the same episode at the step before). A chain
    that breaks first (an overwritten step) gives -1: O(episode length) per row.

    Parameters
    ----------
    last_slots : ndarray, shape (B,), int64
        Slots holding the last step of an episode, or -1 (then ``out`` is -1).
    episode, step, prev_slot : ndarray, shape (capacity,), int64
        The episode index (links are -1 or in ``[0, capacity)``).
    out : ndarray, shape (B,), int64
        Destination: the first step's slot, or -1.
    """
    for b in range(last_slots.shape[0]):
        current = last_slots[b]
        while current >= 0 and step[current] > 0:
            linked = prev_slot[current]
            if (
                linked >= 0
                and episode[linked] == episode[current]
                and step[linked] == step[current] - 1
            ):
                current = linked
            else:
                current = -1
        out[b] = current


@njit(cache=True, nogil=True)
def episode_tails(
    first_slots: np.ndarray,
    episode: np.ndarray,
    step: np.ndarray,
    next_slot: np.ndarray,
    out: np.ndarray,
) -> None:
    """The slot of the newest stored step of the episode beginning at each of ``first_slots``.

    Follows ``next_slot`` links while each target holds the same episode at the next step:
    O(episode length) per row.

    Parameters
    ----------
    first_slots : ndarray, shape (B,), int64
        Slots holding data (normally a step 0).
    episode, step, next_slot : ndarray, shape (capacity,), int64
        The episode index (links are -1 or in ``[0, capacity)``).
    out : ndarray, shape (B,), int64
        Destination: the last linked slot (the start itself for a one-step chain).
    """
    for b in range(first_slots.shape[0]):
        current = first_slots[b]
        while True:
            linked = next_slot[current]
            if (
                linked >= 0
                and episode[linked] == episode[current]
                and step[linked] == step[current] + 1
            ):
                current = linked
            else:
                break
        out[b] = current


@njit(cache=True, nogil=True)
def link_stream_steps(
    slots: np.ndarray,
    ends: np.ndarray,
    skip: int,
    open_episode: int,
    open_step: int,
    back: int,
    next_episode: int,
    rows: np.ndarray,
    obs_bytes: int,
    next_obs_start: int,
    quiet: np.ndarray,
    full: np.ndarray,
    episode: np.ndarray,
    step: np.ndarray,
    prev_slot: np.ndarray,
    next_slot: np.ndarray,
) -> tuple[int, int, int, int]:
    """The episode index of ``T`` consecutive steps of one stream, in one pass.

    First, stream breaks inside the call: a step ``k > 0`` whose observation bytes differ from
    the next-observation bytes of step ``k - 1``, where step ``k - 1`` is ``quiet`` (no agent
    done, every agent present), did not end its episode and step ``k`` is ``full``, ends the
    episode at step ``k - 1`` (``ends[k - 1]`` is set). Then every step gets its episode id
    (the open episode continued by the first step, a new id after every end) and step number,
    and the kept steps (``k >= skip``) are written with their links.

    Parameters
    ----------
    slots : ndarray, shape (T - skip,), int64
        Where the kept steps go.
    ends : ndarray, shape (T,), bool
        Whether each step ends its episode; breaks found are set here.
    skip : int
        Leading steps not stored (overwritten by the call itself).
    open_episode, open_step : int
        The stream's open episode and its newest step number, or ``open_episode = -1``.
    back : int
        Slot of that newest step when still stored (not overwritten), else -1.
    next_episode : int
        The id the next new episode gets.
    rows : ndarray, shape (T, row_items), uint8 or uint64
        The staged rows as bytes or 8-byte words (obs at ``[0, obs_bytes)``, next_obs at
        ``next_obs_start``); with ``obs_bytes == 0`` nothing is compared.
    obs_bytes, next_obs_start : int
        In items of ``rows`` (bytes, or words for a word view).
    quiet, full : ndarray, shape (T,), bool
    episode, step, prev_slot, next_slot : ndarray, shape (capacity,), int64
        The episode index; written at ``slots`` (and ``next_slot[back]``).

    Returns
    -------
    (next_episode, last_episode, last_step, breaks) : tuple of int
        The counter after the call, the last step's episode and step number, and the breaks
        found.
    """
    total = ends.shape[0]
    breaks = 0
    if obs_bytes > 0:
        for k in range(1, total):
            if ends[k - 1] or not quiet[k - 1] or not full[k]:
                continue
            for j in range(obs_bytes):
                if rows[k, j] != rows[k - 1, next_obs_start + j]:
                    ends[k - 1] = True
                    breaks += 1
                    break
    if open_episode >= 0:
        current, number, prev = open_episode, open_step + 1, back if skip == 0 else -1
    else:
        current, number, prev = next_episode, 0, -1
        next_episode += 1
    for k in range(total):
        if k > 0:
            if ends[k - 1]:
                current, number, prev = next_episode, 0, -1
                next_episode += 1
            else:
                number += 1
                prev = slots[k - 1 - skip] if k - 1 >= skip else -1
        if k >= skip:
            slot = slots[k - skip]
            episode[slot] = current
            step[slot] = number
            prev_slot[slot] = prev
            next_slot[slot] = -1
            if prev >= 0:
                next_slot[prev] = slot
    return next_episode, current, number, breaks
