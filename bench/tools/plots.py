"""PNG figures from ``bench/results/*.json`` in the style of the paper's figures.

``make_all(results_dir)`` draws every figure whose result file exists and returns the paths.
matplotlib is imported lazily (the ``[bench]`` extra) and uses the non-interactive Agg backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marlbuf.bench.tools.common import RESULTS_DIR


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'marlbuf[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` with every artist inside the image (titles, legends and labels
    outside the axes included: the canvas grows to hold them) and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def wrapped(text: str, width_inches: float, fontsize: float = 10.0) -> str:
    """``text`` broken into lines that fit ``width_inches`` at ``fontsize`` points (an average
    glyph is about half as wide as it is high), so that a title never runs off its figure."""
    import textwrap

    chars = max(20, int(width_inches * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars))


def plain_numbers() -> Any:
    """A tick formatter that writes a log axis's ticks as numbers (1, 10, 0.1), not powers."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value:g}")


def seeds(count: int) -> str:
    """``1`` -> "1 seed", ``3`` -> "3 seeds"."""
    return f"{count} seed" + ("" if count == 1 else "s")


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
    plain: bool = False,
) -> Path:
    """One group of bars per workload, one bar (and one colour) per case (a row field
    ``value``); with more than :data:`GROUPED_MAX_CASES` cases, one panel per workload with a
    labelled horizontal bar per case instead, so that no two cases share a colour. ``plain``:
    cases named in plain words (:func:`marlbuf.bench.tools.report.plain_case`)."""
    from marlbuf.bench.tools.report import plain_case

    plt = _plt()
    name = plain_case if plain else str
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
                ax.xaxis.set_major_formatter(plain_numbers())
            ax.grid(axis="x", alpha=0.3)
            ax.tick_params(labelsize=7)
        axes[0][0].set_yticks(positions)
        axes[0][0].set_yticklabels([name(c) for c in cases], fontsize=7)
        fig.suptitle(wrapped(full_title, fig.get_figwidth(), 9), fontsize=9)
    else:
        colors = plt.get_cmap("tab10").colors
        width = 0.8 / len(cases)
        fig, ax = plt.subplots(figsize=(max(7.0, 1.4 * len(workloads) + 2), 5))
        for i, case in enumerate(cases):
            ys = [value_of(w, case) or 0.0 for w in workloads]
            xs = [j + (i - (len(cases) - 1) / 2) * width for j in range(len(workloads))]
            ax.bar(xs, ys, width, label=name(case), color=colors[i % len(colors)])
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain_numbers())
        ax.set_title(wrapped(full_title, fig.get_figwidth(), 9), fontsize=9)
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


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
        plain=True,
    )


def plot_peers(record: dict[str, Any], out: Path) -> Path:
    """Peers on the MADDPG pattern, time relative to marlbuf interleaved + uniform."""
    return _grouped_bars(
        record,
        "time_vs_marlbuf_uniform",
        "MADDPG sampling round against peers, time / marlbuf with its defaults",
        "relative time (lower is better, log)",
        out / "peers.png",
        log=True,
        plain=True,
    )


def _stacked_phases(
    record: dict[str, Any],
    configs: list[str],
    phases: list[tuple[str, str]],
    title: str,
    path: Path,
) -> Path:
    """Per workload, one stacked bar per configuration: seconds per phase (plus "other": the
    total's remainder), normalised to the first configuration's total (Figs. 2, 3, 9 views).
    Each bar is named by a tick label beneath it, the workloads on a second row below."""
    plt = _plt()
    rows = record["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    configs = [c for c in configs if any(r["config"] == c for r in rows)]
    width = 0.8 / len(configs)
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(max(7.0, 0.75 * len(workloads) * len(configs) + 2), 5))
    ticks: list[float] = []
    tick_labels: list[str] = []
    for j, workload in enumerate(workloads):
        by_config = {r["config"]: r for r in rows if r["workload"] == workload}
        norm = by_config[configs[0]]["total_s"]
        for i, config in enumerate(configs):
            row = by_config.get(config)
            if row is None:
                continue
            x = j + (i - (len(configs) - 1) / 2) * width
            ticks.append(x)
            tick_labels.append(config.replace("_", " "))
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
    ax.set_xticks(ticks)
    ax.set_xticklabels(tick_labels, fontsize=7, rotation=30, ha="right")
    groups = ax.secondary_xaxis("bottom")  # the workloads, one row below the bar names
    groups.set_xticks(range(len(workloads)))
    groups.set_xticklabels(workloads, fontsize=9)
    groups.tick_params(length=0, pad=44)
    groups.spines["bottom"].set_visible(False)
    ax.set_ylabel(f"time / {configs[0]} total")
    full_title = title + (" (quick sizes)" if record.get("quick") else "")
    ax.set_title(wrapped(full_title, fig.get_figwidth(), 9), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


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
        "One update round (every trainer once) by phase, B = "
        f"{(record.get('config') or {}).get('batch_size', 1024)}",
        out / "update.png",
    )


