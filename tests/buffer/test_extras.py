"""Per-agent extra fields, global fields and alive masks, against a naive per-field reference.

Random steps (agents that die and respawn, resets, several streams, ``add``/``extend``/
``add_envs``, wraparound) are written to buffers of both layouts, both next_obs modes and both
batch layouts, and to :class:`NaiveFields`, which keeps every slot as a dict of per-field
arrays with the documented semantics (an agent missing from ``obs`` is stored absent: its
fields zero-filled where not given, alive False). Every gathered and sampled batch is compared
bit for bit; so are state round trips, the fast and the complete staging path, and rejected
writes (which must change nothing).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marlbuf import FIELDS, AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.memory import estimate
from marlbuf.samplers import Neighbor, Prioritized, Uniform
from marlbuf.spec import ALIVE, interleaved_row_layout

EXTRAS_A = {
    "hidden": FieldSpec((3,)),
    "avail": FieldSpec((4,), np.bool_),
    "count": FieldSpec((), np.int16),
}
EXTRAS_B = {
    "hidden": FieldSpec((2, 2), np.float16),  # 2-D and half: the per-agent copy, widened
    "avail": FieldSpec((3,), np.bool_),
    "count": FieldSpec((), np.int16),
}
SPECS = {
    "a": AgentSpec(obs_shape=(3,), action_shape=(2,), extras=EXTRAS_A),
    "b": AgentSpec(obs_shape=(2,), action_shape=(3,), obs_dtype=np.float16, extras=EXTRAS_B),
    "c": AgentSpec(obs_shape=(1,), action_shape=(4,), n_discrete_actions=4, extras=EXTRAS_A),
}
GLOBALS = {"state": FieldSpec((5,)), "step": FieldSpec((), np.int32)}
#: same-dtype 1-D extras and obs: the fast staging path takes every call
PACKED_SPECS = {
    f"agent_{i}": AgentSpec(
        obs_shape=(4,),
        action_shape=(2,),
        extras={"hidden": FieldSpec((3,)), "avail": FieldSpec((2,), np.bool_)},
    )
    for i in range(3)
}
#: packed transition fields, extras of every kind the fast path handles (2-D: one copy per
#: agent; integer and bool scalars; half precision)
LOOSE_SPECS = {
    f"agent_{i}": AgentSpec(
        obs_shape=(4,),
        action_shape=(2,),
        extras={
            "hidden": FieldSpec((2, 2)),
            "count": FieldSpec((), np.int16),
            "legal": FieldSpec((3,), np.bool_),
            "half": FieldSpec((2,), np.float16),
        },
    )
    for i in range(3)
}
CONFIGS = [
    (layout, next_obs, batch_layout)
    for layout in ("interleaved", "agent_major")
    for next_obs in ("once", "stored")
    for batch_layout in ("rows", "per_agent")
    if not (layout == "agent_major" and batch_layout == "rows")
]


# ------------------------------------------------------------------------------ reference
def item_shape(spec: AgentSpec, field: str) -> tuple[int, ...]:
    return spec.shape(field)


class NaiveFields:
    """Every slot as ``{field: {agent: array}}``, ``{"globals": {name: array}}`` and
    ``{"alive": {agent: bool}}``: the documented semantics, one step at a time."""

    def __init__(self, specs, capacity, global_fields, alive):
        self.specs, self.capacity = specs, capacity
        self.global_fields, self.alive = global_fields, alive
        self.slots: list[dict | None] = [None] * capacity
        self.cursor = 0
        self.size = 0

    def add(self, step: dict) -> None:
        obs = step["obs"]
        explicit = step.get("alive") or {}
        row: dict = {"alive": {}, "globals": {}}
        names = [*FIELDS, *next(iter(self.specs.values())).extras]
        for f in names:
            row[f] = {}
        for agent, spec in self.specs.items():
            alive = bool(explicit[agent]) if agent in explicit else agent in obs
            row["alive"][agent] = alive
            for f in names:
                value = step.get(f, {}).get(agent)
                dtype = spec.dtype(f)
                if value is None:
                    row[f][agent] = np.zeros(spec.shape(f), dtype)
                elif f == "action" and spec.n_discrete_actions and np.ndim(value) == 0:
                    row[f][agent] = np.eye(spec.n_discrete_actions, dtype=dtype)[int(value)]
                else:
                    row[f][agent] = np.asarray(value).astype(dtype)
        for name, fs in self.global_fields.items():
            row["globals"][name] = np.asarray(step[name]).astype(fs.dtype)
        self.slots[self.cursor] = row
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)


def widen(x: np.ndarray, batch_dtype: str) -> np.ndarray:
    return x.astype(np.float32) if batch_dtype == "float32" and x.dtype == np.float16 else x


def bits(x) -> bytes:
    x = np.ascontiguousarray(x)
    return x.dtype.str.encode() + str(x.shape).encode() + x.tobytes()


def check_batch(batch, naive: NaiveFields, indices, batch_dtype="float32") -> None:
    """Every field of ``batch`` equals the reference at ``indices``, bit for bit."""
    indices = np.asarray(indices)
    ref = [naive.slots[int(i)] for i in indices]
    extra_names = list(next(iter(naive.specs.values())).extras)
    for f in [*FIELDS, *extra_names]:
        got = batch.field(f)
        if f in extra_names:
            assert got is batch.extras[f]
        for agent in naive.specs:
            want = np.stack([widen(r[f][agent], batch_dtype) for r in ref])
            assert bits(got[agent]) == bits(want), (f, agent)
    assert set(batch.globals) == set(naive.global_fields)
    for name in naive.global_fields:
        want = np.stack([widen(r["globals"][name], batch_dtype) for r in ref])
        assert bits(batch.globals[name]) == bits(want), name
        assert batch.globals[name] is getattr(batch, name)
    if naive.alive:
        for agent in naive.specs:
            want = np.array([r["alive"][agent] for r in ref], dtype=np.bool_)
            assert bits(batch.alive[agent]) == bits(want), agent
    else:
        assert batch.alive is None


# ------------------------------------------------------------------------------ the env
class DyingEnv:
    """A parallel env where agents die (their last step has done=1 and a final next_obs) and
    respawn at random later with a fresh observation; occasionally the episode resets. What a
    PettingZoo loop passes to ``add``: dicts of the agents in this step's ``obs`` only."""

    def __init__(self, specs, global_fields, rng, p_die=0.25, p_respawn=0.3, levels=3):
        self.specs, self.global_fields, self.rng = specs, global_fields, rng
        self.p_die, self.p_respawn, self.levels = p_die, p_respawn, levels
        self.obs: dict[str, np.ndarray] = {}
        self.reset()

    def _fresh(self, agent):
        # few distinct values: equal observations across boundaries happen by chance
        spec = self.specs[agent]
        return self.rng.integers(0, self.levels, spec.obs_shape).astype(spec.obs_dtype)

    def reset(self):
        self.obs = {a: self._fresh(a) for a in self.specs if self.rng.random() < 0.8}

    def _value(self, spec_shape, dtype):
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            return self.rng.random(spec_shape) < 0.5
        if dtype.kind in "iu":
            return self.rng.integers(-100, 100, spec_shape).astype(dtype)
        return self.rng.standard_normal(spec_shape).astype(dtype)

    def _action(self, spec):
        """A vector action: normal values, or probabilities for a discrete agent."""
        if spec.n_discrete_actions:
            p = self.rng.random(spec.action_shape) + 0.05
            return (p / p.sum()).astype(spec.action_dtype)
        return self._value(spec.action_shape, spec.action_dtype)

    def step(self) -> dict:
        """One step's arguments for ``add`` (dicts of the agents alive at its start)."""
        step: dict = {f: {} for f in FIELDS}
        names = list(next(iter(self.specs.values())).extras)
        for f in names:
            step[f] = {}
        survivors = {}
        for agent, obs in self.obs.items():
            spec = self.specs[agent]
            step["obs"][agent] = obs
            if spec.n_discrete_actions and self.rng.random() < 0.5:
                step["action"][agent] = int(self.rng.integers(spec.n_discrete_actions))
            else:
                step["action"][agent] = self._action(spec)
            step["reward"][agent] = float(self.rng.standard_normal())
            nxt = self._fresh(agent)
            step["next_obs"][agent] = nxt
            dies = self.rng.random() < self.p_die
            step["done"][agent] = float(dies)
            for f in names:
                fs = spec.extras[f]
                step[f][agent] = self._value(fs.shape, fs.dtype)
            if not dies:
                survivors[agent] = nxt
        for name, fs in self.global_fields.items():
            step[name] = self._value(fs.shape, fs.dtype)
        for agent in self.specs:
            if (
                agent not in self.obs
                and agent not in survivors
                and self.rng.random() < (self.p_respawn)
            ):
                survivors[agent] = self._fresh(agent)
        self.obs = survivors
        if not self.obs or self.rng.random() < 0.05:
            self.reset()
        return step


