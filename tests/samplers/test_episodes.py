"""Whole-episode sampling (:class:`marlbuf.samplers.Episodes`), ``gather_sequences``, episode
counts, and writes that cannot mix environments (stream breaks, the hints of shape errors, the
refusal of environments given to ``extend``), against a list-of-episodes model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from naive import episode_heads as naive_heads
from naive import episode_tails as naive_tails
from naive import link_stream_steps as naive_link
from scipy.stats import chisquare
from streams import AGENTS, SPECS, StreamDriver, make_buffer, reloaded

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf._kernels.episodes import episode_heads, episode_tails, link_stream_steps
from marlbuf.batch import EpisodeBatch
from marlbuf.buffer import StreamBreakWarning
from marlbuf.samplers import Episodes, Sampler, Sequence, Uniform

CONFIGS = [
    ("interleaved", "rows", "once"),
    ("interleaved", "per_agent", "stored"),
    ("agent_major", "per_agent", "once"),
]


def make(capacity: int = 60, config=CONFIGS[0], **sampler_args) -> MultiAgentReplayBuffer:
    return make_buffer(Episodes(**sampler_args), capacity, config)


def check_complete(driver: StreamDriver) -> None:
    buf = driver.buf
    assert buf.episodes is not None
    slots = buf.episodes.complete_slots()
    got = dict(zip(slots.tolist(), buf.episodes.length[slots].tolist()))
    assert got == driver.naive.complete()
    assert buf.complete_episodes == len(got)
    held = {item[0] for item in driver.naive.content if item is not None}
    assert buf.stored_episodes == len(held)
    untracked = np.ones(buf.capacity, bool)
    untracked[slots] = False
    assert not buf.episodes.length[untracked].any()


def check_batch(driver: StreamDriver, batch: EpisodeBatch, max_length: int | None) -> None:
    complete = driver.naive.complete()
    first = batch.indices.tolist()
    assert isinstance(batch, EpisodeBatch) and set(first) <= set(complete)
    lengths = np.array([complete[s] for s in first])
    np.testing.assert_array_equal(batch.lengths, lengths)
    steps = max_length if max_length is not None else int(lengths.max())
    assert batch.mask.shape == (len(first), steps) and batch.burn_in == 0
    expected = np.array([driver.naive.sequence(s, 0, steps - 1) for s in first])
    np.testing.assert_array_equal(batch.slots, expected)
    kept = np.minimum(lengths, steps)[:, None]
    np.testing.assert_array_equal(batch.mask, np.arange(steps) < kept)
    assert batch.filled is batch.mask
    driver.check_values(batch)


# ------------------------------------------------------------------ kernels and the index


def test_kernels_match_their_naive_twins() -> None:
    driver = StreamDriver(make(50), 3)
    for _ in range(10):
        driver.random_ops(8, episodes=True)
        index = driver.buf.episodes
        assert index is not None
        slots = np.arange(driver.buf.size, dtype=np.int64)
        heads = np.empty_like(slots)
        episode_heads(slots, index.episode, index.step, index.prev_slot, heads)
        np.testing.assert_array_equal(
            heads, naive_heads(slots, index.episode, index.step, index.prev_slot)
        )
        tails = np.empty_like(slots)
        episode_tails(slots, index.episode, index.step, index.next_slot, tails)
        np.testing.assert_array_equal(
            tails, naive_tails(slots, index.episode, index.step, index.next_slot)
        )
    heads = np.empty(1, np.int64)
    episode_heads(np.array([-1]), index.episode, index.step, index.prev_slot, heads)
    assert heads[0] == -1


@pytest.mark.parametrize("seed", range(40))
def test_link_stream_steps_matches_its_naive_twin(seed: int) -> None:
    """Random calls (skipped steps, open episodes with and without a stored newest step, ends,
    quiet and full flags, rows that continue or break): the same index, ends and results."""
    rng = np.random.default_rng(seed)
    capacity, total = 30, int(rng.integers(1, 12))
    skip = int(rng.integers(0, 3)) if total > 3 else 0
    slots = rng.permutation(capacity)[: total - skip].astype(np.int64)
    ends = rng.random(total) < 0.2
    obs_bytes, next_start = (4, 6) if rng.random() < 0.8 else (0, 0)
    rows = rng.integers(0, 2, size=(total, 10)).astype(np.uint8)
    follow = rng.random(total) < 0.6  # most steps continue: obs = the previous next_obs
    for k in range(1, total):
        if follow[k]:
            rows[k, :4] = rows[k - 1, 6:10]
    quiet, full = rng.random(total) < 0.8, rng.random(total) < 0.9
    opened = rng.random() < 0.5
    open_episode, open_step = (3, int(rng.integers(0, 5))) if opened else (-1, 0)
    back = int(rng.choice(np.setdiff1d(np.arange(capacity), slots))) if opened else -1
    start = {k: rng.integers(-1, capacity, capacity).astype(np.int64) for k in ("a", "b")}
    arrays = {
        "episode": start["a"].copy(),
        "step": start["b"].copy(),
        "prev_slot": start["a"][::-1].copy(),
        "next_slot": start["b"][::-1].copy(),
    }
    twin = {k: v.copy() for k, v in arrays.items()}
    ends_kernel, ends_naive = ends.copy(), ends.copy()
    got = link_stream_steps(
        slots, ends_kernel, skip, open_episode, open_step, back, 7, rows, obs_bytes,
        next_start, quiet, full, arrays["episode"], arrays["step"], arrays["prev_slot"],
        arrays["next_slot"],
    )  # fmt: skip
    want = naive_link(
        slots, ends_naive, skip, open_episode, open_step, back, 7, rows, obs_bytes, next_start,
        quiet, full, twin,
    )  # fmt: skip
    assert tuple(got) == tuple(want)
    np.testing.assert_array_equal(ends_kernel, ends_naive)
    for key in arrays:
        np.testing.assert_array_equal(arrays[key], twin[key], err_msg=key)


@pytest.mark.parametrize("capacity", [7, 40, 200])
@pytest.mark.parametrize("seed", [0, 1])
def test_complete_episodes_match_the_model(capacity: int, seed: int) -> None:
    """Random writes on several streams, wrapping the ring: the complete set, each episode's
    length and both counts equal the model's after every round."""
    driver = StreamDriver(make(capacity), seed)
    check_complete(driver)
    for _ in range(15):
        driver.random_ops(5, episodes=True)
        check_complete(driver)


