"""Know the cost before allocating: bytes per transition and total size of a buffer.

>>> from marlbuf import AgentSpec
>>> from marlbuf.memory import estimate
>>> specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
>>> dense = estimate(specs, 1_000_000, next_obs="stored")
>>> lean = estimate(specs, 1_000_000)
>>> round(dense.table_row_bytes / 1024, 1), round(lean.table_row_bytes / 1024, 1)
(27.7, 14.2)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from marlbuf import _config
from marlbuf.spec import AgentSpec, FieldSpec, interleaved_row_layout, row_fields

#: episode length assumed by :func:`estimate` for the side table of observations stored once
#: (MPE's ``max_cycles``); every episode end keeps one next observation in the side table
DEFAULT_EPISODE_LENGTH = 25

GIB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a buffer needs, by part.

    Attributes
    ----------
    capacity : int
    table_row_bytes : int
        Stored bytes per transition in the storage arrays (padded row or per-agent arrays).
    side_table_bytes : int
        Expected bytes of the next-observation side table (observations stored once): one row
        per episode end still stored plus one per stream; 0 with ``next_obs="stored"`` or
        ``"none"``.
    metadata_bytes : int
        Per-slot bookkeeping: write generations, next-observation links and priority trees.
    """

    capacity: int
    table_row_bytes: int
    side_table_bytes: int
    metadata_bytes: int

    @property
    def storage_bytes(self) -> int:
        """The storage arrays (allocated up front)."""
        return self.capacity * self.table_row_bytes

    @property
    def total_bytes(self) -> int:
        return self.storage_bytes + self.side_table_bytes + self.metadata_bytes

    @property
    def bytes_per_transition(self) -> float:
        return self.total_bytes / self.capacity

    def __str__(self) -> str:
        return (
            f"{self.total_bytes / GIB:.2f} GiB ({self.bytes_per_transition:,.0f} bytes per "
            f"transition: {self.table_row_bytes:,} stored, "
            f"{(self.side_table_bytes + self.metadata_bytes) / self.capacity:,.0f} side table "
            "and metadata)"
        )


