"""Recurrent MADDPG: GRU actors trained from sequence batches with burn-in.

The example of sequence sampling (:class:`marlbuf.samplers.Sequence`) and global fields: a
MADDPG variant whose actors carry a GRU state through the episode, on **partially observable**
cooperative navigation, where each agent's observation lacks its own velocity (it has to infer
it from how positions change), while the centralized critics see the full state (every agent's
complete observation, stored once per step as the global field ``state``)::

    from marlbuf.algos.recurrent import RecurrentConfig, train

    result = train(RecurrentConfig(n_agents=3, episodes=3000, seed=0), evaluate_episodes=40)
    result.records[-1].original_return    # one record per training episode
    result.eval_before, result.eval_after # the policy before / after training, same episodes

One update draws ``batch_size`` sequences of ``burn_in + length`` steps (``buffer.sample``,
shape ``(B, L, ...)`` per agent and field, ``mask`` of real steps). Every actor is unrolled over
the sequence from a zero state: the ``burn_in`` steps only warm the state up (no gradient), the
``length`` training steps carry the losses, and steps outside the sequence's episode (masked)
hold the state at zero and contribute nothing. The critic of agent ``i`` is MADDPG's:
``Q_i(state, a_1..a_N)``, trained towards ``r_i + γ (1 − d_i) Q'_i(state', a'_1..a'_N)``, where
each next action ``a'_j`` comes from agent ``j``'s target actor, whose state has consumed the
sequence up to that step. Actions are MADDPG's Gumbel-softmax samples over 5 logits.

``docs/training.md`` shows the learning curve over 3 seeds (``marlbuf bench recurrent``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "marlbuf.algos needs PyTorch: pip install 'marlbuf[algos]' "
        "(install torch==2.13.0 CPU first on CPU-only machines)"
    ) from exc

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.algos.nets import draw_uniform, gumbel_softmax, polyak_
from marlbuf.samplers import Sequence

Tensor = torch.Tensor

#: Scalars at the start of an MPE cooperative-navigation observation that hold the agent's own
#: velocity (``[vel(2), pos(2), landmarks(2N), other agents(2(N-1)), comm(2(N-1))]``).
VELOCITY = slice(0, 2)


@dataclass
class RecurrentConfig:
    """Settings of one recurrent MADDPG run (defaults: the documented learning run)."""

    n_agents: int = 3
    episodes: int = 3000
    seed: int = 0
    hide_velocity: bool = True
    """Drop each agent's own velocity from its observation (partial observability)."""
    hidden: int = 64
    """Width of the actors' encoder and GRU state, and of the critics' hidden layers."""
    length: int = 16
    """Training steps per sequence."""
    burn_in: int = 8
    """Steps before them that only warm up the GRU state."""
    batch_size: int = 32
    """Sequences per update (``batch_size * length`` training steps)."""
    buffer_size: int = 100_000
    warmup_steps: int = 2_500
    update_every: int = 100
    """Env steps between updates (one update of every agent each time)."""
    gamma: float = 0.95
    tau: float = 0.01
    lr_actor: float = 1e-3
    lr_critic: float = 1e-3
    grad_clip: float = 0.5
    prioritized: bool = False
    """Prioritized sequences (R2D2's mix of per-step TD errors) instead of uniform starts."""

    def __post_init__(self) -> None:
        for name in ("n_agents", "episodes", "hidden", "length", "batch_size", "buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        for name in ("burn_in", "warmup_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0; got {name}={value!r}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 < self.tau <= 1.0:
            raise ValueError(
                f"gamma must be in [0, 1] and tau in (0, 1]; got gamma={self.gamma}, tau={self.tau}"
            )


@dataclass
class EpisodeRecord:
    """One training episode: its return in the original MPE's units and the wall time."""

    episode: int
    original_return: float
    updates: int
    seconds: float


class Actor(nn.Module):
    """``obs -> Linear -> ReLU -> GRUCell -> Linear -> logits`` (one agent)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int) -> None:
        super().__init__()
        self.encode = nn.Linear(obs_dim, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.head = nn.Linear(hidden, action_dim)

    def step(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: ``obs`` (B, obs_dim), ``state`` (B, hidden) -> logits (B, A), new state."""
        new = self.cell(torch.relu(self.encode(obs)), state)
        return self.head(new), new

    def unroll(self, obs: Tensor, mask: Tensor, grad_from: int = 0) -> tuple[Tensor, Tensor]:
        """Run the sequences ``obs`` (B, L, obs_dim) from a zero state.

        ``mask`` (B, L) bool marks real steps: the state is held at zero through masked steps
        (before the episode begins: the episode starts from a zero state, as when acting).
        Steps before ``grad_from`` run without gradient (burn-in). Returns the logits
        (B, L, A) and the states after each step (B, L, hidden).
        """
        batch, steps, _ = obs.shape
        state = obs.new_zeros(batch, self.cell.hidden_size)
        logits, states = [], []
        keep = mask.to(obs.dtype).unsqueeze(-1)
        for t in range(steps):
            with torch.set_grad_enabled(torch.is_grad_enabled() and t >= grad_from):
                out, new = self.step(obs[:, t], state)
                state = new * keep[:, t]
            logits.append(out)
            states.append(state)
        return torch.stack(logits, 1), torch.stack(states, 1)


def _critic(in_dim: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 1),
    )  # fmt: skip


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


