"""The writer: where each transition goes and what the buffer knows about its slots.

* :mod:`~marlbuf.writer.ring`: :class:`RingWriter`, the ring arithmetic, write generations and
  locks;
* :mod:`~marlbuf.writer.links`: :class:`NextObsLinks`, next observations stored once;
* :mod:`~marlbuf.writer.episodes`: :class:`EpisodeIndex`, episodes and steps per slot;
* :mod:`~marlbuf.writer.inputs`: the checks of the write arguments the staging does not see
  (``stream``, ``truncated``) and the readers of staged rows (done and stream-break flags);
* :mod:`~marlbuf.writer.commit`: :class:`WritePath`, the commit engine, the one-step path of
  ``add`` and the ``next_obs`` format policy with its warnings.

It owns the ring arithmetic (cursor, fill level), the per-slot *write generation* (the value of
a global write counter when the slot was last written: a stale priority update or a sample taken
before an overwrite is recognised by comparing generations), and the buffer's locks.

Concurrency model: a buffer may be used by one or more writer threads and any number of sampling
threads at once. Writers serialize on ``write_lock`` while they validate and stage (staging has
one scratch row); the commit of staged rows into storage, the metadata update and every read of
the storage (index draw + gather, ``latest``, ``gather``, ``update_priorities``, ``state_dict``)
happen under ``lock``. So a sampler sees a row either entirely before or entirely after a write,
never a mix, and validation of staged rows (the costly part of a multi-step write) does not
block samplers. ``add``'s common case stages nothing: one kernel checks the step and stores it
under ``lock`` (:func:`marlbuf._kernels.store_dense_step` / ``store_lean_step``, a few
microseconds), so it needs no ``write_lock``. The gather kernels release the GIL, so a trainer
thread can run while another thread gathers.
"""

from marlbuf.writer.episodes import EpisodeIndex, StoredNext, complete_episodes
from marlbuf.writer.links import NextObsLinks
from marlbuf.writer.ring import RingWriter

__all__ = ["EpisodeIndex", "NextObsLinks", "RingWriter", "StoredNext", "complete_episodes"]
