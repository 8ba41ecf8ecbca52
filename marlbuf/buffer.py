"""The multi-agent replay buffer: the one front over its parts.

:class:`MultiAgentReplayBuffer` checks arguments and hands each call to the part that owns it:
the commit engine (:mod:`marlbuf.writer`), the reader (:mod:`marlbuf.reading`), the state
(:mod:`marlbuf.state`); :mod:`marlbuf.build` builds the parts from a checked configuration.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np

from marlbuf import mapped
from marlbuf.batch import Batch, EpisodeBatch
from marlbuf.build import build_parts, check_device_options
from marlbuf.config import BufferConfig, check_n_trainers, check_trainer
from marlbuf.reading import Reader, update_each_trainer
from marlbuf.samplers import Sampler
from marlbuf.spec import AgentSpec, FieldSpec
from marlbuf.state import BufferState, load_file, open_folder
from marlbuf.stores.base import Storage
from marlbuf.writer import EpisodeIndex, NextObsLinks
from marlbuf.writer.commit import (
    NextObsDroppedWarning,
    NextObsWarning,
    SlowWriteWarning,
    StreamBreakWarning,
)
from marlbuf.writer.inputs import MAX_STREAM, check_stream, check_truncated


class MultiAgentReplayBuffer:
    """A ring buffer of joint multi-agent transitions with pluggable layout, sampler and store.

    The front of the library: it checks arguments and hands each call to the part that owns it
    (writer, reader, store, sampler, state; ``docs/architecture.md``). Storage formats and
    memory: ``docs/guides/storage.md``.

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
    parallel_gather : bool, default False
        Opt-in: gathers of at least ``_config.PARALLEL_GATHER_MIN_BYTES`` use Numba's threads.
        It needs an idle core (keep torch at one thread) and is a runtime setting, not saved.
    batch_layout : {"rows", "per_agent"}, default "rows"
        ``"rows"`` (interleaved layout): per-agent arrays are strided views into the gathered
        rows, and ``batch.concat("obs", "action")`` (the centralized critic's input) is
        zero-copy. ``"per_agent"``: C-contiguous per-agent arrays, written so by the gather in
        the same pass (per-agent networks). ``agent_major`` storage always gathers per agent.
    next_obs : {"auto", "once", "stored", "none"}, default "auto"
        ``"once"``: observations are stored once; a transition's ``next_obs`` is the ``obs`` of
        the next step of the same stream, or where they differ (termination, truncation,
        reset, the newest step) a side table, found by comparing values at write time (exact
        in every case, see :class:`marlbuf.writer.NextObsLinks`): about half the memory for
        MPE-style rows, the same batches bit for bit. ``"stored"``: ``next_obs`` is a field of
        every row. ``"none"``: no next observations, for learners that never read them (episode
        learners read the next step's ``obs`` of a sequence or episode batch): writes leave
        ``next_obs`` out and ``batch.next_obs`` raises a ``ValueError`` naming it. ``"auto"``:
        ``"stored"`` for tiny observations or a first ``extend`` of independent transitions,
        ``"none"`` for a first write without ``next_obs`` (:class:`NextObsDroppedWarning`),
        else ``"once"`` (:attr:`next_obs` tells which; the rules are in the storage guide). A
        ``"once"`` buffer in which most steps end up in the side table warns once
        (:class:`NextObsWarning`, naming ``stream=``, ``add_envs`` and ``"stored"``).
    batch_dtype : {"float32", "storage"}, default "float32"
        Half-precision fields (``AgentSpec(obs_dtype=np.float16)``) are converted to float32
        by the gather, in the same pass; ``"storage"`` delivers them in storage precision
        (convert on the device).
    path : str or path-like, optional
        Keep the storage arrays in memory-mapped files in this folder (a new or empty one; its
        parent must exist), so that the capacity is bounded by disk, not RAM. Every write is
        logged before it is applied, so the folder reopens (:meth:`open`) consistently even if
        the process is killed; :meth:`flush` writes everything to disk and :meth:`close` (or a
        ``with`` block) also releases the folder. See :mod:`marlbuf.mapped`.
    durable : bool, default False
        With ``path``: every ``add``/``extend`` is on disk (``fdatasync``) before it returns,
        so that a machine crash also reopens with it; otherwise only :meth:`flush` does that.
    global_fields : mapping of str to FieldSpec, optional
        Fields stored once per step for all agents (``{"state": FieldSpec((48,))}``). Writes
        take each as a keyword argument (with the leading axis of ``extend``/``add_envs``);
        batches hold them in ``batch.globals[name]``, shape ``(B, *shape)``. Per-agent extra
        fields are declared in the specs (``AgentSpec(extras=...)``).
    alive : bool, default False
        Store an alive flag per agent per step (``batch.alive[agent]``, shape ``(B,)``, bool).
        An agent missing from a step's ``obs`` is then stored absent (zero-filled where not
        given, alive False), and writes accept ``alive={agent: bool}``.
    device : str or torch.device, optional
        ``None`` (default): NumPy arrays (in RAM, or mapped files with ``path=``). ``"cuda"``,
        ``"cuda:k"`` or ``"cpu"``: one torch tensor on that device (needs PyTorch), gathered
        there into :class:`marlbuf.stores.torch.DeviceBatch` objects; the same seed gives the
        same batches on every store. Interleaved layout only, not with ``path=`` (see
        :data:`marlbuf.stores.capabilities.CAPABILITIES` and ``docs/device.md``).

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
        device = check_device_options(device, layout, path is not None, parallel_gather)
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
        :meth:`open` (whose state it then loads). The parts come from
        :func:`marlbuf.build.build_parts`; the front holds them together."""
        parts = build_parts(
            config,
            sampler,
            seed,
            parallel_gather,
            device,
            lambda: self.sampler,
            path=path,
            durable=durable,
            files=files,
        )
        self.specs, self.capacity = config.specs, config.capacity
        self.n_trainers = config.n_trainers
        #: fields stored once per step for all agents (``global_fields=``), and whether each
        #: step records which agents are alive (``alive=``)
        self.global_fields, self.alive = config.global_fields, config.alive
        #: the torch device of the rows (``None``: NumPy arrays)
        self.device = device
        self.sampler = sampler
        self._codec, self.writer, self.rng = parts.codec, parts.writer, parts.rng
        self.episodes = parts.episodes
        #: the commit engine: the store, links, episode index and format policy of writes
        self._writes = parts.writes
        #: the files of a memory-mapped buffer (``path=``), once it is live
        self._mapped = None
        # sampling, gathers and priority feedback (the storage and sampler read through hooks:
        # a buffer whose first write decides its next_obs format replaces its store)
        self._reader = Reader(
            lambda: self.storage,
            self.writer,
            lambda: self.sampler,
            self.episodes,
            self.rng,
            self.n_trainers,
            self.device is not None,
            tuple(self.specs),
            self.global_fields,
            self._codec.field_names,
        )
        #: state_dict, load_state_dict, save and load
        self._states = BufferState(
            config, self._writes, lambda: self.sampler, self.rng, self._reader, lambda: self._mapped
        )
        store = parts.files
        if store is not None:
            store.bind(
                self.config,
                mapped.BufferHooks(
                    commit=self._writes.replay,
                    state=lambda: self._states.snapshot(copy=False, errors=False),
                    load=lambda state: self._states.load(state, adopt=True, table_ahead=True),
                    replayed=self._states.replayed,
                    attach=self._attach_store,
                    total_writes=lambda: self.writer.total_writes,
                    row_words=self._codec.row_words,
                    lock=self.writer.lock,
                ),
            )
            if path is not None:
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
        return self._states.config()

    def __len__(self) -> int:
        return self.writer.size

    def __repr__(self) -> str:
        # the format: "auto" while the first write may still choose it (the format it assumes
        # until then in brackets)
        undecided = (
            self._writes.auto_none and self.writer.total_writes == 0 and self.next_obs != "none"
        )
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
    @property
    def storage(self) -> Storage:
        """The store that holds the rows (a new one replaces it where ``next_obs="auto"``
        chooses another format at the first write)."""
        return self._writes.storage

    @property
    def links(self) -> NextObsLinks | None:
        """The next-observation links (``next_obs="once"``), else ``None``."""
        return self._writes.links

    @property
    def next_obs(self) -> str:
        """How next observations are stored: ``"once"``, ``"stored"`` or ``"none"`` (for
        ``next_obs="auto"``, the format chosen, or assumed until the first write)."""
        return self._writes.next_obs

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
        writes = self._writes
        if next_obs is None or done is None or writes.stand_ins:
            next_obs = writes.stand_in(obs, next_obs, done, "add")
        values = (obs, action, reward, next_obs, done)
        if fields or writes.codec.more:
            values = writes.codec.arrange(values, fields, "add")
        if type(stream) is not int or not 0 <= stream <= MAX_STREAM:
            stream = check_stream(stream)
        cut = False if truncated is False else check_truncated(truncated, self.agents, None)
        writes.add(values, stream, cut)

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
        writes = self._writes
        if next_obs is None or done is None or writes.stand_ins:
            next_obs = writes.stand_in(obs, next_obs, done, "extend")
        values = (obs, action, reward, next_obs, done)
        if fields or writes.codec.more:
            values = writes.codec.arrange(values, fields, "extend")
        if type(stream) is not int or not 0 <= stream <= MAX_STREAM:
            stream = check_stream(stream)
        writes.extend(values, stream, truncated)

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
        writes = self._writes
        if next_obs is None or done is None or writes.stand_ins:
            next_obs = writes.stand_in(obs, next_obs, done, "add_envs")
        values = (obs, action, reward, next_obs, done)
        if fields or writes.codec.more:
            values = writes.codec.arrange(values, fields, "add_envs")
        writes.add_envs(values, check_stream(first_stream), truncated)

    # ----------------------------------------------------------------------------- sampling
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
            :class:`marlbuf.stores.base.FieldSelection`); a left-out field raises a ``ValueError``
            naming ``fields=`` when used. ``None`` (default): every field.

        Notes
        -----
        Safe to call from several threads while others write (see :mod:`marlbuf.writer`).
        """
        return self._reader.sample(batch_size, trainer, out, fields)

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
            :class:`marlbuf.stores.base.FieldSelection`); a left-out field raises a ``ValueError``
            naming ``fields=`` when used. ``None`` (default): every field.
        """
        return self._reader.sample_for_trainers(batch_size, n_trainers, shared_index, out, fields)

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
        return self._reader.iter_trainers(batch_size, n_trainers, fields)

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
        return check_trainer(trainer, self.n_trainers)

    def check_n_trainers(self, n_trainers: Any) -> int:
        """``n_trainers`` of a round as :meth:`sample_for_trainers` checks it: ``None`` gives
        the buffer's ``n_trainers``, else an int in ``[1, n_trainers]`` (``TypeError`` or
        ``ValueError`` otherwise)."""
        return check_n_trainers(n_trainers, self.n_trainers)

    def sample_prefix(
        self,
        batch_size: int,
        size: int,
        trainer: int = 0,
        out: Batch | None = None,
        fields: tuple[str, ...] | None = None,
    ) -> Batch:
        """One batch drawn by the buffer's sampler from slots ``[0, size)`` only (``size`` in
        ``[1, len(self)]``), as :meth:`sample` would draw it if the buffer held just those:
        one shard's part of a draw over several buffers (the learner of
        :class:`marlbuf.distributed.ShardedReplayBuffer` splits the batch by the sizes it
        counted, so the global draw is exact for the counted state; ``docs/distributed.md``).
        The sampler is asked through
        :meth:`marlbuf.samplers.Sampler.sample_share`. Samplers that draw from state kept per
        slot (priority trees, the episode index) draw from every stored slot, so for them
        ``size`` must be ``len(self)``. ``batch_size``, ``trainer``, ``out`` and ``fields`` are
        those of :meth:`sample`, and so is the batch returned.
        """
        return self._reader.sample_prefix(batch_size, size, trainer, out, fields)

    def gather(
        self, indices: Any, trainer: int | None = None, fields: tuple[str, ...] | None = None
    ) -> Batch:
        """The joint batch at explicit ``indices`` (shape (B,), ints in ``[0, len(self))``,
        ``B >= 1``: empty ``indices`` are a ``ValueError``, like ``latest(0)``); ``fields`` as
        in :meth:`sample`."""
        return self._reader.gather(indices, trainer, fields)

    def latest(self, n: int) -> Batch:
        """The newest ``n`` joint transitions, oldest first (``n <= len(self)``)."""
        return self._reader.latest(n)

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
        return self._reader.stored(field)

    def reward_stats(self) -> dict[str, tuple[float, float]]:
        """Mean and standard deviation of every stored reward, per agent (for reward
        normalisation and logging): ``{agent: (mean, std)}``, accumulated in float64.

        Reads the stored rewards once (O(len(self)), nothing is added to the write path).
        """
        return self._reader.reward_stats()

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
        return self._reader.gather_sequences(starts, length, fields)

    @property
    def complete_episodes(self) -> int:
        """Complete episodes stored: ended, with every step still stored (what
        :class:`marlbuf.samplers.Episodes` draws from). Needs the episode index (a sequence
        or episode sampler)."""
        return self._reader.episode_index("complete_episodes").n_complete

    @property
    def stored_episodes(self) -> int:
        """Episodes with at least one stored step: the complete ones, those the ring has
        overwritten in part and those still being written (O(len(self))). Needs the episode
        index (a sequence or episode sampler)."""
        return self._reader.stored_episodes()

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
        self._reader.update_priorities(indices, td_errors, trainer, generations, sync)

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
        self._reader.apply_deferred_updates()

    #: :meth:`apply_deferred_updates` under the name the learners use to surface errors
    check_priority_errors = apply_deferred_updates

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
        return self._states.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output into this buffer (same specs, capacity, layout).

        The state is checked as a whole before anything changes: every field against the others
        and against what it indexes (ring counters and write generations, next-observation
        links and side rows, priorities only for written slots, RNG state). A rejected state
        (``ValueError`` naming the field) leaves the buffer as it was.
        """
        self._states.load(state, adopt=False)

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
        self._states.save(path, overwrite)

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

        def build(saved: BufferConfig) -> BufferState:
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
            return buf._states

        load_file(path, build)
        return built[0]

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

        def build(
            config: BufferConfig, sampler: Sampler, files: mapped.MappedStore
        ) -> tuple[MultiAgentReplayBuffer, Mapping[str, np.ndarray]]:
            buffer = cls.__new__(cls)
            buffer._build(config, sampler, None, parallel_gather, None, files=files)
            return buffer, buffer.storage.arrays()

        return open_folder(path, durable, mode, parallel_gather, build)

    def _attach_store(self, store: mapped.MappedStore | None) -> None:
        """Make the memory-mapped ``store`` live: from now on writes are logged there."""
        self._mapped = store
        self._writes.log = store  # the folder's redo log (marlbuf.writer.commit.WriteLog)

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


__all__ = [
    "MultiAgentReplayBuffer",
    "NextObsDroppedWarning",
    "NextObsWarning",
    "SlowWriteWarning",
    "StreamBreakWarning",
]