def test_a_partly_overwritten_episode_is_never_drawn() -> None:
    driver = StreamDriver(make(20), 0)
    driver.episode(12)
    driver.episode(5)
    assert driver.buf.complete_episodes == 2
    driver.episode(6)  # overwrites the first 3 steps of the 12-step episode
    assert driver.buf.complete_episodes == 2 and driver.buf.stored_episodes == 3
    check_complete(driver)
    for _ in range(20):
        assert 0 not in driver.buf.sample(2).indices.tolist()
    driver.add(p_done=0.0, p_trunc=0.0)  # an open episode: stored, not complete
    assert driver.buf.complete_episodes == 2 and driver.buf.stored_episodes == 4


# ------------------------------------------------------------------ sampled episodes


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("max_length", [None, 4, 9])
def test_batches_match_the_model(config, max_length) -> None:
    """Exact slots, masks, lengths and zero-filled data, every layout and next_obs mode,
    while filling and after wrapping; fixed lengths cut longer episodes."""
    driver = StreamDriver(make(80, config, max_length=max_length), 5)
    for target in (30, 400):
        while sum(driver.counters.values()) < target:
            driver.random_ops(1, n_streams=2, episodes=True)
        count = min(6, driver.buf.complete_episodes)
        batch = driver.buf.sample(count)
        check_batch(driver, batch, max_length)
        assert len(set(batch.indices.tolist())) == count


