"""Reward preservation across samplers (the paper's Figs. 10-11): does sampling faster cost reward?

MADDPG is trained with every sampler — ``uniform``, ``neighbor`` with run length 16 and 64,
``prioritized`` (PER), ``prioritized_neighbor`` (prioritized-locality) and ``uniform_memory``
(uniform batches in ascending slot order: the same distribution as a set) — on cooperative
navigation with 3 and 6 agents and predator-prey with 3 predators + 1 prey, several seeds each.
Every run records its reward curve (mean return per block of episodes) and its final return
(mean over the last :data:`FINAL_FRACTION` of the training episodes). The summary gives, per
environment and sampler, mean ± std over seeds of the final return, the difference to uniform,
and whether it lies within uniform's seed spread, with a paired t-test over seeds (same seed =
same initial weights and environment episodes).

Returns are in the original MPE's units (what openai/maddpg prints and the paper plots):
cooperative navigation sums the (shared) reward over agents; predator-prey's headline is the
predators' return (sum over predators: +10 per contact for every predator), the sum over all
agents (prey included) is recorded too.

Every sampler gets identical settings (:data:`SETTINGS`): the paper's networks and learning
rates with faster-learning batch size, warm-up and update interval so that a few thousand
episodes show learning on a 2-core machine. Each run is seeded and deterministic (one torch
thread); runs go to a process pool (:data:`WORKERS` processes) and finished runs can be cached
in a JSON-lines file, so an interrupted study resumes where it stopped.

Run ``python -m marlbuf.bench.suites.rewards [--quick] [--cache PATH]``; the plot is
:func:`plot` (``bench/results/figures/rewards.png``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import markdown_table

SUITE = "rewards"

#: Sampler variants compared: label -> TrainConfig overrides. Run lengths divide the batch.
#: ``uniform`` and ``prioritized`` pin draw order (what their recorded runs used, whatever the
#: trainers' default order); ``uniform_memory`` is uniform in ascending slot order.
SAMPLERS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform", "sample_order": "random"},
    "neighbor_16": {"sampler": "neighbor", "run_length": 16},
    "neighbor_64": {"sampler": "neighbor", "run_length": 64},
    "prioritized": {"sampler": "prioritized", "sample_order": "random"},
    "prioritized_neighbor": {"sampler": "prioritized_neighbor"},
    # uniform sampling from float16 observation storage (float32 batches)
    "uniform_float16": {"sampler": "uniform", "obs_dtype": "float16", "sample_order": "random"},
    # the same uniform batches as sets, indices in ascending slot order
    "uniform_memory": {"sampler": "uniform", "sample_order": "memory"},
}
#: Labels ``neighbor_<n>`` for any other run length n are accepted too (see
#: :func:`sampler_overrides`); the locality suite sweeps them.
NEIGHBOR_PREFIX = "neighbor_"
#: The verdict that counts as a loss of reward (see :func:`_verdict`).
LOSES = "loses reward"
#: Environments: label -> TrainConfig overrides.
ENVS: dict[str, dict[str, Any]] = {
    "CN-3": {"env": "cooperative_navigation", "n_agents": 3},
    "CN-6": {"env": "cooperative_navigation", "n_agents": 6},
    "PP-3+1": {"env": "predator_prey", "n_agents": 3},
}
#: Settings shared by every run (the rest are TrainConfig's defaults, the paper's): batch 256
#: instead of 1024 (so the neighbor samplers draw 16 refs x 16 and 4 refs x 64 slots), an update
#: round every 25 env steps instead of 100, and openai/maddpg's warm-up rule batch x 25 (6,400
#: transitions = 256 episodes).
SETTINGS: dict[str, Any] = {
    "algo": "maddpg",
    "batch_size": 256,
    "update_every": 25,
    "warmup_steps": 256 * 25,
    "threads": 1,
}
FULL: dict[str, Any] = {
    "envs": list(ENVS),
    "samplers": list(SAMPLERS),
    "seeds": [0, 1, 2],
    "episodes": 2500,
    "block": 50,
    # uniform_memory is compared with uniform on cooperative navigation only (not PP-3+1)
    "skip": {"PP-3+1": ["uniform_memory"]},
    # the neighbor samplers again at the paper's batch of 1024 (64 refs x 16, 16 refs x 64):
    # does a loss at batch 256 (16 refs x 16, 4 refs x 64) come from too few references?
    "supplement": {
        "envs": ["CN-3"],
        "samplers": ["uniform", "neighbor_16", "neighbor_64"],
        "settings": {"batch_size": 1024},
    },
}
#: The quick run (CI, ``marlbuf bench --quick``): well under a minute. Tests patch it smaller.
QUICK: dict[str, Any] = {
    "envs": ["CN-3"],
    "samplers": ["uniform", "neighbor_16", "uniform_memory"],
    "seeds": [0],
    "episodes": 60,
    "block": 10,
    "settings": {"batch_size": 64, "warmup_steps": 500, "update_every": 25},
}
#: Columns of the per-(env, sampler) table (see :func:`summarize`).
TABLE_COLUMNS = [
    "env",
    "sampler",
    "metric",
    "seeds",
    "final_mean",
    "final_std",
    "diff_vs_uniform",
    "welch_t",
    "paired_t",
    "paired_p",
    "within_uniform_range",
    "verdict",
]
#: Processes training at once (one torch thread each).
WORKERS = 2
#: Share of the training episodes, at the end, whose mean return is the run's final return.
FINAL_FRACTION = 0.2


def sampler_overrides(sampler: str) -> dict[str, Any]:
    """TrainConfig overrides of a sampler label: one of :data:`SAMPLERS`, or ``neighbor_<n>``
    (the neighbor sampler with run length n, a positive int)."""
    if sampler in SAMPLERS:
        return dict(SAMPLERS[sampler])
    if sampler.startswith(NEIGHBOR_PREFIX):
        digits = sampler[len(NEIGHBOR_PREFIX) :]
        if digits.isdigit() and int(digits) > 0 and str(int(digits)) == digits:
            return {"sampler": "neighbor", "run_length": int(digits)}
    raise ValueError(
        f"sampler must be one of {list(SAMPLERS)} or neighbor_<n> with a positive int n; "
        f"got sampler={sampler!r}"
    )


def run_spec(
    env: str, sampler: str, seed: int, episodes: int, block: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """The JSON-safe description of one training run (also its cache key)."""
    if env not in ENVS:
        raise ValueError(f"env must be one of {list(ENVS)}; got env={env!r}")
    sampler_overrides(sampler)  # validates the label
    return {
        "env": env,
        "sampler": sampler,
        "seed": int(seed),
        "episodes": int(episodes),
        "block": int(block),
        "settings": dict(sorted(settings.items())),
    }


def train_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one run described by :func:`run_spec`; returns its row (curve, final return).

    Runs in a worker process: sets one torch thread and a passive OpenMP wait first.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from marlbuf.algos import Runner, TrainConfig

    episodes, block = spec["episodes"], spec["block"]
    settings = dict(spec["settings"])
    rounds = max(1, episodes * 25 // settings.get("update_every", 100))
    config = TrainConfig(
        **ENVS[spec["env"]],
        **sampler_overrides(spec["sampler"]),
        **settings,
        seed=spec["seed"],
        # every transition of the run fits: the same as the paper's 1e6 buffer here
        buffer_size=max(episodes * 25, settings.get("warmup_steps") or 0, 1000),
        # prioritized samplers: beta reaches 1 at the end of the run
        beta_anneal_rounds=rounds,
    )
    runner = Runner(config)
    predators = [i for i, name in enumerate(runner.agents) if name.startswith("adversary")]
    start = time.perf_counter()
    records = runner.train(episodes)
    wall = time.perf_counter() - start
    rounds_done = runner.update_rounds
    runner.close()
    total = np.array([r.ret_original for r in records])
    if predators:  # predator-prey: mpe2's simple_tag rewards are the original ones
        headline = np.array([sum(r.agent_returns[i] for i in predators) for r in records])
        metric = "predator_return"
    else:
        headline = total
        metric = "return"
    n_final = max(1, round(FINAL_FRACTION * len(records)))
    return {
        **{k: spec[k] for k in ("env", "sampler", "seed", "episodes")},
        "metric": metric,
        "final_return": float(headline[-n_final:].mean()),
        "final_total_return": float(total[-n_final:].mean()),
        "first_block_return": float(headline[:block].mean()),
        "final_episodes": n_final,
        "block": block,
        "curve": _blocks(headline, block),
        "curve_total": _blocks(total, block),
        "update_rounds": rounds_done,
        "train_wall_s": wall,
        "spec": spec,
    }


def _blocks(values: np.ndarray, block: int) -> list[float]:
    return [float(values[i : i + block].mean()) for i in range(0, len(values), block)]


def load_cache(path: Path | None) -> dict[str, dict[str, Any]]:
    """Finished runs of a JSON-lines cache file, by :func:`spec_key` (empty if no file)."""
    if path is None or not path.is_file():
        return {}
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[spec_key(row["spec"])] = row
    return rows


def spec_key(spec: dict[str, Any]) -> str:
    """A run's cache key: its spec as canonical JSON (identical spec = identical run)."""
    return json.dumps(spec, sort_keys=True)


