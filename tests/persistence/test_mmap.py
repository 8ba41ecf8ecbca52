"""Memory-mapped buffers (``path=``): reopening, crash consistency, bad paths, checkpoints."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from datagen import random_step_data

import marlbuf
from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer, _config, mapped, persistence
from marlbuf.samplers import Neighbor, Prioritized, Uniform
from tests.persistence.encoded_steps import (
    CAPACITY,
    MAX_STEPS_PER_CALL,
    SPECS,
    check_consistent,
    encoded,
    extend_calls,
    killed_after,
    one_step,
)


# ---------------------------------------------------------------------------- reopening
def _write_mixed(buf: MultiAgentReplayBuffer, rng: np.random.Generator, calls: int) -> None:
    """add, extend (episode boundaries, longer than the ring once) and add_envs (3 streams)."""
    for k in range(calls):
        kind = k % 3
        if kind == 0:
            data = random_step_data(buf.specs, 1, rng)
            buf.add(**{f: {a: x[0] for a, x in per.items()} for f, per in data.items()})
        elif kind == 1:
            steps = int(rng.integers(2, 12)) if k != 4 else buf.capacity + 5
            data = random_step_data(buf.specs, steps, rng)
            # observations stored once: make most next_obs equal to the next obs (links)
            for a in buf.specs:
                data["next_obs"][a][:-1] = data["obs"][a][1:]
            buf.extend(**data)
        else:
            buf.add_envs(**random_step_data(buf.specs, 3, rng), first_stream=1)


def _assert_same(a: MultiAgentReplayBuffer, b: MultiAgentReplayBuffer) -> None:
    assert (a.cursor, a.size, a.total_writes) == (b.cursor, b.size, b.total_writes)
    np.testing.assert_array_equal(a.write_generation, b.write_generation)
    if a.links is not None:
        assert b.links is not None
        sa, sb = a.links.state_dict(), b.links.state_dict()
        for key in sa:
            np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)


def _assert_same_batches(a: MultiAgentReplayBuffer, b: MultiAgentReplayBuffer, n: int) -> None:
    for t in range(a.n_trainers):
        x, y = a.sample(n, trainer=t), b.sample(n, trainer=t)
        np.testing.assert_array_equal(x.indices, y.indices)
        for f in FIELDS:
            for agent in a.specs:
                np.testing.assert_array_equal(x.field(f)[agent], y.field(f)[agent])
        if x.weights is not None:
            np.testing.assert_array_equal(x.weights, y.weights)


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("next_obs", ["once", "stored"])
def test_reopen_after_close_gives_identical_batches(tmp_path, mixed_specs, layout, next_obs):
    kwargs = dict(layout=layout, next_obs=next_obs, sampler=Neighbor(2), seed=5)
    ram = MultiAgentReplayBuffer(mixed_specs, 32, **kwargs)
    folder = tmp_path / "buf"
    with MultiAgentReplayBuffer(mixed_specs, 32, path=folder, **kwargs) as buf:
        assert buf.path == str(folder)
        for b in (ram, buf):
            _write_mixed(b, np.random.default_rng(1), 9)
        _assert_same(ram, buf)
        _assert_same_batches(ram, buf, 8)
    assert buf.path == str(folder)  # closed, not forgotten
    with pytest.raises(ValueError, match="closed; reopen it with"):
        _write_mixed(buf, np.random.default_rng(0), 1)
    reopened = MultiAgentReplayBuffer.open(folder)
    assert reopened.specs == ram.specs and reopened.layout == layout
    assert reopened.next_obs == next_obs and repr(reopened.sampler) == repr(ram.sampler)
    for array in reopened.storage.arrays().values():  # the files, mapped: nothing was copied
        owner = array
        while isinstance(owner, np.ndarray):
            owner = owner.base
        assert isinstance(getattr(owner, "obj", owner), mmap.mmap)
    _assert_same(ram, reopened)
    _assert_same_batches(ram, reopened, 8)  # same RNG state, same rows
    for b in (ram, reopened):  # and they go on alike
        _write_mixed(b, np.random.default_rng(2), 5)
    _assert_same(ram, reopened)
    _assert_same_batches(ram, reopened, 8)
    reopened.close()
    reopened.close()  # twice is fine


def test_reopen_restores_batch_options_and_priorities(tmp_path, mixed_specs):
    kwargs = dict(
        sampler=Prioritized(alpha=0.6, beta=0.4),
        seed=2,
        batch_layout="per_agent",
        batch_dtype="storage",
        n_trainers=2,
    )
    ram = MultiAgentReplayBuffer(mixed_specs, 40, **kwargs)
    buf = MultiAgentReplayBuffer(mixed_specs, 40, path=tmp_path / "p", **kwargs)
    rng = np.random.default_rng(0)
    for b in (ram, buf):
        _write_mixed(b, np.random.default_rng(3), 6)
    for _ in range(3):
        td = rng.random(16)
        for b in (ram, buf):
            batch = b.sample(16, trainer=1)
            b.update_priorities(batch.indices, td, trainer=1)
    buf.close()
    reopened = MultiAgentReplayBuffer.open(tmp_path / "p")
    assert reopened.batch_layout == "per_agent" and reopened.storage.batch_dtype == "storage"
    assert reopened.n_trainers == 2
    _assert_same(ram, reopened)
    _assert_same_batches(ram, reopened, 16)  # priorities and RNG restored: same draws, weights
    reopened.close()


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_reopen_without_close_replays_the_log(tmp_path, mixed_specs, layout):
    """A buffer that was never closed (its process died): the logged writes are replayed."""
    ram = MultiAgentReplayBuffer(mixed_specs, 16, layout=layout, seed=0)
    buf = MultiAgentReplayBuffer(mixed_specs, 16, layout=layout, seed=0, path=tmp_path / "b")
    for b in (ram, buf):
        _write_mixed(b, np.random.default_rng(4), 8)
    assert os.path.getsize(tmp_path / "b" / mapped.LOG) > 0
    assert buf._mapped is not None
    buf._mapped.release()  # as if the process had died: no checkpoint, the lock is gone
    reopened = MultiAgentReplayBuffer.open(tmp_path / "b")
    _assert_same(ram, reopened)
    batch = reopened.gather(np.arange(len(reopened)))
    expected = ram.gather(np.arange(len(ram)))
    for f in FIELDS:
        for agent in mixed_specs:
            np.testing.assert_array_equal(batch.field(f)[agent], expected.field(f)[agent])
    reopened.close()


def test_log_is_checkpointed_and_stays_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(_config, "MAPPED_LOG_BYTES", 2048)
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, path=tmp_path / "c", seed=0)
    t = 0
    for _ in range(300):
        steps = 1 + t % 5
        buf.extend(**encoded(np.arange(t, t + steps)))
        t += steps
        store = buf._mapped
        assert store is not None
        assert store._offset - mapped.LOG_HEADER_BYTES < store._limit  # checkpointed when reached
    assert store.checkpoint_number > 10
    # stays bounded: reserved in whole units, given back when a huge write grew it
    assert os.path.getsize(tmp_path / "c" / mapped.LOG) <= 2 * mapped.LOG_UNIT_BYTES
    store.release()
    reopened = MultiAgentReplayBuffer.open(tmp_path / "c")
    assert reopened.total_writes == t
    check_consistent(reopened)
    reopened.close()


def test_durable_writes(tmp_path):
    with MultiAgentReplayBuffer(SPECS, 8, path=tmp_path / "d", durable=True, seed=0) as buf:
        for t in range(5):
            buf.extend(**encoded(np.arange(2 * t, 2 * t + 2)))
    with MultiAgentReplayBuffer.open(tmp_path / "d", durable=True) as reopened:
        assert reopened.total_writes == 10
        check_consistent(reopened)


def _last_record(buf: MultiAgentReplayBuffer, steps: int) -> tuple[int, int]:
    """(start, bytes) of the last log record of ``buf``, a call of ``steps`` steps."""
    assert buf._mapped is not None
    payload = steps * buf._codec.row_words * 8
    size = mapped.RECORD_HEADER_BYTES + payload + mapped.RECORD_TRAILER_BYTES
    return buf._mapped._offset - size, size


def _killed_writing(folder: Path, calls: int, steps: int) -> tuple[MultiAgentReplayBuffer, int]:
    """:func:`killed_after`, then a call of ``steps`` steps killed while its record was being
    written: the record is in the log, nothing after it (no stamps, no rows) happened."""
    buf = MultiAgentReplayBuffer(SPECS, 16, path=folder, seed=0)
    t = extend_calls(buf, calls)
    store = buf._mapped
    assert store is not None and store._stamps is not None
    stamps = store._stamps.copy()
    rows, _ = buf._codec.stage(encoded(np.arange(t, t + steps)), steps)
    store.log(rows, steps, 0)
    store._stamps[:] = stamps  # killed before the stamps (and the rows) were written
    store.release()
    return buf, t


def test_a_torn_log_record_is_dropped(tmp_path):
    """Killed while writing a record (a prefix of it written, no trailer): that call never
    reached the table and is not replayed; the calls before it are."""
    for name, keep in (
        ("trailer", -mapped.RECORD_TRAILER_BYTES + 3),
        ("payload", mapped.RECORD_HEADER_BYTES + 10),
        ("header", mapped.RECORD_HEADER_BYTES // 2),
    ):
        buf, total = _killed_writing(tmp_path / name, 8, 4)
        start, size = _last_record(buf, 4)
        cut = start + keep if keep > 0 else start + size + keep
        with open(tmp_path / name / mapped.LOG, "r+b") as fh:  # the rest never written
            fh.seek(cut)
            fh.write(bytes(start + size - cut))
        with MultiAgentReplayBuffer.open(tmp_path / name) as reopened:
            assert reopened.total_writes == total
            check_consistent(reopened)


def test_a_complete_last_record_damaged_later_is_refused(tmp_path):
    """The same cuts in the last record of a call that returned (its stamps and rows are in
    the table): not a torn tail but a damaged log, refused."""
    for name, keep in (
        ("trailer", -mapped.RECORD_TRAILER_BYTES + 3),
        ("payload", mapped.RECORD_HEADER_BYTES + 10),
        ("header", mapped.RECORD_HEADER_BYTES // 2),
    ):
        buf, _ = killed_after(tmp_path / name, 8)  # the last call wrote 4 steps
        start, size = _last_record(buf, 4)
        cut = start + keep if keep > 0 else start + size + keep
        with open(tmp_path / name / mapped.LOG, "r+b") as fh:
            fh.seek(cut)
            fh.write(bytes(start + size - cut))
        with pytest.raises(mapped.LogDamaged, match="hold rows of writes"):
            MultiAgentReplayBuffer.open(tmp_path / name)


def test_a_damaged_truncated_or_missing_log_is_refused(tmp_path):
    """After an unclean close, a log that does not vouch for the table is refused with what
    was found (before: opened with rows that did not hold their generation's step)."""
    cases = {
        "bit flip in a complete record": lambda log, buf: _flip(log, mapped.LOG_HEADER_BYTES + 70),
        "bit flip in a header": lambda log, buf: _flip(log, mapped.LOG_HEADER_BYTES + 20),
        "truncated": lambda log, buf: os.truncate(log, _last_record(buf, 4)[0] + 10),
        "truncated at a record": lambda log, buf: os.truncate(log, _last_record(buf, 4)[0]),
        "emptied": lambda log, buf: os.truncate(log, 0),
        "deleted": lambda log, buf: log.unlink(),
        "a folder": lambda log, buf: (log.unlink(), log.mkdir()),
    }
    for k, (name, damage) in enumerate(cases.items()):
        folder = tmp_path / f"case{k}"
        buf, _ = killed_after(folder, 8)
        damage(folder / mapped.LOG, buf)
        with pytest.raises(ValueError, match=r"not opened|is a folder") as info:
            MultiAgentReplayBuffer.open(folder)
        message = str(info.value)
        assert "log" in message, (name, message)
        assert "Put back the log" in message or "regular file" in message, (name, message)


def test_an_older_checkpoint_is_refused(tmp_path):
    folder = tmp_path / "old"
    buf = MultiAgentReplayBuffer(SPECS, 16, path=folder, seed=0)
    buf.extend(**encoded(np.arange(5)))
    buf.flush()
    old = (folder / mapped.CHECKPOINT).read_bytes()
    buf.extend(**encoded(np.arange(5, 30)))  # wraps the ring
    buf.flush()
    buf.extend(**encoded(np.arange(30, 33)))
    assert buf._mapped is not None
    buf._mapped.release()  # the process dies; someone puts the older checkpoint back
    (folder / mapped.CHECKPOINT).write_bytes(old)
    with pytest.raises(ValueError, match="older than its log"):
        MultiAgentReplayBuffer.open(folder)


def test_a_clean_close_leaves_nothing_like_a_crash(tmp_path):
    folder = tmp_path / "clean"
    with MultiAgentReplayBuffer(SPECS, 16, path=folder, seed=0) as buf:
        buf.extend(**encoded(np.arange(20)))
    # nothing to replay: the log's header marked clean, one unit kept
    assert (folder / mapped.LOG).stat().st_size == mapped.LOG_UNIT_BYTES
    state = persistence.read_state(folder / mapped.CHECKPOINT)
    assert state["mapped"]["clean"] is True
    (folder / mapped.LOG).unlink()  # a clean folder does not need its log
    with MultiAgentReplayBuffer.open(folder) as reopened:
        assert reopened.total_writes == 20
        check_consistent(reopened)
        reopened.extend(**encoded(np.arange(20, 23)))
    with MultiAgentReplayBuffer.open(folder) as reopened:
        assert reopened.total_writes == 23
        check_consistent(reopened)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 1]))


