"""openai/maddpg's per-agent ``ReplayBuffer`` API over one shared interleaved store.

In openai/maddpg every agent's trainer owns a list-of-tuples ``ReplayBuffer``; every agent's
``experience`` call adds that agent's transition, and every trainer's update calls
``make_index`` on its own buffer and then ``sample_index(index)`` on *all* agents' buffers
(N + 1 calls with the same index). That is N² small Python gathers per training round.

:func:`make_buffers` returns one buffer object per agent with the same methods, all backed by
one :class:`~marlbuf.MultiAgentReplayBuffer` (``layout="interleaved"``): a row holds every
agent's transition of one environment step, so the N + 1 ``sample_index`` calls of a trainer
share **one** gather of wide rows (the gathered batch is cached, keyed by the index).

Lockstep
--------
The per-agent buffers stay aligned because each environment step becomes one row. Each agent's
``add`` stages that agent's part of the current step; when all N agents have added (in any
order) the row is validated and written. An agent that adds a second time before the others
have added theirs gets a ``ValueError`` naming the agents still missing; nothing is written. A
step with invalid data (wrong shape, NaN, ...) is rejected as a whole when it completes: the
error names the agent and field, and the partial step is discarded for every agent.

Shapes and dtypes
-----------------
openai's buffer takes no shapes, so they are inferred from each agent's first ``add`` (or
checked against ``obs_shape_n`` / ``act_shape_n`` when given); the store is allocated when the
first step is complete. By default every field is stored in the dtype the original returns for
it: observations and actions in the dtype of the arrays added, rewards and dones in their float
dtype (float64 for Python floats, which is what ``float(done)`` gives). ``dtype=np.float32``
stores and returns every field as float32 instead (half the memory for float64 environments).

Examples
--------
>>> import numpy as np
>>> from marlbuf.compat.maddpg import make_buffers
>>> buffers = make_buffers(n_agents=2, size=100, seed=0)
>>> for step in range(10):  # what openai's train.py does: agent.experience(...) per agent
...     for i, buf in enumerate(buffers):
...         buf.add(np.zeros(4), np.ones(2, np.float32), 1.0, np.zeros(4), float(step == 9))
>>> index = buffers[0].make_index(8)  # trainer 0
>>> batches = [buf.sample_index(index) for buf in buffers]  # one gather for all of them
>>> obs, act, rew, obs_next, done = batches[1]
>>> obs.shape, obs.dtype, act.dtype, rew.dtype, done.dtype
((8, 4), dtype('float64'), dtype('float32'), dtype('float64'), dtype('float64'))
>>> buffers[0].store.gathers
1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from marlbuf.batch import Batch
from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.compat import NotEnoughDataError
from marlbuf.compat._common import check_n_agents, check_shape_list, check_size
from marlbuf.config import make_rng
from marlbuf.samplers import Sampler, Uniform, ascending_uniform
from marlbuf.spec import FIELDS, AgentSpec
from marlbuf.stores.host import LAYOUTS

#: one agent's staged transition: (obs_t, action, reward, obs_tp1, done) as passed to ``add``
_Staged = tuple[Any, Any, Any, Any, Any]


def _float_dtype_of(value: Any) -> np.dtype:
    """The dtype ``np.array([value, ...])`` gives for float scalars; float64 for ints/bools."""
    dt = np.asarray(value).dtype
    return dt if dt.kind == "f" else np.dtype(np.float64)


class SharedStore:
    """The one store behind the per-agent buffers of :func:`make_buffers`.

    Holds the lockstep staging area (each agent's part of the current step), the
    :class:`~marlbuf.MultiAgentReplayBuffer` (``None`` until the first step completes, when
    shapes are known) and the cached gather of the last index.

    Attributes
    ----------
    buffer : MultiAgentReplayBuffer or None
        The joint store; agents are named ``agent_0`` ... ``agent_{N-1}``.
    gathers : int
        Gathers performed so far (one per distinct index array sampled).
    """

    def __init__(
        self,
        n_agents: int,
        size: Any = 1e6,
        obs_shape_n: Sequence[Any] | None = None,
        act_shape_n: Sequence[Any] | None = None,
        dtype: Any = None,
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
        copy: bool = False,
        layout: str = "interleaved",
    ) -> None:
        self.n_agents = check_n_agents(n_agents)
        self.capacity = check_size(size)
        self.obs_shape_n = (
            None
            if obs_shape_n is None
            else check_shape_list("obs_shape_n", obs_shape_n, self.n_agents)
        )
        self.act_shape_n = (
            None
            if act_shape_n is None
            else check_shape_list("act_shape_n", act_shape_n, self.n_agents)
        )
        if dtype is not None:
            try:
                dtype = np.dtype(dtype)
            except TypeError as exc:
                raise TypeError(
                    f"dtype must be a float dtype or None; got dtype={dtype!r}"
                ) from exc
            if dtype.kind != "f":
                raise TypeError(f"dtype must be a float dtype or None; got dtype={dtype}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}; got layout={layout!r}")
        self.dtype: np.dtype | None = dtype
        # draw order, as openai's make_index (ascending slots: pass Uniform(order='memory'))
        self.sampler = Uniform(order="random") if sampler is None else sampler
        if not isinstance(self.sampler, Sampler):
            raise TypeError(f"sampler must be a marlbuf.samplers.Sampler; got {sampler!r}")
        if self.sampler.weighted:
            raise ValueError(
                "openai/maddpg's buffer API has no importance weights; use an unweighted sampler "
                f"(Uniform, Neighbor) here; got sampler={self.sampler!r}"
            )
        if not isinstance(copy, (bool, np.bool_)):
            raise TypeError(f"copy must be a bool; got copy={copy!r}")
        self.copy = bool(copy)
        self.layout = layout
        self.rng = make_rng(seed)
        self.agent_names = [f"agent_{i}" for i in range(self.n_agents)]
        self.buffer: MultiAgentReplayBuffer | None = None
        self._staged: list[_Staged | None] = [None] * self.n_agents
        self._n_staged = 0
        self.gathers = 0
        # the gather cache: the last index object handed out or passed in, a copy of it (to
        # notice in-place edits), its int64 form, and the gathered batch (None until needed)
        self._key: Any = None
        self._key_snapshot: list[int] | None = None
        self._indices: np.ndarray | None = None
        self._batch: Batch | None = None

    # ----------------------------------------------------------------------------- writing
    def stage(self, agent_index: int, transition: _Staged) -> None:
        """Stage one agent's part of the current step; write the row once all have added."""
        if self._staged[agent_index] is not None:
            missing = [i for i, s in enumerate(self._staged) if s is None]
            raise ValueError(
                f"agent {agent_index}'s buffer got a second add() before agents {missing} added "
                f"their part of step {len(self)}. The buffers from make_buffers share one store "
                "and stay in lockstep: every agent must add exactly once per environment step "
                "(in any order). Nothing was written; call discard_partial_step() to drop the "
                "incomplete step."
            )
        self._staged[agent_index] = transition
        self._n_staged += 1
        if self._n_staged == self.n_agents:
            self._commit()

    def discard_partial_step(self) -> None:
        """Drop the agents' parts of an incomplete step (nothing of it was written)."""
        self._staged = [None] * self.n_agents
        self._n_staged = 0

    def _commit(self) -> None:
        staged = [s for s in self._staged if s is not None]
        self.discard_partial_step()  # a rejected step is dropped for every agent
        if self.buffer is None:
            self.buffer = self._allocate(staged)
        columns = {
            f: dict(zip(self.agent_names, values)) for f, values in zip(FIELDS, zip(*staged))
        }
        self._forget_cache()  # the new row may overwrite a cached slot
        self.buffer.add(**columns)

    def _infer_spec(self, agent_index: int, transition: _Staged) -> AgentSpec:
        obs, action, reward, _obs_tp1, done = transition
        obs_arr, act_arr = np.asarray(obs), np.asarray(action)
        for name, arr, given in (
            ("obs_shape_n", obs_arr, self.obs_shape_n),
            ("act_shape_n", act_arr, self.act_shape_n),
        ):
            if given is not None and arr.shape != given[agent_index]:
                raise ValueError(
                    f"agent {agent_index}'s first add() has shape {arr.shape} but "
                    f"{name}[{agent_index}]={given[agent_index]}; fix the data or the shapes"
                )
        try:
            return AgentSpec(
                obs_shape=obs_arr.shape,
                action_shape=act_arr.shape,
                obs_dtype=self.dtype or obs_arr.dtype,
                action_dtype=self.dtype or act_arr.dtype,
                reward_dtype=self.dtype or _float_dtype_of(reward),
                done_dtype=self.dtype or _float_dtype_of(done),
            )
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"agent {agent_index}'s first add() sets the stored shapes and dtypes, but its "
                f"data does not fit: {exc}"
            ) from exc

    def _allocate(self, staged: list[_Staged]) -> MultiAgentReplayBuffer:
        specs = {
            name: self._infer_spec(i, transition)
            for i, (name, transition) in enumerate(zip(self.agent_names, staged))
        }
        return MultiAgentReplayBuffer(
            specs, self.capacity, layout=self.layout, sampler=self.sampler, seed=self.rng
        )

    def clear(self) -> None:
        """Empty the store for every agent (keeps the shapes learnt so far)."""
        self.discard_partial_step()
        self._forget_cache()
        if self.buffer is not None:
            specs = self.buffer.specs
            self.buffer = None  # free the old table before allocating the new one
            self.buffer = MultiAgentReplayBuffer(
                specs, self.capacity, layout=self.layout, sampler=self.sampler, seed=self.rng
            )

    def __len__(self) -> int:
        return 0 if self.buffer is None else len(self.buffer)

    @property
    def cursor(self) -> int:
        """Slot the next step goes to (openai's ``_next_idx``)."""
        return 0 if self.buffer is None else self.buffer.cursor

    # ----------------------------------------------------------------------------- sampling
    def _check_batch_size(self, batch_size: Any) -> int:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int; got batch_size={batch_size!r}")
        return self.sampler.check_batch_size(int(batch_size))

    def make_index(self, batch_size: Any, trainer: int) -> list[int]:
        """``batch_size`` slot indices drawn by the sampler, as a list (as openai returns)."""
        batch_size = self._check_batch_size(batch_size)
        if len(self) == 0:
            raise NotEnoughDataError(
                f"make_index({batch_size}) on an empty buffer; add transitions first"
            )
        if batch_size > len(self) and isinstance(self.sampler, Uniform) and self.sampler.replace:
            # openai's make_index draws with replacement from however many entries exist;
            # the buffer's Uniform refuses a batch larger than the data, the original does not
            if self.sampler.order == "memory":
                indices = ascending_uniform(batch_size, len(self), self.rng, True)
            else:
                indices = self.rng.integers(0, len(self), size=batch_size, dtype=np.int64)
        else:
            indices, _ = self.sampler.sample(batch_size, len(self), self.rng, trainer)
        return self._remember_index(indices)

    def make_latest_index(self, batch_size: Any) -> list[int]:
        """The ``batch_size`` most recent slots, shuffled (as openai's ``make_latest_index``)."""
        batch_size = self._check_batch_size(batch_size)
        back = np.arange(1, batch_size + 1, dtype=np.int64)
        indices = (self.cursor - back) % self.capacity  # walks backwards over the ring's end
        return self._remember_index(self.rng.permutation(indices))

    def _remember_index(self, indices: np.ndarray) -> list[int]:
        """Hand out ``indices`` as a list and remember it: the N + 1 ``sample_index`` calls
        that follow with this very list share one gather."""
        as_list: list[int] = indices.tolist()
        self._forget_cache()
        self._key = as_list
        self._key_snapshot = list(as_list)  # detects in-place edits of the handed-out list
        self._indices = indices
        return as_list

    def _forget_cache(self) -> None:
        self._key = None
        self._key_snapshot = None
        self._indices = None
        self._batch = None

    def batch_at(self, idxes: Any) -> Batch:
        """The joint batch at ``idxes``, gathered once per distinct index."""
        if not self._is_cached_key(idxes):
            indices = np.asarray(idxes)
            if indices.ndim != 1 or indices.dtype.kind not in "iu":
                if indices.size == 0:  # np.asarray([]) is float64
                    raise ValueError("sample_index needs at least one index; got an empty list")
                raise TypeError(
                    "idxes must be a list or 1-D array of ints (e.g. from make_index); got "
                    f"shape {indices.shape}, dtype {indices.dtype}"
                )
            if self._indices is None or not np.array_equal(indices, self._indices):
                self._forget_cache()
                # a private copy: the caller may edit its array in place before the next call
                self._indices = indices.astype(np.int64, copy=True)
            self._key = idxes
            self._key_snapshot = list(idxes) if isinstance(idxes, list) else None
        if self._batch is None:
            if self.buffer is None:
                raise NotEnoughDataError("sample_index on an empty buffer; add transitions first")
            assert self._indices is not None  # set by _remember_index or above
            batch = self.buffer.gather(self._indices)
            self.gathers += 1
            if not self.copy:
                # every agent's sample_index returns views of this one gather: read-only, so an
                # in-place edit by one trainer cannot leak into another's batch
                for name in FIELDS:
                    for arr in batch.field(name).values():
                        arr.flags.writeable = False
            self._batch = batch
        return self._batch

    def _is_cached_key(self, idxes: Any) -> bool:
        if idxes is not self._key or self._indices is None:
            return False
        if isinstance(idxes, list):
            return idxes == self._key_snapshot
        if isinstance(idxes, np.ndarray):
            return np.array_equal(idxes, self._indices)
        return False

    def sample_index(self, idxes: Any, agent_index: int) -> tuple[np.ndarray, ...]:
        """One agent's ``(obs, act, rew, obs_next, done)`` at ``idxes``."""
        batch = self.batch_at(idxes)
        name = self.agent_names[agent_index]
        arrays = tuple(batch.field(f)[name] for f in FIELDS)
        if self.copy:
            return tuple(np.array(a) for a in arrays)
        return arrays


