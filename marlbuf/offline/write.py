"""Buffers into vaults: :func:`write_vault`.

A buffer is written oldest step first as one stream (``B = 1``) with OG-MARL's keys (the leaves
of :data:`~marlbuf.offline.plan.DEFAULT_KEYS`, laid out by
:func:`~marlbuf.offline.plan.buffer_leaves`; every per-agent field of agents whose shapes
differ flattened and zero-padded to the widest, as OG-MARL pads observations; discrete actions
as indices when every stored action is one-hot) and a ``"marlbuf"`` entry in ``metadata.json``
with the buffer's specs and options. Private arrays, which Flashbax never reads, hold what
OG-MARL's keys cannot: the true ``next_obs`` of every step whose ``next_obs`` is not the
following step's ``obs`` (episode ends), and each step's stream when the buffer's episodes
interleave (environments written in turn, ``add_envs``). Reading such a vault back gives the
same rows in the same order, the same episodes, masks and global state.
"""

from __future__ import annotations

import heapq
import math
import os
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.offline.plan import (
    ENTRY_FORMAT,
    ENTRY_VERSION,
    NEXT_OBS,
    NEXT_OBS_AT,
    STREAMS,
    Packing,
    buffer_leaves,
)
from marlbuf.offline.progress import Progress
from marlbuf.offline.vault import LeafSpec, VaultWriter

#: Buffer rows gathered and written per append by :func:`write_vault`.
WRITE_CHUNK_BYTES = 64 * 1024**2


def _write_order(buffer: MultiAgentReplayBuffer) -> np.ndarray:
    """The filled slots, oldest first."""
    size, capacity = buffer.size, buffer.capacity
    if size < capacity:
        return np.arange(size, dtype=np.int64)
    return (np.arange(size, dtype=np.int64) + buffer.cursor) % capacity


def _exact_one_hot(buffer: MultiAgentReplayBuffer, chunk: int) -> bool:
    """Whether every agent is discrete and every stored action one-hot (so indices keep it)."""
    if not all(s.n_discrete_actions for s in buffer.specs.values()):
        return False
    for values in buffer.stored("action").values():
        for lo in range(0, len(values), chunk):
            part = np.asarray(values[lo : lo + chunk])
            if not (((part == 0) | (part == 1)).all() and (part.sum(axis=1) == 1).all()):
                return False
    return True


