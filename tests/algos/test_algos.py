"""MADDPG / MATD3 learners: both formulations agree, MATD3's specifics, runner, checkpoints."""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf import FIELDS, MultiAgentReplayBuffer  # noqa: E402
from marlbuf.algos import (  # noqa: E402
    BatchedLearner,
    LoopLearner,
    NullProfiler,
    Runner,
    TrainConfig,
)
from marlbuf.algos.nets import clip_grad_by_norm_, gumbel_softmax  # noqa: E402
from marlbuf.algos.stacking import RoundBlock, stack_fields  # noqa: E402
from marlbuf.samplers import Prioritized  # noqa: E402
from marlbuf.workloads import Workload, random_steps  # noqa: E402

F64 = torch.float64


def filled_buffer(workload: Workload, sampler: Any = None, steps: int = 600) -> Any:
    specs = workload.specs()
    buf = MultiAgentReplayBuffer(specs, capacity=1000, sampler=sampler, seed=1)
    buf.extend(**random_steps(specs, steps, np.random.default_rng(2)))
    return buf


def learners(config: TrainConfig, workload: Workload, dtype: Any) -> tuple[Any, Any]:
    dims = workload.obs_dims()
    return (
        LoopLearner(config, dims, 5, seed=3, dtype=dtype),
        BatchedLearner(config, dims, 5, seed=3, dtype=dtype),
    )


def max_param_diff(a: Any, b: Any) -> float:
    pa, pb = a.get_params(), b.get_params()
    return max(float((x[k] - y[k]).abs().max()) for x, y in zip(pa, pb) for k in x)


CASES = [
    ("maddpg", Workload("cooperative_navigation", 3), None),
    ("maddpg-independent-targets", Workload("cooperative_navigation", 3), None),
    ("matd3", Workload("cooperative_navigation", 3), None),
    ("maddpg", Workload("predator_prey", 3), None),  # 16/14 obs: padded, grouped actors
    ("matd3", Workload("predator_prey", 6), "prioritized"),  # weighted critic loss
]


