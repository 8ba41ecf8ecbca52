"""Redo logs of folders written by earlier versions (manifest versions 1 to 3: log formats 1
to 3), replayed by their own rules when such a folder is opened; a writer then rewrites the
folder in this version's format."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from marlbuf._kernels.checksum import (
    record_checksum,
)
from marlbuf.mapped.files import (
    CHECKPOINT,
    as_bytes,
    read_into,
)
from marlbuf.mapped.redo import (
    CUT,
    LOG_HEADER_BYTES,
    LOG_UNIT_BYTES,
    LogContext,
    LogDamaged,
)

#: Log format 3 (folders of manifest version 3): record header (magic, checkpoint number,
#: sequence number, steps, stream, rows, payload bytes, payload checksum, flags; then CRC-32),
#: trailer (magic, sequence number, header CRC-32) and log header (magic, checkpoint number,
#: checkpoint id; then CRC-32)
RECORD_V3 = struct.Struct("<8sQQqqqQQQ")


HEADER_CRC = struct.Struct("<I")


RECORD_V3_BYTES = RECORD_V3.size + HEADER_CRC.size  # 76


_MAGIC_V3 = b"MBUFREC3"


_TRAILER_V3 = struct.Struct("<8sQI4x")


_TRAILER_MAGIC_V3 = b"MBUFEND1"


LOG_HEADER_V3 = struct.Struct("<8sQQ")


LOG_MAGIC_V3 = b"MBUFLOGH"


#: Records of format versions 1-2: the same fields with a CRC-32 of the payload, no trailer.
LEGACY_RECORD = struct.Struct("<8sQQqqqQI")


_LEGACY_MAGIC = b"MBUFLOG1"


def parse_header(
    head: bytes, number: int, seq: int, row_words: int, layout: struct.Struct = RECORD_V3
) -> tuple[int, int, int, int, int, int] | None:
    """``(steps, stream, rows, payload bytes, payload checksum, flags)`` of a record header
    (of ``layout``: this version's or the legacy one, whose flags are 0) that is whole and
    belongs to checkpoint ``number`` at sequence number ``seq``; else ``None``."""
    if len(head) < layout.size + HEADER_CRC.size:
        return None
    fields = layout.unpack_from(head)
    magic, rec_number, rec_seq, steps, stream, n_rows, nbytes, crc = fields[:8]
    flags = fields[8] if len(fields) > 8 else 0
    (head_crc,) = HEADER_CRC.unpack_from(head, layout.size)
    expected = (
        n_rows * row_words * 8
        + (n_rows * 8 if stream < 0 else 0)
        + (n_rows * 8 if flags & CUT else 0)
    )
    if (
        magic != (_MAGIC_V3 if layout is RECORD_V3 else _LEGACY_MAGIC)
        or zlib.crc32(head[: layout.size]) != head_crc
        or rec_number != number
        or rec_seq != seq
        or steps != n_rows
        or n_rows < 0
        or nbytes != expected
        or flags & ~CUT
    ):
        return None
    return steps, stream, n_rows, nbytes, crc, flags


def read_payload(
    fd: int, offset: int, n_rows: int, stream: int, row_words: int, flags: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.empty((n_rows, row_words), dtype=np.uint64)
    streams = np.empty(n_rows if stream < 0 else 0, dtype=np.int64)
    cut = np.empty(n_rows if flags & CUT else 0, dtype=np.int64)
    read_into(fd, offset, [rows, streams, cut])
    return rows, streams, cut


def read_record_v3(
    fd: int, offset: int, end: int, number: int, seq: int, row_words: int
) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray | None, int] | str | None:
    """The record at ``offset``: ``(rows, steps, stream, streams, truncated, bytes)``
    (``truncated``: shape (steps,) bool, or ``None`` when the call marked none); ``None`` at the
    end of the log (zeros, or a whole record of an earlier checkpoint); else what is wrong:
    ``"torn"`` (no whole header, or no trailer: cut short) or a description of the damage."""
    head = os.pread(fd, RECORD_V3_BYTES, offset)
    if not any(head):
        return None
    magic, rec_number, rec_seq, *_ = RECORD_V3.unpack_from(head)
    (head_crc,) = HEADER_CRC.unpack_from(head, RECORD_V3.size)
    whole = magic == _MAGIC_V3 and zlib.crc32(head[: RECORD_V3.size]) == head_crc
    if whole and rec_number < number:
        return None  # a record of an earlier checkpoint: the end of this one's
    if whole and rec_number == number and rec_seq != seq:
        return f"has sequence number {rec_seq}, not {seq}: records are missing"
    parsed = parse_header(head, number, seq, row_words)
    if parsed is None:
        return "torn" if not whole else "has a header that does not fit its rows"
    steps, stream, n_rows, nbytes, crc, flags = parsed
    size = RECORD_V3_BYTES + nbytes + _TRAILER_V3.size
    if offset + size > end:
        return f"runs past the end of the log ({end} bytes): the log was truncated"
    trailer = os.pread(fd, _TRAILER_V3.size, offset + size - _TRAILER_V3.size)
    t_magic, t_seq, t_crc = _TRAILER_V3.unpack(trailer)
    if t_magic != _TRAILER_MAGIC_V3 or t_seq != seq or t_crc != head_crc:
        return "torn"  # the record was cut short: its call never reached the table
    rows, streams, cut = read_payload(
        fd, offset + RECORD_V3_BYTES, n_rows, stream, row_words, flags
    )
    if _payload_checksum_v3(rows, streams, cut) != crc:
        return "is complete but its rows fail their checksum (damaged)"
    return rows, steps, stream, streams, (cut != 0) if flags & CUT else None, size


def later_record_v3(fd: int, offset: int, end: int, number: int, seq: int) -> bool:
    """Whether a whole record header of checkpoint ``number`` with a sequence number above
    ``seq`` lies after ``offset`` (then a bad record there is damage, not a torn end)."""
    chunk = 8 << 20
    position = offset + 1
    while position < end:
        data = os.pread(fd, min(chunk + RECORD_V3_BYTES, end - position), position)
        at = data.find(_MAGIC_V3)
        while at >= 0:
            head = data[at : at + RECORD_V3_BYTES]
            if len(head) == RECORD_V3_BYTES:
                _, rec_number, rec_seq, *_ = RECORD_V3.unpack_from(head)
                (crc,) = HEADER_CRC.unpack_from(head, RECORD_V3.size)
                if (
                    zlib.crc32(head[: RECORD_V3.size]) == crc
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


def replay_v3(fd: int | None, log: LogContext) -> int:
    """Replay a log of format 3 (manifest version 3; ``fd`` is ``None`` when it is missing),
    by that version's rules: after an unclean close the log must follow this checkpoint and
    hold whole records (a record without trailer at its end is the call in flight, dropped);
    else :class:`LogDamaged`. A clean checkpoint needs no log. Returns the records replayed."""
    clean, previous = log.clean, log.previous
    if fd is None:
        if clean:
            return 0
        raise damaged_v3(log, "its log is missing")
    end = os.fstat(fd).st_size
    number, ident = log.number, log.ident
    head = os.pread(fd, LOG_HEADER_BYTES, 0) if end else b""
    if len(head) < LOG_HEADER_BYTES or not any(head):
        if clean:
            return 0  # closed cleanly: the log was emptied
        raise damaged_v3(log, f"its log is empty ({end} bytes: truncated or replaced)")
    magic, log_number, log_id = LOG_HEADER_V3.unpack_from(head)
    (crc,) = HEADER_CRC.unpack_from(head, LOG_HEADER_V3.size)
    if magic != LOG_MAGIC_V3 or zlib.crc32(head[: LOG_HEADER_V3.size]) != crc:
        raise damaged_v3(log, "its log's header is damaged (not a marlbuf log header)")
    if log_number > number or (log_number == number and log_id != ident):
        raise ValueError(
            f"the memory-mapped buffer at {str(log.folder)!r} has a checkpoint "
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
        raise damaged_v3(
            log,
            f"its log follows checkpoint {log_number}, not this one ({number}): the log "
            "that followed this checkpoint is missing",
        )
    if end % LOG_UNIT_BYTES:
        raise damaged_v3(
            log,
            f"its log is {end} bytes, not a whole number of {LOG_UNIT_BYTES}-byte units "
            "(a log is always reserved so): it was truncated",
        )
    offset, count = LOG_HEADER_BYTES, 0
    while offset + RECORD_V3_BYTES <= end:
        record = read_record_v3(fd, offset, end, number, count, log.row_words)
        if record is None:
            break  # the end of the log: zeros, or records of an earlier checkpoint
        if isinstance(record, str):
            if record == "torn" and not later_record_v3(fd, offset, end, number, count):
                break  # the call in flight when the process died: it never reached the table
            raise damaged_v3(
                log,
                f"record {count} of its log (at byte {offset}) {record}"
                if record != "torn"
                else f"record {count} of its log (at byte {offset}) is incomplete but "
                "later records follow it (damaged)",
            )
        rows, steps, stream, streams, cut, size = record
        log.commit(rows, steps, stream if stream >= 0 else streams, cut)
        offset += size
        count += 1
    return count


def replay_legacy(fd: int | None, log: LogContext) -> int:
    """Replay a log of format version 1-2 (records from byte 0, no header or trailers; ``fd``
    is ``None`` when it is missing), stopping at the first incomplete record, as those versions
    did. Returns the records replayed."""
    if fd is None:
        return 0
    end = os.fstat(fd).st_size
    offset = count = 0
    head_bytes = LEGACY_RECORD.size + HEADER_CRC.size
    while offset + head_bytes <= end:
        head = os.pread(fd, head_bytes, offset)
        parsed = parse_header(head, log.number, count, log.row_words, LEGACY_RECORD)
        if parsed is None or offset + head_bytes + parsed[3] > end:
            break
        steps, stream, n_rows, nbytes, crc, _ = parsed
        rows, streams, _ = read_payload(fd, offset + head_bytes, n_rows, stream, log.row_words, 0)
        if zlib.crc32(as_bytes(streams), zlib.crc32(as_bytes(rows))) != crc:
            break
        log.commit(rows, steps, stream if stream >= 0 else streams, None)
        offset += head_bytes + nbytes
        count += 1
    return count


def damaged_v3(log: LogContext, what: str) -> LogDamaged:
    """Why a folder of version 3 that was not closed cleanly is not opened."""
    return LogDamaged(
        f"the memory-mapped buffer at {str(log.folder)!r} was not closed cleanly and "
        f"{what}. Its table may hold rows written after checkpoint {log.number} "
        "that nothing describes any more, so it is not opened (replaying what remains would "
        "give rows that do not hold the steps their write generations name). Put back the "
        "log from the copy this folder came from (the folder must be copied whole), or "
        "delete the folder and build the buffer again"
    )
