"""Per-phase profiler: ``with prof.phase("sampling"): ...`` -> time and counters per phase.

How figures are attributed: every phase entry and exit is a *boundary*. At a boundary the
backend's cumulative counters are read (or, under callgrind, the costs since the last boundary
are dumped to a file tagged with the phase), and what happened since the previous boundary is
charged to the innermost phase open during it. That gives each phase's *exclusive* figures;
*inclusive* figures add the phase's descendants. Code outside any phase is charged to
``<outside>``.

Overhead correction: every charged segment also contains the profiler's own boundary code (the
end of one boundary and the start of the next). A *null phase* (enter and exit with nothing
inside) is exactly one such segment; it is measured when the profiler starts (median of
``null_repeats``) and subtracted once per segment. A phase entered ``c`` times with ``k`` child
entries has ``c + k`` segments.

Sources (every metric carries one, and nothing is reported under a hardware counter's name
unless a hardware counter produced it):

* ``time`` -- wall clock (``perf_counter``) and the thread's CPU time;
* ``software`` -- kernel software events (task-clock, page-faults) via ``perf_event_open``;
* ``hardware`` -- the PMU counter group (instructions, cycles, cache-misses, LLC and dTLB read
  misses), scaled and flagged when the kernel multiplexed it;
* ``simulated`` -- callgrind's cache simulation (Ir, D1/LL misses...), which models no
  prefetcher and no TLB;
* ``modelled`` -- figures from a trace-driven model (see :mod:`marlbuf.profiling.cachemodel`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlbuf.profiling import callgrind
from marlbuf.profiling.perf_events import (
    HARDWARE_EVENTS,
    SOFTWARE_EVENTS,
    CounterGroup,
    PerfEventError,
)

BACKENDS = ("auto", "hardware", "callgrind", "time")
OUTSIDE = "<outside>"
NULL_PHASE = "<null>"
REPORT_SCHEMA = "marlbuf-profile/1"

#: Null phases measured at start, per backend (callgrind dumps cost ~0.1 s each under valgrind).
DEFAULT_NULL_REPEATS = {"time": 200, "hardware": 200, "callgrind": 8}


_NULL_CONTEXT = nullcontext()


class NullProfiler:
    """A stand-in with the profiler's ``phase`` hook that measures nothing (a shared no-op
    context manager): for warm-up rounds and unprofiled runs."""

    def phase(self, name: str) -> AbstractContextManager[None]:
        return _NULL_CONTEXT


@dataclass(frozen=True)
class Metric:
    """One reported quantity: its source label, unit and meaning."""

    source: str  # "time" | "software" | "hardware" | "simulated" | "modelled"
    unit: str
    description: str


TIME_METRICS = {
    "wall_s": Metric("time", "s", "wall-clock time (time.perf_counter)"),
    "cpu_s": Metric("time", "s", "CPU time of the profiled thread (time.thread_time)"),
}
SOFTWARE_METRICS = {
    "task-clock": Metric("software", "ns", "kernel task-clock of the profiled thread"),
    "page-faults": Metric("software", "count", "page faults of the profiled thread"),
}
HARDWARE_METRICS = {
    "instructions": Metric("hardware", "count", "retired instructions (user space)"),
    "cycles": Metric("hardware", "count", "core cycles (user space)"),
    "cache-misses": Metric("hardware", "count", "generic cache-misses event (usually LLC)"),
    "LLC-read-misses": Metric("hardware", "count", "last-level cache read misses"),
    "dTLB-read-misses": Metric("hardware", "count", "data TLB read misses"),
}
SIMULATED_METRICS = {
    "Ir": Metric("simulated", "count", "instructions executed (callgrind)"),
    "Dr": Metric("simulated", "count", "data reads"),
    "Dw": Metric("simulated", "count", "data writes"),
    "I1mr": Metric("simulated", "count", "L1 instruction-fetch misses"),
    "D1mr": Metric("simulated", "count", "L1 data read misses"),
    "D1mw": Metric("simulated", "count", "L1 data write misses"),
    "ILmr": Metric("simulated", "count", "last-level instruction-fetch misses"),
    "DLmr": Metric("simulated", "count", "last-level data read misses"),
    "DLmw": Metric("simulated", "count", "last-level data write misses"),
    "D1_misses": Metric("simulated", "count", "L1 data misses (D1mr + D1mw)"),
    "LL_misses": Metric("simulated", "count", "last-level misses (ILmr + DLmr + DLmw)"),
}


def _thread_settings() -> dict[str, Any]:
    """The thread settings that decide what the counters saw (reported with every profile)."""
    settings: dict[str, Any] = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)")}
    try:
        import numba

        settings["numba_num_threads"] = int(numba.get_num_threads())
        settings["numba_threading_layer"] = str(getattr(numba.config, "THREADING_LAYER", "?"))
    except Exception:  # pragma: no cover - numba is a core dependency
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        settings["torch_threads"] = int(torch.get_num_threads())
    return settings


@dataclass
class _Segments:
    """Accumulated exclusive figures of one phase path."""

    calls: int = 0
    segments: int = 0
    multiplexed_segments: int = 0
    values: dict[str, float] = field(default_factory=dict)

    def add(self, delta: Mapping[str, float]) -> None:
        for key, value in delta.items():
            self.values[key] = self.values.get(key, 0.0) + value


class Profiler:
    """Time and counters per named phase of a training loop.

    Parameters
    ----------
    backend : {"auto", "hardware", "callgrind", "time"}
        ``"auto"`` picks callgrind when the process runs under ``valgrind --tool=callgrind``,
        else the hardware counters when they open, else time plus software events.
        Naming a backend that is not available raises (with the reason).
    null_repeats : int, optional
        Null phases measured at start for the overhead correction (0 disables it).
    software_events : bool, default True
        Also read task-clock and page-faults (``perf_event_open`` software events) when they open.

    Examples
    --------
    >>> from marlbuf.profiling import Profiler
    >>> prof = Profiler(backend="time", null_repeats=20)
    >>> with prof.phase("update_all_trainers"):
    ...     with prof.phase("sampling"):
    ...         total = sum(range(1000))
    >>> rep = prof.report()
    >>> [p["path"] for p in rep["phases"]]
    ['update_all_trainers', 'update_all_trainers/sampling']
    """

    #: The PMU events read as one group by the hardware backend.
    hardware_events: tuple[str, ...] = HARDWARE_EVENTS

    def __init__(
        self,
        backend: str = "auto",
        null_repeats: int | None = None,
        software_events: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got backend={backend!r}")
        if null_repeats is not None and (
            isinstance(null_repeats, bool) or not isinstance(null_repeats, int) or null_repeats < 0
        ):
            raise ValueError(f"null_repeats must be an int >= 0; got null_repeats={null_repeats!r}")
        self.notes: list[str] = []
        self._hardware: CounterGroup | None = None
        self._software: CounterGroup | None = None
        self.backend = self._choose_backend(backend)
        self.metrics: dict[str, Metric] = dict(TIME_METRICS)
        if software_events and self.backend != "callgrind":
            try:
                self._software = CounterGroup(list(SOFTWARE_EVENTS))
                self._software.reset()
                self._software.enable()
                self.metrics.update(SOFTWARE_METRICS)
            except PerfEventError as exc:
                self.notes.append(f"software events unavailable: {exc.strerror or exc}")
        if self.backend == "hardware":
            assert self._hardware is not None
            self._hardware.reset()
            self._hardware.enable()
            self.metrics.update(
                {
                    name: HARDWARE_METRICS.get(name, Metric("hardware", "count", name))
                    for name in self._hardware.events
                }
            )
            self.notes.append(
                "hardware and software counters count the calling thread only (no inherit); "
                "work on other threads (Numba parallel, torch intra-op) is not counted"
            )
        if self.backend == "callgrind":
            self._callgrind_setup()
        self._finished = False
        self._stack: list[str] = []
        self._phases: dict[str, _Segments] = {}
        self._order: list[str] = []
        self._last = self._read()
        self._null_values: dict[str, float] = {}
        repeats = DEFAULT_NULL_REPEATS[self.backend] if null_repeats is None else null_repeats
        self._null_repeats = repeats
        if repeats:
            self._calibrate(repeats)

    # ------------------------------------------------------------------ backend selection
    def _choose_backend(self, backend: str) -> str:
        if backend in ("auto", "callgrind") and callgrind.under_callgrind():
            return "callgrind"
        if backend == "callgrind":
            raise RuntimeError(
                "backend='callgrind' needs the process to run under valgrind --tool=callgrind "
                "--cache-sim=yes (use 'marlbuf profile --backend callgrind', which relaunches "
                "itself under valgrind), or choose backend='time'"
            )
        if backend in ("auto", "hardware"):
            try:
                self._hardware = CounterGroup(list(self.hardware_events))
                return "hardware"
            except PerfEventError as exc:
                if backend == "hardware":
                    raise
                self.notes.append(
                    f"no hardware counters ({exc.strerror or exc}); using the time backend"
                )
        return "time"

    def _callgrind_setup(self) -> None:
        self.metrics.update(
            {k: v for k, v in SIMULATED_METRICS.items()}
            if callgrind.cache_sim_enabled()
            else {"Ir": SIMULATED_METRICS["Ir"]}
        )
        self._dump_prefix = callgrind.dump_file_prefix()
        self._dumps_seen = {p.name for p in callgrind.dump_files(self._dump_prefix)}
        self._label_prefix = f"marlbuf{os.getpid()}.{id(self):x}:"
        self._dump_cache: dict[str, tuple[str, dict[str, int]]] = {}
        self._simulated_caches: list[str] = []
        if not callgrind.cache_sim_enabled():
            self.notes.append("callgrind runs without --cache-sim=yes: only Ir is simulated")
        self.notes.append(
            "simulated figures come from callgrind's cache model (geometry in "
            "'simulated_caches'); it models no hardware prefetcher and no TLB, and sums all "
            "threads; time figures are inflated ~50-100x by valgrind"
        )
        callgrind.start_instrumentation()
        # costs collected before this profiler (or across a stop/start of the simulation) are
        # not ours: without zeroing, the first dump can even show wrapped-around counts
        callgrind.zero_stats()

    # ------------------------------------------------------------------ boundaries
    def _read(self) -> dict[str, float]:
        values = {"wall_s": time.perf_counter(), "cpu_s": time.thread_time()}
        if self._software is not None:
            values.update(self._software.read().values)
        if self._hardware is not None:
            reading = self._hardware.read()
            values.update(reading.values)
            values["_multiplexed"] = float(reading.multiplexed)
        return values

    def _boundary(self, path: str) -> dict[str, float]:
        """Charge everything since the previous boundary to ``path``; returns the delta."""
        if self.backend == "callgrind":
            callgrind.dump_stats_at(self._label_prefix + path)
        now = self._read()
        delta = {k: now[k] - self._last.get(k, 0.0) for k in now if not k.startswith("_")}
        self._last = now
        seg = self._phases.get(path)
        if seg is None:
            seg = self._phases[path] = _Segments()
            self._order.append(path)
        seg.segments += 1
        seg.multiplexed_segments += int(now.get("_multiplexed", 0.0))
        seg.add(delta)
        return delta

    def _current(self) -> str:
        return "/".join(self._stack) if self._stack else OUTSIDE

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Context manager: charge what runs inside to phase ``name`` (nested in the open one)."""
        if not isinstance(name, str) or not name or "/" in name or name.startswith("<"):
            raise ValueError(
                f"phase name must be a non-empty str without '/' and not starting with '<'; "
                f"got name={name!r}"
            )
        if self._finished:
            raise RuntimeError("this profiler has finished (report() or finish() was called)")
        self._boundary(self._current())
        self._stack.append(name)
        path = self._current()
        try:
            yield
        finally:
            self._boundary(path)
            self._phases[path].calls += 1
            self._stack.pop()

    def add_figures(
        self, path: str, values: Mapping[str, float], metrics: Mapping[str, Metric]
    ) -> None:
        """Add figures measured elsewhere (e.g. *modelled* misses) to phase ``path``'s exclusive
        figures. They get no overhead correction; ``metrics`` describes each new name (its
        source must not be ``hardware`` unless a hardware counter produced it)."""
        for name, metric in metrics.items():
            known = self.metrics.get(name)
            if known is not None and known != metric:
                raise ValueError(f"metric {name!r} is already defined as {known}")
            self.metrics[name] = metric
        missing = set(values) - set(self.metrics)
        if missing:
            raise ValueError(f"describe every metric in metrics=; missing {sorted(missing)}")
        seg = self._phases.get(path)
        if seg is None:
            seg = self._phases[path] = _Segments()
            self._order.append(path)
        seg.add(values)

    def _calibrate(self, repeats: int) -> None:
        self._boundary(OUTSIDE)
        samples: list[dict[str, float]] = []
        for _ in range(repeats):
            self._boundary(OUTSIDE)
            samples.append(self._boundary(NULL_PHASE))
        self._null_samples = samples
        if self.backend != "callgrind":
            self._null_values = _median_dict(samples)
        # under callgrind the simulated part of the null phase is read from its dumps later

    # ------------------------------------------------------------------ callgrind dumps
    def _dump_totals(self) -> dict[str, list[dict[str, float]]]:
        """Per phase path, the simulated costs of each of its dumps (in dump order)."""
        per_path: dict[str, list[dict[str, float]]] = {}
        for dump in callgrind.dump_files(self._dump_prefix):
            if dump.name in self._dumps_seen:
                continue
            if dump.name not in self._dump_cache:
                self._dump_cache[dump.name] = callgrind.read_dump_summary(dump)
            label, costs = self._dump_cache[dump.name]
            if not label.startswith(self._label_prefix):
                continue
            values: dict[str, float] = {k: float(v) for k, v in costs.items()}
            if "D1mr" in values:
                values["D1_misses"] = values["D1mr"] + values.get("D1mw", 0.0)
                values["LL_misses"] = values["ILmr"] + values["DLmr"] + values.get("DLmw", 0.0)
            per_path.setdefault(label[len(self._label_prefix) :], []).append(values)
            if not self._simulated_caches:
                self._simulated_caches = callgrind.read_dump_caches(dump)
        return per_path

    # ------------------------------------------------------------------ report
    def null_phase(self) -> dict[str, float]:
        """The calibrated cost of one null segment per metric (empty when not calibrated)."""
        null = dict(self._null_values)
        if self.backend == "callgrind" and self._null_repeats:
            dumps = self._dump_totals().get(NULL_PHASE, [])
            null.update(_median_dict(dumps))
            null.update(_median_dict(self._null_samples))
        return null

    def finish(self, stop_simulation: bool = True) -> None:
        """End profiling: charge the trailing segment, close the counters and, under callgrind,
        switch the simulation off (``stop_simulation``) so that what follows (parsing the dumps)
        runs ~4x faster. Idempotent; :meth:`report` calls it. Pass ``stop_simulation=False``
        when another profiler takes over in the same process."""
        if self._finished:
            return
        self._boundary(self._current())
        self._finished = True
        if self.backend == "callgrind" and stop_simulation:
            callgrind.stop_instrumentation()
        for group in (self._hardware, self._software):
            if group is not None:
                group.close()

    def report(self) -> dict[str, Any]:
        """Per phase: calls, segments, exclusive and inclusive figures (overhead-corrected, and
        raw), the null-phase cost, metric sources and the thread settings. JSON-safe.

        Ends profiling (calls :meth:`finish`): take the report once, at the end."""
        self.finish()
        exclusive_raw = {p: dict(s.values) for p, s in self._phases.items()}
        if self.backend == "callgrind":
            for path, dumps in self._dump_totals().items():
                if path in exclusive_raw:
                    for values in dumps:
                        for key, value in values.items():
                            exclusive_raw[path][key] = exclusive_raw[path].get(key, 0.0) + value
        null = self.null_phase()
        metrics = [m for m in self.metrics if any(m in v for v in exclusive_raw.values())]
        if not metrics:
            metrics = list(self.metrics)
        phase_paths = [p for p in self._order if p not in (NULL_PHASE,)]
        rows: list[dict[str, Any]] = []
        total_raw: dict[str, float] = dict.fromkeys(metrics, 0.0)
        total_overhead: dict[str, float] = dict.fromkeys(metrics, 0.0)
        corrected: dict[str, dict[str, float]] = {}
        for path in phase_paths:
            seg = self._phases[path]
            raw = exclusive_raw[path]
            corrected[path] = {}
            for m in metrics:
                overhead = seg.segments * null.get(m, 0.0)
                total_raw[m] += raw.get(m, 0.0)
                total_overhead[m] += overhead
                corrected[path][m] = max(0.0, raw.get(m, 0.0) - overhead)
        for path in phase_paths:
            seg = self._phases[path]
            inside = [q for q in phase_paths if q == path or q.startswith(path + "/")]
            rows.append(
                {
                    "path": path,
                    "name": path.rsplit("/", 1)[-1],
                    "parent": path.rsplit("/", 1)[0] if "/" in path else None,
                    "depth": 0 if path == OUTSIDE else path.count("/"),
                    "calls": seg.calls,
                    "segments": seg.segments,
                    "multiplexed_segments": seg.multiplexed_segments,
                    "exclusive": corrected[path],
                    "inclusive": {
                        m: sum(corrected[q][m] for q in inside) if path != OUTSIDE else None
                        for m in metrics
                    },
                    "exclusive_raw": {m: exclusive_raw[path].get(m, 0.0) for m in metrics},
                }
            )
        return {
            "schema": REPORT_SCHEMA,
            "backend": self.backend,
            "metrics": {
                m: {
                    "source": self.metrics[m].source,
                    "unit": self.metrics[m].unit,
                    "description": self.metrics[m].description,
                }
                for m in metrics
            },
            "null_phase": {m: null.get(m, 0.0) for m in metrics},
            "null_repeats": self._null_repeats,
            "phases": [r for r in rows if r["path"] != OUTSIDE]
            + [r for r in rows if r["path"] == OUTSIDE],
            "total_raw": total_raw,
            "total_overhead": total_overhead,
            "threads": _thread_settings(),
            "simulated_caches": list(getattr(self, "_simulated_caches", [])),
            "notes": list(self.notes),
        }

    def close(self) -> None:
        """Same as :meth:`finish`: end profiling and release the counter file descriptors."""
        self.finish()

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _median_dict(samples: list[dict[str, float]]) -> dict[str, float]:
    if not samples:
        return {}
    keys = set().union(*samples)
    out = {}
    for key in keys:
        values = sorted(s[key] for s in samples if key in s)
        mid = len(values) // 2
        out[key] = values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])
    return out