def stack_steps(steps: list[dict], specs, global_fields) -> dict:
    """``extend``/``add_envs`` arguments from steps whose agents are all present."""
    out: dict = {}
    for f, per in steps[0].items():
        if f in global_fields:
            out[f] = np.stack([np.asarray(s[f]) for s in steps])
            continue
        out[f] = {}
        for a in per:
            items = [s[f][a] for s in steps]
            n = specs[a].n_discrete_actions
            if f == "action" and n and not all(isinstance(x, int) for x in items):
                # indices and one-hot rows mixed: all one-hot
                items = [np.eye(n, dtype=np.float32)[x] if isinstance(x, int) else x for x in items]
            out[f][a] = np.stack([np.asarray(x) for x in items])
    return out


def write(buf: MultiAgentReplayBuffer, naive: NaiveFields, env_steps, rng, streams=1) -> None:
    """Write ``env_steps`` (a list per stream) through random ``add``/``extend``/``add_envs``
    calls; the reference sees them in the same order."""
    position = [0] * streams
    while any(p < len(env_steps[k]) for k, p in enumerate(position)):
        k = int(rng.integers(streams))
        if position[k] >= len(env_steps[k]):
            continue
        how = rng.random()
        if how < 0.2 and streams > 1 and all(p < len(env_steps[j]) for j, p in enumerate(position)):
            batch = [env_steps[j][position[j]] for j in range(streams)]
            agents = set(batch[0]["obs"])
            if all(set(s["obs"]) == agents for s in batch) and agents:
                buf.add_envs(**stack_steps(batch, buf.specs, buf.global_fields), first_stream=0)
                for j, s in enumerate(batch):
                    naive.add(s)
                    position[j] += 1
                continue
        if how < 0.45:
            run = []
            while position[k] < len(env_steps[k]) and len(run) < 4:
                s = env_steps[k][position[k]]
                if run and set(s["obs"]) != set(run[0]["obs"]):
                    break
                run.append(s)
                position[k] += 1
            if run[0]["obs"]:
                buf.extend(**stack_steps(run, buf.specs, buf.global_fields), stream=k)
                for s in run:
                    naive.add(s)
                continue
            position[k] -= len(run)
        s = env_steps[k][position[k]]
        buf.add(**s, stream=k)
        naive.add(s)
        position[k] += 1


