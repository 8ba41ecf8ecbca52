"""What the redo log's checksums cost a memory-mapped buffer's writes, same run.

A memory-mapped buffer (``path=``) writes each call's staged rows into its mapped log with one
kernel (:func:`marlbuf._kernels.checksum.write_record`) that copies the rows and checksums
them in the same pass. This suite times ``add`` (one step) and ``extend`` (64 steps) of such a
buffer with three record writers in turn:

* ``shipped``: the kernel as shipped;
* ``separate``: a separate checksum pass over the payload before the record is written (what a
  log whose checksum is not folded into the copy costs);
* ``none``: the same record written without any checksum (a copy-only twin of the kernel, only
  for this measurement: its records would not verify).

The three are interleaved round by round, in a rotating order, and each result is the median
over rounds of its time over ``none``'s in the same round. Rows are MPE-sized (``agents``
agents, 18 observation and 5 action floats each, ``next_obs="stored"``); the log limit is
raised so that no checkpoint falls in a timed call. The machine's copy bandwidth is recorded.

Run: ``marlbuf bench log_checksums`` (3 and 24 agents; ``--quick``: 3 agents, fewer rounds), or
``python -m marlbuf.bench.suites.log_checksums [--agents 3 24] [--rounds 60] [--calls 100]``
(prints JSON).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from marlbuf import AgentSpec, MultiAgentReplayBuffer, _config
from marlbuf._kernels.checksum import (
    RECORD_HEAD_WORDS,
    RECORD_MAGIC,
    RECORD_TAIL_WORDS,
    TRAILER_MAGIC,
    payload_checksum,
    write_record,
)
from marlbuf.bench.tools.common import copy_bandwidth
from marlbuf.mapped import store as mapped_store


@njit(cache=True, nogil=True)
def _copy(dst: np.ndarray, at: int, src: np.ndarray) -> None:
    out = dst[at : at + src.shape[0]]
    for i in range(src.shape[0]):
        out[i] = src[i]


@njit(cache=True, nogil=True)
def write_unchecked(
    log: np.ndarray,
    at: int,
    rows: np.ndarray,
    streams: np.ndarray,
    flags: np.ndarray,
    ident: int,
    seq: int,
    first_generation: int,
    stream: int,
    flag_bits: int,
) -> int:
    """:func:`write_record` without checksums (zeros in their place): the same words copied."""
    body = at + RECORD_HEAD_WORDS
    flat = rows.reshape(rows.size)
    _copy(log, body, flat)
    _copy(log, body + flat.shape[0], streams.view(np.uint64))
    _copy(log, body + flat.shape[0] + streams.shape[0], flags.view(np.uint64))
    payload = flat.shape[0] + streams.shape[0] + flags.shape[0]
    head = log[at : at + RECORD_HEAD_WORDS]
    head[0] = np.uint64(RECORD_MAGIC)
    head[1] = np.uint64(ident)
    head[2] = np.uint64(seq)
    head[3] = np.uint64(first_generation)
    head[4] = np.uint64(rows.shape[0])
    head[5] = np.uint64(stream)
    head[6] = np.uint64(flag_bits)
    head[7] = np.uint64(payload)
    for i in range(8, RECORD_HEAD_WORDS):
        head[i] = 0
    end = body + payload
    tail = log[end : end + RECORD_TAIL_WORDS]
    tail[0] = np.uint64(TRAILER_MAGIC)
    tail[1] = np.uint64(seq)
    tail[2] = np.uint64(payload)
    for i in range(3, RECORD_TAIL_WORDS):
        tail[i] = 0
    return end + RECORD_TAIL_WORDS


def write_separate(log: np.ndarray, at: int, rows: np.ndarray, streams: np.ndarray,
                   flags: np.ndarray, *rest: int) -> int:  # fmt: skip
    """A checksum pass over the payload, then the record (the pass folding saves)."""
    payload_checksum(rows, streams, flags)
    return int(write_record(log, at, rows, streams, flags, *rest))


def measure(agents: int = 24, rounds: int = 60, calls: int = 100) -> dict[str, Any]:
    """Per-call medians and same-round ratios of mapped ``add``/``extend`` by record writer."""
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
    writers: dict[str, Callable[..., int]] = {
        "shipped": write_record,
        "separate": write_separate,
        "none": write_unchecked,
    }
    limit = _config.MAPPED_LOG_BYTES
    _config.MAPPED_LOG_BYTES = 1 << 30  # no checkpoint inside the timed calls
    out: dict[str, Any] = {"agents": agents, "rounds": rounds, "calls_per_sample": calls}
    try:
        with tempfile.TemporaryDirectory() as folder:
            buf = MultiAgentReplayBuffer(
                specs, 100_000, path=Path(folder) / "m", next_obs="stored", seed=0
            )
            out["row_bytes"] = buf._codec.row_bytes
            writes: dict[str, Callable[[], None]] = {
                "add": lambda: buf.add(**one),
                "extend64": lambda: buf.extend(**block),
            }
            for op, write in writes.items():
                samples: dict[str, list[float]] = {name: [] for name in writers}
                names = list(writers)
                for r in range(rounds + 2):  # two warm-up rounds
                    for name in names[r % 3 :] + names[: r % 3]:  # rotating order
                        mapped_store.write_record = writers[name]  # type: ignore[assignment]
                        start = time.perf_counter()
                        for _ in range(calls):
                            write()
                        elapsed = (time.perf_counter() - start) / calls
                        if r >= 2:
                            samples[name].append(elapsed)
                mapped_store.write_record = write_record
                base = np.asarray(samples["none"])
                for name, times in samples.items():
                    out[f"{op}_{name}_us"] = float(np.median(times)) * 1e6
                    if name != "none":
                        ratio = float(np.median(np.asarray(times) / base))
                        out[f"{op}_{name}_ratio"] = ratio
            buf.close()
    finally:
        mapped_store.write_record = write_record
        _config.MAPPED_LOG_BYTES = limit
    return out


SUITE = "log_checksums"


def run(quick: bool = False) -> dict[str, Any]:
    """The suite: :func:`measure` at 3 and 24 agents (``quick``: 3 agents, 10 rounds of 20
    calls), with the machine's copy bandwidth."""
    rounds, calls = (10, 20) if quick else (60, 100)
    agents = (3,) if quick else (3, 24)
    return {
        "copy_bandwidth_gb_s": copy_bandwidth() / 1e9,
        "runs": [measure(n, rounds, calls) for n in agents],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[3, 24])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    results: dict[str, Any] = {"copy_bandwidth_gb_s": copy_bandwidth() / 1e9}
    results["runs"] = [measure(n, args.rounds, args.calls) for n in args.agents]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
