"""The locality suite at tiny size: it runs, has its schema, reuses identical runs, and the
recommendation follows the reward study's verdict rule."""

from __future__ import annotations

import json

import pytest

from marlbuf.bench import cli
from marlbuf.bench.suites import locality, rewards
from marlbuf.bench.tools import common, plots
from marlbuf.workloads import Workload

TINY = {
    "run_lengths": (4, 16),
    "timing": {
        "workloads": [Workload("cooperative_navigation", 3)],
        "capacity": 2_000,
        "repeats": 2,
    },
    "rewards": {
        "envs": ["CN-3"],
        "seeds": [0, 1],
        "episodes": 12,
        "block": 4,
        "settings": {"batch_size": 32, "warmup_steps": 100, "update_every": 25},
        "reuse_from": None,
        "repeat_check": 0,
    },
}


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(locality, "QUICK", dict(TINY))
        out = tmp_path_factory.mktemp("locality")
        return locality.run(quick=True, progress=False, workers=1, results_dir=out)


def test_schema(payload, tmp_path):
    timing = payload["rows"]
    assert [r["case"] for r in timing] == ["uniform", "neighbor_4", "neighbor_16"]
    assert timing[0]["time_vs_uniform"] == 1.0 and timing[0]["run_length"] is None
    assert timing[0]["time_vs_uniform_paired"] == 1.0
    assert [r["references"] for r in timing[1:]] == [256, 64]  # B = 1024
    for row in timing:
        assert 0 < row["ms_min"] <= row["ms_median"] <= row["ms_max"]
    assert len(payload["reward_rows"]) == 2 * 3  # seeds x (uniform + 2 run lengths)
    assert {r["sampler"] for r in payload["reward_rows"]} == {
        "uniform",
        "neighbor_4",
        "neighbor_16",
    }
    front = {r["run_length"]: r for r in payload["frontier"]}
    assert sorted(front) == [4, 16]
    for row in front.values():
        assert row["time_CN-3"] > 0 and row["time_geomean"] == pytest.approx(row["time_CN-3"])
        assert len(row["paired_CN-3"]) == 2 and isinstance(row["qualifies"], bool)
        assert row["verdict_CN-3"] != "baseline"
    rec = payload["recommendation"]
    assert rec["default_run_length"] in (1, 4, 16)
    assert set(payload["uniform_baseline"]) == {"CN-3"}
    assert payload["config"]["rewards"]["settings"]["batch_size"] == 32
    assert "run length" in payload["markdown"]
    path = common.write_result(locality.SUITE, payload, quick=True, out_dir=tmp_path)
    record = json.loads(path.read_text())
    assert record["suite"] == "locality" and record["frontier"]


def test_plot(payload, tmp_path):
    pytest.importorskip("matplotlib")
    record = json.loads(common.write_result("locality", payload, True, tmp_path).read_text())
    assert locality.plot(record, tmp_path).stat().st_size > 1000


def test_reuses_identical_runs_and_checks_one(payload, tmp_path):
    (tmp_path / "rewards.json").write_text(json.dumps({"rows": payload["reward_rows"]}))
    cfg = {**TINY["rewards"], "seeds": [0], "reuse_from": "rewards.json", "repeat_check": 1}
    part = locality.train_rewards(cfg, (4,), tmp_path, workers=1, progress=False)
    assert part["provenance"]["reused_from_result_file"] == 2  # uniform, neighbor_4 at seed 0
    assert part["provenance"]["trained_by_this_suite"] == 1  # only the repeat check
    (check,) = part["repeat_checks"]
    assert check["sampler"] == "neighbor_4" and check["identical_curve"]
    assert part["table_vs_retrained_uniform"] == []
    # retrain the uniform baseline too: a second set of verdicts against it
    part = locality.train_rewards(
        {**cfg, "repeat_uniform": True}, (4,), tmp_path, workers=1, progress=False
    )
    assert [c["sampler"] for c in part["repeat_checks"]] == ["neighbor_4", "uniform"]
    assert all(c["identical_curve"] for c in part["repeat_checks"])
    alt = {t["sampler"]: t for t in part["table_vs_retrained_uniform"]}
    assert alt["neighbor_4"]["final_mean"] == part["table"][1]["final_mean"]


