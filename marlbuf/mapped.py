"""Memory-mapped storage: a buffer whose storage arrays live in files, so that its capacity is
bounded by disk, not RAM (``MultiAgentReplayBuffer(..., path=folder)``; reopened with
``MultiAgentReplayBuffer.open(folder)``, or ``open(folder, mode="r")`` to sample from a frozen
buffer, e.g. on read-only media: the files are opened read-only and mapped copy-on-write, a log
left by a crash is replayed in memory only, and the arrays are read-only once open).

The folder holds:

* ``manifest.json``: the configuration (specs, capacity, layout, next_obs mode, batch options,
  number of trainers, sampler type and parameters) and each storage array's file, dtype and
  shape. Written once, last of all and atomically: a folder with a manifest is a complete buffer.
* ``array-<i>.bin``: one storage array each, raw C-ordered bytes, reserved on disk when the buffer
  is created (``posix_fallocate``) and mapped with ``mmap`` (a file mapping starts on a page
  boundary, so the kernels see the alignment of in-memory storage). The buffer reads and writes
  them in place: opening copies nothing.
* ``state.npz``: the last *checkpoint* of everything else: cursor, size, total writes, write
  generations, next-observation links and side table, sampler state (priorities), RNG state
  (:mod:`marlbuf.persistence` format, without the storage arrays), and the checkpoint's number,
  its random id, the id of the checkpoint before it, and whether it was written by ``close()``
  (*clean*).
* ``log``: the *redo log* since that checkpoint. A 64-byte header names the checkpoint the log
  follows (number and id); then one record per ``add``/``extend``/``add_envs`` call: a header
  (checkpoint number, sequence number, steps, stream, sizes, a checksum of the payload (CRC-32
  for a few rows, else :mod:`marlbuf._kernels.checksum` at memory speed), CRC-32 of the
  header), the call's validated staged rows and streams, and a trailer (sequence number, the
  header's CRC-32) written in the same call, so a record cut short by a crash has no trailer.
  The log is reserved on disk like the storage (``posix_fallocate``), in whole
  ``LOG_UNIT_BYTES`` units, each before a record is written into it: a full disk is reported
  before a record is written (the call changes nothing), never half-way, and a log whose size
  is not a whole number of units was truncated. Creating a buffer checks that the disk has
  room for the storage and a full log (``_config.MAPPED_LOG_BYTES``).

Containment: the manifest names storage files by plain names (``array-<i>.bin``) only; every
file is opened relative to the folder, without following symbolic links (``O_NOFOLLOW``), must
be a regular file with no other hard link, or ``open`` refuses it. So neither a crafted manifest
nor a link put in the folder makes the buffer read or write outside it.

Locking: a buffer object holds an ``flock`` on the folder itself (exclusive for writing, shared
for ``mode="r"``) while it has the folder open. Deleting or replacing a file cannot defeat it,
and a second writer is refused. (A ``lock`` file left by an earlier version is ignored.)

Crash consistency
-----------------
A call's record is written to the log *before* the call changes anything (table rows, links,
side table, counters, priorities). Reopening loads the checkpoint and runs the log's records
again through the buffer's own commit, which rewrites their rows into the table and rebuilds all
metadata exactly. Every ``_config.MAPPED_LOG_BYTES`` logged bytes (or the size of the last
checkpoint, if larger) the metadata is checkpointed (written to a temporary file that is renamed
over ``state.npz``; with ``durable=True``, and always by ``flush()``/``close()``, the storage
files are flushed to disk first and the checkpoint is fsynced), then the log's header is
rewritten for the new checkpoint and its records start again. Hence:

* **The process dies** (``SIGKILL``, a crash, the OOM killer) at any point: every call that
  returned is kept, the call in flight is kept entirely or not at all, and no row is torn. Priority
  updates (``update_priorities``) and the RNG state are those of the last checkpoint, ``flush()``
  or ``close()``.
* **The machine stops** (power loss, kernel crash): with ``durable=True`` each call's record is on
  disk (``fdatasync``) before its rows are written, so the same holds. Otherwise the files are
  as ``flush()``/``close()`` left them if nothing was written since; writes after the last flush
  may be lost, and when the buffer was full the oldest rows they overwrote may be torn.

Verified recovery: reopening after an unclean close (the checkpoint is not clean) checks that the
log follows this very checkpoint (number and id) and that its records are whole: numbered from
0, each with its trailer and checksums. Only a record without trailer at the end of the log (the
call in flight when the process died, which never reached the table) is dropped. A missing log,
a log truncated (not a whole number of units, or a record running past its end), a record that
is complete but whose checksum fails, a record missing in the sequence, or a log that follows a
newer checkpoint than ``state.npz`` (an older checkpoint put back) is refused with a
``ValueError`` that says what was found: the rows such records wrote may already be in the
table, so replaying what remains would leave rows that do not hold the steps their generations
name. ``close()`` writes a clean checkpoint and empties the log, so a closed folder reopens
without looking at the log.
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
from typing import TYPE_CHECKING, Any

import numpy as np

from marlbuf import _config, persistence
from marlbuf._kernels.checksum import record_checksum
from marlbuf.memory import MemoryEstimate
from marlbuf.options import row_options_of
from marlbuf.spec import AgentSpec

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no inter-process lock
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from marlbuf.buffer import MultiAgentReplayBuffer

#: Value of ``"format"`` in ``manifest.json``; bump ``FORMAT_VERSION`` on incompatible changes.
FORMAT = "marlbuf-mapped"
FORMAT_VERSION = 3
#: version 1: manifests without ``global_fields``/``alive`` (read as none and False);
#: versions 1-2: a log without header and trailers (replayed as before, then rewritten)
READABLE_FORMAT_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
CHECKPOINT = "state.npz"
LOG = "log"
LOCK = "lock"
#: Files this module creates (an interrupted creation leaves only such files behind).
_OWN_FILE = re.compile(r"array-\d+\.bin|state\.npz|log|lock|(manifest\.json|state\.npz)\..*\.tmp")
#: What a manifest may name as a storage file: a plain name in the folder.
_ARRAY_FILE = re.compile(r"array-\d{1,6}\.bin")

#: Log record header: magic, checkpoint number, sequence number, steps, stream (-1: an array of
#: streams follows the rows), rows, payload bytes, payload checksum
#: (:func:`marlbuf._kernels.checksum.record_checksum`), flags (:data:`_CUT`: a truncation flag
#: per row, as int64, follows the rows and streams); then the CRC-32 of these.
_RECORD = struct.Struct("<8sQQqqqQQQ")
#: an empty int64 array (a record without streams or truncation flags)
_NO_STREAMS = np.zeros(0, dtype=np.int64)
#: record flag: the call marked steps as truncated (``truncated=``), which the episode index of
#: sequence and episode samplers reads
_CUT = 1
_HEADER_CRC = struct.Struct("<I")
RECORD_HEADER_BYTES = _RECORD.size + _HEADER_CRC.size  # 76
_MAGIC = b"MBUFREC3"
#: Records of format versions 1-2: the same fields with a CRC-32 of the payload, no trailer.
_LEGACY_RECORD = struct.Struct("<8sQQqqqQI")
_LEGACY_MAGIC = b"MBUFLOG1"
#: Record trailer (written in the same call as the record): magic, sequence number, the
#: header's CRC-32. A record without it was cut short.
_TRAILER = struct.Struct("<8sQI4x")
RECORD_TRAILER_BYTES = _TRAILER.size  # 24
_TRAILER_MAGIC = b"MBUFEND1"
#: Log header: magic, checkpoint number, checkpoint id; then its CRC-32 (64 bytes in all).
_LOG_HEADER = struct.Struct("<8sQQ")
LOG_HEADER_BYTES = 64
_LOG_MAGIC = b"MBUFLOGH"
#: The log is reserved (and grows) in whole units of this many bytes.
LOG_UNIT_BYTES = 1 << 20


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
        Load a checkpoint whose storage arrays are already the buffer's own (nothing copied).
    attach : callable ``(store or None) -> None``
        Make the store live on the buffer (its writes are logged from then on).
    row_words : int
        Words of a staged row (what log records hold per step).
    """

    commit: Callable[[np.ndarray, int, Any, Any], None]
    state: Callable[[], dict[str, Any]]
    load: Callable[[Mapping[str, Any]], None]
    attach: Callable[[Any], None]
    row_words: int


