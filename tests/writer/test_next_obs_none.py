"""Buffers without next observations (``next_obs="none"``).

A ``"none"`` buffer stores the lean row without links or side table, its writes leave
``next_obs`` out, and its batches hold every other field. On every store, layout and batch
layout, with extras, a global field and alive flags, its batches must equal those of a
``next_obs="stored"`` buffer fed the same data with the same seed, field by field and bit for
bit, minus ``next_obs``, which every batch refuses with a ``ValueError`` naming
``next_obs="none"``. Also: the refusals of writes that do or do not pass ``next_obs``, the
choice of ``"auto"``, episodes without stream-break detection, state files, and the memory
estimates.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer, memory_cli  # noqa: E402
from marlbuf.buffer import NextObsDroppedWarning, StreamBreakWarning  # noqa: E402
from marlbuf.memory import estimate, format_options  # noqa: E402
from marlbuf.samplers import Episodes, Prioritized, Sampler, Sequence, Uniform  # noqa: E402

KEPT = ("obs", "action", "reward", "done")
GLOBALS = {"state": FieldSpec((6,))}
#: (store, layout): the torch store keeps interleaved rows only (see the capabilities table)
STORE_LAYOUTS = [
    ("ram", "interleaved"),
    ("ram", "agent_major"),
    ("mapped", "interleaved"),
    ("mapped", "agent_major"),
    ("torch-cpu", "interleaved"),
    ("torch-cuda", "interleaved"),
]


def stores(mapped: bool = True) -> list[Any]:
    """:data:`STORE_LAYOUTS` as parameters (CUDA ones marked ``cuda``; without mapped ones)."""
    return [
        pytest.param(store, layout, id=f"{store}-{layout}", marks=pytest.mark.cuda)
        if store == "torch-cuda"
        else pytest.param(store, layout, id=f"{store}-{layout}")
        for store, layout in STORE_LAYOUTS
        if mapped or store != "mapped"
    ]


STORES = stores()


def make_specs(half: bool = False) -> dict[str, AgentSpec]:
    """Three agents of different sizes, one discrete actor, a float16 extra field and, with
    ``half``, float16 observations (converted to float32 batches)."""
    obs_dtype = np.float16 if half else np.float32
    return {
        f"agent_{i}": AgentSpec(
            obs_shape=(5 + 2 * i,),
            action_shape=(4,),
            obs_dtype=obs_dtype,
            n_discrete_actions=4 if i == 1 else None,
            extras={"hidden": FieldSpec((3,), np.float16), "avail": FieldSpec((4,), np.bool_)},
        )
        for i in range(3)
    }


def stream_steps(specs: dict[str, AgentSpec], steps: int, seed: int) -> dict[str, Any]:
    """``steps`` consecutive steps of one environment: episodes end by a done (every agent)
    or a truncation, the last step is done; ``next_obs`` is the following step's ``obs``
    except at an episode end (a reset follows); an agent is absent now and then."""
    rng = np.random.default_rng(seed)
    chain = {
        a: rng.standard_normal((steps + 1, *s.obs_shape)).astype(s.obs_dtype)
        for a, s in specs.items()
    }
    ends = rng.random(steps) < 0.15
    ends[-1] = True
    truncated = ends & (rng.random(steps) < 0.5)
    truncated[-1] = False
    done = (ends & ~truncated).astype(np.float32)
    next_obs = {a: c[1:].copy() for a, c in chain.items()}
    for a in specs:
        next_obs[a][ends] += 1  # the next step starts from a reset observation
    alive = {a: rng.random(steps) < 0.9 for a in specs}
    alive["agent_0"][:] = True
    return {
        "obs": {a: c[:-1] for a, c in chain.items()},
        "action": {
            a: rng.integers(0, 4, steps)
            if s.n_discrete_actions
            else rng.standard_normal((steps, 4)).astype(np.float32)
            for a, s in specs.items()
        },
        "reward": {a: rng.standard_normal(steps).astype(np.float32) for a in specs},
        "next_obs": next_obs,
        "done": {a: done for a in specs},
        "hidden": {a: rng.standard_normal((steps, 3)).astype(np.float16) for a in specs},
        "avail": {a: rng.random((steps, 4)) < 0.5 for a in specs},
        "state": rng.standard_normal((steps, 6)).astype(np.float32),
        "alive": alive,
        "truncated": truncated,
    }


def without_next_obs(data: dict[str, Any]) -> dict[str, Any]:
    return {f: v for f, v in data.items() if f != "next_obs"}


def step_of(data: dict[str, Any], t: int) -> dict[str, Any]:
    """Step ``t`` of :func:`stream_steps` output, as ``add`` takes it."""
    out: dict[str, Any] = {}
    for f, value in data.items():
        if isinstance(value, dict):
            out[f] = {a: v[t] for a, v in value.items()}
        else:
            out[f] = value[t]
    out["truncated"] = bool(out["truncated"])
    return out


def envs_step(data: list[dict[str, Any]], t: int) -> dict[str, Any]:
    """Step ``t`` of several environments' :func:`stream_steps`, as ``add_envs`` takes it."""
    out: dict[str, Any] = {}
    for f, value in data[0].items():
        if isinstance(value, dict):
            out[f] = {a: np.stack([d[f][a][t] for d in data]) for a in value}
        else:
            out[f] = np.stack([d[f][t] for d in data])
    return out


