"""The MADDPG sampling workload (the paper's Fig. 8 and 14 views).

Per round, each of the N trainers draws one index array of B = 1024 and gathers obs, action,
reward, next_obs and done of **all** agents at it — the O(N²B) pattern. Compared side by side in
one process, repeats interleaved:

* ``list_of_tuples`` — openai/maddpg's buffer (the paper's baseline), ``make_index`` +
  ``sample_index`` per agent;
* ``numpy_per_agent`` — preallocated per-agent arrays, fancy indexing (a strong baseline);
* marlbuf ``agent_major`` and ``interleaved`` layouts × ``uniform`` and ``neighbor`` samplers
  through ``sample_for_trainers``, with fresh output arrays each round and with ``out=`` reuse;
  ``uniform`` cases draw in draw order (``Uniform(order="random")``), ``uniform_memory`` cases
  the same distribution in ascending slot order (``Uniform()``'s default).

Also measured: the *copy floor* — one contiguous ``memcpy`` per trainer of exactly the bytes its
batch gathers, timed in the same interleaved repeats as the cases (so machine noise hits it
alike) — and this machine's copy bandwidth with the floor it implies (useful bytes gathered /
bandwidth).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.baselines.numpy_buffers import ListOfTuplesBuffer, NumpyPerAgentBuffer
from marlbuf.bench.suites.memory import half_specs
from marlbuf.bench.tools.common import (
    copy_bandwidth,
    markdown_table,
    quiet_threads,
    time_interleaved,
)
from marlbuf.memory import estimate
from marlbuf.reading import Reader
from marlbuf.samplers import Neighbor, Sampler, Uniform
from marlbuf.storage import BlockPool
from marlbuf.workloads import PAPER_WORKLOADS, Workload, episode_steps

SUITE = "sampling"
BATCH = 1024
FILL_CHUNK = 5_000


def draw_order() -> Sampler:
    """Uniform in draw order: the sampler of the ``uniform`` cases."""
    return Uniform(order="random")


def memory_order() -> Sampler:
    """Uniform in ascending slot order: the sampler of the ``uniform_memory`` cases."""
    return Uniform(order="memory")


#: marlbuf cases: name -> (layout, sampler factory, variant, storage). Variants: "" (defaults:
#: serial kernels, pooled batch memory, the ``sample_for_trainers`` round), "out" (``out=``
#: reuse of the previous round's batches), "parallel" (the opt-in threaded gather), "stream" (the
#: round as ``iter_trainers``, each batch dropped before the next is drawn, as a MADDPG learner
#: consumes it), "per_agent" (``batch_layout="per_agent"``: contiguous per-agent arrays from the
#: same gather); the lock's cost is measured pairwise by the ``concurrency`` suite.
#: Storage: "dense" (every row holds next_obs, float32: the 0.1 format), "lean" (observations
#: stored once), "lean16" (stored once, float16 observations, float32 batches converted in the
#: gather), "lean16s" (the same, batches in storage precision).
MARLBUF_CASES: dict[str, tuple[str, Callable[[], Sampler], str, str]] = {
    "agent_major+uniform": ("agent_major", draw_order, "", "dense"),
    "agent_major+neighbor64": ("agent_major", lambda: Neighbor(64), "", "dense"),
    "interleaved+uniform": ("interleaved", draw_order, "", "dense"),
    "interleaved+uniform_memory": ("interleaved", memory_order, "", "dense"),
    "interleaved+neighbor16": ("interleaved", lambda: Neighbor(16), "", "dense"),
    "interleaved+neighbor64": ("interleaved", lambda: Neighbor(64), "", "dense"),
    "interleaved+uniform+out": ("interleaved", draw_order, "out", "dense"),
    "interleaved+uniform+parallel": ("interleaved", draw_order, "parallel", "dense"),
    "interleaved+neighbor64+parallel": ("interleaved", lambda: Neighbor(64), "parallel", "dense"),
    "interleaved+uniform+stream": ("interleaved", draw_order, "stream", "dense"),
    "interleaved+uniform+per_agent": ("interleaved", draw_order, "per_agent", "dense"),
    "lean+uniform": ("interleaved", draw_order, "", "lean"),
    "lean+uniform_memory": ("interleaved", memory_order, "", "lean"),
    "lean+uniform+stream": ("interleaved", draw_order, "stream", "lean"),
    "lean16+uniform+stream": ("interleaved", draw_order, "stream", "lean16"),
    "lean16s+uniform+stream": ("interleaved", draw_order, "stream", "lean16s"),
    "lean16+neighbor64+stream": ("interleaved", lambda: Neighbor(64), "stream", "lean16"),
    "lean16s+neighbor64+stream": ("interleaved", lambda: Neighbor(64), "stream", "lean16s"),
}

#: storage -> (next_obs, half-precision observations, batch_dtype)
STORAGES: dict[str, tuple[str, bool, str]] = {
    "dense": ("stored", False, "float32"),
    "lean": ("once", False, "float32"),
    "lean16": ("once", True, "float32"),
    "lean16s": ("once", True, "storage"),
}


QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("cooperative_navigation", 6)],
    "capacity": 20_000,
    "repeats": 3,
}
FULL: dict[str, Any] = {"workloads": PAPER_WORKLOADS, "capacity": 100_000, "repeats": 5}

#: the largest dense float32 table one workload may take: every case keeps its own copy of
#: the data (five marlbuf storages, per-agent arrays, lists of tuples), so the 24-agent
#: workloads run at a lower capacity (stated in each row) to fit a 24 GiB machine
TABLE_BUDGET_BYTES = 1_500_000_000


def capacity_for(workload: Workload, capacity: int) -> int:
    """``capacity``, lowered (to a multiple of the fill chunk) when the dense table would
    exceed :data:`TABLE_BUDGET_BYTES`."""
    row = estimate(workload.specs(), 1, next_obs="stored").table_row_bytes
    fitting = TABLE_BUDGET_BYTES // row // FILL_CHUNK * FILL_CHUNK
    return int(min(capacity, max(FILL_CHUNK, fitting)))


def _share_storage(
    buf: MultiAgentReplayBuffer, sampler: Sampler, seed: int
) -> MultiAgentReplayBuffer:
    """A second handle on ``buf``'s storage with another sampler (read-only use: the copies'
    write cursors would diverge on writes). Saves one full copy of the data per sampler. Each
    handle gets its own batch memory pool, as a buffer of its own would have: cases sharing one
    pool would evict each other's recycled blocks and pay page faults for it.

    The handle is assembled from the front's parts (the buffer has no public constructor over
    another buffer's rows): its own commit engine holding a copy of the store (for the pool),
    its own sampler and generator, and a reader of its own that reads them; a shallow copy
    alone would keep reading through the original's reader, with the original's sampler.
    """
    other = copy.copy(buf)
    # the store is the commit engine's: the handle gets an engine of its own holding the copy
    other._writes = copy.copy(buf._writes)
    other._writes.storage = copy.copy(buf.storage)
    other.storage.pool = BlockPool(buf.storage.pool.max_blocks)
    other.sampler = sampler
    sampler.bind(buf.capacity, buf.n_trainers)
    other.rng = np.random.default_rng(seed)
    other._reader = Reader(
        lambda: other.storage,
        buf.writer,
        lambda: other.sampler,
        buf.episodes,
        other.rng,
        buf.n_trainers,
        buf.device is not None,
        tuple(buf.specs),
        buf.global_fields,
        buf._codec.field_names,
    )
    return other


def _variant(buf: MultiAgentReplayBuffer, variant: str) -> MultiAgentReplayBuffer:
    """Give a shared-storage handle its batch layout (per_agent)."""
    if variant == "per_agent":
        buf.storage.batch_layout = "per_agent"
        buf.storage._carvings = {}
    return buf


def _fill(workload: Workload, capacity: int, seed: int) -> dict[str, Any]:
    """Build every buffer of one workload, filled with the same transitions: episode streams
    of 25 steps (each next_obs is the next obs except at an episode end), values exact in
    float16."""
    specs = workload.specs()
    rng = np.random.default_rng(seed)
    by_layout = {}
    for layout, storage in dict.fromkeys((c[0], c[3]) for c in MARLBUF_CASES.values()):
        next_obs, half, batch_dtype = STORAGES[storage]
        by_layout[(layout, storage)] = MultiAgentReplayBuffer(
            half_specs(specs) if half else specs,
            capacity,
            layout=layout,
            seed=seed,
            next_obs=next_obs,
            batch_dtype=batch_dtype,
        )
    numpy_buf = NumpyPerAgentBuffer(specs, capacity, seed=seed)
    lists = {a: ListOfTuplesBuffer(capacity, seed=seed + i) for i, a in enumerate(specs)}
    for start in range(0, capacity, FILL_CHUNK):
        steps = min(FILL_CHUNK, capacity - start)
        data = episode_steps(specs, steps, rng, first=start)
        for buf in by_layout.values():
            buf.extend(**data)
        numpy_buf.extend(**data)
        for agent, lst in lists.items():
            obs, act, rew = data["obs"][agent], data["action"][agent], data["reward"][agent]
            nxt, done = data["next_obs"][agent], data["done"][agent]
            for t in range(steps):  # one small array per field per step, as a real loop makes
                lst.add(obs[t].copy(), act[t].copy(), float(rew[t]), nxt[t].copy(), bool(done[t]))
    bufs = {
        name: _variant(_share_storage(by_layout[(layout, storage)], make_sampler(), seed), variant)
        for name, (layout, make_sampler, variant, storage) in MARLBUF_CASES.items()
    }
    floor_bytes = useful_bytes_per_round(workload)
    return {"marlbuf": bufs, "numpy": numpy_buf, "lists": lists, "floor_bytes": floor_bytes}


def _round_fns(buffers: dict[str, Any], n_trainers: int) -> dict[str, Callable[[], Any]]:
    lists: dict[str, ListOfTuplesBuffer] = buffers["lists"]
    agents = list(lists)

    def list_round() -> None:
        for t in range(n_trainers):
            index = lists[agents[t]].make_index(BATCH)
            for agent in agents:
                lists[agent].sample_index(index)

    numpy_buf: NumpyPerAgentBuffer = buffers["numpy"]

    def numpy_round() -> None:
        for _ in range(n_trainers):
            numpy_buf.sample_joint(BATCH)

    fns: dict[str, Callable[[], Any]] = {
        "list_of_tuples": list_round,
        "numpy_per_agent": numpy_round,
        "copy_floor": _copy_floor(buffers["floor_bytes"], n_trainers),
        "bare_row_gather": _bare_gather(buffers["marlbuf"]["lean16+uniform+stream"], n_trainers),
    }
    for name, buf in buffers["marlbuf"].items():
        fns[name] = _marlbuf_round(buf, MARLBUF_CASES[name][2])
    return fns


@njit(cache=True, nogil=True)
def bare_row_gather(table: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = table[indices[i]]`` by a plain Numba loop over the words: the yardstick the
    rounds are measured against (defined here, so that no change to marlbuf's own kernels
    moves it)."""
    width = table.shape[1]
    for i in range(indices.shape[0]):
        row = indices[i]
        for k in range(width):
            out[i, k] = table[row, k]


