"""Consumer 3: EPyMARL's episode pipeline (QMIX) with its own padded buffer or marlbuf's.

EPyMARL (and PyMARL) train QMIX, VDN, MAPPO and their kin on whole episodes: an episode runner
fills a padded ``EpisodeBatch`` step by step, the run loop inserts it into a ``ReplayBuffer``
(a ring of padded episodes), draws ``sample(batch_size)`` distinct episodes, truncates them to
the longest filled one (``batch[:, :max_t_filled()]``) and hands them to the learner. This
module reproduces that pipeline from its documented behaviour, so that the drop-in suite can
swap the buffer as an EPyMARL user would (``from marlbuf.compat.epymarl import ReplayBuffer``,
one line) and measure both on a real environment:

* :class:`PaddedEpisodeBatch` / :class:`PaddedReplayBuffer` — EPyMARL's ``EpisodeBatch`` and
  ``ReplayBuffer`` semantics: per scheme field one zero-filled torch tensor of shape
  ``(episodes, max_seq_length, *shape)`` (group fields ``(..., members, *vshape)``; episode
  constants ``(episodes, *shape)``), a long ``filled`` mask; ``update`` writes a slice of
  episodes and steps (checking that the value only adds or drops unit dimensions, then
  ``view_as``) and applies the ``preprocess`` transforms to the written slice;
  ``insert_episode_batch`` writes whole padded episodes at the ring position (split in two at
  the ring's end); ``sample`` returns ``[:batch_size]`` when that is every stored episode, else
  the episodes ``np.random.choice(episodes_in_buffer, batch_size, replace=False)`` (the global
  legacy generator) gathered by advanced indexing (copies); ``max_t_filled`` and indexing by
  key, keys, episodes and contiguous time slices as EPyMARL's learners use them.
* :class:`MPEEpisodeEnv` — mpe2's ``simple_spread`` (discrete actions) as EPyMARL's wrapper
  presents it: per-agent observations, the state as their concatenation, every action
  available, the agents' rewards summed into the common reward, ``terminated`` at the end of
  an episode and ``episode_limit`` in the info when the time limit cut it. ``mixed=(lo, hi)``
  ends each episode (terminated) at a step drawn uniformly from ``[lo, hi]``, for episodes of
  mixed lengths.
* :class:`EpisodeRunner` — one environment, one episode per ``run()``: the batch is updated
  with ``state``/``avail_actions``/``obs`` before and ``actions``/``reward``/``terminated``
  after each step, then the last state and the actions chosen there.
* :class:`BasicMAC`, :class:`RNNAgent`, :class:`QMixer`, :class:`QLearner` — a QMIX-sized
  learner with EPyMARL's QMIX defaults (``QMIXConfig``): parameter-shared agents fed the
  observation and the one-hot agent id, 64 hidden units, epsilon-greedy acting (1.0 to 0.05
  over 50,000 steps), double Q-learning, a QMIX mixer with two-layer hypernetworks (64) and a
  32-unit mixing layer, standardised rewards, Adam 5e-4, gradient clipping at 10, hard target
  updates every 200 training steps, γ 0.99.

:class:`QMIXRun` is the run loop (``run_sequential``'s body): one episode, insert, and when
``can_sample(batch_size)``: sample, truncate, train. It times the buffer's calls (``insert``,
``sample`` with the truncation) and the learner's ``train`` separately (``timers``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

Tensor = torch.Tensor


class OneHot:
    """EPyMARL's ``OneHot`` transform: integer actions ``(..., 1)`` to float one-hot
    ``(..., out_dim)``."""

    def __init__(self, out_dim: int) -> None:
        self.out_dim = out_dim

    def transform(self, tensor: Tensor) -> Tensor:
        out = tensor.new_zeros(*tensor.shape[:-1], self.out_dim)
        out.scatter_(-1, tensor.long(), 1)
        return out.float()

    def infer_output_info(self, vshape: Any, dtype: Any) -> tuple[tuple[int, ...], Any]:
        return (self.out_dim,), torch.float32


# ------------------------------------------------------------------------------ the buffer
class PaddedEpisodeBatch:
    """EPyMARL's ``EpisodeBatch``: padded episodes as torch tensors (see the module docstring).

    Parameters
    ----------
    scheme : dict
        Field -> ``{"vshape", "group", "dtype", "episode_const"}``.
    groups : dict
        Group -> members.
    batch_size, max_seq_length : int
        Episodes and steps.
    data : SimpleNamespace, optional
        ``transition_data`` and ``episode_data`` (views of another batch); new zero tensors
        when not given.
    preprocess : dict, optional
        ``{key: (new_key, [transforms])}``, applied by :meth:`update`.
    device : str
    """

    def __init__(
        self,
        scheme: dict[str, Any],
        groups: dict[str, int],
        batch_size: int,
        max_seq_length: int,
        data: SimpleNamespace | None = None,
        preprocess: dict[str, Any] | None = None,
        device: Any = "cpu",
    ) -> None:
        self.scheme = dict(scheme)
        self.groups = groups
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.preprocess = preprocess or {}
        self.device = device
        if data is not None:
            self.data = data
            return
        self.data = SimpleNamespace(transition_data={}, episode_data={})
        for key, (new_key, transforms) in self.preprocess.items():
            vshape, dtype = self.scheme[key]["vshape"], self.scheme[key]["dtype"]
            for transform in transforms:
                vshape, dtype = transform.infer_output_info(vshape, dtype)
            derived = {"vshape": vshape, "dtype": dtype}
            for copied in ("group", "episode_const"):
                if copied in self.scheme[key]:
                    derived[copied] = self.scheme[key][copied]
            self.scheme[new_key] = derived
        if "filled" in scheme:
            raise ValueError('"filled" is a reserved key for masking')
        self.scheme["filled"] = {"vshape": (1,), "dtype": torch.long}
        for key, info in self.scheme.items():
            vshape = info["vshape"]
            vshape = (vshape,) if isinstance(vshape, int) else tuple(vshape)
            group = info.get("group")
            shape = (groups[group], *vshape) if group else vshape
            dtype = info.get("dtype", torch.float32)
            if info.get("episode_const", False):
                self.data.episode_data[key] = torch.zeros(
                    (batch_size, *shape), dtype=dtype, device=device
                )
            else:
                self.data.transition_data[key] = torch.zeros(
                    (batch_size, max_seq_length, *shape), dtype=dtype, device=device
                )

    def to(self, device: Any) -> None:
        for store in (self.data.transition_data, self.data.episode_data):
            for key in store:
                store[key] = store[key].to(device)
        self.device = device

    def update(
        self,
        data: dict[str, Any],
        bs: Any = slice(None),
        ts: Any = slice(None),
        mark_filled: bool = True,
    ) -> None:
        """Write ``data`` (field -> tensor, or a list converted as EPyMARL converts it) into
        episodes ``bs`` and steps ``ts``; the preprocessed fields follow."""
        slices = self._parse((bs, ts))
        for key, value in data.items():
            if key in self.data.transition_data:
                target, where = self.data.transition_data, slices
                if mark_filled:
                    target["filled"][where] = 1
                    mark_filled = False
            elif key in self.data.episode_data:
                target, where = self.data.episode_data, slices[0]
            else:
                raise KeyError(f"{key} not found in transition or episode data")
            dtype = self.scheme[key].get("dtype", torch.float32)
            if isinstance(value, list):
                value = torch.tensor(np.array(value), dtype=dtype, device=self.device)
            destination = target[key][where]
            _check_safe_view(value, destination)
            target[key][where] = value.view_as(destination)
            if key in self.preprocess:
                new_key, transforms = self.preprocess[key]
                derived = target[key][where]
                for transform in transforms:
                    derived = transform.transform(derived)
                target[new_key][where] = derived.view_as(target[new_key][where])

    def __getitem__(self, item: Any) -> Any:
        transition, episode = self.data.transition_data, self.data.episode_data
        if isinstance(item, str):
            if item in episode:
                return episode[item]
            if item in transition:
                return transition[item]
            raise ValueError(item)
        if isinstance(item, tuple) and all(isinstance(k, str) for k in item):
            data = SimpleNamespace(transition_data={}, episode_data={})
            for key in item:
                if key in transition:
                    data.transition_data[key] = transition[key]
                elif key in episode:
                    data.episode_data[key] = episode[key]
                else:
                    raise KeyError(f"Unrecognised key {key}")
            scheme = {key: self.scheme[key] for key in item}
            groups = {
                self.scheme[k]["group"]: self.groups[self.scheme[k]["group"]]
                for k in item
                if "group" in self.scheme[k]
            }
            return PaddedEpisodeBatch(
                scheme, groups, self.batch_size, self.max_seq_length, data, device=self.device
            )
        rows, steps = self._parse(item)
        data = SimpleNamespace(
            transition_data={k: v[rows, steps] for k, v in transition.items()},
            episode_data={k: v[rows] for k, v in episode.items()},
        )
        return PaddedEpisodeBatch(
            self.scheme,
            self.groups,
            _count(rows, self.batch_size),
            _count(steps, self.max_seq_length),
            data,
            device=self.device,
        )

    @staticmethod
    def _parse(item: Any) -> tuple[Any, ...]:
        """``(episodes, steps)``: a lone episode index gets every step; ints become slices."""
        if isinstance(item, (slice, int, list, np.ndarray, torch.Tensor)):
            item = (item, slice(None))
        if isinstance(item[1], list):
            raise IndexError("Indexing across Time must be contiguous")
        return tuple(slice(i, i + 1) if isinstance(i, int) else i for i in item)

    def max_t_filled(self) -> Tensor:
        return torch.sum(self.data.transition_data["filled"], 1).max(0)[0]


def _check_safe_view(value: Tensor, destination: Tensor) -> None:
    """EPyMARL's check that ``value`` fits ``destination`` up to unit dimensions."""
    index = len(value.shape) - 1
    for size in destination.shape[::-1]:
        if value.shape[index] != size:
            if size != 1:
                raise ValueError(f"Unsafe reshape of {value.shape} to {destination.shape}")
        else:
            index -= 1