class ReplayBuffer:
    """One agent's view of a :class:`SharedStore`, with openai/maddpg's ``ReplayBuffer`` API.

    Build the buffers of all agents with :func:`make_buffers`. ``ReplayBuffer(size)`` alone
    makes a standalone single-agent buffer (correct, but without the shared gather).

    Parameters
    ----------
    size : int or float
        Capacity in environment steps (openai passes ``1e6``).
    store : SharedStore, optional
        The shared store; a private one-agent store when omitted.
    agent_index : int
        Which agent of ``store`` this buffer is.
    """

    def __init__(
        self, size: Any = 1e6, *, store: SharedStore | None = None, agent_index: int = 0
    ) -> None:
        if store is None:
            store = SharedStore(1, size)
        elif check_size(size) != store.capacity:
            raise ValueError(f"size={size!r} differs from the store's capacity {store.capacity}")
        if not 0 <= agent_index < store.n_agents:
            raise ValueError(
                f"agent_index must be in [0, {store.n_agents}); got agent_index={agent_index!r}"
            )
        self.store = store
        self.agent_index = int(agent_index)

    def __len__(self) -> int:
        """Complete environment steps stored (the same for every agent)."""
        return len(self.store)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(agent_index={self.agent_index}, n_agents={self.store.n_agents}, "
            f"size={self.store.capacity}, len={len(self)})"
        )

    def clear(self) -> None:
        """Empty the buffer — **of every agent**: they share one store and stay in lockstep."""
        self.store.clear()

    def add(self, obs_t: Any, action: Any, reward: Any, obs_tp1: Any, done: Any) -> None:
        """Add this agent's transition of the current step (written when all agents added).

        Parameters
        ----------
        obs_t, obs_tp1 : array_like, shape obs_shape
        action : array_like, shape act_shape
        reward, done : float
        """
        self.store.stage(self.agent_index, (obs_t, action, reward, obs_tp1, done))

    def make_index(self, batch_size: int) -> list[int]:
        """``batch_size`` random slots in ``[0, len(self))`` (with replacement by default)."""
        return self.store.make_index(batch_size, self.agent_index)

    def make_latest_index(self, batch_size: int) -> list[int]:
        """The ``batch_size`` most recently written slots, in random order."""
        return self.store.make_latest_index(batch_size)

    def sample_index(self, idxes: Any) -> tuple[np.ndarray, ...]:
        """This agent's transitions at ``idxes``.

        Returns
        -------
        obs : ndarray, shape (B, *obs_shape)
        act : ndarray, shape (B, *act_shape)
        rew : ndarray, shape (B,)
        obs_next : ndarray, shape (B, *obs_shape)
        done : ndarray, shape (B,)
            In the stored dtypes. Read-only views into one gather shared by all agents unless
            the store was made with ``copy=True``.
        """
        return self.store.sample_index(idxes, self.agent_index)

    def sample(self, batch_size: int) -> tuple[np.ndarray, ...]:
        """``sample_index(make_index(batch_size))``; ``batch_size <= 0`` returns everything in
        slot order (openai's ``collect``)."""
        if isinstance(batch_size, (int, np.integer)) and not isinstance(batch_size, bool):
            if batch_size <= 0:
                if len(self) == 0:
                    raise NotEnoughDataError("sample on an empty buffer; add transitions first")
                return self.sample_index(np.arange(len(self), dtype=np.int64))
        return self.sample_index(self.make_index(batch_size))

    def collect(self) -> tuple[np.ndarray, ...]:
        """Every stored transition of this agent, in slot order."""
        return self.sample(-1)