def _bare_gather(
    buf: MultiAgentReplayBuffer, n_trainers: int, run_length: int = 1
) -> Callable[[], Any]:
    """A bare Numba row-gather loop (:func:`bare_row_gather`) over ``buf``'s stored rows into one
    reused output array, with uniform indices drawn as the buffer draws them: what moving the
    stored bytes costs without batches, next-observation links or conversion (the streaming
    round's yardstick). ``run_length > 1``: runs of that many consecutive rows from uniform
    starts, as ``Neighbor(run_length)`` draws them (the bare kernel's own neighbor gain)."""
    table = buf.storage.arrays()["table"]  # the yardstick reads the stored rows directly
    out = np.empty((BATCH, table.shape[1]), dtype=table.dtype)
    rng = np.random.default_rng(0)
    size = len(buf)
    offsets = np.arange(run_length, dtype=np.int64)
    runs = max(1, BATCH // run_length)

    def round_() -> None:
        for _ in range(n_trainers):
            if run_length == 1:
                indices = rng.integers(0, size, BATCH, dtype=np.int64)
            else:
                starts = rng.integers(0, size - run_length + 1, runs, dtype=np.int64)
                indices = (starts[:, None] + offsets).reshape(-1)
            bare_row_gather(table, indices, out)

    return round_


def _copy_floor(nbytes: int, n_trainers: int) -> Callable[[], Any]:
    """The floor: one contiguous copy per trainer of the bytes its batch gathers (memcpy speed,
    measured in the same interleaved repeats as the cases)."""
    per_trainer = max(1, nbytes // n_trainers // 8)
    src = np.ones((n_trainers, per_trainer), dtype=np.float64)  # distinct pages per trainer
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in

    def copy_round() -> None:
        for t in range(n_trainers):
            np.copyto(dst[t], src[t])

    return copy_round


def _marlbuf_round(buf: MultiAgentReplayBuffer, variant: str) -> Callable[[], Any]:
    previous: list[Any] = []
    reuse = variant == "out"

    def round_() -> None:
        out = previous[0] if (reuse and previous) else None
        # the handles of one layout share their storage: set the kernel choice per round
        buf.storage.parallel_gather = variant == "parallel"
        if variant == "stream":
            for batch in buf.iter_trainers(BATCH):
                del batch  # consumed: its block is free for the next trainer
            return
        batches = buf.sample_for_trainers(BATCH, out=out)
        if reuse:
            previous[:] = [batches]

    return round_


def useful_bytes_per_round(workload: Workload) -> int:
    """Bytes of transition data one round gathers (no padding): N trainers × B × row."""
    row = sum(
        (2 * s.obs_dim + s.action_dim) * s.obs_dtype.itemsize + 2 * 4
        for s in workload.specs().values()
    )
    return workload.n_trainers * BATCH * row


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Measure every case on every workload; returns the JSON payload (see module doc)."""
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    bandwidth = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    for workload in cfg["workloads"]:
        capacity = capacity_for(workload, cfg["capacity"])
        if progress:
            print(f"[sampling] {workload.label}: filling {capacity} steps ...", flush=True)
        buffers = _fill(workload, capacity, seed=0)
        fns = _round_fns(buffers, workload.n_trainers)
        timings = time_interleaved(fns, repeats=cfg["repeats"], warmup=1)
        floor = timings["copy_floor"]["median"]
        base_a = timings["list_of_tuples"]["median"]
        base_b = timings["numpy_per_agent"]["median"]
        uniform = timings["interleaved+uniform"]["median"]
        for case, t in timings.items():
            rows.append(
                {
                    "workload": workload.label,
                    "n_trainers": workload.n_trainers,
                    "capacity": capacity,
                    "case": case,
                    "ms_median": 1e3 * t["median"],
                    "ms_min": 1e3 * t["min"],
                    "ms_max": 1e3 * t["max"],
                    "first_call_ms": 1e3 * t["first_call"],
                    "speedup_vs_list_of_tuples": base_a / t["median"],
                    "speedup_vs_numpy_per_agent": base_b / t["median"],
                    "time_vs_interleaved_uniform": t["median"] / uniform,
                    "x_copy_floor": t["median"] / floor,
                    "floor_ms": 1e3 * floor,
                    "floor_ms_from_bandwidth": 1e3 * useful_bytes_per_round(workload) / bandwidth,
                }
            )
        if progress:
            print(
                f"[sampling] {workload.label}: "
                + ", ".join(f"{k} {1e3 * v['median']:.1f} ms" for k, v in timings.items()),
                flush=True,
            )
        del buffers, fns
        gc.collect()
    summary = _summary(rows)
    return {
        "config": {
            "batch_size": BATCH,
            "capacity": cfg["capacity"],
            "repeats": cfg["repeats"],
            "workloads": [w.label for w in cfg["workloads"]],
            "threads": threads,
            "copy_bandwidth_GBps": bandwidth / 1e9,
        },
        "rows": rows,
        "summary": summary,
        "markdown": markdown_table(
            rows,
            [
                "workload",
                "case",
                "ms_median",
                "speedup_vs_list_of_tuples",
                "speedup_vs_numpy_per_agent",
                "time_vs_interleaved_uniform",
                "x_copy_floor",
            ],
        ),
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline ratios per workload (the targets are set at CN-24)."""
    out: dict[str, Any] = {}
    for label in dict.fromkeys(r["workload"] for r in rows):
        by_case = {r["case"]: r for r in rows if r["workload"] == label}
        iu = by_case["interleaved+uniform"]
        out[label] = {
            "interleaved_uniform_vs_numpy_per_agent": iu["speedup_vs_numpy_per_agent"],
            "interleaved_uniform_vs_list_of_tuples": iu["speedup_vs_list_of_tuples"],
            "interleaved_uniform_x_copy_floor": iu["x_copy_floor"],
            "interleaved_neighbor64_time_vs_uniform": by_case["interleaved+neighbor64"][
                "time_vs_interleaved_uniform"
            ],
            "interleaved_stream_time_vs_uniform": by_case["interleaved+uniform+stream"][
                "time_vs_interleaved_uniform"
            ],
            "interleaved_per_agent_time_vs_uniform": by_case["interleaved+uniform+per_agent"][
                "time_vs_interleaved_uniform"
            ],
            # the same uniform distribution in ascending slot order, per storage
            "dense_memory_order_time_vs_draw_order": by_case["interleaved+uniform_memory"][
                "time_vs_interleaved_uniform"
            ],
            "lean_memory_order_time_vs_draw_order": by_case["lean+uniform_memory"]["ms_median"]
            / by_case["lean+uniform"]["ms_median"],
            "dense_round_vs_lean16_stream": by_case["interleaved+uniform"]["ms_median"]
            / by_case["lean16+uniform+stream"]["ms_median"],
            "dense_round_vs_lean16s_stream": by_case["interleaved+uniform"]["ms_median"]
            / by_case["lean16s+uniform+stream"]["ms_median"],
            "lean16_stream_vs_bare_row_gather": by_case["lean16+uniform+stream"]["ms_median"]
            / by_case["bare_row_gather"]["ms_median"],
            "lean16_neighbor64_time_vs_uniform": by_case["lean16+neighbor64+stream"]["ms_median"]
            / by_case["lean16+uniform+stream"]["ms_median"],
            "lean16s_neighbor64_time_vs_uniform": by_case["lean16s+neighbor64+stream"]["ms_median"]
            / by_case["lean16s+uniform+stream"]["ms_median"],
            "agent_major_neighbor64_time_vs_uniform": by_case["agent_major+neighbor64"]["ms_median"]
            / by_case["agent_major+uniform"]["ms_median"],
            "best_marlbuf_case": min(
                (
                    r
                    for r in by_case.values()
                    if r["case"]
                    not in ("list_of_tuples", "numpy_per_agent", "copy_floor", "bare_row_gather")
                ),
                key=lambda r: r["ms_median"],
            )["case"],
        }
    return out
