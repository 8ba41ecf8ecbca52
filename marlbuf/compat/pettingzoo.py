"""Filling a :class:`~marlbuf.MultiAgentReplayBuffer` from a PettingZoo parallel environment.

``MultiAgentReplayBuffer.add`` takes the dicts ``env.step`` returns (``{agent: value}``)
directly, and :func:`marlbuf.specs_from_env` builds every agent's spec from
``env.observation_space(agent)`` / ``env.action_space(agent)``. This module adds the two things
a training loop still needs:

* :func:`buffer_from_env` — a buffer for every agent of an environment in one call;
* :func:`add_parallel_step` — one ``env.step`` into the buffer, with PettingZoo's episode-end
  rules made explicit: ``terminal=`` (required) says what the stored ``done`` is, and agents
  that have left the episode are either an error (default) or padded.

``terminal="terminated"`` stores ``done = termination``: a time-limit truncation is not a
terminal state, so critics keep bootstrapping through it (correct for time limits).
``terminal="terminated_or_truncated"`` stores ``done = termination or truncation``, which is
what code written as ``done = term or trunc`` stores; choose it to keep such a codebase's
learning targets unchanged when porting it. The two differ only on truncated steps (in MPE:
the last step of every episode).

MPE (``mpe2``) keeps every agent until the time limit: the last step's dicts hold all agents
with ``truncations`` all True, then ``env.agents`` is empty and the env must be reset. Stepping
after that returns empty dicts, which :func:`add_parallel_step` rejects.

Examples
--------
>>> from mpe2 import simple_spread_v3
>>> env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=True)
>>> buf = buffer_from_env(env, capacity=1000)
>>> obs, _ = env.reset(seed=0)
>>> while env.agents:
...     actions = {a: env.action_space(a).sample() for a in env.agents}
...     next_obs, rewards, terminations, truncations, _ = env.step(actions)
...     _ = add_parallel_step(
...         buf, obs, actions, rewards, next_obs, terminations, truncations, terminal="terminated"
...     )
...     obs = next_obs
>>> len(buf), buf.sample(4).obs["agent_0"].shape
(25, (4, 18))
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.spec import specs_from_env


def buffer_from_env(env: Any, capacity: int, **kwargs: Any) -> MultiAgentReplayBuffer:
    """A buffer with one spec per agent of ``env`` (``env.possible_agents`` order).

    ``kwargs`` go to :class:`~marlbuf.MultiAgentReplayBuffer` (``layout``, ``sampler``,
    ``seed``, ``n_trainers``).
    """
    return MultiAgentReplayBuffer(specs_from_env(env), capacity, **kwargs)


#: the accepted values of ``add_parallel_step(terminal=...)``
TERMINAL_CONVENTIONS = ("terminated", "terminated_or_truncated")


def _check_terminal(terminal: Any, truncation_is_done: Any) -> str:
    """The ``terminal`` convention, from ``terminal`` or the deprecated ``truncation_is_done``."""
    if truncation_is_done is not None:
        if not isinstance(truncation_is_done, (bool, np.bool_)):
            raise TypeError(
                f"truncation_is_done must be a bool; got truncation_is_done={truncation_is_done!r}"
            )
        implied = "terminated_or_truncated" if truncation_is_done else "terminated"
        if terminal is not None and terminal != implied:
            raise ValueError(
                f"terminal={terminal!r} contradicts truncation_is_done={truncation_is_done}; "
                "pass terminal= only"
            )
        warnings.warn(
            f"truncation_is_done is deprecated; pass terminal={implied!r} instead",
            DeprecationWarning,
            stacklevel=3,
        )
        return implied
    if terminal is None:
        raise TypeError(
            "add_parallel_step needs terminal=: 'terminated' stores done = termination (a "
            "time-limit truncation is not terminal, critics keep bootstrapping), "
            "'terminated_or_truncated' stores done = termination or truncation (what code "
            "written as done = term or trunc stores; keeps its learning targets unchanged)"
        )
    if terminal not in TERMINAL_CONVENTIONS:
        raise ValueError(f"terminal must be one of {TERMINAL_CONVENTIONS}; got {terminal!r}")
    return str(terminal)


def _check_dict(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be the dict env.step returns ({{agent: value}}); "
            f"got {type(value).__name__}"
        )
    return value


def add_parallel_step(
    buf: MultiAgentReplayBuffer,
    obs: Mapping[str, Any],
    actions: Mapping[str, Any],
    rewards: Mapping[str, Any],
    next_obs: Mapping[str, Any],
    terminations: Mapping[str, Any],
    truncations: Mapping[str, Any] | None = None,
    *,
    terminal: str | None = None,
    pad_missing: bool = False,
    truncation_is_done: bool | None = None,
    **fields: Any,
) -> list[str]:
    """Store one parallel-API step: ``obs`` before it, then ``env.step``'s outputs.

    Parameters
    ----------
    buf : MultiAgentReplayBuffer
    obs : dict
        Observations the actions were chosen from (the previous ``next_obs`` or ``reset``'s).
    actions, rewards, next_obs, terminations, truncations : dict
        ``actions`` as passed to ``env.step``; the others as it returned them.
    terminal : {"terminated", "terminated_or_truncated"}
        Required: what the stored ``done`` is. ``"terminated"``: ``done = termination`` (a
        time-limit truncation is not terminal; critics bootstrap through it).
        ``"terminated_or_truncated"``: ``done = termination or truncation`` (the convention of
        code written as ``done = term or trunc``; needs ``truncations``). Omitting it raises
        ``TypeError``: the choice changes the critic's targets on every truncated step.
    pad_missing : bool, default False
        An agent of the buffer that is absent from the step's dicts (it left the episode
        earlier) raises ``ValueError`` by default. With ``True`` it is stored as an absorbing
        transition: zero observation, action, reward and next observation, ``done = 1``.
        A buffer built with ``alive=True`` stores such an agent **absent** instead (every field
        zero-filled, alive False), without ``pad_missing``.
    **fields
        The buffer's extra and global fields, passed on to ``buf.add`` (extras keyed by agent;
        an absent agent's entries are dropped).
    truncation_is_done : bool, optional
        Deprecated spelling: ``True`` is ``terminal="terminated_or_truncated"``, ``False`` is
        ``terminal="terminated"`` (warns ``DeprecationWarning``).

    Returns
    -------
    list of str
        The agents that were padded (``pad_missing``) or stored absent (``alive=True``).
    """
    terminal = _check_terminal(terminal, truncation_is_done)
    or_truncated = terminal == "terminated_or_truncated"
    dicts = {
        "obs": _check_dict("obs", obs),
        "actions": _check_dict("actions", actions),
        "rewards": _check_dict("rewards", rewards),
        "next_obs": _check_dict("next_obs", next_obs),
        "terminations": _check_dict("terminations", terminations),
    }
    if truncations is not None:
        dicts["truncations"] = _check_dict("truncations", truncations)
    elif or_truncated:
        raise ValueError("terminal='terminated_or_truncated' needs the truncations dict; got None")
    agents = buf.agents
    missing = sorted({a for a in agents for d in dicts.values() if a not in d})
    truncated = _episode_truncated(terminations, truncations, missing)
    if missing and getattr(buf, "alive", False):
        # stored absent: every dict without those agents (the buffer zero-fills them)
        keep = [a for a in agents if a not in missing]
        unknown = sorted({a for d in dicts.values() for a in d if a not in buf.specs})
        if unknown:
            raise ValueError(f"agents {unknown} are not in the buffer (agents {agents})")
        dones = {
            a: bool(terminations[a])
            or (or_truncated and truncations is not None and bool(truncations[a]))
            for a in keep
        }
        buf.add(
            {a: obs[a] for a in keep},
            {a: actions[a] for a in keep},
            {a: rewards[a] for a in keep},
            {a: next_obs[a] for a in keep},
            dones,
            truncated=truncated,
            **{
                name: {a: v for a, v in value.items() if a in keep}
                if isinstance(value, Mapping)
                else value
                for name, value in fields.items()
            },
        )
        return missing
    if missing and not pad_missing:
        where = [n for n, d in dicts.items() if any(a not in d for a in missing)]
        raise ValueError(
            f"agents {missing} are missing from {where}. PettingZoo drops an agent from the "
            "step dicts after it terminates or is truncated (and returns empty dicts once the "
            "episode is over: reset the env when env.agents is empty). A joint buffer stores "
            "every agent each step: reset the env, or pass pad_missing=True to store absorbing "
            "transitions (zeros, done=1) for agents that left."
        )
    unknown = sorted({a for d in dicts.values() for a in d if a not in buf.specs})
    if unknown:
        raise ValueError(f"agents {unknown} are not in the buffer (agents {agents})")
    row: dict[str, dict[str, Any]] = {f: {} for f in ("obs", "action", "reward", "next_obs")}
    row["done"] = {}
    for agent in agents:
        spec = buf.specs[agent]
        if agent in missing:
            zeros_obs = np.zeros(spec.obs_shape, spec.obs_dtype)
            row["obs"][agent] = zeros_obs
            row["action"][agent] = np.zeros(spec.action_shape, spec.action_dtype)
            row["reward"][agent] = 0.0
            row["next_obs"][agent] = zeros_obs
            row["done"][agent] = 1.0
            continue
        done = bool(terminations[agent])
        if or_truncated and truncations is not None:
            done = done or bool(truncations[agent])
        row["obs"][agent] = obs[agent]
        row["action"][agent] = actions[agent]
        row["reward"][agent] = rewards[agent]
        row["next_obs"][agent] = next_obs[agent]
        row["done"][agent] = done
    buf.add(**row, truncated=truncated, **fields)
    return missing


def _episode_truncated(
    terminations: Mapping[str, Any], truncations: Mapping[str, Any] | None, missing: list[str]
) -> bool:
    """Whether this step ends the episode by truncation, for the buffer's episode bookkeeping
    (``add(truncated=...)``, which sequence sampling reads): every agent present in the step
    is terminated or truncated (none remains for the next step), and one is truncated. An
    episode whose present agents all terminate ends by the ``done`` flags instead."""
    if truncations is None:
        return False
    present = [a for a in terminations if a not in missing]
    if not present:
        return False
    gone = all(bool(terminations[a]) or bool(truncations.get(a, False)) for a in present)
    return gone and any(bool(truncations.get(a, False)) for a in present)


__all__ = ["TERMINAL_CONVENTIONS", "add_parallel_step", "buffer_from_env", "specs_from_env"]
