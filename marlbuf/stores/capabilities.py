"""What every store offers: one table, read by the buffer's checks and rendered in the docs.

A store is where a buffer's rows live: ``"ram"`` (NumPy arrays in memory), ``"mapped"``
(NumPy arrays in memory-mapped files, ``path=``), ``"torch"`` (one tensor on a CPU or CUDA
device, ``device=``), and ``"sharded"`` (Ray actors, each with a buffer of its own,
:class:`marlbuf.distributed.ShardedReplayBuffer`). Every feature works on every store unless
this table says why not; a refusal names its reason and what to use instead.
"""

from __future__ import annotations

#: the stores, in the order the docs show them
STORES = ("ram", "mapped", "torch", "sharded")

#: feature -> store -> ``None`` (supported) or the reason it is refused (and what to do)
CAPABILITIES: dict[str, dict[str, str | None]] = {
    "extras, global_fields, alive": {"ram": None, "mapped": None, "torch": None, "sharded": None},
    "Sequence sampler": {
        "ram": None,
        "mapped": None,
        "torch": None,
        "sharded": None,
    },
    "layout='agent_major'": {
        "ram": None,
        "mapped": None,
        "torch": "a device table is one tensor of interleaved rows; batch_layout='per_agent' "
        "gives the contiguous per-agent tensors agent_major would (from one gather)",
        "sharded": None,
    },
    "custom Sampler subclasses": {
        "ram": None,
        "mapped": None,
        "torch": None,
        "sharded": "the learner splits each batch across shards by the sampler's global rule "
        "(shard sizes for uniform draws, valid run starts for Neighbor, priority totals for "
        "Prioritized and PrioritizedNeighbor), which exists for those samplers only: another "
        "sampler's draw could not be split exactly; use one MultiAgentReplayBuffer for it",
    },
    "truncated= and extras on writes": {
        "ram": None,
        "mapped": None,
        "torch": None,
        "sharded": None,
    },
    "next_obs / batch_dtype / batch_layout options": {
        "ram": None,
        "mapped": None,
        "torch": None,
        "sharded": None,
    },
    "update_priorities(sync=False), update_priorities_for_trainers": {
        "ram": None,
        "mapped": None,
        "torch": None,
        "sharded": None,
    },
    "loading another next_obs format": {
        "ram": None,
        "mapped": None,
        "torch": None,
        "sharded": None,
    },
    "path=": {
        "ram": None,
        "mapped": None,
        "torch": "a device table is not memory-mapped; save() the buffer and load(path, "
        "device=...) it, or keep a mapped buffer on the host and move batches with "
        "Batch.to_torch",
        "sharded": "shards keep their rows in their actors' memory (a shard that dies loses "
        "its process, and with it any mapping); save(folder) checkpoints every shard and "
        "restart_shard(k) or ShardedReplayBuffer.load(folder) restores them",
    },
    "parallel_gather=True": {
        "ram": None,
        "mapped": None,
        "torch": "it selects Numba threads of the host gather; a torch store gathers with "
        "torch kernels: leave parallel_gather=False",
        "sharded": None,
    },
}


def refusal(feature: str, store: str, given: str) -> str:
    """The error message for ``feature`` on ``store`` (``given``: how the store was chosen,
    e.g. ``"device='cuda'"``)."""
    reason = CAPABILITIES[feature][store]
    if reason is None:
        raise ValueError(f"{feature} is supported on the {store} store")
    return f"{feature} is not available with {given} ({store} store): {reason}"


def markdown_table() -> str:
    """:data:`CAPABILITIES` as a Markdown table (what ``docs/architecture.md`` shows)."""
    lines = ["| feature | " + " | ".join(STORES) + " |", "|---" * (len(STORES) + 1) + "|"]
    for feature, stores in CAPABILITIES.items():
        cells = ["yes" if stores[s] is None else "no (see below)" for s in STORES]
        lines.append(f"| {feature} | " + " | ".join(cells) + " |")
    reasons = [
        f"- **{feature}, {store}:** {reason}"
        for feature, stores in CAPABILITIES.items()
        for store, reason in stores.items()
        if reason is not None
    ]
    return "\n".join([*lines, "", *reasons]) + "\n"
