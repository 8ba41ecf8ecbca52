"""The drop-in consumers: swapping marlbuf in leaves learning unchanged; the suite runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mpe2")

import torch

from marlbuf.bench import cli, common, dropin
from marlbuf.bench.consumers import joint, per_agent
from marlbuf.envs import make

N_AGENTS = 3
CAPACITY = 400
SETTINGS = {"batch_size": 32, "update_every": 10, "warmup": 40, "seed": 3}
STEPS = 120  # 9 update rounds, 4 finished episodes


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
    assert a.updates == b.updates == 9
    assert a.episode_returns == b.episode_returns and len(a.episode_returns) == 4
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


@pytest.mark.parametrize(("batch_layout", "norm_rews"), [("per_agent", True), ("rows", False)])
def test_joint_consumer_learns_the_same_with_marlbuf(batch_layout, norm_rews):
    env = _env()
    own_buf = joint.JointReplayBuffer(CAPACITY, env.obs_dims, env.action_dims)
    own = joint.JointMADDPG(env, own_buf, norm_rews=norm_rews, **SETTINGS)
    own.run_steps(STEPS)
    env = _env()
    swapped = _ConsumerIndicesJoint(
        CAPACITY, env.obs_dims, env.action_dims, batch_layout=batch_layout
    )
    ours = joint.JointMADDPG(env, swapped, norm_rews=norm_rews, **SETTINGS)
    ours.run_steps(STEPS)
    _assert_same_run(own, ours)


def test_dropin_suite_runs_tiny(monkeypatch, tmp_path):
    tiny = {"agents": (2,), "capacity": 300, "batch_size": 32, "repeats": 1}
    tiny.update(write_agents=(2,), write_steps=30, write_repeats=1)
    monkeypatch.setattr(dropin, "QUICK", tiny)
    payload = dropin.run(quick=True)
    rows = payload["rows"]
    kinds = ("streams", "independent")
    assert [(r["consumer"], r["kind"], r["case"]) for r in rows] == [
        *[("per_agent", kind, case) for kind in kinds for case in ("own", "marlbuf")],
        *[
            ("joint", kind, case)
            for kind in kinds
            for case in ("own", "marlbuf", "marlbuf_per_agent_batches")
        ],
    ]
    for row in rows:
        assert row["agents"] == 2 and row["capacity"] == 300
        assert row["buffer"] == dropin.BUFFERS[row["case"]]
        for metric in ("write_us", "sample_ms", "update_ms", "per100_s"):
            assert row[metric] > 0
        assert {"ratio_write", "ratio_sample", "ratio_update", "ratio_per100"} <= set(row)
        assert row["sample_speedup"] > 0 and row["own_buffer_s"] > 0
        assert 0 < row["own_buffer_share"] and np.isfinite(row["gain_vs_own_buffer"])
    assert "tuning option" in dropin.BUFFERS["marlbuf_per_agent_batches"]
    assert [(r["kind"], r["case"]) for r in payload["write_rows"]] == [
        (kind, case) for kind in kinds for case in ("numpy_rows", "marlbuf_add")
    ]
    assert payload["write_rows"][0]["ratio_vs_numpy_rows"] == 1.0
    expected = {
        f"{consumer}/{case}/{kind}/N=2"
        for kind in kinds
        for consumer, case in (
            ("per_agent", "marlbuf"),
            ("joint", "marlbuf"),
            ("joint", "marlbuf_per_agent_batches"),
        )
    }
    expected |= {f"write_add_vs_numpy_rows/{kind}/N=2" for kind in kinds}
    assert set(payload["summary"]) == expected | {"targets_missed"}
    assert set(dropin.METRICS) <= set(payload["summary"]["joint/marlbuf/streams/N=2"])
    # targets only for the default cases; the sampling-call target applies at 12 and 24 agents
    assert {(t["workload"], t["kind"]) for t in payload["targets"]} == {
        (f"{consumer} N=2", kind) for consumer in ("per_agent", "joint") for kind in kinds
    }
    assert all(t["status"] in ("PASS", "FAIL") for t in payload["targets"])
    path = common.write_result("dropin", payload, quick=True, out_dir=tmp_path)
    assert path.name == "dropin-quick.json"
    record = json.loads(path.read_text())
    assert record["suite"] == "dropin" and record["config"]["batch_size"] == 32
    assert "dropin" in cli.SUITES
    report = cli.write_report(tmp_path, quick=True).read_text()
    assert "## dropin" in report and "marlbuf_per_agent_batches" in report
    assert "numpy_rows" in report and ("PASS" in report or "FAIL" in report)


class _ConsumerIndicesDevice(per_agent.DeviceBufferMADDPG):
    """The device swap of the per-agent loop gathering the consumer's own indices."""

    def sample(self, i):
        idx = np.random.choice(len(self.buffer), self.batch_size, replace=False)  # noqa: NPY002
        obs_n, act_n, rew_n, next_obs_n, done_n = self.buffer.gather(idx).as_lists()
        return obs_n, act_n, next_obs_n, rew_n[i], done_n[i]


