"""The multi-agent replay buffer: writer (ring + write generations), storage, sampler."""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np

from marlbuf import _config, mapped, persistence
from marlbuf._kernels import (
    commit_dense_step,
    commit_lean_step,
    store_dense_leading_step,
    store_dense_step,
    store_lean_leading_step,
    store_lean_step,
)
from marlbuf._kernels.drawn import judge_update
from marlbuf._kernels.staging import STEP_DECLINED
from marlbuf.batch import Batch, DrawnIndices, EpisodeBatch, SequenceBatch
from marlbuf.config import BufferConfig
from marlbuf.convert import convert_state, staged_rows
from marlbuf.memory import MemoryEstimate, estimate
from marlbuf.options import check_capacity, check_header
from marlbuf.samplers import Episodes as EpisodesSampler
from marlbuf.samplers import Sampler
from marlbuf.samplers import Sequence as SequenceSampler
from marlbuf.spec import (
    ALIVE,
    GLOBAL,
    AgentSpec,
    FieldSpec,
)
from marlbuf.staging import RowCodec, StepItems, steps_of
from marlbuf.storage import FieldSelection, Storage, available_memory_bytes, check_fields
from marlbuf.stores import make_store
from marlbuf.stores.capabilities import refusal
from marlbuf.writer import EpisodeIndex, NextObsLinks, RingWriter

#: the store kernels of a one-step ``extend``/``add_envs`` (items with a leading axis of 1)
_LEADING_KERNELS = (store_dense_leading_step, store_lean_leading_step)
#: ``NextObsLinks.pending`` of a stream without a pending transition (no slot, no generation)
_NO_PENDING = (-1, -1)


#: an empty int64 array: nothing to compare indices with (``generations=`` was given)
_NO_SLOTS = np.zeros(0, dtype=np.int64)
#: why indices written to after their draw are refused
_CHANGED_IN_PLACE = (
    "indices were written to after the draw: they hold slots their batch did not draw, so "
    "the write generations they carry say nothing about those slots (a slot overwritten since "
    "would be given another step's priority). Leave batch.indices as drawn (reordering it in "
    "place is fine), or pass generations= for the slots you update (generations="
    "buffer.write_generation[indices] to set the priorities of the slots as they are now)"
)


def _untrusted(trainer: int, why: str) -> str:
    """Why indices without write generations are refused for ``trainer``."""
    return (
        f"indices carry no write generations (a copy, slice, tensor or list of a batch's "
        f"indices, or slots never drawn) and {why} (trainer {trainer}), so the buffer cannot "
        "tell whether their slots were overwritten since they were drawn: pass "
        "generations=batch.generations of the batch they came from, or "
        "generations=buffer.write_generation[indices] to set the priorities of the slots as "
        "they are now"
    )


class StreamBreakWarning(UserWarning):
    """A step's ``obs`` differs from the ``next_obs`` of the previous step written on the same
    stream, and that step was neither done nor truncated: several environments are written in
    turn on one stream. The episode index ends the episode there (a sequence or episode never
    mixes environments). Raised once per buffer; write each environment on its own stream
    (``add(..., stream=k)``) or use ``add_envs``."""


class NextObsWarning(UserWarning):
    """Most stored steps of a buffer with observations stored once keep their ``next_obs`` in
    the side table: the data are not streams of consecutive steps (or several environments
    are written in turn on one stream), so the format costs memory and time instead of saving
    them. Raised once per buffer."""


class NextObsDroppedWarning(UserWarning):
    """A ``next_obs="auto"`` buffer's first write left ``next_obs`` out, so the buffer chose
    ``next_obs="none"``: it stores no next observations from then on, and reading them raises.
    Raised once per buffer, before anything is stored; build the buffer with
    ``next_obs="none"`` to choose this format without the warning, or pass ``next_obs=`` to
    every write to keep next observations."""


