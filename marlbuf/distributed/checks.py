"""The sharded buffer's own argument checks: the shard count, the sampler (only the samplers
whose draw the learner splits across shards exactly), the learner's options and the shards'
capacity. What every shard's buffer checks (specs, layout, ``next_obs``, ...) is
:class:`~marlbuf.config.BufferConfig`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from marlbuf.distributed.limiter import RateLimiter
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Sampler, Uniform
from marlbuf.samplers import Sequence as SequenceSampler
from marlbuf.stores.capabilities import refusal

#: the samplers whose draw the learner splits across shards exactly (docs/distributed.md);
#: their exact classes, since a subclass may draw by another rule
SHARDED_SAMPLERS: tuple[type[Sampler], ...] = (
    Uniform,
    Neighbor,
    Prioritized,
    PrioritizedNeighbor,
    SequenceSampler,
)


def check_n_shards(n_shards: Any) -> int:
    """``n_shards``, an int >= 1."""
    if isinstance(n_shards, bool) or not isinstance(n_shards, (int, np.integer)):
        raise TypeError(f"n_shards must be an int; got n_shards={n_shards!r}")
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1; got n_shards={n_shards}")
    return int(n_shards)


def check_sampler(sampler: Any) -> Sampler:
    """``sampler`` (``None``: ``Uniform()``), one the sharded buffer can draw exactly."""
    if sampler is None:
        sampler = Uniform()
    if not isinstance(sampler, Sampler):
        raise TypeError(
            "sampler must be a marlbuf.samplers.Sampler (e.g. Uniform(), Prioritized()); "
            f"got sampler={sampler!r}"
        )
    if sampler.needs_episodes and not isinstance(sampler, SequenceSampler):
        raise TypeError(
            f"the sharded buffer does not sample whole episodes (sampler={sampler!r}): "
            "Episodes draws distinct episodes padded to the batch's longest, a property of "
            "the whole batch that per-shard draws do not have; use Sequence(length=..., "
            "pad=True) on the sharded buffer, or one MultiAgentReplayBuffer for Episodes"
        )
    if isinstance(sampler, SequenceSampler) and sampler.prioritized and not sampler.replace:
        raise ValueError(
            f"sampler={sampler!r}: prioritized sequences without replacement are drawn one "
            "after another in proportion to the priorities left, a draw the learner cannot "
            "split across shards exactly; use replace=True (independent draws) on the "
            "sharded buffer, or one MultiAgentReplayBuffer"
        )
    if type(sampler) not in SHARDED_SAMPLERS:
        raise ValueError(refusal("custom Sampler subclasses", "sharded", f"sampler={sampler!r}"))
    return sampler


def check_learner_options(prefetch: Any, timeout: Any, rate_limiter: Any) -> None:
    """The learner's ``prefetch``, ``timeout`` and ``rate_limiter``."""
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be a bool; got prefetch={prefetch!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds > 0; got timeout={timeout!r}")
    if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
        raise TypeError(f"rate_limiter must be a RateLimiter; got {rate_limiter!r}")


def check_capacity(capacity: Any) -> int:
    """``shard_capacity``, an int >= 1 (a float that is a whole number is taken)."""
    if isinstance(capacity, (float, np.floating)) and float(capacity).is_integer():
        capacity = int(capacity)
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"shard_capacity must be an int; got shard_capacity={capacity!r}")
    if capacity < 1:
        raise ValueError(f"shard_capacity must be >= 1; got shard_capacity={capacity}")
    return int(capacity)
