"""Filling a buffer from a vault, a chunk at a time: the engine of ``read_vault``.

Chunks are read ahead (the next one decoded by TensorStore's threads while one is converted),
each stream's steps written in turn, in ``extend`` calls of about :data:`EXTEND_BYTES` of data.
Episode ends are where every agent is terminal or truncated; ``next_obs`` is the following
step's obs, replaced where the vault's private table says otherwise or, in a foreign vault, at
episode ends by the step's own obs. A filled buffer that was interrupted continues where its
writes end (``skip``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.offline.plan import NEXT_OBS, NEXT_OBS_AT, STREAMS, Plan, broadcast
from marlbuf.offline.progress import Progress
from marlbuf.offline.vault import VaultError, VaultInfo, VaultReader

#: Vault data per ``extend`` call: staging rows of a few MiB stay in the caches (measured:
#: 8,192-step calls of 3-agent rows took 0.45x the time of 250,000-step calls).
EXTEND_BYTES = 2 * 1024**2
#: Rows of the private next-observation table read at a time.
SIDE_ROWS_PER_READ = 65_536


class _SideTable:
    """The private next observations of a written vault, read in order, a block at a time."""

    def __init__(self, reader: VaultReader, rows: int, info: VaultInfo) -> None:
        self.reader = reader
        self.rows = rows
        self.info = info
        self.next_row = 0
        self.at = np.zeros((0, 2), np.int64)
        self.values: np.ndarray | None = None
        self.last = (-1, -1)

    def _more(self) -> bool:
        if self.next_row >= self.rows:
            return False
        stop = min(self.rows, self.next_row + SIDE_ROWS_PER_READ)
        at = self.reader.read_private(NEXT_OBS_AT, slice(self.next_row, stop)).astype(np.int64)
        values = self.reader.read_private(NEXT_OBS, slice(self.next_row, stop))
        keys = at[:, 1] * self.info.streams + at[:, 0]
        if (
            at.ndim != 2
            or at.shape[1] != 2
            or (at < 0).any()
            or (at[:, 0] >= self.info.streams).any()
            or (np.diff(keys) <= 0).any()
            or (len(keys) and keys[0] <= self.last[1] * self.info.streams + self.last[0])
        ):
            raise VaultError(
                f"vault {str(self.info.path)!r}: {NEXT_OBS_AT!r} does not list (stream, step) "
                "pairs in order (damaged vault)"
            )
        self.last = (int(at[-1, 0]), int(at[-1, 1]))
        self.at = np.concatenate([self.at, at])
        self.values = values if self.values is None else np.concatenate([self.values, values])
        self.next_row = stop
        return True

    def take(self, t1: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The entries of steps before ``t1`` not taken yet: ``(stream, step)`` rows and their
        observations."""
        while (not len(self.at) or self.at[-1, 1] < t1) and self._more():
            pass
        cut = int(np.searchsorted(self.at[:, 1], t1))
        at, self.at = self.at[:cut], self.at[cut:]
        if self.values is None:
            return at, None
        values, self.values = self.values[:cut], self.values[cut:]
        return at, values


@dataclass
class _Chunk:
    """One conversion step: steps ``[t0, t1)`` of every stream."""

    t0: int
    t1: int
    data: dict[str, np.ndarray]


