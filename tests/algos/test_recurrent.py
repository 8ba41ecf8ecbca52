"""Recurrent MADDPG (marlbuf.algos.recurrent): GRU unrolls over masked sequences, burn-in,
masked losses, and a short training run end to end."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf.algos.recurrent import (  # noqa: E402
    Actor,
    RecurrentConfig,
    RecurrentMADDPG,
    make_buffer,
    train,
)


def _actor(seed: int = 0) -> Actor:
    torch.manual_seed(seed)
    return Actor(6, 5, 16)


def test_unroll_holds_the_state_at_zero_through_masked_steps():
    actor = _actor()
    obs = torch.randn(4, 9, 6)
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[:, :3] = False  # the episode begins at step 3 (front padding)
    with torch.no_grad():
        logits, states = actor.unroll(obs, mask)
        alone, alone_states = actor.unroll(obs[:, 3:], mask[:, 3:])
    assert torch.equal(states[:, :3], torch.zeros_like(states[:, :3]))
    torch.testing.assert_close(logits[:, 3:], alone, rtol=0, atol=0)
    torch.testing.assert_close(states[:, 3:], alone_states, rtol=0, atol=0)


def test_unroll_matches_step_by_step_acting():
    actor = _actor(1)
    obs = torch.randn(1, 7, 6)
    mask = torch.ones(1, 7, dtype=torch.bool)
    with torch.no_grad():
        logits, _ = actor.unroll(obs, mask)
        state = torch.zeros(1, 16)
        for t in range(7):
            out, state = actor.step(obs[:, t], state)
            torch.testing.assert_close(out, logits[:, t], rtol=0, atol=0)


def test_burn_in_steps_carry_no_gradient():
    actor = _actor(2)
    obs = torch.randn(3, 8, 6, requires_grad=True)
    mask = torch.ones(3, 8, dtype=torch.bool)
    logits, _ = actor.unroll(obs, mask, grad_from=4)
    logits[:, 4:].sum().backward()
    assert obs.grad is not None
    assert torch.count_nonzero(obs.grad[:, :4]) == 0  # burn-in inputs: no gradient
    assert torch.count_nonzero(obs.grad[:, 4:]) > 0


def _filled_buffer(config: RecurrentConfig):
    rng = np.random.default_rng(0)
    buffer = make_buffer([6, 6], 5, 12, config)
    obs = rng.standard_normal((2, 6)).astype(np.float32)
    for step in range(200):
        next_obs = rng.standard_normal((2, 6)).astype(np.float32)  # the next step's obs
        buffer.add(
            obs,
            rng.random((2, 5)).astype(np.float32),
            rng.standard_normal(2),
            next_obs,
            np.zeros(2),
            truncated=step % 25 == 24,
            state=rng.standard_normal(12).astype(np.float32),
            next_state=rng.standard_normal(12).astype(np.float32),
        )
        obs = next_obs
    return buffer


def _params(learner: RecurrentMADDPG) -> list[torch.Tensor]:
    nets = learner.actors + learner.critics
    return [p.detach().clone() for net in nets for p in net.parameters()]


def test_masked_steps_do_not_change_the_update():
    config = RecurrentConfig(length=8, burn_in=4, batch_size=16, buffer_size=1000, seed=3)
    buffer = _filled_buffer(config)
    batch = buffer.sample(16)
    assert not batch.mask.all()  # sequences run past episode ends: some steps are masked
    changed = copy.deepcopy(batch)
    for agent in changed.agents:  # garbage in every masked step
        changed.reward[agent][~changed.mask] = 1e3
        changed.obs[agent][~changed.mask] = 7.0
        changed.next_obs[agent][~changed.mask] = -7.0
    changed.globals["state"][~changed.mask] = 5.0
    a = RecurrentMADDPG([6, 6], 5, 12, config)
    b = RecurrentMADDPG([6, 6], 5, 12, config)
    stats_a = a.update(batch)
    stats_b = b.update(changed)
    for x, y in zip(_params(a), _params(b)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    np.testing.assert_array_equal(stats_a["td_abs"], stats_b["td_abs"])
    k = batch.burn_in
    assert (stats_a["td_abs"][~batch.mask[:, k:]] == 0).all()


def test_a_short_run_trains_and_evaluates():
    pytest.importorskip("mpe2")
    config = RecurrentConfig(
        episodes=6, warmup_steps=50, batch_size=4, length=4, burn_in=2, update_every=25, seed=0
    )
    result = train(config, evaluate_episodes=2)
    assert len(result.records) == 6
    assert result.records[-1].updates == (6 * 25 - 50) // 25 + 1
    assert len(result.eval_before) == len(result.eval_after) == 2
    assert all(np.isfinite(result.eval_after))


def test_prioritized_sequences_take_the_per_step_errors():
    config = RecurrentConfig(
        length=8, burn_in=4, batch_size=8, buffer_size=1000, seed=4, prioritized=True
    )
    buffer = _filled_buffer(config)
    learner = RecurrentMADDPG([6, 6], 5, 12, config)
    batch = buffer.sample(8)
    assert batch.weights is not None
    stats = learner.update(batch)
    buffer.update_priorities(batch.indices, stats["td_abs"])  # (B, length) per-step errors


@pytest.mark.parametrize("bad", [{"length": 0}, {"burn_in": -1}, {"gamma": 1.5}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RecurrentConfig(**bad)