def _count(index: Any, size: int) -> int:
    if isinstance(index, slice):
        start, stop, step = index.indices(size)
        return 1 + (stop - start - 1) // step
    return len(index)


class PaddedReplayBuffer(PaddedEpisodeBatch):
    """EPyMARL's ``ReplayBuffer``: a ring of ``buffer_size`` padded episodes."""

    def __init__(
        self,
        scheme: dict[str, Any],
        groups: dict[str, int],
        buffer_size: int,
        max_seq_length: int,
        preprocess: dict[str, Any] | None = None,
        device: Any = "cpu",
    ) -> None:
        super().__init__(
            scheme, groups, buffer_size, max_seq_length, preprocess=preprocess, device=device
        )
        self.buffer_size = buffer_size
        self.buffer_index = 0
        self.episodes_in_buffer = 0

    def insert_episode_batch(self, ep_batch: Any) -> None:
        if self.buffer_index + ep_batch.batch_size <= self.buffer_size:
            where = slice(self.buffer_index, self.buffer_index + ep_batch.batch_size)
            self.update(
                ep_batch.data.transition_data,
                where,
                slice(0, ep_batch.max_seq_length),
                mark_filled=False,
            )
            self.update(ep_batch.data.episode_data, where)
            self.buffer_index += ep_batch.batch_size
            self.episodes_in_buffer = max(self.episodes_in_buffer, self.buffer_index)
            self.buffer_index %= self.buffer_size
            return
        room = self.buffer_size - self.buffer_index
        self.insert_episode_batch(ep_batch[0:room, :])
        self.insert_episode_batch(ep_batch[room:, :])

    def can_sample(self, batch_size: int) -> bool:
        return self.episodes_in_buffer >= batch_size

    def sample(self, batch_size: int) -> PaddedEpisodeBatch:
        assert self.can_sample(batch_size)
        if self.episodes_in_buffer == batch_size:
            return self[:batch_size]
        ids = np.random.choice(self.episodes_in_buffer, batch_size, replace=False)  # noqa: NPY002
        return self[ids]


