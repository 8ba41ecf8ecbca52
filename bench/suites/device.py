"""Device-resident buffers: the MADDPG sampling round on a GPU, and the torch backend on the CPU.

GPU part (needs CUDA; where ``torch.cuda.is_available()`` is False every GPU case is recorded
as not measured, with the reason). Per workload (CN-24 and PP-24+8 at B = 1024), one round =
N trainers x one batch of every agent's fields, delivered as tensors on the GPU; each timed
round ends with ``torch.cuda.synchronize()``:

* ``device buffer`` - ``MultiAgentReplayBuffer(..., device="cuda", next_obs="stored")``,
  ``sample_for_trainers`` (indices drawn and the round gathered on the GPU); ``+out`` reuses the
  previous round's block; ``+prioritized`` with the ``Prioritized`` sampler; ``+obs once`` in
  the default format, observations stored once (lean rows; each next_obs gathered from its
  successor's row or a side row);
* ``host buffer + to_torch`` - the NumPy buffer's round, each batch sent with
  ``to_torch(device, pin_memory=True, non_blocking=True)``;
* ``torchrl`` - TorchRL's ``LazyTensorStorage(device="cuda")`` holding a nested TensorDict
  (``agents/<agent>/<field>``), one ``sample()`` per trainer; ``torchrl prioritized`` - its
  ``TensorDictPrioritizedReplayBuffer`` on the same storage, where its sampler loads.

Prioritized part (same device): the MADDPG pattern of prioritized replay, ``per_trainers``
(8) trainers per round, each drawing ``B`` = 1024 rows with its own priority tree and feeding
``B`` TD errors (on the device) back, at capacities 1e5, 1e6 and 1e7 of CN-3 rows (next_obs
stored in every row). Two operations per case: ``sample + update`` (the round's draws and
gathers, then its updates) and ``update alone`` (the round's updates of fixed indices, applied):

* ``marlbuf index=host`` - ``Prioritized()`` (float64 Numba trees on the host),
  ``sample_for_trainers`` + ``update_priorities_for_trainers(..., sync=False)``: the TD errors
  are copied back without waiting and applied before the next draw (``update alone`` applies
  them at once with ``check_priority_errors()``);
* ``marlbuf index=device`` - ``Prioritized(index="device")`` (float64 sum trees in tensors on
  the device, updated there); recorded as not available where this marlbuf has no such option;
* ``torchrl`` - TorchRL's best prioritized sampler in the installed version: one
  ``LazyTensorStorage(device=...)`` holding a nested TensorDict and one ``PrioritizedSampler``
  per trainer over it (its components directly, no ``ReplayBuffer`` wrapper), with
  ``device=...`` (its CUDA segment trees) where that version has them, else its host trees;
  a round is ``sampler.sample(storage, B)`` + ``storage.get(index)`` per trainer, then
  ``update_priority``. The payload records the sampler, its tree class and TorchRL's version.

A capacity whose buffers (all cases are alive at once) would not fit in 90% of the device's
free memory (``torch.cuda.mem_get_info``), or whose host part (on a CPU run: everything) would
not fit in a quarter of the available RAM, is recorded as not measured with the bytes it needs.

End-to-end part (same device, needs mpe2): seconds per 100 env steps of MADDPG at CN-24, the
environment, action selection, buffer writes and the one update round that falls in every 100
steps included, networks on the device, for
``faithful`` (per-agent loop, per-agent host buffers, mpe2's own environment code: what the
original trainers run), ``baseline`` (the same on marlbuf's vectorized environment),
``marlbuf host buffer`` (batched learner, host buffer, pinned non-blocking copies) and
``marlbuf device buffer`` (batched learner, the round drawn and gathered on the device).

CPU part (always measured): the torch backend with ``device="cpu"`` against the NumPy buffer on
the CN-24 round (uniform, serial NumPy kernels, one torch thread; both with their default batch
memory recycling and with ``out=`` reuse). The target is a ratio of at most 1.3. The NumPy
buffer stores observations once (its default); ``torch backend (cpu)`` keeps next_obs in every
row, ``torch backend (cpu) lean`` stores observations once as well.

Targets (``targets`` in the payload: PASS, FAIL or not measured, with the reason):
``marlbuf index=device`` sample + update at least 3x faster than TorchRL at capacity 1e6 and 5x
at 1e7; the CN-24 device round (uniform, B = 1024) at most 1.2 ms (an absolute time on the GPU
it ran on, the one target that is not a same-run ratio).

Times are medians of interleaved repeats (``bench/tools/common.py``); only ratios measured in
the same process are compared.
"""

from __future__ import annotations

import gc
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.tools.common import check, markdown_table, quiet_threads, time_interleaved
from marlbuf.memory import estimate
from marlbuf.samplers import Prioritized, Uniform
from marlbuf.storage import available_memory_bytes
from marlbuf.workloads import Workload, random_steps

SUITE = "device"
BATCH = 1024
CHUNK = 5_000
#: the CPU comparison's target: torch backend on the CPU / NumPy buffer, CN-24 round
CPU_TARGET = 1.3

QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
    "cpu_workload": Workload("cooperative_navigation", 6),
    "capacity": 20_000,
    "repeats": 3,
    "per_workload": Workload("cooperative_navigation", 3),
    "per_capacities": (20_000, 100_000),
    "per_trainers": 8,
    "per_repeats": 5,
    "e2e_workload": Workload("cooperative_navigation", 3),
    "e2e_capacity": 3_000,
    "e2e_batch": 256,
    "e2e_repeats": 2,
}
FULL: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 24), Workload("predator_prey", 24)],
    "cpu_workload": Workload("cooperative_navigation", 24),
    "capacity": 100_000,
    "repeats": 5,
    "per_workload": Workload("cooperative_navigation", 3),
    "per_capacities": (100_000, 1_000_000, 10_000_000),
    "per_trainers": 8,
    "per_repeats": 20,
    "e2e_workload": Workload("cooperative_navigation", 24),
    "e2e_capacity": 20_000,
    "e2e_batch": BATCH,
    "e2e_repeats": 3,
}
#: the end-to-end configurations (``marlbuf.bench.suites.update`` names) and the devices they add
E2E_CONFIGS: dict[str, dict[str, Any]] = {
    "faithful": {"formulation": "loop", "layout": "agent_major", "env_impl": "mpe2"},
    "baseline": {"formulation": "loop", "layout": "agent_major"},
    "marlbuf host buffer": {"formulation": "batched", "layout": "interleaved"},
    "marlbuf device buffer": {"formulation": "batched", "layout": "interleaved", "on_device": 1},
}
#: the prioritized part's cases and operations (module docstring)
PER_CASES = ("marlbuf index=host", "marlbuf index=device", "torchrl")
PER_OPS = ("sample + update", "update alone")
PER_CHUNK = 50_000  # rows per write while filling the prioritized part's buffers
PER_DISTINCT_CHUNKS = 4  # distinct chunks of random rows, written in turn (filling 1e7 rows)
#: targets: TorchRL's sample + update time over marlbuf index="device"'s, by capacity
PER_TARGETS = {1_000_000: 3.0, 10_000_000: 5.0}
#: target: the device round of this workload (uniform, B = 1024), at most this many ms
ROUND_TARGET = ("CN-24", 1.2)
#: a capacity is measured when it fits in these shares of the free device memory and of the
#: available host RAM
DEVICE_MEMORY_SHARE = 0.9
HOST_MEMORY_SHARE = 0.25
E2E_STEPS = 100

GPU_CASES = (
    "device buffer",
    "device buffer+out",
    "device buffer+prioritized",
    "device buffer+prioritized index=device",
    "device buffer+obs once",
    "host buffer + to_torch(pinned, non_blocking)",
    "torchrl LazyTensorStorage(device)",
    "torchrl prioritized",
)


def gpu_status(device: str = "cuda") -> str | None:
    """``None`` when ``device`` can be used, else why not."""
    try:
        import torch
    except ImportError as exc:
        return f"not measured: torch is not installed ({exc})"
    if device.startswith("cuda") and not torch.cuda.is_available():
        return "not measured: no CUDA device here (torch.cuda.is_available() is False)"
    return None


def _sync(device: str) -> Callable[[], None]:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def _fill(buffers: list[Any], extend_torchrl: list[Any], workload: Workload, capacity: int) -> None:
    """Write the same random transitions into every buffer (marlbuf and TorchRL)."""
    specs = workload.specs()
    rng = np.random.default_rng(0)
    for start in range(0, capacity, CHUNK):
        data = random_steps(specs, min(CHUNK, capacity - start), rng)
        for buf in buffers:
            buf.extend(**data)
        for rb in extend_torchrl:
            rb.extend(_nested_tensordict(data))


def _nested_tensordict(data: dict[str, dict[str, np.ndarray]]) -> Any:
    """``agents/<agent>/<field>`` TensorDict of one chunk (TorchRL's multi-agent layout)."""
    import torch
    from tensordict import TensorDict

    agents = list(data["obs"])
    steps = data["obs"][agents[0]].shape[0]
    per_agent = {
        a: TensorDict(
            {f: torch.from_numpy(np.ascontiguousarray(data[f][a])) for f in data},
            batch_size=[steps],
        )
        for a in agents
    }
    return TensorDict({"agents": TensorDict(per_agent, batch_size=[steps])}, batch_size=[steps])


def _torchrl_buffers(capacity: int, device: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """TorchRL's replay buffers on ``device`` (those that load) and why others do not."""
    made: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    try:
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

        made["torchrl LazyTensorStorage(device)"] = TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity, device=device), batch_size=BATCH
        )
    except Exception as exc:  # not installed or does not load: record and go on
        skipped["torchrl LazyTensorStorage(device)"] = f"{type(exc).__name__}: {exc}"
    try:
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

        made["torchrl prioritized"] = TensorDictPrioritizedReplayBuffer(
            alpha=0.6,
            beta=0.4,
            storage=LazyTensorStorage(capacity, device=device),
            batch_size=BATCH,
        )
    except Exception as exc:  # its sum-tree extension may not match this torch build
        skipped["torchrl prioritized"] = f"{type(exc).__name__}: {exc}"
    return made, skipped


