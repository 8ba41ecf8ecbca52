"""Drop-in adapters: each adapter driven with the original trainer's call sequence next
to a naive re-statement of the original buffer; same indices, identical arrays."""

from __future__ import annotations

import numpy as np
import pytest
from naive import OpenAIListBuffer, Tf2marlNaiveBuffer

from marlbuf.compat import NotEnoughDataError
from marlbuf.compat.maddpg import ReplayBuffer, make_buffers
from marlbuf.compat.tf2marl import EfficientReplayBuffer
from marlbuf.samplers import Neighbor

OBS_DIMS = [4, 6, 3]
ACT_DIM = 2


def openai_step(rng: np.random.Generator, n_agents: int = 3) -> list[tuple]:
    """One step's per-agent transitions with the types the original sees: float64 observations
    (old MPE), float32 actions (TF policy), Python-float reward, ``float(done)``."""
    return [
        (
            rng.standard_normal(OBS_DIMS[i]),
            rng.random(ACT_DIM, dtype=np.float32),
            float(rng.standard_normal()),
            rng.standard_normal(OBS_DIMS[i]),
            float(rng.random() < 0.1),
        )
        for i in range(n_agents)
    ]


def fill_openai(buffers, naive, steps: int, rng: np.random.Generator) -> None:
    """openai's train.py: ``agent.experience(...)`` for every agent, every step."""
    for _ in range(steps):
        for buf, ref, transition in zip(buffers, naive, openai_step(rng)):
            buf.add(*transition)
            ref.add(*transition)


def assert_same(ours: tuple, theirs: tuple) -> None:
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ openai/maddpg
@pytest.mark.parametrize("copy", [False, True])
def test_openai_trainer_round_matches_list_of_tuples(copy: bool) -> None:
    rng = np.random.default_rng(0)
    buffers = make_buffers(3, size=32, seed=1, copy=copy)
    naive = [OpenAIListBuffer(32) for _ in range(3)]
    fill_openai(buffers, naive, 50, rng)  # wraps around the ring
    assert [len(b) for b in buffers] == [len(r) for r in naive] == [32] * 3
    store = buffers[0].store
    for round_ in range(3):
        for trainer, own in enumerate(buffers):  # MADDPGAgentTrainer.update
            before = store.gathers
            index = own.make_index(16)
            assert isinstance(index, list) and all(0 <= i < 32 for i in index)
            for agent, buf in enumerate(buffers):
                assert_same(buf.sample_index(index), naive[agent].sample_index(index))
            assert_same(own.sample_index(index), naive[trainer].sample_index(index))
            assert store.gathers == before + 1  # N + 1 sample_index calls, one gather
        fill_openai(buffers, naive, 7, rng)  # more steps between rounds
        assert round_ >= 0


def test_openai_dtypes_are_those_of_the_original() -> None:
    rng = np.random.default_rng(2)
    buffers = make_buffers(3, size=10, seed=0)
    naive = [OpenAIListBuffer(10) for _ in range(3)]
    fill_openai(buffers, naive, 5, rng)
    obs, act, rew, obs_next, done = buffers[1].sample(4)
    assert (obs.dtype, act.dtype, rew.dtype, obs_next.dtype, done.dtype) == (
        np.float64,
        np.float32,
        np.float64,
        np.float64,
        np.float64,
    )
    assert obs.shape == (4, OBS_DIMS[1]) and act.shape == (4, ACT_DIM) and rew.shape == (4,)


def test_openai_collect_and_latest_index() -> None:
    rng = np.random.default_rng(3)
    buffers = make_buffers(3, size=20, seed=0)
    naive = [OpenAIListBuffer(20) for _ in range(3)]
    fill_openai(buffers, naive, 27, rng)
    for buf, ref in zip(buffers, naive):
        assert_same(buf.collect(), ref.collect())
        assert_same(buf.sample(0), ref.collect())
        latest = buf.make_latest_index(12)
        assert sorted(latest) == sorted(ref.latest_index_unshuffled(12))
        assert_same(buf.sample_index(latest), ref.sample_index(latest))


def test_openai_float32_option() -> None:
    rng = np.random.default_rng(4)
    buffers = make_buffers(3, size=16, seed=0, dtype=np.float32)
    naive = [OpenAIListBuffer(16) for _ in range(3)]
    fill_openai(buffers, naive, 20, rng)
    index = buffers[2].make_index(8)
    for buf, ref in zip(buffers, naive):
        for ours, theirs in zip(buf.sample_index(index), ref.sample_index(index)):
            assert ours.dtype == np.float32
            np.testing.assert_array_equal(ours, theirs.astype(np.float32))


