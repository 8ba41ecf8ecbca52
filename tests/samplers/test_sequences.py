"""Episode bookkeeping and sequence sampling: the episode index against a
list-of-episodes model, exact masks and data, start distributions, prioritized sequences,
persistence, rejected writes and bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from naive import NaiveEpisodeRing, r2d2_priority
from scipy.stats import chisquare
from streams import AGENTS, SPECS, StreamDriver, make_buffer, reloaded

from marlbuf import MultiAgentReplayBuffer
from marlbuf.batch import Batch, SequenceBatch, as_sequences
from marlbuf.memory import estimate
from marlbuf.samplers import Sampler, Sequence
from marlbuf.writer import EpisodeIndex

CONFIGS = [
    ("interleaved", "rows", "once"),
    ("interleaved", "per_agent", "stored"),
    ("interleaved", "rows", "stored"),
    ("agent_major", "per_agent", "once"),
]


def make(capacity: int = 40, config=CONFIGS[0], **sampler_args) -> MultiAgentReplayBuffer:
    return make_buffer(Sequence(**{"length": 4, "burn_in": 2, **sampler_args}), capacity, config)


def check_index(driver: StreamDriver, before: int, after: int) -> None:
    """The slot matrix of every stored slot equals the model's."""
    buf, naive = driver.buf, driver.naive
    assert buf.episodes is not None
    starts = np.arange(buf.size)
    got = buf.episodes.sequences(starts, before, after)
    expected = np.array([naive.sequence(s, before, after) for s in starts]).reshape(got.shape)
    np.testing.assert_array_equal(got, expected)


def check_batch(driver: StreamDriver, batch: SequenceBatch, length: int, burn_in: int) -> None:
    """Slots, mask and data of a sampled batch against the model and the written numbers."""
    n = len(batch)
    steps = burn_in + length
    assert isinstance(batch, SequenceBatch)
    assert batch.burn_in == burn_in and batch.mask.shape == (n, steps)
    expected = np.array([driver.naive.sequence(int(s), burn_in, length - 1) for s in batch.indices])
    np.testing.assert_array_equal(batch.slots, expected)
    np.testing.assert_array_equal(batch.mask, expected >= 0)
    np.testing.assert_array_equal(batch.slots[:, burn_in], batch.indices)
    np.testing.assert_array_equal(batch.generations, driver.buf.write_generation[batch.indices])
    for agent in AGENTS:
        assert batch.obs[agent].shape == (n, steps, 3)
        assert batch.action[agent].shape == (n, steps, 2)
    driver.check_values(batch)


# ------------------------------------------------------------------ the episode index


@pytest.mark.parametrize("capacity", [7, 40, 200])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_index_matches_list_of_episodes(capacity: int, seed: int) -> None:
    """Random add / extend / add_envs on several streams, wrapping the ring many times (and
    while not yet full): every stored slot's sequence equals the model's."""
    driver = StreamDriver(make(capacity, length=3, burn_in=2), seed)
    for _ in range(12):
        driver.random_ops(6)
        check_index(driver, 4, 5)


def test_interleaved_streams_never_mix() -> None:
    """Two streams written alternately step by step: every sequence stays in one stream."""
    driver = StreamDriver(make(64, length=6, burn_in=3), 3)
    for _ in range(100):
        driver.add(0, p_done=0.05, p_trunc=0)
        driver.add(1, p_done=0.05, p_trunc=0)
    check_index(driver, 3, 5)
    batch = driver.buf.sample(256)
    check_batch(driver, batch, 6, 3)
    # both streams' slots alternate: a valid sequence's slots step by 2
    slots = batch.slots
    valid_pairs = batch.mask[:, 1:] & batch.mask[:, :-1]
    assert np.all(((slots[:, 1:] - slots[:, :-1]) % 64)[valid_pairs] == 2)


