"""The reward-preservation suite at tiny size: it runs, is deterministic, has its schema."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marlbuf.bench.suites import rewards
from marlbuf.bench.tools import common

TINY = {
    "envs": ["CN-3", "PP-3+1"],
    "samplers": ["uniform", "neighbor_16", "prioritized_neighbor"],
    "seeds": [0, 1],
    "episodes": 12,
    "block": 4,
    "settings": {"batch_size": 32, "warmup_steps": 100, "update_every": 25},
    "supplement": {
        "envs": ["CN-3"],
        "samplers": ["uniform", "neighbor_16"],
        "settings": {"batch_size": 64},
    },
}


@pytest.fixture(scope="module")
def payload():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rewards, "QUICK", dict(TINY))
        return rewards.run(quick=True, progress=False, workers=1)


@pytest.mark.slow
def test_schema(payload, tmp_path):
    rows = payload["rows"]
    assert len(rows) == 2 * 3 * 2
    for row in rows:
        assert row["episodes"] == 12 and len(row["curve"]) == 3 and len(row["curve_total"]) == 3
        assert row["final_episodes"] == 2  # 20% of 12, rounded
        assert row["update_rounds"] > 0
        expected = "predator_return" if row["env"] == "PP-3+1" else "return"
        assert row["metric"] == expected
    table = {(t["env"], t["sampler"]): t for t in payload["table"]}
    assert len(table) == 6
    for (env, sampler), entry in table.items():
        assert entry["seeds"] == 2 and len(entry["finals"]) == 2
        assert entry["final_min"] <= entry["final_mean"] <= entry["final_max"]
        uniform = table[(env, "uniform")]["final_mean"]
        assert entry["diff_vs_uniform"] == pytest.approx(entry["final_mean"] - uniform)
        assert isinstance(entry["within_uniform_range"], bool)
        assert f"{env}/{sampler}" in payload["summary"]
    assert table[("CN-3", "uniform")]["verdict"] == "baseline"
    assert len(table[("CN-3", "neighbor_16")]["paired_diffs"]) == 2
    supplement = payload["supplement"]
    assert supplement["settings"]["batch_size"] == 64
    assert len(supplement["rows"]) == 2 * 2 and len(supplement["table"]) == 2
    assert all(r["spec"]["settings"]["batch_size"] == 64 for r in supplement["rows"])
    assert payload["config"]["settings"]["batch_size"] == 32
    path = common.write_result(rewards.SUITE, payload, quick=True, out_dir=tmp_path)
    record = json.loads(path.read_text())
    assert record["suite"] == "rewards" and record["rows"]


@pytest.mark.slow
def test_cn_return_is_sum_and_pp_headline_is_predators(payload):
    for row in payload["rows"]:
        if row["env"] == "CN-3":
            assert row["final_return"] == row["final_total_return"]
        else:  # prey are penalised for each contact: predators' sum >= all agents' sum
            assert row["final_return"] >= row["final_total_return"]


@pytest.mark.slow
def test_deterministic_and_cached(payload, tmp_path):
    first = payload["rows"][0]
    cache = tmp_path / "runs.jsonl"
    rows = rewards.train_all([first["spec"]], workers=1, progress=False, cache=cache)
    assert rows[0]["curve"] == first["curve"]  # same seed, same numbers
    assert len(cache.read_text().splitlines()) == 1
    again = rewards.train_all([first["spec"]], workers=1, progress=False, cache=cache)
    assert again[0]["train_wall_s"] == rows[0]["train_wall_s"]  # read back, not retrained


@pytest.mark.slow
def test_plot(payload, tmp_path):
    pytest.importorskip("matplotlib")
    path = rewards.plot(payload, tmp_path)
    assert path.name == "rewards.png" and path.stat().st_size > 1000


def test_bad_names():
    with pytest.raises(ValueError, match="sampler"):
        rewards.run_spec("CN-3", "fast", 0, 10, 5, {})
    with pytest.raises(ValueError, match="env"):
        rewards.run_spec("CN-9", "uniform", 0, 10, 5, {})
    with pytest.raises(ValueError, match="workers"):
        rewards.train_all([], workers=0)


def test_precision_suite_compares_float16_storage_with_uniform(monkeypatch, tmp_path):
    from marlbuf.bench.suites import precision

    tiny = dict(precision.QUICK, episodes=12, block=4)
    tiny["settings"] = {"batch_size": 16, "warmup_steps": 100, "update_every": 25}
    monkeypatch.setattr(precision, "QUICK", tiny)
    payload = precision.run(quick=True, progress=False, workers=1, results_dir=tmp_path)
    samplers = {r["sampler"] for r in payload["rows"]}
    assert samplers == {"uniform", "uniform_float16"}
    assert {t["sampler"] for t in payload["table"]} == samplers
    assert payload["config"]["reused_float32_runs"] == 0


def test_uniform_memory_case_and_the_paired_test():
    assert rewards.sampler_overrides("uniform_memory") == {
        "sampler": "uniform",
        "sample_order": "memory",
    }
    assert rewards.sampler_overrides("uniform")["sample_order"] == "random"
    assert "uniform_memory" in rewards.QUICK["samplers"]
    assert "uniform_memory" in rewards.FULL["samplers"]
    assert rewards.FULL["skip"] == {"PP-3+1": ["uniform_memory"]}
    # t = mean / (std / sqrt(n)) = 2 / (1 / sqrt(3)); with 2 degrees of freedom the two-sided
    # p-value is 1 - |t| / sqrt(2 + t^2)
    out = rewards.paired_test([1.0, 2.0, 3.0])
    t = 2.0 * np.sqrt(3.0)
    assert out["paired_t"] == pytest.approx(t) and out["paired_df"] == 2
    assert out["paired_p"] == pytest.approx(1.0 - t / np.sqrt(2.0 + t * t))
    assert rewards.paired_test([0.5]) == {"paired_t": None, "paired_df": 0, "paired_p": None}
    assert rewards.paired_test([0.0, 0.0])["paired_p"] == 1.0


def test_skip_leaves_a_sampler_out_of_one_env(monkeypatch):
    tiny = {
        "envs": ["CN-3", "PP-3+1"],
        "samplers": ["uniform", "uniform_memory"],
        "skip": {"PP-3+1": ["uniform_memory"]},
        "seeds": [0],
        "episodes": 8,
        "block": 4,
        "settings": {"batch_size": 16, "warmup_steps": 50, "update_every": 25},
    }
    monkeypatch.setattr(rewards, "QUICK", tiny)
    payload = rewards.run(quick=True, progress=False, workers=1)
    runs = {(r["env"], r["sampler"]) for r in payload["rows"]}
    assert runs == {("CN-3", "uniform"), ("CN-3", "uniform_memory"), ("PP-3+1", "uniform")}
    entry = {(t["env"], t["sampler"]): t for t in payload["table"]}[("CN-3", "uniform_memory")]
    assert {"paired_t", "paired_p", "paired_df"} <= set(entry)
    assert payload["config"]["skipped"] == {"PP-3+1": ["uniform_memory"]}
