"""The drop-in consumers: swapping marlbuf in leaves learning unchanged; the suite runs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mpe2")

import torch

from marlbuf.bench.consumers import joint, per_agent
from marlbuf.envs import make

N_AGENTS = 3
CAPACITY = 400
SETTINGS = {"batch_size": 32, "update_every": 10, "warmup": 64, "seed": 3}
STEPS = 160  # 16 update rounds, 6 finished episodes


def _env():
    return make("cooperative_navigation", N_AGENTS, seed=5)


def _consumer_indices_per_agent(buffers):
    """marlbuf's per-agent adapters drawing the consumer's own indices (global np.random)."""
    for buf in buffers:
        buf.make_index = lambda b, buf=buf: np.random.choice(len(buf), b, replace=False)  # noqa: NPY002
    return buffers


class _ConsumerIndicesJoint(joint.MarlbufJointBuffer):
    """marlbuf's joint buffer gathering the consumer's own indices."""

    def draw(self, n):
        idx = np.random.choice(np.arange(len(self)), size=n, replace=False)  # noqa: NPY002
        return self.buffer.gather(idx)


def _assert_same_run(a, b):
    assert a.updates == b.updates >= 8
    assert a.episode_returns == b.episode_returns and len(a.episode_returns) >= 5
    pa, pb = a.parameters(), b.parameters()
    assert len(pa) == len(pb)
    for x, y in zip(pa, pb):
        assert torch.equal(x, y)  # bit-identical


def test_per_agent_consumer_learns_the_same_with_marlbuf():
    env = _env()
    own = per_agent.PerAgentMADDPG(
        env, per_agent.own_buffers(CAPACITY, env.obs_dims, 5), **SETTINGS
    )
    own.run_steps(STEPS)
    env = _env()
    swapped = per_agent.marlbuf_buffers(CAPACITY, env.obs_dims, 5)
    ours = per_agent.PerAgentMADDPG(env, _consumer_indices_per_agent(swapped), **SETTINGS)
    ours.run_steps(STEPS)
    _assert_same_run(own, ours)
    # the swap stored exactly what the consumer's buffers hold
    idx = np.arange(STEPS)
    for mine, theirs in zip(ours.buffers, own.buffers):
        for x, y in zip(mine.sample_index(idx), theirs.sample_index(idx)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("batch_layout", ["per_agent", "rows"])
@pytest.mark.parametrize("norm_rews", [True, False])
def test_joint_consumer_learns_the_same_with_marlbuf(batch_layout, norm_rews):
    env = _env()
    own_buf = joint.JointReplayBuffer(CAPACITY, env.obs_dims, env.action_dims)
    own = joint.JointMADDPG(env, own_buf, norm_rews=norm_rews, **SETTINGS)
    own.run_steps(STEPS)
    env = _env()
    swapped = _ConsumerIndicesJoint(CAPACITY, env.obs_dims, env.action_dims, batch_layout)
    ours = joint.JointMADDPG(env, swapped, norm_rews=norm_rews, **SETTINGS)
    ours.run_steps(STEPS)
    _assert_same_run(own, ours)
