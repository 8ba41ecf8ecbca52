"""Shared fixtures: small multi-agent specs and random transitions."""

from __future__ import annotations

import numpy as np
import pytest

from marlbuf import AgentSpec


@pytest.fixture
def mixed_specs() -> dict[str, AgentSpec]:
    """Three agents of different sizes, one with 2-D observations and one discrete actor."""
    return {
        "pred_0": AgentSpec(obs_shape=(16,), action_shape=(5,)),
        "pred_1": AgentSpec(obs_shape=(2, 3), action_shape=(5,), obs_dtype=np.float64),
        "prey_0": AgentSpec(obs_shape=(14,), action_shape=(4,), n_discrete_actions=4),
    }
