"""Flashbax vaults without JAX: the committed fixtures Flashbax wrote, exact round trips,
damaged and crafted vaults, interrupted conversions into memory-mapped buffers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Episodes, Sequence, Uniform

ts = pytest.importorskip("tensorstore")

from marlbuf.offline import VaultError, read_vault, vault_info, write_vault  # noqa: E402
from marlbuf.offline.vault import LeafSpec, VaultWriter  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vaults"
OG_MARL = FIXTURES / "og_marl_like.vlt" / "Good"
TWO_STREAMS = FIXTURES / "continuous.vlt" / "two_streams"


def expected(vault: Path) -> dict[str, np.ndarray]:
    """The arrays Flashbax was given for a fixture vault, by leaf key."""
    prefix = f"{vault.parent.name}/{vault.name}/"
    with np.load(FIXTURES / "expected.npz") as data:
        return {k[len(prefix) :]: data[k] for k in data.files if k.startswith(prefix)}


def copy_vault(vault: Path, tmp_path: Path) -> Path:
    target = tmp_path / vault.parent.name / vault.name
    shutil.copytree(vault, target)
    return target


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


# ------------------------------------------------------------------ vaults Flashbax wrote
def test_vault_info_reads_what_flashbax_wrote():
    info = vault_info(OG_MARL)
    assert info.version == 1.2 and info.steps == 60 and info.streams == 1
    data = expected(OG_MARL)
    assert set(info.leaves) == set(data)
    for key, leaf in info.leaves.items():
        assert leaf.step_shape == data[key].shape[2:] and leaf.dtype == data[key].dtype
    assert info.nbytes == sum(v.nbytes for v in data.values())


def test_og_marl_vault_loads_with_every_field_equal():
    before = snapshot(OG_MARL)
    buf = read_vault(OG_MARL, sampler=Episodes(), seed=0)
    assert snapshot(OG_MARL) == before  # reading writes nothing into the vault
    data = expected(OG_MARL)
    agents = [f"agent_{i}" for i in range(3)]
    assert buf.agents == agents and len(buf) == 60
    spec = buf.specs["agent_0"]
    assert spec.n_discrete_actions == 5 and spec.obs_shape == (8,)
    assert buf.global_fields == {"state": FieldSpec((10,))}
    batch = buf.gather(np.arange(60))
    ends = ((data["terminals"][0] != 0) | (data["truncations"][0] != 0)).all(axis=1)
    for i, a in enumerate(agents):
        obs = data["observations"][0, :, i]
        np.testing.assert_array_equal(batch.obs[a], obs)
        np.testing.assert_array_equal(batch.action_index[a], data["actions"][0, :, i])
        np.testing.assert_array_equal(batch.reward[a], data["rewards"][0, :, i])
        np.testing.assert_array_equal(batch.done[a], data["terminals"][0, :, i])
        np.testing.assert_array_equal(batch.extras["legals"][a], data["infos.legals"][0, :, i])
        # next_obs: the following step's obs, the step's own where nothing follows
        successor = np.concatenate([obs[1:], obs[-1:]])
        successor[ends] = obs[ends]
        np.testing.assert_array_equal(batch.next_obs[a], successor)
    np.testing.assert_array_equal(batch.state, data["infos.state"][0])
    # episodes end at terminations (every agent terminal) and at truncations
    assert buf.complete_episodes == 6
    episodes = buf.sample(6)
    assert sorted(episodes.lengths.tolist()) == sorted([7, 12, 5, 9, 11, 16])


def test_two_stream_vault_keeps_its_streams_apart():
    buf = read_vault(TWO_STREAMS, sampler=Episodes(), seed=0, agents=["left", "right"])
    data = expected(TWO_STREAMS)
    assert buf.agents == ["left", "right"] and len(buf) == 80
    assert buf.specs["left"].action_shape == (2,) and buf.specs["left"].n_discrete_actions is None
    # one chunk: stream 0's 40 steps, then stream 1's
    for b in range(2):
        batch = buf.gather(np.arange(40 * b, 40 * b + 40))
        for i, a in enumerate(buf.agents):
            np.testing.assert_array_equal(batch.obs[a], data["observations"][b, :, i])
            np.testing.assert_array_equal(batch.action[a], data["actions"][b, :, i])
            np.testing.assert_array_equal(batch.reward[a], data["rewards"][b])  # team reward
    # stream 0: four truncated episodes of 10; stream 1: terminated at 6, 20, 33, then open
    assert buf.complete_episodes == 4 + 3
    assert sorted(buf.sample(7).lengths.tolist()) == [7, 10, 10, 10, 10, 13, 14]


def test_a_leaf_without_a_field_is_named_and_can_be_mapped(tmp_path):
    path = tmp_path / "v" / "x"
    leaves = {
        "observations": LeafSpec((2, 3), np.float32),
        "actions": LeafSpec((2, 2), np.float32),
        "rewards": LeafSpec((2,), np.float32),
        "terminals": LeafSpec((2,), np.float32),
        "infos.avail": LeafSpec((2, 4), np.bool_),
        "infos.world": LeafSpec((5,), np.float32),
    }
    writer = VaultWriter(path, leaves)
    rng = np.random.default_rng(0)
    writer.append({k: rng.random((1, 7, *s.step_shape)).astype(s.dtype) for k, s in leaves.items()})
    writer.close()
    with pytest.raises(ValueError, match=r"'infos.avail'.*keys=") as err:
        read_vault(path)
    assert "infos.world" not in str(err.value)  # the first leaf without a place is named
    with pytest.raises(ValueError, match="must be one of"):
        read_vault(path, keys={"infos.avail": "unknown", "infos.world": None})
    buf = read_vault(path, keys={"infos.avail": "extra:avail", "infos.world": "global:world"})
    assert buf.specs["agent_0"].extras == {"avail": FieldSpec((4,), np.bool_)}
    assert set(buf.global_fields) == {"world"} and len(buf) == 7
    buf = read_vault(path, keys={"infos.avail": None, "infos.world": None})
    assert not buf.specs["agent_0"].extras and not buf.global_fields
    with pytest.raises(ValueError, match="'obs'"):
        read_vault(path, keys={"observations": None, "infos.avail": None, "infos.world": None})


# ------------------------------------------------------------------ exact round trips
def _episode(buf, rng, last):
    """One random episode's fields (per step, agent dicts of arrays) and truncation flags."""
    specs = buf.specs
    length = int(rng.integers(1, 9))
    obs = {
        a: rng.normal(size=(length + 1, *s.obs_shape)).astype(s.obs_dtype) for a, s in specs.items()
    }
    fields = {
        "obs": {a: v[:-1] for a, v in obs.items()},
        "action": {
            a: rng.integers(0, s.n_discrete_actions, length)
            if s.n_discrete_actions
            else rng.normal(size=(length, *s.action_shape)).astype(np.float32)
            for a, s in specs.items()
        },
        "reward": {a: rng.normal(size=length) for a in specs},
        "done": {a: np.zeros(length) for a in specs},
    }
    if buf.next_obs != "none":
        fields["next_obs"] = {a: v[1:] for a, v in obs.items()}
    terminal = rng.random() < 0.4
    if terminal:
        for a in specs:
            fields["done"][a][-1] = 1.0
    for name in next(iter(specs.values())).extras:
        fields[name] = {
            a: rng.random((length, *s.extras[name].shape)) < 0.5 for a, s in specs.items()
        }
    for name, f in buf.global_fields.items():
        fields[name] = rng.normal(size=(length, *f.shape)).astype(f.dtype)
    if buf.alive:
        fields["alive"] = {a: rng.random(length) < 0.8 for a in specs}
    truncated = np.zeros(length, bool)
    # every episode ends (the stream's next one would break it otherwise); the last may not
    truncated[-1] = not terminal and (not last or rng.random() < 0.5)
    return fields, truncated