# ------------------------------------------------------------------------------ the environment
class MPEEpisodeEnv:
    """mpe2's ``simple_spread`` with discrete actions, as EPyMARL's wrapper presents it.

    Parameters
    ----------
    n_agents : int
    episode_limit : int
        The time limit (``max_cycles``).
    seed : int
    mixed : tuple of int, optional
        ``(lo, hi)``: every episode ends (terminated) at a step drawn from ``[lo, hi]``.
    """

    n_actions = 5

    def __init__(
        self, n_agents: int, episode_limit: int = 25, seed: int = 0, mixed: Any = None
    ) -> None:
        from mpe2 import simple_spread_v3

        self.env = simple_spread_v3.parallel_env(
            N=n_agents, max_cycles=episode_limit, continuous_actions=False
        )
        self.agents = list(self.env.possible_agents)
        self.n_agents = n_agents
        self.episode_limit = episode_limit
        self.mixed = mixed
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.obs_shape = int(max(self.env.observation_space(a).shape[0] for a in self.agents))
        self._obs: dict[str, np.ndarray] = {}
        self._t = 0
        self._horizon = episode_limit
        self._episodes = 0

    def reset(self) -> None:
        self._obs, _ = self.env.reset(seed=self.seed + self._episodes)
        self._episodes += 1
        self._t = 0
        self._horizon = (
            self.episode_limit
            if self.mixed is None
            else int(self.rng.integers(self.mixed[0], self.mixed[1] + 1))
        )

    def get_obs(self) -> list[np.ndarray]:
        return [self._padded(self._obs[a]) for a in self.agents]

    def _padded(self, obs: np.ndarray) -> np.ndarray:
        if obs.shape[0] == self.obs_shape:
            return obs
        return np.concatenate([obs, np.zeros(self.obs_shape - obs.shape[0], obs.dtype)])

    def get_state(self) -> np.ndarray:
        return np.concatenate(self.get_obs())

    def get_avail_actions(self) -> list[list[int]]:
        return [[1] * self.n_actions for _ in self.agents]

    def step(self, actions: Tensor) -> tuple[float, bool, dict[str, Any]]:
        chosen = {a: int(x) for a, x in zip(self.agents, actions.tolist())}
        obs, rewards, terminations, truncations, _ = self.env.step(chosen)
        self._obs = obs
        self._t += 1
        ended = all(terminations.values()) or self._t >= self._horizon < self.episode_limit
        truncated = all(truncations.values()) and not ended  # the time limit cut it
        return float(sum(rewards.values())), ended or truncated, {"episode_limit": truncated}

    def get_env_info(self) -> dict[str, Any]:
        return {
            "state_shape": self.obs_shape * self.n_agents,
            "obs_shape": self.obs_shape,
            "n_actions": self.n_actions,
            "n_agents": self.n_agents,
            "episode_limit": self.episode_limit,
        }


