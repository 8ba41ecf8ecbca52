"""Saved states converted between row formats (``next_obs`` stored, once or not at all) and
layouts (``interleaved`` or ``agent_major``), so that a state loads into a buffer of any store.

The conversion goes through the stores themselves: a host storage of the state's format
gathers every filled slot (in the stored dtypes), and a host storage of the target format
stores those rows again. Observations stored once get their links from the writer's own
comparison over the transitions in write order (as one stream), so every batch stays the same,
bit for bit. A state converted to ``next_obs="none"`` drops its next observations (and the
stream-break record of its episode index, which compares them); a state without them
(``"none"``) converts only to another layout, since no format can make them up. An empty state
converts to the empty state of the target format.

:func:`staged_rows` reads chosen slots of a state in any format back as the writer staged them
(what a loading buffer cross-checks the parts of a state against).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf.staging import RowCodec
from marlbuf.stores import make_store
from marlbuf.stores.base import Storage
from marlbuf.writer import NextObsLinks, RingWriter


def _zeros(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


def _storage(
    codec: RowCodec, layout: str, next_obs: str, capacity: int, links: NextObsLinks | None
) -> Storage:
    """A host storage of ``capacity`` slots in ``layout`` and ``next_obs`` format whose batches
    keep the stored dtypes."""
    return make_store(
        layout,
        codec,
        capacity,
        2,
        "rows",
        links,
        "storage",
        _zeros,
        stores_next_obs=next_obs != "none",
    )


def _dense(codec: RowCodec, storage: Storage, count: int) -> np.ndarray:
    """Slots ``[0, count)`` of ``storage`` as dense staging rows (shape (count, row_words),
    uint64; next_obs zero where the storage holds none)."""
    rows = np.zeros((count, codec.row_words), dtype=np.uint64)
    if not count:
        return rows
    fields, _ = storage.gather(np.arange(count, dtype=np.int64))
    for name, per_agent in codec.views(rows).items():
        if name in fields:  # every field but next_obs of a storage without it (left zero)
            for agent, view in per_agent.items():
                view[...] = fields[name][agent]
    return rows


def staged_rows(state: Mapping[str, Any], codec: RowCodec, slots: np.ndarray) -> np.ndarray:
    """Filled ``slots`` (shape (k,), int64, each in ``[0, size)``) of ``state`` (a checked
    state of any layout and format, rows in the format of ``codec``) as the writer staged
    them: dense rows (shape (k, row_words), uint64), next_obs from the slot's successor or side
    row where observations are stored once, zeros where the state stores none. Only the rows
    needed are copied."""
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    count = slots.shape[0]
    layout, fmt = state["layout"], state.get("next_obs", "stored")
    take = slots
    links = None
    if fmt == "once" and count:
        saved = state["links"]
        successor = np.asarray(saved["next_slot"], dtype=np.int64)[slots]
        linked = np.flatnonzero(successor >= 0)
        take = np.concatenate([slots, successor[linked]])
        links = NextObsLinks(take.shape[0], codec.obs_bytes)
        links.next_slot[linked] = count + np.arange(linked.shape[0], dtype=np.int64)
        alone = np.flatnonzero(successor < 0)
        side_rows = np.asarray(saved["side_row"], dtype=np.int64)[slots[alone]]
        side = np.zeros((max(1, alone.shape[0]), links.side.shape[1]), dtype=np.uint8)
        side[: alone.shape[0]] = np.asarray(saved["side"])[side_rows]
        links.side = side
        links.side_row[alone] = np.arange(alone.shape[0], dtype=np.int64)
    storage = _storage(codec, layout, fmt, max(1, take.shape[0]), links)
    for key, dst in storage.arrays().items():
        dst[: take.shape[0]] = np.asarray(state["storage"][key])[take]
    return _dense(codec, storage, count)


def convert_state(
    state: Mapping[str, Any], codec: RowCodec, layout: str, next_obs: str
) -> Mapping[str, Any]:
    """``state`` (a :meth:`~marlbuf.MultiAgentReplayBuffer.state_dict` whose header was
    checked, for the row format ``codec``) in ``layout`` and ``next_obs`` format; ``state``
    itself when it already is. The links of the state's format are checked before use."""
    source = (state["layout"], state.get("next_obs", "stored"))
    if source == (layout, next_obs):
        return state
    if source[1] == "none" and next_obs != "none":
        raise ValueError(
            "this state holds no next observations (saved with next_obs='none'), so it cannot "
            f"load into a buffer that keeps them (next_obs={next_obs!r}): build the buffer with "
            "next_obs='none' (MultiAgentReplayBuffer.load(path) does), or leave next_obs='auto' "
            "and load the state before the first write"
        )
    capacity = int(state["capacity"])
    size = int(state["size"])
    old_links = None
    if source[1] == "once":
        old_links = NextObsLinks(capacity, codec.obs_bytes)
        # the gather kernels index with the links unchecked: the ring's and the links' own
        # checks of the whole state first
        size, generations = RingWriter(capacity).check_loaded(state)
        old_links.check_loaded(state["links"], size, generations)
        old_links.load_state_dict(state["links"])
    old = _storage(codec, source[0], source[1], capacity, old_links)
    old.check_saved(state["storage"], size)
    for key, dst in old.arrays().items():
        dst[:size] = state["storage"][key]
    rows = _dense(codec, old, size)  # every filled slot, in the stored dtypes
    links = NextObsLinks(capacity, codec.obs_bytes) if next_obs == "once" else None
    new = _storage(codec, layout, next_obs, capacity, links)
    if size:
        generations = np.asarray(state["write_generation"], dtype=np.int64)[:size]
        order = np.argsort(generations, kind="stable")  # oldest first: write order
        if links is not None:
            links.commit(
                order,
                rows[order].view(np.uint8),
                0,
                generations[order],
                codec.next_obs_start,
                np.full(capacity, -1, dtype=np.int64),
            )
        new.write(order, rows[order], None)
    converted = {
        **state,
        "layout": layout,
        "next_obs": next_obs,
        "storage": {key: array[:size].copy() for key, array in new.arrays().items()},
        "links": {} if links is None else links.state_dict(copy=True),
    }
    episodes = state.get("episodes")
    if next_obs == "none" and episodes and "next_streams" in episodes:
        # nothing to compare a stream's next obs with: the record of the last ones goes too
        converted["episodes"] = {
            **episodes,
            "next_streams": np.zeros(0, dtype=np.int64),
            "next_obs": np.zeros((0, 0), dtype=np.uint8),
        }
    return converted


__all__ = ["convert_state", "staged_rows"]
