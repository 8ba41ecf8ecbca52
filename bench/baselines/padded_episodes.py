"""A padded-episode replay buffer in the style of EPyMARL's ``EpisodeBatch`` (NumPy only).

The sequence baseline of the ``sequences`` suite. It mirrors the design of the episode buffer
used by PyMARL/EPyMARL (QMIX, MAPPO, ... with recurrent agents), written here from its
description, not from its code:

* **Whole episodes, padded.** Storage is one array per field with leading axes
  ``(n_episodes, max_t + 1)``: every episode slot has room for ``max_t`` transitions plus the
  observation after the last one, whatever the episode's real length. Per-agent fields add an
  agent axis (``(n_episodes, max_t + 1, n_agents, *shape)``: agents stacked, so all agents
  must share a shape), global fields do not (``(n_episodes, max_t + 1, *shape)``).
* **A ``filled`` mask** (int64, ``(n_episodes, max_t + 1, 1)``: EPyMARL keeps it as a long
  tensor) marks the real steps: steps ``0 .. length`` (the observation after the last
  transition included); padding is zeros. ``terminated`` is one uint8 per step (EPyMARL's
  episode-level flag), not one per agent.
* **Next observations are not stored**: the observation of step ``t + 1`` is the next
  observation of step ``t`` (learners slice ``obs[:, :-1]`` and ``obs[:, 1:]``).
* **Writes are whole episodes** into a ring of episode slots (``insert_episode_batch``), as
  EPyMARL's runners insert finished episodes; the slot is overwritten with its padding.
* **Sampling draws episode slots** uniformly without replacement among the stored episodes and
  copies those whole padded episodes (every field, all ``max_t + 1`` steps), as
  ``ReplayBuffer.sample`` followed by indexing the ``EpisodeBatch`` does.

:meth:`PaddedEpisodeBuffer.sample_sequences` adds what the ``sequences`` suite compares against
``marlbuf``'s ``Sequence`` sampler: after gathering B whole episodes, it slices from each a
window of ``length`` transitions starting at a step drawn uniformly among the episode's real
transitions (steps past the episode end are zero-filled and masked, like a ``SequenceBatch``).
EPyMARL itself trains on whole episodes (:meth:`sample_episodes`); the window is the extra
step a learner with fixed-length sequences (an R2D2-style learner) would take on this layout.

Deviations: sampling uses a ``numpy.random.Generator`` (``choice(..., replace=False)``, which
does not permute all stored episodes as the legacy ``np.random.choice`` does: this favours the
baseline); actions are stored as the MADDPG-style float vectors the other buffers of the suite
hold, not as EPyMARL's integer actions plus one-hot copies; no ``avail_actions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PaddedField:
    """One field of the padded layout: its per-step shape and dtype, per agent or global."""

    shape: tuple[int, ...]
    dtype: Any = np.float32
    per_agent: bool = True


class PaddedEpisodeBuffer:
    """Episodes padded to ``max_t + 1`` steps in a ring of ``n_episodes`` slots.

    Parameters
    ----------
    fields : mapping of name to PaddedField
        The stored fields (``filled`` and ``terminated`` are added).
    n_agents : int
    n_episodes : int
        Episode slots (EPyMARL's ``buffer_size`` counts episodes, not steps).
    max_t : int
        Longest episode, in transitions (EPyMARL's ``episode_limit``).
    seed : int
    """

    def __init__(
        self,
        fields: Mapping[str, PaddedField],
        n_agents: int,
        n_episodes: int,
        max_t: int,
        seed: int = 0,
    ) -> None:
        if "filled" in fields or "terminated" in fields:
            raise ValueError("'filled' and 'terminated' are added by the buffer; do not declare")
        self.n_agents = int(n_agents)
        self.n_episodes = int(n_episodes)
        self.max_t = int(max_t)
        self.fields = dict(fields)
        steps = (self.n_episodes, self.max_t + 1)
        self.data: dict[str, np.ndarray] = {
            name: np.zeros(
                steps + ((self.n_agents,) if f.per_agent else ()) + tuple(f.shape), f.dtype
            )
            for name, f in self.fields.items()
        }
        self.data["terminated"] = np.zeros((*steps, 1), np.uint8)
        self.data["filled"] = np.zeros((*steps, 1), np.int64)
        self.lengths = np.zeros(self.n_episodes, np.int64)  # transitions per stored episode
        self.index = 0  # next episode slot to write (ring)
        self.episodes_in_buffer = 0
        self.rng = np.random.default_rng(seed)

    @property
    def nbytes(self) -> int:
        """Bytes of the padded arrays (``filled`` and ``terminated`` included)."""
        return sum(a.nbytes for a in self.data.values())

    def insert_episode_batch(self, episodes: Mapping[str, np.ndarray], lengths: np.ndarray) -> None:
        """Store E finished episodes.

        Parameters
        ----------
        episodes : mapping of name to ndarray
            Every declared field, shape ``(E, max_t + 1, [n_agents,] *shape)``: step ``t`` of
            episode ``e`` at ``[e, t]``; the observation after the last transition at
            ``[e, lengths[e]]``; anything past that is overwritten with zeros.
        lengths : ndarray of int, shape (E,)
            Transitions per episode, 1 .. max_t.
        """
        lengths = np.asarray(lengths, np.int64)
        count = lengths.shape[0]
        if count > self.n_episodes:
            raise ValueError(f"{count} episodes do not fit in {self.n_episodes} slots")
        if lengths.min() < 1 or lengths.max() > self.max_t:
            raise ValueError(f"episode lengths must be in 1..{self.max_t}; got {lengths}")
        slots = (self.index + np.arange(count)) % self.n_episodes  # ring of episode slots
        steps = np.arange(self.max_t + 1)
        filled = steps[None, :] <= lengths[:, None]  # (E, max_t + 1): real steps and last obs
        for name in self.fields:
            block = np.asarray(episodes[name], self.data[name].dtype)
            pad = filled.reshape(filled.shape + (1,) * (block.ndim - 2))
            self.data[name][slots] = np.where(pad, block, 0)  # padding written as zeros
        self.data["filled"][slots] = filled[..., None]
        terminated = np.zeros((count, self.max_t + 1, 1), np.uint8)
        terminated[np.arange(count), lengths - 1, 0] = 1
        self.data["terminated"][slots] = terminated
        self.lengths[slots] = lengths
        self.index = int((self.index + count) % self.n_episodes)
        self.episodes_in_buffer = min(self.n_episodes, self.episodes_in_buffer + count)

    def _episode_ids(self, batch_size: int) -> np.ndarray:
        if batch_size > self.episodes_in_buffer:
            raise ValueError(
                f"batch_size={batch_size} exceeds the {self.episodes_in_buffer} stored episodes"
            )
        return self.rng.choice(self.episodes_in_buffer, batch_size, replace=False)

    def sample_episodes(self, batch_size: int) -> dict[str, np.ndarray]:
        """B whole padded episodes: every field ``(B, max_t + 1, ...)`` (copies)."""
        ids = self._episode_ids(batch_size)
        return {name: array[ids] for name, array in self.data.items()}

    def sample_sequences(self, batch_size: int, length: int) -> dict[str, np.ndarray]:
        """B windows of ``length`` transitions, cut from B whole episodes gathered first.

        Returns
        -------
        dict
            Every declared field ``(B, length, [n_agents,] *shape)``; ``next_obs`` (the
            ``obs`` window shifted by one step); ``mask`` ``(B, length)`` bool, True on real
            transitions; ``terminated`` ``(B, length)`` uint8. Masked steps are zeros.
        """
        episodes = self.sample_episodes(batch_size)  # the whole padded episodes, copied
        lengths = episodes["filled"][:, :, 0].sum(axis=1) - 1  # transitions per episode
        starts = (self.rng.random(batch_size) * lengths).astype(np.int64)
        steps = starts[:, None] + np.arange(length + 1)  # length transitions + the next obs
        mask = steps[:, :length] < lengths[:, None]  # real transitions
        # flat row of every window step in the gathered episodes, clipped to the episode slot
        # (clipped steps are masked and zeroed below)
        flat = np.arange(batch_size)[:, None] * (self.max_t + 1) + np.minimum(steps, self.max_t)
        cuts = {"next_obs": ("obs", flat[:, 1:].ravel())}
        cuts |= {name: (name, flat[:, :length].ravel()) for name in episodes if name != "filled"}
        masked = ~mask.ravel()
        out: dict[str, np.ndarray] = {}
        for name, (source, rows) in cuts.items():
            array = episodes[source]
            cut = array.reshape((-1, *array.shape[2:])).take(rows, axis=0)
            cut[masked] = 0  # steps past the episode end
            out[name] = cut.reshape((batch_size, length, *array.shape[2:]))
        out["terminated"] = out["terminated"][..., 0]
        out["mask"] = mask
        return out


def from_stream(
    stream: Mapping[str, Mapping[str, np.ndarray]], episode_length: int
) -> dict[str, np.ndarray]:
    """Cut a stream of equal-length episodes (``extend``-style per-agent dicts with a leading
    T axis, T a multiple of ``episode_length``, starting at an episode start) into the padded
    layout: ``obs`` ``(E, episode_length + 1, n_agents, *obs_shape)`` (the last step's
    next_obs after each episode), ``action`` ``(E, episode_length + 1, n_agents, *shape)``,
    ``reward`` ``(E, episode_length + 1, n_agents)`` (zero at the final step).
    """

    def stacked(field: str) -> np.ndarray:
        return np.stack(list(stream[field].values()), axis=1)  # (T, n_agents, ...)

    obs, next_obs = stacked("obs"), stacked("next_obs")
    steps = obs.shape[0]
    if steps % episode_length:
        raise ValueError(f"{steps} steps are not whole episodes of {episode_length}")
    count = steps // episode_length
    out = {}
    for field, last in (
        ("obs", next_obs[episode_length - 1 :: episode_length]),
        ("action", None),
        ("reward", None),
    ):
        values = obs if field == "obs" else stacked(field)
        per_episode = values.reshape((count, episode_length, *values.shape[1:]))
        final = np.zeros_like(per_episode[:, :1]) if last is None else last[:, None]
        out[field] = np.concatenate([per_episode, final], axis=1)
    return out


def _check_view(source: tuple[int, ...], destination: tuple[int, ...]) -> None:
    """Refuse a value of shape ``source`` that cannot be viewed as ``destination``: walking both
    shapes from the last dimension, every destination dimension must match the next source
    dimension or be 1 (EPyMARL's check before writing an update)."""
    position = len(source) - 1
    for size in reversed(destination):
        if position >= 0 and source[position] == size:
            position -= 1
        elif size != 1:
            raise ValueError(f"cannot write a value of shape {source} into {destination}")


class TorchPaddedEpisodeBuffer:
    """The padded-episode layout in torch tensors, as EPyMARL keeps it (``EpisodeBatch``'s
    ``transition_data``): the whole-episode baseline of the ``sequences`` suite's episodes part.

    Same layout as :class:`PaddedEpisodeBuffer` (every field ``(n_episodes, max_t + 1, ...)``,
    ``filled`` int64 and ``terminated`` uint8 ``(n_episodes, max_t + 1, 1)``), in torch tensors
    on ``device``. An insert writes already padded episodes (a runner fills a padded batch as it
    steps the environment) into consecutive episode slots, every field and every one of the
    ``max_t + 1`` steps, each through a view-compatibility check and a slice assignment of
    ``value.view_as(destination)`` as EPyMARL's ``update`` does (its per-key bookkeeping and
    preprocessing transforms are left out: there are no preprocessed fields here); a draw
    takes ``B`` distinct stored episode slots (``Generator.choice(..., replace=False)``) and
    indexes every tensor with them (copies), as ``ReplayBuffer.sample`` does. Written from that
    description, not from EPyMARL's code.

    Parameters
    ----------
    fields : mapping of name to PaddedField
        The stored fields (``filled`` and ``terminated`` are added).
    n_agents, n_episodes, max_t, seed
        As in :class:`PaddedEpisodeBuffer`.
    device : str, default "cpu"
    """

    def __init__(
        self,
        fields: Mapping[str, PaddedField],
        n_agents: int,
        n_episodes: int,
        max_t: int,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        import torch

        if "filled" in fields or "terminated" in fields:
            raise ValueError("'filled' and 'terminated' are added by the buffer; do not declare")
        self.n_agents, self.n_episodes, self.max_t = int(n_agents), int(n_episodes), int(max_t)
        self.fields = dict(fields)
        steps = (self.n_episodes, self.max_t + 1)

        def dtype(np_dtype: Any) -> Any:
            return torch.from_numpy(np.zeros(0, np_dtype)).dtype

        self.data: dict[str, Any] = {
            name: torch.zeros(
                steps + ((self.n_agents,) if f.per_agent else ()) + tuple(f.shape),
                dtype=dtype(f.dtype),
                device=device,
            )
            for name, f in self.fields.items()
        }
        self.data["terminated"] = torch.zeros((*steps, 1), dtype=torch.uint8, device=device)
        self.data["filled"] = torch.zeros((*steps, 1), dtype=torch.long, device=device)
        self.index = 0
        self.episodes_in_buffer = 0
        self.rng = np.random.default_rng(seed)

    @property
    def nbytes(self) -> int:
        """Bytes of the padded tensors (``filled`` and ``terminated`` included)."""
        return sum(t.numel() * t.element_size() for t in self.data.values())

    def pad(self, episode: Mapping[str, np.ndarray], length: int) -> dict[str, Any]:
        """One episode as a runner's padded batch of one: every field ``(1, max_t + 1, ...)``
        from ``episode[name]`` (``(length + 1, ...)``: the steps and the row after the last),
        zeros past it, ``filled`` on rows ``0 .. length``, ``terminated`` on row
        ``length - 1``."""
        import torch

        out = {}
        for name, array in self.data.items():
            padded = torch.zeros((1, *array.shape[1:]), dtype=array.dtype)
            if name == "filled":
                padded[0, : length + 1] = 1
            elif name == "terminated":
                padded[0, length - 1] = 1
            else:
                padded[0, : length + 1] = torch.from_numpy(np.asarray(episode[name][: length + 1]))
            out[name] = padded
        return out

    def insert_episode_batch(self, episodes: Mapping[str, Any]) -> None:
        """Store E padded episodes (every field ``(E, max_t + 1, ...)``, ``filled`` and
        ``terminated`` included) at the next slots, wrapping as EPyMARL's buffer does."""
        count = int(episodes["filled"].shape[0])
        if self.index + count > self.n_episodes:  # split at the end of the ring
            left = self.n_episodes - self.index
            self.insert_episode_batch({k: v[:left] for k, v in episodes.items()})
            self.insert_episode_batch({k: v[left:] for k, v in episodes.items()})
            return
        rows = slice(self.index, self.index + count)
        for name, value in episodes.items():
            # as EPyMARL's update: check that the value views as the destination (trailing
            # dimensions equal, or 1 in the destination), then assign through view_as
            _check_view(value.shape, self.data[name][rows].shape)
            self.data[name][rows] = value.view_as(self.data[name][rows])
        self.index = (self.index + count) % self.n_episodes
        self.episodes_in_buffer = min(self.n_episodes, self.episodes_in_buffer + count)

    def sample_episodes(self, batch_size: int) -> dict[str, Any]:
        """B distinct whole padded episodes: every field ``(B, max_t + 1, ...)`` (copies)."""
        import torch

        if batch_size > self.episodes_in_buffer:
            raise ValueError(
                f"batch_size={batch_size} exceeds the {self.episodes_in_buffer} stored episodes"
            )
        ids = torch.from_numpy(self.rng.choice(self.episodes_in_buffer, batch_size, replace=False))
        return {name: array[ids] for name, array in self.data.items()}