def train_all(
    specs: Sequence[dict[str, Any]],
    workers: int = WORKERS,
    progress: bool = True,
    cache: Path | None = None,
    reuse: Iterable[dict[str, Any]] = (),
    desc: str = "rewards",
) -> list[dict[str, Any]]:
    """Train every spec (``workers`` processes; ``1`` trains in this process), reusing and
    appending to the JSON-lines ``cache`` if given. ``reuse``: finished rows from elsewhere
    (e.g. an earlier result file's ``rows``), used where their ``spec`` is identical. Rows come
    back in the order of ``specs``."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int; got workers={workers!r}")
    done = {spec_key(row["spec"]): row for row in reuse if "spec" in row}
    done.update(load_cache(cache))
    todo = [s for s in specs if spec_key(s) not in done]
    bar = _progress(len(specs), len(specs) - len(todo), progress, desc)

    def finish(row: dict[str, Any]) -> None:
        done[spec_key(row["spec"])] = row
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            with cache.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        if bar is not None:
            bar.set_postfix_str(
                f"{row['env']} {row['sampler']} s{row['seed']}: {row['final_return']:.0f}"
            )
            bar.update(1)

    if workers == 1 or len(todo) <= 1:
        for spec in todo:
            finish(train_one(spec))
    else:
        import multiprocessing

        # spawn: a fresh interpreter per worker, no inherited torch/OpenMP thread state
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(train_one, spec) for spec in todo]
            for future in as_completed(futures):
                finish(future.result())
    if bar is not None:
        bar.close()
    return [done[spec_key(s)] for s in specs]


def _progress(total: int, initial: int, enabled: bool, desc: str = "rewards") -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the [algos] extra
        return None
    return tqdm(total=total, initial=initial, desc=desc, unit="run")


def summarize(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per (env, sampler): mean ± std over seeds of the final return, the difference to
    uniform, and whether it lies within uniform's seed spread. Returns (table rows, summary)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["env"], row["sampler"]), []).append(row)
    table = []
    summary: dict[str, Any] = {}
    for (env, sampler), group in groups.items():
        finals = np.array([r["final_return"] for r in sorted(group, key=lambda r: r["seed"])])
        base = groups.get((env, "uniform"))
        entry: dict[str, Any] = {
            "env": env,
            "sampler": sampler,
            "metric": group[0]["metric"],
            "seeds": len(finals),
            "final_mean": float(finals.mean()),
            "final_std": float(finals.std(ddof=1)) if len(finals) > 1 else 0.0,
            "final_min": float(finals.min()),
            "final_max": float(finals.max()),
            "finals": finals.tolist(),
            "first_block_mean": float(np.mean([r["first_block_return"] for r in group])),
        }
        if base is not None:
            base_finals = np.array([r["final_return"] for r in base])
            base_mean = float(base_finals.mean())
            base_std = float(base_finals.std(ddof=1)) if len(base_finals) > 1 else 0.0
            diff = entry["final_mean"] - base_mean
            entry["diff_vs_uniform"] = diff
            entry["diff_vs_uniform_pct"] = 100.0 * diff / abs(base_mean) if base_mean else 0.0
            # "within spread": the sampler's mean lies inside uniform's seed range
            entry["within_uniform_range"] = bool(
                base_finals.min() <= entry["final_mean"] <= base_finals.max()
            )
            entry["within_uniform_std"] = bool(abs(diff) <= base_std)
            # same seed = same initial weights and environment episodes: pair them
            by_seed = {r["seed"]: r["final_return"] for r in base}
            entry["paired_diffs"] = [
                r["final_return"] - by_seed[r["seed"]]
                for r in sorted(group, key=lambda r: r["seed"])
                if r["seed"] in by_seed
            ]
            spread = np.sqrt(
                (entry["final_std"] ** 2 + base_std**2) / max(1, min(len(finals), len(base_finals)))
            )
            entry["welch_t"] = float(diff / spread) if spread > 0 else 0.0
            entry.update(paired_test(entry["paired_diffs"]))
            entry["verdict"] = _verdict(entry, base_finals)
        table.append(entry)
        key = f"{env}/{sampler}"
        summary[key] = {
            k: (round(v, 1) if isinstance(v, float) else v)
            for k, v in entry.items()
            if k
            in ("final_mean", "final_std", "diff_vs_uniform", "within_uniform_range", "verdict")
        }
    return table, summary


def paired_test(diffs: Sequence[float]) -> dict[str, Any]:
    """Paired t-test of per-seed differences to uniform (same seed, same initial weights and
    episodes): ``paired_t = mean / (std / sqrt(n))``, ``paired_df = n - 1`` and the two-sided
    ``paired_p`` (from scipy when it is installed, else ``None``). With fewer than two seeds, or
    differences all equal, ``paired_t`` is ``None`` (0 when they are all zero)."""
    values = np.asarray(diffs, dtype=np.float64)
    n = len(values)
    out: dict[str, Any] = {"paired_t": None, "paired_df": max(0, n - 1), "paired_p": None}
    if n < 2:
        return out
    spread = float(values.std(ddof=1))
    if spread == 0.0:
        out["paired_t"] = 0.0 if not values.any() else None
        out["paired_p"] = 1.0 if not values.any() else 0.0
        return out
    t = float(values.mean() / (spread / np.sqrt(n)))
    out["paired_t"] = t
    try:
        from scipy import stats
    except ImportError:  # pragma: no cover - scipy comes with the [dev] extra
        return out
    out["paired_p"] = float(2.0 * stats.t.sf(abs(t), n - 1))
    return out


#: |Welch t| from which a difference below/above every uniform seed counts as a loss/gain.
#: A heuristic: with 3 seeds a t-test has little power, so the verdict also asks that the
#: sampler be lower (higher) than uniform on every seed.
CLEAR_T = 2.0


def _verdict(entry: dict[str, Any], base_finals: np.ndarray) -> str:
    """A plain reading from uniform's seed range, the per-seed (paired) differences and t."""
    if entry["sampler"] == "uniform":
        return "baseline"
    paired = entry.get("paired_diffs") or []
    t = entry.get("welch_t", 0.0)
    if entry["final_mean"] < base_finals.min():
        if paired and all(d < 0 for d in paired) and t <= -CLEAR_T:
            return LOSES
        return "slightly below uniform's seed range, not a clear loss"
    if entry["final_mean"] > base_finals.max():
        if paired and all(d > 0 for d in paired) and t >= CLEAR_T:
            return "gains reward"
        return "slightly above uniform's seed range, not a clear gain"
    return "within uniform's seed spread"


