"""marlbuf vs peer replay buffers on the MADDPG sampling pattern.

Peers (the ``[peers]`` extra): cpprb's ``ReplayBuffer`` and TorchRL's ``TensorDictReplayBuffer``
over a ``LazyTensorStorage``, each holding every agent's fields in one buffer (their best
layout for this workload: one ``sample`` returns all agents). A round = N trainers × one
uniform batch of B = 1024 with every agent's fields, as in ``bench/suites/sampling.py``. A peer that
is not installed, or fails to load, is skipped with the reason recorded. TorchRL's prioritized
sampler needs its compiled extension; where that does not load against the local torch build
it is reported as skipped (the prioritized comparison with cpprb is in the ``prioritized``
suite).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.tools.common import markdown_table, per_workload, quiet_threads, time_interleaved
from marlbuf.samplers import Neighbor, Uniform
from marlbuf.workloads import PAPER_WORKLOADS, Workload, random_steps

SUITE = "peers"
BATCH = 1024
CHUNK = 5_000

QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("cooperative_navigation", 6)],
    "capacity": 20_000,
    "repeats": 3,
}
FULL: dict[str, Any] = {"workloads": PAPER_WORKLOADS, "capacity": 100_000, "repeats": 5}


def _flat_fields(workload: Workload) -> dict[str, tuple[int, ...]]:
    """Peer buffers store one flat key per (field, agent)."""
    out: dict[str, tuple[int, ...]] = {}
    for i, spec in enumerate(workload.specs().values()):
        out[f"obs{i}"] = spec.obs_shape
        out[f"act{i}"] = spec.action_shape
        out[f"rew{i}"] = (1,)
        out[f"next_obs{i}"] = spec.obs_shape
        out[f"done{i}"] = (1,)
    return out


def _flatten_chunk(data: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    names = {"obs": "obs", "action": "act", "reward": "rew", "next_obs": "next_obs", "done": "done"}
    out = {}
    for field, per_agent in data.items():
        for i, arr in enumerate(per_agent.values()):
            out[f"{names[field]}{i}"] = arr.reshape(arr.shape[0], -1)
    return out


def _cpprb(workload: Workload, capacity: int) -> Any:
    import cpprb

    env_dict = {k: {"shape": s} for k, s in _flat_fields(workload).items()}
    return cpprb.ReplayBuffer(capacity, env_dict)


def _torchrl(capacity: int) -> Any:
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=BATCH)


def _torchrl_prioritized_status() -> str:
    try:
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        PrioritizedSampler(16, alpha=0.6, beta=0.4)
    except Exception as exc:  # the compiled extension may not match this torch build
        return f"skipped: {type(exc).__name__}: {exc}"
    return "available (compared in the prioritized suite)"


def _round(sample: Callable[[], Any], calls: int) -> Callable[[], Any]:
    """``sample`` called ``calls`` times (one per trainer for peers; marlbuf's
    ``sample_for_trainers`` already does the whole round)."""

    def round_() -> Any:
        return [sample() for _ in range(calls)]

    return round_


def _measure(workload: Workload, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    specs = workload.specs()
    capacity = cfg["capacity"]
    n_trainers = workload.n_trainers
    rng = np.random.default_rng(0)
    ours = {
        "marlbuf interleaved+uniform": MultiAgentReplayBuffer(specs, capacity, sampler=Uniform()),
        "marlbuf interleaved+neighbor64": MultiAgentReplayBuffer(
            specs, capacity, sampler=Neighbor(64)
        ),
    }
    peers: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name, factory in (
        ("cpprb", lambda: _cpprb(workload, capacity)),
        ("torchrl", lambda: _torchrl(capacity)),
    ):
        try:
            peers[name] = factory()
        except Exception as exc:  # not installed or does not load: record and go on
            skipped[name] = f"{type(exc).__name__}: {exc}"
    for start in range(0, capacity, CHUNK):
        data = random_steps(specs, min(CHUNK, capacity - start), rng)
        for buf in ours.values():
            buf.extend(**data)
        flat = _flatten_chunk(data)
        if "cpprb" in peers:
            peers["cpprb"].add(**flat)
        if "torchrl" in peers:
            import torch
            from tensordict import TensorDict

            steps = next(iter(flat.values())).shape[0]
            peers["torchrl"].extend(
                TensorDict({k: torch.from_numpy(v) for k, v in flat.items()}, batch_size=[steps])
            )
    fns: dict[str, Callable[[], Any]] = {
        name: _round(partial(buf.sample_for_trainers, BATCH), 1) for name, buf in ours.items()
    }
    if "cpprb" in peers:
        fns["cpprb"] = _round(partial(peers["cpprb"].sample, BATCH), n_trainers)
    if "torchrl" in peers:
        fns["torchrl"] = _round(peers["torchrl"].sample, n_trainers)
    return time_interleaved(fns, repeats=cfg["repeats"], warmup=1), skipped


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for workload in cfg["workloads"]:
        timings, skip = _measure(workload, cfg)
        skipped.update(skip)
        ours = timings["marlbuf interleaved+uniform"]["median"]
        for case, t in timings.items():
            rows.append(
                {
                    "workload": workload.label,
                    "case": case,
                    "ms_median": 1e3 * t["median"],
                    "ms_min": 1e3 * t["min"],
                    "ms_max": 1e3 * t["max"],
                    "first_call_ms": 1e3 * t["first_call"],
                    "time_vs_marlbuf_uniform": t["median"] / ours,
                }
            )
        if progress:
            print(
                f"[peers] {workload.label}: "
                + ", ".join(f"{k} {1e3 * v['median']:.1f} ms" for k, v in timings.items()),
                flush=True,
            )
        gc.collect()
    skipped["torchrl PrioritizedSampler"] = _torchrl_prioritized_status()
    summary = per_workload(rows, "time_vs_marlbuf_uniform")
    return {
        "config": {
            "batch_size": BATCH,
            "capacity": cfg["capacity"],
            "repeats": cfg["repeats"],
            "threads": threads,
        },
        "rows": rows,
        "summary": {"time_vs_marlbuf_interleaved_uniform": summary, "peers_skipped": skipped},
        "markdown": markdown_table(
            rows, ["workload", "case", "ms_median", "time_vs_marlbuf_uniform"]
        ),
    }
