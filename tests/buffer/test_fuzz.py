"""Fuzzing the public API in a subprocess: bad arguments raise, they never crash the process.

Each run is a fresh interpreter executing ``FUZZ`` (below) with a seed: a loop that drives
buffers of random specs, layouts and samplers with random, often invalid arguments and
catches only ``ValueError``, ``TypeError`` and ``MemoryError`` (what the README promises for
bad input). Anything else ends the subprocess with a traceback (exit code 1); a crash in
native code kills it with a signal (a negative return code; ``faulthandler`` prints where).
Successful samples are checked too: indices in range and rows equal to a fresh gather.

A few known crashes also get a targeted subprocess of their own, so that each is reported by
name and does not hide the others.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import marlbuf

REPO_ROOT = str(Path(marlbuf.__file__).resolve().parent.parent)

PRELUDE = r"""
import faulthandler, sys, time, warnings
faulthandler.enable()
warnings.simplefilter("ignore")  # warnings are not crashes; test_rejected_writes covers them
import numpy as np
from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.batch import Batch
from marlbuf.batch import SequenceBatch
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Sequence, Uniform

OK = (ValueError, TypeError, MemoryError)

def log(*parts):
    print(*parts, file=sys.stderr, flush=True)

def steps_data(specs, steps, rng):
    lead = () if steps is None else (steps,)
    data = {f: {} for f in FIELDS}
    for a, s in specs.items():
        for f in FIELDS:
            shape = lead + s.shape(f)
            if f == "action" and s.n_discrete_actions:
                data[f][a] = rng.integers(0, s.n_discrete_actions, size=lead)
            elif s.dtype(f).kind in "iu":
                data[f][a] = rng.integers(-5, 5, size=shape).astype(s.dtype(f))
            else:
                data[f][a] = rng.standard_normal(shape)
    return data

def check_batch(buf, batch, what):
    # a returned batch holds filled slots and the rows stored there
    if isinstance(batch, SequenceBatch):
        check_sequences(buf, batch, what)
        return
    idx = batch.indices
    assert idx.ndim == 1 and (idx.size == 0 or (idx.min() >= 0 and idx.max() < len(buf))), (
        what, idx, len(buf))
    fresh = buf.gather(idx.copy())
    for f in FIELDS:
        for a in buf.specs:
            got, want = batch.field(f)[a], fresh.field(f)[a]
            assert got.shape == want.shape and got.dtype == want.dtype, (what, f, a, got.shape)
            assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), (
                what, f, a, "rows differ from a fresh gather of the batch's indices")

def check_sequences(buf, batch, what):
    # every unmasked step holds the row of its slot, every masked step is zero
    slots, mask = batch.slots, batch.mask
    assert slots.shape == mask.shape and ((slots >= 0) == mask).all(), (what, "mask")
    assert (slots[mask] < len(buf)).all(), (what, slots, len(buf))
    fresh = buf.gather(slots[mask].copy())
    for f in FIELDS:
        for a in buf.specs:
            got = batch.field(f)[a]
            assert got.shape[:2] == mask.shape, (what, f, a, got.shape)
            assert np.ascontiguousarray(got[mask]).tobytes() == np.ascontiguousarray(
                fresh.field(f)[a]).tobytes(), (what, f, a, "steps differ from their slots")
            assert not np.ascontiguousarray(got[~mask]).view(np.uint8).any(), (what, f, a)

def fill(buf, steps, rng):
    buf.extend(**steps_data(buf.specs, steps, rng))
"""

FUZZ = (
    PRELUDE
    + r"""
seed, budget, max_ops = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
pick = lambda seq: seq[int(rng.integers(len(seq)))]

def rand_specs(narrow=False):
    specs = {}
    for i in range(int(rng.integers(1, 4))):
        if narrow:
            specs[f"ag{i}"] = AgentSpec((1,), (1,))
            continue
        obs = tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(1, 3))))
        kind = int(rng.integers(4))
        if kind == 0:
            specs[f"ag{i}"] = AgentSpec(obs, (int(rng.integers(1, 6)),))
        elif kind == 1:
            k = int(rng.integers(1, 5))
            specs[f"ag{i}"] = AgentSpec(obs, (k,), n_discrete_actions=k)
        elif kind == 2:
            specs[f"ag{i}"] = AgentSpec(obs, (2,), obs_dtype=np.float64, reward_dtype=np.float64)
        else:
            specs[f"ag{i}"] = AgentSpec(obs, (3,), obs_dtype=np.int32, action_dtype=np.int16)
    return specs

