"""The store a memory-mapped buffer uses: :class:`MappedStore` maps the storage arrays and
stamps from the folder's files, logs every write before the buffer applies it, checkpoints
the metadata, replays the log on :func:`recover`, and holds the folder's lock."""

from __future__ import annotations

import errno
import math
import mmap
import os
import secrets
import shutil
import stat
import weakref
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf import _config, persistence
from marlbuf._kernels.checksum import (
    checksum,
    write_record,
)
from marlbuf.config import BufferConfig
from marlbuf.mapped import files, redo
from marlbuf.mapped.earlier import replay_legacy, replay_v3
from marlbuf.mapped.files import CHECKPOINT, MANIFEST
from marlbuf.mapped.hooks import BufferHooks
from marlbuf.memory import MemoryEstimate
from marlbuf.writer import RingWriter

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no inter-process lock
    fcntl = None  # type: ignore[assignment]


def resident(needed: MemoryEstimate) -> MemoryEstimate:
    """The part of ``needed`` that stays in RAM when the storage arrays are mapped files."""
    return replace(needed, table_row_bytes=0)


class MappedStore:
    """The files of one memory-mapped buffer: storage arrays, stamps, checkpoint, redo log and
    lock.

    Built by :meth:`create` (a new buffer) or :meth:`open` (an existing one); the buffer's
    constructor maps its storage arrays through :meth:`allocate`, and :meth:`start` (new) or
    :func:`recover` (existing) makes it live. Writes are then logged by :meth:`log` before the
    buffer applies them and :meth:`committed` after (:meth:`retract` when the buffer could not
    apply a logged write); every method runs under the buffer's ``writer.lock`` (the callers
    hold it).
    """

    def __init__(
        self, folder: Path, durable: bool, manifest: dict[str, Any] | None, readonly: bool = False
    ) -> None:
        self.folder = folder
        self.durable = bool(durable)
        #: opened with ``mode="r"``: mapped read-only, nothing written, writes refused
        self.readonly = bool(readonly)
        #: the configuration read by :meth:`open`; ``None`` while creating
        self.manifest = manifest
        #: the folder's random id (manifest, checkpoints and log header share it)
        self.folder_id = 0
        self._arrays: dict[str, dict[str, Any]] = {}  # name -> file, dtype, shape
        self._maps: list[mmap.mmap] = []
        self._mapped_arrays: list[np.ndarray] = []
        self._stamps: np.ndarray | None = None  # per slot: write generation + 1 (0: none)
        self._fds: dict[str, int] = {}  # "folder" (the lock), "log": raw descriptors
        self._finalizer = weakref.finalize(self, files.close_all, self._fds)
        self._log_map: mmap.mmap | None = None
        self._log_words: np.ndarray | None = None  # the mapped log as words
        self.checkpoint_number = 0
        self.checkpoint_id = 0  # random id of the current checkpoint
        self._previous_id = -1  # id of the checkpoint before it
        self._seq = 0  # next record's sequence number since the checkpoint
        self._offset = redo.LOG_HEADER_BYTES  # next record's position in the log
        self._reserved = 0  # bytes of the log reserved on disk (and mapped)
        self._limit = _config.MAPPED_LOG_BYTES
        self._row_words = 0
        self._hooks: BufferHooks | None = None  # the buffer's calls, given by bind()
        self.config: BufferConfig  # the buffer's configuration, given by bind()
        self._log_version = 4  # the folder's log format (1-3: an earlier version's folder)
        self._clean_on_disk = False  # the log's header says no record follows
        self._header_current = False  # the log's header names the loaded checkpoint
        self._last: tuple[int, int, int, int] | None = None  # the last record, for retract()
        self._restamp = False  # the table is being replaced: stamps rewritten at checkpoint
        self._problems: list[str] = []  # what opening found wrong with the log
        self._made_folder = False  # by create(): removed again if the creation fails
        self.closed = False

    def bind(self, config: BufferConfig, hooks: BufferHooks) -> None:
        """Take the configuration and the calls of the buffer this store serves (its
        constructor gives them)."""
        self.config = config
        self._hooks = hooks
        self._row_words = hooks.row_words

    @property
    def capacity(self) -> int:
        """Slots of the buffer this store serves."""
        return self.config.capacity

    @property
    def hooks(self) -> BufferHooks:
        if self._hooks is None:
            raise RuntimeError("this MappedStore serves no buffer yet (bind() was not called)")
        return self._hooks

    def clean_on_disk(self) -> bool:
        """Whether the folder is marked clean on disk (no record follows the checkpoint): set
        by :meth:`close` (and by a checkpoint), cleared by the first write after it."""
        return self._clean_on_disk

    # ------------------------------------------------------------------------ create / open
    @classmethod
    def create(cls, path: Any, durable: bool, needed: MemoryEstimate) -> MappedStore:
        """Claim a new folder for a buffer whose estimate is ``needed``.

        ``path`` must not exist (its parent must) or be an empty folder; a folder left by a
        creation that was interrupted (only this module's files, no manifest) is reused.
        """
        folder = files.folder_path(path)
        files.check_durable(durable)
        made = False
        if folder.is_symlink():
            target = os.readlink(folder)
            state = "" if folder.exists() else ", which does not exist"
            raise FileExistsError(
                errno.EEXIST,
                f"{str(folder)!r} is a symbolic link to {target!r}{state}; a memory-mapped "
                "buffer needs a real folder: pass the path of a new or empty folder",
            )
        if folder.is_dir():
            if (folder / MANIFEST).exists() or (folder / MANIFEST).is_symlink():
                raise FileExistsError(
                    errno.EEXIST,
                    f"{str(folder)!r} already holds a memory-mapped buffer; reopen it with "
                    "MultiAgentReplayBuffer.open(path), or delete the folder to start afresh",
                )
            foreign = files.foreign_files(folder)
            if foreign:
                raise FileExistsError(
                    errno.EEXIST,
                    f"{str(folder)!r} holds other files ({', '.join(foreign[:5])}); a "
                    "memory-mapped buffer needs a folder of its own: pass a new or empty folder",
                )
        elif folder.exists():
            raise FileExistsError(
                errno.EEXIST,
                f"{str(folder)!r} is a file; a memory-mapped buffer keeps its storage in a "
                "folder: pass the path of a new or empty folder",
            )
        else:
            parent = folder.parent
            if not parent.is_dir():
                raise FileNotFoundError(
                    errno.ENOENT,
                    f"cannot create the buffer folder {str(folder)!r}: its parent "
                    f"{str(parent)!r} does not exist; create it first",
                )
            folder.mkdir()
            made = True
        store = cls(folder, durable, None)
        store._made_folder = made
        try:
            store._lock()
            for p in folder.iterdir():  # what an interrupted creation left
                p.unlink()
            free = shutil.disk_usage(folder).free
            log_bytes = files.round_up(
                redo.LOG_HEADER_BYTES + _config.MAPPED_LOG_BYTES, redo.LOG_UNIT_BYTES
            )
            disk = needed.storage_bytes + 8 * needed.capacity + log_bytes  # rows, stamps, log
            if disk > free:
                gib = 1024**3
                raise OSError(
                    errno.ENOSPC,
                    f"this buffer's storage and redo log need "
                    f"{disk / gib:.2f} GiB on disk but "
                    f"{str(folder)!r} has {free / gib:.2f} GiB free; reduce capacity or choose "
                    "a folder on another disk",
                )
        except BaseException:
            store.abandon()
            raise
        return store

    @classmethod
    def open(cls, path: Any, durable: bool, mode: Any = "r+") -> MappedStore:
        """Claim the folder of an existing buffer (``mode="r"``: shared, read-only) and read
        its manifest."""
        folder = files.folder_path(path)
        files.check_durable(durable)
        readonly = files.check_mode(mode)
        if not folder.exists():
            raise FileNotFoundError(
                errno.ENOENT,
                f"no memory-mapped buffer at {str(folder)!r}: the folder does not exist",
            )
        if not folder.is_dir():
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"{str(folder)!r} is a file, not the folder of a memory-mapped buffer (a file "
                "written by save() is read with MultiAgentReplayBuffer.load)",
            )
        manifest_path = folder / MANIFEST
        if not manifest_path.is_file() and not manifest_path.is_symlink():
            if any(folder.iterdir()) and not files.foreign_files(folder):
                raise ValueError(
                    f"{str(folder)!r} holds an incomplete memory-mapped buffer (its creation "
                    "was interrupted, so it holds no data); delete the folder or create a new "
                    "buffer there"
                )
            raise ValueError(
                f"{str(folder)!r} is not a marlbuf memory-mapped buffer (it has no {MANIFEST})"
            )
        store = cls(folder, durable, None, readonly)
        try:
            store._lock()
            store.manifest = files.read_manifest(
                store._open_file(MANIFEST, write=False), manifest_path
            )
            version = store.manifest["version"]
            store._log_version = 1 if version < 3 else version
            if version >= 4:
                try:
                    store.folder_id = manifest_int(store.manifest, "folder_id")
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"{str(manifest_path)!r} is corrupt ({exc})") from exc
        except BaseException:
            store.release()
            raise
        return store

    def _lock(self) -> None:
        """Lock the folder itself (``flock`` on its descriptor): no file whose deletion would
        release the lock. Exclusive for writing, shared for ``mode="r"``."""
        fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | files.CLOEXEC)
        self._fds["folder"] = fd
        if fcntl is None:  # pragma: no cover
            return
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            what = (
                "open for writing in another buffer object"
                if self.readonly
                else "open in another buffer object"
            )
            raise BlockingIOError(
                exc.errno,
                f"the memory-mapped buffer at {str(self.folder)!r} is {what} (this or another "
                "process); close() that one first",
            ) from None

    def _open_file(self, name: str, write: bool, create: bool = False) -> int:
        """A descriptor of the regular file ``name`` in the folder: opened relative to the
        folder's descriptor, without following a symbolic link; refused (``ValueError`` naming
        it) unless it is a regular file with no other hard link."""
        if "/" in name or name in ("", ".", "..") or (os.sep != "/" and os.sep in name):
            raise ValueError(
                f"{str(self.folder / MANIFEST)!r} names the file {name!r}; a memory-mapped "
                "buffer's files are plain names inside its folder (corrupt or crafted manifest)"
            )
        path = self.folder / name
        flags = (os.O_RDWR if write else os.O_RDONLY) | files.CLOEXEC | getattr(os, "O_NONBLOCK", 0)
        flags |= getattr(os, "O_NOFOLLOW", 0) | (os.O_CREAT if create else 0)
        try:
            fd = os.open(name, flags, 0o666, dir_fd=self._fds["folder"])
        except FileNotFoundError:
            raise FileNotFoundError(
                errno.ENOENT,
                f"the memory-mapped buffer at {str(self.folder)!r} lacks its file {name!r} "
                "(incomplete copy?)",
            ) from None
        except IsADirectoryError:
            raise ValueError(
                f"{str(path)!r} is a folder; a memory-mapped buffer's {name!r} must be a regular "
                "file (the folder was altered: restore the file from a copy of the folder)"
            ) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(
                    f"{str(path)!r} is a symbolic link; a memory-mapped buffer's files must be "
                    "regular files inside its folder, never links (which could send its writes "
                    "elsewhere): replace the link by the file itself"
                ) from None
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and write:
                raise PermissionError(
                    exc.errno,
                    f"cannot open {str(path)!r} for writing ({exc.strerror}); a buffer on "
                    "read-only media or in a folder you may not write is opened with "
                    "MultiAgentReplayBuffer.open(path, mode='r') to sample from it",
                ) from None
            raise
        info = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = f"is {persistence.file_kind(info.st_mode)}, not a regular file"
        elif info.st_nlink > 1:
            problem = (
                f"has {info.st_nlink - 1} other hard link(s); its contents could be changed "
                "through them (or it is a file outside the folder)"
            )
        if problem is not None:
            os.close(fd)
            raise ValueError(
                f"{str(path)!r} {problem}; a memory-mapped buffer's files must be regular files "
                "of its own folder: restore the file from a copy of the folder"
            )
        os.set_blocking(fd, True)
        return fd

    def release(self) -> None:
        """Close the log and give up the lock (the mapped arrays stay valid while referenced)."""
        files.close_all(self._fds)

    def abandon(self) -> None:
        """A creation failed: release, delete the files made so far, and the folder if made."""
        self.release()
        if self.manifest is not None:
            return  # never for an existing buffer
        for p in self.folder.iterdir():
            if not p.is_symlink() and p.is_file() and files.OWN_FILE.fullmatch(p.name):
                p.unlink()
        if self._made_folder and not any(self.folder.iterdir()):
            self.folder.rmdir()

    # ------------------------------------------------------------------------ storage arrays
    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The storage array ``name``: a new file (creating) or the existing one (opening),
        mapped into memory (read-only with ``mode="r"``). Matches
        :data:`marlbuf.storage.Allocator`."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if self.manifest is None:
            file = f"array-{len(self._arrays)}.bin"
            self._arrays[name] = {"file": file, "dtype": dtype.str, "shape": list(shape)}
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | files.CLOEXEC
            fd = os.open(file, flags, 0o666, dir_fd=self._fds["folder"])
            try:
                files.reserve(fd, nbytes, self.folder / file)
                return self._map(fd, nbytes, shape, dtype)
            finally:
                os.close(fd)
        entry = self.manifest["arrays"].get(name)
        if (
            not isinstance(entry, dict)
            or entry.get("shape") != list(shape)
            or entry.get("dtype") != dtype.str
        ):
            raise ValueError(
                f"{str(self.folder / MANIFEST)!r} describes storage array {name!r} as {entry!r}; "
                f"its specs need shape {list(shape)} dtype {dtype.str!r} (corrupt manifest)"
            )
        named: Any = entry.get("file")
        if not isinstance(named, str) or not files.ARRAY_FILE.fullmatch(named):
            raise ValueError(
                f"{str(self.folder / MANIFEST)!r} names {named!r} as the file of storage array "
                f"{name!r}; storage files are plain names 'array-<i>.bin' inside the folder "
                "(corrupt or crafted manifest: nothing outside the folder is opened)"
            )
        return self._map_file(named, "storage", shape, dtype)

    def _map_file(
        self, file: str, what: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        """Map the existing ``file`` of the folder (read-only with ``mode="r"``), which must
        hold exactly an array of ``shape`` and ``dtype``; ``what`` it is, for the errors."""
        nbytes = math.prod(shape) * dtype.itemsize
        mapped_file = self.folder / file
        try:
            fd = self._open_file(file, write=not self.readonly)
        except FileNotFoundError:
            raise ValueError(
                f"the memory-mapped buffer at {str(self.folder)!r} lacks its {what} file "
                f"{str(mapped_file)!r} (incomplete copy?)"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise ValueError(
                    f"{what} file {str(mapped_file)!r} holds {size} bytes; the buffer needs "
                    f"{nbytes} (truncated or corrupt)"
                )
            return self._map(fd, nbytes, shape, dtype)
        finally:
            os.close(fd)

    def _map(self, fd: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if nbytes == 0:
            array = np.zeros(shape, dtype=dtype)
            array.flags.writeable = not self.readonly
            return array
        # read-only: a private copy-on-write mapping of a file opened read-only, so that opening
        # may replay the log in memory; the arrays are made read-only once open (freeze())
        access = mmap.ACCESS_COPY if self.readonly else mmap.ACCESS_WRITE
        mapping = mmap.mmap(fd, nbytes, access=access)
        self._maps.append(mapping)
        # a plain ndarray over the mapping (kernels take it like any array)
        array = np.frombuffer(mapping, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
        self._mapped_arrays.append(array)
        return array

    def freeze(self) -> None:
        """Make the storage arrays of a read-only store read-only (once the log is replayed)."""
        if self.readonly:
            for array in self._mapped_arrays:
                array.flags.writeable = False

    def release_pages(self) -> None:
        """Let the OS take back this process's pages of the storage files (``madvise`` with
        ``MADV_DONTNEED``): their contents stay in the files (the mappings are shared), and
        the next access reads them back. Bulk writers call it between chunks, so that resident
        memory follows the chunk, not the files. Nothing to do for a read-only store, whose
        private mappings may hold replayed rows that are in no file."""
        if self.readonly or not hasattr(mmap, "MADV_DONTNEED"):
            return
        for mapping in self._maps:
            mapping.madvise(mmap.MADV_DONTNEED)

    def sync_arrays(self) -> None:
        """Flush the mapped storage arrays to disk (``msync``)."""
        if self.readonly:
            return
        for mapping in self._maps:
            mapping.flush()

    # ------------------------------------------------------------------------ stamps
    def map_stamps(self, capacity: int) -> None:
        """Map the stamps file of an existing folder (version 4), checked against the manifest;
        a folder of an earlier version has none (until :meth:`upgrade`)."""
        if self._log_version < 4:
            return
        assert self.manifest is not None
        entry = self.manifest.get("stamps")
        if (
            not isinstance(entry, dict)
            or entry.get("file") != files.STAMPS
            or entry.get("shape") != [capacity]
            or entry.get("dtype") != np.dtype(np.int64).str
        ):
            raise ValueError(
                f"{str(self.folder / MANIFEST)!r} describes the stamps file as {entry!r}; a "
                f"buffer of capacity {capacity} has {{'file': {files.STAMPS!r}, 'dtype': '<i8', "
                f"'shape': [{capacity}]}} (corrupt or crafted manifest)"
            )
        self._stamps = self._map_file(files.STAMPS, "stamps", (capacity,), np.dtype(np.int64))

    def _create_stamps(self, capacity: int) -> None:
        """A new stamps file of ``capacity`` zeros (one left by an interrupted upgrade is
        replaced), reserved on disk and mapped."""
        flags = os.O_RDWR | os.O_CREAT | files.CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(files.STAMPS, flags, 0o666, dir_fd=self._fds["folder"])
        try:
            os.ftruncate(fd, 0)
            files.reserve(fd, 8 * capacity, self.folder / files.STAMPS)
            self._stamps = self._map(fd, 8 * capacity, (capacity,), np.dtype(np.int64))
        finally:
            os.close(fd)

    def _stamp_ring(self, total_writes: int) -> None:
        """Stamps of a ring after ``total_writes`` writes (every filled slot's generation)."""
        assert self._stamps is not None
        expected = ring_stamps(self._stamps.shape[0], total_writes)
        if not np.array_equal(self._stamps, expected):
            self._stamps[:] = expected

    # ------------------------------------------------------------------------ going live
    def start(self, config: BufferConfig) -> None:
        """Make a new buffer live: stamps, first checkpoint, clean log, then the manifest."""
        try:
            self._start(config)
        except BaseException:
            self.manifest = None
            self.abandon()
            raise

    def _start(self, config: BufferConfig) -> None:
        self.folder_id = secrets.randbits(63)
        self._create_stamps(self.capacity)
        self._open_log(create=True)
        self.checkpoint(sync=True)
        manifest = {
            "format": files.FORMAT,
            "version": files.FORMAT_VERSION,
            "folder_id": self.folder_id,
            **config.to_dict(),
            "arrays": self._arrays,
            "stamps": {
                "file": files.STAMPS,
                "dtype": np.dtype(np.int64).str,
                "shape": [self.capacity],
            },
        }
        files.write_json(self.folder / MANIFEST, manifest)
        self.manifest = manifest
        self.hooks.attach(self)

    def _open_log(self, create: bool, empty: bool = False) -> None:
        """Open the log for writing (created if missing when ``create``; emptied when
        ``empty``), files.reserve its first unit and map it; :meth:`log` reserves further units
        before it writes into them."""
        fd = self._open_file(files.LOG, write=True, create=create)
        self._fds[files.LOG] = fd
        if empty:
            os.ftruncate(fd, 0)
        self._reserved = os.fstat(fd).st_size
        self._reserve_log(redo.LOG_HEADER_BYTES + redo.RECORD_HEADER_BYTES)
        if self._log_map is None:
            self._map_log()

    def _reserve_log(self, end: int) -> None:
        """Make the log at least ``end`` bytes long, reserved on disk, in whole units (growing
        by half its size at least, so that it is remapped rarely)."""
        if end <= self._reserved and self._reserved % redo.LOG_UNIT_BYTES == 0:
            return
        grown = min(self._reserved + self._reserved // 2, redo.LOG_HEADER_BYTES + self._limit)
        end = files.round_up(max(end, grown, self._reserved), redo.LOG_UNIT_BYTES)
        fd = self._fds[files.LOG]
        files.reserve(fd, end, self.folder / files.LOG, keep=True)
        if self.durable:
            files.datasync(fd)  # the log's new size is on disk before records are
        self._reserved = end

    def _map_log(self) -> None:
        """Map the reserved log (again, after it grew or shrank)."""
        self._unmap_log()
        self._log_map = mmap.mmap(self._fds[files.LOG], self._reserved, access=mmap.ACCESS_WRITE)
        self._log_words = np.frombuffer(self._log_map, dtype=np.uint64)

    def _unmap_log(self) -> None:
        self._log_words = None  # the only view of the mapping: closing it is allowed now
        if self._log_map is not None:
            self._log_map.close()
            self._log_map = None

    def _write_log_header(self, state: int, sync: bool) -> None:
        """The log's header for the current checkpoint (``state``: :data:`redo.CLEAN`, no record
        follows; :data:`redo.WRITING`, records may follow); records start again after it."""
        fields = np.array(
            [redo.LOG_MAGIC, self.checkpoint_number, self.checkpoint_id, self.folder_id, state],
            dtype=np.uint64,
        )
        first, second = checksum(fields)
        words = np.zeros(redo.LOG_HEADER_BYTES // 8, dtype=np.uint64)
        words[:5] = fields
        words[5], words[6] = first, second
        files.write_at(self._fds[files.LOG], [words], 0, self.folder / files.LOG)
        if sync:
            files.datasync(self._fds[files.LOG])
        self._clean_on_disk = state == redo.CLEAN
        self._header_current = True

    def read_checkpoint(self) -> dict[str, Any]:
        """The checkpointed state (no storage arrays), checked: a memory-mapped checkpoint of
        this folder, not one interrupted while the buffer was being replaced."""
        path = self.folder / CHECKPOINT
        try:
            os.close(self._open_file(CHECKPOINT, write=False))  # a regular file of the folder
        except FileNotFoundError:
            raise ValueError(
                f"the memory-mapped buffer at {str(self.folder)!r} lacks its {CHECKPOINT} "
                "(incomplete copy?)"
            ) from None
        state = persistence.read_state(path)
        info = state.get("mapped")
        if not isinstance(info, dict) or not isinstance(info.get("checkpoint"), int):
            raise ValueError(f"{str(path)!r} is not a memory-mapped buffer's checkpoint")
        if info.get("replacing"):
            raise ValueError(
                f"the memory-mapped buffer at {str(self.folder)!r} was being overwritten by "
                "load_state_dict (or persistence.load_into) when its process stopped, so its "
                "contents are lost; delete the folder"
            )
        if self._log_version >= 4 and info.get("folder") != self.folder_id:
            raise ValueError(
                f"{str(path)!r} is the checkpoint of another folder (its folder id "
                f"{info.get('folder')!r} is not {self.folder_id} of {MANIFEST}): a {CHECKPOINT} "
                "was copied in from another buffer. Put back this folder's own "
                f"{CHECKPOINT} (a folder is copied whole, while the buffer is closed), or delete "
                "the folder"
            )
        self.checkpoint_number = int(info["checkpoint"])
        self.checkpoint_id = int(info.get("id", 0))
        self._previous_id = int(info.get("previous", -1))
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        return state

    # ------------------------------------------------------------------------ reopening
    def replay(self, checkpoint: Mapping[str, Any]) -> int:
        """Run the log's records after the checkpoint (``checkpoint["mapped"]``) through
        ``buffer``'s commit (not yet attached, so nothing is logged again); returns how many
        there were (with ``mode="r"`` into the private copy-on-write mappings: the files are
        not changed). A log of this version stops at its first record that is not whole (what
        was found is kept for :meth:`verify`); one of an earlier version raises
        :class:`LogDamaged` where it does not vouch for the table (see the module docstring)."""
        try:
            fd = self._open_file(files.LOG, write=False)
        except FileNotFoundError:
            fd = None
        log = redo.LogContext(
            self.folder,
            self.folder_id,
            self.checkpoint_number,
            self.checkpoint_id,
            self._previous_id,
            bool(checkpoint["mapped"].get("clean", False)),
            self._row_words,
            self.hooks.commit,
            self.hooks.total_writes,
        )
        try:
            if self._log_version < 4:
                replay = replay_v3 if self._log_version == 3 else replay_legacy
                return replay(fd, log)
            if fd is None:
                self._problems.append("its log is missing")
                return 0
            replayed = redo.replay(fd, log, self._problems)
            self._header_current, self._clean_on_disk = replayed.current, replayed.clean
            return replayed.records
        finally:
            if fd is not None:
                os.close(fd)

    def verify(self, first_writes: int, records: int) -> None:
        """After the replay: refuse (:class:`LogDamaged`) unless the stamps agree with the
        state the checkpoint and the ``records`` replayed give (the checkpoint ends at write
        ``first_writes``); then, opened for writing, stamp the replayed slots. Nothing to check
        in a folder of an earlier version (no stamps)."""
        if self._stamps is None:
            return
        stamps = self._stamps
        capacity = stamps.shape[0]
        total = self.hooks.total_writes()
        expected = ring_stamps(capacity, total)
        replayed = np.zeros(capacity, dtype=bool)
        if total - first_writes >= capacity:
            replayed[:] = True
        elif total > first_writes:
            replayed[np.arange(first_writes, total, dtype=np.int64) % capacity] = True
        ahead = np.flatnonzero(stamps > expected)
        behind = np.flatnonzero((stamps < expected) & ~replayed)
        if ahead.size or behind.size:
            raise redo.unaccounted(
                self.folder,
                self.checkpoint_number,
                self._problems,
                stamps,
                expected,
                ahead,
                behind,
                first_writes,
                total,
                records,
            )
        if not self.readonly and total > first_writes:
            stamps[replayed] = expected[replayed]

    def settle(self, replayed: int) -> None:
        """Opened for writing: the log made ready for this checkpoint's records. A folder of an
        earlier version is rewritten in this version's format (:meth:`upgrade`); a log that was
        replayed, or that does not follow this checkpoint, is replaced by a new checkpoint and
        an empty log; else the log is kept as it is (its clean mark too)."""
        if self._log_version < 4:
            self.upgrade()
            return
        fresh = bool(self._problems) or not self._header_current
        self._open_log(create=True, empty=fresh)
        if replayed or fresh:
            self.checkpoint(sync=True)  # a fresh, verified log
        else:
            self._seq, self._offset = 0, redo.LOG_HEADER_BYTES

    def upgrade(self) -> None:
        """Rewrite a folder of an earlier version (replayed, verified by its own rules) in this
        version's format. Each step leaves a folder that opens: the stamps (made from the
        state), a checkpoint with the folder's new id, the manifest of this version, and last
        the log emptied under this version's header."""
        assert self.manifest is not None
        self.folder_id = secrets.randbits(63)
        self._create_stamps(self.capacity)
        self._stamp_ring(self.hooks.total_writes())
        self._log_version = files.FORMAT_VERSION
        self.checkpoint(sync=True)  # the old log names an older checkpoint now
        stamps = {"file": files.STAMPS, "dtype": np.dtype(np.int64).str, "shape": [self.capacity]}
        self.manifest = {
            **self.manifest,
            "version": files.FORMAT_VERSION,
            "folder_id": self.folder_id,
            "stamps": stamps,
        }
        files.write_json(self.folder / MANIFEST, self.manifest)
        self._open_log(create=True, empty=True)
        self._write_log_header(redo.CLEAN, sync=True)

    # ------------------------------------------------------------------------ the write path
    def _writable(self) -> None:
        if self.closed:
            raise ValueError(
                f"this buffer was closed; reopen it with MultiAgentReplayBuffer.open("
                f"{str(self.folder)!r}) to write again"
            )
        if self.readonly:
            raise ValueError(
                f"this buffer was opened read-only (mode='r'); reopen "
                f"{str(self.folder)!r} with MultiAgentReplayBuffer.open(path) (mode='r+') to "
                "write"
            )

    def log(
        self,
        rows: np.ndarray,
        steps: int,
        streams: int | np.ndarray,
        truncated: bool | np.ndarray | None = None,
    ) -> None:
        """Append the redo record of one commit (before the buffer changes anything), with its
        truncation flags (``truncated``: a bool, shape (steps,) bool, or ``None``/``False`` for
        none) so that a replay rebuilds the episode index exactly; then stamp the slots it
        writes. The first write after a checkpoint clears the log's clean mark first."""
        self._writable()
        if self._last is not None:
            self.retract()  # the buffer raised before it applied the previous record
        if self._clean_on_disk:
            self._write_log_header(redo.WRITING, sync=self.durable)
        staged = rows if rows.flags.c_contiguous else np.ascontiguousarray(rows)
        if isinstance(streams, (int, np.integer)):
            stream = int(streams)
            stream_ids = redo.NO_STREAMS
        else:  # add_envs: one stream per row
            stream = -1
            stream_ids = np.ascontiguousarray(streams, dtype=np.int64)
        flags = 0
        cut = redo.NO_STREAMS
        if truncated is not None and truncated is not False and np.any(truncated):
            flags = redo.CUT
            cut = np.zeros(len(staged), dtype=np.int64)
            cut[:] = np.asarray(truncated, dtype=bool)
        words = staged.size + stream_ids.shape[0] + cut.shape[0]
        end = self._offset + redo.RECORD_HEADER_BYTES + 8 * words + redo.RECORD_TRAILER_BYTES
        if end > self._reserved:
            try:
                self._reserve_log(end)  # before anything is written
            except OSError as exc:
                raise files.no_space(
                    exc, self.folder, f"its redo log {str(self.folder / files.LOG)!r}"
                ) from None
            self._map_log()
        first = self.hooks.total_writes()
        assert self._log_words is not None
        write_record(
            self._log_words,
            self._offset // 8,
            staged,
            stream_ids,
            cut,
            self.checkpoint_id,
            self._seq,
            first,
            stream,
            flags,
        )
        if self.durable:
            self._sync_log(self._offset, end)
        self._last = (self._offset, self._seq, first, steps)
        self._stamp(first, steps)
        self._offset = end
        self._seq += 1

    def _stamp(self, first: int, steps: int) -> None:
        """Stamp the slots a call of ``steps`` steps from write ``first`` writes (the last
        ``capacity`` of them)."""
        stamps = self._stamps
        assert stamps is not None
        capacity = stamps.shape[0]
        if steps == 1:
            stamps[first % capacity] = first + 1
            return
        kept = np.arange(first + max(0, steps - capacity), first + steps, dtype=np.int64)
        stamps[kept % capacity] = kept + 1

    def retract(self) -> None:
        """The buffer could not apply the write logged last (it raised before changing
        anything, so :meth:`committed` was not called): the record is taken back and its slots'
        stamps restored, so that a reopened folder does not replay a write that did not happen.
        Called by the next :meth:`log` or checkpoint (a process that dies before either leaves
        the record, which a reopen then applies whole)."""
        if self._last is None or self.closed:
            return
        offset, seq, first, steps = self._last
        self._last = None
        assert self._log_words is not None and self._stamps is not None
        self._log_words[offset // 8] = 0  # no record starts here: the end of the log
        capacity = self._stamps.shape[0]
        kept = np.arange(first + max(0, steps - capacity), first + steps, dtype=np.int64)
        # the write each slot held before: the newest one before ``first`` in that slot
        before = kept - capacity * ((kept - first) // capacity + 1)
        self._stamps[kept % capacity] = np.maximum(before + 1, 0)
        if self.durable:
            self._sync_log(offset, offset + 8)
        self._offset, self._seq = offset, seq

    def _sync_log(self, start: int, end: int) -> None:
        """Log bytes ``[start, end)`` to disk (``msync`` of the pages holding them)."""
        assert self._log_map is not None
        page = start - start % mmap.PAGESIZE
        self._log_map.flush(page, end - page)

    def committed(self) -> None:
        """After a commit: checkpoint once the log is long enough."""
        self._last = None
        if self._offset - redo.LOG_HEADER_BYTES >= self._limit:
            self.checkpoint()

    def checkpoint(self, sync: bool = False, clean: bool = False) -> None:
        """Write the buffer's metadata as the new checkpoint and start the log afresh.

        With ``sync`` (or ``durable``) the storage arrays and stamps are flushed to disk
        first, so that the checkpoint never describes rows the disk does not hold. ``clean``
        (by ``close()``): nothing will be logged after it.
        """
        with self.hooks.lock:
            if self._last is not None:
                self.retract()  # the buffer raised before it applied the last record
            if self._restamp:  # the table was replaced wholesale: its stamps follow
                self._stamp_ring(self.hooks.total_writes())
                self._restamp = False
            if sync or self.durable:
                self.sync_arrays()
            state = self.hooks.state()
            state["storage"] = {}  # the mapped files
            self._write_checkpoint(state, sync or self.durable, clean)

    def begin_replace(self) -> None:
        """Mark the files unusable before the storage is overwritten wholesale (a state is
        loaded into the buffer); the checkpoint that follows makes them usable again."""
        self._write_checkpoint(
            {"format": _config.SAVE_FORMAT, "version": _config.SAVE_VERSION},
            sync=True,
            replacing=True,
        )
        self._restamp = True

    def _write_checkpoint(
        self, state: dict[str, Any], sync: bool, clean: bool = False, replacing: bool = False
    ) -> None:
        self._writable()
        path = self.folder / CHECKPOINT
        new_id = secrets.randbits(63)
        state["mapped"] = {
            "checkpoint": self.checkpoint_number + 1,
            "id": new_id,
            "previous": self.checkpoint_id,
            "folder": self.folder_id,
            "clean": clean,
            **({"replacing": True} if replacing else {}),
        }
        try:
            # atomic: temporary file (fsync), rename; never over a link or a special file
            persistence.write_state(state, path, sync, overwrite=True)
        except OSError as exc:
            raise files.no_space(exc, self.folder, "a checkpoint", changed=True) from None
        self._previous_id = self.checkpoint_id
        self.checkpoint_number += 1  # older log records no longer count
        self.checkpoint_id = new_id
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        if files.LOG in self._fds:
            self._write_log_header(redo.CLEAN, sync)  # the log now follows the new checkpoint
            self._seq, self._offset = 0, redo.LOG_HEADER_BYTES
            if self._reserved > 2 * files.round_up(
                redo.LOG_HEADER_BYTES + self._limit, redo.LOG_UNIT_BYTES
            ):
                # a huge extend grew it: give the space back (whole units)
                self._unmap_log()
                self._reserved = files.round_up(
                    redo.LOG_HEADER_BYTES + self._limit, redo.LOG_UNIT_BYTES
                )
                os.ftruncate(self._fds[files.LOG], self._reserved)
                self._map_log()

    def flush(self) -> None:
        """Storage arrays to disk, then a checkpoint of everything else."""
        with self.hooks.lock:
            if not self.closed and not self.readonly:
                self.checkpoint(sync=True)

    def close(self) -> None:
        """A clean checkpoint (storage flushed) and a clean log (its header only, one unit
        reserved), then the log and the lock released; later writes are refused. A read-only
        store only releases."""
        with self.hooks.lock:
            if self.closed:
                return
            if not self.readonly:
                self.checkpoint(sync=True, clean=True)
                self._unmap_log()  # nothing to replay: give the reservation back
                fd = self._fds[files.LOG]
                os.ftruncate(fd, redo.LOG_HEADER_BYTES)
                files.reserve(fd, redo.LOG_UNIT_BYTES, self.folder / files.LOG)
                files.datasync(fd)
            self.closed = True
            self.release()


def recover(store: MappedStore, arrays: Mapping[str, np.ndarray]) -> None:
    """Make the folder of :meth:`MultiAgentReplayBuffer.open` live once its buffer is built
    over ``store`` (bound, its storage ``arrays`` mapped from the folder's files): load the
    checkpoint, replay the log, check the stamps, and (``mode="r+"``) make the log ready for
    new records. The caller releases the store if this raises."""
    capacity = store.capacity
    store.map_stamps(capacity)
    state = store.read_checkpoint()
    size = state.get("size", 0)
    size = size if isinstance(size, int) and 0 <= size <= capacity else 0
    state["storage"] = {k: v[:size] for k, v in arrays.items()}
    store.hooks.load(state)  # the storage is already in place: nothing copied
    first_writes = store.hooks.total_writes()
    replayed = store.replay(state)
    store.verify(first_writes, replayed)
    store.hooks.replayed()
    store.hooks.attach(store)
    store.freeze()
    if not store.readonly:
        store.settle(replayed)


def manifest_int(manifest: Mapping[str, Any], key: str) -> int:
    value = manifest[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r} (expected an int)")
    return value


def ring_stamps(capacity: int, total_writes: int) -> np.ndarray:
    """The stamps of a ring of ``capacity`` slots after ``total_writes`` writes (shape
    (capacity,), int64: each filled slot's write generation + 1, 0 for the others)."""
    size = min(total_writes, capacity)
    stamps = np.zeros(capacity, dtype=np.int64)
    stamps[:size] = (
        RingWriter.generations(capacity, size, total_writes % capacity, total_writes) + 1
    )
    return stamps
