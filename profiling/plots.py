"""PNG plots of a ``marlbuf profile`` sweep (needs the ``[bench]`` extra: matplotlib).

* :func:`plot_phase_breakdown` -- share of each phase in the profiled time per agent count,
  stacked (the paper's Figs. 2 and 3), one panel per layout and sampler.
* :func:`plot_sampling_counters` -- the sampling phase's counters per update round, grouped by
  agent count, one bar per layout and sampler (the paper's Fig. 4), each panel titled with the
  metric's source (hardware / simulated / time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Sampling-phase metrics put in the summary and plotted, in this order, where a run has
#: them.
HEADLINE_METRICS = (
    "LLC-read-misses",
    "dTLB-read-misses",
    "instructions",
    "LL_misses",
    "D1_misses",
    "Ir",
    "model_LL_misses",
    "model_dTLB_misses_4k",
    "model_dTLB_misses_2m",
    "wall_s",
)


#: Leaf phases in loop order; ``update_all_trainers`` (other) is what its children leave over.
STACK_ORDER = (
    "action_selection",
    "env_step",
    "buffer_add",
    "sampling",
    "target_q",
    "q_p_loss",
    "priority_update",
    "update_all_trainers",
)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError(
            "plots need matplotlib: pip install 'marlbuf[bench]' (or pass --no-plots)"
        ) from exc
    return plt


def _exclusive(report: dict[str, Any], metric: str) -> dict[str, float]:
    """Exclusive figure per phase name (summed over paths), without <outside>."""
    out: dict[str, float] = {}
    for row in report["phases"]:
        if row["path"] == "<outside>":
            continue
        out[row["name"]] = out.get(row["name"], 0.0) + float(row["exclusive"].get(metric) or 0.0)
    return out


def plot_phase_breakdown(
    result: dict[str, Any], path: str | Path, metric: str | None = None
) -> Path:
    """Stacked share of ``metric`` per phase, per agent count; one panel per layout/sampler.

    ``metric`` defaults to wall time, or to simulated instructions (``Ir``) under callgrind,
    where time is inflated unevenly by the instrumentation."""
    plt = _pyplot()
    runs = result["runs"]
    if metric is None:
        first = runs[0]["report"]["metrics"] if runs else {}
        metric = "Ir" if "Ir" in first else "wall_s"
    groups = sorted({(r["layout"], r["sampler"]) for r in runs})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4), squeeze=False)
    source = runs[0]["report"]["metrics"].get(metric, {}).get("source", "?") if runs else "?"
    for ax, (layout, sampler) in zip(axes[0], groups):
        selected = sorted(
            (r for r in runs if (r["layout"], r["sampler"]) == (layout, sampler)),
            key=lambda r: r["n_agents"],
        )
        labels = [str(r["n_agents"]) for r in selected]
        shares = []
        for r in selected:
            excl = _exclusive(r["report"], metric)
            total = sum(excl.values()) or 1.0
            shares.append({k: 100.0 * v / total for k, v in excl.items()})
        bottom = [0.0] * len(selected)
        names = [p for p in STACK_ORDER if any(p in s for s in shares)]
        names += sorted({k for s in shares for k in s} - set(names))
        for name in names:
            heights = [s.get(name, 0.0) for s in shares]
            shown = "update (other)" if name == "update_all_trainers" else name
            ax.bar(labels, heights, bottom=bottom, label=shown)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title(f"{layout} / {sampler}")
        ax.set_xlabel("agents")
        ax.set_ylim(0, 100)
    axes[0][0].set_ylabel(f"% of profiled {metric} [{source}]")
    handles, names_ = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, names_, loc="lower center", ncol=len(names_), fontsize="small")
    fig.suptitle(f"Phase breakdown ({result['config']['workload']} workload)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    target = Path(path)
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def plot_sampling_counters(
    result: dict[str, Any], path: str | Path, metrics: list[str] | None = None
) -> Path:
    """The sampling phase's figures per update round: grouped bars per agent count, one bar per
    layout/sampler, one panel per metric (titled with its source)."""
    plt = _pyplot()
    runs = result["runs"]
    available = runs[0]["report"]["metrics"] if runs else {}
    if metrics is None:
        metrics = [m for m in HEADLINE_METRICS if m in available][:6]
        if any(available[m]["source"] in ("hardware", "simulated") for m in metrics):
            # under valgrind, time is inflated and meaningless; next to PMU counts it is noise
            metrics = [m for m in metrics if available[m]["source"] != "time"]
    agents = sorted({r["n_agents"] for r in runs})
    groups = sorted({(r["layout"], r["sampler"]) for r in runs})
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 4 * nrows), squeeze=False)
    for ax in axes.ravel()[len(metrics) :]:
        ax.set_visible(False)
    width = 0.8 / max(1, len(groups))
    for ax, metric in zip(axes.ravel(), metrics):
        for g, (layout, sampler) in enumerate(groups):
            heights = []
            for n in agents:
                run = next(
                    (
                        r
                        for r in runs
                        if (r["layout"], r["sampler"], r["n_agents"]) == (layout, sampler, n)
                    ),
                    None,
                )
                value = 0.0
                if run is not None:
                    excl = {
                        row["name"]: row["inclusive"].get(metric)
                        for row in run["report"]["phases"]
                        if row["path"] != "<outside>"
                    }
                    value = float(excl.get("sampling") or 0.0) / run["updates"]
                heights.append(value)
            xs = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(agents))]
            ax.bar(xs, heights, width=width, label=f"{layout}/{sampler}")
        ax.set_xticks(range(len(agents)), [str(n) for n in agents])
        ax.set_xlabel("agents")
        ax.set_title(f"sampling: {metric} [{available[metric]['source']}]", fontsize="medium")
        ax.set_ylabel(f"per update round ({available[metric]['unit']})")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target