def scheme_of(env_info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int], dict[str, Any]]:
    """EPyMARL's scheme, groups and preprocess for an environment (``run_sequential``'s)."""
    scheme = {
        "state": {"vshape": env_info["state_shape"]},
        "obs": {"vshape": env_info["obs_shape"], "group": "agents"},
        "actions": {"vshape": (1,), "group": "agents", "dtype": torch.long},
        "avail_actions": {
            "vshape": (env_info["n_actions"],),
            "group": "agents",
            "dtype": torch.int,
        },
        "reward": {"vshape": (1,)},
        "terminated": {"vshape": (1,), "dtype": torch.uint8},
    }
    groups = {"agents": env_info["n_agents"]}
    preprocess = {"actions": ("actions_onehot", [OneHot(out_dim=env_info["n_actions"])])}
    return scheme, groups, preprocess


# ------------------------------------------------------------------------------ the learner
@dataclass
class QMIXConfig:
    """EPyMARL's QMIX settings (its ``qmix.yaml`` over ``default.yaml``)."""

    batch_size: int = 32
    buffer_size: int = 5000
    hidden_dim: int = 64
    use_rnn: bool = False
    obs_agent_id: bool = True
    epsilon_start: float = 1.0
    epsilon_finish: float = 0.05
    epsilon_anneal_time: int = 50_000
    gamma: float = 0.99
    lr: float = 0.0005
    grad_norm_clip: float = 10.0
    target_update_interval: int = 200
    double_q: bool = True
    mixing_embed_dim: int = 32
    hypernet_embed: int = 64
    standardise_rewards: bool = True


