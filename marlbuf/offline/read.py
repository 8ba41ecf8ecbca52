"""Vaults into buffers: :func:`read_vault`, OG-MARL's keys as marlbuf's fields.

A vault's leaves are ``(B, T, ...)`` arrays; OG-MARL's map to a buffer's fields as
:data:`~marlbuf.offline.plan.DEFAULT_KEYS` says:

==================  ==========================  =========================================
vault key           shape                       marlbuf
==================  ==========================  =========================================
``observations``    ``(B, T, N, *O)``           ``obs`` (and ``next_obs``, see below)
``actions``         ``(B, T, N)`` int           discrete: ``AgentSpec(n_discrete_actions=K)``
                    ``(B, T, N, *A)`` float     continuous actions
``rewards``         ``(B, T, N)`` or ``(B, T)``  ``reward`` (a team reward goes to every agent)
``terminals``       ``(B, T, N)`` or ``(B, T)``  ``done``
``truncations``     ``(B, T, N)`` or ``(B, T)``  where episodes end without termination
``infos.legals``    ``(B, T, N, K)``            the extra field ``legals`` (action masks)
``infos.state``     ``(B, T, *S)``              the global field ``state``
==================  ==========================  =========================================

Agents come from the ``N`` axis (named ``agent_0``, ... or as the caller says). Each of the
``B`` streams is written as its own buffer stream, in time order. A step ends its episode when
every agent is terminal or truncated; the buffer is told ``truncated`` where that happens
without every agent terminal. ``next_obs`` of a step is the following step's ``obs`` (so with
``next_obs="once"`` observations are stored once); a vault holds no observation after the last
step of an episode, or of a stream, so there ``next_obs`` repeats the step's own ``obs``. Any
other leaf needs a place: ``keys={"infos.mask": "extra:mask"}`` (per agent),
``"global:name"`` (one per step), ``"alive"`` (per-agent presence flags) or ``None`` (left
out); a leaf without one is a ``ValueError`` naming it.

A vault marlbuf wrote (:mod:`marlbuf.offline.write`) is read as written, by its ``"marlbuf"``
entry (:mod:`marlbuf.offline.plan`). This module resolves the arguments into a plan and a
reader; :mod:`marlbuf.offline.fill` writes the chunks into the buffer, and
:mod:`marlbuf.offline.resumable` does so into a memory-mapped folder, resumably.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.offline.fill import fill, steps_per_chunk
from marlbuf.offline.plan import (
    NEXT_OBS,
    NEXT_OBS_AT,
    STREAMS,
    plan_foreign,
    plan_written,
    read_entry,
)
from marlbuf.offline.resumable import fill_folder
from marlbuf.offline.vault import (
    PRIVATE_ROWS,
    VaultError,
    VaultInfo,
    VaultReader,
    read_private_meta,
    vault_info,
)

#: How much data one chunk of a conversion holds, in memory (uncompressed, every leaf).
DEFAULT_CHUNK_BYTES = 16 * 1024**2
#: The largest capacity a written vault's entry may ask for beyond four times its steps.
MAX_SPARE_CAPACITY = 10_000_000
#: Options of the buffer that :func:`read_vault` sets itself.
SET_BY_THE_VAULT = ("specs", "global_fields", "alive")


def read_vault(
    vault: str | os.PathLike[str],
    *,
    agents: Sequence[str] | None = None,
    keys: Mapping[str, str | None] | None = None,
    n_actions: int | None = None,
    capacity: int | None = None,
    next_obs: str | None = None,
    path: str | os.PathLike[str] | None = None,
    resume: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool | Callable[[int, int], Any] = False,
    **buffer_options: Any,
) -> MultiAgentReplayBuffer:
    """Load a Flashbax vault (OG-MARL's datasets, or one :func:`write_vault` wrote) into a
    :class:`~marlbuf.MultiAgentReplayBuffer`, a chunk at a time.

    Parameters
    ----------
    vault : str or path-like
        The vault's folder, ``<base>/<name>/<uid>`` (``vaults/3m.vlt/Good``), the one holding
        ``metadata.json``.
    agents : sequence of str, optional
        Names for the ``N`` agents of the agent axis (default ``agent_0``, ... or, for a vault
        marlbuf wrote, its agents).
    keys : mapping of str to str or None, optional
        Where leaves go, on top of :data:`DEFAULT_KEYS`: ``{vault key: field}`` with field one
        of ``"obs"``, ``"action"``, ``"reward"``, ``"done"``, ``"truncated"``, ``"alive"``,
        ``"extra:NAME"``, ``"global:NAME"``, or ``None`` to leave the leaf out. A vault marlbuf
        wrote is read as written unless ``keys`` is given.
    n_actions : int, optional
        Discrete actions (integer ``actions``): how many; default the last axis of
        ``infos.legals``, else the largest stored action plus one.
    capacity : int, optional
        Default: every step of the vault (for a vault marlbuf wrote, the capacity of the buffer
        it came from when larger). A smaller one keeps the newest steps.
    next_obs : {"once", "stored", "none", "auto"}, optional
        The buffer's format (see :class:`~marlbuf.MultiAgentReplayBuffer`); default
        ``"once"`` (a vault marlbuf wrote: its buffer's).
    path : str or path-like, optional
        Convert into a memory-mapped buffer in this new folder (for vaults larger than
        memory): resident memory stays bounded by ``chunk_bytes`` and the buffer's metadata
        (write generations, next-observation links: about 24 bytes per step), not by the
        vault. The conversion works in a folder beside it (``.<name>.vault-import``) that
        becomes ``path`` only when complete; if it is interrupted (an exception, Ctrl-C, the
        process killed), calling ``read_vault`` again with the same arguments continues where
        it stopped (``resume=True``), or is refused (``resume=False``, or another vault or
        other options): a half-converted buffer is never taken for a complete one.
    resume : bool, default True
        With ``path``: continue an interrupted conversion of the same vault with the same
        arguments.
    chunk_bytes : int
        Uncompressed bytes of vault data converted at a time (two chunks are in memory: one
        converted while the next is read).
    progress : bool or callable
        ``True`` shows progress (tqdm when installed, else lines on stderr); a callable gets
        ``(steps done, steps in all)`` after every chunk.
    **buffer_options
        Further arguments of :class:`~marlbuf.MultiAgentReplayBuffer` (``sampler``, ``seed``,
        ``layout``, ``n_trainers``, ``batch_layout``, ``batch_dtype``, ``durable``, ...).

    Returns
    -------
    MultiAgentReplayBuffer
        Steps of each stream in time order, streams one after another a chunk at a time
        (stream ``b`` of the vault is buffer stream ``b``).

    Raises
    ------
    VaultError
        A damaged, truncated, crafted or mismatched vault, or another major version: before
        anything is written to a buffer where it can be seen, and the buffer is discarded
        (with ``path``: the partial conversion stays in its work folder, never at ``path``).
    ValueError
        A leaf without a field, a field without a leaf, or invalid arguments.
    """
    info = vault_info(vault)
    for name in SET_BY_THE_VAULT:
        if name in buffer_options:
            raise TypeError(f"read_vault sets {name}= from the vault; got {name}= as well")
    chunk_steps = steps_per_chunk(info, chunk_bytes)
    entry = read_entry(info) if keys is None else None
    if entry is not None:
        plan = plan_written(info, entry, agents)
    else:
        plan = plan_foreign(info, keys, agents, n_actions, chunk_steps)
    total = info.steps * info.streams
    if capacity is None:
        capacity = max(1, total, _written_capacity(info, entry) if entry else 0)
    if next_obs is None:
        next_obs = str(entry.get("next_obs", "once")) if entry else "once"
    private = []
    side_rows = 0
    if plan.entry is not None:
        declared = plan.entry.get("private", [])
        if not isinstance(declared, list) or not set(declared) <= {NEXT_OBS, NEXT_OBS_AT, STREAMS}:
            raise VaultError(f"vault {str(info.path)!r}: its 'marlbuf' entry is damaged (private)")
        private = [n for n in (NEXT_OBS, NEXT_OBS_AT, STREAMS) if n in declared]
        if private:
            for name in private:
                read_private_meta(info, name)
            private.append(PRIVATE_ROWS)
    # a vault chunk that two conversion chunks share stays cached, so it is decoded once
    cache = 2 * sum(
        leaf.chunks[0] * leaf.chunk_steps * leaf.step_bytes for leaf in info.leaves.values()
    )
    reader = VaultReader(info, list(plan.roles), cache_bytes=cache, private=private)
    if NEXT_OBS in reader.private and plan.entry is not None:
        counts = reader.read_private(PRIVATE_ROWS, slice(None))
        declared = list(plan.entry["private"])
        if counts.shape != (len(declared),):
            raise VaultError(f"vault {str(info.path)!r}: {PRIVATE_ROWS!r} is damaged")
        side_rows = int(min(counts[declared.index(NEXT_OBS)], counts[declared.index(NEXT_OBS_AT)]))
    options = dict(
        buffer_options,
        next_obs=next_obs,
        global_fields=plan.global_fields,
        alive=plan.alive,
    )
    if path is None:
        buffer = MultiAgentReplayBuffer(plan.specs, capacity, **options)
        fill(info, plan, buffer, reader, side_rows, chunk_steps, 0, progress, None)
        return buffer
    return fill_folder(
        info, plan, Path(path), capacity, options, reader, side_rows, chunk_steps, progress, resume
    )


def _written_capacity(info: VaultInfo, entry: Mapping[str, Any]) -> int:
    """The capacity of the buffer a vault was written from: the default capacity when it
    reads back (a crafted entry cannot make it allocate more than its data needs by much)."""
    capacity = entry.get("capacity", 0)
    steps = info.steps * info.streams
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise VaultError(f"vault {str(info.path)!r}: its 'marlbuf' entry has capacity {capacity!r}")
    if capacity > max(MAX_SPARE_CAPACITY, 4 * steps):
        raise VaultError(
            f"vault {str(info.path)!r}: its 'marlbuf' entry asks for a capacity of {capacity:,} "
            f"for {steps:,} stored steps; pass capacity= to choose one"
        )
    return capacity
