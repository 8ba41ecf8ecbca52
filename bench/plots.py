"""PNG figures from ``bench/results/*.json`` in the style of the paper's figures.

``make_all(results_dir)`` draws every figure whose result file exists and returns the paths.
matplotlib is imported lazily (the ``[bench]`` extra) and uses the non-interactive Agg backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marlbuf.bench.common import RESULTS_DIR


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'marlbuf[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load(results_dir: Path, suite: str, quick: bool | None = None) -> dict[str, Any] | None:
    """A suite's result record: the full run if present (unless ``quick``), else the quick one."""
    names = {True: [f"{suite}-quick.json"], False: [f"{suite}.json"]}
    order = names[bool(quick)] if quick is not None else names[False] + names[True]
    for name in order:
        path = Path(results_dir) / name
        if path.is_file():
            record: dict[str, Any] = json.loads(path.read_text())
            return record
    return None


#: Cases up to which one chart of grouped bars stays readable (one colour per case from a
#: ten-colour palette); more cases are drawn as small multiples, one panel per workload.
GROUPED_MAX_CASES = 10


def _grouped_bars(
    record: dict[str, Any],
    value: str,
    title: str,
    ylabel: str,
    path: Path,
    cases: list[str] | None = None,
    log: bool = False,
) -> Path:
    """One group of bars per workload, one bar (and one colour) per case (a row field
    ``value``); with more than :data:`GROUPED_MAX_CASES` cases, one panel per workload with a
    labelled horizontal bar per case instead, so that no two cases share a colour."""
    plt = _plt()
    rows = record["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    cases = cases or list(dict.fromkeys(r["case"] for r in rows))
    full_title = title + (" (quick sizes)" if record.get("quick") else "")

    def value_of(workload: str, case: str) -> float | None:
        return next(
            (r.get(value) for r in rows if r["workload"] == workload and r["case"] == case), None
        )

    if len(cases) > GROUPED_MAX_CASES:
        fig, axes = plt.subplots(
            1,
            len(workloads),
            figsize=(3.0 * len(workloads) + 3.0, 0.28 * len(cases) + 1.6),
            sharey=True,
            squeeze=False,
        )
        positions = list(range(len(cases)))[::-1]  # first case on top
        for ax, workload in zip(axes[0], workloads):
            values = [value_of(workload, c) for c in cases]
            ax.barh(
                positions,
                [v if v is not None else 0.0 for v in values],
                color=["C0" if v is not None else "white" for v in values],
            )
            if value.startswith("time_vs"):
                ax.axvline(1.0, color="0.3", lw=0.8)  # the reference case
            ax.set_title(workload, fontsize=9)
            ax.set_xlabel(ylabel, fontsize=7)
            if log:
                ax.set_xscale("log")
            ax.grid(axis="x", alpha=0.3)
            ax.tick_params(labelsize=7)
        axes[0][0].set_yticks(positions)
        axes[0][0].set_yticklabels(cases, fontsize=7)
        fig.suptitle(full_title, fontsize=9)
    else:
        colors = plt.get_cmap("tab10").colors
        width = 0.8 / len(cases)
        fig, ax = plt.subplots(figsize=(max(7.0, 1.4 * len(workloads) + 2), 5))
        for i, case in enumerate(cases):
            ys = [value_of(w, case) or 0.0 for w in workloads]
            xs = [j + (i - (len(cases) - 1) / 2) * width for j in range(len(workloads))]
            ax.bar(xs, ys, width, label=case, color=colors[i % len(colors)])
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.set_title(full_title, fontsize=9)
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sampling(record: dict[str, Any], out: Path) -> Path:
    """Fig. 8 view: sampling-round time of every case relative to interleaved + uniform."""
    return _grouped_bars(
        record,
        "time_vs_interleaved_uniform",
        "MADDPG sampling round (N trainers x B=1024), time / interleaved+uniform",
        "time / interleaved+uniform (lower is better, log)",
        out / "sampling.png",
        log=True,
    )


def plot_layout(record: dict[str, Any], out: Path) -> Path:
    """Fig. 14 view: joint-batch gather speed-up over per-agent NumPy arrays."""
    return _grouped_bars(
        record,
        "speedup_vs_numpy_per_agent",
        "One trainer's joint batch: speed-up over per-agent NumPy arrays",
        "speed-up (higher is better)",
        out / "layout.png",
        cases=["agent_major", "interleaved", "interleaved+split"],
    )


def plot_peers(record: dict[str, Any], out: Path) -> Path:
    """Peers on the MADDPG pattern, time relative to marlbuf interleaved + uniform."""
    return _grouped_bars(
        record,
        "time_vs_marlbuf_uniform",
        "Sampling round vs peers, time / marlbuf interleaved+uniform",
        "relative time (lower is better, log)",
        out / "peers.png",
        log=True,
    )


def _stacked_phases(
    record: dict[str, Any],
    configs: list[str],
    phases: list[tuple[str, str]],
    title: str,
    path: Path,
) -> Path:
    """Per workload, one stacked bar per configuration: seconds per phase (plus "other": the
    total's remainder), normalised to the first configuration's total (Figs. 2, 3, 9 views)."""
    plt = _plt()
    rows = record["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    configs = [c for c in configs if any(r["config"] == c for r in rows)]
    width = 0.8 / len(configs)
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(max(7.0, 1.5 * len(workloads) + 2), 5))
    for j, workload in enumerate(workloads):
        by_config = {r["config"]: r for r in rows if r["workload"] == workload}
        norm = by_config[configs[0]]["total_s"]
        for i, config in enumerate(configs):
            row = by_config.get(config)
            if row is None:
                continue
            x = j + (i - (len(configs) - 1) / 2) * width
            bottom = 0.0
            parts = [(label, row.get(key, 0.0)) for key, label in phases]
            parts.append(("other", max(0.0, row["total_s"] - sum(v for _, v in parts))))
            for k, (label, seconds) in enumerate(parts):
                value = seconds / norm
                ax.bar(
                    x,
                    value,
                    width,
                    bottom=bottom,
                    color=colors[k % 10],
                    label=label if (i == 0 and j == 0) else None,
                )
                bottom += value
            ax.text(x, bottom, config, rotation=90, fontsize=6, ha="center", va="bottom")
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads)
    ax.set_ylabel(f"time / {configs[0]} total")
    ax.set_title(title + (" (quick sizes)" if record.get("quick") else ""), fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_end_to_end(record: dict[str, Any], out: Path) -> Path:
    """Fig. 9 view: time per 100 env steps by phase, relative to the faithful baseline."""
    phases = [
        ("action_selection_s", "action selection"),
        ("env_step_s", "env step"),
        ("buffer_add_s", "buffer add"),
        ("update_all_trainers_s", "update all trainers"),
    ]
    return _stacked_phases(
        record,
        ["faithful", "baseline", "marlbuf"],
        phases,
        "Time per 100 env steps by phase (faithful = per-agent loop, per-agent arrays, mpe2 env)",
        out / "end_to_end.png",
    )


def plot_update(record: dict[str, Any], out: Path) -> Path:
    """One update round by phase, relative to the per-agent-loop baseline."""
    phases = [
        ("sampling_s", "sampling"),
        ("target_q_s", "target Q"),
        ("q_p_loss_s", "Q and P loss"),
        ("priority_update_s", "priority update"),
    ]
    return _stacked_phases(
        record,
        ["baseline", "marlbuf", "marlbuf_shared_index"],
        phases,
        "One update round (every trainer once) by phase, B = 1024",
        out / "update.png",
    )


def plot_rewards(record: dict[str, Any], out: Path) -> Path:
    """Figs. 10-11 view: reward curves per sampler (see :func:`marlbuf.bench.rewards.plot`)."""
    from marlbuf.bench.rewards import plot

    return plot(record, out)


def plot_locality(record: dict[str, Any], out: Path) -> Path:
    """Run-length frontier: time ratio vs return difference (see locality.plot)."""
    from marlbuf.bench.locality import plot

    return plot(record, out)


def plot_recurrent(record: dict[str, Any], out_dir: Path) -> Path:
    from marlbuf.bench.recurrent import plot

    return plot(record, out_dir)


PLOTTERS: dict[str, Callable[[dict[str, Any], Path], Path]] = {
    "sampling": plot_sampling,
    "layout": plot_layout,
    "peers": plot_peers,
    "update": plot_update,
    "end_to_end": plot_end_to_end,
    "rewards": plot_rewards,
    "locality": plot_locality,
    "recurrent": plot_recurrent,
}


def make_all(
    results_dir: Path = RESULTS_DIR, out_dir: Path | None = None, quick: bool | None = None
) -> list[Path]:
    """Draw every figure whose results exist; returns the PNG paths."""
    folder = "figures-quick" if quick else "figures"  # quick runs never overwrite full figures
    out = Path(out_dir) if out_dir is not None else Path(results_dir) / folder
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for suite, plot in PLOTTERS.items():
        record = load(Path(results_dir), suite, quick)
        if record is not None and record.get("rows"):
            paths.append(plot(record, out))
    return paths
