"""Scale-out on Ray: sharded learner rounds, distributed collection, distributed training.

Four parts, all in one process that starts one local Ray instance:

* **round** — one MADDPG sampling round (every trainer's ``B`` rows from all shards, assembled
  into one block) from ``K = 1, 2`` shard actors vs a local ``MultiAgentReplayBuffer`` holding
  the same number of rows (CN-24, ``B = 1024``). ``sync``: the learner asks and waits (no
  prefetch; cases interleaved). ``prefetch``: the learner is busy for ``busy_s`` (one thread of
  matrix multiplies, like an update round) between rounds and then waits for the prefetched
  round; what is reported is that exposed wait.
* **collect** — environment steps per second of ``1`` and ``2`` rollout actors writing to their
  shards, learner idle (no update round is due), PP-24+8 on mpe2's own environment code,
  against the same collection loop in this process without Ray.
* **train** — seconds per 100 env steps of ``marlbuf train --actors 2`` (its
  :class:`~marlbuf.algos.distributed.DistributedRunner`) vs the single-process
  :class:`~marlbuf.algos.Runner`, same configuration, after the warm-up.
* **model** — a scaling model fitted to those numbers, predicting 8 and 64 actors on 16-core
  nodes; its assumptions are listed in the payload (``model.assumptions``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import marlbuf.distributed  # noqa: F401 - without Ray the suite is listed as unavailable
from marlbuf.bench.common import markdown_table, quiet_threads, time_interleaved
from marlbuf.bench.workloads import Workload, random_steps

SUITE = "distributed"

FULL: dict[str, Any] = {
    "round_workload": Workload("cooperative_navigation", 24),
    "round_capacity": 20_000,  # total rows; K shards hold capacity / K each
    "batch_size": 1024,
    "round_repeats": 5,
    "busy_s": 1.0,
    "collect_workload": Workload("predator_prey", 24),
    "collect_episodes": 8,  # per measurement, over all actors
    "train_workload": Workload("predator_prey", 24),
    "train_batch_size": 1024,
    "train_episodes": 16,  # timed, after the warm-up
    "env_impl": "mpe2",
    "object_store_bytes": 3 * 2**30,
}
#: Sizes of the quick run (``marlbuf bench --quick``); tests patch it smaller.
QUICK: dict[str, Any] = {
    "round_workload": Workload("cooperative_navigation", 6),
    "round_capacity": 4_000,
    "batch_size": 256,
    "round_repeats": 3,
    "busy_s": 0.1,
    "collect_workload": Workload("predator_prey", 3),
    "collect_episodes": 4,
    "train_workload": Workload("cooperative_navigation", 3),
    "train_batch_size": 64,
    "train_episodes": 8,
    "env_impl": "mpe2",
    "object_store_bytes": 512 * 2**20,
}

#: Scaling-model constants that are assumptions, not measurements.
NODE_CORES = 16
NETWORK_BYTES_S = 1.25e9  # 10 Gb/s Ethernet between nodes


def _busy(seconds: float) -> None:
    """One thread of matrix multiplies for ``seconds`` (a stand-in for an update round)."""
    a = np.ones((256, 256), np.float32)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = (a @ a) * np.float32(1 / 256)


def round_part(sizes: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sampling-round latency: local buffer vs 1 and 2 shards (sync), and prefetch's wait."""
    from marlbuf import MultiAgentReplayBuffer
    from marlbuf.distributed import ShardedReplayBuffer

    workload: Workload = sizes["round_workload"]
    specs, capacity, batch = workload.specs(), sizes["round_capacity"], sizes["batch_size"]
    rng = np.random.default_rng(0)
    chunk = 2000
    local = MultiAgentReplayBuffer(specs, capacity, seed=0)
    sharded = {
        k: ShardedReplayBuffer(specs, capacity // k, k, seed=k, prefetch=False) for k in (1, 2)
    }
    for first in range(0, capacity, chunk):
        data = random_steps(specs, min(chunk, capacity - first), rng)
        local.extend(**data)
        for k, buf in sharded.items():
            buf.extend(**data, stream=(first // chunk) % k)
    for buf in sharded.values():
        buf.flush()
    round_bytes = batch * local.storage.codec.row_bytes * workload.n_trainers
    cases: dict[str, Callable[[], Any]] = {"local": lambda: local.sample_for_trainers(batch)}
    for k, buf in sharded.items():
        cases[f"sharded_K{k}"] = functools.partial(buf.sample_for_trainers, batch)
    timings = time_interleaved(cases, sizes["round_repeats"], warmup=1)
    rows = []
    for name, t in timings.items():
        rows.append(
            {
                "part": "round",
                "workload": workload.label,
                "case": name,
                "mode": "sync",
                "ms_median": 1e3 * t["median"],
                "ms_min": 1e3 * t["min"],
                "ratio_vs_local": t["median"] / timings["local"]["median"],
                "round_mb": round_bytes / 2**20,
            }
        )
    # prefetch: the learner computes for busy_s, then waits for the round fetched meanwhile
    busy = sizes["busy_s"]
    for k, buf in sharded.items():
        buf.prefetch = True
        waits: list[float] = []
        batches = buf.sample_for_trainers(batch)
        for _ in range(sizes["round_repeats"] + 1):
            del batches
            _busy(busy)
            start = time.perf_counter()
            batches = buf.sample_for_trainers(batch)
            waits.append(time.perf_counter() - start)
        del batches
        rows.append(
            {
                "part": "round",
                "workload": workload.label,
                "case": f"sharded_K{k}",
                "mode": f"prefetch, learner busy {busy:g} s",
                "ms_median": 1e3 * float(np.median(waits[1:])),
                "ms_min": 1e3 * float(np.min(waits[1:])),
                "ratio_vs_local": float(np.median(waits[1:])) / timings["local"]["median"],
                "round_mb": round_bytes / 2**20,
            }
        )
        buf.close()
    sync = {r["case"]: r["ms_median"] for r in rows if r["mode"] == "sync"}
    fetch_s = sync["sharded_K2"] / 1e3
    return rows, {
        "round_bytes": round_bytes,
        "local_round_s": sync["local"] / 1e3,
        "sharded_round_s": {k: sync[f"sharded_K{k}"] / 1e3 for k in (1, 2)},
        "object_store_bytes_s": round_bytes / fetch_s,
    }


def _config(workload: Workload, sizes: dict[str, Any], **over: Any) -> Any:
    from marlbuf.algos import TrainConfig

    base = {
        "env": workload.env,
        "n_agents": workload.n,
        "env_impl": sizes["env_impl"],
        "batch_size": sizes["train_batch_size"],
        "warmup_steps": sizes["train_batch_size"],
        "buffer_size": 50_000,
        "seed": 0,
    }
    base.update(over)
    return TrainConfig(**base)


def collect_part(sizes: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Env steps/s of 1 and 2 rollout actors (learner idle) and of the in-process loop."""
    from marlbuf.algos import Runner
    from marlbuf.algos.distributed import DistributedRunner

    workload: Workload = sizes["collect_workload"]
    episodes = sizes["collect_episodes"]
    # no update is ever due: warm-up = capacity, far beyond the steps collected
    config = _config(workload, sizes, buffer_size=100_000, warmup_steps=100_000)
    rows = []
    runner = Runner(config)
    runner.collect(25)  # first episode: JIT, page faults
    start = time.perf_counter()
    runner.collect(25 * episodes)
    local_rate = 25 * episodes / (time.perf_counter() - start)
    runner.close()
    rows.append(_collect_row(workload, "in-process (no Ray)", 0, local_rate, local_rate))
    rates = {}
    for actors in (1, 2):
        dist = DistributedRunner(config, actors)
        try:
            dist.train(actors)  # every actor's first episode: imports, JIT, first writes
            start = time.perf_counter()
            dist.train(episodes)
            rates[actors] = 25 * episodes / (time.perf_counter() - start)
            assert dist.update_rounds == 0
        finally:
            dist.close()
        rows.append(_collect_row(workload, f"{actors} actor(s)", actors, rates[actors], local_rate))
    return rows, {
        "actor_steps_s": rates[1],
        "two_actor_efficiency": rates[2] / (2 * rates[1]),
        "in_process_steps_s": local_rate,
    }


def _collect_row(
    workload: Workload, case: str, actors: int, rate: float, local: float
) -> dict[str, Any]:
    return {
        "part": "collect",
        "workload": f"{workload.label} (mpe2)",
        "case": case,
        "actors": actors,
        "env_steps_s": rate,
        "ratio_vs_in_process": rate / local,
    }


def train_part(sizes: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Seconds per 100 env steps: ``train --actors 2`` vs the single-process loop."""
    from marlbuf.algos import PhaseTimer, Runner
    from marlbuf.algos.distributed import DistributedRunner

    workload: Workload = sizes["train_workload"]
    config = _config(workload, sizes)
    warm_episodes = math.ceil(config.effective_warmup / 25)
    timed = sizes["train_episodes"]
    rows = []
    timer = PhaseTimer()
    single = Runner(config, profiler=timer)
    single.train(warm_episodes)
    before, start = timer.snapshot(), time.perf_counter()
    single.train(timed)
    wall = time.perf_counter() - start
    update_s = (timer.snapshot()["update_all_trainers"] - before["update_all_trainers"]) / max(
        1, timed * 25 // config.update_every
    )
    single.close()
    per_100 = {"single": 100 * wall / (25 * timed)}
    rounds = {"single": single.update_rounds}
    dist = DistributedRunner(config, 2, profiler=PhaseTimer())
    try:
        dist.train(warm_episodes)
        start = time.perf_counter()
        dist.train(timed)
        wall = time.perf_counter() - start
        rounds["actors_2"] = dist.update_rounds
    finally:
        dist.close()
    per_100["actors_2"] = 100 * wall / (25 * timed)
    for case, seconds in per_100.items():
        rows.append(
            {
                "part": "train",
                "workload": f"{workload.label} ({config.env_impl})",
                "case": case,
                "s_per_100_steps": seconds,
                "speedup_vs_single": per_100["single"] / seconds,
                "batch_size": config.batch_size,
                "update_rounds_total": rounds[case],
            }
        )
    return rows, {"update_round_s": update_s, "update_rounds": rounds, **per_100}


def scaling_model(
    collect: dict[str, Any], round_info: dict[str, Any], train: dict[str, Any], update_every: int
) -> dict[str, Any]:
    """Predicted env steps/s and seconds per 100 env steps for 1, 2, 8 and 64 actors."""
    per_actor = collect["actor_steps_s"]
    efficiency = min(1.0, collect["two_actor_efficiency"])
    t_update = train["update_round_s"]
    round_bytes = round_info["round_bytes"]
    predictions = []
    for actors in (1, 2, 8, 64):
        nodes = math.ceil(actors / (NODE_CORES - 1))  # one core per node for its shard
        collection = actors * per_actor * (efficiency if actors > 1 else 1.0)
        # shards on other nodes: each round crosses the network once (learner NIC bound)
        fetch = round_bytes / (NETWORK_BYTES_S if nodes > 1 else round_info["object_store_bytes_s"])
        exposed = max(0.0, fetch - t_update)  # prefetch hides the fetch behind the update
        learner = update_every / (t_update + exposed)  # env steps/s the learner keeps up with
        rate = min(collection, learner)
        predictions.append(
            {
                "actors": actors,
                "nodes": nodes,
                "collection_steps_s": collection,
                "learner_steps_s": learner,
                "predicted_steps_s": rate,
                "s_per_100_steps": 100 / rate,
                "bound": "learner" if learner < collection else "collection",
            }
        )
    return {
        "predictions": predictions,
        "inputs": {
            "actor_steps_s": per_actor,
            "two_actor_efficiency": efficiency,
            "update_round_s": t_update,
            "round_bytes": round_bytes,
            "object_store_bytes_s": round_info["object_store_bytes_s"],
            "update_every": update_every,
        },
        "assumptions": [
            f"{NODE_CORES}-core nodes; each runs up to {NODE_CORES - 1} rollout actors (one "
            "core each) and its shard actor; the learner has a node of its own",
            "an actor's env steps/s is the measured single-actor rate, times the measured "
            "two-actor efficiency for more than one actor (no further loss per node)",
            f"across nodes a round crosses a {NETWORK_BYTES_S * 8 / 1e9:g} Gb/s link once; "
            "one node: the measured object-store rate; prefetch hides the fetch behind the "
            "update, so only max(0, fetch - update) is exposed",
            "the learner does one update round per update_every env steps (the single-process "
            "replay ratio, kept by marlbuf train --actors), at the measured update time; more "
            "actors than the learner can follow only make the policy staler, not training faster",
            "rounds, priority updates and weight broadcasts are the only traffic; the policy "
            "broadcast (a few MB every weights_every rounds) is neglected",
        ],
    }


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    threads = quiet_threads()
    sizes = QUICK if quick else FULL
    import ray

    from marlbuf.distributed import init_ray

    started = init_ray(
        num_cpus=max(2, os.cpu_count() or 2),
        object_store_memory=sizes["object_store_bytes"],
        logging_level=logging.ERROR,  # Ray's INFO/WARNING start-up lines are not ours
    )
    try:
        t0 = time.perf_counter()
        round_rows, round_info = round_part(sizes)
        if progress:
            print(f"[distributed] round {time.perf_counter() - t0:.1f} s", flush=True)
        collect_rows, collect_info = collect_part(sizes)
        if progress:
            print(f"[distributed] collect {time.perf_counter() - t0:.1f} s", flush=True)
        train_rows, train_info = train_part(sizes)
        if progress:
            print(f"[distributed] train {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        if started:
            ray.shutdown()
    update_every = _config(sizes["train_workload"], sizes).update_every
    model = scaling_model(collect_info, round_info, train_info, update_every)
    two = model["predictions"][1]
    model["check_2_actors_here"] = {
        "predicted_s_per_100_steps": two["s_per_100_steps"],
        "measured_s_per_100_steps": train_info["actors_2"],
        "note": "the model gives every actor and the learner a core of their own; on this "
        "machine the learner, both actors and the shards share its cores",
    }
    rows = round_rows + collect_rows + train_rows
    model_rows = [{"part": "model", **p} for p in model["predictions"]]
    summary = {
        "round_ratio_K1_vs_local": round(round_rows[1]["ratio_vs_local"], 2),
        "round_ratio_K2_vs_local": round(round_rows[2]["ratio_vs_local"], 2),
        "collect_2_actors_vs_1": round(collect_info["two_actor_efficiency"] * 2, 2),
        "train_actors_2_speedup": round(train_info["single"] / train_info["actors_2"], 2),
        "model_steps_s_8_actors": round(model["predictions"][2]["predicted_steps_s"], 1),
        "model_steps_s_64_actors": round(model["predictions"][3]["predicted_steps_s"], 1),
    }
    markdown = "\n\n".join(
        [
            markdown_table(
                round_rows, ["workload", "case", "mode", "ms_median", "ratio_vs_local", "round_mb"]
            ),
            markdown_table(
                collect_rows, ["workload", "case", "env_steps_s", "ratio_vs_in_process"]
            ),
            markdown_table(
                train_rows, ["workload", "case", "s_per_100_steps", "speedup_vs_single"]
            ),
            markdown_table(
                model_rows,
                ["actors", "nodes", "collection_steps_s", "learner_steps_s", "s_per_100_steps"],
            ),
        ]
    )
    config = {k: (v.label if isinstance(v, Workload) else v) for k, v in sizes.items()}
    return {
        "rows": rows + model_rows,
        "model": model,
        "markdown": markdown,
        "summary": summary,
        "config": {
            **config,
            "threads": threads,
            "cores": os.cpu_count(),
            "note": "Ray local instance on this machine (shared 2-core VM): actors, shards and "
            "the learner share the same cores",
        },
    }


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    from marlbuf.bench.common import write_result

    quick = "--quick" in sys.argv
    payload = run(quick=quick)
    print(json.dumps(payload["summary"], indent=1))
    print(write_result(SUITE, payload, quick))

__all__ = ["SUITE", "run", "scaling_model"]
