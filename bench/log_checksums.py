"""What the redo log's checksums cost a memory-mapped buffer's writes, same run.

Times ``add`` (one step) and ``extend`` (64 steps) of a memory-mapped buffer (``path=``) with
the log's payload checksum as shipped (:mod:`marlbuf._kernels.checksum`), with ``zlib.crc32``
in its place (what the log used before), and with none (a constant: records then go
unverified; only for this measurement). The three are interleaved round by round, in a rotating
order, and the result is the median over rounds of each one's time over the unchecked one's in
the same round. Rows are MPE-sized (``agents`` agents, 18 observation and 5 action floats each,
``next_obs="stored"``); the log limit is raised so that no checkpoint falls in a timed call.

Run: ``python bench/log_checksums.py [--agents 3] [--rounds 60] [--calls 100]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf import AgentSpec, MultiAgentReplayBuffer, _config, mapped


def _none(rows: np.ndarray, streams: np.ndarray, state: np.ndarray, *cut: np.ndarray) -> int:
    return 0


def _crc32(rows: np.ndarray, streams: np.ndarray, state: np.ndarray, *cut: np.ndarray) -> int:
    crc = zlib.crc32(streams.data, zlib.crc32(rows.data))
    return zlib.crc32(cut[0].data, crc) if cut else crc


def run(agents: int = 3, rounds: int = 60, calls: int = 100) -> dict[str, Any]:
    """Per-call medians and same-round ratios of mapped ``add``/``extend`` by checksum."""
    specs = {f"agent_{i}": AgentSpec(obs_shape=(18,), action_shape=(5,)) for i in range(agents)}
    rng = np.random.default_rng(0)

    def steps(n: int) -> dict[str, dict[str, np.ndarray]]:
        return {
            "obs": {a: rng.random((n, 18), dtype=np.float32) for a in specs},
            "next_obs": {a: rng.random((n, 18), dtype=np.float32) for a in specs},
            "action": {a: rng.random((n, 5), dtype=np.float32) for a in specs},
            "reward": {a: rng.random(n, dtype=np.float32) for a in specs},
            "done": {a: np.zeros(n, np.float32) for a in specs},
        }

    one = {f: {a: x[0] for a, x in per.items()} for f, per in steps(1).items()}
    block = steps(64)
    shipped = mapped._payload_checksum
    checksums: dict[str, Callable[..., int]] = {
        "shipped": shipped,
        "crc32": _crc32,
        "none": _none,
    }
    limit = _config.MAPPED_LOG_BYTES
    _config.MAPPED_LOG_BYTES = 1 << 30  # no checkpoint inside the timed calls
    out: dict[str, Any] = {"agents": agents, "rounds": rounds, "calls_per_sample": calls}
    try:
        with tempfile.TemporaryDirectory() as folder:
            buf = MultiAgentReplayBuffer(
                specs, 100_000, path=Path(folder) / "m", next_obs="stored", seed=0
            )
            writes: dict[str, Callable[[], None]] = {
                "add": lambda: buf.add(**one),
                "extend64": lambda: buf.extend(**block),
            }
            for op, write in writes.items():
                samples: dict[str, list[float]] = {name: [] for name in checksums}
                names = list(checksums)
                for r in range(rounds + 2):  # two warm-up rounds
                    for name in names[r % 3 :] + names[: r % 3]:  # rotating order
                        mapped._payload_checksum = checksums[name]
                        start = time.perf_counter()
                        for _ in range(calls):
                            write()
                        elapsed = (time.perf_counter() - start) / calls
                        if r >= 2:
                            samples[name].append(elapsed)
                mapped._payload_checksum = shipped
                base = np.asarray(samples["none"])
                for name, times in samples.items():
                    out[f"{op}_{name}_us"] = float(np.median(times)) * 1e6
                    if name != "none":
                        ratio = float(np.median(np.asarray(times) / base))
                        out[f"{op}_{name}_ratio"] = ratio
            buf.close()
    finally:
        mapped._payload_checksum = shipped
        _config.MAPPED_LOG_BYTES = limit
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(run(args.agents, args.rounds, args.calls), indent=1))


if __name__ == "__main__":
    main()