def run_episode_data(specs, global_fields, seed, n_steps, streams=1, **env_options):
    rng = np.random.default_rng(seed)
    envs = [DyingEnv(specs, global_fields, rng, **env_options) for _ in range(streams)]
    return [[env.step() for _ in range(n_steps)] for env in envs], rng


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize(("layout", "next_obs", "batch_layout"), CONFIGS)
@pytest.mark.parametrize("batch_dtype", ["float32", "storage"])
def test_dying_agents_match_naive_reference(layout, next_obs, batch_layout, batch_dtype):
    capacity = 23
    data, rng = run_episode_data(SPECS, GLOBALS, 1, 40, streams=2)
    buf = MultiAgentReplayBuffer(
        SPECS,
        capacity,
        layout=layout,
        next_obs=next_obs,
        batch_layout=batch_layout,
        batch_dtype=batch_dtype,
        global_fields=GLOBALS,
        alive=True,
        seed=0,
    )
    naive = NaiveFields(SPECS, capacity, GLOBALS, True)
    write(buf, naive, data, rng, streams=2)
    assert len(buf) == naive.size == capacity
    every = np.arange(len(buf))
    check_batch(buf.gather(every), naive, every, batch_dtype)
    batch = buf.sample(17)
    check_batch(batch, naive, batch.indices, batch_dtype)
    for batch in buf.sample_for_trainers(9):
        check_batch(batch, naive, batch.indices, batch_dtype)
    newest = buf.latest(5)
    check_batch(newest, naive, newest.indices, batch_dtype)


@pytest.mark.parametrize(("layout", "next_obs", "batch_layout"), CONFIGS)
def test_packed_extras_without_alive_match_reference(layout, next_obs, batch_layout):
    rng = np.random.default_rng(2)
    globals_ = {"state": FieldSpec((6,))}
    buf = MultiAgentReplayBuffer(
        PACKED_SPECS,
        16,
        layout=layout,
        next_obs=next_obs,
        batch_layout=batch_layout,
        global_fields=globals_,
        seed=0,
    )
    naive = NaiveFields(PACKED_SPECS, 16, globals_, False)
    env = DyingEnv(PACKED_SPECS, globals_, rng, p_die=0.0, p_respawn=1.0)
    env.obs = {a: env._fresh(a) for a in PACKED_SPECS}
    steps = []
    for _ in range(30):
        step = env.step()
        if set(step["obs"]) != set(PACKED_SPECS):
            env.obs = {a: env._fresh(a) for a in PACKED_SPECS}
            continue
        steps.append(step)
    write(buf, naive, [steps], rng)
    every = np.arange(len(buf))
    check_batch(buf.gather(every), naive, every)
    assert buf.gather(every).alive is None


@pytest.mark.parametrize("sampler", [Neighbor(run_length=3), Prioritized()], ids=repr)
def test_every_sampler_returns_the_extras_of_its_indices(sampler):
    data, rng = run_episode_data(SPECS, GLOBALS, 3, 30)
    buf = MultiAgentReplayBuffer(
        SPECS, 20, sampler=sampler, global_fields=GLOBALS, alive=True, seed=1
    )
    naive = NaiveFields(SPECS, 20, GLOBALS, True)
    write(buf, naive, data, rng)
    for batch in buf.sample_for_trainers(12):
        check_batch(batch, naive, batch.indices)


