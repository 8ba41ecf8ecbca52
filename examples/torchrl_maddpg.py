"""MADDPG with TorchRL on MPE cooperative navigation (mpe2's ``simple_spread``), on the CPU.

A TorchRL multi-agent loop as TorchRL's own multi-agent examples write one: the PettingZoo
environment through ``PettingZooWrapper`` (one agent group, ``("agent", ...)`` keys), per-agent
actors and centralized critics from ``MultiAgentMLP``, a ``Collector``, a
``TensorDictReplayBuffer`` and ``DDPGLoss`` with soft target updates.

This loop exists twice: ``torchrl_maddpg.py`` keeps TorchRL's ``LazyTensorStorage``, and
``torchrl_maddpg_marlbuf.py`` puts marlbuf's ``MarlbufStorage`` in its place. The two files
differ in the buffer's lines only (``docs/torchrl.md`` shows the diff). Run either::

    python examples/torchrl_maddpg.py --n-agents 3 --n-iters 20

It needs ``pip install 'marlbuf[torchrl,envs]'`` (TorchRL, mpe2). :func:`train` returns the
run's losses and its time per phase, which the ``torchrl`` benchmark suite compares between
the two files.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from mpe2 import simple_spread_v3
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
from torchrl.envs import Compose, InitTracker, RewardSum, TransformedEnv
from torchrl.envs.libs.pettingzoo import PettingZooWrapper
from torchrl.modules import AdditiveGaussianModule, ProbabilisticActor, TanhDelta, ValueOperator
from torchrl.modules.models.multiagent import MultiAgentMLP
from torchrl.objectives import DDPGLoss, SoftUpdate, ValueEstimators


@dataclass
class Config:
    """One run's settings (MADDPG paper's where they apply)."""

    n_agents: int = 3
    """Agents (and landmarks) of cooperative navigation."""
    max_cycles: int = 25
    """Steps per episode."""
    frames_per_batch: int = 1000
    """Environment steps collected per iteration."""
    n_iters: int = 20
    """Collection + training iterations."""
    memory_size: int = 1_000_000
    """Replay buffer capacity (transitions)."""
    minibatch_size: int = 1024
    """Transitions per gradient step."""
    updates_per_iter: int = 10
    """Gradient steps per iteration."""
    learning_starts: int = 1024
    """Transitions stored before the first gradient step."""
    lr: float = 0.01
    gamma: float = 0.95
    tau: float = 0.01
    """Target networks' soft-update rate."""
    hidden: int = 64
    """Units of the two hidden layers of actors and critics."""
    max_grad_norm: float = 0.5
    seed: int = 0
    threads: int = 1
    """torch threads (one keeps 2-core machines quiet)."""
    record: dict[str, Any] = field(default_factory=dict)
    """Filled by :func:`train`: losses and seconds per phase."""


def make_env(cfg: Config) -> TransformedEnv:
    env = PettingZooWrapper(
        simple_spread_v3.parallel_env(
            N=cfg.n_agents, max_cycles=cfg.max_cycles, continuous_actions=True
        ),
        use_mask=False,
        categorical_actions=False,
        seed=cfg.seed,
    )
    return TransformedEnv(
        env,
        Compose(
            InitTracker(),  # marks episode starts (the exploration noise reads it)
            RewardSum(in_keys=[env.reward_key], out_keys=[("agent", "episode_reward")]),
        ),
    )