class _Converter:
    """Writes vault chunks into a buffer, stream by stream (each stream's steps in order)."""

    def __init__(
        self,
        info: VaultInfo,
        plan: Plan,
        buffer: MultiAgentReplayBuffer,
        reader: VaultReader,
        side: _SideTable | None,
        skip: int,
    ) -> None:
        self.info, self.plan, self.buffer, self.reader, self.side = info, plan, buffer, reader, side
        self.with_next = buffer.next_obs != "none"
        self.exact = plan.entry is not None
        self.obs_key = plan.key_of("obs")
        #: steps already in the buffer (a resumed conversion): those writes are skipped
        self.skip = skip
        self.written = 0
        #: steps per ``extend`` call
        per_step = sum(leaf.step_bytes for leaf in info.leaves.values())
        self.piece = max(1, EXTEND_BYTES // max(1, per_step))

    def convert(self, chunk: _Chunk) -> None:
        """Write every stream's steps of ``chunk`` (each stream's steps in order)."""
        plan, n_agents = self.plan, len(self.plan.agents)
        n = chunk.t1 - chunk.t0
        side_at, side_values = (
            self.side.take(chunk.t1)
            if self.side is not None
            else (np.zeros((0, 2), np.int64), None)
        )
        done_key, trunc_key = plan.key_of("done"), plan.key_of("truncated")
        assert done_key is not None and self.obs_key is not None
        streams = None
        if STREAMS in self.reader.private:
            streams = self.reader.read_private(STREAMS, slice(chunk.t0, chunk.t1))
        for b in range(self.info.streams):
            data = {k: v[b] for k, v in chunk.data.items()}
            terminal = broadcast(data[done_key], n_agents) != 0
            ends = terminal.copy()
            if trunc_key is not None:
                ends |= broadcast(data[trunc_key], n_agents) != 0
            ends = ends.all(axis=1)
            truncated = ends & ~terminal.all(axis=1)
            obs_all = data[self.obs_key]  # with the step after the chunk, where there is one
            data[self.obs_key] = obs_all[:n]
            fields: dict[str, Any] = {}
            for key, role in plan.roles.items():
                leaf = data[key]
                if role in ("obs", "action") or role.startswith("extra:"):
                    value: Any = self._agents(key, leaf)
                elif role in ("reward", "done"):
                    part = broadcast(leaf, n_agents)
                    value = {
                        a: part[:, i].astype(plan.specs[a].dtype(role), copy=False)
                        for i, a in enumerate(plan.agents)
                    }
                elif role == "alive":
                    value = {a: leaf[:, i] != 0 for i, a in enumerate(plan.agents)}
                elif role.startswith("global:"):
                    value = leaf
                else:  # truncated: given as the episode ends above
                    continue
                name = role.partition(":")[2] if ":" in role else role
                fields[name] = value
            successor = None
            if self.with_next:
                successor = self._successor(obs_all, n, ends, side_at, side_values, b, chunk.t0)
            self._extend(fields, truncated, b, n, streams, successor)

    def _successor(
        self,
        obs_all: np.ndarray,
        n: int,
        ends: np.ndarray,
        side_at: np.ndarray,
        side_values: np.ndarray | None,
        stream: int,
        t0: int,
    ) -> Callable[[int, int], dict[str, np.ndarray]]:
        """``next_obs`` of steps ``[lo, hi)`` of the chunk, per agent: the following step's
        obs, replaced where the vault says otherwise (marlbuf's private table) or holds nothing
        after the step (an episode's last step, the stream's last step: the step's own obs)."""
        if self.exact and side_values is not None:
            mine = side_at[:, 0] == stream
            rows, values = side_at[mine, 1] - t0, side_values[mine]
        else:
            rows = np.flatnonzero(ends)
            values = obs_all[rows]
        if len(obs_all) == n and (not len(rows) or rows[-1] != n - 1):
            rows = np.append(rows, n - 1)  # nothing follows the stream's last step
            values = np.concatenate([values, obs_all[n - 1 : n]])
        obs_key = self.obs_key
        assert obs_key is not None

        def piece(lo: int, hi: int) -> dict[str, np.ndarray]:
            out = np.empty_like(obs_all[lo:hi])
            have = min(hi, len(obs_all) - 1) - lo
            out[:have] = obs_all[lo + 1 : lo + 1 + have]
            a, z = np.searchsorted(rows, [lo, hi])
            out[rows[a:z] - lo] = values[a:z]
            return self._agents(obs_key, out)

        return piece

    def _agents(self, key: str, leaf: np.ndarray) -> dict[str, np.ndarray]:
        parts = self.plan.packings[key].unpack(leaf, self.exact)
        return dict(zip(self.plan.agents, parts))

    def _extend(
        self,
        fields: dict[str, Any],
        truncated: np.ndarray,
        stream: int,
        n: int,
        streams: np.ndarray | None,
        successor: Callable[[int, int], dict[str, np.ndarray]] | None,
    ) -> None:
        """``extend`` the ``n`` steps, in runs of one stream each, each run in pieces of at most
        :attr:`piece` steps (staging rows that stay in the caches are written much faster)."""
        if streams is None:
            runs = [(0, n, stream)]
        else:
            cuts = np.flatnonzero(np.diff(streams)) + 1
            bounds = [0, *cuts.tolist(), n]
            runs = [(lo, hi, int(streams[lo])) for lo, hi in itertools.pairwise(bounds)]
        pieces = [
            (start, min(hi, start + self.piece), s)
            for lo, hi, s in runs
            for start in range(lo, hi, self.piece)
        ]
        for lo, hi, s in pieces:
            steps = hi - lo
            if self.written + steps <= self.skip:  # written before the interruption
                self.written += steps
                continue
            if self.written < self.skip:
                raise VaultError(
                    f"the buffer being filled holds {self.skip} steps, which is not where a "
                    "write of this conversion ends: it was not written by this conversion"
                )
            part = {name: _rows(value, lo, hi) for name, value in fields.items()}
            if successor is not None:
                part["next_obs"] = successor(lo, hi)
            self.buffer.extend(stream=s, truncated=truncated[lo:hi], **part)
            self.written += steps


def _rows(value: Any, lo: int, hi: int) -> Any:
    if isinstance(value, dict):
        return {k: v[lo:hi] for k, v in value.items()}
    return value[lo:hi]


def steps_per_chunk(info: VaultInfo, chunk_bytes: int) -> int:
    """Steps per conversion chunk: ``chunk_bytes`` of data, in whole chunks of the widest
    leaf where that fits (a vault chunk is then decoded once)."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)):
        raise TypeError(f"chunk_bytes must be an int; got chunk_bytes={chunk_bytes!r}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive; got chunk_bytes={chunk_bytes}")
    steps = max(1, int(chunk_bytes) // max(1, info.step_bytes))
    widest = max(info.leaves.values(), key=lambda leaf: leaf.step_bytes).chunk_steps
    return steps - steps % widest if steps >= widest else steps


def _chunks(
    reader: VaultReader, steps: int, chunk_steps: int, start: int, obs_key: str
) -> Iterator[_Chunk]:
    """The conversion chunks from step ``start`` on (with the step after each chunk of the
    observations leaf, for the last step's ``next_obs``); the next chunk is being read and
    decoded by TensorStore's threads while the caller converts one."""
    bounds = [(t0, min(steps, t0 + chunk_steps)) for t0 in range(start, steps, chunk_steps)]
    if not bounds:
        return
    pending = reader.start(*bounds[0], one_more=(obs_key,))
    for k, (t0, t1) in enumerate(bounds):
        data = reader.finish(pending)
        if k + 1 < len(bounds):
            pending = reader.start(*bounds[k + 1], one_more=(obs_key,))
        yield _Chunk(t0, t1, data)


def fill(
    info: VaultInfo,
    plan: Plan,
    buffer: MultiAgentReplayBuffer,
    reader: VaultReader,
    side_rows: int,
    chunk_steps: int,
    skip: int,
    progress: Any,
    after_chunk: Callable[[], Any] | None,
) -> None:
    side = _SideTable(reader, side_rows, info) if NEXT_OBS in reader.private else None
    # a resumed conversion starts at the chunk it was writing (each chunk writes every
    # stream's steps in turn: chunk_steps * streams steps, the last chunk fewer)
    first = skip // (chunk_steps * info.streams)
    start = min(info.steps, first * chunk_steps)
    if side is not None:
        side.take(start)
    converter = _Converter(info, plan, buffer, reader, side, skip - start * info.streams)
    shown = Progress(progress, info.steps * info.streams, f"vault {info.path.name}")
    if start:
        shown.update(start * info.streams)
    try:
        assert converter.obs_key is not None
        for chunk in _chunks(reader, info.steps, chunk_steps, start, converter.obs_key):
            converter.convert(chunk)
            if after_chunk is not None:
                after_chunk()
            shown.update((chunk.t1 - chunk.t0) * info.streams)
    finally:
        shown.close()
    if converter.written < converter.skip:
        raise VaultError(
            f"the buffer being filled holds {skip} steps, more than this conversion writes: "
            "it was not written by this conversion"
        )