def test_uniform_over_complete_episodes_and_distinct() -> None:
    driver = StreamDriver(make(120), 2)
    while driver.buf.complete_episodes < 25 or driver.buf.size < 120:
        driver.random_ops(1, episodes=True)
    complete = sorted(driver.naive.complete())
    counts = dict.fromkeys(complete, 0)
    for _ in range(1500):
        drawn = driver.buf.sample(8).indices.tolist()
        assert len(set(drawn)) == 8  # replace=False: distinct episodes
        for slot in drawn:
            counts[slot] += 1
    assert chisquare(list(counts.values())).pvalue > 1e-3


def test_with_replacement_and_refusals() -> None:
    driver = StreamDriver(make(60, replace=True), 0)
    driver.add(p_done=0.0, p_trunc=0.0)  # an open episode only
    with pytest.raises(ValueError, match="no complete episode is stored"):
        driver.buf.sample(2)
    driver.buf.add(**StreamDriver.one_step(StreamDriver.fields(np.array([1]), np.ones(1))))
    driver.record([0], np.ones(1, bool))
    driver.episode(3)
    driver.episode(4)
    batch = driver.buf.sample(16)  # more than stored: with replacement
    assert set(batch.indices.tolist()) == {0, 2, 5}
    distinct = StreamDriver(make(60), 0)
    distinct.episode(3)
    with pytest.raises(ValueError, match="distinct episodes"):
        distinct.buf.sample(2)


def test_out_reuses_a_fixed_shape_block() -> None:
    driver = StreamDriver(make(60, max_length=6), 0)
    for length in (3, 6, 2, 5):
        driver.episode(length)
    first = driver.buf.sample(3)
    again = driver.buf.sample(3, out=first)
    assert again.block is first.block
    check_batch(driver, again, 6)
    free = StreamDriver(make(60), 0)
    free.episode(3)
    with pytest.raises(TypeError, match="max_length"):
        free.buf.sample(1, out=free.buf.sample(1))


# ------------------------------------------------------------------ prioritized episodes


def prioritized_driver(**args) -> tuple[StreamDriver, Episodes]:
    driver = StreamDriver(make(200, prioritized=True, **args), 4)
    for length in np.random.default_rng(0).integers(2, 8, size=30):
        driver.episode(int(length))
    sampler = driver.buf.sampler
    assert isinstance(sampler, Episodes)
    return driver, sampler


def test_prioritized_frequencies_and_weights_follow_priorities() -> None:
    driver, sampler = prioritized_driver(replace=True, alpha=0.7, beta=0.5)
    firsts = np.array(sorted(driver.naive.complete()))
    priorities = np.linspace(0.5, 4.0, firsts.shape[0])
    driver.buf.update_priorities(
        firsts, priorities, trainer=0, generations=driver.buf.write_generation[firsts]
    )
    mass = (priorities + sampler.eps) ** 0.7
    counts = dict.fromkeys(firsts.tolist(), 0)
    for _ in range(600):
        batch = driver.buf.sample(16)
        picked = mass[np.searchsorted(firsts, batch.indices)]
        np.testing.assert_allclose(batch.weights, (picked.min() / picked) ** 0.5, rtol=1e-6)
        for slot in batch.indices.tolist():
            counts[slot] += 1
    observed = np.array([counts[s] for s in firsts.tolist()])
    assert chisquare(observed, mass / mass.sum() * observed.sum()).pvalue > 1e-3


def test_prioritized_without_replacement_is_distinct_and_favours_priority() -> None:
    driver, _ = prioritized_driver()
    firsts = np.array(sorted(driver.naive.complete()))
    priorities = np.where(np.arange(firsts.shape[0]) < 5, 100.0, 0.01)
    driver.buf.update_priorities(
        firsts, priorities, trainer=0, generations=driver.buf.write_generation[firsts]
    )
    hits = 0
    for _ in range(50):
        drawn = driver.buf.sample(8).indices.tolist()
        assert len(set(drawn)) == 8
        hits += len(set(drawn) & set(firsts[:5].tolist()))
    assert hits >= 50 * 4.5  # the 5 heavy episodes are in nearly every batch


