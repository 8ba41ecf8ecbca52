"""What consistent snapshots cost the CN-24 sampling round, same run.

A snapshot (``state_dict``/``save``) takes the buffer's lock to copy one committed state; a
sampling round takes the same lock for its draws and gathers. This times
``sample_for_trainers(batch)`` of a 24-agent buffer (cooperative navigation sizes: 98
observation and 5 action floats per agent) in three cases, interleaved round by round in a
rotating order:

* ``idle``: nothing else runs;
* ``snapshots``: a thread takes ``state_dict()`` and ``save()`` in a loop (with the lock);
* ``unlocked``: a thread does the same copying work without the lock (what snapshots cost
  before they were made consistent: torn, but never in the round's way).

``snapshots / unlocked`` is the cost of the lock itself on the round (the median of same-round
ratios); ``unlocked / idle`` is what the copying costs a 2-core machine anyway.

Run: ``marlbuf bench snapshot_lock`` (``--quick``: fewer rounds, a smaller buffer), or
``python -m marlbuf.bench.suites.snapshot_lock [--rounds 40] [--capacity 20000]`` (prints JSON).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer, persistence


def measure(rounds: int = 40, capacity: int = 20_000, batch: int = 1024) -> dict[str, Any]:
    """Median round times and same-round ratios with and without concurrent snapshots."""
    agents = 24
    specs = {f"agent_{i}": AgentSpec(obs_shape=(98,), action_shape=(5,)) for i in range(agents)}
    rng = np.random.default_rng(0)
    buf = MultiAgentReplayBuffer(specs, capacity, seed=0)
    for start in range(0, capacity, 1000):
        n = min(1000, capacity - start)
        obs = {a: rng.random((n + 1, 98), dtype=np.float32) for a in specs}
        buf.extend(
            obs={a: o[:-1] for a, o in obs.items()},
            next_obs={a: o[1:] for a, o in obs.items()},
            action={a: rng.random((n, 5), dtype=np.float32) for a in specs},
            reward={a: rng.random(n, dtype=np.float32) for a in specs},
            done={a: np.zeros(n, np.float32) for a in specs},
        )
    buf.sample_for_trainers(batch)  # kernels compiled outside the timings

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "snap.npz"

        def locked() -> None:
            buf.state_dict()
            buf.save(path)

        def unlocked() -> None:
            buf._states.snapshot(copy=True)  # the same copies, without the lock
            persistence.write_state(buf._states.snapshot(copy=False), path)

        def background(work: Callable[[], None] | None) -> tuple[threading.Event, Any]:
            stop = threading.Event()
            if work is None:
                return stop, None

            def loop() -> None:
                while not stop.is_set():
                    work()

            thread = threading.Thread(target=loop, daemon=True)
            thread.start()
            return stop, thread

        cases: dict[str, Callable[[], None] | None] = {
            "idle": None,
            "snapshots": locked,
            "unlocked": unlocked,
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for r in range(rounds + 1):
            for name in names[r % 3 :] + names[: r % 3]:
                stop, thread = background(cases[name])
                began = time.perf_counter()
                for _ in range(5):
                    buf.sample_for_trainers(batch)
                elapsed = (time.perf_counter() - began) / 5
                stop.set()
                if thread is not None:
                    thread.join()
                if r:
                    samples[name].append(elapsed)

    def ratio(a: str, b: str) -> float:
        return float(np.median(np.asarray(samples[a]) / np.asarray(samples[b])))

    return {
        "agents": agents,
        "capacity": capacity,
        "batch": batch,
        "rounds": rounds,
        **{f"{name}_ms": float(np.median(t)) * 1e3 for name, t in samples.items()},
        "lock_ratio": ratio("snapshots", "unlocked"),
        "copying_ratio": ratio("unlocked", "idle"),
    }


SUITE = "snapshot_lock"


def run(quick: bool = False) -> dict[str, Any]:
    """The suite: :func:`measure` (``quick``: 6 rounds of a 5,000-slot buffer)."""
    return measure(6, 5_000) if quick else measure()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--capacity", type=int, default=20_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.rounds, args.capacity), indent=1))


if __name__ == "__main__":
    main()
