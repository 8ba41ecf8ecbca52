"""Temporary stand-ins for buffer APIs that are landing in the core (removed once merged)."""

from __future__ import annotations

from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.spec import FIELDS


def make_buffer(specs: Any, capacity: int, **kwargs: Any) -> MultiAgentReplayBuffer:
    try:
        return MultiAgentReplayBuffer(specs, capacity, **kwargs)
    except TypeError:
        kwargs.pop("batch_layout", None)
        return MultiAgentReplayBuffer(specs, capacity, **kwargs)


def as_lists(batch: Any) -> tuple[list[np.ndarray], ...]:
    if hasattr(batch, "as_lists"):
        return batch.as_lists()
    return tuple([batch.field(f)[a] for a in batch.agents] for f in FIELDS)


def reward_stats(buf: MultiAgentReplayBuffer) -> dict[str, tuple[float, float]]:
    if hasattr(buf, "reward_stats"):
        return buf.reward_stats()
    everything = buf.gather(np.arange(len(buf)))
    return {a: (float(r.mean()), float(r.std())) for a, r in everything.reward.items()}
