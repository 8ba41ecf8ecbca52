"""Benchmark suites at tiny sizes: they run, their JSON has the schema, compare works."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marlbuf.bench import cli
from marlbuf.bench.tools import common
from marlbuf.workloads import Workload

TINY = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
    "capacity": 3_000,
    "repeats": 2,
    "inner": 1,
}


def _tiny(monkeypatch, module):
    monkeypatch.setattr(module, "QUICK", dict(TINY))


def check_schema(payload):
    assert isinstance(payload["rows"], list) and payload["rows"]
    assert all(isinstance(r, dict) for r in payload["rows"])
    assert isinstance(payload["summary"], dict)
    assert isinstance(payload["config"], dict)
    json.dumps(payload, default=common._json_default)  # serialisable


@pytest.mark.parametrize("suite", ["sampling", "layout", "peers"])
def test_buffer_suites_run_tiny(monkeypatch, tmp_path, suite):
    module = cli._load(suite)
    assert not isinstance(module, str), module
    _tiny(monkeypatch, module)
    payload = module.run(quick=True, progress=False)
    check_schema(payload)
    path = common.write_result(suite, payload, quick=True, out_dir=tmp_path)
    record = json.loads(path.read_text())
    assert record["suite"] == suite and record["quick"] is True
    assert "cpu_model" in record["machine"] and "perf_counters" in record["machine"]
    assert "ratio" not in record or record["ratio"] > 0


def test_sampling_rows_have_ratios(monkeypatch):
    from marlbuf.bench.suites import sampling

    _tiny(monkeypatch, sampling)
    payload = sampling.run(quick=True, progress=False)
    cases = {r["case"] for r in payload["rows"]}
    assert {"list_of_tuples", "numpy_per_agent", "interleaved+uniform"} <= cases
    for row in payload["rows"]:
        assert row["ms_median"] > 0 and row["speedup_vs_list_of_tuples"] > 0
    for label in ("CN-3", "PP-3+1"):
        assert label in payload["summary"]


def test_compare_prints_ratios(tmp_path, capsys):
    rows_a = [{"workload": "CN-3", "case": "x", "ms_median": 2.0}]
    rows_b = [{"workload": "CN-3", "case": "x", "ms_median": 1.0}]
    a = common.write_result("demo", {"rows": rows_a}, quick=True, out_dir=tmp_path / "a")
    b = common.write_result("demo", {"rows": rows_b}, quick=True, out_dir=tmp_path / "b")
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| CN-3 / x | 2 | 1 | 0.5 |" in out


def test_cli_lists_and_rejects_unknown_suites(capsys):
    assert cli.main(["--list"]) == 0
    assert "sampling" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["no_such_suite"])


def test_guard_suite_reports_every_check_tiny(monkeypatch, tmp_path):
    import importlib.util

    from marlbuf.bench.suites import guard

    tiny = dict(guard.QUICK, workloads=[Workload("cooperative_navigation", 3)], capacity=3_000)
    tiny.update(repeats=2, min_sample_s=0.0, per_capacity=5_000, per_repeats=2)
    tiny.update(add_steps=5, add_repeats=1)
    monkeypatch.setattr(guard, "QUICK", tiny)
    # the Neighbor, memcpy and float16 checks' limits are set at 24 agents; give CN-3 one to
    # run their paths here
    monkeypatch.setattr(guard, "NEIGHBOR_LIMITS", {"CN-3": 0.6})
    monkeypatch.setattr(guard, "MEMCPY_LIMITS", {"CN-3": 1.3})
    monkeypatch.setattr(guard, "FLOAT16_LIMITS", {"CN-3": 0.85})
    payload = guard.run(quick=True, progress=False)
    check_schema(payload)
    kinds = ("streams", "independent")
    expected = {
        (name, "CN-3", kind)
        for kind in kinds
        for name in (
            "default round / dense round",
            "dense round / bare row gather",
            "iter_trainers round / bare row gather",
            "Neighbor(64) round / uniform round, default format",
            "Neighbor(64) ratio / bare kernel's runs ratio",
            "default round / memcpy floor",
        )
    }
    expected.add(("float16 round / float32 round", "CN-3", "streams"))
    expected |= {
        ("add / NumPy row write", f"N={n}", kind)
        for n in (3, 24)
        for kind in ("discrete", "continuous")
    }
    expected.add(("PER sample + update: cpprb / marlbuf", "capacity 5,000", ""))
    checks = payload["checks"]
    assert {(c["check"], c["workload"], c["kind"]) for c in checks} == expected
    has_cpprb = importlib.util.find_spec("cpprb") is not None
    for c in checks:
        if c["status"] == "SKIP":  # only the cpprb comparison, without cpprb
            assert not has_cpprb and c["check"].startswith("PER") and "cpprb" in c["note"]
            continue
        assert c["status"] in ("PASS", "FAIL")
        assert np.isfinite(c["ratio"]) and c["ratio"] > 0 and c["limit"] > 0
        assert (c["status"] == "PASS") == (
            c["ratio"] <= c["limit"] if c["bound"] == "at most" else c["ratio"] >= c["limit"]
        )
    limits = {(c["check"], c["kind"]): c["limit"] for c in checks}
    assert limits["default round / dense round", "streams"] == 1.10
    assert limits["default round / dense round", "independent"] == 1.25
    assert len(payload["failed_checks"]) == payload["summary"]["failed"]
    assert payload["summary"]["failed"] == sum(c["status"] == "FAIL" for c in checks)
    rounds = [r for r in payload["rows"] if "ms_median" in r]
    assert {r["case"] for r in rounds} == {
        "default",
        "dense",
        "bare_row_gather",
        "default_stream",
        "default+neighbor64",
        "bare_runs64",
        "output_write_floor",
        "memcpy_floor",
        "float16",
    }
    assert {r["kind"] for r in rounds if r["case"] == "float16"} == {"streams"}
    for row in rounds:
        assert row["ms_median"] > 0 and row["floor_ms_from_bandwidth"] > 0
    neighbor = [c for c in checks if c["check"].startswith("Neighbor(64) round")]
    assert neighbor and all("output blocks alone" in c["note"] for c in neighbor)
    keep = [c for c in checks if c["check"].startswith("Neighbor(64) ratio")]
    assert keep and all("bare gather of 64-row runs" in c["note"] for c in keep)
    assert payload["config"]["copy_bandwidth_GBps"] > 0
    for name, *_ in expected:
        assert name in payload["markdown"]
    assert "guard" in cli.SUITES
    path = common.write_result("guard", payload, quick=True, out_dir=tmp_path)
    assert json.loads(path.read_text())["suite"] == "guard"


def test_failed_checks_set_the_exit_status_except_in_quick(monkeypatch, tmp_path):
    import sys
    import types

    fake = types.ModuleType("fake_guard_suite")
    fake.SUITE = "fake"

    def run(quick=False):
        return {"rows": [{"case": "x", "ms_median": 1.0}], "summary": {}, "failed_checks": ["x"]}

    fake.run = run
    monkeypatch.setitem(sys.modules, "fake_guard_suite", fake)
    monkeypatch.setitem(cli.SUITES, "fake", "fake_guard_suite")
    assert cli.main(["fake", "--quick", "--out", str(tmp_path)]) == 0
    assert cli.main(["fake", "--out", str(tmp_path)]) == 1


def test_suite_options_reach_only_suites_that_take_them(monkeypatch, tmp_path, capsys):
    import sys
    import types

    got = {}
    fake = types.ModuleType("fake_option_suite")
    fake.SUITE = "fake"

    def run(quick=False, device=None, actors=None):
        got.update(device=device, actors=actors)
        return {"rows": [{"case": "x", "ms_median": 1.0}], "summary": {}}

    fake.run = run
    monkeypatch.setitem(sys.modules, "fake_option_suite", fake)
    monkeypatch.setitem(cli.SUITES, "fake", "fake_option_suite")
    out = tmp_path / "out"
    argv = ["fake", "--quick", "--out", str(out), "--device", "cuda:1", "--actors", "1", "4"]
    assert cli.main(argv) == 0
    assert got == {"device": "cuda:1", "actors": [1, 4]}
    record = json.loads((out / "fake-quick.json").read_text())
    assert record["options"] == {"device": "cuda:1", "actors": [1, 4]}
    got.clear()
    assert cli.main(["fake", "--quick", "--out", str(out)]) == 0
    assert got == {"device": None, "actors": None}  # not given: the suite's defaults
    assert "options" not in json.loads((out / "fake-quick.json").read_text())
    capsys.readouterr()
    # a chosen suite that does not take an option: refused before anything runs
    with pytest.raises(SystemExit) as info:
        cli.main(["fake", "sampling", "--quick", "--out", str(out), "--actors", "2"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--actors is not an option of suite(s) sampling" in err and "fake" in err
    assert cli.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "(options: --device --actors)" in listed and "sampling     ok\n" in listed


def test_time_interleaved_counts_calls():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1

        return fn

    res = common.time_interleaved({"a": make("a"), "b": make("b")}, repeats=3, warmup=2, inner=4)
    assert calls == {"a": 14, "b": 14}
    assert res["a"]["n"] == 3 and res["a"]["min"] <= res["a"]["median"] <= res["a"]["max"]
    assert res["a"]["first_call"] >= 0  # the first warm-up call is reported separately


def test_workload_obs_dims_match_the_paper():
    assert Workload("cooperative_navigation", 24).obs_dims() == [144] * 24
    assert Workload("predator_prey", 3).obs_dims() == [16] * 3 + [14]
    assert Workload("predator_prey", 24).obs_dims() == [98] * 24 + [96] * 8


def test_memory_suite_estimates_match_measured_buffers(monkeypatch):
    from marlbuf.bench.suites import memory

    tiny = dict(memory.QUICK, workloads=[Workload("cooperative_navigation", 3)])
    tiny["measure_capacity"] = 1_000
    monkeypatch.setattr(memory, "QUICK", tiny)
    payload = memory.run(quick=True, progress=False)
    check_schema(payload)
    by_format = {r["format"]: r for r in payload["rows"]}
    assert set(by_format) == {"dense", "once", "once+float16"}
    for row in payload["rows"]:  # the estimate is what a real buffer of 25-step episodes holds
        assert row["measured_bytes_per_transition"] == pytest.approx(
            row["bytes_per_transition"], rel=0.05
        )
    assert by_format["once+float16"]["vs_dense"] < by_format["once"]["vs_dense"] < 1


def test_sampling_has_the_lean_and_streaming_cases(monkeypatch):
    from marlbuf.bench.suites import sampling

    _tiny(monkeypatch, sampling)
    monkeypatch.setattr(sampling, "QUICK", dict(TINY, workloads=[TINY["workloads"][0]]))
    payload = sampling.run(quick=True, progress=False)
    cases = {r["case"] for r in payload["rows"]}
    assert {"lean16+uniform+stream", "lean16s+uniform+stream", "bare_row_gather"} <= cases
    summary = payload["summary"]["CN-3"]
    assert summary["dense_round_vs_lean16_stream"] > 0
    # the same uniform distribution in draw order and in ascending slot order
    assert {"interleaved+uniform_memory", "lean+uniform_memory"} <= cases
    assert summary["dense_memory_order_time_vs_draw_order"] > 0
    assert summary["lean_memory_order_time_vs_draw_order"] > 0
    handles = sampling._fill(TINY["workloads"][0], 5_000, seed=0)["marlbuf"]
    assert handles["interleaved+uniform"].sampler.order == "random"
    assert handles["lean+uniform_memory"].sampler.order == "memory"


def test_concurrency_suite_measures_the_lock_pairwise(monkeypatch):
    from marlbuf.bench.suites import concurrency

    monkeypatch.setattr(
        concurrency, "QUICK", dict(concurrency.QUICK, capacity=2_000, repeats=2, writes=50)
    )
    payload = concurrency.run(quick=True, progress=False)
    check_schema(payload)
    assert {r["format"] for r in payload["rows"]} == {"dense", "lean16"}
    for row in payload["rows"]:
        assert row["lock_cost"] > 0 and row["threaded_vs_sequential"] > 0


@pytest.mark.slow
def test_sequences_suite_runs_and_has_its_cases(monkeypatch):
    from marlbuf.bench.suites import sequences

    tiny = dict(sequences.QUICK, capacity=7_500, scaling=[1_000, 2_500], memory_capacity=500)
    tiny["repeats"] = 2
    monkeypatch.setattr(sequences, "QUICK", tiny)
    payload = sequences.run(quick=True, progress=False)
    check_schema(payload)
    by_part: dict[str, list[dict]] = {}
    for row in payload["rows"]:
        by_part.setdefault(row["part"], []).append(row)
    sampled = {r["case"] for r in by_part["sampling"]}
    assert {"padded_episodes/L=32", "padded_episodes/L=40", "padded_episodes_whole"} <= sampled
    assert {"marlbuf/L=32", "marlbuf/L=40"} <= sampled or "marlbuf Sequence(burn_in=0)" in (
        payload["summary"]["skipped"]
    )
    if "torchrl" not in payload["summary"]["skipped"]:
        assert {"torchrl_pad/L=32", "torchrl_ragged/L=32", "torchrl_pad_cached/L=40"} <= sampled
    for row in by_part["sampling"]:
        assert row["ms_median"] > 0
    assert {r["capacity"] for r in by_part["scaling"]} == {1_000, 2_500}
    assert {r["episodes"] for r in by_part["memory"]} == {"length 25", "mixed 5-25"}
    for row in by_part["memory"]:  # padding: more bytes per real step for shorter episodes
        assert row["padded_bytes_per_step"] > 0
    full, mixed = by_part["memory"]
    assert mixed["padded_bytes_per_step"] > full["padded_bytes_per_step"]


def test_padded_episode_windows_match_the_episodes():
    from marlbuf.bench.baselines.padded_episodes import PaddedEpisodeBuffer, PaddedField

    max_t, n_agents, count = 6, 2, 9
    lengths = np.array([6, 1, 3, 6, 2, 5, 4, 6, 1])
    buf = PaddedEpisodeBuffer(
        {"obs": PaddedField((1,)), "state": PaddedField((1,), per_agent=False)},
        n_agents=n_agents,
        n_episodes=7,  # the ring wraps: the first two episodes are overwritten
        max_t=max_t,
        seed=3,
    )
    code = 100 * np.arange(count)[:, None] + np.arange(max_t + 1) + 1.0  # episode, step
    episodes = {
        "obs": np.repeat(code[:, :, None, None], n_agents, axis=2),
        "state": code[:, :, None].copy(),
    }
    for part in (slice(0, 5), slice(5, count)):  # the second batch wraps around the ring
        buf.insert_episode_batch({k: v[part] for k, v in episodes.items()}, lengths[part])
    assert buf.episodes_in_buffer == 7 and buf.index == 2
    held = {int(buf.data["state"][slot, 0, 0]) // 100: slot for slot in range(7)}
    assert sorted(held) == [2, 3, 4, 5, 6, 7, 8]
    for _ in range(20):
        out = buf.sample_sequences(5, length=4)
        assert out["obs"].shape == (5, 4, n_agents, 1) and out["mask"].shape == (5, 4)
        for b in range(5):
            first = out["state"][b, 0, 0]
            episode, start = int(first) // 100, int(first) % 100 - 1
            length = lengths[episode]
            for t in range(4):
                step = start + t
                real = step < length
                assert out["mask"][b, t] == real
                want = code[episode, step] if real else 0.0
                assert out["state"][b, t, 0] == want and (out["obs"][b, t] == want).all()
                nxt = code[episode, step + 1] if step + 1 <= length else 0.0
                assert (out["next_obs"][b, t] == nxt).all()
                assert out["terminated"][b, t] == (step == length - 1)
    whole = buf.sample_episodes(3)
    assert whole["obs"].shape == (3, max_t + 1, n_agents, 1)
    assert (whole["filled"][:, :, 0].sum(axis=1) - 1 <= max_t).all()


def test_shared_storage_handles_draw_with_their_own_sampler():
    """The sampling, locality and guard suites time several samplers over one filled storage:
    each handle must draw with its own sampler and generator, and leave the original's alone."""
    from datagen import random_step_data

    from marlbuf import AgentSpec, MultiAgentReplayBuffer
    from marlbuf.bench.suites.sampling import _share_storage
    from marlbuf.samplers import Neighbor, Uniform

    specs = {"a": AgentSpec((4,), (2,)), "b": AgentSpec((3,), (2,))}
    buf = MultiAgentReplayBuffer(specs, 256, seed=0)
    buf.extend(**random_step_data(specs, 256, np.random.default_rng(0)))
    handle = _share_storage(buf, Neighbor(8), seed=1)
    runs = handle.sample(64).indices.reshape(8, 8)
    # Neighbor(8): each run is 8 consecutive slots of the ring
    assert np.all((np.diff(runs, axis=1) % 256) == 1)
    assert isinstance(buf.sampler, Uniform) and isinstance(handle.sampler, Neighbor)
    drawn = buf.sample(64).indices
    assert not np.all((np.diff(drawn.reshape(8, 8), axis=1) % 256) == 1)
    batch = handle.sample(16)
    for agent in specs:  # the rows are the original's
        np.testing.assert_array_equal(
            batch.field("obs")[agent], buf.gather(batch.indices).field("obs")[agent]
        )
