"""Scale-out on Ray (extra ``[distributed]``): sharded replay buffers, remote writers, one learner.

::

    from marlbuf.distributed import ShardedReplayBuffer, init_ray
    from marlbuf.samplers import Prioritized

    init_ray(num_cpus=4)                      # or init_ray(address="auto") on a cluster
    buf = ShardedReplayBuffer(specs, shard_capacity=250_000, n_shards=4,
                              sampler=Prioritized(), seed=0)
    writer = buf.writer(stream=7)             # picklable: give it to a rollout actor
    writer.extend(obs, action, reward, next_obs, done)   # whole episodes of stream 7
    batches = buf.sample_for_trainers(1024)   # exact global draw over every shard
    buf.update_priorities(batches[0].indices, td, trainer=0,
                          generations=batches[0].generations)
    buf.save("ckpt/")                         # one file per shard + manifest.json

``import marlbuf`` never imports Ray; this subpackage does. See ``docs/distributed.md``.
"""

try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "marlbuf.distributed needs Ray: pip install 'marlbuf[distributed]'", name="ray"
    ) from exc

from marlbuf.distributed._ray import DEFAULT_TIMEOUT_S, ShardError, init_ray, repo_root
from marlbuf.distributed.limiter import RateLimiter
from marlbuf.distributed.sharded import ShardedReplayBuffer, ShardWriter

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RateLimiter",
    "ShardError",
    "ShardWriter",
    "ShardedReplayBuffer",
    "init_ray",
    "repo_root",
]