@pytest.mark.parametrize("specs", [PACKED_SPECS, LOOSE_SPECS], ids=["packed", "loose"])
def test_fast_and_complete_staging_agree_bit_for_bit(specs):
    rng = np.random.default_rng(4)
    globals_ = {"state": FieldSpec((2,)), "step": FieldSpec((), np.int32)}
    buf = MultiAgentReplayBuffer(specs, 8, global_fields=globals_, alive=True)
    codec = buf._codec
    env = DyingEnv(specs, globals_, rng, p_die=0.0)
    env.obs = {a: env._fresh(a) for a in specs}
    for explicit in (None, {a: bool(rng.random() < 0.5) for a in specs}):
        step = env.step()
        env.obs = {a: env._fresh(a) for a in specs}
        step["step"] = np.asarray(step["step"])
        kwargs = {k: v for k, v in step.items() if k not in FIELDS}
        if explicit is not None:
            kwargs["alive"] = explicit
        values = codec.arrange(tuple(step[f] for f in FIELDS), kwargs, "add")
        fast = codec.stage_fast(values, None)
        assert fast is not None, "the fast path should take a complete packed call"
        fast = fast.copy()
        slow, _ = codec.stage(dict(zip(codec.field_names, values)), None)
        assert fast.tobytes() == slow.tobytes()
        # several steps at once
        run = [env.step() for _ in range(3)]
        stacked = stack_steps(run, specs, globals_)
        kwargs = {k: v for k, v in stacked.items() if k not in FIELDS}
        values = codec.arrange(tuple(stacked[f] for f in FIELDS), kwargs, "extend")
        fast = codec.stage_fast(values, 3)
        assert fast is not None
        slow, _ = codec.stage(dict(zip(codec.field_names, values)), 3)
        assert fast.tobytes() == slow.tobytes()


def test_rows_without_extras_keep_their_layout():
    plain = {a: AgentSpec(s.obs_shape, s.action_shape) for a, s in PACKED_SPECS.items()}
    base, base_bytes = interleaved_row_layout(plain, 64, FIELDS)
    assert interleaved_row_layout(plain, 64) == (base, base_bytes)
    slots, _ = interleaved_row_layout(
        PACKED_SPECS, 64, global_fields={"state": FieldSpec((5,))}, alive=True
    )
    # the five fields keep their offsets; extras, globals and alive follow done
    assert slots[: len(base)] == base
    done_end = base[-1].offset + base[-1].nbytes
    assert all(s.offset >= done_end for s in slots[len(base) :])
    assert [s.field for s in slots[len(base) :]][-3:] == [ALIVE] * 3


# ------------------------------------------------------------------------------ absent agents
def test_agent_missing_from_dicts_is_stored_absent():
    buf = MultiAgentReplayBuffer(SPECS, 4, global_fields=GLOBALS, alive=True)
    rng = np.random.default_rng(5)
    env = DyingEnv(SPECS, GLOBALS, rng, p_die=0.0)
    env.obs = {"a": env._fresh("a")}  # only a
    step = env.step()
    buf.add(**step)
    batch = buf.gather([0])
    assert batch.alive["a"][0] and not batch.alive["b"][0] and not batch.alive["c"][0]
    for f in [*FIELDS, "hidden", "avail", "count"]:
        for agent in ("b", "c"):
            assert not np.any(batch.field(f)[agent]), (f, agent)


def test_explicit_alive_keeps_what_was_given():
    buf = MultiAgentReplayBuffer(PACKED_SPECS, 4, alive=True)
    agents = list(PACKED_SPECS)
    full = lambda *shape: {a: np.full(shape, 2.0, np.float32) for a in agents}  # noqa: E731
    buf.add(
        full(4),
        full(2),
        {a: 1.0 for a in agents},
        full(4),
        {a: 0.0 for a in agents},
        hidden=full(3),
        avail={a: np.ones(2, bool) for a in agents},
        alive={"agent_1": False},
    )
    # agent_2 left out of obs and given alive=False: only what was given is stored
    buf.add(
        {a: np.ones(4, np.float32) for a in agents[:2]},
        full(2),
        {a: 1.0 for a in agents},
        full(4),
        {a: 0.0 for a in agents},
        hidden={a: np.ones(3, np.float32) for a in agents[:2]},
        avail={a: np.ones(2, bool) for a in agents[:2]},
        alive={"agent_2": False},
    )
    batch = buf.gather([0, 1])
    assert batch.alive["agent_1"].tolist() == [False, True]
    assert batch.alive["agent_0"].tolist() == [True, True]
    assert batch.alive["agent_2"].tolist() == [True, False]
    assert batch.obs["agent_1"][0].tolist() == [2.0] * 4  # stored although not alive
    assert batch.obs["agent_2"][1].tolist() == [0.0] * 4  # not given: zeros
    assert batch.action["agent_2"][1].tolist() == [2.0] * 2  # given: kept
    assert batch.hidden["agent_2"][1].tolist() == [0.0] * 3