class MappedStore:
    """The files of one memory-mapped buffer: storage arrays, checkpoint, redo log and lock.

    Built by :meth:`create` (a new buffer) or :meth:`open` (an existing one); the buffer's
    constructor maps its storage arrays through :meth:`allocate`, and :meth:`start` (new) or
    :func:`open_buffer` (existing) makes it live. Writes are then logged by :meth:`log` before the
    buffer applies them and :meth:`committed` after; every method runs under the buffer's
    ``writer.lock`` (the callers hold it).
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
        self._arrays: dict[str, dict[str, Any]] = {}  # name -> file, dtype, shape
        self._maps: list[mmap.mmap] = []
        self._mapped_arrays: list[np.ndarray] = []
        self._sum_state = np.zeros(2, dtype=np.uint64)  # scratch of _payload_checksum
        self._fds: dict[str, int] = {}  # "folder" (the lock), "log": raw descriptors
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        self.checkpoint_number = 0
        self.checkpoint_id = 0  # random id of the current checkpoint
        self._seq = 0  # next record's sequence number since the checkpoint
        self._offset = LOG_HEADER_BYTES  # next record's position in the log
        self._reserved = 0  # bytes of the log reserved on disk
        self._limit = _config.MAPPED_LOG_BYTES
        self._row_words = 0
        self._hooks: BufferHooks | None = None  # the buffer's calls, given by bind()
        self._legacy_log = False  # a folder of format version 1-2 (log without header)
        self._made_folder = False  # by create(): removed again if the creation fails
        self.closed = False

    def bind(self, hooks: BufferHooks) -> None:
        """Take the calls of the buffer this store serves (its constructor gives them)."""
        self._hooks = hooks
        self._row_words = hooks.row_words

    @property
    def hooks(self) -> BufferHooks:
        if self._hooks is None:
            raise RuntimeError("this MappedStore serves no buffer yet (bind() was not called)")
        return self._hooks

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
            if needed.storage_bytes + log_bytes > free:
                gib = 1024**3
                raise OSError(
                    errno.ENOSPC,
                    f"this buffer's storage and redo log need "
                    f"{(needed.storage_bytes + log_bytes) / gib:.2f} GiB on disk but "
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
            store._legacy_log = store.manifest["version"] < 3
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
        file = named
        mapped_file = self.folder / file
        try:
            fd = self._open_file(file, write=not self.readonly)
        except FileNotFoundError:
            raise ValueError(
                f"the memory-mapped buffer at {str(self.folder)!r} lacks its storage file "
                f"{str(mapped_file)!r} (incomplete copy?)"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise ValueError(
                    f"storage file {str(mapped_file)!r} holds {size} bytes; the buffer needs "
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

    # ------------------------------------------------------------------------ going live
    def start(self, buffer: MultiAgentReplayBuffer) -> None:
        """Make a new buffer live: first checkpoint, empty log, then the manifest."""
        try:
            self._start(buffer)
        except BaseException:
            self.manifest = None
            self.abandon()
            raise

    def _start(self, buffer: MultiAgentReplayBuffer) -> None:
        self._open_log(create=True)
        self.checkpoint(buffer, sync=True)
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "specs": {a: s.to_dict() for a, s in buffer.specs.items()},
            "capacity": buffer.capacity,
            "layout": buffer.layout,
            "next_obs": buffer.next_obs,
            "global_fields": {n: fs.to_dict() for n, fs in buffer.global_fields.items()},
            "alive": buffer.alive,
            "n_trainers": buffer.n_trainers,
            "sampler": {"type": type(buffer.sampler).__name__, "config": buffer.sampler.config()},
            "batch_layout": buffer.batch_layout,
            "batch_dtype": buffer.storage.batch_dtype,
            "arrays": self._arrays,
        }
        _write_json(self.folder / MANIFEST, manifest)
        self.manifest = manifest
        self.hooks.attach(self)

    def _open_log(self, create: bool) -> None:
        """Open the log for writing (created if missing when ``create``) and reserve its first
        unit; :meth:`log` reserves further units before it writes into them."""
        fd = self._open_file(LOG, write=True, create=create)
        self._fds[LOG] = fd
        self._reserved = os.fstat(fd).st_size
        self._reserve_log(LOG_HEADER_BYTES + RECORD_HEADER_BYTES)

    def _reserve_log(self, end: int) -> None:
        """Make the log at least ``end`` bytes long, reserved on disk, in whole units."""
        end = _round_up(end, LOG_UNIT_BYTES)
        if end <= self._reserved and self._reserved % LOG_UNIT_BYTES == 0:
            return
        end = max(end, _round_up(self._reserved, LOG_UNIT_BYTES))
        _reserve(self._fds[LOG], end, self.folder / LOG, keep=True)
        self._reserved = end

    def _write_log_header(self, sync: bool) -> None:
        head = _LOG_HEADER.pack(_LOG_MAGIC, self.checkpoint_number, self.checkpoint_id)
        header = head + _HEADER_CRC.pack(zlib.crc32(head))
        _write_at(self._fds[LOG], [header.ljust(LOG_HEADER_BYTES, b"\0")], 0, self.folder / LOG)
        if sync:
            _datasync(self._fds[LOG])
        self._seq = 0
        self._offset = LOG_HEADER_BYTES

    def read_checkpoint(self) -> dict[str, Any]:
        """The checkpointed state (no storage arrays), checked."""
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
        self.checkpoint_number = int(info["checkpoint"])
        self.checkpoint_id = int(info.get("id", 0))
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        return state

    def replay(self, buffer: MultiAgentReplayBuffer, checkpoint: Mapping[str, Any]) -> int:
        """Run the log's records after the checkpoint (``checkpoint["mapped"]``) through
        ``buffer``'s commit (not yet attached, so nothing is logged again); returns how many
        there were (with ``mode="r"`` into the private copy-on-write mappings: the files are
        not changed). Raises :class:`LogDamaged` when the log does not vouch for the table
        (see the module docstring)."""
        info = checkpoint["mapped"]
        if self._legacy_log:
            return self._replay_legacy(buffer)
        clean = bool(info.get("clean", False))
        previous = int(info.get("previous", -1))
        try:
            fd = self._open_file(LOG, write=False)
        except FileNotFoundError:
            if clean:
                return 0
            raise self._damaged("its log is missing") from None
        try:
            return self._replay_from(fd, buffer, clean, previous)
        finally:
            os.close(fd)

    def _replay_from(
        self, fd: int, buffer: MultiAgentReplayBuffer, clean: bool, previous: int
    ) -> int:
        end = os.fstat(fd).st_size
        number, ident = self.checkpoint_number, self.checkpoint_id
        head = os.pread(fd, LOG_HEADER_BYTES, 0) if end else b""
        if len(head) < LOG_HEADER_BYTES or not any(head):
            if clean:
                return 0  # closed cleanly: the log was emptied
            raise self._damaged(f"its log is empty ({end} bytes: truncated or replaced)")
        magic, log_number, log_id = _LOG_HEADER.unpack_from(head)
        (crc,) = _HEADER_CRC.unpack_from(head, _LOG_HEADER.size)
        if magic != _LOG_MAGIC or zlib.crc32(head[: _LOG_HEADER.size]) != crc:
            raise self._damaged("its log's header is damaged (not a marlbuf log header)")
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
            raise self._damaged(
                f"its log follows checkpoint {log_number}, not this one ({number}): the log "
                "that followed this checkpoint is missing"
            )
        if end % LOG_UNIT_BYTES:
            raise self._damaged(
                f"its log is {end} bytes, not a whole number of {LOG_UNIT_BYTES}-byte units "
                "(a log is always reserved so): it was truncated"
            )
        offset, count = LOG_HEADER_BYTES, 0
        while offset + RECORD_HEADER_BYTES <= end:
            record = _read_record(fd, offset, end, number, count, self._row_words)
            if record is None:
                break  # the end of the log: zeros, or records of an earlier checkpoint
            if isinstance(record, str):
                if record == "torn" and not _later_record(fd, offset, end, number, count):
                    break  # the call in flight when the process died: it never reached the table
                raise self._damaged(
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

    def _damaged(self, what: str) -> LogDamaged:
        return LogDamaged(
            f"the memory-mapped buffer at {str(self.folder)!r} was not closed cleanly and "
            f"{what}. Its table may hold rows written after checkpoint {self.checkpoint_number} "
            "that nothing describes any more, so it is not opened (replaying what remains would "
            "give rows that do not hold the steps their write generations name). Put back the "
            "log from the copy this folder came from (the folder must be copied whole), or "
            "delete the folder and build the buffer again"
        )

    def _replay_legacy(self, buffer: MultiAgentReplayBuffer) -> int:
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
        none) so that a replay rebuilds the episode index exactly."""
        self._writable()
        staged = np.ascontiguousarray(rows)  # staged rows are contiguous: no copy
        parts = [memoryview(b""), staged.data]
        if isinstance(streams, (int, np.integer)):
            stream = int(streams)
            stream_ids = _NO_STREAMS
        else:  # add_envs: one stream per row
            stream = -1
            stream_ids = np.ascontiguousarray(streams, dtype=np.int64)
            parts.append(stream_ids.data)
        flags = 0
        cut = _NO_STREAMS
        if truncated is not None and truncated is not False and np.any(truncated):
            flags = _CUT
            cut = np.zeros(len(rows), dtype=np.int64)
            cut[:] = np.asarray(truncated, dtype=bool)
            parts.append(cut.data)
        crc = _payload_checksum(staged, stream_ids, self._sum_state, cut)
        payload = sum(part.nbytes for part in parts[1:])
        head = _RECORD.pack(
            _MAGIC,
            self.checkpoint_number,
            self._seq,
            steps,
            stream,
            len(rows),
            payload,
            crc,
            flags,
        )
        head_crc = zlib.crc32(head)
        parts[0] = memoryview(head + _HEADER_CRC.pack(head_crc))
        parts.append(memoryview(_TRAILER.pack(_TRAILER_MAGIC, self._seq, head_crc)))
        size = RECORD_HEADER_BYTES + payload + RECORD_TRAILER_BYTES
        if self._offset + size > self._reserved:
            try:
                self._reserve_log(self._offset + size)  # before anything is written
            except OSError as exc:
                raise _no_space(
                    exc, self.folder, f"its redo log {str(self.folder / LOG)!r}"
                ) from None
        fd = self._fds[LOG]
        _write_at(fd, parts, self._offset, self.folder / LOG)
        if self.durable:
            _datasync(fd)
        self._offset += size
        self._seq += 1

    def committed(self, buffer: MultiAgentReplayBuffer) -> None:
        """After a commit: checkpoint once the log is long enough."""
        if self._offset - LOG_HEADER_BYTES >= self._limit:
            self.checkpoint(buffer)

    def checkpoint(
        self, buffer: MultiAgentReplayBuffer, sync: bool = False, clean: bool = False
    ) -> None:
        """Write the buffer's metadata as the new checkpoint and start the log afresh.

        With ``sync`` (or ``durable``) the storage arrays are flushed to disk first, so that the
        checkpoint never describes rows the disk does not hold. ``clean`` (by ``close()``):
        nothing will be logged after it.
        """
        with buffer.writer.lock:
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
            "clean": clean,
            **({"replacing": True} if replacing else {}),
        }
        try:
            # atomic: temporary file (fsync), rename; never over a link or a special file
            persistence.write_state(state, path, sync, overwrite=True)
        except OSError as exc:
            raise _no_space(exc, self.folder, "a checkpoint", changed=True) from None
        self.checkpoint_number += 1  # older log records no longer count
        self.checkpoint_id = new_id
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        if LOG in self._fds:
            self._write_log_header(sync)  # the log now follows the new checkpoint
            if self._reserved > 2 * _round_up(LOG_HEADER_BYTES + self._limit, LOG_UNIT_BYTES):
                # a huge extend grew it: give the space back (whole units)
                size = _round_up(LOG_HEADER_BYTES + self._limit, LOG_UNIT_BYTES)
                os.ftruncate(self._fds[LOG], size)
                self._reserved = size

    def flush(self, buffer: MultiAgentReplayBuffer) -> None:
        """Storage arrays to disk, then a checkpoint of everything else."""
        with buffer.writer.lock:
            if not self.closed and not self.readonly:
                self.checkpoint(buffer, sync=True)

    def close(self, buffer: MultiAgentReplayBuffer) -> None:
        """A clean checkpoint (storage flushed), the log emptied, then the log and the lock
        released; later writes are refused. A read-only store only releases."""
        with buffer.writer.lock:
            if self.closed:
                return
            if not self.readonly:
                self.checkpoint(buffer, sync=True, clean=True)
                os.ftruncate(self._fds[LOG], 0)  # nothing to replay: give the reservation back
            self.closed = True
            self.release()


