"""Device-resident buffers: the MADDPG sampling round on a GPU, and the torch backend on the CPU.

GPU part (needs CUDA; where ``torch.cuda.is_available()`` is False every GPU case is recorded
as not measured, with the reason). Per workload (CN-24 and PP-24+8 at B = 1024), one round =
N trainers x one batch of every agent's fields, delivered as tensors on the GPU; each timed
round ends with ``torch.cuda.synchronize()``:

* ``device buffer`` - ``MultiAgentReplayBuffer(..., device="cuda")``, ``sample_for_trainers``
  (indices drawn and the round gathered on the GPU); ``+out`` reuses the previous round's block;
  ``+prioritized`` with the ``Prioritized`` sampler;
* ``host buffer + to_torch`` - the NumPy buffer's round, each batch sent with
  ``to_torch(device, pin_memory=True, non_blocking=True)``;
* ``torchrl`` - TorchRL's ``LazyTensorStorage(device="cuda")`` holding a nested TensorDict
  (``agents/<agent>/<field>``), one ``sample()`` per trainer; ``torchrl prioritized`` - its
  ``TensorDictPrioritizedReplayBuffer`` on the same storage, where its sampler loads.

CPU part (always measured): the torch backend with ``device="cpu"`` against the NumPy buffer on
the CN-24 round (uniform, serial NumPy kernels, one torch thread; both with their default batch
memory recycling and with ``out=`` reuse). The target is a ratio of at most 1.3.

Times are medians of interleaved repeats (``bench/common.py``); only ratios measured in the same
process are compared.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.common import markdown_table, quiet_threads, time_interleaved
from marlbuf.bench.workloads import Workload, random_steps
from marlbuf.samplers import Prioritized, Uniform

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
}
FULL: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 24), Workload("predator_prey", 24)],
    "cpu_workload": Workload("cooperative_navigation", 24),
    "capacity": 100_000,
    "repeats": 5,
}

GPU_CASES = (
    "device buffer",
    "device buffer+out",
    "device buffer+prioritized",
    "host buffer + to_torch(pinned, non_blocking)",
    "torchrl LazyTensorStorage(device)",
    "torchrl prioritized",
)


def gpu_status() -> str | None:
    """``None`` when a CUDA device can be used, else why not."""
    try:
        import torch
    except ImportError as exc:
        return f"not measured: torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return "not measured: no CUDA device here (torch.cuda.is_available() is False)"
    return None


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


def _gpu_rounds(workload: Workload, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Time every GPU case of one workload."""
    import torch

    device = torch.device("cuda")
    specs = workload.specs()
    n, capacity = workload.n_trainers, cfg["capacity"]
    uniform = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0, device="cuda")
    per = MultiAgentReplayBuffer(specs, capacity, sampler=Prioritized(), seed=0, device="cuda")
    host = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0)
    peers, skipped = _torchrl_buffers(capacity, device)
    _fill([uniform, per, host], list(peers.values()), workload, capacity)
    sync = torch.cuda.synchronize
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

    def host_round() -> None:
        for batch in host.sample_for_trainers(BATCH):
            batch.to_torch(device, pin_memory=True, non_blocking=True)
        sync()

    fns: dict[str, Callable[[], Any]] = {
        "device buffer": device_round,
        "device buffer+out": device_round_out,
        "device buffer+prioritized": prioritized_round,
        "host buffer + to_torch(pinned, non_blocking)": host_round,
    }
    for name, rb in peers.items():

        def peer_round(rb: Any = rb) -> None:
            for _ in range(n):
                rb.sample()
            sync()

        fns[name] = peer_round
    return time_interleaved(fns, repeats=cfg["repeats"], warmup=1), skipped


