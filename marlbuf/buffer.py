"""The multi-agent replay buffer: writer (ring + write generations), storage, sampler."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marlbuf import _config, persistence
from marlbuf.batch import Batch
from marlbuf.samplers import Sampler, Uniform
from marlbuf.spec import FIELDS, AgentSpec, normalize_specs
from marlbuf.staging import RowCodec, RowViews, steps_of
from marlbuf.storage import Storage, make_storage


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A ``Generator`` from a seed, an existing generator, or fresh entropy (``None``)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        return np.random.default_rng(seed)
    raise TypeError(f"seed must be an int, a numpy Generator or None; got seed={seed!r}")


class MultiAgentReplayBuffer:
    """A ring buffer of joint multi-agent transitions with pluggable layout and sampler.

    Parameters
    ----------
    specs : mapping of str to AgentSpec
        One spec per agent, in agent order (agents may differ in shapes and dtypes).
    capacity : int
        Number of joint transitions (timesteps) kept; the oldest is overwritten first.
    layout : {"interleaved", "agent_major"}
        ``"interleaved"``: one row per timestep holding every agent's fields, one gather per
        batch. ``"agent_major"``: per-agent, per-field arrays (the classic layout).
    sampler : Sampler, default ``Uniform(replace=True)``
        How indices are drawn (:mod:`marlbuf.samplers`).
    seed : int, numpy Generator or None
        Source of randomness; the same seed gives the same indices.
    n_trainers : int, optional
        Trainers that sample with their own index array (and, for prioritized samplers, their
        own priority tree). Defaults to the number of agents, as in MADDPG.
    parallel_gather : bool, default False
        Opt-in: gathers of at least ``_config.PARALLEL_GATHER_MIN_BYTES`` use Numba's threads.
        Measured 1.4x on the 24-agent round of a quiet 2-core machine; it needs an idle core
        (keep torch at one thread) and is a runtime setting, not saved with the buffer.

    Examples
    --------
    >>> import numpy as np
    >>> from marlbuf import AgentSpec, MultiAgentReplayBuffer
    >>> from marlbuf.samplers import Neighbor
    >>> specs = {f"agent_{i}": AgentSpec(obs_shape=(18,), action_shape=(5,)) for i in range(3)}
    >>> buf = MultiAgentReplayBuffer(specs, capacity=1000, sampler=Neighbor(run_length=4), seed=0)
    >>> z = lambda *s: {a: np.zeros((64, *s), np.float32) for a in specs}
    >>> buf.extend(obs=z(18), action=z(5), reward=z(), next_obs=z(18), done=z())
    >>> batch = buf.sample(32)
    >>> batch.obs["agent_0"].shape, len(buf)
    ((32, 18), 64)
    """

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        layout: str = "interleaved",
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
        n_trainers: int | None = None,
        parallel_gather: bool = False,
    ) -> None:
        self.specs = normalize_specs(specs)
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int; got capacity={capacity!r}")
        if capacity <= 0:
            raise ValueError(f"capacity must be positive; got capacity={capacity}")
        if sampler is None:
            sampler = Uniform()
        if not isinstance(sampler, Sampler):
            raise TypeError(
                "sampler must be a marlbuf.samplers.Sampler (e.g. Uniform(), Neighbor(64)); "
                f"got sampler={sampler!r}"
            )
        if n_trainers is None:
            n_trainers = len(self.specs)
        if isinstance(n_trainers, bool) or not isinstance(n_trainers, (int, np.integer)):
            raise TypeError(f"n_trainers must be an int; got n_trainers={n_trainers!r}")
        if n_trainers < 1:
            raise ValueError(f"n_trainers must be >= 1; got n_trainers={n_trainers}")
        self.capacity = int(capacity)
        self.n_trainers = int(n_trainers)
        # enough recycled batch blocks for two rounds of every trainer (one being consumed
        # while the next is gathered)
        pool_blocks = 2 * self.n_trainers + 2
        self._codec = RowCodec(self.specs)  # validation + staging of add/extend
        self.storage: Storage = make_storage(
            layout, self.specs, self.capacity, pool_blocks, self._codec
        )
        if not isinstance(parallel_gather, (bool, np.bool_)):
            raise TypeError(
                f"parallel_gather must be a bool; got parallel_gather={parallel_gather!r}"
            )
        self.storage.parallel_gather = bool(parallel_gather)
        self.sampler = sampler
        self.sampler.bind(self.capacity, self.n_trainers)
        self.rng = make_rng(seed)
        self.cursor = 0  # next slot to write (the oldest slot once full)
        self.size = 0  # filled slots
        self.total_writes = 0  # transitions ever written; also the next write generation
        # write generation of each slot: the value of total_writes when the slot was written
        self.write_generation = np.full(self.capacity, -1, dtype=np.int64)

    # ----------------------------------------------------------------------------- basics
    @property
    def layout(self) -> str:
        """``"interleaved"`` or ``"agent_major"``."""
        return self.storage.layout

    @property
    def agents(self) -> list[str]:
        """Agent names in spec order."""
        return list(self.specs)

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage arrays."""
        return self.storage.nbytes

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return (
            f"MultiAgentReplayBuffer(agents={len(self.specs)}, capacity={self.capacity}, "
            f"size={self.size}, layout={self.layout!r}, sampler={self.sampler!r})"
        )

    # ----------------------------------------------------------------------------- writing
    def add(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any,
        done: Any,
    ) -> None:
        """Store one timestep of every agent.

        Each argument is a dict keyed by agent name (what a PettingZoo parallel env returns) or
        a sequence in agent order. ``obs``/``next_obs`` items have shape ``obs_shape``,
        ``action`` items ``action_shape`` (or an int for a discrete agent), ``reward`` and
        ``done`` items are scalars (bools accepted for ``done``). Nothing is written unless every
        value is valid.
        """
        fields = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs}
        fields["done"] = done
        rows, views = self._codec.stage(fields, None)
        self._commit(rows, views, 1)

    def extend(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any,
        done: Any,
    ) -> None:
        """Store ``T`` timesteps at once: like :meth:`add`, each item with a leading time axis
        (``obs[agent]`` of shape ``(T, *obs_shape)``, ``reward[agent]`` of shape ``(T,)``).

        With ``T > capacity`` only the last ``capacity`` timesteps remain, as if added one by
        one. Nothing is written unless every value is valid.
        """
        fields = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs}
        fields["done"] = done
        steps = steps_of(self._codec, fields)
        rows, views = self._codec.stage(fields, steps)
        self._commit(rows, views, steps)

    def _commit(self, rows: np.ndarray, views: RowViews, steps: int) -> None:
        skip = max(0, steps - self.capacity)  # older steps would be overwritten at once
        if skip:
            rows = rows[skip:]
            views = {f: {a: x[skip:] for a, x in per.items()} for f, per in views.items()}
        count = steps - skip
        start = (self.cursor + skip) % self.capacity
        slots = (start + np.arange(count, dtype=np.int64)) % self.capacity  # wraps past the end
        self.storage.write(slots, rows, views)
        self.write_generation[slots] = self.total_writes + skip + np.arange(count, dtype=np.int64)
        self.total_writes += steps
        self.cursor = (self.cursor + steps) % self.capacity
        self.size = min(self.size + steps, self.capacity)
        self.sampler.on_write(slots)

    # ----------------------------------------------------------------------------- sampling
    def _check_trainer(self, trainer: Any) -> int:
        if isinstance(trainer, bool) or not isinstance(trainer, (int, np.integer)):
            raise TypeError(f"trainer must be an int; got trainer={trainer!r}")
        if not 0 <= trainer < self.n_trainers:
            raise ValueError(
                f"trainer must be in [0, {self.n_trainers}) (n_trainers={self.n_trainers}); "
                f"got trainer={trainer}"
            )
        return int(trainer)

    def sample(self, batch_size: int, trainer: int = 0, out: Batch | None = None) -> Batch:
        """Draw one batch of ``batch_size`` joint transitions with the buffer's sampler.

        Parameters
        ----------
        batch_size : int
            Rows in the batch.
        trainer : int, default 0
            Which trainer's sampler state (priority tree) to use.
        out : Batch, optional
            A batch of the same size from an earlier call whose arrays are overwritten instead
            of allocating new ones.
        """
        trainer = self._check_trainer(trainer)
        batch_size = self.sampler.check_batch_size(batch_size)
        indices, weights = self.sampler.sample(batch_size, self.size, self.rng, trainer)
        return self._gather(indices, weights, trainer, out)

    def sample_for_trainers(
        self,
        batch_size: int,
        n_trainers: int | None = None,
        shared_index: bool = False,
        out: Sequence[Batch] | None = None,
    ) -> list[Batch]:
        """The MADDPG sampling round: per trainer, one index array and the joint batch of all
        agents at those indices (the O(N²B) workload of Gogineni et al.).

        Parameters
        ----------
        batch_size : int
            Rows per trainer.
        n_trainers : int, optional
            Defaults to the buffer's ``n_trainers`` (one per agent).
        shared_index : bool, default False
            Draw one index array and give the same batch to every trainer (as EPyMARL and
            BenchMARL do). **A deviation from MADDPG**, where each trainer samples on its own;
            off by default.
        out : sequence of Batch, optional
            Batches from an earlier round to overwrite.
        """
        if n_trainers is None:
            n_trainers = self.n_trainers
        if isinstance(n_trainers, bool) or not isinstance(n_trainers, (int, np.integer)):
            raise TypeError(f"n_trainers must be an int; got n_trainers={n_trainers!r}")
        if not 1 <= n_trainers <= self.n_trainers:
            raise ValueError(
                f"n_trainers must be in [1, {self.n_trainers}]; got n_trainers={n_trainers}"
            )
        if out is not None and len(out) != n_trainers:
            raise ValueError(f"out must hold {n_trainers} batches; got {len(out)}")
        if shared_index:
            if self.sampler.weighted:
                raise ValueError(
                    "shared_index=True cannot be combined with a prioritized sampler: each "
                    "trainer has its own priority tree"
                )
            batch = self.sample(batch_size, 0, None if out is None else out[0])
            return [batch] * n_trainers
        return [
            self.sample(batch_size, t, None if out is None else out[t]) for t in range(n_trainers)
        ]

    def gather(self, indices: Any, trainer: int | None = None) -> Batch:
        """The joint batch at explicit ``indices`` (shape (B,), ints in ``[0, len(self))``)."""
        return self._gather(self._check_indices(indices), None, trainer, None)

    def _check_indices(self, indices: Any) -> np.ndarray:
        """``indices`` as a 1-D int64 array of filled slots, or a clear error."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError(
                f"indices must be a 1-D integer array; got shape {idx.shape}, dtype {idx.dtype}"
            )
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ValueError(
                f"indices must lie in [0, {self.size}) (the filled slots); "
                f"got min {idx.min()}, max {idx.max()}"
            )
        return idx.astype(np.int64, copy=False)

    def _gather(
        self,
        indices: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out: Batch | None,
    ) -> Batch:
        reuse = _reuse_arrays(out) if out is not None else None
        fields, block = self.storage.gather(np.ascontiguousarray(indices), reuse)
        return Batch(
            **fields,
            indices=indices,
            generations=self.write_generation[indices],
            weights=weights,
            trainer=trainer,
            block=block,
        )

    def update_priorities(
        self,
        indices: Any,
        td_errors: Any,
        trainer: int = 0,
        generations: Any = None,
    ) -> None:
        """Feed TD errors back to a prioritized sampler (one priority tree per trainer).

        ``generations`` (from ``batch.generations``) lets the sampler drop updates for slots
        overwritten since they were sampled; when omitted, the slots' current generations are
        assumed (no update is dropped).
        """
        trainer = self._check_trainer(trainer)
        idx = self._check_indices(indices)
        gens = self.write_generation[idx] if generations is None else np.asarray(generations)
        if gens.shape != idx.shape:
            raise ValueError(
                f"generations must have the shape of indices {idx.shape}; got {gens.shape}"
            )
        stale = gens.astype(np.int64, copy=False) != self.write_generation[idx]
        self.sampler.update_priorities(idx, np.asarray(td_errors), trainer, stale)

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: data, cursor, size, sampler state, RNG.

        Arrays are copies of the filled part of the storage; other values are JSON-safe.
        """
        return self._state(copy=True)

    def _state(self, copy: bool) -> dict[str, Any]:
        """:meth:`state_dict`; with ``copy=False`` the buffer's own arrays are views of the live
        memory (what :meth:`save` writes from, so that saving copies nothing)."""
        filled = self.size  # slots [0, size) hold data while filling; all of them once full

        def part(array: np.ndarray) -> np.ndarray:
            return array[:filled].copy() if copy else array[:filled]

        return {
            "format": _config.SAVE_FORMAT,
            "version": _config.SAVE_VERSION,
            "specs": {a: s.to_dict() for a, s in self.specs.items()},
            "capacity": self.capacity,
            "layout": self.layout,
            "n_trainers": self.n_trainers,
            "sampler": {
                "type": type(self.sampler).__name__,
                "config": self.sampler.config(),
                "state": self.sampler.state_dict(),
            },
            "cursor": self.cursor,
            "size": self.size,
            "total_writes": self.total_writes,
            "rng": self.rng.bit_generator.state,
            "write_generation": part(self.write_generation),
            "storage": {k: part(v) for k, v in self.storage.arrays().items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output into this buffer (same specs, capacity, layout)."""
        _check_header(state)
        specs = {a: AgentSpec.from_dict(s) for a, s in state["specs"].items()}
        mismatch = [
            (k, mine, theirs)
            for k, mine, theirs in (
                ("specs", self.specs, specs),
                ("capacity", self.capacity, state["capacity"]),
                ("layout", self.layout, state["layout"]),
                ("n_trainers", self.n_trainers, state["n_trainers"]),
            )
            if mine != theirs
        ]
        if mismatch:
            key, mine, theirs = mismatch[0]
            raise ValueError(
                f"state_dict does not fit this buffer: {key} is {mine!r} here, {theirs!r} in "
                "the state; build the buffer with MultiAgentReplayBuffer.load instead"
            )
        size = int(state["size"])
        arrays = self.storage.arrays()
        if set(state["storage"]) != set(arrays):
            raise ValueError(
                f"state_dict storage arrays {sorted(state['storage'])} do not match this "
                f"layout's {sorted(arrays)}"
            )
        for key, dst in arrays.items():
            src = np.asarray(state["storage"][key])
            if src.shape != (size, *dst.shape[1:]) or src.dtype != dst.dtype:
                raise ValueError(
                    f"state_dict storage array {key!r} has shape {src.shape} dtype {src.dtype}; "
                    f"expected {(size, *dst.shape[1:])} {dst.dtype}"
                )
        for key, dst in arrays.items():
            dst[:size] = state["storage"][key]
        self.write_generation[:] = -1
        self.write_generation[:size] = state["write_generation"]
        self.cursor = int(state["cursor"])
        self.size = size
        self.total_writes = int(state["total_writes"])
        self.rng.bit_generator.state = state["rng"]
        self.sampler.load_state_dict(state["sampler"]["state"])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the buffer to ``path``, an ``.npz`` archive (no pickled code).

        The write is atomic: the file is written next to the target, flushed to disk and
        renamed over it only when complete, so ``path`` holds the old or the new file even if
        the process is killed. The storage is written straight from the buffer's memory (no
        copy), and the file gets the mode ``0o666 & ~umask``. The folder must exist. See
        :mod:`marlbuf.persistence` for the format.
        """
        persistence.write_state(self._state(copy=False), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MultiAgentReplayBuffer:
        """Rebuild a buffer written by :meth:`save` (specs, layout, sampler, data, RNG state).

        The storage is read straight into the new buffer's preallocated arrays. Raises
        ``FileNotFoundError`` for a missing file and ``ValueError`` for a corrupt or foreign one.
        """
        built: list[MultiAgentReplayBuffer] = []

        def build(header: dict[str, Any]) -> dict[str, np.ndarray]:
            # called with the file's JSON part, before any array is read
            _check_header(header)
            sampler = header["sampler"]
            buf = cls(
                {a: AgentSpec.from_dict(s) for a, s in header["specs"].items()},
                capacity=int(header["capacity"]),
                layout=header["layout"],
                sampler=Sampler.from_config(sampler["type"], sampler["config"]),
                n_trainers=int(header["n_trainers"]),
            )
            built.append(buf)
            return persistence.storage_destinations(buf, header)

        state = persistence.read_state(path, build)
        buf = built[0]
        buf.load_state_dict(state)  # the storage arrays are already in place: no copy
        return buf


def _check_header(state: Mapping[str, Any]) -> None:
    if state.get("format") != _config.SAVE_FORMAT:
        raise ValueError(
            f"not a marlbuf buffer state (format={state.get('format')!r}, "
            f"expected {_config.SAVE_FORMAT!r})"
        )
    if state.get("version") != _config.SAVE_VERSION:
        raise ValueError(
            f"buffer state has format version {state.get('version')!r}; this marlbuf reads "
            f"version {_config.SAVE_VERSION}. Load it with the marlbuf version that wrote it."
        )


def _reuse_arrays(batch: Batch) -> dict[str, np.ndarray]:
    reuse = {f"{f}/{a}": x for f in FIELDS for a, x in batch.field(f).items()}
    if batch.block is not None:
        reuse["block"] = batch.block
    return reuse


__all__ = ["MultiAgentReplayBuffer", "make_rng"]
