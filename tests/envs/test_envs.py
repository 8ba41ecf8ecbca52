"""marlbuf.envs: paper configurations, seeding, episode boundary, action checks, rollouts."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3, simple_tag_v3

from marlbuf import MultiAgentReplayBuffer
from marlbuf.envs import EPISODE_LENGTH, MPEEnv, make, rollout
from marlbuf.workloads import PAPER_WORKLOADS, Workload, predator_prey_sizes


def reference_env(env: MPEEnv):
    """Unpatched mpe2 parallel env with the same configuration as ``env``."""
    c = env.config
    common = {"max_cycles": 25, "continuous_actions": env.continuous_actions}
    if env.name == "cooperative_navigation":
        return simple_spread_v3.parallel_env(N=c["n_agents"], local_ratio=0.5, **common)
    return simple_tag_v3.parallel_env(
        num_adversaries=c["n_predators"],
        num_good=c["n_prey"],
        num_obstacles=c["n_landmarks"],
        **common,
    )


def make_workload(workload: Workload, **kwargs) -> MPEEnv:
    if workload.env == "cooperative_navigation":
        return make(workload.env, n_agents=workload.n, **kwargs)
    return make(workload.env, n_predators=workload.n, **kwargs)


# ----------------------------------------------------------------------------- configurations
@pytest.mark.parametrize("workload", PAPER_WORKLOADS, ids=lambda w: w.label)
def test_obs_dims_match_the_paper_table(workload):
    env = make_workload(workload)
    assert env.obs_dims == workload.obs_dims()
    assert env.action_dims == [5] * workload.n_trainers
    assert env.n_trainers == workload.n_trainers
    obs = env.reset()
    assert [o.shape for o in obs] == [(d,) for d in workload.obs_dims()]
    assert all(o.dtype == np.float32 for o in obs)


@pytest.mark.parametrize(
    ("name", "n", "expected"),
    [
        ("cooperative_navigation", 3, [18] * 3),
        ("cooperative_navigation", 6, [36] * 6),
        ("cooperative_navigation", 12, [72] * 12),
        ("cooperative_navigation", 24, [144] * 24),
        ("cooperative_navigation", 48, [288] * 48),
        ("predator_prey", 3, [16] * 3 + [14]),
        ("predator_prey", 24, [98] * 24 + [96] * 8),
    ],
)
def test_paper_obs_sizes_literally(name, n, expected):
    env = make(name, n_agents=n)
    assert env.obs_dims == expected


@pytest.mark.parametrize("n_predators", [1, 2, 3, 4, 6, 12, 24, 48])
def test_predator_prey_defaults_follow_the_workloads(n_predators):
    env = make("predator_prey", n_predators=n_predators)
    prey, landmarks = predator_prey_sizes(n_predators)
    assert (env.config["n_prey"], env.config["n_landmarks"]) == (prey, landmarks)
    assert env.agents == [f"adversary_{i}" for i in range(n_predators)] + [
        f"agent_{i}" for i in range(prey)
    ]
    assert env.obs_dims == Workload("predator_prey", n_predators).obs_dims()


def test_predator_prey_sizes_overridable():
    env = make("predator_prey", n_predators=24, n_prey=4, n_landmarks=16)
    assert env.config == {
        "n_predators": 24,
        "n_prey": 4,
        "n_landmarks": 16,
        "episode_length": 25,
        "continuous_actions": True,
    }
    assert env.obs_dims == [98] * 24 + [96] * 4  # 98 for predators whenever L + 2M = 24


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "simple_spread"}, ValueError),
        ({"name": "cooperative_navigation", "n_agents": 0}, ValueError),
        ({"name": "cooperative_navigation", "n_agents": 2.0}, TypeError),
        ({"name": "cooperative_navigation", "n_agents": True}, TypeError),
        ({"name": "cooperative_navigation", "n_prey": 2}, ValueError),
        ({"name": "predator_prey", "n_predators": 0}, ValueError),
        ({"name": "predator_prey", "n_predators": 3, "n_prey": 0}, ValueError),
        ({"name": "predator_prey", "n_landmarks": -1}, ValueError),
        ({"name": "predator_prey", "n_agents": 3, "n_predators": 6}, ValueError),
        ({"name": "predator_prey", "seed": -1}, ValueError),
        ({"name": "predator_prey", "continuous_actions": 1}, TypeError),
    ],
)
def test_bad_configurations_rejected(kwargs, error):
    with pytest.raises(error):
        make(**kwargs)


def test_import_does_not_need_mpe2():
    code = "import sys, marlbuf.envs; assert 'mpe2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- fidelity, seeds
def run_side_by_side(env: MPEEnv, steps: int, seed: int, actions_seed: int = 0) -> None:
    """Step ``env`` and unpatched mpe2 with the same actions; everything must be identical."""
    ref = reference_env(env)
    rng = np.random.default_rng(actions_seed)
    obs = env.reset(seed=seed)
    ref_obs, _ = ref.reset(seed=seed)
    for _ in range(steps):
        assert all(np.array_equal(o, ref_obs[a]) for o, a in zip(obs, env.agents))
        if env.needs_reset:
            obs = env.reset()
            ref_obs, _ = ref.reset()
            continue
        if env.continuous_actions:
            actions = rng.random((env.n_agents, 5), dtype=np.float32)
        else:
            actions = rng.integers(0, 5, env.n_agents)
        obs, reward, done, info = env.step(actions)
        ref_obs, ref_rew, ref_term, ref_trunc, _ = ref.step(
            {a: actions[i] for i, a in enumerate(env.agents)}
        )
        assert np.array_equal(reward, [ref_rew[a] for a in env.agents])
        assert done.tolist() == [ref_term[a] for a in env.agents]
        assert info["truncated"].tolist() == [ref_trunc[a] for a in env.agents]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "cooperative_navigation", "n_agents": 3},
        {"name": "predator_prey", "n_predators": 3},
        {"name": "predator_prey", "n_predators": 6, "n_prey": 3, "n_landmarks": 1},
        {"name": "cooperative_navigation", "n_agents": 1},
        {"name": "cooperative_navigation", "n_agents": 2, "continuous_actions": False},
        {"name": "predator_prey", "n_predators": 1, "n_prey": 1, "n_landmarks": 0},
        {"name": "predator_prey", "n_predators": 2, "n_prey": 3, "continuous_actions": False},
    ],
    ids=["CN-3", "PP-3+1", "PP-6+3", "CN-1", "CN-2-discrete", "PP-1+1+0", "PP-2+3-discrete"],
)
def test_identical_to_unpatched_mpe2_over_two_episodes(kwargs):
    # the default (vectorized) env against mpe2's parallel_env, edge sizes included
    run_side_by_side(make(**kwargs), steps=2 * EPISODE_LENGTH + 3, seed=11)


def bits(values) -> bytes:
    """Exact bytes of a float array (``array_equal`` would let -0.0 pass for 0.0)."""
    return np.ascontiguousarray(values, dtype=np.float64).tobytes()


def world_state(env: MPEEnv) -> bytes:
    agents = env.unwrapped.world.agents
    return bits([a.state.p_pos for a in agents]) + bits([a.state.p_vel for a in agents])


def crowd(env: MPEEnv, seed: int, spread: float, prey_at_edge: bool = False) -> None:
    """Start positions packed into a small square, so agents collide (and prey are caught);
    optionally every prey but the first pushed to the edge (simple_tag's boundary penalty)."""
    rng = np.random.default_rng(seed)
    for agent in env.unwrapped.world.agents:
        agent.state.p_pos = rng.uniform(-spread, spread, 2)
        if prey_at_edge and agent.name.startswith("agent_") and agent.name != "agent_0":
            agent.state.p_pos = np.array([rng.uniform(0.85, 1.3), rng.uniform(-1.3, 1.3)])


ACCELERATIONS = {"fast": {}, "shared_predator_reward": {"fast": False}}


@pytest.mark.parametrize("mode", list(ACCELERATIONS))
@pytest.mark.parametrize(
    ("kwargs", "spread", "steps"),
    [
        ({"name": "cooperative_navigation", "n_agents": 6}, 0.3, 12),
        ({"name": "cooperative_navigation", "n_agents": 24}, 0.6, 4),
        ({"name": "predator_prey", "n_predators": 3, "n_prey": 2}, 0.15, 12),
        ({"name": "predator_prey", "n_predators": 24}, 0.1, 3),
    ],
    ids=["CN-6", "CN-24", "PP-3+2", "PP-24+8"],
)
def test_accelerations_bit_identical_to_unpatched_mpe2(mode, kwargs, spread, steps):
    fast = make(**kwargs, seed=5, **ACCELERATIONS[mode])
    plain = make(**kwargs, seed=5, fast=False, shared_predator_reward=False)
    observations = []
    for env in (fast, plain):
        env.reset()
        crowd(env, seed=1, spread=spread, prey_at_edge=env.name == "predator_prey")
        if env is fast and mode == "fast":
            fast._fast.invalidate()  # the test moved agents behind the wrapper's back
        observations.append(env._observe())
    assert all(bits(a) == bits(b) for a, b in zip(*observations))
    rng = np.random.default_rng(2)
    overlapped = caught = at_edge = False
    for _ in range(steps):
        actions = rng.random((fast.n_agents, 5), dtype=np.float32)
        obs_fast, rew_fast, _, _ = fast.step(actions)
        obs_plain, rew_plain, _, _ = plain.step(actions)
        assert bits(rew_fast) == bits(rew_plain)
        assert world_state(fast) == world_state(plain)
        assert all(bits(a) == bits(b) for a, b in zip(obs_fast, obs_plain))
        overlapped |= len(set(rew_plain.tolist())) > 1  # local collision rewards differ
        if fast.name == "predator_prey":
            caught |= bool(rew_plain[0] > 0)  # the shared predator reward is not just 0
            at_edge |= bool(np.any(rew_plain[fast.config["n_predators"] :] % 10 != 0))
    assert overlapped  # collision forces and rewards were exercised
    if fast.name == "predator_prey":
        assert caught and at_edge


def test_fast_refuses_unsupported_worlds():
    env = make("cooperative_navigation", n_agents=3, fast=False)
    env.unwrapped.world.agents[0].silent = False
    from marlbuf.envs._fast import FastMPE

    with pytest.raises(ValueError, match="fast=False"):
        FastMPE(env.unwrapped, env.name)


def test_seed_reproduces_episodes():
    runs = []
    for _ in range(2):
        env = make("cooperative_navigation", n_agents=3, seed=7)
        stats = rollout(env, 2 * EPISODE_LENGTH)
        runs.append(np.stack(stats.episode_returns))
    assert np.array_equal(runs[0], runs[1])
    other = rollout(make("cooperative_navigation", n_agents=3, seed=8), 2 * EPISODE_LENGTH)
    assert not np.array_equal(runs[0], np.stack(other.episode_returns))


def test_reset_seed_overrides_and_later_resets_continue():
    env = make("predator_prey", seed=1)
    first = env.reset()
    second = env.reset()
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))
    again = env.reset(seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


# ----------------------------------------------------------------------------- episode boundary
def test_episode_boundary_truncates_at_25_and_needs_reset():
    env = make("cooperative_navigation", n_agents=3, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.random_actions())
    env.reset()
    total = np.zeros(3)
    for step in range(1, EPISODE_LENGTH + 1):
        obs, reward, done, info = env.step(env.random_actions())
        total += reward
        assert info["episode_step"] == step
        assert not done.any()  # MPE never terminates; truncation is not a terminal state
        assert info["episode_over"] == (step == EPISODE_LENGTH)
        assert info["truncated"].all() == (step == EPISODE_LENGTH)
    assert len(obs) == 3 and obs[0].shape == (18,)  # the final observation comes back
    assert np.array_equal(info["episode_return"], total)
    assert env.needs_reset
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.random_actions())
    env.reset()
    assert env.episode_step == 0 and not env.needs_reset
    _, _, _, info = env.step(env.random_actions())
    assert not info["episode_over"] and not info["truncated"].any()


