"""Nothing lost across a reload: one test per way a reload used to lose or corrupt data
silently (memory-mapped logs and checkpoints, stream breaks, complete episodes, crafted sizes,
rejected first writes, reordered indices, empty states, deferred priority errors, discrete
actions). Each failed before the fix it guards."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer, mapped
from marlbuf.buffer import StreamBreakWarning
from marlbuf.samplers import Episodes, Prioritized

SPECS = {
    "a0": AgentSpec(obs_shape=(4,), action_shape=(2,)),
    "a1": AgentSpec(obs_shape=(3,), action_shape=(3,), obs_dtype=np.float64),
}


def steps(first: int, n: int, done_at: tuple[int, ...] = (), shift: float = 0.0) -> dict:
    """``n`` steps of one stream numbered from ``first`` (next_obs = the next step's obs; add
    ``shift`` to the observations to make another environment), done at steps ``done_at``
    (numbers)."""
    t = np.arange(first, first + n + 1, dtype=np.float64) + shift
    done = np.isin(np.arange(first, first + n), done_at).astype(np.float32)
    out: dict = {f: {} for f in FIELDS}
    for i, (agent, spec) in enumerate(SPECS.items()):
        obs = np.stack([t + 0.25 * k + i for k in range(spec.obs_shape[0])], 1)
        out["obs"][agent] = obs[:-1].astype(spec.obs_dtype)
        out["next_obs"][agent] = obs[1:].astype(spec.obs_dtype)
        out["action"][agent] = np.full((n, *spec.action_shape), 0.5, np.float32)
        out["reward"][agent] = (t[:-1] + i).astype(np.float32)
        out["done"][agent] = done
    return out


def one(data: dict, k: int = 0) -> dict:
    return {f: {a: x[k] for a, x in per.items()} for f, per in data.items()}


def check_rows(buf: MultiAgentReplayBuffer) -> None:
    """Every filled slot holds the step its write generation names (steps numbered from 0 on
    stream 0, as :func:`write_numbered` writes them)."""
    size = len(buf)
    gens = buf.write_generation[:size]
    assert sorted(gens.tolist()) == list(range(buf.total_writes - size, buf.total_writes))
    if size:
        batch = buf.gather(np.arange(size))
        np.testing.assert_array_equal(batch.reward["a0"], gens.astype(np.float32))


def write_numbered(buf: MultiAgentReplayBuffer, first: int, calls: int) -> int:
    t = first
    for k in range(calls):
        n = 1 + k % 3
        if n == 1:
            buf.add(**one(steps(t, 1)))
        else:
            buf.extend(**steps(t, n))
        t += n
    return t


def die(buf: MultiAgentReplayBuffer) -> None:
    """The process holding ``buf`` dies: nothing more is written, the folder is released."""
    assert buf._mapped is not None
    buf._mapped.release()


# ---------------------------------------------------------------------------- mapped folders
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("damage", ["deleted", "emptied", "header zeroed"])
def test_a_lost_log_after_a_close_and_reopen_is_refused(tmp_path, full, damage):
    """close() wrote a clean checkpoint; the reopened buffer writes and dies; its log is lost.
    Before: opened, with wrong rows (full) or the writes silently lost (not full)."""
    folder = tmp_path / "m"
    capacity = 16
    with MultiAgentReplayBuffer(SPECS, capacity, path=folder, seed=0) as buf:
        t = write_numbered(buf, 0, 10 if full else 3)
    buf = MultiAgentReplayBuffer.open(folder)
    t = write_numbered(buf, t, 4)
    die(buf)
    log = folder / mapped.LOG
    if damage == "deleted":
        log.unlink()
    elif damage == "emptied":
        os.truncate(log, 0)
    else:
        with open(log, "r+b") as fh:
            fh.write(bytes(mapped.LOG_HEADER_BYTES))
    with pytest.raises(ValueError, match="log") as info:
        MultiAgentReplayBuffer.open(folder)
    assert "delete the folder" in str(info.value) or "Put back" in str(info.value)


def test_a_reopened_folder_clears_its_clean_mark_at_its_first_write(tmp_path):
    folder = tmp_path / "m"
    with MultiAgentReplayBuffer(SPECS, 16, path=folder, seed=0) as buf:
        write_numbered(buf, 0, 3)
    buf = MultiAgentReplayBuffer.open(folder)
    assert buf._mapped is not None and buf._mapped.clean_on_disk()
    buf.add(**one(steps(6, 1)))
    assert not buf._mapped.clean_on_disk()
    buf.close()
    assert MultiAgentReplayBuffer.open(folder)._mapped.clean_on_disk()


def _killed(folder: Path, calls: int, capacity: int = 64) -> tuple[MultiAgentReplayBuffer, int]:
    buf = MultiAgentReplayBuffer(SPECS, capacity, path=folder, seed=0)
    t = write_numbered(buf, 0, calls)
    die(buf)
    return buf, t


def _flip(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ (1 << bit)]))


@pytest.mark.parametrize("where", ["header", "trailer"])
def test_a_flipped_bit_in_the_last_record_is_not_a_torn_tail(tmp_path, where):
    """The last record is complete and its rows are in the table; one flipped bit in its
    header or trailer must not make it look cut short. Before: dropped, wrong rows."""
    folder = tmp_path / "m"
    buf, _ = _killed(folder, 9)  # 18 steps, fewer than the capacity; the last call wrote 3
    assert buf._mapped is not None
    end = buf._mapped._offset
    size = mapped.RECORD_HEADER_BYTES + 3 * buf._codec.row_words * 8 + mapped.RECORD_TRAILER_BYTES
    _flip(folder / mapped.LOG, end - size + 9 if where == "header" else end - 9)
    with pytest.raises(ValueError, match="log"):
        MultiAgentReplayBuffer.open(folder)


def test_a_log_replaced_by_an_earlier_copy_of_itself_is_refused(tmp_path):
    folder = tmp_path / "m"
    buf = MultiAgentReplayBuffer(SPECS, 64, path=folder, seed=0)
    t = write_numbered(buf, 0, 4)
    earlier = (folder / mapped.LOG).read_bytes()
    write_numbered(buf, t, 3)
    die(buf)
    (folder / mapped.LOG).write_bytes(earlier)
    with pytest.raises(ValueError, match="log"):
        MultiAgentReplayBuffer.open(folder)


def test_a_checkpoint_from_another_folder_is_refused(tmp_path):
    """Two buffers of the same specs; one's state.npz put into the other's closed folder.
    Before: opened with the other buffer's metadata over this one's rows."""
    for name, first in (("a", 0), ("b", 100)):
        with MultiAgentReplayBuffer(SPECS, 16, path=tmp_path / name, seed=0) as buf:
            buf.extend(**steps(first, 20))
    shutil.copy(tmp_path / "b" / mapped.CHECKPOINT, tmp_path / "a" / mapped.CHECKPOINT)
    with pytest.raises(ValueError, match="another"):
        MultiAgentReplayBuffer.open(tmp_path / "a")


# ---------------------------------------------------------------------------- stream breaks
STORES = ["ram", "state_dict", "mapped", "torch"]


def _reloaded(buf: MultiAgentReplayBuffer, how: str, folder: Path) -> MultiAgentReplayBuffer:
    if how == "ram":
        buf.save(folder / "b.npz")
        return MultiAgentReplayBuffer.load(folder / "b.npz")
    if how == "state_dict":
        other = MultiAgentReplayBuffer(SPECS, buf.capacity, sampler=Episodes(), seed=0)
        other.load_state_dict(buf.state_dict())
        return other
    if how == "mapped":
        buf.close()
        return MultiAgentReplayBuffer.open(folder / "m")
    pytest.importorskip("torch")
    buf.save(folder / "b.npz")
    return MultiAgentReplayBuffer.load(folder / "b.npz", device="cpu")


def _episodes_buffer(how: str, folder: Path, capacity: int = 32) -> MultiAgentReplayBuffer:
    path = folder / "m" if how == "mapped" else None
    next_obs = "once" if how == "mapped" else "auto"
    return MultiAgentReplayBuffer(
        SPECS, capacity, sampler=Episodes(), seed=0, path=path, next_obs=next_obs
    )


@pytest.mark.parametrize("how", STORES)
def test_stream_breaks_survive_a_reload(tmp_path, how):
    """Stream 0's episode is open; after a reload, a step of another environment on stream 0
    begins a new episode, as it does without the reload. Before: it joined the open one."""
    buf = _episodes_buffer(how, tmp_path)
    buf.extend(**steps(0, 5))  # an open episode on stream 0
    buf = _reloaded(buf, how, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StreamBreakWarning)
        buf.extend(**steps(0, 3, done_at=(2,), shift=1000.0))  # another environment
    assert buf.episodes is not None
    assert buf.episodes.breaks == 1
    assert buf.episodes.episode[5] != buf.episodes.episode[4]
    assert buf.complete_episodes == 2  # the break ended the first; the second is done


# ---------------------------------------------------------------------------- complete episodes
@pytest.mark.parametrize("how", STORES)
def test_complete_episodes_survive_a_reload(tmp_path, how):
    """Stream 1's open step sits in slot 0 until stream 0's complete episode overwrites it;
    the rebuilt index must not take that episode for stream 1's open one. Before: the one
    complete episode was never drawn again after the reload."""
    buf = _episodes_buffer(how, tmp_path, capacity=4)
    buf.add(**one(steps(500, 1)), stream=1)  # slot 0: stream 1's open episode
    buf.extend(**steps(0, 4, done_at=(3,)))  # slots 1, 2, 3, 0: one complete episode
    assert buf.complete_episodes == 1
    buf = _reloaded(buf, how, tmp_path)
    assert buf.complete_episodes == 1
    assert len(buf.sample(1).indices) == 1


# ---------------------------------------------------------------------------- sizes
def test_the_constructor_checks_sizes_before_it_allocates():
    from marlbuf.storage import available_memory_bytes

    huge = {"a": AgentSpec(obs_shape=(10**11,), action_shape=(2,))}
    if available_memory_bytes() is None:
        pytest.skip("the machine does not report its memory")
    with pytest.raises(MemoryError, match="obs_shape"):
        MultiAgentReplayBuffer(huge, 1)


# ---------------------------------------------------------------------------- failed writes
def test_a_rejected_first_write_does_not_choose_next_obs_none():
    """A NaN add without next_obs is refused; the buffer must stay as it was (next_obs
    'auto', nothing chosen). Before: it had become next_obs='none' and refused next_obs."""
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0)
    bad = one(steps(0, 1))
    bad.pop("next_obs")
    bad["reward"]["a0"] = np.float32("nan")
    before = buf.next_obs
    with pytest.raises(ValueError, match="NaN"):
        buf.add(**bad)
    assert buf.next_obs == before
    buf.add(**one(steps(0, 1)))  # with next_obs: accepted
    assert buf.next_obs == before and len(buf) == 1


def test_a_loaded_state_decides_the_format_of_an_auto_buffer():
    """An "auto" buffer loads a state with data, then extends independent transitions.
    Before: the extend still took the first write's choice, switched to an empty store of dense
    rows, and the loaded slots read as garbage."""
    rng = np.random.default_rng(0)
    source = MultiAgentReplayBuffer(SPECS, 32, next_obs="once", seed=0)
    source.extend(**steps(0, 10))
    target = MultiAgentReplayBuffer(SPECS, 32, seed=0)
    target.load_state_dict(source.state_dict())
    chosen = target.next_obs
    independent = steps(10, 5)
    for agent in SPECS:
        independent["next_obs"][agent] = rng.random(independent["next_obs"][agent].shape)
    target.extend(**independent)
    assert target.next_obs == chosen
    np.testing.assert_array_equal(target.gather(np.arange(15)).reward["a0"], np.arange(15.0))


# ---------------------------------------------------------------------------- drawn indices
def _prioritized(capacity: int = 32) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(SPECS, capacity, sampler=Prioritized(), n_trainers=1, seed=0)
    buf.extend(**steps(0, capacity))
    return buf


def test_indices_reordered_in_place_are_judged_by_their_own_slots():
    """batch.indices sorted in place: its generations stay in the order of the draw. Before:
    each slot was judged against another slot's generation and fresh updates were dropped."""
    buf, twin = _prioritized(), _prioritized()
    batch, same = buf.sample(16), twin.sample(16)
    buf.extend(**steps(32, 6))  # overwrites slots 0-5: their updates are stale
    twin.extend(**steps(32, 6))
    order = np.argsort(batch.indices, kind="stable")
    td = np.arange(16.0) + 1.0
    twin.update_priorities(same.indices, td)  # as drawn
    batch.indices.sort()  # in place
    buf.update_priorities(batch.indices, td[order])
    np.testing.assert_array_equal(
        buf.sampler.state_dict()["leaves"], twin.sampler.state_dict()["leaves"]
    )
    batch.indices[0] = int(np.setdiff1d(np.arange(32), batch.indices)[0])  # never drawn
    with pytest.raises(ValueError, match="generations="):
        buf.update_priorities(batch.indices, td)