def test_stale_and_non_start_updates_are_dropped() -> None:
    driver, sampler = prioritized_driver(replace=True)
    assert sampler.trees is not None
    batch = driver.buf.sample(4)
    while driver.buf.write_generation[batch.indices[0]] == batch.generations[0]:
        driver.episode(7)  # until the first drawn episode is overwritten
    before = sampler.trees.leaves(0).copy()
    driver.buf.update_priorities(batch.indices, np.full(4, 50.0), trainer=0)
    leaves = sampler.trees.leaves(0)
    assert leaves[batch.indices[0]] == before[batch.indices[0]]
    middle = np.flatnonzero(driver.buf.episodes.step[: driver.buf.size] > 0)[:3]
    driver.buf.update_priorities(
        middle, np.full(3, 50.0), trainer=0, generations=driver.buf.write_generation[middle]
    )
    assert not leaves[middle].any()  # a slot inside an episode never gets a priority
    np.testing.assert_array_equal(
        np.flatnonzero(leaves), np.sort(driver.buf.episodes.complete_slots())
    )


@pytest.mark.parametrize(
    "args", [{}, {"max_length": 5}, {"prioritized": True}, {"prioritized": True, "replace": True}]
)
@pytest.mark.parametrize("how", ["state_dict", "file"])
def test_round_trip_samples_the_same(args: dict, how: str, tmp_path) -> None:
    driver = StreamDriver(make(70, **args), 9)
    driver.random_ops(40, episodes=True)
    if args.get("prioritized"):
        firsts = driver.buf.episodes.complete_slots().copy()
        driver.buf.update_priorities(
            firsts,
            np.arange(1.0, firsts.shape[0] + 1),
            trainer=1,
            generations=driver.buf.write_generation[firsts],
        )
    other = reloaded(driver.buf, how, tmp_path, lambda: make(70, **args))
    assert other.complete_episodes == driver.buf.complete_episodes
    for trainer in (0, 1):
        a, b = driver.buf.sample(4, trainer=trainer), other.sample(4, trainer=trainer)
        np.testing.assert_array_equal(a.slots, b.slots)
        np.testing.assert_array_equal(a.lengths, b.lengths)
        if a.weights is not None:
            np.testing.assert_array_equal(a.weights, b.weights)


def test_a_state_without_an_index_is_rebuilt() -> None:
    """A state saved by a buffer without episodes (Uniform) loads into an Episodes buffer:
    episodes are cut at done flags, and every chain counts as complete."""
    plain = MultiAgentReplayBuffer(SPECS, 40, sampler=Uniform(), seed=0)
    numbers = np.arange(10)
    done = (numbers % 5 == 4).astype(np.float32)
    plain.extend(**StreamDriver.fields(numbers, done))
    other = make(40, prioritized=True)
    other.load_state_dict(plain.state_dict())
    assert other.complete_episodes == 2
    assert sorted(other.sample(2).lengths.tolist()) == [5, 5]


# ------------------------------------------------------------------ gather_sequences


def test_gather_sequences_matches_the_model() -> None:
    driver = StreamDriver(make(50), 6)
    driver.random_ops(30, episodes=True)
    starts = np.arange(driver.buf.size)
    batch = driver.buf.gather_sequences(starts, 5)
    expected = np.array([driver.naive.sequence(int(s), 0, 4) for s in starts])
    np.testing.assert_array_equal(batch.slots, expected)
    np.testing.assert_array_equal(batch.lengths, (expected >= 0).sum(axis=1))
    np.testing.assert_array_equal(batch.indices, starts)
    driver.check_values(batch)
    sequences = MultiAgentReplayBuffer(SPECS, 10, sampler=Sequence(length=2), seed=0)
    StreamDriver(sequences).episode(4)
    assert sequences.gather_sequences([0], 9).lengths.tolist() == [4]


