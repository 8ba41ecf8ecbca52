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

from marlbuf.mapped.files import (
    CHECKPOINT,
    FORMAT,
    FORMAT_VERSION,
    LOCK,
    LOG,
    MANIFEST,
    READABLE_FORMAT_VERSIONS,
    STAMPS,
)
from marlbuf.mapped.hooks import BufferHooks
from marlbuf.mapped.redo import (
    LOG_HEADER_BYTES,
    LOG_UNIT_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_TRAILER_BYTES,
    LogDamaged,
)
from marlbuf.mapped.store import MappedStore, recover, resident

__all__ = [
    "CHECKPOINT",
    "FORMAT",
    "FORMAT_VERSION",
    "LOCK",
    "LOG",
    "LOG_HEADER_BYTES",
    "LOG_UNIT_BYTES",
    "MANIFEST",
    "READABLE_FORMAT_VERSIONS",
    "RECORD_HEADER_BYTES",
    "RECORD_TRAILER_BYTES",
    "STAMPS",
    "BufferHooks",
    "LogDamaged",
    "MappedStore",
    "recover",
    "resident",
]
