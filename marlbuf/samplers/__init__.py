"""Samplers: which slots a trainer's mini-batch comes from.

A sampler returns indices (and, for prioritized samplers, importance weights) for one trainer;
the buffer gathers the rows. Every sampler declares its batch kind (rows, sequences or
episodes: :data:`BATCH_KINDS`) and implements the hooks of :class:`Sampler`; samplers with
per-trainer state (priority trees) allocate it in :meth:`Sampler.bind`. Each sampler's
docstring states its semantics.

* :mod:`~marlbuf.samplers.base` - the protocol (:class:`Sampler`) and shared checks;
* :mod:`~marlbuf.samplers.uniform` - :class:`Uniform` and :class:`Neighbor`;
* :mod:`~marlbuf.samplers.priority` - :class:`PriorityState`, the priority handling every
  prioritized sampler shares;
* :mod:`~marlbuf.samplers.prioritized` - :class:`Prioritized` and :class:`PrioritizedNeighbor`;
* :mod:`~marlbuf.samplers.sequences` - :class:`Sequence`;
* :mod:`~marlbuf.samplers.episodes` - :class:`Episodes`.
"""

from __future__ import annotations

from marlbuf.prioritized import LinearBeta
from marlbuf.samplers.base import BATCH_KINDS, ORDERS, SAMPLERS, Sampler
from marlbuf.samplers.episodes import Episodes
from marlbuf.samplers.prioritized import PRIORITY_INDEXES, Prioritized, PrioritizedNeighbor
from marlbuf.samplers.priority import PriorityState
from marlbuf.samplers.sequences import Sequence
from marlbuf.samplers.uniform import Neighbor, Uniform, ascending_uniform

__all__ = [
    "BATCH_KINDS",
    "ORDERS",
    "PRIORITY_INDEXES",
    "SAMPLERS",
    "Episodes",
    "LinearBeta",
    "Neighbor",
    "Prioritized",
    "PrioritizedNeighbor",
    "PriorityState",
    "Sampler",
    "Sequence",
    "Uniform",
    "ascending_uniform",
]