def test_extend_with_an_absent_agent_and_per_step_alive():
    buf = MultiAgentReplayBuffer(PACKED_SPECS, 8, alive=True)
    agents = list(PACKED_SPECS)
    T = 3
    present = agents[:2]
    z = lambda *shape: {a: np.ones((T, *shape), np.float32) for a in present}  # noqa: E731
    buf.extend(
        z(4),
        z(2),
        z(),
        z(4),
        z(),
        hidden=z(3),
        avail={a: np.ones((T, 2), bool) for a in present},
        alive={"agent_1": np.array([True, False, True])},
    )
    alive = buf.stored("alive")
    assert alive["agent_0"].tolist() == [True] * 3
    assert alive["agent_1"].tolist() == [True, False, True]
    assert alive["agent_2"].tolist() == [False] * 3
    assert not buf.stored("hidden")["agent_2"].any()


@pytest.mark.filterwarnings("ignore::marlbuf.NextObsWarning")  # adversarial: mostly side rows
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    seed=st.integers(0, 2**31 - 1),
    capacity=st.integers(3, 30),
    p_die=st.sampled_from([0.0, 0.2, 0.5]),
    p_respawn=st.sampled_from([0.1, 0.5, 1.0]),
    levels=st.sampled_from([1, 2, 4]),
    streams=st.integers(1, 3),
    layout=st.sampled_from(["interleaved", "agent_major"]),
)
def test_obs_once_stays_exact_with_absent_agents(
    seed, capacity, p_die, p_respawn, levels, streams, layout
):
    """The stored-once format compares a step's next_obs with its successor's obs over every
    agent's bytes, absent agents' zeros included: next_obs must come out exactly as given."""
    data, rng = run_episode_data(
        SPECS, GLOBALS, seed, 25, streams, p_die=p_die, p_respawn=p_respawn, levels=levels
    )
    once = MultiAgentReplayBuffer(
        SPECS, capacity, layout=layout, global_fields=GLOBALS, alive=True, seed=0, next_obs="once"
    )
    naive = NaiveFields(SPECS, capacity, GLOBALS, True)
    write(once, naive, data, rng, streams)
    every = np.arange(len(once))
    check_batch(once.gather(every), naive, every)
    links = once.links
    assert links is not None
    # the format did link something when observations repeat (not vacuous)
    if levels == 1 and p_die == 0.0 and streams == 1 and len(once) > 3:
        assert (links.next_slot[: len(once)] >= 0).any()


# ------------------------------------------------------------------------------ state
@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("next_obs", ["once", "stored"])
def test_state_save_load_round_trip(tmp_path, layout, next_obs):
    data, rng = run_episode_data(SPECS, GLOBALS, 6, 30)
    buf = MultiAgentReplayBuffer(
        SPECS, 20, layout=layout, next_obs=next_obs, global_fields=GLOBALS, alive=True, seed=3
    )
    naive = NaiveFields(SPECS, 20, GLOBALS, True)
    write(buf, naive, data, rng)
    every = np.arange(len(buf))
    path = tmp_path / "buf.npz"
    buf.save(path)
    loaded = MultiAgentReplayBuffer.load(path)
    assert loaded.global_fields == GLOBALS and loaded.alive
    assert loaded.specs == SPECS
    check_batch(loaded.gather(every), naive, every)
    assert bits(loaded.sample(8).indices) == bits(buf.sample(8).indices)
    other = MultiAgentReplayBuffer(
        SPECS, 20, layout=layout, next_obs=next_obs, global_fields=GLOBALS, alive=True
    )
    other.load_state_dict(buf.state_dict())
    check_batch(other.gather(every), naive, every)
    # a buffer of other row options refuses the state and stays as it was
    plain = MultiAgentReplayBuffer(SPECS, 20, layout=layout, next_obs=next_obs, alive=True)
    with pytest.raises(ValueError, match="global_fields"):
        plain.load_state_dict(buf.state_dict())
    assert len(plain) == 0


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "killed"])
@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_mapped_buffer_reopens_with_extras(tmp_path, layout, closed):
    data, rng = run_episode_data(SPECS, GLOBALS, 7, 20)
    folder = tmp_path / "mapped"
    naive = NaiveFields(SPECS, 16, GLOBALS, True)
    buf = MultiAgentReplayBuffer(
        SPECS, 16, path=folder, global_fields=GLOBALS, alive=True, layout=layout
    )
    write(buf, naive, data, rng)
    if closed:
        buf.close()
    else:
        buf._mapped.release()  # as if the process had died: the log is replayed
    reopened = MultiAgentReplayBuffer.open(folder)
    try:
        assert reopened.global_fields == GLOBALS and reopened.alive
        every = np.arange(len(reopened))
        check_batch(reopened.gather(every), naive, every)
    finally:
        reopened.close()