def original_mpe_shared_reward(env: MPEEnv) -> float:
    """The original MPE's simple_spread reward, summed over agents (shared_reward=True),
    written out from its definition: every agent gets ``-sum_l min_a |a - l|`` minus one per
    agent it overlaps, itself included."""
    world = env.unwrapped.world
    positions = np.array([a.state.p_pos for a in world.agents])
    landmarks = np.array([lm.state.p_pos for lm in world.landmarks])
    coverage = -np.linalg.norm(landmarks[:, None] - positions[None], axis=2).min(axis=1).sum()
    sizes = np.array([a.size for a in world.agents])
    dist = np.linalg.norm(positions[:, None] - positions[None], axis=2)
    overlaps = (dist < sizes[:, None] + sizes[None]).sum(axis=1)  # includes the agent itself
    return float(np.sum(coverage - overlaps))


def test_original_units_for_cooperative_navigation():
    env = make("cooperative_navigation", n_agents=6, seed=3)
    env.reset()
    world = env.unwrapped.world
    for i, agent in enumerate(world.agents[:3]):  # force some collisions (size 0.15 each)
        agent.state.p_pos = np.array([0.1 * i, 0.1])
    per_step = []
    for _ in range(EPISODE_LENGTH):
        _, reward, _, info = env.step(env.random_actions())
        converted = env.original_reward(reward)
        expected = original_mpe_shared_reward(env)
        np.testing.assert_allclose(converted, np.full(6, expected), rtol=1e-12, atol=1e-12)
        per_step.append(expected)
    np.testing.assert_allclose(info["original_return"], np.full(6, sum(per_step)), rtol=1e-12)