def test_gather_sequences_and_counts_refuse_bad_input() -> None:
    buf = make(20)
    StreamDriver(buf).episode(3)
    with pytest.raises(ValueError, match="length must be a positive int"):
        buf.gather_sequences([0], 0)
    with pytest.raises(ValueError, match="indices must lie in"):
        buf.gather_sequences([5], 2)
    with pytest.raises(TypeError, match="1-D integer array"):
        buf.gather_sequences([[0]], 2)
    plain = MultiAgentReplayBuffer(SPECS, 20, seed=0)
    for call in (
        lambda: plain.gather_sequences([0], 2),
        lambda: plain.complete_episodes,
        lambda: plain.stored_episodes,
    ):
        with pytest.raises(TypeError, match="episode index"):
            call()


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"max_length": 0}, ValueError, "max_length must be a positive int"),
        ({"max_length": 2.5}, ValueError, "max_length must be a positive int"),
        ({"replace": "no"}, TypeError, "replace must be a bool"),
        ({"prioritized": 1}, TypeError, "prioritized must be a bool"),
        ({"alpha": -1}, ValueError, "alpha"),
    ],
)
def test_bad_episode_arguments(args: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Episodes(**args)


def test_config_and_refusals_of_the_buffer() -> None:
    sampler = Episodes(max_length=7, replace=True, prioritized=True, alpha=0.5)
    again = Sampler.from_config("Episodes", sampler.config())
    assert again.config() == sampler.config()
    with pytest.raises(ValueError, match="longer than the buffer's capacity"):
        MultiAgentReplayBuffer(SPECS, 5, sampler=Episodes(max_length=6))
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        make(10).sample(0)


def test_torch_store_samples_the_same_episodes() -> None:
    pytest.importorskip("torch")
    host = make(60, max_length=None)
    device = MultiAgentReplayBuffer(SPECS, 60, sampler=Episodes(), seed=1, device="cpu")
    for buf in (host, device):
        driver = StreamDriver(buf, 3)
        driver.random_ops(25, episodes=True)
    a, b = host.sample(4), device.sample(4)
    np.testing.assert_array_equal(a.slots, b.slots)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.obs[AGENTS[0]], b.obs[AGENTS[0]].cpu().numpy())


# ------------------------------------------------------------------ writes that cannot mix


def env_step(env: int, t: int) -> dict:
    """Step ``t`` of environment ``env``: its obs names the environment; next_obs is the obs
    of step ``t + 1``."""

    def obs(step: int) -> dict:
        return {a: np.array([env, step, i], np.float32) for i, a in enumerate(AGENTS)}

    return {
        "obs": obs(t),
        "action": {a: np.zeros(2, np.float32) for a in AGENTS},
        "reward": {a: float(env) for a in AGENTS},
        "next_obs": obs(t + 1),
        "done": {a: float((t + 1) % 25 == 0) for a in AGENTS},
    }


@pytest.mark.parametrize("sampler", [Sequence(length=8), Episodes()])
def test_four_environments_written_in_turn_never_mix(sampler) -> None:
    """Without stream=, four environments added in turn: every step breaks the stream, so
    no sequence or episode mixes environments, and the buffer warns once."""
    buf = MultiAgentReplayBuffer(SPECS, 2000, sampler=sampler, seed=0)
    with pytest.warns(StreamBreakWarning, match="add_envs") as caught:
        for t in range(100):
            for env in range(4):
                buf.add(**env_step(env, t))
    assert len([w for w in caught if w.category is StreamBreakWarning]) == 1
    assert "stream=" in str(caught[0].message)
    mixed = 0
    for _ in range(64):
        batch = buf.sample(16 if isinstance(sampler, Episodes) else 256)
        envs = batch.reward[AGENTS[0]]
        for row, keep in zip(envs, batch.mask):
            mixed += len(set(row[keep].tolist())) > 1
    assert mixed == 0


def test_environments_on_their_own_streams_do_not_warn() -> None:
    buf = MultiAgentReplayBuffer(SPECS, 2000, sampler=Sequence(length=8), seed=0)
    for t in range(60):
        for env in range(4):
            buf.add(**env_step(env, t), stream=env)
        steps = [env_step(env, t + 1000) for env in range(4)]
        buf.add_envs(
            **{f: {a: np.stack([s[f][a] for s in steps]) for a in AGENTS} for f in steps[0]},
            first_stream=4,
        )
    batch = buf.sample(64)
    assert batch.mask.sum(axis=1).mean() > 4  # episodes of 25 steps: sequences go on


