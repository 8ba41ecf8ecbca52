"""Shared benchmark machinery: interleaved repeats, medians, ratios, result files.

Every suite module in ``bench/`` exposes ``SUITE`` (its name) and
``run(quick: bool = False) -> dict`` returning a JSON-safe payload with at least ``"rows"`` (a
list of flat dicts, one per measured case) and ``"summary"`` (headline numbers). The CLI adds
machine info and writes ``bench/results/<suite>[-quick].json``.

Method: all cases of one comparison are timed in the same process, repeats
interleaved (case A, B, C, A, B, C, ...) so that machine noise hits every case alike; JIT
warm-up runs before timing; we report the median and min/max and ratios to a baseline measured
in the same run.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def quiet_threads() -> dict[str, str]:
    """Settings that keep idle thread pools from busy-waiting on small machines.

    On a 2-core machine an idle OpenMP/TBB pool spinning after a parallel region slows every
    following call by 10-25 ms, so benchmarks run torch with one thread and OpenMP with a
    passive wait policy. Returns what was set.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    settings = {"OMP_WAIT_POLICY": os.environ["OMP_WAIT_POLICY"]}
    try:
        import torch

        torch.set_num_threads(1)
        settings["torch_threads"] = "1"
    except ImportError:
        pass
    return settings


def paired_ratio(case: Mapping[str, Any], base: Mapping[str, Any]) -> float:
    """Median over the timed rounds of ``case``'s time over ``base``'s in the same round (two
    entries of :func:`time_interleaved` output timed with ``keep_samples=True``)."""
    return float(np.median(np.divide(case["samples"], base["samples"])))