def _gpu_rounds(
    workload: Workload, cfg: dict[str, Any], where: str = "cuda"
) -> tuple[dict[str, Any], dict[str, str]]:
    """Time every GPU case of one workload (on ``where``: ``"cpu"`` only to test the suite)."""
    import torch

    device = torch.device(where)
    specs = workload.specs()
    n, capacity = workload.n_trainers, cfg["capacity"]
    uniform = MultiAgentReplayBuffer(
        specs, capacity, sampler=Uniform(), seed=0, device=where, next_obs="stored"
    )
    per = MultiAgentReplayBuffer(
        specs, capacity, sampler=Prioritized(), seed=0, device=where, next_obs="stored"
    )
    device_index, why_not = prioritized_sampler("device")
    per_device = None
    if device_index is not None:
        per_device = MultiAgentReplayBuffer(
            specs, capacity, sampler=device_index, seed=0, device=where, next_obs="stored"
        )
    lean = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0, device=where)
    host = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0)
    peers, skipped = _torchrl_buffers(capacity, device)
    if why_not is not None:
        skipped["device buffer+prioritized index=device"] = why_not
    ours = [b for b in (uniform, per, per_device, lean, host) if b is not None]
    _fill(ours, list(peers.values()), workload, capacity)
    sync = _sync(where)
    previous: list[Any] = []

    def device_round() -> None:
        uniform.sample_for_trainers(BATCH)
        sync()

    def device_round_out() -> None:
        out = previous[0] if previous else None
        previous[:] = [uniform.sample_for_trainers(BATCH, out=out)]
        sync()

    def prioritized_round() -> None:
        per.sample_for_trainers(BATCH)
        sync()

    def prioritized_device_round() -> None:
        assert per_device is not None
        per_device.sample_for_trainers(BATCH)
        sync()

    def lean_round() -> None:
        lean.sample_for_trainers(BATCH)
        sync()

    def host_round() -> None:
        for batch in host.sample_for_trainers(BATCH):
            batch.to_torch(device, pin_memory=device.type == "cuda", non_blocking=True)
        sync()

    fns: dict[str, Callable[[], Any]] = {
        "device buffer": device_round,
        "device buffer+out": device_round_out,
        "device buffer+prioritized": prioritized_round,
        "device buffer+prioritized index=device": prioritized_device_round,
        "device buffer+obs once": lean_round,
        "host buffer + to_torch(pinned, non_blocking)": host_round,
    }
    if per_device is None:
        del fns["device buffer+prioritized index=device"]
    for name, rb in peers.items():

        def peer_round(rb: Any = rb) -> None:
            for _ in range(n):
                rb.sample()
            sync()

        fns[name] = peer_round
    fns = _working(fns, skipped, lambda name: name)
    return time_interleaved(fns, repeats=cfg["repeats"], warmup=1), skipped


def prioritized_sampler(index: str) -> tuple[Prioritized | None, str | None]:
    """``Prioritized(index=index)``, or ``None`` and why this marlbuf has none (a version
    without the ``index`` option keeps its trees on the host: ``"host"`` is then the default)."""
    options: dict[str, Any] = {"index": index}
    try:
        return Prioritized(**options), None
    except TypeError as exc:
        if index == "host":
            return Prioritized(), None
        return None, f"not available: this marlbuf's Prioritized has no index option ({exc})"


def torchrl_per_samplers(
    capacity: int, count: int, device: Any, storage: Any
) -> tuple[list[Any], dict[str, Any]]:
    """``count`` TorchRL ``PrioritizedSampler``s over ``storage`` (filled), every slot at the
    default priority, on ``device`` where this TorchRL can keep its trees there (else on the
    host), and what they are (``sampler``, ``trees``, ``torchrl`` version, ``tried``)."""
    import torch
    import torchrl
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    base: dict[str, Any] = {"max_capacity": capacity, "alpha": 0.6, "beta": 0.5, "eps": 1e-6}
    attempts: list[dict[str, Any]] = [{}]  # the sampler's own choice for this storage
    if "device" in inspect.signature(PrioritizedSampler.__init__).parameters:
        attempts = [{"device": torch.device(device)}]
        if attempts[0]["device"].type != "cpu":  # CUDA trees first, then the host trees
            attempts.append({"device": torch.device("cpu")})
    tried: list[str] = []
    everything = torch.arange(len(storage))
    for extra in attempts:
        try:
            samplers = [PrioritizedSampler(**base, **extra) for _ in range(count)]
            for sampler in samplers:  # what TorchRL's writer does for written slots
                sampler.extend(everything)
                sampler.mark_update(everything)  # the default (maximum) priority
            samplers[0].sample(storage, 2)  # the first draw picks (and builds) the trees
        except Exception as exc:  # no CUDA trees in this build: record and try the next
            tried.append(f"PrioritizedSampler({extra}): {type(exc).__name__}: {exc}")
            continue
        shown = {k: v for k, v in {**base, **extra}.items() if k != "max_capacity"}
        settings = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return samplers, {
            "sampler": f"PrioritizedSampler({settings})",
            "trees": type(getattr(samplers[0], "_sum_tree", None)).__name__,
            "torchrl": torchrl.__version__,
            "tried": tried,
        }
    raise RuntimeError("; ".join(tried))