@pytest.mark.parametrize("consumer", ["per_agent", "joint"])
def test_consumers_with_a_device_buffer_learn_the_same(consumer):
    # the device swaps on device="cpu" (the code a GPU runs): the same data, the same learning
    settings = {**SETTINGS, "device": "cpu"}
    env = _env()  # each loop seeds the global generators when built: build, run, then the next
    if consumer == "per_agent":
        own = per_agent.PerAgentMADDPG(
            env, per_agent.own_buffers(CAPACITY, env.obs_dims, 5), **settings
        )
        own.run_steps(STEPS)
        buffer = per_agent.device_buffer(CAPACITY, env.obs_dims, 5, "cpu")
        ours = _ConsumerIndicesDevice(_env(), buffer, **settings)
    else:
        own = joint.JointMADDPG(
            env, joint.JointReplayBuffer(CAPACITY, env.obs_dims, env.action_dims), **settings
        )
        own.run_steps(STEPS)
        swapped = _ConsumerIndicesJoint(CAPACITY, env.obs_dims, env.action_dims, device="cpu")
        ours = joint.JointMADDPG(_env(), swapped, **settings)
    ours.run_steps(STEPS)
    _assert_same_run(own, ours)


def test_dropin_on_a_device_runs_tiny(monkeypatch):
    # the device run's code on the CPU; on "cuda" without CUDA every case is not measured
    tiny = {"agents": (2,), "capacity": 300, "batch_size": 32, "repeats": 1, "kind": "streams"}
    monkeypatch.setattr(dropin, "DEVICE_QUICK", tiny)
    payload = dropin.run(quick=True, device="cpu")
    rows = payload["rows"]
    assert [(r["consumer"], r["case"]) for r in rows] == [
        (consumer, case) for consumer in ("per_agent", "joint") for case in dropin.DEVICE_BUFFERS
    ]
    for row in rows:
        assert row["status"] == "measured" and row["per100_s"] > 0 and row["update_ms"] > 0
        assert row["speedup_per100"] > 0 and row["device"] == "cpu"
    assert set(payload["summary"]) >= {"per_agent/N=2", "joint/N=2", "targets_missed"}
    # targets at 3, 12 and 24 agents: not in this run
    assert len(payload["targets"]) == 2 * len(dropin.DEVICE_TARGETS)
    assert all(t["status"] == "not measured" for t in payload["targets"])
    assert "not a GPU figure" in payload["config"]["gpu"]
    json.dumps(payload, default=common._json_default)
    if not torch.cuda.is_available():
        payload = dropin.run(quick=True, device="cuda")
        assert all(r["status"].startswith("not measured: no CUDA") for r in payload["rows"])
        assert all("no CUDA" in t["note"] for t in payload["targets"])
    with pytest.raises(ValueError, match="device must be"):
        dropin.run(quick=True, device="tpu")


def test_write_path_streams_link_next_obs_to_the_following_obs():
    transitions = dropin.env_transitions([4, 4], 60, seed=0, kind="streams")
    for t, (_, _, _, nxt, _) in enumerate(transitions[:-1]):
        follows = all(np.array_equal(a, b) for a, b in zip(nxt, transitions[t + 1][0]))
        assert follows == bool((t + 1) % dropin.EPISODE_STEPS)
    independent = dropin.env_transitions([4, 4], 10, seed=0, kind="independent")
    assert not any(np.array_equal(independent[t][3][0], independent[t + 1][0][0]) for t in range(9))


def test_docs_joint_buffer_snippet_matches_the_consumer_buffer():
    """docs/guides/maddpg.md's joint ReplayBuffer returns what the consumer's own buffer returns."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "maddpg.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    snippet = next(b for b in blocks if "class ReplayBuffer" in b)
    namespace: dict = {}
    exec(compile(snippet, "docs/guides/maddpg.md", "exec"), namespace)
    obs_dims, act_dims, steps = [6, 4, 5], [2, 3, 2], 50
    docs_buf = namespace["ReplayBuffer"](100, obs_dims, act_dims)
    own = joint.JointReplayBuffer(100, obs_dims, act_dims)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        step = (
            [rng.random(d, np.float32) for d in obs_dims],
            [rng.random(d, np.float32) for d in act_dims],
            list(rng.standard_normal(3)),
            [rng.random(d, np.float32) for d in obs_dims],
            [False, True, False],
        )
        docs_buf.push(*step)
        own.push(*step)
    assert len(docs_buf) == len(own) == steps
    np.random.seed(7)  # noqa: NPY002
    idx = np.random.choice(np.arange(steps), size=16, replace=False)  # noqa: NPY002
    docs_buf.buffer.sample = lambda b: docs_buf.buffer.gather(idx)  # the consumer's indices
    np.random.seed(7)  # noqa: NPY002
    expected = own.sample(16)
    got = docs_buf.sample(16)
    for field_got, field_expected in zip(got, expected):
        for x, y in zip(field_got, field_expected, strict=True):
            assert x.is_contiguous() and x.dtype == torch.float32
            assert torch.equal(x, y)