def _episode_layout(
    buffer: MultiAgentReplayBuffer, order: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """From the buffer's episode index: whether each step (in write ``order``) ends its
    episode, and each step's stream when episodes interleave (``None`` when they do not)."""
    index = buffer.episodes
    if index is None:
        return None, None
    episode = index.episode[order]
    open_ids = {int(entry[0]) for entry in index.open.values()}
    last = index.next_slot[order] < 0
    if open_ids:
        last &= ~np.isin(episode, np.fromiter(open_ids, np.int64))
    ids, first = np.unique(episode, return_index=True)
    _, last_rev = np.unique(episode[::-1], return_index=True)
    final = len(episode) - 1 - last_rev
    if open_ids:  # an unfinished episode keeps its stream: nothing may continue it
        final[np.isin(ids, np.fromiter(open_ids, np.int64))] = len(episode)
    spans = sorted(zip(first.tolist(), final.tolist(), range(len(ids))))
    stream_of = np.zeros(len(ids), np.int64)
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (last position, stream)
    streams_used = 0
    for start, stop, k in spans:
        while busy and busy[0][0] < start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            s = heapq.heappop(free)
        else:
            s, streams_used = streams_used, streams_used + 1
        stream_of[k] = s
        heapq.heappush(busy, (stop, s))
    if streams_used <= 1:
        return last, None
    position = np.searchsorted(ids, episode)
    return last, stream_of[position].astype(np.int32)


def write_vault(
    buffer: MultiAgentReplayBuffer,
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    compression: Mapping[str, Any] | None = None,
    chunk_bytes: int = WRITE_CHUNK_BYTES,
    progress: bool | Callable[[int, int], Any] = False,
) -> Path:
    """Write a buffer's stored steps as a Flashbax vault (format 1.2) with OG-MARL's keys.

    The vault is written into a temporary folder beside ``path`` and renamed to ``path`` when
    complete, so ``path`` never holds half a vault. Flashbax's ``Vault(vault_name, rel_dir,
    vault_uid).read()`` reads it with ``path = rel_dir/vault_name/vault_uid``;
    :func:`read_vault` reads it back exactly (see the module docstring).

    Parameters
    ----------
    buffer : MultiAgentReplayBuffer
        Written oldest step first (a buffer that has wrapped around reads back with its oldest
        step in slot 0). Steps of an episode whose first steps the ring has overwritten read
        back as a shorter episode.
    path : str or path-like
        The vault's folder, ``<base>/<name>/<uid>``; must not exist (missing parents are
        created).
    metadata : mapping, optional
        Further JSON-safe keys of ``metadata.json`` (``"marlbuf"`` is marlbuf's own).
    compression : mapping, optional
        The zarr compressor (default Flashbax's, gzip level 5; ``{"id": "zstd", "level": 3}``
        writes and reads faster).
    chunk_bytes : int
        Steps are gathered from the buffer and written about this many bytes (of the buffer's
        rows) at a time; TensorStore compresses one such range while the next is gathered
        (larger ranges keep more of its threads busy: measured 1.45x the time of one whole
        write at 16 MiB, 1.07x at 64 MiB).
    progress : bool or callable
        As for :func:`read_vault`.

    Returns
    -------
    Path
        The vault's folder.
    """
    if not isinstance(buffer, MultiAgentReplayBuffer):
        raise TypeError(f"buffer must be a MultiAgentReplayBuffer; got {type(buffer).__name__}")
    final = Path(path).absolute()
    if final.exists() or final.is_symlink():
        raise FileExistsError(f"{str(final)!r} already exists; a vault is written to a new folder")
    if metadata is not None and "marlbuf" in metadata:
        raise ValueError("metadata may not set 'marlbuf' (marlbuf's own entry)")
    with buffer.writer.lock:
        return _write(buffer, final, metadata, compression, chunk_bytes, progress)


def _write(
    buffer: MultiAgentReplayBuffer,
    final: Path,
    metadata: Mapping[str, Any] | None,
    compression: Mapping[str, Any] | None,
    chunk_bytes: int,
    progress: Any,
) -> Path:
    specs = buffer.specs
    agents = list(specs)
    size = buffer.size
    row_bytes = max(1, buffer.nbytes // max(1, buffer.capacity))
    chunk = max(1, int(chunk_bytes) // row_bytes)
    action_index = _exact_one_hot(buffer, chunk)
    layout = buffer_leaves(specs, buffer.global_fields, buffer.alive, action_index)
    order = _write_order(buffer)
    ends, streams = _episode_layout(buffer, order)
    with_next = buffer.next_obs != "none"
    obs_packing = layout["observations"][2]
    assert obs_packing is not None
    private: dict[str, LeafSpec] = {}
    if with_next:
        private[NEXT_OBS] = LeafSpec(obs_packing.step_shape, obs_packing.dtype)
        private[NEXT_OBS_AT] = LeafSpec((2,), np.dtype(np.int64))
    if streams is not None:
        private[STREAMS] = LeafSpec((), np.dtype(np.int32))
    entry = {
        "format": ENTRY_FORMAT,
        "version": ENTRY_VERSION,
        "agents": agents,
        "specs": {a: s.to_dict() for a, s in specs.items()},
        "global_fields": {n: f.to_dict() for n, f in buffer.global_fields.items()},
        "alive": buffer.alive,
        "action_index": action_index,
        "next_obs": buffer.next_obs,
        "capacity": buffer.capacity,
        "layout": buffer.layout,
        "fields": {k: role for k, (role, _, _) in layout.items()},
        "private": list(private),
    }
    tmp = final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer = VaultWriter(
            tmp,
            {k: spec for k, (_, spec, _) in layout.items()},
            1,
            {"marlbuf": entry, **dict(metadata or {})},
            compression,
            private,
            chunk_bytes=min(int(chunk_bytes), 4 * 1024**2),
        )
        step = max(writer.chunk_steps, chunk - chunk % writer.chunk_steps)
        shown = Progress(progress, size, f"vault {final.name}")
        try:
            for lo in range(0, size, step):
                hi = min(size, lo + step)
                _write_chunk(buffer, writer, layout, order, (lo, hi), ends, streams, action_index)
                shown.update(hi - lo)
        finally:
            shown.close()
        writer.close()
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_chunk(
    buffer: MultiAgentReplayBuffer,
    writer: VaultWriter,
    layout: Mapping[str, tuple[str, LeafSpec, Packing | None]],
    order: np.ndarray,
    span: tuple[int, int],
    ends: np.ndarray | None,
    streams: np.ndarray | None,
    action_index: bool,
) -> None:
    """Steps ``span = (lo, hi)`` of write ``order`` (and the step after them, for its obs)."""
    lo, hi = span
    n = hi - lo
    following = int(hi < len(order))
    batch = buffer.gather(order[lo : hi + following])
    agents = list(buffer.specs)
    _, obs_spec, obs_packing = layout["observations"]
    assert obs_packing is not None
    obs_all = np.empty((n + following, *obs_spec.step_shape), obs_spec.dtype)
    obs_packing.pack_field(batch, "obs", obs_all, n + following)
    steps: dict[str, np.ndarray] = {"observations": obs_all[:n]}
    all_done = (batch.concat("done")[:n] != 0).all(axis=1)
    private: dict[str, np.ndarray] = {}
    same = np.zeros(n, bool)
    with_next = buffer.next_obs != "none"
    if with_next:
        next_obs = np.empty((n, *obs_spec.step_shape), obs_spec.dtype)
        obs_packing.pack_field(batch, "next_obs", next_obs, n)
        # compared as stored bytes, as the buffer links next observations
        m = n - 1 + following
        same[:m] = (_words(next_obs[:m]) == _words(obs_all[1 : m + 1])).all(axis=1)
        where = np.flatnonzero(~same)
        private[NEXT_OBS] = next_obs[where]
        private[NEXT_OBS_AT] = np.stack([np.zeros_like(where), where + lo], axis=1)
    if ends is not None:
        end = ends[lo:hi]
    elif with_next:
        end = all_done | ~same
        if not following:
            end[-1] = all_done[-1]  # the newest step: its episode may go on
    else:
        end = all_done
    truncated = (end & ~all_done).astype(np.float32)
    for key, (role, spec, packing) in layout.items():
        if key == "observations":
            continue
        out = np.empty((n, *spec.step_shape), spec.dtype)
        if role == "truncated":
            out[...] = truncated[:, None]
        elif role == "action" and action_index:
            sizes = {buffer.specs[a].n_discrete_actions for a in agents}
            if len(sizes) == 1:  # every agent's one-hot side by side: one argmax
                one_hot = batch.concat("action")[:n].reshape(n, len(agents), -1)
                out[...] = one_hot.argmax(axis=2)
            else:
                for i, a in enumerate(agents):
                    out[:, i] = batch.action[a][:n].argmax(axis=1)
        elif role in ("action", "reward", "done") or role.startswith("extra:"):
            assert packing is not None
            packing.pack_field(batch, role.partition(":")[2] or role, out, n)
        elif role == "alive":
            assert batch.alive is not None
            for i, a in enumerate(agents):
                out[:, i] = batch.alive[a][:n]
        else:
            out[...] = batch.globals[role.partition(":")[2]][:n]
        steps[key] = out
    if streams is not None:
        private[STREAMS] = streams[lo:hi]
    writer.append({k: v[None] for k, v in steps.items()}, private)


def _words(values: np.ndarray) -> np.ndarray:
    """``values`` (shape (n, ...)) as rows of unsigned words, the widest that divide a row (so
    that comparing rows compares their bytes, in as few comparisons as possible)."""
    row = math.prod(values.shape[1:]) * values.dtype.itemsize
    size = next(w for w in (8, 4, 2, 1) if row % w == 0)
    flat = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), row)
    return flat.view(f"<u{size}")
