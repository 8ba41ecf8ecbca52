"""Reward with half-precision storage: does float16 observation storage keep learning?

MADDPG with the reward study's protocol (``bench/suites/rewards.py``: 2,500 episodes, batch 256, an
update round every 25 steps, 3 seeds) on cooperative navigation with 3 and 6 agents, uniform
sampling, observations stored in float32 (``uniform``) and in float16 (``uniform_float16``;
batches converted back to float32 in the gather). The float32 runs are reused from
``bench/results/locality.json`` where their run description is identical (they were trained on
the same machine class; the locality study retrained its uniform baseline), so only the float16
runs are trained. Verdicts use the reward study's rule (every seed lower and Welch t <= -2 =
"loses reward").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from marlbuf.bench.suites import rewards
from marlbuf.bench.tools.common import RESULTS_DIR, markdown_table

SUITE = "precision"

FULL: dict[str, Any] = {
    "envs": ["CN-3", "CN-6"],
    "seeds": [0, 1, 2],
    "episodes": rewards.FULL["episodes"],
    "block": rewards.FULL["block"],
    "settings": {},
    "reuse_from": "locality.json",
}
QUICK: dict[str, Any] = {
    "envs": ["CN-3"],
    "seeds": [0],
    "episodes": 60,
    "block": 10,
    "settings": {"batch_size": 64, "warmup_steps": 500, "update_every": 25},
    "reuse_from": None,
}


def _reusable(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    record = json.loads(path.read_text())
    return [r for r in record.get("reward_rows", record.get("rows", [])) if "spec" in r]


def run(
    quick: bool = False,
    progress: bool = True,
    workers: int = rewards.WORKERS,
    cache: Path | None = None,
    results_dir: Path | str = RESULTS_DIR,
) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    settings = {**rewards.SETTINGS, **cfg["settings"]}
    specs = [
        rewards.run_spec(env, sampler, seed, cfg["episodes"], cfg["block"], settings)
        for seed in cfg["seeds"]
        for env in cfg["envs"]
        for sampler in ("uniform", "uniform_float16")
    ]
    reuse = _reusable(Path(results_dir) / cfg["reuse_from"]) if cfg["reuse_from"] else []
    wanted = {rewards.spec_key(s) for s in specs}
    reused = [r for r in reuse if rewards.spec_key(r["spec"]) in wanted]
    rows = rewards.train_all(
        specs, workers=workers, progress=progress, cache=cache, reuse=reused, desc=SUITE
    )
    table, summary = rewards.summarize(rows)
    columns = rewards.TABLE_COLUMNS
    return {
        "rows": rows,
        "table": table,
        "summary": summary,
        "markdown": markdown_table(table, columns),
        "config": {
            "envs": cfg["envs"],
            "seeds": cfg["seeds"],
            "episodes": cfg["episodes"],
            "settings": settings,
            "reused_float32_runs": len(reused),
            "reused_from": cfg["reuse_from"] if reused else None,
        },
    }
