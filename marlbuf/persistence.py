"""The buffer file format: a nested state written to and read from an ``.npz`` archive.

A state is a nested structure of dicts and lists whose leaves are NumPy arrays or JSON values
(what :meth:`MultiAgentReplayBuffer.state_dict` returns). :func:`write_state` walks it: every
array becomes one uncompressed ``.npy`` member of a zip archive, named by its path in the
nesting (``/storage/table`` -> ``/storage/table.npy``), and everything else goes, as JSON, into
the ``__meta__.npy`` member, where each array is replaced by ``{"__array__": path}``. The file
is a plain ``.npz``: ``np.load`` reads it, and nothing in it is pickled.

Both directions stream. An array is written from its own memory (C-contiguous arrays without
any copy, others in bounded chunks), and :func:`read_state` can read an array straight into a
preallocated destination (a buffer's storage), so saving or loading a buffer needs little
memory beyond the buffer itself.

Writes are atomic: the archive is written to a temporary file in the target's folder, flushed to
disk, renamed over the target and the folder entry is flushed too, so the target path always
holds either the previous file or the complete new one, even if the process is killed. A save
that fails removes its temporary file; one killed outright leaves a ``NAME.*.tmp`` file next to
the target, which can be deleted.

A save replaces only what it may: nothing, an empty regular file or a marlbuf buffer file
(``overwrite=True``: any regular file); never a symbolic link, a folder, a device, a FIFO or a
socket. Reading opens the file without blocking and refuses anything but a regular file, so a
FIFO or a device is refused at once instead of hanging or reading forever.

Reading never spends memory on a lie: every member must be stored uncompressed (as marlbuf and
``np.savez`` write them) and lie inside the file, so an array's bytes are in the file before
memory is allocated for it; a ``check`` callback sees every member's declared shape and dtype
before any array is read (a buffer bounds them by its header). The parts of a loaded state
are checked by the parts that own them (``RingWriter.check_loaded``,
``NextObsLinks.check_loaded``, ``EpisodeIndex.check_loaded``, ``Sampler.check_loaded``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import stat
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from marlbuf import _config
from marlbuf.config import BufferConfig
from marlbuf.stores.base import Storage
from marlbuf.writer import NextObsLinks

#: Archive member holding the JSON part of the state.
META_NAME = "__meta__"
#: Marker replacing an array in the JSON part.
ARRAY_KEY = "__array__"
#: Bytes moved per read call (and per write call for arrays that are not C-contiguous): bounds
#: the temporary memory of a save or load independently of the buffer's size.
CHUNK_BYTES = 4 * 1024 * 1024
#: Bytes of :class:`LiveRows` copied per call of its reader: writers of the buffer being saved
#: wait for one such copy at a time (about 0.1 ms).
LIVE_CHUNK_BYTES = 1024 * 1024

#: Called by :func:`read_state` with the JSON part of the state (arrays still as references);
#: returns preallocated destinations by array path (see :func:`array_path`).
Destinations = Callable[[dict[str, Any]], Mapping[str, np.ndarray]]
#: Called by :func:`read_state` with the JSON part of the state and every array's declared
#: ``(shape, dtype)`` by array path, before anything is allocated; raises ``ValueError`` to
#: refuse the file.
ShapeCheck = Callable[[dict[str, Any], Mapping[str, tuple[tuple[int, ...], np.dtype]]], None]

#: Attempts of a buffer's save to stream its rows while writers run (the last one holds the
#: writers off for the whole write): see :meth:`MultiAgentReplayBuffer.save`.
SNAPSHOT_ATTEMPTS = 3
#: Largest ``total_writes`` a loaded state may hold (generations stay far from int64 overflow).
MAX_TOTAL_WRITES = _config.MAX_TOTAL_WRITES

#: Largest stream id (``stream=``, ``first_stream + k``): stream ids are stored as int64.
MAX_STREAM = _config.MAX_STREAM


class SnapshotMoved(RuntimeError):
    """Raised by a :class:`LiveRows` reader when a writer overwrote rows of the snapshot being
    saved before they were copied (the save starts again from a new snapshot)."""


@dataclass(frozen=True)
class LiveRows:
    """The rows of an array that writer threads may change while it is saved.

    :func:`write_state` writes it like an array of ``shape`` and ``dtype``, asking ``read(start,
    stop)`` for rows ``[start, stop)`` a few at a time (about :data:`LIVE_CHUNK_BYTES`); ``read``
    returns them, C-contiguous, as they were when the snapshot was taken, or raises
    :class:`SnapshotMoved` when they were overwritten since (the partial file is then removed
    and the exception propagates).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    read: Callable[[int, int], np.ndarray]

    def copy(self) -> np.ndarray:
        """All the rows, as a new C-ordered array (read a chunk at a time; may raise
        :class:`SnapshotMoved`)."""
        out = np.empty(self.shape, dtype=self.dtype)
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        step = max(1, LIVE_CHUNK_BYTES // max(1, row_bytes))
        for start in range(0, self.shape[0] if self.shape else 0, step):
            stop = min(self.shape[0], start + step)
            out[start:stop] = self.read(start, stop)
        return out


def array_path(*keys: str) -> str:
    """The path under which the array at ``state[keys[0]][keys[1]]...`` is stored."""
    return "".join(f"/{k}" for k in keys)


# ------------------------------------------------------------------------------------ writing
def write_state(
    state: Mapping[str, Any],
    path: str | os.PathLike[str],
    sync: bool = True,
    *,
    overwrite: bool = False,
) -> None:
    """Write a nested state to ``path`` as an ``.npz`` archive, atomically.

    Parameters
    ----------
    state : mapping
        Nested dicts and lists of NumPy arrays, :class:`LiveRows` and JSON values; dict keys
        are strings. Arrays may be views of live memory (e.g. a buffer's storage): they are
        written from it directly, without a copy.
    path : str or path-like
        Target file; its folder must exist. The file gets the mode ``0o666 & ~umask``, like any
        file the process creates. It may name nothing yet, an empty regular file or a marlbuf
        buffer file; see ``overwrite``.
    sync : bool, default True
        Flush the file and the folder entry to disk. Without it the replacement is still atomic
        for other processes and survives this process dying, but not a machine crash.
    overwrite : bool, default False
        Also replace a regular file that is not a marlbuf buffer file. A symbolic link, a folder,
        a device, a FIFO or a socket at ``path`` is never replaced.

    Raises
    ------
    FileNotFoundError
        The target's folder does not exist (the message names the target).
    ValueError
        ``path`` is empty, or names something :func:`write_state` may not replace.
    TypeError
        ``state`` holds a value JSON cannot store, an object array, or a non-string key.
    SnapshotMoved
        A :class:`LiveRows` reader found its rows overwritten (nothing was written).
    """
    path = _target_path(path)
    check_target(path, overwrite)
    arrays: dict[str, np.ndarray | LiveRows] = {}
    meta = _split_arrays(state, "", arrays)
    try:
        meta_bytes = json.dumps(meta).encode()
    except TypeError as exc:
        raise TypeError(f"state holds a value that cannot be saved: {exc}") from exc
    fd, tmp = create_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            # ZIP_STORED: members are raw .npy bytes, so reading streams them without inflating
            with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as archive:
                _write_member(archive, META_NAME, np.frombuffer(meta_bytes, dtype=np.uint8))
                for key, array in arrays.items():
                    _write_member(archive, key, array)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # also on KeyboardInterrupt: never leave a partial file behind
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync:
        fsync_folder(path.parent)


def _target_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise TypeError(f"path must be a str or os.PathLike naming a file; got path={path!r}")
    if not os.fspath(path):
        raise ValueError("path must name a file; got path=''")
    return Path(os.fspath(path))


def check_target(path: Path, overwrite: bool = False) -> None:
    """Refuse (``ValueError``) to replace what is at ``path`` unless it is nothing, an empty
    regular file or a marlbuf buffer file (with ``overwrite``: any regular file). Symbolic links
    (dangling or not), folders, devices, FIFOs and sockets are always refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return  # nothing there (a missing folder is reported when the file is created)
    except NotADirectoryError:
        raise NotADirectoryError(
            errno.ENOTDIR, f"cannot save to {str(path)!r}: a part of its folder is a file"
        ) from None
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        state = "" if os.path.exists(path) else ", which does not exist"
        raise ValueError(
            f"cannot save to {str(path)!r}: it is a symbolic link to {target!r}{state}; save "
            "never replaces a link: pass the path of the file itself, or remove the link"
        )
    if stat.S_ISDIR(mode):
        raise ValueError(
            f"cannot save to {str(path)!r}: it is a folder; pass the path of a file in it "
            f"(e.g. {str(path / 'buffer.npz')!r})"
        )
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"cannot save to {str(path)!r}: it is {file_kind(mode)}, not a regular file; save "
            "never replaces one: pass the path of a regular file"
        )
    if not overwrite and info.st_size and not _is_buffer_file(path):
        raise ValueError(
            f"cannot save to {str(path)!r}: it holds a file that is not a marlbuf buffer "
            "file; pass overwrite=True to replace it, or choose another name"
        )


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "a special file"


def _is_buffer_file(path: Path) -> bool:
    """Whether the regular file ``path`` is a zip archive with a marlbuf state header."""
    try:
        fd = open_regular(path, follow=False)
    except (OSError, ValueError):
        return False
    with os.fdopen(fd, "rb") as fh:
        try:
            with zipfile.ZipFile(fh) as archive:
                return META_NAME + ".npy" in archive.namelist()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return False


def open_regular(path: str | os.PathLike[str], follow: bool = True, write: bool = False) -> int:
    """A descriptor of the regular file ``path``, opened without blocking (a FIFO does not
    hang the caller) and, unless ``follow``, without following a symbolic link
    (``O_NOFOLLOW``); anything but a regular file is closed again and refused with a
    ``ValueError`` saying what it is."""
    flags = (os.O_RDWR if write else os.O_RDONLY) | getattr(os, "O_NONBLOCK", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileNotFoundError(
                errno.ENOENT,
                f"{str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not exist",
            ) from None
        raise FileNotFoundError(errno.ENOENT, f"{str(path)!r} does not exist") from None
    except IsADirectoryError:  # a folder opened for writing
        raise ValueError(f"{str(path)!r} is a folder, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise ValueError(
                f"{str(path)!r} is a symbolic link (to {os.readlink(path)!r}); it must be a "
                "regular file: replace the link by the file itself"
            ) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError(f"{str(path)!r} is {file_kind(mode)}, not a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return fd


def create_temp(path: Path) -> tuple[int, str]:
    """A new file next to ``path``, opened for writing, with the mode the umask gives.

    ``tempfile.mkstemp`` would create it with mode 0600, which the rename would keep; creating it
    with 0666 lets the kernel apply the umask, as for any other file the user writes.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = str(path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            # report the target the caller named, not the temporary file's name
            folder = path.parent
            if isinstance(exc, FileNotFoundError) and os.path.isdir(folder):
                reason = (
                    f"its folder {str(folder)!r} does not accept new files (a virtual file "
                    "system such as /proc or /sys?); save to a folder on a disk"
                )
            elif isinstance(exc, FileNotFoundError):
                reason = f"its folder {str(folder)!r} does not exist; create it first"
            elif isinstance(exc, NotADirectoryError):
                reason = f"{str(folder)!r} is not a folder"
            else:
                reason = exc.strerror or str(exc)
            raise type(exc)(exc.errno, f"cannot save to {str(path)!r}: {reason}") from None
    raise FileExistsError(errno.EEXIST, f"cannot create a temporary file next to {str(path)!r}")


def fsync_folder(folder: Path) -> None:
    """Flush the folder entry of a rename to disk (POSIX; elsewhere the rename is all we do)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        # some file systems cannot sync a folder; the file itself is complete and in place
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _write_member(archive: zipfile.ZipFile, key: str, array: np.ndarray | LiveRows) -> None:
    """Write ``array`` as the ``.npy`` member ``key + ".npy"``, from the array's own memory."""
    if array.dtype.hasobject:
        raise TypeError(f"state array {key!r} has dtype {array.dtype}; object arrays are not saved")
    if isinstance(array, LiveRows):
        _write_live(archive, key, array)
        return
    header = np.lib.format.header_data_from_array_1_0(array)
    header["fortran_order"] = False  # the data below is always written in C order
    # force_zip64: the member's size is unknown when its local header is written, and a
    # storage array may exceed the 4 GiB that a plain zip entry can hold
    with archive.open(key + ".npy", "w", force_zip64=True) as fh:
        try:
            np.lib.format.write_array_header_1_0(fh, header)
        except ValueError:  # header too long for format 1.0 (very many fields)
            np.lib.format.write_array_header_2_0(fh, header)
        if array.flags.c_contiguous:
            fh.write(_bytes_of(array))  # no copy: zipfile checksums and writes the memory
            return
        # not C-contiguous (so at least 1-D and not empty): C-ordered copies of a few rows
        rows = max(1, CHUNK_BYTES // max(1, array[0].nbytes))
        for start in range(0, len(array), rows):
            fh.write(_bytes_of(np.ascontiguousarray(array[start : start + rows])))


def _write_live(archive: zipfile.ZipFile, key: str, rows: LiveRows) -> None:
    """Write :class:`LiveRows` as a C-ordered ``.npy`` member, a chunk of rows at a time."""
    shape = tuple(int(n) for n in rows.shape)
    header: dict[str, Any] = {
        "descr": np.lib.format.dtype_to_descr(rows.dtype),
        "fortran_order": False,
        "shape": shape,
    }
    row_bytes = math.prod(shape[1:]) * rows.dtype.itemsize
    with archive.open(key + ".npy", "w", force_zip64=True) as fh:
        try:
            np.lib.format.write_array_header_1_0(fh, header)
        except ValueError:
            np.lib.format.write_array_header_2_0(fh, header)
        step = max(1, LIVE_CHUNK_BYTES // max(1, row_bytes))
        for start in range(0, shape[0] if shape else 0, step):
            fh.write(_bytes_of(rows.read(start, min(shape[0], start + step))))


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a view of its memory."""
    return array.reshape(-1).view(np.uint8).data


def _split_arrays(obj: Any, prefix: str, arrays: dict[str, np.ndarray | LiveRows]) -> Any:
    """Replace every ndarray in a nested dict by a reference, collecting arrays by path."""
    if isinstance(obj, (np.ndarray, LiveRows)):
        if prefix in arrays:
            raise ValueError(f"two state arrays share the path {prefix!r}; rename a key")
        arrays[prefix] = obj
        return {ARRAY_KEY: prefix}
    if isinstance(obj, Mapping):
        for k in obj:
            if not isinstance(k, str):
                raise TypeError(
                    f"state keys must be strings (JSON); got {k!r} under {prefix or '/'!r}"
                )
        return {k: _split_arrays(v, f"{prefix}/{k}", arrays) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split_arrays(v, f"{prefix}/{i}", arrays) for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


# ------------------------------------------------------------------------------------ reading
def read_state(
    path: str | os.PathLike[str],
    destinations: Destinations | None = None,
    check: ShapeCheck | None = None,
) -> dict[str, Any]:
    """Read a state written by :func:`write_state`.

    Parameters
    ----------
    path : str or path-like
        The ``.npz`` file; it must be a regular file (a symbolic link to one is followed).
    destinations : callable, optional
        Called with the JSON part of the state once it is read (arrays still appear as
        ``{"__array__": path}``); returns preallocated arrays by array path. An array whose
        dtype matches its destination's, and whose shape is the destination's with at most as
        many rows, is read straight into the destination's first rows, and the state holds that
        view of the destination; any other array is read into a new array.
    check : callable, optional
        Called with the JSON part and every array's declared ``(shape, dtype)`` by array path
        before ``destinations`` and before any array is allocated; raises ``ValueError`` to
        refuse the file.

    Returns
    -------
    dict
        The state, arrays in place of their references.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist (or is a dangling symbolic link).
    ValueError
        ``path`` is not a regular file, or the file is not a marlbuf buffer file, or is
        truncated or corrupt, or ``check`` refused it.
    """
    path = _target_path(path)
    # opened here, outside the handler below, so that a missing or unreadable file raises its
    # own OSError and not "corrupt"; also np.load would leak the handle of a corrupt archive.
    # Without blocking, and only a regular file: a FIFO or a device is refused at once.
    try:
        fd = open_regular(path)
    except ValueError as exc:
        hint = ""
        if os.path.isdir(path):
            hint = " (a memory-mapped buffer's folder is reopened with MultiAgentReplayBuffer.open)"
        raise ValueError(f"cannot load {exc}; a buffer file is a regular file{hint}") from None
    with os.fdopen(fd, "rb") as fh:
        file_size = os.fstat(fd).st_size
        try:
            archive = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise _unreadable(path, exc) from exc
        with archive:
            names = set(archive.namelist())
            if META_NAME + ".npy" not in names:
                raise ValueError(f"{path} is not a marlbuf buffer file (no {META_NAME} entry)")
            for info in archive.infolist():
                _check_member(path, info, file_size)
            try:
                raw = _read_member(archive, META_NAME, None)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                raise _unreadable(path, exc) from exc
            try:
                meta = json.loads(raw.tobytes().decode())
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{path} has a corrupt header: {exc}") from exc
            if not isinstance(meta, dict):
                raise ValueError(f"{path} has a corrupt header: not a JSON object")
            if check is not None:
                shapes = {}
                for name in names:
                    if name.endswith(".npy") and name != META_NAME + ".npy":
                        try:
                            shapes[name[: -len(".npy")]] = _member_header(archive, name)
                        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                            raise _unreadable(path, exc) from exc
                check(meta, shapes)
            targets = dict(destinations(meta)) if destinations is not None else {}

            def load_array(key: str) -> np.ndarray:
                if not isinstance(key, str) or key + ".npy" not in names:
                    raise ValueError(
                        f"{path} is missing array {key!r} (truncated or corrupt buffer file)"
                    )
                try:
                    return _read_member(archive, key, targets.get(key))
                except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                    raise _unreadable(path, exc) from exc

            state: dict[str, Any] = _join_arrays(meta, load_array)
            return state


def _check_member(path: Path, info: zipfile.ZipInfo, file_size: int) -> None:
    """Refuse a member whose bytes are not all in the file: compressed (a few bytes may
    inflate to gigabytes) or declared past the file's end."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(
            f"{path} has a compressed member {info.filename!r}; marlbuf buffer files store "
            "their arrays uncompressed (as save() and np.savez write them): re-save the state "
            "with np.savez, not np.savez_compressed"
        )
    if info.header_offset + info.compress_size > file_size or info.file_size > file_size:
        raise ValueError(
            f"{path}: member {info.filename!r} declares {info.file_size} bytes past the end "
            f"of the {file_size}-byte file (truncated or corrupt)"
        )


def _member_header(archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """The declared ``(shape, dtype)`` of the ``.npy`` member ``name`` (only its header read)."""
    with archive.open(name) as fh:
        shape, _, dtype, _ = _npy_header(fh, name[: -len(".npy")])
    return shape, dtype


def _npy_header(fh: IO[bytes], key: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, header bytes)`` of the ``.npy`` stream ``fh``."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise ValueError(f"array {key!r} has .npy format version {version}; expected 1.0/2.0")
    if dtype.hasobject:
        raise ValueError(f"array {key!r} holds Python objects; marlbuf files never do")
    return tuple(int(n) for n in shape), bool(fortran_order), dtype, fh.tell()


class LoadTarget(Protocol):
    """What :func:`load_into` needs of the buffer it loads a file into: its configuration,
    its storage (whose arrays the file is read into), the hook that marks them as being
    replaced, and its checked load."""

    @property
    def config(self) -> BufferConfig: ...

    @property
    def storage(self) -> Storage: ...

    def begin_replace(self) -> None: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def load_into(target: LoadTarget, path: str | os.PathLike[str]) -> None:
    """Restore a file written by :meth:`MultiAgentReplayBuffer.save` into the buffer
    ``target``.

    Like ``target.load_state_dict(MultiAgentReplayBuffer.load(path).state_dict())`` (the same
    checks and errors), but the storage arrays are read straight into ``target``'s storage
    when the file's specs, capacity and layout are ``target``'s, so no second buffer is built.
    If the file turns out to be corrupt half-way, ``target``'s contents are undefined.
    """
    config, arrays = target.config, target.storage.arrays()
    target.load_state_dict(
        read_state(
            path, lambda header: storage_destinations(config, arrays, target.begin_replace, header)
        )
    )


def storage_destinations(
    config: BufferConfig,
    arrays: Mapping[str, np.ndarray],
    begin_replace: Callable[[], None],
    header: Mapping[str, Any],
) -> dict[str, np.ndarray]:
    """The storage ``arrays`` of a buffer of ``config`` by array path when the state
    ``header`` describes storage of the same shape (specs, global fields, alive mask,
    capacity, layout, next_obs format), after calling ``begin_replace`` (a mapped folder's
    files are unusable until the state is loaded); otherwise none, and the arrays are read as
    usual (:meth:`~MultiAgentReplayBuffer.load_state_dict` then explains the mismatch)."""
    try:
        saved = BufferConfig.from_dict(header)
        fits = (
            saved.specs == config.specs
            and (saved.global_fields, saved.alive) == (config.global_fields, config.alive)
            and saved.capacity == config.capacity
            and saved.layout == config.layout
            and saved.next_obs == config.next_obs
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        fits = False
    if not fits:
        return {}
    begin_replace()
    return {array_path("storage", k): v for k, v in arrays.items()}


def _unreadable(path: Path, exc: BaseException) -> ValueError:
    return ValueError(
        f"{path} is not a readable marlbuf buffer file (corrupt or not an .npz): {exc}"
    )


def _read_member(archive: zipfile.ZipFile, key: str, destination: np.ndarray | None) -> np.ndarray:
    """The array of member ``key + ".npy"``, read into ``destination[:rows]`` when it fits."""
    info = archive.getinfo(key + ".npy")
    with archive.open(info) as fh:
        shape, fortran_order, dtype, header_bytes = _npy_header(fh, key)
        nbytes = math.prod(shape) * dtype.itemsize
        # check the size before allocating: a corrupt header must not ask for terabytes
        if header_bytes + nbytes != info.file_size:
            raise ValueError(
                f"array {key!r} declares shape {shape} {dtype} ({nbytes} bytes) but its entry "
                f"holds {info.file_size - header_bytes} bytes (truncated or corrupt)"
            )
        if _fits(destination, shape, dtype, fortran_order):
            assert destination is not None
            out = destination[: shape[0]]
        elif fortran_order:
            out = np.empty(shape[::-1], dtype=dtype).T  # F-ordered: its transpose is C-ordered
        else:
            out = np.empty(shape, dtype=dtype)
        memory = out.T if fortran_order else out
        _read_exactly(fh, _bytes_of(memory), key)
        fh.read(1)  # reach the end of the entry, where zipfile checks the CRC-32
    return out


def _fits(
    destination: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype, fortran: bool
) -> bool:
    return (
        destination is not None
        and not fortran
        and destination.flags.c_contiguous
        and destination.dtype == dtype
        and len(shape) == destination.ndim >= 1
        and shape[1:] == destination.shape[1:]
        and shape[0] <= destination.shape[0]
    )


def _read_exactly(fh: IO[bytes], memory: memoryview, key: str) -> None:
    """Fill ``memory`` from ``fh`` in chunks of :data:`CHUNK_BYTES`."""
    done, total = 0, memory.nbytes
    while done < total:
        got = fh.readinto(memory[done : min(total, done + CHUNK_BYTES)])  # type: ignore[attr-defined]
        if not got:
            raise ValueError(f"array {key!r} ends after {done} of {total} bytes (truncated)")
        done += got


# ------------------------------------------------------------------------------------ checking
def check_declared_shapes(
    shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    capacity: int,
    n_trainers: Any,
    weighted: bool,
) -> None:
    """Bound the arrays a buffer file declares (:data:`ShapeCheck`'s ``shapes``) by its header,
    before the buffer is built or any array read: per-slot arrays have at most ``capacity``
    rows, the side table at most :meth:`NextObsLinks.side_rows_bound` rows, and priority trees are
    ``(n_trainers, capacity)`` (present exactly when the sampler is ``weighted``), so
    ``n_trainers`` is bounded by what the file holds."""
    if isinstance(n_trainers, bool) or not isinstance(n_trainers, int) or n_trainers < 1:
        raise ValueError(f"buffer file has n_trainers={n_trainers!r}; expected an int >= 1")
    for key, (shape, _) in shapes.items():
        if key.startswith("/sampler/state/") and key.rsplit("/", 1)[1] in ("leaves", "priorities"):
            if shape != (n_trainers, capacity):
                raise ValueError(
                    f"buffer file's {key} has shape {shape}; its header (n_trainers="
                    f"{n_trainers}, capacity={capacity}) needs {(n_trainers, capacity)}"
                )
        elif key == "/links/side":
            if not shape or shape[0] > NextObsLinks.side_rows_bound(capacity):
                raise ValueError(
                    f"buffer file's {key} has shape {shape}; a buffer of capacity {capacity} "
                    f"has at most {NextObsLinks.side_rows_bound(capacity)} side rows"
                )
        elif key in ("/episodes/next_streams", "/episodes/next_obs"):
            # one per open stream (the open episodes may outnumber the slots)
            opened = shapes.get("/episodes/open", ((0,), np.dtype(np.int64)))[0]
            if not shape or shape[0] > (opened[0] if opened else 0):
                raise ValueError(
                    f"buffer file's {key} has shape {shape}; it holds one row per open episode "
                    f"(/episodes/open has {opened[0] if opened else 0})"
                )
        elif key.startswith(("/storage/", "/write_generation", "/links/", "/episodes/")) and (
            key not in ("/links/free", "/links/pending", "/episodes/open")
        ):
            if not shape or shape[0] > capacity:
                raise ValueError(
                    f"buffer file's {key} has shape {shape}; a buffer of capacity {capacity} "
                    f"has at most {capacity} rows of it"
                )
    if weighted and "/sampler/state/leaves" not in shapes:
        raise ValueError(
            "buffer file has a prioritized sampler but no priorities (/sampler/state/leaves); "
            "truncated or corrupt"
        )


def _join_arrays(obj: Any, load_array: Callable[[str], np.ndarray]) -> Any:
    """Inverse of :func:`_split_arrays`: each reference replaced by ``load_array(path)``."""
    if isinstance(obj, dict):
        if set(obj) == {ARRAY_KEY}:
            return load_array(obj[ARRAY_KEY])
        return {k: _join_arrays(v, load_array) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join_arrays(v, load_array) for v in obj]
    return obj


__all__ = [
    "MAX_STREAM",
    "LiveRows",
    "LoadTarget",
    "SnapshotMoved",
    "array_path",
    "check_declared_shapes",
    "check_target",
    "create_temp",
    "file_kind",
    "fsync_folder",
    "load_into",
    "open_regular",
    "read_state",
    "storage_destinations",
    "write_state",
]