def test_truncation_and_termination_end_episodes() -> None:
    buf = make(50, length=3, burn_in=0)
    driver = StreamDriver(buf)

    def step(done: list[bool], truncated: object = False) -> None:
        fields = driver.fields(driver.numbers([0]), np.array([done]))
        buf.add(**StreamDriver.one_step(fields), truncated=truncated)
        driver.counters[0] = driver.counters.get(0, 0) + 1

    step([True, False])  # one agent done: the episode goes on
    step([False, False], truncated=[False, True])  # truncated (any agent): ends here
    step([False, False])
    step([True, True])  # every agent done: ends here
    step([False, False], truncated={"agent_0": np.bool_(False)})
    assert buf.episodes is not None
    np.testing.assert_array_equal(buf.episodes.episode[:5], [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(buf.episodes.step[:5], [0, 1, 0, 1, 0])
    assert set(buf.episodes.open) == {0}


def test_extend_longer_than_capacity_counts_skipped_steps() -> None:
    """Only the last ``capacity`` steps are stored, numbered as if added one by one."""
    driver = StreamDriver(make(10, length=3, burn_in=1), 5)
    driver.extend(4)
    driver.extend(27)
    check_index(driver, 3, 3)
    driver.add_envs(3)
    driver.extend(12, stream=1)
    check_index(driver, 3, 3)


def test_add_envs_with_more_envs_than_capacity() -> None:
    driver = StreamDriver(make(5, length=2, burn_in=1), 7)
    for _ in range(6):
        driver.add_envs(8)
        check_index(driver, 2, 2)


# ------------------------------------------------------------------ sampled sequences


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("pad", [True, False])
def test_batches_match_the_model(config, pad: bool) -> None:
    """Exact slots, masks, burn-in positions and zero-filled data, every layout and next_obs
    mode, while filling and after wrapping."""
    buf = make(60, config, length=5, burn_in=3, pad=pad)
    driver = StreamDriver(buf, 11)
    for size_steps in (25, 200):
        while driver.count < size_steps:
            driver.random_ops(1, n_streams=2)
        batch = buf.sample(64)
        check_batch(driver, batch, 5, 3)
        if not pad:  # every start has its `length` steps
            assert batch.mask[:, 3:].all()


def test_pad_false_starts_are_exactly_the_valid_ones() -> None:
    driver = StreamDriver(make(50, length=4, burn_in=0, pad=False), 2)
    for _ in range(20):
        driver.random_ops(4)
        sampler = driver.buf.sampler
        assert isinstance(sampler, Sequence)
        expected = np.zeros(driver.buf.size, bool)
        expected[driver.naive.valid_starts(4)] = True
        np.testing.assert_array_equal(sampler.startable[: driver.buf.size], expected)


def test_pad_false_without_long_episodes_is_refused() -> None:
    driver = StreamDriver(make(50, length=4, burn_in=0, pad=False))
    for _ in range(3):
        driver.add(p_done=1.0)
    with pytest.raises(ValueError, match="pad=False has no sequence start"):
        driver.buf.sample(4)


def test_uniform_starts_are_uniform_over_stored_slots() -> None:
    driver = StreamDriver(make(30, length=4, burn_in=1), 4)
    driver.random_ops(10)
    while driver.buf.size < 30:
        driver.add()
    counts = np.zeros(30)
    for _ in range(200):
        np.add.at(counts, driver.buf.sample(64).indices, 1)
    assert chisquare(counts).pvalue > 1e-3


def test_pad_false_starts_are_uniform_over_valid_starts() -> None:
    driver = StreamDriver(make(60, length=3, burn_in=0, pad=False), 6)
    for _ in range(12):
        driver.extend(8, p_done=0.15, p_trunc=0)
    valid = driver.naive.valid_starts(3)
    counts = np.zeros(60)
    for _ in range(200):
        np.add.at(counts, driver.buf.sample(64).indices, 1)
    assert counts[np.setdiff1d(np.arange(60), valid)].sum() == 0
    assert chisquare(counts[valid]).pvalue > 1e-3


def test_sample_for_trainers_draws_valid_sequences_for_each_trainer() -> None:
    """Each trainer's batch of a round holds sequences the model agrees with (the rounds
    themselves, and ``iter_trainers``, are tested in tests/buffer/test_reading.py)."""
    driver = StreamDriver(make(80, length=4, burn_in=2), 9)
    driver.random_ops(20)
    for batch in driver.buf.sample_for_trainers(16):
        check_batch(driver, batch, 4, 2)


def test_out_reuses_the_block() -> None:
    driver = StreamDriver(make(80, length=4, burn_in=2), 9)
    driver.random_ops(20)
    first = driver.buf.sample(16)
    state = driver.buf.rng.bit_generator.state
    fresh = driver.buf.sample(16)
    driver.buf.rng.bit_generator.state = state
    again = driver.buf.sample(16, out=first)
    assert again.block is first.block
    np.testing.assert_array_equal(again.slots, fresh.slots)
    np.testing.assert_array_equal(again.obs["agent_1"], fresh.obs["agent_1"])
    check_batch(driver, again, 4, 2)
    with pytest.raises(ValueError, match="out holds a block"):
        driver.buf.sample(8, out=first)
    plain = MultiAgentReplayBuffer(SPECS, 80)
    StreamDriver(plain).extend(30)
    with pytest.raises(TypeError, match="SequenceBatch"):
        driver.buf.sample(16, out=plain.sample(16))


def test_concat_is_per_step() -> None:
    driver = StreamDriver(make(40, length=3, burn_in=1), 1)
    driver.extend(30)
    batch = driver.buf.sample(8)
    joined = batch.concat("obs", "action")
    assert joined.shape == (8, 4, 2 * (3 + 2))
    np.testing.assert_array_equal(joined[..., :3], batch.obs["agent_0"])
    np.testing.assert_array_equal(joined[..., 3:6], batch.obs["agent_1"])


def test_reshape_covers_every_per_row_array() -> None:
    """Fields a Batch gains (dicts of per-agent arrays, nested dicts, plain arrays) come out
    per step and zeroed at masked positions without changes to the sequence gather."""

    @dataclasses.dataclass
    class Wider(Batch):
        extras: dict = dataclasses.field(default_factory=dict)
        globals: dict = dataclasses.field(default_factory=dict)
        alive: dict | None = None

    @dataclasses.dataclass
    class WiderSequences(SequenceBatch, Wider):
        pass

    n, steps = 3, 4
    rows = n * steps
    mask = np.ones((n, steps), bool)
    mask[0, 0] = mask[2, 3] = False
    per_agent = lambda *s: {a: np.ones((rows, *s), np.float32) for a in AGENTS}  # noqa: E731
    flat = Wider(
        obs=per_agent(3),
        action=per_agent(2),
        reward=per_agent(),
        next_obs=per_agent(3),
        done=per_agent(),
        indices=np.arange(rows),
        generations=np.arange(rows),
        extras={"hidden": per_agent(5)},
        globals={"state": np.ones((rows, 6), np.float32)},
        alive={a: np.ones(rows, bool) for a in AGENTS},
    )
    out = as_sequences(
        flat,
        mask,
        1,
        np.zeros((n, steps), np.int64),
        np.arange(n),
        np.arange(n),
        None,
        0,
        WiderSequences,
    )
    assert out.extras["hidden"]["agent_0"].shape == (n, steps, 5)  # type: ignore[attr-defined]
    assert out.globals["state"].shape == (n, steps, 6)  # type: ignore[attr-defined]
    assert out.alive["agent_1"].shape == (n, steps)  # type: ignore[attr-defined]
    assert not out.alive["agent_1"][~mask].any()  # type: ignore[attr-defined]
    assert (out.globals["state"][~mask] == 0).all()  # type: ignore[attr-defined]
    assert (out.globals["state"][mask] == 1).all()  # type: ignore[attr-defined]
    assert out.indices.shape == (n,)


# ------------------------------------------------------------------ prioritized sequences


def prioritized(capacity: int = 40, **args) -> tuple[StreamDriver, Sequence]:
    buf = make(capacity, prioritized=True, **{"length": 4, "burn_in": 1, **args})
    assert isinstance(buf.sampler, Sequence)
    return StreamDriver(buf, 8), buf.sampler


def test_new_starts_get_the_running_max() -> None:
    driver, sampler = prioritized()
    driver.extend(20, p_done=0, p_trunc=0)
    assert sampler.trees is not None
    np.testing.assert_array_equal(sampler.trees.leaves(0)[:20], 1.0)
    batch = driver.buf.sample(4, trainer=0)
    driver.buf.update_priorities(batch.indices, np.full(4, 3.0), trainer=0)
    driver.extend(2, p_done=0, p_trunc=0)
    np.testing.assert_allclose(sampler.trees.leaves(0)[20:22], (3.0 + sampler.eps) ** 0.6)
    np.testing.assert_array_equal(sampler.trees.leaves(1)[20:22], 1.0)  # trainer 1's own max


def test_prioritized_frequencies_and_weights_follow_priorities() -> None:
    driver, sampler = prioritized(capacity=30, alpha=0.7, beta=0.5)
    driver.extend(30, p_done=0.1, p_trunc=0)
    priorities = np.linspace(0.5, 4.0, 30)
    driver.buf.gather(np.arange(30), trainer=0)
    driver.buf.update_priorities(
        np.arange(30), priorities, trainer=0, generations=driver.buf.write_generation[np.arange(30)]
    )
    mass = (priorities + sampler.eps) ** 0.7
    counts = np.zeros(30)
    for _ in range(200):
        batch = driver.buf.sample(64, trainer=0)
        np.add.at(counts, batch.indices, 1)
        picked = mass[batch.indices]
        assert batch.weights is not None
        np.testing.assert_allclose(batch.weights, (picked.min() / picked) ** 0.5, rtol=1e-6)
    assert chisquare(counts, mass / mass.sum() * counts.sum()).pvalue > 1e-3


@pytest.mark.parametrize("pad", [True, False])
def test_r2d2_mix_over_valid_training_steps(pad: bool) -> None:
    driver, sampler = prioritized(length=5, burn_in=2, eta=0.7, alpha=1.0, pad=pad)
    for _ in range(8):
        driver.extend(6, p_done=0.3, p_trunc=0)
    batch = driver.buf.sample(32, trainer=1)
    valid = batch.mask[:, 2:]
    td = np.random.default_rng(0).normal(size=(32, 5))
    td[~valid] = np.nan  # masked steps are ignored, whatever they hold
    # later writes extend the open episode: the mix still uses the steps valid when sampled
    driver.extend(3, p_done=0, p_trunc=0)
    driver.buf.update_priorities(batch.indices, td, trainer=1)
    expected = r2d2_priority(td, valid, 0.7) + sampler.eps
    last = {int(s): p for s, p in zip(batch.indices, expected)}  # duplicates: the last wins
    assert sampler.trees is not None
    leaves = sampler.trees.leaves(1)
    for slot, priority in last.items():
        if driver.buf.write_generation[slot] == batch.generations[list(batch.indices).index(slot)]:
            assert leaves[slot] == pytest.approx(priority)


def test_stale_sequence_updates_are_dropped() -> None:
    driver, sampler = prioritized(capacity=20)
    driver.extend(20, p_done=0.1, p_trunc=0)
    batch = driver.buf.sample(8, trainer=0)
    assert sampler.trees is not None
    before = sampler.trees.leaves(0).copy()
    driver.extend(20, p_done=0.1, p_trunc=0)  # every slot overwritten
    after_write = sampler.trees.leaves(0).copy()
    driver.buf.update_priorities(batch.indices, np.full(8, 50.0), trainer=0)
    np.testing.assert_array_equal(sampler.trees.leaves(0), after_write)
    driver.buf.update_priorities(
        batch.indices, np.full(8, 50.0), trainer=0, generations=batch.generations
    )
    np.testing.assert_array_equal(sampler.trees.leaves(0), after_write)
    assert before.shape == after_write.shape


def test_pad_false_never_prioritizes_an_invalid_start() -> None:
    driver, sampler = prioritized(capacity=30, pad=False, length=4, burn_in=0)
    for _ in range(4):
        driver.extend(6, p_done=0.2, p_trunc=0)
    invalid = np.setdiff1d(np.arange(driver.buf.size), driver.naive.valid_starts(4))
    assert invalid.size
    driver.buf.update_priorities(
        invalid,
        np.full(invalid.size, 9.0),
        trainer=0,
        generations=driver.buf.write_generation[invalid],
    )
    assert sampler.trees is not None
    assert not sampler.trees.leaves(0)[invalid].any()


def test_bad_td_errors() -> None:
    driver, _ = prioritized()
    driver.extend(20)
    batch = driver.buf.sample(4)
    with pytest.raises(ValueError, match=r"shape \(4,\).*\(4, 4\)"):
        driver.buf.update_priorities(batch.indices, np.ones((4, 3)))
    with pytest.raises(ValueError, match="finite"):
        driver.buf.update_priorities(batch.indices, np.array([1.0, np.nan, 1.0, 1.0]))
    bad = np.ones((4, 4))
    bad[batch.mask[:, 1:]] = np.inf
    with pytest.raises(ValueError, match="finite at valid steps"):
        driver.buf.update_priorities(batch.indices, bad)
    with pytest.raises(TypeError, match="real numeric"):
        driver.buf.update_priorities(batch.indices, np.array(["a"] * 4))
    uniform = make(20)
    StreamDriver(uniform).extend(10)
    with pytest.raises(TypeError, match="keeps no priorities"):
        uniform.update_priorities(
            np.arange(2), np.ones(2), generations=uniform.write_generation[np.arange(2)]
        )


# ------------------------------------------------------------------ state


@pytest.mark.parametrize(
    "args",
    [{}, {"pad": False}, {"prioritized": True}, {"prioritized": True, "pad": False}],
)
@pytest.mark.parametrize("how", ["state_dict", "file"])
def test_round_trip_samples_the_same(args: dict, how: str, tmp_path) -> None:
    driver = StreamDriver(make(30, **args), 12)
    driver.random_ops(25)
    if driver.buf.sampler.weighted:
        batch = driver.buf.sample(8, trainer=1)
        driver.buf.update_priorities(batch.indices, np.arange(8.0), trainer=1)
    other = reloaded(driver.buf, how, tmp_path, lambda: make(30, **args))
    assert other.episodes is not None and driver.buf.episodes is not None
    assert other.episodes.open == driver.buf.episodes.open
    for t in (0, 1):
        a, b = driver.buf.sample(16, trainer=t), other.sample(16, trainer=t)
        np.testing.assert_array_equal(a.slots, b.slots)
        np.testing.assert_array_equal(a.obs["agent_0"], b.obs["agent_0"])
        if a.weights is not None:
            np.testing.assert_array_equal(a.weights, b.weights)
    # open episodes continue in both alike
    twin = StreamDriver(other)
    twin.rng, twin.count, twin.naive = driver.rng, driver.count, driver.naive
    twin.counters = dict(driver.counters)
    state = driver.rng.bit_generator.state
    driver.random_ops(3)
    twin.rng.bit_generator.state = state
    twin.naive = NaiveEpisodeRing(30)  # only the buffers are compared below
    twin.random_ops(3)
    np.testing.assert_array_equal(
        driver.buf.episodes.sequences(np.arange(30), 3, 3),
        other.episodes.sequences(np.arange(30), 3, 3),
    )


def test_states_without_an_index_are_rebuilt_from_done_flags_and_links() -> None:
    """One stream, episodes ended by done, next_obs equal to the next obs within an episode:
    observations stored once recover the episodes exactly; dense rows give one-step episodes."""
    rng = np.random.default_rng(0)
    for next_obs in ("once", "stored"):
        source = MultiAgentReplayBuffer(SPECS, 25, next_obs=next_obs, seed=0)
        naive = NaiveEpisodeRing(25)
        obs = {a: rng.normal(size=3).astype(np.float32) for a in AGENTS}
        for _ in range(60):
            end = bool(rng.random() < 0.2)
            nxt = {a: rng.normal(size=3).astype(np.float32) for a in AGENTS}
            source.add(
                obs,
                {a: np.zeros(2) for a in AGENTS},
                {a: 0.0 for a in AGENTS},
                nxt,
                {a: float(end) for a in AGENTS},
            )
            naive.write(0, end)
            obs = {a: rng.normal(size=3).astype(np.float32) for a in AGENTS} if end else nxt
        state = source.state_dict()
        assert state["episodes"] == {}
        target = MultiAgentReplayBuffer(
            SPECS, 25, next_obs=next_obs, sampler=Sequence(length=3, burn_in=2)
        )
        target.load_state_dict(state)
        assert target.episodes is not None
        got = target.episodes.sequences(np.arange(25), 2, 2)
        if next_obs == "once":
            expected = np.array([naive.sequence(s, 2, 2) for s in range(25)])
        else:
            expected = np.full((25, 5), -1)
            expected[:, 2] = np.arange(25)
        np.testing.assert_array_equal(got, expected)
        assert target.episodes.open == {}


def test_bad_episode_states_change_nothing() -> None:
    driver = StreamDriver(make(30), 3)
    driver.random_ops(10)
    state = driver.buf.state_dict()
    before = driver.buf.state_dict()
    for key, value in [
        ("prev_slot", np.full(driver.buf.size, 99)),
        ("episode", np.zeros(3, np.int64)),
        ("next_episode", 0),
        ("open", np.zeros((1, 4), np.int64)),
    ]:
        broken = {**state, "episodes": {**state["episodes"], key: value}}
        with pytest.raises(ValueError, match=r"episode|open"):
            driver.buf.load_state_dict(broken)
        after = driver.buf.state_dict()
        for part in ("episode", "step", "prev_slot", "next_slot", "open"):
            np.testing.assert_array_equal(after["episodes"][part], before["episodes"][part])


def test_rejected_writes_leave_the_index_unchanged() -> None:
    driver = StreamDriver(make(30), 3)
    driver.random_ops(10)
    before = driver.buf.state_dict()["episodes"]
    fields = driver.fields(np.arange(4.0), np.zeros((4, 2), bool))
    fields["reward"]["agent_0"][2] = np.nan
    with pytest.raises(ValueError):
        driver.buf.extend(**fields, truncated=np.array([0, 1, 0, 1], bool))
    fields["reward"]["agent_0"][2] = 0
    with pytest.raises(ValueError, match="truncated has shape"):
        driver.buf.extend(**fields, truncated=np.zeros(3, bool))
    with pytest.raises(ValueError, match="unknown agent"):
        driver.buf.add_envs(**fields, truncated={"nobody": np.zeros(4, bool)})
    after = driver.buf.state_dict()["episodes"]
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


# ------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"length": 0}, ValueError, "length must be a positive int"),
        ({"length": 2.0}, ValueError, "length"),
        ({"length": 2, "burn_in": -1}, ValueError, "burn_in"),
        ({"length": 2, "pad": "yes"}, TypeError, "pad must be a bool"),
        ({"length": 2, "prioritized": 1}, TypeError, "prioritized must be a bool"),
        ({"length": 2, "eta": 1.5}, ValueError, "eta"),
        ({"length": 2, "alpha": -1}, ValueError, "alpha"),
        ({"length": 2, "beta": 2}, ValueError, "beta"),
        ({"length": 2, "eps": float("nan")}, ValueError, "eps"),
    ],
)
def test_bad_sequence_arguments(args: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Sequence(**args)


def test_sequences_longer_than_the_buffer_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit a buffer of capacity=5"):
        MultiAgentReplayBuffer(SPECS, 5, sampler=Sequence(length=4, burn_in=2))


@pytest.mark.parametrize(
    ("call", "truncated", "error", "match"),
    [
        ("add", "yes", TypeError, "must be bools"),
        ("add", 2, ValueError, "must be bools"),
        ("add", [True], ValueError, r"shape \(1,\)"),
        ("add", {"agent_9": True}, ValueError, "unknown agent 'agent_9'"),
        ("add", {"agent_0": [True]}, ValueError, r"truncated\['agent_0'\] has shape"),
        ("extend", True, ValueError, "would end an episode at each"),
        ("extend", np.zeros((2, 3), bool), ValueError, "truncated has shape"),
        ("add_envs", np.zeros(5, bool), ValueError, "truncated has shape"),
    ],
)
def test_bad_truncated(call: str, truncated: object, error: type, match: str) -> None:
    buf = make(30)
    driver = StreamDriver(buf)
    fields = driver.fields(np.arange(4.0), np.zeros((4, 2), bool))
    if call == "add":
        fields = {f: {a: x[0] for a, x in per.items()} for f, per in fields.items()}
    with pytest.raises(error, match=match):
        getattr(buf, call)(**fields, truncated=truncated)
    assert len(buf) == 0


def test_truncated_forms_for_every_sampler() -> None:
    """Other samplers accept (and ignore) truncated; add_envs broadcasts a bool; per-agent
    (n_agents, T) arrays count any agent."""
    for sampler in (None, Sequence(length=2)):
        buf = MultiAgentReplayBuffer(SPECS, 30, sampler=sampler)
        driver = StreamDriver(buf)
        fields = driver.fields(np.arange(4.0), np.zeros((4, 2), bool))
        buf.add_envs(**fields, truncated=True)
        buf.extend(**fields, truncated=np.array([[0, 1, 0, 0], [0, 0, 0, 1]]))
        buf.extend(**fields, truncated=[False, False, True, False])
        if buf.episodes is not None:
            np.testing.assert_array_equal(
                buf.episodes.step[:12], [0] * 4 + [0, 1, 0, 1, 0, 1, 2, 0]
            )


def test_memory_mapped_buffers_sample_the_same_sequences(tmp_path) -> None:
    mapped = MultiAgentReplayBuffer(
        SPECS, 40, sampler=Sequence(length=4, burn_in=1), seed=1, path=tmp_path / "m"
    )
    driver = StreamDriver(mapped, 2)
    driver.random_ops(20)
    check_batch(driver, mapped.sample(16), 4, 1)
    mapped.close()


def test_to_torch_carries_the_mask() -> None:
    torch = pytest.importorskip("torch")
    driver = StreamDriver(make(30))
    driver.extend(20)
    batch = driver.buf.sample(4).to_torch()
    assert batch.mask.dtype == torch.bool and tuple(batch.mask.shape) == (4, 6)
    assert tuple(batch.obs["agent_0"].shape) == (4, 6, 3)


def test_config_round_trip_and_memory_estimate() -> None:
    sampler = Sequence(length=8, burn_in=3, pad=False, prioritized=True, eta=0.5)
    again = Sampler.from_config("Sequence", sampler.config())
    assert again.config() == sampler.config() and again.weighted
    plain = estimate(SPECS, 1000)
    with_index = estimate(SPECS, 1000, episodes=True)
    assert with_index.metadata_bytes - plain.metadata_bytes >= 1000 * 33
    assert isinstance(EpisodeIndex(10).nbytes, int)


def test_sharded_buffer_refuses_whole_episodes() -> None:
    """Sequences are sampled by shards (tests/distributed/test_distributed.py); whole
    episodes padded to the batch's longest are not (refused before Ray starts)."""
    pytest.importorskip("ray")
    from marlbuf.distributed import ShardedReplayBuffer
    from marlbuf.samplers import Episodes

    with pytest.raises(TypeError, match="does not sample whole episodes"):
        ShardedReplayBuffer(SPECS, 100, n_shards=2, sampler=Episodes())


def test_explicit_gather_stays_a_plain_batch() -> None:
    driver = StreamDriver(make(30))
    driver.extend(20)
    batch = driver.buf.gather(np.arange(5))
    assert type(batch) is Batch and batch.obs["agent_0"].shape == (5, 3)


@pytest.mark.parametrize(
    "args", [{}, {"pad": False}, {"prioritized": True}, {"prioritized": True, "pad": False}]
)
def test_replace_false_draws_distinct_starts(args: dict) -> None:
    driver = StreamDriver(make(40, length=3, burn_in=1, replace=False, **args), 8)
    while driver.buf.size < 40:
        driver.random_ops(3)
    sampler = driver.buf.sampler
    assert isinstance(sampler, Sequence) and sampler.config()["replace"] is False
    valid = set(driver.naive.valid_starts(3)) if args.get("pad") is False else set(range(40))
    for _ in range(30):
        batch = driver.buf.sample(12)
        starts = batch.indices.tolist()
        assert len(set(starts)) == 12 and set(starts) <= valid
        check_batch(driver, batch, 3, 1)
        if batch.weights is not None:
            mass = sampler.trees.leaves(0)[batch.indices]  # type: ignore[union-attr]
            np.testing.assert_allclose(batch.weights, (mass.min() / mass) ** 0.4, rtol=1e-6)
    with pytest.raises(ValueError, match="distinct sequences"):
        driver.buf.sample(len(valid) + 1)


def test_replace_false_is_uniform_over_stored_slots() -> None:
    driver = StreamDriver(make(30, length=4, burn_in=1, replace=False), 4)
    driver.random_ops(10)
    counts = np.zeros(30)
    for _ in range(400):
        drawn = driver.buf.sample(10).indices
        assert len(set(drawn.tolist())) == 10
        np.add.at(counts, drawn, 1)
    assert chisquare(counts[: driver.buf.size]).pvalue > 1e-3


@pytest.mark.parametrize(
    "mutate",
    [
        "episode of a filled slot",
        "negative step",
        "repeated pair",
        "open stream repeated",
        "open episode id",
        "complete outside",
        "complete twice",
    ],
)
def test_crafted_episode_indexes_are_refused(mutate: str) -> None:
    """The episode index of a state is checked as a whole before anything changes."""
    driver = StreamDriver(make(30))
    driver.extend(25)
    state = driver.buf.state_dict()
    episodes = {k: np.array(v, copy=True) for k, v in state["episodes"].items()}
    if mutate == "episode of a filled slot":
        episodes["episode"][3] = -1
    elif mutate == "negative step":
        episodes["step"][3] = -2
    elif mutate == "repeated pair":
        episodes["episode"][4] = episodes["episode"][3]
        episodes["step"][4] = episodes["step"][3]
    elif mutate == "open stream repeated":
        episodes["open"] = np.concatenate([episodes["open"], episodes["open"]])
    elif mutate == "open episode id":
        episodes["open"][0, 1] = int(state["episodes"]["next_episode"])
    elif mutate == "complete outside":
        episodes["complete"] = np.array([0, 99])
    else:
        episodes["complete"] = np.array([0, 0])
    episodes["next_episode"] = state["episodes"]["next_episode"]
    before = driver.buf.state_dict()
    with pytest.raises(ValueError, match="corrupt state"):
        driver.buf.load_state_dict({**state, "episodes": episodes})
    after = driver.buf.state_dict()
    np.testing.assert_array_equal(after["episodes"]["episode"], before["episodes"]["episode"])
