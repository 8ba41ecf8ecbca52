"""marlbuf: performance-tuned replay buffers for multi-agent reinforcement learning.

``import marlbuf`` needs only NumPy and Numba. Trainers (``marlbuf.algos``), environments
(``marlbuf.envs``), the profiler (``marlbuf.profiling``) and benchmarks (``marlbuf.bench``) are
subpackages with optional dependencies (extras ``[algos]``, ``[envs]``, ``[bench]``).
"""

from marlbuf.batch import Batch, EpisodeBatch, SequenceBatch, TorchBatch
from marlbuf.buffer import (
    MultiAgentReplayBuffer,
    NextObsWarning,
    SlowWriteWarning,
    StreamBreakWarning,
)
from marlbuf.spec import FIELDS, AgentSpec, FieldSpec, specs_from_env
from marlbuf.version import __version__

__all__ = [
    "FIELDS",
    "AgentSpec",
    "Batch",
    "EpisodeBatch",
    "FieldSpec",
    "MultiAgentReplayBuffer",
    "NextObsWarning",
    "SequenceBatch",
    "SlowWriteWarning",
    "StreamBreakWarning",
    "TorchBatch",
    "__version__",
    "specs_from_env",
]
