"""Random transition data for tests."""

from __future__ import annotations

import numpy as np


def random_step_data(specs, steps, rng):
    """``steps`` timesteps of random finite data for ``extend`` (leading time axis)."""
    return {
        "obs": {
            a: rng.standard_normal((steps, *s.obs_shape)).astype(s.obs_dtype)
            for a, s in specs.items()
        },
        "action": {a: random_actions(s, steps, rng) for a, s in specs.items()},
        "reward": {a: rng.standard_normal(steps).astype(np.float32) for a in specs},
        "next_obs": {
            a: rng.standard_normal((steps, *s.obs_shape)).astype(s.obs_dtype)
            for a, s in specs.items()
        },
        "done": {a: (rng.random(steps) < 0.2).astype(np.float32) for a in specs},
    }


def random_actions(spec, steps, rng):
    """``steps`` random actions of one agent: normal values, or for a discrete agent
    probabilities over its actions (a softmax, as a Gumbel-softmax policy gives)."""
    values = rng.standard_normal((steps, *spec.action_shape))
    if spec.n_discrete_actions:
        values = np.exp(values)
        values /= values.sum(axis=-1, keepdims=True)
    return values.astype(spec.action_dtype)


def step_slice(data, t):
    """Timestep ``t`` of ``random_step_data`` output, in ``add`` form."""
    return {f: {a: x[t] for a, x in per.items()} for f, per in data.items()}
