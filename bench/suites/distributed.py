"""Scale-out on Ray: sharded learner rounds, global PER, distributed collection and training.

Five parts, all in one process that starts one local Ray instance, for each number of rollout
actors ``K`` in ``actors`` (``run(actors=...)``, ``marlbuf bench distributed --actors 1 2 4 8``;
default ``1 2``; 1 is always measured, every ratio needs it):

* **round** — one MADDPG sampling round (every trainer's ``B`` rows from all shards, assembled
  into one block) from ``K`` shard actors vs a local ``MultiAgentReplayBuffer`` holding the
  same number of rows (CN-24, ``B = 1024``). ``sync``: the learner asks and waits (no
  prefetch; cases interleaved). ``prefetch``: the learner is busy for ``busy_s`` (one thread of
  matrix multiplies, like an update round) between rounds and then waits for the prefetched
  round; what is reported is that exposed wait.
* **per** — the global prioritized round over ``K`` shards (exact global draws, no prefetch):
  the round's draws and gathers, then every trainer's priority update, applied (``flush()``),
  vs the same with one local buffer; ``Prioritized`` sampler, rows and workload as **round**.
* **collect** — environment steps per second of ``K`` rollout actors writing to their shards,
  learner idle (no update round is due), PP-24+8 on mpe2's own environment code, against the
  same collection loop in this process without Ray; ``max(collect_episodes,
  collect_per_actor * K)`` episodes per measurement.
* **train** — seconds per 100 env steps of ``marlbuf train --actors K`` (its
  :class:`~marlbuf.algos.distributed.DistributedRunner`) for every ``K > 1`` measured (``K = 1``
  when it is the only one) vs the single-process :class:`~marlbuf.algos.Runner`, same
  configuration (PP-24+8 at full size), after the warm-up.
* **model** — a scaling model fitted to those numbers, predicting 1, 2, 8, 64 and every
  measured number of actors on 16-core nodes; its assumptions are listed in the payload
  (``model.assumptions``) and its predictions set against every measured training run.

Targets (``targets`` in the payload: PASS, FAIL or not measured, with the reason): collection
with 8 actors at least 5x one actor's; ``train --actors 8`` at least 2x the single process; the
exposed wait of a prefetched round at most 1.5x the local round, for every ``K``.
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
from marlbuf.bench.tools.common import check, markdown_table, quiet_threads, time_interleaved
from marlbuf.workloads import Workload, random_steps

SUITE = "distributed"

FULL: dict[str, Any] = {
    "round_workload": Workload("cooperative_navigation", 24),
    "round_capacity": 20_000,  # total rows; K shards hold capacity / K each
    "batch_size": 1024,
    "round_repeats": 5,
    "busy_s": 1.0,
    "collect_workload": Workload("predator_prey", 24),
    "collect_episodes": 8,  # per measurement, over all actors (at least)
    "collect_per_actor": 4,  # ... and at least this many per actor
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
    "collect_per_actor": 2,
    "train_workload": Workload("cooperative_navigation", 3),
    "train_batch_size": 64,
    "train_episodes": 8,
    "env_impl": "mpe2",
    "object_store_bytes": 512 * 2**20,
}

#: Actor counts measured unless ``run(actors=...)`` says otherwise.
DEFAULT_ACTORS = (1, 2)
#: Actor counts the model predicts (with every measured one).
MODEL_ACTORS = (1, 2, 8, 64)
#: Targets: (actors, least collection speed-up over 1 actor); (actors, least training speed-up
#: over the single process); the most a prefetched round's exposed wait may be over the local
COLLECT_TARGET = (8, 5.0)
TRAIN_TARGET = (8, 2.0)
PREFETCH_TARGET = 1.5

#: Scaling-model constants that are assumptions, not measurements.
NODE_CORES = 16
NETWORK_BYTES_S = 1.25e9  # 10 Gb/s Ethernet between nodes


def actor_counts(actors: Any) -> tuple[int, ...]:
    """The actor counts to measure: ``actors`` sorted, without repeats, with 1 added."""
    if actors is None:
        return DEFAULT_ACTORS
    values = list(actors) if isinstance(actors, (list, tuple)) else [actors]
    if not values or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in values):
        raise ValueError(f"actors must be integers >= 1; got actors={actors!r}")
    return tuple(sorted({1, *values}))


def _busy(seconds: float) -> None:
    """One thread of matrix multiplies for ``seconds`` (a stand-in for an update round)."""
    a = np.ones((256, 256), np.float32)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = (a @ a) * np.float32(1 / 256)


def _filled_buffers(
    sizes: dict[str, Any], counts: tuple[int, ...], sampler: Any = None
) -> tuple[Any, dict[int, Any]]:
    """A local buffer and a sharded one per count (``K`` shards), holding the same rows."""
    from marlbuf import MultiAgentReplayBuffer
    from marlbuf.distributed import ShardedReplayBuffer

    workload: Workload = sizes["round_workload"]
    specs, capacity = workload.specs(), sizes["round_capacity"]
    rng = np.random.default_rng(0)
    chunk = 2000
    options = {} if sampler is None else {"sampler": sampler}
    local = MultiAgentReplayBuffer(specs, capacity, seed=0, **options)
    sharded = {
        k: ShardedReplayBuffer(specs, capacity // k, k, seed=k, prefetch=False, **options)
        for k in counts
    }
    for first in range(0, capacity, chunk):
        data = random_steps(specs, min(chunk, capacity - first), rng)
        local.extend(**data)
        for k, buf in sharded.items():
            buf.extend(**data, stream=(first // chunk) % k)
    for buf in sharded.values():
        buf.flush()
    return local, sharded


def round_part(
    sizes: dict[str, Any], counts: tuple[int, ...] = DEFAULT_ACTORS
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sampling-round latency: local buffer vs ``K`` shards (sync), and prefetch's wait."""
    workload: Workload = sizes["round_workload"]
    batch = sizes["batch_size"]
    local, sharded = _filled_buffers(sizes, counts)
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
    exposed = {r["case"]: r["ratio_vs_local"] for r in rows if r["mode"] != "sync"}
    fetch_s = sync[f"sharded_K{max(counts)}"] / 1e3  # the most shards: the learner's fetch
    return rows, {
        "round_bytes": round_bytes,
        "local_round_s": sync["local"] / 1e3,
        "sharded_round_s": {k: sync[f"sharded_K{k}"] / 1e3 for k in counts},
        "prefetch_wait_vs_local": {k: exposed[f"sharded_K{k}"] for k in counts},
        "object_store_bytes_s": round_bytes / fetch_s,
    }