def per_bytes_needed(
    workload: Workload, capacity: int, trainers: int, torchrl_trees_on_device: bool
) -> dict[str, int]:
    """Bytes the prioritized part holds at ``capacity`` (every case alive at once), on the
    device and on the host: marlbuf's rows and priority trees (``marlbuf.memory.estimate``),
    TorchRL's unpadded rows and its float32 sum and min trees."""
    specs = workload.specs()
    est = estimate(specs, capacity, next_obs="stored", prioritized=True, n_trainers=trainers)
    trees = est.metadata_bytes - capacity * 8  # the write generations stay on the host
    leaves = 1 << max(0, (capacity - 1).bit_length())
    peer_trees = trainers * 2 * 2 * leaves * 4
    peer_rows = capacity * sum(
        4 * (2 * math.prod(s.obs_shape) + math.prod(s.action_shape) + 2) for s in specs.values()
    )
    device = 2 * est.storage_bytes + trees + peer_rows  # index="device": its trees too
    host = 2 * capacity * 8 + trees  # index="host": its trees
    if torchrl_trees_on_device:
        device += peer_trees
    else:
        host += peer_trees
    return {"device": device, "host": host}


def memory_shortfall(needed: dict[str, int], where: str) -> str | None:
    """``None`` when ``needed`` fits in this machine's memory shares, else why not."""
    gib = 2**30
    ram = available_memory_bytes()
    if where.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(where))
        if needed["device"] > DEVICE_MEMORY_SHARE * free:
            return (
                f"not measured: needs {needed['device'] / gib:.1f} GiB on {where}, "
                f"{free / gib:.1f} GiB free (torch.cuda.mem_get_info)"
            )
        host = needed["host"]
    else:
        host = needed["device"] + needed["host"]  # the device is this host
    if ram is not None and host > HOST_MEMORY_SHARE * ram:
        return (
            f"not measured: needs {host / gib:.1f} GiB of host memory, more than a quarter of "
            f"the {ram / gib:.1f} GiB available"
        )
    return None


def _per_fill(
    buffers: list[Any], storage_writer: Any, workload: Workload, capacity: int, where: str
) -> None:
    """Write ``capacity`` random rows into every marlbuf buffer and into TorchRL's storage on
    ``where`` (through ``storage_writer``, a TorchRL ``ReplayBuffer``): ``PER_DISTINCT_CHUNKS``
    distinct chunks written in turn (the rows' values do not matter to prioritized sampling)."""
    specs = workload.specs()
    rng = np.random.default_rng(0)
    chunk = min(PER_CHUNK, capacity)
    chunks = [random_steps(specs, chunk, rng) for _ in range(PER_DISTINCT_CHUNKS)]
    peer_chunks: list[Any] = []
    if storage_writer is not None:
        peer_chunks = [_nested_tensordict(c).to(where) for c in chunks]
    for number, start in enumerate(range(0, capacity, chunk)):
        steps = min(chunk, capacity - start)
        data = chunks[number % len(chunks)]
        if steps < chunk:
            data = {f: {a: v[:steps] for a, v in per.items()} for f, per in data.items()}
        for buf in buffers:
            buf.extend(**data)
        if peer_chunks:
            storage_writer.extend(peer_chunks[number % len(chunks)][:steps])


