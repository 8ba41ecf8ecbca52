"""Callgrind client requests issued from Python, and callgrind dump-file parsing.

Valgrind recognises a "client request" by a magic instruction sequence that is a no-op on a
real CPU (``valgrind.h``): on amd64, ``rol rdi`` by 3, 13, 61 and 51 bits (a full turn), then
``xchg rbx, rbx``; ``rax`` holds the address of a block of six words (request code and five
arguments), the result comes back in ``rdx`` (left at the default outside valgrind). We emit
that sequence as inline assembly in a tiny Numba intrinsic, so no C compiler is needed at
install time; the compiled function is cached on disk like every other kernel (compile it
natively before a valgrind run: compiling under valgrind is very slow).

The kernel is :func:`marlbuf._kernels.client_request.client_request_kernel`. On other
machines (not x86-64), :func:`client_request` is a plain Python no-op that returns the
default, as valgrind's own macros do when valgrind support is compiled out.

Per-phase attribution uses ``CALLGRIND_DUMP_STATS_AT(label)``: it writes the costs collected
since the previous dump (or zeroing) to a new file whose header says
``desc: Trigger: Client Request: <label>`` and zeroes them. The simulated cache contents are
*not* reset, so phases see each other's warm/cold state, as on hardware.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import numpy as np

from marlbuf._kernels.client_request import client_request_kernel

# valgrind.h / callgrind.h request codes
VG_USERREQ_RUNNING_ON_VALGRIND = 0x1001
_CALLGRIND_BASE = (ord("C") << 24) | (ord("T") << 16)
CALLGRIND_DUMP_STATS = _CALLGRIND_BASE + 0
CALLGRIND_ZERO_STATS = _CALLGRIND_BASE + 1
CALLGRIND_DUMP_STATS_AT = _CALLGRIND_BASE + 3
CALLGRIND_START_INSTRUMENTATION = _CALLGRIND_BASE + 4
CALLGRIND_STOP_INSTRUMENTATION = _CALLGRIND_BASE + 5

#: Cache geometry pinned for every callgrind run (bytes, associativity, line bytes), so that
#: results do not depend on the host's CPUID: 32 KiB 8-way L1s, a 32 MiB 16-way last level.
PINNED_CACHES = {"I1": (32768, 8, 64), "D1": (32768, 8, 64), "LL": (33554432, 16, 64)}


def simulated_ll_bytes() -> int:
    """The size of the last-level cache every callgrind run simulates (:data:`PINNED_CACHES`)."""
    return PINNED_CACHES["LL"][0]


#: The events callgrind writes with ``--cache-sim=yes`` (instruction reads, data reads/writes,
#: L1 and last-level misses for instruction fetch, data read and data write).
CACHE_SIM_EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")


def supported() -> bool:
    """Whether client requests can be issued on this machine (x86-64 only)."""
    return platform.machine() in ("x86_64", "AMD64")


def client_request(code: int, *args: int, default: int = 0) -> int:
    """Issue valgrind client request ``code`` with up to five word arguments.

    Returns valgrind's answer, or ``default`` when not running under valgrind or on a machine
    other than x86-64 (where this is a Python no-op).
    """
    if len(args) > 5:
        raise ValueError(f"a client request takes at most 5 arguments; got {len(args)}")
    if not supported():
        return default
    block = np.zeros(6, dtype=np.uint64)
    block[0] = code
    block[1 : 1 + len(args)] = args
    return int(client_request_kernel(np.uint64(block.ctypes.data), np.uint64(default)))


def warm_up() -> None:
    """Compile the client-request function (and fill Numba's on-disk cache); a no-op request."""
    client_request(VG_USERREQ_RUNNING_ON_VALGRIND)


def running_on_valgrind() -> int:
    """How many valgrinds deep we run (0 natively), like ``RUNNING_ON_VALGRIND``."""
    return client_request(VG_USERREQ_RUNNING_ON_VALGRIND)


def _real_cmdline() -> list[str]:
    """This process's real command line. Valgrind virtualises ``/proc/self/cmdline`` and
    ``/proc/<pid>/cmdline`` to show the guest program, but not the per-task path, which still
    shows ``valgrind.bin --tool=... <options> python ...``."""
    pid = os.getpid()
    try:
        raw = Path(f"/proc/{pid}/task/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def valgrind_options() -> list[str]:
    """The valgrind options this process was started with; empty when not under valgrind."""
    argv = _real_cmdline()
    if not argv or "valgrind" not in Path(argv[0]).name:
        return []
    options = []
    for arg in argv[1:]:
        if not arg.startswith("-"):
            break  # the guest program starts here
        options.append(arg)
    return options


def valgrind_tool() -> str | None:
    """The valgrind tool running this process (``"callgrind"``, ``"memcheck"``...), else None."""
    argv = _real_cmdline()
    if not argv or "valgrind" not in Path(argv[0]).name:
        return None
    for opt in valgrind_options():
        if opt.startswith("--tool="):
            return opt.split("=", 1)[1]
    return "memcheck"  # valgrind's default tool


def under_callgrind() -> bool:
    """True when this process runs under ``valgrind --tool=callgrind``."""
    return valgrind_tool() == "callgrind"


def callgrind_options() -> list[str]:
    """The valgrind options of this process when it runs under callgrind, else empty."""
    return valgrind_options() if under_callgrind() else []


def cache_sim_enabled() -> bool:
    """Whether callgrind runs with ``--cache-sim=yes`` (else only instructions are counted)."""
    return "--cache-sim=yes" in callgrind_options()


def dump_file_prefix() -> Path:
    """Where this process's dumps go: ``--callgrind-out-file`` (``%p`` = pid) or the default
    ``callgrind.out.<pid>`` in the current directory. Dumps are ``<prefix>.<n>``."""
    pid = str(os.getpid())
    for opt in callgrind_options():
        if opt.startswith("--callgrind-out-file="):
            return Path(opt.split("=", 1)[1].replace("%p", pid))
    return Path.cwd() / f"callgrind.out.{pid}"


def start_instrumentation() -> None:
    """Start simulating (for runs launched with ``--instr-atstart=no``); no-op natively."""
    client_request(CALLGRIND_START_INSTRUMENTATION)


def stop_instrumentation() -> None:
    """Stop simulating (code runs ~4x faster than instrumented); no-op natively."""
    client_request(CALLGRIND_STOP_INSTRUMENTATION)


def zero_stats() -> None:
    """Zero the collected costs (the cache contents stay)."""
    client_request(CALLGRIND_ZERO_STATS)


def dump_stats_at(label: str) -> None:
    """Write the costs since the last dump/zero to a new dump file tagged ``label``; zero them."""
    text = np.frombuffer(label.encode() + b"\0", dtype=np.uint8).copy()
    client_request(CALLGRIND_DUMP_STATS_AT, text.ctypes.data)


def read_dump_summary(path: str | os.PathLike[str]) -> tuple[str, dict[str, int]]:
    """The trigger label and the summary costs of one callgrind dump file.

    Only the header is read (``desc: Trigger: ...``, ``events:``, ``summary:``); a client-request
    dump's label is what followed ``Client Request: ``. Missing events (no cache simulation)
    are absent from the dict.
    """
    label = ""
    events: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("desc: Trigger:"):
                trigger = line.split(":", 2)[2].strip()
                label = trigger.removeprefix("Client Request: ")
            elif line.startswith("events:"):
                events = line.split(":", 1)[1].split()
            elif line.startswith(("summary:", "totals:")):
                return label, _costs(events, line)
            elif line.startswith("fl=") or line.startswith("fn="):
                break  # past the header without a summary line: fall back to the totals
        for line in fh:
            if line.startswith("totals:"):
                return label, _costs(events, line)
    raise ValueError(f"{path}: not a callgrind dump (no summary: or totals: line)")


def read_dump_caches(path: str | os.PathLike[str]) -> list[str]:
    """The simulated cache geometry a dump file states (``desc: I1 cache: 32768 B, 64 B,
    8-way associative`` ...), one string per cache; empty without cache simulation."""
    caches = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("desc:") and " cache:" in line:
                caches.append(line.split(":", 1)[1].strip())
            elif line.startswith(("events:", "fl=", "fn=")):
                break
    return caches


def _costs(events: list[str], line: str) -> dict[str, int]:
    values = [int(v) for v in line.split(":", 1)[1].split()]
    return {name: values[i] if i < len(values) else 0 for i, name in enumerate(events)}


def dump_files(prefix: Path) -> list[Path]:
    """The numbered dump files ``<prefix>.<n>`` in dump order."""
    pattern = re.compile(re.escape(prefix.name) + r"\.(\d+)$")
    found = []
    for path in prefix.parent.glob(prefix.name + ".*"):
        match = pattern.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]


def valgrind_command(
    python_argv: list[str],
    out_prefix: str | os.PathLike[str],
    valgrind: str = "valgrind",
    log_file: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The command line that runs ``python_argv`` under callgrind with the pinned caches.

    Instrumentation starts off (``--instr-atstart=no``; imports run ~4x faster) and the
    profiler switches it on when it starts; dumps go to ``<out_prefix>.<n>``. With
    ``log_file``, valgrind's own messages (its banner, start-up warnings about the host's
    cache, "brk segment overflow", the closing summary) go to that file instead of stderr,
    which then carries the program's own output only.
    """
    caches = [
        f"--{name}={size},{assoc},{line}" for name, (size, assoc, line) in PINNED_CACHES.items()
    ]
    return [
        valgrind,
        "--tool=callgrind",
        "--cache-sim=yes",
        *caches,
        "--instr-atstart=no",
        "--dump-instr=no",
        "--dump-line=no",
        "--compress-strings=yes",
        f"--callgrind-out-file={out_prefix}",
        *([] if log_file is None else [f"--log-file={log_file}"]),
        *python_argv,
    ]