def build(store: str, layout: str, tmp_path: Any, specs: Any, **kw: Any) -> MultiAgentReplayBuffer:
    kw = {"global_fields": GLOBALS, "alive": True, "seed": 3, "layout": layout, **kw}
    if store == "mapped":
        tmp_path.mkdir(parents=True, exist_ok=True)
        folder = tmp_path / f"buf{len(list(tmp_path.iterdir()))}"
        return MultiAgentReplayBuffer(specs, path=folder, **kw)
    if store.startswith("torch"):
        if store == "torch-cuda" and not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        return MultiAgentReplayBuffer(specs, device=store.split("-")[1], **kw)
    return MultiAgentReplayBuffer(specs, **kw)


def pair(
    store: str,
    layout: str,
    tmp_path: Any,
    half: bool = False,
    sampler: Any = Uniform,
    capacity: int = 64,
    **kw: Any,
) -> tuple[MultiAgentReplayBuffer, MultiAgentReplayBuffer]:
    """A ``next_obs="stored"`` NumPy buffer and a ``next_obs="none"`` buffer on ``store``."""
    specs = make_specs(half)
    made = [
        build(where, layout, tmp_path, specs, capacity=capacity, sampler=sampler(), **kw, **fmt)
        for where, fmt in (("ram", {"next_obs": "stored"}), (store, {"next_obs": "none"}))
    ]
    return made[0], made[1]


def write_both(ref: MultiAgentReplayBuffer, buf: MultiAgentReplayBuffer, rounds: int = 3) -> None:
    """The same data into both: ``extend`` of a stream (wrapping the ring), one-step ``add``
    of another stream, ``add_envs`` of two more; ``buf`` without next_obs."""
    specs = ref.specs
    for k in range(rounds):
        data = stream_steps(specs, 30, k)
        ref.extend(**data, stream=0)
        buf.extend(**without_next_obs(data), stream=0)
        data = stream_steps(specs, 6, 100 + k)
        for t in range(6):
            ref.add(**step_of(data, t), stream=1)
            buf.add(**step_of(without_next_obs(data), t), stream=1)
        envs = [stream_steps(specs, 4, 200 + 10 * k + e) for e in range(2)]
        for t in range(4):
            ref.add_envs(**envs_step(envs, t), first_stream=2)
            buf.add_envs(**without_next_obs(envs_step(envs, t)), first_stream=2)