def rand_sampler(capacity):
    return pick([
        lambda: Uniform(), lambda: Uniform(replace=False),
        lambda: Neighbor(int(rng.integers(1, 5))), lambda: Neighbor(1 << 20),
        lambda: Neighbor(capacity + int(rng.integers(1, 4))),
        lambda: Prioritized(), lambda: Prioritized(priority="given"), lambda: PrioritizedNeighbor(),
        lambda: PrioritizedNeighbor(run_lengths=(1, 2, 64)),
        lambda: Sequence(int(rng.integers(1, 5)), burn_in=int(rng.integers(0, 3))),
        lambda: Sequence(2, pad=False), lambda: Sequence(3, prioritized=True),
        lambda: Sequence(capacity + 1),
        lambda: "uniform", lambda: None,
    ])()

def new_buffer():
    capacity = pick([1, 2, 3, 5, 8, 17, 64, 0, -1, 2.0, None, 1 << 62])
    specs = rand_specs(narrow=bool(rng.random() < 0.3))
    layout = pick(["interleaved", "agent_major", "interleaved", "agent_major", "rows", 3])
    n_trainers = pick([None, None, 1, 2, 5, 0, -2, 1.5])
    sampler = rand_sampler(capacity if isinstance(capacity, int) else 8)
    buf = MultiAgentReplayBuffer(specs, capacity, layout=layout, sampler=sampler,
                                 seed=int(rng.integers(1 << 30)), n_trainers=n_trainers,
                                 alive=bool(rng.random() < 0.3))
    fill(buf, int(rng.integers(1, 3 * buf.capacity + 3)), rng)
    return buf

def junk(shape):
    choice = int(rng.integers(16))
    if choice == 0:
        return np.full(shape, pick([np.nan, np.inf, -np.inf, 1e39, -1e39, 1e308]))
    if choice == 1:
        dt = pick(["f4", "f8", "i1", "i8", "u8", "?", "c8", "O", "U3", "M8[s]", "f2"])
        return np.zeros(shape, dtype=dt)
    if choice == 2:
        bad_shape = tuple(int(x) for x in rng.integers(0, 4, size=int(rng.integers(0, 4))))
        return np.zeros(bad_shape)
    if choice == 3:
        return pick([None, "abc", b"x", 10**30, -(10**30), 2**63, 1.5, True, 1 + 2j, {}, []])
    if choice == 4:
        return [[1.0], [2.0, 3.0]]  # ragged
    if choice == 5:
        return np.zeros(shape)[..., None] if shape else np.zeros((1,))
    if choice == 6:
        a = np.zeros((*shape, 2))[..., 0]  # non-contiguous
        a.setflags(write=False)
        return a
    if choice == 7:
        return np.full(shape, 2**62, dtype=np.int64)
    return np.zeros(shape)  # valid

def corrupt(data, specs, steps):
    f = pick(list(FIELDS))
    r = rng.random()
    if r < 0.1:
        data[f] = junk(())
    elif r < 0.2 and data[f]:
        data[f].pop(pick(list(data[f])))
    elif r < 0.3:
        data[f]["ghost"] = np.zeros(3)
    elif r < 0.4:
        data[f] = list(data[f].values())[: int(rng.integers(0, 4))]
    else:
        a = pick(list(specs))
        lead = () if steps is None else (pick([steps, steps, steps + 1, max(steps - 1, 0)]),)
        if f == "action" and specs[a].n_discrete_actions and rng.random() < 0.5:
            data[f][a] = np.full(lead, pick([-1, specs[a].n_discrete_actions, 2**40, 2**63 - 1]))
        else:
            data[f][a] = junk(lead + specs[a].shape(f))

def rand_batch_size(buf):
    run = getattr(buf.sampler, "run_length", 1)
    return pick([1, 2, 3, 4, 7, 16, 64, len(buf), len(buf) + 1, run, 2 * run, 0, -1, -(2**63),
                 2**62, 2**64, 1.5, "4", None, True, np.int64(4), np.uint64(2**63)])

def rand_trainer(buf):
    return pick([0, 0, 1, buf.n_trainers - 1, buf.n_trainers, -1, 10**20, 1.0, None, True])