def test_openai_views_are_read_only_copies_are_not() -> None:
    rng = np.random.default_rng(5)
    views = make_buffers(3, size=16, seed=0)
    copies = make_buffers(3, size=16, seed=0, copy=True)
    fill_openai(views, copies, 5, rng)
    obs, *_ = views[0].sample(4)
    with pytest.raises(ValueError, match="read-only"):
        obs[0, 0] = 1.0
    obs, *_ = copies[0].sample(4)
    assert obs.flags.writeable and obs.flags.c_contiguous


def test_openai_agents_may_add_in_any_order() -> None:
    rng = np.random.default_rng(6)
    buffers = make_buffers(3, size=8, seed=0)
    naive = [OpenAIListBuffer(8) for _ in range(3)]
    for _ in range(5):
        step = openai_step(rng)
        for agent in (2, 0, 1):
            buffers[agent].add(*step[agent])
            naive[agent].add(*step[agent])
    for buf, ref in zip(buffers, naive):
        assert_same(buf.collect(), ref.collect())


def test_openai_out_of_step_add_is_refused() -> None:
    rng = np.random.default_rng(7)
    buffers = make_buffers(3, size=8, seed=0)
    step = openai_step(rng)
    for buf, transition in zip(buffers, step):
        buf.add(*transition)
    buffers[0].add(*step[0])
    with pytest.raises(ValueError, match=r"second add\(\) before agents \[1, 2\]"):
        buffers[0].add(*step[0])
    assert len(buffers[0]) == 1  # nothing written
    buffers[0].store.discard_partial_step()
    for buf, transition in zip(buffers, step):
        buf.add(*transition)
    assert len(buffers[2]) == 2


def test_openai_partial_step_is_not_visible() -> None:
    rng = np.random.default_rng(8)
    buffers = make_buffers(2, size=8, seed=0)
    step = openai_step(rng, 2)
    buffers[0].add(*step[0])
    assert len(buffers[0]) == len(buffers[1]) == 0
    with pytest.raises(NotEnoughDataError):
        buffers[0].make_index(4)
    buffers[1].add(*step[1])
    assert len(buffers[0]) == 1


def test_openai_bad_step_is_rejected_whole() -> None:
    rng = np.random.default_rng(9)
    buffers = make_buffers(3, size=8, seed=0)
    fill_openai(buffers, [OpenAIListBuffer(8) for _ in range(3)], 2, rng)
    step = openai_step(rng)
    obs, act, _, obs_next, done = step[1]
    step[1] = (obs, act, float("nan"), obs_next, done)
    with pytest.raises(ValueError, match=r"reward\['agent_1'\] contains NaN"):
        for buf, transition in zip(buffers, step):
            buf.add(*transition)
    assert len(buffers[0]) == 2  # the whole step was dropped, for every agent
    step = openai_step(rng)
    step[0] = (np.zeros(5), *step[0][1:])
    with pytest.raises(ValueError, match=r"obs\['agent_0'\] must have shape \(4,\)"):
        for buf, transition in zip(buffers, step):
            buf.add(*transition)
    for buf, transition in zip(buffers, openai_step(rng)):  # and the next step is fine
        buf.add(*transition)
    assert len(buffers[1]) == 3


def test_openai_first_add_checks_given_shapes_and_types() -> None:
    rng = np.random.default_rng(10)
    buffers = make_buffers(3, size=8, obs_shape_n=[(4,), (6,), (9,)])
    with pytest.raises(ValueError, match=r"obs_shape_n\[2\]=\(9,\)"):
        for buf, transition in zip(buffers, openai_step(rng)):
            buf.add(*transition)
    buffers = make_buffers(1, size=8)
    with pytest.raises(TypeError, match="first add"):
        buffers[0].add(np.array(["a", "b"]), np.zeros(2), 0.0, np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="obs_shape_n must hold one shape per agent"):
        make_buffers(3, obs_shape_n=[(4,)])
    with pytest.raises(ValueError, match="n_agents must be a positive int"):
        make_buffers(0)
    with pytest.raises(ValueError, match="size must be a positive whole number"):
        make_buffers(2, size=10.5)
    with pytest.raises(ValueError, match="layout must be one of"):
        make_buffers(2, layout="columnar")
    with pytest.raises(TypeError, match="dtype must be a float dtype"):
        make_buffers(2, dtype=np.int32)
    with pytest.raises(TypeError, match="dtype must be a float dtype"):
        make_buffers(2, dtype="not a dtype")