class RecurrentMADDPG:
    """GRU actors and centralized feed-forward critics of ``n`` agents, trained from
    :class:`marlbuf.batch.SequenceBatch` es (see the module docstring)."""

    def __init__(
        self, obs_dims: list[int], action_dim: int, state_dim: int, config: RecurrentConfig
    ) -> None:
        self.cfg = config
        self.n = len(obs_dims)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed + 1)
        h = config.hidden
        self.actors = [Actor(d, action_dim, h) for d in obs_dims]
        self.critics = [_critic(state_dim + self.n * action_dim, h) for _ in obs_dims]
        self.target_actors = [Actor(d, action_dim, h) for d in obs_dims]
        self.target_critics = [_critic(state_dim + self.n * action_dim, h) for _ in obs_dims]
        for target, source in zip(
            self.target_actors + self.target_critics, self.actors + self.critics
        ):
            target.load_state_dict(source.state_dict())
            target.requires_grad_(False)
        self.actor_opt = [torch.optim.Adam(a.parameters(), lr=config.lr_actor) for a in self.actors]
        self.critic_opt = [
            torch.optim.Adam(c.parameters(), lr=config.lr_critic) for c in self.critics
        ]
        self.action_dim = action_dim

    # ------------------------------------------------------------------ acting
    def initial_states(self) -> list[Tensor]:
        """Zero GRU states, one (1, hidden) per agent (the start of an episode)."""
        return [torch.zeros(1, self.cfg.hidden) for _ in range(self.n)]

    @torch.no_grad()
    def act(
        self, obs: list[np.ndarray], states: list[Tensor], explore: bool = True
    ) -> tuple[np.ndarray, list[Tensor]]:
        """Actions (n, A) float32 for one step, and the agents' next states: Gumbel-softmax
        samples (``explore=True``, as in training) or the softmax of the logits."""
        actions, new_states = [], []
        for actor, o, s in zip(self.actors, obs, states):
            logits, new = actor.step(torch.from_numpy(o)[None], s)
            if explore:
                noise = draw_uniform(tuple(logits.shape), self.generator, logits.dtype)
                actions.append(gumbel_softmax(logits, noise)[0].numpy())
            else:
                actions.append(torch.softmax(logits, -1)[0].numpy())
            new_states.append(new)
        return np.stack(actions).astype(np.float32), new_states

    def _sample_actions(self, logits: Tensor) -> Tensor:
        return gumbel_softmax(
            logits, draw_uniform(tuple(logits.shape), self.generator, logits.dtype)
        )

    # ------------------------------------------------------------------ learning
    def update(self, batch: Any) -> dict[str, Any]:
        """One update of every agent from one sequence batch; returns the mean losses and the
        per-sequence priorities (max/mean mix of |TD| over training steps, R2D2)."""
        cfg = self.cfg
        k = int(batch.burn_in)
        agents = batch.agents
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        mask_all = t(batch.mask)
        mask = mask_all[:, k:].to(torch.float32)  # (B, T) the training steps
        obs = [t(batch.obs[a]) for a in agents]
        next_obs = [t(batch.next_obs[a])[:, k:] for a in agents]
        actions = torch.cat([t(batch.action[a])[:, k:] for a in agents], -1)
        state = t(batch.globals["state"])[:, k:]
        next_state = t(batch.globals["next_state"])[:, k:]
        with torch.no_grad():  # next actions: target actors whose state consumed obs[:t]
            next_actions = []
            for actor, o, o_next in zip(self.target_actors, obs, next_obs):
                _, states = actor.unroll(o, mask_all)
                b, steps, _ = o_next.shape
                logits, _ = actor.step(
                    o_next.reshape(b * steps, -1), states[:, k:].reshape(b * steps, -1)
                )
                next_actions.append(self._sample_actions(logits).view(b, steps, -1))
            next_in = torch.cat([next_state, torch.cat(next_actions, -1)], -1)
        critic_in = torch.cat([state, actions], -1)
        critic_losses, actor_losses, td_abs = [], [], []
        for i, a in enumerate(agents):
            reward = t(batch.reward[a])[:, k:]
            done = t(batch.done[a])[:, k:]
            with torch.no_grad():
                target = reward + cfg.gamma * (1.0 - done) * self.target_critics[i](next_in)[..., 0]
            q = self.critics[i](critic_in)[..., 0]
            td = q - target
            loss = _masked_mean(td * td, mask)
            self._step(self.critic_opt[i], self.critics[i], loss)
            critic_losses.append(float(loss.detach()))
            td_abs.append(td.detach().abs() * mask)
            logits, _ = self.actors[i].unroll(obs[i], mask_all, grad_from=k)
            own = self._sample_actions(logits[:, k:])
            joint = list(actions.split(self.action_dim, -1))
            joint[i] = own
            value = self.critics[i](torch.cat([state, torch.cat(joint, -1)], -1))[..., 0]
            reg = (logits[:, k:] ** 2).mean(-1)
            actor_loss = -_masked_mean(value, mask) + 1e-3 * _masked_mean(reg, mask)
            self._step(self.actor_opt[i], self.actors[i], actor_loss)
            actor_losses.append(float(actor_loss.detach()))
        targets, sources = self.target_actors + self.target_critics, self.actors + self.critics
        polyak_(
            [p for net in targets for p in net.parameters()],
            [p for net in sources for p in net.parameters()],
            cfg.tau,
        )
        per_step = torch.stack(td_abs).mean(0)  # (B, T): mean |TD| over agents
        return {
            "critic_loss": float(np.mean(critic_losses)),
            "actor_loss": float(np.mean(actor_losses)),
            "td_abs": per_step.numpy(),
        }

    def _step(self, opt: torch.optim.Optimizer, net: nn.Module, loss: Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), self.cfg.grad_clip)
        opt.step()