@pytest.mark.parametrize(("algo", "workload", "sampler"), CASES)
def test_batched_equals_loop(algo: str, workload: Workload, sampler: str | None) -> None:
    target_init = "independent" if algo.endswith("independent-targets") else "copy"
    config = TrainConfig(algo=algo.split("-")[0], batch_size=64, target_init=target_init)
    loop, batched = learners(config, workload, F64)
    assert max_param_diff(loop, batched) == 0.0  # same initial weights
    buf = filled_buffer(workload, Prioritized() if sampler else None)
    block = RoundBlock(buf, workload.n_trainers, 64)
    for _ in range(3):
        batches = buf.sample_for_trainers(64, out=block.out())
        block.keep(batches)
        a, b = loop.update(batches), batched.update(batches)
        np.testing.assert_allclose(a.critic_loss, b.critic_loss, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(a.actor_loss, b.actor_loss, rtol=1e-9, atol=1e-9)
        for x, y in zip(a.td_errors, b.td_errors):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
        assert a.actor_updated == b.actor_updated
    assert max_param_diff(loop, batched) <= 1e-10
    obs = [np.full(d, 0.1, np.float32) for d in workload.obs_dims()]
    for x, y in zip(loop.act(obs), batched.act(obs)):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_target_init() -> None:
    dims = [18] * 3
    for target_init, same in (("copy", True), ("independent", False)):
        params = LoopLearner(TrainConfig(target_init=target_init), dims, 5).get_params()
        assert torch.equal(params[0]["actor.l0.W"], params[0]["target_actor.l0.W"]) == same
        assert params[0]["target_critic.l0.W"].shape == params[0]["critic.l0.W"].shape


def test_batched_equals_loop_float32_agent_major() -> None:
    """The compute dtype of real runs, and batches that are not views of one block."""
    workload = Workload("predator_prey", 3)
    config = TrainConfig(batch_size=128)
    loop, batched = learners(config, workload, None)
    specs = workload.specs()
    buf = MultiAgentReplayBuffer(specs, capacity=1000, layout="agent_major", seed=1)
    buf.extend(**random_steps(specs, 600, np.random.default_rng(2)))
    batches = buf.sample_for_trainers(128)
    a, b = loop.update(batches), batched.update(batches)
    np.testing.assert_allclose(a.critic_loss, b.critic_loss, rtol=1e-5)
    np.testing.assert_allclose(a.actor_loss, b.actor_loss, rtol=1e-5)
    assert max_param_diff(loop, batched) <= 1e-5


def test_round_block_stacks_without_copy() -> None:
    workload = Workload("cooperative_navigation", 3)
    buf = filled_buffer(workload)
    block = RoundBlock(buf, 3, 32)
    batches = buf.sample_for_trainers(32, out=block.out())
    stacked = stack_fields(batches, "obs", "action")
    expected = np.stack([b.concat("obs", "action") for b in batches])
    np.testing.assert_array_equal(stacked, expected)
    assert np.shares_memory(stacked, batches[0].block)
    plain = buf.sample_for_trainers(32)  # separate allocations: falls back to a copy
    np.testing.assert_array_equal(
        stack_fields(plain, "next_obs"), np.stack([b.concat("next_obs") for b in plain])
    )


def test_matd3_policy_delay() -> None:
    workload = Workload("cooperative_navigation", 3)
    config = TrainConfig(algo="matd3", batch_size=32, policy_delay=2)
    learner = BatchedLearner(config, workload.obs_dims(), 5, seed=0)
    buf = filled_buffer(workload)
    updated = []
    for _ in range(4):
        before = learner.get_params()
        stats = learner.update(buf.sample_for_trainers(32))
        after = learner.get_params()
        actor_moved = any(
            not torch.equal(b[k], a[k])
            for b, a in zip(before, after)
            for k in a
            if k.startswith("actor.")
        )
        target_moved = any(
            not torch.equal(b[k], a[k])
            for b, a in zip(before, after)
            for k in a
            if k.startswith("target_")
        )
        critic_moved = all(
            not torch.equal(b["critic2.l0.W"], a["critic2.l0.W"]) for b, a in zip(before, after)
        )
        assert actor_moved == target_moved == stats.actor_updated
        assert critic_moved  # both critics update every round
        assert np.isnan(stats.actor_loss).all() != stats.actor_updated
        updated.append(stats.actor_updated)
    assert updated == [True, False, True, False]


def test_matd3_target_smoothing_noise() -> None:
    workload = Workload("cooperative_navigation", 3)
    config = TrainConfig(algo="matd3", target_noise=0.2, target_noise_clip=0.5)
    noise = BatchedLearner(config, workload.obs_dims(), 5, seed=0).draw_round_noise(4096)
    assert noise.smoothing is not None and noise.smoothing.shape == (3, 3, 4096, 5)
    smoothing = noise.smoothing.numpy()
    assert smoothing.min() >= -0.5 and smoothing.max() <= 0.5
    assert (np.abs(smoothing) == 0.5).mean() > 0.005  # 2-sigma tails are clipped
    assert abs(smoothing.std() - 0.2) < 0.01
    for off in (TrainConfig(algo="maddpg"), TrainConfig(algo="matd3", target_noise=0.0)):
        assert BatchedLearner(off, [18] * 3, 5).draw_round_noise(8).smoothing is None


def test_matd3_uses_min_of_twin_targets() -> None:
    """Constant target critics Q'_1 = -5 and Q'_2 = 3 and an online critic Q_1 = 0: the TD
    error is -y with y = r + gamma (1 - done) min(-5, 3)."""
    workload = Workload("cooperative_navigation", 3)
    config = TrainConfig(algo="matd3", gamma=0.5)
    learner = LoopLearner(config, workload.obs_dims(), 5, seed=0, dtype=F64)
    buf = filled_buffer(workload)
    batch = buf.sample(16)
    with torch.no_grad():
        for p in learner.params:
            for net, value in (("target_critic", -5.0), ("target_critic2", 3.0), ("critic", 0.0)):
                p[f"{net}.l2.W"].zero_()
                p[f"{net}.l2.b"].fill_(value)
    learner.begin_round(16)
    _, _, td = learner.update_trainer(0, batch)
    agent = batch.agents[0]
    y = batch.reward[agent] + 0.5 * (1.0 - batch.done[agent]) * -5.0
    np.testing.assert_allclose(td, np.abs(y), rtol=1e-6)


def test_gumbel_softmax_is_a_soft_sample() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    uniform = torch.full_like(logits, np.exp(-1.0))  # Gumbel noise -log(-log(u)) = 0
    np.testing.assert_allclose(gumbel_softmax(logits, uniform), torch.softmax(logits, -1))
    sample = gumbel_softmax(torch.zeros(100, 5), torch.rand(100, 5))
    np.testing.assert_allclose(sample.sum(-1), np.ones(100), rtol=1e-6)


def test_clip_by_norm_per_trainer_slice() -> None:
    grads = [torch.tensor([[3.0, 4.0], [0.3, 0.4]])]  # norms 5 and 0.5
    clip_grad_by_norm_(grads, 1.0, stacked=True)
    np.testing.assert_allclose(grads[0], [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
    single = [torch.tensor([3.0, 4.0])]
    clip_grad_by_norm_(single, 1.0, stacked=False)
    np.testing.assert_allclose(single[0], [0.6, 0.8], rtol=1e-6)


# ---------------------------------------------------------------------------- runner

SMALL = {"batch_size": 32, "buffer_size": 3000, "warmup_steps": 100}


class CountingProfiler:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.stack: list[str] = []
        self.nesting: set[tuple[str, str]] = set()

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        self.counts[name] += 1
        if self.stack:
            self.nesting.add((self.stack[-1], name))
        self.stack.append(name)
        try:
            yield
        finally:
            self.stack.pop()


@pytest.mark.parametrize("formulation", ["batched", "loop"])
def test_runner_phases(formulation: str) -> None:
    prof = CountingProfiler()
    runner = Runner(TrainConfig(formulation=formulation, **SMALL), profiler=prof)
    runner.train(8)  # 200 steps: rounds at steps 100 and 200
    assert runner.total_steps == 200 and runner.update_rounds == 2
    for name in ("action_selection", "env_step", "buffer_add"):
        assert prof.counts[name] == 200
    assert prof.counts["update_all_trainers"] == 2
    per_round = 1 if formulation == "batched" else 3
    assert prof.counts["sampling"] == 2 * per_round
    assert prof.counts["target_q"] == 2 * per_round
    assert prof.counts["priority_update"] == 0  # uniform sampler
    inner = {"sampling", "target_q", "q_p_loss"}
    assert {child for parent, child in prof.nesting} == inner
    assert {parent for parent, child in prof.nesting} == {"update_all_trainers"}


def test_null_profiler_is_a_shared_no_op() -> None:
    null = NullProfiler()
    assert null.phase("env_step") is null.phase("sampling")
    with null.phase("env_step"):
        pass


def test_prioritized_runner_feeds_priorities_back() -> None:
    prof = CountingProfiler()
    config = TrainConfig(sampler="prioritized", **SMALL)
    runner = Runner(config, profiler=prof)
    runner.train(4)
    assert prof.counts["priority_update"] == 1
    trees = runner.buffer.sampler.trees  # type: ignore[attr-defined]
    leaves = trees.sums[0][trees.leaf_offset : trees.leaf_offset + len(runner.buffer)]
    assert len(np.unique(leaves)) > 2  # no longer the uniform initial priority


def test_loop_and_batched_runners_agree_and_overlap_changes_nothing() -> None:
    results = []
    for options in (
        {"formulation": "batched"},
        {"formulation": "loop"},
        {"formulation": "loop", "overlap_gather": True},
    ):
        runner = Runner(TrainConfig(algo="matd3", **SMALL, **options))
        results.append([r.ret for r in runner.train(12)])
        runner.close()
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4)
    assert results[1] == results[2]


def test_checkpoint_resume_is_exact(tmp_path: Any) -> None:
    config = dict(algo="matd3", sampler="prioritized", **SMALL)
    straight = Runner(TrainConfig(**config))
    expected = [r.ret for r in straight.train(10)]
    first = Runner(TrainConfig(**config))
    got = [r.ret for r in first.train(5)]
    first.save_checkpoint(tmp_path / "ckpt")
    second = Runner(TrainConfig(**config))
    second.load_checkpoint(tmp_path / "ckpt")
    got += [r.ret for r in second.train(5)]
    assert got == expected
    assert (second.total_steps, second.update_rounds) == (straight.total_steps, 2)
    for a, b in zip(straight.learner.get_params(), second.learner.get_params()):
        for k in a:
            assert torch.equal(a[k], b[k]), k
    sa, sb = straight.buffer.state_dict(), second.buffer.state_dict()
    np.testing.assert_array_equal(sa["storage"]["table"], sb["storage"]["table"])
    assert sa["rng"] == sb["rng"]


def test_checkpoint_rejects_other_config(tmp_path: Any) -> None:
    runner = Runner(TrainConfig(**SMALL))
    runner.train(1)
    runner.save_checkpoint(tmp_path / "c")
    other = Runner(TrainConfig(**{**SMALL, "batch_size": 64}))
    with pytest.raises(ValueError, match="batch_size"):
        other.load_checkpoint(tmp_path / "c")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"algo": "ddpg"}, "algo"),
        ({"n_agents": 0}, "n_agents"),
        ({"n_agents": 49}, "n_agents"),
        ({"sampler": "prioritized", "shared_index": True}, "shared_index"),
        ({"sampler": "neighbor", "run_length": 48}, "run_length"),
        ({"overlap_gather": True}, "overlap_gather"),
        ({"warmup_steps": 10}, "warmup_steps"),
        ({"buffer_size": 1000}, "buffer"),
        ({"env": "cooperative_navigation", "n_prey": 2}, "n_prey"),
        ({"gamma": 1.5}, "gamma"),
        ({"device": "tpu"}, "device"),
        ({"target_init": "zeros"}, "target_init"),
    ],
)
def test_bad_config_is_rejected_before_work(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**options)


