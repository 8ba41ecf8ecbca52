"""The files of a memory-mapped buffer's folder: their names, the manifest, and the helpers
that open, reserve and write them (containment: plain names inside the folder, never a link)."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf import persistence

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
OWN_FILE = re.compile(
    r"array-\d+\.bin|stamps\.bin|state\.npz|log|lock|(manifest\.json|state\.npz)\..*\.tmp"
)


#: What a manifest may name as a storage file: a plain name in the folder.
ARRAY_FILE = re.compile(r"array-\d{1,6}\.bin")


def folder_path(path: Any) -> Path:
    """``path`` as a ``Path``, or a ``TypeError``/``ValueError`` that says what is accepted."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise TypeError(f"path must be a str or os.PathLike naming a folder; got path={path!r}")
    if not os.fspath(path):
        raise ValueError("path must name a folder; got path=''")
    return Path(os.fspath(path))


def check_durable(durable: Any) -> None:
    if not isinstance(durable, (bool, np.bool_)):
        raise TypeError(f"durable must be a bool; got durable={durable!r}")


def foreign_files(folder: Path) -> list[str]:
    """Names in ``folder`` that this module did not create (none: only ours, or empty);
    symbolic links are never ours."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.is_symlink() or not (p.is_file() and OWN_FILE.fullmatch(p.name))
    )


def check_mode(mode: Any) -> bool:
    """``mode`` of :meth:`MultiAgentReplayBuffer.open`: ``True`` for read-only (``"r"``)."""
    if mode not in ("r", "r+"):
        raise ValueError(
            f"mode must be 'r+' (read and write) or 'r' (read-only: sample from a frozen "
            f"buffer); got mode={mode!r}"
        )
    return mode == "r"


def read_manifest(fd: int, path: Path) -> dict[str, Any]:
    try:
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(MANIFEST_MAX_BYTES + 1)
        if len(text) > MANIFEST_MAX_BYTES:
            raise ValueError(f"larger than {MANIFEST_MAX_BYTES} bytes")
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
MANIFEST_MAX_BYTES = 16 << 20


CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def close_all(fds: dict[str, int]) -> None:
    while fds:
        _, fd = fds.popitem()
        try:
            os.close(fd)  # closing the folder's descriptor releases the flock
        except OSError:
            pass


def no_space(exc: OSError, folder: Path, what: str, changed: bool = False) -> OSError:
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


def reserve(fd: int, nbytes: int, path: Path, keep: bool = False) -> None:
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


def write_at(fd: int, buffers: list[Any], offset: int, path: Path | None = None) -> None:
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
        raise no_space(exc, path.parent, f"its redo log {str(path)!r}") from None


def read_into(fd: int, offset: int, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        view = as_bytes(array)
        while view.nbytes:
            chunk = os.pread(fd, min(view.nbytes, persistence.CHUNK_BYTES), offset)
            if not chunk:
                raise ValueError("log record ends early")  # checked against the size before
            view[: len(chunk)] = chunk
            view = view[len(chunk) :]
            offset += len(chunk)


def as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a flat view of its memory."""
    return array.reshape(-1).view(np.uint8).data


def datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def write_json(path: Path, obj: Any) -> None:
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
