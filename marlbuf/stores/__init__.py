"""Stores: where a buffer's rows live and how they are gathered.

The front (:class:`marlbuf.MultiAgentReplayBuffer`) checks, stages, writes the metadata, draws
indices and builds batches once; a store owns the row table and its gathers:

* host NumPy arrays (:mod:`marlbuf.stores.host`, Numba kernels), in RAM or in memory-mapped
  files (:mod:`marlbuf.mapped` supplies the allocator and the redo log);
* torch tensors on a CPU or CUDA device (:mod:`marlbuf.stores.torch`, imported only when a
  buffer is built with ``device=``).

Every store subclasses :class:`marlbuf.stores.base.Storage` and is built from one
:class:`marlbuf.stores.base.StoreOptions`. :data:`STORES` names each store's class; a new store
is one module here plus one line there. :data:`marlbuf.stores.capabilities.CAPABILITIES` lists
what each store offers and why a refusal remains.
"""

from __future__ import annotations

import importlib
from typing import Any

from marlbuf.rows import RowGeometry
from marlbuf.storage import Allocator
from marlbuf.stores.base import Storage, StoreOptions
from marlbuf.writer import NextObsLinks

__all__ = ["STORES", "StoreOptions", "make_store", "store_class"]

#: store name -> ``"module:class"``, imported on first use (torch only for ``device=``). A host
#: store's name is its ``layout=``; ``"torch"`` is the store of every ``device=``.
STORES: dict[str, str] = {
    "interleaved": "marlbuf.stores.host:InterleavedStorage",
    "agent_major": "marlbuf.stores.host:AgentMajorStorage",
    "torch": "marlbuf.stores.torch:TorchStorage",
}


def store_class(name: str) -> type[Storage]:
    """The class of the store registered as ``name`` in :data:`STORES`."""
    if name not in STORES:
        raise ValueError(f"store must be one of {sorted(STORES)}; got {name!r}")
    module, _, cls = STORES[name].partition(":")
    found: type[Storage] = getattr(importlib.import_module(module), cls)
    return found


def make_store(
    layout: str,
    codec: RowGeometry,
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
    """The store of a buffer: host NumPy arrays in ``layout`` (``allocate`` makes them: in
    memory, or mapped files), or with a ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:k"``, a
    ``torch.device``) one torch tensor there (interleaved rows; torch is imported only then).
    ``stores_next_obs=False``: rows without next observations (``next_obs="none"``). The
    arguments are :class:`StoreOptions`' fields."""
    if device is None and (layout == "torch" or layout not in STORES):
        host = sorted(name for name in STORES if name != "torch")
        raise ValueError(f"layout must be one of {host}; got layout={layout!r}")
    options = StoreOptions(
        codec,
        capacity,
        pool_blocks,
        batch_layout,
        links,
        batch_dtype,
        allocate,
        device,
        stores_next_obs,
    )
    return store_class(layout if device is None else "torch")(options)
