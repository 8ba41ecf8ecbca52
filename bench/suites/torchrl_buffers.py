"""marlbuf inside TorchRL (``marlbuf bench torchrl``): ``MarlbufStorage`` and marlbuf's
prioritized sampler against TorchRL's own parts, in TorchRL's own loop.

Data: MADDPG-shaped TensorDicts of MPE cooperative navigation with N agents (what
``PettingZooWrapper`` and ``RewardSum`` make of mpe2's ``simple_spread``: one group ``"agent"``
with ``observation`` of ``6N`` floats, ``action``, per-agent ``done``/``terminated``/
``truncated``, ``episode_reward``, the rewards under ``"next"``, the root done flags and the
collector's ``traj_ids``), written as streams of 25-step episodes (a step's next observation
is the following step's except at an episode's end). Every comparison is timed in one process,
cases interleaved, medians of the repeats, as ratios to TorchRL's part in the same run:

1. **storage get** of B = 1024 random indices, N = 3, 12, 24: ``LazyTensorStorage.get`` vs
   ``MarlbufStorage.get`` (the same index tensor) and ``MarlbufStorage(contiguous=False).get``
   (leaves strided views of whole gathered rows), with the floor of any gather on this
   machine: the batch's bytes over the copy bandwidth (``speedup_vs_torchrl`` of the floor is
   the most any storage could gain here);
2. **rb.sample()** end to end through ``TensorDictReplayBuffer``: ``LazyTensorStorage`` +
   ``RandomSampler`` vs ``MarlbufStorage`` (both leaf layouts) + ``RandomSampler``, and +
   ``MarlbufUniformSampler`` (memory order);
3. **bytes per stored transition** of the same streams: ``LazyTensorStorage``'s tensors vs
   ``MarlbufStorage``'s rows, next-observation links and side table, and write generations;
4. **prioritized sample + update** of B = 1024 at capacities 1e5 and 1e6:
   ``MarlbufPrioritizedSampler`` (``sample`` + ``update_priority``), cpprb's
   ``PrioritizedReplayBuffer`` (``sample`` + ``update_priorities``), and TorchRL's
   ``PrioritizedSampler`` where its compiled extension loads (otherwise its error is
   recorded);
5. **the example's whole run** (``examples/torchrl_maddpg.py`` against
   ``examples/torchrl_maddpg_marlbuf.py``, same seed): seconds per phase, alternating the two
   buffers after a warm-up run of each (Numba's kernels load from their cache once per
   process: ``first_run_s``), the ratio of each repeat's pair (whole run, and the phases a
   buffer takes part in: extend, sample, update), and whether their losses are identical (same
   sampled indices, same rows). Collection (``PettingZooWrapper`` stepping mpe2) does not
   touch the buffer and is most of a run. Needs a checkout (the examples are not installed)
   and mpe2.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import (
    copy_bandwidth,
    markdown_table,
    quiet_threads,
    time_interleaved,
)

SUITE = "torchrl"
BATCH = 1024
EPISODE = 25
CHUNK = 5_000
ALPHA, BETA = 0.6, 0.4

QUICK: dict[str, Any] = {
    "agents": [3, 12],
    "capacity": 4_000,
    "repeats": 5,
    "per_capacities": [100_000],
    "per_repeats": 20,
    "run": {
        "n_iters": 2,
        "frames_per_batch": 100,
        "updates_per_iter": 4,
        "minibatch_size": 64,
        "learning_starts": 64,
        "memory_size": 1_000,
        "hidden": 16,
    },
    "run_repeats": 1,
}
FULL: dict[str, Any] = {
    "agents": [3, 12, 24],
    "capacity": 40_000,
    "repeats": 15,
    "per_capacities": [100_000, 1_000_000],
    "per_repeats": 60,
    "run": {
        "n_iters": 6,
        "frames_per_batch": 250,
        "updates_per_iter": 40,
        "minibatch_size": 1024,
        "learning_starts": 1024,
        "memory_size": 1_000_000,
    },
    "run_repeats": 5,
}


def mpe_streams(n_agents: int, steps: int, seed: int) -> Any:
    """``steps`` transitions of cooperative navigation with ``n_agents`` agents as TorchRL's
    ``PettingZooWrapper`` + ``RewardSum`` + a collector lay them out, in 25-step episodes."""
    import torch
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(seed)
    obs_dim = 6 * n_agents
    obs = torch.randn(steps + 1, n_agents, obs_dim, generator=gen)
    step = torch.arange(steps + 1) % EPISODE
    end = step[1:] == EPISODE - 1  # the transition whose next observation ends an episode
    next_obs = obs[1:].clone()
    next_obs[end] = torch.randn(int(end.sum()), n_agents, obs_dim, generator=gen)
    reward = -torch.rand(steps, n_agents, 1, generator=gen)
    running = torch.zeros(steps + 1, n_agents, 1)
    for t in range(steps):  # episode_reward: the sum so far, reset at an episode's start
        running[t + 1] = (0 if step[t + 1] == 0 else running[t]) + reward[t]
    flags = {
        "done": end.reshape(steps, 1),
        "terminated": torch.zeros(steps, 1, dtype=torch.bool),
        "truncated": end.reshape(steps, 1),
    }
    root_flags = {k: torch.zeros(steps, 1, dtype=torch.bool) for k in flags}

    def per_agent(value: Any) -> Any:
        return value.unsqueeze(1).expand(steps, n_agents, 1).contiguous()

    return TensorDict(
        {
            "agent": TensorDict(
                {
                    "observation": obs[:-1],
                    "action": torch.rand(steps, n_agents, 5, generator=gen) * 2 - 1,
                    "episode_reward": running[:-1],
                    **{k: per_agent(v) for k, v in root_flags.items()},
                },
                batch_size=[steps, n_agents],
            ),
            **root_flags,
            "collector": TensorDict(
                {"traj_ids": torch.arange(steps) // EPISODE + seed * steps}, batch_size=[steps]
            ),
            "next": TensorDict(
                {
                    "agent": TensorDict(
                        {
                            "observation": next_obs,
                            "reward": reward,
                            "episode_reward": running[1:],
                            **{k: per_agent(v) for k, v in flags.items()},
                        },
                        batch_size=[steps, n_agents],
                    ),
                    **flags,
                },
                batch_size=[steps],
            ),
        },
        batch_size=[steps],
    )


def _filled(n_agents: int, capacity: int) -> dict[str, Any]:
    """``TensorDictReplayBuffer``s over TorchRL's and marlbuf's storages (contiguous and
    strided leaves), holding the same ``capacity`` transitions; marlbuf's memory-order sampler
    shares the contiguous storage."""
    from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer

    from marlbuf.compat.torchrl import MarlbufStorage, MarlbufUniformSampler

    lazy = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=RandomSampler(), batch_size=BATCH
    )
    ours = TensorDictReplayBuffer(
        storage=MarlbufStorage(capacity), sampler=RandomSampler(), batch_size=BATCH
    )
    for start in range(0, capacity, CHUNK):
        chunk = mpe_streams(n_agents, min(CHUNK, capacity - start), seed=start)
        for rb in (lazy, ours):
            rb.extend(chunk.clone(False))  # the buffer writes "index" into what it extends
    strided = MarlbufStorage(capacity, contiguous=False)
    strided.load_state_dict(ours.storage.state_dict())
    return {
        "LazyTensorStorage+RandomSampler": lazy,
        "MarlbufStorage+RandomSampler": ours,
        "MarlbufStorage(contiguous=False)+RandomSampler": TensorDictReplayBuffer(
            storage=strided, sampler=RandomSampler(), batch_size=BATCH
        ),
        "MarlbufStorage+MarlbufUniformSampler": TensorDictReplayBuffer(
            storage=ours.storage, sampler=MarlbufUniformSampler(seed=0), batch_size=BATCH
        ),
    }


def _lazy_bytes(storage: Any) -> int:
    """Bytes of ``LazyTensorStorage``'s tensors (every key it stores, for its capacity)."""
    first = storage.get(slice(0, 1))
    return storage.max_size * sum(
        leaf.element_size() * leaf[0].numel()
        for leaf in first.values(include_nested=True, leaves_only=True)
    )


