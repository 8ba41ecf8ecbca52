"""state_dict / save / load round trips and corrupt files."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from datagen import random_step_data

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer, persistence
from marlbuf.samplers import Neighbor, Uniform


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("steps", [0, 5, 16, 37])
@pytest.mark.parametrize("sampler", [Uniform(replace=False), Neighbor(2)])
def test_save_load_round_trip(tmp_path, mixed_specs, layout, steps, sampler):
    buf = MultiAgentReplayBuffer(mixed_specs, 16, layout=layout, sampler=sampler, seed=3)
    if steps:
        buf.extend(**random_step_data(mixed_specs, steps, np.random.default_rng(steps)))
    buf.rng.random(7)  # move the RNG off its seed state
    path = tmp_path / "buf.npz"
    buf.save(path)
    loaded = MultiAgentReplayBuffer.load(path)
    assert (loaded.cursor, loaded.size, loaded.total_writes) == (
        buf.cursor,
        buf.size,
        buf.total_writes,
    )
    assert loaded.layout == layout and loaded.specs == buf.specs
    assert repr(loaded.sampler) == repr(buf.sampler)
    np.testing.assert_array_equal(loaded.write_generation, buf.write_generation)
    if steps >= 4:
        a, b = buf.sample(4), loaded.sample(4)  # same RNG state -> same indices and rows
        np.testing.assert_array_equal(a.indices, b.indices)
        for f in FIELDS:
            for agent in mixed_specs:
                np.testing.assert_array_equal(a.field(f)[agent], b.field(f)[agent])
    assert not list(tmp_path.glob("*.tmp"))  # the temp file was renamed away


def test_state_dict_round_trip_in_place(mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 8, seed=0)
    buf.extend(**random_step_data(mixed_specs, 11, np.random.default_rng(0)))
    state = buf.state_dict()
    other = MultiAgentReplayBuffer(mixed_specs, 8, seed=99)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.sample(5).indices, buf.sample(5).indices)
    wrong = MultiAgentReplayBuffer(mixed_specs, 9)
    with pytest.raises(ValueError, match="capacity is 9 here, 8 in the state"):
        wrong.load_state_dict(state)


def test_corrupt_and_foreign_files(tmp_path, mixed_specs):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="not a readable marlbuf buffer file"):
        MultiAgentReplayBuffer.load(garbage)

    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.arange(3))
    with pytest.raises(ValueError, match="no __meta__"):
        MultiAgentReplayBuffer.load(foreign)

    buf = MultiAgentReplayBuffer(mixed_specs, 8)
    good = tmp_path / "good.npz"
    buf.save(good)
    with np.load(good) as archive:
        files = {k: archive[k] for k in archive.files}
    meta = json.loads(files["__meta__"].tobytes())
    meta["version"] = 999
    files["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    future = tmp_path / "future.npz"
    np.savez(future, **files)
    with pytest.raises(ValueError, match="format version 999"):
        MultiAgentReplayBuffer.load(future)

    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable marlbuf buffer file"):
        MultiAgentReplayBuffer.load(truncated)

    with pytest.raises(FileNotFoundError):
        MultiAgentReplayBuffer.load(tmp_path / "missing.npz")


def test_failed_save_leaves_old_file(tmp_path, mixed_specs, monkeypatch):
    buf = MultiAgentReplayBuffer(mixed_specs, 8)
    path = tmp_path / "buf.npz"
    buf.save(path)
    before = path.read_bytes()

    real_write_member = persistence._write_member

    def boom(archive, key, array):
        if key != persistence.META_NAME:  # fail after part of the file is written
            raise OSError("disk full")
        real_write_member(archive, key, array)

    monkeypatch.setattr(persistence, "_write_member", boom)
    with pytest.raises(OSError, match="disk full"):
        buf.save(path)
    assert path.read_bytes() == before
    assert zipfile.is_zipfile(path)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.skipif(os.name != "posix", reason="POSIX umask")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_saved_file_mode_follows_the_umask(tmp_path, mixed_specs, umask):
    buf = MultiAgentReplayBuffer(mixed_specs, 8)
    old = os.umask(umask)
    try:
        buf.save(tmp_path / "buf.npz")
        buf.save(tmp_path / "buf.npz")  # replacing a file: the new one gets the same mode
    finally:
        os.umask(old)
    assert (tmp_path / "buf.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def test_save_into_a_missing_folder_names_the_target(tmp_path, mixed_specs):
    target = tmp_path / "no" / "such" / "buf.npz"
    with pytest.raises(FileNotFoundError) as info:
        MultiAgentReplayBuffer(mixed_specs, 8).save(target)
    message = str(info.value)
    assert str(target) in message and "does not exist" in message
    assert ".tmp" not in message
    assert not (tmp_path / "no").exists()


def test_the_file_is_a_plain_npz_and_old_files_load(tmp_path, mixed_specs):
    """Files of the earlier ``np.savez`` writer (same member names) load unchanged."""
    buf = MultiAgentReplayBuffer(mixed_specs, 16, sampler=Neighbor(2), seed=1)
    buf.extend(**random_step_data(mixed_specs, 21, np.random.default_rng(1)))
    buf.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as archive:
        members = {k: archive[k] for k in archive.files}
    assert "__meta__" in members and "/storage/table" in members
    np.savez(tmp_path / "old.npz", **members)
    loaded = MultiAgentReplayBuffer.load(tmp_path / "old.npz")
    np.testing.assert_array_equal(loaded.storage.table[:16], buf.storage.table[:16])
    np.testing.assert_array_equal(loaded.sample(4).indices, buf.sample(4).indices)


def test_generic_nested_state_round_trip(tmp_path):
    """Whatever nesting a state has: arrays by path (any layout in memory), the rest JSON."""
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    state = {
        "format": "x",
        "nested": {"deeper": {"ints": np.arange(5), "note": "text", "n": np.int64(3)}},
        "side_tables": [np.ones((2, 2), np.uint8), {"f": np.asfortranarray(base)}, 1.5],
        "strided": base[::2, ::3],
        "scalar": np.array(7.0),
        "empty": np.zeros((0, 4), np.int32),
        "streamed": base[:4],
    }
    path = tmp_path / "state.npz"
    persistence.write_state(state, path)
    destination = np.full((6, 10), -1, np.float32)
    seen = {}

    def destinations(header):
        seen.update(header)
        return {persistence.array_path("streamed"): destination}

    back = persistence.read_state(path, destinations)
    assert seen["nested"]["deeper"]["ints"] == {"__array__": "/nested/deeper/ints"}
    assert back["nested"]["deeper"]["note"] == "text" and back["nested"]["deeper"]["n"] == 3
    assert back["side_tables"][2] == 1.5
    for got, want in [
        (back["nested"]["deeper"]["ints"], state["nested"]["deeper"]["ints"]),
        (back["side_tables"][0], state["side_tables"][0]),
        (back["side_tables"][1]["f"], base),
        (back["strided"], base[::2, ::3]),
        (back["scalar"], np.array(7.0)),
        (back["empty"], state["empty"]),
        (back["streamed"], base[:4]),
    ]:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # read into the destination's first rows, and the state holds that view of it
    assert np.shares_memory(back["streamed"], destination)
    np.testing.assert_array_equal(destination[:4], base[:4])
    assert (destination[4:] == -1).all()

    with pytest.raises(TypeError, match="keys must be strings"):
        persistence.write_state({"a": {1: np.zeros(2)}}, tmp_path / "bad.npz")
    with pytest.raises(TypeError, match="cannot be saved"):
        persistence.write_state({"a": object()}, tmp_path / "bad.npz")
    assert not list(tmp_path.glob("bad.npz*"))


def test_corrupt_array_bytes_are_detected(tmp_path, mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 8)
    buf.extend(**random_step_data(mixed_specs, 8, np.random.default_rng(0)))
    path = tmp_path / "buf.npz"
    buf.save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"/storage/table.npy")
    data[start + 400] ^= 0xFF  # inside the table's bytes: only the CRC-32 can tell
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not a readable marlbuf buffer file"):
        MultiAgentReplayBuffer.load(path)


def test_load_into_an_existing_buffer(tmp_path, mixed_specs):
    buf = MultiAgentReplayBuffer(mixed_specs, 16, seed=2)
    buf.extend(**random_step_data(mixed_specs, 19, np.random.default_rng(2)))
    path = tmp_path / "buf.npz"
    buf.save(path)
    # the same format as the saved buffer (which chose it from its first write), so the file
    # streams into the existing table
    other = MultiAgentReplayBuffer(mixed_specs, 16, seed=5, next_obs=buf.next_obs)
    table = other.storage.table
    persistence.load_into(other, path)
    assert other.storage.table is table
    np.testing.assert_array_equal(other.storage.table, buf.storage.table)
    np.testing.assert_array_equal(other.sample(6).indices, buf.sample(6).indices)
    wrong = MultiAgentReplayBuffer(mixed_specs, 12)
    before = wrong.storage.table.copy()
    with pytest.raises(ValueError, match="capacity is 12 here, 16 in the state"):
        persistence.load_into(wrong, path)
    np.testing.assert_array_equal(wrong.storage.table, before)  # nothing streamed into it


def test_save_and_load_stream_without_a_second_copy(tmp_path):
    """A 100 MB buffer: saving allocates almost nothing, loading little beyond the new buffer."""
    specs = {"agent_0": AgentSpec(obs_shape=(4096,), action_shape=(4,))}
    buf = MultiAgentReplayBuffer(specs, 3200, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(8):  # filled in parts, so the test's own input arrays stay small
        buf.extend(**random_step_data(specs, 400, rng))
    nbytes = buf.nbytes
    assert nbytes > 100e6
    path = tmp_path / "big.npz"
    tracemalloc.start()
    try:
        buf.save(path)
        save_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        loaded = MultiAgentReplayBuffer.load(path)
        load_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert save_peak < 0.02 * nbytes, save_peak
    assert load_peak < 1.1 * nbytes, load_peak  # the new buffer itself, not a second copy
    np.testing.assert_array_equal(loaded.storage.table, buf.storage.table)


# Builds the two buffers the crash test alternates between; run by the test and its child.
_CRASH_SETUP = """
import numpy as np
from marlbuf import AgentSpec, MultiAgentReplayBuffer