def _per_capacity(
    cfg: dict[str, Any], capacity: int, where: str
) -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, Any]]:
    """Time every case of the prioritized part at ``capacity``: ``{"op/case": timing}``, the
    cases not measured with their reasons, and TorchRL's sampler description."""
    import torch

    workload: Workload = cfg["per_workload"]
    trainers = cfg["per_trainers"]
    specs = workload.specs()
    skipped: dict[str, str] = {}
    peer_info: dict[str, Any] = {}
    storage, writer = None, None
    try:
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        storage = LazyTensorStorage(capacity, device=torch.device(where))
        writer = ReplayBuffer(storage=storage)
    except Exception as exc:  # TorchRL not installed, or it does not load with this torch
        skipped["torchrl"] = f"not measured: {type(exc).__name__}: {exc}"
    ours: dict[str, MultiAgentReplayBuffer] = {}
    for case, index in (("marlbuf index=host", "host"), ("marlbuf index=device", "device")):
        sampler, why_not = prioritized_sampler(index)
        if sampler is None:
            skipped[case] = str(why_not)
            continue
        try:
            ours[case] = MultiAgentReplayBuffer(
                specs,
                capacity,
                sampler=sampler,
                n_trainers=trainers,
                seed=0,
                device=where,
                next_obs="stored",
            )
        except Exception as exc:  # recorded in the rows, the other cases go on
            skipped[case] = f"not measured: failed: {type(exc).__name__}: {exc}"
    _per_fill(list(ours.values()), writer, workload, capacity, where)
    samplers: list[Any] = []
    if storage is not None:
        try:
            samplers, peer_info = torchrl_per_samplers(capacity, trainers, where, storage)
        except Exception as exc:  # no sampler of this TorchRL loads: record and go on
            skipped["torchrl"] = f"not measured: {type(exc).__name__}: {exc}"
    sync = _sync(where)
    gen = torch.Generator(device=where).manual_seed(0)
    td = torch.rand(trainers, BATCH, generator=gen, device=where) + 0.01  # |TD| > 0, device

    def marlbuf_ops(buf: MultiAgentReplayBuffer) -> dict[str, Callable[[], None]]:
        fixed = buf.sample_for_trainers(BATCH)
        indices, gens = [b.indices for b in fixed], [b.generations for b in fixed]
        del fixed

        def sample_update() -> None:
            batches = buf.sample_for_trainers(BATCH)
            buf.update_priorities_for_trainers(
                [b.indices for b in batches], td, [b.generations for b in batches], sync=False
            )
            sync()

        def update() -> None:
            buf.update_priorities_for_trainers(indices, td, gens, sync=False)
            buf.check_priority_errors()  # applied (host trees: after the copy to the host)
            sync()

        return {"sample + update": sample_update, "update alone": update}

    def torchrl_ops() -> dict[str, Callable[[], None]]:
        assert storage is not None
        fixed = [s.sample(storage, BATCH)[0] for s in samplers]
        errors = td
        try:  # TD errors as the learner has them, on the device
            samplers[0].update_priority(fixed[0], td[0])
            peer_info["td_errors"] = "passed on the device"
        except Exception as exc:  # a sampler that takes host tensors only: copied here
            errors = td.cpu()
            peer_info["td_errors"] = f"copied to the host first ({type(exc).__name__}: {exc})"

        def sample_update() -> None:
            drawn = []
            for s in samplers:
                index, _ = s.sample(storage, BATCH)
                storage.get(index)  # the batch: every agent's fields at those slots
                drawn.append(index)
            for s, index, err in zip(samplers, drawn, errors):
                s.update_priority(index, err)
            sync()

        def update() -> None:
            for s, index, err in zip(samplers, fixed, errors):
                s.update_priority(index, err)
            sync()

        return {"sample + update": sample_update, "update alone": update}

    fns: dict[str, Callable[[], None]] = {}
    for case, buf in ours.items():
        fns.update({f"{op}/{case}": fn for op, fn in marlbuf_ops(buf).items()})
    if samplers:
        fns.update({f"{op}/torchrl": fn for op, fn in torchrl_ops().items()})
    fns = _working(fns, skipped, lambda name: name.split("/", 1)[1])
    timings = time_interleaved(fns, repeats=cfg["per_repeats"], warmup=2)
    for buf in ours.values():
        buf.check_priority_errors()
    return timings, skipped, peer_info


def _working(
    fns: dict[str, Callable[[], Any]], skipped: dict[str, str], case_of: Callable[[str], str]
) -> dict[str, Callable[[], Any]]:
    """``fns`` without those of a case whose first call raised (recorded in ``skipped`` with
    the error): one failing case must not cost the run every other case's figures."""
    failed: dict[str, str] = {}
    for name, fn in fns.items():
        if case_of(name) in failed:
            continue
        try:
            fn()
        except Exception as exc:  # recorded in the rows, the other cases go on
            failed[case_of(name)] = f"not measured: failed: {type(exc).__name__}: {exc}"
    skipped.update(failed)
    return {name: fn for name, fn in fns.items() if case_of(name) not in failed}