def make_networks(env: TransformedEnv, cfg: Config) -> tuple[Any, Any, Any]:
    obs_dim = env.observation_spec["agent", "observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched["agent", "action"]
    act_dim = action_spec.shape[-1]
    actor = MultiAgentMLP(
        n_agent_inputs=obs_dim,
        n_agent_outputs=act_dim,
        n_agents=cfg.n_agents,
        centralized=False,
        share_params=False,
        depth=2,
        num_cells=cfg.hidden,
        activation_class=nn.ReLU,
    )
    policy = ProbabilisticActor(
        module=TensorDictModule(
            actor, in_keys=[("agent", "observation")], out_keys=[("agent", "param")]
        ),
        spec=env.full_action_spec_unbatched,
        in_keys=[("agent", "param")],
        out_keys=[env.action_key],
        distribution_class=TanhDelta,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=False,
    )
    explore = TensorDictSequential(
        policy,
        AdditiveGaussianModule(
            spec=env.full_action_spec_unbatched,
            annealing_num_steps=cfg.frames_per_batch * cfg.n_iters // 2,
            action_key=env.action_key,
        ),
    )
    critic = ValueOperator(  # MADDPG: every critic sees every agent's observation and action
        module=MultiAgentMLP(
            n_agent_inputs=obs_dim + act_dim,
            n_agent_outputs=1,
            n_agents=cfg.n_agents,
            centralized=True,
            share_params=False,
            depth=2,
            num_cells=cfg.hidden,
            activation_class=nn.ReLU,
        ),
        in_keys=[("agent", "observation"), env.action_key],
        out_keys=[("agent", "state_action_value")],
    )
    return policy, explore, critic


def train(cfg: Config) -> Config:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    env = make_env(cfg)
    policy, explore, critic = make_networks(env, cfg)
    collector = Collector(
        env,
        explore,
        frames_per_batch=cfg.frames_per_batch,
        total_frames=cfg.frames_per_batch * cfg.n_iters,
    )
    replay_buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(cfg.memory_size),
        sampler=RandomSampler(),
        batch_size=cfg.minibatch_size,
    )
    loss_module = DDPGLoss(actor_network=policy, value_network=critic, delay_value=True)
    loss_module.set_keys(
        state_action_value=("agent", "state_action_value"),
        reward=("agent", "reward"),
        done=("agent", "done"),
        terminated=("agent", "terminated"),
    )
    loss_module.make_value_estimator(ValueEstimators.TD0, gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_module, tau=cfg.tau)
    optimizer = torch.optim.Adam(loss_module.parameters(), cfg.lr)

    seconds = {"collect": 0.0, "buffer_extend": 0.0, "buffer_sample": 0.0, "update": 0.0}
    losses: list[tuple[float, float]] = []
    returns: list[float] = []
    tick = time.perf_counter()
    for data in collector:
        seconds["collect"] += time.perf_counter() - tick
        tick = time.perf_counter()
        replay_buffer.extend(data.reshape(-1))
        seconds["buffer_extend"] += time.perf_counter() - tick
        finished = data["next", "agent", "done"].any(-1).any(-1)
        if finished.any():
            returns.append(float(data["next", "agent", "episode_reward"][finished].mean()))
        for _ in range(cfg.updates_per_iter if len(replay_buffer) >= cfg.learning_starts else 0):
            tick = time.perf_counter()
            batch = replay_buffer.sample()
            seconds["buffer_sample"] += time.perf_counter() - tick
            tick = time.perf_counter()
            loss = loss_module(batch)
            (loss["loss_actor"] + loss["loss_value"]).backward()
            torch.nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            target_updater.step()
            losses.append((loss["loss_actor"].item(), loss["loss_value"].item()))
            seconds["update"] += time.perf_counter() - tick
        collector.update_policy_weights_()
        tick = time.perf_counter()
    collector.shutdown()
    seconds["total"] = time.perf_counter() - start
    cfg.record = {"losses": losses, "returns": returns, "seconds": seconds}
    return cfg


def main(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in Config().__dict__.items():
        if name != "record":
            flag = "--" + name.replace("_", "-")
            parser.add_argument(flag, type=type(value), default=value)
    cfg = train(Config(**vars(parser.parse_args(argv))))
    seconds = cfg.record["seconds"]
    print(
        f"{len(cfg.record['losses'])} updates; last episode return "
        f"{cfg.record['returns'][-1] if cfg.record['returns'] else float('nan'):.2f}; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
    )
    return cfg


if __name__ == "__main__":
    main()
