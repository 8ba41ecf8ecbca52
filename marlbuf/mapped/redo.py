"""The redo log of a memory-mapped folder (format 4): record and header layout, reading a
record back, and the :class:`LogDamaged` errors that say why a log does not vouch for its
table."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marlbuf._kernels.checksum import (
    RECORD_HEAD_WORDS,
    RECORD_MAGIC,
    RECORD_TAIL_WORDS,
    TRAILER_MAGIC,
    checksum,
    payload_checksum,
)
from marlbuf.mapped.files import (
    CHECKPOINT,
    read_into,
)

#: Log format 4: a record's header and trailer (see :mod:`marlbuf._kernels.checksum`)
RECORD_HEADER_BYTES = 8 * RECORD_HEAD_WORDS  # 96


RECORD_TRAILER_BYTES = 8 * RECORD_TAIL_WORDS  # 72


#: record flag: the call marked steps as truncated (``truncated=``), which the episode index of
#: sequence and episode samplers reads
CUT = 1


#: an empty int64 array (a record without streams or truncation flags)
NO_STREAMS = np.zeros(0, dtype=np.int64)


#: Log header (format 4): magic, checkpoint number, checkpoint id, folder id, state; then the
#: checksum (2 words) of these five words; 64 bytes in all
LOG_HEADER_BYTES = 64


LOG_MAGIC = int.from_bytes(b"MBUFLOG4", "little")


#: log header states: records may follow; none do (a clean mark, cleared by the first write)
WRITING, CLEAN = 0, 1


#: The log is reserved (and grows) in whole units of this many bytes.
LOG_UNIT_BYTES = 1 << 20


class LogDamaged(ValueError):
    """The redo log of a memory-mapped folder does not vouch for the rows in its table (missing,
    truncated, damaged, or following another checkpoint): the message says what was found."""


def read_record(
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
    expected = steps * row_words + (steps if stream < 0 else 0) + (steps if flags & CUT else 0)
    if steps < 1 or stream < -1 or flags & ~CUT or payload != expected:
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
    cut = np.empty(steps if flags & CUT else 0, dtype=np.int64)
    read_into(fd, offset + RECORD_HEADER_BYTES, [rows, streams, cut])
    if tuple(payload_checksum(rows, streams, cut)) != (head[8], head[9]):
        return "is whole but its rows fail their checksum (damaged)"
    return rows, steps, stream, streams, (cut != 0) if flags & CUT else None, size


def later_record(fd: int, offset: int, end: int, ident: int, seq: int) -> bool:
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


def unaccounted(
    folder: Path,
    checkpoint_number: int,
    problems: list[str],
    stamps: np.ndarray,
    expected: np.ndarray,
    ahead: np.ndarray,
    behind: np.ndarray,
    first_writes: int,
    total: int,
    records: int,
) -> LogDamaged:
    """Why the stamps refuse a replayed folder: what opening found wrong with the log
    (``problems``) and the first slot that nothing accounts for."""
    found = "; ".join(problems) or f"its log's {records} records are whole"
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
    return damaged(folder, checkpoint_number, f"{found}, and {evidence}")


def damaged(folder: Path, checkpoint_number: int, what: str) -> LogDamaged:
    """Why a folder whose log does not vouch for its table is not opened."""
    return LogDamaged(
        f"the memory-mapped buffer at {str(folder)!r}: {what}. Its rows cannot be "
        f"proven to hold the steps their write generations name (checkpoint "
        f"{checkpoint_number}), so it is not opened. Put back the log (and the folder's "
        "other files) from the copy this folder came from (a folder is copied whole, while "
        "the buffer is closed), or delete the folder and build the buffer again"
    )


@dataclass(frozen=True)
class LogContext:
    """What replaying a folder's log needs from its store: the folder (for messages) and its
    id, the loaded checkpoint's number and id, the id of the checkpoint before it and whether
    ``close()`` wrote it, the words of a staged row, and the buffer's commit and write-counter
    hooks."""

    folder: Path
    folder_id: int
    number: int
    ident: int
    previous: int
    clean: bool
    row_words: int
    commit: Callable[..., None]
    total_writes: Callable[[], int]


@dataclass
class Replayed:
    """What :func:`replay` found: the records replayed, whether the log's header names the
    loaded checkpoint (``current``) and marks the log clean (``clean``)."""

    records: int = 0
    current: bool = False
    clean: bool = False


def replay(fd: int, log: LogContext, problems: list[str]) -> Replayed:
    """Run the records of the log ``fd`` (format 4) that follow the loaded checkpoint through
    the buffer's commit; stop at the first that is not whole, noting what was found in
    ``problems`` (the stamps then decide, :meth:`MappedStore.verify`). Raises
    :class:`LogDamaged` for the log of another folder, a checkpoint older than the log, or a
    damaged record followed by whole ones."""
    found = Replayed()
    end = os.fstat(fd).st_size
    head = np.frombuffer(
        os.pread(fd, LOG_HEADER_BYTES, 0).ljust(LOG_HEADER_BYTES, b"\0"), np.uint64
    )
    if not head.any():
        problems.append(
            f"its log is empty ({end} bytes)"
            if end < LOG_HEADER_BYTES
            else "its log's header is zeroed"
        )
        return found
    magic, number, ident, folder, state = (int(x) for x in head[:5])
    if magic != LOG_MAGIC or tuple(checksum(head[:5])) != (head[5], head[6]):
        problems.append("its log's header is damaged (not a marlbuf log header)")
        return found
    if folder != log.folder_id:
        raise LogDamaged(
            f"the memory-mapped buffer at {str(log.folder)!r} has the log of another folder "
            f"(its folder id {folder} is not {log.folder_id}): put back this folder's own "
            "log (a folder is copied whole, while the buffer is closed), or delete the folder"
        )
    if number > log.number or (number == log.number and ident != log.ident):
        raise LogDamaged(
            f"the memory-mapped buffer at {str(log.folder)!r} has a checkpoint "
            f"({CHECKPOINT}, number {log.number}) older than its log (which "
            f"follows checkpoint {number}): an older {CHECKPOINT} was put in the folder. Put "
            f"back the {CHECKPOINT} that came with this log (a folder is copied whole, while "
            "the buffer is closed)"
        )
    if number != log.number:
        if number == log.number - 1 and ident == log.previous:
            return found  # stopped between the checkpoint and the log's new header: all in it
        problems.append(f"its log follows checkpoint {number}, not this one ({log.number})")
        return found
    found.current = True
    found.clean = state == CLEAN
    if end % LOG_UNIT_BYTES:
        problems.append(
            f"its log is {end} bytes, not a whole number of {LOG_UNIT_BYTES}-byte units (truncated)"
        )
    offset, count = LOG_HEADER_BYTES, 0
    while offset + RECORD_HEADER_BYTES <= end:
        record = read_record(
            fd,
            offset,
            end,
            log.ident,
            count,
            log.total_writes(),
            log.row_words,
        )
        if record is None:
            break  # the end of the log: zeros, or records of an earlier checkpoint
        if isinstance(record, str):
            if later_record(fd, offset, end, log.ident, count):
                raise damaged(
                    log.folder,
                    log.number,
                    f"record {count} of its log (at byte {offset}) {record}, and later "
                    "records follow it",
                )
            problems.append(f"record {count} of its log (at byte {offset}) {record}")
            break
        if state == CLEAN:
            problems.append("its log is marked clean, yet records follow its header")
            break
        rows, steps, stream, streams, cut, size = record
        log.commit(rows, steps, stream if stream >= 0 else streams, cut)
        offset += size
        count += 1
    found.records = count
    return found
