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
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from marlbuf.spec import AgentSpec

if TYPE_CHECKING:
    from marlbuf.buffer import MultiAgentReplayBuffer

#: Archive member holding the JSON part of the state.
META_NAME = "__meta__"
#: Marker replacing an array in the JSON part.
ARRAY_KEY = "__array__"
#: Bytes moved per read call (and per write call for arrays that are not C-contiguous): bounds
#: the temporary memory of a save or load independently of the buffer's size.
CHUNK_BYTES = 4 * 1024 * 1024

#: Called by :func:`read_state` with the JSON part of the state (arrays still as references);
#: returns preallocated destinations by array path (see :func:`array_path`).
Destinations = Callable[[dict[str, Any]], Mapping[str, np.ndarray]]


def array_path(*keys: str) -> str:
    """The path under which the array at ``state[keys[0]][keys[1]]...`` is stored."""
    return "".join(f"/{k}" for k in keys)


# ------------------------------------------------------------------------------------ writing
def write_state(state: Mapping[str, Any], path: str | os.PathLike[str], sync: bool = True) -> None:
    """Write a nested state to ``path`` as an ``.npz`` archive, atomically.

    Parameters
    ----------
    state : mapping
        Nested dicts and lists of NumPy arrays and JSON values; dict keys are strings. Arrays
        may be views of live memory (e.g. a buffer's storage): they are written from it
        directly, without a copy.
    path : str or path-like
        Target file; its folder must exist. The file gets the mode ``0o666 & ~umask``, like any
        file the process creates.
    sync : bool, default True
        Flush the file and the folder entry to disk. Without it the replacement is still atomic
        for other processes and survives this process dying, but not a machine crash.

    Raises
    ------
    FileNotFoundError
        The target's folder does not exist (the message names the target).
    TypeError
        ``state`` holds a value JSON cannot store, an object array, or a non-string key.
    """
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    meta = _split_arrays(state, "", arrays)
    try:
        meta_bytes = json.dumps(meta).encode()
    except TypeError as exc:
        raise TypeError(f"state holds a value that cannot be saved: {exc}") from exc
    fd, tmp = _create_temp(path)
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
        _fsync_folder(path.parent)


def _create_temp(path: Path) -> tuple[int, str]:
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
            if isinstance(exc, FileNotFoundError):
                reason = f"its folder {str(folder)!r} does not exist; create it first"
            elif isinstance(exc, NotADirectoryError):
                reason = f"{str(folder)!r} is not a folder"
            else:
                reason = exc.strerror or str(exc)
            raise type(exc)(exc.errno, f"cannot save to {str(path)!r}: {reason}") from None
    raise FileExistsError(errno.EEXIST, f"cannot create a temporary file next to {str(path)!r}")


def _fsync_folder(folder: Path) -> None:
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


def _write_member(archive: zipfile.ZipFile, key: str, array: np.ndarray) -> None:
    """Write ``array`` as the ``.npy`` member ``key + ".npy"``, from the array's own memory."""
    if array.dtype.hasobject:
        raise TypeError(f"state array {key!r} has dtype {array.dtype}; object arrays are not saved")
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


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a view of its memory."""
    return array.reshape(-1).view(np.uint8).data


def _split_arrays(obj: Any, prefix: str, arrays: dict[str, np.ndarray]) -> Any:
    """Replace every ndarray in a nested dict by a reference, collecting arrays by path."""
    if isinstance(obj, np.ndarray):
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
    path: str | os.PathLike[str], destinations: Destinations | None = None
) -> dict[str, Any]:
    """Read a state written by :func:`write_state`.

    Parameters
    ----------
    path : str or path-like
        The ``.npz`` file.
    destinations : callable, optional
        Called with the JSON part of the state once it is read (arrays still appear as
        ``{"__array__": path}``); returns preallocated arrays by array path. An array whose
        dtype matches its destination's, and whose shape is the destination's with at most as
        many rows, is read straight into the destination's first rows, and the state holds that
        view of the destination; any other array is read into a new array.

    Returns
    -------
    dict
        The state, arrays in place of their references.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        The file is not a marlbuf buffer file, or is truncated or corrupt.
    """
    path = Path(path)
    # opened here, outside the handler below, so that a missing or unreadable file raises its
    # own OSError and not "corrupt"; also np.load would leak the handle of a corrupt archive
    with open(path, "rb") as fh:
        try:
            archive = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise _unreadable(path, exc) from exc
        with archive:
            names = set(archive.namelist())
            if META_NAME + ".npy" not in names:
                raise ValueError(f"{path} is not a marlbuf buffer file (no {META_NAME} entry)")
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
            targets = dict(destinations(meta)) if destinations is not None else {}

            def load_array(key: str) -> np.ndarray:
                if key + ".npy" not in names:
                    raise ValueError(
                        f"{path} is missing array {key!r} (truncated or corrupt buffer file)"
                    )
                try:
                    return _read_member(archive, key, targets.get(key))
                except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                    raise _unreadable(path, exc) from exc

            state: dict[str, Any] = _join_arrays(meta, load_array)
            return state


def load_into(buffer: MultiAgentReplayBuffer, path: str | os.PathLike[str]) -> None:
    """Restore a file written by :meth:`MultiAgentReplayBuffer.save` into ``buffer``.

    Like ``buffer.load_state_dict(MultiAgentReplayBuffer.load(path).state_dict())`` (the same
    checks and errors), but the storage arrays are read straight into ``buffer``'s storage when
    the file's specs, capacity and layout are ``buffer``'s, so no second buffer is built. If the
    file turns out to be corrupt half-way, ``buffer``'s contents are undefined.
    """
    buffer.load_state_dict(read_state(path, lambda header: storage_destinations(buffer, header)))


def storage_destinations(
    buffer: MultiAgentReplayBuffer, header: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """``buffer``'s storage arrays by array path when the state ``header`` describes storage of
    the same shape (specs, global fields, alive mask, capacity, layout, next_obs format);
    otherwise none, and
    the arrays are read as usual (:meth:`~MultiAgentReplayBuffer.load_state_dict` then explains
    the mismatch)."""
    from marlbuf.buffer import row_options_of

    try:
        specs = {a: AgentSpec.from_dict(s) for a, s in header["specs"].items()}
        fits = (
            specs == buffer.specs
            and row_options_of(header) == (buffer.global_fields, buffer.alive)
            and header["capacity"] == buffer.capacity
            and header["layout"] == buffer.layout
            and header.get("next_obs", "stored") == buffer.next_obs
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        fits = False
    if not fits:
        return {}
    if buffer._mapped is not None:  # its files are unusable until the state is loaded
        buffer._mapped.begin_replace()
    return {array_path("storage", k): v for k, v in buffer.storage.arrays().items()}


def _unreadable(path: Path, exc: BaseException) -> ValueError:
    return ValueError(
        f"{path} is not a readable marlbuf buffer file (corrupt or not an .npz): {exc}"
    )


def _read_member(archive: zipfile.ZipFile, key: str, destination: np.ndarray | None) -> np.ndarray:
    """The array of member ``key + ".npy"``, read into ``destination[:rows]`` when it fits."""
    info = archive.getinfo(key + ".npy")
    with archive.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"array {key!r} has .npy format version {version}; expected 1.0/2.0")
        if dtype.hasobject:
            raise ValueError(f"array {key!r} holds Python objects; marlbuf files never do")
        header_bytes = fh.tell()
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
    "array_path",
    "load_into",
    "read_state",
    "storage_destinations",
    "write_state",
]
