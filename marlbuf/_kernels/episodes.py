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