def rand_indices(buf):
    n = len(buf)
    choice = int(rng.integers(12))
    if choice == 0:
        return rng.integers(0, max(n, 1), size=int(rng.integers(1, 9)))
    if choice == 1:
        return np.array([0, n])
    if choice == 2:
        return np.array([-1, 0])
    if choice == 3:
        return np.array([2**63 - 1])
    if choice == 4:
        return np.array([2**64 - 1], dtype=np.uint64)
    if choice == 5:
        return np.array([0.5])
    if choice == 6:
        return np.zeros((2, 2), dtype=np.int64)
    if choice == 7:
        a = np.zeros(8, dtype=np.int64)[::2]  # non-contiguous
        return a
    if choice == 8:
        a = rng.integers(0, max(n, 1), size=4)
        a.setflags(write=False)
        return a
    if choice == 9:
        return np.array([], dtype=np.int64)
    if choice == 10:
        return np.zeros(4, dtype=np.int8)
    return ["0", "1"]

def rand_td(k):
    choice = int(rng.integers(8))
    if choice == 0:
        return np.full(k, np.nan)
    if choice == 1:
        return -np.ones(k)
    if choice == 2:
        return np.ones(k + 1)
    if choice == 3:
        return np.full(k, 1e308)
    if choice == 4:
        return np.ones(k, dtype=np.complex64)
    if choice == 5:
        return ["x"] * k
    if choice == 6:
        return np.ones((k, 1))
    return rng.standard_normal(k)

buffers, batches = [], []

def forget(out):
    # batches passed as out= are overwritten: drop them from the pool, so that the pool never
    # holds two batches sharing memory (except when a test hands the same one twice)
    for b in out if isinstance(out, list) else [out]:
        for i in range(len(batches) - 1, -1, -1):
            if batches[i] is b:
                del batches[i]

start, ops, caught = time.monotonic(), 0, 0
while ops < max_ops and time.monotonic() - start < budget:
    ops += 1
    try:
        if len(buffers) < 2 or rng.random() < 0.04:
            log(ops, "new buffer")
            buffers.append(new_buffer())
            buffers = buffers[-4:]
            continue
        buf = pick(buffers)
        op = int(rng.integers(9))
        if op == 0:
            data = steps_data(buf.specs, None, rng)
            if rng.random() < 0.7:
                corrupt(data, buf.specs, None)
            truncated = pick([False, False, True, {pick(list(buf.specs)): True}, "yes", None,
                              np.ones(3, bool), 2])
            log(ops, "add", repr(truncated)[:40], buf)
            buf.add(**data, truncated=truncated)
        elif op == 1:
            steps = pick([1, 2, 5, buf.capacity, buf.capacity + 3])
            data = steps_data(buf.specs, steps, rng)
            if rng.random() < 0.7:
                corrupt(data, buf.specs, steps)
            truncated = pick([False, False, rng.random(steps) < 0.3, np.ones(steps + 1, bool),
                              True, "x"])
            log(ops, "extend", steps, repr(truncated)[:40], buf)
            buf.extend(**data, truncated=truncated)
        elif op in (2, 3):
            size = rand_batch_size(buf)
            trainer = rand_trainer(buf)
            out = pick([None, None] + [b for b in batches if b is not None])
            if rng.random() < 0.03:
                out = pick(["batch", 7, [out]])  # not a Batch at all
            log(ops, "sample", repr(size), repr(trainer), type(out).__name__,
                None if not isinstance(out, Batch) else len(out), buf)
            forget(out)  # its memory now belongs to the new batch
            batch = buf.sample(size, trainer=trainer, out=out)
            check_batch(buf, batch, "sample")
            batches.append(batch)
        elif op == 4:
            size = rand_batch_size(buf)
            n = pick([None, 1, 2, buf.n_trainers, buf.n_trainers + 1, 0])
            shared = bool(rng.random() < 0.4)
            pool = [b for b in batches if b is not None]
            k = buf.n_trainers if n is None else n
            out = None
            if pool and rng.random() < 0.6:
                out = pick([
                    [pick(pool)] * (k if isinstance(k, int) and 0 < k < 9 else 1),
                    [pick(pool) for _ in range(k if isinstance(k, int) and 0 < k < 9 else 1)],
                    [pick(pool)],
                    pick(pool),
                ])
            log(ops, "sample_for_trainers", repr(size), n, shared, type(out).__name__, buf)
            forget(out)
            result = buf.sample_for_trainers(size, n_trainers=n, shared_index=shared, out=out)
            for b in result:
                check_batch(buf, b, "sample_for_trainers")
            batches.extend(result)
        elif op == 5:
            idx = rand_indices(buf)
            log(ops, "gather", repr(idx)[:80], buf)
            batch = buf.gather(idx, trainer=pick([None, 0, 5]))
            check_batch(buf, batch, "gather")
        elif op == 6:
            pool = [b for b in batches if b is not None]
            if pool and rng.random() < 0.7:
                b = pick(pool)
                idx, gens = b.indices, pick([b.generations, None, b.generations[:-1]])
            else:
                idx, gens = rand_indices(buf), None
            k = len(idx) if hasattr(idx, "__len__") else 1
            td = rand_td(k)
            log(ops, "update_priorities", repr(idx)[:60], repr(td)[:60], buf)
            buf.update_priorities(idx, td, trainer=rand_trainer(buf), generations=gens)
        elif op == 7:
            other = pick(buffers)
            log(ops, "load_state_dict", buf, other)
            other.load_state_dict(buf.state_dict())
        else:
            batches = batches[-6:]
            if rng.random() < 0.3:
                batches.clear()
    except OK:
        caught += 1