def test_version_2_states_still_load():
    plain = {a: AgentSpec(s.obs_shape, s.action_shape) for a, s in PACKED_SPECS.items()}
    buf = MultiAgentReplayBuffer(plain, 8, seed=0)
    agents = list(plain)
    for t in range(5):
        o = {a: np.full(4, t, np.float32) for a in agents}
        buf.add(o, {a: np.zeros(2) for a in agents}, [1.0] * 3, o, [0.0] * 3)
    state = buf.state_dict()
    state["version"] = 2
    del state["global_fields"], state["alive"]
    other = MultiAgentReplayBuffer(plain, 8)
    other.load_state_dict(state)
    assert bits(other.stored("obs")["agent_0"]) == bits(buf.stored("obs")["agent_0"])


def test_stored_reads_extras_globals_and_alive():
    data, rng = run_episode_data(SPECS, GLOBALS, 8, 10)
    buf = MultiAgentReplayBuffer(SPECS, 16, global_fields=GLOBALS, alive=True)
    naive = NaiveFields(SPECS, 16, GLOBALS, True)
    write(buf, naive, data, rng)
    n = len(buf)
    state = buf.stored("state")
    assert state.shape == (n, 5)
    assert bits(state) == bits(np.stack([naive.slots[i]["globals"]["state"] for i in range(n)]))
    hidden = buf.stored("hidden")["b"]
    assert hidden.dtype == np.float16 and hidden.shape == (n, 2, 2)
    alive = buf.stored("alive")
    assert alive["a"].tolist() == [naive.slots[i]["alive"]["a"] for i in range(n)]
    with pytest.raises(ValueError, match="field must be one of"):
        buf.stored("nope")


# ------------------------------------------------------------------------------ batches
def test_batch_conveniences_and_torch():
    torch = pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(
        PACKED_SPECS, 8, global_fields={"state": FieldSpec((2,))}, alive=True
    )
    agents = list(PACKED_SPECS)
    ones = lambda *shape: {a: np.ones(shape, np.float32) for a in agents}  # noqa: E731
    for _ in range(4):
        buf.add(
            ones(4),
            ones(2),
            ones(),
            ones(4),
            ones(),
            hidden=ones(3),
            avail={a: np.ones(2, bool) for a in agents},
            state=np.ones(2, np.float32),
        )
    batch = buf.sample(3)
    assert batch.hidden is batch.extras["hidden"]
    assert batch.state is batch.globals["state"]
    assert batch.field("alive") is batch.alive
    assert batch.concat("obs", "hidden").shape == (3, 3 * 4 + 3 * 3)
    assert len(batch.as_lists()) == 5
    with pytest.raises(AttributeError, match="extra fields"):
        _ = batch.nope
    with pytest.raises(ValueError, match=r"batch\.globals"):
        batch.field("state")
    tb = batch.to_torch()
    assert isinstance(tb.hidden["agent_0"], torch.Tensor)
    assert tb.state.shape == (3, 2)
    assert tb.alive["agent_1"].dtype == torch.bool
    assert torch.equal(tb.extras["avail"]["agent_2"], torch.ones(3, 2, dtype=torch.bool))


def test_torch_store_gathers_extras_globals_and_alive():
    torch = pytest.importorskip("torch")
    plain = {a: AgentSpec(s.obs_shape, s.action_shape) for a, s in PACKED_SPECS.items()}
    for specs, kw in (
        (PACKED_SPECS, {}),
        (plain, {"alive": True, "global_fields": {"s": FieldSpec(2)}}),
    ):
        buf = MultiAgentReplayBuffer(specs, 8, next_obs="stored", device="cpu", **kw)
        assert buf.device == torch.device("cpu")
        assert buf.stored("obs").keys() == specs.keys()


def test_memory_estimate_counts_extras():
    for layout in ("interleaved", "agent_major"):
        for next_obs in ("once", "stored"):
            buf = MultiAgentReplayBuffer(
                SPECS, 10, layout=layout, next_obs=next_obs, global_fields=GLOBALS, alive=True
            )
            est = estimate(SPECS, 10, layout, next_obs, global_fields=GLOBALS, alive=True)
            table = sum(a.nbytes for a in buf.storage.arrays().values())
            assert est.storage_bytes == table
            stripped = {a: AgentSpec(s.obs_shape, s.action_shape) for a, s in SPECS.items()}
            plain = estimate(stripped, 10, layout, next_obs)
            big = estimate(stripped, 10, layout, next_obs, global_fields={"s": FieldSpec(100)})
            assert big.table_row_bytes >= plain.table_row_bytes + 300


# ------------------------------------------------------------------------------ bad input
def good_step(specs=PACKED_SPECS):
    agents = list(specs)
    ones = lambda *shape: {a: np.ones(shape, np.float32) for a in agents}  # noqa: E731
    return dict(
        obs=ones(4),
        action=ones(2),
        reward=ones(),
        next_obs=ones(4),
        done=ones(),
        hidden=ones(3),
        avail={a: np.ones(2, bool) for a in agents},
    )


