"""``read_vault(path=...)``: a conversion larger than memory, into a memory-mapped buffer, that
resumes after an interruption.

The buffer is filled in a work folder beside the target (``.<name>.vault-import``) with a
journal (vault fingerprint, plan, options); each ``extend`` is one redo-log record, so the
reopened buffer holds whole calls and its ``total_writes`` says where to continue. After each
chunk the mapped pages and the C heap go back to the OS. The work folder becomes the target only
when complete.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.offline.fill import fill
from marlbuf.offline.plan import Plan
from marlbuf.offline.vault import VaultInfo, VaultReader
from marlbuf.spec import FieldSpec

#: Name and version of the journal of a conversion into a memory-mapped buffer.
JOURNAL = "import.json"
JOURNAL_FORMAT = "marlbuf-vault-import"


def _fingerprint(info: VaultInfo) -> str:
    digest = hashlib.sha256((info.path / "metadata.json").read_bytes())
    digest.update(f"{info.steps}/{info.streams}".encode())
    return digest.hexdigest()


def _json_safe(value: Any) -> Any:
    """Buffer options as the journal records them (objects by their representation)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    config = getattr(value, "config", None)
    if callable(config):
        return {"type": type(value).__name__, "config": _json_safe(config())}
    if isinstance(value, FieldSpec):
        return value.to_dict()
    return repr(value)


def fill_folder(
    info: VaultInfo,
    plan: Plan,
    target: Path,
    capacity: int,
    options: dict[str, Any],
    reader: VaultReader,
    side_rows: int,
    chunk_steps: int,
    progress: Any,
    resume: bool,
) -> MultiAgentReplayBuffer:
    """:func:`read_vault` into a memory-mapped buffer at ``target``, through a work folder."""
    target = target.absolute()
    if target.exists() or target.is_symlink():
        raise FileExistsError(
            f"{str(target)!r} already exists; read_vault(path=...) converts into a new folder "
            "(open a converted buffer with MultiAgentReplayBuffer.open)"
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"the parent folder of path={str(target)!r} does not exist")
    work = target.parent / f".{target.name}.vault-import"
    journal = {
        "format": JOURNAL_FORMAT,
        "version": 1,
        "vault": str(info.path),
        "fingerprint": _fingerprint(info),
        "chunk_steps": chunk_steps,
        "capacity": int(capacity),
        "plan": plan.to_json(),
        "options": _json_safe(
            {k: v for k, v in options.items() if k not in ("durable", "parallel_gather")}
        ),
    }
    runtime: dict[str, Any] = {
        k: options[k] for k in ("durable", "parallel_gather") if k in options
    }
    if work.exists() or work.is_symlink():
        if not resume:
            raise FileExistsError(
                f"{str(work)!r} holds an unfinished conversion into {str(target)!r}; pass "
                "resume=True to continue it, or delete that folder to start again"
            )
        found = _read_journal(work)
        if found != journal:
            differs = sorted(k for k in set(found) | set(journal) if found.get(k) != journal.get(k))
            raise ValueError(
                f"{str(work)!r} holds an unfinished conversion of {found.get('vault')!r} with "
                f"other settings ({', '.join(differs)} differ); finish it with the arguments it "
                "was started with, or delete that folder to start again"
            )
    else:
        work.mkdir()
        tmp = work / (JOURNAL + ".tmp")
        tmp.write_text(json.dumps(journal))
        os.replace(tmp, work / JOURNAL)
    _fill_work(
        info,
        plan,
        work / "buffer",
        capacity,
        options,
        runtime,
        reader,
        side_rows,
        chunk_steps,
        progress,
    )
    gc.collect()  # the filled buffer's metadata is gone before the complete buffer's is loaded
    _trim_heap()
    os.replace(work / "buffer", target)
    (work / JOURNAL).unlink()
    work.rmdir()
    buffer = MultiAgentReplayBuffer.open(target, **runtime)
    _trim_heap()  # what loading its checkpoint freed
    return buffer


def _fill_work(
    info: VaultInfo,
    plan: Plan,
    folder: Path,
    capacity: int,
    options: dict[str, Any],
    runtime: dict[str, Any],
    reader: VaultReader,
    side_rows: int,
    chunk_steps: int,
    progress: Any,
) -> None:
    """Fill (or continue filling) the memory-mapped buffer of the work folder, then close it."""
    if (folder / "manifest.json").exists():
        buffer = MultiAgentReplayBuffer.open(folder, **runtime)
    else:
        buffer = MultiAgentReplayBuffer(plan.specs, capacity, path=folder, **options)

    def after_chunk() -> None:
        # resident memory follows the chunk, not the vault: the mapped files' pages go back
        # to the OS, and so does the C heap that decoding and staging freed
        buffer.release_pages()
        _trim_heap()

    try:
        fill(
            info,
            plan,
            buffer,
            reader,
            side_rows,
            chunk_steps,
            buffer.total_writes,
            progress,
            after_chunk,
        )
    finally:
        buffer.close()  # everything written so far is kept: an interrupted call continues


def _trim_heap() -> None:
    """Return the C heap's free memory to the OS (glibc's ``malloc_trim``; nothing elsewhere):
    the chunks that TensorStore's threads decoded and staging copied are freed into malloc's
    arenas, which keep them resident otherwise."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _read_journal(work: Path) -> dict[str, Any]:
    path = work / JOURNAL
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1024**2 + 1)
        found = json.loads(raw.decode()) if len(raw) <= 1024**2 else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{str(work)!r} is not an unfinished conversion (its {JOURNAL} cannot be read: "
            f"{exc}); delete that folder to start again"
        ) from exc
    if not isinstance(found, dict) or found.get("format") != JOURNAL_FORMAT:
        raise ValueError(f"{str(work)!r} is not an unfinished vault conversion; delete it")
    return found