def _per_part(
    cfg: dict[str, Any], where: str, say: Callable[..., None]
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Rows of the prioritized part at every capacity, its summary (TorchRL's time over each
    marlbuf case's, per capacity and operation) and TorchRL's sampler description."""
    workload: Workload = cfg["per_workload"]
    trainers = cfg["per_trainers"]
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    peer: dict[str, Any] = {}
    try:
        import torchrl._torchrl as extension

        cuda_trees = hasattr(extension, "CudaSumSegmentTreeFp32") and where.startswith("cuda")
    except Exception:  # no TorchRL (its cases say so) or no extension: host trees
        cuda_trees = False
    for capacity in cfg["per_capacities"]:
        label = f"{workload.label} capacity {capacity:,}"
        needed = per_bytes_needed(workload, capacity, trainers, cuda_trees)
        reason = memory_shortfall(needed, where)
        ident = {"part": "per", "workload": label, "capacity": capacity}
        if reason is not None:
            say(f"[device] prioritized at {label}: {reason}", flush=True)
            rows += [
                {**ident, "case": case, "op": op, "status": reason}
                for op in PER_OPS
                for case in PER_CASES
            ]
            summary[str(capacity)] = reason
            continue
        say(f"[device] prioritized at {label}, {trainers} trainers ...", flush=True)
        timings, skipped, info = _per_capacity(cfg, capacity, where)
        _release_gpu_memory()
        peer = peer or info
        summary[str(capacity)] = {}
        for op in PER_OPS:
            theirs = timings.get(f"{op}/torchrl", {}).get("median")
            ratios: dict[str, Any] = {}
            for case in PER_CASES:
                t = timings.get(f"{op}/{case}")
                if t is None:
                    status = skipped.get(case, "not measured")
                    rows.append({**ident, "case": case, "op": op, "status": status})
                    continue
                extra = {"torchrl_time_vs_this": theirs / t["median"]} if theirs else {}
                row = _measured("per", label, case, t, op=op, capacity=capacity, **extra)
                rows.append(row)
                ratios[f"{case} ms"] = round(1e3 * t["median"], 4)
                if theirs and case != "torchrl":
                    ratios[f"torchrl / {case}"] = round(theirs / t["median"], 3)
            summary[str(capacity)][op] = ratios
        say(
            f"[device] prioritized at {label}: "
            + ", ".join(f"{k} {1e3 * v['median']:.3f} ms" for k, v in timings.items()),
            flush=True,
        )
    return rows, summary, peer


def targets(rows: list[dict[str, Any]], status: str | None) -> list[dict[str, Any]]:
    """PASS/FAIL of the targets (module docstring) from the rows, or not measured and why."""
    out = []
    per = {
        (r["capacity"], r["case"]): r
        for r in rows
        if r["part"] == "per" and r.get("op") == "sample + update"
    }
    for capacity, limit in PER_TARGETS.items():
        name = "PER sample + update: TorchRL / marlbuf index=device"
        ident: dict[str, Any] = {"workload": f"capacity {capacity:,}", "kind": "", "note": ""}
        row = per.get((capacity, "marlbuf index=device"))
        if row is not None and "torchrl_time_vs_this" in row:
            out.append(check(name, row["torchrl_time_vs_this"], limit, at_most=False, **ident))
            continue
        if row is None:
            why = status or "not measured: capacity not in this run (quick sizes)"
        elif row["status"] != "measured":
            why = row["status"]
        else:  # ours measured, TorchRL's case not
            why = per.get((capacity, "torchrl"), {}).get("status", "not measured")
        out.append(_unmeasured(name, limit, False, ident, why))
    workload, limit_ms = ROUND_TARGET
    name = "device round (uniform, B = 1024), ms"
    ident = {
        "workload": workload,
        "kind": "",
        "note": "an absolute time, not a ratio",
    }
    found = [
        r
        for r in rows
        if r["part"] == "gpu" and r["workload"] == workload and r["case"] == "device buffer"
    ]
    if found and found[0]["status"] == "measured":
        out.append(check(name, found[0]["ms_median"], limit_ms, **ident))
    else:
        why = found[0]["status"] if found else "not measured: workload not in this run"
        out.append(_unmeasured(name, limit_ms, True, ident, why))
    return out


def _unmeasured(
    name: str, limit: float, at_most: bool, ident: dict[str, Any], why: str
) -> dict[str, Any]:
    """A target row that was not measured, with the reason as its note."""
    why = why.removeprefix("not measured: ")
    return {
        "check": name,
        **ident,
        "ratio": float("nan"),
        "limit": float(limit),
        "bound": "at most" if at_most else "at least",
        "status": "not measured",
        "note": why,
    }


def targets_markdown(checks: list[dict[str, Any]]) -> str:
    """The targets as a table: check, where, value, limit, result, note."""
    rows = [
        {
            "check": c["check"],
            "where": c["workload"],
            "value": f"{c['ratio']:.3g}" if c["status"] in ("PASS", "FAIL") else "—",
            "limit": f"{'≤' if c['bound'] == 'at most' else '≥'} {c['limit']:g}",
            "result": c["status"],
            "note": c.get("note", ""),
        }
        for c in checks
    ]
    return markdown_table(rows, ["check", "where", "value", "limit", "result", "note"])


def _end_to_end(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Seconds per 100 env steps (env, actions, writes, one update round) per configuration."""
    from marlbuf.bench.suites.update import make_runner, time_rounds

    workload: Workload = cfg["e2e_workload"]
    skipped: dict[str, str] = {}
    runners: dict[str, Any] = {}
    try:
        import mpe2  # noqa: F401 - the environments (and the faithful configuration) need it
    except ImportError as exc:
        reason = f"not measured: mpe2 is not installed ({exc}); see bench/device_check.sh"
        return {}, {name: reason for name in E2E_CONFIGS}
    for name, config in E2E_CONFIGS.items():
        overrides = {k: v for k, v in config.items() if k != "on_device"}
        overrides["device"] = where
        if config.get("on_device"):
            overrides["buffer_device"] = where
        runners[name] = make_runner(workload, overrides, cfg["e2e_batch"], cfg["e2e_capacity"])
    sync = _sync(where)

    def window(runner: Any) -> None:
        runner.run_steps(E2E_STEPS)
        sync()

    try:
        samples = time_rounds(runners, cfg["e2e_repeats"], window)
        for runner in runners.values():  # one update round in every timed window
            assert runner.update_rounds == cfg["e2e_repeats"] + 1, runner.update_rounds
    finally:
        for runner in runners.values():
            runner.close()
    timings = {
        name: {
            "median": float(np.median(s["total"])),
            "min": float(np.min(s["total"])),
            "max": float(np.max(s["total"])),
            "update_s": float(np.median(s.get("update_all_trainers", [0.0]))),
            "env_step_s": float(np.median(s.get("env_step", [0.0]))),
        }
        for name, s in samples.items()
    }
    return timings, skipped


def _release_gpu_memory() -> None:
    """Free the last workload's buffers (their tensors were local to ``_gpu_rounds``)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _cpu_comparison(cfg: dict[str, Any]) -> dict[str, Any]:
    """The torch backend on the CPU against the NumPy buffer, one workload's round."""
    workload: Workload = cfg["cpu_workload"]
    specs = workload.specs()
    capacity = cfg["capacity"]
    numpy_buf = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0)
    torch_buf = MultiAgentReplayBuffer(
        specs, capacity, sampler=Uniform(), seed=0, device="cpu", next_obs="stored"
    )
    torch_lean = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0, device="cpu")
    _fill([numpy_buf, torch_buf, torch_lean], [], workload, capacity)
    kept: dict[str, list[Any]] = {"numpy": [], "torch": []}

    def with_out(buf: Any, key: str) -> Callable[[], Any]:
        def round_() -> None:
            out = kept[key][0] if kept[key] else None
            kept[key][:] = [buf.sample_for_trainers(BATCH, out=out)]

        return round_

    fns: dict[str, Callable[[], Any]] = {
        "numpy buffer": lambda: numpy_buf.sample_for_trainers(BATCH),
        "torch backend (cpu)": lambda: torch_buf.sample_for_trainers(BATCH),
        "numpy buffer+out": with_out(numpy_buf, "numpy"),
        "torch backend (cpu)+out": with_out(torch_buf, "torch"),
        "torch backend (cpu) lean": lambda: torch_lean.sample_for_trainers(BATCH),
    }
    timings = time_interleaved(fns, repeats=cfg["repeats"], warmup=1)
    return {"workload": workload.label, "timings": timings}