def test_plain_copies_of_an_old_batch_are_not_taken_as_fresh():
    """A copy of an older batch's indices, some of whose slots were overwritten since, and
    which is not the trainer's latest draw. Before: its updates were applied to the new rows."""
    buf = _prioritized()
    old = buf.sample(16).indices.copy()
    buf.extend(**steps(32, 8))
    buf.sample(16)
    leaves = buf.sampler.state_dict()["leaves"].copy()
    with pytest.raises(ValueError, match="generations="):
        buf.update_priorities(old, np.full(16, 50.0))
    np.testing.assert_array_equal(buf.sampler.state_dict()["leaves"], leaves)


def test_a_good_update_is_applied_while_a_bad_deferred_one_waits():
    """A bad update_priorities(..., sync=False) is pending when a good update comes. Before:
    the good update was not applied and raised the earlier error."""
    torch = pytest.importorskip("torch")
    buf, twin = _prioritized(), _prioritized()
    for b in (buf, twin):
        b.sample(8)
        good = b.sample(8)
    buf.update_priorities(good.indices, torch.full((8,), float("nan")), sync=False)
    buf.update_priorities(good.indices, np.arange(8.0) + 1.0)  # applied
    twin.update_priorities(good.indices, np.arange(8.0) + 1.0)
    with pytest.raises(ValueError, match=r"NaN|finite"):
        buf.check_priority_errors()  # the earlier error, once
    buf.check_priority_errors()
    np.testing.assert_array_equal(
        buf.sampler.state_dict()["leaves"], twin.sampler.state_dict()["leaves"]
    )