def _step(fields, t):
    return {
        k: ({a: x[t] for a, x in v.items()} if isinstance(v, dict) else v[t])
        for k, v in fields.items()
    }


def _fill(buf, rng, episodes, streams):
    """``episodes`` random episodes per stream; several streams' steps are interleaved."""
    if streams == 1:
        for k in range(episodes):
            fields, truncated = _episode(buf, rng, k == episodes - 1)
            buf.extend(**fields, truncated=truncated)
        return
    queues = {
        s: [_episode(buf, rng, k == episodes - 1) for k in range(episodes)] for s in range(streams)
    }
    position = dict.fromkeys(queues, 0)
    while queues:
        s = int(rng.choice(list(queues)))
        fields, truncated = queues[s][0]
        t = position[s]
        buf.add(**_step(fields, t), stream=s, truncated=bool(truncated[t]))
        position[s] += 1
        if position[s] == len(truncated):
            queues[s].pop(0)
            position[s] = 0
            if not queues[s]:
                del queues[s]


agent_specs = st.builds(
    lambda obs, discrete, dtype, act: AgentSpec(
        obs,
        (act,),
        obs_dtype=dtype,
        n_discrete_actions=act if discrete else None,
        extras={"legals": FieldSpec((act,), np.bool_)},
    ),
    st.sampled_from([(3,), (2, 2), (5,)]),
    st.booleans(),
    st.sampled_from([np.float32, np.float16]),
    st.integers(2, 4),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=st.lists(agent_specs, min_size=1, max_size=3),
    next_obs=st.sampled_from(["once", "stored", "none"]),
    episodes=st.sampled_from([False, True]),
    global_state=st.booleans(),
    alive=st.booleans(),
    streams=st.sampled_from([1, 1, 2]),
    capacity=st.sampled_from([40, 1000]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_gives_equal_batches(
    tmp_path, specs, next_obs, episodes, global_state, alive, streams, capacity, seed
):
    rng = np.random.default_rng(seed)
    named = {f"agent_{i}": s for i, s in enumerate(specs)}
    sampler = Episodes() if episodes else Uniform()
    options = {"global_fields": {"state": FieldSpec((3,))}} if global_state else {}
    src = MultiAgentReplayBuffer(
        named, capacity, sampler=sampler, next_obs=next_obs, seed=0, alive=alive, **options
    )
    _fill(src, rng, 6, streams)
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "x.vlt" / "u"
    write_vault(src, path, chunk_bytes=int(rng.integers(200, 5000)))
    back = read_vault(
        path,
        sampler=Episodes() if episodes else Uniform(),
        seed=0,
        chunk_bytes=int(rng.integers(100, 4000)),
    )
    assert back.agents == src.agents and back.specs == src.specs and back.next_obs == src.next_obs
    assert back.capacity == src.capacity and back.alive == src.alive
    assert back.global_fields == src.global_fields
    # oldest first: slot i of the copy holds what slot (cursor + i) % capacity held
    order = (np.arange(len(src)) + (src.cursor if len(src) == src.capacity else 0)) % src.capacity
    assert len(back) == len(src)
    a, b = src.gather(order), back.gather(np.arange(len(back)))
    fields = ("obs", "action", "reward", "done") + (("next_obs",) if next_obs != "none" else ())
    for f in fields:
        for agent in named:
            np.testing.assert_array_equal(getattr(a, f)[agent], getattr(b, f)[agent], err_msg=f)
    for agent in named:
        np.testing.assert_array_equal(a.extras["legals"][agent], b.extras["legals"][agent])
        if alive:
            np.testing.assert_array_equal(a.alive[agent], b.alive[agent])
    if global_state:
        np.testing.assert_array_equal(a.state, b.state)
    if episodes:
        position = np.empty(src.capacity, np.int64)
        position[order] = np.arange(len(order))
        firsts = src.episodes.complete[: src.complete_episodes]
        whole = position[firsts][src.episodes.step[firsts] == 0]  # episodes stored whole
        mine = np.sort(back.episodes.complete[: back.complete_episodes])
        assert set(whole.tolist()) <= set(mine.tolist())
        if len(src) < src.capacity:  # nothing overwritten: the same episodes exactly
            assert sorted(whole.tolist()) == mine.tolist()
        if len(whole):
            ea = src.gather_sequences(order[np.sort(whole)], 10)
            eb = back.gather_sequences(np.sort(whole), 10)
            np.testing.assert_array_equal(ea.mask, eb.mask)
            for agent in named:
                np.testing.assert_array_equal(ea.obs[agent], eb.obs[agent])
                np.testing.assert_array_equal(ea.reward[agent], eb.reward[agent])


def test_round_trip_keeps_sequences_of_interleaved_streams(tmp_path):
    specs = {"a": AgentSpec((4,), (2,)), "b": AgentSpec((3,), (2,))}
    src = MultiAgentReplayBuffer(specs, 500, sampler=Sequence(length=6), seed=0)
    rng = np.random.default_rng(5)
    _fill(src, rng, 10, 3)
    meta = json.loads((write_vault(src, tmp_path / "v" / "x") / "metadata.json").read_text())
    assert "marlbuf.stream." in meta["marlbuf"]["private"]
    back = read_vault(tmp_path / "v" / "x", sampler=Sequence(length=6), seed=0)
    starts = np.arange(len(src))
    a, b = src.gather_sequences(starts, 6), back.gather_sequences(starts, 6)
    np.testing.assert_array_equal(a.mask, b.mask)
    for agent in specs:
        np.testing.assert_array_equal(a.obs[agent], b.obs[agent])
        np.testing.assert_array_equal(a.next_obs[agent], b.next_obs[agent])


def test_written_vault_is_a_plain_flashbax_vault(tmp_path):
    specs = {f"agent_{i}": AgentSpec((6,), (5,), n_discrete_actions=5) for i in range(2)}
    src = MultiAgentReplayBuffer(specs, 100, seed=0)
    _fill(src, np.random.default_rng(1), 5, 1)
    path = write_vault(src, tmp_path / "vaults" / "cn.vlt" / "Good", metadata={"policy": "random"})
    assert sorted(p.name for p in (tmp_path / "vaults" / "cn.vlt").iterdir()) == ["Good"]
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["version"] == 1.2 and meta["policy"] == "random"
    assert meta["structure_dtype"]["actions"] == "int32"  # one-hot actions as indices
    assert set(meta["structure_shape"]) == {
        "observations",
        "actions",
        "rewards",
        "terminals",
        "truncations",
    }
    info = vault_info(path)
    assert info.steps == len(src) and info.leaves["observations"].step_shape == (2, 6)
    with pytest.raises(FileExistsError):
        write_vault(src, path)
    with pytest.raises(ValueError, match="marlbuf"):
        write_vault(src, tmp_path / "other", metadata={"marlbuf": 1})
    # read as a foreign vault (keys given): OG-MARL's view of the same data
    plain = read_vault(path, keys={})
    np.testing.assert_array_equal(plain.stored("obs")["agent_0"], src.stored("obs")["agent_0"])


# ------------------------------------------------------------------ damaged and crafted vaults
def _rewrite_metadata(vault: Path, change) -> None:
    meta = json.loads((vault / "metadata.json").read_text())
    change(meta)
    (vault / "metadata.json").write_text(json.dumps(meta))


def _largest(folder: Path) -> Path:
    return max(folder.iterdir(), key=lambda p: p.stat().st_size)


def _truncate(path: Path) -> None:
    """Cut a file to half its size (a copy or a download stopped part way)."""
    os.truncate(path, path.stat().st_size // 2)


def _set_index(vault: Path, steps: int) -> None:
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "ocdbt", "base": f"file://{vault}", "path": "vault_index"},
    }
    ts.open(spec).result().write(np.array([steps], np.int32)).result()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda v: _rewrite_metadata(v, lambda m: m.update(version=2.0)), "version 2.0"),
        (lambda v: _rewrite_metadata(v, lambda m: m.pop("structure_dtype")), "structure_dtype"),
        (
            lambda v: _rewrite_metadata(
                v, lambda m: m["structure_shape"].update(observations="(1, 5, 3, 9)")
            ),
            "observations",
        ),
        (
            lambda v: _rewrite_metadata(
                v, lambda m: m["structure_shape"].update(rewards="(2, 5, 3)")
            ),
            "rewards",
        ),
        (
            lambda v: _rewrite_metadata(
                v, lambda m: m["structure_shape"].update({"../up": "(1, 5)"})
            ),
            "no dots or slashes",
        ),
        (lambda v: _rewrite_metadata(v, lambda m: m.update(structure_shape={})), "structure"),
        (lambda v: (v / "metadata.json").write_text("{" * 100), "JSON"),
        (lambda v: (v / "metadata.json").unlink(), "no metadata.json"),
        (lambda v: _set_index(v, 10**9), "past the data"),
        (lambda v: (v / "evil").symlink_to("/etc/passwd"), "symbolic link"),
        (lambda v: shutil.rmtree(v / "d"), "store"),
        (lambda v: _largest(v / "d").unlink(), "vault"),
        (lambda v: _truncate(v / "manifest.ocdbt"), "vault"),
        (lambda v: _truncate(_largest(v / "d")), "vault"),
    ],
)
def test_damaged_or_crafted_vault_is_refused(tmp_path, damage, message):
    vault = copy_vault(OG_MARL, tmp_path)
    damage(vault)
    with pytest.raises(VaultError, match=message):
        read_vault(vault)
    with pytest.raises(VaultError):
        read_vault(vault, path=tmp_path / "mapped")
    # nothing at the target; a vault found damaged part way leaves the work folder (a
    # repaired vault resumes from it), one refused up front not even that
    assert not (tmp_path / "mapped").exists()