def _measured(part: str, label: str, case: str, t: dict[str, Any], **ratios: Any) -> dict:
    return {
        "part": part,
        "workload": label,
        "case": case,
        "status": "measured",
        "ms_median": 1e3 * t["median"],
        "ms_min": 1e3 * t["min"],
        "ms_max": 1e3 * t["max"],
        **ratios,
    }


def _not_measured(part: str, label: str, cases: Any, status: str) -> list[dict[str, Any]]:
    return [{"part": part, "workload": label, "case": case, "status": status} for case in cases]


def _part_rows(
    part: str,
    label: str,
    cases: Any,
    timings: dict[str, Any],
    skip: dict[str, str],
    extra: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """One part's rows in case order: each measured case with ``extra(timing)`` (its ratios),
    each other case with the reason it was not measured."""
    rows = []
    for case in cases:
        if case in timings:
            rows.append(_measured(part, label, case, timings[case], **extra(timings[case])))
        else:
            reason = skip.get(case, "not measured")
            rows.append({"part": part, "workload": label, "case": case, "status": reason})
    return rows


def run(quick: bool = False, progress: bool = True, device: str = "cuda") -> dict[str, Any]:
    """Measure the CPU comparison and, where a GPU is present, every GPU case.

    ``device="cpu"`` runs the GPU parts on the CPU instead (a test of the suite itself; its
    figures say nothing about a GPU).
    """
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows: list[dict[str, Any]] = []
    status = gpu_status(device)
    skipped: dict[str, str] = {}
    say = print if progress else (lambda *a, **k: None)
    say(f"[device] CPU comparison on {cfg['cpu_workload'].label} ...", flush=True)
    cpu = _cpu_comparison(cfg)
    gc.collect()  # the comparison's buffers (gigabytes at full size) go before the GPU part
    base = cpu["timings"]["numpy buffer"]["median"]
    base_out = cpu["timings"]["numpy buffer+out"]["median"]
    for case, t in cpu["timings"].items():
        ratio_base = base_out if case.endswith("+out") else base
        rows.append(
            _measured("cpu", cpu["workload"], case, t, time_vs_numpy=t["median"] / ratio_base)
        )
    ratio = cpu["timings"]["torch backend (cpu)"]["median"] / base
    ratio_out = cpu["timings"]["torch backend (cpu)+out"]["median"] / base_out
    ratio_lean = cpu["timings"]["torch backend (cpu) lean"]["median"] / base
    say(
        f"[device] torch backend (cpu) / numpy buffer: {ratio:.2f} ({ratio_out:.2f} with out=, "
        f"{ratio_lean:.2f} lean)"
    )
    gpu: dict[str, Any] = {}
    for workload in cfg["workloads"]:
        if status is not None:
            rows += _not_measured("gpu", workload.label, GPU_CASES, status)
            continue
        say(f"[device] {workload.label}: filling {cfg['capacity']} steps ...", flush=True)
        timings, skip = _gpu_rounds(workload, cfg, device)
        _release_gpu_memory()
        skipped.update(skip)
        host = timings["host buffer + to_torch(pinned, non_blocking)"]["median"]
        rows += _part_rows(
            "gpu",
            workload.label,
            GPU_CASES,
            timings,
            skip,
            lambda t: {"time_vs_host_to_torch": t["median"] / host},  # noqa: B023 - called now
        )
        gpu[workload.label] = {case: round(timings[case]["median"] / host, 4) for case in timings}
        say(
            f"[device] {workload.label}: "
            + ", ".join(f"{k} {1e3 * v['median']:.2f} ms" for k, v in timings.items()),
            flush=True,
        )
    # prioritized sample + update (and update alone) of a round of trainers, by capacity
    per: dict[str, Any] | str = status if status is not None else {}
    peer: dict[str, Any] = {}
    if status is None:
        per_rows, per, peer = _per_part(cfg, device, say)
        rows += per_rows
    else:
        for capacity in cfg["per_capacities"]:
            label = f"{cfg['per_workload'].label} capacity {capacity:,}"
            for op in PER_OPS:
                rows += [
                    {**r, "op": op, "capacity": capacity}
                    for r in _not_measured("per", label, PER_CASES, status)
                ]
    # end to end: seconds per 100 env steps
    e2e_label = cfg["e2e_workload"].label
    e2e: dict[str, Any] | str = status if status is not None else {}
    if status is None:
        say(f"[device] end to end at {e2e_label} ...", flush=True)
        e2e_t, skip = _end_to_end(cfg, device)
        _release_gpu_memory()
        skipped.update(skip)
        faithful = e2e_t.get("faithful", {}).get("median")

        def e2e_extra(t: dict[str, Any]) -> dict[str, Any]:
            extra = {"update_ms": 1e3 * t["update_s"], "env_step_ms": 1e3 * t["env_step_s"]}
            if faithful:
                extra["speedup_vs_faithful"] = faithful / t["median"]
            return extra

        rows += _part_rows("e2e", e2e_label, E2E_CONFIGS, e2e_t, skip, e2e_extra)
        assert isinstance(e2e, dict)
        if faithful:
            e2e.update({k: round(faithful / v["median"], 3) for k, v in e2e_t.items()})
        say(
            "[device] per 100 env steps: "
            + ", ".join(f"{k} {1e3 * v['median']:.1f} ms" for k, v in e2e_t.items()),
            flush=True,
        )
    else:
        rows += _not_measured("e2e", e2e_label, E2E_CONFIGS, status)
    summary: dict[str, Any] = {
        "cpu": {
            "workload": cpu["workload"],
            "torch_cpu_vs_numpy": round(ratio, 3),
            "torch_cpu_vs_numpy_with_out": round(ratio_out, 3),
            "torch_cpu_lean_vs_numpy": round(ratio_lean, 3),
            "target": CPU_TARGET,
            "meets_target": bool(ratio <= CPU_TARGET),
        },
        "gpu_time_vs_host_to_torch": gpu if status is None else status,
        "per_round": per,
        "e2e_speedup_vs_faithful": e2e,
        "skipped": skipped,
    }
    checks = targets(rows, status)
    summary["targets"] = {
        f"{c['check']} ({c['workload']})": c["status"]
        + (f" ({c['ratio']:.3g})" if c["status"] in ("PASS", "FAIL") else f": {c['note']}")
        for c in checks
    }
    import torch

    config: dict[str, Any] = {
        "batch_size": BATCH,
        "capacity": cfg["capacity"],
        "repeats": cfg["repeats"],
        "workloads": [w.label for w in cfg["workloads"]],
        "cpu_workload": cfg["cpu_workload"].label,
        "per": {
            "workload": cfg["per_workload"].label,
            "capacities": list(cfg["per_capacities"]),
            "trainers": cfg["per_trainers"],
            "batch_size": BATCH,
            "repeats": cfg["per_repeats"],
            "next_obs": "stored",
            "torchrl": peer or "not measured",
        },
        "e2e": {
            "workload": e2e_label,
            "capacity": cfg["e2e_capacity"],
            "batch_size": cfg["e2e_batch"],
            "repeats": cfg["e2e_repeats"],
            "steps": E2E_STEPS,
            "configs": E2E_CONFIGS,
        },
        "threads": threads,
        "torch": torch.__version__,
        "torchrl": _version("torchrl"),
        "device": device,
        "gpu": (
            torch.cuda.get_device_name(0)
            if status is None and device.startswith("cuda")
            else status or "the CPU (a test of the suite, not a GPU figure)"
        ),
    }
    columns = ["part", "workload", "case", "op", "status", "ms_median", "time_vs_numpy"]
    columns += ["time_vs_host_to_torch", "torchrl_time_vs_this", "speedup_vs_faithful"]
    return {
        "config": config,
        "rows": rows,
        "summary": summary,
        "targets": checks,
        "markdown": markdown_table(rows, columns)
        + "\n\nTargets (a miss is reported, not an error):\n\n"
        + targets_markdown(checks),
    }


def _version(name: str) -> str:
    """An optional package's version, or why it cannot be imported here."""
    try:
        module = __import__(name)
    except Exception as exc:  # not installed, or it does not load with this torch
        return f"not available: {type(exc).__name__}: {exc}"
    return str(getattr(module, "__version__", "?"))