def test_openai_bad_indices_and_batch_sizes() -> None:
    rng = np.random.default_rng(11)
    buffers = make_buffers(3, size=32, seed=0)
    fill_openai(buffers, [OpenAIListBuffer(32) for _ in range(3)], 10, rng)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        buffers[0].sample_index([0, 10])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        buffers[0].sample_index([-1])  # a Python list would wrap; the adapter refuses
    with pytest.raises(TypeError, match="idxes must be a list or 1-D array of ints"):
        buffers[0].sample_index([0.5, 1.0])
    with pytest.raises(ValueError, match="at least one index"):
        buffers[0].sample_index([])
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        buffers[0].make_index(0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        buffers[0].make_index(2.0)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        buffers[0].sample_index(buffers[0].make_latest_index(11))  # reaches unwritten slots


def test_openai_cache_follows_new_data_and_edited_indices() -> None:
    rng = np.random.default_rng(12)
    buffers = make_buffers(3, size=8, seed=0)
    naive = [OpenAIListBuffer(8) for _ in range(3)]
    fill_openai(buffers, naive, 8, rng)
    index = buffers[0].make_index(6)
    assert_same(buffers[1].sample_index(index), naive[1].sample_index(index))
    fill_openai(buffers, naive, 3, rng)  # overwrites slots 0..2
    assert_same(buffers[1].sample_index(index), naive[1].sample_index(index))
    index[0] = (index[0] + 1) % 8  # edited in place after it was handed out
    assert_same(buffers[2].sample_index(index), naive[2].sample_index(index))
    as_array = np.array(index)
    assert_same(buffers[0].sample_index(as_array), naive[0].sample_index(as_array))
    gathers = buffers[0].store.gathers
    assert_same(buffers[1].sample_index(list(index)), naive[1].sample_index(index))
    assert buffers[0].store.gathers == gathers  # equal content, no new gather
    as_array[1] = (as_array[1] + 1) % 8  # an array edited in place between calls
    assert_same(buffers[1].sample_index(as_array), naive[1].sample_index(as_array))


def test_openai_clear_empties_every_agent() -> None:
    rng = np.random.default_rng(13)
    buffers = make_buffers(3, size=8, seed=0)
    fill_openai(buffers, [OpenAIListBuffer(8) for _ in range(3)], 4, rng)
    buffers[1].clear()
    assert [len(b) for b in buffers] == [0, 0, 0]
    naive = [OpenAIListBuffer(8) for _ in range(3)]
    fill_openai(buffers, naive, 3, rng)
    for buf, ref in zip(buffers, naive):
        assert_same(buf.collect(), ref.collect())


def test_openai_standalone_and_neighbor_sampler() -> None:
    rng = np.random.default_rng(14)
    single = ReplayBuffer(1e3)
    ref = OpenAIListBuffer(1e3)
    for transition in (openai_step(rng)[0] for _ in range(30)):
        single.add(*transition)
        ref.add(*transition)
    index = single.make_index(10)
    assert_same(single.sample_index(index), ref.sample_index(index))
    buffers = make_buffers(3, size=64, seed=0, sampler=Neighbor(run_length=4))
    fill_openai(buffers, [OpenAIListBuffer(64) for _ in range(3)], 40, rng)
    runs = np.array(buffers[0].make_index(16)).reshape(4, 4)
    np.testing.assert_array_equal(np.diff(runs, axis=1), 1)


# ------------------------------------------------------------------------------ tf2marl
def tf2marl_step(rng: np.random.Generator, obs_dims: list[int]) -> tuple:
    """What tf2marl's train.py adds: lists of float64 obs / float32 actions, one reward, done."""
    obs = [rng.standard_normal(d) for d in obs_dims]
    acts = [rng.random(ACT_DIM, dtype=np.float32) for _ in obs_dims]
    nxt = [rng.standard_normal(d) for d in obs_dims]
    return obs, acts, float(rng.standard_normal()), nxt, float(rng.random() < 0.1)


def assert_same_tf2marl(ours: tuple, theirs: tuple) -> None:
    for part_ours, part_theirs in zip(ours, theirs):
        pairs = (
            zip(part_ours, part_theirs)
            if isinstance(part_ours, list)
            else [(part_ours, part_theirs)]
        )
        for a, b in pairs:
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_tf2marl_efficient_matches_naive() -> None:
    rng = np.random.default_rng(20)
    obs_shape_n = np.array([[d] for d in OBS_DIMS])  # what tf2marl's space_n_to_shape_n gives
    act_shape_n = [(ACT_DIM,)] * 3
    buf = EfficientReplayBuffer(1e2 * 0.32, 3, obs_shape_n, act_shape_n, seed=0)
    ref = Tf2marlNaiveBuffer(32, OBS_DIMS, [ACT_DIM] * 3)
    for step in range(45):
        transition = tf2marl_step(rng, OBS_DIMS)
        buf.add(*transition)
        ref.add(*transition)
        assert len(buf) == len(ref) == min(step + 1, 32)
        if step >= 10 and step % 5 == 0:  # the trainer's update: sample(batch_size)
            ours = buf.sample(8)
            assert buf.last_batch is not None
            assert_same_tf2marl(ours, ref.sample_index(buf.last_batch.indices))
    idx = np.arange(32)
    assert_same_tf2marl(buf.sample_index(idx), ref.sample_index(idx))


def test_tf2marl_errors() -> None:
    rng = np.random.default_rng(21)
    buf = EfficientReplayBuffer(16, 3, [(d,) for d in OBS_DIMS], [(ACT_DIM,)] * 3, seed=0)
    for _ in range(3):
        buf.add(*tf2marl_step(rng, OBS_DIMS))
    with pytest.raises(RuntimeError, match="batch_size=4 is more than the 3 transitions"):
        buf.sample(4)
    with pytest.raises(NotEnoughDataError):
        buf.sample(4)
    obs, acts, _, nxt, done = tf2marl_step(rng, OBS_DIMS)
    with pytest.raises(ValueError, match="reward must be one scalar"):
        buf.add(obs, acts, [1.0, 2.0, 3.0], nxt, done)
    with pytest.raises(ValueError, match=r"obs\['agent_1'\] must have shape \(6,\)"):
        buf.add([obs[0], obs[0], obs[2]], acts, 1.0, nxt, done)
    with pytest.raises(ValueError, match="one entry per agent"):
        buf.add(obs[:2], acts, 1.0, nxt, done)
    assert len(buf) == 3
    with pytest.raises(ValueError, match="act_shape_n must hold one shape per agent"):
        EfficientReplayBuffer(16, 3, [(4,)] * 3, [(2,)] * 2)


# ------------------------------------------------------------------------------ PettingZoo
def test_pettingzoo_episode_into_buffer() -> None:
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    from marlbuf import specs_from_env
    from marlbuf.compat.pettingzoo import add_parallel_step, buffer_from_env

    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=True)
    specs = specs_from_env(env)
    assert {a: (s.obs_shape, s.action_shape) for a, s in specs.items()} == {
        f"agent_{i}": ((18,), (5,)) for i in range(3)
    }
    buf = buffer_from_env(env, capacity=100, seed=0)
    either = buffer_from_env(env, capacity=100, seed=0)
    plain = buffer_from_env(env, capacity=100, seed=0)
    obs, _ = env.reset(seed=0)
    rows = []
    while env.agents:
        actions = {a: env.action_space(a).sample() for a in env.agents}
        next_obs, rewards, terminations, truncations, _ = env.step(actions)
        step = (obs, actions, rewards, next_obs, terminations, truncations)
        add_parallel_step(buf, *step, terminal="terminated")
        add_parallel_step(either, *step, terminal="terminated_or_truncated")
        plain.add(obs, actions, rewards, next_obs, terminations)  # the dicts, as they come
        rows.append((obs, actions, rewards, next_obs, truncations))
        obs = next_obs
    assert len(buf) == len(either) == len(plain) == 25
    assert all(rows[-1][4].values())  # MPE truncates every agent at max_cycles
    everything = np.arange(25)
    got, got_plain = buf.gather(everything), plain.gather(everything)
    got_either = either.gather(everything)
    for t, (o, act, rew, nxt, _) in enumerate(rows):
        for agent in specs:
            np.testing.assert_array_equal(got.obs[agent][t], o[agent])
            np.testing.assert_array_equal(got.action[agent][t], act[agent])
            assert got.reward[agent][t] == np.float32(rew[agent])
            np.testing.assert_array_equal(got.next_obs[agent][t], nxt[agent])
            assert got.done[agent][t] == 0.0  # "terminated": truncation is not termination
            np.testing.assert_array_equal(got_plain.obs[agent][t], o[agent])
            np.testing.assert_array_equal(got_either.obs[agent][t], o[agent])
    for agent in specs:  # "terminated_or_truncated": done on the truncated last step only
        np.testing.assert_array_equal(got_either.done[agent], np.arange(25) == 24)
    # stepping a finished episode returns empty dicts: a clear error, nothing written
    empty = env.step({})
    with pytest.raises(ValueError, match="missing from"):
        add_parallel_step(
            buf, obs, {}, empty[1], empty[0], empty[2], empty[3], terminal="terminated"
        )
    assert len(buf) == 25


