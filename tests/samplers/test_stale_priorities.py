"""``update_priorities`` for slots overwritten since they were sampled.

With ``generations=batch.generations`` the sampler drops the updates of overwritten slots.
Without it, the buffer must still not give a stale TD error to the *new* contents of a slot:
either it knows which writes the indices were sampled from, or it refuses the call. Either
way the priorities of the new contents (and the running maximum new slots get) stay as they
were.
"""

from __future__ import annotations

import numpy as np
import pytest

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Prioritized, PrioritizedNeighbor

CAPACITY = 16
SPECS = {
    "a0": AgentSpec(obs_shape=(3,), action_shape=(2,)),
    "a1": AgentSpec(obs_shape=(4,), action_shape=(3,), n_discrete_actions=3),
    "a2": AgentSpec(obs_shape=(2,), action_shape=(1,)),
}
TRAINER = 1


def steps(buf, count, rng):
    data = {f: {} for f in FIELDS}
    for a, s in SPECS.items():
        data["obs"][a] = rng.standard_normal((count, *s.obs_shape))
        data["next_obs"][a] = rng.standard_normal((count, *s.obs_shape))
        data["action"][a] = (
            rng.integers(0, 3, count)
            if s.n_discrete_actions
            else rng.standard_normal((count, *s.action_shape))
        )
        data["reward"][a] = rng.standard_normal(count)
        data["done"][a] = np.zeros(count)
    buf.extend(**data)


def tree_state(buf):
    trees = buf.sampler.trees
    state = {"max_priority": trees.max_priority.copy()}
    for t in range(buf.n_trainers):
        state[f"leaves {t}"] = trees.leaves(t).copy()
        if trees.track_max:
            state[f"priorities {t}"] = trees.priorities(t).copy()
    return state


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("sampler", [Prioritized, PrioritizedNeighbor])
@pytest.mark.parametrize("overwrite", [5, CAPACITY])
def test_update_without_generations_leaves_new_contents_alone(layout, sampler, overwrite):
    rng = np.random.default_rng(0)
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, layout=layout, sampler=sampler(), seed=0)
    steps(buf, CAPACITY, rng)
    batch = buf.sample(12, trainer=TRAINER)
    sampled = set(batch.indices.tolist())
    new_slots = {(buf.cursor + k) % CAPACITY for k in range(overwrite)}
    steps(buf, overwrite, rng)  # overwrite `overwrite` slots after sampling
    stale = sampled & new_slots
    fresh = sampled - new_slots
    assert stale, "the scenario needs at least one overwritten sampled slot"
    before = tree_state(buf)
    td = np.full(len(batch), 7.0)
    try:
        buf.update_priorities(batch.indices, td, trainer=TRAINER)
    except ValueError:
        # refusing (the indices are stale and no generations were given) is correct too
        after = tree_state(buf)
        for key in before:
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
        return
    after = tree_state(buf)
    stale_slots = sorted(stale)
    for key in before:
        if key == "max_priority":
            continue
        np.testing.assert_array_equal(
            after[key][stale_slots],
            before[key][stale_slots],
            err_msg=f"{key}: a stale TD error reached the new contents of slots {stale_slots}",
        )
        if not key.endswith(str(TRAINER)):  # other trainers' trees are not touched at all
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    if fresh:  # slots still holding what was sampled get their update
        expected = (7.0 + buf.sampler.eps) ** buf.sampler.alpha
        np.testing.assert_allclose(after[f"leaves {TRAINER}"][sorted(fresh)], expected)
    else:  # nothing was applied, so the running maximum new slots get must not move
        np.testing.assert_array_equal(after["max_priority"], before["max_priority"])


@pytest.mark.parametrize("sampler", [Prioritized, PrioritizedNeighbor])
def test_update_with_generations_drops_overwritten_slots(sampler):
    """The documented path (already working): the same scenario with ``generations``."""
    rng = np.random.default_rng(1)
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, sampler=sampler(), seed=0)
    steps(buf, CAPACITY, rng)
    batch = buf.sample(12, trainer=TRAINER)
    steps(buf, 5, rng)
    stale = sorted(set(batch.indices.tolist()) & set(range(5)))
    before = tree_state(buf)
    buf.update_priorities(
        batch.indices, np.full(12, 7.0), trainer=TRAINER, generations=batch.generations
    )
    after = tree_state(buf)
    np.testing.assert_array_equal(
        after[f"leaves {TRAINER}"][stale], before[f"leaves {TRAINER}"][stale]
    )


@pytest.mark.parametrize("sampler", [Prioritized, PrioritizedNeighbor])
def test_old_batch_updated_after_a_newer_batch_of_the_same_slots(sampler):
    """``update_priorities(old.indices, td)`` after a newer batch drew the same slots again,
    with the slots overwritten in between: the old update is dropped (its rows are gone), the
    newer one applies; in either order of the two updates."""
    for newer_first in (True, False):
        rng = np.random.default_rng(1)
        buf = MultiAgentReplayBuffer(SPECS, CAPACITY, sampler=sampler(), seed=3)
        steps(buf, CAPACITY, rng)
        old = buf.sample(64, trainer=TRAINER)  # with replacement: every slot, many times
        steps(buf, CAPACITY, rng)  # every slot overwritten: the old batch's rows are gone
        new = buf.sample(64, trainer=TRAINER)
        assert set(old.indices.tolist()) & set(new.indices.tolist())
        td_old = np.full(64, 1e3)  # would dominate the tree if it were (wrongly) applied
        td_new = np.arange(1, 65, dtype=np.float64)
        if newer_first:
            buf.update_priorities(new.indices, td_new, trainer=TRAINER)
            before = tree_state(buf)
            buf.update_priorities(old.indices, td_old, trainer=TRAINER)
            for key, value in tree_state(buf).items():
                np.testing.assert_array_equal(value, before[key], err_msg=key)
        else:
            before = tree_state(buf)
            buf.update_priorities(old.indices, td_old, trainer=TRAINER)
            for key, value in tree_state(buf).items():
                np.testing.assert_array_equal(value, before[key], err_msg=key)
            buf.update_priorities(new.indices, td_new, trainer=TRAINER)
        # the newer batch's slots carry the newer batch's priorities (the last duplicate wins)
        leaves = buf.sampler.trees.leaves(TRAINER)
        last = {int(s): td for s, td in zip(new.indices, td_new)}
        for slot, td in last.items():
            assert leaves[slot] == pytest.approx((td + buf.sampler.eps) ** buf.sampler.alpha)


def test_drawn_indices_carry_generations_only_on_the_handed_out_array():
    rng = np.random.default_rng(2)
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, sampler=Prioritized(), seed=0)
    steps(buf, CAPACITY, rng)
    batch = buf.sample(8, trainer=0)
    np.testing.assert_array_equal(batch.indices.generations, batch.generations)
    assert batch.indices.dtype == np.int64 and batch.indices.shape == (8,)
    for derived in (batch.indices.copy(), batch.indices + 0):
        assert derived.generations is None
    # indexing keeps the generations of the entries it takes
    order = np.argsort(batch.indices, kind="stable")
    for taken, key in ((batch.indices[::-1], slice(None, None, -1)), (batch.indices[order], order)):
        np.testing.assert_array_equal(taken.generations, batch.generations[key])
    assert type(np.asarray(batch.indices.tolist())) is np.ndarray
