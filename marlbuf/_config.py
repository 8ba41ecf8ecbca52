"""Tunables, in one place (never literals inside kernels)."""

from __future__ import annotations

#: Interleaved rows are padded to a multiple of this many bytes (one cache line), so that a row
#: never shares a line with its neighbour and every row starts on a line boundary.
ROW_ALIGN_BYTES = 64

#: Storage arrays start on a page boundary. NumPy's default placement of large arrays is 16 bytes
#: past a cache line here, which makes random rows straddle one extra line (measured: 1.35x more
#: simulated cache misses for a random gather).
ARRAY_ALIGN_BYTES = 4096

#: Warn when a buffer will use more than this fraction of the memory the OS reports available.
MEMORY_WARN_FRACTION = 0.8

#: A buffer with observations stored once warns (``NextObsWarning``) once it holds at least this
#: many steps and more than half of them keep their next_obs in the side table.
SIDE_TABLE_WARN_ROWS = 1024

#: File format written by ``MultiAgentReplayBuffer.save``; bump on incompatible changes.
SAVE_FORMAT = "marlbuf-buffer"
SAVE_VERSION = 4
#: version 1 (marlbuf 0.1): next observations stored in every row, no word-aligned sections;
#: version 2: no extra fields, global fields or alive masks (their rows are laid out as in 3);
#: version 3: an episode index without the stream-break record of its open streams (taken from
#: the stored rows on load where they still hold it)
READABLE_SAVE_VERSIONS = (1, 2, 3, 4)

#: Sequence sampling: slots whose sequences are walked at once when the starts of a loaded
#: state are recomputed (bounds the temporary slot matrix to this many entries).
SEQUENCE_REBUILD_SLOTS = 1 << 22

#: Batched MADDPG trainer: rows (trainers x batch) per chunk of the target-actor pass, so that
#: its (agents, rows, hidden) activations stay in cache (the pass touches agents^2 * batch rows).
TARGET_CHUNK_ROWS = 4096

#: Priority-tree searches and updates prefetch the tree line a target (or updated leaf) this
#: many places later in the batch will read at the same level.
SEARCH_PREFETCH_AHEAD = 16

#: Prioritized-locality sampling searches its reference slots in chunks of at least this many
#: (one tree level at a time, so the cache misses of a chunk overlap); unused ones are dropped.
SEARCH_CHUNK_MIN = 32

#: With ``parallel_gather=True``, a gather uses Numba's threads only when its output is at least
#: this large: measured on a quiet 2-core VM, 28 KB rows x 1024 (29 MB) gathered 1.4x faster on
#: two threads, while 576-byte rows x 1024 (0.6 MB) were 0.9x (thread start-up dominates).
PARALLEL_GATHER_MIN_BYTES = 4 * 1024 * 1024

#: Row gathers prefetch the rows they will copy next (``_kernels.memops``): rows whose first
#: bytes are this far ahead of the row being copied (at least one row), and at most
#: ``PREFETCH_LINES`` cache lines of each (the hardware follows a long row once started).
PREFETCH_AHEAD_BYTES = 4096
PREFETCH_LINES = 16

#: Row gathers write whole output lines with non-temporal (streaming) stores when the batch
#: block is at least this large: such a block does not stay in the cache anyway, and a plain
#: store first reads each output line into the cache (read-for-ownership), moving its bytes
#: twice. Smaller blocks are written through the cache, where the learner then finds them.
STREAMING_STORE_MIN_BYTES = 4 * 1024 * 1024

#: The general gather (per-agent batches, float16 -> float32) copies the rows of a block into a
#: staging area of about this many bytes (kept in cache), then applies its plan to them
#: segment by segment; at least ``GATHER_BLOCK_MIN_ROWS`` rows per block (wide rows: the
#: staging area then fits the second-level cache rather than the first).
GATHER_BLOCK_BYTES = 48 * 1024
GATHER_BLOCK_MIN_ROWS = 16

#: Torch backend (``MultiAgentReplayBuffer(..., device="cuda")``): staged rows travel to the
#: device through two pinned host buffers of this size, used in turn, so that one is filled
#: while the other's copy runs (a larger write is sent in chunks).
DEVICE_STAGING_BYTES = 4 * 1024 * 1024

#: Memory-mapped buffers (``path=``) write a checkpoint of their metadata, and start their redo
#: log afresh, once the log holds this many bytes or the size of the last checkpoint if larger
#: (so checkpoints cost at most about one byte written per byte logged).
MAPPED_LOG_BYTES = 64 * 1024 * 1024

#: ``Uniform(replace=False, order="memory")`` draws a batch of B distinct slots out of ``size``
#: by merging sorted chunks of i.i.d. draws (O(B) while repeats are rare); once B exceeds this
#: fraction of ``size`` the repeats make that slower than one selection-sampling pass over every
#: slot (O(size)), which it then uses. Measured on a 2-core VM: the two cost the same at
#: B / size = 0.2 for B = 256 and 1024 (merging: 13 us at B = 1024 of 1e6 slots).
SELECTION_SAMPLING_FRACTION = 0.2

#: field selections (``fields=`` of a sample or gather) a storage keeps built; a learner uses
#: one or two, so the cache is cleared when a program cycles through more
MAX_FIELD_SELECTIONS = 16

#: A discrete agent's action given as a vector must be probabilities (one-hot included): each
#: in [0, 1], summing to 1 within this (plus 4 ulps of the stored dtype per action when checked
#: as stored). The one-step kernels check the values before they are stored against this alone,
#: so they never accept what the complete checks refuse.
DISCRETE_SUM_TOLERANCE = 1e-3

#: Largest stream id (``stream=``, ``first_stream + k``): stream ids are stored as int64.
MAX_STREAM = 2**63 - 1
#: Largest ``total_writes`` a loaded state may hold (generations stay far from int64 overflow).
MAX_TOTAL_WRITES = 2**62