def make(which):
    specs = {f"agent_{i}": AgentSpec(obs_shape=(256,), action_shape=(5,)) for i in range(2)}
    buf = MultiAgentReplayBuffer(specs, 4096, seed=which)
    steps = 4000 if which == 1 else 3000
    full = lambda *shape: {a: np.full((steps, *shape), which, np.float32) for a in specs}
    buf.extend(obs=full(256), action=full(5), reward=full(), next_obs=full(256), done=full())
    return buf
"""

_CRASH_CHILD = (
    _CRASH_SETUP
    + """
import sys
path = sys.argv[1]
buffers = [make(1), make(2)]
buffers[0].save(path)
print("ready", flush=True)
i = 1
while True:
    buffers[i % 2].save(path)
    i += 1
"""
)


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
@pytest.mark.slow
def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_file(tmp_path):
    scope: dict = {}
    exec(_CRASH_SETUP, scope)
    expected = {which: scope["make"](which) for which in (1, 2)}
    path = tmp_path / "buf.npz"
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    rng = random.Random(0)
    deadline, kills = time.monotonic() + 4.0, 0
    while kills < 3 or time.monotonic() < deadline:
        child = subprocess.Popen(
            [sys.executable, "-c", _CRASH_CHILD, str(path)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            child.stdout.close()  # type: ignore[union-attr]
        kills += 1
        loaded = MultiAgentReplayBuffer.load(path)  # never a partial or corrupt file
        which = 1 if loaded.size == 4000 else 2
        want = expected[which]
        assert (loaded.size, loaded.total_writes, loaded.cursor) == (
            want.size,
            want.total_writes,
            want.cursor,
        )
        np.testing.assert_array_equal(
            loaded.storage.table[: want.size], want.storage.table[: want.size]
        )
    # a kill mid-write may leave a temporary file, never anything under the target's name
    assert {p.name for p in tmp_path.iterdir()} - {"buf.npz"} <= {
        p.name for p in tmp_path.glob("buf.npz.*.tmp")
    }
