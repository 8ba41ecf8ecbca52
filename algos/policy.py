"""Trained actors as policies: the actors of a ``marlbuf train`` checkpoint folder act in an
environment (for :func:`marlbuf.offline.record`, ``marlbuf record --policy FOLDER``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.offline.record import Policy


def checkpoint_policy(
    path: str | os.PathLike[str], explore: bool = False, seed: int | None = None
) -> Policy:
    """The actors of a ``marlbuf train`` checkpoint folder as a policy (needs torch).

    Trainer ``t``'s actor acts for the ``t``-th agent of the observation dict (the
    environment's agent order, as in training). Without ``explore`` an agent's action is the
    actor's softmax (continuous action spaces, as MPE's ``continuous_actions=True``); with
    ``explore``, a Gumbel-softmax sample, as the trainer explores. A discrete action space gets
    the index of the largest value.
    """
    import torch

    from marlbuf.algos.config import TrainConfig
    from marlbuf.algos.maddpg import make_learner
    from marlbuf.algos.nets import LAYERS

    folder = Path(path)
    meta_path = folder / "runner.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no marlbuf checkpoint at {str(folder)!r} (missing runner.json); pass the "
            "'checkpoint' folder that marlbuf train writes"
        )
    meta = json.loads(meta_path.read_text())
    config = TrainConfig.from_dict(meta["config"])
    state = torch.load(folder / "learner.pt", map_location="cpu", weights_only=True)
    from marlbuf.algos.runner import make_env

    env = make_env(config)
    try:
        obs_dims, action_dim = list(env.obs_dims), int(env.action_dims[0])
    finally:
        env.close()
    learner = make_learner(config, obs_dims, action_dim)
    learner.load_state_dict(state)
    actors = [
        [
            (p[f"actor.{layer}.W"].numpy().astype(np.float64), p[f"actor.{layer}.b"].numpy())
            for layer in LAYERS
        ]
        for p in learner.get_params()
    ]
    rng = np.random.default_rng(seed)

    def act(obs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if len(obs) != len(actors):
            raise ValueError(
                f"the checkpoint has {len(actors)} actors; got observations of {len(obs)} agents"
            )
        out = {}
        for (agent, o), layers in zip(obs.items(), actors):
            x = np.asarray(o, np.float64).reshape(-1)
            for k, (w, b) in enumerate(layers):
                x = x @ w + b
                if k < len(layers) - 1:
                    x = np.maximum(x, 0.0)
            if explore:
                x = x - np.log(-np.log(rng.uniform(size=x.shape)))
            e = np.exp(x - x.max())
            out[agent] = (e / e.sum()).astype(np.float32)
        return out

    return act


__all__ = ["checkpoint_policy"]