def test_rows_torn_in_the_table_are_rewritten_from_the_log(tmp_path):
    """Killed while writing rows to the table (their record complete): replay rewrites them."""
    buf, total = killed_after(tmp_path / "r", 9)
    table = buf.storage.arrays()["table"]
    newest = buf.writer.newest(4)
    table[newest[1:3], 1:] = 0xDEADBEEF  # half-written rows of the last call
    with MultiAgentReplayBuffer.open(tmp_path / "r") as reopened:
        assert reopened.total_writes == total
        check_consistent(reopened)


# ---------------------------------------------------------------------------- crash consistency
CHILD = """
import os, sys
import numpy as np
sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]  # this folder, and tests/
from encoded_steps import CAPACITY, MAX_STEPS_PER_CALL, SPECS, encoded, one_step, write_encoded
from marlbuf import MultiAgentReplayBuffer, _config
from marlbuf.samplers import Neighbor, Prioritized

_config.MAPPED_LOG_BYTES = 4096  # checkpoints every few calls: kills land in them too
folder, layout, next_obs, ack, seed = sys.argv[2:7]
# load the kernels first (an in-memory twin), so that the kill delay is spent writing
twin = MultiAgentReplayBuffer(SPECS, CAPACITY, layout=layout, next_obs=next_obs, seed=0)
twin.extend(**encoded(np.arange(5)))
twin.add(**one_step(5))
twin.sample(2)
if os.path.exists(os.path.join(folder, "manifest.json")):
    buf = MultiAgentReplayBuffer.open(folder)
else:
    sampler = Prioritized() if layout == "interleaved" else Neighbor(2)
    buf = MultiAgentReplayBuffer(
        SPECS, CAPACITY, layout=layout, next_obs=next_obs, sampler=sampler, path=folder, seed=0
    )
fd = os.open(ack, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.write(fd, b"ready %d\\n" % buf.total_writes)
rng = np.random.default_rng(int(seed))
t = buf.total_writes
while True:
    steps = 1 if rng.random() < 0.5 else int(rng.integers(2, MAX_STEPS_PER_CALL + 1))
    t = write_encoded(buf, t, steps)
    os.write(fd, b"%d\\n" % t)  # acknowledged: add/extend returned
    if rng.random() < 0.2 and len(buf) >= 4:
        batch = buf.sample(4)
        if buf.sampler.weighted:
            buf.update_priorities(batch.indices, rng.random(4) + 0.1)
"""


