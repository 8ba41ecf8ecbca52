"""The PettingZoo recorder (``marlbuf.offline.record``, ``marlbuf record``) and the offline
example at a tiny size."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from marlbuf import MultiAgentReplayBuffer
from marlbuf.samplers import Episodes

simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
pytest.importorskip("tensorstore")

from marlbuf.offline import read_vault, record, vault_info  # noqa: E402

ROOT = Path(__file__).parents[2]


def make(continuous: bool = False):
    return simple_spread.parallel_env(N=3, max_cycles=25, continuous_actions=continuous)


def turning_policy(obs):
    """A deterministic policy of the observations: move along the larger landmark offset."""
    return {a: int(np.argmax(np.abs(o[4:6]))) + 1 for a, o in obs.items()}


def test_recorded_streams_equal_a_hand_written_loop():
    steps, seed = 70, 3
    buf = record([make(), make()], steps, turning_policy, seed=seed, state=True)
    # the same run, written by hand: each environment its own stream, in lockstep
    envs = [make(), make()]
    agents = envs[0].possible_agents
    ref = MultiAgentReplayBuffer(buf.specs, 2 * steps, global_fields=buf.global_fields)
    obs = [env.reset(seed=seed + k)[0] for k, env in enumerate(envs)]
    for _ in range(steps):
        for k, env in enumerate(envs):
            state = env.state()
            actions = turning_policy(obs[k])
            nxt, rew, term, trunc, _ = env.step(actions)
            over = all(term[a] or trunc[a] for a in agents)
            ref.add(
                obs[k],
                actions,
                rew,
                nxt,
                term,
                stream=k,
                truncated=over and not all(term.values()),
                state=state,
            )
            obs[k] = env.reset()[0] if over else nxt
    idx = np.arange(2 * steps)
    a, b = buf.gather(idx), ref.gather(idx)
    for field in ("obs", "action", "reward", "next_obs", "done"):
        for agent in agents:
            np.testing.assert_array_equal(getattr(a, field)[agent], getattr(b, field)[agent])
    np.testing.assert_array_equal(a.state, b.state)


def test_recording_into_a_vault_reads_back_as_recorded(tmp_path):
    steps = 60
    buf = record([make(), make()], steps, "random", seed=0, state=True)
    path = record(
        [make(), make()], steps, "random", seed=0, state=True, vault=tmp_path / "ss.vlt" / "r"
    )
    info = vault_info(path)
    assert info.streams == 2 and info.steps == steps
    assert info.leaves["actions"].dtype == np.int32 and "infos.state" in info.leaves
    back = read_vault(path, sampler=Episodes(), seed=0)
    for k in range(2):  # buffer: steps interleaved by environment; vault: stream k in turn
        a = buf.gather(np.arange(k, 2 * steps, 2))
        b = back.gather(np.arange(k * steps, (k + 1) * steps))
        for field in ("obs", "action", "reward", "next_obs", "done"):  # true final obs kept
            for agent in buf.agents:
                np.testing.assert_array_equal(getattr(a, field)[agent], getattr(b, field)[agent])
        np.testing.assert_array_equal(a.state, b.state)
    assert back.complete_episodes == 4  # two 25-step episodes per stream; 10 steps still open


def test_random_recording_is_reproducible_and_seeds_matter():
    a = record(make(), 30, seed=1)
    b = record(make(), 30, seed=1)
    c = record(make(), 30, seed=2)
    for agent in a.agents:
        np.testing.assert_array_equal(a.stored("action")[agent], b.stored("action")[agent])
        np.testing.assert_array_equal(a.stored("obs")[agent], b.stored("obs")[agent])
    assert not np.array_equal(a.stored("obs")["agent_0"], c.stored("obs")["agent_0"])


def test_recorder_refuses_what_it_cannot_record(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        record(make(), 0)
    with pytest.raises(ValueError, match="not both"):
        record(
            make(),
            5,
            buffer=MultiAgentReplayBuffer(record(make(), 1).specs, 10),
            vault=tmp_path / "v",
        )
    with pytest.raises(TypeError, match="policy"):
        record(make(), 5, policy=3)
    with pytest.raises(ValueError, match="other agents"):
        record([make(), simple_spread.parallel_env(N=2, max_cycles=25)], 5)

    def bad_policy(obs):
        return {a: 7 for a in obs}

    with pytest.raises(ValueError, match="not in its action space"):
        record(make(), 5, bad_policy)


def test_checkpoint_policy_acts_with_the_trained_actors(tmp_path):
    pytest.importorskip("torch")
    from marlbuf.algos import Runner, TrainConfig, checkpoint_policy

    runner = Runner(TrainConfig(batch_size=32, buffer_size=2000, warmup_steps=100, seed=0))
    runner.train(episodes=6)
    runner.save_checkpoint(tmp_path / "checkpoint")
    policy = checkpoint_policy(tmp_path / "checkpoint")
    env = make(continuous=True)
    obs, _ = env.reset(seed=0)
    actions = policy(obs)
    assert set(actions) == set(obs)
    for action in actions.values():
        assert action.shape == (5,) and np.isclose(action.sum(), 1.0)
    # the actor's forward pass, from the learner's own weights
    params = runner.learner.get_params()
    for t, (agent, o) in enumerate(obs.items()):
        x = np.asarray(o, np.float64)
        for k, layer in enumerate(("l0", "l1", "l2")):
            x = x @ params[t][f"actor.{layer}.W"].numpy() + params[t][f"actor.{layer}.b"].numpy()
            x = np.maximum(x, 0) if k < 2 else x
        expected = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        np.testing.assert_allclose(actions[agent], expected, rtol=1e-5, atol=1e-6)
    buf = record(make(continuous=True), 30, policy, seed=0)
    assert len(buf) == 30
    # record takes the policy, not the folder (loading a checkpoint needs the trainers' extra)
    with pytest.raises(TypeError, match=r"marlbuf\.algos\.checkpoint_policy\(folder\)"):
        record(make(continuous=True), 5, tmp_path / "checkpoint")


def test_record_command_writes_a_vault_or_a_buffer_file(tmp_path, monkeypatch, capsys):
    from marlbuf import cli

    monkeypatch.chdir(tmp_path)
    argv = ["record", "--env", "simple_spread", "--agents", "3", "--steps", "40", "--envs", "2"]
    assert cli.main([*argv, "--state", "--quiet", "--out", "v/ss.vlt/random"]) == 0
    info = vault_info(tmp_path / "v" / "ss.vlt" / "random")
    assert info.streams == 2 and info.steps == 40
    assert info.metadata["recorded_with"]["env"] == "simple_spread"
    argv = ["record", "--env", "simple_spread_v3", "--steps", "30", "--quiet", "--out", "b.npz"]
    assert cli.main(argv) == 0
    assert len(MultiAgentReplayBuffer.load(tmp_path / "b.npz")) == 30
    capsys.readouterr()
    for argv, message in (
        (["--env", "no_such_env", "--steps", "5", "--out", "x"], "unknown environment"),
        (["--env", "simple_spread", "--steps", "0", "--out", "x"], "--steps"),
        (["--env", "simple_spread", "--steps", "5", "--out", "b.npz"], "already exists"),
        (["--env", "simple_spread", "--steps", "5", "--env-arg", "nope=1", "--out", "x"], "nope"),
    ):
        assert cli.main(["record", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_record_help_imports_no_heavy_dependency():
    code = (
        "import sys; from marlbuf import cli\n"
        "try:\n    cli.main(['record', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'tensorstore', 'pettingzoo', 'mpe2', 'matplotlib', 'ray')"
        " if m in sys.modules]\nassert not heavy, heavy"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)


@pytest.mark.slow
def test_offline_example_reaches_the_recording_policy_at_a_tiny_size(monkeypatch):
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("offline_bc", ROOT / "examples" / "offline_bc.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "offline_bc", example)  # its dataclass looks itself up
    spec.loader.exec_module(example)
    result = example.main(["--quick"])
    assert result["behaviour_cloning_return"] >= result["recording_policy_return"]