def plot_rewards(record: dict[str, Any], out: Path) -> Path:
    """Figs. 10-11 view: reward curves per sampler (see
    :func:`marlbuf.bench.suites.rewards.plot`)."""
    from marlbuf.bench.suites.rewards import plot

    return plot(record, out)


def plot_locality(record: dict[str, Any], out: Path) -> Path:
    """Run-length frontier: time ratio vs return difference (see locality.plot)."""
    from marlbuf.bench.suites.locality import plot

    return plot(record, out)


def plot_recurrent(record: dict[str, Any], out_dir: Path) -> Path:
    from marlbuf.bench.suites.recurrent import plot

    return plot(record, out_dir)


def plot_headline(data: dict[str, Any], out: Path, quick: bool) -> Path | None:
    """The report's headline as a figure: how many times faster marlbuf's default buffer
    samples the MADDPG round than each baseline, per workload (log scale, the value on every
    bar), and the memory of the stored transitions per format. ``data`` is
    :func:`marlbuf.bench.tools.report.headline_data`; ``None`` when it holds neither part."""
    from marlbuf.bench.tools.report import plain_workload

    rounds: dict[str, dict[str, float]] = data.get("round") or {}
    memory: dict[str, dict[str, float]] = data.get("memory") or {}
    if not rounds and not memory:
        return None
    plt = _plt()
    panels = [p for p in ("round", "memory") if (rounds if p == "round" else memory)]
    most = max(len({w for per in rounds.values() for w in per}), len(memory))
    plain = most <= 3  # workloads named in words where they fit, else by their short labels
    panel_width = max(6.4, 1.3 * most + 2.0)
    # side by side where the workloads are few, else one above the other
    shape = (1, len(panels)) if plain else (len(panels), 1)
    size = (panel_width * shape[1], 4.6 * shape[0] + (0.6 if shape[0] > 1 else 0.0))
    fig, grid = plt.subplots(*shape, figsize=size, squeeze=False)
    axes = [[ax for row in grid for ax in row]]
    colors = plt.get_cmap("tab10").colors
    for ax, panel in zip(axes[0], panels):
        if panel == "round":
            workloads = list(dict.fromkeys(w for per in rounds.values() for w in per))
            width = 0.8 / len(rounds)
            for i, (baseline, per) in enumerate(rounds.items()):
                xs = [j + (i - (len(rounds) - 1) / 2) * width for j in range(len(workloads))]
                ys = [per.get(w, float("nan")) for w in workloads]
                bars = ax.bar(xs, ys, width, label=baseline, color=colors[i % 10])
                ax.bar_label(bars, labels=[f"{y:.3g}×" for y in ys], fontsize=7, padding=1)
            ax.axhline(1.0, color="0.3", lw=0.8)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain_numbers())
            ax.set_ylabel("× faster (log scale; above 1: marlbuf is faster)")
            ax.set_title("MADDPG sampling round: marlbuf's defaults × faster than", fontsize=10)
        else:
            workloads = list(memory)
            formats = [
                ("once", "marlbuf default (obs stored once)"),
                ("once+float16", "with float16 observations"),
                ("dense", "next_obs in every row (per-agent arrays, cpprb, TorchRL)"),
            ]
            width = 0.8 / len(formats)
            for i, (key, label) in enumerate(formats):
                xs = [j + (i - (len(formats) - 1) / 2) * width for j in range(len(workloads))]
                ys = [memory[w].get(key, float("nan")) for w in workloads]
                bars = ax.bar(xs, ys, width, label=label, color=colors[(i + 4) % 10])
                ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7, padding=1)
            capacity = next(iter(memory.values())).get("capacity")
            at = f"{capacity:,.0f}" if isinstance(capacity, (int, float)) else "the"
            values = [v for entry in memory.values() for k, v in entry.items() if k != "capacity"]
            spread = max(values) / max(min(values), 1e-9) if values else 1.0
            if spread > 30:  # a few small and a few large workloads: all readable on a log axis
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(plain_numbers())
            ax.set_ylabel(f"GiB for {at} transitions" + (" (log scale)" if spread > 30 else ""))
            ax.set_title("Memory", fontsize=10)
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(
            [wrapped(plain_workload(w), 2.4, 8) if plain else w for w in workloads], fontsize=8
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    title = "marlbuf against the buffer you would otherwise use" + (
        " (quick sizes: indicative)" if quick else ""
    )
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save(fig, Path(out) / "headline.png")


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
    from marlbuf.bench.tools.report import headline_data

    paths = []
    if quick is not None:  # the headline reads one kind of result files
        headline = plot_headline(headline_data(Path(results_dir), quick), out, quick)
        if headline is not None:
            paths.append(headline)
    for suite, plot in PLOTTERS.items():
        record = load(Path(results_dir), suite, quick)
        if record is not None and record.get("rows"):
            paths.append(plot(record, out))
    return paths