def test_original_units_for_predator_prey_are_mpe2_units():
    env = make("predator_prey", seed=0)
    stats = rollout(env, EPISODE_LENGTH)
    assert np.array_equal(stats.original_returns[0], stats.episode_returns[0])
    with pytest.raises(ValueError, match="shape"):
        env.original_reward(np.zeros(3))


# ----------------------------------------------------------------------------- bad actions
@pytest.mark.parametrize(
    ("actions", "error", "match"),
    [
        (np.full((4, 5), 0.5), TypeError, "float32"),  # float64
        (np.full((4, 5), 1, dtype=np.int64), TypeError, "float32"),
        (np.full((3, 5), 0.5, dtype=np.float32), ValueError, "one entry per agent"),
        (np.full((5, 5), 0.5, dtype=np.float32), ValueError, "one entry per agent"),
        (np.full((4, 4), 0.5, dtype=np.float32), ValueError, "shape"),
        (np.array(0.5, dtype=np.float32), ValueError, "one entry per agent"),
        (np.float32(0.5), TypeError, "list"),
        ([np.full(5, 0.5, np.float32)] * 3, ValueError, "one entry per agent"),
        ([[0.5] * 5] * 4, TypeError, "numpy array"),
        ({"adversary_0": np.zeros(5, np.float32)}, TypeError, "list"),
        ([np.full(5, 0.5, np.float32)] * 3 + [np.full(5, np.nan, np.float32)], ValueError, "NaN"),
        ([np.full(5, 0.5, np.float32)] * 3 + [np.zeros((1, 5), np.float32)], ValueError, "shape"),
    ],
)
def test_wrong_actions_rejected_and_nothing_applied(actions, error, match):
    env = make("predator_prey", seed=4)
    twin = make("predator_prey", seed=4)
    env.reset()
    twin.reset()
    with pytest.raises(error, match=match):
        env.step(actions)
    assert env.episode_step == 0
    good = np.full((4, 5), 0.25, dtype=np.float32)
    obs, reward, _, _ = env.step(good)
    twin_obs, twin_reward, _, _ = twin.step(good)
    assert np.array_equal(reward, twin_reward)
    assert all(np.array_equal(a, b) for a, b in zip(obs, twin_obs))


