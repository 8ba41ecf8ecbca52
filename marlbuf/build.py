"""Building a buffer's parts from a checked configuration: the constructor's policy.

:func:`build_parts` does what :class:`marlbuf.MultiAgentReplayBuffer` does before it holds
anything: the memory estimate (refused or warned before anything is allocated), the
``next_obs`` format assumed until the first write, the row codec, the store (in RAM, on a
device, or in the files of a memory-mapped folder, which is created here and abandoned again
if the store cannot be built), the ring, the episode index and the commit engine. It returns
the parts; the front assigns them and adds the reading and state sides. Nothing here takes the
buffer object.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlbuf import _config, mapped
from marlbuf.config import BufferConfig, make_rng
from marlbuf.memory import MemoryEstimate, estimate
from marlbuf.samplers import Sampler
from marlbuf.spec import AgentSpec, FieldSpec
from marlbuf.staging import RowCodec
from marlbuf.storage import available_memory_bytes
from marlbuf.stores import make_store
from marlbuf.stores.base import Storage
from marlbuf.stores.capabilities import refusal
from marlbuf.writer import EpisodeIndex, NextObsLinks, RingWriter
from marlbuf.writer.commit import WritePath


@dataclass(frozen=True)
class BufferParts:
    """The parts :func:`build_parts` builds for one buffer.

    Attributes
    ----------
    codec : RowCodec
        Checks and stages writes.
    writer : RingWriter
        Cursor, fill level, write generations and the locks.
    episodes : EpisodeIndex or None
        The episode index of a sampler that draws sequences or episodes, else ``None``.
    writes : WritePath
        The commit engine (it holds the store and the next-observation links).
    rng : numpy.random.Generator
        The generator of every draw.
    files : MappedStore or None
        The memory-mapped folder (created for ``path=``, or the one ``open`` claimed), not yet
        bound to the buffer; ``None`` for a buffer in memory.
    """

    codec: RowCodec
    writer: RingWriter
    episodes: EpisodeIndex | None
    writes: WritePath
    rng: np.random.Generator
    files: mapped.MappedStore | None


def build_parts(
    config: BufferConfig,
    sampler: Sampler,
    seed: int | np.random.Generator | None,
    parallel_gather: bool,
    device: Any,
    current_sampler: Callable[[], Sampler],
    path: str | os.PathLike[str] | None = None,
    durable: bool = False,
    files: mapped.MappedStore | None = None,
) -> BufferParts:
    """The parts of a buffer of a checked ``config`` (:meth:`BufferConfig.from_arguments`)
    drawing with ``sampler`` (bound here): in RAM or on ``device``, in a new memory-mapped
    folder at ``path``, or over the claimed folder ``files``. ``current_sampler`` returns the
    buffer's sampler when a write asks whether dense rows fit (the attribute may be replaced).

    Raises ``MemoryError`` (and warns :class:`marlbuf.memory.MemoryWarning`) before allocating
    a buffer that does not fit; a folder created here is removed again if its store cannot be
    built.
    """
    specs, capacity = config.specs, config.capacity
    in_files = path is not None or files is not None  # storage arrays on disk, not in RAM
    #: whether the format is still to be chosen by the first write (``next_obs="auto"``)
    auto = choose_format = config.next_obs == "auto" and not in_files
    next_obs = "once" if config.next_obs == "auto" else config.next_obs
    # sizes first: nothing that depends on a declared shape is allocated before the whole
    # buffer is known to fit (the staging row of add() is one dense row)
    row_options: dict[str, Any] = {"global_fields": config.global_fields, "alive": config.alive}
    staging_row = estimate(specs, 1, "interleaved", "stored", **row_options)
    if choose_format and config.initial_next_obs() == "stored":
        # rows so small that padding to a cache line eats what storing observations once
        # saves: the dense format costs no more memory and gathers without links
        choose_format = False
        next_obs = "stored"
    needed = estimate(
        specs,
        capacity,
        config.layout,
        next_obs,
        prioritized=sampler.weighted,
        n_trainers=config.n_trainers,
        episodes=sampler.needs_episodes,
        **row_options,
    )
    check_memory(
        mapped.resident(needed) if in_files or device is not None else needed,
        specs,
        config.layout,
        next_obs,
        config.global_fields,
        config.alive,
        working=staging_row.table_row_bytes,
    )
    # validation + staging of add/extend
    codec = RowCodec(specs, config.global_fields, config.alive)
    # checked against capacity first (a Neighbor run longer than the ring is refused here)
    sampler.bind(capacity, config.n_trainers)
    links = NextObsLinks(capacity, codec.obs_bytes) if next_obs == "once" else None
    store = files
    if path is not None:
        make_rng(seed)  # checked before the folder is claimed
        store = mapped.MappedStore.create(path, durable, needed)
    elif files is None and durable is not False:
        raise ValueError(
            f"durable={durable!r} applies to memory-mapped buffers only: pass path= as well"
        )
    try:
        storage = build_storage(
            config, codec, next_obs, links, None if store is None else store.allocate, device
        )
    except BaseException:
        if store is not None:
            store.abandon()  # a new folder is removed again; an existing one is released
        raise
    storage.parallel_gather = bool(parallel_gather)
    sampler.place_priorities(device)  # prioritized: trees on the device if asked
    rng = make_rng(seed)
    writer = RingWriter(capacity)
    episodes = None
    if sampler.needs_episodes:
        # staged rows carry obs and next_obs: the index compares them for stream breaks
        # (not without next observations, whose staged rows carry obs in their place)
        episodes = EpisodeIndex(
            capacity, codec.obs_bytes if next_obs != "none" else 0, codec.next_obs_start
        )
        sampler.attach_episodes(episodes)
    on_write = None if type(sampler).on_write is Sampler.on_write else sampler.on_write

    def new_store(next_obs: str) -> Storage:
        # the commit engine's hook when next_obs="auto" chooses the format: a new, empty store
        # of the current one's layout and options, whose rows keep next observations
        # ("stored") or not ("none"), without links
        current = writes.storage
        replacement = make_store(
            current.layout,
            codec,
            capacity,
            current.pool.max_blocks,
            current.batch_layout,
            None,
            current.batch_dtype,
            device=device,
            stores_next_obs=next_obs != "none",
        )
        replacement.parallel_gather = current.parallel_gather
        return replacement

    def dense_fits() -> bool:
        # whether the dense rows (next_obs="stored") fit in the memory available (besides what
        # the current store holds)
        current, drawing = writes.storage, current_sampler()
        dense = estimate(
            specs,
            capacity,
            current.layout,
            "stored",
            prioritized=drawing.weighted,
            n_trainers=config.n_trainers,
            episodes=drawing.needs_episodes,
            **row_options,
        )
        available = available_memory_bytes()
        return available is None or dense.total_bytes <= _config.MEMORY_WARN_FRACTION * (
            available + current.nbytes
        )

    writes = WritePath(
        codec,
        writer,
        storage,
        links,
        episodes,
        next_obs,
        on_write,
        new_store,
        dense_fits,
        auto=auto,
        choose_format=choose_format,
    )
    return BufferParts(codec, writer, episodes, writes, rng, store)


def build_storage(
    config: BufferConfig,
    codec: RowCodec,
    next_obs: str,
    links: NextObsLinks | None,
    allocate: Any = None,
    device: Any = None,
) -> Storage:
    """The store of a buffer of ``config`` whose rows are in format ``next_obs`` (never
    ``"auto"``), with the next-observation ``links`` of format ``"once"``: its arrays from
    ``allocate`` (a mapped folder's files; ``None``: NumPy), on ``device`` (``None``: host).
    A sharded buffer's learner builds one of capacity 1 to assemble its batches."""
    return make_store(
        config.layout,
        codec,
        config.capacity,
        # enough recycled batch blocks for two rounds of every trainer (one being consumed
        # while the next is gathered)
        2 * config.n_trainers + 2,
        config.batch_layout,
        links,
        config.batch_dtype,
        allocate,
        device,
        stores_next_obs=next_obs != "none",
    )


def check_device_options(device: Any, layout: str, in_files: bool, parallel_gather: Any) -> Any:
    """``device`` checked against the options a torch store cannot take (the reasons are
    :data:`marlbuf.stores.capabilities.CAPABILITIES`'); ``None`` stays ``None``."""
    if device is None:
        return None
    for feature, used in (
        ("layout='agent_major'", layout == "agent_major"),
        ("path=", in_files),
        ("parallel_gather=True", parallel_gather is True),
    ):
        if used:
            raise ValueError(refusal(feature, "torch", f"device={str(device)!r}"))
    from marlbuf.stores.torch import check_device

    return check_device(device)


def check_memory(
    needed: MemoryEstimate,
    specs: Mapping[str, AgentSpec],
    layout: str,
    next_obs: str,
    global_fields: Mapping[str, FieldSpec] | None = None,
    alive: bool = False,
    working: int = 0,
) -> None:
    """Refuse (``MemoryError``, naming the largest declared fields, listing every storage
    format that would fit, with its size, and the largest capacity that fits) or warn
    (:class:`marlbuf.memory.MemoryWarning`, a ``UserWarning``) before allocating a buffer that
    will not fit in the memory the OS and the process's limits leave available. ``next_obs`` is
    the format ``needed`` was estimated for; ``working`` the bytes the buffer allocates besides
    (its staging row)."""
    from marlbuf.memory import MemoryWarning, advice, largest_fields

    available = available_memory_bytes()
    if available is None:
        return
    gib = 1024**3
    total = needed.total_bytes + working
    if total > available:
        raise MemoryError(
            f"this buffer (next_obs={next_obs!r}, capacity={needed.capacity:,}) needs {needed} "
            f"(rows of {largest_fields(specs, global_fields)}) but only "
            f"{available / gib:.2f} GiB is available; "
            + advice(
                needed,
                available,
                specs,
                layout,
                global_fields=global_fields,
                alive=alive,
                next_obs=next_obs,
            )
            + " (marlbuf.memory.format_options lists every format's size)"
        )
    if total > _config.MEMORY_WARN_FRACTION * available:
        warnings.warn(
            f"this buffer needs {needed} of the {available / gib:.2f} GiB available; the "
            "machine may start swapping (marlbuf.memory.format_options lists smaller formats)",
            MemoryWarning,
            stacklevel=4,  # the front's constructor (check_memory < build_parts < _build)
        )


__all__ = [
    "BufferParts",
    "build_parts",
    "build_storage",
    "check_device_options",
    "check_memory",
]
