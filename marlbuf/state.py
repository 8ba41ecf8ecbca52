"""A buffer's state: assembled from its parts, checked as a whole, loaded, saved and reopened.

:class:`BufferState` does the work behind :class:`marlbuf.MultiAgentReplayBuffer`'s
``state_dict``, ``load_state_dict``, ``save`` and ``load`` over the parts it is given (the
configuration, the commit engine with the ring, store, links and episode index it holds, the
sampler, the generator, the reader, the memory-mapped folder), never the buffer itself. Each
part checks its own part of a loaded state (``RingWriter.check_loaded``,
``NextObsLinks.check_loaded``, ``EpisodeIndex.check_loaded``, ``Sampler.check_loaded``, the
store); this module compares the header with the buffer, converts a state of another layout
or ``next_obs`` format (:func:`marlbuf.convert.convert_state`), and loads nothing until every
part has accepted its own. :func:`load_file` and :func:`open_folder` are the state side of the
front's ``load`` and ``open``: the front builds the buffer, they read and check what it is
built from.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from marlbuf import _config, mapped, persistence
from marlbuf.config import BufferConfig
from marlbuf.convert import convert_state, staged_rows
from marlbuf.options import check_capacity, check_header
from marlbuf.reading import Reader
from marlbuf.samplers import Sampler
from marlbuf.spec import ALIVE
from marlbuf.writer.commit import WritePath

if TYPE_CHECKING:
    from marlbuf.stores.base import Storage

#: what :func:`open_folder` builds (the front's buffer)
Built = TypeVar("Built")


class BufferState:
    """The state side of one buffer, over its parts.

    Parameters
    ----------
    config : BufferConfig
        The configuration the buffer was built from (:meth:`config` gives it as it is now).
    writes : WritePath
        The commit engine: the codec, the ring (counters, write generations, the locks), the
        store, the next-observation links and the episode index it holds, and the ``next_obs``
        format policy (a loaded state may decide an undecided ``next_obs="auto"``).
    sampler : callable
        Returns the buffer's bound sampler (its attribute, which may be replaced).
    rng : numpy.random.Generator
        The buffer's generator (its bit generator's state is saved and restored).
    reader : Reader
        The reading side: deferred priority updates are applied before a state is taken, and
        draws meant for a replaced state are forgotten.
    files : callable
        Returns the buffer's live memory-mapped folder (:class:`marlbuf.mapped.MappedStore`),
        or ``None`` for a buffer in memory.
    """

    def __init__(
        self,
        config: BufferConfig,
        writes: WritePath,
        sampler: Callable[[], Sampler],
        rng: np.random.Generator,
        reader: Reader,
        files: Callable[[], mapped.MappedStore | None],
    ) -> None:
        self.built = config
        self.writes = writes
        self.codec = writes.codec
        self.writer = writes.ring
        self.episodes = writes.episodes
        self.sampler = sampler
        self.rng = rng
        self.reader = reader
        self.files = files

    @property
    def storage(self) -> Storage:
        """The store (a buffer whose first write decides its format replaces it)."""
        storage: Storage = self.writes.storage
        return storage

    def config(self) -> BufferConfig:
        """See :attr:`marlbuf.MultiAgentReplayBuffer.config`."""
        storage, sampler = self.storage, self.sampler()
        return dataclasses.replace(
            self.built,
            layout=storage.layout,
            next_obs=self.writes.next_obs,
            sampler_type=type(sampler).__name__,
            sampler_config=sampler.config(),
            batch_layout=storage.batch_layout,
            batch_dtype=storage.batch_dtype,
        )

    # ------------------------------------------------------------------------ taking
    def state_dict(self) -> dict[str, Any]:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.state_dict`."""
        for _ in range(persistence.SNAPSHOT_ATTEMPTS - 1):
            with self.writer.lock:
                state = self.snapshot(copy=False, live=True)
            try:
                state["storage"] = {k: rows.copy() for k, rows in state["storage"].items()}
                return state
            except persistence.SnapshotMoved:
                continue  # a writer overtook the copy: again, from a new state
        with self.writer.lock:
            return self.snapshot(copy=True)

    def save(self, path: str | os.PathLike[str], overwrite: bool) -> None:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.save`."""
        for _ in range(persistence.SNAPSHOT_ATTEMPTS - 1):
            with self.writer.lock:
                state = self.snapshot(copy=False, live=True)
            try:
                persistence.write_state(state, path, overwrite=overwrite)
                return
            except persistence.SnapshotMoved:
                continue  # a writer overtook the stream: again, from a new state
        with self.writer.lock:
            persistence.write_state(self.snapshot(copy=False), path, overwrite=overwrite)

    def snapshot(self, copy: bool, live: bool = False, errors: bool = True) -> dict[str, Any]:
        """The buffer's state (call under ``writer.lock``); with ``copy=False`` the buffer's own
        arrays are views of the live memory (what a checkpoint writes from, so that it copies
        nothing). With ``live=True`` everything but the storage rows is copied, and each storage
        array is a :class:`marlbuf.persistence.LiveRows` whose rows are copied later, a chunk
        at a time under the lock, as long as their write generations are still those of this
        state (else :class:`~marlbuf.persistence.SnapshotMoved`): what :meth:`save` writes.
        ``errors=False`` (a checkpoint): the error of a deferred priority update is kept for the
        next call that reads priorities instead of raised here."""
        if errors:
            self.reader.apply_deferred_updates()  # the state holds every update made so far
        else:
            self.reader.settle_deferred()
        filled = self.writer.size  # slots [0, size) hold data while filling; all once full
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
        config = self.config()
        header = config.to_dict(batch_options=False)
        header["sampler"]["state"] = self.sampler().state_dict()
        links = self.writes.links
        return {
            "format": _config.SAVE_FORMAT,
            "version": _config.SAVE_VERSION,
            **header,
            **ring,
            "rng": self.rng.bit_generator.state,  # a new dict on every read
            "storage": storage,
            "links": {} if links is None else links.state_dict(copy=copy),
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

    # ------------------------------------------------------------------------ loading
    def load(self, state: Mapping[str, Any], adopt: bool, table_ahead: bool = False) -> None:
        """See :meth:`marlbuf.MultiAgentReplayBuffer.load_state_dict`; ``adopt``: keep the
        state's arrays (nobody else holds them); ``table_ahead``: the storage holds the state's
        rows already, and may hold newer ones (a memory-mapped checkpoint before its log is
        replayed), so the parts are cross-checked against the rows after the replay
        (:meth:`replayed`)."""
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
        """:meth:`load`: the header compared with this buffer's configuration."""
        check_header(state)
        saved = BufferConfig.from_dict(state)
        # next_obs="auto" not yet decided by a write: the state's format decides (a buffer that
        # chose "stored" or "none" from its first write loads into a new default buffer)
        saved_format = saved.next_obs
        writes, mine = self.writes, self.built
        deciding = writes.deciding and self.writer.total_writes == 0
        adopt_dense = deciding and writes.choose_format and saved_format == "stored"
        adopt_none = deciding and writes.next_obs != "none" and saved_format == "none"
        mismatch = [
            (k, ours, theirs)
            for k, ours, theirs in (
                ("specs", mine.specs, saved.specs),
                ("capacity", mine.capacity, saved.capacity),
                ("global_fields", mine.global_fields, saved.global_fields),
                ("alive", mine.alive, saved.alive),
                ("n_trainers", mine.n_trainers, saved.n_trainers),
            )
            if ours != theirs
        ]
        if mismatch:
            key, ours, theirs = mismatch[0]
            raise ValueError(
                f"state_dict does not fit this buffer: {key} is {ours!r} here, {theirs!r} in "
                "the state; build the buffer with MultiAgentReplayBuffer.load instead"
            )
        if not (adopt_dense or adopt_none):  # another layout or format is converted first
            converted = convert_state(state, self.codec, self.storage.layout, writes.next_obs)
            self._load_checked(converted, adopt, table_ahead)
            if writes.deciding and self.writer.total_writes:
                writes.decided()  # steps are stored: the format stays
            return
        with self.writer.write_lock, self.writer.lock:
            before = writes.format_state()
            if adopt_none:
                writes.drop_next_obs()
            else:
                writes.choose_format = False
                writes.store_next_obs()
            try:
                converted = convert_state(state, self.codec, self.storage.layout, writes.next_obs)
                self._load_checked(converted, adopt)
            except BaseException:  # a rejected state leaves the buffer as it was
                writes.restore_format(before)
                raise
            writes.decided()

    def _load_checked(
        self, state: Mapping[str, Any], adopt: bool, table_ahead: bool = False
    ) -> None:
        """:meth:`load` once the state's format matches this buffer's: every field checked
        against the others before anything changes."""
        # every part checks its own part of the state first: a rejected state changes nothing
        writer, links, episodes, storage = (
            self.writer,
            self.writes.links,
            self.episodes,
            self.storage,
        )
        sampler, files = self.sampler(), self.files()
        size, generations = writer.check_loaded(state)
        if links is not None:
            links.check_loaded(state["links"], size, generations)
        sampler.check_loaded(state["sampler"]["state"], size)
        storage.check_saved(state["storage"], size)
        episodes_state = state.get("episodes") or {}
        stored_next = None if table_ahead else self._stored_next(state)
        if episodes is not None and episodes_state:
            episodes.check_loaded(episodes_state, size, generations, stored_next)
        try:
            scratch = type(self.rng.bit_generator)()
            scratch.state = state["rng"]
        except (TypeError, ValueError, KeyError, OverflowError, AttributeError) as exc:
            raise ValueError(
                f"state_dict has an unusable rng state ({type(exc).__name__}: {exc}); expected "
                f"the state of a {type(self.rng.bit_generator).__name__} bit generator, as "
                "state_dict() writes it"
            ) from exc
        sampler_before = sampler.state_dict()
        sampler.load_state_dict(state["sampler"]["state"])  # raises before it changes
        with writer.lock:
            if files is not None:  # the files are unusable until the new checkpoint
                files.begin_replace()
            try:
                storage.restore(state["storage"], size)  # skips what load() read in place
            except BaseException:
                sampler.load_state_dict(sampler_before)
                raise
            writer.load_state_dict(state)
            if links is not None:
                links.load_state_dict(state["links"], adopt=adopt)
            if episodes is not None:
                if episodes_state:
                    episodes.load_state_dict(episodes_state, size, generations, stored_next)
                else:  # saved without an index: rebuilt from done flags and next_obs links
                    episodes.reconstruct(
                        size,
                        self._stored_ends(size),
                        None if links is None else links.next_slot,
                    )
                sampler.rebuild(size)
            self.reader.forget()  # draws and updates meant for the state this one replaces
            self.rng.bit_generator.state = state["rng"]
            if files is not None:
                files.checkpoint(sync=True)

    def replayed(self) -> None:
        """A memory-mapped checkpoint was loaded and its log replayed: the table now holds
        exactly the loaded state's rows, so the episode index's record of each open stream's
        last next_obs is checked against them (or, for a checkpoint of an earlier version
        without one, taken from them)."""
        if self.episodes is None or not self.episodes.obs_bytes:
            return
        size, links = self.writer.size, self.writes.links
        live = {
            "layout": self.storage.layout,
            "next_obs": self.writes.next_obs,
            "storage": self.storage.arrays(),
            "links": {} if links is None else links.state_dict(copy=False),
        }
        self.episodes.settle_stream_next(
            size, self.writer.write_generation[:size], self._stored_next(live)
        )

    def _stored_next(self, state: Mapping[str, Any]) -> Any:
        """The episode index's ``stored_next`` for ``state`` (in this buffer's format): the
        next_obs section of filled slots as the writer staged it, and whether the stream-break
        check compares it (:class:`marlbuf.writer.StoredNext`)."""
        codec, writes = self.codec, self.writes
        start, width = codec.next_obs_start, codec.obs_bytes

        def read(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rows = staged_rows(state, codec, slots)
            quiet, _ = writes.break_flags(rows)
            return rows.view(np.uint8)[:, start : start + width], quiet

        return read

    def _stored_ends(self, size: int) -> np.ndarray:
        """Per filled slot (shape (size,), bool), whether every (alive) agent's stored done is
        set."""
        every = np.ones(size, dtype=bool)
        storage, alive = self.storage, self.built.alive
        for agent in self.built.specs:
            done = np.asarray(storage.read_field("done", agent, size) != 0)
            if alive:
                done = done | ~np.asarray(storage.read_field(ALIVE, agent, size))
            every &= done.reshape(size, -1).all(axis=1)
        return every

    def destinations(self, header: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Where a file with JSON part ``header`` may read its storage arrays straight into
        (:func:`marlbuf.persistence.storage_destinations`): this buffer's own, when they have
        the file's shape."""
        files = self.files()
        return persistence.storage_destinations(
            self.config(),
            self.storage.arrays(),
            (lambda: None) if files is None else files.begin_replace,
            header,
        )


def check_file(header: dict[str, Any], shapes: Mapping[str, Any]) -> None:
    """A buffer file's JSON part and declared array shapes, checked before anything is
    allocated: the declared shapes must fit the header's capacity and ``n_trainers``."""
    check_header(header)
    saved = BufferConfig.from_dict(header)
    persistence.check_declared_shapes(
        shapes, check_capacity(saved.capacity), saved.n_trainers, saved.sampler().weighted
    )


def load_file(path: str | os.PathLike[str], build: Callable[[BufferConfig], BufferState]) -> None:
    """Read the buffer file at ``path`` (written by ``save``) into the buffer that ``build``
    makes from the file's configuration (called once, with the JSON part, before any array is
    read), checked before memory is spent on it (:func:`check_file`), then as a whole
    (:meth:`BufferState.load`). ``ValueError`` for a header no buffer can be built from."""
    built: list[BufferState] = []

    def destinations(header: dict[str, Any]) -> dict[str, np.ndarray]:
        target = build(BufferConfig.from_dict(header))
        built.append(target)
        return target.destinations(header)

    try:
        state = persistence.read_state(path, destinations, check_file)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{os.fspath(path)!r} has an invalid header ({type(exc).__name__}: {exc}); it "
            "is not a buffer file this marlbuf can build a buffer from"
        ) from exc
    built[0].load(state, adopt=True)  # storage already in place; fresh arrays adopted


def open_folder(
    path: str | os.PathLike[str],
    durable: bool,
    mode: str,
    parallel_gather: bool,
    build: Callable[
        [BufferConfig, Sampler, mapped.MappedStore], tuple[Built, Mapping[str, np.ndarray]]
    ],
) -> Built:
    """Claim the memory-mapped folder at ``path`` (see ``MultiAgentReplayBuffer.open``), check
    its manifest as the constructor checks its arguments, have ``build`` make the buffer over
    it (which loads the folder's checkpoint) and return it with its storage arrays, then
    recover: the log replayed and the table's stamps checked. The folder is released again if
    any of it fails (``ValueError`` naming the manifest for one that describes no buffer)."""
    store = mapped.MappedStore.open(path, durable, mode)
    manifest_path = str(store.folder / mapped.MANIFEST)
    try:
        assert store.manifest is not None
        try:
            saved = BufferConfig.from_dict(store.manifest, strict=True)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"{manifest_path!r} is corrupt (missing or invalid {exc})") from exc
        try:
            config, sampler = saved.checked(parallel_gather)
            buffer, arrays = build(config, sampler, store)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{manifest_path!r} describes no valid buffer: {exc}") from exc
        mapped.recover(store, arrays)
    except BaseException:
        store.release()
        raise
    return buffer


__all__ = ["BufferState", "check_file", "load_file", "open_folder"]