def test_damaged_leaf_is_a_vault_error_and_nothing_is_returned(tmp_path):
    vault = copy_vault(OG_MARL, tmp_path)
    # every data file's middle overwritten: some chunk no longer decodes
    for f in (vault / "d").iterdir():
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 3 : len(raw) // 3 + 64] = b"\xff" * 64
        f.write_bytes(bytes(raw))
    with pytest.raises(VaultError):
        read_vault(vault)


def test_crafted_sizes_are_refused_before_anything_is_allocated(tmp_path):
    # a leaf whose chunks would take 40 GB each, and a metadata file of 17 MiB
    path = tmp_path / "v" / "x"
    writer = VaultWriter(path, {"observations": LeafSpec((3, 4), np.float32)})
    writer.append({"observations": np.zeros((1, 5, 3, 4), np.float32)})
    writer.close()
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "ocdbt", "base": f"file://{path}", "path": "huge."},
        "metadata": {"chunks": [1, 10**9, 10]},
    }
    ts.open(spec, shape=(1, 10**13, 10), dtype="float32", create=True).result()
    _rewrite_metadata(
        path,
        lambda m: (
            m["structure_shape"].update(huge="(1, 5, 10)"),
            m["structure_dtype"].update(huge="float32"),
        ),
    )
    with pytest.raises(VaultError, match="exceed"):
        vault_info(path)
    _rewrite_metadata(path, lambda m: m.update(padding="x" * (17 * 1024**2)))
    with pytest.raises(VaultError, match="larger than"):
        vault_info(path)


