"""Stores: where a buffer's rows live and how they are gathered.

The front (:class:`marlbuf.MultiAgentReplayBuffer`) checks, stages, writes the metadata, draws
indices and builds batches once; a store owns the row table and its gathers:

* host NumPy arrays (:mod:`marlbuf.storage`, Numba kernels), in RAM or in memory-mapped files
  (:mod:`marlbuf.mapped` supplies the allocator and the redo log);
* torch tensors on a CPU or CUDA device (:mod:`marlbuf.stores.torch`, imported only when a
  buffer is built with ``device=``).

:data:`marlbuf.stores.capabilities.CAPABILITIES` lists what each store offers and why a
refusal remains.
"""

from __future__ import annotations

from typing import Any

from marlbuf.staging import RowCodec
from marlbuf.storage import Allocator, Storage, make_storage
from marlbuf.writer import NextObsLinks

__all__ = ["make_store"]


def make_store(
    layout: str,
    codec: RowCodec,
    capacity: int,
    pool_blocks: int,
    batch_layout: str,
    links: NextObsLinks | None,
    batch_dtype: str,
    allocate: Allocator | None = None,
    device: Any = None,
    *,
    stores_next_obs: bool = True,
) -> Storage:
    """The store of a buffer: host NumPy arrays (``allocate`` makes them: in memory, or mapped
    files), or with a ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:k"``, a ``torch.device``) one
    torch tensor there (interleaved rows; torch is imported only then).
    ``stores_next_obs=False``: rows without next observations (``next_obs="none"``)."""
    if device is None:
        return make_storage(
            layout,
            codec.specs,
            capacity,
            pool_blocks,
            codec,
            batch_layout,
            links,
            batch_dtype,
            allocate,
            stores_next_obs=stores_next_obs,
        )
    from marlbuf.stores.torch import TorchStorage

    return TorchStorage(
        codec.specs,
        capacity,
        pool_blocks,
        codec,
        batch_layout,
        links,
        batch_dtype,
        device,
        stores_next_obs=stores_next_obs,
    )
