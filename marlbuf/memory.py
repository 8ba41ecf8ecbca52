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
        per episode end still stored plus one per stream; 0 with ``next_obs="stored"``.
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
        As for the buffer.
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
        Whether the sampler samples sequences (:class:`marlbuf.samplers.Sequence`): the writer
        then keeps the episode index (episode id, step, two links: 32 bytes per slot), a start
        flag per slot and a start tree (counted as prioritized trees when ``prioritized``, else
        as one 0/1 tree, an upper bound: ``pad=True`` needs none), and prioritized sequences
        the valid training steps of each handed-out sequence (4 bytes per slot and trainer).
    global_fields, alive
        As for the buffer: global fields and the alive mask (one byte per agent) are stored in
        every row, like the per-agent extra fields of the specs.
    """
    n_trainers = len(specs) if n_trainers is None else int(n_trainers)
    once = next_obs == "once"
    fields = row_fields(specs, lean=once)
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
        metadata += capacity * (4 * 8 + 1)  # episode, step, previous, next slot; start flag
        metadata += n_trainers * capacity * 4 if prioritized else 2 * leaves * 8
    return MemoryEstimate(int(capacity), int(row_bytes), int(side), int(metadata))


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse (``MemoryError``) or warn (``ResourceWarning``) before allocating ``nbytes`` of
    host memory that will not fit in what the OS reports available."""
    from marlbuf.storage import available_memory_bytes

    available = available_memory_bytes()
    if available is None:
        return
    if nbytes > available:
        raise MemoryError(
            f"{what} needs {nbytes / GIB:.2f} GiB but only {available / GIB:.2f} GiB is "
            "available; reduce capacity (or the number of agents / observation size)"
        )
    if nbytes > _config.MEMORY_WARN_FRACTION * available:
        warnings.warn(
            f"{what} needs {nbytes / GIB:.2f} GiB of the {available / GIB:.2f} GiB available; "
            "the machine may start swapping",
            ResourceWarning,
            stacklevel=3,
        )


def main(argv: list[str] | None = None) -> int:
    """``marlbuf memory``: bytes per transition and total size for an MPE configuration."""
    from marlbuf.cli import ArgumentParser, error

    parser = ArgumentParser(
        "marlbuf memory",
        description="What a buffer will hold, before allocating it: bytes per transition and "
        "total size of each storage format for the paper's MPE tasks.",
    )
    parser.add_argument(
        "--env",
        choices=("cooperative_navigation", "predator_prey"),
        default="cooperative_navigation",
    )
    parser.add_argument("--agents", type=int, default=24, help="agents (predators)")
    parser.add_argument("--capacity", type=float, default=1e6, help="transitions")
    parser.add_argument("--layout", choices=("interleaved", "agent_major"), default="interleaved")
    parser.add_argument("--episode-length", type=int, default=DEFAULT_EPISODE_LENGTH)
    parser.add_argument(
        "--hidden",
        type=int,
        default=0,
        help="a float32 extra field of this many values per agent (e.g. an RNN state)",
    )
    parser.add_argument(
        "--state", type=int, default=0, help="a float32 global field of this many values"
    )
    parser.add_argument("--alive", action="store_true", help="an alive flag per agent per step")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.capacity < 1 or not float(args.capacity).is_integer():
        return error("marlbuf memory", "--agents and --capacity must be positive integers")
    if args.hidden < 0 or args.state < 0:
        return error("marlbuf memory", "--hidden and --state must be >= 0")
    from marlbuf.bench.workloads import Workload

    workload = Workload(args.env, args.agents)
    extras = {"hidden": FieldSpec((args.hidden,))} if args.hidden else {}
    specs = {a: replace(s, extras=extras) for a, s in workload.specs().items()}
    global_fields = {"state": FieldSpec((args.state,))} if args.state else {}
    half = {
        a: AgentSpec(s.obs_shape, s.action_shape, obs_dtype="float16", extras=extras)
        for a, s in specs.items()
    }
    capacity = int(args.capacity)
    print(f"{workload.label} ({workload.n_trainers} agents), capacity {capacity:,}:")
    dense = None
    for name, fmt_specs, next_obs in (
        ("dense (next_obs stored)", specs, "stored"),
        ("observations stored once", specs, "once"),
        ("stored once + float16 obs", half, "once"),
    ):
        est = estimate(
            fmt_specs,
            capacity,
            args.layout,
            next_obs,
            episode_length=args.episode_length,
            global_fields=global_fields,
            alive=args.alive,
        )
        dense = dense or est
        ratio = est.bytes_per_transition / dense.bytes_per_transition
        print(f"  {name:<28} {est}  ({ratio:.2f}x dense)")
    return 0


__all__ = ["DEFAULT_EPISODE_LENGTH", "MemoryEstimate", "check_fits_in_memory", "estimate"]