# ---------------------------------------------------------------------- output
#: Width a printed table keeps to; wider tables are split into column groups.
TABLE_WIDTH = 100

#: Suffixes of counts: three significant figures with these instead of exponents.
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def sig3(value: float) -> str:
    """``value`` with three significant figures and never an exponent: ``0.00189``,
    ``27.9``, ``673``, ``43.5k``, ``1.23M``."""
    magnitude = abs(value)
    for scale, suffix in _SI:
        if magnitude >= scale:
            return f"{value / scale:.3g}{suffix}"
    if magnitude == 0:
        return "0"
    text = f"{value:.3g}"
    if "e" in text:  # small values: positional, three significant digits
        decimals = 2 - math.floor(math.log10(magnitude))
        text = f"{value:.{decimals}f}"
    return text


def _fmt(value: float | None, unit: str) -> str:
    """A table cell: times in milliseconds, counts with SI suffixes, three significant figures."""
    if value is None:
        return "-"
    if unit == "s":
        return sig3(value * 1e3)
    if unit == "ns":
        return sig3(value / 1e6)
    return sig3(value)


def _column_header(metric: str, unit: str) -> str:
    """A metric's column header with the unit its cells are in (times in ms)."""
    if unit in ("s", "ns"):
        return f"{metric.removesuffix('_s')} ms"
    return metric