def estimate(
    specs: Mapping[str, AgentSpec],
    capacity: int,
    layout: str = "interleaved",
    next_obs: str = "once",
    prioritized: bool = False,
    n_trainers: int | None = None,
    episode_length: int = DEFAULT_EPISODE_LENGTH,
    n_streams: int = 1,
    episodes: bool = False,
    global_fields: Mapping[str, FieldSpec] | None = None,
    alive: bool = False,
) -> MemoryEstimate:
    """What a :class:`~marlbuf.MultiAgentReplayBuffer` with these options will hold.

    Parameters
    ----------
    specs, capacity, layout, next_obs
        As for the buffer (``next_obs``: ``"once"``, ``"stored"`` or ``"none"``; ``"none"``
        stores the lean row of ``"once"`` without links or side table).
    prioritized : bool
        Whether the sampler keeps priority trees (``Prioritized``/``PrioritizedNeighbor``).
    n_trainers : int, optional
        Defaults to the number of agents.
    episode_length : int
        Steps per episode, for the expected side-table size of observations stored once (its
        worst case, no two consecutive observations equal, is one row per slot).
    n_streams : int
        Environment copies writing into the buffer.
    episodes : bool
        Whether the sampler samples sequences or episodes (:class:`marlbuf.samplers.Sequence`,
        :class:`~marlbuf.samplers.Episodes`): the writer then keeps the episode index (episode
        id, step, two links, length and the set of complete episodes: 56 bytes per slot), a
        start flag per slot and a start tree (counted as prioritized trees when
        ``prioritized``, else as one 0/1 tree, an upper bound: ``pad=True`` needs none), and
        prioritized sequences the valid training steps of each handed-out sequence (4 bytes
        per slot and trainer).
    global_fields, alive
        As for the buffer: global fields and the alive mask (one byte per agent) are stored in
        every row, like the per-agent extra fields of the specs.
    """
    n_trainers = len(specs) if n_trainers is None else int(n_trainers)
    once = next_obs == "once"
    fields = row_fields(specs, lean=once or next_obs == "none")
    slots, row_bytes = interleaved_row_layout(
        specs, _config.ROW_ALIGN_BYTES, fields, global_fields=global_fields, alive=alive
    )
    if layout != "interleaved":  # one array per (field, agent): no padding
        row_bytes = sum(s.nbytes for s in slots)
    side = 0
    metadata = capacity * 8  # write generation
    if once:
        slots, _ = interleaved_row_layout(specs, _config.ROW_ALIGN_BYTES)
        obs = [s for s in slots if s.field == "obs"]
        side_row = -(-(obs[-1].offset + obs[-1].nbytes) // 8) * 8
        side = side_row * (min(capacity, -(-capacity // max(1, episode_length))) + n_streams)
        metadata += capacity * 16  # successor slot and side row per slot
    leaves = 1 << max(0, (capacity - 1).bit_length())
    if prioritized:
        metadata += n_trainers * 2 * 2 * leaves * 8  # sum + max trees
    if episodes:
        # episode, step, previous and next slot, length, complete set and position; start flag
        metadata += capacity * (7 * 8 + 1)
        metadata += n_trainers * capacity * 4 if prioritized else 2 * leaves * 8
    return MemoryEstimate(int(capacity), int(row_bytes), int(side), int(metadata))


def largest_fields(
    specs: Mapping[str, AgentSpec],
    global_fields: Mapping[str, FieldSpec] | None = None,
    count: int = 2,
) -> str:
    """The ``count`` largest items of a row, in words, each with its declared shape and size
    (``"obs_shape (1000000000,) of agent 'a' (4.0 GB), ..."``): what a refusal for size names."""
    items: list[tuple[int, str]] = []
    for agent, spec in specs.items():
        for field, shape, dtype in (
            ("obs_shape", spec.obs_shape, spec.obs_dtype),
            ("action_shape", spec.action_shape, spec.action_dtype),
        ):
            nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
            items.append((nbytes, f"{field} {tuple(shape)} of agent {agent!r}"))
        for name, fs in spec.extras.items():
            nbytes = int(np.prod(fs.shape, dtype=object)) * fs.dtype.itemsize
            items.append((nbytes, f"extra {name!r} {tuple(fs.shape)} of agent {agent!r}"))
    for name, fs in (global_fields or {}).items():
        nbytes = int(np.prod(fs.shape, dtype=object)) * fs.dtype.itemsize
        items.append((nbytes, f"global field {name!r} {tuple(fs.shape)}"))
    items.sort(key=lambda item: -item[0])
    return ", ".join(f"{what} ({nbytes / 1e9:.3g} GB)" for nbytes, what in items[:count])


class MemoryWarning(UserWarning):
    """A buffer that fits, but in most of the memory the OS reports available (the machine
    may start swapping). A ``UserWarning``, so Python shows it by default."""


@dataclass(frozen=True)
class FormatOption:
    """One way to store a buffer, and what it costs.

    Attributes
    ----------
    name : str
        What the format is, in words ("observations stored once, float16").
    setting : str
        The arguments that select it (``next_obs='once'``, ``AgentSpec(obs_dtype=np.float16)``,
        ``path=...``).
    estimate : MemoryEstimate
        Everything the format stores (RAM and, for ``path=``, files).
    ram_bytes : int
        The part of it held in RAM: all of it, except the storage arrays with ``path=``.
    keeps_next_obs : bool
        Whether batches hold ``next_obs`` (``False``: ``next_obs='none'``, for learners that
        never read it).
    """

    name: str
    setting: str
    estimate: MemoryEstimate
    ram_bytes: int
    keeps_next_obs: bool = True


def _half(specs: Mapping[str, AgentSpec]) -> dict[str, AgentSpec]:
    return {a: replace(s, obs_dtype=np.float16) for a, s in specs.items()}


def format_options(
    specs: Mapping[str, AgentSpec],
    capacity: int,
    layout: str = "interleaved",
    *,
    extra_metadata_bytes: int = 0,
    episode_length: int = DEFAULT_EPISODE_LENGTH,
    global_fields: Mapping[str, FieldSpec] | None = None,
    alive: bool = False,
) -> list[FormatOption]:
    """Every storage format of a buffer of ``specs`` and ``capacity``, with its size.

    The formats: next observations stored in every row (``next_obs='stored'``) or stored once
    (``next_obs='once'``; ``'auto'``, the default, picks it for streams of environment steps),
    each with float32 and float16 observations (``AgentSpec(obs_dtype=np.float16)``: batches
    are still float32), the storage arrays of the stored-once format in memory-mapped files
    (``path=``: only the side table and metadata stay in RAM), then no next observations at
    all (``next_obs='none'``, for learners that never read them: episode learners read the
    next step's ``obs``), with float32 and float16 observations.

    Parameters
    ----------
    specs, capacity, layout, global_fields, alive
        As for the buffer.
    extra_metadata_bytes : int
        Bytes every format adds alike (priority trees, an episode index).
    episode_length : int
        Steps per episode, for the side table of observations stored once.

    Returns
    -------
    list of FormatOption
        In the order above; the float16 rows are left out where the observations are float16
        already.
    """
    half = _half(specs)
    halves = any(half[a].obs_dtype != s.obs_dtype for a, s in specs.items())
    f16 = "AgentSpec(obs_dtype=np.float16)"
    variants = [("dense", "next_obs='stored'", specs, "stored")]
    variants.append(("stored once", "next_obs='once'", specs, "once"))
    if halves:
        variants.append(("dense, float16 obs", f"next_obs='stored' + {f16}", half, "stored"))
        variants.append(("stored once, float16 obs", f"next_obs='once' + {f16}", half, "once"))
    variants.append(("no next_obs", "next_obs='none'", specs, "none"))
    if halves:
        variants.append(("no next_obs, float16 obs", f"next_obs='none' + {f16}", half, "none"))
    options = []
    for name, setting, fmt_specs, next_obs in variants:
        est = estimate(
            fmt_specs,
            capacity,
            layout,
            next_obs,
            episode_length=episode_length,
            global_fields=global_fields,
            alive=alive,
        )
        est = replace(est, metadata_bytes=est.metadata_bytes + extra_metadata_bytes)
        options.append(FormatOption(name, setting, est, est.total_bytes, next_obs != "none"))
    once = options[1].estimate
    mapped = FormatOption(
        "stored once, in mapped files",
        "next_obs='once' + path='DIR'",
        once,
        once.total_bytes - once.storage_bytes,
    )
    at = next(k for k, o in enumerate(options) if not o.keeps_next_obs)
    return [*options[:at], mapped, *options[at:]]


def largest_capacity(bytes_per_transition: float, budget_bytes: float) -> int:
    """The largest capacity, rounded down to two significant figures, whose buffer of
    ``bytes_per_transition`` fits in ``budget_bytes``."""
    exact = int(budget_bytes // max(bytes_per_transition, 1.0))
    if exact < 100:
        return exact
    scale = 10 ** (len(str(exact)) - 2)
    return exact // scale * scale


def advice(
    needed: MemoryEstimate,
    available: int,
    specs: Mapping[str, AgentSpec],
    layout: str,
    *,
    global_fields: Mapping[str, FieldSpec] | None = None,
    alive: bool = False,
    next_obs: str = "once",
) -> str:
    """What fits instead of a buffer that needs ``needed`` of RAM: every storage format of
    :func:`format_options` that fits in ``available`` bytes, with its size, and the largest
    capacity of this format that fits (one sentence each, for a ``MemoryError``). Formats whose
    batches hold next observations are listed for a buffer that keeps them (``next_obs`` other
    than ``"none"``), formats without them for one that does not: never a format that changes
    what the buffer's batches hold."""
    if needed.table_row_bytes == 0:  # storage in mapped files already: RAM holds metadata
        fitting = []
    else:
        base = estimate(specs, needed.capacity, layout, "stored", global_fields=global_fields)
        once = estimate(specs, needed.capacity, layout, "once", global_fields=global_fields)
        # what the sampler adds (priority trees, an episode index) is the same in every format
        own = once if needed.side_table_bytes else base
        extra = max(0, needed.metadata_bytes - own.metadata_bytes)
        options = format_options(
            specs,
            needed.capacity,
            layout,
            extra_metadata_bytes=extra,
            global_fields=global_fields,
            alive=alive,
        )
        keeps = next_obs != "none"
        fitting = [
            o
            for o in options
            if o.ram_bytes <= available
            and o.ram_bytes < needed.total_bytes
            and o.keeps_next_obs == keeps
        ]
    parts = []
    for o in fitting:
        size = f"{o.ram_bytes / GIB:.2f} GiB"
        if o.ram_bytes != o.estimate.total_bytes:
            size += f" of RAM and {o.estimate.storage_bytes / GIB:.2f} GiB of disk"
        parts.append(f"{o.name} ({o.setting}): {size}")
    fits = largest_capacity(needed.bytes_per_transition, _config.MEMORY_WARN_FRACTION * available)
    text = "formats that fit: " + "; ".join(parts) + ". Or " if parts else "Fix: "
    if fits < 1:  # not one transition fits: the shapes, not the capacity, are too large
        return text + "declare smaller fields: not even one transition of these fits"
    return text + f"lower capacity to {fits:,} or less in this format"


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse (``MemoryError``) or warn (:class:`MemoryWarning`) before allocating ``nbytes``
    of host memory that will not fit in what the OS reports available."""
    from marlbuf.storage import available_memory_bytes

    available = available_memory_bytes()
    if available is None:
        return
    if nbytes > available:
        raise MemoryError(
            f"{what} needs {nbytes / GIB:.2f} GiB but only {available / GIB:.2f} GiB is "
            "available; reduce capacity (or the number of agents / observation size), or store "
            "observations as float16 (AgentSpec(obs_dtype=np.float16))"
        )
    if nbytes > _config.MEMORY_WARN_FRACTION * available:
        warnings.warn(
            f"{what} needs {nbytes / GIB:.2f} GiB of the {available / GIB:.2f} GiB available; "
            "the machine may start swapping",
            MemoryWarning,
            stacklevel=3,
        )


def format_table(
    options: list[FormatOption], available: int | None, default: str = "stored once"
) -> list[str]:
    """The lines of ``marlbuf memory``'s table: one row per format, sizes in GiB, each
    format's RAM as a share of ``available`` (``None``: unknown here)."""
    dense = options[0].estimate.bytes_per_transition
    header = (
        f"{'format':<32}{'bytes/transition':>17}{'vs dense':>9}{'total GiB':>11}"
        f"{'RAM GiB':>9}  of RAM available"
    )
    lines = [header, "-" * len(header)]
    for o in options:
        name = o.name + (" (default)" if o.name == default else "")
        if available is None:
            share = "unknown"
        elif o.ram_bytes > available:
            share = "does not fit"
        else:
            share = f"{o.ram_bytes / available:.0%}" if o.ram_bytes >= available / 100 else "<1%"
            if o.ram_bytes > _config.MEMORY_WARN_FRACTION * available:
                share += " (warns)"
        lines.append(
            f"{name:<32}{o.estimate.bytes_per_transition:>17,.0f}"
            f"{o.estimate.bytes_per_transition / dense:>8.2f}x{o.estimate.total_bytes / GIB:>11.2f}"
            f"{o.ram_bytes / GIB:>9.2f}  {share}"
        )
    return lines


__all__ = [
    "DEFAULT_EPISODE_LENGTH",
    "FormatOption",
    "MemoryEstimate",
    "MemoryWarning",
    "advice",
    "check_fits_in_memory",
    "estimate",
    "format_options",
    "largest_capacity",
    "largest_fields",
]
