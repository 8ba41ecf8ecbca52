"""The paper's environments: MPE cooperative navigation and predator-prey, 3 to 48 agents.

Thin wrappers over ``mpe2`` (``simple_spread_v3`` and ``simple_tag_v3``, extra ``[envs]``) with
a fixed agent order and NumPy in and out::

    from marlbuf import MultiAgentReplayBuffer
    from marlbuf.envs import make, rollout

    env = make("cooperative_navigation", n_agents=24, seed=0)   # N agents, N landmarks
    env = make("predator_prey", n_predators=24, seed=0)         # 24 + 8 prey + 8 landmarks
    env.agents        # fixed order: predators ("adversary_*") first, then prey ("agent_*")
    env.obs_dims      # [98] * 24 + [96] * 8
    obs = env.reset()                          # list of float32 arrays, agent order
    obs, rew, done, info = env.step(actions)   # actions: per agent float32 (5,), or (n, 5)
    if info["episode_over"]:                   # truncation at step 25 (info["truncated"])
        obs = env.reset()

    buf = MultiAgentReplayBuffer(env.specs(), capacity=100_000)
    rollout(env, 1000, buffer=buf)             # random policy; fills the buffer

Conventions (details in ``docs/envs.md``):

* **Per-agent data are sequences in agent order** (``env.agents``), never dicts: observations a
  list of 1-D float32 arrays, rewards/dones 1-D arrays of length ``n_agents``. They go straight
  into ``MultiAgentReplayBuffer.add``.
* ``done`` holds terminations only (MPE never terminates: all False), which is what the
  original MADDPG trainers store; the 25-step truncation is reported in ``info["truncated"]``
  and ``info["episode_over"]``, and the caller resets.
* Rewards are mpe2's; :meth:`MPEEnv.original_reward` and ``info["original_return"]`` give them
  in the original MPE's units (cooperative navigation: ``2·Σᵢ rᵢ − N`` per step).
* ``seed`` makes the sequence of episodes (and the default random actions) reproducible.
* ``make(..., fast=True)`` (default) steps the world, rewards and observations on whole arrays
  (:mod:`marlbuf.envs._fast`), bit-identical to mpe2 and faster than its ``parallel_env``:
  19.5x at 24 agents (cooperative navigation), 32x at 24 + 8 (predator-prey);
  ``fast=False`` runs mpe2's own loops.
"""

from marlbuf.envs.mpe import EPISODE_LENGTH, SCENARIOS, MPEEnv, make
from marlbuf.envs.rollout import Policy, RolloutStats, rollout

__all__ = [
    "EPISODE_LENGTH",
    "SCENARIOS",
    "MPEEnv",
    "Policy",
    "RolloutStats",
    "make",
    "rollout",
]
