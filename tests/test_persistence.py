"""state_dict / save / load round trips and corrupt files."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from datagen import random_step_data

from marlbuf import FIELDS, MultiAgentReplayBuffer
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

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        buf.save(path)
    assert path.read_bytes() == before
    assert zipfile.is_zipfile(path)
    assert not list(tmp_path.glob("*.tmp"))