def _last_ack(ack: Path) -> tuple[bool, int | None]:
    """(child got ready, last acknowledged total_writes) from the child's acknowledgements."""
    lines = ack.read_bytes().split(b"\n")[:-1] if ack.exists() else []  # complete lines only
    ready = [i for i, line in enumerate(lines) if line.startswith(b"ready")]
    if not ready:
        return False, None
    last = lines[-1]
    return True, int(last.split()[-1])


@pytest.mark.parametrize(
    ("layout", "next_obs"),
    [("interleaved", "once"), pytest.param("agent_major", "stored", marks=pytest.mark.slow)],
)
def test_killed_writer_reopens_consistent(tmp_path, layout, next_obs):
    """A writer killed with SIGKILL at random points (in add, extend, checkpoints, open) reopens
    with no torn row, every acknowledged write kept and at most the call in flight added."""
    folder = tmp_path / "crash"
    env = dict(os.environ, PYTHONPATH=str(Path(marlbuf.__file__).parent.parent))
    tests_dir = str(Path(__file__).parent)  # where encoded_steps.py is
    rng = np.random.default_rng()  # kill points differ from run to run anyway (timing)
    known = 0  # total_writes after the last verification
    deadline = time.monotonic() + 5.0
    rounds = 0
    # at least two kills, and on until the ring has wrapped (a loaded machine writes less per
    # round: more rounds, never a weaker check)
    while rounds < 2 or known <= CAPACITY or (time.monotonic() < deadline and rounds < 4):
        assert rounds < 60, f"{known} writes after {rounds} rounds: the writer stalls"
        ack = tmp_path / f"ack{rounds}"
        args = [tests_dir, str(folder), layout, next_obs, str(ack), str(rounds)]
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            env=env,
            stderr=subprocess.PIPE,
        )
        try:
            waited = time.monotonic()
            while not _last_ack(ack)[0] and child.poll() is None:
                if time.monotonic() - waited > 30:
                    raise AssertionError("the writer did not start")
                time.sleep(0.01)
            time.sleep(float(rng.uniform(0.0, 0.4)))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            errors = child.stderr.read().decode() if child.stderr else ""
            if child.stderr:
                child.stderr.close()
        assert child.returncode == -signal.SIGKILL, errors  # it did not fail on its own
        _, acked = _last_ack(ack)
        assert acked is not None
        buf = MultiAgentReplayBuffer.open(folder)
        assert acked <= buf.total_writes <= acked + MAX_STEPS_PER_CALL
        assert buf.total_writes >= known
        check_consistent(buf)
        if len(buf) >= 4:
            buf.sample(4)
        known = buf.total_writes
        buf.close()
        rounds += 1
        print(f"round {rounds}: {known} writes")
    assert known > CAPACITY  # the ring wrapped