class RNNAgent(nn.Module):
    """EPyMARL's ``rnn`` agent: ``fc1`` -> GRU cell (or a linear layer) -> ``fc2``."""

    def __init__(self, input_shape: int, n_actions: int, config: QMIXConfig) -> None:
        super().__init__()
        self.config = config
        self.fc1 = nn.Linear(input_shape, config.hidden_dim)
        self.rnn: nn.Module = (
            nn.GRUCell(config.hidden_dim, config.hidden_dim)
            if config.use_rnn
            else nn.Linear(config.hidden_dim, config.hidden_dim)
        )
        self.fc2 = nn.Linear(config.hidden_dim, n_actions)

    def init_hidden(self) -> Tensor:
        return self.fc1.weight.new_zeros(1, self.config.hidden_dim)

    def forward(self, inputs: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        x = functional.relu(self.fc1(inputs))
        h_in = hidden.reshape(-1, self.config.hidden_dim)
        h = self.rnn(x, h_in) if self.config.use_rnn else functional.relu(self.rnn(x))
        return self.fc2(h), h


class BasicMAC:
    """EPyMARL's ``BasicMAC``: one agent network shared by every agent, epsilon-greedy."""

    def __init__(
        self, scheme: dict[str, Any], n_agents: int, n_actions: int, config: QMIXConfig
    ) -> None:
        self.n_agents = n_agents
        self.config = config
        input_shape = scheme["obs"]["vshape"] + (n_agents if config.obs_agent_id else 0)
        self.agent = RNNAgent(input_shape, n_actions, config)
        self.hidden_states: Tensor | None = None
        self.epsilon = config.epsilon_start

    def select_actions(self, batch: Any, t_ep: int, t_env: int) -> Tensor:
        avail = batch["avail_actions"][:, t_ep]
        q = self.forward(batch, t_ep)
        c = self.config
        fraction = min(1.0, t_env / c.epsilon_anneal_time)
        self.epsilon = c.epsilon_start - fraction * (c.epsilon_start - c.epsilon_finish)
        masked = q.clone()
        masked[avail == 0.0] = -float("inf")
        pick_random = (torch.rand_like(q[:, :, 0]) < self.epsilon).long()
        random_actions = torch.distributions.Categorical(avail.float()).sample().long()
        return pick_random * random_actions + (1 - pick_random) * masked.max(dim=2)[1]

    def forward(self, batch: Any, t: int) -> Tensor:
        inputs = self._build_inputs(batch, t)
        outs, self.hidden_states = self.agent(inputs, self.hidden_states)
        return outs.view(batch.batch_size, self.n_agents, -1)

    def init_hidden(self, batch_size: int) -> None:
        self.hidden_states = (
            self.agent.init_hidden().unsqueeze(0).expand(batch_size, self.n_agents, -1)
        )

    def parameters(self) -> Any:
        return self.agent.parameters()

    def load_state(self, other: BasicMAC) -> None:
        self.agent.load_state_dict(other.agent.state_dict())

    def _build_inputs(self, batch: Any, t: int) -> Tensor:
        bs = batch.batch_size
        inputs = [batch["obs"][:, t]]
        if self.config.obs_agent_id:
            eye = torch.eye(self.n_agents, device=batch.device)
            inputs.append(eye.unsqueeze(0).expand(bs, -1, -1))
        return torch.cat([x.reshape(bs * self.n_agents, -1) for x in inputs], dim=1)


class QMixer(nn.Module):
    """The QMIX mixing network with two-layer hypernetworks."""

    def __init__(self, n_agents: int, state_dim: int, config: QMIXConfig) -> None:
        super().__init__()
        self.n_agents, self.state_dim = n_agents, state_dim
        embed, hyper = config.mixing_embed_dim, config.hypernet_embed
        self.embed_dim = embed
        self.hyper_w_1 = nn.Sequential(
            nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, embed * n_agents)
        )
        self.hyper_w_final = nn.Sequential(
            nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, embed)
        )
        self.hyper_b_1 = nn.Linear(state_dim, embed)
        self.V = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, agent_qs: Tensor, states: Tensor) -> Tensor:
        bs = agent_qs.size(0)
        states = states.reshape(-1, self.state_dim)
        agent_qs = agent_qs.view(-1, 1, self.n_agents)
        w1 = torch.abs(self.hyper_w_1(states)).view(-1, self.n_agents, self.embed_dim)
        b1 = self.hyper_b_1(states).view(-1, 1, self.embed_dim)
        hidden = functional.elu(torch.bmm(agent_qs, w1) + b1)
        w_final = torch.abs(self.hyper_w_final(states)).view(-1, self.embed_dim, 1)
        v = self.V(states).view(-1, 1, 1)
        return (torch.bmm(hidden, w_final) + v).view(bs, -1, 1)


