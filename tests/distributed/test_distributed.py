"""marlbuf.distributed on a real local Ray instance (2 CPUs, one for the whole module).

No mocks: shards are Ray actors, a dead shard is a killed (or stopped) worker process. If Ray
cannot start, these tests fail rather than skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from scipy.stats import chisquare

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.distributed import RateLimiter, ShardedReplayBuffer, ShardError, init_ray
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Uniform

SPECS = {f"agent_{i}": AgentSpec(obs_shape=(2,), action_shape=(2,)) for i in range(2)}


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    init_ray(num_cpus=2, object_store_memory=256 * 2**20)
    assert ray.is_initialized()
    yield
    ray.shutdown()


def steps(ids, stream=0):
    """Transitions whose obs encode (stream, id) and next_obs (stream, id + 1)."""
    ids = np.asarray(ids, dtype=np.float32)
    obs = np.stack([np.full_like(ids, stream), ids], axis=1)
    nxt = np.stack([np.full_like(ids, stream), ids + 1], axis=1)
    return {
        "obs": {a: obs for a in SPECS},
        "action": {a: np.zeros((len(ids), 2), np.float32) for a in SPECS},
        "reward": {a: ids for a in SPECS},
        "next_obs": {a: nxt for a in SPECS},
        "done": {a: np.zeros(len(ids), np.float32) for a in SPECS},
    }


def one_step(t, stream):
    """One timestep (no time axis) of :func:`steps`."""
    many = steps([t], stream)
    return {f: {a: v[0] for a, v in many[f].items()} for f in many}


def fill(buf, sizes):
    """Shard k gets ids k*1000 + [0, sizes[k]) through stream k."""
    for k, n in enumerate(sizes):
        buf.extend(**steps(k * 1000 + np.arange(n), stream=k), stream=k)
    buf.flush()


def test_import_marlbuf_does_not_import_ray():
    code = "import marlbuf, sys; assert 'ray' not in sys.modules, 'ray imported'"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize(
    "batch_layout", ["rows", pytest.param("per_agent", marks=pytest.mark.slow)]
)
def test_uniform_global_frequencies_match_one_buffer(batch_layout):
    sizes = [200, 100]  # unequal: the multinomial split must follow the sizes
    with ShardedReplayBuffer(
        SPECS, 256, 2, sampler=Uniform(), seed=1, batch_layout=batch_layout
    ) as buf:
        fill(buf, sizes)
        assert len(buf) == 300 and buf.sizes.tolist() == sizes
        counts = np.zeros(300)
        for _ in range(15):
            for batch in buf.sample_for_trainers(256):
                shard, slot = buf.locate(batch.indices)
                ids = batch.obs["agent_1"][:, 1]
                assert np.array_equal(ids, shard * 1000 + slot)  # rows are the slots named
                assert np.array_equal(batch.next_obs["agent_0"][:, 1], ids + 1)
                counts[np.where(shard == 0, slot, 200 + slot)] += 1
        # a single buffer holding the same 300 rows draws each with probability 1/300
        assert chisquare(counts).pvalue > 1e-3


@pytest.mark.slow
def test_neighbor_and_without_replacement_split_exactly():
    with ShardedReplayBuffer(SPECS, 64, 2, sampler=Neighbor(run_length=4), seed=2) as buf:
        fill(buf, [64, 30])
        for batch in buf.sample_for_trainers(32, n_trainers=1):
            shard, slot = buf.locate(batch.indices)
            runs = slot.reshape(-1, 4)
            assert (np.diff(runs, axis=1) % 64 == 1).all()  # runs stay inside one shard
            assert (shard.reshape(-1, 4) == shard.reshape(-1, 4)[:, :1]).all()
            assert (slot[shard == 1] < 30).all()
    with ShardedReplayBuffer(SPECS, 64, 2, sampler=Uniform(replace=False), seed=3) as buf:
        fill(buf, [20, 12])
        batch = buf.sample(32)
        assert len(np.unique(batch.indices)) == 32  # every row of both shards, once
        with pytest.raises(ValueError, match="needs more stored transitions"):
            buf.sample(33)


def _single_buffer_with(sizes, priorities, alpha):
    single = MultiAgentReplayBuffer(SPECS, sum(sizes), sampler=Prioritized(alpha=alpha), seed=0)
    for k, n in enumerate(sizes):
        single.extend(**steps(k * 1000 + np.arange(n), stream=k))
    for t in range(2):
        every = np.arange(sum(sizes))
        single.update_priorities(
            every, priorities[t], trainer=t, generations=single.write_generation[every]
        )
    return single


def test_prioritized_global_draw_and_weights_equal_one_buffer():
    sizes, alpha, beta = [150, 90], 0.7, 0.4
    rng = np.random.default_rng(0)
    priorities = [rng.uniform(0.05, 3.0, sum(sizes)) for _ in range(2)]
    sampler = Prioritized(alpha=alpha, beta=beta, eps=0.0)
    with ShardedReplayBuffer(SPECS, 200, 2, sampler=sampler, seed=4, prefetch=False) as buf:
        fill(buf, sizes)
        everything = np.concatenate([np.arange(150), 200 + np.arange(90)])
        for t in range(2):
            buf.update_priorities(everything, priorities[t], trainer=t)
        buf.flush()
        single = _single_buffer_with(sizes, priorities, alpha)
        leaves = [single.sampler.trees.leaves(t)[: sum(sizes)] for t in range(2)]
        counts = np.zeros((2, sum(sizes)))
        for _ in range(12):
            for batch in buf.sample_for_trainers(512):
                shard, slot = buf.locate(batch.indices)
                row = np.where(shard == 0, slot, 150 + slot)  # the single buffer's slot
                counts[batch.trainer, row] += 1
                p = leaves[batch.trainer][row]
                # the single-buffer formula: (N P(i))^-beta normalised by the batch maximum
                expected = (len(buf) * p / leaves[batch.trainer].sum()) ** -beta
                np.testing.assert_allclose(batch.weights, expected / expected.max(), rtol=1e-5)
                buf.update_priorities(
                    batch.indices,
                    priorities[batch.trainer][row],  # unchanged: the distribution stays put
                    trainer=batch.trainer,
                    generations=batch.generations,
                )
        for t in range(2):
            probability = leaves[t] / leaves[t].sum()
            assert chisquare(counts[t], probability * counts[t].sum()).pvalue > 1e-3
        with pytest.raises(ValueError, match="finite"):
            buf.update_priorities(batch.indices, np.full(512, np.nan), trainer=0)
        with pytest.raises(ValueError, match=r"\[0, 400\)"):
            buf.update_priorities([400], [1.0], trainer=0)


def test_prioritized_neighbor_weights_use_per_shard_inclusion_probabilities():
    sizes = [40, 24]
    sampler = PrioritizedNeighbor(alpha=0.6, beta=1.0)
    with ShardedReplayBuffer(SPECS, 40, 2, sampler=sampler, seed=5, prefetch=False) as buf:
        fill(buf, sizes)
        td = np.linspace(0.1, 2.0, 64)
        buf.update_priorities(np.r_[np.arange(40), 40 + np.arange(24)], td, trainer=0)
        buf.flush()
        # local copies of each shard's data and priorities give the documented probabilities
        shards = []
        for k, n in enumerate(sizes):
            local = MultiAgentReplayBuffer(SPECS, 40, sampler=PrioritizedNeighbor(alpha=0.6))
            local.extend(**steps(k * 1000 + np.arange(n), stream=k))
            mine = np.arange(n)
            local.update_priorities(
                mine,
                td[sum(sizes[:k]) : sum(sizes[: k + 1])],
                generations=local.write_generation[mine],
            )
            shards.append(local)
        totals = np.array([s.sampler.trees.total(0) for s in shards])
        batch = buf.sample(64, trainer=0)
        shard, slot = buf.locate(batch.indices)
        prob = np.array(
            [
                totals[k] / totals.sum() * shards[k].sampler.inclusion_probabilities(sizes[k])[s]
                for k, s in zip(shard, slot)
            ]
        )
        np.testing.assert_allclose(batch.weights, prob.min() / prob, rtol=1e-5)


@ray.remote(num_cpus=0)
def _write_stream(writer, stream, count):
    """A remote writer: one step at a time, then a block of steps."""
    for t in range(count // 2):
        writer.add(**one_step(t, stream))
    writer.extend(**steps(np.arange(count // 2, count), stream))
    return writer.flush()


@pytest.mark.slow
def test_stream_affinity_keeps_every_next_obs_correct():
    with ShardedReplayBuffer(SPECS, 128, 2, sampler=Neighbor(run_length=8), seed=6) as buf:
        remote = _write_stream.remote(buf.writer(1), 1, 60)  # stream 1 from another process
        for t in range(40):  # streams 0 and 2 interleaved step by step, both on shard 0
            for stream in (0, 2):
                buf.add(**one_step(t, stream), stream=stream)
        assert ray.get(remote, timeout=60)[0] == 60
        buf.flush()
        assert buf.refresh().tolist() == [80, 60]
        for _ in range(5):
            for batch in buf.sample_for_trainers(64):
                shard, _ = buf.locate(batch.indices)
                obs, nxt = batch.obs["agent_0"], batch.next_obs["agent_1"]
                assert (obs[:, 0] % 2 == shard).all()  # stream s lives on shard s % 2
                assert (nxt[:, 0] == obs[:, 0]).all() and (nxt[:, 1] == obs[:, 1] + 1).all()
                # shard 1 holds stream 1 alone: a run is consecutive steps of that stream
                ones = obs[shard == 1, 1].reshape(-1, 8)
                assert (np.diff(ones, axis=1) == 1).all()


@pytest.mark.slow
def test_dead_shard_is_reported_and_restarts_from_its_checkpoint(tmp_path):
    with ShardedReplayBuffer(SPECS, 64, 2, sampler=Uniform(), seed=7) as buf:
        fill(buf, [50, 30])
        buf.save(tmp_path / "ckpt")
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
            "manifest.json",
            "shard-0.npz",
            "shard-1.npz",
        ]
        buf.extend(**steps(5000 + np.arange(10), stream=1), stream=1)  # lost by the restart
        buf.flush()
        # a hung shard (its process stopped): a clear error after the timeout, not a hang
        pid = ray.get(buf.actors[1].info.remote(), timeout=30)["pid"]
        buf.timeout = 4.0  # only for the hung call: a busy machine may be slow elsewhere
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            with pytest.raises(ShardError, match=r"shard 1 did not answer") as info:
                buf.sample(16)
        finally:
            os.kill(pid, signal.SIGKILL)
        assert time.monotonic() - start < 20 and info.value.shard == 1
        buf.timeout = 60.0
        # a dead shard: reported at once with the way out
        with pytest.raises(ShardError, match=r"shard 1 died.*restart_shard\(1\)"):
            buf.sample(16)
        buf.restart_shard(1)
        assert buf.refresh().tolist() == [50, 30]
        batch = buf.sample(80)
        shard, slot = buf.locate(batch.indices)
        assert np.array_equal(batch.obs["agent_0"][:, 1], shard * 1000 + slot)
    loaded = ShardedReplayBuffer.load(tmp_path / "ckpt", prefetch=False)
    try:
        assert loaded.sizes.tolist() == [50, 30]
        batch = loaded.sample(64)
        shard, slot = loaded.locate(batch.indices)
        assert np.array_equal(batch.obs["agent_1"][:, 1], shard * 1000 + slot)
    finally:
        loaded.close()


@ray.remote(num_cpus=0)
def _fast_writer(writer, limit):
    written = 0
    try:
        while written < limit:
            writer.extend(**steps(np.arange(written, written + 25)))
            written += 25
    except TimeoutError:
        return written, "timeout"
    return written, "done"


@pytest.mark.slow
def test_rate_limiter_holds_samples_per_insert():
    ratio, min_size, error_buffer = 2.0, 100, 150
    limiter = RateLimiter(ratio, min_size_to_sample=min_size, error_buffer=error_buffer, timeout=4)
    with ShardedReplayBuffer(SPECS, 4096, 1, seed=8, rate_limiter=limiter, prefetch=False) as buf:
        task = _fast_writer.remote(buf.writer(0), 4000)
        deadline = time.monotonic() + 60  # a busy machine may take seconds to start the task
        while limiter.stats()["inserts"] < min_size and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(40):  # the learner samples 40 rounds of 50 rows
            buf.sample_for_trainers(50)
        written, why = ray.get(task, timeout=60)
        stats = limiter.stats()
        # the writer was held back (it is faster) and gave up after the learner stopped
        assert why == "timeout" and stats["blocked_inserts"] > 0
        assert stats["samples"] == 40 * 50
        assert stats["max_gap"] <= error_buffer
        assert abs(stats["samples"] - ratio * (stats["inserts"] - min_size)) <= error_buffer
        assert written == stats["inserts"]
        with pytest.raises(TimeoutError, match="writers have stopped"):
            # nobody inserts any more: within error_buffer / 50 more rounds the learner blocks
            for _ in range(int(2 * error_buffer / 50) + 1):
                buf.sample_for_trainers(50)
    limiter.close()


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="n_shards"):
        ShardedReplayBuffer(SPECS, 64, 0)
    with pytest.raises(ValueError, match="run_length=100 is longer"):
        ShardedReplayBuffer(SPECS, 64, 1, sampler=Neighbor(100))
    with pytest.raises(ValueError, match="samples_per_insert"):
        RateLimiter(0.0)


@pytest.mark.slow
def test_two_actor_training_run_updates_the_learner(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("mpe2")
    from marlbuf.algos import TrainConfig, make_learner
    from marlbuf.algos.cli import main

    out = tmp_path / "run"
    args = ["--actors", "2", "--episodes", "12", "--batch-size", "32", "--buffer-size", "2000"]
    args += ["--warmup", "100", "--update-every", "25", "--weights-every", "2"]
    assert main([*args, "--no-progress", "--no-plot", "--out", str(out)]) == 0
    lines = (out / "episodes.csv").read_text().splitlines()
    assert len(lines) == 13  # header + 12 episodes, 300 env steps over the two actors
    assert int(lines[-1].split(",")[4]) >= 5  # update rounds before the last episode arrived
    state = torch.load(out / "learner.pt", weights_only=True)
    assert state["rounds"] == 9  # a round at every 25 steps from 100 to 300
    initial = make_learner(TrainConfig(), [18] * 3, 5).state_dict()
    changed = [
        not torch.equal(a, b)
        for a, b in zip(state["params"][0].values(), initial["params"][0].values())
    ]
    assert any(changed)


@pytest.mark.slow
def test_distributed_bench_suite_runs_tiny(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("mpe2")
    from marlbuf.bench import cli
    from marlbuf.bench.suites import distributed as suite
    from marlbuf.bench.tools import common
    from marlbuf.workloads import Workload

    assert cli.SUITES["distributed"] == "marlbuf.bench.suites.distributed"
    tiny = {
        **suite.QUICK,
        "round_workload": Workload("cooperative_navigation", 3),
        "round_capacity": 600,
        "batch_size": 32,
        "round_repeats": 2,
        "busy_s": 0.01,
        "collect_workload": Workload("cooperative_navigation", 3),
        "collect_episodes": 2,
        "train_batch_size": 32,
        "train_episodes": 4,
    }
    monkeypatch.setattr(suite, "QUICK", tiny)
    payload = suite.run(quick=True, progress=False)
    assert ray.is_initialized()  # it used this module's instance and left it running
    parts = {row["part"] for row in payload["rows"]}
    assert parts == {"round", "per", "collect", "train", "model"}
    assert payload["config"]["actors"] == [1, 2]  # the default
    per = [(r["case"], r["ratio_vs_local"] > 0) for r in payload["rows"] if r["part"] == "per"]
    assert per == [("local", True), ("sharded_K1", True), ("sharded_K2", True)]
    train = [r["case"] for r in payload["rows"] if r["part"] == "train"]
    assert train == ["single", "actors_2"]
    assert [p["actors"] for p in payload["model"]["predictions"]] == [1, 2, 8, 64]
    assert payload["model"]["assumptions"] and payload["summary"]
    assert set(payload["model"]["check_here"]) == {"2 actors", "note"}
    # the 8-actor targets need --actors 8; the prefetch target is checked for 1 and 2 shards
    status = {(t["check"].split(":")[0], t["workload"]): t["status"] for t in payload["targets"]}
    assert status["collection", "8 actors"] == status["training", "8 actors"] == "not measured"
    assert {status["prefetched round's exposed wait / local round", f"{k} shard(s)"]
            for k in (1, 2)} <= {"PASS", "FAIL"}  # fmt: skip
    import json

    json.dumps(payload, default=common._json_default)


def test_distributed_suite_actor_counts_and_contention_fit():
    from marlbuf.bench.suites import distributed as suite

    assert suite.actor_counts(None) == (1, 2)
    assert suite.actor_counts([8, 2, 4, 2]) == (1, 2, 4, 8)  # 1 is always measured
    for bad in ([0], [1.5], [], [True]):
        with pytest.raises(ValueError, match="actors must be"):
            suite.actor_counts(bad)
    # rates of K * 100 / (1 + 0.25 (K - 1)) are fitted back exactly; one count: no contention
    rates = {k: k * 100 / (1 + 0.25 * (k - 1)) for k in (1, 2, 4, 8)}
    assert suite.contention_fit(rates) == pytest.approx(0.25)
    assert suite.contention_fit({1: 100.0}) == 0.0
    assert suite.contention_fit({1: 100.0, 2: 250.0}) == 0.0  # super-linear: clipped at 0


def test_add_envs_routes_streams_and_bad_writes_surface_at_flush():
    with ShardedReplayBuffer(SPECS, 32, 2, seed=9, prefetch=False) as buf:
        for t in range(5):  # three vectorized envs: streams 0 and 2 -> shard 0, 1 -> shard 1
            many = steps([t, t, t])
            many["obs"] = {
                a: np.stack([[e, t] for e in range(3)]).astype(np.float32) for a in SPECS
            }
            many["next_obs"] = {a: v + np.float32([0, 1]) for a, v in many["obs"].items()}
            buf.add_envs(**many)
        buf.flush()
        assert buf.sizes.tolist() == [10, 5]
        batch = buf.sample(15)
        shard, _ = buf.locate(batch.indices)
        assert (batch.obs["agent_0"][:, 0] % 2 == shard).all()
        bad = steps([1.0])
        bad["reward"]["agent_1"] = np.array([np.nan], np.float32)
        buf.extend(**bad, stream=1)  # queued: the shard refuses it, writing nothing
        with pytest.raises(ValueError, match="agent_1"):
            buf.flush()
        assert buf.refresh().tolist() == [10, 5]


def test_stale_priority_updates_are_dropped_per_shard():
    with ShardedReplayBuffer(SPECS, 8, 2, sampler=Prioritized(), seed=10, prefetch=False) as buf:
        fill(buf, [8, 8])
        batch = buf.sample(64, trainer=0)
        buf.extend(**steps(np.arange(8)), stream=0)  # shard 0 is overwritten since the draw
        buf.flush()
        buf.update_priorities(batch.indices, np.full(64, 5.0), 0, generations=batch.generations)
        buf.flush()
        totals = [ray.get(a.stats.remote(), timeout=30)[2] for a in buf.actors]
        shard, _ = buf.locate(batch.indices)
        assert totals[0] == pytest.approx(8.0)  # every update for shard 0 was stale: dropped
        updated = len(np.unique(batch.indices[shard == 1]))
        expected = updated * (5.0 + 1e-6) ** 0.6 + (8 - updated)
        assert totals[1] == pytest.approx(expected)


# ------------------------------------------------------------------ the single buffer's options
RICH = {
    f"agent_{i}": AgentSpec(
        obs_shape=(3,), action_shape=(2,), obs_dtype=np.float16, extras={"hidden": FieldSpec(4)}
    )
    for i in range(2)
}
RICH_OPTIONS = {
    "global_fields": {"state": FieldSpec((5,))},
    "alive": True,
    "next_obs": "once",
    "batch_dtype": "float32",
}


def rich_steps(n, stream, seed):
    """``n`` consecutive steps of one stream with extras, a global state, alive flags and a
    truncation at steps 3, 13, ... (next_obs is the next step's obs except there)."""
    rng = np.random.default_rng(seed)
    obs = {a: rng.standard_normal((n + 1, 3)).astype(np.float16) for a in RICH}
    obs["agent_0"][:, 0] = stream
    next_obs = {a: o[1:].copy() for a, o in obs.items()}
    truncated = np.zeros(n, dtype=bool)
    truncated[3::10] = True
    for a in RICH:  # the step after a truncation starts from a reset observation
        next_obs[a][truncated] += np.float16(1)
    return {
        "obs": {a: o[:-1] for a, o in obs.items()},
        "action": {a: rng.standard_normal((n, 2)).astype(np.float32) for a in RICH},
        "reward": {a: rng.standard_normal(n).astype(np.float32) for a in RICH},
        "next_obs": next_obs,
        "done": {a: np.zeros(n, np.float32) for a in RICH},
        "hidden": {a: rng.standard_normal((n, 4)).astype(np.float32) for a in RICH},
        "state": rng.standard_normal((n, 5)).astype(np.float32),
        "alive": {"agent_0": np.ones(n, bool), "agent_1": rng.random(n) < 0.7},
        "truncated": truncated,
    }


def chunk(data, lo, hi):
    """Steps ``[lo, hi)`` of :func:`rich_steps` output."""
    return {
        f: {a: v[lo:hi] for a, v in d.items()} if isinstance(d, dict) else d[lo:hi]
        for f, d in data.items()
    }


def assert_rows_equal(
    batch, singles, buf, rows=None, names=("obs", "action", "reward", "next_obs", "done", "alive")
):
    """Every row of a sharded ``batch`` equals what the single buffer holding that shard's
    writes gathers at the row's slot: the five fields (``names``), extras, globals and alive."""
    shard, slot = buf.locate(batch.indices)
    rows = np.arange(len(shard)) if rows is None else rows
    for k in np.unique(shard):
        mine = rows[shard == k]
        want = singles[k].gather(slot[shard == k])
        for name in names:
            for agent, value in getattr(want, name).items():
                np.testing.assert_array_equal(getattr(batch, name)[agent][mine], value)
        for agent, value in want.extras["hidden"].items():
            np.testing.assert_array_equal(batch.extras["hidden"][agent][mine], value)
        np.testing.assert_array_equal(batch.globals["state"][mine], want.globals["state"])
        np.testing.assert_array_equal(batch.generations[mine], want.generations)


@pytest.mark.parametrize(
    "batch_layout", ["rows", pytest.param("per_agent", marks=pytest.mark.slow)]
)
def test_extras_globals_alive_and_truncated_through_writers_match_one_buffer(batch_layout):
    singles = [
        MultiAgentReplayBuffer(RICH, 40, batch_layout=batch_layout, **RICH_OPTIONS)
        for _ in range(2)
    ]
    with ShardedReplayBuffer(
        RICH, 40, 2, seed=11, prefetch=False, batch_layout=batch_layout, **RICH_OPTIONS
    ) as buf:
        writer = buf.writer(stream=1)  # what a rollout actor holds
        streams = [rich_steps(61, 0, 0), rich_steps(61, 1, 1)]
        for part in range(3):  # stream 0 through the buffer, stream 1 through its writer
            first, second = (chunk(data, 20 * part, 20 * part + 20) for data in streams)
            buf.extend(**first, stream=0)
            writer.extend(**second)
            singles[0].extend(**first)
            singles[1].extend(**second)
        step = {
            f: {a: v[0] for a, v in d.items()} if isinstance(d, dict) else d[0]
            for f, d in chunk(streams[1], 60, 61).items()
        }
        writer.add(**step)  # one step with extras, state, alive and truncated
        singles[1].add(**step)
        writer.flush()
        buf.flush()
        assert buf.refresh().tolist() == [40, 40]
        batches = buf.sample_for_trainers(64)
        assert [b.trainer for b in batches] == [0, 1]
        for batch in batches:
            assert batch.obs["agent_0"].dtype == np.float32  # float16 storage, float32 batches
            assert set(batch.extras) == {"hidden"} and set(batch.globals) == {"state"}
            assert batch.state.shape == (64, 5) and batch.alive["agent_1"].dtype == bool
            assert_rows_equal(batch, singles, buf)
            assert batch.indices.generations is batch.generations  # DrawnIndices, as one buffer


@pytest.mark.parametrize(
    "batch_layout", ["rows", pytest.param("per_agent", marks=pytest.mark.slow)]
)
def test_shards_without_next_obs_match_one_buffer(batch_layout, tmp_path):
    """next_obs="none": writes leave it out (checked at the call), batches hold every other
    field as one buffer per shard would, and refuse next_obs; save/load keeps the format."""
    options = {**RICH_OPTIONS, "next_obs": "none"}
    kept = ("obs", "action", "reward", "done", "alive")
    singles = [
        MultiAgentReplayBuffer(RICH, 40, batch_layout=batch_layout, **options) for _ in range(2)
    ]
    with ShardedReplayBuffer(
        RICH, 40, 2, seed=11, prefetch=False, batch_layout=batch_layout, **options
    ) as buf:
        writer = buf.writer(stream=1)
        streams = [rich_steps(50, k, k) for k in range(2)]
        for data in streams:
            del data["next_obs"]
        buf.extend(**streams[0], stream=0)
        writer.extend(**streams[1])
        for k in range(2):
            singles[k].extend(**streams[k])
        with pytest.raises(ValueError, match=r"got next_obs.*next_obs='none'"):
            buf.extend(**rich_steps(2, 0, 5), stream=0)
        with pytest.raises(ValueError, match=r"got next_obs.*next_obs='none'"):
            writer.extend(**rich_steps(2, 1, 5))
        writer.flush()
        buf.flush()
        assert buf.refresh().tolist() == [40, 40]
        for batch in buf.sample_for_trainers(32):
            assert_rows_equal(batch, singles, buf, names=kept)
            with pytest.raises(ValueError, match="next_obs='none'"):
                batch.next_obs["agent_0"]
        buf.save(tmp_path / "ckpt")
    loaded = ShardedReplayBuffer.load(tmp_path / "ckpt", prefetch=False)
    try:
        assert loaded.config()["next_obs"] == "none"
        assert_rows_equal(loaded.sample(24), singles, loaded, names=kept)
    finally:
        loaded.close()
    with ShardedReplayBuffer(RICH, 8, 2, prefetch=False, **{**options, "next_obs": "auto"}) as auto:
        with pytest.raises(ValueError, match=r"got no next_obs.*never from a first write"):
            auto.extend(**streams[0], stream=0)


def test_add_envs_splits_every_field_and_flag_across_shards():
    singles = [MultiAgentReplayBuffer(RICH, 32, **RICH_OPTIONS) for _ in range(2)]
    with ShardedReplayBuffer(RICH, 32, 2, seed=12, prefetch=False, **RICH_OPTIONS) as buf:
        envs = [rich_steps(6, e, 20 + e) for e in range(3)]  # streams 0, 1, 2
        for t in range(6):
            step = {
                f: {a: np.stack([env[f][a][t] for env in envs]) for a in RICH}
                if isinstance(envs[0][f], dict)
                else np.stack([env[f][t] for env in envs])
                for f in envs[0]
            }
            buf.add_envs(**step)  # environments 0 and 2 -> shard 0, environment 1 -> shard 1
            for k, sel in ((0, [0, 2]), (1, [1])):
                part = {
                    f: {a: v[sel] for a, v in value.items()}
                    if isinstance(value, dict)
                    else value[sel]
                    for f, value in step.items()
                }
                singles[k].add_envs(**part)
        buf.flush()
        assert buf.sizes.tolist() == [12, 6]
        assert_rows_equal(buf.sample(18), singles, buf)


def test_writes_with_bad_options_are_refused_clearly():
    with ShardedReplayBuffer(RICH, 16, 2, seed=13, prefetch=False, **RICH_OPTIONS) as buf:
        data = rich_steps(4, 0, 0)
        with pytest.raises(ValueError, match=r"stream=3 lives on shard 1.*writer\(3\)"):
            buf.writer(0).extend(**data, stream=3)
        with pytest.raises(ValueError, match="not consecutive streams"):
            buf.add_envs(
                **{f: v for f, v in data.items() if f != "truncated"}, streams=[0, 4, 1, 3]
            )
        with pytest.raises(ValueError, match="streams= or first_stream="):
            buf.add_envs(**data, streams=[0, 1, 2, 3], first_stream=0)
        bad = dict(data, truncated=np.zeros(3, bool))  # 4 steps, 3 flags
        buf.extend(**bad, stream=1)  # queued: the shard refuses it, writing nothing
        with pytest.raises(ValueError, match="truncated"):
            buf.flush()
        buf.extend(**data, stream=0, colour=np.zeros(4))  # an undeclared field
        with pytest.raises(TypeError, match="colour"):
            buf.flush()
        assert buf.refresh().tolist() == [0, 0]


def test_custom_samplers_and_sequences_are_refused_with_the_capabilities_reason():
    from marlbuf.stores.capabilities import CAPABILITIES

    class EveryOther(Uniform):  # a user's sampler: the learner could not split its draw
        pass

    reason = CAPABILITIES["custom Sampler subclasses"]["sharded"]
    assert reason is not None
    with pytest.raises(ValueError, match=reason[:30]):
        ShardedReplayBuffer(SPECS, 64, 2, sampler=EveryOther())
    with pytest.raises(ValueError, match="next_obs must be one of"):
        ShardedReplayBuffer(SPECS, 64, 2, next_obs="twice")
    with pytest.raises(ValueError, match="batch_dtype"):
        ShardedReplayBuffer(SPECS, 64, 2, batch_dtype="float8")


def test_beta_schedule_drawn_indices_and_round_updates():
    from marlbuf.prioritized import LinearBeta

    sizes, alpha = [30, 20], 0.5
    schedule = LinearBeta(start=0.2, end=1.0, steps=4)
    sampler = Prioritized(alpha=alpha, beta=schedule, eps=0.0)
    priorities = np.linspace(0.5, 3.0, 50)
    with ShardedReplayBuffer(SPECS, 32, 2, sampler=sampler, seed=14, prefetch=False) as buf:
        fill(buf, sizes)
        everything = np.r_[np.arange(30), 32 + np.arange(20)]
        buf.update_priorities_for_trainers([everything] * 2, [priorities] * 2)
        buf.flush()
        mass = priorities**alpha
        for step in range(5):  # trainer 0's batches walk the schedule; trainer 1 stays put
            batch = buf.sample(40, trainer=0)
            shard, slot = buf.locate(batch.indices)
            p = mass[np.where(shard == 0, slot, 30 + slot)]
            expected = (p.min() / p) ** schedule(step)
            np.testing.assert_allclose(batch.weights, expected, rtol=1e-5)
            # batch.indices carry their generations: no generations= needed
            buf.update_priorities(batch.indices, priorities[np.where(shard == 0, slot, 30 + slot)])
        round_ = buf.sample_for_trainers(40)
        torch = pytest.importorskip("torch")
        buf.update_priorities_for_trainers(
            [torch.as_tensor(b.indices) for b in round_],
            [torch.ones(40) for _ in round_],
            generations=[b.generations for b in round_],
            sync=False,
        )
        buf.flush()
        with pytest.raises(TypeError, match="sync must be a bool"):
            buf.update_priorities(round_[0].indices, np.ones(40), sync=None)
        with pytest.raises(ValueError, match="one entry per trainer"):
            buf.update_priorities_for_trainers([round_[0].indices], [])


# ------------------------------------------------------------------ the public methods it uses
def _local(sampler, size=40, capacity=64):
    buf = MultiAgentReplayBuffer(SPECS, capacity, sampler=sampler, seed=0)
    buf.extend(**steps(np.arange(size)))
    return buf


def test_sample_prefix_draws_from_the_counted_slots_only():
    buf = _local(Uniform(), size=40)
    batch = buf.sample_prefix(100, 10)  # with replacement: more rows than the prefix holds
    assert len(batch) == 100 and batch.indices.max() < 10
    assert np.array_equal(batch.obs["agent_0"][:, 1], batch.indices)
    assert (np.diff(batch.indices) >= 0).all()  # memory order, as sample
    with pytest.raises(ValueError, match=r"size must be in \[1, 40\]"):
        buf.sample_prefix(5, 41)
    with pytest.raises(TypeError, match="size must be an int"):
        buf.sample_prefix(5, 2.0)
    without = _local(Uniform(replace=False))
    assert len(np.unique(without.sample_prefix(10, 10).indices)) == 10
    with pytest.raises(ValueError, match="distinct slots"):
        without.sample_prefix(11, 10)
    runs = _local(Neighbor(run_length=4)).sample_prefix(8, 12).indices
    assert runs.max() < 12 and (np.diff(runs.reshape(2, 4), axis=1) == 1).all()
    same = [_local(Uniform(order="random")) for _ in range(2)]  # equal to sample at len(self)
    assert np.array_equal(same[0].sample_prefix(16, 40).indices, same[1].sample(16).indices)
    out = buf.sample_prefix(100, 10)
    assert buf.sample_prefix(100, 20, out=out).block is out.block
    prioritized = _local(Prioritized())
    with pytest.raises(ValueError, match=r"size must be len\(self\)=40"):
        prioritized.sample_prefix(8, 20)
    assert len(prioritized.sample_prefix(8, 40, trainer=1)) == 8


def test_prioritized_samplers_expose_totals_maxima_probabilities_and_beta():
    from marlbuf.prioritized import LinearBeta

    buf = _local(Prioritized(alpha=0.5, beta=LinearBeta(0.4, 1.0, 10)), size=20)
    sampler = buf.sampler
    four = np.arange(4)
    buf.update_priorities(
        four, np.array([4.0, 1.0, 0.0, 9.0]), trainer=1, generations=buf.write_generation[four]
    )
    leaves = np.r_[np.array([4.0, 1.0, 0.0, 9.0]) + 1e-6, np.ones(16)] ** 0.5  # new: max = 1
    assert sampler.priority_total(1) == pytest.approx(leaves.sum())
    assert sampler.priority_total(0) == pytest.approx(20.0)
    np.testing.assert_allclose(
        sampler.sampling_probabilities([0, 3], 20, trainer=1), leaves[[0, 3]] / leaves.sum()
    )
    assert sampler.max_priority(1) == pytest.approx(9.0 + 1e-6) and sampler.max_priority(0) == 1
    sampler.raise_max_priority([5.0, 2.0])  # raises trainer 0's, leaves trainer 1's alone
    assert sampler.max_priority(0) == 5.0 and sampler.max_priority(1) == pytest.approx(9.0)
    buf.extend(**steps([20]))  # a new slot enters with the raised maximum
    assert sampler.priority_total(0) == pytest.approx(20.0 + 5.0**0.5)
    for bad in ([1.0], [np.nan, 1.0], [0.0, 1.0]):
        with pytest.raises(ValueError, match="one finite priority > 0 per trainer"):
            sampler.raise_max_priority(bad)
    assert [sampler.beta_at(n) for n in (0, 5, 10, 50)] == pytest.approx([0.4, 0.7, 1.0, 1.0])
    buf.sample(4, trainer=1)
    assert sampler.beta_for(1) == sampler.beta_at(1) and sampler.beta_for(0) == 0.4
    assert Prioritized(beta=0.3).beta_at(7) == 0.3
    locality = _local(PrioritizedNeighbor(), size=30)
    every = np.arange(30)
    locality.update_priorities(
        every, np.linspace(0.1, 2.0, 30), generations=locality.write_generation[every]
    )
    idx = np.array([0, 5, 29])
    np.testing.assert_array_equal(
        locality.sampler.sampling_probabilities(idx, 30),
        locality.sampler.inclusion_probabilities(30)[idx],
    )


def test_check_trainer_and_n_trainers_are_public():
    buf = MultiAgentReplayBuffer(SPECS, 8)
    assert buf.check_trainer(np.int64(1)) == 1 and buf.check_n_trainers(None) == 2
    with pytest.raises(ValueError, match=r"trainer must be in \[0, 2\)"):
        buf.check_trainer(2)
    with pytest.raises(TypeError, match="trainer must be an int"):
        buf.check_trainer(True)
    with pytest.raises(ValueError, match=r"n_trainers must be in \[1, 2\]"):
        buf.check_n_trainers(3)


@pytest.mark.parametrize("next_obs", [pytest.param(None, marks=pytest.mark.slow), "stored"])
def test_save_and_load_keep_the_options_and_convert_the_next_obs_format(tmp_path, next_obs):
    """A saved sharded buffer loads with its options, in its own next_obs format or another."""
    singles = [MultiAgentReplayBuffer(RICH, 24, **RICH_OPTIONS) for _ in range(2)]
    with ShardedReplayBuffer(RICH, 24, 2, seed=15, prefetch=False, **RICH_OPTIONS) as buf:
        for k in range(2):
            data = rich_steps(30, k, 30 + k)  # wraps each shard's ring
            buf.extend(**data, stream=k)
            singles[k].extend(**data)
        buf.save(tmp_path / "ckpt")
    loaded = ShardedReplayBuffer.load(tmp_path / "ckpt", prefetch=False, next_obs=next_obs)
    try:
        assert loaded.config()["next_obs"] == (next_obs or "once")
        assert loaded.config()["global_fields"] == {"state": {"shape": [5], "dtype": "<f4"}}
        assert_rows_equal(loaded.sample(48), singles, loaded)
    finally:
        loaded.close()


# ------------------------------------------------------------------ sequences
def _env_step(t, streams):
    """Step ``t`` of environments ``streams`` (leading environment axis); every stream's
    episode ends (done) at steps 6, 13, ..."""
    data = steps(np.full(len(streams), t))
    obs = np.stack([np.float32([s, t]) for s in streams])
    data["obs"] = {a: obs for a in SPECS}
    data["next_obs"] = {a: obs + np.float32([0, 1]) for a in SPECS}
    data["done"] = {a: np.full(len(streams), float(t % 7 == 6), np.float32) for a in SPECS}
    return data


def _write_envs(buf, singles, n_steps):
    """Streams 0..3 step by step: 0 and 2 on shard 0, 1 and 3 on shard 1 (as the mirrors)."""
    for t in range(n_steps):
        buf.add_envs(**_env_step(t, [0, 1, 2, 3]))
        for k, single in enumerate(singles):
            single.add_envs(**_env_step(t, [k, k + 2]))
    buf.flush()


def test_sequences_equal_the_ones_a_buffer_of_each_shard_builds():
    from marlbuf.batch import SequenceBatch
    from marlbuf.samplers import Sequence

    singles = [MultiAgentReplayBuffer(SPECS, 48, sampler=Sequence(5)) for _ in range(2)]
    with ShardedReplayBuffer(SPECS, 48, 2, sampler=Sequence(5), seed=16) as buf:
        _write_envs(buf, singles, 30)  # 60 steps per shard: the ring wraps
        for batch in buf.sample_for_trainers(64):
            assert isinstance(batch, SequenceBatch) and batch.obs["agent_0"].shape == (64, 5, 2)
            shard, start = buf.locate(batch.indices)
            assert np.array_equal(batch.slots[:, 0], batch.indices)
            for k in range(2):
                want = singles[k].gather_sequences(start[shard == k], 5)
                np.testing.assert_array_equal(batch.mask[shard == k], want.mask)
                local = np.where(want.mask, want.slots + 48 * k, -1)
                np.testing.assert_array_equal(batch.slots[shard == k], local)
                for name in ("obs", "next_obs", "reward", "done"):
                    for agent, value in getattr(want, name).items():
                        np.testing.assert_array_equal(
                            getattr(batch, name)[agent][shard == k], value
                        )
            # a sequence never mixes streams or episodes: one stream, consecutive steps
            obs = batch.obs["agent_0"]
            assert ((obs[:, :, 0] == obs[:, :1, 0]) | ~batch.mask).all()
            steps_ = np.where(batch.mask, obs[:, :, 1] - obs[:, :1, 1], np.arange(5))
            assert (steps_ == np.arange(5)).all()
        # starts are uniform over the 96 stored slots of both shards
        counts = np.zeros(96)
        for _ in range(10):
            shard, start = buf.locate(buf.sample(96).indices)
            np.add.at(counts, shard * 48 + start, 1)
        assert chisquare(counts).pvalue > 1e-3


@pytest.mark.slow
def test_distinct_and_prioritized_sequences_across_shards():
    from marlbuf.samplers import Episodes, Sequence

    with ShardedReplayBuffer(
        SPECS, 32, 2, sampler=Sequence(3, pad=False, replace=False), seed=17, prefetch=False
    ) as buf:
        _write_envs(buf, [], 10)  # 20 steps per shard, episodes of 7 steps
        batch = buf.sample(20)
        assert len(np.unique(batch.indices)) == 20 and batch.mask.all()  # length 3 stored
        with pytest.raises(ValueError, match="distinct sequences"):
            buf.sample(200)
    sampler = Sequence(4, burn_in=1, prioritized=True, alpha=1.0, beta=1.0, eps=0.0)
    singles = [
        MultiAgentReplayBuffer(SPECS, 40, sampler=Sequence(4, 1, prioritized=True, alpha=1.0))
        for _ in range(2)
    ]
    with ShardedReplayBuffer(SPECS, 40, 2, sampler=sampler, seed=18, prefetch=False) as buf:
        _write_envs(buf, singles, 15)
        first = buf.sample(30, trainer=1)
        assert first.burn_in == 1 and first.mask.shape == (30, 5)
        td = np.linspace(0.5, 4.0, 30)
        buf.update_priorities(first.indices, td, trainer=1)  # one error per sequence
        shard, start = buf.locate(first.indices)
        for k in range(2):  # the mirrors get the same updates (later ones win, as there)
            mine = start[shard == k]
            singles[k].update_priorities(
                mine, td[shard == k] + 0.0, trainer=1, generations=singles[k].write_generation[mine]
            )
        per_step = np.full((30, 4), np.nan)  # anything at masked steps
        per_step[first.mask[:, 1:]] = 1.0
        buf.update_priorities(first.indices[:2], per_step[:2], trainer=0)
        buf.flush()
        batch = buf.sample(30, trainer=1)
        shard, start = buf.locate(batch.indices)
        totals = [s.sampler.start_total(s.size, 1) for s in singles]
        p = np.array(
            [
                singles[k].sampler.sampling_probabilities([s], singles[k].size, 1)[0] * totals[k]
                for k, s in zip(shard, start)
            ]
        ) / sum(totals)
        np.testing.assert_allclose(batch.weights, p.min() / p, rtol=1e-5)
        with pytest.raises(ValueError, match=r"shape \(2,\) or \(2, 4\)"):
            buf.update_priorities(first.indices[:2], np.ones((2, 3)), trainer=0)
    with pytest.raises(ValueError, match="prioritized sequences without replacement"):
        ShardedReplayBuffer(SPECS, 40, 2, sampler=Sequence(4, prioritized=True, replace=False))
    with pytest.raises(TypeError, match="does not sample whole episodes"):
        ShardedReplayBuffer(SPECS, 40, 2, sampler=Episodes())


def test_sequence_samplers_expose_start_totals_probabilities_and_priorities():
    from marlbuf.prioritized import LinearBeta
    from marlbuf.samplers import Sequence

    uniform = _local(Sequence(3), size=20).sampler
    assert uniform.start_total(20) == 20.0
    np.testing.assert_array_equal(uniform.sampling_probabilities([0, 7], 20), [0.05, 0.05])
    with pytest.raises(TypeError, match="keeps no priorities"):
        uniform.max_priority(0)
    valid = _local(Sequence(3, pad=False), size=20).sampler
    assert valid.start_total(20) == 18.0  # one episode of 20 steps: 18 starts with 3 steps
    buf = _local(Sequence(3, prioritized=True, alpha=1.0, beta=LinearBeta(0.5, 1.0, 2)), 20)
    sampler = buf.sampler
    two = np.array([2, 4])
    buf.update_priorities(
        two, np.array([3.0, 0.0]), trainer=1, generations=buf.write_generation[two]
    )
    assert sampler.start_total(20, 1) == pytest.approx(18.0 + 3.0 + 2e-6)
    np.testing.assert_allclose(
        sampler.sampling_probabilities([2, 5], 20, 1), np.array([3.0 + 1e-6, 1.0]) / 21.000002
    )
    assert sampler.max_priority(1) == pytest.approx(3.0) and sampler.max_priority(0) == 1.0
    sampler.raise_max_priority([4.0, 1.0])
    assert sampler.max_priority(0) == 4.0
    with pytest.raises(ValueError, match="one finite priority > 0 per trainer"):
        sampler.raise_max_priority([4.0])
    assert [sampler.beta_at(n) for n in (0, 1, 9)] == [0.5, 0.75, 1.0]
