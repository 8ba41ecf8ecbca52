"""marlbuf: performance-tuned replay buffers for multi-agent reinforcement learning.

The buffer needs only NumPy and Numba. Trainers (``marlbuf.algos``), environments
(``marlbuf.envs``), the profiler (``marlbuf.profiling``) and benchmarks (``marlbuf.bench``) are
subpackages with optional dependencies (extras ``[algos]``, ``[envs]``, ``[bench]``).

The names below are imported when first used (``from marlbuf import MultiAgentReplayBuffer``
imports the buffer and what it needs; ``import marlbuf`` alone imports nothing else), and so
are the subpackages (``marlbuf.samplers``, ``marlbuf.algos``): the console script and the
tools that only need the version start without NumPy and Numba.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from marlbuf.version import __version__

#: the public names of the package -> the module that defines each
_EXPORTS = {
    "FIELDS": "marlbuf.spec",
    "AgentSpec": "marlbuf.spec",
    "Batch": "marlbuf.batch",
    "EpisodeBatch": "marlbuf.batch",
    "FieldSpec": "marlbuf.spec",
    "MultiAgentReplayBuffer": "marlbuf.buffer",
    "NextObsDroppedWarning": "marlbuf.buffer",
    "NextObsWarning": "marlbuf.buffer",
    "SequenceBatch": "marlbuf.batch",
    "SlowWriteWarning": "marlbuf.buffer",
    "StreamBreakWarning": "marlbuf.buffer",
    "TorchBatch": "marlbuf.batch",
    "specs_from_env": "marlbuf.spec",
}

if TYPE_CHECKING:
    from marlbuf.batch import Batch, EpisodeBatch, SequenceBatch, TorchBatch
    from marlbuf.buffer import (
        MultiAgentReplayBuffer,
        NextObsDroppedWarning,
        NextObsWarning,
        SlowWriteWarning,
        StreamBreakWarning,
    )
    from marlbuf.spec import FIELDS, AgentSpec, FieldSpec, specs_from_env


def __getattr__(name: str) -> Any:
    """A public name (imported from its module on first use) or a subpackage or module of
    ``marlbuf`` (imported on first use)."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later uses find it without this hook
        return value
    if name.startswith("__"):
        raise AttributeError(f"module 'marlbuf' has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the submodule exists but needs something missing: say what
        raise AttributeError(f"module 'marlbuf' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "FIELDS",
    "AgentSpec",
    "Batch",
    "EpisodeBatch",
    "FieldSpec",
    "MultiAgentReplayBuffer",
    "NextObsDroppedWarning",
    "NextObsWarning",
    "SequenceBatch",
    "SlowWriteWarning",
    "StreamBreakWarning",
    "TorchBatch",
    "__version__",
    "specs_from_env",
]
