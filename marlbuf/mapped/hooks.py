"""The calls a memory-mapped store makes on the buffer it serves."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BufferHooks:
    """The calls a :class:`MappedStore` makes on the buffer it serves, given by the buffer
    (:meth:`MappedStore.bind`), so that the store needs none of the buffer's internals.

    Attributes
    ----------
    commit : callable ``(rows, steps, streams, truncated) -> None``
        Write validated staged rows (shape (steps, row_words), uint64) and their metadata, as
        the buffer's own writes do (the redo log's replay); ``truncated`` is the call's
        truncation flags (shape (steps,) bool) or ``None``.
    state : callable ``() -> dict``
        The buffer's state (what ``state_dict`` holds), its arrays views of live memory.
    load : callable ``(state) -> None``
        Load a checkpoint whose storage arrays are already the buffer's own (nothing copied;
        the table may hold newer rows until the log is replayed).
    replayed : callable ``() -> None``
        Called once the log is replayed (the table then holds exactly the loaded rows).
    attach : callable ``(store or None) -> None``
        Make the store live on the buffer (its writes are logged from then on).
    total_writes : callable ``() -> int``
        The buffer's write counter: the write generation of the next step.
    row_words : int
        Words of a staged row (what log records hold per step).
    lock : lock
        The buffer's lock (``RingWriter.lock``): checkpoints, flushes and closes hold it, so
        that no write is between its record and its rows while they run.
    """

    commit: Callable[[np.ndarray, int, Any, Any], None]
    state: Callable[[], dict[str, Any]]
    load: Callable[[Mapping[str, Any]], None]
    replayed: Callable[[], None]
    attach: Callable[[Any], None]
    total_writes: Callable[[], int]
    row_words: int
    lock: Any