def measure_storage(n_agents: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Parts 1-3 at ``n_agents``."""
    import torch

    capacity = cfg["capacity"]
    buffers = _filled(n_agents, capacity)
    lazy = buffers["LazyTensorStorage+RandomSampler"]
    ours = buffers["MarlbufStorage+RandomSampler"]
    strided = buffers["MarlbufStorage(contiguous=False)+RandomSampler"]
    index = torch.randint(0, capacity, (BATCH,), generator=torch.Generator().manual_seed(1))
    gets = time_interleaved(
        {
            "LazyTensorStorage.get": lambda: lazy.storage.get(index),
            "MarlbufStorage.get": lambda: ours.storage.get(index),
            "MarlbufStorage(contiguous=False).get": lambda: strided.storage.get(index),
        },
        repeats=cfg["repeats"],
        warmup=2,
        rotate=True,
    )
    samples = time_interleaved(
        {name: rb.sample for name, rb in buffers.items()},
        repeats=cfg["repeats"],
        warmup=2,
        rotate=True,
    )
    label = f"CN-{n_agents}"
    rows: list[dict[str, Any]] = []
    base = gets["LazyTensorStorage.get"]["median"]
    batch = lazy.storage.get(index)
    batch_bytes = sum(
        leaf.numel() * leaf.element_size()
        for leaf in batch.values(include_nested=True, leaves_only=True)
    )
    floor = batch_bytes / copy_bandwidth()  # the batch's bytes copied once at memcpy speed
    rows.append(
        {
            "part": "storage get",
            "workload": label,
            "case": "floor: batch bytes / copy bandwidth",
            "ms_median": 1e3 * floor,
            "speedup_vs_torchrl": base / floor,
            "batch_mb": batch_bytes / 1e6,
        }
    )
    for case, t in gets.items():
        rows.append(
            {
                "part": "storage get",
                "workload": label,
                "case": case,
                **_times(t),
                "speedup_vs_torchrl": base / t["median"],
            }
        )
    base = samples["LazyTensorStorage+RandomSampler"]["median"]
    for case, t in samples.items():
        rows.append(
            {
                "part": "rb.sample()",
                "workload": label,
                "case": case,
                **_times(t),
                "speedup_vs_torchrl": base / t["median"],
            }
        )
    buffer = ours.storage.buffer
    marlbuf_bytes = buffer.nbytes + buffer.write_generation.nbytes
    lazy_bytes = _lazy_bytes(lazy.storage)
    rows.append(
        {
            "part": "bytes per transition",
            "workload": label,
            "case": f"MarlbufStorage ({buffer.next_obs})",
            "bytes_per_transition": marlbuf_bytes / capacity,
            "torchrl_bytes_per_transition": lazy_bytes / capacity,
            "memory_vs_torchrl": marlbuf_bytes / lazy_bytes,
        }
    )
    gc.collect()
    return rows


def _times(t: dict[str, Any]) -> dict[str, float]:
    return {"ms_median": 1e3 * t["median"], "ms_min": 1e3 * t["min"], "ms_max": 1e3 * t["max"]}


def torchrl_prioritized_status() -> str | None:
    """``None`` where TorchRL's ``PrioritizedSampler`` builds here, else why it does not."""
    try:
        from torchrl.data import PrioritizedSampler

        PrioritizedSampler(16, ALPHA, BETA)
    except Exception as exc:  # the compiled extension may not load against this torch build
        return f"{type(exc).__name__}: {exc}"
    return None


def measure_prioritized(capacity: int, repeats: int) -> list[dict[str, Any]]:
    """Part 4: one prioritized draw of B = 1024 and its priority update, at ``capacity``."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage

    from marlbuf.compat.torchrl import MarlbufPrioritizedSampler

    storage = LazyTensorStorage(capacity)  # the samplers read its length only
    storage.set(torch.arange(capacity), TensorDict({"x": torch.zeros(capacity, 1)}, [capacity]))
    gen = torch.Generator().manual_seed(0)
    initial = torch.rand(capacity, generator=gen, dtype=torch.float64) * 2
    td_pool = torch.rand(64, BATCH, generator=gen) * 2  # fresh TD errors per call
    counter = {"i": 0}

    def next_td() -> Any:
        counter["i"] += 1
        return td_pool[counter["i"] % td_pool.shape[0]]

    everything = torch.arange(capacity)
    ours = MarlbufPrioritizedSampler(capacity, ALPHA, BETA, seed=0)
    ours.mark_update(everything)
    ours.update_priority(everything, initial)

    def marlbuf_case() -> None:
        index, _ = ours.sample(storage, BATCH)
        ours.update_priority(index, next_td())

    cases: dict[str, Callable[[], Any]] = {"MarlbufPrioritizedSampler": marlbuf_case}
    skipped: dict[str, str] = {}
    try:
        import cpprb

        per = cpprb.PrioritizedReplayBuffer(capacity, {"x": {"shape": 1}}, alpha=ALPHA)
        per.add(x=np.zeros((capacity, 1), dtype=np.float32))
        per.update_priorities(np.arange(capacity), initial.numpy())

        def cpprb_case() -> None:
            drawn = per.sample(BATCH, beta=BETA)
            per.update_priorities(drawn["indexes"], next_td().numpy())

        cases["cpprb.PrioritizedReplayBuffer"] = cpprb_case
    except ImportError as exc:
        skipped["cpprb"] = f"not installed: {exc} (pip install 'marlbuf[peers]')"
    status = torchrl_prioritized_status()
    if status is None:
        from torchrl.data import PrioritizedSampler

        theirs = PrioritizedSampler(capacity, ALPHA, BETA)
        theirs.update_priority(everything, initial)

        def torchrl_case() -> None:
            index, _ = theirs.sample(storage, BATCH)
            theirs.update_priority(index, next_td())

        cases["torchrl.PrioritizedSampler"] = torchrl_case
    else:
        skipped["torchrl.PrioritizedSampler"] = status
    timings = time_interleaved(cases, repeats=repeats, warmup=3, rotate=True)
    base = timings["MarlbufPrioritizedSampler"]["median"]
    rows = [
        {
            "part": "prioritized sample+update",
            "workload": f"capacity {capacity:.0e}",
            "case": case,
            "us_median": 1e6 * t["median"],
            "us_min": 1e6 * t["min"],
            "us_max": 1e6 * t["max"],
            "time_vs_marlbuf": t["median"] / base,
        }
        for case, t in timings.items()
    ]
    for case, why in skipped.items():
        rows.append(
            {
                "part": "prioritized sample+update",
                "workload": f"capacity {capacity:.0e}",
                "case": case,
                "skipped": why,
            }
        )
    return rows


def _examples() -> Path | None:
    """The checkout's ``examples/`` folder (``None`` for an installed package, which has
    none)."""
    folder = Path(__file__).resolve().parents[2] / "examples"
    return folder if (folder / "torchrl_maddpg_marlbuf.py").exists() else None


def _load_example(folder: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {folder / name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks the module up
    spec.loader.exec_module(module)
    return module


def measure_whole_run(cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Part 5: the example's whole run with each buffer."""
    import warnings

    folder = _examples()
    if folder is None:
        return [], {"skipped": "examples/ not found: run the suite from a checkout"}
    try:
        import mpe2  # noqa: F401
    except ImportError as exc:
        return [], {"skipped": f"mpe2 not installed: {exc} (pip install 'marlbuf[envs]')"}
    modules = {
        "LazyTensorStorage": _load_example(folder, "torchrl_maddpg"),
        "MarlbufStorage": _load_example(folder, "torchrl_maddpg_marlbuf"),
    }
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in modules}
    first: dict[str, dict[str, float]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's and PettingZoo's own notices
        for name, module in modules.items():  # warm-up: kernels loaded, caches filled
            first[name] = module.train(module.Config(**cfg["run"])).record["seconds"]
        for repeat in range(cfg["run_repeats"]):
            order = list(modules) if repeat % 2 == 0 else list(modules)[::-1]
            for name in order:
                module = modules[name]
                records[name].append(module.train(module.Config(**cfg["run"])).record)
    phases = list(records["LazyTensorStorage"][0]["seconds"])
    medians = {
        name: {p: float(np.median([r["seconds"][p] for r in recs])) for p in phases}
        for name, recs in records.items()
    }

    def buffer_phases(record: dict[str, Any]) -> float:
        seconds = record["seconds"]
        return float(seconds["buffer_extend"] + seconds["buffer_sample"] + seconds["update"])

    def paired(measure: Callable[[dict[str, Any]], float]) -> float:
        pairs = zip(records["MarlbufStorage"], records["LazyTensorStorage"])
        return float(np.median([measure(ours) / measure(theirs) for ours, theirs in pairs]))

    ratios = {
        "MarlbufStorage": (
            paired(lambda r: float(r["seconds"]["total"])),
            paired(buffer_phases),
        ),
        "LazyTensorStorage": (1.0, 1.0),
    }
    rows = [
        {
            "part": "example whole run",
            "workload": "CN-3",
            "case": name,
            **{f"s_{p}": medians[name][p] for p in phases},
            "s_median": medians[name]["total"],
            "time_vs_torchrl": ratios[name][0],
            "buffer_phases_vs_torchrl": ratios[name][1],
            "first_run_s": first[name]["total"],
        }
        for name in modules
    ]
    identical = all(
        a["losses"] == b["losses"]
        for a, b in zip(records["LazyTensorStorage"], records["MarlbufStorage"])
    )
    return rows, {
        "losses_identical": identical,
        "updates": len(records["MarlbufStorage"][0]["losses"]),
        "repeats": cfg["run_repeats"],
    }


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    import tensordict
    import torch
    import torchrl

    cfg = QUICK if quick else FULL
    threads = quiet_threads()
    rows: list[dict[str, Any]] = []
    for n_agents in cfg["agents"]:
        part = measure_storage(n_agents, cfg)
        rows += part
        if progress:
            print(
                f"[torchrl] CN-{n_agents}: "
                + ", ".join(
                    f"{r['part']} {r['case']} "
                    + (
                        f"{r['speedup_vs_torchrl']:.2f}x"
                        if "speedup_vs_torchrl" in r
                        else f"{r['memory_vs_torchrl']:.2f}x bytes"
                    )
                    for r in part
                ),
                flush=True,
            )
    for capacity in cfg["per_capacities"]:
        part = measure_prioritized(capacity, cfg["per_repeats"])
        rows += part
        if progress:
            print(
                f"[torchrl] prioritized {capacity:.0e}: "
                + ", ".join(
                    f"{r['case']} {r['us_median']:.0f} us"
                    if "us_median" in r
                    else f"{r['case']} skipped"
                    for r in part
                ),
                flush=True,
            )
    run_rows, run_summary = measure_whole_run(cfg)
    rows += run_rows
    if progress and run_rows:
        print(
            "[torchrl] whole run: "
            + ", ".join(f"{r['case']} {r['s_median']:.1f} s" for r in run_rows),
            flush=True,
        )

    def pick(part: str, case: str, column: str) -> dict[str, float]:
        return {
            r["workload"]: round(float(r[column]), 3)
            for r in rows
            if r["part"] == part and r["case"] == case and column in r
        }

    summary = {
        "storage_get_speedup": pick("storage get", "MarlbufStorage.get", "speedup_vs_torchrl"),
        "sample_speedup": pick("rb.sample()", "MarlbufStorage+RandomSampler", "speedup_vs_torchrl"),
        "storage_get_strided_speedup": pick(
            "storage get", "MarlbufStorage(contiguous=False).get", "speedup_vs_torchrl"
        ),
        "storage_get_floor_speedup": pick(
            "storage get", "floor: batch bytes / copy bandwidth", "speedup_vs_torchrl"
        ),
        "sample_strided_speedup": pick(
            "rb.sample()", "MarlbufStorage(contiguous=False)+RandomSampler", "speedup_vs_torchrl"
        ),
        "sample_memory_order_speedup": pick(
            "rb.sample()", "MarlbufStorage+MarlbufUniformSampler", "speedup_vs_torchrl"
        ),
        "memory_vs_torchrl": {
            r["workload"]: round(r["memory_vs_torchrl"], 3)
            for r in rows
            if r["part"] == "bytes per transition"
        },
        "prioritized_speedup_vs_cpprb": {
            r["workload"]: round(r["time_vs_marlbuf"], 3)
            for r in rows
            if r["part"] == "prioritized sample+update"
            and r["case"] == "cpprb.PrioritizedReplayBuffer"
        },
        "prioritized_speedup_vs_torchrl": {
            r["workload"]: round(r["time_vs_marlbuf"], 3)
            for r in rows
            if r["part"] == "prioritized sample+update"
            and r["case"] == "torchrl.PrioritizedSampler"
            and "time_vs_marlbuf" in r
        },
        "torchrl_prioritized_sampler": torchrl_prioritized_status() or "loads",
        "whole_run": run_summary,
        "whole_run_time_vs_torchrl": {
            r["case"]: round(r["time_vs_torchrl"], 3)
            for r in rows
            if r["part"] == "example whole run"
        },
        "whole_run_buffer_phases_vs_torchrl": {
            r["case"]: round(r["buffer_phases_vs_torchrl"], 3)
            for r in rows
            if r["part"] == "example whole run"
        },
    }
    tables = []
    for table, columns in (
        ("storage get", ["workload", "case", "ms_median", "speedup_vs_torchrl"]),
        ("rb.sample()", ["workload", "case", "ms_median", "speedup_vs_torchrl"]),
        (
            "bytes per transition",
            [
                "workload",
                "case",
                "bytes_per_transition",
                "torchrl_bytes_per_transition",
                "memory_vs_torchrl",
            ],
        ),
        (
            "prioritized sample+update",
            ["workload", "case", "us_median", "time_vs_marlbuf", "skipped"],
        ),
        (
            "example whole run",
            [
                "case",
                "s_median",
                "s_collect",
                "s_buffer_extend",
                "s_buffer_sample",
                "s_update",
                "time_vs_torchrl",
                "buffer_phases_vs_torchrl",
                "first_run_s",
            ],
        ),
    ):
        table_rows = [r for r in rows if r["part"] == table]
        if table_rows:
            tables.append(f"{table}:\n\n" + markdown_table(table_rows, columns))
    return {
        "config": {
            "batch_size": BATCH,
            "capacity": cfg["capacity"],
            "repeats": cfg["repeats"],
            "prioritized_capacities": cfg["per_capacities"],
            "run": cfg["run"],
            "run_repeats": cfg["run_repeats"],
            "threads": threads,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "torch": torch.__version__,
            "copy_bandwidth_gb_s": round(copy_bandwidth() / 1e9, 2),
        },
        "rows": rows,
        "summary": summary,
        "markdown": "\n\n".join(tables),
    }
