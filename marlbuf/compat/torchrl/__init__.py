"""marlbuf inside TorchRL: a storage and samplers for ``TensorDictReplayBuffer`` (extra
``[torchrl]``), so that a TorchRL or BenchMARL training loop keeps its code and swaps its
buffer's parts. See ``docs/torchrl.md``.

* :class:`MarlbufStorage`: ``LazyTensorStorage``'s place. marlbuf's interleaved rows, built
  from the first TensorDict (nested agent groups, ``("next", ...)`` keys, any dtype), next
  observations stored once, one gather per sample, ``path=`` (memory-mapped files) and
  ``device=`` (rows in one tensor on a GPU).
* :class:`MarlbufPrioritizedSampler`: ``PrioritizedSampler``'s place, on marlbuf's float64
  Numba sum-tree: nothing compiled at install, so it works where TorchRL's extension does not
  load (``SumSegmentTreeFp32 is not available``).
* :class:`MarlbufNeighborSampler`, :class:`MarlbufPrioritizedNeighborSampler` and
  :class:`MarlbufUniformSampler` (uniform draws in memory order): marlbuf's samplers inside a
  TorchRL loop.
* :mod:`marlbuf.compat.torchrl.benchmarl`: the same parts in a BenchMARL experiment.

Supported TorchRL versions: :data:`SUPPORTED_TORCHRL` (tested with 0.11.1, which BenchMARL
1.5.2 installs with tensordict 0.11, and 0.14.1 with tensordict 0.14). The module imports
TorchRL's public names from ``torchrl.data.replay_buffers`` (``Storage``, ``TensorStorage``,
``Sampler``, ``PrioritizedSampler``) and ``torchrl.data.replay_buffers.checkpointers``
(``StorageCheckpointerBase``): modules in 0.11, packages since (their ``__init__`` re-exports
the same names). It subclasses ``TensorStorage`` (so replay buffers pick their identity
collate function, as for ``LazyTensorStorage``) and ``PrioritizedSampler`` (so
``TensorDictReplayBuffer.update_tensordict_priority`` feeds priorities back), and overrides
every method of both that touches their internals (``tests/compat/test_compat_torchrl.py`` checks
that no other method of them is inherited).
"""

from __future__ import annotations

try:
    import tensordict  # noqa: F401
    import torchrl
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "marlbuf.compat.torchrl needs TorchRL: pip install 'marlbuf[torchrl]' (with "
        "torch==2.13.0 installed first on CPU-only machines)"
    ) from exc

from marlbuf.compat.torchrl.layout import EXCLUDED_KEYS, TensorDictLayout
from marlbuf.compat.torchrl.samplers import (
    MarlbufNeighborSampler,
    MarlbufPrioritizedNeighborSampler,
    MarlbufPrioritizedSampler,
    MarlbufUniformSampler,
)
from marlbuf.compat.torchrl.storage import (
    MarlbufCheckpointer,
    MarlbufStorage,
    StorageIndexError,
)

#: TorchRL versions this module is tested with (the first and the last tested minor releases;
#: the ones between share the import paths above)
SUPPORTED_TORCHRL = (">=0.11", "<0.15")

TORCHRL_VERSION: str = torchrl.__version__

__all__ = [
    "EXCLUDED_KEYS",
    "SUPPORTED_TORCHRL",
    "TORCHRL_VERSION",
    "MarlbufCheckpointer",
    "MarlbufNeighborSampler",
    "MarlbufPrioritizedNeighborSampler",
    "MarlbufPrioritizedSampler",
    "MarlbufStorage",
    "MarlbufUniformSampler",
    "StorageIndexError",
    "TensorDictLayout",
]