def test_extend_with_breaks_cuts_episodes_and_warns_once() -> None:
    buf = MultiAgentReplayBuffer(SPECS, 200, sampler=Episodes(), seed=0)
    steps = [env_step(env, 0) for env in range(4)] * 2  # one step of each env, twice over
    stacked = {f: {a: np.stack([s[f][a] for s in steps]) for a in AGENTS} for f in steps[0]}
    with pytest.warns(StreamBreakWarning):
        buf.extend(**stacked)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buf.extend(**stacked)  # once per buffer
    assert buf.complete_episodes == 15  # every step alone; the newest is still open
    assert buf.episodes is not None and buf.episodes.breaks == 15


def test_agents_done_or_absent_do_not_break_the_stream() -> None:
    """A step after one where an agent is done, or where agents join or leave, may see an
    obs its previous next_obs did not predict: it continues the episode."""
    buf = MultiAgentReplayBuffer(SPECS, 50, sampler=Episodes(), alive=True, seed=0)
    first = env_step(0, 0)
    first["done"] = {AGENTS[0]: 1.0, AGENTS[1]: 0.0}
    buf.add(**first)
    buf.add(**env_step(0, 7))  # agent_0 respawned somewhere new
    gone = env_step(0, 8)
    gone = {f: {AGENTS[1]: v[AGENTS[1]]} for f, v in gone.items()}
    buf.add(**gone)  # agent_0 absent
    buf.add(**env_step(0, 20), truncated=True)  # it joins again
    assert buf.complete_episodes == 1 and buf.sample(1).lengths.tolist() == [4]


def test_environments_given_to_extend_are_refused() -> None:
    """After add_envs with K environments, an extend of K steps in which every step breaks the
    stream is one step of each environment: refused, nothing written."""
    buf = MultiAgentReplayBuffer(SPECS, 100, seed=0)
    steps = [env_step(env, 0) for env in range(4)]
    stacked = {f: {a: np.stack([s[f][a] for s in steps]) for a in AGENTS} for f in steps[0]}
    buf.add_envs(**stacked)
    with pytest.raises(ValueError, match="looks like one step of 4 environments"):
        buf.extend(**stacked)
    assert len(buf) == 4
    run = [env_step(0, t) for t in range(1, 5)]  # four consecutive steps of one environment
    buf.extend(**{f: {a: np.stack([s[f][a] for s in run]) for a in AGENTS} for f in run[0]})
    assert len(buf) == 8


def test_shape_errors_name_add_envs_and_extend() -> None:
    buf = MultiAgentReplayBuffer(SPECS, 100, seed=0)
    steps = [env_step(env, 0) for env in range(4)]
    per_agent = {f: {a: np.stack([s[f][a] for s in steps]) for a in AGENTS} for f in steps[0]}
    with pytest.raises(ValueError, match="leading axis of 4: for one step of 4 vectorized"):
        buf.add(**per_agent)
    stacked = {f: np.stack([per_agent[f][a] for a in AGENTS], axis=1) for f in per_agent}
    with pytest.raises(ValueError, match="use add_envs"):
        buf.add(**stacked)
    doubled = {f: {a: v[None] for a, v in per.items()} for f, per in per_agent.items()}
    with pytest.raises(ValueError, match=r"two leading axes .*add_envs"):
        buf.extend(**doubled)
    assert len(buf) == 0


def test_add_envs_takes_a_stacked_array() -> None:
    """``(K, n_agents, ...)`` arrays are split per agent: the same rows as per-agent dicts."""
    steps = [env_step(env, 3) for env in range(4)]
    per_agent = {f: {a: np.stack([s[f][a] for s in steps]) for a in AGENTS} for f in steps[0]}
    stacked = {f: np.stack([per_agent[f][a] for a in AGENTS], axis=1) for f in per_agent}
    a = MultiAgentReplayBuffer(SPECS, 10, seed=0)
    b = MultiAgentReplayBuffer(SPECS, 10, seed=0)
    a.add_envs(**per_agent)
    b.add_envs(**stacked)
    for field in ("obs", "reward", "next_obs"):
        for agent in AGENTS:
            np.testing.assert_array_equal(a.stored(field)[agent], b.stored(field)[agent])