def make_buffers(
    n_agents: int,
    size: Any = 1e6,
    *,
    obs_shape_n: Sequence[Any] | None = None,
    act_shape_n: Sequence[Any] | None = None,
    dtype: Any = None,
    sampler: Sampler | None = None,
    seed: int | np.random.Generator | None = None,
    copy: bool = False,
    layout: str = "interleaved",
) -> list[ReplayBuffer]:
    """One openai/maddpg-style ``ReplayBuffer`` per agent, sharing one interleaved store.

    Parameters
    ----------
    n_agents : int
        Number of agents (trainers).
    size : int or float, default 1e6
        Capacity in environment steps; preallocated when the first step is complete.
    obs_shape_n, act_shape_n : sequence of shapes, optional
        Per-agent observation and action shapes to check the first ``add`` against; inferred
        from it when omitted.
    dtype : float dtype, optional
        Store and return every field in this dtype (e.g. ``np.float32``). By default each field
        keeps the dtype the original buffer would return.
    sampler : Sampler, default ``Uniform(order="random")``
        How ``make_index`` draws (e.g. ``Neighbor(16)`` for cache-locality sampling).
    seed : int or numpy Generator, optional
        Randomness of ``make_index`` / ``make_latest_index`` (openai uses the global
        ``random`` module).
    copy : bool, default False
        ``False``: ``sample_index`` returns read-only views into the shared gather.
        ``True``: private writeable copies, exactly like the original (slower).
    layout : {"interleaved", "agent_major"}
        Storage layout; ``"agent_major"`` exists for comparisons.

    Returns
    -------
    list of ReplayBuffer
        ``buffers[i]`` is agent ``i``'s; hand it to that agent's trainer
        (``trainer.replay_buffer = buffers[i]``).
    """
    store = SharedStore(
        n_agents, size, obs_shape_n, act_shape_n, dtype, sampler, seed, copy, layout
    )
    return [ReplayBuffer(store.capacity, store=store, agent_index=i) for i in range(n_agents)]


__all__ = ["ReplayBuffer", "SharedStore", "make_buffers"]