class RunningMeanStd:
    """Running mean and variance (parallel algorithm), as EPyMARL standardises rewards."""

    def __init__(self, shape: tuple[int, ...], epsilon: float = 1e-4) -> None:
        self.mean = torch.zeros(shape, dtype=torch.float32)
        self.var = torch.ones(shape, dtype=torch.float32)
        self.count = epsilon

    def update(self, arr: Tensor) -> None:
        arr = arr.reshape(-1, arr.size(-1))
        batch_mean, batch_var, batch_count = arr.mean(dim=0), arr.var(dim=0), arr.size(0)
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = (
            self.var * self.count
            + batch_var * batch_count
            + delta**2 * self.count * batch_count / total
        )
        self.mean = self.mean + delta * batch_count / total
        self.var = m2 / total
        self.count = total


class QLearner:
    """EPyMARL's ``QLearner`` with the QMIX mixer (see the module docstring)."""

    def __init__(self, mac: BasicMAC, state_dim: int, config: QMIXConfig) -> None:
        self.mac, self.config = mac, config
        self.n_agents = mac.n_agents
        self.mixer = QMixer(self.n_agents, state_dim, config)
        self.params = [*mac.parameters(), *self.mixer.parameters()]
        self.optimiser = torch.optim.Adam(self.params, lr=config.lr)
        self.target_mac = copy.deepcopy(mac)
        self.target_mixer = copy.deepcopy(self.mixer)
        self.training_steps = 0
        self.last_target_update = 0
        self.rew_ms = RunningMeanStd((1,)) if config.standardise_rewards else None
        self.last_loss = float("nan")

    def train(self, batch: Any) -> None:
        rewards = batch["reward"][:, :-1]
        actions = batch["actions"][:, :-1]
        terminated = batch["terminated"][:, :-1].float()
        mask = batch["filled"][:, :-1].float()
        mask[:, 1:] = mask[:, 1:] * (1 - terminated[:, :-1])
        avail_actions = batch["avail_actions"]
        if self.rew_ms is not None:
            self.rew_ms.update(rewards)
            rewards = (rewards - self.rew_ms.mean) / torch.sqrt(self.rew_ms.var)
        rewards = rewards.expand(-1, -1, self.n_agents)

        mac_out = []
        self.mac.init_hidden(batch.batch_size)
        for t in range(batch.max_seq_length):
            mac_out.append(self.mac.forward(batch, t))
        mac_out_all = torch.stack(mac_out, dim=1)
        chosen = torch.gather(mac_out_all[:, :-1], dim=3, index=actions).squeeze(3)

        target_out = []
        self.target_mac.init_hidden(batch.batch_size)
        for t in range(batch.max_seq_length):
            target_out.append(self.target_mac.forward(batch, t))
        target_all = torch.stack(target_out[1:], dim=1)
        target_all[avail_actions[:, 1:] == 0] = -9999999
        if self.config.double_q:
            detached = mac_out_all.clone().detach()
            detached[avail_actions == 0] = -9999999
            best = detached[:, 1:].max(dim=3, keepdim=True)[1]
            target_max = torch.gather(target_all, 3, best).squeeze(3)
        else:
            target_max = target_all.max(dim=3)[0]

        chosen = self.mixer(chosen, batch["state"][:, :-1])
        target_max = self.target_mixer(target_max, batch["state"][:, 1:])
        targets = rewards + self.config.gamma * (1 - terminated) * target_max.detach()
        td_error = chosen - targets.detach()
        mask = mask.expand_as(td_error)
        masked = td_error * mask
        loss = (masked**2).sum() / mask.sum()
        self.optimiser.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.params, self.config.grad_norm_clip)
        self.optimiser.step()
        self.last_loss = float(loss.detach())
        self.training_steps += 1
        if self.training_steps - self.last_target_update >= self.config.target_update_interval:
            self.target_mac.load_state(self.mac)
            self.target_mixer.load_state_dict(self.mixer.state_dict())
            self.last_target_update = self.training_steps

    def parameters(self) -> list[Tensor]:
        return [p.detach() for p in self.params]


