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

Prioritized part (same device): one trainer's ``sample(B)`` + ``update_priorities`` at a large
capacity (1e6 transitions of CN-3 rows in the full run), against TorchRL's
``TensorDictPrioritizedReplayBuffer`` on a ``LazyTensorStorage`` on the same device
(``sample()`` + ``update_priority``). The device buffer draws from its host priority trees and
defers each update (``sync=False``) until the next draw.

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
    "per_workload": Workload("cooperative_navigation", 3),
    "per_capacity": 20_000,
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
    "per_capacity": 1_000_000,
    "e2e_workload": Workload("cooperative_navigation", 24),
    "e2e_capacity": 20_000,
    "e2e_batch": BATCH,
    "e2e_repeats": 3,
}
#: the end-to-end configurations (``marlbuf.bench.update`` names) and the devices they add
E2E_CONFIGS: dict[str, dict[str, Any]] = {
    "faithful": {"formulation": "loop", "layout": "agent_major", "env_impl": "mpe2"},
    "baseline": {"formulation": "loop", "layout": "agent_major"},
    "marlbuf host buffer": {"formulation": "batched", "layout": "interleaved"},
    "marlbuf device buffer": {"formulation": "batched", "layout": "interleaved", "on_device": 1},
}
PER_CASES = ("device buffer prioritized", "torchrl prioritized")
E2E_STEPS = 100

GPU_CASES = (
    "device buffer",
    "device buffer+out",
    "device buffer+prioritized",
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


def _torchrl_buffers(
    capacity: int, device: Any, uniform: bool = True
) -> tuple[dict[str, Any], dict[str, str]]:
    """TorchRL's replay buffers on ``device`` (those that load) and why others do not."""
    made: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    try:
        if not uniform:
            raise LookupError("not used")
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

        made["torchrl LazyTensorStorage(device)"] = TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity, device=device), batch_size=BATCH
        )
    except LookupError:
        pass
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
    lean = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0, device=where)
    host = MultiAgentReplayBuffer(specs, capacity, sampler=Uniform(), seed=0)
    peers, skipped = _torchrl_buffers(capacity, device)
    _fill([uniform, per, lean, host], list(peers.values()), workload, capacity)
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
        "device buffer+obs once": lean_round,
        "host buffer + to_torch(pinned, non_blocking)": host_round,
    }
    for name, rb in peers.items():

        def peer_round(rb: Any = rb) -> None:
            for _ in range(n):
                rb.sample()
            sync()

        fns[name] = peer_round
    return time_interleaved(fns, repeats=cfg["repeats"], warmup=1), skipped


def _per_rounds(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """One trainer's prioritized ``sample`` + ``update_priorities`` at ``per_capacity``."""
    import torch

    workload: Workload = cfg["per_workload"]
    capacity = cfg["per_capacity"]
    ours = MultiAgentReplayBuffer(
        workload.specs(), capacity, sampler=Prioritized(), seed=0, device=where
    )
    peers, skipped = _torchrl_buffers(capacity, torch.device(where), uniform=False)
    _fill([ours], list(peers.values()), workload, capacity)
    sync = _sync(where)
    gen = torch.Generator(device=where).manual_seed(0)
    td = torch.rand(BATCH, generator=gen, device=where) + 0.01  # |TD| > 0, on the device
    td_host = td.cpu()

    def op(buf: Any) -> Callable[[], None]:
        def run() -> None:
            batch = buf.sample(BATCH)
            buf.update_priorities(batch.indices, td, sync=False)
            sync()

        return run

    fns: dict[str, Callable[[], Any]] = {"device buffer prioritized": op(ours)}
    for name, rb in peers.items():

        def peer_op(rb: Any = rb) -> None:
            sample = rb.sample()
            rb.update_priority(sample["index"], td_host)
            sync()

        fns[name] = peer_op
    timings = time_interleaved(fns, repeats=cfg["repeats"] * 4, warmup=2)
    ours.check_priority_errors()
    return timings, skipped


def _end_to_end(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Seconds per 100 env steps (env, actions, writes, one update round) per configuration."""
    from marlbuf.bench.update import make_runner, time_rounds

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
    # prioritized sample + update at a large capacity
    per_label = f"{cfg['per_workload'].label} capacity {cfg['per_capacity']}"
    per: dict[str, Any] | str = status if status is not None else {}
    if status is None:
        say(f"[device] prioritized at {per_label} ...", flush=True)
        per_t, skip = _per_rounds(cfg, device)
        _release_gpu_memory()
        skipped.update(skip)
        ours = per_t["device buffer prioritized"]["median"]
        rows += _part_rows(
            "per", per_label, PER_CASES, per_t, skip, lambda t: {"time_vs_ours": t["median"] / ours}
        )
        assert isinstance(per, dict)
        if "torchrl prioritized" in per_t:
            per["torchrl_vs_ours"] = round(per_t["torchrl prioritized"]["median"] / ours, 3)
        say(
            "[device] prioritized: "
            + ", ".join(f"{k} {1e3 * v['median']:.3f} ms" for k, v in per_t.items()),
            flush=True,
        )
    else:
        rows += _not_measured("per", per_label, PER_CASES, status)
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
        "per_time_torchrl_vs_ours": per,
        "e2e_speedup_vs_faithful": e2e,
        "skipped": skipped,
    }
    import torch

    config: dict[str, Any] = {
        "batch_size": BATCH,
        "capacity": cfg["capacity"],
        "repeats": cfg["repeats"],
        "workloads": [w.label for w in cfg["workloads"]],
        "cpu_workload": cfg["cpu_workload"].label,
        "per": {"workload": cfg["per_workload"].label, "capacity": cfg["per_capacity"]},
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
        "device": device,
        "gpu": (
            torch.cuda.get_device_name(0)
            if status is None and device.startswith("cuda")
            else status or "the CPU (a test of the suite, not a GPU figure)"
        ),
    }
    columns = ["part", "workload", "case", "status", "ms_median", "time_vs_numpy"]
    columns += ["time_vs_host_to_torch", "time_vs_ours", "speedup_vs_faithful"]
    return {
        "config": config,
        "rows": rows,
        "summary": summary,
        "markdown": markdown_table(rows, columns),
    }
