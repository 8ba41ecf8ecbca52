"""Per-phase profiling of a MARL training loop: time, software and hardware counters, or
callgrind's cache simulation where the machine has no PMU.

>>> from marlbuf.profiling import Profiler
>>> prof = Profiler(backend="time", null_repeats=10)
>>> with prof.phase("sampling"):
...     pass
>>> prof.report()["phases"][0]["name"]
'sampling'
"""

from marlbuf.profiling.perf_events import CounterGroup, PerfEventError, probe
from marlbuf.profiling.profiler import (
    BACKENDS,
    NullProfiler,
    Profiler,
    format_table,
    write_json,
)

__all__ = [
    "BACKENDS",
    "CounterGroup",
    "NullProfiler",
    "PerfEventError",
    "Profiler",
    "format_table",
    "probe",
    "write_json",
]