def test_pettingzoo_terminal_conventions_and_missing_agents() -> None:
    from marlbuf import AgentSpec, MultiAgentReplayBuffer
    from marlbuf.compat.pettingzoo import add_parallel_step

    specs = {a: AgentSpec(obs_shape=(3,), action_shape=(2,)) for a in ("a", "b")}
    buf = MultiAgentReplayBuffer(specs, capacity=8)
    one = {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}
    act = {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}
    rew = {"a": 1.0, "b": 2.0}
    no = {"a": False, "b": False}
    yes = {"a": True, "b": True}
    step = (buf, one, act, rew, one)
    # the convention is required: omitting it is an error that explains both choices
    with pytest.raises(TypeError, match="needs terminal=: 'terminated' stores done"):
        add_parallel_step(*step, no, yes)
    with pytest.raises(ValueError, match="terminal must be one of"):
        add_parallel_step(*step, no, yes, terminal="truncated")
    assert len(buf) == 0
    # truncated, not terminated: done under one convention, not under the other
    add_parallel_step(*step, no, yes, terminal="terminated")
    add_parallel_step(*step, no, yes, terminal="terminated_or_truncated")
    add_parallel_step(*step, yes, no, terminal="terminated")  # termination: done under both
    add_parallel_step(*step, yes, None, terminal="terminated")  # truncations optional here
    np.testing.assert_array_equal(buf.gather(np.arange(4)).done["b"], [0.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="'terminated_or_truncated' needs the truncations"):
        add_parallel_step(*step, no, terminal="terminated_or_truncated")
    # the old flag still works, with a deprecation warning
    with pytest.warns(DeprecationWarning, match="pass terminal='terminated_or_truncated'"):
        add_parallel_step(*step, no, yes, truncation_is_done=True)
    assert buf.gather(np.array([4])).done["a"][0] == 1.0
    with pytest.raises(ValueError, match="contradicts truncation_is_done"):
        add_parallel_step(*step, no, yes, terminal="terminated", truncation_is_done=True)
    buf = MultiAgentReplayBuffer(specs, capacity=8)
    # agent "b" left the episode: absent from this step's dicts
    only_a = {k: {"a": v["a"]} for k, v in {"o": one, "act": act, "r": rew, "d": no}.items()}
    left = (buf, only_a["o"], only_a["act"], only_a["r"], only_a["o"], only_a["d"])
    with pytest.raises(ValueError, match=r"agents \['b'\] are missing"):
        add_parallel_step(*left, terminal="terminated")
    assert len(buf) == 0
    padded = add_parallel_step(*left, terminal="terminated", pad_missing=True)
    assert padded == ["b"]
    row = buf.gather(np.array([0]))
    assert row.done["b"][0] == 1.0 and not row.obs["b"].any() and row.reward["a"][0] == 1.0
    with pytest.raises(ValueError, match=r"agents \['c'\] are not in the buffer"):
        add_parallel_step(buf, {**one, "c": one["a"]}, act, rew, one, no, terminal="terminated")
    with pytest.raises(TypeError, match=r"obs must be the dict env\.step returns"):
        add_parallel_step(buf, [one["a"], one["b"]], act, rew, one, no, terminal="terminated")


def test_tf2marl_prioritized_matches_naive() -> None:
    from naive import Tf2marlNaivePrioritized

    from marlbuf.compat.tf2marl import PrioritizedReplayBuffer

    rng = np.random.default_rng(22)
    shapes = [(d,) for d in OBS_DIMS]
    buf = PrioritizedReplayBuffer(32, 3, shapes, [(ACT_DIM,)] * 3, alpha=0.6, seed=0)
    ref = Tf2marlNaivePrioritized(32, OBS_DIMS, [ACT_DIM] * 3, alpha=0.6)
    for step in range(60):
        transition = tf2marl_step(rng, OBS_DIMS)
        buf.add(*transition)
        ref.add(*transition)
        if step >= 10 and step % 4 == 0:  # MADDPGAgent.update with prioritized replay
            beta = 0.4 + step / 200
            *arrays, weights, indices = buf.sample(16, beta=beta)
            assert isinstance(indices, list) and len(indices) == 16
            assert_same_tf2marl(tuple(arrays), ref.sample_index(indices))
            assert weights.dtype == np.float32 and weights.shape == (16,)
            np.testing.assert_allclose(weights, ref.weights(indices, beta), rtol=1e-5)
            td_loss = rng.random(16).astype(np.float32) * 3
            buf.update_priorities(indices, td_loss + 1e-6)
            ref.update_priorities(indices, td_loss + 1e-6)
            np.testing.assert_allclose(buf.sampler.trees.leaves(0), ref.leaf, rtol=1e-12)


def test_tf2marl_prioritized_sampling_follows_priorities() -> None:
    from marlbuf.compat.tf2marl import PrioritizedReplayBuffer

    rng = np.random.default_rng(23)
    buf = PrioritizedReplayBuffer(32, 3, [(d,) for d in OBS_DIMS], [(ACT_DIM,)] * 3, 1.0, seed=1)
    for _ in range(32):
        buf.add(*tf2marl_step(rng, OBS_DIMS))
    priorities = np.full(32, 1e-3)
    priorities[5] = 1e3
    buf.update_priorities(np.arange(32), priorities)
    *_, weights, indices = buf.sample(1000, beta=1.0)
    assert np.mean(np.array(indices) == 5) > 0.95
    assert weights.max() <= 1.0
    batch_mode = PrioritizedReplayBuffer(
        32, 3, [(d,) for d in OBS_DIMS], [(ACT_DIM,)] * 3, 1.0, weights="batch", seed=1
    )
    for _ in range(32):
        batch_mode.add(*tf2marl_step(rng, OBS_DIMS))
    batch_mode.update_priorities(np.arange(32), priorities)
    *_, weights, _ = batch_mode.sample(64, beta=1.0)
    assert weights.max() == pytest.approx(1.0)


def test_tf2marl_prioritized_stale_updates_and_errors() -> None:
    from marlbuf.compat.tf2marl import PrioritizedReplayBuffer

    rng = np.random.default_rng(24)
    buf = PrioritizedReplayBuffer(8, 3, [(d,) for d in OBS_DIMS], [(ACT_DIM,)] * 3, 0.5, seed=0)
    for _ in range(8):
        buf.add(*tf2marl_step(rng, OBS_DIMS))
    *_, indices = buf.sample(8, beta=0.5)
    for _ in range(8):  # every slot is overwritten before the update arrives
        buf.add(*tf2marl_step(rng, OBS_DIMS))
    buf.update_priorities(indices, np.full(8, 50.0))
    np.testing.assert_array_equal(buf.sampler.trees.leaves(0), 1.0)  # dropped, not misapplied
    with pytest.raises(ValueError, match="priorities must be positive"):
        buf.update_priorities([0, 1], [1.0, 0.0])
    with pytest.raises(ValueError, match="one value per index"):
        buf.update_priorities([0, 1], [1.0])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 8\)"):
        buf.update_priorities([0, 8], [1.0, 1.0])
    with pytest.raises(ValueError, match="beta"):
        buf.sample(4, beta=-0.5)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(8, 3, [(d,) for d in OBS_DIMS], [(ACT_DIM,)] * 3, -1.0)
    with pytest.raises(ValueError, match="weights must be one of"):
        PrioritizedReplayBuffer(8, 3, [(4,)] * 3, [(2,)] * 3, 0.6, weights="max")