def test_crafted_marlbuf_entry_is_refused(tmp_path):
    specs = {"a": AgentSpec((3,), (2,))}
    src = MultiAgentReplayBuffer(specs, 50, seed=0)
    _fill(src, np.random.default_rng(0), 3, 1)
    path = write_vault(src, tmp_path / "v" / "x")
    _rewrite_metadata(path, lambda m: m["marlbuf"].update(capacity=10**12))
    with pytest.raises(VaultError, match="capacity"):
        read_vault(path)
    assert len(read_vault(path, capacity=100)) == len(src)  # the caller may choose
    _rewrite_metadata(path, lambda m: m["marlbuf"]["specs"]["a"].update(obs_shape=[4]))
    with pytest.raises(VaultError, match="observations"):
        read_vault(path, capacity=100)
    _rewrite_metadata(path, lambda m: m["marlbuf"].update(version=99))
    with pytest.raises(VaultError, match="version"):
        read_vault(path)


def test_writer_never_writes_outside_its_folder(tmp_path):
    with pytest.raises(ValueError, match="dotted"):
        VaultWriter(tmp_path / "v", {"../up": LeafSpec((1,), np.float32)})
    with pytest.raises(ValueError, match="marlbuf"):
        VaultWriter(tmp_path / "w", {"marlbuf.rows": LeafSpec((1,), np.float32)})
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError):
        VaultWriter(tmp_path / "exists", {"x": LeafSpec((1,), np.float32)})


