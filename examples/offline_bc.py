"""Offline MARL end to end: record a vault, load it, learn from it without the environment.

1. **Record** cooperative navigation (mpe2's ``simple_spread``, 3 agents, discrete actions)
   with a noisy scripted policy (each agent heads for its own landmark; an ``epsilon``
   share of its actions is random) straight into a Flashbax vault (``marlbuf.offline.record``).
2. **Load** the vault twice with ``marlbuf.offline.read_vault``: with the ``Episodes``
   sampler, whose whole-episode batches give the recording policy's return, and with the
   default uniform sampler, whose transition batches train the learner.
3. **Learn** offline: behaviour cloning, one MLP per agent (two hidden layers, as the MADDPG
   actors of ``marlbuf.algos``), cross-entropy against the recorded actions
   (``batch.action_index``).
4. **Evaluate** the cloned policy, acting greedily, in the environment, against the return the
   dataset records. Cloning keeps the scripted behaviour and drops the recording noise, so it
   reaches the recording policy's return or better.

Run ``python examples/offline_bc.py`` (about a minute on two cores) or ``--quick`` (seconds,
what the test suite runs). Needs the ``[envs]``, ``[algos]`` and ``[vault]`` extras.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marlbuf.offline import read_vault, record
from marlbuf.samplers import Episodes


@dataclass
class Config:
    """Sizes of one run (``QUICK`` is what the tests run)."""

    steps: int = 20_000
    """Recorded steps per environment."""
    envs: int = 2
    """Environments recorded side by side (vault streams)."""
    epsilon: float = 0.3
    """Share of random actions of the recording policy."""
    train_steps: int = 3_000
    """Gradient steps of behaviour cloning."""
    batch_size: int = 256
    hidden: int = 64
    lr: float = 1e-3
    episodes_per_batch: int = 32
    """Whole episodes per batch when measuring the dataset's return."""
    eval_episodes: int = 50
    seed: int = 0


QUICK = Config(steps=2_500, envs=2, train_steps=600, eval_episodes=20)


def make_env() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25)


def scripted_policy(epsilon: float, seed: int) -> Any:
    """Agent ``i`` moves towards landmark ``i`` (mpe2's discrete moves: 1 left, 2 right, 3
    down, 4 up), damped by its velocity; a random action with probability ``epsilon``."""
    rng = np.random.default_rng(seed)

    def act(obs: dict[str, np.ndarray]) -> dict[str, int]:
        actions = {}
        for i, (agent, o) in enumerate(obs.items()):
            if rng.random() < epsilon:
                actions[agent] = int(rng.integers(5))
                continue
            # obs: own velocity (2), own position (2), landmarks relative to the agent (2 each)
            delta = o[4 + 2 * i : 6 + 2 * i] - 0.5 * o[0:2]
            if abs(delta[0]) > abs(delta[1]):
                actions[agent] = 2 if delta[0] > 0 else 1
            else:
                actions[agent] = 4 if delta[1] > 0 else 3
        return actions

    return act


def dataset_return(vault: Path, config: Config) -> float:
    """Mean episode return (summed over agents) of the recorded episodes, from whole-episode
    batches."""
    episodes = read_vault(vault, sampler=Episodes(), seed=config.seed)
    returns = []
    for _ in range(max(1, episodes.complete_episodes // config.episodes_per_batch)):
        batch = episodes.sample(min(config.episodes_per_batch, episodes.complete_episodes))
        team = sum(batch.reward[a] for a in episodes.agents)  # (B, L), zeros where masked
        returns.extend((team * batch.mask).sum(axis=1).tolist())
    return float(np.mean(returns))


def behaviour_cloning(vault: Path, config: Config) -> dict[str, torch.nn.Module]:
    """One classifier per agent, trained on uniform batches of recorded transitions."""
    buffer = read_vault(vault, seed=config.seed, next_obs="none")
    torch.manual_seed(config.seed)
    nets, params = {}, []
    for agent, spec in buffer.specs.items():
        assert spec.n_discrete_actions is not None
        nets[agent] = torch.nn.Sequential(
            torch.nn.Linear(spec.obs_dim, config.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(config.hidden, config.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(config.hidden, spec.n_discrete_actions),
        )
        params += list(nets[agent].parameters())
    optimizer = torch.optim.Adam(params, lr=config.lr)
    for _ in range(config.train_steps):
        batch = buffer.sample(config.batch_size)
        loss = sum(
            torch.nn.functional.cross_entropy(
                nets[a](torch.from_numpy(np.ascontiguousarray(batch.obs[a]))),
                torch.from_numpy(batch.action_index[a]),
            )
            for a in buffer.agents
        )
        optimizer.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
    return nets


def evaluate(nets: dict[str, torch.nn.Module], config: Config) -> float:
    """Mean episode return (summed over agents) of the greedy cloned policy."""
    env = make_env()
    returns = []
    with torch.no_grad():
        for episode in range(config.eval_episodes):
            obs, _ = env.reset(seed=10_000 + episode)
            total = 0.0
            while env.agents:
                actions = {
                    a: int(nets[a](torch.as_tensor(o)[None]).argmax()) for a, o in obs.items()
                }
                obs, rewards, _, _, _ = env.step(actions)
                total += float(sum(rewards.values()))
            returns.append(total)
    return float(np.mean(returns))


def run(config: Config, folder: Path) -> dict[str, float]:
    vault = folder / "simple_spread.vlt" / "scripted"
    envs = [make_env() for _ in range(config.envs)]
    record(
        envs,
        config.steps,
        scripted_policy(config.epsilon, config.seed),
        vault=vault,
        seed=config.seed,
    )
    recorded = dataset_return(vault, config)
    nets = behaviour_cloning(vault, config)
    cloned = evaluate(nets, config)
    return {"recording_policy_return": recorded, "behaviour_cloning_return": cloned}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny run the tests use")
    parser.add_argument("--out", type=Path, help="keep the vault in this folder")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else Config()
    torch.set_num_threads(1)
    if args.out is not None:
        result = run(config, args.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(config, Path(tmp))
    verdict = (
        "reaches"
        if result["behaviour_cloning_return"] >= result["recording_policy_return"]
        else "falls short of"
    )
    print(
        f"recording policy: {result['recording_policy_return']:.1f} per episode; behaviour "
        f"cloning: {result['behaviour_cloning_return']:.1f} ({verdict} the recording policy)"
    )
    return result


if __name__ == "__main__":
    main()
