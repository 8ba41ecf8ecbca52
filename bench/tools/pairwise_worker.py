"""One side of :mod:`marlbuf.bench.tools.pairwise`'s core comparison: a process that builds
the core workloads with whichever marlbuf it imports (``PYTHONPATH`` selects it) and times one case
per request.

Run as a script (``python bench/tools/pairwise_worker.py``), not as
``marlbuf.bench.tools.pairwise_worker``: the base version being compared need not have this file. It
uses only public API that every compared version has. Protocol, one line each: the parent writes a
case name, the worker answers with the median seconds of ``REPEATS`` timed calls (``nan`` when the
case does not exist in this version); ``quit`` ends it. The first line it writes is ``ready``
followed by the case names.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

#: timed calls per request (the parent alternates versions between requests)
REPEATS = 5
#: batch size of every sampling case
BATCH = 1024


def _steps(specs: dict[str, Any], steps: int, seed: int) -> dict[str, Any]:
    """``steps`` consecutive steps of one stream (next_obs = the next obs; episodes of 25)."""
    rng = np.random.default_rng(seed)
    obs = {a: rng.random((steps + 1, *s.obs_shape), dtype=np.float32) for a, s in specs.items()}
    done = np.zeros(steps, np.float32)
    done[24::25] = 1
    next_obs = {a: o[1:].copy() for a, o in obs.items()}
    for a in specs:
        next_obs[a][done == 1] += 1  # a reset after every episode end
    return {
        "obs": {a: o[:-1] for a, o in obs.items()},
        "action": {
            a: rng.random((steps, *s.action_shape), dtype=np.float32) for a, s in specs.items()
        },
        "reward": {a: rng.random(steps, dtype=np.float32) for a in specs},
        "next_obs": next_obs,
        "done": {a: done for a in specs},
    }


def _navigation_specs(n: int) -> dict[str, Any]:
    """Cooperative navigation's specs with ``n`` agents (``6n`` observation floats, 5 action
    floats; :class:`marlbuf.workloads.Workload`'s, built here from the public ``AgentSpec``
    because the compared versions keep the workloads in different modules)."""
    from marlbuf import AgentSpec

    return {f"agent_{i}": AgentSpec(obs_shape=(6 * n,), action_shape=(5,)) for i in range(n)}


def _filled(specs: dict[str, Any], capacity: int, **options: Any) -> Any:
    from marlbuf import MultiAgentReplayBuffer

    buf = MultiAgentReplayBuffer(specs, capacity, seed=0, **options)
    chunk = 5_000
    for k in range(-(-capacity // chunk)):
        buf.extend(**_steps(specs, chunk, k))
    return buf


def _round(buf: Any) -> Callable[[], None]:
    state: dict[str, Any] = {"out": buf.sample_for_trainers(BATCH)}

    def run() -> None:
        state["out"] = buf.sample_for_trainers(BATCH, out=state["out"])

    return run


def _round_case(
    specs: dict[str, Any], capacity: int, options: dict[str, Any]
) -> Callable[[], None]:
    return _round(_filled(specs, capacity, **options))


def build_cases() -> dict[str, Callable[[], Callable[[], None]]]:
    """Case name -> a builder of the timed call (built on first request)."""
    from marlbuf.samplers import Neighbor, Prioritized, Sequence

    cases: dict[str, Callable[[], Callable[[], None]]] = {}
    for n, capacity in ((3, 100_000), (12, 50_000), (24, 20_000)):
        specs = _navigation_specs(n)
        name = f"CN-{n}"
        for label, options in (
            ("default", {}),
            ("dense", {"next_obs": "stored"}),
            ("neighbor64", {"sampler": Neighbor(run_length=64)}),
            ("per_agent", {"batch_layout": "per_agent"}),
            ("agent_major", {"layout": "agent_major"}),
        ):
            cases[f"{name} round {label}"] = partial(_round_case, specs, capacity, options)

        def add_one(s: dict[str, Any] = specs) -> Callable[[], None]:
            from marlbuf import MultiAgentReplayBuffer

            buf = MultiAgentReplayBuffer(s, 10_000, seed=0)
            data = _steps(s, 4096, 1)
            step = {"t": 0}

            def run() -> None:
                t = step["t"] % 4096
                step["t"] += 1
                buf.add(**{f: {a: v[t] for a, v in d.items()} for f, d in data.items()})

            return run

        def extend_64(s: dict[str, Any] = specs) -> Callable[[], None]:
            from marlbuf import MultiAgentReplayBuffer

            buf = MultiAgentReplayBuffer(s, 10_000, seed=0)
            data = _steps(s, 64, 2)
            buf.extend(**data)

            def run() -> None:
                buf.extend(**data)

            return run

        cases[f"{name} add"] = add_one
        cases[f"{name} extend64"] = extend_64

    cn3 = _navigation_specs(3)

    def per(capacity: int) -> Callable[[], None]:
        buf = _filled(cn3, capacity, sampler=Prioritized())
        td = np.random.default_rng(0).random(BATCH) + 0.01

        def run() -> None:
            batch = buf.sample(BATCH)
            buf.update_priorities(batch.indices, td, generations=batch.generations)

        return run

    def per_drawn(capacity: int) -> Callable[[], None]:
        buf = _filled(cn3, capacity, sampler=Prioritized())
        td = np.random.default_rng(0).random(BATCH) + 0.01

        def run() -> None:
            batch = buf.sample(BATCH)
            buf.update_priorities(batch.indices, td)  # judged by the indices' own draw

        return run

    cases["CN-3 PER sample+update 1e5"] = lambda: per(100_000)
    cases["CN-3 PER sample+update 1e6"] = lambda: per(1_000_000)
    cases["CN-3 PER sample+update(batch.indices) 1e5"] = lambda: per_drawn(100_000)

    def sequences(length: int) -> Callable[[], None]:
        buf = _filled(cn3, 100_000, sampler=Sequence(length, burn_in=4))

        def run() -> None:
            buf.sample(64)

        return run

    cases["CN-3 Sequence(16) sample 64"] = lambda: sequences(16)

    def sequences_prioritized() -> Callable[[], None]:
        buf = _filled(cn3, 100_000, sampler=Sequence(16, burn_in=4, prioritized=True))
        td = np.random.default_rng(1).random((64, 16)) + 0.01

        def run() -> None:
            batch = buf.sample(64)
            buf.update_priorities(batch.indices, td, generations=batch.generations)

        return run

    cases["CN-3 Sequence(16) PER sample+update 64"] = sequences_prioritized

    def episodes(prioritized: bool) -> Callable[[], None]:
        # imported here: a version without Episodes answers nan for these cases only
        from marlbuf.samplers import Episodes

        sampler = Episodes(max_length=25, prioritized=prioritized)
        buf = _filled(cn3, 100_000, sampler=sampler)
        td = np.random.default_rng(2).random(32) + 0.01

        def run() -> None:
            batch = buf.sample(32)
            if prioritized:
                buf.update_priorities(batch.indices, td, generations=batch.generations)

        return run

    cases["CN-3 Episodes(25) sample 32"] = lambda: episodes(False)
    cases["CN-3 Episodes(25) PER sample+update 32"] = lambda: episodes(True)

    def torch_round(n: int, next_obs: str) -> Callable[[], None]:
        import torch

        torch.set_num_threads(1)
        specs = _navigation_specs(n)
        return _round(_filled(specs, 20_000, device="cpu", next_obs=next_obs))

    cases["CN-24 torch cpu round dense"] = lambda: torch_round(24, "stored")
    cases["CN-24 torch cpu round once"] = lambda: torch_round(24, "once")
    cases["CN-6 torch cpu round once"] = lambda: torch_round(6, "once")
    return cases


def main() -> None:
    warnings.simplefilter("ignore")
    cases = build_cases()
    built: dict[str, Callable[[], None]] = {}
    print("ready", *[name.replace(" ", "~") for name in cases], flush=True)
    for line in sys.stdin:
        name = line.strip().replace("~", " ")
        if name == "quit":
            break
        if name not in built:
            built.clear()  # one case's buffers in memory at a time
            try:
                built[name] = cases[name]()
                built[name]()  # warm-up (JIT, first-touch of batch memory)
            except Exception as exc:  # a case this version cannot run
                print(f"nan {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
                continue
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            built[name]()
            times.append(time.perf_counter() - start)
        print(f"{float(np.median(times))!r}", flush=True)


if __name__ == "__main__":
    main()