# ---------------------------------------------------------------------------- opening
def open_buffer(
    cls: type[MultiAgentReplayBuffer],
    path: Any,
    durable: bool,
    parallel_gather: bool,
    mode: Any = "r+",
) -> MultiAgentReplayBuffer:
    """:meth:`MultiAgentReplayBuffer.open`: map the files, load the checkpoint, replay the log."""
    from marlbuf.samplers import Sampler

    store = MappedStore.open(path, durable, mode)
    manifest_path = str(store.folder / MANIFEST)
    try:
        m = store.manifest
        assert m is not None
        try:
            specs = {a: AgentSpec.from_dict(s) for a, s in m["specs"].items()}
            sampler = Sampler.from_config(m["sampler"]["type"], m["sampler"]["config"])
            options = {k: m[k] for k in ("layout", "next_obs", "batch_layout", "batch_dtype")}
            capacity, n_trainers = _manifest_int(m, "capacity"), _manifest_int(m, "n_trainers")
            global_fields, alive = row_options_of(m)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"{manifest_path!r} is corrupt (missing or invalid {exc})") from exc
        try:
            buffer = cls(
                specs,
                capacity,
                sampler=sampler,
                n_trainers=n_trainers,
                parallel_gather=parallel_gather,
                _store=store,
                global_fields=global_fields,
                alive=alive,
                **options,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{manifest_path!r} describes no valid buffer: {exc}") from exc
        state = store.read_checkpoint()
        size = state.get("size", 0)
        size = size if isinstance(size, int) and 0 <= size <= capacity else 0
        state["storage"] = {k: v[:size] for k, v in buffer.storage.arrays().items()}
        store.hooks.load(state)  # the storage is already in place: nothing copied
        replayed = store.replay(buffer, state)
        store.hooks.attach(store)
        store.freeze()
        if not store.readonly:
            legacy = store._legacy_log
            store._legacy_log = False
            store._open_log(create=True)
            if replayed or legacy:
                store.checkpoint(buffer, sync=True)  # a fresh, verified log
                if legacy:
                    _write_json(store.folder / MANIFEST, {**m, "version": FORMAT_VERSION})
            else:
                store._write_log_header(sync=True)  # open: the log follows this checkpoint
    except BaseException:
        store.release()
        raise
    return buffer


def _manifest_int(manifest: Mapping[str, Any], key: str) -> int:
    value = manifest[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r} (expected an int)")
    return value


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


# ---------------------------------------------------------------------------- log records
def _parse_header(
    head: bytes, number: int, seq: int, row_words: int, layout: struct.Struct = _RECORD
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
        magic != (_MAGIC if layout is _RECORD else _LEGACY_MAGIC)
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


def _read_record(
    fd: int, offset: int, end: int, number: int, seq: int, row_words: int
) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray | None, int] | str | None:
    """The record at ``offset``: ``(rows, steps, stream, streams, truncated, bytes)``
    (``truncated``: shape (steps,) bool, or ``None`` when the call marked none); ``None`` at the
    end of the log (zeros, or a whole record of an earlier checkpoint); else what is wrong:
    ``"torn"`` (no whole header, or no trailer: cut short) or a description of the damage."""
    head = os.pread(fd, RECORD_HEADER_BYTES, offset)
    if not any(head):
        return None
    magic, rec_number, rec_seq, *_ = _RECORD.unpack_from(head)
    (head_crc,) = _HEADER_CRC.unpack_from(head, _RECORD.size)
    whole = magic == _MAGIC and zlib.crc32(head[: _RECORD.size]) == head_crc
    if whole and rec_number < number:
        return None  # a record of an earlier checkpoint: the end of this one's
    if whole and rec_number == number and rec_seq != seq:
        return f"has sequence number {rec_seq}, not {seq}: records are missing"
    parsed = _parse_header(head, number, seq, row_words)
    if parsed is None:
        return "torn" if not whole else "has a header that does not fit its rows"
    steps, stream, n_rows, nbytes, crc, flags = parsed
    size = RECORD_HEADER_BYTES + nbytes + RECORD_TRAILER_BYTES
    if offset + size > end:
        return f"runs past the end of the log ({end} bytes): the log was truncated"
    trailer = os.pread(fd, RECORD_TRAILER_BYTES, offset + size - RECORD_TRAILER_BYTES)
    t_magic, t_seq, t_crc = _TRAILER.unpack(trailer)
    if t_magic != _TRAILER_MAGIC or t_seq != seq or t_crc != head_crc:
        return "torn"  # the record was cut short: its call never reached the table
    rows, streams, cut = _read_payload(
        fd, offset + RECORD_HEADER_BYTES, n_rows, stream, row_words, flags
    )
    if _payload_checksum(rows, streams, np.zeros(2, dtype=np.uint64), cut) != crc:
        return "is complete but its rows fail their checksum (damaged)"
    return rows, steps, stream, streams, (cut != 0) if flags & _CUT else None, size


def _later_record(fd: int, offset: int, end: int, number: int, seq: int) -> bool:
    """Whether a whole record header of checkpoint ``number`` with a sequence number above
    ``seq`` lies after ``offset`` (then a bad record there is damage, not a torn end)."""
    chunk = 8 << 20
    position = offset + 1
    while position < end:
        data = os.pread(fd, min(chunk + RECORD_HEADER_BYTES, end - position), position)
        at = data.find(_MAGIC)
        while at >= 0:
            head = data[at : at + RECORD_HEADER_BYTES]
            if len(head) == RECORD_HEADER_BYTES:
                _, rec_number, rec_seq, *_ = _RECORD.unpack_from(head)
                (crc,) = _HEADER_CRC.unpack_from(head, _RECORD.size)
                if (
                    zlib.crc32(head[: _RECORD.size]) == crc
                    and rec_number == number
                    and rec_seq > seq
                ):
                    return True
            at = data.find(_MAGIC, at + 1)
        position += chunk
    return False


#: Payloads up to this many bytes are checksummed with ``zlib.crc32`` (cheaper to call than a
#: kernel for a row or two), larger ones with :func:`marlbuf._kernels.checksum.record_checksum`
#: (about six times faster per byte); the reader applies the same rule.
SMALL_PAYLOAD_BYTES = 4096


def _payload_checksum(
    rows: np.ndarray, streams: np.ndarray, state: np.ndarray, cut: np.ndarray = _NO_STREAMS
) -> int:
    """The checksum of a record's payload: staged ``rows`` (shape (n, row_words), uint64,
    C-contiguous), then ``streams`` and the truncation flags ``cut`` (each shape (n,) or (0,),
    int64), as one 64-bit value (``state``: scratch, kept for callers)."""
    if not streams.shape[0] and not cut.shape[0] and rows.nbytes <= SMALL_PAYLOAD_BYTES:
        return zlib.crc32(rows)  # type: ignore[arg-type]  # add's one step: an ndarray is a buffer
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


__all__ = ["FORMAT", "LogDamaged", "MappedStore", "open_buffer", "resident"]