def format_table(
    report: Mapping[str, Any], metrics: list[str] | None = None, width: int = TABLE_WIDTH
) -> str:
    """A plain-text table of a :meth:`Profiler.report`: one row per phase, inclusive figures.

    Times are in milliseconds (the header says ``ms``), counts carry SI suffixes (``k``, ``M``),
    every figure has three significant figures. A table wider than ``width`` characters is
    split into column groups, each repeating the phase column. The line beneath names each
    metric's source (``time``, ``software``, ``hardware``, ``simulated``, ``modelled``).
    """
    names = metrics if metrics is not None else list(report["metrics"])
    units = {m: report["metrics"][m]["unit"] for m in names}
    rows = []
    for row in report["phases"]:
        label = "  " * row["depth"] + row["name"]
        if row["multiplexed_segments"]:
            label += " (multiplexed)"
        figures = row["inclusive"] if row["path"] != OUTSIDE else row["exclusive"]
        rows.append((label, str(row["calls"]), [_fmt(figures.get(m), units[m]) for m in names]))
    headers = [_column_header(m, units[m]) for m in names]
    cell_widths = [max(len(h), *(len(r[2][i]) for r in rows)) for i, h in enumerate(headers)]
    label_width = max(len("phase"), *(len(r[0]) for r in rows))
    calls_width = max(len("calls"), *(len(r[1]) for r in rows))
    # column groups that fit the width next to the phase and calls columns
    groups: list[list[int]] = [[]]
    used = label_width + 2 + calls_width
    for i, w in enumerate(cell_widths):
        if groups[-1] and used + 2 + w > width:
            groups.append([])
            used = label_width + 2 + calls_width
        groups[-1].append(i)
        used += 2 + w
    out: list[str] = []
    for group in groups:
        if out:
            out.append("")
        head = ["phase".ljust(label_width), "calls".rjust(calls_width)]
        out.append("  ".join(head + [headers[i].rjust(cell_widths[i]) for i in group]))
        for label, calls, cells in rows:
            line = [label.ljust(label_width), calls.rjust(calls_width)]
            out.append("  ".join(line + [cells[i].rjust(cell_widths[i]) for i in group]))
    by_source: dict[str, list[str]] = {}
    for m in names:
        by_source.setdefault(report["metrics"][m]["source"], []).append(_column_header(m, units[m]))
    out.append(
        "sources: " + "; ".join(f"{source}: {', '.join(ms)}" for source, ms in by_source.items())
    )
    out.append(
        f"backend: {report['backend']}; inclusive figures, null-phase overhead subtracted "
        f"({report['null_repeats']} null phases)"
    )
    out.extend(f"note: {n}" for n in report["notes"])
    return "\n".join(out)


def write_json(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a report as JSON (atomically); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, target)
    return target