# ------------------------------------------------------------------ the benchmark, tiny


def test_bench_episodes_part_runs_tiny(monkeypatch) -> None:
    """``bench sequences``' episodes part at a tiny size: every case, ratio and byte count
    (the full run: ``sequences.run(parts=("episodes",))``)."""
    pytest.importorskip("torch")
    from marlbuf.bench.suites import sequences
    from marlbuf.workloads import Workload

    tiny = dict(sequences.QUICK, episodes_stored=40, episode_repeats=2)
    tiny["episode_workloads"] = [Workload("cooperative_navigation", 3)]
    monkeypatch.setattr(sequences, "QUICK", tiny)
    payload = sequences.run(quick=True, progress=False, parts=("episodes",))
    rows = payload["rows"]
    assert {r["part"] for r in rows} == {"episodes"}
    cases = {(r["episodes"], r["case"]) for r in rows}
    for mix in sequences.EPISODE_MIXES:
        for case in ("marlbuf", "marlbuf_torch", "padded_torch"):
            assert (mix, case) in cases
        assert (mix, "insert/marlbuf") in cases and (mix, "insert/padded_torch") in cases
    for row in rows:
        assert row["ms_median"] > 0 and row["time_vs_marlbuf"] > 0
        assert row["marlbuf_bytes_per_step"] > 0 and row["padded_bytes_per_step"] > 0
    summary = payload["summary"]["episodes"]
    mixed = summary["CN-3 + state(54) mixed 5-25"]
    assert "sample_target_2x_met" in mixed and "memory_target_0.7x_met" in mixed
    assert "insert_no_slower_met" in mixed
    # padding costs the padded layout more bytes per real step with shorter episodes
    fixed = summary["CN-3 + state(54) length 25"]
    assert mixed["padded_bytes_per_step"] > fixed["padded_bytes_per_step"]
    with pytest.raises(ValueError, match="parts must be among"):
        sequences.run(quick=True, progress=False, parts=("nothing",))


def test_torch_padded_episode_buffer_holds_the_episodes() -> None:
    torch = pytest.importorskip("torch")
    from marlbuf.bench.baselines.padded_episodes import PaddedField, TorchPaddedEpisodeBuffer

    buf = TorchPaddedEpisodeBuffer(
        {"obs": PaddedField((2,)), "state": PaddedField((3,), per_agent=False)}, 2, 3, 4
    )
    episodes = []
    for length in (2, 4, 1, 3):  # the fourth wraps onto slot 0
        steps = np.arange(length + 1, dtype=np.float32)
        episode = {
            "obs": np.broadcast_to(steps[:, None, None], (length + 1, 2, 2)) + length,
            "state": np.broadcast_to(steps[:, None], (length + 1, 3)) * length,
        }
        padded = buf.pad(episode, length)
        assert padded["filled"][0, :, 0].tolist() == [1] * (length + 1) + [0] * (4 - length)
        assert int(padded["terminated"][0, length - 1, 0]) == 1
        buf.insert_episode_batch(padded)
        episodes.append(padded)
    assert buf.episodes_in_buffer == 3 and buf.index == 1
    assert torch.equal(buf.data["obs"][0], episodes[3]["obs"][0])
    assert torch.equal(buf.data["state"][1], episodes[1]["state"][0])
    batch = buf.sample_episodes(3)
    assert batch["obs"].shape == (3, 5, 2, 2) and batch["filled"].dtype == torch.long
    with pytest.raises(ValueError, match="exceeds"):
        buf.sample_episodes(4)
    assert buf.nbytes == sum(t.numel() * t.element_size() for t in buf.data.values())