def _partial(obs: list[np.ndarray], hide_velocity: bool) -> list[np.ndarray]:
    if not hide_velocity:
        return obs
    return [np.delete(o, VELOCITY) for o in obs]


def make_buffer(
    obs_dims: list[int], action_dim: int, state_dim: int, config: RecurrentConfig
) -> MultiAgentReplayBuffer:
    """The sequence buffer: per-agent (partial) observations, actions, rewards, dones; the full
    state and next state as global fields; :class:`~marlbuf.samplers.Sequence` sampling."""
    specs = {
        f"agent_{i}": AgentSpec(obs_shape=(d,), action_shape=(action_dim,))
        for i, d in enumerate(obs_dims)
    }
    return MultiAgentReplayBuffer(
        specs,
        config.buffer_size,
        sampler=Sequence(
            length=config.length, burn_in=config.burn_in, prioritized=config.prioritized
        ),
        seed=config.seed,
        global_fields={"state": FieldSpec((state_dim,)), "next_state": FieldSpec((state_dim,))},
    )


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    records: list[EpisodeRecord]
    eval_before: list[float]
    """Returns (original units) of the untrained policy on the evaluation episodes."""
    eval_after: list[float]
    """Returns of the trained policy on the same evaluation episodes."""


def _env_dims(config: RecurrentConfig) -> tuple[Any, list[int], int]:
    from marlbuf.envs import make

    env = make("cooperative_navigation", n_agents=config.n_agents, seed=config.seed)
    full = env.reset()
    obs_dims = [int(o.shape[0]) for o in _partial(full, config.hide_velocity)]
    return env, obs_dims, int(sum(o.shape[0] for o in full))


