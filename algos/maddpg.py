"""MADDPG and MATD3 learners, in two formulations that compute the same numbers.

* :class:`LoopLearner` — the readable reference: one set of tensors per trainer, updated one
  trainer after the other, as openai/maddpg does.
* :class:`BatchedLearner` — the same tensors stacked over trainers (leading axis ``T``), every
  layer one ``baddbmm``. Actors of agents with different observation sizes are zero-padded to
  the largest size: padded input columns are zero, so the padded weight rows get zero gradient,
  Adam leaves them at zero, and the outputs equal the unpadded ones.

Semantics (openai/maddpg, ``maddpg/trainer/maddpg.py``): per trainer ``t`` (one per agent) a
batch drawn with its own indices; target actions of *every* agent by its target actor with a
Gumbel-softmax sample (temperature 1); ``y = r_t + gamma (1 - done_t) Q'_t(o', a')``; critic
loss ``mean((Q_t(o, a) - y)^2)`` (importance-weighted with a prioritized sampler); actor loss
``-mean(Q_t(o, a with a_t <- pi_t(o_t))) + 1e-3 mean(logits^2)`` through the just-updated
critic; Adam; clip-by-norm 0.5 per parameter tensor; polyak tau = 0.01.

MATD3 (Ackermann et al. 2019, their MATD3 code): twin critics trained on the same target
``y = r + gamma (1 - done) min(Q'_1, Q'_2)``; clipped Gaussian smoothing noise on every target
action; the actor (through critic 1) and all target networks update every ``policy_delay``-th
round.

One deliberate deviation, shared by both formulations: target networks are soft-updated once
every trainer of the round has updated. openai/maddpg updates trainer ``t``'s targets before
trainer ``t+1`` computes its target Q, so later trainers see earlier agents' target actors one
polyak step (``tau``) newer; computing all trainers together requires the round-start targets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf.algos.config import TrainConfig
from marlbuf.algos.nets import (
    LAYERS,
    Tensor,
    clip_grad_by_norm_,
    draw_uniform,
    glorot_mlp,
    gumbel_softmax,
    polyak_,
    torch,
)
from marlbuf.algos.stacking import merge_leading, stack_fields, stack_or_copy
from marlbuf.batch import Batch

#: A phase hook: ``phase(name)`` returns a context manager (see :mod:`marlbuf.algos.runner`).
PhaseHook = Callable[[str], contextlib.AbstractContextManager[Any]]

_NULL_CONTEXT = contextlib.nullcontext()


def _no_phase(name: str) -> contextlib.AbstractContextManager[Any]:
    return _NULL_CONTEXT


#: Networks of one trainer, by name. MATD3 adds ``critic2`` and ``target_critic2``.
ONLINE = ("actor", "critic")
TWIN_ONLINE = ("actor", "critic", "critic2")


@dataclass
class RoundNoise:
    """Every random draw of one update round, drawn up front in a fixed order so that both
    formulations consume the same numbers.

    Attributes
    ----------
    target_uniform : Tensor, shape (T, N, B, A)
        Gumbel noise source for trainer t's target action of agent j.
    actor_uniform : Tensor, shape (T, B, A)
        Gumbel noise source for trainer t's own action in its actor loss.
    smoothing : Tensor, shape (T, N, B, A), or None
        MATD3's clipped Gaussian target-policy smoothing noise.
    """

    target_uniform: Tensor
    actor_uniform: Tensor
    smoothing: Tensor | None


@dataclass
class UpdateStats:
    """What one update round reports.

    Attributes
    ----------
    critic_loss : ndarray, shape (T,), float64
        Critic (1) loss per trainer.
    actor_loss : ndarray, shape (T,), float64
        Actor loss per trainer, NaN where the actor did not update (MATD3's delay).
    td_errors : list of ndarray, each shape (B,), float32
        |Q_1 - y| per trainer (for priority updates).
    actor_updated : bool
        Whether actors and targets updated this round.
    """

    critic_loss: np.ndarray
    actor_loss: np.ndarray
    td_errors: list[np.ndarray]
    actor_updated: bool


class Learner:
    """What both formulations share: sizes, hyperparameters, RNG, initial weights, noise.

    Parameters
    ----------
    config : TrainConfig
        Hyperparameters (algo, gamma, tau, learning rates, clip, MATD3 options, device).
    obs_dims : sequence of int
        Observation size of each trainer's agent, in agent order (trainer t = agent t).
    action_dim : int
        Size of every agent's action vector (5 in MPE).
    seed : int
        Seeds the initial weights and every noise draw (a ``torch.Generator`` on the CPU).
    dtype : torch.dtype, default float32
        Compute dtype (float64 is for tests that compare formulations to many digits).
    """

    def __init__(
        self,
        config: TrainConfig,
        obs_dims: Sequence[int],
        action_dim: int,
        seed: int = 0,
        dtype: Any = None,
    ) -> None:
        self.config = config
        self.obs_dims = [int(d) for d in obs_dims]
        self.n_trainers = len(self.obs_dims)
        self.action_dim = int(action_dim)
        self.critic_in = sum(self.obs_dims) + self.n_trainers * self.action_dim
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "device='cuda' was requested but torch.cuda.is_available() is False on this "
                "machine; use --device cpu"
            )
        self.dtype = torch.float32 if dtype is None else dtype
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))
        self.rounds = 0  # update rounds done (MATD3's delay counts these)
        self.online_names = TWIN_ONLINE if config.twin_critics else ONLINE

    # ------------------------------------------------------------------ initial weights
    def initial_params(self) -> list[dict[str, Tensor]]:
        """Fresh weights of every trainer, drawn in trainer order from the generator.

        Returns, per trainer, ``{"actor.l0.W": ..., "critic.l0.W": ..., "target_actor.l0.W":
        ..., ...}`` with each agent's true (unpadded) shapes; targets start as copies, or
        with their own draws when ``config.target_init == "independent"``.
        """
        hidden, act = self.config.hidden, self.action_dim
        out: list[dict[str, Tensor]] = []
        for obs_dim in self.obs_dims:
            params: dict[str, Tensor] = {}
            nets = {"actor": (obs_dim, act), "critic": (self.critic_in, 1)}
            if self.config.twin_critics:
                nets["critic2"] = (self.critic_in, 1)
            for net, (n_in, n_out) in nets.items():
                for key, value in glorot_mlp(n_in, hidden, n_out, self.generator).items():
                    params[f"{net}.{key}"] = value
                    params[f"target_{net}.{key}"] = value.clone()
                if self.config.target_init == "independent":
                    fresh = glorot_mlp(n_in, hidden, n_out, self.generator)
                    params.update({f"target_{net}.{k}": v for k, v in fresh.items()})
            out.append(params)
        return out

    # ------------------------------------------------------------------ noise
    def draw_round_noise(self, batch_size: int) -> RoundNoise:
        """The random numbers of one update round (see :class:`RoundNoise`)."""
        shape = (self.n_trainers, self.n_trainers, batch_size, self.action_dim)
        target_uniform = draw_uniform(shape, self.generator, self.dtype)
        actor_uniform = draw_uniform(shape[:1] + shape[2:], self.generator, self.dtype)
        smoothing = None
        if self.config.twin_critics and self.config.target_noise > 0:
            noise = torch.randn(shape, generator=self.generator, dtype=self.dtype)
            clip = self.config.target_noise_clip
            smoothing = (noise * self.config.target_noise).clamp_(-clip, clip)
        return RoundNoise(
            target_uniform.to(self.device),
            actor_uniform.to(self.device),
            None if smoothing is None else smoothing.to(self.device),
        )

    def draw_action_noise(self) -> Tensor:
        """Uniform noise for one step of action selection, shape (N, 1, A)."""
        shape = (self.n_trainers, 1, self.action_dim)
        return draw_uniform(shape, self.generator, self.dtype).to(self.device)

    def actor_updates_now(self) -> bool:
        """MADDPG: every round. MATD3: every ``policy_delay``-th round, the first included."""
        if not self.config.twin_critics:
            return True
        return self.rounds % self.config.policy_delay == 0

    def _tensor(self, arr: np.ndarray) -> Tensor:
        """A batch array as a tensor of the compute dtype on the device (zero copy on CPU when
        the dtype matches)."""
        tensor = torch.from_numpy(arr)
        if self.device.type == "cuda":
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.dtype)

    # ------------------------------------------------------------------ interface
    def act(self, obs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Exploration actions (soft Gumbel-softmax samples) for one step; obs in agent order,
        each shape (obs_dim,); returns float32 arrays of shape (A,)."""
        raise NotImplementedError

    def update(self, batches: Sequence[Batch], phase: PhaseHook = _no_phase) -> UpdateStats:
        """One update round of every trainer, trainer t on ``batches[t]``."""
        raise NotImplementedError

    def get_params(self) -> list[dict[str, Tensor]]:
        """Per trainer, every network's tensors with true shapes (CPU copies)."""
        raise NotImplementedError

    def set_params(self, params: Sequence[dict[str, Tensor]]) -> None:
        """Load :meth:`get_params`-shaped weights (optimizer state untouched)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer states, round counter and RNG state."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        raise NotImplementedError


def _alive_masks(
    batches: Sequence[Batch], agents: Sequence[str], tensor: Callable[[np.ndarray], Tensor]
) -> tuple[Tensor, Tensor] | None:
    """Masks of agents that come and go (buffers built with ``alive=True``), else None.

    Returns ``present`` (K, N, B): agent j is present at the step of batch k's row b, and
    ``next_present`` (K, N, B): it also acts at the next step (present and not done). The
    learners weight trainer t's critic and actor losses by its own agent's ``present`` (an
    absent agent's steps carry no loss) and zero the target actions of agents absent at the
    next step (their stored actions there are zeros too).
    """
    alive = [b.alive for b in batches]
    if any(a is None for a in alive):
        return None
    present = np.stack([np.stack([m[a] for a in agents]) for m in alive if m is not None])
    done = np.stack([np.stack([b.done[a] for a in agents]) for b in batches])
    next_present = present & (done == 0)
    return tensor(present.astype(np.float32)), tensor(next_present.astype(np.float32))


def _mlp(params: dict[str, Tensor], prefix: str, x: Tensor) -> Tensor:
    """The per-agent 3-layer MLP ``x @ W + b`` with ReLUs, from ``params[f"{prefix}.l0.W"]``..."""
    for i, layer in enumerate(LAYERS):
        x = torch.addmm(params[f"{prefix}.{layer}.b"], x, params[f"{prefix}.{layer}.W"])
        if i < len(LAYERS) - 1:
            x = torch.relu(x)
    return x


def _net_keys(params: dict[str, Tensor], net: str) -> list[str]:
    return [k for k in params if k.split(".", 1)[0] == net]


class LoopLearner(Learner):
    """The per-agent reference: each trainer owns its tensors and Adam optimizers and is
    updated in turn (``update_trainer``), exactly the structure of openai/maddpg."""

    def __init__(
        self,
        config: TrainConfig,
        obs_dims: Sequence[int],
        action_dim: int,
        seed: int = 0,
        dtype: Any = None,
    ) -> None:
        super().__init__(config, obs_dims, action_dim, seed, dtype)
        self.params: list[dict[str, Tensor]] = []
        self.set_params(self.initial_params())
        self.optimizers: list[dict[str, torch.optim.Adam]] = [
            {
                net: torch.optim.Adam(
                    [p[k] for k in _net_keys(p, net)],
                    lr=config.lr_actor if net == "actor" else config.lr_critic,
                )
                for net in self.online_names
            }
            for p in self.params
        ]
        self._noise: RoundNoise | None = None

    def get_params(self) -> list[dict[str, Tensor]]:
        return [{k: v.detach().cpu().clone() for k, v in p.items()} for p in self.params]

    def set_params(self, params: Sequence[dict[str, Tensor]]) -> None:
        if not self.params:
            self.params = [
                {
                    k: v.to(self.device, self.dtype)
                    .clone()
                    .requires_grad_(not k.startswith("target_"))
                    for k, v in p.items()
                }
                for p in params
            ]
            return
        with torch.no_grad():
            for mine, theirs in zip(self.params, params):
                for k, v in mine.items():
                    v.copy_(theirs[k])

    @torch.no_grad()
    def act(self, obs: Sequence[np.ndarray]) -> list[np.ndarray]:
        noise = self.draw_action_noise()
        actions = []
        for t, o in enumerate(obs):
            x = torch.as_tensor(np.asarray(o), dtype=self.dtype, device=self.device)[None]
            logits = _mlp(self.params[t], "actor", x)
            actions.append(gumbel_softmax(logits, noise[t])[0].cpu().numpy().astype(np.float32))
        return actions

    # ------------------------------------------------------------------ one round
    def begin_round(self, batch_size: int) -> None:
        """Draw the round's noise (before any trainer updates)."""
        self._noise = self.draw_round_noise(batch_size)

    def update_trainer(
        self, t: int, batch: Batch, phase: PhaseHook = _no_phase
    ) -> tuple[float, float, np.ndarray]:
        """Update trainer ``t`` on its batch; returns (critic loss, actor loss or NaN, |TD|)."""
        if self._noise is None:
            raise RuntimeError("call begin_round(batch_size) before update_trainer")
        noise, cfg, params = self._noise, self.config, self.params[t]
        agents = batch.agents
        obs = [self._tensor(batch.obs[a]) for a in agents]
        act = [self._tensor(batch.action[a]) for a in agents]
        masks = _alive_masks([batch], agents, self._tensor)
        own = None if masks is None else masks[0][0, t]  # (B,): trainer t's agent present
        with phase("target_q"), torch.no_grad():
            next_obs = [self._tensor(batch.next_obs[a]) for a in agents]
            target_act = []
            for j, o in enumerate(next_obs):
                logits = _mlp(self.params[j], "target_actor", o)
                a = gumbel_softmax(logits, noise.target_uniform[t, j])
                if noise.smoothing is not None:
                    a = a + noise.smoothing[t, j]
                if masks is not None:  # agents absent at the next step act not at all
                    a = a * masks[1][0, j, :, None]
                target_act.append(a)
            target_in = torch.cat(next_obs + target_act, dim=1)
            q_next = _mlp(params, "target_critic", target_in)[:, 0]
            if cfg.twin_critics:
                q_next = torch.minimum(q_next, _mlp(params, "target_critic2", target_in)[:, 0])
            reward = self._tensor(batch.reward[agents[t]])
            done = self._tensor(batch.done[agents[t]])
            y = reward + cfg.gamma * (1.0 - done) * q_next
        with phase("q_p_loss"):
            weights = None if batch.weights is None else self._tensor(batch.weights)
            critic_in = torch.cat(obs + act, dim=1)
            critic_loss = 0.0
            td_abs = np.empty(0, np.float32)
            for net in self.online_names[1:]:
                td = _mlp(params, net, critic_in)[:, 0] - y
                if own is not None:
                    td = td * own  # an absent agent's steps carry no loss (and no priority)
                sq = td.square() if weights is None else weights * td.square()
                loss = sq.mean() if own is None else sq.sum() / own.sum().clamp(min=1.0)
                self._step(t, net, loss)
                if net == "critic":
                    critic_loss = float(loss.detach())
                    td_abs = td.detach().abs().float().cpu().numpy()
            actor_loss = float("nan")
            if self.actor_updates_now():
                logits = _mlp(params, "actor", obs[t])
                joint = list(act)
                joint[t] = gumbel_softmax(logits, noise.actor_uniform[t])
                q = _mlp(params, "critic", torch.cat(obs + joint, dim=1))[:, 0]
                if own is None:
                    loss = -q.mean() + cfg.actor_reg * logits.square().mean()
                else:
                    present = own.sum().clamp(min=1.0)
                    reg = (logits.square().mean(dim=1) * own).sum() / present
                    loss = -(q * own).sum() / present + cfg.actor_reg * reg
                self._step(t, "actor", loss)
                actor_loss = float(loss.detach())
        return critic_loss, actor_loss, td_abs

    def _step(self, t: int, net: str, loss: Tensor) -> None:
        keys = _net_keys(self.params[t], net)
        tensors = [self.params[t][k] for k in keys]
        grads = torch.autograd.grad(loss, tensors)
        clip_grad_by_norm_(list(grads), self.config.grad_clip, stacked=False)
        for p, g in zip(tensors, grads):
            p.grad = g
        self.optimizers[t][net].step()

    def end_round(self) -> bool:
        """Soft-update every trainer's targets (when the actors updated); returns whether."""
        updated = self.actor_updates_now()
        if updated:
            for p in self.params:
                for net in self.online_names:
                    keys = _net_keys(p, net)
                    polyak_([p[f"target_{k}"] for k in keys], [p[k] for k in keys], self.config.tau)
        self.rounds += 1
        self._noise = None
        return updated

    def update(self, batches: Sequence[Batch], phase: PhaseHook = _no_phase) -> UpdateStats:
        self.begin_round(len(batches[0]))
        results = [self.update_trainer(t, b, phase) for t, b in enumerate(batches)]
        with phase("q_p_loss"):
            updated = self.end_round()
        return UpdateStats(
            critic_loss=np.array([r[0] for r in results]),
            actor_loss=np.array([r[1] for r in results]),
            td_errors=[r[2] for r in results],
            actor_updated=updated,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "formulation": "loop",
            "params": self.get_params(),
            "optimizers": [
                {n: o.state_dict() for n, o in opts.items()} for opts in self.optimizers
            ],
            "rounds": self.rounds,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("formulation") != "loop":
            raise ValueError(
                f"this state is from formulation {state.get('formulation')!r}; load it into a "
                "learner of the same formulation"
            )
        self.set_params(state["params"])
        for opts, saved in zip(self.optimizers, state["optimizers"]):
            for net, opt in opts.items():
                opt.load_state_dict(saved[net])
        self.rounds = int(state["rounds"])
        self.generator.set_state(state["generator"])


class BatchedLearner(Learner):
    """Every trainer at once: each parameter is one tensor with a leading trainer axis ``T``
    (actors zero-padded to the largest observation), each layer one ``baddbmm``.

    The critic's first layer is split into its observation rows and its action rows, so the
    observations enter straight from the gathered rows (a strided view, no copy) and only the
    small action block is rebuilt for the target and actor passes.
    """

    def __init__(
        self,
        config: TrainConfig,
        obs_dims: Sequence[int],
        action_dim: int,
        seed: int = 0,
        dtype: Any = None,
    ) -> None:
        super().__init__(config, obs_dims, action_dim, seed, dtype)
        self.max_obs = max(self.obs_dims)
        # runs of agents with the same observation size: (first, last + 1, obs_dim)
        self.obs_groups: list[tuple[int, int, int]] = []
        for t, dim in enumerate(self.obs_dims):
            if self.obs_groups and self.obs_groups[-1][2] == dim:
                self.obs_groups[-1] = (self.obs_groups[-1][0], t + 1, dim)
            else:
                self.obs_groups.append((t, t + 1, dim))
        self.obs_total = sum(self.obs_dims)
        self.stacked: dict[str, Tensor] = {}
        self.set_params(self.initial_params())
        self.optimizers: dict[str, torch.optim.Adam] = {
            net: torch.optim.Adam(
                [self.stacked[k] for k in _net_keys(self.stacked, net)],
                lr=config.lr_actor if net == "actor" else config.lr_critic,
            )
            for net in self.online_names
        }
        # own_action_mask[t, 0, j, 0] = 1 where j == t: replaces each trainer's own action
        eye = torch.eye(self.n_trainers, dtype=self.dtype, device=self.device)
        self.own_action_mask = eye.view(self.n_trainers, 1, self.n_trainers, 1)

    # ------------------------------------------------------------------ weights
    def set_params(self, params: Sequence[dict[str, Tensor]]) -> None:
        stacked: dict[str, Tensor] = {}
        for key in params[0]:
            parts = []
            for t, p in enumerate(params):
                value = p[key].to(self.dtype)
                if key.split(".", 1)[0].endswith("actor") and key.endswith("l0.W"):
                    pad = self.max_obs - self.obs_dims[t]  # zero rows for missing inputs
                    value = torch.nn.functional.pad(value, (0, 0, 0, pad))
                if key.endswith(".b"):
                    value = value[None]  # (1, out): broadcasts over the batch in baddbmm
                parts.append(value)
            stacked[key] = torch.stack(parts).to(self.device)
        if not self.stacked:
            self.stacked = {
                k: v.requires_grad_(not k.startswith("target_")) for k, v in stacked.items()
            }
            return
        with torch.no_grad():
            for k, v in self.stacked.items():
                v.copy_(stacked[k])

    def get_params(self) -> list[dict[str, Tensor]]:
        out: list[dict[str, Tensor]] = []
        for t, obs_dim in enumerate(self.obs_dims):
            params = {}
            for key, value in self.stacked.items():
                v = value[t].detach().cpu().clone()
                if key.split(".", 1)[0].endswith("actor") and key.endswith("l0.W"):
                    v = v[:obs_dim]
                if key.endswith(".b"):
                    v = v[0]
                params[key] = v
            out.append(params)
        return out

    # ------------------------------------------------------------------ forward passes
    def _stacked_mlp(self, prefix: str, x: Tensor, first: Tensor | None = None) -> Tensor:
        """Stacked MLP over the leading axis; ``first`` replaces the first layer's output
        (pre-activation) when the caller computed it in pieces."""
        p = self.stacked
        h = (
            first
            if first is not None
            else torch.baddbmm(p[f"{prefix}.l0.b"], x, p[f"{prefix}.l0.W"])
        )
        h = torch.relu(h)
        h = torch.relu(torch.baddbmm(p[f"{prefix}.l1.b"], h, p[f"{prefix}.l1.W"]))
        return torch.baddbmm(p[f"{prefix}.l2.b"], h, p[f"{prefix}.l2.W"])

    def _critic_split(self, prefix: str, obs: Tensor, actions: Tensor) -> Tensor:
        """Critic on observations (T, B, S) and actions (T, B, N*A) given separately."""
        p = self.stacked
        weight = p[f"{prefix}.l0.W"]
        first = torch.baddbmm(p[f"{prefix}.l0.b"], obs, weight[:, : self.obs_total])
        first = torch.baddbmm(first, actions, weight[:, self.obs_total :])
        return self._stacked_mlp(prefix, obs, first)[..., 0]

    def _actor_groups(
        self, prefix: str, inputs: Sequence[np.ndarray], relu_inplace: bool = False
    ) -> Tensor:
        """Stacked actors over agents, one ``baddbmm`` chain per group of equal observation
        size (contiguous agents): ``inputs[g]`` has shape (G_g, rows, obs_dim_g); returns
        logits of shape (N, rows, A). The padded weight rows are not read."""
        p = self.stacked
        outs = []
        for (start, stop, dim), x_np in zip(self.obs_groups, inputs):
            x = self._tensor(x_np)
            h = torch.baddbmm(
                p[f"{prefix}.l0.b"][start:stop], x, p[f"{prefix}.l0.W"][start:stop, :dim]
            )
            h = torch.relu_(h) if relu_inplace else torch.relu(h)
            h = torch.baddbmm(p[f"{prefix}.l1.b"][start:stop], h, p[f"{prefix}.l1.W"][start:stop])
            h = torch.relu_(h) if relu_inplace else torch.relu(h)
            outs.append(
                torch.baddbmm(p[f"{prefix}.l2.b"][start:stop], h, p[f"{prefix}.l2.W"][start:stop])
            )
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _target_logits(self, batches: Sequence[Batch], agents: Sequence[str]) -> Tensor:
        """Target actor of every agent j on agent j's next obs in every trainer t's batch:
        logits of shape (T, N, B, A).

        Trainers are taken in chunks of ``TARGET_CHUNK_ROWS`` rows so the (N, rows, hidden)
        activations stay in cache; within a chunk each group of equal-size agents is one
        (G, rows, obs_dim) strided view of the gathered rows (no copy with a RoundBlock).
        """
        n, batch_size = len(agents), len(batches[0])
        if len(batches) > 1 and all(b is batches[0] for b in batches):
            # shared_index: every trainer holds the same rows, so the logits are the same too
            one = self._target_logits(batches[:1], agents)
            return one.expand(len(batches), *one.shape[1:])
        per_chunk = max(1, _config.TARGET_CHUNK_ROWS // batch_size)
        chunks = []
        for first in range(0, len(batches), per_chunk):
            chunk = batches[first : first + per_chunk]
            per_agent = [
                merge_leading(stack_or_copy([b.next_obs[a] for b in chunk])) for a in agents
            ]
            groups = [stack_or_copy(per_agent[start:stop]) for start, stop, _ in self.obs_groups]
            logits = self._actor_groups("target_actor", groups, relu_inplace=True)
            chunks.append(logits.view(n, len(chunk), batch_size, -1).transpose(0, 1))
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)

    @torch.no_grad()
    def act(self, obs: Sequence[np.ndarray]) -> list[np.ndarray]:
        noise = self.draw_action_noise()
        rows = [np.asarray(o, dtype=np.float32).reshape(1, -1) for o in obs]
        groups = [np.stack(rows[start:stop]) for start, stop, _ in self.obs_groups]
        logits = self._actor_groups("actor", groups, relu_inplace=True)
        actions = gumbel_softmax(logits, noise)[:, 0].cpu().numpy().astype(np.float32)
        return list(actions)

    # ------------------------------------------------------------------ one round
    def update(self, batches: Sequence[Batch], phase: PhaseHook = _no_phase) -> UpdateStats:
        agents = batches[0].agents

        def own(name: str) -> Tensor:  # trainer t's own agent's field in batch t: (T, B)
            return self._tensor(np.stack([b.field(name)[a] for b, a in zip(batches, agents)]))

        def weights() -> Tensor | None:
            if batches[0].weights is None:
                return None
            return self._tensor(np.stack([b.weights for b in batches]))  # type: ignore[misc]

        def own_obs_groups() -> list[Any]:
            obs = [b.obs[a] for b, a in zip(batches, agents)]
            return [stack_or_copy(obs[start:stop]) for start, stop, _ in self.obs_groups]

        critic_loss, td, actor_loss, actor_updates = self._round(
            len(batches[0]),
            phase,
            next_obs=lambda: self._tensor(stack_fields(batches, "next_obs")),
            target_logits=lambda: self._target_logits(batches, agents),
            own=own,
            critic_in=lambda: self._tensor(stack_fields(batches, "obs", "action")),
            weights=weights,
            own_obs_groups=own_obs_groups,
            alive=lambda: _alive_masks(batches, agents, self._tensor),
        )
        return UpdateStats(
            critic_loss.double().cpu().numpy(),
            np.full(self.n_trainers, np.nan)
            if actor_loss is None
            else actor_loss.double().cpu().numpy(),
            list(td.abs().float().cpu().numpy()),
            actor_updates,
        )

    def _round(
        self,
        batch_size: int,
        phase: PhaseHook,
        next_obs: Callable[[], Tensor],
        target_logits: Callable[[], Tensor],
        own: Callable[[str], Tensor],
        critic_in: Callable[[], Tensor],
        weights: Callable[[], Tensor | None],
        own_obs_groups: Callable[[], list[Any]],
        alive: Callable[[], tuple[Tensor, Tensor] | None] = lambda: None,
    ) -> tuple[Tensor, Tensor, Tensor | None, bool]:
        """One update round of every trainer on inputs the caller provides (each asked for
        inside its phase): every trainer's next observations (T, B, S), target-actor logits
        (T, N, B, A), own reward/done (T, B), critic input (T, B, S + N*A), importance weights
        (T, B) or None, own observations grouped by size, and the alive masks of
        :func:`_alive_masks` (None: every agent present). Returns the critic loss (T,), the TD
        errors (T, B), the actor loss (T,) or None, and whether actors were updated; all
        detached, on the learner's device."""
        cfg = self.config
        n, act_dim = self.n_trainers, self.action_dim
        noise = self.draw_round_noise(batch_size)
        actor_updates = self.actor_updates_now()
        masks = alive()
        own_alive = None if masks is None else masks[0].diagonal(dim1=0, dim2=1).T  # (T, B)
        with phase("target_q"), torch.no_grad():
            next_in = next_obs()  # (T, B, S)
            logits = target_logits()  # (T, N, B, A)
            target_act = gumbel_softmax(logits, noise.target_uniform)
            if noise.smoothing is not None:
                target_act = target_act + noise.smoothing
            if masks is not None:  # agents absent at the next step act not at all
                target_act = target_act * masks[1][..., None]
            target_act = target_act.transpose(1, 2).reshape(n, batch_size, n * act_dim)
            q_next = self._critic_split("target_critic", next_in, target_act)
            if cfg.twin_critics:
                q_next = torch.minimum(
                    q_next, self._critic_split("target_critic2", next_in, target_act)
                )
            y = own("reward") + cfg.gamma * (1.0 - own("done")) * q_next  # (T, B)
        with phase("q_p_loss"):
            joint_in = critic_in()  # (T, B, S + N*A)
            w = weights()
            critic_loss = td_errors = None
            for net in self.online_names[1:]:
                td = self._stacked_mlp(net, joint_in)[..., 0] - y
                if own_alive is not None:
                    td = td * own_alive  # an absent agent's steps carry no loss (no priority)
                sq = td.square() if w is None else w * td.square()
                if own_alive is None:
                    per_trainer = sq.mean(dim=1)
                else:
                    per_trainer = sq.sum(dim=1) / own_alive.sum(dim=1).clamp(min=1.0)
                self._step(net, per_trainer.sum())
                if net == "critic":
                    critic_loss, td_errors = per_trainer.detach(), td.detach()
            actor_loss = None
            if actor_updates:
                logits = self._actor_groups("actor", own_obs_groups())  # (T, B, A)
                new_act = gumbel_softmax(logits, noise.actor_uniform)
                old_act = joint_in[..., self.obs_total :].reshape(n, batch_size, n, act_dim)
                mask = self.own_action_mask
                joint = old_act * (1.0 - mask) + new_act[:, :, None, :] * mask
                q = self._critic_split(
                    "critic", joint_in[..., : self.obs_total], joint.view(n, batch_size, -1)
                )
                if own_alive is None:
                    reg = logits.square().mean(dim=(1, 2))
                    per_trainer = -q.mean(dim=1) + cfg.actor_reg * reg
                else:
                    present = own_alive.sum(dim=1).clamp(min=1.0)
                    reg = (logits.square().mean(dim=2) * own_alive).sum(dim=1) / present
                    per_trainer = -(q * own_alive).sum(dim=1) / present + cfg.actor_reg * reg
                self._step("actor", per_trainer.sum())
                actor_loss = per_trainer.detach()
                for net in self.online_names:
                    keys = _net_keys(self.stacked, net)
                    polyak_(
                        [self.stacked[f"target_{k}"] for k in keys],
                        [self.stacked[k] for k in keys],
                        cfg.tau,
                    )
        self.rounds += 1
        assert critic_loss is not None and td_errors is not None  # "critic" is always online
        return critic_loss, td_errors, actor_loss, actor_updates

    def _step(self, net: str, loss: Tensor) -> None:
        keys = _net_keys(self.stacked, net)
        tensors = [self.stacked[k] for k in keys]
        grads = torch.autograd.grad(loss, tensors)
        clip_grad_by_norm_(list(grads), self.config.grad_clip, stacked=True)
        for p, g in zip(tensors, grads):
            p.grad = g
        self.optimizers[net].step()

    def state_dict(self) -> dict[str, Any]:
        return {
            "formulation": "batched",
            "params": self.get_params(),
            "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
            "rounds": self.rounds,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("formulation") != "batched":
            raise ValueError(
                f"this state is from formulation {state.get('formulation')!r}; load it into a "
                "learner of the same formulation"
            )
        self.set_params(state["params"])
        for net, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][net])
        self.rounds = int(state["rounds"])
        self.generator.set_state(state["generator"])


def make_learner(
    config: TrainConfig, obs_dims: Sequence[int], action_dim: int, dtype: Any = None
) -> Learner:
    """The learner of ``config.formulation``, seeded from ``config.seed``."""
    cls = BatchedLearner if config.formulation == "batched" else LoopLearner
    return cls(config, obs_dims, action_dim, seed=config.seed, dtype=dtype)
