"""A recurrent agent that learns from sequence batches: recurrent MADDPG on partially observable
cooperative navigation (:mod:`marlbuf.algos.recurrent`).

Each agent's observation lacks its own velocity; the actors are GRUs trained from
``Sequence(length=16, burn_in=8)`` batches of 32 sequences; the critics see the full state (a
global field). Per seed: the training curve (mean return per block of episodes, in the original
MPE's units), and the returns of the untrained and the trained policy on the same evaluation
episodes (fixed initial positions, actions without exploration noise). The run **learns** when,
for every seed, the trained policy's mean evaluation return exceeds the untrained one's by more
than twice the standard error of the mean paired difference (same episodes before and after).

Run ``marlbuf bench recurrent`` (about 10 minutes per seed on a 2-core machine, seeds in
parallel); the figure is :func:`plot` (``bench/results/figures/recurrent.png``).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import markdown_table

SUITE = "recurrent"

FULL: dict[str, Any] = {
    "seeds": [0, 1, 2],
    "episodes": 4000,
    "block": 100,
    "eval_episodes": 200,
    "settings": {},
}
QUICK: dict[str, Any] = {
    "seeds": [0],
    "episodes": 24,
    "block": 8,
    "eval_episodes": 2,
    "settings": {"warmup_steps": 200, "batch_size": 8, "length": 8, "burn_in": 4},
}
#: parallel training processes (one torch thread each)
WORKERS = max(1, min(3, (os.cpu_count() or 1)))


def train_seed(seed: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """One seeded run: its curve, final return and evaluation returns before/after."""
    from marlbuf.algos.recurrent import RecurrentConfig, config_dict, train

    config = RecurrentConfig(seed=seed, episodes=cfg["episodes"], **cfg["settings"])
    result = train(config, evaluate_episodes=cfg["eval_episodes"])
    returns = np.array([r.original_return for r in result.records])
    block = cfg["block"]
    usable = len(returns) // block * block
    curve = returns[:usable].reshape(-1, block).mean(axis=1)
    before, after = np.array(result.eval_before), np.array(result.eval_after)
    paired = after - before  # the same evaluation episodes before and after training
    gain = float(paired.mean())
    stderr = float(paired.std(ddof=1) / np.sqrt(len(paired))) if len(paired) > 1 else float("nan")
    final = returns[-max(1, len(returns) // 10) :]
    return {
        "seed": seed,
        "episodes": len(returns),
        "updates": result.records[-1].updates,
        "seconds": round(result.records[-1].seconds, 1),
        "block": block,
        "curve": [round(float(x), 2) for x in curve],
        "first_block": float(curve[0]) if len(curve) else float("nan"),
        "final_return": float(final.mean()),
        "eval_before": float(before.mean()),
        "eval_after": float(after.mean()),
        "eval_gain": gain,
        "eval_gain_stderr": stderr,
        "learns": bool(gain > 2 * stderr),
        "config": config_dict(config),
    }


def run(quick: bool = False, progress: bool = True, workers: int = WORKERS) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    seeds = cfg["seeds"]
    if workers > 1 and len(seeds) > 1:
        with ProcessPoolExecutor(min(workers, len(seeds))) as pool:
            rows = list(pool.map(train_seed, seeds, [cfg] * len(seeds)))
    else:
        rows = [train_seed(seed, cfg) for seed in seeds]
    if progress:
        for row in rows:
            print(
                f"[recurrent] seed {row['seed']}: eval {row['eval_before']:.1f} -> "
                f"{row['eval_after']:.1f} (gain {row['eval_gain']:.1f} ± "
                f"{row['eval_gain_stderr']:.1f}), {row['seconds']} s",
                flush=True,
            )
    gains = np.array([r["eval_gain"] for r in rows])
    summary = {
        "seeds": len(rows),
        "eval_before_mean": round(float(np.mean([r["eval_before"] for r in rows])), 2),
        "eval_after_mean": round(float(np.mean([r["eval_after"] for r in rows])), 2),
        "eval_gain_mean": round(float(gains.mean()), 2),
        "eval_gain_std": round(float(gains.std(ddof=1)), 2) if len(gains) > 1 else None,
        "every_seed_learns": bool(all(r["learns"] for r in rows)),
    }
    columns = ["seed", "episodes", "updates", "first_block", "final_return", "eval_before"]
    columns += ["eval_after", "eval_gain", "eval_gain_stderr", "learns", "seconds"]
    return {
        "rows": rows,
        "summary": summary,
        "markdown": markdown_table(rows, columns),
        "config": {k: v for k, v in cfg.items() if k != "seeds"} | {"seeds": seeds},
    }


def plot(record: dict[str, Any], out_dir: Path | str) -> Path:
    """The training curve of every seed and their mean; writes ``<out_dir>/recurrent.png``."""
    from marlbuf.bench.tools.plots import _plt, save, wrapped

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    rows = record["rows"]
    length = min(len(r["curve"]) for r in rows)
    block = rows[0]["block"]
    x = (np.arange(length) + 1) * block
    curves = np.array([r["curve"][:length] for r in rows])
    if len(rows) > 1:
        for row, curve in zip(rows, curves):
            ax.plot(x, curve, lw=0.8, alpha=0.5, label=f"seed {row['seed']}")
    mean_label = "mean over seeds" if len(rows) > 1 else f"seed {rows[0]['seed']} (one seed)"
    ax.plot(x, curves.mean(axis=0), color="k", lw=2, label=mean_label)
    ax.set_xlabel("episode")
    ax.set_ylabel(f"return (original MPE units, mean per {block} episodes)")
    title = "Recurrent MADDPG, cooperative navigation (3 agents, no own velocity)"
    ax.set_title(wrapped(title + (" (quick sizes)" if record.get("quick") else ""), 6.0, 12))
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return save(fig, Path(out_dir) / "recurrent.png")


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps(run(quick=True)["summary"], indent=1))
