"""Drop-in adapters: swap marlbuf into MARL code you already run (see ``docs/migrating.md``).

* :mod:`marlbuf.compat.maddpg` — openai/maddpg's per-agent ``ReplayBuffer`` API
  (``make_index`` / ``sample_index`` on every agent's buffer), backed by one shared interleaved
  store, so a trainer's ``sample_index`` across all agents costs one gather.
* :mod:`marlbuf.compat.tf2marl` — tf2multiagentrl's ``EfficientReplayBuffer`` and
  ``PrioritizedReplayBuffer``.
* :mod:`marlbuf.compat.pettingzoo` — filling a :class:`~marlbuf.MultiAgentReplayBuffer` from a
  PettingZoo parallel environment's step dicts.
* :mod:`marlbuf.compat.epymarl` — EPyMARL's episode ``ReplayBuffer`` (``insert_episode_batch``,
  ``can_sample``, ``sample``, ``episodes_in_buffer``) from its ``scheme``/``groups``/
  ``preprocess``, returning batches its learners use unchanged; only the filled steps of each
  episode are stored (needs torch).

See ``docs/migrating.md`` for before/after snippets and the documented differences.
"""

from __future__ import annotations


class NotEnoughDataError(ValueError, RuntimeError):
    """A batch was requested from a buffer that holds too few transitions.

    A ``ValueError`` like every marlbuf input error, and also a ``RuntimeError`` because that is
    what tf2multiagentrl's buffers raise, so existing ``except RuntimeError`` code keeps working.
    """


__all__ = ["NotEnoughDataError"]