def test_cuda_request_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="cuda"):
        BatchedLearner(TrainConfig(device="cuda"), [18] * 3, 5)


def test_profiler_without_phase_is_rejected() -> None:
    with pytest.raises(TypeError, match="phase"):
        Runner(TrainConfig(**SMALL), profiler=object())


@pytest.mark.slow
def test_maddpg_learns_cooperative_navigation() -> None:
    """A seeded short run beats the same seed's untrained policy by a clear margin on the same
    evaluation episodes (measured margins over seeds 0-2: 126, 98, 74; random policy about
    -680 in original MPE units)."""
    config = TrainConfig(
        batch_size=128, warmup_steps=1250, update_every=5, buffer_size=20_000, seed=0
    )
    runner = Runner(config)
    untrained = np.mean(runner.evaluate(40))
    runner.train(400)
    trained = np.mean(runner.evaluate(40))
    assert trained > untrained + 40, (untrained, trained)


def test_shared_index_batches_give_the_same_numbers_in_both_formulations() -> None:
    workload = Workload("predator_prey", 3)
    loop, batched = learners(TrainConfig(batch_size=32, shared_index=True), workload, F64)
    buf = filled_buffer(workload)
    for _ in range(2):
        batches = buf.sample_for_trainers(32, shared_index=True)
        a, b = loop.update(batches), batched.update(batches)
        np.testing.assert_allclose(a.critic_loss, b.critic_loss, rtol=1e-9)
    assert max_param_diff(loop, batched) <= 1e-10