# ---------------------------------------------------------------------------- paths and files
def test_bad_paths_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"parent .* does not exist; create it first"):
        MultiAgentReplayBuffer(SPECS, 8, path=tmp_path / "missing" / "buf")
    file = tmp_path / "file.bin"
    file.write_bytes(b"x")
    with pytest.raises(FileExistsError, match="is a file; a memory-mapped buffer keeps"):
        MultiAgentReplayBuffer(SPECS, 8, path=file)
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike"):
        MultiAgentReplayBuffer(SPECS, 8, path=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path must name a folder"):
        MultiAgentReplayBuffer(SPECS, 8, path="")
    with pytest.raises(TypeError, match="durable must be a bool"):
        MultiAgentReplayBuffer(SPECS, 8, path=tmp_path / "x", durable="yes")  # type: ignore
    with pytest.raises(ValueError, match="memory-mapped buffers only: pass path= as well"):
        MultiAgentReplayBuffer(SPECS, 8, durable=True)
    with pytest.raises(TypeError, match="seed must be"):
        MultiAgentReplayBuffer(SPECS, 8, path=tmp_path / "y", seed="s")  # type: ignore
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    wide = {"a": AgentSpec(obs_shape=(50_000,), action_shape=(1,), obs_dtype=np.float64)}
    with pytest.raises(OSError, match="GiB on disk but"):  # 32 TB of rows, 160 MB of metadata
        MultiAgentReplayBuffer(wide, 2 * 10**7, next_obs="stored", path=tmp_path / "huge")
    assert not (tmp_path / "huge").exists()  # a failed creation leaves nothing behind
    with pytest.raises(FileNotFoundError, match="the folder does not exist"):
        MultiAgentReplayBuffer.open(tmp_path / "nothing")
    with pytest.raises(NotADirectoryError, match="is a file, not the folder"):
        MultiAgentReplayBuffer.open(file)
    with pytest.raises(TypeError, match="path must be a str"):
        MultiAgentReplayBuffer.open(None)  # type: ignore[arg-type]


def test_a_path_holding_something_else_is_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds other files \(notes.txt\)"):
        MultiAgentReplayBuffer(SPECS, 8, path=foreign)
    with pytest.raises(ValueError, match="is not a marlbuf memory-mapped buffer"):
        MultiAgentReplayBuffer.open(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"  # untouched
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is not a marlbuf memory-mapped buffer"):
        MultiAgentReplayBuffer.open(empty)
    npz = tmp_path / "saved.npz"
    MultiAgentReplayBuffer(SPECS, 8).save(npz)
    with pytest.raises(NotADirectoryError, match=r"read with MultiAgentReplayBuffer\.load"):
        MultiAgentReplayBuffer.open(npz)

    folder = tmp_path / "buf"
    buf = MultiAgentReplayBuffer(SPECS, 8, path=folder, seed=0)
    with pytest.raises(BlockingIOError, match="is open in another buffer object"):
        MultiAgentReplayBuffer.open(folder)
    buf.close()
    with pytest.raises(FileExistsError, match="already holds a memory-mapped buffer; reopen"):
        MultiAgentReplayBuffer(SPECS, 8, path=folder)
    # a manifest of another kind, a truncated storage file, a missing checkpoint
    manifest = json.loads((folder / mapped.MANIFEST).read_text())
    (folder / mapped.MANIFEST).write_text(json.dumps({**manifest, "format": "other"}))
    with pytest.raises(ValueError, match="not a marlbuf memory-mapped buffer manifest"):
        MultiAgentReplayBuffer.open(folder)
    (folder / mapped.MANIFEST).write_text("{not json")
    with pytest.raises(ValueError, match="is corrupt"):
        MultiAgentReplayBuffer.open(folder)
    (folder / mapped.MANIFEST).write_text(json.dumps(manifest))
    table = folder / manifest["arrays"]["table"]["file"]
    size = table.stat().st_size
    os.truncate(table, size - 8)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        MultiAgentReplayBuffer.open(folder)
    os.truncate(table, size)
    (folder / mapped.CHECKPOINT).unlink()
    with pytest.raises(ValueError, match=r"lacks its state\.npz"):
        MultiAgentReplayBuffer.open(folder)


def test_interrupted_creation_is_reported_and_reused(tmp_path):
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "array-0.bin").write_bytes(b"\0" * 64)  # what a creation killed early leaves
    (folder / "lock").write_bytes(b"")
    with pytest.raises(ValueError, match="creation was interrupted"):
        MultiAgentReplayBuffer.open(folder)
    with MultiAgentReplayBuffer(SPECS, 8, path=folder, seed=0) as buf:
        buf.add(**one_step(0))
    with MultiAgentReplayBuffer.open(folder) as buf:
        assert len(buf) == 1


# ---------------------------------------------------------------------------- save / load
def test_save_streams_from_the_mapped_files(tmp_path):
    """The rows are streamed a chunk at a time (each chunk copied under the lock, so that a
    writer thread cannot tear the snapshot); the rest is metadata, small for linked steps."""
    capacity = 4096
    specs = {f"a{i}": AgentSpec(obs_shape=(64,), action_shape=(8,)) for i in range(4)}
    with MultiAgentReplayBuffer(specs, capacity, path=tmp_path / "m", seed=0) as buf:
        data = random_step_data(specs, capacity, np.random.default_rng(0))
        for a in specs:  # one episode: every next_obs is the next obs (one side row)
            data["next_obs"][a][:-1] = data["obs"][a][1:]
        buf.extend(**data)
        table_bytes = buf.storage.arrays()["table"].nbytes
        tracemalloc.start()
        buf.save(tmp_path / "m.npz")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # one chunk of rows and the metadata: nothing like a copy of the table
        assert peak < persistence.LIVE_CHUNK_BYTES + table_bytes / 8, (peak, table_bytes)
        loaded = MultiAgentReplayBuffer.load(tmp_path / "m.npz")
        _assert_same(buf, loaded)
        _assert_same_batches(buf, loaded, 32)


def test_loading_a_state_into_a_mapped_buffer(tmp_path, mixed_specs):
    ram = MultiAgentReplayBuffer(mixed_specs, 16, seed=1)
    _write_mixed(ram, np.random.default_rng(0), 6)
    ram.save(tmp_path / "ram.npz")
    buf = MultiAgentReplayBuffer(mixed_specs, 16, seed=1, path=tmp_path / "m")
    persistence.load_into(buf, tmp_path / "ram.npz")  # streamed into the mapped files
    _assert_same(ram, buf)
    buf._mapped.release()  # killed right after: the loaded state was checkpointed
    reopened = MultiAgentReplayBuffer.open(tmp_path / "m")
    _assert_same(ram, reopened)
    _assert_same_batches(ram, reopened, 4)
    # killed while a state was being loaded: refused, not half-loaded
    assert reopened._mapped is not None
    reopened._mapped.begin_replace()
    reopened._mapped.release()
    with pytest.raises(ValueError, match="contents are lost; delete the folder"):
        MultiAgentReplayBuffer.open(tmp_path / "m")


def test_in_memory_buffers_have_the_same_methods(mixed_specs):
    with MultiAgentReplayBuffer(mixed_specs, 4, sampler=Uniform()) as buf:
        buf.flush()
        assert buf.path is None
    buf.close()


@pytest.mark.parametrize("kind", ["sequence", "episodes"])
def test_sequences_survive_a_crash(tmp_path, mixed_specs, kind):
    """A mapped buffer with a sequence (or whole-episode) sampler: the log records the
    truncation flags, so the replay after a crash rebuilds the episode index exactly."""
    from marlbuf.samplers import Episodes, Sequence

    def sampler():
        return Sequence(3, burn_in=1) if kind == "sequence" else Episodes(max_length=8)

    ram = MultiAgentReplayBuffer(mixed_specs, 40, sampler=sampler(), seed=2)
    buf = MultiAgentReplayBuffer(mixed_specs, 40, sampler=sampler(), seed=2, path=tmp_path / "b")
    rng = np.random.default_rng(0)
    stream = random_step_data(mixed_specs, 80, rng)  # observations of one long stream
    t = 0
    for call in range(12):
        steps = 1 + call % 5
        data = random_step_data(mixed_specs, steps, rng)
        for agent in mixed_specs:  # linked steps; every third call ends a truncated episode
            data["obs"][agent] = stream["obs"][agent][t : t + steps]
            data["next_obs"][agent] = stream["obs"][agent][t + 1 : t + steps + 1]
            data["done"][agent][:] = 0
        cut = np.zeros(steps, dtype=bool)
        cut[-1] = call % 3 == 2
        t += steps  # a cut (a time limit) with the stream going on: only the flag ends it
        for b in (ram, buf):
            b.extend(**data, truncated=cut)
    assert buf._mapped is not None
    buf._mapped.release()  # as if the process had died after the last call returned
    reopened = MultiAgentReplayBuffer.open(tmp_path / "b")
    for t in range(len(mixed_specs)):
        want, got = ram.sample(4, trainer=t), reopened.sample(4, trainer=t)
        np.testing.assert_array_equal(got.mask, want.mask)
        np.testing.assert_array_equal(got.slots, want.slots)
        for agent in mixed_specs:
            np.testing.assert_array_equal(got.obs[agent], want.obs[agent])
    reopened.close()
