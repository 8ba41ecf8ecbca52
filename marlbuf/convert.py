"""Saved states converted between row formats (``next_obs`` stored, once or not at all) and
layouts (``interleaved`` or ``agent_major``), so that a state loads into a buffer of any store.

The conversion goes through the stores themselves: a host storage of the state's format
gathers every filled slot (in the stored dtypes), and a host storage of the target format
stores those rows again. Observations stored once get their links from the writer's own
comparison over the transitions in write order (as one stream), so every batch stays the same,
bit for bit. A state converted to ``next_obs="none"`` drops its next observations; a state
without them (``"none"``) converts only to another layout, since no format can make them up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf.staging import RowCodec
from marlbuf.storage import make_storage
from marlbuf.writer import NextObsLinks


def _zeros(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


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
        old_links.check_state(state["links"])
        old_links.load_state_dict(state["links"])
    old = make_storage(
        source[0],
        codec.specs,
        capacity,
        2,
        codec,
        "rows",
        old_links,
        "storage",
        _zeros,
        stores_next_obs=source[1] != "none",
    )
    old.check_saved(state["storage"], size)
    for key, dst in old.arrays().items():
        dst[:size] = state["storage"][key]
    # every filled slot as a dense staging row, in the stored dtypes
    fields, _ = old.gather(np.arange(size, dtype=np.int64))
    rows = np.zeros((size, codec.row_words), dtype=np.uint64)
    views = codec.views(rows)
    for name, per_agent in views.items():
        if name in fields:  # every field but next_obs of a state without it (left zero)
            for agent, view in per_agent.items():
                view[...] = fields[name][agent]
    links = NextObsLinks(capacity, codec.obs_bytes) if next_obs == "once" else None
    new = make_storage(
        layout,
        codec.specs,
        capacity,
        2,
        codec,
        "rows",
        links,
        "storage",
        _zeros,
        stores_next_obs=next_obs != "none",
    )
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
    return {
        **state,
        "layout": layout,
        "next_obs": next_obs,
        "storage": {key: array[:size].copy() for key, array in new.arrays().items()},
        "links": {} if links is None else links.state_dict(copy=True),
    }


__all__ = ["convert_state"]