def test_out_of_range_actions_are_clipped_like_mpe2():
    env = make("cooperative_navigation", n_agents=3, seed=2)
    twin = make("cooperative_navigation", n_agents=3, seed=2)
    env.reset()
    twin.reset()
    wild = np.array([[2.0, -1.0, 1.5, 0.3, 0.7]] * 3, dtype=np.float32)
    obs, *_ = env.step(wild)
    twin_obs, *_ = twin.step(np.clip(wild, 0, 1))
    assert all(np.array_equal(a, b) for a, b in zip(obs, twin_obs))
    assert wild[0, 0] == 2.0  # the caller's array is not modified


def test_list_and_array_actions_agree():
    env = make("predator_prey", seed=9)
    twin = make("predator_prey", seed=9)
    env.reset()
    twin.reset()
    actions = env.random_actions(np.random.default_rng(0))
    _, reward, _, _ = env.step(actions)
    _, twin_reward, _, _ = twin.step(list(actions))
    assert np.array_equal(reward, twin_reward)


def test_discrete_actions():
    env = make("cooperative_navigation", n_agents=3, seed=0, continuous_actions=False)
    assert env.specs()["agent_0"].n_discrete_actions == 5
    env.reset()
    env.step([0, 1, np.int64(4)])
    env.step(np.array([2, 3, 4]))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        env.step([0, 1, 5])
    with pytest.raises(TypeError, match="int"):
        env.step([0, 1, 0.5])
    buf = MultiAgentReplayBuffer(env.specs(), capacity=64, seed=0)
    rollout(env, 30, buffer=buf)
    batch = buf.sample(8)
    assert batch.action["agent_0"].shape == (8, 5)
    assert np.array_equal(batch.action["agent_0"].sum(axis=1), np.ones(8))  # one-hot