def run(
    quick: bool = False,
    progress: bool = True,
    workers: int = WORKERS,
    cache: Path | None = None,
) -> dict[str, Any]:
    """Train the grid (:data:`FULL`, or :data:`QUICK` with ``quick``) and summarise it."""
    sizes = QUICK if quick else FULL
    settings = {**SETTINGS, **sizes.get("settings", {})}
    episodes, block = int(sizes["episodes"]), int(sizes["block"])
    # seed-major order: an interrupted study still has whole seeds of every (env, sampler)
    skip = sizes.get("skip", {})
    specs = [
        run_spec(env, sampler, seed, episodes, block, settings)
        for seed in sizes["seeds"]
        for env in sizes["envs"]
        for sampler in sizes["samplers"]
        if sampler not in skip.get(env, ())
    ]
    supplement = sizes.get("supplement")
    extra_settings = {**settings, **supplement["settings"]} if supplement else {}
    extra_specs = (
        [
            run_spec(env, sampler, seed, episodes, block, extra_settings)
            for seed in sizes["seeds"]
            for env in supplement["envs"]
            for sampler in supplement["samplers"]
        ]
        if supplement
        else []
    )
    cached = sum(spec_key(s) in load_cache(cache) for s in specs + extra_specs)
    start = time.perf_counter()
    all_rows = train_all(specs + extra_specs, workers=workers, progress=progress, cache=cache)
    wall = time.perf_counter() - start
    rows, extra_rows = all_rows[: len(specs)], all_rows[len(specs) :]
    table, summary = summarize(rows)
    columns = TABLE_COLUMNS
    extra: dict[str, Any] = {}
    if extra_rows:
        extra_table, extra_summary = summarize(extra_rows)
        extra = {
            "supplement": {
                "what": "the same runs with only these settings changed",
                "settings": extra_settings,
                "rows": extra_rows,
                "table": extra_table,
                "summary": extra_summary,
                "markdown": markdown_table(extra_table, columns),
            }
        }
    return {
        "rows": rows,
        "table": table,
        "summary": summary,
        "markdown": markdown_table(table, columns),
        "config": {
            "envs": {e: ENVS[e] for e in sizes["envs"]},
            "samplers": {s: SAMPLERS[s] for s in sizes["samplers"]},
            "skipped": {env: list(names) for env, names in skip.items()},
            "seeds": list(sizes["seeds"]),
            "episodes": episodes,
            "block": block,
            "final_fraction": FINAL_FRACTION,
            "settings": settings,
            "buffer_size": "episodes x 25 (every transition kept)",
            "beta_anneal_rounds": "the run's update rounds (beta 0.5 -> 1 over the run)",
            "workers": workers,
            "torch_threads_per_run": 1,
            "wall_s": wall,
            "runs_read_from_cache": cached,
            "cpu_s": float(sum(r["train_wall_s"] for r in all_rows)),
            "units": "original MPE units; CN: sum over agents; PP: sum over predators "
            "(final_total_return / curve_total: sum over all agents)",
            "what": "final_return = mean return of the last final_fraction of training "
            "episodes (with exploration); curve = mean return per block of episodes",
        },
        **extra,
    }


