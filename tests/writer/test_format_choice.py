"""``next_obs="auto"`` (the default): the storage format chosen from the first write, and the
side-table warning (``NextObsWarning``) of lean buffers fed independent transitions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer, NextObsWarning
from marlbuf._config import SIDE_TABLE_WARN_ROWS

SPECS = {f"agent_{i}": AgentSpec(obs_shape=(18,), action_shape=(2,)) for i in range(2)}
OBS = 18


def transitions(steps: int, rng: np.random.Generator, stream: bool) -> dict:
    """``steps`` transitions: one MPE-like stream (next_obs = the following obs, an episode
    end every 25 steps) or independent ones (next_obs unrelated to the following obs)."""
    obs = {a: rng.standard_normal((steps, OBS)).astype(np.float32) for a in SPECS}
    if stream:
        nxt = {a: np.concatenate([o[1:], rng.standard_normal((1, OBS))]) for a, o in obs.items()}
        for a in SPECS:
            nxt[a][24::25] = rng.standard_normal(nxt[a][24::25].shape)
    else:
        nxt = {a: rng.standard_normal((steps, OBS)).astype(np.float32) for a in SPECS}
    return {
        "obs": obs,
        "action": {a: rng.standard_normal((steps, 2)) for a in SPECS},
        "reward": {a: rng.standard_normal(steps) for a in SPECS},
        "next_obs": nxt,
        "done": {a: np.zeros(steps) for a in SPECS},
    }


def step(data: dict, t: int) -> dict:
    return {f: {a: v[a][t] for a in SPECS} for f, v in data.items()}


def test_first_extend_of_independent_transitions_stores_them_dense():
    rng = np.random.default_rng(0)
    data = transitions(500, rng, stream=False)
    auto = MultiAgentReplayBuffer(SPECS, 1000, seed=1)
    dense = MultiAgentReplayBuffer(SPECS, 1000, seed=1, next_obs="stored")
    assert auto.next_obs == "once"  # undecided: lean until the first write
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto.extend(**data)
        auto.extend(**transitions(500, rng, stream=False))
    dense.extend(**data)
    assert auto.next_obs == "stored" and auto.links is None
    np.testing.assert_array_equal(auto.storage.table[:500], dense.storage.table[:500])
    assert auto.nbytes <= dense.nbytes


def test_first_extend_of_a_stream_stays_stored_once():
    rng = np.random.default_rng(1)
    auto = MultiAgentReplayBuffer(SPECS, 1000, seed=1)
    auto.extend(**transitions(500, rng, stream=True))
    assert auto.next_obs == "once" and auto.links is not None
    assert auto.links.side_rows_used <= 500 // 25 + 1


def test_the_first_write_decides_once():
    """A first ``add`` keeps the lean format; later extends do not switch it."""
    rng = np.random.default_rng(2)
    buf = MultiAgentReplayBuffer(SPECS, 1000, seed=1)
    buf.add(**step(transitions(1, rng, stream=False), 0))
    buf.extend(**transitions(300, rng, stream=False))
    assert buf.next_obs == "once"


@pytest.mark.parametrize("next_obs", ["auto", "once"])
def test_independent_steps_added_one_by_one_warn_once(next_obs):
    rng = np.random.default_rng(3)
    buf = MultiAgentReplayBuffer(SPECS, 4 * SIDE_TABLE_WARN_ROWS, seed=1, next_obs=next_obs)
    data = transitions(2 * SIDE_TABLE_WARN_ROWS, rng, stream=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(2 * SIDE_TABLE_WARN_ROWS):
            buf.add(**step(data, t))
    side = [w for w in caught if issubclass(w.category, NextObsWarning)]
    assert len(side) == 1, [str(w.message) for w in caught]
    message = str(side[0].message)
    for fix in ("stream=", "add_envs", "next_obs='stored'"):
        assert fix in message
    assert buf.next_obs == "once"  # warned, not converted


def test_streams_added_one_by_one_do_not_warn():
    rng = np.random.default_rng(4)
    buf = MultiAgentReplayBuffer(SPECS, 4 * SIDE_TABLE_WARN_ROWS, seed=1)
    data = transitions(2 * SIDE_TABLE_WARN_ROWS, rng, stream=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(2 * SIDE_TABLE_WARN_ROWS):
            buf.add(**step(data, t))
    assert buf.next_obs == "once"


def test_two_environments_written_in_turn_on_one_stream_warn():
    """The trap the warning names: environments interleaved without ``stream=``."""
    rng = np.random.default_rng(5)
    envs = [transitions(SIDE_TABLE_WARN_ROWS, rng, stream=True) for _ in range(2)]
    buf = MultiAgentReplayBuffer(SPECS, 4 * SIDE_TABLE_WARN_ROWS, seed=1)
    with pytest.warns(NextObsWarning, match="stream="):
        for t in range(SIDE_TABLE_WARN_ROWS):
            for data in envs:
                buf.add(**step(data, t))
    fixed = MultiAgentReplayBuffer(SPECS, 4 * SIDE_TABLE_WARN_ROWS, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(SIDE_TABLE_WARN_ROWS):
            for k, data in enumerate(envs):
                fixed.add(**step(data, t), stream=k)


def test_explicit_formats_are_kept():
    rng = np.random.default_rng(6)
    data = transitions(300, rng, stream=False)
    once = MultiAgentReplayBuffer(SPECS, 1000, next_obs="once")
    once.extend(**data)
    assert once.next_obs == "once"
    stored = MultiAgentReplayBuffer(SPECS, 1000, next_obs="stored")
    stored.extend(**transitions(300, rng, stream=True))
    assert stored.next_obs == "stored"


@pytest.mark.filterwarnings("ignore::marlbuf.NextObsWarning")
def test_memory_mapped_buffers_keep_the_lean_format(tmp_path):
    rng = np.random.default_rng(7)
    with MultiAgentReplayBuffer(SPECS, 1000, path=tmp_path / "m") as buf:
        buf.extend(**transitions(300, rng, stream=False))
        assert buf.next_obs == "once"


def test_a_new_default_buffer_loads_a_state_that_chose_dense(tmp_path):
    rng = np.random.default_rng(8)
    source = MultiAgentReplayBuffer(SPECS, 1000, seed=2)
    source.extend(**transitions(400, rng, stream=False))
    assert source.next_obs == "stored"
    target = MultiAgentReplayBuffer(SPECS, 1000, seed=3)
    target.load_state_dict(source.state_dict())
    assert target.next_obs == "stored"
    np.testing.assert_array_equal(target.sample(16).indices, source.sample(16).indices)
    source.save(tmp_path / "b.npz")
    loaded = MultiAgentReplayBuffer.load(tmp_path / "b.npz")
    assert loaded.next_obs == "stored"


def test_a_rejected_state_leaves_an_undecided_buffer_as_it_was():
    rng = np.random.default_rng(9)
    source = MultiAgentReplayBuffer(SPECS, 1000, seed=2)
    source.extend(**transitions(400, rng, stream=False))
    state = source.state_dict()
    state["storage"] = {"table": state["storage"]["table"][:, :-1]}  # wrong row width
    target = MultiAgentReplayBuffer(SPECS, 1000, seed=3)
    table = target.storage.table
    with pytest.raises(ValueError, match="storage array"):
        target.load_state_dict(state)
    assert target.next_obs == "once" and target.storage.table is table
    target.extend(**transitions(300, rng, stream=False))  # still chooses from its first write
    assert target.next_obs == "stored"


def test_rows_too_small_to_save_anything_are_stored_dense():
    """Interleaved rows are padded to cache lines: where a lean row takes as many bytes as a
    dense one, the default stores next_obs (no links to follow, same memory)."""
    tiny = {f"agent_{i}": AgentSpec(obs_shape=(2,), action_shape=(2,)) for i in range(2)}
    buf = MultiAgentReplayBuffer(tiny, 100)
    assert buf._codec.lean_row_bytes == buf._codec.row_bytes
    assert buf.next_obs == "stored" and buf.links is None
    lean = MultiAgentReplayBuffer(tiny, 100, next_obs="once")  # still available explicitly
    assert lean.next_obs == "once"
    wide = MultiAgentReplayBuffer(SPECS, 100)
    assert wide.next_obs == "once" and wide._codec.lean_row_bytes < wide._codec.row_bytes