def test_float16_observation_storage_trains_on_float32_batches() -> None:
    config = TrainConfig(batch_size=32, warmup_steps=100, buffer_size=500, obs_dtype="float16")
    runner = Runner(config)
    try:
        assert all(s.obs_dtype == np.float16 for s in runner.buffer.specs.values())
        runner.train(10)
        assert runner.update_rounds > 0
        batch = runner.buffer.sample(8)
        assert all(x.dtype == np.float32 for x in batch.obs.values())
    finally:
        runner.close()
    with pytest.raises(ValueError, match="obs_dtype must be 'float32' or 'float16'"):
        TrainConfig(obs_dtype="float64").validate()


# ----------------------------------------------------------------- agents that come and go
def _buffer_with_absent_agents(workload: Workload) -> Any:
    """Random steps where each agent is absent from about a quarter of the steps (zero-filled,
    alive False), stored one step at a time as a PettingZoo loop would."""
    specs = workload.specs()
    buf = MultiAgentReplayBuffer(specs, capacity=400, seed=1, alive=True)
    rng = np.random.default_rng(5)
    data = random_steps(specs, 300, rng)
    for t in range(300):
        present = [a for a in specs if rng.random() > 0.25] or [next(iter(specs))]
        buf.add(
            *({a: data[f][a][t] for a in present} for f in FIELDS),
            alive={a: a in present for a in specs},
        )
    return buf


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_learners_ignore_absent_agents(algo: str) -> None:
    workload = Workload("cooperative_navigation", 3)
    buf = _buffer_with_absent_agents(workload)
    batches = buf.sample_for_trainers(64)
    assert not all(b.alive[a].all() for b in batches for a in b.agents)
    # garbage where it must not matter: the reward, done and weight of every absent step
    changed = [copy.deepcopy(b) for b in batches]
    for b in changed:
        for a in b.agents:
            b.reward[a][~b.alive[a]] = 1e3
            b.done[a][~b.alive[a]] = 0.5
    config = TrainConfig(algo=algo, batch_size=64)
    for make in (LoopLearner, BatchedLearner):
        a = make(config, workload.obs_dims(), 5, seed=3, dtype=F64)
        b = make(config, workload.obs_dims(), 5, seed=3, dtype=F64)
        stats_a, stats_b = a.update(batches), b.update(changed)
        np.testing.assert_array_equal(stats_a.critic_loss, stats_b.critic_loss)
        assert max_param_diff(a, b) == 0.0
        for batch, td in zip(batches, stats_a.td_errors):  # absent steps: no priority
            t = batch.trainer
            assert (td[~batch.alive[batch.agents[t]]] == 0).all()