def plot(record: dict[str, Any], out_dir: Path | str) -> Path:
    """Mean reward curve per sampler with a min-max band over seeds, one panel per env (and
    one for the supplement's runs, if any).

    Writes ``<out_dir>/rewards.png`` and returns its path (needs matplotlib, ``[bench]``).
    """
    from marlbuf.bench.tools.plots import _plt, save, seeds, wrapped

    plt = _plt()
    panels: dict[str, list[dict[str, Any]]] = {}
    for row in record["rows"]:
        panels.setdefault(row["env"], []).append(row)
    supplement = record.get("supplement")
    if supplement:
        batch = supplement["settings"].get("batch_size")
        for row in supplement["rows"]:
            panels.setdefault(f"{row['env']}, batch {batch}", []).append(row)
    samplers = list(dict.fromkeys(r["sampler"] for rows in panels.values() for r in rows))
    colors = {s: f"C{i}" for i, s in enumerate(samplers)}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (env, rows) in zip(axes[0], panels.items()):
        metric = "return"
        for sampler in samplers:
            group = [r for r in rows if r["sampler"] == sampler]
            if not group:
                continue
            metric = group[0]["metric"]
            length = min(len(r["curve"]) for r in group)
            curves = np.array([r["curve"][:length] for r in group])
            x = (np.arange(length) + 1) * group[0]["block"]
            mean = curves.mean(axis=0)
            color = colors[sampler]
            ax.plot(x, mean, label=f"{sampler} ({seeds(len(group))})", lw=1.4, color=color)
            if len(group) > 1:
                low, high = curves.min(axis=0), curves.max(axis=0)
                ax.fill_between(x, low, high, alpha=0.15, color=color)
        ax.set_title(env)
        ax.set_xlabel("episode")
        ax.set_ylabel(f"{metric.replace('_', ' ')} (original MPE units)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    most = max(len({r.get("seed") for r in rows}) for rows in panels.values())
    title = (
        "MADDPG reward by sampler: mean over seeds, band = min-max over seeds"
        if most > 1
        else "MADDPG reward by sampler, one seed"
    )
    if record.get("quick"):
        title += " (quick sizes)"
    fig.suptitle(wrapped(title, fig.get_figwidth(), 12))
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return save(fig, out / "rewards.png")


if __name__ == "__main__":  # pragma: no cover
    import argparse

    from marlbuf.bench.tools.common import RESULTS_DIR, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--cache", type=Path, default=None, help="JSON-lines file of finished runs")
    ns = parser.parse_args()
    payload = run(quick=ns.quick, workers=ns.workers, cache=ns.cache)
    print(payload["markdown"])
    path = write_result(SUITE, payload, ns.quick)
    print(path)
    if not ns.quick:
        print(plot(json.loads(path.read_text()), RESULTS_DIR / "figures"))