def snapshot(buf):
    state = buf.state_dict()
    return (
        len(buf),
        buf.total_writes,
        {k: bits(v) for k, v in state["storage"].items()},
        {k: bits(v) for k, v in state["links"].items()},
    )


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(hiden={}), TypeError, r"hiden.*'hidden', 'avail'.*'state'"),
        (dict(alive={"agent_0": True}, _no_alive=True), TypeError, "alive=True"),
        (dict(_drop="hidden"), ValueError, "hidden= is missing"),
        (dict(_drop="state"), ValueError, "state= is missing"),
        (dict(hidden={"agent_0": np.ones(3)}), ValueError, r"hidden has no entry.*agent_1"),
        (dict(state=np.ones(3)), ValueError, r"state must have shape \(2,\)"),
        (dict(avail={a: np.ones(2) for a in PACKED_SPECS}), TypeError, r"avail\['agent_0'\]"),
        (dict(hidden={a: np.full(3, np.nan) for a in PACKED_SPECS}), ValueError, "NaN"),
        (dict(state=np.array([1e39, 0.0])), ValueError, "outside the range"),
        (dict(_obs_missing="agent_1"), ValueError, "alive=True"),
        (dict(alive={"agent_1": True}, _obs_missing="agent_1"), ValueError, "obs has no entry"),
        (dict(alive={"agent_0": 2}), TypeError, "must be a bool"),
        (
            dict(hidden={**{a: np.ones(3) for a in PACKED_SPECS}, "z": np.ones(3)}),
            ValueError,
            "unknown agents",
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(layout, change, error, match):
    change = dict(change)
    no_alive = change.pop("_no_alive", False)
    missing = change.pop("_obs_missing", None)
    alive = not no_alive and (missing is None or "alive" in change)
    buf = MultiAgentReplayBuffer(
        PACKED_SPECS,
        4,
        layout=layout,
        global_fields={"state": FieldSpec((2,))},
        alive=alive,
    )
    for _ in range(5):  # full and wrapped: a bad write must not overwrite the oldest slot
        buf.add(**good_step(), state=np.zeros(2, np.float32))
    before = snapshot(buf)
    step = {**good_step(), "state": np.zeros(2, np.float32)}
    drop = change.pop("_drop", None)
    if drop is not None:
        del step[drop]
    if missing is not None:
        del step["obs"][missing]
    step.update(change)
    with pytest.raises(error, match=match):
        buf.add(**step)
    stacked = {
        k: (
            np.stack([v, v])
            if isinstance(v, np.ndarray)
            else {a: np.stack([x, x]) for a, x in v.items()}
        )
        for k, v in step.items()
    }
    with pytest.raises((TypeError, ValueError)):
        buf.extend(**stacked)
    assert snapshot(buf) == before


def test_integer_extras_refuse_values_out_of_range():
    specs = {"a": AgentSpec((2,), (2,), extras={"n": FieldSpec((2,), np.int8)})}
    buf = MultiAgentReplayBuffer(specs, 4)
    z = {"a": np.zeros(2, np.float32)}
    buf.add(z, z, {"a": 0.0}, z, {"a": 0.0}, n={"a": np.array([127, -128])})  # int64: in range
    assert buf.stored("n")["a"][0].tolist() == [127, -128]
    with pytest.raises(ValueError, match=r"n\['a'\] holds 300, outside the range"):
        buf.add(z, z, {"a": 0.0}, z, {"a": 0.0}, n={"a": np.array([300, 0])})
    with pytest.raises(TypeError, match="does not cast safely"):
        buf.add(z, z, {"a": 0.0}, z, {"a": 0.0}, n={"a": np.array([1.5, 0.0])})
    assert len(buf) == 1


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: AgentSpec((2,), (2,), extras={"obs": FieldSpec(2)}), "reserved"),
        (lambda: AgentSpec((2,), (2,), extras={"2x": FieldSpec(2)}), "identifiers"),
        (lambda: AgentSpec((2,), (2,), extras={"h": (2,)}), "must be a FieldSpec"),
        (lambda: FieldSpec((0,)), "positive ints"),
        (lambda: FieldSpec((2,), object), "dtype"),
        (
            lambda: MultiAgentReplayBuffer(
                {
                    "a": AgentSpec((2,), (2,), extras={"h": FieldSpec(2)}),
                    "b": AgentSpec((2,), (2,)),
                },
                4,
            ),
            "same extra fields",
        ),
        (
            lambda: MultiAgentReplayBuffer(
                {"a": AgentSpec((2,), (2,), extras={"h": FieldSpec(2)})},
                4,
                global_fields={"h": FieldSpec(2)},
            ),
            "also extra fields",
        ),
        (
            lambda: MultiAgentReplayBuffer(
                {"a": AgentSpec((2,), (2,))}, 4, global_fields={"alive": FieldSpec(2)}
            ),
            "reserved",
        ),
        (lambda: MultiAgentReplayBuffer({"a": AgentSpec((2,), (2,))}, 4, alive=1), "bool"),
    ],
)
def test_bad_declarations_are_refused(build, match):
    with pytest.raises((TypeError, ValueError), match=match):
        build()