# ---------------------------------------------------------------------------- empty states
LAYOUTS = [
    (layout, fmt) for layout in ("interleaved", "agent_major") for fmt in ("once", "stored", "none")
]


@pytest.mark.parametrize(("layout", "fmt"), LAYOUTS)
def test_an_empty_state_loads_into_every_layout_and_format(tmp_path, layout, fmt):
    source = MultiAgentReplayBuffer(SPECS, 8, layout=layout, next_obs=fmt, seed=0)
    source.save(tmp_path / "empty.npz")
    state = source.state_dict()
    for target_layout, target_fmt in LAYOUTS:
        if fmt == "none" and target_fmt != "none":
            continue  # no format can make next observations up
        target = MultiAgentReplayBuffer(SPECS, 8, layout=target_layout, next_obs=target_fmt, seed=0)
        target.load_state_dict(state)
        assert len(target) == 0
    MultiAgentReplayBuffer.load(tmp_path / "empty.npz")


# ---------------------------------------------------------------------------- discrete actions
def test_a_discrete_action_vector_must_be_one_action():
    specs = {"a": AgentSpec(obs_shape=(2,), action_shape=(3,), n_discrete_actions=3)}
    buf = MultiAgentReplayBuffer(specs, 8, seed=0)
    step = {
        "obs": {"a": np.zeros(2, np.float32)},
        "action": {"a": np.array([1.0, 1.0, 0.0], np.float32)},
        "reward": {"a": 0.0},
        "next_obs": {"a": np.zeros(2, np.float32)},
        "done": {"a": 0.0},
    }
    with pytest.raises(ValueError, match="action"):
        buf.add(**step)
    assert len(buf) == 0