def host(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def assert_equal_minus_next_obs(want: Any, got: Any, fields: tuple[str, ...] = KEPT) -> None:
    """Every field ``want`` (a batch of the "stored" buffer) holds, but next_obs, equals
    ``got``'s bit for bit; ``got.next_obs`` refuses every use, naming next_obs='none'."""
    for name in fields:
        for agent, value in want.field(name).items():
            mine = host(got.field(name)[agent])
            assert mine.dtype == value.dtype, (name, agent)
            np.testing.assert_array_equal(mine, value, err_msg=f"{name}[{agent}]")
    for name, per_agent in want.extras.items():
        for agent, value in per_agent.items():
            np.testing.assert_array_equal(host(got.extras[name][agent]), value, err_msg=name)
    for name, value in want.globals.items():
        np.testing.assert_array_equal(host(got.globals[name]), value)
    if want.alive is not None:
        for agent, value in want.alive.items():
            np.testing.assert_array_equal(host(got.alive[agent]), value)
    np.testing.assert_array_equal(host(got.indices), want.indices)
    np.testing.assert_array_equal(host(got.generations), want.generations)
    if want.weights is not None:
        np.testing.assert_array_equal(host(got.weights), want.weights)
    for name in ("mask", "slots", "lengths"):
        if hasattr(want, name) and name in vars(want):
            np.testing.assert_array_equal(host(getattr(got, name)), getattr(want, name))
    for agent, value in want.action_index.items():
        np.testing.assert_array_equal(host(got.action_index[agent]), value)
    assert_refuses_next_obs(got)


def assert_refuses_next_obs(batch: Any) -> None:
    for use in (
        lambda: batch.next_obs["agent_0"],
        lambda: dict(batch.next_obs),
        lambda: batch.field("next_obs"),
        lambda: batch.as_lists(),
        lambda: batch.concat("obs", "next_obs"),
    ):
        with pytest.raises(ValueError, match="next_obs='none'"):
            use()


# ----------------------------------------------------------------------------- batches
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
@pytest.mark.parametrize(("store", "layout"), STORES)
def test_batches_equal_a_stored_buffer_minus_next_obs(
    store: str, layout: str, batch_layout: str, tmp_path: Any
) -> None:
    ref, buf = pair(store, layout, tmp_path, batch_layout=batch_layout)
    assert buf.next_obs == "none" and ref.next_obs == "stored"
    write_both(ref, buf)
    assert len(buf) == len(ref) == 64 and buf.total_writes == ref.total_writes
    np.testing.assert_array_equal(buf.write_generation, ref.write_generation)
    assert buf.nbytes < ref.nbytes  # no next_obs bytes in any row
    for t in range(3):
        assert_equal_minus_next_obs(ref.sample(8, trainer=t), buf.sample(8, trainer=t))
    for want, got in zip(ref.sample_for_trainers(8), buf.sample_for_trainers(8)):
        assert_equal_minus_next_obs(want, got)
    for want, got in zip(
        ref.sample_for_trainers(8, shared_index=True), buf.sample_for_trainers(8, shared_index=True)
    ):
        assert_equal_minus_next_obs(want, got)
    for want, got in zip(ref.iter_trainers(8), buf.iter_trainers(8)):
        assert_equal_minus_next_obs(want, got)
    idx = np.array([63, 0, 5, 5, 17])
    assert_equal_minus_next_obs(ref.gather(idx), buf.gather(idx))
    assert_equal_minus_next_obs(ref.latest(7), buf.latest(7))
    # out= reuses a batch's memory (a round's too)
    first, _ = buf.sample(8), ref.sample(8)
    assert_equal_minus_next_obs(ref.sample(8), buf.sample(8, out=first))
    round_, _ = buf.sample_for_trainers(8), ref.sample_for_trainers(8)
    for want, got in zip(ref.sample_for_trainers(8), buf.sample_for_trainers(8, out=round_)):
        assert_equal_minus_next_obs(want, got)
    # fields= chooses among the fields a "none" buffer stores
    chosen = ("reward", "obs", "state", "alive", "hidden")
    want, got = ref.sample(8, fields=chosen), buf.sample(8, fields=chosen)
    for name in ("obs", "reward"):
        for agent, value in want.field(name).items():
            np.testing.assert_array_equal(host(got.field(name)[agent]), value)
    np.testing.assert_array_equal(host(got.globals["state"]), want.globals["state"])
    np.testing.assert_array_equal(host(got.extras["hidden"]["agent_2"]), want.hidden["agent_2"])
    with pytest.raises(ValueError, match="next_obs='none'"):
        got.next_obs["agent_0"]
    with pytest.raises(ValueError, match="fields="):  # left out by fields=, and stored
        got.action["agent_0"]
    every = tuple(n for n in buf.storage.field_names)
    assert "next_obs" not in every
    assert_equal_minus_next_obs(ref.sample(8), buf.sample(8, fields=every))  # = fields=None
    # every stored value of the kept fields, read in place
    for name in (*KEPT, "hidden", "alive"):
        for agent, value in ref.stored(name).items():
            np.testing.assert_array_equal(buf.stored(name)[agent], value)
    np.testing.assert_array_equal(buf.stored("state"), ref.stored("state"))
    assert buf.reward_stats() == ref.reward_stats()
    buf.close()


@pytest.mark.parametrize(("store", "layout"), stores(mapped=False))
def test_half_precision_batches_equal_a_stored_buffer(
    store: str, layout: str, tmp_path: Any
) -> None:
    """float16 observations converted to float32 in the gather (and kept float16 with
    batch_dtype="storage"): the gather plan path, not the whole-row copy."""
    for batch_dtype in ("float32", "storage"):
        ref, buf = pair(store, layout, tmp_path, half=True, batch_dtype=batch_dtype)
        write_both(ref, buf, rounds=2)
        for t in range(2):
            assert_equal_minus_next_obs(ref.sample(8, trainer=t), buf.sample(8, trainer=t))
        for want, got in zip(ref.sample_for_trainers(8), buf.sample_for_trainers(8)):
            assert_equal_minus_next_obs(want, got)


SEQUENCE_SAMPLERS = {
    "sequence": lambda: Sequence(4, burn_in=2),
    "sequence-unpadded-prioritized": lambda: Sequence(3, pad=False, prioritized=True),
    "episodes": lambda: Episodes(),
    "episodes-fixed-prioritized": lambda: Episodes(max_length=6, prioritized=True),
}


@pytest.mark.parametrize("kind", sorted(SEQUENCE_SAMPLERS))
@pytest.mark.parametrize(("store", "layout"), STORES)
def test_sequence_and_episode_batches_equal_a_stored_buffer(
    store: str, layout: str, kind: str, tmp_path: Any
) -> None:
    batch_layout = "per_agent" if kind.endswith("prioritized") else "rows"
    ref, buf = pair(
        store, layout, tmp_path, sampler=SEQUENCE_SAMPLERS[kind], batch_layout=batch_layout
    )
    write_both(ref, buf)
    # the same episodes: every stream is written on its own, so no step breaks a stream
    assert buf.complete_episodes == ref.complete_episodes > 0
    assert buf.stored_episodes == ref.stored_episodes
    for t in range(2):
        want, got = ref.sample(4, trainer=t), buf.sample(4, trainer=t)
        assert_equal_minus_next_obs(want, got)
        if ref.sampler.weighted:
            td = np.linspace(0.1, 2.0, 4)
            ref.update_priorities(want.indices, td, trainer=t)
            buf.update_priorities(got.indices, td, trainer=t)
    starts = ref.sample(3).indices
    buf.sample(3)  # the same draw (both generators move alike)
    assert_equal_minus_next_obs(ref.gather_sequences(starts, 5), buf.gather_sequences(starts, 5))
    fields = ("obs", "done")
    want = ref.gather_sequences(starts, 5, fields=fields)
    got = buf.gather_sequences(starts, 5, fields=fields)
    for name in fields:
        for agent, value in want.field(name).items():
            np.testing.assert_array_equal(host(got.field(name)[agent]), value)
    with pytest.raises(ValueError, match="next_obs='none'"):
        got.next_obs["agent_0"]
    buf.close()


def test_numpy_batches_to_torch_keep_the_refusal() -> None:
    specs = make_specs()
    buf = MultiAgentReplayBuffer(specs, 32, next_obs="none", global_fields=GLOBALS, alive=True)
    buf.extend(**without_next_obs(stream_steps(specs, 20, 0)))
    batch = buf.sample(4)
    assert batch.gathered_fields == buf.storage.field_names
    tensors = batch.to_torch()
    assert tensors.obs["agent_0"].shape == (4, 5)
    with pytest.raises(ValueError, match="next_obs='none'"):
        tensors.next_obs["agent_0"]
    with pytest.raises(ValueError, match="next_obs='none'"):
        tensors.as_lists()
    assert "not stored" in repr(batch.next_obs)
    device = MultiAgentReplayBuffer(specs, 32, next_obs="none", device="cpu", **_more())
    device.extend(**without_next_obs(stream_steps(specs, 20, 0)))
    host_copy = device.sample(4).to_numpy()
    with pytest.raises(ValueError, match="next_obs='none'"):
        host_copy.next_obs["agent_0"]


def _more() -> dict[str, Any]:
    return {"global_fields": GLOBALS, "alive": True}


# ----------------------------------------------------------------------------- writes
def small_specs() -> dict[str, AgentSpec]:
    return {f"a{i}": AgentSpec((12 + i,), (2,)) for i in range(2)}


def small_steps(steps: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    specs = small_specs()
    chain = {
        a: rng.standard_normal((steps + 1, *s.obs_shape)).astype(np.float32)
        for a, s in specs.items()
    }
    return {
        "obs": {a: c[:-1] for a, c in chain.items()},
        "action": {a: np.zeros((steps, 2), np.float32) for a in specs},
        "reward": {a: np.ones(steps, np.float32) for a in specs},
        "next_obs": {a: c[1:] for a, c in chain.items()},
        "done": {a: np.zeros(steps, np.float32) for a in specs},
    }


def one(data: dict[str, Any], t: int = 0) -> dict[str, Any]:
    return {f: {a: v[t] for a, v in per.items()} for f, per in data.items()}


@pytest.mark.parametrize("mode", ["once", "stored"])
def test_writes_without_next_obs_are_refused_where_it_is_kept(mode: str) -> None:
    buf = MultiAgentReplayBuffer(small_specs(), 16, next_obs=mode)
    data = without_next_obs(small_steps(3))
    for call, args in (
        (buf.add, one(data)),
        (buf.extend, data),
        (buf.add_envs, data),
    ):
        with pytest.raises(
            ValueError, match=rf"got no next_obs.*next_obs='{mode}'.*next_obs='none'"
        ):
            call(**args)
    assert len(buf) == 0 and buf.total_writes == 0


def test_writes_with_next_obs_are_refused_without_it() -> None:
    buf = MultiAgentReplayBuffer(small_specs(), 16, next_obs="none")
    data = small_steps(3)
    for call, args in ((buf.add, one(data)), (buf.extend, data), (buf.add_envs, data)):
        with pytest.raises(
            ValueError, match=r"got next_obs.*\(next_obs='none'\).*leave next_obs out"
        ):
            call(**args)
    # done given in next_obs's place (positionally): done is missing, and the hint says why
    d = one(data)
    with pytest.raises(TypeError, match="pass done by keyword"):
        buf.add(d["obs"], d["action"], d["reward"], d["done"])
    with pytest.raises(TypeError, match="missing the required argument done"):
        buf.extend(data["obs"], data["action"], data["reward"])
    assert len(buf) == 0
    # positional obs, action, reward and done by keyword is the normal call
    buf.add(d["obs"], d["action"], d["reward"], done=d["done"])
    buf.extend(**without_next_obs(data))
    buf.add_envs(**without_next_obs(data), first_stream=4)
    assert len(buf) == 7


def test_missing_done_is_a_type_error_in_every_mode() -> None:
    buf = MultiAgentReplayBuffer(small_specs(), 16, next_obs="stored")
    d = one(small_steps(1))
    with pytest.raises(TypeError, match="missing the required argument done"):
        buf.add(d["obs"], d["action"], d["reward"], d["next_obs"])


def test_auto_chooses_none_at_a_first_write_without_next_obs() -> None:
    data = small_steps(5)
    for first in ("add", "extend", "add_envs"):
        buf = MultiAgentReplayBuffer(small_specs(), 16, seed=0)
        assert buf.next_obs == "once"
        args = one(without_next_obs(data)) if first == "add" else without_next_obs(data)
        with pytest.warns(NextObsDroppedWarning, match=f"{first}\\(\\) got no next_obs"):
            getattr(buf, first)(**args)
        assert buf.next_obs == "none" and buf.links is None and not buf.storage.stores_next_obs
        with pytest.raises(ValueError, match="chosen by its first write, which had none"):
            buf.extend(**data)
        buf.extend(**without_next_obs(data))
        assert_refuses_next_obs(buf.sample(3))
    # tiny rows make "auto" dense at construction; a first write without next_obs still decides
    tiny = {"a": AgentSpec((1,), (1,))}
    buf = MultiAgentReplayBuffer(tiny, 8)
    assert buf.next_obs == "stored"
    with pytest.warns(NextObsDroppedWarning):
        buf.add({"a": np.zeros(1)}, {"a": np.zeros(1)}, {"a": 0.0}, done={"a": 0.0})
    assert buf.next_obs == "none" and len(buf) == 1


def test_auto_keeps_the_format_its_first_write_chose() -> None:
    buf = MultiAgentReplayBuffer(small_specs(), 16)
    buf.extend(**small_steps(4))
    assert buf.next_obs == "once"
    with pytest.raises(ValueError, match="next_obs='auto' chose 'once' at this buffer's first"):
        buf.extend(**without_next_obs(small_steps(4)))
    assert len(buf) == 4


def test_memory_mapped_auto_buffers_need_an_explicit_none(tmp_path: Any) -> None:
    with MultiAgentReplayBuffer(small_specs(), 16, path=tmp_path / "auto") as buf:
        with pytest.raises(ValueError, match=r"memory-mapped.*next_obs='none'"):
            buf.extend(**without_next_obs(small_steps(3)))
        assert len(buf) == 0


def test_fields_and_stored_refuse_next_obs() -> None:
    buf = MultiAgentReplayBuffer(small_specs(), 16, next_obs="none")
    buf.extend(**without_next_obs(small_steps(6)))
    for call in (
        lambda: buf.sample(2, fields=("obs", "next_obs")),
        lambda: buf.sample_for_trainers(2, fields=["next_obs"]),
        lambda: buf.iter_trainers(2, fields=("next_obs",)),
        lambda: buf.gather([0, 1], fields=("next_obs", "reward")),
        lambda: buf.stored("next_obs"),
    ):
        with pytest.raises(ValueError, match="next_obs='none'"):
            call()
    with pytest.raises(ValueError, match="unknown"):
        buf.sample(2, fields=("obs", "colour"))


# ----------------------------------------------------------------------------- episodes
def two_envs_on_one_stream(steps: int = 12) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two environments' steps written in turn on one stream (done at the last step of each
    environment's episode): with next_obs the buffer sees every step break its stream."""
    specs = small_specs()
    envs = [small_steps(steps // 2, seed) for seed in (1, 2)]
    order = {
        f: {a: np.empty((steps, *envs[0][f][a].shape[1:]), np.float32) for a in specs}
        for f in envs[0]
    }
    for f in order:
        for a in specs:
            order[f][a][0::2] = envs[0][f][a]
            order[f][a][1::2] = envs[1][f][a]
    for a in specs:
        order["done"][a][-2:] = 1
    return order, without_next_obs(order)


def test_without_next_obs_an_episode_ends_only_at_a_done_or_truncated_step() -> None:
    with_next, without = two_envs_on_one_stream()
    kept = MultiAgentReplayBuffer(small_specs(), 32, sampler=Episodes(), next_obs="stored")
    with pytest.warns(StreamBreakWarning):
        kept.extend(**with_next)
    # every step broke the stream: ten one-step episodes ended by a break, two by their done
    assert kept.complete_episodes == 12
    none = MultiAgentReplayBuffer(small_specs(), 32, sampler=Episodes(), next_obs="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no StreamBreakWarning: it cannot be seen
        none.extend(**without)
        assert none.episodes is not None and none.episodes.breaks == 0
        assert none.complete_episodes == 2  # ended by the done steps only
        batch = none.sample(2)
        assert sorted(batch.lengths.tolist()) == [1, 11]
        # a truncated step ends the episode too
        none.extend(**without_next_obs(small_steps(4, 7)), truncated=np.array([0, 1, 0, 0], bool))
        assert none.complete_episodes == 3


def test_add_envs_then_extend_of_as_many_steps_is_not_refused_without_next_obs() -> None:
    """With next_obs, an extend whose every step breaks the stream after add_envs of as many
    environments is refused (one step of each environment given as consecutive steps); a
    buffer without next_obs cannot tell, so it stores the steps."""
    data = small_steps(3)
    data["next_obs"] = {a: v + 5 for a, v in data["next_obs"].items()}  # no step follows another
    kept = MultiAgentReplayBuffer(small_specs(), 16, sampler=Sequence(2), next_obs="stored")
    kept.add_envs(**data)
    with pytest.raises(ValueError, match="looks like one step of 3 environments"):
        kept.extend(**data)
    none = MultiAgentReplayBuffer(small_specs(), 16, sampler=Sequence(2), next_obs="none")
    none.add_envs(**without_next_obs(data))
    none.extend(**without_next_obs(data))
    assert len(none) == 6


# ----------------------------------------------------------------------------- state files
@pytest.mark.parametrize(("store", "layout"), STORES)
def test_save_load_and_state_dict_round_trips(store: str, layout: str, tmp_path: Any) -> None:
    def sampler() -> Sampler:
        return Prioritized(alpha=0.6, beta=0.4)  # its priority trees are saved too

    ref, buf = pair(store, layout, tmp_path, sampler=sampler)
    write_both(ref, buf, rounds=2)
    batch = buf.sample(8, trainer=1)
    buf.update_priorities(batch.indices, np.linspace(0.5, 3.0, 8), trainer=1)
    buf.save(tmp_path / "none.npz")
    state = buf.state_dict()
    assert state["next_obs"] == "none" and state["links"] == {}
    loaded = MultiAgentReplayBuffer.load(
        tmp_path / "none.npz", device=store.split("-")[1] if store.startswith("torch") else None
    )
    assert loaded.next_obs == "none" and not loaded.storage.stores_next_obs
    copy = build(
        store, layout, tmp_path, make_specs(), capacity=64, sampler=sampler(), next_obs="none"
    )
    copy.load_state_dict(state)
    for t in range(3):  # the same draws, weights and rows from the saved state on
        want = buf.sample(8, trainer=t)
        want = want.to_numpy() if hasattr(want, "to_numpy") else want
        for other in (loaded, copy):
            assert_equal_minus_next_obs(want, other.sample(8, trainer=t))
    if store == "mapped":
        folder = buf._mapped.folder  # type: ignore[union-attr]
        buf.close()
        reopened = MultiAgentReplayBuffer.open(folder)
        assert reopened.next_obs == "none" and len(reopened) == 64
        data = stream_steps(reopened.specs, 5, 99)
        reopened.extend(**without_next_obs(data))
        ref.extend(**data)
        np.testing.assert_array_equal(
            host(reopened.latest(5).reward["agent_0"]), ref.latest(5).reward["agent_0"]
        )
        reopened.close()
    for other in (loaded, copy):
        other.close()


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_a_memory_mapped_buffer_replays_its_log_after_a_crash(layout: str, tmp_path: Any) -> None:
    """The redo log holds the staged rows (obs in the next_obs section, which the lean rows
    drop): replayed, they give the rows and episodes a buffer in RAM holds."""
    specs = make_specs()
    kw = {"layout": layout, "sampler": Sequence(3), "next_obs": "none", "seed": 1, **_more()}
    ram = MultiAgentReplayBuffer(specs, 48, **kw)
    buf = MultiAgentReplayBuffer(specs, 48, path=tmp_path / "crash", **kw)
    for k in range(3):
        data = without_next_obs(stream_steps(specs, 20, k))
        for b in (ram, buf):
            b.extend(**data)
            b.add(**step_of(data, 0), stream=5)
    assert buf._mapped is not None
    buf._mapped.release()  # as if the process had died: no clean checkpoint
    reopened = MultiAgentReplayBuffer.open(tmp_path / "crash")
    assert reopened.next_obs == "none" and reopened.total_writes == ram.total_writes
    assert reopened.complete_episodes == ram.complete_episodes
    everything = np.arange(len(ram))
    want, got = ram.gather(everything), reopened.gather(everything)
    for name in KEPT:
        for agent, value in want.field(name).items():
            np.testing.assert_array_equal(got.field(name)[agent], value)
    for a, b in zip(
        (ram.sample(4, trainer=t) for t in range(2)),
        (reopened.sample(4, trainer=t) for t in range(2)),
    ):
        np.testing.assert_array_equal(a.obs["agent_2"], b.obs["agent_2"])
    reopened.close()


@pytest.mark.parametrize("saved", ["once", "stored"])
@pytest.mark.parametrize(("store", "layout"), stores(mapped=False))
def test_a_state_with_next_obs_loads_into_a_none_buffer(
    saved: str, store: str, layout: str, tmp_path: Any
) -> None:
    """convert_state drops the next observations (from either layout: the state's layout is
    the other one, converted too)."""
    specs = make_specs()
    other_layout = "agent_major" if layout == "interleaved" else "interleaved"
    source = build("ram", other_layout, tmp_path, specs, capacity=64, next_obs=saved)
    for k in range(3):
        source.extend(**stream_steps(specs, 30, k))
    state = source.state_dict()
    ref = build("ram", layout, tmp_path, specs, capacity=64, next_obs="stored")
    ref.load_state_dict(state)
    none = build(store, layout, tmp_path, specs, capacity=64, next_obs="none")
    none.load_state_dict(state)
    assert none.next_obs == "none" and len(none) == 64
    for t in range(2):
        assert_equal_minus_next_obs(ref.sample(16, trainer=t), none.sample(16, trainer=t))
    # and on: the loaded buffer writes without next_obs
    data = stream_steps(specs, 10, 9)
    ref.extend(**data)
    none.extend(**without_next_obs(data))
    assert_equal_minus_next_obs(ref.latest(10), none.latest(10))


def test_a_none_state_is_refused_where_next_obs_is_kept_and_adopted_by_auto(tmp_path: Any) -> None:
    specs = small_specs()
    none = MultiAgentReplayBuffer(specs, 16, next_obs="none", seed=1)
    none.extend(**without_next_obs(small_steps(9)))
    state = none.state_dict()
    for mode in ("once", "stored"):
        kept = MultiAgentReplayBuffer(specs, 16, next_obs=mode)
        kept.extend(**small_steps(2))
        with pytest.raises(ValueError, match=rf"holds no next observations.*next_obs='{mode}'"):
            kept.load_state_dict(state)
        assert len(kept) == 2 and kept.next_obs == mode  # unchanged
    auto = MultiAgentReplayBuffer(specs, 16)  # "auto", nothing written yet: adopts "none"
    auto.load_state_dict(state)
    assert auto.next_obs == "none" and len(auto) == 9
    np.testing.assert_array_equal(auto.sample(4).obs["a0"], none.sample(4).obs["a0"])
    decided = MultiAgentReplayBuffer(specs, 16)
    decided.extend(**small_steps(2))  # "auto" decided "once" by a write
    with pytest.raises(ValueError, match="holds no next observations"):
        decided.load_state_dict(state)
    none.save(tmp_path / "none.npz")
    for device in (None, "cpu"):
        assert MultiAgentReplayBuffer.load(tmp_path / "none.npz", device=device).next_obs == "none"
    # a rejected state leaves an "auto" buffer undecided
    fresh = MultiAgentReplayBuffer(specs, 16)
    broken = dict(state, write_generation=np.asarray(state["write_generation"])[:3])
    with pytest.raises(ValueError):
        fresh.load_state_dict(broken)
    assert fresh.next_obs == "once" and fresh.storage.stores_next_obs
    with pytest.warns(NextObsDroppedWarning):
        fresh.extend(**without_next_obs(small_steps(2)))
    assert fresh.next_obs == "none"


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_memory_estimate_counts_rows_without_next_obs(layout: str) -> None:
    specs = make_specs()
    kw = {"global_fields": GLOBALS, "alive": True}
    none = estimate(specs, 1000, layout, "none", **kw)
    once = estimate(specs, 1000, layout, "once", **kw)
    stored = estimate(specs, 1000, layout, "stored", **kw)
    assert none.side_table_bytes == 0 and none.metadata_bytes == stored.metadata_bytes
    assert none.table_row_bytes == once.table_row_bytes < stored.table_row_bytes
    assert none.total_bytes < once.total_bytes
    buf = MultiAgentReplayBuffer(specs, 1000, layout=layout, next_obs="none", **kw)
    assert buf.nbytes == none.storage_bytes  # the storage arrays, nothing more
    options = {o.name: o for o in format_options(specs, 1000, layout, **kw)}
    assert list(options)[-2:] == ["no next_obs", "no next_obs, float16 obs"]
    assert options["no next_obs"].estimate == none
    assert options["no next_obs, float16 obs"].setting.startswith("next_obs='none' + ")
    assert not options["no next_obs"].keeps_next_obs and options["dense"].keeps_next_obs
    # float16 observations already: no float16 variants
    names = [o.name for o in format_options(make_specs(half=True), 1000, layout, **kw)]
    assert names[-1] == "no next_obs" and "no next_obs, float16 obs" not in names


def test_memory_command_shows_the_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert memory_cli.main(["--agents", "3", "--capacity", "1e5"]) == 0
    out = capsys.readouterr().out
    assert "no next_obs " in out and "no next_obs, float16 obs" in out
    assert 'next_obs="none"' in out


def test_memory_error_of_a_none_buffer_lists_formats_without_next_obs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from marlbuf import build

    specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
    needed = estimate(specs, 2_000_000, next_obs="none")
    monkeypatch.setattr(build, "available_memory_bytes", lambda: int(0.8 * needed.total_bytes))
    with pytest.raises(MemoryError) as info:
        MultiAgentReplayBuffer(specs, 2_000_000, next_obs="none")
    message = str(info.value)
    assert "next_obs='none'" in message
    assert "no next_obs, float16 obs (next_obs='none' + AgentSpec(obs_dtype=np.float16))" in message
    assert "next_obs='once'" not in message and "next_obs='stored'" not in message


def test_sampler_subclasses_see_the_same_draws() -> None:
    """A custom sampler is unaware of the format: it draws, the store gathers."""

    class EveryOther(Sampler):
        def config(self) -> dict[str, Any]:
            return {}

        def sample(self, batch_size, size, rng, trainer=0):  # type: ignore[no-untyped-def]
            return (np.arange(batch_size, dtype=np.int64) * 2) % size, None

    specs = make_specs()
    ref = MultiAgentReplayBuffer(specs, 64, sampler=EveryOther(), next_obs="stored", **_more())
    buf = MultiAgentReplayBuffer(specs, 64, sampler=EveryOther(), next_obs="none", **_more())
    write_both(ref, buf, rounds=1)
    assert_equal_minus_next_obs(ref.sample(10), buf.sample(10))
