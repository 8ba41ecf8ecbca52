"""Shared fixtures: small multi-agent specs and random transitions."""

from __future__ import annotations

from typing import Any

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


@pytest.fixture(params=["numpy", "torch-cpu", pytest.param("torch-cuda", marks=pytest.mark.cuda)])
def store(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Constructor keywords that put a buffer's rows on a store: ``{}`` (NumPy arrays),
    ``{"device": "cpu"}`` or ``{"device": "cuda"}`` (the torch store; skipped without torch or
    a GPU). A test that takes it runs once per store."""
    if request.param == "numpy":
        return {}
    torch = pytest.importorskip("torch")
    device = request.param.split("-")[1]
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch.cuda.is_available())")
    return {"device": device}