@pytest.mark.parametrize("module", ["maddpg", "tf2marl", "pettingzoo"])
def test_compat_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    if module == "pettingzoo":
        pytest.importorskip("mpe2")
    mod = importlib.import_module(f"marlbuf.compat.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_float64_reward_and_done_specs_round_trip(layout: str, tmp_path) -> None:
    from marlbuf import AgentSpec, MultiAgentReplayBuffer

    spec = AgentSpec(obs_shape=(3,), action_shape=(2,), reward_dtype=np.float64, done_dtype="f8")
    assert AgentSpec.from_dict(spec.to_dict()) == spec
    assert (
        AgentSpec.from_dict(
            {"obs_shape": [3], "action_shape": [2], "obs_dtype": "<f4", "action_dtype": "<f4"}
        ).reward_dtype
        == np.float32
    )
    with pytest.raises(TypeError, match="reward_dtype must be a bool, integer or float"):
        AgentSpec(obs_shape=(3,), action_shape=(2,), reward_dtype=np.complex128)
    specs = {"a": spec, "b": AgentSpec(obs_shape=(5,), action_shape=(1,))}
    buf = MultiAgentReplayBuffer(specs, capacity=4, layout=layout, seed=0)
    rewards = [0.1 + 1e-12, 1 / 3]
    for r in rewards:
        buf.add(
            obs={"a": np.ones(3), "b": np.ones(5)},
            action={"a": np.ones(2), "b": np.ones(1)},
            reward={"a": r, "b": r},
            next_obs={"a": np.ones(3), "b": np.ones(5)},
            done={"a": 1.0, "b": 0.0},
        )
    buf.save(tmp_path / "buf.npz")
    loaded = MultiAgentReplayBuffer.load(tmp_path / "buf.npz")
    for b in (buf, loaded):
        batch = b.gather(np.array([0, 1]))
        assert batch.reward["a"].dtype == np.float64 and batch.reward["b"].dtype == np.float32
        assert batch.reward["a"].tolist() == rewards  # not rounded to float32
        assert batch.done["a"].dtype == np.float64 and batch.done["a"].tolist() == [1.0, 1.0]


def test_openai_adapter_on_a_real_mpe2_episode() -> None:
    """openai's train.py loop over a real environment: lists in agent order, one
    ``experience`` per agent per step, then every trainer's sampling."""
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=True)
    agents = env.possible_agents
    buffers = make_buffers(len(agents), size=1e6 / 1e4, seed=0)  # openai passes a float
    naive = [OpenAIListBuffer(100) for _ in agents]
    obs, _ = env.reset(seed=0)
    obs_n = [obs[a] for a in agents]
    while env.agents:
        action_n = [env.action_space(a).sample() for a in agents]
        new_obs, rew, terminated, _truncated, _ = env.step(dict(zip(agents, action_n)))
        new_obs_n = [new_obs[a] for a in agents]
        for i, a in enumerate(agents):  # MADDPGAgentTrainer.experience -> add(..., float(done))
            transition = (obs_n[i], action_n[i], rew[a], new_obs_n[i], float(terminated[a]))
            buffers[i].add(*transition)
            naive[i].add(*transition)
        obs_n = new_obs_n
    assert len(buffers[0]) == 25
    for own in buffers:
        index = own.make_index(32)
        for buf, ref in zip(buffers, naive):
            assert_same(buf.sample_index(index), ref.sample_index(index))