def test_both_formulations_agree_with_absent_agents() -> None:
    workload = Workload("cooperative_navigation", 3)
    buf = _buffer_with_absent_agents(workload)
    loop, batched = learners(TrainConfig(batch_size=64), workload, F64)
    for _ in range(3):
        batches = buf.sample_for_trainers(64)
        a, b = loop.update(batches), batched.update(batches)
        np.testing.assert_allclose(a.critic_loss, b.critic_loss, rtol=1e-9)
    assert max_param_diff(loop, batched) <= 1e-10


def test_alive_masks_mark_who_acts_at_the_next_step() -> None:
    from marlbuf.algos.maddpg import _alive_masks

    workload = Workload("cooperative_navigation", 3)
    buf = _buffer_with_absent_agents(workload)
    batch = buf.sample(32)
    for b in (batch,):
        for a in b.agents:
            b.done[a][:5] = 1.0  # present but done: no action at the next step
    present, next_present = _alive_masks([batch], batch.agents, torch.from_numpy)
    for j, a in enumerate(batch.agents):
        np.testing.assert_array_equal(present[0, j].numpy(), batch.alive[a])
        expected = batch.alive[a] & (batch.done[a] == 0)
        np.testing.assert_array_equal(next_present[0, j].numpy(), expected)
    assert _alive_masks(filled_buffer(workload).sample_for_trainers(8), batch.agents, None) is None