def evaluate(learner: RecurrentMADDPG, config: RecurrentConfig, episodes: int) -> list[float]:
    """Returns of ``learner``'s policy (no exploration noise: the softmax of its logits; no
    learning) on ``episodes`` evaluation episodes, whose initial positions are fixed by the seed
    ``10_000 + config.seed``: two policies are compared on the same episodes."""
    from marlbuf.envs import make

    env = make("cooperative_navigation", n_agents=config.n_agents, seed=10_000 + config.seed)
    returns = []
    try:
        for _ in range(episodes):
            obs = _partial(env.reset(), config.hide_velocity)
            states = learner.initial_states()
            while True:
                actions, states = learner.act(obs, states, explore=False)
                full, _, _, info = env.step(actions)
                obs = _partial(full, config.hide_velocity)
                if info["episode_over"]:
                    returns.append(float(np.sum(info["original_return"])))
                    break
    finally:
        env.close()
    return returns


def train(
    config: RecurrentConfig,
    log: Callable[[EpisodeRecord], None] | None = None,
    evaluate_episodes: int = 0,
) -> TrainResult:
    """Train recurrent MADDPG on (partially observable) cooperative navigation.

    Returns one record per training episode and, with ``evaluate_episodes > 0``, the returns
    of the untrained and of the trained policy on the same evaluation episodes (:func:`evaluate`).
    """
    torch.set_num_threads(1)
    env, obs_dims, state_dim = _env_dims(config)
    action_dim = 5
    learner = RecurrentMADDPG(obs_dims, action_dim, state_dim, config)
    before = evaluate(learner, config, evaluate_episodes) if evaluate_episodes else []
    buffer = make_buffer(obs_dims, action_dim, state_dim, config)
    full = env.reset()
    obs = _partial(full, config.hide_velocity)
    states = learner.initial_states()
    records: list[EpisodeRecord] = []
    steps = updates = 0
    start = time.perf_counter()
    while len(records) < config.episodes:
        actions, states = learner.act(obs, states)
        full_next, reward, done, info = env.step(actions)
        next_obs = _partial(full_next, config.hide_velocity)
        buffer.add(
            obs,
            actions,
            reward,
            next_obs,
            done,
            truncated=bool(info["episode_over"]),
            state=np.concatenate(full),
            next_state=np.concatenate(full_next),
        )
        steps += 1
        full, obs = full_next, next_obs
        if steps >= config.warmup_steps and steps % config.update_every == 0:
            batch = buffer.sample(config.batch_size)
            stats = learner.update(batch)
            if config.prioritized:
                buffer.update_priorities(batch.indices, stats["td_abs"])
            updates += 1
        if info["episode_over"]:
            record = EpisodeRecord(
                episode=len(records),
                original_return=float(np.sum(info["original_return"])),
                updates=updates,
                seconds=time.perf_counter() - start,
            )
            records.append(record)
            if log is not None:
                log(record)
            full = env.reset()
            obs = _partial(full, config.hide_velocity)
            states = learner.initial_states()
    env.close()
    after = evaluate(learner, config, evaluate_episodes) if evaluate_episodes else []
    return TrainResult(records, before, after)


def config_dict(config: RecurrentConfig) -> dict[str, Any]:
    """Plain-data form of a config (for result files)."""
    return asdict(config)
