"""Recording PettingZoo parallel environments into a buffer or straight into a vault.

:func:`record` runs a policy in one environment, or in several side by side (each its own
stream), and stores every step: ``obs``, the policy's actions, rewards, the next observations,
``done`` (terminations) and truncations (where episodes end at a time limit), and optionally
the environment's global ``state()``. An episode ends when every agent is terminated or
truncated; the environment is then reset (the first reset of environment ``k`` is seeded
``seed + k``, later ones continue its generator).

Policies:

* ``"random"``: each agent's ``action_space(agent).sample()``, the spaces seeded from ``seed``;
* any callable taking one environment's observation dict ``{agent: obs}`` and returning its
  action dict ``{agent: action}``, such as the actors of a ``marlbuf train`` checkpoint
  folder (:func:`marlbuf.algos.checkpoint_policy`, extra ``[algos]``).

Into a buffer, K environments are written with ``add_envs`` (environment ``k`` is stream
``k``); into a vault they are its ``B = K`` streams, written a chunk at a time, with the true
``next_obs`` of every episode's last step kept in marlbuf's private arrays (so
:func:`marlbuf.offline.read_vault` gives back exactly what was recorded).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.offline.plan import ENTRY_FORMAT, ENTRY_VERSION, NEXT_OBS, NEXT_OBS_AT, buffer_leaves
from marlbuf.offline.progress import Progress
from marlbuf.offline.vault import LeafSpec, VaultWriter
from marlbuf.spec import AgentSpec, FieldSpec, specs_from_env

Policy = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]


def random_policy(env: Any, seed: int | None) -> Policy:
    """Uniform random actions from ``env``'s action spaces, seeded (one seed per agent)."""
    spaces = {a: env.action_space(a) for a in env.possible_agents}
    if seed is not None:
        for i, space in enumerate(spaces.values()):
            space.seed(int(np.random.SeedSequence([seed, i]).generate_state(1)[0]))

    def act(obs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {a: spaces[a].sample() for a in obs}

    return act


def _policy(policy: Any, env: Any, seed: int | None, index: int) -> Policy:
    if isinstance(policy, str) and policy == "random":
        return random_policy(env, None if seed is None else seed * 1_000 + index)
    if callable(policy):
        return policy
    if isinstance(policy, (str, os.PathLike)):
        raise TypeError(
            f"policy must be 'random' or a callable obs dict -> action dict; got "
            f"policy={policy!r}. For the actors of a marlbuf train checkpoint folder pass "
            "policy=marlbuf.algos.checkpoint_policy(folder) (extra [algos])"
        )
    raise TypeError(
        f"policy must be 'random' or a callable obs dict -> action dict; got policy={policy!r}"
    )


def _as_action(value: Any, spec: AgentSpec, agent: str) -> Any:
    """A policy's action for ``agent``: an index for a discrete spec, else an array."""
    if spec.n_discrete_actions:
        arr = np.asarray(value)
        if arr.shape == (spec.n_discrete_actions,) and arr.dtype.kind == "f":
            return int(np.argmax(arr))
        if arr.shape != () or arr.dtype.kind not in "iu":
            raise ValueError(
                f"the policy's action for {agent!r} must be an int in [0, "
                f"{spec.n_discrete_actions}); got {value!r}"
            )
        return np.int64(arr)
    return np.asarray(value, dtype=spec.action_dtype).reshape(spec.action_shape)


class _Envs:
    """K environments stepped in lockstep, each reset when its episode ends."""

    def __init__(self, envs: Sequence[Any], agents: list[str], seed: int | None) -> None:
        self.envs = list(envs)
        self.agents = agents
        self.spaces = {a: self.envs[0].action_space(a) for a in agents}
        self.obs = []
        for k, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + k)
            self.obs.append(self._check(obs, "reset"))

    def _check(self, values: Mapping[str, Any], what: str) -> dict[str, Any]:
        missing = [a for a in self.agents if a not in values]
        if missing:
            raise ValueError(
                f"the environment's {what} holds no value for {missing}: the recorder needs "
                "every agent at every step (agents that leave an episode early are not "
                "recorded; use a buffer with alive=True and your own loop)"
            )
        return {a: values[a] for a in self.agents}

    def step(self, k: int, actions: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        env = self.envs[k]
        for agent, action in actions.items():
            if not self.spaces[agent].contains(action):
                raise ValueError(
                    f"the policy's action for {agent!r} is not in its action space "
                    f"{self.spaces[agent]}; got {action!r}"
                )
        next_obs, rewards, terminations, truncations, _ = env.step(dict(actions))
        next_obs = self._check(next_obs, "step observations")
        rewards = self._check(rewards, "rewards")
        terminations = self._check(terminations, "terminations")
        truncations = self._check(truncations, "truncations")
        over = all(bool(terminations[a]) or bool(truncations[a]) for a in self.agents)
        if over or not env.agents:
            obs, _ = env.reset()
            self.obs[k] = self._check(obs, "reset")
        else:
            self.obs[k] = next_obs
        return next_obs, rewards, terminations, truncations


def record(
    env: Any,
    steps: int,
    policy: str | os.PathLike[str] | Policy = "random",
    *,
    buffer: MultiAgentReplayBuffer | None = None,
    vault: str | os.PathLike[str] | None = None,
    seed: int | None = None,
    state: bool = False,
    progress: bool | Callable[[int, int], Any] = False,
    metadata: Mapping[str, Any] | None = None,
) -> MultiAgentReplayBuffer | Path:
    """Run ``policy`` in ``env`` for ``steps`` steps and record them.

    Parameters
    ----------
    env : PettingZoo ParallelEnv, or a sequence of them
        Several environments are recorded side by side, as separate streams (build them with
        the same arguments: every one needs the same agents and spaces).
    steps : int
        Steps per environment (K environments record K * steps).
    policy : "random", path or callable
        See the module docstring; a callable is called once per environment and step with that
        environment's observation dict.
    buffer : MultiAgentReplayBuffer, optional
        Record into this buffer (its specs must fit the environment).
    vault : str or path-like, optional
        Record straight into a new vault at this folder (``<base>/<name>/<uid>``) instead.
        Without ``buffer`` and ``vault``, a new buffer of ``K * steps`` steps is returned.
    seed : int, optional
        Seeds the environments' first resets (``seed + k``) and the random policy.
    state : bool
        Also record ``env.state()`` before each step as the global field ``state`` (OG-MARL's
        ``infos.state``).
    progress : bool or callable
        As for :func:`marlbuf.offline.read_vault`.
    metadata : mapping, optional
        Further keys of the vault's ``metadata.json``.

    Returns
    -------
    MultiAgentReplayBuffer or Path
        The buffer, or the vault's folder.
    """
    envs = list(env) if isinstance(env, (list, tuple)) else [env]
    if not envs:
        raise ValueError("env must be an environment or a non-empty sequence of them")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive int; got steps={steps!r}")
    if buffer is not None and vault is not None:
        raise ValueError("record into a buffer or into a vault, not both")
    specs = specs_from_env(envs[0])
    for k, other in enumerate(envs[1:], 1):
        if specs_from_env(other) != specs:
            raise ValueError(f"env[{k}] has other agents or spaces than env[0]")
    agents = list(specs)
    if state and not callable(getattr(envs[0], "state", None)):
        raise ValueError("state=True needs an environment with a state() method")
    policies = [_policy(policy, e, seed, k) for k, e in enumerate(envs)]
    runner = _Envs(envs, agents, seed)
    global_fields: dict[str, FieldSpec] = {}
    if state:
        s = np.asarray(envs[0].state())
        global_fields["state"] = FieldSpec(s.shape, s.dtype if s.dtype.kind == "f" else np.float32)
    shown = Progress(progress, steps * len(envs), "record")
    try:
        if vault is not None:
            return _record_vault(
                runner, policies, specs, global_fields, int(steps), Path(vault), metadata, shown
            )
        if buffer is None:
            buffer = MultiAgentReplayBuffer(
                specs, len(envs) * int(steps), global_fields=global_fields, seed=seed
            )
        _record_buffer(runner, policies, buffer, int(steps), state, shown)
        return buffer
    finally:
        shown.close()


def _step_all(
    runner: _Envs, policies: Sequence[Policy], specs: Mapping[str, AgentSpec], state: bool
) -> list[dict[str, Any]]:
    """One step of every environment: per environment, what a buffer stores of it."""
    out = []
    for k, act in enumerate(policies):
        obs = runner.obs[k]
        global_state = np.asarray(runner.envs[k].state()) if state else None
        chosen = act(obs)
        actions = {a: _as_action(chosen[a], specs[a], a) for a in runner.agents}
        next_obs, rewards, terminations, truncations = runner.step(k, actions)
        out.append(
            {
                "obs": obs,
                "action": actions,
                "reward": rewards,
                "next_obs": next_obs,
                "done": terminations,
                "truncated": truncations,
                "state": global_state,
            }
        )
    return out


def _truncated(row: Mapping[str, Any], agents: list[str]) -> bool:
    """Whether the step ends its episode without every agent terminated: every agent is
    terminated or truncated, not all terminated."""
    done = [bool(row["done"][a]) for a in agents]
    over = all(d or bool(row["truncated"][a]) for d, a in zip(done, agents))
    return over and not all(done)


def _record_buffer(
    runner: _Envs,
    policies: Sequence[Policy],
    buffer: MultiAgentReplayBuffer,
    steps: int,
    state: bool,
    shown: Progress,
) -> None:
    agents = runner.agents
    for _ in range(steps):
        rows = _step_all(runner, policies, buffer.specs, state)
        fields: dict[str, Any] = {
            name: {a: np.stack([np.asarray(r[name][a]) for r in rows]) for a in agents}
            for name in ("obs", "action", "reward", "next_obs", "done")
        }
        fields["truncated"] = np.array([_truncated(r, agents) for r in rows])
        if state:
            fields["state"] = np.stack([r["state"] for r in rows])
        buffer.add_envs(**fields)
        shown.update(len(rows))


def _record_vault(
    runner: _Envs,
    policies: Sequence[Policy],
    specs: dict[str, AgentSpec],
    global_fields: dict[str, FieldSpec],
    steps: int,
    path: Path,
    metadata: Mapping[str, Any] | None,
    shown: Progress,
) -> Path:
    agents = runner.agents
    streams = len(runner.envs)
    action_index = all(s.n_discrete_actions for s in specs.values())
    layout = buffer_leaves(specs, global_fields, False, action_index)
    _, obs_spec, obs_packing = layout["observations"]
    assert obs_packing is not None
    private = {
        NEXT_OBS: LeafSpec(obs_spec.step_shape, obs_spec.dtype),
        NEXT_OBS_AT: LeafSpec((2,), np.dtype(np.int64)),
    }
    entry = {
        "format": ENTRY_FORMAT,
        "version": ENTRY_VERSION,
        "agents": agents,
        "specs": {a: s.to_dict() for a, s in specs.items()},
        "global_fields": {n: f.to_dict() for n, f in global_fields.items()},
        "alive": False,
        "action_index": action_index,
        "next_obs": "once",
        "capacity": steps * streams,
        "layout": "interleaved",
        "fields": {k: role for k, (role, _, _) in layout.items()},
        "private": list(private),
    }
    writer = VaultWriter(
        path,
        {k: spec for k, (_, spec, _) in layout.items()},
        streams,
        {"marlbuf": entry, **dict(metadata or {})},
        private=private,
    )
    chunk = writer.chunk_steps
    staged = {
        k: np.zeros((streams, chunk, *spec.step_shape), spec.dtype)
        for k, (_, spec, _) in layout.items()
    }
    pending_next: list[np.ndarray] = []  # (streams, *obs step shape) per staged step
    filled = 0
    try:
        for t in range(steps):
            rows = _step_all(runner, policies, specs, bool(global_fields))
            for b, row in enumerate(rows):
                _stage(layout, staged, b, filled, row, agents, action_index)
            nxt = np.empty((streams, *obs_spec.step_shape), obs_spec.dtype)
            for b, row in enumerate(rows):
                values = [np.asarray(row["next_obs"][a])[None] for a in agents]
                obs_packing.pack(values, nxt[b : b + 1])
            pending_next.append(nxt)
            filled += 1
            shown.update(streams)
            if filled == chunk and t + 1 < steps:
                # the next_obs of the chunk's last step is compared with the following obs,
                # which the environments hold now
                start = t + 1 - filled
                _flush(writer, staged, pending_next, filled, start, runner, agents, obs_packing)
                staged = {k: np.zeros_like(v) for k, v in staged.items()}  # in flight
                filled, pending_next = 0, []
        start = steps - filled
        _flush(writer, staged, pending_next, filled, start, runner, agents, obs_packing, last=True)
    finally:
        writer.close()  # every appended step is committed, even after an error
    return writer.path


def _stage(
    layout: Mapping[str, Any],
    staged: Mapping[str, np.ndarray],
    b: int,
    t: int,
    row: Mapping[str, Any],
    agents: list[str],
    action_index: bool,
) -> None:
    for key, (role, _, packing) in layout.items():
        out = staged[key][b, t : t + 1]
        if role == "truncated":
            out[...] = float(_truncated(row, agents))
        elif role == "action" and action_index:
            out[0] = [row["action"][a] for a in agents]
        elif role in ("obs", "action", "reward", "done"):
            packing.pack([np.asarray(row[role][a])[None] for a in agents], out)
        else:  # the global state
            out[0] = row["state"]


def _flush(
    writer: VaultWriter,
    staged: Mapping[str, np.ndarray],
    pending_next: list[np.ndarray],
    filled: int,
    t0: int,
    runner: _Envs,
    agents: list[str],
    obs_packing: Any,
    last: bool = False,
) -> None:
    """Append the ``filled`` staged steps (steps ``t0 ...``) and, in marlbuf's private arrays,
    every ``next_obs`` among them that is not the following step's ``obs``."""
    if not filled:
        return
    obs = staged["observations"][:, :filled]
    following = np.empty_like(obs)
    following[:, :-1] = obs[:, 1:]
    if last:
        following[:, -1] = obs[:, -1]  # nothing follows: the true next_obs is always kept
    else:  # the next chunk's first obs: the environments' current observations
        for b in range(len(runner.envs)):
            current = [np.asarray(runner.obs[b][a])[None] for a in agents]
            obs_packing.pack(current, following[b, -1:])
    nxt = np.stack(pending_next, axis=1)  # (streams, filled, ...)
    streams = nxt.shape[0]
    # compared as stored bytes, as the buffer links next observations
    same = nxt.reshape(streams, filled, -1).view(np.uint8) == following.reshape(
        streams, filled, -1
    ).view(np.uint8)
    differs = ~same.all(axis=2)
    if last:
        differs[:, -1] = True
    steps_at, streams_at = np.nonzero(differs.T)  # ordered by step, then stream
    writer.append(
        {k: v[:, :filled] for k, v in staged.items()},
        {
            NEXT_OBS: nxt[streams_at, steps_at],
            NEXT_OBS_AT: np.stack([streams_at, steps_at + t0], axis=1).astype(np.int64),
        },
    )


__all__ = ["random_policy", "record"]