class _ComeAndGo:
    """A PettingZoo-style parallel environment (PettingZoo itself not needed) whose agents leave
    the step dicts after they terminate and rejoin two steps later; every episode is truncated
    at step 12. Observations encode (episode, step, agent) so that stored rows can be traced
    back to the step that wrote them."""

    def __init__(self, seed: int) -> None:
        self.possible_agents = ["a0", "a1", "a2"]
        self.rng = np.random.default_rng(seed)
        self.episode = -1

    def observe(self) -> dict[str, np.ndarray]:
        return {
            a: np.array([self.episode, self.t, i, 1.0], np.float32)
            for i, a in enumerate(self.possible_agents)
            if a in self.agents
        }

    def reset(self) -> dict[str, np.ndarray]:
        self.episode += 1
        self.t = 0
        self.agents = list(self.possible_agents)
        self.away: dict[str, int] = {}
        return self.observe()

    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict[str, object], ...]:
        self.t += 1
        over = self.t == 12
        terminations = {a: bool(self.rng.random() < 0.2) and not over for a in self.agents}
        truncations = {a: over for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        next_obs = self.observe()  # the present agents' observations after the step
        for a in list(self.away):
            self.away[a] -= 1
            if self.away[a] == 0:
                del self.away[a]  # back from the next step on
        self.away.update({a: 2 for a, gone in terminations.items() if gone})
        self.agents = [] if over else [a for a in self.possible_agents if a not in self.away]
        return next_obs, rewards, terminations, truncations


def test_pettingzoo_agents_that_leave_and_rejoin_are_stored_absent() -> None:
    from marlbuf import AgentSpec, MultiAgentReplayBuffer
    from marlbuf.compat.pettingzoo import add_parallel_step
    from marlbuf.samplers import Sequence

    env = _ComeAndGo(seed=0)
    specs = {a: AgentSpec(obs_shape=(4,), action_shape=(2,)) for a in env.possible_agents}
    buf = MultiAgentReplayBuffer(specs, 200, alive=True, sampler=Sequence(length=12), seed=0)
    written: list[dict[str, np.ndarray]] = []
    for _ in range(8):
        obs = env.reset()
        while env.agents:
            actions = {a: np.ones(2, np.float32) for a in obs}
            next_obs, rewards, terms, truncs = env.step(actions)
            add_parallel_step(
                buf, obs, actions, rewards, next_obs, terms, truncs, terminal="terminated"
            )
            written.append(obs)
            obs = env.observe() if env.agents else {}
    assert len(buf) == len(written) > 8
    episode = [int(next(iter(step.values()))[0]) for step in written]  # episode of each slot
    batch = buf.gather(np.arange(len(written)))
    rejoined = 0
    for slot, step_obs in enumerate(written):
        for a in env.possible_agents:
            present = a in step_obs
            assert bool(batch.alive[a][slot]) == present
            if present:
                np.testing.assert_array_equal(batch.obs[a][slot], step_obs[a])
                t = step_obs[a][1]
                np.testing.assert_array_equal(batch.next_obs[a][slot][:2], [episode[slot], t + 1])
            else:
                assert not batch.obs[a][slot].any() and batch.reward[a][slot] == 0
        same = slot and episode[slot - 1] == episode[slot]
        if same and any(a not in written[slot - 1] for a in step_obs):
            rejoined += 1
    assert rejoined > 0  # agents came back within their episode
    # sequences never reach into the next episode: one ends where the environment's episode
    # ends (truncation at step 12, or every agent gone), or at a step where every present agent
    # terminated (the buffer's rule; agents that rejoin later then start a new buffer episode)
    seqs = buf.sample(32)
    for b in range(32):
        steps = seqs.slots[b][seqs.mask[b]]
        assert (np.diff(steps) == 1).all()
        assert len({episode[s] for s in steps}) == 1
        end = steps[-1]
        all_done = all(batch.done[a][end] for a in written[end])
        assert end + 1 == len(episode) or episode[end + 1] != episode[end] or all_done


def test_a_pettingzoo_env_that_removes_agents_fills_an_alive_buffer() -> None:
    # Knights-Archers-Zombies: knights and archers leave the step dicts when zombies kill them
    kaz = pytest.importorskip("pettingzoo.butterfly.knights_archers_zombies_v11")
    from marlbuf.compat.pettingzoo import add_parallel_step, buffer_from_env
    from marlbuf.samplers import Sequence

    env = kaz.parallel_env(max_zombies=20, spawn_delay=5, max_cycles=300)
    buf = buffer_from_env(env, 2000, alive=True, sampler=Sequence(length=8), seed=0)
    presence, episode_of = [], []
    rng = np.random.default_rng(0)
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        while env.agents:
            actions = {a: int(rng.integers(6)) for a in env.agents}
            next_obs, rewards, terms, truncs, _ = env.step(actions)
            acting = set(obs) & set(actions)
            add_parallel_step(
                buf,
                {a: obs[a] for a in acting},
                {a: actions[a] for a in acting},
                {a: rewards[a] for a in acting},
                {a: next_obs[a] for a in acting},
                {a: terms[a] for a in acting},
                {a: truncs[a] for a in acting},
                terminal="terminated",
            )
            presence.append(acting)
            episode_of.append(episode)
            obs = {a: next_obs[a] for a in env.agents}
    assert any(len(p) < len(env.possible_agents) for p in presence)  # somebody was killed
    batch = buf.gather(np.arange(len(presence)))
    for a in env.possible_agents:
        expected = np.array([a in p for p in presence])
        np.testing.assert_array_equal(batch.alive[a], expected)
        assert not batch.obs[a][~expected].any() and not batch.action[a][~expected].any()
    seqs = buf.sample(64)
    for b in range(64):
        steps = seqs.slots[b][seqs.mask[b]]
        assert (np.diff(steps) == 1).all() and len({episode_of[s] for s in steps}) == 1
