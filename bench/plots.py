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


def _grouped_bars(
    record: dict[str, Any],
    value: str,
    title: str,
    ylabel: str,
    path: Path,
    cases: list[str] | None = None,
    log: bool = False,
) -> Path:
    """One group of bars per workload, one bar per case (a row field ``value``)."""
    plt = _plt()
    rows = record["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    cases = cases or list(dict.fromkeys(r["case"] for r in rows))
    width = 0.8 / len(cases)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.4 * len(workloads) + 2), 5))
    for i, case in enumerate(cases):
        ys = [
            next((r[value] for r in rows if r["workload"] == w and r["case"] == case), 0.0)
            for w in workloads
        ]
        xs = [j + (i - (len(cases) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(xs, ys, width, label=case)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title + (" (quick sizes)" if record.get("quick") else ""), fontsize=9)
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
        "relative time (lower is better, log)",
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


PLOTTERS: dict[str, Callable[[dict[str, Any], Path], Path]] = {
    "sampling": plot_sampling,
    "layout": plot_layout,
    "peers": plot_peers,
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