def _release_gpu_memory() -> None:
    """Free the last workload's buffers (their tensors were local to ``_gpu_rounds``)."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def _cpu_comparison(cfg: dict[str, Any]) -> dict[str, Any]:
    """The torch backend on the CPU against the NumPy buffer, one workload's round."""
    workload: Workload = cfg["cpu_workload"]
    specs = workload.specs()
    capacity = cfg["capacity"]
    numpy_buf = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0)
    torch_buf = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0, device="cpu")
    _fill([numpy_buf, torch_buf], [], workload, capacity)
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
    }
    timings = time_interleaved(fns, repeats=cfg["repeats"], warmup=1)
    return {"workload": workload.label, "timings": timings}


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Measure the CPU comparison and, where a GPU is present, every GPU case."""
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows: list[dict[str, Any]] = []
    status = gpu_status()
    skipped: dict[str, str] = {}
    if progress:
        print(f"[device] CPU comparison on {cfg['cpu_workload'].label} ...", flush=True)
    cpu = _cpu_comparison(cfg)
    gc.collect()  # the comparison's buffers (gigabytes at full size) go before the GPU part
    base = cpu["timings"]["numpy buffer"]["median"]
    base_out = cpu["timings"]["numpy buffer+out"]["median"]
    for case, t in cpu["timings"].items():
        rows.append(
            {
                "part": "cpu",
                "workload": cpu["workload"],
                "case": case,
                "status": "measured",
                "ms_median": 1e3 * t["median"],
                "ms_min": 1e3 * t["min"],
                "ms_max": 1e3 * t["max"],
                "time_vs_numpy": t["median"] / (base_out if case.endswith("+out") else base),
            }
        )
    ratio = cpu["timings"]["torch backend (cpu)"]["median"] / base
    ratio_out = cpu["timings"]["torch backend (cpu)+out"]["median"] / base_out
    if progress:
        print(
            f"[device] torch backend (cpu) / numpy buffer: {ratio:.2f} ({ratio_out:.2f} with out=)"
        )
    gpu: dict[str, Any] = {}
    for workload in cfg["workloads"]:
        if status is not None:
            rows += [
                {"part": "gpu", "workload": workload.label, "case": case, "status": status}
                for case in GPU_CASES
            ]
            continue
        if progress:
            print(f"[device] {workload.label}: filling {cfg['capacity']} steps ...", flush=True)
        timings, skip = _gpu_rounds(workload, cfg)
        _release_gpu_memory()
        skipped.update(skip)
        host = timings["host buffer + to_torch(pinned, non_blocking)"]["median"]
        for case in GPU_CASES:
            if case not in timings:
                reason = skip.get(case, "not measured")
                rows.append(
                    {"part": "gpu", "workload": workload.label, "case": case, "status": reason}
                )
                continue
            t = timings[case]
            rows.append(
                {
                    "part": "gpu",
                    "workload": workload.label,
                    "case": case,
                    "status": "measured",
                    "ms_median": 1e3 * t["median"],
                    "ms_min": 1e3 * t["min"],
                    "ms_max": 1e3 * t["max"],
                    "time_vs_host_to_torch": t["median"] / host,
                }
            )
        gpu[workload.label] = {case: round(timings[case]["median"] / host, 3) for case in timings}
        if progress:
            print(
                f"[device] {workload.label}: "
                + ", ".join(f"{k} {1e3 * v['median']:.2f} ms" for k, v in timings.items()),
                flush=True,
            )
    summary: dict[str, Any] = {
        "cpu": {
            "workload": cpu["workload"],
            "torch_cpu_vs_numpy": round(ratio, 3),
            "torch_cpu_vs_numpy_with_out": round(ratio_out, 3),
            "target": CPU_TARGET,
            "meets_target": bool(ratio <= CPU_TARGET),
        },
        "gpu_time_vs_host_to_torch": gpu if status is None else status,
        "skipped": skipped,
    }
    import torch

    config: dict[str, Any] = {
        "batch_size": BATCH,
        "capacity": cfg["capacity"],
        "repeats": cfg["repeats"],
        "workloads": [w.label for w in cfg["workloads"]],
        "cpu_workload": cfg["cpu_workload"].label,
        "threads": threads,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if status is None else status,
    }
    columns = ["part", "workload", "case", "status", "ms_median", "time_vs_numpy"]
    columns.append("time_vs_host_to_torch")
    return {
        "config": config,
        "rows": rows,
        "summary": summary,
        "markdown": markdown_table(rows, columns),
    }
