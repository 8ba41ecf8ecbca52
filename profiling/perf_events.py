"""A small ``perf_event_open`` binding (ctypes, Linux only): counter groups read per phase.

Why our own: no maintained Python package offers grouped hardware *and* software events with
enable/disable/reset and readable errors (see ``docs/profiling.md``). This module opens one
counter group for the calling thread, reads it with ``PERF_FORMAT_GROUP`` plus the enabled and
running times (so that multiplexing is detected and scaled), and turns ``errno`` into plain
reasons: no PMU (``ENOENT``, e.g. a VM), ``kernel.perf_event_paranoid`` too high (``EACCES`` /
``EPERM``), a group larger than the PMU's counters (``EINVAL`` / ``ENOSPC`` on a member, or a
group that is never scheduled).

What is counted: the calling thread only (``pid=0, cpu=-1``, no ``inherit``, because
``inherit`` cannot be combined with group reads on older kernels), user space only
(``exclude_kernel``, ``exclude_hv``). Work done by other threads (a Numba ``parallel=True``
pool, torch intra-op threads) is *not* counted: pin them to one thread while profiling.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

# perf_event_attr.type
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_HW_CACHE = 3

# perf_event_attr.read_format
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
READ_FORMAT = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING

# perf_event_attr flag bits (the bitfield word after read_format)
_FLAG_DISABLED = 1 << 0
_FLAG_EXCLUDE_KERNEL = 1 << 5
_FLAG_EXCLUDE_HV = 1 << 6

# ioctls: _IO('$', n) and the flag that applies them to the whole group
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_IOC_FLAG_GROUP = 1
PERF_FLAG_FD_CLOEXEC = 1 << 3

#: perf_event_open syscall number per machine (the libc has no wrapper)
SYSCALL_NUMBERS = {"x86_64": 298, "aarch64": 241, "arm64": 241}

#: Event name -> (perf type, config, source label). Hardware-cache configs are
#: ``id | (op << 8) | (result << 16)``: LL=2 / DTLB=3 / L1D=0, op read=0, result miss=1.
EVENTS: dict[str, tuple[int, int, str]] = {
    "instructions": (PERF_TYPE_HARDWARE, 1, "hardware"),
    "cycles": (PERF_TYPE_HARDWARE, 0, "hardware"),
    "cache-misses": (PERF_TYPE_HARDWARE, 3, "hardware"),
    "LLC-read-misses": (PERF_TYPE_HW_CACHE, 0x10002, "hardware"),
    "dTLB-read-misses": (PERF_TYPE_HW_CACHE, 0x10003, "hardware"),
    "task-clock": (PERF_TYPE_SOFTWARE, 1, "software"),
    "page-faults": (PERF_TYPE_SOFTWARE, 2, "software"),
}

#: The hardware events the profiler reads as one group at every phase boundary.
HARDWARE_EVENTS = ("instructions", "cycles", "cache-misses", "LLC-read-misses", "dTLB-read-misses")
#: Kernel software events: they open in VMs without a PMU.
SOFTWARE_EVENTS = ("task-clock", "page-faults")

_PARANOID_PATH = Path("/proc/sys/kernel/perf_event_paranoid")


class PerfEventError(OSError):
    """``perf_event_open`` or a group read failed; ``str()`` is a plain-language reason."""


class _PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to ``PERF_ATTR_SIZE_VER5`` (112 bytes)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
    ]


assert ctypes.sizeof(_PerfEventAttr) == 112

_libc: ctypes.CDLL | None = None


def _syscall_number() -> int:
    if not sys.platform.startswith("linux"):
        raise PerfEventError(
            errno.ENOSYS,
            f"perf_event_open is Linux-only; this is {sys.platform}. Use the 'time' backend.",
        )
    machine = platform.machine()
    if machine not in SYSCALL_NUMBERS:
        raise PerfEventError(
            errno.ENOSYS,
            f"perf_event_open's syscall number is not known for machine {machine!r} "
            f"(known: {sorted(SYSCALL_NUMBERS)}). Use the 'time' backend.",
        )
    return SYSCALL_NUMBERS[machine]


def _get_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.ioctl.restype = ctypes.c_int
        _libc = lib
    return _libc


def paranoid_level() -> str:
    """The value of ``kernel.perf_event_paranoid`` (``"unknown"`` if unreadable)."""
    try:
        return _PARANOID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def explain_errno(err: int, event: str, member: bool = False) -> str:
    """A plain-language reason why ``event`` could not be opened (``err`` is an errno)."""
    if err == errno.ENOENT or err == errno.EOPNOTSUPP:
        return (
            f"{event}: not supported (errno {errno.errorcode.get(err, err)}): no hardware "
            "performance counters (no PMU) on this CPU or VM; software events still work, "
            "'--backend callgrind' gives simulated cache figures"
        )
    if err in (errno.EACCES, errno.EPERM):
        return (
            f"{event}: permission denied (errno {errno.errorcode.get(err, err)}): "
            f"kernel.perf_event_paranoid is {paranoid_level()}. Lower it, e.g. "
            "'sudo sysctl -w kernel.perf_event_paranoid=1' (or run with CAP_PERFMON)."
        )
    if member and err in (errno.EINVAL, errno.ENOSPC, errno.E2BIG):
        return (
            f"{event}: the counter group is too large for this PMU (errno "
            f"{errno.errorcode.get(err, err)} when adding it to the group): count fewer "
            "hardware events at once."
        )
    if err == errno.ENOSYS:
        return f"{event}: the kernel has no perf_event_open (errno ENOSYS)."
    if err == errno.EMFILE:
        return f"{event}: too many open files (errno EMFILE): close other counter groups."
    return f"{event}: perf_event_open failed: {os.strerror(err)} (errno {err})."


def open_event(name: str, group_fd: int = -1, disabled: bool = True) -> int:
    """Open one counter for the calling thread; returns its file descriptor.

    Parameters
    ----------
    name : str
        A key of :data:`EVENTS`.
    group_fd : int, default -1
        The group leader's fd, or -1 to open a new group (then ``name`` is the leader).
    disabled : bool, default True
        Open stopped (a leader's state governs the whole group).

    Raises
    ------
    PerfEventError
        With a plain reason (no PMU, paranoid level, group too large, not Linux).
    """
    if name not in EVENTS:
        raise ValueError(f"unknown perf event {name!r}; choose from {sorted(EVENTS)}")
    nr = _syscall_number()
    kind, config, _ = EVENTS[name]
    attr = _PerfEventAttr()
    attr.type = kind
    attr.size = ctypes.sizeof(_PerfEventAttr)
    attr.config = config
    attr.read_format = READ_FORMAT
    attr.flags = _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV | (_FLAG_DISABLED if disabled else 0)
    libc = _get_libc()
    fd = libc.syscall(
        ctypes.c_long(nr),
        ctypes.byref(attr),
        ctypes.c_int(0),  # pid 0: this thread
        ctypes.c_int(-1),  # any cpu
        ctypes.c_int(group_fd),
        ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise PerfEventError(err, explain_errno(err, name, member=group_fd >= 0))
    return int(fd)


@dataclass(frozen=True)
class GroupReading:
    """One read of a counter group.

    ``values`` are scaled by ``time_enabled / time_running`` when the kernel multiplexed the
    group (``multiplexed`` is then True and the values are estimates); ``raw`` are unscaled.
    """

    values: dict[str, float]
    raw: dict[str, int]
    time_enabled_ns: int
    time_running_ns: int

    @property
    def multiplexed(self) -> bool:
        return self.time_running_ns < self.time_enabled_ns


@dataclass
class CounterGroup:
    """A group of counters on the calling thread, enabled, disabled, reset and read together.

    Examples
    --------
    >>> group = CounterGroup(["task-clock", "page-faults"])  # doctest: +SKIP
    >>> group.enable(); work(); reading = group.read()       # doctest: +SKIP
    >>> group.close()                                        # doctest: +SKIP
    """

    events: list[str]
    fds: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not self.events:
            raise ValueError("events must name at least one perf event; got an empty list")
        for name in self.events:
            if name not in EVENTS:
                raise ValueError(f"unknown perf event {name!r}; choose from {sorted(EVENTS)}")
        try:
            for name in self.events:
                leader = self.fds[0] if self.fds else -1
                self.fds.append(open_event(name, group_fd=leader, disabled=not self.fds))
        except PerfEventError:
            self.close()
            raise
        # 8 bytes nr + enabled + running, then one u64 per event
        self._read_size = 8 * (3 + len(self.events))

    def _ioctl(self, request: int) -> None:
        if not self.fds:
            raise PerfEventError(errno.EBADF, "the counter group is closed")
        if _get_libc().ioctl(self.fds[0], request, PERF_IOC_FLAG_GROUP) != 0:
            err = ctypes.get_errno()
            raise PerfEventError(err, f"perf ioctl {request:#x} failed: {os.strerror(err)}")

    def enable(self) -> None:
        """Start counting (the whole group)."""
        self._ioctl(PERF_EVENT_IOC_ENABLE)

    def disable(self) -> None:
        """Stop counting (the whole group)."""
        self._ioctl(PERF_EVENT_IOC_DISABLE)

    def reset(self) -> None:
        """Zero every counter of the group."""
        self._ioctl(PERF_EVENT_IOC_RESET)

    def read(self) -> GroupReading:
        """Cumulative counts since the last reset, scaled if the group was multiplexed.

        Raises
        ------
        PerfEventError
            If the group was enabled but never scheduled (more events than counters).
        """
        if not self.fds:
            raise PerfEventError(errno.EBADF, "the counter group is closed")
        data = os.read(self.fds[0], self._read_size)
        nr, enabled, running = struct.unpack_from("QQQ", data)
        counts = struct.unpack_from(f"{nr}Q", data, 24)
        raw = dict(zip(self.events, (int(c) for c in counts)))
        if enabled > 0 and running == 0:
            raise PerfEventError(
                errno.ENOSPC,
                f"the counter group {self.events} was enabled but never scheduled: it is too "
                "large for this PMU; count fewer hardware events at once.",
            )
        scale = enabled / running if 0 < running < enabled else 1.0
        return GroupReading(
            values={k: v * scale for k, v in raw.items()},
            raw=raw,
            time_enabled_ns=int(enabled),
            time_running_ns=int(running),
        )

    def close(self) -> None:
        """Close every fd (members first); safe to call twice."""
        for fd in reversed(self.fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    def __enter__(self) -> CounterGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def probe(events: tuple[str, ...] | None = None) -> dict[str, str]:
    """Which perf events open on this machine: event name -> ``"ok"`` or the plain reason.

    Each event is opened on its own (not as a group) and closed at once.
    """
    names = tuple(EVENTS) if events is None else events
    status: dict[str, str] = {}
    for name in names:
        try:
            fd = open_event(name)
        except PerfEventError as exc:
            reason = exc.strerror or str(exc)
            status[name] = reason.removeprefix(f"{name}: ")
        else:
            os.close(fd)
            status[name] = "ok"
    return status
