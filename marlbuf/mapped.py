"""Memory-mapped storage: a buffer whose storage arrays live in files, so that its capacity is
bounded by disk, not RAM (``MultiAgentReplayBuffer(..., path=folder)``; reopened with
``MultiAgentReplayBuffer.open(folder)``).

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
  (:mod:`marlbuf.persistence` format, without the storage arrays).
* ``log``: the *redo log* since that checkpoint, one record per ``add``/``extend``/``add_envs``
  call: its validated staged rows, its stream(s), a sequence number, and CRC-32 checksums.
* ``lock``: held (``flock``) while a buffer object has the folder open; a second open is refused.

Crash consistency
-----------------
A call's record is written to the log *before* the call changes anything (table rows, links,
side table, counters, priorities). Reopening loads the checkpoint and runs the complete records
again through the buffer's own commit, which rewrites their rows into the table and rebuilds all
metadata exactly; it stops at the first record that is incomplete (checksum, sequence number or
checkpoint number wrong), whose call had not yet touched the table. Every
``_config.MAPPED_LOG_BYTES`` logged bytes (or the size of the last checkpoint, if larger) the
metadata is checkpointed (written to a temporary file that is renamed over ``state.npz``; with
``durable=True``, and always by ``flush()``/``close()``, the storage files are flushed to disk
first and the checkpoint is fsynced) and the log starts afresh, its records numbered for the new
checkpoint. Hence:

* **The process dies** (``SIGKILL``, a crash, the OOM killer) at any point: every call that
  returned is kept, the call in flight is kept entirely or not at all, and no row is torn. Priority
  updates (``update_priorities``) and the RNG state are those of the last checkpoint, ``flush()``
  or ``close()``.
* **The machine stops** (power loss, kernel crash): with ``durable=True`` each call's record is on
  disk (``fdatasync``) before its rows are written, so the same holds. Otherwise the files are
  as ``flush()``/``close()`` left them if nothing was written since; writes after the last flush
  may be lost, and when the buffer was full the oldest rows they overwrote may be torn.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import re
import shutil
import struct
import weakref
import zlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from marlbuf import _config, persistence
from marlbuf.memory import MemoryEstimate
from marlbuf.spec import AgentSpec

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no inter-process lock
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from marlbuf.buffer import MultiAgentReplayBuffer

#: Value of ``"format"`` in ``manifest.json``; bump ``FORMAT_VERSION`` on incompatible changes.
FORMAT = "marlbuf-mapped"
FORMAT_VERSION = 2
#: version 1: manifests without ``global_fields``/``alive`` (read as none and False)
READABLE_FORMAT_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
CHECKPOINT = "state.npz"
LOG = "log"
LOCK = "lock"
#: Files this module creates (an interrupted creation leaves only such files behind).
_OWN_FILE = re.compile(r"array-\d+\.bin|state\.npz|log|lock|(manifest\.json|state\.npz)\..*\.tmp")

#: Log record header: magic, checkpoint number, sequence number, steps, stream (-1: an array of
#: streams follows the rows), rows, payload bytes, payload CRC-32; then the CRC-32 of these.
_RECORD = struct.Struct("<8sQQqqqQI")
_HEADER_CRC = struct.Struct("<I")
RECORD_HEADER_BYTES = _RECORD.size + _HEADER_CRC.size  # 64
_MAGIC = b"MBUFLOG1"


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
    """Names in ``folder`` that this module did not create (none: only ours, or empty)."""
    return sorted(
        p.name for p in folder.iterdir() if not (p.is_file() and _OWN_FILE.fullmatch(p.name))
    )


class MappedStore:
    """The files of one memory-mapped buffer: storage arrays, checkpoint, redo log and lock.

    Built by :meth:`create` (a new buffer) or :meth:`open` (an existing one); the buffer's
    constructor maps its storage arrays through :meth:`allocate`, and :meth:`start` (new) or
    :func:`open_buffer` (existing) makes it live. Writes are then logged by :meth:`log` before the
    buffer applies them and :meth:`committed` after; every method runs under the buffer's
    ``writer.lock`` (the callers hold it).
    """

    def __init__(self, folder: Path, durable: bool, manifest: dict[str, Any] | None) -> None:
        self.folder = folder
        self.durable = bool(durable)
        #: the configuration read by :meth:`open`; ``None`` while creating
        self.manifest = manifest
        self._arrays: dict[str, dict[str, Any]] = {}  # name -> file, dtype, shape
        self._maps: list[mmap.mmap] = []
        self._fds: dict[str, int] = {}  # "lock", "log": raw descriptors (closed by _release)
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        self.checkpoint_number = 0
        self._seq = 0  # next record's sequence number since the checkpoint
        self._offset = 0  # next record's position in the log
        self._limit = _config.MAPPED_LOG_BYTES
        self._row_words = 0
        self._made_folder = False  # by create(): removed again if the creation fails
        self.closed = False

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
        if folder.is_dir():
            if (folder / MANIFEST).exists():
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
        elif folder.exists() or folder.is_symlink():
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
                if p.name != LOCK:
                    p.unlink()
            free = shutil.disk_usage(folder).free
            if needed.storage_bytes > free:
                gib = 1024**3
                raise OSError(
                    errno.ENOSPC,
                    f"this buffer's storage needs {needed.storage_bytes / gib:.2f} GiB on disk but "
                    f"{str(folder)!r} has {free / gib:.2f} GiB free; reduce capacity or choose "
                    "a folder on another disk",
                )
        except BaseException:
            store.abandon()
            raise
        return store

    @classmethod
    def open(cls, path: Any, durable: bool) -> MappedStore:
        """Claim the folder of an existing buffer and read its manifest."""
        folder = _folder(path)
        _check_durable(durable)
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
        if not (folder / MANIFEST).is_file():
            if any(folder.iterdir()) and not _foreign_files(folder):
                raise ValueError(
                    f"{str(folder)!r} holds an incomplete memory-mapped buffer (its creation "
                    "was interrupted, so it holds no data); delete the folder or create a new "
                    "buffer there"
                )
            raise ValueError(
                f"{str(folder)!r} is not a marlbuf memory-mapped buffer (it has no {MANIFEST})"
            )
        store = cls(folder, durable, None)
        try:
            store._lock()
            store.manifest = _read_manifest(folder / MANIFEST)
        except BaseException:
            store.release()
            raise
        return store

    def _lock(self) -> None:
        fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        self._fds["lock"] = fd
        if fcntl is None:  # pragma: no cover
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise BlockingIOError(
                exc.errno,
                f"the memory-mapped buffer at {str(self.folder)!r} is open in another buffer "
                "object (this or another process); close() that one first",
            ) from None

    def release(self) -> None:
        """Close the log and give up the lock (the mapped arrays stay valid while referenced)."""
        _close_all(self._fds)

    def abandon(self) -> None:
        """A creation failed: release, delete the files made so far, and the folder if made."""
        self.release()
        if self.manifest is not None:
            return  # never for an existing buffer
        for p in self.folder.iterdir():
            if p.is_file() and _OWN_FILE.fullmatch(p.name):
                p.unlink()
        if self._made_folder and not any(self.folder.iterdir()):
            self.folder.rmdir()

    # ------------------------------------------------------------------------ storage arrays
    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The storage array ``name``: a new file (creating) or the existing one (opening),
        mapped into memory. Matches :data:`marlbuf.storage.Allocator`."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if self.manifest is None:
            file = f"array-{len(self._arrays)}.bin"
            self._arrays[name] = {"file": file, "dtype": dtype.str, "shape": list(shape)}
            fd = os.open(self.folder / file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
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
        mapped_file = self.folder / str(entry["file"])
        try:
            fd = os.open(mapped_file, os.O_RDWR)
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
            return np.zeros(shape, dtype=dtype)
        mapping = mmap.mmap(fd, nbytes, access=mmap.ACCESS_WRITE)
        self._maps.append(mapping)
        # a plain ndarray over the mapping (kernels take it like any array)
        return np.frombuffer(mapping, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)

    def sync_arrays(self) -> None:
        """Flush the mapped storage arrays to disk (``msync``)."""
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
        self._row_words = buffer._codec.row_words
        self._open_log()
        os.ftruncate(self._fds[LOG], 0)
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
        buffer._mapped = self

    def _open_log(self) -> None:
        self._fds[LOG] = os.open(self.folder / LOG, os.O_RDWR | os.O_CREAT, 0o666)

    def read_checkpoint(self) -> dict[str, Any]:
        """The checkpointed state (no storage arrays), checked."""
        path = self.folder / CHECKPOINT
        if not path.is_file():
            raise ValueError(
                f"the memory-mapped buffer at {str(self.folder)!r} lacks its {CHECKPOINT} "
                "(incomplete copy?)"
            )
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
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        return state

    def replay(self, buffer: MultiAgentReplayBuffer) -> int:
        """Run the complete log records after the checkpoint through ``buffer``'s commit (not
        yet attached, so nothing is logged again); returns how many there were."""
        self._row_words = buffer._codec.row_words
        self._open_log()
        fd = self._fds[LOG]
        end = os.fstat(fd).st_size
        offset = count = 0
        while offset + RECORD_HEADER_BYTES <= end:
            head = os.pread(fd, RECORD_HEADER_BYTES, offset)
            if len(head) < RECORD_HEADER_BYTES:
                break
            magic, number, seq, steps, stream, n_rows, nbytes, crc = _RECORD.unpack_from(head)
            (head_crc,) = _HEADER_CRC.unpack_from(head, _RECORD.size)
            expected = n_rows * self._row_words * 8 + (n_rows * 8 if stream < 0 else 0)
            if (
                magic != _MAGIC
                or zlib.crc32(head[: _RECORD.size]) != head_crc
                or number != self.checkpoint_number
                or seq != count
                or steps != n_rows
                or n_rows < 0
                or nbytes != expected
                or offset + RECORD_HEADER_BYTES + nbytes > end
            ):
                break  # stale or torn: its call never reached the table
            rows = np.empty((n_rows, self._row_words), dtype=np.uint64)
            streams = np.empty(n_rows if stream < 0 else 0, dtype=np.int64)
            _read_into(fd, offset + RECORD_HEADER_BYTES, [rows, streams])
            if zlib.crc32(_bytes(streams), zlib.crc32(_bytes(rows))) != crc:
                break
            buffer._commit(rows, int(steps), int(stream) if stream >= 0 else streams)
            offset += RECORD_HEADER_BYTES + nbytes
            count += 1
        return count

    # ------------------------------------------------------------------------ the write path
    def log(self, rows: np.ndarray, steps: int, streams: int | np.ndarray) -> None:
        """Append the redo record of one commit (before the buffer changes anything)."""
        if self.closed:
            raise ValueError(
                f"this buffer was closed; reopen it with MultiAgentReplayBuffer.open("
                f"{str(self.folder)!r}) to write again"
            )
        data = np.ascontiguousarray(rows).data  # staged rows are contiguous: no copy
        crc = zlib.crc32(data)
        parts = [memoryview(b""), data]
        if isinstance(streams, (int, np.integer)):
            stream = int(streams)
        else:  # add_envs: one stream per row
            stream = -1
            parts.append(np.ascontiguousarray(streams, dtype=np.int64).data)
            crc = zlib.crc32(parts[2], crc)
        payload = sum(part.nbytes for part in parts[1:])
        head = _RECORD.pack(
            _MAGIC, self.checkpoint_number, self._seq, steps, stream, len(rows), payload, crc
        )
        parts[0] = memoryview(head + _HEADER_CRC.pack(zlib.crc32(head)))
        fd = self._fds[LOG]
        _write_at(fd, parts, self._offset)
        if self.durable:
            _datasync(fd)
        self._offset += RECORD_HEADER_BYTES + payload
        self._seq += 1

    def committed(self, buffer: MultiAgentReplayBuffer) -> None:
        """After a commit: checkpoint once the log is long enough."""
        if self._offset >= self._limit:
            self.checkpoint(buffer)

    def checkpoint(self, buffer: MultiAgentReplayBuffer, sync: bool = False) -> None:
        """Write the buffer's metadata as the new checkpoint and start the log afresh.

        With ``sync`` (or ``durable``) the storage arrays are flushed to disk first, so that the
        checkpoint never describes rows the disk does not hold.
        """
        with buffer.writer.lock:
            if sync or self.durable:
                self.sync_arrays()
            state = buffer._state(copy=False)
            state["storage"] = {}  # the mapped files
            state["mapped"] = {"checkpoint": self.checkpoint_number + 1}
            self._write_checkpoint(state, sync or self.durable)

    def begin_replace(self) -> None:
        """Mark the files unusable before the storage is overwritten wholesale (a state is
        loaded into the buffer); the checkpoint that follows makes them usable again."""
        self._write_checkpoint(
            {
                "format": _config.SAVE_FORMAT,
                "version": _config.SAVE_VERSION,
                "mapped": {"checkpoint": self.checkpoint_number + 1, "replacing": True},
            },
            sync=True,
        )

    def _write_checkpoint(self, state: Mapping[str, Any], sync: bool) -> None:
        if self.closed:
            raise ValueError(
                f"this buffer was closed; reopen it with MultiAgentReplayBuffer.open("
                f"{str(self.folder)!r}) to change it"
            )
        path = self.folder / CHECKPOINT
        persistence.write_state(state, path, sync)  # atomic: temporary file (fsync), rename
        self.checkpoint_number += 1  # older log records no longer count
        self._seq = 0
        self._offset = 0
        self._limit = max(_config.MAPPED_LOG_BYTES, path.stat().st_size)
        fd = self._fds.get(LOG)
        if fd is not None and os.fstat(fd).st_size > 2 * self._limit:
            os.ftruncate(fd, 0)  # a huge extend grew it: give the space back

    def flush(self, buffer: MultiAgentReplayBuffer) -> None:
        """Storage arrays to disk, then a checkpoint of everything else."""
        with buffer.writer.lock:
            if not self.closed:
                self.checkpoint(buffer, sync=True)

    def close(self, buffer: MultiAgentReplayBuffer) -> None:
        """:meth:`flush`, then release the log and the lock; later writes are refused."""
        with buffer.writer.lock:
            if self.closed:
                return
            self.flush(buffer)
            self.closed = True
            self.release()


# ---------------------------------------------------------------------------- opening
def open_buffer(
    cls: type[MultiAgentReplayBuffer], path: Any, durable: bool, parallel_gather: bool
) -> MultiAgentReplayBuffer:
    """:meth:`MultiAgentReplayBuffer.open`: map the files, load the checkpoint, replay the log."""
    from marlbuf.buffer import row_options_of
    from marlbuf.samplers import Sampler

    store = MappedStore.open(path, durable)
    try:
        m = store.manifest
        assert m is not None
        try:
            specs = {a: AgentSpec.from_dict(s) for a, s in m["specs"].items()}
            sampler = Sampler.from_config(m["sampler"]["type"], m["sampler"]["config"])
            options = {k: m[k] for k in ("layout", "next_obs", "batch_layout", "batch_dtype")}
            capacity, n_trainers = int(m["capacity"]), int(m["n_trainers"])
            global_fields, alive = row_options_of(m)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{str(store.folder / MANIFEST)!r} is corrupt (missing or invalid {exc})"
            ) from exc
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
        state = store.read_checkpoint()
        size = int(state.get("size", 0))
        state["storage"] = {k: v[:size] for k, v in buffer.storage.arrays().items()}
        buffer._load_state(state, adopt=True)  # the storage is already in place: nothing copied
        replayed = store.replay(buffer)
        buffer._mapped = store
        if replayed:
            store.checkpoint(buffer, sync=store.durable)  # a fresh log
    except BaseException:
        store.release()
        raise
    return buffer


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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


# ---------------------------------------------------------------------------- file helpers
def _close_all(fds: dict[str, int]) -> None:
    while fds:
        _, fd = fds.popitem()
        try:
            os.close(fd)  # closing the lock's descriptor releases the flock
        except OSError:
            pass


def _reserve(fd: int, nbytes: int, path: Path) -> None:
    """Size the file and reserve its blocks, so a full disk is reported now rather than as a
    ``SIGBUS`` when a mapped page is first written."""
    os.ftruncate(fd, nbytes)
    if nbytes == 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"no space left to reserve {nbytes} bytes for {str(path)!r}; reduce capacity "
                "or choose a folder on another disk",
            ) from None
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise


def _write_at(fd: int, buffers: list[Any], offset: int) -> None:
    """Write ``buffers`` (bytes or memoryviews of C-contiguous memory) at ``offset``, whole."""
    views = [memoryview(b).cast("B") for b in buffers]
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
    fd, tmp = persistence._create_temp(path)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    persistence._fsync_folder(path.parent)


__all__ = ["FORMAT", "MappedStore", "open_buffer", "resident"]
