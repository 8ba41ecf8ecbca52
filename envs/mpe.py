"""The paper's two MPE tasks behind one small, fixed-order, NumPy-out interface.

See :mod:`marlbuf.envs` for the API and ``docs/envs.md`` for the conventions (episode end,
reward units, the shared predator reward cache).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from marlbuf.config import make_rng
from marlbuf.envs._fast import FastMPE
from marlbuf.spec import AgentSpec
from marlbuf.workloads import predator_prey_sizes

#: Scenario names accepted by :func:`make`, with the mpe2 module each one wraps.
SCENARIOS: dict[str, str] = {
    "cooperative_navigation": "simple_spread_v3",
    "predator_prey": "simple_tag_v3",
}

#: Episode length of the paper and of the original MPE trainers (mpe2's ``max_cycles``).
EPISODE_LENGTH = 25

#: Cooperative navigation's weight of the local (collision) reward; 0.5 is mpe2's default and
#: the value for which :meth:`MPEEnv.original_reward` converts to the original MPE's units.
LOCAL_RATIO = 0.5

_INSTALL_HINT = "pip install 'marlbuf[envs]'"


def _import_mpe2_module(module: str) -> Any:
    try:
        import importlib

        return importlib.import_module(f"mpe2.{module}")
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            f"marlbuf.envs needs mpe2 (the MPE environments): {_INSTALL_HINT}"
        ) from exc


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {name}={value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {name}={value}")
    return int(value)


class _SharedPredatorReward:
    """Computes simple_tag's predator reward once per world step instead of once per predator.

    mpe2's ``adversary_reward(agent, world)`` loops over every (prey, predator) pair and uses
    ``agent`` only through ``agent.collide``: every colliding predator gets the same number.
    At 24 predators + 8 prey that loop is recomputed 24 times a step (60% of the step). This
    callable, installed on the scenario instance, calls the original method once per step
    and hands the same float to the other predators, so rewards stay bit-identical
    (``tests/envs/test_envs.py`` checks them against unpatched mpe2). :class:`MPEEnv` calls
    :meth:`invalidate` before every world step.
    """

    def __init__(self, original: Callable[[Any, Any], float]) -> None:
        self._original = original
        self._value: float | None = None

    def invalidate(self) -> None:
        self._value = None

    def __call__(self, agent: Any, world: Any) -> float:
        if not agent.collide:  # the one agent-dependent branch: not cached
            return self._original(agent, world)
        if self._value is None:
            self._value = self._original(agent, world)
        return self._value


class MPEEnv:
    """One MPE task (cooperative navigation or predator-prey) with fixed agent order.

    Build it with :func:`make`. Per-agent data is passed **as sequences in agent order**
    (``env.agents``: predators first, then prey): observations are a list of 1-D float32 arrays
    (lengths differ between predators and prey), rewards/dones are 1-D arrays of length
    ``n_agents``; actions are accepted as a list of per-agent arrays or one 2-D array.

    Attributes
    ----------
    name : str
        ``"cooperative_navigation"`` or ``"predator_prey"``.
    agents : list of str
        mpe2's agent names in fixed order (``adversary_*`` predators first, then ``agent_*``).
    obs_dims, action_dims : list of int
        Per agent, in agent order.
    config : dict
        The sizes used: ``n_agents`` (CN) or ``n_predators``/``n_prey``/``n_landmarks`` (PP),
        plus ``episode_length`` and ``continuous_actions``.
    episode_step : int
        Steps taken in the current episode (0 right after :meth:`reset`).
    """

    def __init__(
        self,
        name: str,
        raw_env: Any,
        config: dict[str, Any],
        continuous_actions: bool,
        seed: int | None,
        shared_reward_cache: _SharedPredatorReward | None,
        fast: FastMPE | None,
    ) -> None:
        self.name = name
        self.config = config
        self.continuous_actions = continuous_actions
        self.episode_length = EPISODE_LENGTH
        self._raw = raw_env
        self._reward_cache = shared_reward_cache
        self._fast = fast
        self.agents: list[str] = list(raw_env.possible_agents)
        self.n_agents = len(self.agents)
        self.obs_dims = [int(raw_env.observation_space(a).shape[0]) for a in self.agents]
        if continuous_actions:
            self.action_dims = [int(raw_env.action_space(a).shape[0]) for a in self.agents]
        else:
            self.action_dims = [int(raw_env.action_space(a).n) for a in self.agents]
        self._seed = seed
        self._seed_used = False
        self.episode_step = 0
        self._needs_reset = True
        self._episode_return = np.zeros(self.n_agents, dtype=np.float64)
        self._action_rng = make_rng(None if seed is None else seed + 1)

    # ----------------------------------------------------------------------------- info
    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.config.items())
        return f"MPEEnv({self.name!r}, {sizes})"

    @property
    def needs_reset(self) -> bool:
        """True before the first :meth:`reset` and after an episode ended."""
        return self._needs_reset

    @property
    def n_trainers(self) -> int:
        """Trained agents: every agent, prey included (the paper trains N + M in predator-prey)."""
        return self.n_agents

    def specs(self) -> dict[str, AgentSpec]:
        """Buffer specs, keyed by agent name in agent order (for ``MultiAgentReplayBuffer``).

        Continuous actions are stored as ``(5,)`` float32; discrete ones one-hot as ``(5,)``
        float32 (the buffer's ``add`` also takes the integer index).
        """
        out: dict[str, AgentSpec] = {}
        for agent, obs_dim, action_dim in zip(self.agents, self.obs_dims, self.action_dims):
            if self.continuous_actions:
                out[agent] = AgentSpec(obs_shape=(obs_dim,), action_shape=(action_dim,))
            else:
                out[agent] = AgentSpec(
                    obs_shape=(obs_dim,),
                    action_shape=(action_dim,),
                    n_discrete_actions=action_dim,
                )
        return out

    @property
    def unwrapped(self) -> Any:
        """The mpe2 ``raw_env`` (an AEC ``SimpleEnv``) this wrapper drives."""
        return self._raw

    # ----------------------------------------------------------------------------- episode
    def reset(self, seed: int | None = None) -> list[np.ndarray]:
        """Start an episode; returns the observations (list of float32 arrays, agent order).

        Parameters
        ----------
        seed : int, optional
            Reseed the world's generator. By default the first reset uses the ``seed`` given to
            :func:`make` and later resets continue that generator, so a seeded env replays
            the same sequence of episodes.
        """
        if seed is None and not self._seed_used:
            seed = self._seed
        self._seed_used = True
        if seed is not None:
            _check_count("seed", seed, 0)
        self._raw.reset(seed=seed)
        if self._fast is not None:
            self._fast.invalidate()
        self.episode_step = 0
        self._needs_reset = False
        self._episode_return[:] = 0.0
        return self._observe()

    def step(self, actions: Any) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, dict[str, Any]]:
        """Advance every agent by one step.

        Parameters
        ----------
        actions : sequence of arrays or 2-D array
            Continuous: per agent a float32 array of shape ``(action_dim,)`` (e.g. a
            Gumbel-softmax sample), or one float32 array ``(n_agents, action_dim)``. Values are
            clipped to the action space ``[0, 1]`` as mpe2 does (without its warning); NaN/inf
            are rejected. Discrete: one integer in ``[0, action_dim)`` per agent.

        Returns
        -------
        obs : list of np.ndarray
            Next observations, float32, one per agent (after the last step of an episode: the
            final observations, to store as ``next_obs``).
        reward : np.ndarray
            ``(n_agents,)`` float64, mpe2's rewards (see :meth:`original_reward`).
        done : np.ndarray
            ``(n_agents,)`` bool, **terminations only** (what the original trainers store in
            the buffer; MPE never terminates by itself, so this is all False).
        info : dict
            ``"truncated"``: ``(n_agents,)`` bool, True for every agent at step 25;
            ``"episode_over"``: bool, True when the episode ended (terminated or truncated) —
            call :meth:`reset` before stepping again; ``"episode_step"``: int, 1..25.
            When the episode is over, also ``"episode_return"`` (``(n_agents,)`` float64, the
            sum of this episode's rewards) and ``"original_return"`` (the same in the
            original MPE's units, see :meth:`original_reward`).
        """
        if self._needs_reset:
            raise RuntimeError(
                "step() needs a running episode: call env.reset() first (the episode "
                f"{'has not started' if self.episode_step == 0 else 'is over'})"
            )
        per_agent = self._check_actions(actions)
        if self._reward_cache is not None:
            self._reward_cache.invalidate()
        raw = self._raw
        # AEC order: the world step runs inside the last agent's step (mpe2's own parallel
        # wrapper does the same, plus an extra observation per agent and per-step space checks)
        for action in per_agent:
            raw.step(action)
        self.episode_step += 1
        rewards = np.fromiter((raw.rewards[a] for a in self.agents), np.float64, self.n_agents)
        done = np.fromiter((raw.terminations[a] for a in self.agents), bool, self.n_agents)
        truncated = np.fromiter((raw.truncations[a] for a in self.agents), bool, self.n_agents)
        obs = self._observe()
        self._episode_return += rewards
        episode_over = bool(done.any() or truncated.any())
        info: dict[str, Any] = {
            "truncated": truncated,
            "episode_over": episode_over,
            "episode_step": self.episode_step,
        }
        if episode_over:
            self._needs_reset = True
            info["episode_return"] = self._episode_return.copy()
            info["original_return"] = self.original_reward(
                self._episode_return, steps=self.episode_step
            )
        return obs, rewards, done, info

    def _observe(self) -> list[np.ndarray]:
        if self._fast is not None:
            return self._fast.observations()
        return [self._raw.observe(a) for a in self.agents]

    def original_reward(self, reward: Any, steps: int = 1) -> np.ndarray:
        """Rewards in the units of the original MPE (openai/multiagent-particle-envs).

        Parameters
        ----------
        reward : array_like
            ``(n_agents,)``: one step's rewards from :meth:`step`, or their sum over ``steps``
            steps (an episode return).
        steps : int
            How many steps ``reward`` sums.

        Returns
        -------
        np.ndarray
            ``(n_agents,)`` float64. Cooperative navigation: every entry is the original
            shared reward ``2·Σᵢ rᵢ − N·steps`` (derivation in ``docs/envs.md``). Predator-prey:
            mpe2's rewards are already the original ones, returned as a copy.
        """
        values = np.asarray(reward, dtype=np.float64)
        if values.shape != (self.n_agents,):
            raise ValueError(f"reward must have shape ({self.n_agents},); got {values.shape}")
        steps = _check_count("steps", steps, 1)
        if self.name != "cooperative_navigation":
            return values.copy()
        shared = 2.0 * float(values.sum()) - self.n_agents * steps
        return np.full(self.n_agents, shared, dtype=np.float64)

    # ----------------------------------------------------------------------------- actions
    def random_actions(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """Uniform random actions: ``(n_agents, action_dim)`` float32 in [0, 1) (continuous)
        or ``(n_agents,)`` int64 (discrete). Uses the env's own seeded generator by default."""
        rng = self._action_rng if rng is None else rng
        if self.continuous_actions:
            return rng.random((self.n_agents, self.action_dims[0]), dtype=np.float32)
        return rng.integers(0, self.action_dims[0], size=self.n_agents)

    def _check_actions(self, actions: Any) -> list[Any]:
        if isinstance(actions, np.ndarray):
            if actions.ndim == 0 or actions.shape[0] != self.n_agents:
                raise ValueError(
                    f"actions must have one entry per agent ({self.n_agents}, in env.agents "
                    f"order); got an array of shape {actions.shape}"
                )
            if (
                self.continuous_actions
                and len(set(self.action_dims)) == 1
                and actions.dtype == np.float32
                and actions.shape == (self.n_agents, self.action_dims[0])
                and np.isfinite(actions).all()
            ):
                # the common case (a stacked policy's output), checked and clipped at once
                return list(np.clip(actions, np.float32(0.0), np.float32(1.0)))
            items: Sequence[Any] = list(actions)
        elif isinstance(actions, Sequence) and not isinstance(actions, (str, bytes)):
            if len(actions) != self.n_agents:
                raise ValueError(
                    f"actions must have one entry per agent ({self.n_agents}, in env.agents "
                    f"order); got {len(actions)}"
                )
            items = actions
        else:
            raise TypeError(
                "actions must be a list of per-agent arrays in env.agents order (or one 2-D "
                f"array); got {type(actions).__name__}"
            )
        if self.continuous_actions:
            return [self._check_continuous(i, a) for i, a in enumerate(items)]
        return [self._check_discrete(i, a) for i, a in enumerate(items)]

    def _check_continuous(self, index: int, action: Any) -> np.ndarray:
        agent = self.agents[index]
        if not isinstance(action, np.ndarray):
            raise TypeError(
                f"actions[{index}] ({agent}) must be a float32 numpy array of shape "
                f"({self.action_dims[index]},); got {type(action).__name__}"
            )
        if action.dtype != np.float32:
            raise TypeError(
                f"actions[{index}] ({agent}) must be float32 (MPE's Box action space); got "
                f"dtype {action.dtype}: convert with .astype(np.float32)"
            )
        if action.shape != (self.action_dims[index],):
            raise ValueError(
                f"actions[{index}] ({agent}) must have shape ({self.action_dims[index]},); "
                f"got {action.shape}"
            )
        if not np.isfinite(action).all():
            raise ValueError(f"actions[{index}] ({agent}) contains NaN or inf; got {action!r}")
        # mpe2's ClipOutOfBoundsWrapper clips to the Box [0, 1] too; a fresh array also keeps
        # the env from aliasing the caller's buffer
        return np.clip(action, np.float32(0.0), np.float32(1.0))

    def _check_discrete(self, index: int, action: Any) -> int:
        agent = self.agents[index]
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)):
            if isinstance(action, np.ndarray) and action.ndim == 0 and action.dtype.kind in "iu":
                action = action.item()
            else:
                raise TypeError(
                    f"actions[{index}] ({agent}) must be an int action index (discrete "
                    f"actions); got {action!r}"
                )
        if not 0 <= action < self.action_dims[index]:
            raise ValueError(
                f"actions[{index}] ({agent}) must be in [0, {self.action_dims[index]}); "
                f"got {action}"
            )
        return int(action)

    def close(self) -> None:
        """Release mpe2's resources."""
        self._raw.close()


