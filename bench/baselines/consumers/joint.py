"""Stand-in consumer 2: MADDPG with one joint buffer (``push`` / ``sample`` of per-agent lists).

Written the way PyTorch MADDPG codebases with a joint buffer are: the buffer keeps per-agent
preallocated float32 arrays; ``push(obs, act, rew, next_obs, done)`` writes one environment step
of every agent from the dicts mpe2's parallel ``env.step`` returns
(:mod:`marlbuf.bench.baselines.consumers.mpe`; the rewards a ``defaultdict``); ``sample(B)`` draws
``np.random.choice(filled, B, replace=False)`` and returns lists of per-agent tensors, with every
agent's rewards normalised by the mean and standard deviation of all its stored rewards. Every
100 steps each agent draws its own sample and updates its critic and actor (the other agents'
actions in the actor loss come from their current policies); then all target networks are
soft-updated.

Swapping marlbuf in is the thirty lines of :class:`MarlbufJointBuffer`: ``push`` becomes
``MultiAgentReplayBuffer.add`` of the env's dicts as they are, ``sample`` becomes ``sample(B)``
with a ``Uniform(replace=False)`` sampler, ``Batch.as_lists()`` and ``torch.from_numpy``. The
reward normalisation reads ``stored("reward")`` with the consumer's float32 arithmetic (so
learning stays bit-identical) and recomputes it only when the buffer has been written to since
(``total_writes``): the consumer's own buffer makes that pass over every stored reward at every
sample call, N times per update round although nothing is written during the round. The buffer
is built with the library's defaults; the tuning option ``batch_layout="per_agent"`` makes every
per-agent array contiguous, which the per-agent networks here may read faster than strided
views.

On a GPU (``JointMADDPG(..., device="cuda")``) the networks live on the device and ``sample``
is asked for tensors there: the own buffer copies each sampled array with ``torch.tensor(...,
device=device)`` (these codebases' ``to_gpu`` cast); the swap builds its buffer with
``device=device`` (``MarlbufJointBuffer(..., device="cuda")``), whose batches are tensors on the
device already, normalised there.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any

import numpy as np
import torch
from torch import nn

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.baselines.consumers.mpe import EnvLoop
from marlbuf.samplers import Uniform

Tensor = torch.Tensor
#: what ``sample`` returns: obs, actions, rewards, next obs, dones (lists of per-agent tensors)
Sample = tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], list[Tensor]]


class JointReplayBuffer:
    """The consumer's own buffer: per-agent float32 arrays behind one ``push`` / ``sample``.

    Parameters
    ----------
    max_steps : int
        Capacity in environment steps.
    obs_dims, act_dims : sequence of int
        Per agent.
    """

    def __init__(self, max_steps: int, obs_dims: Sequence[int], act_dims: Sequence[int]) -> None:
        self.max_steps = int(max_steps)
        self.num_agents = len(obs_dims)
        self.obs_buffs = [np.zeros((self.max_steps, d), dtype=np.float32) for d in obs_dims]
        self.ac_buffs = [np.zeros((self.max_steps, d), dtype=np.float32) for d in act_dims]
        self.rew_buffs = [np.zeros(self.max_steps, dtype=np.float32) for _ in obs_dims]
        self.next_obs_buffs = [np.zeros((self.max_steps, d), dtype=np.float32) for d in obs_dims]
        self.done_buffs = [np.zeros(self.max_steps, dtype=np.float32) for _ in obs_dims]
        self.filled_i = 0
        self.curr_i = 0

    def __len__(self) -> int:
        return self.filled_i

    def push(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        next_observations: Any,
        dones: Any,
    ) -> None:
        """Store one step of every agent (each argument: a dict keyed by agent, as the env
        returns it, or one entry per agent in order)."""
        keys = list(observations) if isinstance(observations, Mapping) else range(self.num_agents)
        for i, key in enumerate(keys):
            self.obs_buffs[i][self.curr_i] = observations[key]
            self.ac_buffs[i][self.curr_i] = actions[key]
            self.rew_buffs[i][self.curr_i] = rewards[key]
            self.next_obs_buffs[i][self.curr_i] = next_observations[key]
            self.done_buffs[i][self.curr_i] = dones[key]
        self.curr_i = (self.curr_i + 1) % self.max_steps
        self.filled_i = min(self.filled_i + 1, self.max_steps)

    def sample(self, n: int, norm_rews: bool = True, device: Any = None) -> Sample:
        """``n`` distinct stored steps as lists of per-agent tensors (copied to ``device``)."""
        # the global legacy generator, as these codebases use it
        inds = np.random.choice(np.arange(self.filled_i), size=n, replace=False)  # noqa: NPY002

        def cast(x: np.ndarray) -> Tensor:
            return torch.tensor(x, dtype=torch.float32, device=device)

        if norm_rews:
            rews = [
                cast(
                    (self.rew_buffs[i][inds] - self.rew_buffs[i][: self.filled_i].mean())
                    / self.rew_buffs[i][: self.filled_i].std()
                )
                for i in range(self.num_agents)
            ]
        else:
            rews = [cast(self.rew_buffs[i][inds]) for i in range(self.num_agents)]
        return (
            [cast(self.obs_buffs[i][inds]) for i in range(self.num_agents)],
            [cast(self.ac_buffs[i][inds]) for i in range(self.num_agents)],
            rews,
            [cast(self.next_obs_buffs[i][inds]) for i in range(self.num_agents)],
            [cast(self.done_buffs[i][inds]) for i in range(self.num_agents)],
        )


class MarlbufJointBuffer:
    """The swap: the same ``push`` / ``sample`` over a marlbuf buffer.

    Parameters
    ----------
    max_steps : int
        Capacity in environment steps.
    obs_dims, act_dims : sequence of int
        Per agent.
    batch_layout : {"rows", "per_agent"}, optional
        Not given: the library's default (``"rows"``: strided views into the gathered rows).
        ``"per_agent"``: contiguous per-agent arrays (a tuning option for per-agent networks).
    seed : int, optional
        Seeds the buffer's sampler.
    device : str or torch.device, optional
        Keep the buffer on this torch device (its batches are tensors there); ``None``: NumPy
        arrays in host memory.
    """

    def __init__(
        self,
        max_steps: int,
        obs_dims: Sequence[int],
        act_dims: Sequence[int],
        batch_layout: str | None = None,
        seed: int | None = None,
        device: Any = None,
    ) -> None:
        specs = {
            f"agent_{i}": AgentSpec(obs_shape=(o,), action_shape=(a,))
            for i, (o, a) in enumerate(zip(obs_dims, act_dims))
        }
        options: dict[str, Any] = {} if batch_layout is None else {"batch_layout": batch_layout}
        if device is not None:
            options["device"] = device
        self.buffer = MultiAgentReplayBuffer(
            specs, max_steps, sampler=Uniform(replace=False), seed=seed, **options
        )
        self._stats: list[tuple[np.float32, np.float32]] = []
        self._stats_at = -1  # buffer.total_writes when _stats was computed

    def __len__(self) -> int:
        return len(self.buffer)

    def push(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        next_observations: Any,
        dones: Any,
    ) -> None:
        """Store one step of every agent: the env's dicts (or lists in agent order), as they
        are."""
        self.buffer.add(observations, actions, rewards, next_observations, dones)

    def draw(self, n: int) -> Any:
        """The batch of ``n`` distinct steps (the sampler draws without replacement): a
        :class:`~marlbuf.batch.Batch`, or a ``DeviceBatch`` of a buffer on a device."""
        return self.buffer.sample(n)

    def reward_stats(self) -> list[tuple[np.float32, np.float32]]:
        """Per agent, the float32 mean and std of the stored rewards, computed as the consumer
        computes them (bit-identical) but only when new data arrived since the last call."""
        if self._stats_at != self.buffer.total_writes:
            stored = self.buffer.stored("reward").values()
            self._stats = [(r.mean(), r.std()) for r in stored]
            self._stats_at = self.buffer.total_writes
        return self._stats

    def sample(self, n: int, norm_rews: bool = True, device: Any = None) -> Sample:
        """As :meth:`JointReplayBuffer.sample`: zero-copy tensors over the batch's arrays
        (copied to ``device`` when the buffer is in host memory), or the device batch's own."""
        obs, acs, rews, next_obs, dones = self.draw(n).as_lists()
        if self.buffer.device is not None:  # tensors on the buffer's device already
            if norm_rews:
                stats = self.reward_stats()
                rews = [(r - float(mean)) / float(std) for r, (mean, std) in zip(rews, stats)]
            return obs, acs, rews, next_obs, dones
        if norm_rews:
            rews = [(r - mean) / std for r, (mean, std) in zip(rews, self.reward_stats())]

        def t(x: np.ndarray) -> Tensor:
            tensor = torch.from_numpy(x)
            return tensor if device is None else tensor.to(device)

        return (
            [t(x) for x in obs],
            [t(x) for x in acs],
            [t(x) for x in rews],
            [t(x) for x in next_obs],
            [t(x) for x in dones],
        )


