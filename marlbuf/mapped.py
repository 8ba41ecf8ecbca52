"""Memory-mapped storage: a buffer whose storage arrays live in files, so that its capacity is
bounded by disk, not RAM (``MultiAgentReplayBuffer(..., path=folder)``; reopened with
``MultiAgentReplayBuffer.open(folder)``, or ``open(folder, mode="r")`` to sample from a frozen
buffer, e.g. on read-only media: the files are opened read-only and mapped copy-on-write, a log
left by a crash is replayed in memory only, and the arrays are read-only once open).

The folder holds:

* ``manifest.json``: the configuration (specs, capacity, layout, next_obs mode, batch options,
  number of trainers, sampler type and parameters), each storage array's file, dtype and
  shape, and the folder's random id. Written once, last of all and atomically: a folder with a
  manifest is a complete buffer.
* ``array-<i>.bin``: one storage array each, raw C-ordered bytes, reserved on disk when the buffer
  is created (``posix_fallocate``) and mapped with ``mmap`` (a file mapping starts on a page
  boundary, so the kernels see the alignment of in-memory storage). The buffer reads and writes
  them in place: opening copies nothing.
* ``stamps.bin``: the table's own record of what it holds: per slot, one more than the write
  generation of the row in it (0: never written), int64, mapped like the storage and written
  before the rows of every write.
* ``state.npz``: the last *checkpoint* of everything else: cursor, size, total writes, write
  generations, next-observation links and side table, episode index, sampler state
  (priorities), RNG state (:mod:`marlbuf.persistence` format, without the storage arrays), and
  the checkpoint's number, its random id, the id of the checkpoint before it, the folder's id
  and whether ``close()`` wrote it.
* ``log``: the *redo log* since that checkpoint, mapped into memory. A 64-byte header names the
  folder and the checkpoint the log follows (number and id) and whether records may follow
  (*clean*: none do); then one record per ``add``/``extend``/``add_envs`` call: a header
  (checkpoint id, sequence number, the write generation of the call's first step, steps,
  stream, flags, length and checksum of the payload, its own checksum), the call's validated
  staged rows, streams and truncation flags, and a trailer that repeats the length and the
  checksums (:mod:`marlbuf._kernels.checksum`: the rows are copied into the log and checksummed
  in one pass). The log is reserved on disk like the storage (``posix_fallocate``), in whole
  ``LOG_UNIT_BYTES`` units, before a record is written into them: a full disk is reported
  before a record is written (the call changes nothing), never half-way. Creating a buffer
  checks that the disk has room for the storage, the stamps and a full log
  (``_config.MAPPED_LOG_BYTES``).

Containment: the manifest names storage files by plain names (``array-<i>.bin``,
``stamps.bin``) only; every file is opened relative to the folder, without following symbolic
links (``O_NOFOLLOW``), must be a regular file with no other hard link, or ``open`` refuses it.
So neither a crafted manifest nor a link put in the folder makes the buffer read or write
outside it.

Locking: a buffer object holds an ``flock`` on the folder itself (exclusive for writing, shared
for ``mode="r"``) while it has the folder open. Deleting or replacing a file cannot defeat it,
and a second writer is refused. (A ``lock`` file left by an earlier version is ignored.)

Crash consistency
-----------------
A call's record is written to the log *before* the call changes anything (stamps, table rows,
links, side table, counters, priorities); the stamps of the slots it writes are written before
its rows. Reopening loads the checkpoint and runs the log's records again through the buffer's
own commit, which rewrites their rows into the table and rebuilds all metadata exactly. Every
``_config.MAPPED_LOG_BYTES`` logged bytes (or the size of the last checkpoint, if larger) the
metadata is checkpointed (written to a temporary file that is renamed over ``state.npz``; with
``durable=True``, and always by ``flush()``/``close()``, the storage files are flushed to disk
first and the checkpoint is fsynced), then the log's header is rewritten for the new checkpoint
and its records start again. Hence:

* **The process dies** (``SIGKILL``, a crash, the OOM killer) at any point: every call that
  returned is kept, the call in flight is kept entirely or not at all, and no row is torn.
  Priority updates (``update_priorities``) and the RNG state are those of the last checkpoint,
  ``flush()`` or ``close()``.
* **The machine stops** (power loss, kernel crash): with ``durable=True`` each call's record is on
  disk (``msync``) before its stamps and rows are written, so the same holds. Otherwise the
  files are as ``flush()``/``close()`` left them if nothing was written since; after writes that
  followed the last flush, the folder may be refused (see below) rather than opened with rows
  that do not hold their steps.

Verified recovery: a folder opens only when the checkpoint and the log it replays account for
every row of the table. Reopening checks that the checkpoint is this folder's (the folder's id),
that the log follows this very checkpoint (folder, number and id) and that its records are
whole: numbered from 0, each continuing at the write generation where the one before ended,
with matching length and checksums at both ends. Then it compares the stamps with the write
generations the replayed state gives every slot: a slot stamped with a write the checkpoint and
the log do not account for (its rows may be in the table, the record that described them is
missing, damaged, or older than the table) is refused with a :class:`LogDamaged` that says what
was found; a slot stamped older than the checkpoint (table files older than ``state.npz``) too.
So a record at the end of the log that is incomplete or damaged is dropped only where the
stamps show that its rows never reached the table (the call in flight when the process died);
a missing, emptied, zeroed or older log is accepted only where no write followed the checkpoint;
a damaged record followed by whole ones, a log that follows a newer checkpoint (an older
``state.npz`` put back) and a checkpoint or log of another folder are refused. ``close()``
writes a clean checkpoint and marks the log clean (no record follows); the first write after a
reopen clears that mark (rewrites the log's header) before anything else.

Folders of earlier versions (manifest versions 1 to 3: no stamps, logs of format 1 to 3) open
by their own rules (see ``_replay_v3``); opening one for writing (``mode="r+"``) rewrites it in
this version's format.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import re
import secrets
import shutil
import stat
import struct
import weakref
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf import _config, persistence
from marlbuf._kernels.checksum import (
    RECORD_HEAD_WORDS,
    RECORD_MAGIC,
    RECORD_TAIL_WORDS,
    TRAILER_MAGIC,
    checksum,
    payload_checksum,
    record_checksum,
    write_record,
)
from marlbuf.config import BufferConfig
from marlbuf.memory import MemoryEstimate
from marlbuf.writer import RingWriter

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no inter-process lock
    fcntl = None  # type: ignore[assignment]

#: Value of ``"format"`` in ``manifest.json``; bump ``FORMAT_VERSION`` on incompatible changes.
FORMAT = "marlbuf-mapped"
FORMAT_VERSION = 4
#: version 1: manifests without ``global_fields``/``alive`` (read as none and False);
#: versions 1-2: a log without header and trailers; version 3: log format 3, no stamps and no
#: folder id (all replayed by their own rules, then rewritten in version 4 by a writer)
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)
MANIFEST = "manifest.json"
CHECKPOINT = "state.npz"
LOG = "log"
LOCK = "lock"
STAMPS = "stamps.bin"
#: Files this module creates (an interrupted creation leaves only such files behind).
_OWN_FILE = re.compile(
    r"array-\d+\.bin|stamps\.bin|state\.npz|log|lock|(manifest\.json|state\.npz)\..*\.tmp"
)
#: What a manifest may name as a storage file: a plain name in the folder.
_ARRAY_FILE = re.compile(r"array-\d{1,6}\.bin")

#: Log format 4: a record's header and trailer (see :mod:`marlbuf._kernels.checksum`)
RECORD_HEADER_BYTES = 8 * RECORD_HEAD_WORDS  # 96
RECORD_TRAILER_BYTES = 8 * RECORD_TAIL_WORDS  # 72
#: record flag: the call marked steps as truncated (``truncated=``), which the episode index of
#: sequence and episode samplers reads
_CUT = 1
#: an empty int64 array (a record without streams or truncation flags)
_NO_STREAMS = np.zeros(0, dtype=np.int64)
#: Log header (format 4): magic, checkpoint number, checkpoint id, folder id, state; then the
#: checksum (2 words) of these five words; 64 bytes in all
LOG_HEADER_BYTES = 64
_LOG_MAGIC = int.from_bytes(b"MBUFLOG4", "little")
#: log header states: records may follow; none do (a clean mark, cleared by the first write)
_WRITING, _CLEAN = 0, 1
#: The log is reserved (and grows) in whole units of this many bytes.
LOG_UNIT_BYTES = 1 << 20

#: Log format 3 (folders of manifest version 3): record header (magic, checkpoint number,
#: sequence number, steps, stream, rows, payload bytes, payload checksum, flags; then CRC-32),
#: trailer (magic, sequence number, header CRC-32) and log header (magic, checkpoint number,
#: checkpoint id; then CRC-32)
_RECORD_V3 = struct.Struct("<8sQQqqqQQQ")
_HEADER_CRC = struct.Struct("<I")
_RECORD_V3_BYTES = _RECORD_V3.size + _HEADER_CRC.size  # 76
_MAGIC_V3 = b"MBUFREC3"
_TRAILER_V3 = struct.Struct("<8sQI4x")
_TRAILER_MAGIC_V3 = b"MBUFEND1"
_LOG_HEADER_V3 = struct.Struct("<8sQQ")
_LOG_MAGIC_V3 = b"MBUFLOGH"
#: Records of format versions 1-2: the same fields with a CRC-32 of the payload, no trailer.
_LEGACY_RECORD = struct.Struct("<8sQQqqqQI")
_LEGACY_MAGIC = b"MBUFLOG1"


def resident(needed: MemoryEstimate) -> MemoryEstimate:
    """The part of ``needed`` that stays in RAM when the storage arrays are mapped files."""
    return replace(needed, table_row_bytes=0)


def _folder(path: Any) -> Path:
    """``path`` as a ``Path``, or a ``TypeError``/``ValueError`` that says what is accepted."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise TypeError(f"path must be a str or os.PathLike naming a folder; got path={path!r}")
    if not os.fspath(path):
        raise ValueError("path must name a folder; got path=''")
    return Path(os.fspath(path))


