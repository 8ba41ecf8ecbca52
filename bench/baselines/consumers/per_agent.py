"""Stand-in consumer 1: MADDPG with one replay buffer object per agent.

Written the way PyTorch ports of the original MADDPG trainer to PettingZoo are: every agent owns a
buffer of preallocated NumPy arrays and a trainer; each environment step (mpe2's parallel
``env.step``, :mod:`marlbuf.bench.baselines.consumers.mpe`) every agent adds its own transition from
the step's dicts (``buffers[i].add(obs[a], act[a], rew[a], next_obs[a], term[a])``: the reward a
Python float out of mpe2's ``defaultdict``, the termination a bool); every 100 steps each trainer
draws indices with ``np.random.choice(len, B, replace=False)`` from its own buffer, reads every
agent's buffer at those indices (``buffers[j].sample_index(idx)``), converts the arrays with
``torch.tensor`` and updates its critic, its actor and its target networks.

Swapping marlbuf in is one function (:func:`marlbuf_buffers`): the per-agent adapter objects of
:func:`marlbuf.compat.maddpg.make_buffers` share one interleaved store, so a trainer's
``sample_index`` calls on all agents' buffers cost one gather; ``Uniform(replace=False)`` draws
without replacement as ``np.random.choice(..., replace=False)`` does. Nothing else changes.

On a GPU (``device="cuda"``) the networks live on the device, and so do the tensors the update
reads: the own buffers' arrays are copied there by ``torch.tensor(..., device=device)`` (as these
codebases' ``.cuda()`` calls do), ``3N + 2`` copies per trainer. Keeping the replay data on the
device takes the change a user makes by hand (:class:`DeviceBufferMADDPG`): the per-agent
buffers become one ``MultiAgentReplayBuffer(..., device=device)`` (:func:`device_buffer`), a step
is stored with one ``add`` of every agent's transition, and a trainer's sample is one batch of
tensors already on the device.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from time import perf_counter
from typing import Any

import numpy as np
import torch
from torch import nn

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.bench.baselines.consumers.mpe import EnvLoop
from marlbuf.compat.maddpg import make_buffers
from marlbuf.samplers import Uniform

Tensor = torch.Tensor


class AgentReplayBuffer:
    """One agent's replay buffer: preallocated float32 arrays, a ring cursor, and the usual
    ``make_index`` / ``sample_index`` pair.

    Parameters
    ----------
    size : int
        Capacity in environment steps.
    obs_dim, act_dim : int
        This agent's observation and action sizes.
    """

    def __init__(self, size: int, obs_dim: int, act_dim: int) -> None:
        self.size = int(size)
        self.obs = np.zeros((self.size, obs_dim), dtype=np.float32)
        self.act = np.zeros((self.size, act_dim), dtype=np.float32)
        self.rew = np.zeros(self.size, dtype=np.float32)
        self.next_obs = np.zeros((self.size, obs_dim), dtype=np.float32)
        self.done = np.zeros(self.size, dtype=np.float32)
        self.ptr = 0
        self.filled = 0

    def __len__(self) -> int:
        return self.filled

    def add(self, obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> None:
        """Store this agent's transition of one step (overwrites the oldest once full)."""
        self.obs[self.ptr] = obs
        self.act[self.ptr] = act
        self.rew[self.ptr] = rew
        self.next_obs[self.ptr] = next_obs
        self.done[self.ptr] = done
        self.ptr = (self.ptr + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def make_index(self, batch_size: int) -> np.ndarray:
        """``batch_size`` distinct slots, drawn with the global NumPy generator."""
        # the global legacy generator, as these codebases use it
        return np.random.choice(self.filled, batch_size, replace=False)  # noqa: NPY002

    def sample_index(self, idx: Any) -> tuple[np.ndarray, ...]:
        """``(obs, act, rew, next_obs, done)`` at ``idx``: five fancy-indexing copies."""
        return self.obs[idx], self.act[idx], self.rew[idx], self.next_obs[idx], self.done[idx]


def own_buffers(size: int, obs_dims: Sequence[int], act_dim: int) -> list[AgentReplayBuffer]:
    """The consumer's own buffers: one :class:`AgentReplayBuffer` per agent."""
    return [AgentReplayBuffer(size, d, act_dim) for d in obs_dims]


def marlbuf_buffers(
    size: int, obs_dims: Sequence[int], act_dim: int, seed: int | None = None
) -> list[Any]:
    """The swap: per-agent adapter objects over one marlbuf store, same methods."""
    return make_buffers(
        len(obs_dims),
        size,
        obs_shape_n=[(d,) for d in obs_dims],
        act_shape_n=[(act_dim,)] * len(obs_dims),
        dtype=np.float32,
        sampler=Uniform(replace=False),
        seed=seed,
    )


def device_buffer(
    size: int, obs_dims: Sequence[int], act_dim: int, device: Any, seed: int | None = None
) -> MultiAgentReplayBuffer:
    """The swap for a GPU: one marlbuf buffer of every agent's fields on ``device``, in place
    of the per-agent buffers (for :class:`DeviceBufferMADDPG`)."""
    specs = {
        f"agent_{i}": AgentSpec(obs_shape=(d,), action_shape=(act_dim,))
        for i, d in enumerate(obs_dims)
    }
    return MultiAgentReplayBuffer(
        specs, size, sampler=Uniform(replace=False), seed=seed, device=device
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


class AgentTrainer:
    """One agent's actor, centralized critic, their target copies and optimizers."""

    def __init__(
        self, index: int, obs_dims: Sequence[int], act_dim: int, lr: float, device: Any = None
    ) -> None:
        self.index = index
        self.actor = mlp(obs_dims[index], act_dim)
        self.critic = mlp(sum(obs_dims) + act_dim * len(obs_dims), 1)
        if device is not None:
            self.actor.to(device)
            self.critic.to(device)
        self.target_actor = copy.deepcopy(self.actor)
        self.target_critic = copy.deepcopy(self.critic)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)

    def soft_update(self, tau: float) -> None:
        """``target <- (1 - tau) * target + tau * online`` for actor and critic."""
        with torch.no_grad():
            for net, target in ((self.actor, self.target_actor), (self.critic, self.target_critic)):
                for p, tp in zip(net.parameters(), target.parameters()):
                    tp.mul_(1 - tau).add_(p, alpha=tau)


class PerAgentMADDPG(EnvLoop):
    """The training loop: action selection, env step, per-agent ``add``, periodic updates.

    Parameters
    ----------
    env : PettingZoo ParallelEnv
        mpe2's continuous-action cooperative navigation
        (:func:`marlbuf.bench.baselines.consumers.mpe.parallel_env`).
    buffers : list
        One buffer per agent with ``add``, ``make_index``, ``sample_index`` and ``len``
        (:func:`own_buffers` or :func:`marlbuf_buffers`).
    batch_size : int
    update_every : int
        Environment steps between update rounds (100, as the original trainer).
    warmup : int, optional
        Stored steps before the first update (default ``batch_size``).
    lr, gamma, tau, noise : float
        Adam learning rate, discount, target smoothing, exploration noise (Gaussian std).
    seed : int
        Seeds the global NumPy and torch generators, as these codebases do, and the env.
    device : str or torch.device, optional
        Where the networks live (and the tensors the update reads); ``None``: the CPU.
    """

    def __init__(
        self,
        env: Any,
        buffers: list[Any],
        batch_size: int = 1024,
        update_every: int = 100,
        warmup: int | None = None,
        lr: float = 0.01,
        gamma: float = 0.95,
        tau: float = 0.01,
        noise: float = 0.1,
        seed: int = 0,
        device: Any = None,
    ) -> None:
        np.random.seed(seed)  # noqa: NPY002 - global seeding, as these codebases do
        torch.manual_seed(seed)
        super().__init__(env, seed, update_every, batch_size if warmup is None else warmup)
        self.buffers = buffers
        self.device = device
        self.n = self.n_agents
        self.act_dim = self.action_dims[0]
        self.trainers = [
            AgentTrainer(i, self.obs_dims, self.act_dim, lr, device) for i in range(self.n)
        ]
        self.batch_size = batch_size
        self.gamma, self.tau, self.noise = gamma, tau, noise

    # ----------------------------------------------------------------------------- acting
    def select_actions(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each actor on its own observation, plus Gaussian noise, clipped to [0, 1]."""
        actions = {}
        with torch.no_grad():
            for trainer, agent in zip(self.trainers, self.agents):
                o = torch.tensor(obs[agent], device=self.device).unsqueeze(0)
                a = torch.sigmoid(trainer.actor(o))[0].cpu().numpy()
                a = a + np.random.normal(0.0, self.noise, self.act_dim)  # noqa: NPY002
                actions[agent] = np.clip(a, 0.0, 1.0).astype(np.float32)
        return actions

    def store(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, dones: Any) -> None:
        """The write path: every agent adds its own transition to its own buffer."""
        for agent, buf in zip(self.agents, self.buffers):
            buf.add(obs[agent], actions[agent], rewards[agent], next_obs[agent], dones[agent])

    def stored_steps(self) -> int:
        """Environment steps held by the replay data."""
        return len(self.buffers[0])

    # ----------------------------------------------------------------------------- learning
    def sample(self, i: int) -> tuple[list[Tensor], list[Tensor], list[Tensor], Tensor, Tensor]:
        """Trainer ``i``'s sampling call: its own indices, every agent's buffer read at them.

        Returns ``(obs_n, act_n, next_obs_n, rew, done)``: lists of per-agent tensors, then
        agent ``i``'s reward and done.
        """
        idx = self.buffers[i].make_index(self.batch_size)
        obs_n, act_n, next_obs_n = [], [], []
        device = self.device
        for buf in self.buffers:
            obs, act, _, next_obs, _ = buf.sample_index(idx)
            obs_n.append(torch.tensor(obs, dtype=torch.float32, device=device))
            act_n.append(torch.tensor(act, dtype=torch.float32, device=device))
            next_obs_n.append(torch.tensor(next_obs, dtype=torch.float32, device=device))
        _, _, rew, _, done = self.buffers[i].sample_index(idx)
        rew_t = torch.tensor(rew, dtype=torch.float32, device=device)
        done_t = torch.tensor(done, dtype=torch.float32, device=device)
        return obs_n, act_n, next_obs_n, rew_t, done_t

    def update_agent(
        self, i: int, sample: tuple[list[Tensor], list[Tensor], list[Tensor], Tensor, Tensor]
    ) -> None:
        """Critic, actor and target update of trainer ``i`` from its sample."""
        obs_n, act_n, next_obs_n, rew, done = sample
        me = self.trainers[i]
        with torch.no_grad():
            next_act_n = [
                torch.sigmoid(t.target_actor(o)) for t, o in zip(self.trainers, next_obs_n)
            ]
            target_q = me.target_critic(torch.cat(next_obs_n + next_act_n, dim=1)).squeeze(1)
            target = rew + self.gamma * (1.0 - done) * target_q
        q = me.critic(torch.cat(obs_n + act_n, dim=1)).squeeze(1)
        critic_loss = torch.mean((q - target) ** 2)
        me.critic_opt.zero_grad()
        critic_loss.backward()
        nn.utils.clip_grad_norm_(me.critic.parameters(), 0.5)
        me.critic_opt.step()

        logits = me.actor(obs_n[i])
        act_in = list(act_n)
        act_in[i] = torch.sigmoid(logits)
        actor_loss = -me.critic(torch.cat(obs_n + act_in, dim=1)).mean()
        actor_loss = actor_loss + 1e-3 * torch.mean(logits**2)
        me.actor_opt.zero_grad()
        actor_loss.backward()
        nn.utils.clip_grad_norm_(me.actor.parameters(), 0.5)
        me.actor_opt.step()
        me.soft_update(self.tau)

    def update_round(self) -> None:
        """Every trainer samples and updates once (sampling and updates timed apart)."""
        for i in range(self.n):
            start = perf_counter()
            sample = self.sample(i)
            middle = perf_counter()
            self.update_agent(i, sample)
            self.timers["sample"] += middle - start
            self.timers["update"] += perf_counter() - middle
        self.updates += 1

    def parameters(self) -> list[Tensor]:
        """Every network parameter (online and target), in a fixed order."""
        nets = []
        for t in self.trainers:
            nets += [t.actor, t.critic, t.target_actor, t.target_critic]
        return [p.detach() for net in nets for p in net.parameters()]


class DeviceBufferMADDPG(PerAgentMADDPG):
    """The per-agent loop with its replay data on the networks' device: what a user changes to
    move the buffers onto the GPU with marlbuf (the compat adapters return NumPy arrays).

    ``buffers`` gives way to one ``buffer`` (:func:`device_buffer`, on ``device``); two methods
    change: :meth:`store` writes every agent's transition with one ``add``, :meth:`sample`
    reads trainer ``i``'s batch (its own draw, as before) as tensors already on the device.
    Everything else is :class:`PerAgentMADDPG`'s.
    """

    def __init__(self, env: Any, buffer: MultiAgentReplayBuffer, **settings: Any) -> None:
        super().__init__(env, [], **settings)
        self.buffer = buffer

    def stored_steps(self) -> int:
        return len(self.buffer)

    def store(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, dones: Any) -> None:
        """One ``add`` of the step's dicts, as ``env.step`` returned them."""
        self.buffer.add(obs, actions, rewards, next_obs, dones)

    def sample(self, i: int) -> tuple[list[Tensor], list[Tensor], list[Tensor], Tensor, Tensor]:
        """Trainer ``i``'s batch: ``(obs_n, act_n, next_obs_n, rew, done)`` on the device."""
        batch: Any = self.buffer.sample(self.batch_size)  # a DeviceBatch: tensors
        obs_n, act_n, rew_n, next_obs_n, done_n = batch.as_lists()
        return obs_n, act_n, next_obs_n, rew_n[i], done_n[i]


__all__ = [
    "AgentReplayBuffer",
    "AgentTrainer",
    "DeviceBufferMADDPG",
    "PerAgentMADDPG",
    "device_buffer",
    "marlbuf_buffers",
    "mlp",
    "own_buffers",
]
