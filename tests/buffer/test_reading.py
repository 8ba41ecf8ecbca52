"""Reading what is stored without sampling (``latest``, ``stored``, ``reward_stats``) and the
rounds of every trainer (``sample_for_trainers``, ``iter_trainers``) for rows, sequences and
episodes."""

from __future__ import annotations

import numpy as np
import pytest
from datagen import random_step_data
from streams import StreamDriver, make_buffer

from marlbuf import MultiAgentReplayBuffer
from marlbuf.samplers import Episodes, Sequence, Uniform

LAYOUTS = ["interleaved", "agent_major"]


def _wrapped(specs, layout: str) -> tuple[MultiAgentReplayBuffer, dict]:
    """A 32-slot buffer after 50 steps (the first 18 overwritten) and the steps written."""
    data = random_step_data(specs, 50, np.random.default_rng(6))
    buf = MultiAgentReplayBuffer(specs, 32, layout=layout)
    buf.extend(**data)
    return buf, data


@pytest.mark.parametrize("layout", LAYOUTS)
def test_latest_returns_the_newest_steps_in_write_order(mixed_specs, layout):
    buf, data = _wrapped(mixed_specs, layout)
    newest = buf.latest(5)
    for agent in mixed_specs:
        np.testing.assert_array_equal(newest.obs[agent], data["obs"][agent][45:])
    with pytest.raises(ValueError, match=r"n must be in \[1, 32\]"):
        buf.latest(33)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stored_is_a_read_only_view_of_every_kept_value(mixed_specs, layout):
    buf, data = _wrapped(mixed_specs, layout)
    stored = buf.stored("reward")
    for agent in mixed_specs:
        assert stored[agent].shape == (32,) and not stored[agent].flags.writeable
        assert sorted(stored[agent].tolist()) == sorted(data["reward"][agent][18:].tolist())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reward_stats_are_the_mean_and_std_of_the_kept_rewards(mixed_specs, layout):
    buf, data = _wrapped(mixed_specs, layout)
    stats = buf.reward_stats()
    assert set(stats) == set(mixed_specs)
    for agent in mixed_specs:
        kept = data["reward"][agent][18:].astype(np.float64)
        mean, std = stats[agent]
        assert mean == pytest.approx(kept.mean()) and std == pytest.approx(kept.std())


SAMPLERS = {
    "rows": Uniform,
    "sequences": lambda: Sequence(length=4, burn_in=2),
    "episodes": lambda: Episodes(max_length=6),
}


@pytest.mark.parametrize("kind", SAMPLERS)
def test_iter_trainers_yields_the_rounds_of_sample_for_trainers(kind):
    """One batch per trainer, each drawn on its own (different slots), and ``iter_trainers``
    yields the same batches as ``sample_for_trainers`` from the same generator state."""
    driver = StreamDriver(make_buffer(SAMPLERS[kind](), 80), 9)
    driver.random_ops(20, episodes=True)  # whole episodes among the writes: some are complete
    batches = driver.buf.sample_for_trainers(8)
    assert [batch.trainer for batch in batches] == list(range(driver.buf.n_trainers)) == [0, 1]
    assert not np.array_equal(batches[0].indices, batches[1].indices)
    twin = make_buffer(SAMPLERS[kind](), 80)
    twin.load_state_dict(driver.buf.state_dict())
    driver.buf.rng = np.random.default_rng(5)
    twin.rng = np.random.default_rng(5)
    rounds = driver.buf.sample_for_trainers(8)
    streamed = list(twin.iter_trainers(8))
    assert len(streamed) == len(rounds)
    for a, b in zip(rounds, streamed):
        assert a.trainer == b.trainer
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.concat("obs"), b.concat("obs"))
        if kind != "rows":
            np.testing.assert_array_equal(a.slots, b.slots)
            np.testing.assert_array_equal(a.mask, b.mask)