def _check_durable(durable: Any) -> None:
    if not isinstance(durable, (bool, np.bool_)):
        raise TypeError(f"durable must be a bool; got durable={durable!r}")


def _foreign_files(folder: Path) -> list[str]:
    """Names in ``folder`` that this module did not create (none: only ours, or empty);
    symbolic links are never ours."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.is_symlink() or not (p.is_file() and _OWN_FILE.fullmatch(p.name))
    )


def _check_mode(mode: Any) -> bool:
    """``mode`` of :meth:`MultiAgentReplayBuffer.open`: ``True`` for read-only (``"r"``)."""
    if mode not in ("r", "r+"):
        raise ValueError(
            f"mode must be 'r+' (read and write) or 'r' (read-only: sample from a frozen "
            f"buffer); got mode={mode!r}"
        )
    return mode == "r"


class LogDamaged(ValueError):
    """The redo log of a memory-mapped folder does not vouch for the rows in its table (missing,
    truncated, damaged, or following another checkpoint): the message says what was found."""


@dataclass(frozen=True)
class BufferHooks:
    """The calls a :class:`MappedStore` makes on the buffer it serves, given by the buffer
    (:meth:`MappedStore.bind`), so that the store needs none of the buffer's internals.

    Attributes
    ----------
    commit : callable ``(rows, steps, streams, truncated) -> None``
        Write validated staged rows (shape (steps, row_words), uint64) and their metadata, as
        the buffer's own writes do (the redo log's replay); ``truncated`` is the call's
        truncation flags (shape (steps,) bool) or ``None``.
    state : callable ``() -> dict``
        The buffer's state (what ``state_dict`` holds), its arrays views of live memory.
    load : callable ``(state) -> None``
        Load a checkpoint whose storage arrays are already the buffer's own (nothing copied;
        the table may hold newer rows until the log is replayed).
    replayed : callable ``() -> None``
        Called once the log is replayed (the table then holds exactly the loaded rows).
    attach : callable ``(store or None) -> None``
        Make the store live on the buffer (its writes are logged from then on).
    total_writes : callable ``() -> int``
        The buffer's write counter: the write generation of the next step.
    row_words : int
        Words of a staged row (what log records hold per step).
    lock : lock
        The buffer's lock (``RingWriter.lock``): checkpoints, flushes and closes hold it, so
        that no write is between its record and its rows while they run.
    """

    commit: Callable[[np.ndarray, int, Any, Any], None]
    state: Callable[[], dict[str, Any]]
    load: Callable[[Mapping[str, Any]], None]
    replayed: Callable[[], None]
    attach: Callable[[Any], None]
    total_writes: Callable[[], int]
    row_words: int
    lock: Any


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
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        self._log_map: mmap.mmap | None = None
        self._log_words: np.ndarray | None = None  # the mapped log as words
        self.checkpoint_number = 0
        self.checkpoint_id = 0  # random id of the current checkpoint
        self._previous_id = -1  # id of the checkpoint before it
        self._seq = 0  # next record's sequence number since the checkpoint
        self._offset = LOG_HEADER_BYTES  # next record's position in the log
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
        folder = _folder(path)
        _check_durable(durable)
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
            foreign = _foreign_files(folder)
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
            log_bytes = _round_up(LOG_HEADER_BYTES + _config.MAPPED_LOG_BYTES, LOG_UNIT_BYTES)
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
        folder = _folder(path)
        _check_durable(durable)
        readonly = _check_mode(mode)
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
            if any(folder.iterdir()) and not _foreign_files(folder):
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
            store.manifest = _read_manifest(store._open_file(MANIFEST, write=False), manifest_path)
            version = store.manifest["version"]
            store._log_version = 1 if version < 3 else version
            if version >= 4:
                try:
                    store.folder_id = _manifest_int(store.manifest, "folder_id")
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"{str(manifest_path)!r} is corrupt ({exc})") from exc
        except BaseException:
            store.release()
            raise
        return store

    def _lock(self) -> None:
        """Lock the folder itself (``flock`` on its descriptor): no file whose deletion would
        release the lock. Exclusive for writing, shared for ``mode="r"``."""
        fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
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
        flags = (os.O_RDWR if write else os.O_RDONLY) | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
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
        _close_all(self._fds)

    def abandon(self) -> None:
        """A creation failed: release, delete the files made so far, and the folder if made."""
        self.release()
        if self.manifest is not None:
            return  # never for an existing buffer
        for p in self.folder.iterdir():
            if not p.is_symlink() and p.is_file() and _OWN_FILE.fullmatch(p.name):
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
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _CLOEXEC
            fd = os.open(file, flags, 0o666, dir_fd=self._fds["folder"])
            try:
                _reserve(fd, nbytes, self.folder / file)
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
        if not isinstance(named, str) or not _ARRAY_FILE.fullmatch(named):
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
            or entry.get("file") != STAMPS
            or entry.get("shape") != [capacity]
            or entry.get("dtype") != np.dtype(np.int64).str
        ):
            raise ValueError(
                f"{str(self.folder / MANIFEST)!r} describes the stamps file as {entry!r}; a "
                f"buffer of capacity {capacity} has {{'file': {STAMPS!r}, 'dtype': '<i8', "
                f"'shape': [{capacity}]}} (corrupt or crafted manifest)"
            )
        self._stamps = self._map_file(STAMPS, "stamps", (capacity,), np.dtype(np.int64))

    def _create_stamps(self, capacity: int) -> None:
        """A new stamps file of ``capacity`` zeros (one left by an interrupted upgrade is
        replaced), reserved on disk and mapped."""
        flags = os.O_RDWR | os.O_CREAT | _CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(STAMPS, flags, 0o666, dir_fd=self._fds["folder"])
        try:
            os.ftruncate(fd, 0)
            _reserve(fd, 8 * capacity, self.folder / STAMPS)
            self._stamps = self._map(fd, 8 * capacity, (capacity,), np.dtype(np.int64))
        finally:
            os.close(fd)

    def _stamp_ring(self, total_writes: int) -> None:
        """Stamps of a ring after ``total_writes`` writes (every filled slot's generation)."""
        assert self._stamps is not None
        expected = _ring_stamps(self._stamps.shape[0], total_writes)
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
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "folder_id": self.folder_id,
            **config.to_dict(),
            "arrays": self._arrays,
            "stamps": {"file": STAMPS, "dtype": np.dtype(np.int64).str, "shape": [self.capacity]},
        }
        _write_json(self.folder / MANIFEST, manifest)
        self.manifest = manifest
        self.hooks.attach(self)

    def _open_log(self, create: bool, empty: bool = False) -> None:
        """Open the log for writing (created if missing when ``create``; emptied when
        ``empty``), reserve its first unit and map it; :meth:`log` reserves further units
        before it writes into them."""
        fd = self._open_file(LOG, write=True, create=create)
        self._fds[LOG] = fd
        if empty:
            os.ftruncate(fd, 0)
        self._reserved = os.fstat(fd).st_size
        self._reserve_log(LOG_HEADER_BYTES + RECORD_HEADER_BYTES)
        if self._log_map is None:
            self._map_log()

    def _reserve_log(self, end: int) -> None:
        """Make the log at least ``end`` bytes long, reserved on disk, in whole units (growing
        by half its size at least, so that it is remapped rarely)."""
        if end <= self._reserved and self._reserved % LOG_UNIT_BYTES == 0:
            return
        grown = min(self._reserved + self._reserved // 2, LOG_HEADER_BYTES + self._limit)
        end = _round_up(max(end, grown, self._reserved), LOG_UNIT_BYTES)
        fd = self._fds[LOG]
        _reserve(fd, end, self.folder / LOG, keep=True)
        if self.durable:
            _datasync(fd)  # the log's new size is on disk before records are
        self._reserved = end

    def _map_log(self) -> None:
        """Map the reserved log (again, after it grew or shrank)."""
        self._unmap_log()
        self._log_map = mmap.mmap(self._fds[LOG], self._reserved, access=mmap.ACCESS_WRITE)
        self._log_words = np.frombuffer(self._log_map, dtype=np.uint64)

    def _unmap_log(self) -> None:
        self._log_words = None  # the only view of the mapping: closing it is allowed now
        if self._log_map is not None:
            self._log_map.close()
            self._log_map = None

    def _write_log_header(self, state: int, sync: bool) -> None:
        """The log's header for the current checkpoint (``state``: :data:`_CLEAN`, no record
        follows; :data:`_WRITING`, records may follow); records start again after it."""
        fields = np.array(
            [_LOG_MAGIC, self.checkpoint_number, self.checkpoint_id, self.folder_id, state],
            dtype=np.uint64,
        )
        first, second = checksum(fields)
        words = np.zeros(LOG_HEADER_BYTES // 8, dtype=np.uint64)
        words[:5] = fields
        words[5], words[6] = first, second
        _write_at(self._fds[LOG], [words], 0, self.folder / LOG)
        if sync:
            _datasync(self._fds[LOG])
        self._clean_on_disk = state == _CLEAN
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
        info = checkpoint["mapped"]
        if self._log_version < 3:
            return self._replay_legacy()
        if self._log_version == 3:
            return self._replay_v3(bool(info.get("clean", False)))
        try:
            fd = self._open_file(LOG, write=False)
        except FileNotFoundError:
            self._problems.append("its log is missing")
            return 0
        try:
            return self._replay_from(fd)
        finally:
            os.close(fd)

    def _replay_from(self, fd: int) -> int:
        end = os.fstat(fd).st_size
        head = np.frombuffer(
            os.pread(fd, LOG_HEADER_BYTES, 0).ljust(LOG_HEADER_BYTES, b"\0"), np.uint64
        )
        if not head.any():
            self._problems.append(
                f"its log is empty ({end} bytes)"
                if end < LOG_HEADER_BYTES
                else "its log's header is zeroed"
            )
            return 0
        magic, number, ident, folder, state = (int(x) for x in head[:5])
        if magic != _LOG_MAGIC or tuple(checksum(head[:5])) != (head[5], head[6]):
            self._problems.append("its log's header is damaged (not a marlbuf log header)")
            return 0
        if folder != self.folder_id:
            raise LogDamaged(
                f"the memory-mapped buffer at {str(self.folder)!r} has the log of another folder "
                f"(its folder id {folder} is not {self.folder_id}): put back this folder's own "
                "log (a folder is copied whole, while the buffer is closed), or delete the folder"
            )
        if number > self.checkpoint_number or (
            number == self.checkpoint_number and ident != self.checkpoint_id
        ):
            raise LogDamaged(
                f"the memory-mapped buffer at {str(self.folder)!r} has a checkpoint "
                f"({CHECKPOINT}, number {self.checkpoint_number}) older than its log (which "
                f"follows checkpoint {number}): an older {CHECKPOINT} was put in the folder. Put "
                f"back the {CHECKPOINT} that came with this log (a folder is copied whole, while "
                "the buffer is closed)"
            )
        if number != self.checkpoint_number:
            if number == self.checkpoint_number - 1 and ident == self._previous_id:
                return 0  # stopped between the checkpoint and the log's new header: all in it
            self._problems.append(
                f"its log follows checkpoint {number}, not this one ({self.checkpoint_number})"
            )
            return 0
        self._header_current = True
        self._clean_on_disk = state == _CLEAN
        if end % LOG_UNIT_BYTES:
            self._problems.append(
                f"its log is {end} bytes, not a whole number of {LOG_UNIT_BYTES}-byte units "
                "(truncated)"
            )
        offset, count = LOG_HEADER_BYTES, 0
        while offset + RECORD_HEADER_BYTES <= end:
            record = _read_record(
                fd,
                offset,
                end,
                self.checkpoint_id,
                count,
                self.hooks.total_writes(),
                self._row_words,
            )
            if record is None:
                break  # the end of the log: zeros, or records of an earlier checkpoint
            if isinstance(record, str):
                if _later_record(fd, offset, end, self.checkpoint_id, count):
                    raise self._damaged(
                        f"record {count} of its log (at byte {offset}) {record}, and later "
                        "records follow it"
                    )
                self._problems.append(f"record {count} of its log (at byte {offset}) {record}")
                break
            if state == _CLEAN:
                self._problems.append("its log is marked clean, yet records follow its header")
                break
            rows, steps, stream, streams, cut, size = record
            self.hooks.commit(rows, steps, stream if stream >= 0 else streams, cut)
            offset += size
            count += 1
        return count

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
        expected = _ring_stamps(capacity, total)
        replayed = np.zeros(capacity, dtype=bool)
        if total - first_writes >= capacity:
            replayed[:] = True
        elif total > first_writes:
            replayed[np.arange(first_writes, total, dtype=np.int64) % capacity] = True
        ahead = np.flatnonzero(stamps > expected)
        behind = np.flatnonzero((stamps < expected) & ~replayed)
        if ahead.size or behind.size:
            raise self._unaccounted(stamps, expected, ahead, behind, first_writes, total, records)
        if not self.readonly and total > first_writes:
            stamps[replayed] = expected[replayed]

    def _unaccounted(
        self,
        stamps: np.ndarray,
        expected: np.ndarray,
        ahead: np.ndarray,
        behind: np.ndarray,
        first_writes: int,
        total: int,
        records: int,
    ) -> LogDamaged:
        found = "; ".join(self._problems) or f"its log's {records} records are whole"
        if ahead.size:
            slot = int(ahead[0])
            evidence = (
                f"{ahead.size} slot(s) of its table hold rows of writes that neither the "
                f"checkpoint (writes before {first_writes}) nor the log ({records} record(s), "
                f"writes before {total}) accounts for: slot {slot} holds write "
                f"{int(stamps[slot]) - 1}"
            )
        else:
            slot = int(behind[0])
            held = int(stamps[slot]) - 1
            evidence = (
                f"{behind.size} slot(s) of its table hold older rows than the checkpoint names: "
                f"slot {slot} holds {'no write' if held < 0 else f'write {held}'}, the "
                f"checkpoint says write {int(expected[slot]) - 1} (table files older than "
                f"{CHECKPOINT}, or the machine stopped after writes to a buffer without "
                "durable=True that were not flushed)"
            )
        return self._damaged(f"{found}, and {evidence}")

    def _damaged(self, what: str) -> LogDamaged:
        return LogDamaged(
            f"the memory-mapped buffer at {str(self.folder)!r}: {what}. Its rows cannot be "
            f"proven to hold the steps their write generations name (checkpoint "
            f"{self.checkpoint_number}), so it is not opened. Put back the log (and the folder's "
            "other files) from the copy this folder came from (a folder is copied whole, while "
            "the buffer is closed), or delete the folder and build the buffer again"
        )

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
            self._seq, self._offset = 0, LOG_HEADER_BYTES

    def upgrade(self) -> None:
        """Rewrite a folder of an earlier version (replayed, verified by its own rules) in this
        version's format. Each step leaves a folder that opens: the stamps (made from the
        state), a checkpoint with the folder's new id, the manifest of this version, and last
        the log emptied under this version's header."""
        assert self.manifest is not None
        self.folder_id = secrets.randbits(63)
        self._create_stamps(self.capacity)
        self._stamp_ring(self.hooks.total_writes())
        self._log_version = FORMAT_VERSION
        self.checkpoint(sync=True)  # the old log names an older checkpoint now
        stamps = {"file": STAMPS, "dtype": np.dtype(np.int64).str, "shape": [self.capacity]}
        self.manifest = {
            **self.manifest,
            "version": FORMAT_VERSION,
            "folder_id": self.folder_id,
            "stamps": stamps,
        }
        _write_json(self.folder / MANIFEST, self.manifest)
        self._open_log(create=True, empty=True)
        self._write_log_header(_CLEAN, sync=True)

    # ------------------------------------------------------------------------ earlier versions
    def _replay_v3(self, clean: bool) -> int:
        """Replay a log of format 3 (manifest version 3), by that version's rules: after an
        unclean close the log must follow this checkpoint and hold whole records (a record
        without trailer at its end is the call in flight, dropped); else :class:`LogDamaged`.
        A clean checkpoint needs no log."""
        try:
            fd = self._open_file(LOG, write=False)
        except FileNotFoundError:
            if clean:
                return 0
            raise self._damaged_v3("its log is missing") from None
        try:
            return self._replay_v3_from(fd, clean, self._previous_id)
        finally:
            os.close(fd)

    def _replay_v3_from(self, fd: int, clean: bool, previous: int) -> int:
        end = os.fstat(fd).st_size
        number, ident = self.checkpoint_number, self.checkpoint_id
        head = os.pread(fd, LOG_HEADER_BYTES, 0) if end else b""
        if len(head) < LOG_HEADER_BYTES or not any(head):
            if clean:
                return 0  # closed cleanly: the log was emptied
            raise self._damaged_v3(f"its log is empty ({end} bytes: truncated or replaced)")
        magic, log_number, log_id = _LOG_HEADER_V3.unpack_from(head)
        (crc,) = _HEADER_CRC.unpack_from(head, _LOG_HEADER_V3.size)
        if magic != _LOG_MAGIC_V3 or zlib.crc32(head[: _LOG_HEADER_V3.size]) != crc:
            raise self._damaged_v3("its log's header is damaged (not a marlbuf log header)")
        if log_number > number or (log_number == number and log_id != ident):
            raise ValueError(
                f"the memory-mapped buffer at {str(self.folder)!r} has a checkpoint "
                f"({CHECKPOINT}, number {number}) older than its log (which follows checkpoint "
                f"{log_number}): an older {CHECKPOINT} was put in the folder. Put back the "
                f"{CHECKPOINT} that came with this log (a copy of the folder must be taken "
                "whole, while the buffer is closed)"
            )
        if log_number != number:
            if clean or (log_number == number - 1 and log_id == previous):
                # closed cleanly, or stopped between writing the checkpoint and renumbering
                # the log: its records are in the checkpoint already
                return 0
            raise self._damaged_v3(
                f"its log follows checkpoint {log_number}, not this one ({number}): the log "
                "that followed this checkpoint is missing"
            )
        if end % LOG_UNIT_BYTES:
            raise self._damaged_v3(
                f"its log is {end} bytes, not a whole number of {LOG_UNIT_BYTES}-byte units "
                "(a log is always reserved so): it was truncated"
            )
        offset, count = LOG_HEADER_BYTES, 0
        while offset + _RECORD_V3_BYTES <= end:
            record = _read_record_v3(fd, offset, end, number, count, self._row_words)
            if record is None:
                break  # the end of the log: zeros, or records of an earlier checkpoint
            if isinstance(record, str):
                if record == "torn" and not _later_record_v3(fd, offset, end, number, count):
                    break  # the call in flight when the process died: it never reached the table
                raise self._damaged_v3(
                    f"record {count} of its log (at byte {offset}) {record}"
                    if record != "torn"
                    else f"record {count} of its log (at byte {offset}) is incomplete but "
                    "later records follow it (damaged)"
                )
            rows, steps, stream, streams, cut, size = record
            self.hooks.commit(rows, steps, stream if stream >= 0 else streams, cut)
            offset += size
            count += 1
        return count

    def _replay_legacy(self) -> int:
        """Replay a log of format version 1-2 (records from byte 0, no header or trailers),
        stopping at the first incomplete record, as those versions did."""
        try:
            fd = self._open_file(LOG, write=False)
        except FileNotFoundError:
            return 0
        try:
            end = os.fstat(fd).st_size
            offset = count = 0
            head_bytes = _LEGACY_RECORD.size + _HEADER_CRC.size
            while offset + head_bytes <= end:
                head = os.pread(fd, head_bytes, offset)
                parsed = _parse_header(
                    head, self.checkpoint_number, count, self._row_words, _LEGACY_RECORD
                )
                if parsed is None or offset + head_bytes + parsed[3] > end:
                    break
                steps, stream, n_rows, nbytes, crc, _ = parsed
                rows, streams, _ = _read_payload(
                    fd, offset + head_bytes, n_rows, stream, self._row_words, 0
                )
                if zlib.crc32(_bytes(streams), zlib.crc32(_bytes(rows))) != crc:
                    break
                self.hooks.commit(rows, steps, stream if stream >= 0 else streams, None)
                offset += head_bytes + nbytes
                count += 1
            return count
        finally:
            os.close(fd)

    def _damaged_v3(self, what: str) -> LogDamaged:
        return LogDamaged(
            f"the memory-mapped buffer at {str(self.folder)!r} was not closed cleanly and "
            f"{what}. Its table may hold rows written after checkpoint {self.checkpoint_number} "
            "that nothing describes any more, so it is not opened (replaying what remains would "
            "give rows that do not hold the steps their write generations name). Put back the "
            "log from the copy this folder came from (the folder must be copied whole), or "
            "delete the folder and build the buffer again"
        )

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
            self._write_log_header(_WRITING, sync=self.durable)
        staged = rows if rows.flags.c_contiguous else np.ascontiguousarray(rows)
        if isinstance(streams, (int, np.integer)):
            stream = int(streams)
            stream_ids = _NO_STREAMS
        else:  # add_envs: one stream per row
            stream = -1
            stream_ids = np.ascontiguousarray(streams, dtype=np.int64)
        flags = 0
        cut = _NO_STREAMS
        if truncated is not None and truncated is not False and np.any(truncated):
            flags = _CUT
            cut = np.zeros(len(staged), dtype=np.int64)
            cut[:] = np.asarray(truncated, dtype=bool)
        words = staged.size + stream_ids.shape[0] + cut.shape[0]
        end = self._offset + RECORD_HEADER_BYTES + 8 * words + RECORD_TRAILER_BYTES
        if end > self._reserved:
            try:
                self._reserve_log(end)  # before anything is written
            except OSError as exc:
                raise _no_space(
                    exc, self.folder, f"its redo log {str(self.folder / LOG)!r}"
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
        if self._offset - LOG_HEADER_BYTES >= self._limit:
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
            raise _no_space(exc, self.folder, "a checkpoint", changed=True) from None
        self._previous_id = self.checkpoint_id
        self.checkpoint_number += 1  # older log records no longer count
        self.checkpoint_id = new_id
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        if LOG in self._fds:
            self._write_log_header(_CLEAN, sync)  # the log now follows the new checkpoint
            self._seq, self._offset = 0, LOG_HEADER_BYTES
            if self._reserved > 2 * _round_up(LOG_HEADER_BYTES + self._limit, LOG_UNIT_BYTES):
                # a huge extend grew it: give the space back (whole units)
                self._unmap_log()
                self._reserved = _round_up(LOG_HEADER_BYTES + self._limit, LOG_UNIT_BYTES)
                os.ftruncate(self._fds[LOG], self._reserved)
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
                fd = self._fds[LOG]
                os.ftruncate(fd, LOG_HEADER_BYTES)
                _reserve(fd, LOG_UNIT_BYTES, self.folder / LOG)
                _datasync(fd)
            self.closed = True
            self.release()


# ---------------------------------------------------------------------------- opening
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


def _manifest_int(manifest: Mapping[str, Any], key: str) -> int:
    value = manifest[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r} (expected an int)")
    return value


def _ring_stamps(capacity: int, total_writes: int) -> np.ndarray:
    """The stamps of a ring of ``capacity`` slots after ``total_writes`` writes (shape
    (capacity,), int64: each filled slot's write generation + 1, 0 for the others)."""
    size = min(total_writes, capacity)
    stamps = np.zeros(capacity, dtype=np.int64)
    stamps[:size] = (
        RingWriter.generations(capacity, size, total_writes % capacity, total_writes) + 1
    )
    return stamps


# ---------------------------------------------------------------------------- log records
def _read_record(
    fd: int, offset: int, end: int, ident: int, seq: int, first: int, row_words: int
) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray | None, int] | str | None:
    """The record at ``offset`` (log format 4): ``(rows, steps, stream, streams, truncated,
    bytes)`` (``truncated``: shape (steps,) bool, or ``None`` when the call marked none);
    ``None`` at the end of the log (zeros, or a whole record of another checkpoint); else what
    is wrong with it, in words. ``ident``, ``seq`` and ``first`` are what the record must name:
    the checkpoint's id, its sequence number and the write generation its first step gets."""
    raw = os.pread(fd, RECORD_HEADER_BYTES, offset)
    if len(raw) < RECORD_HEADER_BYTES:
        return "is cut short by the end of the log"
    head = np.frombuffer(raw, dtype=np.uint64)
    if not head.any():
        return None
    if int(head[0]) != RECORD_MAGIC or tuple(checksum(head[:10])) != (head[10], head[11]):
        return "has a damaged or incomplete header"
    if int(head[1]) != ident:
        return None  # a record of an earlier checkpoint: the end of this one's
    if int(head[2]) != seq:
        return f"has sequence number {int(head[2])}, not {seq}: records are missing"
    if int(head[3]) != first:
        return (
            f"continues at write {int(head[3])}, but the checkpoint and the records before it "
            f"end at write {first}"
        )
    steps, stream, flags, payload = (
        int(head[4]),
        int(head[5].view(np.int64)),
        int(head[6]),
        int(head[7]),
    )
    expected = steps * row_words + (steps if stream < 0 else 0) + (steps if flags & _CUT else 0)
    if steps < 1 or stream < -1 or flags & ~_CUT or payload != expected:
        return "has a header that does not fit its rows"
    size = RECORD_HEADER_BYTES + 8 * payload + RECORD_TRAILER_BYTES
    if offset + size > end:
        return f"runs past the end of the log ({end} bytes): the log was truncated"
    tail = np.frombuffer(
        os.pread(fd, RECORD_TRAILER_BYTES, offset + size - RECORD_TRAILER_BYTES), dtype=np.uint64
    )
    if (
        int(tail[0]) != TRAILER_MAGIC
        or tuple(checksum(tail[:7])) != (tail[7], tail[8])
        or int(tail[1]) != seq
        or int(tail[2]) != payload
        or (tail[3], tail[4], tail[5], tail[6]) != (head[8], head[9], head[10], head[11])
    ):
        return "has no whole trailer that matches its header (cut short, or damaged)"
    rows = np.empty((steps, row_words), dtype=np.uint64)
    streams = np.empty(steps if stream < 0 else 0, dtype=np.int64)
    cut = np.empty(steps if flags & _CUT else 0, dtype=np.int64)
    _read_into(fd, offset + RECORD_HEADER_BYTES, [rows, streams, cut])
    if tuple(payload_checksum(rows, streams, cut)) != (head[8], head[9]):
        return "is whole but its rows fail their checksum (damaged)"
    return rows, steps, stream, streams, (cut != 0) if flags & _CUT else None, size


def _later_record(fd: int, offset: int, end: int, ident: int, seq: int) -> bool:
    """Whether a whole record header of checkpoint ``ident`` with a sequence number above
    ``seq`` starts at a word after ``offset`` (then a bad record there is damage, not the end
    of the log)."""
    magic = RECORD_MAGIC.to_bytes(8, "little")
    chunk = 8 << 20
    position = offset + 8
    while position < end:
        data = os.pread(fd, min(chunk + RECORD_HEADER_BYTES, end - position), position)
        at = data.find(magic)
        while at >= 0:
            if at % 8 == 0 and at + RECORD_HEADER_BYTES <= len(data):
                head = np.frombuffer(data[at : at + RECORD_HEADER_BYTES], dtype=np.uint64)
                if (
                    tuple(checksum(head[:10])) == (head[10], head[11])
                    and int(head[1]) == ident
                    and int(head[2]) > seq
                ):
                    return True
            at = data.find(magic, at + 1)
        position += chunk
    return False


def _read_manifest(fd: int, path: Path) -> dict[str, Any]:
    try:
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(_MANIFEST_MAX_BYTES + 1)
        if len(text) > _MANIFEST_MAX_BYTES:
            raise ValueError(f"larger than {_MANIFEST_MAX_BYTES} bytes")
        manifest = json.loads(text.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"{str(path)!r} is corrupt: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a marlbuf memory-mapped buffer manifest")
    if manifest.get("version") not in READABLE_FORMAT_VERSIONS:
        raise ValueError(
            f"{str(path)!r} has format version {manifest.get('version')!r}; this marlbuf reads "
            f"versions {list(READABLE_FORMAT_VERSIONS)}. Open it with the marlbuf version that "
            "wrote it."
        )
    if not isinstance(manifest.get("arrays"), dict):
        raise ValueError(f"{str(path)!r} is corrupt (no storage arrays listed)")
    return manifest


#: A manifest is a few kilobytes; a larger one is refused before it is parsed.
_MANIFEST_MAX_BYTES = 16 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# ---------------------------------------------------------------------------- log format 3
def _parse_header(
    head: bytes, number: int, seq: int, row_words: int, layout: struct.Struct = _RECORD_V3
) -> tuple[int, int, int, int, int, int] | None:
    """``(steps, stream, rows, payload bytes, payload checksum, flags)`` of a record header
    (of ``layout``: this version's or the legacy one, whose flags are 0) that is whole and
    belongs to checkpoint ``number`` at sequence number ``seq``; else ``None``."""
    if len(head) < layout.size + _HEADER_CRC.size:
        return None
    fields = layout.unpack_from(head)
    magic, rec_number, rec_seq, steps, stream, n_rows, nbytes, crc = fields[:8]
    flags = fields[8] if len(fields) > 8 else 0
    (head_crc,) = _HEADER_CRC.unpack_from(head, layout.size)
    expected = (
        n_rows * row_words * 8
        + (n_rows * 8 if stream < 0 else 0)
        + (n_rows * 8 if flags & _CUT else 0)
    )
    if (
        magic != (_MAGIC_V3 if layout is _RECORD_V3 else _LEGACY_MAGIC)
        or zlib.crc32(head[: layout.size]) != head_crc
        or rec_number != number
        or rec_seq != seq
        or steps != n_rows
        or n_rows < 0
        or nbytes != expected
        or flags & ~_CUT
    ):
        return None
    return steps, stream, n_rows, nbytes, crc, flags


def _read_payload(
    fd: int, offset: int, n_rows: int, stream: int, row_words: int, flags: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.empty((n_rows, row_words), dtype=np.uint64)
    streams = np.empty(n_rows if stream < 0 else 0, dtype=np.int64)
    cut = np.empty(n_rows if flags & _CUT else 0, dtype=np.int64)
    _read_into(fd, offset, [rows, streams, cut])
    return rows, streams, cut


def _read_record_v3(
    fd: int, offset: int, end: int, number: int, seq: int, row_words: int
) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray | None, int] | str | None:
    """The record at ``offset``: ``(rows, steps, stream, streams, truncated, bytes)``
    (``truncated``: shape (steps,) bool, or ``None`` when the call marked none); ``None`` at the
    end of the log (zeros, or a whole record of an earlier checkpoint); else what is wrong:
    ``"torn"`` (no whole header, or no trailer: cut short) or a description of the damage."""
    head = os.pread(fd, _RECORD_V3_BYTES, offset)
    if not any(head):
        return None
    magic, rec_number, rec_seq, *_ = _RECORD_V3.unpack_from(head)
    (head_crc,) = _HEADER_CRC.unpack_from(head, _RECORD_V3.size)
    whole = magic == _MAGIC_V3 and zlib.crc32(head[: _RECORD_V3.size]) == head_crc
    if whole and rec_number < number:
        return None  # a record of an earlier checkpoint: the end of this one's
    if whole and rec_number == number and rec_seq != seq:
        return f"has sequence number {rec_seq}, not {seq}: records are missing"
    parsed = _parse_header(head, number, seq, row_words)
    if parsed is None:
        return "torn" if not whole else "has a header that does not fit its rows"
    steps, stream, n_rows, nbytes, crc, flags = parsed
    size = _RECORD_V3_BYTES + nbytes + _TRAILER_V3.size
    if offset + size > end:
        return f"runs past the end of the log ({end} bytes): the log was truncated"
    trailer = os.pread(fd, _TRAILER_V3.size, offset + size - _TRAILER_V3.size)
    t_magic, t_seq, t_crc = _TRAILER_V3.unpack(trailer)
    if t_magic != _TRAILER_MAGIC_V3 or t_seq != seq or t_crc != head_crc:
        return "torn"  # the record was cut short: its call never reached the table
    rows, streams, cut = _read_payload(
        fd, offset + _RECORD_V3_BYTES, n_rows, stream, row_words, flags
    )
    if _payload_checksum_v3(rows, streams, cut) != crc:
        return "is complete but its rows fail their checksum (damaged)"
    return rows, steps, stream, streams, (cut != 0) if flags & _CUT else None, size


def _later_record_v3(fd: int, offset: int, end: int, number: int, seq: int) -> bool:
    """Whether a whole record header of checkpoint ``number`` with a sequence number above
    ``seq`` lies after ``offset`` (then a bad record there is damage, not a torn end)."""
    chunk = 8 << 20
    position = offset + 1
    while position < end:
        data = os.pread(fd, min(chunk + _RECORD_V3_BYTES, end - position), position)
        at = data.find(_MAGIC_V3)
        while at >= 0:
            head = data[at : at + _RECORD_V3_BYTES]
            if len(head) == _RECORD_V3_BYTES:
                _, rec_number, rec_seq, *_ = _RECORD_V3.unpack_from(head)
                (crc,) = _HEADER_CRC.unpack_from(head, _RECORD_V3.size)
                if (
                    zlib.crc32(head[: _RECORD_V3.size]) == crc
                    and rec_number == number
                    and rec_seq > seq
                ):
                    return True
            at = data.find(_MAGIC_V3, at + 1)
        position += chunk
    return False


#: Log format 3: payloads up to this many bytes were checksummed with ``zlib.crc32``, larger
#: ones with :func:`marlbuf._kernels.checksum.record_checksum`.
SMALL_PAYLOAD_BYTES = 4096


def _payload_checksum_v3(rows: np.ndarray, streams: np.ndarray, cut: np.ndarray) -> int:
    """The checksum of a format-3 record's payload: staged ``rows`` (shape (n, row_words),
    uint64, C-contiguous), then ``streams`` and the truncation flags ``cut`` (each shape (n,)
    or (0,), int64), as one value."""
    if rows.nbytes + streams.nbytes + cut.nbytes <= SMALL_PAYLOAD_BYTES:
        crc = zlib.crc32(rows.data)
        if streams.shape[0]:
            crc = zlib.crc32(streams.data, crc)
        if cut.shape[0]:
            crc = zlib.crc32(cut.data, crc)
        return crc
    return int(record_checksum(rows, streams, cut))


# ---------------------------------------------------------------------------- file helpers
def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _close_all(fds: dict[str, int]) -> None:
    while fds:
        _, fd = fds.popitem()
        try:
            os.close(fd)  # closing the folder's descriptor releases the flock
        except OSError:
            pass


def _no_space(exc: OSError, folder: Path, what: str, changed: bool = False) -> OSError:
    """``exc``, with a hint when the disk is full (``changed``: the failure came after the
    buffer's call was applied and logged, as a checkpoint does)."""
    if exc.errno != errno.ENOSPC:
        return exc
    outcome = (
        "the call before it is applied and in the log (kept); free some space, then flush() "
        "writes the checkpoint"
        if changed
        else "free some space (or move the folder to a larger disk) and write again: the call "
        "that failed changed nothing in the buffer"
    )
    return OSError(
        errno.ENOSPC, f"no space left on the disk of {str(folder)!r} to write {what}; {outcome}"
    )


def _reserve(fd: int, nbytes: int, path: Path, keep: bool = False) -> None:
    """Size the file and reserve its blocks, so a full disk is reported now rather than as a
    ``SIGBUS`` when a mapped page is first written (or half-way through a log record).
    ``keep``: never shrink the file."""
    if not keep or os.fstat(fd).st_size < nbytes:
        os.ftruncate(fd, nbytes)
    if nbytes == 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"no space left to reserve {nbytes} bytes for {str(path)!r}; free some space, "
                "reduce capacity, or choose a folder on another disk",
            ) from None
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise


def _write_at(fd: int, buffers: list[Any], offset: int, path: Path | None = None) -> None:
    """Write ``buffers`` (bytes or memoryviews of C-contiguous memory) at ``offset``, whole."""
    views = [memoryview(b).cast("B") for b in buffers]
    try:
        while views:
            if hasattr(os, "pwritev"):
                done = os.pwritev(fd, views, offset)  # one call, unless the write comes up short
            else:  # pragma: no cover
                done = os.pwrite(fd, views[0], offset)
            offset += done
            while views and done >= views[0].nbytes:
                done -= views[0].nbytes
                views.pop(0)
            if views:
                views[0] = views[0][done:]
    except OSError as exc:
        if path is None:
            raise
        raise _no_space(exc, path.parent, f"its redo log {str(path)!r}") from None


def _read_into(fd: int, offset: int, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        view = _bytes(array)
        while view.nbytes:
            chunk = os.pread(fd, min(view.nbytes, persistence.CHUNK_BYTES), offset)
            if not chunk:
                raise ValueError("log record ends early")  # checked against the size before
            view[: len(chunk)] = chunk
            view = view[len(chunk) :]
            offset += len(chunk)


def _bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a flat view of its memory."""
    return array.reshape(-1).view(np.uint8).data


def _datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _write_json(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` atomically (temporary file, fsync, rename, folder fsync)."""
    fd, tmp = persistence.create_temp(path)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    persistence.fsync_folder(path.parent)


__all__ = ["FORMAT", "BufferHooks", "LogDamaged", "MappedStore", "recover", "resident"]
