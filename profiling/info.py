"""``marlbuf info``: what this machine offers the buffer and the profiler, and the versions of
marlbuf and the libraries it runs with. Nothing is imported to learn them (versions come from
the packages' metadata, torch's CUDA build from its version file, the devices from the NVIDIA
driver); ``--cuda`` asks torch itself whether it can use CUDA."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from marlbuf.cli import ArgumentParser


def _cpu_caches() -> list[dict[str, Any]]:
    caches = []
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")):
        try:
            caches.append(
                {
                    "level": int((index / "level").read_text()),
                    "type": (index / "type").read_text().strip(),
                    "size": (index / "size").read_text().strip(),
                    "line_bytes": int((index / "coherency_line_size").read_text()),
                    "shared_by_cpus": (index / "shared_cpu_list").read_text().strip(),
                }
            )
        except (OSError, ValueError):
            continue
    return caches


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _perf_counters() -> dict[str, str]:
    """Which perf events open here: event -> "ok" or the plain reason it does not."""
    from marlbuf.profiling.perf_events import probe

    return probe()


#: Distributions whose versions ``marlbuf info`` reports (absent ones as "not installed").
LIBRARIES = ("torch", "ray", "mpe2", "pettingzoo", "torchrl", "cpprb", "matplotlib")


def library_versions(ask_cuda: bool = False) -> dict[str, str]:
    """Installed versions of :data:`LIBRARIES` (from package metadata, nothing imported), and
    ``cuda``: torch's CUDA version and devices, asked of torch where it is imported already or
    ``ask_cuda`` allows importing it, else read without importing it (:func:`cuda_build`)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    if versions["torch"] != "not installed":
        versions["cuda"] = _cuda() if ask_cuda or "torch" in sys.modules else cuda_build()
    return versions


def cuda_build() -> str:
    """torch's CUDA build (the ``cuda`` line of its ``version.py``) and the NVIDIA devices the
    driver lists, without importing torch (which takes seconds)."""
    spec = importlib.util.find_spec("torch")
    build = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        found = re.search(r"^cuda\b[^=]*=\s*(.+)$", text, re.MULTILINE)
        if found:
            try:
                build = ast.literal_eval(found.group(1).strip())
            except (ValueError, SyntaxError):
                build = "unknown"
        break
    if build is None:
        return "none (a CPU build of torch)"
    models = []
    for information in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in information.read_text().splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    devices = (
        f"{len(models)} device(s): {', '.join(sorted(set(models)))}"
        if models
        else "no NVIDIA device listed by a driver here"
    )
    return f"{build} (torch's build; {devices}; 'marlbuf info --cuda' asks torch)"


def _cuda() -> str:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - a broken torch install
        return f"unknown (torch does not import: {exc})"
    if torch.version.cuda is None:
        return "none (a CPU build of torch)"
    if not torch.cuda.is_available():
        return f"{torch.version.cuda} (torch's build; no CUDA device here)"
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return f"{torch.version.cuda}, {torch.cuda.device_count()} device(s): {', '.join(names)}"


def machine_info() -> dict[str, Any]:
    """Cores, caches, Python/NumPy/Numba versions and threading, and perf-counter access."""
    import numba
    import numpy as np

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        affinity = os.cpu_count() or 0
    try:
        paranoid = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        paranoid = "unknown"
    from marlbuf import __version__

    return {
        "marlbuf": __version__,
        "cpu_model": _cpu_model(),
        "machine": platform.machine(),
        "cores_online": os.cpu_count(),
        "cores_usable": affinity,
        "caches": _cpu_caches(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threading_layer": str(getattr(numba.config, "THREADING_LAYER", "unknown")),
        "numba_num_threads": int(getattr(numba.config, "NUMBA_NUM_THREADS", 0)),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "perf_event_paranoid": paranoid,
        "perf_counters": _perf_counters(),
        "libraries": library_versions(),
    }


def perf_lines(counters: dict[str, str]) -> list[tuple[str, str]]:
    """The perf events grouped by status: one ``(events, status)`` per distinct status, so a
    reason shared by every hardware event is printed once."""
    groups: dict[str, list[str]] = {}
    for event, status in counters.items():
        groups.setdefault(status, []).append(event)
    return [(", ".join(events), status) for status, events in groups.items()]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser("marlbuf info", (__doc__ or "").replace("``", ""))
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--cuda",
        action="store_true",
        help="import torch to ask whether it can use CUDA here (seconds); by default torch's "
        "CUDA build and the driver's devices are read without importing it",
    )
    args = parser.parse_args(argv)
    info = machine_info()
    info["libraries"] = library_versions(ask_cuda=args.cuda)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "caches":
            for c in value:
                print(
                    f"{'cache':<22} L{c['level']} {c['type']:<12} {c['size']:>8} "
                    f"(line {c['line_bytes']} B, cpus {c['shared_by_cpus']})"
                )
        elif key == "perf_counters":
            for events, status in perf_lines(value):
                print(f"{'perf counters':<22} {events}: {status}")
        elif key == "libraries":
            for name, version in value.items():
                print(f"{name:<22} {version}")
        else:
            print(f"{key:<22} {value}")
    return 0
