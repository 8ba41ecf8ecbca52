"""Batches of chosen fields (``fields=``) and integer actions beside one-hot ones.

A batch gathered with ``fields=`` must equal the full batch of the same draw on the chosen
fields, bit for bit, on every store, layout, batch layout and storage precision, and hold only
those fields' bytes; the integer actions of discrete agents must be the integers written.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer  # noqa: E402
from marlbuf.batch import NotGathered  # noqa: E402
from marlbuf.samplers import Episodes, Sequence  # noqa: E402

STORES = ["ram", "mapped", "torch-cpu"]
FIVE = ("obs", "action", "reward", "next_obs", "done")
CHOICES = [
    ("obs", "action", "reward", "state"),
    ("next_obs",),
    ("done", "hidden", "alive"),
    ("action", "obs", "done", "reward", "hidden", "state"),  # any order: the row's is kept
]


def host(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def make_specs(half: bool = False) -> dict[str, AgentSpec]:
    obs_dtype = np.float16 if half else np.float32
    return {
        f"agent_{i}": AgentSpec(
            obs_shape=(5 + 2 * i,),
            action_shape=(4,),
            obs_dtype=obs_dtype,
            n_discrete_actions=4,
            extras={"hidden": FieldSpec((3,), np.float16 if half else np.float32)},
        )
        for i in range(3)
    }


def write(buf: MultiAgentReplayBuffer, steps: int, seed: int) -> dict[str, np.ndarray]:
    """``steps`` steps of one stream (episodes of 1 to 9 steps, next_obs the following obs
    inside an episode, an agent absent now and then); returns the integer actions written."""
    rng = np.random.default_rng(seed)
    specs = buf.specs
    obs = {a: rng.standard_normal((steps + 1, *s.obs_shape)) for a, s in specs.items()}
    done = (rng.random(steps) < 0.2).astype(np.float32)
    done[-1] = 1
    next_obs = {a: o[1:].copy() for a, o in obs.items()}
    for a in specs:
        next_obs[a][done == 1] += 1
    actions = {a: rng.integers(0, 4, steps) for a in specs}
    alive = {a: rng.random(steps) < 0.9 for a in specs}
    buf.extend(
        {a: o[:-1].astype(specs[a].obs_dtype) for a, o in obs.items()},
        actions,
        {a: rng.standard_normal(steps).astype(np.float32) for a in specs},
        {a: x.astype(specs[a].obs_dtype) for a, x in next_obs.items()},
        {a: done for a in specs},
        hidden={a: rng.standard_normal((steps, 3)).astype(np.float32) for a in specs},
        state=rng.standard_normal((steps, 6)).astype(np.float32),
        alive=alive,
    )
    return actions


def build(store: str, tmp_path: Any, half: bool = False, **kw: Any) -> MultiAgentReplayBuffer:
    kw = {"global_fields": {"state": FieldSpec((6,))}, "alive": True, "seed": 3, **kw}
    specs = make_specs(half)
    if store == "mapped":
        tmp_path.mkdir(parents=True, exist_ok=True)
        return MultiAgentReplayBuffer(specs, 64, path=tmp_path / "buf", **kw)
    if store == "torch-cpu":
        return MultiAgentReplayBuffer(specs, 64, device="cpu", **kw)
    return MultiAgentReplayBuffer(specs, 64, **kw)


def chosen_items(batch: Any, fields: tuple[str, ...]) -> dict[tuple[str, str], np.ndarray]:
    """Every chosen (field, agent) array of ``batch`` on the host."""
    out = {}
    for name in fields:
        if name == "state":
            out[(name, "")] = host(batch.globals[name])
            continue
        per_agent = batch.field(name) if name != "alive" else batch.alive
        for agent, value in per_agent.items():
            out[(name, agent)] = host(value)
    return out


def assert_chosen_equal(full: Any, part: Any, fields: tuple[str, ...]) -> None:
    want, got = chosen_items(full, fields), chosen_items(part, fields)
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        np.testing.assert_array_equal(got[key], value, err_msg=str(key))
    np.testing.assert_array_equal(host(part.indices), host(full.indices))
    for name in (*FIVE, "alive", "hidden", "state"):
        if name in fields:
            continue
        with pytest.raises((ValueError, AttributeError), match="fields="):
            if name in FIVE:
                dict(getattr(part, name))
            elif name == "alive":
                dict(part.alive)
            else:
                getattr(part, name)
        if name != "state":  # a global field is not a per-agent field of field()
            with pytest.raises(ValueError, match="fields="):
                part.field(name)


def gathered_bytes(batch: Any) -> int:
    block = batch.block
    return int(block.numel() * block.element_size()) if hasattr(block, "numel") else block.nbytes


PARAMS = [
    pytest.param(
        store, layout, batch_layout, next_obs, half,
        id=f"{store}-{layout}-{batch_layout}-{next_obs}-{'f16' if half else 'f32'}",
    )
    for store in STORES
    for layout in ("interleaved", "agent_major")
    for batch_layout in ("rows", "per_agent")
    for next_obs in ("once", "stored")
    for half in (False, True)
    if not (store == "torch-cpu" and layout == "agent_major")
    and not (layout == "agent_major" and batch_layout == "rows")
]  # fmt: skip


@pytest.mark.parametrize(("store", "layout", "batch_layout", "next_obs", "half"), PARAMS)
def test_chosen_fields_equal_the_full_batch(
    store: str, layout: str, batch_layout: str, next_obs: str, half: bool, tmp_path: Any
) -> None:
    kw = {"layout": layout, "batch_layout": batch_layout, "next_obs": next_obs}
    buf = build(store, tmp_path, half, **kw)
    write(buf, 50, seed=1)
    indices = np.random.default_rng(0).integers(0, len(buf), 17)
    full = buf.gather(indices)
    for fields in CHOICES:
        part = buf.gather(indices, fields=fields)
        assert_chosen_equal(full, part, fields)
        assert gathered_bytes(part) < gathered_bytes(full)
    # storage precision kept in the batch: the chosen fields are the stored float16 bits
    if half:
        stored = build(store, tmp_path / "s", half, batch_dtype="storage", **kw)
        write(stored, 50, seed=1)
        fields = ("obs", "hidden", "next_obs")
        assert_chosen_equal(stored.gather(indices), stored.gather(indices, fields=fields), fields)
    if store == "mapped":
        buf.close()


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
def test_sampled_rounds_sequences_and_episodes(
    store: str, batch_layout: str, tmp_path: Any
) -> None:
    """The sampler-driven paths draw as without fields= (same seed, same indices)."""
    fields = ("obs", "action", "reward", "state")
    for s, sampler in enumerate((None, Sequence(4, burn_in=1), Episodes(), Episodes(max_length=9))):
        made = [
            build(store, tmp_path / f"{s}-{k}", batch_layout=batch_layout, sampler=sampler)
            for k in range(2)
        ]
        for buf in made:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an absent agent may break a stream
                write(buf, 60, seed=2)
        full_buf, part_buf = made
        full, part = full_buf.sample(5), part_buf.sample(5, fields=fields)
        assert_chosen_equal(full, part, fields)
        if sampler is not None:
            np.testing.assert_array_equal(host(part.mask), host(full.mask))
            starts = host(full.indices)
            whole = full_buf.gather_sequences(starts, 7)
            some = part_buf.gather_sequences(starts, 7, fields=fields)
            assert_chosen_equal(whole, some, fields)
            np.testing.assert_array_equal(host(some.mask), host(whole.mask))
        else:
            for fulls, parts in (
                (full_buf.sample_for_trainers(4), part_buf.sample_for_trainers(4, fields=fields)),
                (list(full_buf.iter_trainers(4)), list(part_buf.iter_trainers(4, fields=fields))),
                (
                    full_buf.sample_for_trainers(4, shared_index=True),
                    part_buf.sample_for_trainers(4, shared_index=True, fields=fields),
                ),
            ):
                for one, other in zip(fulls, parts):
                    assert_chosen_equal(one, other, fields)
        if store == "mapped":
            for buf in made:
                buf.close()


@pytest.mark.parametrize("store", STORES)
def test_out_reuses_a_batch_of_the_same_fields(store: str, tmp_path: Any) -> None:
    buf = build(store, tmp_path)
    write(buf, 40, seed=4)
    fields = ("obs", "state")
    first = buf.sample(8, fields=fields)
    block = first.block
    again = buf.sample(8, out=first, fields=fields)
    assert again.block is block or host(again.block).ctypes.data == host(block).ctypes.data
    np.testing.assert_array_equal(
        host(again.obs["agent_1"]), host(buf.gather(host(again.indices)).obs["agent_1"])
    )
    with pytest.raises(ValueError, match="fields="):
        buf.sample(8, out=first)  # a full batch needs a full block
    if store == "mapped":
        buf.close()


def test_bad_fields_name_the_argument() -> None:
    buf = build("ram", None)
    write(buf, 10, seed=5)
    with pytest.raises(TypeError, match="fields must be None or a tuple"):
        buf.sample(2, fields="obs")
    with pytest.raises(ValueError, match="unknown: \\['nope'\\]"):
        buf.sample(2, fields=("obs", "nope"))
    with pytest.raises(ValueError, match="at least one"):
        buf.gather([0, 1], fields=())
    with pytest.raises(ValueError, match="unknown"):
        buf.iter_trainers(2, fields=("hiden",))
    # every field chosen is the default batch
    every = buf.gather([0, 1], fields=("obs", "action", "reward", "next_obs", "done", "hidden",
                                       "state", "alive"))  # fmt: skip
    assert every.gathered_fields is None


def test_a_left_out_field_says_so() -> None:
    buf = build("ram", None)
    write(buf, 10, seed=6)
    batch = buf.sample(3, fields=("obs",))
    assert isinstance(batch.next_obs, NotGathered)
    assert batch.gathered_fields == ("obs",)
    assert batch.extras == {} and batch.globals == {}
    with pytest.raises(ValueError, match=r"'reward' was not gathered.*fields=\('obs',\)"):
        batch.reward["agent_0"]
    with pytest.raises(ValueError, match="'action' was not gathered"):
        batch.action_index  # noqa: B018 - computed from the left-out one-hot
    with pytest.raises(ValueError, match="not gathered"):
        batch.as_lists()
    with pytest.raises(AttributeError, match="fields="):
        batch.state  # noqa: B018
    converted = batch.to_torch()
    assert isinstance(converted.done, NotGathered)
    assert converted.obs["agent_0"].shape == (3, 5)


# ----------------------------------------------------------------------- integer actions
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
@pytest.mark.parametrize("half", [False, True])
def test_action_index_is_the_integer_written(
    store: str, batch_layout: str, half: bool, tmp_path: Any
) -> None:
    buf = build(store, tmp_path, half, batch_layout=batch_layout, sampler=Episodes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an absent agent may break a stream
        actions = write(buf, 50, seed=7)  # slots 0..49 hold steps 0..49
    indices = np.arange(0, 50, 3)
    batch = buf.gather(indices)
    assert set(batch.action_index) == set(buf.specs)
    for agent, index in batch.action_index.items():
        if store == "torch-cpu":
            assert isinstance(index, torch.Tensor) and index.dtype == torch.int64
        got = host(index)
        assert got.dtype == np.int64 and got.shape == (len(indices),)
        np.testing.assert_array_equal(got, host(batch.action[agent]).argmax(axis=-1))
        np.testing.assert_array_equal(got, actions[agent][indices])
    # sequences and episodes: (B, L), 0 on the padding
    episodes = buf.sample(4)
    lengths = host(episodes.mask).shape
    for agent, index in episodes.action_index.items():
        got = host(index)
        assert got.shape == lengths and got.dtype == np.int64
        np.testing.assert_array_equal(got, host(episodes.action[agent]).argmax(axis=-1))
        assert not got[~host(episodes.mask)].any()
    sequences = build(store, tmp_path / "seq", half, batch_layout=batch_layout, sampler=Sequence(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write(sequences, 50, seed=7)
    runs = sequences.sample(6)
    assert type(runs).__name__ in ("SequenceBatch", "DeviceSequenceBatch")
    for agent, index in runs.action_index.items():
        np.testing.assert_array_equal(host(index), host(runs.action[agent]).argmax(axis=-1))
        assert host(index).shape == (6, 3)
    if store == "mapped":
        sequences.close()
    chosen = buf.sample(4, fields=("action",))
    np.testing.assert_array_equal(
        host(chosen.action_index["agent_2"]), host(chosen.action["agent_2"]).argmax(axis=-1)
    )
    if store == "mapped":
        buf.close()


def test_action_index_leaves_continuous_agents_out() -> None:
    specs = {
        "discrete": AgentSpec((2,), (3,), n_discrete_actions=3),
        "continuous": AgentSpec((2,), (3,)),
    }
    buf = MultiAgentReplayBuffer(specs, 8)
    buf.add(
        {a: np.zeros(2, np.float32) for a in specs},
        {"discrete": 2, "continuous": np.ones(3, np.float32)},
        {a: 0.0 for a in specs},
        {a: np.zeros(2, np.float32) for a in specs},
        {a: 0.0 for a in specs},
    )
    batch = buf.gather([0])
    assert list(batch.action_index) == ["discrete"]
    assert batch.action_index["discrete"].tolist() == [2]
    assert batch.to_torch().action_index["discrete"].tolist() == [2]


# ------------------------------------------------- team reward and per-episode constants
def test_team_reward_and_episode_constants_as_global_fields() -> None:
    """The documented recipe (docs/guides/epymarl.md): a team reward is one global value per step,
    a per-episode constant a global field written with the episode's value at each step."""
    specs = {f"agent_{i}": AgentSpec((4,), (3,), n_discrete_actions=3) for i in range(16)}
    globals_ = {"team_reward": FieldSpec(()), "map_id": FieldSpec((), np.int32)}
    plain = MultiAgentReplayBuffer(specs, 1000, sampler=Episodes())
    buf = MultiAgentReplayBuffer(specs, 1000, sampler=Episodes(), global_fields=globals_, seed=1)
    extras = {name: FieldSpec(fs.shape, fs.dtype) for name, fs in globals_.items()}
    per_agent = MultiAgentReplayBuffer(
        {a: AgentSpec((4,), (3,), n_discrete_actions=3, extras=extras) for a in specs},
        1000,
        sampler=Episodes(),
    )
    # stored once per step: the two globals add 8 bytes to a row (at most one more cache
    # line of padding), per-agent copies 8 bytes per agent
    assert buf.nbytes - plain.nbytes <= 1000 * 64 < per_agent.nbytes - plain.nbytes
    rng = np.random.default_rng(0)
    team, maps = {}, {}
    for episode, length in enumerate(rng.integers(3, 12, size=40)):
        obs = rng.random((length + 1, 4), np.float32)
        first = buf.cursor
        team[first] = rng.standard_normal(length).astype(np.float32)
        maps[first] = episode
        buf.extend(
            obs={a: obs[:-1] for a in specs},
            action={a: np.zeros(length, np.int64) for a in specs},
            reward={a: np.zeros(length, np.float32) for a in specs},
            next_obs={a: obs[1:] for a in specs},
            done={a: (np.arange(length) == length - 1).astype(np.float32) for a in specs},
            team_reward=team[first],
            map_id=np.full(length, episode, np.int32),
        )
    batch = buf.sample(16, fields=("obs", "team_reward", "map_id"))
    for b, start in enumerate(batch.indices.tolist()):
        length = int(batch.lengths[b])
        np.testing.assert_array_equal(batch.team_reward[b, :length], team[start])
        assert (batch.map_id[b, :length] == maps[start]).all()
        assert batch.map_id[b, 0] == maps[start]  # the constant, read at the first step
        assert not batch.team_reward[b, length:].any()  # padding