# ----------------------------------------------------------------------------- rollouts
@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_rollout_fills_a_buffer_with_consistent_shapes(layout):
    env = make("predator_prey", n_predators=3, seed=0)
    buf = MultiAgentReplayBuffer(env.specs(), capacity=200, layout=layout, seed=0)
    seen = []

    def policy(obs):
        seen.append([o.copy() for o in obs])
        return env.random_actions()

    stats = rollout(env, 60, policy=policy, buffer=buf)
    assert (stats.steps, stats.episodes, len(buf)) == (60, 2, 60)
    assert buf.agents == env.agents
    batch = buf.sample(32)
    for agent, dim in zip(env.agents, env.obs_dims):
        assert batch.obs[agent].shape == (32, dim)
        assert batch.next_obs[agent].shape == (32, dim)
        assert batch.action[agent].shape == (32, 5)
        assert batch.reward[agent].shape == (32,)
        assert not batch.done[agent].any()
    # the stored obs are the ones the policy saw, in order; next_obs chains within an episode
    rows, _ = buf.storage.gather(np.arange(60, dtype=np.int64))  # slots 0..59 in write order
    for t in (0, 24, 25, 59):
        for i, agent in enumerate(env.agents):
            assert np.array_equal(rows["obs"][agent][t], seen[t][i])
    first = env.agents[0]
    assert np.array_equal(rows["next_obs"][first][10], rows["obs"][first][11])


def test_rollout_needs_matching_buffer():
    env = make("cooperative_navigation", n_agents=3)
    other = make("cooperative_navigation", n_agents=4)
    buf = MultiAgentReplayBuffer(other.specs(), capacity=10)
    with pytest.raises(ValueError, match=r"env\.specs"):
        rollout(env, 5, buffer=buf)
    with pytest.raises(ValueError, match="n_steps"):
        rollout(env, -1)


def test_big_predator_prey_steps():
    env = make("predator_prey", n_predators=24, seed=0)
    obs = env.reset()
    assert [o.shape[0] for o in obs] == [98] * 24 + [96] * 8
    for _ in range(3):
        obs, reward, done, info = env.step(env.random_actions())
    assert reward.shape == done.shape == info["truncated"].shape == (32,)