print(ops, "operations,", caught, "rejected")
"""
)


def run_code(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    env.setdefault("NUMBA_NUM_THREADS", "2")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO_ROOT,
    )


def describe(proc: subprocess.CompletedProcess) -> str:
    rc = proc.returncode
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "unknown signal"
        what = f"killed by signal {-rc} ({name})"
    else:
        what = f"exit code {rc}"
    return (
        f"subprocess {what}\n--- stdout ---\n{proc.stdout[-2000:]}\n--- stderr ---\n"
        + (proc.stderr[-4000:])
    )


@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_fuzz_public_api_never_crashes(seed):
    proc = run_code(FUZZ, str(seed), "2.0", "4000")  # at most 2 s of operations
    assert proc.returncode == 0, describe(proc)
    assert "operations" in proc.stdout


# ------------------------------------------------------------------------------ known crashes
# Each scenario must either be rejected with ValueError/TypeError or give correct batches.

NARROW_OUT = (
    PRELUDE
    + r"""
layout, other_layout = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
wide = {"a": AgentSpec((300,), (20,)), "b": AgentSpec((300,), (20,))}
narrow = {"a": AgentSpec((2,), (1,)), "b": AgentSpec((2,), (1,))}
big = MultiAgentReplayBuffer(wide, 64, layout=layout, seed=0)
small = MultiAgentReplayBuffer(narrow, 64, layout=other_layout, seed=0)
fill(big, 64, rng)
fill(small, 64, rng)
for _ in range(20):
    out = small.sample(32)
    try:
        batch = big.sample(32, out=out)
    except OK:
        continue
    check_batch(big, batch, "sample with out= from a narrower buffer")
    try:
        batches = big.sample_for_trainers(32, out=[small.sample(32), small.sample(32)])
    except OK:
        continue
    for b in batches:
        check_batch(big, b, "sample_for_trainers with out= from a narrower buffer")
print("ok")
"""
)


@pytest.mark.parametrize(
    ("layout", "other_layout"),
    [
        ("interleaved", "interleaved"),
        ("agent_major", "agent_major"),
        ("interleaved", "agent_major"),
        ("agent_major", "interleaved"),
    ],
)
def test_sample_out_from_narrower_buffer(layout, other_layout):
    proc = run_code(NARROW_OUT, layout, other_layout)
    assert proc.returncode == 0, describe(proc)


HUGE_RUN = (
    PRELUDE
    + r"""
rng = np.random.default_rng(0)
specs = {"a": AgentSpec((2,), (1,))}
for layout in ("interleaved", "agent_major"):
    try:
        buf = MultiAgentReplayBuffer(specs, 2, layout=layout, sampler=Neighbor(1 << 20), seed=0)
    except OK:
        continue
    fill(buf, 5, rng)
    for size in (1 << 20, 2 << 20):
        try:
            batch = buf.sample(size)
        except OK:
            continue
        check_batch(buf, batch, "Neighbor(1 << 20) on capacity 2")
print("ok")
"""
)


def test_neighbor_run_longer_than_capacity():
    proc = run_code(HUGE_RUN)
    assert proc.returncode == 0, describe(proc)