def make(
    name: str,
    n_agents: int | None = None,
    *,
    n_predators: int | None = None,
    n_prey: int | None = None,
    n_landmarks: int | None = None,
    seed: int | None = None,
    continuous_actions: bool = True,
    fast: bool = True,
    shared_predator_reward: bool = True,
) -> MPEEnv:
    """Build one of the paper's MPE tasks.

    Parameters
    ----------
    name : {"cooperative_navigation", "predator_prey"}
        ``simple_spread`` (N agents, N landmarks, ``local_ratio=0.5``) or ``simple_tag``.
    n_agents : int
        Cooperative navigation: the number of agents N (default 3). Predator-prey: accepted as
        a synonym of ``n_predators``.
    n_predators, n_prey, n_landmarks : int, optional
        Predator-prey sizes; defaults are the paper's: 3 predators,
        ``M = max(1, N // 3)`` prey and ``L = max(2, N // 3)`` landmarks
        (:func:`marlbuf.workloads.predator_prey_sizes`).
    seed : int, optional
        Seed of the first :meth:`MPEEnv.reset` (later resets continue the same generator) and
        of :meth:`MPEEnv.random_actions`.
    continuous_actions : bool, default True
        Continuous ``Box(0, 1, (5,))`` action vectors, as MADDPG's Gumbel-softmax produces and
        the original trainers used; ``False`` for ``Discrete(5)``.
    fast : bool, default True
        Step the world, compute rewards and build observations on whole arrays
        (:mod:`marlbuf.envs._fast`) instead of mpe2's per-entity Python loops. Bit-identical
        to mpe2 (tested side by side); ``False`` runs mpe2's own code.
    shared_predator_reward : bool, default True
        With ``fast=False``: compute predator-prey's predator reward (the same for every
        predator) once per step instead of once per predator; bit-identical. ``fast=False,
        shared_predator_reward=False`` runs mpe2 unpatched.

    Examples
    --------
    >>> from marlbuf.envs import make
    >>> env = make("predator_prey", n_predators=3, seed=0)
    >>> env.agents, env.obs_dims
    (['adversary_0', 'adversary_1', 'adversary_2', 'agent_0'], [16, 16, 16, 14])
    """
    if name not in SCENARIOS:
        raise ValueError(f"name must be one of {sorted(SCENARIOS)}; got name={name!r}")
    if seed is not None:
        seed = _check_count("seed", seed, 0)
    for flag, value in (
        ("continuous_actions", continuous_actions),
        ("fast", fast),
        ("shared_predator_reward", shared_predator_reward),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool; got {flag}={value!r}")
    module = _import_mpe2_module(SCENARIOS[name])
    common = {"max_cycles": EPISODE_LENGTH, "continuous_actions": continuous_actions}
    cache: _SharedPredatorReward | None = None
    if name == "cooperative_navigation":
        if n_predators is not None or n_prey is not None or n_landmarks is not None:
            raise ValueError(
                "n_predators/n_prey/n_landmarks are predator-prey sizes; cooperative "
                "navigation takes n_agents (N agents and N landmarks)"
            )
        n = _check_count("n_agents", 3 if n_agents is None else n_agents, 1)
        raw = module.raw_env(N=n, local_ratio=LOCAL_RATIO, **common)
        config: dict[str, Any] = {"n_agents": n}
    else:
        if n_agents is not None and n_predators is not None and n_agents != n_predators:
            raise ValueError(
                "n_agents is a synonym of n_predators for predator-prey; got "
                f"n_agents={n_agents} and n_predators={n_predators}"
            )
        predators = n_predators if n_predators is not None else n_agents
        predators = _check_count("n_predators", 3 if predators is None else predators, 1)
        default_prey, default_landmarks = predator_prey_sizes(predators)
        prey = _check_count("n_prey", default_prey if n_prey is None else n_prey, 1)
        landmarks = _check_count(
            "n_landmarks", default_landmarks if n_landmarks is None else n_landmarks, 0
        )
        raw = module.raw_env(
            num_adversaries=predators, num_good=prey, num_obstacles=landmarks, **common
        )
        if shared_predator_reward and not fast:
            cache = _SharedPredatorReward(raw.scenario.adversary_reward)
            raw.scenario.adversary_reward = cache
        config = {"n_predators": predators, "n_prey": prey, "n_landmarks": landmarks}
    config.update(episode_length=EPISODE_LENGTH, continuous_actions=continuous_actions)
    accelerated = FastMPE(raw, name) if fast else None
    return MPEEnv(name, raw, config, continuous_actions, seed, cache, accelerated)