# ------------------------------------------------------------------ memory-mapped conversion
def _same_rows(a, b):
    idx = np.arange(len(a))
    x, y = a.gather(idx), b.gather(idx)
    for f in ("obs", "action", "reward", "next_obs", "done"):
        for agent in a.specs:
            np.testing.assert_array_equal(getattr(x, f)[agent], getattr(y, f)[agent])


@pytest.fixture
def long_vault(tmp_path):
    """A vault of 3,000 steps written in chunks of 120 steps."""
    path = tmp_path / "long.vlt" / "u"
    rng = np.random.default_rng(0)
    leaves = {
        "observations": LeafSpec((2, 5), np.float32),
        "actions": LeafSpec((2,), np.int32),
        "rewards": LeafSpec((2,), np.float32),
        "terminals": LeafSpec((2,), np.float32),
        "truncations": LeafSpec((2,), np.float32),
    }
    writer = VaultWriter(path, leaves, chunk_bytes=120 * 40)
    for _ in range(0, 3000, 600):
        trunc = np.zeros((1, 600, 2), np.float32)
        trunc[:, 24::25] = 1
        writer.append(
            {
                "observations": rng.normal(size=(1, 600, 2, 5)).astype(np.float32),
                "actions": rng.integers(0, 3, (1, 600, 2)).astype(np.int32),
                "rewards": rng.normal(size=(1, 600, 2)).astype(np.float32),
                "terminals": np.zeros((1, 600, 2), np.float32),
                "truncations": trunc,
            }
        )
    writer.close()
    return path