class SlowWriteWarning(UserWarning):
    """A valid step of ``add`` (or a one-step ``extend``/``add_envs``) was not taken by the
    one-kernel write path because of how one of its inputs is given (a list where an array is
    expected, a torch tensor, a dtype the kernels do not read, specs whose five fields are
    stored in different dtypes), so it was staged by NumPy or the complete checks: several
    times slower. The message names the input and the fix. Raised once per buffer."""


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
        Number of joint transitions (timesteps) kept; the oldest is overwritten first. An
        integral float (``1e6``, as in many configs) is accepted.
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
    next_obs : {"auto", "once", "stored", "none"}, default "auto"
        ``"auto"``: ``"stored"`` where a lean row would take as many bytes as a dense one
        (interleaved rows are padded to cache lines: tiny observations), else ``"once"``,
        unless the buffer's first write is an ``extend`` of
        consecutive steps in which most ``next_obs`` differ from the following step's ``obs``
        (independent transitions: a dataset, shuffled transitions, or environments written in
        turn): the buffer then stores them ``"stored"`` (it is still empty, so nothing is
        converted; :attr:`next_obs` tells which format was chosen; a memory-mapped buffer, or
        one where the dense rows would not fit in memory, keeps ``"once"``). A first write
        without ``next_obs`` makes it ``"none"``, with a warning (:class:`NextObsDroppedWarning`;
        not a memory-mapped buffer, whose files are laid out at construction: build it with
        ``next_obs="none"``); later writes must then leave it out too.
        ``"once"``: observations are stored once; a transition's ``next_obs`` is read from the
        ``obs`` of the next step of the same stream, and where they differ (termination,
        truncation, reset, the newest step) from a side table, detected by comparing values at
        write time (no episode flags needed; exact in every case, see
        :class:`marlbuf.writer.NextObsLinks`). About half the memory for MPE-style rows; batches
        are the same, bit for bit. ``"stored"``: ``next_obs`` is a field of every row. With
        ``"once"`` (chosen or automatic), a buffer in which most stored steps end up in the side
        table warns once (:class:`NextObsWarning`), naming ``stream=``, ``add_envs`` and
        ``next_obs="stored"``. ``"none"``: no next observations at all, for learners that
        never read them (episode learners such as QMIX and VDN read the next step's ``obs`` of
        a :class:`~marlbuf.samplers.Sequence` or :class:`~marlbuf.samplers.Episodes` batch):
        rows are the lean rows of ``"once"`` without links or side table, writes leave
        ``next_obs`` out, and batches hold none (``batch.next_obs`` raises a ``ValueError``
        naming ``next_obs="none"``, as a field left out by ``fields=`` does). Without
        ``next_obs`` a stream break cannot be seen: a step begins a new episode only after a
        done or truncated step (or on another stream).
    batch_dtype : {"float32", "storage"}, default "float32"
        Half-precision storage (``AgentSpec(obs_dtype=np.float16)``, per agent and field)
        halves the bytes stored and read; by default the gather kernel converts such fields to
        float32 in the same pass, so trainers see float32 batches. ``"storage"`` delivers them
        in storage precision (convert on the device).
    batch_layout : {"rows", "per_agent"}, default "rows"
        How gathered batches are laid out. ``"rows"`` (interleaved layout): every per-agent
        array is a strided view into the gathered rows (row stride = the joint row), and
        ``batch.concat("obs", "action")`` (the centralized critic's input) is zero-copy.
        ``"per_agent"``: every per-agent array is C-contiguous, written so by the gather kernel
        in the same pass; best for per-agent networks (``.view()`` works, no strided matmul).
        ``agent_major`` storage always gathers per agent.
    path : str or path-like, optional
        Keep the storage arrays in memory-mapped files in this folder (a new or empty one; its
        parent must exist), so that the capacity is bounded by disk, not RAM; the metadata
        (write generations, next-observation links, priorities) stays in RAM. Every write is
        logged before it is applied, so the folder reopens (:meth:`open`) consistently even if
        the process is killed; :meth:`flush` writes everything to disk and :meth:`close` (or a
        ``with`` block) also releases the folder. See :mod:`marlbuf.mapped`.
    durable : bool, default False
        With ``path``: make every ``add``/``extend`` durable on disk (``fdatasync``) before it
        returns, so that a machine crash or power loss also reopens consistently with it.
        Without it, writes survive the process dying but only :meth:`flush` protects them from
        the machine stopping.
    parallel_gather : bool, default False
        Opt-in: gathers of at least ``_config.PARALLEL_GATHER_MIN_BYTES`` use Numba's threads.
        Measured 1.4x on the 24-agent round of a quiet 2-core machine; it needs an idle core
        (keep torch at one thread) and is a runtime setting, not saved with the buffer.
    global_fields : mapping of str to FieldSpec, optional
        Fields stored once per step for all agents (e.g. a SMAC-style global ``state``:
        ``{"state": FieldSpec((48,))}``), in the same rows. Writes take each as a keyword
        argument holding one array of its shape (with the leading axis of ``extend`` /
        ``add_envs``); batches hold them in ``batch.globals[name]``, shape ``(B, *shape)``.
        Per-agent extra fields are declared in the specs (``AgentSpec(extras=...)``).
    alive : bool, default False
        Store an alive flag per agent per step (one byte each; ``batch.alive[agent]``, shape
        ``(B,)``, bool). An agent missing from a step's ``obs`` is then stored **absent**
        (zero-filled where not given, alive False) instead of being an error, and writes accept
        ``alive={agent: bool}`` to set the flags explicitly.
    device : str or torch.device, optional
        ``None`` (default): the rows live in NumPy arrays (in RAM, or mapped files with
        ``path=``). ``"cuda"``, ``"cuda:k"`` or ``"cpu"``: they live in one torch tensor on
        that device (:class:`marlbuf.stores.torch.TorchStorage`; needs PyTorch), gathered there
        with ``index_select``, and batches are :class:`marlbuf.stores.torch.DeviceBatch`
        objects of tensors on that device. Everything else (checks, writer, samplers,
        priorities, sequences, extras, state files) is this buffer's own, so the same seed
        gives the same batches on every store. Interleaved layout only, not with ``path=``
        (see :data:`marlbuf.stores.capabilities.CAPABILITIES`). See ``docs/device.md``.

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

    #: memory-mapped files of a ``path=`` buffer (``None``: in RAM; a class default so that
    #: backends with their own ``__init__`` need not set it)
    _mapped: mapped.MappedStore | None = None
    #: episode bookkeeping, kept when the sampler samples sequences (``None`` otherwise)
    episodes: EpisodeIndex | None = None
    #: the sampler when it is a :class:`marlbuf.samplers.Sequence`
    _sequence: SequenceSampler | None = None
    #: ``next_obs="auto"`` before the first write chose the format; whether the side-table
    #: warning was given (class defaults for backends with their own ``__init__``)
    _choose_format = False
    _format_warned = False
    #: ``next_obs="auto"`` in RAM or on a device: a first write without next_obs (while nothing
    #: was written yet) makes the buffer ``next_obs="none"``
    _auto_none = False
    #: ``next_obs="auto"`` not yet decided by a committed write (nor by a loaded state): every
    #: write goes through :meth:`_stand_in` and the general commit, which decides
    _deciding = False
    #: whether a write's ``next_obs`` goes through :meth:`_stand_in` even when given: buffers
    #: without next observations, and ``"auto"`` buffers still deciding
    _stand_ins = False
    #: whether the stream-break warning was given (:class:`StreamBreakWarning`)
    _breaks_warned = False
    #: whether the slow-write warning was given (:class:`SlowWriteWarning`)
    _slow_warned = False
    #: environments of the latest ``add_envs`` call (0: none yet)
    _declared_envs = 0
    #: what the one-step commit of ``add`` needs, for the storage and sampler it was made for
    #: (see :meth:`_step_target`)
    _step: tuple[Any, ...] | None = None

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        capacity: int,
        layout: str = "interleaved",
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
        n_trainers: int | None = None,
        parallel_gather: bool = False,
        batch_layout: str = "rows",
        next_obs: str = "auto",
        batch_dtype: str = "float32",
        path: str | os.PathLike[str] | None = None,
        durable: bool = False,
        *,
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
        device: Any = None,
    ) -> None:
        #: the torch device of the rows (``None``: NumPy arrays)
        device = _check_device_options(device, layout, path is not None, parallel_gather)
        config, sampler = BufferConfig.from_arguments(
            specs,
            capacity,
            layout,
            sampler,
            n_trainers,
            next_obs,
            batch_layout,
            batch_dtype,
            global_fields,
            alive,
            parallel_gather,
        )
        self._build(config, sampler, seed, parallel_gather, device, path=path, durable=durable)

    def _build(
        self,
        config: BufferConfig,
        sampler: Sampler,
        seed: int | np.random.Generator | None,
        parallel_gather: bool,
        device: Any,
        path: str | os.PathLike[str] | None = None,
        durable: bool = False,
        files: mapped.MappedStore | None = None,
    ) -> None:
        """Build the buffer of a checked ``config`` (:meth:`BufferConfig.from_arguments`):
        a new memory-mapped folder at ``path``, or over the claimed folder ``files`` of
        :meth:`open` (whose state it then loads)."""
        self.specs = config.specs
        in_files = path is not None or files is not None  # storage arrays on disk, not in RAM
        self.device = device
        next_obs = config.next_obs
        #: whether the format is still to be chosen by the first write (``next_obs="auto"``)
        self._choose_format = next_obs == "auto" and not in_files
        self._auto_none = self._deciding = self._choose_format
        self._stand_ins = next_obs == "none" or self._deciding
        #: per thread, whether the write being made left ``next_obs`` out (read by the first
        #: commit of an ``"auto"`` buffer, which then chooses ``"none"``)
        self._write_call = threading.local()
        next_obs = "once" if next_obs == "auto" else next_obs
        self._format_warned = False
        #: fields stored once per step for all agents (``global_fields=``), and whether each
        #: step records which agents are alive (``alive=``)
        self.global_fields, self.alive = config.global_fields, config.alive
        self.capacity = config.capacity
        self.n_trainers = config.n_trainers
        layout = config.layout
        # sizes first: nothing that depends on a declared shape is allocated before the whole
        # buffer is known to fit (the staging row of add() is one dense row)
        row_options: dict[str, Any] = {"global_fields": self.global_fields, "alive": self.alive}
        staging_row = estimate(self.specs, 1, "interleaved", "stored", **row_options)
        if self._choose_format and config.initial_next_obs() == "stored":
            # rows so small that padding to a cache line eats what storing observations once
            # saves: the dense format costs no more memory and gathers without links
            self._choose_format = False
            next_obs = "stored"
        needed = estimate(
            self.specs,
            self.capacity,
            layout,
            next_obs,
            prioritized=sampler.weighted,
            n_trainers=self.n_trainers,
            episodes=sampler.needs_episodes,
            **row_options,
        )
        _check_memory(
            mapped.resident(needed) if in_files or self.device is not None else needed,
            self.specs,
            layout,
            next_obs,
            self.global_fields,
            self.alive,
            working=staging_row.table_row_bytes,
        )
        # validation + staging of add/extend
        self._codec = RowCodec(self.specs, self.global_fields, self.alive)
        # checked against capacity first (a Neighbor run longer than the ring is refused here)
        sampler.bind(self.capacity, self.n_trainers)
        self.sampler = sampler
        self.next_obs = next_obs
        self.links = (
            NextObsLinks(self.capacity, self._codec.obs_bytes) if next_obs == "once" else None
        )
        #: the files of a memory-mapped buffer (``path=``), once it is live
        self._mapped = None
        store = files
        if path is not None:
            make_rng(seed)  # checked before the folder is claimed
            store = mapped.MappedStore.create(path, durable, needed)
        elif files is None and durable is not False:
            raise ValueError(
                f"durable={durable!r} applies to memory-mapped buffers only: pass path= as well"
            )
        try:
            self.storage: Storage = build_storage(
                config,
                self._codec,
                next_obs,
                self.links,
                None if store is None else store.allocate,
                self.device,
            )
        except BaseException:
            if store is not None:
                store.abandon()  # a new folder is removed again; an existing one is released
            raise
        self.storage.parallel_gather = bool(parallel_gather)
        place = getattr(sampler, "place_priorities", None)
        if place is not None:  # prioritized samplers: trees on the store's device if asked
            place(self.device)
        self.rng = make_rng(seed)
        self.writer = RingWriter(self.capacity)
        if sampler.needs_episodes:
            # staged rows carry obs and next_obs: the index compares them for stream breaks
            # (not without next observations, whose staged rows carry obs in their place)
            self.episodes = EpisodeIndex(
                self.capacity,
                self._codec.obs_bytes if next_obs != "none" else 0,
                self._codec.next_obs_start,
            )
            if isinstance(sampler, SequenceSampler):
                self._sequence = sampler
            attach = getattr(sampler, "attach_episodes", None)
            if attach is not None:
                attach(self.episodes)
        self._done_reader = _done_reader(self._codec)
        self._break_flags = _break_flag_reader(self._codec)
        # per trainer, the indices of its latest batch (prioritized samplers only): a plain
        # copy of them passed to update_priorities without generations= is judged against
        # that draw (batch.indices itself carries its generations)
        self._last_drawn: list[DrawnIndices | None] = [None] * (
            self.n_trainers if self.sampler.weighted else 0
        )
        #: updates of ``update_priorities(..., sync=False)`` waiting for their device copies:
        #: (trainer, indices, generations, a function returning the host TD errors)
        #: an entry ``(-1, None, None, error)`` keeps the error of an update applied by a later
        #: call for the next call that reads priorities
        self._deferred: list[tuple[int, Any, Any, Any]] = []
        if store is not None:
            store.bind(
                self.config,
                mapped.BufferHooks(
                    commit=self._replay,
                    state=lambda: self._state(copy=False, errors=False),
                    load=lambda state: self._load_state(state, adopt=True, table_ahead=True),
                    replayed=self._replayed,
                    attach=self._attach_store,
                    total_writes=lambda: self.writer.total_writes,
                    row_words=self._codec.row_words,
                    lock=self.writer.lock,
                ),
            )
        if path is not None and store is not None:
            store.start(self.config)  # first checkpoint, then the manifest: a complete folder

    # ----------------------------------------------------------------------------- basics
    @property
    def layout(self) -> str:
        """``"interleaved"`` or ``"agent_major"``."""
        return self.storage.layout

    @property
    def batch_layout(self) -> str:
        """``"rows"`` (strided views of gathered rows) or ``"per_agent"`` (contiguous arrays)."""
        return self.storage.batch_layout

    @property
    def agents(self) -> list[str]:
        """Agent names in spec order."""
        return list(self.specs)

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage arrays."""
        return self.storage.nbytes

    @property
    def cursor(self) -> int:
        """The next slot to be written (the oldest slot once the buffer is full)."""
        return self.writer.cursor

    @property
    def size(self) -> int:
        """Filled slots; slots ``[0, size)`` hold data."""
        return self.writer.size

    @property
    def total_writes(self) -> int:
        """Transitions ever written (also the write generation of the next one)."""
        return self.writer.total_writes

    @property
    def write_generation(self) -> np.ndarray:
        """Per slot (shape (capacity,), int64), the value of ``total_writes`` when it was
        written; ``-1`` for slots never written. Read-only by contract."""
        return self.writer.write_generation

    @property
    def config(self) -> BufferConfig:
        """The buffer's configuration as it is now (:class:`marlbuf.config.BufferConfig`: the
        format chosen by the first write of a ``next_obs="auto"`` buffer once it is chosen)."""
        return BufferConfig(
            specs=self.specs,
            capacity=self.capacity,
            layout=self.layout,
            next_obs=self.next_obs,
            sampler_type=type(self.sampler).__name__,
            sampler_config=self.sampler.config(),
            n_trainers=self.n_trainers,
            global_fields=self.global_fields,
            alive=self.alive,
            batch_layout=self.batch_layout,
            batch_dtype=self.storage.batch_dtype,
        )

    def __len__(self) -> int:
        return self.writer.size

    def __repr__(self) -> str:
        # the format: "auto" while the first write may still choose it (the format it assumes
        # until then in brackets)
        undecided = self._auto_none and self.writer.total_writes == 0 and self.next_obs != "none"
        next_obs = f"'auto' ({self.next_obs!r} until the first write)" if undecided else None
        if self.device is not None:
            store = f"store='torch', device={str(self.device)!r}"
        elif self._mapped is not None:
            store = f"store='mapped', path={self.path!r}"
        else:
            store = "store='ram'"
        return (
            f"MultiAgentReplayBuffer(agents={len(self.specs)}, size={self.size}, "
            f"capacity={self.capacity}, next_obs={next_obs or repr(self.next_obs)}, "
            f"layout={self.layout!r}, {store}, sampler={self.sampler!r})"
        )

    # ----------------------------------------------------------------------------- writing
    def add(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        stream: Any = 0,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """Store one timestep of every agent.

        Each argument is a dict keyed by agent name (what a PettingZoo parallel env returns) or
        a sequence in agent order. ``obs``/``next_obs`` items have shape ``obs_shape``,
        ``action`` items ``action_shape`` (or an int for a discrete agent), ``reward`` and
        ``done`` items are scalars (bools accepted for ``done``). Values are converted to the
        stored dtypes with NumPy's ``same_kind`` rule (float64 and ints into float32 storage);
        a finite value beyond the stored dtype's range, NaN or inf is rejected. Nothing is
        written unless every value is valid.

        ``stream`` names the environment copy the step comes from when several write into one
        buffer step by step (with observations stored once, a step's ``next_obs`` is matched
        with the next step *of the same stream*); ``add_envs`` numbers streams by environment.

        ``truncated`` (a bool, or per agent a dict or a sequence in agent order; any True counts)
        marks the step as the last of its episode without termination (a time limit). Episodes
        matter to sequence sampling (:class:`marlbuf.samplers.Sequence`): an episode ends at a
        step where every agent is done (every alive agent, with ``alive=True``) or that is
        truncated, and the stream's next step begins a new one. Other samplers accept and
        ignore it.

        Declared extra fields are keyword arguments, per agent like ``obs`` (``hidden={agent:
        array of the FieldSpec's shape}``); each global field is one array of its shape
        (``state=array``). With ``alive=True`` at construction, an agent missing from ``obs``
        is stored absent (its fields zero-filled where not given, alive False), and ``alive=
        {agent: bool}`` may set the flags explicitly (an agent given as not alive keeps the
        values given for it). An unknown keyword is a ``TypeError``.

        ``next_obs`` is left out (``None``) with ``next_obs="none"`` (pass ``done`` by keyword:
        ``add(obs, action, reward, done=done)``) and required otherwise; ``done`` is always
        required. A buffer with ``next_obs="auto"`` whose first write leaves it out becomes
        ``next_obs="none"`` and warns once (:class:`NextObsDroppedWarning`).
        """
        if next_obs is None or done is None or self._stand_ins:
            next_obs = self._stand_in(obs, next_obs, done, "add")
        codec = self._codec
        values = (obs, action, reward, next_obs, done)
        if fields or codec.more:
            values = codec.arrange(values, fields, "add")
        if type(stream) is not int or not 0 <= stream <= persistence.MAX_STREAM:
            stream = _check_stream(stream)
        cut = False if truncated is False else _check_truncated(truncated, self.agents, None)
        step = self._step
        if step is None or step[0] is not self.storage or step[1] is not self.sampler:
            step = self._step = self._step_target()
        items = None
        if step[3] and self._mapped is None:
            # the common case: checked and stored by one kernel call under the storage lock
            # (no staging row, so the writer lock is not needed)
            items = codec.step_items(values)
            if items is not None and self._store_step(step, items, stream):
                return
        with self.writer.write_lock:
            # else staged (one kernel, or NumPy per field, or the complete checks), committed
            try:
                rows = codec.stage_step(values, items)
                if rows is None:
                    rows = codec.stage_fast(values, None)
                    if rows is None:
                        rows, _ = codec.stage(dict(zip(codec.field_names, values)), None)
                    if not self._slow_warned:
                        self._warn_slow_step(values, "add")
            except ValueError as exc:
                raise _with_hint(exc, self._leading_axis_hint("add", obs)) from exc
            if step[2] is None:
                self._commit(rows, 1, stream, cut)
            else:
                self._commit_step(step, rows, stream, bool(cut))

    def _add_one(self, values: tuple[Any, ...], stream: int, truncated: Any, per_env: bool) -> bool:
        """A one-step ``extend`` or ``add_envs`` (every item with a leading axis of length 1)
        written as ``add`` writes a step: checked and stored by one kernel call, or staged by
        one kernel and committed as one step. ``False`` where the kernels decline it (nothing
        changed: the general path then decides and explains)."""
        codec = self._codec
        items = codec.step_items(values)
        if items is None:
            return False
        step = self._step
        if step is None or step[0] is not self.storage or step[1] is not self.sampler:
            step = self._step = self._step_target()
        cut = (
            None
            if truncated is False or truncated is None
            else _check_truncated(truncated, self.agents, 1, per_env=per_env)
        )
        if step[3] and self._mapped is None:
            if self._store_step(step, items, stream, _LEADING_KERNELS):
                return True
        with self.writer.write_lock:
            rows = codec.stage_step(values, items, leading=True)
            if rows is None:
                return False
            if step[2] is None:
                self._commit(rows, 1, stream, cut)
            else:
                self._commit_step(step, rows, stream, cut is not None)
        return True

    def extend(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        stream: Any = 0,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """Store ``T`` timesteps at once: like :meth:`add`, each item with a leading time axis
        (``obs[agent]`` of shape ``(T, *obs_shape)``, ``reward[agent]`` of shape ``(T,)``;
        extras, global fields and ``alive`` flags likewise, e.g. ``state`` of shape
        ``(T, *shape)``). An agent missing from ``obs`` of a buffer with ``alive=True`` is
        absent at all T steps.

        The T steps are consecutive steps of one ``stream`` (see :meth:`add`). With
        ``T > capacity`` only the last ``capacity`` timesteps remain, as if added one by one.
        ``truncated`` marks truncated steps (see :meth:`add`): ``False`` (none), an array of
        shape (T,), or per agent a dict or sequence of (T,) arrays. Nothing is written unless
        every value is valid. ``next_obs`` as in :meth:`add`: left out with
        ``next_obs="none"``, required otherwise.
        """
        if next_obs is None or done is None or self._stand_ins:
            next_obs = self._stand_in(obs, next_obs, done, "extend")
        values = (obs, action, reward, next_obs, done)
        if fields or self._codec.more:
            values = self._codec.arrange(values, fields, "extend")
        if type(stream) is not int or not 0 <= stream <= persistence.MAX_STREAM:
            stream = _check_stream(stream)
        # one step of per-agent dicts (the common case): add's path at once
        first = next(iter(obs.values()), None) if type(obs) is dict else None
        if type(first) is np.ndarray and first.ndim and first.shape[0] == 1:
            if self._add_one(values, stream, truncated, False):
                return
        values = self._unstacked(values)
        one = _leading_length(values[0]) == 1
        if one and first is None and self._add_one(values, stream, truncated, False):
            return  # one step given otherwise (lists, stacked arrays, other mappings)
        self._extend(values, stream, 0, truncated)
        if one and not self._slow_warned:
            self._warn_slow_step(values, "extend")

    def add_envs(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any = None,
        done: Any = None,
        first_stream: Any = 0,
        truncated: Any = False,
        **fields: Any,
    ) -> None:
        """Store one step of ``K`` vectorized environments in one call.

        Like :meth:`add` with a leading environment axis on every item (``obs[agent]`` of shape
        ``(K, *obs_shape)``, ``reward[agent]`` of shape ``(K,)``, extras, global fields and
        ``alive`` flags likewise); the K transitions are stored in environment order.
        Environment ``k`` is stream ``first_stream + k``: its next step's ``obs`` is matched
        with this step's ``next_obs`` (observations stored once). ``truncated`` marks truncated
        environments (see :meth:`add`): a bool for all, an array of shape (K,), or per agent a
        dict or sequence of (K,) arrays. Nothing is written unless every value is valid.
        ``next_obs`` as in :meth:`add`: left out with ``next_obs="none"``, required otherwise.
        """
        if next_obs is None or done is None or self._stand_ins:
            next_obs = self._stand_in(obs, next_obs, done, "add_envs")
        values = (obs, action, reward, next_obs, done)
        if fields or self._codec.more:
            values = self._codec.arrange(values, fields, "add_envs")
        first_stream = _check_stream(first_stream)
        # one environment of per-agent dicts (the common case): add's path at once
        first = next(iter(obs.values()), None) if type(obs) is dict else None
        one = type(first) is np.ndarray and first.ndim > 0 and first.shape[0] == 1
        unstacked = not one
        if unstacked:
            values = self._unstacked(values)
            one = _leading_length(values[0]) == 1
        if one and self._add_one(values, first_stream, truncated, True):
            self._declared_envs = 1  # one environment, as the general path records it
            return
        if not unstacked:
            values = self._unstacked(values)
        self._extend(values, None, first_stream, truncated)
        if one and not self._slow_warned:
            self._warn_slow_step(values, "add_envs")

    def _stand_in(self, obs: Any, next_obs: Any, done: Any, call: str) -> Any:
        """What a write passes as ``next_obs`` when it leaves it out or the buffer stores none
        (``next_obs="none"``): ``obs`` itself, staged in the next_obs section of the staging
        rows and dropped by the lean row (so the staging paths stay those of every format);
        else a clear error. While an ``"auto"`` buffer is still deciding, every write comes
        here: it notes whether this call left ``next_obs`` out, and the call's commit (only
        once the call is validated: a rejected write changes nothing) chooses the format. Called
        only when ``next_obs`` or ``done`` is missing, or the buffer stores no next
        observations or is deciding: one check per call, none per row."""
        if done is None:
            if self.next_obs == "none" and next_obs is not None:
                raise TypeError(
                    f"{call}() missing the required argument done; a buffer with "
                    f"next_obs='none' takes no next_obs, so pass done by keyword: "
                    f"{call}(obs, action, reward, done=done)"
                )
            raise TypeError(f"{call}() missing the required argument done")
        if self._deciding:
            self._write_call.none = next_obs is None
            if next_obs is None and self._auto_none and self.next_obs != "none":
                # warned before the call's commit decides: where warnings are errors, the call
                # raises here and nothing changed
                warnings.warn(
                    f"{call}() got no next_obs, so this next_obs='auto' buffer now stores none "
                    "(next_obs='none'): batches will hold no next observations and later writes "
                    "must leave next_obs out. To keep next observations, pass next_obs=... to "
                    "every write; to choose this format without this warning, build the buffer "
                    "with next_obs='none'",
                    NextObsDroppedWarning,
                    stacklevel=3,
                )
            return obs if next_obs is None else next_obs
        if next_obs is None:
            if self.next_obs == "none":
                return obs
            if self._auto_none:
                how = (
                    f"next_obs='auto' chose {self.next_obs!r} at this buffer's first write, "
                    "which passed next_obs"
                )
            elif self._mapped is not None:
                how = (
                    f"this memory-mapped buffer was built with next_obs={self.next_obs!r} (its "
                    "files are laid out when it is built, so next_obs='auto' cannot drop "
                    "next_obs at the first write)"
                )
            else:
                how = f"this buffer was built with next_obs={self.next_obs!r}"
            raise ValueError(
                f"{call}() got no next_obs, but {how} and keeps next observations: pass "
                "next_obs=..., or build the buffer with next_obs='none' to store none (for "
                "learners that never read next_obs)"
            )
        chosen = ", chosen by its first write, which had none" if self._auto_none else ""
        raise ValueError(
            f"{call}() got next_obs, but this buffer stores no next observations "
            f"(next_obs='none'{chosen}): leave next_obs out ({call}(obs, action, reward, "
            "done=done)), or build the buffer with next_obs='auto', 'once' or 'stored' to keep "
            "them"
        )

    def _decide(self, rows: np.ndarray, steps: int, streams: int | np.ndarray) -> None:
        """The first commit of a ``next_obs="auto"`` buffer (under ``writer.lock``, the call
        validated, nothing stored yet) chooses its format: ``"none"`` when the call left
        ``next_obs`` out, ``"stored"`` for an ``extend`` of independent transitions (see
        :meth:`_independent`), else the format it has. Writers that race to be the first write,
        one with and one without ``next_obs``, are not told apart: the first to commit
        decides."""
        if getattr(self._write_call, "none", False) and self._auto_none:
            self._drop_next_obs()
        elif self._choose_format and steps > 1 and isinstance(streams, int):
            if self._independent(rows):
                self._store_next_obs()
        self._decided()

    def _decided(self) -> None:
        """The format is final: writes take their usual paths from now on."""
        self._deciding = self._choose_format = False
        self._stand_ins = self.next_obs == "none"
        self._step = None  # add's one-step target, recomputed for the chosen store

    def _drop_next_obs(self) -> None:
        """Make this ``next_obs="auto"`` buffer, still empty, ``next_obs="none"`` (its first
        write has no next observations): a store of lean rows without links takes the place of
        the one built for the format ``"auto"`` assumed, and the episode index stops looking
        for stream breaks (which it finds by comparing obs with the previous next_obs)."""
        self._switch_format("none")
        if self.episodes is not None:
            self.episodes.obs_bytes = 0

    def _extend(
        self,
        fields: tuple[Any, ...],
        stream: int | None,
        first_stream: int = 0,
        truncated: Any = False,
    ) -> None:
        # the fast path checks every item's shape against the first observation's length, so
        # the complete length check (a loop over every item) runs only when it declines
        call = "extend" if stream is not None else "add_envs"
        guess = _leading_length(fields[0])
        with self.writer.write_lock:
            try:
                rows = None if guess is None else self._codec.stage_fast(fields, guess)
                if rows is None:
                    named = dict(zip(self._codec.field_names, fields))
                    steps = steps_of(self._codec, named)
                    rows, _ = self._codec.stage(named, steps)
                else:
                    steps = int(rows.shape[0])  # the guessed length, confirmed by the fast path
            except ValueError as exc:
                raise _with_hint(exc, self._leading_axis_hint(call, fields[0])) from exc
            if stream is None and first_stream + steps - 1 > persistence.MAX_STREAM:
                raise ValueError(
                    f"add_envs numbers its {steps} environments' streams from first_stream="
                    f"{first_stream}, past the largest stream id {persistence.MAX_STREAM} "
                    "(int64); pass a smaller first_stream"
                )
            streams: int | np.ndarray = (
                stream if stream is not None else first_stream + np.arange(steps, dtype=np.int64)
            )
            cut = _check_truncated(truncated, self.agents, steps, per_env=stream is None)
            if stream is not None and 1 < steps == self._declared_envs:
                self._refuse_environments(rows, steps, cut)
            self._commit(rows, steps, streams, cut)
            if stream is None:
                self._declared_envs = steps

    def _unstacked(self, fields: tuple[Any, ...]) -> tuple[Any, ...]:
        """``fields`` of ``extend``/``add_envs`` with every per-agent field given as one stacked
        array of shape ``(K, n_agents, ...)`` split into its agents' ``(K, ...)`` views.

        An array whose first axis is the number of agents is left alone: it is read in agent
        order, as before (a stacked array of exactly ``n_agents`` steps or environments must be
        given per agent)."""
        n_agents = len(self.specs)
        out = list(fields)
        for k, (name, value) in enumerate(zip(self._codec.field_names, fields)):
            if (
                name not in self.global_fields
                and isinstance(value, np.ndarray)
                and value.ndim >= 2
                and value.shape[1] == n_agents
                and value.shape[0] != n_agents
            ):
                out[k] = [value[:, i] for i in range(n_agents)]
        return tuple(out)

    def _leading_axis_hint(self, call: str, obs: Any) -> str:
        """What to call instead, for a shape error of ``call`` whose ``obs`` has one leading
        axis more than ``call`` takes ("" when it has not)."""
        first = obs.get(self.agents[0]) if isinstance(obs, Mapping) else None
        if first is None and isinstance(obs, np.ndarray) and obs.ndim >= 1:
            if obs.shape[0] == len(self.specs):
                first = obs[0]
            elif obs.ndim >= 2:  # a stacked (K, n_agents, ...) array
                first = obs[:, 0]
        ndim = len(self.specs[self.agents[0]].obs_shape)
        try:
            shape = np.shape(first) if first is not None else ()
        except (ValueError, TypeError):  # not one array (a ragged list): no hint to give
            return ""
        if call == "add" and len(shape) == ndim + 1:
            return (
                f"; obs has a leading axis of {shape[0]}: for one step of {shape[0]} vectorized "
                f"environments use add_envs (environment k is stream first_stream + k), for "
                f"{shape[0]} consecutive steps of one environment use extend"
            )
        if call != "add" and len(shape) == ndim + 2:
            return (
                f"; obs has two leading axes {shape[:2]}: {call} takes one leading "
                f"{'time' if call == 'extend' else 'environment'} axis (per agent, or one "
                "stacked (K, n_agents, ...) array); write each environment's steps with "
                "extend(..., stream=k), or each step of all environments with add_envs"
            )
        return ""

    def _refuse_environments(self, rows: np.ndarray, steps: int, truncated: Any) -> None:
        """Refuse an ``extend`` of as many steps as ``add_envs`` had environments when every
        step breaks the stream (its obs differs from the next_obs of the previous step, which
        no agent ended and which was not truncated): one step of every environment given as
        consecutive steps of one stream. Without next observations (``next_obs="none"``) no
        step can be told to break its stream: nothing is refused."""
        if self.next_obs == "none":
            return
        codec = self._codec
        raw = rows.view(np.uint8)
        obs = raw[1:, : codec.obs_bytes]
        previous_next = raw[:-1, codec.next_obs_start : codec.next_obs_start + codec.obs_bytes]
        quiet, full = self._break_flags(rows)
        breaks = ~(obs == previous_next).all(axis=1) & quiet[:-1] & full[1:]
        if truncated is not None and truncated is not False:
            breaks &= ~np.asarray(truncated, dtype=bool)[:-1]
        if not breaks.all():
            return
        raise ValueError(
            f"extend got {steps} steps, the number of environments add_envs wrote, and no "
            "step's obs is the previous step's next_obs: this looks like one step of "
            f"{steps} environments given as {steps} consecutive steps of one stream. Use "
            "add_envs for it (environment k is stream first_stream + k), or extend each "
            "environment's own steps with stream=k"
        )

    def _commit(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray,
        truncated: bool | np.ndarray | None = None,
    ) -> None:
        """Write validated staging rows; the only place storage and metadata change.

        ``truncated`` (bool for one step, shape (steps,) bool, or ``None`` for none) marks
        truncated steps for the episode index."""
        writer = self.writer
        episodes = self.episodes
        ends = None
        if episodes is not None:  # before anything changes: a failure here changes nothing
            ends = self._done_reader(rows)
            if truncated is not None and truncated is not False:
                ends = ends | truncated
        with writer.lock:
            if self._deciding:  # next_obs="auto": the first write chooses the format
                self._decide(rows, steps, streams)
            if self._mapped is not None:  # the redo record first: a crash never sees half a write
                self._mapped.log(rows, steps, streams, truncated)
            skip, slots = writer.plan(steps)
            kept = rows[skip:] if skip else rows
            every_stream = streams  # the episode index counts the skipped steps too
            if skip and not isinstance(streams, int):
                streams = streams[skip:]  # those environments' steps are overwritten at once
            if self.links is not None and steps == 1 and isinstance(streams, int):
                self.links.commit_one(
                    writer.cursor,
                    kept.view(np.uint8)[0],
                    streams,
                    writer.total_writes,
                    self._codec.next_obs_start,
                    writer.write_generation,
                )
            elif self.links is not None:
                generations = writer.total_writes + skip + np.arange(slots.shape[0])
                self.links.commit(
                    slots,
                    kept.view(np.uint8),
                    streams,
                    generations,
                    self._codec.next_obs_start,
                    writer.write_generation,
                )
            if episodes is not None and ends is not None:
                breaks = episodes.breaks
                if steps == 1 and isinstance(streams, int):
                    episodes.commit_one(
                        writer.cursor,
                        bool(ends[0]),
                        streams,
                        writer.total_writes,
                        writer.write_generation,
                        rows.view(np.uint8)[0],
                        *(bool(flag[0]) for flag in self._break_flags(rows)),
                    )
                else:
                    generation = writer.total_writes
                    episodes.commit(
                        slots,
                        ends,
                        every_stream,
                        skip,
                        generation,
                        writer.write_generation,
                        rows.view(np.uint8),
                        *self._break_flags(rows),
                    )
                if episodes.breaks != breaks and not self._breaks_warned:
                    self._warn_stream_break()
            self.storage.write(slots, kept, None)
            writer.advance(slots, steps, skip)
            self.sampler.on_write(slots)
            if self._mapped is not None:
                self._mapped.committed()
            if self.links is not None and not self._format_warned:
                self._check_side_share()

    def _replay(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray,
        truncated: bool | np.ndarray | None = None,
    ) -> None:
        """:meth:`_commit` of a write logged by the process that made it (a memory-mapped
        folder's redo log, run again on reopening): that process gave the warnings."""
        warned = self._breaks_warned, self._format_warned
        self._breaks_warned = self._format_warned = True
        try:
            self._commit(rows, steps, streams, truncated)
        finally:
            self._breaks_warned, self._format_warned = warned

    def _step_target(self) -> tuple[Any, ...]:
        """What ``add`` needs to write one step, for the current storage and sampler:
        ``(storage, sampler, table, direct, on_write, typed)``. ``table`` is the storage's row table
        when a commit kernel can store a staged row there (interleaved rows in RAM, this
        class's own commit), else ``None`` (:meth:`_commit` then); ``direct`` says whether the
        store kernels may check and store a step straight from the caller's values (also: no
        sequence bookkeeping, no fields beyond the five; memory-mapped buffers are told apart
        per call); ``on_write`` is the sampler's hook, ``None`` when it does nothing; ``typed``
        the table viewed in the dtype of the five fields (for the store kernels)."""
        storage, sampler = self.storage, self.sampler
        table = getattr(storage, "table", None)
        kernel = (
            type(self)._commit is MultiAgentReplayBuffer._commit
            and storage.stores_next_obs  # the kernels store dense rows or rows with links
            and storage.layout == "interleaved"
            and type(table) is np.ndarray
            and table.dtype == np.uint64
            and table.flags.c_contiguous
        )
        kernel = kernel and not self._deciding  # the first write of "auto" chooses in _commit
        plan = self._codec.step_plan
        direct = kernel and plan is not None and self.episodes is None and not self._codec.more
        on_write = None if type(sampler).on_write is Sampler.on_write else sampler.on_write
        typed = None
        if direct and table is not None and plan is not None:
            typed = table.view(plan.dtype)
        return storage, sampler, table if kernel else None, direct, on_write, typed

    def _store_step(
        self,
        step: tuple[Any, ...],
        items: StepItems,
        stream: int,
        kernels: tuple[Any, Any] = (store_dense_step, store_lean_step),
    ) -> bool:
        """Check and store one step of ``add`` (``items``: :meth:`RowCodec.step_items`) by one
        kernel call under the storage lock (:func:`marlbuf._kernels.store_dense_step` /
        :func:`~marlbuf._kernels.store_lean_step`); ``False`` when the kernel declined it
        (nothing changed: the caller stages it, and the complete checks explain).
        ``kernels``: the dense and lean kernels (:data:`_LEADING_KERNELS` for the items of a
        one-step ``extend``/``add_envs``)."""
        _, _, _, _, on_write, table = step
        store_dense, store_lean = kernels
        plan = self._codec.step_plan
        if plan is None:
            return False  # turned off since (see RowCodec.step_failed)
        writer = self.writer
        links = self.links
        with writer.lock:
            slot = writer.cursor
            generation = writer.total_writes
            try:
                if links is None:
                    if not store_dense(
                        *items,
                        plan.plan,
                        plan.dense_gaps,
                        table,
                        slot,
                        generation,
                        writer.write_generation,
                    ):
                        return False
                else:
                    free = links.free
                    if not free:
                        return False  # the side table must grow: after the checks, staged
                    pending = links.pending
                    prev_slot, prev_generation = pending.get(stream, _NO_PENDING)
                    code = store_lean(
                        *items,
                        plan.plan,
                        plan.lean_gaps,
                        table,
                        slot,
                        generation,
                        writer.write_generation,
                        links.side_words,
                        links.pointers,
                        prev_slot,
                        prev_generation,
                        free[-1],
                    )
                    if code == STEP_DECLINED:
                        return False
                    if code >= 0:  # NextObsLinks.apply_step_code, inline
                        free.append(code)
                    elif code == -2:
                        free.pop()
                    pending[stream] = (slot, generation)
            except Exception as exc:  # a value Numba cannot type (nothing ran): the others
                self._codec.step_failed(exc)
                return False
            self._advance_one(slot, generation, on_write)
            # the side-table share grows only when a side row is taken (or the size reaches
            # the warning's minimum)
            if (
                links is not None
                and (code == -2 or writer.size == _config.SIDE_TABLE_WARN_ROWS)
                and self._side_share_due()
            ):
                self._check_side_share()
        return True

    def _advance_one(self, slot: int, generation: int, on_write: Any) -> None:
        """The bookkeeping after one step was stored at ``slot`` (under the storage lock)."""
        self._choose_format = False  # a first write of one step keeps the format
        slots = self.writer.advance_one(slot, generation)
        if on_write is not None:
            on_write(slots)

    def _side_share_due(self) -> bool:
        """Whether :meth:`_check_side_share` would warn now (cheaply: checked after every
        one-step write)."""
        links = self.links
        if links is None or self._format_warned:
            return False
        size = self.writer.size
        return size >= _config.SIDE_TABLE_WARN_ROWS and 2 * links.side_rows_used > size

    def _commit_step(
        self, step: tuple[Any, ...], rows: np.ndarray, stream: int, truncated: bool
    ) -> None:
        """:meth:`_commit` of one staged step (``add``) into interleaved rows: the link update
        (observations stored once), the row store and its write generation in one kernel call
        (:func:`marlbuf._kernels.commit_lean_step` / :func:`~marlbuf._kernels.commit_dense_step`),
        the rest of the bookkeeping with scalars."""
        _, _, table, _, on_write, _ = step
        writer = self.writer
        codec = self._codec
        row = rows[0]
        episodes = self.episodes
        ends = False
        if episodes is not None:  # before anything changes: a failure here changes nothing
            ends = truncated or bool(self._done_reader(rows)[0])
        with writer.lock:
            mapped = self._mapped
            if mapped is not None:  # the redo record first: a crash never sees half a write
                mapped.log(rows, 1, stream, truncated)
            slot = writer.cursor
            generation = writer.total_writes
            links = self.links
            if links is not None and not links.free:
                links.reserve(1)  # before anything changes (MemoryError changes nothing)
            if episodes is not None:
                breaks = episodes.breaks
                quiet, full = self._break_flags(rows)
                episodes.commit_one(
                    slot,
                    ends,
                    stream,
                    generation,
                    writer.write_generation,
                    rows.view(np.uint8)[0],
                    bool(quiet[0]),
                    bool(full[0]),
                )
                if episodes.breaks != breaks and not self._breaks_warned:
                    self._warn_stream_break()
            if links is None:
                commit_dense_step(table, row, slot, generation, writer.write_generation)
            else:
                prev = links.pending.get(stream)
                prev_slot, prev_generation = prev if prev is not None else (-1, -1)
                code = commit_lean_step(
                    table,
                    row,
                    slot,
                    generation,
                    writer.write_generation,
                    codec.lean_words,
                    links.side_words,
                    links.next_slot,
                    links.side_row,
                    prev_slot,
                    prev_generation,
                    links.free[-1],
                )
                if code != -1:
                    links.apply_step_code(code)
                links.pending[stream] = (slot, generation)
            self._advance_one(slot, generation, on_write)
            if mapped is not None:
                mapped.committed()
            if links is not None and self._side_share_due():
                self._check_side_share()

    def _independent(self, rows: np.ndarray) -> bool:
        """Whether most of the consecutive staged ``rows`` (one stream) have a ``next_obs``
        that differs from the following row's ``obs`` (independent transitions)."""
        raw = rows.view(np.uint8)
        codec = self._codec
        obs = raw[1:, : codec.obs_bytes]
        previous_next = raw[:-1, codec.next_obs_start : codec.next_obs_start + codec.obs_bytes]
        linked = int(np.count_nonzero((previous_next == obs).all(axis=1)))
        return 2 * linked < rows.shape[0] - 1

    def _store_next_obs(self) -> None:
        """Switch the (still empty) buffer to ``next_obs="stored"``, if its dense rows fit in
        memory (else it keeps ``"once"``, and the side-table warning explains)."""
        storage = self.storage
        needed = estimate(
            self.specs,
            self.capacity,
            storage.layout,
            "stored",
            prioritized=self.sampler.weighted,
            n_trainers=self.n_trainers,
            episodes=self.sampler.needs_episodes,
            global_fields=self.global_fields,
            alive=self.alive,
        )
        available = available_memory_bytes()
        if available is not None and needed.total_bytes > _config.MEMORY_WARN_FRACTION * (
            available + storage.nbytes
        ):
            return
        self._switch_format("stored")

    def _switch_format(self, next_obs: str) -> None:
        """Give the (still empty) buffer a new store of the same layout and options whose rows
        keep next observations (``"stored"``) or not (``"none"``), without links."""
        storage = self.storage
        store = make_store(
            storage.layout,
            self._codec,
            self.capacity,
            storage.pool.max_blocks,
            storage.batch_layout,
            None,
            storage.batch_dtype,
            device=self.device,
            stores_next_obs=next_obs != "none",
        )
        store.parallel_gather = storage.parallel_gather
        self.storage = store
        self.links = None
        self.next_obs = next_obs

    def _warn_slow_step(self, values: tuple[Any, ...], call: str) -> None:
        """Warn once that a valid step took a staging path slower than the one-kernel write
        path, naming the input that sent it there and the fix (:class:`SlowWriteWarning`).
        Nothing is said where no input is to blame (an absent agent of an ``alive=True``
        buffer, a value the kernels cannot type)."""
        self._slow_warned = True
        reason = self._codec.slow_reason(values)
        if reason is None:
            return
        warnings.warn(
            f"{call}() wrote a valid step through a slower staging path (several times the "
            f"one-kernel write) because {reason}. This warning is given once per buffer",
            SlowWriteWarning,
            stacklevel=3,
        )

    def _warn_stream_break(self) -> None:
        """Warn once that a stream break ended an episode (see :class:`StreamBreakWarning`)."""
        self._breaks_warned = True
        warnings.warn(
            "a step's obs differs from the next_obs of the previous step written on the same "
            "stream, which was neither done nor truncated: several environments seem to be "
            "written in turn on one stream. The episode was ended there, so sequences and "
            "episodes never mix environments, but they are cut short. Write each environment "
            "on its own stream (add(..., stream=k)) or all of them at once with add_envs",
            StreamBreakWarning,
            stacklevel=4,
        )

    def _check_side_share(self) -> None:
        """Warn once when most stored steps keep their next_obs in the side table."""
        size = self.writer.size
        links = self.links
        assert links is not None
        if size < _config.SIDE_TABLE_WARN_ROWS or 2 * links.side_rows_used <= size:
            return
        self._format_warned = True
        warnings.warn(
            f"{links.side_rows_used} of the {size} stored steps keep their next_obs in the side "
            "table: this buffer stores observations once (next_obs='once'), which saves memory "
            "only when a step's next_obs is the obs of the next step written on the same "
            "stream. Write each environment on its own stream (add(..., stream=k), or "
            "add_envs for vectorized environments); for independent transitions (a dataset, "
            "shuffled steps) build the buffer with next_obs='stored'",
            NextObsWarning,
            stacklevel=4,
        )

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

    def sample(
        self,
        batch_size: int,
        trainer: int = 0,
        out: Any = None,
        fields: tuple[str, ...] | None = None,
    ) -> Batch:
        """Draw one batch of ``batch_size`` joint transitions with the buffer's sampler.

        Parameters
        ----------
        batch_size : int
            Rows in the batch. ``Uniform`` and ``Neighbor`` need at least as many stored
            transitions; prioritized samplers draw with replacement by design and accept more.
        trainer : int, default 0
            Which trainer's sampler state (priority tree) to use.
        out : Batch, optional
            A batch of the same size from an earlier call of this buffer whose memory is
            overwritten instead of taking a new block (its arrays then hold the new rows).
            Checked: a batch of another size, layout, ``fields=`` or buffer is a ``ValueError``.
        fields : tuple of str, optional
            Gather only these fields (of the five, extra and global field names, ``"alive"``),
            e.g. ``fields=("obs", "action", "reward", "state")``: the batch holds and copies
            their bytes only (a row format of the chosen fields, see
            :class:`marlbuf.storage.FieldSelection`); a left-out field raises a ``ValueError``
            naming ``fields=`` when used. ``None`` (default): every field.

        Safe to call from several threads while others write (see :mod:`marlbuf.writer`).
        """
        trainer = self._check_trainer(trainer)
        batch_size = self.sampler.check_batch_size(batch_size)
        select = None if fields is None else self._selection(fields)
        out_block = None if out is None else self._out_block(out, batch_size, select)
        with self.writer.lock:
            self._check_enough(batch_size)
            if self._deferred:
                self.apply_deferred_updates()
            indices, weights = self.sampler.sample(batch_size, self.size, self.rng, trainer)
            if self._sequence is not None:
                return self._gather_sequences(indices, weights, trainer, out_block, select)
            if isinstance(self.sampler, EpisodesSampler):
                return self._gather_episodes(indices, weights, trainer, out_block, select)
            return self._gather(indices, weights, trainer, out_block, select)

    def _selection(self, fields: Any) -> FieldSelection | None:
        """The storage's selection of ``fields`` (checked), ``None`` for every stored field
        (the storage's default gather)."""
        storage = self.storage
        if (
            not storage.stores_next_obs
            and isinstance(fields, (tuple, list))
            and "next_obs" in fields
        ):
            raise ValueError(
                f"fields={tuple(fields)!r} names 'next_obs', but this buffer stores no next "
                "observations (next_obs='none'); choose among its fields "
                f"{storage.field_names}, or build the buffer with next_obs='auto', 'once' or "
                "'stored' to keep them"
            )
        names = check_fields(fields, storage.field_names)
        return None if names is None else storage.selection(names)

    def _check_enough(self, batch_size: int) -> None:
        size = self.writer.size
        if size == 0:
            raise ValueError(
                f"the buffer is empty: add transitions before sampling (batch_size={batch_size})"
            )

    def _out_block(self, out: Any, batch_size: int, select: FieldSelection | None = None) -> Any:
        kind = "DeviceBatch" if self.device is not None else "Batch"
        # a sequence batch (of any store) holds its mask; read from the instance dict, since a
        # Batch's attribute fallback (extra fields) costs microseconds per miss
        sequence = "mask" in getattr(out, "__dict__", ())
        if self._sequence is not None:  # a sequence batch is B * L gathered rows
            if not sequence or not hasattr(out, "block"):
                raise TypeError(
                    f"out must be a {kind.replace('Batch', 'SequenceBatch')} from this "
                    f"buffer's sample (it samples sequences); got {type(out).__name__}"
                )
            return self.storage.check_out_block(
                out.block, batch_size * self._sequence.steps, select
            )
        if isinstance(self.sampler, EpisodesSampler):
            steps = self.sampler.max_length
            if steps is None or not isinstance(out, EpisodeBatch):
                raise TypeError(
                    "out= with an Episodes sampler needs Episodes(max_length=...) (batches of a "
                    "fixed shape) and an EpisodeBatch from this buffer's sample; got "
                    f"max_length={steps}, out={type(out).__name__}"
                )
            return self.storage.check_out_block(out.block, batch_size * steps, select)
        if sequence or not hasattr(out, "block"):
            raise TypeError(f"out must be a {kind} from this buffer; got {type(out).__name__}")
        return self.storage.check_out_block(out.block, batch_size, select)

    def sample_for_trainers(
        self,
        batch_size: int,
        n_trainers: int | None = None,
        shared_index: bool = False,
        out: Sequence[Any] | None = None,
        fields: tuple[str, ...] | None = None,
    ) -> list[Batch]:
        """The MADDPG sampling round: per trainer, one index array and the joint batch of all
        agents at those indices (the O(N²B) workload of Gogineni et al.).

        Every batch of the round is alive at once (``n_trainers`` blocks of memory); a learner
        that consumes one trainer's batch at a time should use :meth:`iter_trainers`.

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
            Batches from an earlier round to overwrite; each must be a distinct block (a
            ``shared_index=True`` round returns one batch N times: pass it only with
            ``shared_index=True``).
        fields : tuple of str, optional
            Gather only these fields (of the five, extra and global field names, ``"alive"``),
            e.g. ``fields=("obs", "action", "reward", "state")``: the batch holds and copies
            their bytes only (a row format of the chosen fields, see
            :class:`marlbuf.storage.FieldSelection`); a left-out field raises a ``ValueError``
            naming ``fields=`` when used. ``None`` (default): every field.
        """
        n_trainers = self._check_n_trainers(n_trainers)
        select = None if fields is None else self._selection(fields)
        if out is not None:
            out = list(out)
            if len(out) != n_trainers:
                raise ValueError(f"out must hold {n_trainers} batches; got {len(out)}")
            blocks = [self._out_block(b, batch_size, select) for b in out]
            addresses = [self.storage.block_address(b) for b in blocks]
            if not shared_index and len(set(addresses)) != len(addresses):
                raise ValueError(
                    "out holds the same batch (or memory) more than once, so trainers would "
                    "overwrite each other's rows; pass distinct batches (a shared_index=True "
                    "round's output can only be reused by another shared_index=True round)"
                )
        if shared_index:
            if self.sampler.weighted:
                raise ValueError(
                    "shared_index=True cannot be combined with a prioritized sampler: each "
                    "trainer has its own priority tree"
                )
            batch = self.sample(batch_size, 0, None if out is None else out[0], fields)
            return [batch] * n_trainers
        if self._sequence is None and self.device is not None:
            return self._round(batch_size, n_trainers, None if out is None else blocks, select)
        return [
            self.sample(batch_size, t, None if out is None else out[t], fields)
            for t in range(n_trainers)
        ]

    def _round(
        self,
        batch_size: int,
        n_trainers: int,
        blocks: list[Any] | None,
        select: FieldSelection | None = None,
    ) -> list[Any]:
        """The round with the draws of :meth:`sample` in trainer order, gathered at once where
        the store does that (a device store: one ``index_select`` of ``n_trainers *
        batch_size`` rows into one block, or into the checked ``out=`` ``blocks`` of an earlier
        round), else trainer by trainer."""
        batch_size = self.sampler.check_batch_size(batch_size)
        with self.writer.lock:
            self._check_enough(batch_size)
            if self._deferred:
                self.apply_deferred_updates()
            draws, weights, generations, drawn = [], [], [], []
            for t in range(n_trainers):
                indices, w = self.sampler.sample(batch_size, self.size, self.rng, t)
                indices = np.ascontiguousarray(indices)
                gens = self.writer.write_generation[indices]
                draws.append(indices)
                weights.append(w)
                generations.append(gens)
                drawn.append(DrawnIndices.of(indices, gens))
            batches = (
                None
                if select is not None  # a round block holds whole rows: gather per trainer
                else self.storage.gather_round(
                    draws, weights, generations, list(range(n_trainers)), drawn, blocks
                )
            )
            if batches is None:  # gathered per trainer, from the same draws
                return [
                    self._gather(
                        draws[t], weights[t], t, None if blocks is None else blocks[t], select
                    )
                    for t in range(n_trainers)
                ]
            if self._last_drawn:
                self._last_drawn[:n_trainers] = drawn
            return batches

    def iter_trainers(
        self,
        batch_size: int,
        n_trainers: int | None = None,
        fields: tuple[str, ...] | None = None,
    ) -> Iterator[Batch]:
        """The MADDPG round as a stream: yields trainer 0's batch, then trainer 1's, ...

        Same draws as :meth:`sample_for_trainers` for the same seed. A learner that consumes
        each batch before asking for the next keeps one or two batches alive, so their memory
        is recycled and stays in cache (``sample_for_trainers`` keeps all of them alive).
        ``fields`` as in :meth:`sample`. Its arguments are checked at the call, before the
        first batch.
        """
        n_trainers = self._check_n_trainers(n_trainers)
        if fields is not None:
            self._selection(fields)
        return (self.sample(batch_size, t, None, fields) for t in range(n_trainers))

    def _check_n_trainers(self, n_trainers: Any) -> int:
        if n_trainers is None:
            return self.n_trainers
        if isinstance(n_trainers, bool) or not isinstance(n_trainers, (int, np.integer)):
            raise TypeError(f"n_trainers must be an int; got n_trainers={n_trainers!r}")
        if not 1 <= n_trainers <= self.n_trainers:
            raise ValueError(
                f"n_trainers must be in [1, {self.n_trainers}]; got n_trainers={n_trainers}"
            )
        return int(n_trainers)

    def check_trainer(self, trainer: Any) -> int:
        """``trainer`` as this buffer's methods check it: an int in ``[0, n_trainers)``.

        For code that takes a trainer on this buffer's behalf (a sharded buffer's learner).

        Raises
        ------
        TypeError
            ``trainer`` is not an int (a bool is not one).
        ValueError
            It is outside ``[0, n_trainers)``.
        """
        return self._check_trainer(trainer)

    def check_n_trainers(self, n_trainers: Any) -> int:
        """``n_trainers`` of a round as :meth:`sample_for_trainers` checks it: ``None`` gives
        the buffer's ``n_trainers``, else an int in ``[1, n_trainers]`` (``TypeError`` or
        ``ValueError`` otherwise)."""
        return self._check_n_trainers(n_trainers)

    def sample_prefix(
        self,
        batch_size: int,
        size: int,
        trainer: int = 0,
        out: Batch | None = None,
        fields: tuple[str, ...] | None = None,
    ) -> Batch:
        """One batch drawn by the buffer's sampler from slots ``[0, size)`` only, as
        :meth:`sample` would draw it if the buffer held just those (under the buffer's lock).

        This is one shard's part of a draw over several buffers
        (:class:`marlbuf.distributed.ShardedReplayBuffer`): the learner split the batch by
        the sizes it counted, and a shard that received writes since draws from those slots
        only, so the global draw is exact for the counted state. The sampler is asked through
        :meth:`marlbuf.samplers.Sampler.sample_share` (``Uniform(replace=True)`` may draw more
        rows than ``size``, as it may in :meth:`sample`).

        Parameters
        ----------
        batch_size : int
            Rows in the batch (checked by the sampler, as :meth:`sample`).
        size : int
            Slots to draw from, in ``[1, len(self)]``. Samplers that draw from state kept per
            slot (priority trees, the episode index) draw from every stored slot, so for them
            ``size`` must be ``len(self)``.
        trainer : int, default 0
            Whose sampler state to use.
        out : Batch, optional
            As in :meth:`sample`.
        fields : tuple of str, optional
            As in :meth:`sample`.

        Returns
        -------
        Batch
            As :meth:`sample` returns (a sequence batch for sequence samplers).
        """
        trainer = self._check_trainer(trainer)
        batch_size = self.sampler.check_batch_size(batch_size)
        select = None if fields is None else self._selection(fields)
        out_block = None if out is None else self._out_block(out, batch_size, select)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size must be an int; got size={size!r}")
        with self.writer.lock:
            self._check_enough(batch_size)
            whole = self.sampler.weighted or self.episodes is not None
            if whole and size != self.size:
                raise ValueError(
                    f"size must be len(self)={self.size}: {self.sampler!r} draws from every "
                    f"stored slot; got size={size}"
                )
            if not 1 <= size <= self.size:
                raise ValueError(
                    f"size must be in [1, {self.size}] (the stored slots); got size={size}"
                )
            if self._deferred:
                self.apply_deferred_updates()
            indices, weights = self.sampler.sample_share(batch_size, int(size), self.rng, trainer)
            if self._sequence is not None:
                return self._gather_sequences(indices, weights, trainer, out_block, select)
            if isinstance(self.sampler, EpisodesSampler):
                return self._gather_episodes(indices, weights, trainer, out_block, select)
            return self._gather(indices, weights, trainer, out_block, select)

    def gather(
        self, indices: Any, trainer: int | None = None, fields: tuple[str, ...] | None = None
    ) -> Batch:
        """The joint batch at explicit ``indices`` (shape (B,), ints in ``[0, len(self))``,
        ``B >= 1``: empty ``indices`` are a ``ValueError``, like ``latest(0)``); ``fields`` as
        in :meth:`sample`."""
        if trainer is not None:
            trainer = self._check_trainer(trainer)
        select = None if fields is None else self._selection(fields)
        with self.writer.lock:
            checked = self._check_indices(indices)
            if not checked.size:
                raise ValueError(
                    "indices is empty; gather needs at least one index (a batch of no "
                    "transitions has no rows to gather)"
                )
            return self._gather(checked, None, trainer, None, select)

    def latest(self, n: int) -> Batch:
        """The newest ``n`` joint transitions, oldest first (``n <= len(self)``)."""
        with self.writer.lock:
            return self._gather(self.writer.newest(self._check_latest(n)), None, None, None)

    def _check_latest(self, n: Any) -> int:
        """``n`` of :meth:`latest`, checked against the stored transitions (under the lock)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int; got n={n!r}")
        if not 0 < n <= self.size:
            raise ValueError(f"n must be in [1, {self.size}] (the stored transitions); got n={n}")
        return int(n)

    @overload
    def stored(
        self, field: Literal["obs", "action", "reward", "next_obs", "done", "alive"]
    ) -> dict[str, np.ndarray]: ...

    @overload
    def stored(self, field: str) -> Any: ...

    def stored(self, field: str) -> Any:
        """Read-only views of one field over the filled slots, per agent.

        ``stored("reward")["agent_0"]`` has shape ``(len(self),)``; slots are in ring order
        (slot 0 first, not oldest first: see :attr:`cursor`). The views see later writes; copy
        them to keep a snapshot. With the interleaved layout they are strided (one joint row
        apart). ``next_obs`` of a buffer with observations stored once is not stored as such:
        it is assembled by a gather of every filled slot (a read-only copy, O(len(self)));
        a buffer with ``next_obs="none"`` has none (a ``ValueError``).
        Extra fields and ``"alive"`` (bool) are per agent like the five fields; a global field
        is one array of shape ``(len(self), *shape)``.
        """
        names = self._codec.field_names
        if field not in names:
            raise ValueError(f"field must be one of {names}; got field={field!r}")
        with self.writer.lock:
            size = self.size
            if field in self.global_fields:
                return self.storage.read_field(field, GLOBAL, size)
            return {a: self.storage.read_field(field, a, size) for a in self.specs}

    def reward_stats(self) -> dict[str, tuple[float, float]]:
        """Mean and standard deviation of every stored reward, per agent (for reward
        normalisation and logging): ``{agent: (mean, std)}``, accumulated in float64.

        Reads the stored rewards once (O(len(self)), nothing is added to the write path).
        """
        with self.writer.lock:
            if self.size == 0:
                raise ValueError("reward_stats needs data: the buffer is empty")
            out = {}
            for agent, values in self.stored("reward").items():
                v = values.astype(np.float64)
                out[agent] = (float(v.mean()), float(v.std()))
            return out

    def _check_indices(self, indices: Any) -> np.ndarray:
        """``indices`` as a 1-D int64 array of filled slots, or a clear error."""
        idx = np.asarray(indices)
        if idx.shape == (0,):  # [] is float64 to NumPy: no values, so no wrong type
            return np.empty(0, dtype=np.int64)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError(
                f"indices must be a 1-D integer array; got shape {idx.shape}, dtype {idx.dtype}"
            )
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ValueError(
                f"indices must lie in [0, {self.size}) (the filled slots); "
                f"got min {idx.min()}, max {idx.max()}"
            )
        return np.ascontiguousarray(idx, dtype=np.int64)

    def _gather(
        self,
        indices: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> Batch:
        """Gather under ``writer.lock`` (held by the caller)."""
        indices = np.ascontiguousarray(indices)
        if select is None:
            fields, block = self.storage.gather(indices, out_block)
        else:
            fields, block = self.storage.gather(indices, out_block, select)
        generations = self.writer.write_generation[indices]
        drawn = DrawnIndices.of(indices, generations)
        if self._last_drawn and trainer is not None:
            self._last_drawn[trainer] = drawn
        if select is None:
            return self.storage.make_batch(fields, block, drawn, generations, weights, trainer)
        return self.storage.make_batch(fields, block, drawn, generations, weights, trainer, select)

    def _gather_sequences(
        self,
        starts: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> SequenceBatch:
        """The sequences around training ``starts`` (shape (B,), int64), under ``writer.lock``:
        the (B, L) slot matrix from the episode links (O(B * L)), one gather of its B * L rows
        (masked positions read the start's row and are zeroed), every array reshaped to
        (B, L, ...)."""
        sequence = self._sequence
        assert sequence is not None and self.episodes is not None
        burn_in = sequence.burn_in
        slots = self.episodes.sequences(starts, burn_in, sequence.length - 1)
        gathered, mask, drawn, generations = self._gather_matrix(
            starts, slots, trainer, out_block, select
        )
        if self._last_drawn and trainer is not None:
            sequence.handed(trainer, starts, mask[:, burn_in:].sum(axis=1))
        return self.storage.make_sequences(
            gathered,
            mask,
            burn_in,
            slots,
            drawn,
            generations,
            weights,
            trainer,
            self.storage.zero_fills,
        )

    def _gather_matrix(
        self,
        starts: np.ndarray,
        slots: np.ndarray,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None,
    ) -> tuple[Any, np.ndarray, DrawnIndices, np.ndarray]:
        """One gather of the (B, L) slot matrix ``slots`` (-1 where masked) of the sequences
        beginning at ``starts`` (under ``writer.lock``): the flat batch of its B * L rows, the
        (B, L) mask, ``starts`` as drawn (recorded as ``trainer``'s latest draw) and their
        write generations."""
        mask = slots >= 0
        # storages whose gather writes zeros for slot -1 skip the masked steps' copies
        zeroed = self.storage.zero_fills
        flat = (slots if zeroed else np.where(mask, slots, starts[:, None])).reshape(-1)
        gathered = self._gather(flat, None, None, out_block, select)
        generations = self.writer.write_generation[starts]
        drawn = DrawnIndices.of(starts, generations)
        if self._last_drawn and trainer is not None:
            self._last_drawn[trainer] = drawn
        return gathered, mask, drawn, generations

    def _gather_episodes(
        self,
        starts: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> EpisodeBatch:
        """Whole episodes from their first slots ``starts`` (shape (B,), int64), under
        ``writer.lock``: padded to the sampler's ``max_length`` or the longest of them."""
        sampler = self.sampler
        assert isinstance(sampler, EpisodesSampler) and self.episodes is not None
        lengths = self.episodes.length[starts]
        steps = sampler.max_length if sampler.max_length is not None else int(lengths.max())
        slots = self.episodes.sequences(starts, 0, steps - 1)
        return self._gather_slot_matrix(starts, slots, lengths, weights, trainer, out_block, select)

    def _gather_slot_matrix(
        self,
        starts: np.ndarray,
        slots: np.ndarray,
        lengths: np.ndarray,
        weights: np.ndarray | None,
        trainer: int | None,
        out_block: np.ndarray | None,
        select: FieldSelection | None = None,
    ) -> EpisodeBatch:
        """One gather of the (B, L) slot matrix ``slots`` (-1 where masked) starting at
        ``starts``, as an :class:`marlbuf.batch.EpisodeBatch` (under ``writer.lock``)."""
        gathered, mask, drawn, generations = self._gather_matrix(
            starts, slots, trainer, out_block, select
        )
        batch = self.storage.make_sequences(
            gathered,
            mask,
            0,
            slots,
            drawn,
            generations,
            weights,
            trainer,
            self.storage.zero_fills,
        )
        if type(batch) is SequenceBatch:  # a dataclass: its fields are its instance dict
            return EpisodeBatch(**vars(batch), lengths=lengths)
        batch.lengths = lengths  # a store's own sequence batch (device tensors) carries them
        return batch

    def gather_sequences(
        self, starts: Any, length: int, fields: tuple[str, ...] | None = None
    ) -> EpisodeBatch:
        """The sequences of ``length`` steps beginning at chosen stored slots.

        Row ``b`` holds the step stored at ``starts[b]`` and the ``length - 1`` steps after it
        in its episode, and zeros (``mask`` False) where the episode, or what is still stored
        of it, ends first: the sequences a :class:`marlbuf.samplers.Sequence` sampler would
        return for these training starts without burn-in. A start that is the first slot of an
        episode (``batch.indices`` of an :class:`marlbuf.samplers.Episodes` batch, or a slot
        recorded when the episode was written) gives the whole episode.

        Parameters
        ----------
        starts : array of int, shape (B,)
            Stored slots, in ``[0, len(self))``.
        length : int
            Steps per row, ``>= 1``.
        fields : tuple of str, optional
            As in :meth:`sample`: only these fields are gathered.

        Returns
        -------
        EpisodeBatch
            Per-step arrays of shape ``(B, length, ...)``; ``mask`` (B, length) bool;
            ``lengths`` (B,) int64, the steps of each row (``mask.sum(axis=1)``); ``indices``
            the starts.
        """
        if self.episodes is None:
            raise TypeError(
                f"gather_sequences needs the episode index, which a buffer keeps when its "
                f"sampler samples sequences or episodes; got sampler={self.sampler!r} (build "
                "the buffer with sampler=Episodes() or Sequence(...))"
            )
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"length must be a positive int; got length={length!r}")
        select = None if fields is None else self._selection(fields)
        with self.writer.lock:
            idx = self._check_indices(starts)
            slots = self.episodes.sequences(idx, 0, int(length) - 1)
            lengths = np.count_nonzero(slots >= 0, axis=1).astype(np.int64)
            return self._gather_slot_matrix(idx, slots, lengths, None, None, None, select)

    @property
    def complete_episodes(self) -> int:
        """Complete episodes stored: ended, with every step still stored (what
        :class:`marlbuf.samplers.Episodes` draws from). Needs the episode index (a sequence
        or episode sampler)."""
        return self._episode_index("complete_episodes").n_complete

    @property
    def stored_episodes(self) -> int:
        """Episodes with at least one stored step: the complete ones, those the ring has
        overwritten in part and those still being written (O(len(self))). Needs the episode
        index (a sequence or episode sampler)."""
        index = self._episode_index("stored_episodes")
        with self.writer.lock:
            return index.stored_episodes(self.size)

    def _episode_index(self, what: str) -> EpisodeIndex:
        if self.episodes is None:
            raise TypeError(
                f"{what} needs the episode index, which a buffer keeps when its sampler samples "
                f"sequences or episodes; got sampler={self.sampler!r} (build the buffer with "
                "sampler=Episodes() or Sequence(...))"
            )
        return self.episodes

    def update_priorities(
        self,
        indices: Any,
        td_errors: Any,
        trainer: int = 0,
        generations: Any = None,
        sync: bool = True,
    ) -> None:
        """Feed TD errors back to a prioritized sampler (one priority tree per trainer).

        Updates for slots overwritten since they were sampled are dropped, never applied to
        the new contents. How the buffer knows which:

        * ``update_priorities(batch.indices, td, trainer=t)``: ``batch.indices`` (a
          :class:`marlbuf.batch.DrawnIndices`) carries the write generations of its draw, so
          this is exact in any order of updates (an older batch updated after a newer one).
          The array keeps a copy of its entries as drawn: reordered in place since (sorted,
          shuffled), each entry is judged by its slot's generation at the draw; an entry
          written that is not a slot of the draw is refused (``ValueError`` naming
          ``generations=``);
        * ``generations=batch.generations``: the same, for indices that travelled elsewhere
          (copied, converted to a tensor and back, sent to another process), and
          ``generations=buffer.write_generation[indices]`` to set the priorities of slots as
          they are now (indices never drawn);
        * plain indices without generations: taken as trainer ``t``'s latest batch, and judged
          by its generations, when they are exactly its indices in order (a copy or a list of
          them: the usual sample-then-update loop); any other plain indices are refused with a
          ``ValueError`` naming ``generations=``, since the buffer cannot tell whether their
          slots were overwritten since they were drawn. Checking costs one pass over the
          indices (the same pass that finds the stale slots).

        With a prioritized :class:`marlbuf.samplers.Sequence` sampler, ``indices`` are the
        sequences' training starts (``batch.indices``) and ``td_errors`` one value per sequence
        (shape (B,)) or the per-step errors of the training steps (shape (B, length)), mixed as
        in R2D2 over the steps that were valid when the batch was drawn.

        ``indices``, ``td_errors`` and ``generations`` may be torch tensors on any device (a
        :class:`marlbuf.stores.torch.DeviceBatch`'s ``indices`` are host arrays already). With
        ``Prioritized(index="device")`` on a torch buffer the priorities live in tensor trees on
        the device: the update is written there without a copy, ``sync=True`` waits for its
        check (finite TD errors) and ``sync=False`` leaves that check to the next call that
        reads or changes priorities. Otherwise the priorities live in the host sum tree, so TD
        errors on a GPU are copied to the host. ``sync=True`` waits for that copy here.
        ``sync=False`` starts the copy without waiting and applies the update at the buffer's
        next call that reads or changes priorities (``sample``, ``update_priorities``,
        ``state_dict``, :meth:`check_priority_errors`): the learner does not stall on the
        device, and the next draw still sees the update. A bad deferred update (non-finite TD
        errors) changes nothing, and its error is raised once, by the next call that reads
        priorities (``sample``, ``state_dict``, :meth:`check_priority_errors`); a later
        ``update_priorities`` applies the deferred updates before its own and is applied
        itself, leaving that error for such a call.
        """
        trainer = self._check_trainer(trainer)
        if not isinstance(sync, bool):
            raise TypeError(f"sync must be a bool; got sync={sync!r}")
        # tensor trees (``Prioritized(index="device")``) take the TD errors where they are and
        # check them later; host trees take host TD errors, now or, from a device without
        # waiting, at the next call that reads priorities
        on_device = getattr(self.sampler, "priorities_on_device", False)
        defer = not on_device and not sync and hasattr(td_errors, "detach")
        with self.writer.lock:
            if not (on_device or defer) and self._deferred:
                # earlier deferred updates first, in order; an error of theirs waits for the
                # next call that reads priorities, and this update is still applied
                self._settle_deferred()
            idx = self._check_indices(_host_array(indices))
            gens, stale = self._judged(trainer, indices, idx, generations)
            if defer:  # judged again when applied (the slots may be overwritten meanwhile)
                ready = self.storage.to_host_later(td_errors)
                self._deferred.append((trainer, idx.copy(), gens.copy(), ready))
                return
            values = td_errors if on_device else _host_array(td_errors)
            self.sampler.update_priorities(idx, values, trainer, stale)
            if on_device and sync:
                self.sampler.raise_pending_errors()  # type: ignore[attr-defined]

    def _stale(self, idx: np.ndarray, generations: np.ndarray) -> np.ndarray:
        """Which of the slots ``idx`` were overwritten since their draw at ``generations``
        (shape of ``idx``, bool; under ``writer.lock``)."""
        stale = np.empty(idx.shape[0], dtype=np.bool_)
        judge_update(idx, _NO_SLOTS, generations, self.writer.write_generation, stale)
        return stale

    def update_priorities_for_trainers(
        self,
        indices: Any,
        td_errors: Any,
        generations: Any = None,
        sync: bool = True,
    ) -> None:
        """:meth:`update_priorities` for every trainer of a round: ``indices[t]`` and
        ``td_errors[t]`` (and ``generations[t]``) go to trainer ``t``. Arrays or tensors of
        shape (T, B) are split along their first axis."""
        update_each_trainer(self.update_priorities, indices, td_errors, generations, sync)

    def apply_deferred_updates(self) -> None:
        """Apply the updates of ``update_priorities(..., sync=False)`` still waiting, in the
        order they were made (each waits for its own copy from the device). Every good update
        is applied; a bad one changes nothing, and the first bad one's error is raised once they
        have all been tried (or, if a later ``update_priorities`` applied them, here, once).
        Called by every method that reads priorities. With priorities on the device
        (``Prioritized(index="device")``) the updates are written already, and this raises the
        first error among those not yet checked."""
        check_device = getattr(self.sampler, "raise_pending_errors", None)
        if check_device is not None:
            with self.writer.lock:
                check_device()
        if not self._deferred:
            return
        with self.writer.lock:
            error = self._apply_deferred()
            if error is not None:
                raise error

    def _apply_deferred(self) -> ValueError | None:
        """Apply the waiting deferred updates (under ``writer.lock``); the first error among
        them (or kept from an earlier application) is returned, not raised."""
        pending, self._deferred = self._deferred, []
        first_error: ValueError | None = None
        for trainer, idx, gens, ready in pending:
            if idx is None:  # the error of an update applied by an earlier call, still unseen
                first_error = first_error or ready
                continue
            try:
                self.sampler.update_priorities(idx, ready(), trainer, self._stale(idx, gens))
            except ValueError as exc:
                first_error = first_error or exc
        return first_error

    def _settle_deferred(self) -> None:
        """Apply the waiting deferred updates and keep their first error for the next call that
        reads priorities (an update or a checkpoint must not raise another call's error)."""
        error = self._apply_deferred()
        if error is not None:
            self._deferred.append((-1, None, None, error))

    #: :meth:`apply_deferred_updates` under the name the learners use to surface errors
    check_priority_errors = apply_deferred_updates

    def _update_generations(
        self, trainer: int, indices: Any, idx: np.ndarray, generations: Any
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """What an update of ``idx`` (checked indices) is judged by: ``(generations, the
        indices they belong to, whether idx may be a reordering of those)`` (the second empty
        when ``generations=`` was given: nothing to compare). See :meth:`update_priorities`."""
        if generations is not None:
            gens = _host_array(generations)
            if gens.shape != idx.shape or gens.dtype.kind not in "iu":
                raise ValueError(
                    f"generations must be an integer array of the shape of indices "
                    f"{idx.shape} (pass batch.generations); got shape {gens.shape}, "
                    f"dtype {gens.dtype}"
                )
            return gens.astype(np.int64, copy=False), _NO_SLOTS, False
        if isinstance(indices, DrawnIndices) and indices.as_drawn is not None:
            assert indices.generations is not None
            return indices.generations, indices.as_drawn, True  # its own draw
        latest = self._last_drawn[trainer] if self._last_drawn else None
        if latest is None or latest.as_drawn is None or latest.generations is None:
            raise ValueError(_untrusted(trainer, "no batch was drawn for it since"))
        return latest.generations, latest.as_drawn, False

    def _judged(
        self, trainer: int, indices: Any, idx: np.ndarray, generations: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(generations, stale)`` of an update of ``idx``: the write generations it is
        judged against and which of its slots were overwritten since (shape of ``idx``, bool);
        a ``ValueError`` naming ``generations=`` for indices that cannot be trusted."""
        gens, as_drawn, own = self._update_generations(trainer, indices, idx, generations)
        stale = np.empty(idx.shape[0], dtype=np.bool_)
        current = self.writer.write_generation
        if judge_update(idx, as_drawn, gens, current, stale):
            return gens, stale
        if not own:  # plain indices that are not the trainer's latest batch, in order
            raise ValueError(
                _untrusted(trainer, "they are not its latest batch's indices, in order")
            )
        # batch.indices changed in place since its draw: each entry that is a slot of that
        # draw takes the slot's generation then (the same for every entry of a slot)
        assert isinstance(indices, DrawnIndices)
        remapped = indices.generations_of(idx)
        if remapped is None:
            raise ValueError(_CHANGED_IN_PLACE)
        judge_update(idx, _NO_SLOTS, remapped, current, stale)
        return remapped, stale

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: data, cursor, size, sampler state, RNG.

        Arrays are copies of the filled part of the storage; other values are JSON-safe. The
        state is one committed state even while other threads write or sample: every write is
        in it entirely or not at all. As for :meth:`save`, everything but the storage rows is
        copied under the buffer's lock, then the rows a chunk at a time (about 1 MiB), each
        under the lock after checking that its slots still hold that state's write
        generations, so other threads wait for one chunk at a time; a copy overtaken by a
        writer starts again, and the last of ``persistence.SNAPSHOT_ATTEMPTS`` attempts holds
        the lock throughout.
        """
        for _ in range(persistence.SNAPSHOT_ATTEMPTS - 1):
            with self.writer.lock:
                state = self._state(copy=False, live=True)
            try:
                state["storage"] = {k: rows.copy() for k, rows in state["storage"].items()}
                return state
            except persistence.SnapshotMoved:
                continue  # a writer overtook the copy: again, from a new state
        with self.writer.lock:
            return self._state(copy=True)

    def _state(self, copy: bool, live: bool = False, errors: bool = True) -> dict[str, Any]:
        """:meth:`state_dict` (call under ``writer.lock``); with ``copy=False`` the buffer's own
        arrays are views of the live memory (what a checkpoint writes from, so that it copies
        nothing). With ``live=True`` everything but the storage rows is copied, and each storage
        array is a :class:`marlbuf.persistence.LiveRows` whose rows are copied later, a chunk
        at a time under the lock, as long as their write generations are still those of this
        state (else :class:`~marlbuf.persistence.SnapshotMoved`): what :meth:`save` writes."""
        if errors:
            self.apply_deferred_updates()  # the state holds every priority update made so far
        elif self._deferred:
            self._settle_deferred()
        filled = self.size  # slots [0, size) hold data while filling; all of them once full
        copy = copy or live

        def part(array: np.ndarray) -> np.ndarray:
            return array[:filled].copy() if copy else array[:filled]

        ring = self.writer.state_dict(copy=copy)
        storage: dict[str, Any] = {}
        for key, array in self.storage.arrays().items():
            if live:
                reader = self._live_reader(array, ring["write_generation"])
                storage[key] = persistence.LiveRows((filled, *array.shape[1:]), array.dtype, reader)
            else:
                storage[key] = part(array)
        header = self.config.to_dict(batch_options=False)
        header["sampler"]["state"] = self.sampler.state_dict()
        return {
            "format": _config.SAVE_FORMAT,
            "version": _config.SAVE_VERSION,
            **header,
            **ring,
            "rng": self.rng.bit_generator.state,  # a new dict on every read
            "storage": storage,
            "links": {} if self.links is None else self.links.state_dict(copy=copy),
            "episodes": {}
            if self.episodes is None
            else self.episodes.state_dict(filled, copy=copy),
        }

    def _live_reader(self, array: np.ndarray, generations: np.ndarray) -> Any:
        """``LiveRows.read`` for storage ``array`` of a snapshot whose filled slots had write
        ``generations``: rows ``[start, stop)`` copied under the lock while their slots still
        hold those generations (a slot's bytes change only with its generation)."""
        lock, current = self.writer.lock, self.writer.write_generation

        def read(start: int, stop: int) -> np.ndarray:
            with lock:
                if not np.array_equal(current[start:stop], generations[start:stop]):
                    raise persistence.SnapshotMoved(
                        f"slots [{start}, {stop}) were overwritten before they were saved"
                    )
                return np.array(array[start:stop], order="C", copy=True)

        return read

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output into this buffer (same specs, capacity, layout).

        The state is checked as a whole before anything changes: every field against the others
        and against what it indexes (ring counters and write generations, next-observation
        links and side rows, priorities only for written slots, RNG state). A rejected state
        (``ValueError`` naming the field) leaves the buffer as it was.
        """
        self._load_state(state, adopt=False)

    def _load_state(self, state: Mapping[str, Any], adopt: bool, table_ahead: bool = False) -> None:
        """:meth:`load_state_dict`; ``adopt``: keep the state's arrays (nobody else holds
        them); ``table_ahead``: the storage holds the state's rows already, and may hold newer
        ones (a memory-mapped checkpoint before its log is replayed), so the parts are
        cross-checked against the rows after the replay (:meth:`_replayed`)."""
        if not isinstance(state, Mapping):
            raise TypeError(
                f"a buffer state is a mapping (what state_dict() returns); got {state!r:.80}"
            )
        try:
            self._load_header_checked(state, adopt, table_ahead)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            # a field of the wrong type or missing: the checks below index freely
            raise ValueError(
                f"state_dict is not a complete marlbuf buffer state ({type(exc).__name__}: "
                f"{exc}); pass what state_dict() returned or a file written by save()"
            ) from exc

    def _load_header_checked(
        self, state: Mapping[str, Any], adopt: bool, table_ahead: bool = False
    ) -> None:
        """:meth:`_load_state`: the header compared with this buffer's configuration."""
        check_header(state)
        saved = BufferConfig.from_dict(state)
        # next_obs="auto" not yet decided by a write: the state's format decides (a buffer that
        # chose "stored" or "none" from its first write loads into a new default buffer)
        saved_format = saved.next_obs
        deciding = self._deciding and self.writer.total_writes == 0
        adopt_dense = deciding and self._choose_format and saved_format == "stored"
        adopt_none = deciding and self.next_obs != "none" and saved_format == "none"
        mismatch = [
            (k, mine, theirs)
            for k, mine, theirs in (
                ("specs", self.specs, saved.specs),
                ("capacity", self.capacity, saved.capacity),
                ("global_fields", self.global_fields, saved.global_fields),
                ("alive", self.alive, saved.alive),
                ("n_trainers", self.n_trainers, saved.n_trainers),
            )
            if mine != theirs
        ]
        if mismatch:
            key, mine, theirs = mismatch[0]
            raise ValueError(
                f"state_dict does not fit this buffer: {key} is {mine!r} here, {theirs!r} in "
                "the state; build the buffer with MultiAgentReplayBuffer.load instead"
            )
        if not (adopt_dense or adopt_none):  # another layout or format is converted first
            converted = convert_state(state, self._codec, self.layout, self.next_obs)
            self._load_checked(converted, adopt, table_ahead)
            if self._deciding and self.writer.total_writes:
                self._decided()  # steps are stored: the format stays
            return
        with self.writer.write_lock, self.writer.lock:
            before = (self.storage, self.links, self.next_obs, self._choose_format)
            obs_bytes = None if self.episodes is None else self.episodes.obs_bytes
            if adopt_none:
                self._drop_next_obs()
            else:
                self._choose_format = False
                self._store_next_obs()
            try:
                converted = convert_state(state, self._codec, self.layout, self.next_obs)
                self._load_checked(converted, adopt)
            except BaseException:  # a rejected state leaves the buffer as it was
                self.storage, self.links, self.next_obs, self._choose_format = before
                if self.episodes is not None and obs_bytes is not None:
                    self.episodes.obs_bytes = obs_bytes
                raise
            self._decided()

    def _load_checked(
        self, state: Mapping[str, Any], adopt: bool, table_ahead: bool = False
    ) -> None:
        """:meth:`_load_state` once the state's format matches this buffer's: every field
        checked against the others before anything changes."""
        # every part checks its own part of the state first: a rejected state changes nothing
        size, generations = self.writer.check_loaded(state)
        if self.links is not None:
            self.links.check_loaded(state["links"], size, generations)
        if self.sampler.weighted:
            persistence.check_priorities(state["sampler"]["state"], size)
        self.storage.check_saved(state["storage"], size)
        episodes_state = state.get("episodes") or {}
        stored_next = None if table_ahead else self._stored_next(state)
        if self.episodes is not None and episodes_state:
            self.episodes.check_state(episodes_state, size, generations, stored_next)
        try:
            scratch = type(self.rng.bit_generator)()
            scratch.state = state["rng"]
        except (TypeError, ValueError, KeyError, OverflowError, AttributeError) as exc:
            raise ValueError(
                f"state_dict has an unusable rng state ({type(exc).__name__}: {exc}); expected "
                f"the state of a {type(self.rng.bit_generator).__name__} bit generator, as "
                "state_dict() writes it"
            ) from exc
        sampler_before = self.sampler.state_dict()
        self.sampler.load_state_dict(state["sampler"]["state"])  # raises before it changes
        with self.writer.lock:
            if self._mapped is not None:  # the files are unusable until the new checkpoint
                self._mapped.begin_replace()
            try:
                self.storage.restore(state["storage"], size)  # skips what load() read in place
            except BaseException:
                self.sampler.load_state_dict(sampler_before)
                raise
            self.writer.load_state_dict(state)
            if self.links is not None:
                self.links.load_state_dict(state["links"], adopt=adopt)
            if self.episodes is not None:
                if episodes_state:
                    self.episodes.load_state_dict(episodes_state, size, generations, stored_next)
                else:  # saved without an index: rebuilt from done flags and next_obs links
                    self.episodes.reconstruct(
                        size,
                        self._stored_ends(size),
                        None if self.links is None else self.links.next_slot,
                    )
                if self._sequence is not None:
                    self._sequence.rebuild(size)
            self._last_drawn = [None] * len(self._last_drawn)
            self._deferred = []  # updates meant for the state this one replaces
            self.rng.bit_generator.state = state["rng"]
            if self._mapped is not None:
                self._mapped.checkpoint(sync=True)

    def _replayed(self) -> None:
        """A memory-mapped checkpoint was loaded and its log replayed: the table now holds
        exactly the loaded state's rows, so the episode index's record of each open stream's
        last next_obs is checked against them (or, for a checkpoint of an earlier version
        without one, taken from them)."""
        if self.episodes is None or not self.episodes.obs_bytes:
            return
        size = self.size
        live = {
            "layout": self.layout,
            "next_obs": self.next_obs,
            "storage": self.storage.arrays(),
            "links": {} if self.links is None else self.links.state_dict(copy=False),
        }
        self.episodes.settle_stream_next(
            size, self.writer.write_generation[:size], self._stored_next(live)
        )

    def _stored_next(self, state: Mapping[str, Any]) -> Any:
        """The episode index's ``stored_next`` for ``state`` (in this buffer's format): the
        next_obs section of filled slots as the writer staged it, and whether the stream-break
        check compares it (:class:`marlbuf.writer.StoredNext`)."""
        codec = self._codec
        start, width = codec.next_obs_start, codec.obs_bytes

        def read(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rows = staged_rows(state, codec, slots)
            quiet, _ = self._break_flags(rows)
            return rows.view(np.uint8)[:, start : start + width], quiet

        return read

    def _stored_ends(self, size: int) -> np.ndarray:
        """Per filled slot (shape (size,), bool), whether every (alive) agent's stored done is
        set."""
        every = np.ones(size, dtype=bool)
        for agent in self.specs:
            done = np.asarray(self.storage.read_field("done", agent, size) != 0)
            if self.alive:
                done = done | ~np.asarray(self.storage.read_field(ALIVE, agent, size))
            every &= done.reshape(size, -1).all(axis=1)
        return every

    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        """Write the buffer to ``path``, an ``.npz`` archive (no pickled code).

        The write is atomic: the file is written next to the target, flushed to disk and
        renamed over it only when complete, so ``path`` holds the old or the new file even if
        the process is killed. The file gets the mode ``0o666 & ~umask``. The folder must
        exist. ``path`` may name nothing yet, an empty file or a marlbuf buffer file; with
        ``overwrite=True`` any regular file. A symbolic link, folder, device, FIFO or socket
        is never replaced. See :mod:`marlbuf.persistence` for the format.

        The file holds one committed state even while other threads write. Everything but the
        storage rows (counters, write generations, links, priorities, RNG) is copied under the
        buffer's lock; the rows are then streamed from the buffer's memory, a few megabytes at
        a time, each chunk copied under the lock after checking that its slots still hold the
        generations of that state (a slot's bytes change only with its generation). Writers
        wait only for one chunk at a time. If a writer overwrites a slot before it is saved,
        the partial file is dropped and the save starts again from a new state; after
        ``persistence.SNAPSHOT_ATTEMPTS - 1`` such attempts, the last holds the lock for the whole
        write.
        """
        for _ in range(persistence.SNAPSHOT_ATTEMPTS - 1):
            with self.writer.lock:
                state = self._state(copy=False, live=True)
            try:
                persistence.write_state(state, path, overwrite=overwrite)
                return
            except persistence.SnapshotMoved:
                continue  # a writer overtook the stream: again, from a new state
        with self.writer.lock:
            persistence.write_state(self._state(copy=False), path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike[str], device: Any = None) -> MultiAgentReplayBuffer:
        """Rebuild a buffer written by :meth:`save` (specs, layout, sampler, data, RNG state),
        on the store ``device`` selects (``None``: NumPy arrays; files are the same for every
        store, so a buffer saved from one store loads on any other).

        The storage is read straight into the new buffer's preallocated arrays. The file is
        checked before memory is spent on it: it must be a regular file (a FIFO or device is
        refused at once), every array's bytes must be in the file (uncompressed members), and
        the declared shapes must fit the header's capacity and ``n_trainers`` before the buffer
        is built; the loaded state is then checked as a whole (:meth:`load_state_dict`).
        Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a corrupt,
        foreign or special one.
        """
        built: list[MultiAgentReplayBuffer] = []

        def check(header: dict[str, Any], shapes: Mapping[str, Any]) -> None:
            # the file's JSON part and declared array shapes, before anything is allocated
            check_header(header)
            saved = BufferConfig.from_dict(header)
            persistence.check_declared_shapes(
                shapes,
                check_capacity(saved.capacity),
                saved.n_trainers,
                saved.sampler().weighted,
            )

        def build(header: dict[str, Any]) -> dict[str, np.ndarray]:
            # called with the file's JSON part, before any array is read
            saved = BufferConfig.from_dict(header)
            buf = cls(
                saved.specs,
                capacity=int(saved.capacity),
                # a device store keeps interleaved rows: an agent_major file is converted
                layout=saved.layout if device is None else "interleaved",
                next_obs=saved.next_obs,
                sampler=saved.sampler(),
                n_trainers=int(saved.n_trainers),
                global_fields=saved.global_fields,
                alive=saved.alive,
                device=device,
            )
            built.append(buf)
            return persistence.storage_destinations(
                buf.config, buf.storage.arrays(), buf.begin_replace, header
            )

        try:
            state = persistence.read_state(path, build, check)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{os.fspath(path)!r} has an invalid header ({type(exc).__name__}: {exc}); it "
                "is not a buffer file this marlbuf can build a buffer from"
            ) from exc
        buf = built[0]
        buf._load_state(state, adopt=True)  # storage already in place; fresh arrays adopted
        return buf

    # ----------------------------------------------------------------------------- mapped files
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        durable: bool = False,
        parallel_gather: bool = False,
        mode: str = "r+",
    ) -> MultiAgentReplayBuffer:
        """Reopen a memory-mapped buffer (built with ``path=``) where it was left.

        The storage files are mapped, not read, so this takes about as long as reading the
        metadata. Specs, layout, next_obs mode, batch options, sampler and its state, RNG state,
        ring counters, next-observation links and the episode index are restored; writes logged
        since the last checkpoint are applied again after checking that the checkpoint is this
        folder's, that the log follows it and that its records are whole; then the table's
        stamps must agree with the state this gives every slot (see :mod:`marlbuf.mapped` for
        what survives a crash and what is refused). ``durable`` and ``parallel_gather`` are
        runtime settings, as for the constructor. A folder written by an earlier version is
        rewritten in this version's format when opened with ``mode="r+"``.

        ``mode="r"`` opens the folder read-only (a shared lock; the files mapped read-only, so
        it works on read-only media; a log left by a crash is applied in memory only):
        sampling, ``gather``, ``latest`` and ``update_priorities`` work (priorities and RNG are
        not saved), writes are refused.

        Raises ``FileNotFoundError`` for a missing folder, ``NotADirectoryError`` for a file,
        ``ValueError`` for a folder that holds no (or a corrupt, incomplete or altered) buffer,
        a checkpoint of another folder, or rows that the checkpoint and the redo log do not
        account for (a log missing, damaged or older than the table:
        :class:`marlbuf.mapped.LogDamaged`, which says what was found and how to recover),
        ``MemoryError`` for a manifest whose buffer does not fit, and ``BlockingIOError`` while
        another buffer object has it open for writing.
        """
        store = mapped.MappedStore.open(path, durable, mode)
        manifest_path = str(store.folder / mapped.MANIFEST)
        try:
            assert store.manifest is not None
            try:
                saved = BufferConfig.from_dict(store.manifest, strict=True)
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise ValueError(
                    f"{manifest_path!r} is corrupt (missing or invalid {exc})"
                ) from exc
            buffer = cls.__new__(cls)
            try:
                config, sampler = saved.checked(parallel_gather)
                buffer._build(config, sampler, None, parallel_gather, None, files=store)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{manifest_path!r} describes no valid buffer: {exc}") from exc
            mapped.recover(store, buffer.storage.arrays())
        except BaseException:
            store.release()
            raise
        return buffer

    def _attach_store(self, store: mapped.MappedStore | None) -> None:
        """Make the memory-mapped ``store`` live: from now on writes are logged there."""
        self._mapped = store

    def begin_replace(self) -> None:
        """Before the storage arrays are overwritten wholesale (``persistence.load_into``
        streams a file into them): a memory-mapped folder is marked unusable until the new
        state is loaded and checkpointed. Nothing to do for the other stores."""
        if self._mapped is not None:
            self._mapped.begin_replace()

    @property
    def path(self) -> str | None:
        """The folder of a memory-mapped buffer; ``None`` for one in memory."""
        return None if self._mapped is None else str(self._mapped.folder)

    def flush(self) -> None:
        """Write a memory-mapped buffer to disk: storage files (``msync``), then a checkpoint
        of its metadata, sampler state and RNG. Once it returns, the folder reopens to exactly
        this state even after a machine crash. Nothing to do for a buffer in memory."""
        if self._mapped is not None:
            self._mapped.flush()

    def release_pages(self) -> None:
        """A memory-mapped buffer (``path=``): let the OS take back the pages of its storage
        files that this process has touched (they stay in the files and are read back on the
        next access), so that bulk loading keeps resident memory bounded by what each call
        writes, not by the files. Nothing to do for a buffer in memory, or opened read-only."""
        if self._mapped is not None:
            with self.writer.lock:
                self._mapped.release_pages()

    def close(self) -> None:
        """:meth:`flush`, then release the folder (another buffer object may :meth:`open` it);
        later writes are refused. Closing twice, or a buffer in memory, does nothing."""
        if self._mapped is not None:
            self._mapped.close()

    def __enter__(self) -> MultiAgentReplayBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def update_each_trainer(
    update: Callable[..., None], indices: Any, td_errors: Any, generations: Any, sync: bool
) -> None:
    """``update(indices[t], td_errors[t], trainer=t, generations=generations[t], sync=sync)``
    for every trainer ``t`` of a round (``update_priorities_for_trainers`` of any buffer),
    after checking that the three hold one entry per trainer."""
    n = len(indices)
    if len(td_errors) != n or (generations is not None and len(generations) != n):
        raise ValueError(
            f"indices, td_errors and generations must hold one entry per trainer; got "
            f"{n}, {len(td_errors)} and "
            f"{'None' if generations is None else len(generations)}"
        )
    for t in range(n):
        update(
            indices[t],
            td_errors[t],
            trainer=t,
            generations=None if generations is None else generations[t],
            sync=sync,
        )


def _host_array(value: Any) -> np.ndarray:
    """``value`` as a NumPy array; a torch tensor (any device) is copied to the host."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return np.asarray(value.detach().cpu().numpy())
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


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


def _check_device_options(device: Any, layout: str, in_files: bool, parallel_gather: Any) -> Any:
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


def _check_memory(
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
            stacklevel=3,
        )


def _with_hint(exc: ValueError, hint: str) -> ValueError:
    """``exc`` with ``hint`` appended to its message (``exc`` itself when there is none)."""
    return ValueError(f"{exc}{hint}") if hint else exc


def _break_flag_reader(codec: RowCodec) -> Any:
    """A function of staged rows (shape (T, row_words), uint64) that returns, per row, the
    flags of the stream-break check (:meth:`marlbuf.writer.EpisodeIndex.commit`): ``quiet``
    (no agent done and every agent present: the step's next_obs must be the obs of the stream's
    next step) and ``full`` (every agent present: the step's obs may be compared), both shape
    (T,), bool. An agent that is done, or that joins or leaves, may see an observation its
    previous next_obs did not predict without any environment switch."""
    # a flag is set where any of its bytes is (a float -0.0 done counts as done: the check is
    # then skipped, which never cuts an episode); adjacent fields are read as one byte range
    done = _byte_ranges([fs for fs in codec.slots if fs.field == "done"])
    alive = _byte_ranges([fs for fs in codec.slots if fs.field == ALIVE] if codec.alive else [])

    def read(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raw = rows.view(np.uint8)
        full = np.ones(rows.shape[0], dtype=bool)
        for lo, hi in alive:  # one byte per agent, 1 where present
            full &= raw[:, lo:hi].all(axis=1)
        quiet = full.copy()
        for lo, hi in done:
            quiet &= ~raw[:, lo:hi].any(axis=1)
        return quiet, full

    return read


def _byte_ranges(slots: list[Any]) -> list[tuple[int, int]]:
    """The byte ranges ``(start, stop)`` of row fields ``slots`` (with ``offset`` and
    ``nbytes``), adjacent ones merged."""
    ranges: list[tuple[int, int]] = []
    for fs in sorted(slots, key=lambda fs: fs.offset):
        if ranges and ranges[-1][1] == fs.offset:
            ranges[-1] = (ranges[-1][0], fs.offset + fs.nbytes)
        else:
            ranges.append((fs.offset, fs.offset + fs.nbytes))
    return ranges


def _done_reader(codec: RowCodec) -> Any:
    """A function of staged rows (shape (T, row_words), uint64) that returns, per row, whether
    every agent's ``done`` is nonzero (shape (T,), bool): the termination of an episode. With
    an alive mask, agents that are not alive at the step do not count (a step without any
    alive agent ends its episode)."""
    slots = [fs for fs in codec.slots if fs.field == "done"]
    first, last = slots[0], slots[-1]
    packed = all(fs.dtype == first.dtype and len(fs.shape) == 0 for fs in slots) and all(
        a.offset + a.nbytes == b.offset for a, b in itertools.pairwise(slots)
    )
    if codec.alive:
        alive = [fs for fs in codec.slots if fs.field == ALIVE]
        alive_lo, alive_hi = alive[0].offset, alive[-1].offset + alive[-1].nbytes

        def read_alive(rows: np.ndarray) -> np.ndarray:
            raw = rows.view(np.uint8)
            mask = raw[:, alive_lo:alive_hi].view(np.bool_)
            every = np.ones(rows.shape[0], dtype=bool)
            for k, fs in enumerate(slots):
                flags = raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype)
                every &= (flags[:, 0] != 0) | ~mask[:, k]
            return every

        return read_alive
    if packed:  # one view of all agents' flags
        lo, hi = first.offset, last.offset + last.nbytes

        def read(rows: np.ndarray) -> np.ndarray:
            flags = rows.view(np.uint8)[:, lo:hi].view(first.dtype)
            return np.asarray((flags != 0).all(axis=1))

        return read

    def read_each(rows: np.ndarray) -> np.ndarray:
        raw = rows.view(np.uint8)
        every = np.ones(rows.shape[0], dtype=bool)
        for fs in slots:
            flags = raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype)
            every &= (flags != 0).all(axis=1)
        return every

    return read_each


def _check_truncated(
    truncated: Any, agents: list[str], steps: int | None, per_env: bool = False
) -> bool | np.ndarray | None:
    """``truncated`` of ``add`` (``steps=None``: a bool back) or of ``extend``/``add_envs``
    (shape (steps,) bool back, or ``None`` when no step is truncated), checked.

    Accepted: a bool; per agent, a dict (a subset of the agents; missing ones count as not
    truncated) or a sequence in agent order, any True counting; with ``steps``, each value with
    a leading axis of ``steps`` (a plain (steps,) array is per step, (n_agents, steps) per
    agent). For ``add_envs`` (``per_env``) a bool applies to every environment; ``extend``
    refuses ``True`` (it would end an episode at every step).
    """
    if truncated is False or truncated is None:
        return None if steps is not None else False
    if truncated is True and steps is None:
        return True
    where = "add" if steps is None else ("add_envs" if per_env else "extend")
    lead = () if steps is None else (steps,)
    if isinstance(truncated, Mapping):
        unknown = [k for k in truncated if k not in agents]
        if unknown:
            raise ValueError(
                f"truncated has unknown agent {unknown[0]!r}; {where} expects agents {agents}"
            )
        values = [_truncation_flags(v, lead, f"truncated[{a!r}]") for a, v in truncated.items()]
        flags = np.zeros(lead, dtype=bool)
        for value in values:
            flags = flags | value
    else:
        array = _truncation_flags(truncated, None, "truncated")
        if array.shape == () and steps is not None and array and not per_env:
            raise ValueError(
                f"truncated=True in extend would end an episode at each of its {steps} steps; "
                f"pass an array of shape ({steps},) (e.g. True at the last step only)"
            )
        if array.shape == ():
            flags = np.broadcast_to(array, lead).copy() if lead else array
        elif lead and array.shape == lead:  # one flag per step (1-D is never per agent here)
            flags = array
        elif array.shape == (len(agents), *lead):  # per agent, in agent order
            flags = np.asarray(array.any(axis=0))
        else:
            per_agent = (len(agents), *lead)
            shapes = f"{lead} (per step) or {per_agent} (per agent)" if lead else f"{per_agent}"
            raise ValueError(
                f"truncated has shape {array.shape}; {where} expects a bool, a dict of agents, "
                f"or an array of shape {shapes}"
            )
    if steps is None:
        return bool(flags)
    flags = np.asarray(flags, dtype=bool).reshape(steps)
    return flags if flags.any() else None


def _truncation_flags(value: Any, lead: tuple[int, ...] | None, name: str) -> np.ndarray:
    """``value`` as a bool array (of shape ``lead`` unless ``lead`` is None), or a clear error:
    bools, or numbers that are 0 or 1."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be bools; got {value!r:.80}") from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be bools (or 0/1); got dtype {array.dtype} ({value!r:.80})")
    if array.dtype.kind != "b":
        if not np.all((array == 0) | (array == 1)):
            raise ValueError(f"{name} must be bools (or 0/1); got {value!r:.80}")
        array = array != 0
    if lead is not None and array.shape != lead:
        raise ValueError(f"{name} has shape {array.shape}; expected {lead}")
    return array


def _leading_length(obs: Any) -> int | None:
    """The leading length of the first agent's observations, if cheaply known (else None)."""
    first = next(iter(obs.values()), None) if isinstance(obs, Mapping) else None
    if first is None and type(obs) in (list, tuple) and obs:
        first = obs[0]
    if type(first) is np.ndarray and first.ndim and first.shape[0] > 0:
        return int(first.shape[0])
    return None


def split_more(codec: RowCodec, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The ``extras``, ``globals`` and ``alive`` arguments of a :class:`Batch` from gathered
    per-field arrays (``fields[name][agent]``, global fields under the agent ``GLOBAL``)."""
    return {
        "extras": {name: fields[name] for name in codec.extra_names},
        "globals": {name: fields[name][GLOBAL] for name in codec.global_fields},
        "alive": fields[ALIVE] if codec.alive else None,
    }


def _check_stream(stream: Any) -> int:
    """A stream id (``stream=`` or ``first_stream=``): an int in ``[0, 2**63 - 1]`` (stored as
    int64)."""
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or stream < 0:
        raise TypeError(f"stream must be a non-negative int; got stream={stream!r}")
    if stream > persistence.MAX_STREAM:
        raise ValueError(
            f"stream ids are int64: at most {persistence.MAX_STREAM}; got stream={stream!r}. "
            "Number environments from 0 (add_envs(first_stream=...) counts up from it)"
        )
    return int(stream)


__all__ = [
    "MultiAgentReplayBuffer",
    "NextObsDroppedWarning",
    "NextObsWarning",
    "SlowWriteWarning",
    "StreamBreakWarning",
    "build_storage",
    "make_rng",
    "update_each_trainer",
]