def test_link_stream_steps_compares_words_as_bytes() -> None:
    """The kernel on a word view of the rows finds the breaks its byte view finds."""
    rng = np.random.default_rng(5)
    total = 12
    rows = rng.integers(0, 3, size=(total, 24)).astype(np.uint8)
    for k in range(1, total, 2):
        rows[k, :8] = rows[k - 1, 16:24]  # odd steps continue, even ones mostly break
    flags = np.ones(total, dtype=bool)
    found = []
    for items, obs, start in ((rows, 8, 16), (rows.view(np.uint64), 1, 2)):
        arrays = [np.full(20, -1, np.int64) for _ in range(4)]
        ends = np.zeros(total, dtype=bool)
        out = link_stream_steps(
            np.arange(total, dtype=np.int64), ends, 0, -1, 0, -1, 0, items, obs, start,
            flags, flags, *arrays,
        )  # fmt: skip
        found.append((out, ends.tolist(), [a.tolist() for a in arrays]))
    assert found[0] == found[1] and found[0][0][3] >= 4


def test_add_envs_in_another_order_breaks_the_streams() -> None:
    """Environments passed to add_envs in another order than before: each stream's next obs
    is not its previous next_obs, so episodes end there (and the buffer warns once)."""
    buf = MultiAgentReplayBuffer(SPECS, 100, sampler=Episodes(), seed=0)

    def stacked(order: list[int], t: int) -> dict:
        steps = [env_step(env, t) for env in order]
        return {f: {a: np.stack([s[f][a] for s in steps]) for a in AGENTS} for f in steps[0]}

    buf.add_envs(**stacked([0, 1, 2], 0))
    buf.add_envs(**stacked([0, 1, 2], 1))  # continues every stream
    assert buf.episodes is not None and buf.episodes.breaks == 0
    with pytest.warns(StreamBreakWarning):
        buf.add_envs(**stacked([2, 0, 1], 2))
    assert buf.episodes.breaks == 3 and buf.complete_episodes == 3
    assert sorted(buf.sample(3).lengths.tolist()) == [2, 2, 2]


# ------------------------------------------------------------------ agent-stacked views


@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
def test_stacked_views_of_an_agent_group(batch_layout: str) -> None:
    buf = MultiAgentReplayBuffer(
        SPECS, 60, sampler=Episodes(max_length=6), batch_layout=batch_layout, seed=0
    )
    other = MultiAgentReplayBuffer(SPECS, 60, layout="agent_major", sampler=Episodes(), seed=0)
    StreamDriver(other).episode(4)
    copied = other.sample(1)
    np.testing.assert_array_equal(
        copied.stacked("obs"), np.stack([copied.obs[a] for a in AGENTS], axis=2)
    )
    driver = StreamDriver(buf, 1)
    for length in (3, 6, 4, 5):
        driver.episode(length)
    batch = buf.sample(3)
    for name in ("obs", "action", "reward", "next_obs"):
        stacked = batch.stacked(name)
        expected = np.stack([batch.field(name)[a] for a in AGENTS], axis=2)
        np.testing.assert_array_equal(stacked, expected)
        assert stacked.shape[:3] == (3, 6, len(AGENTS))
        assert np.shares_memory(stacked, batch.block)  # evenly spaced in both layouts
    stacked = batch.stacked("obs")
    stacked[0, 0, 1] = -5.0  # writes through to the batch
    assert (batch.obs[AGENTS[1]][0, 0] == -5.0).all()
    plain = MultiAgentReplayBuffer(SPECS, 60, seed=0)
    plain.extend(**StreamDriver.fields(np.arange(10), np.zeros(10)))
    flat = plain.sample(4)
    assert flat.stacked("obs").shape == (4, 2, 3)
    mixed = MultiAgentReplayBuffer(
        {"a": AgentSpec(obs_shape=(3,), action_shape=(2,)), "b": AgentSpec((4,), (2,))}, 10
    )
    zeros = {a: np.zeros((4, n), np.float32) for a, n in (("a", 3), ("b", 4))}
    scalars = {a: np.zeros(4, np.float32) for a in ("a", "b")}
    actions = {a: np.zeros((4, 2), np.float32) for a in ("a", "b")}
    mixed.extend(zeros, actions, scalars, zeros, scalars)
    with pytest.raises(ValueError, match="share shape and dtype"):
        mixed.sample(2).stacked("obs")
    assert mixed.sample(2).stacked("action").shape == (2, 2, 2)