class EpisodeRunner:
    """EPyMARL's ``EpisodeRunner`` (one environment, one episode per :meth:`run`)."""

    def __init__(self, env: MPEEpisodeEnv, mac: BasicMAC, scheme: Any, groups: Any, pre: Any):
        self.env, self.mac = env, mac
        self.scheme, self.groups, self.preprocess = scheme, groups, pre
        self.t_env = 0

    def run(self) -> PaddedEpisodeBatch:
        batch = PaddedEpisodeBatch(
            self.scheme, self.groups, 1, self.env.episode_limit + 1, preprocess=self.preprocess
        )
        self.env.reset()
        t = 0
        terminated = False
        self.mac.init_hidden(batch_size=1)
        with torch.no_grad():
            while not terminated:
                batch.update(
                    {
                        "state": [self.env.get_state()],
                        "avail_actions": [self.env.get_avail_actions()],
                        "obs": [self.env.get_obs()],
                    },
                    ts=t,
                )
                actions = self.mac.select_actions(batch, t, self.t_env)
                reward, terminated, info = self.env.step(actions[0])
                batch.update(
                    {
                        "actions": actions,
                        "terminated": [(terminated != info.get("episode_limit", False),)],
                        "reward": [(reward,)],
                    },
                    ts=t,
                )
                t += 1
            batch.update(
                {
                    "state": [self.env.get_state()],
                    "avail_actions": [self.env.get_avail_actions()],
                    "obs": [self.env.get_obs()],
                },
                ts=t,
            )
            batch.update({"actions": self.mac.select_actions(batch, t, self.t_env)}, ts=t)
        self.t_env += t
        return batch


class QMIXRun:
    """``run_sequential``'s loop around any EPyMARL-style buffer class.

    Parameters
    ----------
    buffer_class : type
        :class:`PaddedReplayBuffer` or :class:`marlbuf.compat.epymarl.ReplayBuffer` (same
        constructor).
    n_agents : int
    seed : int
        Seeds torch, NumPy's global generator and the environment.
    mixed : tuple of int, optional
        Episodes of mixed lengths (:class:`MPEEpisodeEnv`).
    config : QMIXConfig, optional
    """

    def __init__(
        self,
        buffer_class: Any,
        n_agents: int,
        seed: int = 0,
        mixed: Any = None,
        config: QMIXConfig | None = None,
    ) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)  # noqa: NPY002 - EPyMARL seeds the global generators
        self.config = config or QMIXConfig()
        self.env = MPEEpisodeEnv(n_agents, seed=seed, mixed=mixed)
        info = self.env.get_env_info()
        scheme, groups, preprocess = scheme_of(info)
        self.buffer = buffer_class(
            scheme,
            groups,
            self.config.buffer_size,
            info["episode_limit"] + 1,
            preprocess=preprocess,
            device="cpu",
        )
        self.mac = BasicMAC(scheme, n_agents, info["n_actions"], self.config)
        self.learner = QLearner(self.mac, info["state_shape"], self.config)
        self.runner = EpisodeRunner(self.env, self.mac, scheme, groups, preprocess)
        #: seconds in the buffer's calls (``insert``; ``sample`` with the truncation) and in
        #: the learner's ``train`` (``update``)
        self.timers = {"insert": 0.0, "sample": 0.0, "update": 0.0}
        self.trains = 0

    def episode(self, train: bool = True) -> None:
        """One episode: run, insert, and (``train``, once enough are stored) sample, truncate,
        train."""
        from time import perf_counter

        batch = self.runner.run()
        start = perf_counter()
        self.buffer.insert_episode_batch(batch)
        self.timers["insert"] += perf_counter() - start
        if not train or not self.buffer.can_sample(self.config.batch_size):
            return
        start = perf_counter()
        sample = self.buffer.sample(self.config.batch_size)
        sample = sample[:, : sample.max_t_filled()]
        middle = perf_counter()
        self.learner.train(sample)
        self.timers["sample"] += middle - start
        self.timers["update"] += perf_counter() - middle
        self.trains += 1


__all__ = [
    "BasicMAC",
    "EpisodeRunner",
    "MPEEpisodeEnv",
    "OneHot",
    "PaddedEpisodeBatch",
    "PaddedReplayBuffer",
    "QLearner",
    "QMIXConfig",
    "QMIXRun",
    "QMixer",
    "RNNAgent",
    "scheme_of",
]