def test_recommend_rule():
    def row(n, time, verdict):
        return {
            "run_length": n,
            "time_geomean": time,
            "loses": verdict == rewards.LOSES,
            "qualifies": verdict != rewards.LOSES,
        }

    rows = [row(1, 1.1, "within"), row(4, 0.9, "within"), row(16, 0.7, rewards.LOSES)]
    rec = locality.recommend(rows)
    assert rec["recommended_run_length"] == 4 and rec["default_run_length"] == 4
    assert rec["losing"] == [16] and rec["qualifying"] == [1, 4]
    rec = locality.recommend([row(1, 1.1, "within"), row(4, 0.9, rewards.LOSES)])
    assert rec["recommended_run_length"] == 1 and rec["default_run_length"] == 1
    assert not rec["any_longer_than_1_qualifies"]
    rec = locality.recommend([row(4, 0.9, rewards.LOSES)])
    assert rec["recommended_run_length"] is None and rec["default_run_length"] == 1


def test_registered_and_labels():
    assert cli.SUITES["locality"] == "marlbuf.bench.suites.locality"
    assert "locality" in cli.LONG_SUITES and "locality" in plots.PLOTTERS
    assert rewards.sampler_overrides("neighbor_8") == {"sampler": "neighbor", "run_length": 8}
    assert rewards.sampler_overrides("neighbor_16") == rewards.SAMPLERS["neighbor_16"]
    for bad in ("neighbor_0", "neighbor_x", "neighbor_08", "fast"):
        with pytest.raises(ValueError, match="sampler"):
            rewards.run_spec("CN-3", bad, 0, 10, 5, {})
    with pytest.raises(ValueError, match="parts"):
        locality.run(quick=True, parts=("nope",))


def test_time_interleaved_rotates_and_keeps_samples():
    calls = []
    cases = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    out = common.time_interleaved(cases, repeats=3, warmup=0, rotate=True, keep_samples=True)
    assert "".join(calls) == "abcbcacab"
    assert all(len(t["samples"]) == 3 and t["n"] == 3 for t in out.values())
    assert "samples" not in common.time_interleaved(cases, repeats=1, warmup=0)["a"]


def test_order_part_times_memory_against_draw_order(monkeypatch):
    tiny = dict(TINY)
    tiny["order"] = {
        "workloads": [Workload("cooperative_navigation", 3)],
        "capacities": [2_000, 10_000],
        "storages": ["once", "stored"],
        "samplers": ["uniform", "prioritized"],
        "repeats": 2,
        "table_budget_bytes": 1_000_000,  # lowers 10_000 CN-3 rows to the fill chunk, 5_000
        "draw_sizes": [3_000],
        "draw_repeats": 2,
        "draw_inner": 1,
    }
    monkeypatch.setattr(locality, "QUICK", tiny)
    payload = locality.run(quick=True, progress=False, parts=("order",))
    rows = payload["order_rows"]
    assert payload["rows"] == [] and payload["reward_rows"] == []
    assert len(rows) == 2 * 2 * 4  # capacities x storages x (2 samplers x 2 orders)
    assert {r["case"] for r in rows} == {
        "uniform_random",
        "uniform_memory",
        "prioritized_random",
        "prioritized_memory",
    }
    for row in rows:
        assert 0 < row["ms_min"] <= row["ms_median"] <= row["ms_max"]
        assert row["capacity"] <= row["requested_capacity"]
        assert row["case"] == f"{row['sampler']}_{row['order']}"
        if row["order"] == "random":
            assert row["time_vs_random"] == row["time_vs_random_paired"] == 1.0
    lowered = {r["storage"]: r["capacity"] for r in rows if r["requested_capacity"] == 10_000}
    assert lowered == {"once": 5_000, "stored": 5_000}
    assert set(payload["order"]) == {"uniform", "prioritized"}
    for kind, order in payload["order"].items():
        assert len(order["paired_ratios"]) == 4 and isinstance(order["never_slower"], bool)
        assert order["never_slower"] == (order["max_paired_ratio"] <= locality.ORDER_NOISE)
        assert payload["summary"]["order"][kind]["worst_case"] in order["paired_ratios"]
    draws = payload["order_draws"]
    assert {(r["case"], r["order"]) for r in draws} == {
        (case, order) for case in locality.DRAW_CASES for order in ("random", "memory")
    }
    assert all(r["size"] == 3_000 and r["us_median"] > 0 for r in draws)
    assert all(r["time_vs_random"] == 1.0 for r in draws if r["order"] == "random")
    assert "Memory order vs draw order" in payload["markdown"]
    assert payload["config"]["order"]["storages"] == {"once": "once", "stored": "stored"}


def test_order_part_is_skipped_without_its_config(payload):
    assert payload["order_rows"] == [] and payload["order"] == {}
    assert payload["order_draws"] == []
    assert payload["config"]["order"] is None
