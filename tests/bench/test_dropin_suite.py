"""The drop-in consumers: swapping marlbuf in leaves learning unchanged; the suite runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mpe2")

import torch

from marlbuf.bench import cli
from marlbuf.bench.baselines.consumers import joint, per_agent
from marlbuf.bench.baselines.consumers.mpe import env_dims, parallel_env
from marlbuf.bench.suites import dropin
from marlbuf.bench.tools import common

N_AGENTS = 3
CAPACITY = 400
SETTINGS = {"batch_size": 32, "update_every": 10, "warmup": 40, "seed": 3}
STEPS = 120  # 9 update rounds, 4 finished episodes


def _env():
    return parallel_env(N_AGENTS)


def _dims():
    _, obs_dims, act_dims = env_dims(_env())
    return obs_dims, act_dims


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


def test_consumers_store_mpe2_env_step_output_unmodified():
    """The loops hand the env's dicts to their write paths as env.step returned them (the
    rewards a defaultdict)."""
    from collections import defaultdict

    seen = []
    loop = joint.JointMADDPG(_env(), joint.JointReplayBuffer(CAPACITY, *_dims()), **SETTINGS)
    loop.store = lambda *step: seen.append(step)  # type: ignore[method-assign]
    loop.run_steps(3)
    obs, _, rewards, next_obs, dones = seen[0]
    assert type(rewards) is defaultdict and type(obs) is dict and set(obs) == set(loop.agents)
    assert all(type(v) is bool for v in dones.values())
    assert next_obs is seen[1][0]  # the next step's observations: the same dict


def test_per_agent_consumer_learns_the_same_with_marlbuf():
    obs_dims, _ = _dims()
    own = per_agent.PerAgentMADDPG(_env(), per_agent.own_buffers(CAPACITY, obs_dims, 5), **SETTINGS)
    own.run_steps(STEPS)
    swapped = per_agent.marlbuf_buffers(CAPACITY, obs_dims, 5)
    ours = per_agent.PerAgentMADDPG(_env(), _consumer_indices_per_agent(swapped), **SETTINGS)
    ours.run_steps(STEPS)
    _assert_same_run(own, ours)
    # the swap stored exactly what the consumer's buffers hold
    idx = np.arange(STEPS)
    for mine, theirs in zip(ours.buffers, own.buffers):
        for x, y in zip(mine.sample_index(idx), theirs.sample_index(idx)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(("batch_layout", "norm_rews"), [("per_agent", True), ("rows", False)])
def test_joint_consumer_learns_the_same_with_marlbuf(batch_layout, norm_rews):
    obs_dims, act_dims = _dims()
    own_buf = joint.JointReplayBuffer(CAPACITY, obs_dims, act_dims)
    own = joint.JointMADDPG(_env(), own_buf, norm_rews=norm_rews, **SETTINGS)
    own.run_steps(STEPS)
    swapped = _ConsumerIndicesJoint(CAPACITY, obs_dims, act_dims, batch_layout=batch_layout)
    ours = joint.JointMADDPG(_env(), swapped, norm_rews=norm_rews, **SETTINGS)
    ours.run_steps(STEPS)
    _assert_same_run(own, ours)


def test_the_qmix_consumer_learns_the_same_with_marlbuf():
    """EPyMARL's run loop (run, insert, sample, truncate, train) with the padded buffer and
    with the one-line swap: the same losses and parameters (runs one after the other: both
    draw from the global generators, as EPyMARL)."""
    from marlbuf.bench.baselines.consumers.epymarl import PaddedReplayBuffer, QMIXConfig, QMIXRun
    from marlbuf.compat.epymarl import ReplayBuffer

    config = QMIXConfig(batch_size=4, buffer_size=12, target_update_interval=5)
    losses = {}
    runs = {}
    for name, cls in (("own", PaddedReplayBuffer), ("marlbuf", ReplayBuffer)):
        run = QMIXRun(cls, 2, seed=1, mixed=(4, 25), config=config)
        losses[name] = []
        for _ in range(12):
            run.episode()
            if run.trains:
                losses[name].append(run.learner.last_loss)
        runs[name] = run
    assert runs["own"].trains == runs["marlbuf"].trains == 9
    assert losses["own"] == losses["marlbuf"]
    for x, y in zip(runs["own"].learner.parameters(), runs["marlbuf"].learner.parameters()):
        assert torch.equal(x, y)


TINY = {
    "agents": (2,),
    "capacity": 300,
    "batch_size": 32,
    "seeds": (0, 1, 2),
    "windows": 1,
    "write_agents": (2,),
    "write_steps": 20,
    "write_repeats": 1,
    "batch_agents": (2,),
    "batch_repeats": 1,
    "episode_agents": (2,),
    "episode_windows": 1,
    "episodes_per_window": 1,
    "episode_buffer_agents": (2,),
    "episode_buffer_size": 40,
    "episode_repeats": 1,
}


@pytest.mark.slow
def test_dropin_suite_runs_tiny(monkeypatch, tmp_path):
    monkeypatch.setattr(dropin, "QUICK", TINY)
    payload = dropin.run(quick=True)
    rows = payload["rows"]
    assert [(r["consumer"], r["case"]) for r in rows] == [
        ("per_agent", "own"),
        ("per_agent", "marlbuf"),
        ("joint", "own"),
        ("joint", "marlbuf"),
        ("joint", "marlbuf_per_agent_batches"),
        ("epymarl", "own"),
        ("epymarl", "marlbuf"),
    ]
    for row in rows:
        assert row["agents"] == 2 and row["seeds"] == 3
        assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
        assert row["verdict"] in ("faster", "slower", "within spread")
        assert row["window_s"] > 0 and row["buffer_s"] > 0 and row["update_s"] > 0
        assert row["own_buffer_s"] > 0 and np.isfinite(row["gain_vs_own_buffer"])
        if row["case"] == "own":
            assert row["ratio"] == 1 and row["batch_cost_s"] == 0
    assert "tuning option" in dropin.BUFFERS["marlbuf_per_agent_batches"]
    cases = {(r["actions"], r["case"]) for r in payload["write_rows"]}
    assert cases == {
        (actions, case)
        for actions in ("continuous", "discrete")
        for case in (
            "numpy_rows", "joint_push", "add_raw_env_step", "add_plain_dicts", "extend_one_step"
        )
    }  # fmt: skip
    assert {r["case"] for r in payload["batch_rows"]} == {
        "own", "rows", "per_agent", "rows+contiguous()"
    }  # fmt: skip
    layouts = {r["case"]: r["contiguous"] for r in payload["batch_rows"]}
    assert layouts == {"own": True, "rows": False, "per_agent": True, "rows+contiguous()": True}
    episode = payload["episode_rows"]
    assert {(r["lengths"], r["case"]) for r in episode} == {
        (lengths, case) for lengths in ("fixed", "mixed") for case in ("own", "marlbuf")
    }
    mixed = next(r for r in episode if r["lengths"] == "mixed" and r["case"] == "marlbuf")
    assert 0 < mixed["memory_vs_padded"] < 1
    checks = {(t["check"], t["workload"]) for t in payload["targets"]}
    assert ("whole run: marlbuf / own (lowest seed)", "epymarl N=2") in checks
    assert ("memory: marlbuf / padded", "EPyMARL buffer N=2, mixed lengths") in checks
    assert all(t["status"] in ("PASS", "FAIL") for t in payload["targets"])
    path = common.write_result("dropin", payload, quick=True, out_dir=tmp_path)
    record = json.loads(path.read_text())
    assert record["suite"] == "dropin" and record["config"]["batch_size"] == 32
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
    obs_dims, act_dims = _dims()
    # each loop seeds the global generators when built: build, run, then the next
    if consumer == "per_agent":
        own = per_agent.PerAgentMADDPG(
            _env(), per_agent.own_buffers(CAPACITY, obs_dims, 5), **settings
        )
        own.run_steps(STEPS)
        buffer = per_agent.device_buffer(CAPACITY, obs_dims, 5, "cpu")
        ours = _ConsumerIndicesDevice(_env(), buffer, **settings)
    else:
        own = joint.JointMADDPG(
            _env(), joint.JointReplayBuffer(CAPACITY, obs_dims, act_dims), **settings
        )
        own.run_steps(STEPS)
        swapped = _ConsumerIndicesJoint(CAPACITY, obs_dims, act_dims, device="cpu")
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


def test_docs_joint_buffer_snippet_matches_the_consumer_buffer():
    """docs/guides/maddpg.md's joint ReplayBuffer returns what the consumer's own buffer returns."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "maddpg.md").read_text()
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