def test_spec_dicts_round_trip():
    for spec in SPECS.values():
        assert AgentSpec.from_dict(spec.to_dict()) == spec
    plain = AgentSpec((2,), (3,))
    assert "extras" not in plain.to_dict()  # the dict of earlier versions
    assert FieldSpec.from_dict(FieldSpec((2, 3), np.int8).to_dict()) == FieldSpec((2, 3), np.int8)
    assert FieldSpec(()).shape == ()


def test_uniform_sampler_with_absent_agents_full_round():
    """``sample_for_trainers`` (the MADDPG round) over a buffer of agents that come and go."""
    data, rng = run_episode_data(SPECS, {}, 9, 50)
    buf = MultiAgentReplayBuffer(SPECS, 32, sampler=Uniform(replace=False), alive=True, seed=0)
    naive = NaiveFields(SPECS, 32, {}, True)
    write(buf, naive, data, rng)
    for batch in buf.sample_for_trainers(10):
        check_batch(batch, naive, batch.indices)
        assert batch.globals == {}


def test_pettingzoo_adapter_stores_departed_agents_absent():
    from marlbuf.compat.pettingzoo import add_parallel_step

    buf = MultiAgentReplayBuffer(
        PACKED_SPECS, 4, global_fields={"state": FieldSpec((2,))}, alive=True
    )
    agents = list(PACKED_SPECS)
    keep = agents[:2]  # agent_2 left the episode: gone from every dict of the step
    ones = lambda *shape: {a: np.ones(shape, np.float32) for a in keep}  # noqa: E731
    gone = add_parallel_step(
        buf,
        ones(4),
        ones(2),
        {a: 1.0 for a in keep},
        ones(4),
        {a: False for a in keep},
        terminal="terminated",
        hidden=ones(3),
        avail={a: np.ones(2, bool) for a in agents},  # an entry for the absent agent: dropped
        state=np.ones(2, np.float32),
    )
    assert gone == ["agent_2"]
    batch = buf.gather([0])
    assert [bool(batch.alive[a][0]) for a in agents] == [True, True, False]
    assert not batch.obs["agent_2"].any() and not batch.avail["agent_2"].any()
    assert batch.hidden["agent_0"][0].tolist() == [1.0] * 3
    assert batch.state[0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
def test_sequences_carry_extras_globals_and_alive(batch_layout):
    from marlbuf.samplers import Sequence

    data, rng = run_episode_data(SPECS, GLOBALS, 10, 40)
    buf = MultiAgentReplayBuffer(
        SPECS,
        32,
        sampler=Sequence(length=3, burn_in=2),
        batch_layout=batch_layout,
        global_fields=GLOBALS,
        alive=True,
        seed=0,
    )
    naive = NaiveFields(SPECS, 32, GLOBALS, True)
    write(buf, naive, data, rng)
    batch = buf.sample(6)
    n, steps = batch.mask.shape
    flat = batch.slots.reshape(-1)
    valid = flat >= 0
    for name in ("hidden", "avail", "count"):
        for agent in SPECS:
            got = batch.extras[name][agent].reshape(n * steps, *SPECS[agent].shape(name))
            want = np.stack(
                [widen(naive.slots[int(s)][name][agent], "float32") for s in flat[valid]]
            )
            assert bits(got[valid]) == bits(want)
            assert not got[~valid].any()
    state = batch.globals["state"].reshape(n * steps, 5)
    assert bits(state[valid]) == bits(
        np.stack([naive.slots[int(s)]["globals"]["state"] for s in flat[valid]])
    )
    alive = batch.alive["a"].reshape(-1)
    assert alive[valid].tolist() == [naive.slots[int(s)]["alive"]["a"] for s in flat[valid]]
    assert not alive[~valid].any()


def test_an_episode_ends_when_every_alive_agent_is_done():
    from marlbuf.samplers import Sequence

    buf = MultiAgentReplayBuffer(PACKED_SPECS, 16, sampler=Sequence(length=2), alive=True)
    agents = list(PACKED_SPECS)

    def step(present, done):
        ones = lambda *shape: {a: np.ones(shape, np.float32) for a in present}  # noqa: E731
        buf.add(
            ones(4),
            ones(2),
            ones(),
            ones(4),
            {a: float(a in done) for a in present},
            hidden=ones(3),
            avail={a: np.ones(2, bool) for a in present},
        )

    step(agents, {"agent_0"})  # agent_0 dies: the others go on
    step(agents[1:], set())
    step(agents[1:], set(agents[1:]))  # every alive agent done (agent_0 absent): ends here
    step(agents, set())
    assert buf.episodes is not None
    np.testing.assert_array_equal(buf.episodes.episode[:4], [0, 0, 0, 1])