def per_part(
    sizes: dict[str, Any], counts: tuple[int, ...] = DEFAULT_ACTORS
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """The global PER round (draws, gathers, updates applied): local buffer vs ``K`` shards."""
    from marlbuf.samplers import Prioritized

    workload: Workload = sizes["round_workload"]
    batch, trainers = sizes["batch_size"], workload.n_trainers
    local, sharded = _filled_buffers(sizes, counts, Prioritized())
    td = np.random.default_rng(1).random((trainers, batch)) + 0.01

    def per_round(buf: Any, settle: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            batches = buf.sample_for_trainers(batch)
            indices = [b.indices for b in batches]
            del batches
            buf.update_priorities_for_trainers(indices, td)
            settle()

        return run

    cases: dict[str, Callable[[], Any]] = {"local": per_round(local, lambda: None)}
    for k, buf in sharded.items():
        cases[f"sharded_K{k}"] = per_round(buf, buf.flush)
    try:
        timings = time_interleaved(cases, sizes["round_repeats"], warmup=1)
    finally:
        for buf in sharded.values():
            buf.close()
    base = timings["local"]["median"]
    rows = [
        {
            "part": "per",
            "workload": workload.label,
            "case": name,
            "mode": "sync, updates applied",
            "ms_median": 1e3 * t["median"],
            "ms_min": 1e3 * t["min"],
            "ratio_vs_local": t["median"] / base,
        }
        for name, t in timings.items()
    ]
    return rows, {k: timings[f"sharded_K{k}"]["median"] / base for k in counts}


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


def collect_part(
    sizes: dict[str, Any], counts: tuple[int, ...] = DEFAULT_ACTORS
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Env steps/s of ``K`` rollout actors (learner idle) and of the in-process loop."""
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
    for actors in counts:
        timed = max(episodes, sizes["collect_per_actor"] * actors)
        dist = DistributedRunner(config, actors)
        try:
            dist.train(actors)  # every actor's first episode: imports, JIT, first writes
            start = time.perf_counter()
            dist.train(timed)
            rates[actors] = 25 * timed / (time.perf_counter() - start)
            assert dist.update_rounds == 0
        finally:
            dist.close()
        rows.append(_collect_row(workload, f"{actors} actor(s)", actors, rates[actors], local_rate))
        rows[-1]["speedup_vs_1_actor"] = rates[actors] / rates[1]
        rows[-1]["episodes"] = timed
    return rows, {
        "actor_steps_s": rates[1],
        "steps_s": rates,
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


def train_part(
    sizes: dict[str, Any], counts: tuple[int, ...] = DEFAULT_ACTORS
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Seconds per 100 env steps: ``train --actors K`` vs the single-process loop."""
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
    trained = [k for k in counts if k > 1] or list(counts)  # --actors 1 alone: K = 1
    for actors in trained:
        dist = DistributedRunner(config, actors, profiler=PhaseTimer())
        try:
            dist.train(warm_episodes)
            start = time.perf_counter()
            dist.train(timed)
            wall = time.perf_counter() - start
            rounds[f"actors_{actors}"] = dist.update_rounds
        finally:
            dist.close()
        per_100[f"actors_{actors}"] = 100 * wall / (25 * timed)
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


def contention_fit(rates: dict[int, float]) -> float:
    """The contention ``sigma`` of ``rate(K) = K * rate(1) / (1 + sigma * (K - 1))`` fitted to
    measured collection rates (least squares of the linear form ``K * rate(1) / rate(K) - 1 =
    sigma * (K - 1)``; 0 with one actor count only, never below 0)."""
    points = [(k - 1, k * rates[1] / r - 1) for k, r in rates.items() if k > 1]
    if not points:
        return 0.0
    return max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points))


def scaling_model(
    collect: dict[str, Any],
    round_info: dict[str, Any],
    train: dict[str, Any],
    update_every: int,
    actors: tuple[int, ...] = MODEL_ACTORS,
) -> dict[str, Any]:
    """Predicted env steps/s and seconds per 100 env steps for ``actors`` rollout actors."""
    per_actor = collect["actor_steps_s"]
    sigma = contention_fit(collect["steps_s"])
    t_update = train["update_round_s"]
    round_bytes = round_info["round_bytes"]

    def node_rate(k: int) -> float:  # k actors sharing one node
        return k * per_actor / (1 + sigma * (k - 1))

    predictions = []
    for count in actors:
        nodes = math.ceil(count / (NODE_CORES - 1))  # one core per node for its shard
        full, rest = divmod(count, NODE_CORES - 1)
        collection = full * node_rate(NODE_CORES - 1) + (node_rate(rest) if rest else 0.0)
        # shards on other nodes: each round crosses the network once (learner NIC bound)
        fetch = round_bytes / (NETWORK_BYTES_S if nodes > 1 else round_info["object_store_bytes_s"])
        exposed = max(0.0, fetch - t_update)  # prefetch hides the fetch behind the update
        learner = update_every / (t_update + exposed)  # env steps/s the learner keeps up with
        rate = min(collection, learner)
        predictions.append(
            {
                "actors": count,
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
            "measured_steps_s": collect["steps_s"],
            "contention_sigma": sigma,
            "update_round_s": t_update,
            "round_bytes": round_bytes,
            "object_store_bytes_s": round_info["object_store_bytes_s"],
            "update_every": update_every,
        },
        "assumptions": [
            f"{NODE_CORES}-core nodes; each runs up to {NODE_CORES - 1} rollout actors (one "
            "core each) and its shard actor; the learner has a node of its own",
            "collection on one node follows the contention curve fitted to the measured "
            "rates, K * rate(1) / (1 + sigma * (K - 1)) (least squares over every measured "
            "K); nodes add their rates (no contention between nodes)",
            f"across nodes a round crosses a {NETWORK_BYTES_S * 8 / 1e9:g} Gb/s link once; "
            "one node: the measured object-store rate of the most shards measured; prefetch "
            "hides the fetch behind the update, so only max(0, fetch - update) is exposed",
            "the learner does one update round per update_every env steps (the single-process "
            "replay ratio, kept by marlbuf train --actors), at the measured update time; more "
            "actors than the learner can follow only make the policy staler, not training faster",
            "rounds, priority updates and weight broadcasts are the only traffic; the policy "
            "broadcast (a few MB every weights_every rounds) is neglected",
        ],
    }


def targets(
    counts: tuple[int, ...],
    collect: dict[str, Any],
    train: dict[str, Any],
    round_info: dict[str, Any],
) -> list[dict[str, Any]]:
    """PASS/FAIL of the suite's targets (module docstring), or not measured with the reason."""
    out = []

    def missing(name: str, limit: float, at_most: bool, where: str, why: str) -> None:
        out.append(
            {
                "check": name,
                "workload": where,
                "kind": "",
                "ratio": float("nan"),
                "limit": limit,
                "bound": "at most" if at_most else "at least",
                "status": "not measured",
                "note": why,
            }
        )

    k, limit = COLLECT_TARGET
    name, where = f"collection: {k} actors / 1 actor (env steps/s)", f"{k} actors"
    if k in collect["steps_s"]:
        ratio = collect["steps_s"][k] / collect["steps_s"][1]
        out.append(check(name, ratio, limit, at_most=False, workload=where, kind=""))
    else:
        missing(name, limit, False, where, f"{k} actors not in this run (--actors)")
    k, limit = TRAIN_TARGET
    name, where = f"training: single process / --actors {k} (s per 100 env steps)", f"{k} actors"
    if f"actors_{k}" in train:
        ratio = train["single"] / train[f"actors_{k}"]
        out.append(check(name, ratio, limit, at_most=False, workload=where, kind=""))
    else:
        missing(name, limit, False, where, f"{k} actors not in this run (--actors)")
    for k in counts:
        out.append(
            check(
                "prefetched round's exposed wait / local round",
                round_info["prefetch_wait_vs_local"][k],
                PREFETCH_TARGET,
                workload=f"{k} shard(s)",
                kind="",
            )
        )
    return out


def run(quick: bool = False, progress: bool = True, actors: Any = None) -> dict[str, Any]:
    """The suite (module docstring) for every number of actors in ``actors`` (default 1, 2)."""
    counts = actor_counts(actors)
    threads = quiet_threads()
    sizes = QUICK if quick else FULL
    import ray

    from marlbuf.distributed import init_ray

    # every rollout actor reserves a CPU: more actors than cores share them (recorded)
    ray_cpus = max(2, os.cpu_count() or 2, max(counts))
    started = init_ray(
        num_cpus=ray_cpus,
        object_store_memory=sizes["object_store_bytes"],
        logging_level=logging.ERROR,  # Ray's INFO/WARNING start-up lines are not ours
    )
    try:
        t0 = time.perf_counter()

        def done(part: str) -> None:
            if progress:
                print(f"[distributed] {part} {time.perf_counter() - t0:.1f} s", flush=True)

        round_rows, round_info = round_part(sizes, counts)
        done("round")
        per_rows, per_info = per_part(sizes, counts)
        done("per")
        collect_rows, collect_info = collect_part(sizes, counts)
        done("collect")
        train_rows, train_info = train_part(sizes, counts)
        done("train")
    finally:
        if started:
            ray.shutdown()
    update_every = _config(sizes["train_workload"], sizes).update_every
    model_actors = tuple(sorted({*MODEL_ACTORS, *counts}))
    model = scaling_model(collect_info, round_info, train_info, update_every, model_actors)
    predicted = {p["actors"]: p["s_per_100_steps"] for p in model["predictions"]}
    model["check_here"] = {
        f"{k} actors": {
            "predicted_s_per_100_steps": predicted[k],
            "measured_s_per_100_steps": train_info[f"actors_{k}"],
        }
        for k in counts
        if f"actors_{k}" in train_info
    }
    model["check_here"]["note"] = (
        "the model gives every actor and the learner a core of their own; on the measuring "
        f"machine ({os.cpu_count()} cores) the learner, the actors and the shards share them"
    )
    checks = targets(counts, collect_info, train_info, round_info)
    rows = round_rows + per_rows + collect_rows + train_rows
    model_rows = [{"part": "model", **p} for p in model["predictions"]]
    sync = {r["case"]: r["ratio_vs_local"] for r in round_rows if r["mode"] == "sync"}
    summary: dict[str, Any] = {
        **{f"round_ratio_K{k}_vs_local": round(sync[f"sharded_K{k}"], 2) for k in counts},
        **{
            f"prefetch_wait_K{k}_vs_local": round(round_info["prefetch_wait_vs_local"][k], 2)
            for k in counts
        },
        **{f"per_round_K{k}_vs_local": round(v, 2) for k, v in per_info.items()},
        **{
            f"collect_{k}_actors_vs_1": round(v / collect_info["steps_s"][1], 2)
            for k, v in collect_info["steps_s"].items()
            if k > 1
        },
        **{
            f"train_{case}_speedup": round(train_info["single"] / train_info[case], 2)
            for case in train_info
            if case.startswith("actors_")
        },
        "model_contention_sigma": round(model["inputs"]["contention_sigma"], 3),
        **{
            f"model_steps_s_{p['actors']}_actors": round(p["predicted_steps_s"], 1)
            for p in model["predictions"]
            if p["actors"] in (8, 64)
        },
        "targets": {
            f"{c['check']} ({c['workload']})": c["status"]
            + (f" ({c['ratio']:.3g})" if c["status"] in ("PASS", "FAIL") else f": {c['note']}")
            for c in checks
        },
    }
    from marlbuf.bench.suites.device import targets_markdown

    markdown = "\n\n".join(
        [
            markdown_table(
                round_rows, ["workload", "case", "mode", "ms_median", "ratio_vs_local", "round_mb"]
            ),
            markdown_table(per_rows, ["workload", "case", "mode", "ms_median", "ratio_vs_local"]),
            markdown_table(
                collect_rows,
                ["workload", "case", "env_steps_s", "ratio_vs_in_process", "speedup_vs_1_actor"],
            ),
            markdown_table(
                train_rows, ["workload", "case", "s_per_100_steps", "speedup_vs_single"]
            ),
            markdown_table(
                model_rows,
                ["actors", "nodes", "collection_steps_s", "learner_steps_s", "s_per_100_steps"],
            ),
            "Targets (a miss is reported, not an error):\n\n" + targets_markdown(checks),
        ]
    )
    config = {k: (v.label if isinstance(v, Workload) else v) for k, v in sizes.items()}
    return {
        "rows": rows + model_rows,
        "model": model,
        "targets": checks,
        "markdown": markdown,
        "summary": summary,
        "config": {
            **config,
            "actors": list(counts),
            "threads": threads,
            "cores": os.cpu_count(),
            "ray_cpus": ray_cpus,
            "note": f"Ray local instance on this machine ({os.cpu_count()} cores): actors, "
            "shards and the learner share its cores",
        },
    }


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    from marlbuf.bench.tools.common import write_result

    quick = "--quick" in sys.argv
    payload = run(quick=quick)
    print(json.dumps(payload["summary"], indent=1))
    print(write_result(SUITE, payload, quick))

__all__ = ["SUITE", "run", "scaling_model"]