def test_conversion_into_a_mapped_buffer_equals_the_one_in_memory(long_vault, tmp_path):
    target = tmp_path / "mapped"
    buf = read_vault(long_vault, path=target, chunk_bytes=5000, sampler=Episodes(), seed=0)
    assert buf.path == str(target) and not (tmp_path / ".mapped.vault-import").exists()
    _same_rows(buf, read_vault(long_vault, sampler=Episodes(), seed=0))
    assert buf.complete_episodes == 120
    buf.close()
    with pytest.raises(FileExistsError):
        read_vault(long_vault, path=target)


def test_interrupted_conversion_resumes_or_is_refused(long_vault, tmp_path):
    target = tmp_path / "mapped"
    calls = []

    def stop_after_three(done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        read_vault(long_vault, path=target, chunk_bytes=5000, progress=stop_after_three)
    work = tmp_path / ".mapped.vault-import"
    assert not target.exists() and work.is_dir()
    # a half-converted buffer is never taken for a complete one
    with pytest.raises(FileExistsError, match="resume=True"):
        read_vault(long_vault, path=target, chunk_bytes=5000, resume=False)
    with pytest.raises(ValueError, match="chunk_steps"):
        read_vault(long_vault, path=target, chunk_bytes=9000)
    with pytest.raises(ValueError, match="capacity"):
        read_vault(long_vault, path=target, chunk_bytes=5000, capacity=5000)
    done = []
    buf = read_vault(
        long_vault, path=target, chunk_bytes=5000, progress=lambda d, t: done.append(d)
    )
    assert done[0] > 0  # it went on from where it stopped
    assert not work.exists()
    _same_rows(buf, read_vault(long_vault))


def test_conversion_killed_mid_way_resumes_exactly(long_vault, tmp_path):
    target = tmp_path / "mapped"
    child = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from marlbuf.offline import read_vault
calls = []
def kill(done, total):
    calls.append(done)
    if len(calls) == 4:
        os.kill(os.getpid(), signal.SIGKILL)
read_vault({str(long_vault)!r}, path={str(target)!r}, chunk_bytes=5000, progress=kill)
"""
    done = subprocess.run([sys.executable, "-c", child], check=False, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert not target.exists()
    buf = read_vault(long_vault, path=target, chunk_bytes=5000)
    _same_rows(buf, read_vault(long_vault))


def test_release_pages_keeps_every_row(tmp_path):
    specs = {"a": AgentSpec((64,), (2,))}
    buf = MultiAgentReplayBuffer(specs, 2000, path=tmp_path / "m", seed=0)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2001, 64)).astype(np.float32)
    buf.extend(
        obs={"a": obs[:-1]},
        action={"a": np.zeros((2000, 2))},
        reward={"a": np.zeros(2000)},
        next_obs={"a": obs[1:]},
        done={"a": np.zeros(2000)},
    )
    before = buf.gather(np.arange(2000)).obs["a"].copy()
    buf.release_pages()
    np.testing.assert_array_equal(buf.gather(np.arange(2000)).obs["a"], before)
    buf.close()
    frozen = MultiAgentReplayBuffer.open(tmp_path / "m", mode="r")
    frozen.release_pages()  # private mappings: nothing to release
    np.testing.assert_array_equal(frozen.gather(np.arange(2000)).obs["a"], before)
    MultiAgentReplayBuffer(specs, 10).release_pages()  # in memory: nothing to do


def test_reading_needs_no_jax():
    code = (
        "import sys; from marlbuf.offline import read_vault; "
        f"read_vault({str(OG_MARL)!r}); "
        "assert not any(m == 'jax' or m.startswith(('jax.', 'flax', 'chex')) for m in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.slow
def test_bench_offline_suite_runs_tiny(monkeypatch):
    pytest.importorskip("mpe2")
    from marlbuf.bench import cli
    from marlbuf.bench.suites import offline

    assert cli.SUITES["offline"] == "marlbuf.bench.suites.offline"
    tiny = {"steps": 3_000, "base_steps": 1_000, "repeats": 1, "budget_bytes": 2 * 1024**2}
    monkeypatch.setattr(offline, "QUICK", {**tiny, "memory_modes": ("release",)})
    monkeypatch.setattr(offline, "copy_bandwidth", lambda: 1e9)
    payload = offline.run(quick=True, progress=False)
    cases = {(r["part"], r["case"]) for r in payload["rows"]}
    assert {("read", "read_vault"), ("read", "tensorstore_raw"), ("write", "write_vault")} <= cases
    assert {c for p, c in cases if p == "memory"} == {"read_vault(path=...)"}
    for row in payload["rows"]:
        assert all(v > 0 for k, v in row.items() if k.endswith(("_median", "_MiB")))
    assert {t["status"] for t in payload["targets"]} <= {"PASS", "FAIL", "SKIP"}
    json.dumps(payload)