def mlp(in_dim: int, out_dim: int, hidden: int = 64) -> nn.Sequential:
    """Two hidden ReLU layers of ``hidden`` units."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, out_dim),
    )


class DDPGAgent:
    """A policy (sigmoid outputs), a centralized critic and their targets."""

    def __init__(
        self, obs_dim: int, act_dim: int, critic_in: int, lr: float, device: Any = None
    ) -> None:
        self.policy = mlp(obs_dim, act_dim)
        self.critic = mlp(critic_in, 1)
        if device is not None:
            self.policy.to(device)
            self.critic.to(device)
        self.target_policy = copy.deepcopy(self.policy)
        self.target_critic = copy.deepcopy(self.critic)
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=lr)

    def step(self, obs: Tensor, explore: bool, noise: float) -> Tensor:
        """Action for a batch of observations, with Gaussian exploration noise."""
        action = torch.sigmoid(self.policy(obs))
        if explore:
            action = (action + noise * torch.randn_like(action)).clamp(0.0, 1.0)
        return action


class JointMADDPG(EnvLoop):
    """The training loop: action selection, env step, ``push``, periodic updates.

    Parameters
    ----------
    env : PettingZoo ParallelEnv
        mpe2's continuous-action cooperative navigation
        (:func:`marlbuf.bench.baselines.consumers.mpe.parallel_env`).
    buffer : JointReplayBuffer or MarlbufJointBuffer
    batch_size : int
    update_every : int
        Environment steps between update rounds.
    warmup : int, optional
        Stored steps before the first update (default ``batch_size``).
    lr, gamma, tau, noise : float
    norm_rews : bool
        Normalise sampled rewards by the stored rewards' mean and std.
    seed : int
        Seeds the global NumPy and torch generators, and the env.
    device : str or torch.device, optional
        Where the networks live and the sampled tensors are asked for; ``None``: the CPU.
    """

    def __init__(
        self,
        env: Any,
        buffer: Any,
        batch_size: int = 1024,
        update_every: int = 100,
        warmup: int | None = None,
        lr: float = 0.01,
        gamma: float = 0.95,
        tau: float = 0.01,
        noise: float = 0.1,
        norm_rews: bool = True,
        seed: int = 0,
        device: Any = None,
    ) -> None:
        np.random.seed(seed)  # noqa: NPY002 - global seeding, as these codebases do
        torch.manual_seed(seed)
        super().__init__(env, seed, update_every, batch_size if warmup is None else warmup)
        self.buffer = buffer
        self.device = device
        self.nagents = self.n_agents
        critic_in = sum(self.obs_dims) + sum(self.action_dims)
        self.agents_nets = [
            DDPGAgent(o, a, critic_in, lr, device) for o, a in zip(self.obs_dims, self.action_dims)
        ]
        self.batch_size = batch_size
        self.gamma, self.tau, self.noise = gamma, tau, noise
        self.norm_rews = norm_rews

    # ----------------------------------------------------------------------------- acting
    def select_actions(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every agent's exploring action (one policy call per agent)."""
        with torch.no_grad():
            actions = [
                net.step(torch.as_tensor(obs[a], device=self.device).unsqueeze(0), True, self.noise)
                for net, a in zip(self.agents_nets, self.agents)
            ]
        return {a: x[0].cpu().numpy() for a, x in zip(self.agents, actions)}

    def store(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, dones: Any) -> None:
        """The write path: one ``push`` of the step's dicts, as the env returned them."""
        self.buffer.push(obs, actions, rewards, next_obs, dones)

    def stored_steps(self) -> int:
        return len(self.buffer)

    # ----------------------------------------------------------------------------- learning
    def sample(self, agent_i: int) -> Sample:
        """Agent ``agent_i``'s sampling call (one ``sample`` of the joint buffer)."""
        return self.buffer.sample(self.batch_size, norm_rews=self.norm_rews, device=self.device)

    def update(self, sample: Sample, agent_i: int) -> None:
        """Critic and policy update of agent ``agent_i``."""
        obs, acs, rews, next_obs, dones = sample
        agent = self.agents_nets[agent_i]

        agent.critic_optimizer.zero_grad()
        with torch.no_grad():
            all_trgt_acs = [
                torch.sigmoid(a.target_policy(nobs)) for a, nobs in zip(self.agents_nets, next_obs)
            ]
            trgt_vf_in = torch.cat((*next_obs, *all_trgt_acs), dim=1)
            target_value = rews[agent_i].view(-1, 1) + self.gamma * agent.target_critic(
                trgt_vf_in
            ) * (1 - dones[agent_i].view(-1, 1))
        vf_in = torch.cat((*obs, *acs), dim=1)
        actual_value = agent.critic(vf_in)
        vf_loss = nn.functional.mse_loss(actual_value, target_value)
        vf_loss.backward()
        nn.utils.clip_grad_norm_(agent.critic.parameters(), 0.5)
        agent.critic_optimizer.step()

        agent.policy_optimizer.zero_grad()
        curr_pol_out = agent.policy(obs[agent_i])
        all_pol_acs = []
        for i, (other, ob) in enumerate(zip(self.agents_nets, obs)):
            if i == agent_i:
                all_pol_acs.append(torch.sigmoid(curr_pol_out))
            else:
                with torch.no_grad():
                    all_pol_acs.append(torch.sigmoid(other.policy(ob)))
        pol_loss = -agent.critic(torch.cat((*obs, *all_pol_acs), dim=1)).mean()
        pol_loss = pol_loss + (curr_pol_out**2).mean() * 1e-3
        pol_loss.backward()
        nn.utils.clip_grad_norm_(agent.policy.parameters(), 0.5)
        agent.policy_optimizer.step()

    def update_all_targets(self) -> None:
        """Soft update of every agent's target policy and critic."""
        with torch.no_grad():
            for a in self.agents_nets:
                for net, target in ((a.policy, a.target_policy), (a.critic, a.target_critic)):
                    for p, tp in zip(net.parameters(), target.parameters()):
                        tp.mul_(1 - self.tau).add_(p, alpha=self.tau)

    def update_round(self) -> None:
        """Every agent samples and updates once; then the targets move (sampling and updates
        timed apart)."""
        for agent_i in range(self.nagents):
            start = perf_counter()
            sample = self.sample(agent_i)
            middle = perf_counter()
            self.update(sample, agent_i)
            self.timers["sample"] += middle - start
            self.timers["update"] += perf_counter() - middle
        start = perf_counter()
        self.update_all_targets()
        self.timers["update"] += perf_counter() - start
        self.updates += 1

    def parameters(self) -> list[Tensor]:
        """Every network parameter (online and target), in a fixed order."""
        nets = []
        for a in self.agents_nets:
            nets += [a.policy, a.critic, a.target_policy, a.target_critic]
        return [p.detach() for net in nets for p in net.parameters()]


__all__ = ["DDPGAgent", "JointMADDPG", "JointReplayBuffer", "MarlbufJointBuffer", "mlp"]