def time_interleaved(
    cases: Mapping[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    inner: int = 1,
    rotate: bool = False,
    keep_samples: bool = False,
) -> dict[str, dict[str, Any]]:
    """Time each case ``repeats`` times, interleaving the cases; seconds per call.

    Parameters
    ----------
    cases : mapping of name to zero-argument callable
    repeats : int
        Timed rounds; each round calls every case ``inner`` times, in order.
    warmup : int
        Untimed rounds first (JIT compilation, page faults of fresh arrays).
    inner : int
        Calls per timed sample (for very short operations).
    rotate : bool
        Start each timed round one case later (A B C, B C A, C A B, ...) so that no case always
        runs first or right after the same neighbour.
    keep_samples : bool
        Also return every timed sample, in round order (``"samples"``), e.g. for ratios
        paired within a round.

    Returns
    -------
    dict
        ``{name: {"median": s, "min": s, "max": s, "n": repeats, "first_call": s}}`` —
        ``first_call`` is the first warm-up call, which includes JIT compilation (or loading the
        on-disk Numba cache) and first-touch page faults; it is reported, never timed in. With
        ``keep_samples`` each entry also has ``"samples"`` (list of seconds, one per round).
    """
    first_call: dict[str, float] = {}
    for round_ in range(warmup):
        for name, fn in cases.items():
            if round_ == 0:  # the first call pays JIT compilation (or cache loading) and faults
                first_call[name] = time_once(fn)
            else:
                fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        names = list(cases)
        for round_ in range(repeats):
            shift = round_ % len(names) if (rotate and names) else 0
            for name in names[shift:] + names[:shift]:
                fn = cases[name]
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples[name].append((time.perf_counter() - start) / inner)
    finally:
        if gc_was_enabled:
            gc.enable()
    out: dict[str, dict[str, Any]] = {}
    for name, s in samples.items():
        out[name] = {
            "median": float(np.median(s)),
            "min": float(np.min(s)),
            "max": float(np.max(s)),
            "n": len(s),
            "first_call": first_call.get(name, float("nan")),
        }
        if keep_samples:
            out[name]["samples"] = [float(x) for x in s]
    return out


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call (used to report JIT compile time separately)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def copy_bandwidth(nbytes: int = 256 * 1024**2, repeats: int = 5) -> float:
    """This machine's memory copy bandwidth in bytes/s (best of ``repeats`` large copies).

    A copy reads and writes ``nbytes`` each; the figure counts the bytes copied once, which is
    the unit a gather floor is computed in (bytes gathered / bandwidth).
    """
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    best = min(time_once(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return nbytes / best


def result_path(suite: str, quick: bool, out_dir: Path | None = None) -> Path:
    """Where a suite's JSON goes: ``bench/results/<suite>[-quick].json``."""
    out = RESULTS_DIR if out_dir is None else Path(out_dir)
    return out / f"{suite}{'-quick' if quick else ''}.json"


#: This process's copy bandwidth in GB/s, measured once (by the first result written).
_BANDWIDTH_GBPS: list[float] = []


def run_conditions(payload: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a result depends on beyond the code and the CPU: the machine's copy bandwidth
    (GB/s; a suite's own measurement where its configuration has one, else measured once per
    process), its load average over 1, 5 and 15 minutes when the result is written (the suite
    itself counts about 1 on an idle machine), and the marlbuf version. ``marlbuf bench
    compare`` warns when two runs differ in them."""
    from marlbuf.version import __version__

    config = (payload or {}).get("config")
    own = config.get("copy_bandwidth_GBps") if isinstance(config, Mapping) else None
    if own is None and not _BANDWIDTH_GBPS:
        _BANDWIDTH_GBPS.append(copy_bandwidth() / 1e9)
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - a platform without load averages
        load = None
    return {
        "copy_bandwidth_GBps": float(own) if own is not None else _BANDWIDTH_GBPS[0],
        "load_average_1_5_15_min": load,
        "marlbuf": __version__,
    }


def write_result(
    suite: str, payload: Mapping[str, Any], quick: bool, out_dir: Path | None = None
) -> Path:
    """Write ``payload`` with machine info (:func:`marlbuf.profiling.info.machine_info` and
    :func:`run_conditions`) and a timestamp; returns the path."""
    from marlbuf.profiling.info import machine_info

    path = result_path(suite, quick, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "suite": suite,
        "quick": quick,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**machine_info(), **run_conditions(payload)},
        **payload,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=_json_default) + "\n")
    os.replace(tmp, path)
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub-markdown table of ``rows`` restricted to ``columns``: numbers with three
    significant figures (:func:`marlbuf.bench.tools.report.number`), units in the headers."""
    from marlbuf.bench.tools.report import header_with_unit, number

    header = [header_with_unit(c).strip() for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(number(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def per_workload(
    rows: Sequence[Mapping[str, Any]], column: str, skip: Sequence[str] = ()
) -> dict[str, dict[str, float]]:
    """``{workload: {case: rows' column}}`` for summaries (cases in ``skip`` left out)."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["case"] not in skip:
            out.setdefault(row["workload"], {})[row["case"]] = round(float(row[column]), 3)
    return out


def check(
    name: str, ratio: float, limit: float, at_most: bool = True, **ident: Any
) -> dict[str, Any]:
    """One same-run check: ``ratio`` against ``limit`` (``at_most``: the ratio must not exceed
    it; else it must reach it). A ratio that is not finite (a case that did not run) is
    ``SKIP``. ``ident`` (workload, kind, a note, ...) is kept in the returned row."""
    finite = bool(np.isfinite(ratio))
    passed = ratio <= limit if at_most else ratio >= limit
    return {
        "check": name,
        **ident,
        "ratio": float(ratio),
        "limit": float(limit),
        "bound": "at most" if at_most else "at least",
        "status": "SKIP" if not finite else ("PASS" if passed else "FAIL"),
    }


def checks_markdown(checks: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of :func:`check` rows: check, where, ratio, limit and PASS/FAIL."""
    rows = [
        {
            **c,
            "where": " ".join(str(c[k]) for k in ("workload", "kind") if c.get(k)),
            "ratio": f"{c['ratio']:.3g}" if c["status"] != "SKIP" else "—",
            "limit": f"{'≤' if c['bound'] == 'at most' else '≥'} {c['limit']:g}",
            "result": c["status"],
            "note": c.get("note", ""),
        }
        for c in checks
    ]
    return markdown_table(rows, ["check", "where", "ratio", "limit", "result", "note"])