# ---------------------------------------------------------------------------- cross-checks
def test_the_stream_break_record_is_checked_against_the_stored_rows():
    buf = MultiAgentReplayBuffer(SPECS, 16, sampler=Episodes(), next_obs="stored", seed=0)
    buf.extend(**steps(0, 5))
    state = buf.state_dict()
    episodes = state["episodes"]
    assert episodes["next_streams"].tolist() == [0]
    for name, mutate in (
        ("wrong bytes", lambda e: e["next_obs"].__setitem__((0, 0), e["next_obs"][0, 0] ^ 1)),
        (
            "missing",
            lambda e: e.update(next_streams=e["next_streams"][:0], next_obs=e["next_obs"][:0]),
        ),
        ("no open episode", lambda e: e.update(next_streams=np.array([7]))),
    ):
        copied = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in episodes.items()}
        copy = {**state, "episodes": copied}
        mutate(copy["episodes"])
        fresh = MultiAgentReplayBuffer(SPECS, 16, sampler=Episodes(), next_obs="stored", seed=0)
        with pytest.raises(ValueError, match="corrupt state"):
            fresh.load_state_dict(copy)
        assert len(fresh) == 0, name


def test_a_complete_set_that_the_links_do_not_give_is_refused():
    buf = MultiAgentReplayBuffer(SPECS, 16, sampler=Episodes(), seed=0)
    buf.extend(**steps(0, 6, done_at=(2,)))
    state = buf.state_dict()
    assert state["episodes"]["complete"].tolist() == [0]
    state["episodes"] = {**state["episodes"], "complete": np.array([3])}
    with pytest.raises(ValueError, match="complete episodes"):
        MultiAgentReplayBuffer(SPECS, 16, sampler=Episodes(), seed=0).load_state_dict(state)
