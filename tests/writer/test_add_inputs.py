"""What environments return, on ``add``'s one-kernel path.

Every container (any ``Mapping``, lists, tuples, arrays stacked over the agents) and every scalar
kind (Python and NumPy numbers and bools, 0-d arrays) that environments hand out is written by
one call of the store kernel, with the same bytes as the complete checks store; a one-step
``extend``/``add_envs`` takes the same path; real mpe2 ``env.step`` output (its rewards are a
``defaultdict``) and :func:`marlbuf.compat.pettingzoo.add_parallel_step` too. A valid step the
kernels cannot take warns once, naming the input and the fix. The path taken is asserted, never
a time.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer, SlowWriteWarning
from tests.writer.test_add_step import general  # the complete checks and the general commit only

AGENTS = ["agent_0", "agent_1", "agent_2"]
SPECS = {a: AgentSpec(obs_shape=(4,), action_shape=(3,), n_discrete_actions=3) for a in AGENTS}


class Agents(dict):  # type: ignore[type-arg]
    """A dict subclass, as some wrappers return."""


def containers(values: list[Any]) -> dict[str, Any]:
    """One field's per-agent values in every container environments use."""
    as_dict = dict(zip(AGENTS, values))
    return {
        "dict": as_dict,
        "defaultdict": defaultdict(int, as_dict),
        "OrderedDict": OrderedDict(as_dict),
        "MappingProxyType": MappingProxyType(as_dict),
        "dict subclass": Agents(as_dict),
        "list": list(values),
        "tuple": tuple(values),
    }


SCALARS = {
    "float": [0.5, -1.0, 2.0],
    "int": [1, 0, -2],
    "bool": [True, False, True],
    "np.float32": [np.float32(0.5), np.float32(-1), np.float32(2)],
    "np.float64": [np.float64(0.5), np.float64(-1), np.float64(2)],
    "np.int64": [np.int64(1), np.int64(0), np.int64(3)],
    "np.bool_": [np.bool_(True), np.bool_(False), np.bool_(True)],
    "0-d float array": [np.array(0.5), np.array(-1.0), np.array(2.0)],
    "0-d int array": [np.array(1), np.array(0), np.array(3)],
    "0-d bool array": [np.array(True), np.array(False), np.array(True)],
    "mixed": [0.5, np.float32(1), np.array(2.0)],
}
ACTIONS = {
    "int": [0, 2, 1],
    "np.int64": [np.int64(0), np.int64(2), np.int64(1)],
    "0-d int array": [np.array(0), np.array(2), np.array(1)],
    "one-hot": [np.eye(3, dtype=np.float32)[i] for i in (0, 2, 1)],
}


def observations(seed: int) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).random((3, 4), dtype=np.float32))


class PathSpy:
    """Counts steps stored by the store kernels (:meth:`WritePath.store_step` returning True: the
    kernel took the step) and refuses the slower staging paths."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, buf: MultiAgentReplayBuffer) -> None:
        self.kernel_calls = 0
        store = buf._writes.store_step

        def counted(*args: Any) -> bool:
            taken = store(*args)
            self.kernel_calls += bool(taken)
            return taken

        monkeypatch.setattr(buf._writes, "store_step", counted)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a slower staging path was taken")

        monkeypatch.setattr(buf._codec, "stage_fast", refuse)
        monkeypatch.setattr(buf._codec, "stage", refuse)


def stored(buf: MultiAgentReplayBuffer) -> np.ndarray:
    return buf.storage.table[: len(buf)].copy()  # type: ignore[attr-defined]


def _write_both(monkeypatch: pytest.MonkeyPatch, next_obs: str, steps: list[list[Any]]) -> None:
    """``steps`` through the one-kernel path (each one kernel call, no other staging) and
    through the complete checks: the same bytes and write generations."""
    fast = MultiAgentReplayBuffer(SPECS, 16, next_obs=next_obs, seed=0)
    slow = general(MultiAgentReplayBuffer(SPECS, 16, next_obs=next_obs, seed=0))
    spy = PathSpy(monkeypatch, fast)
    for t, step in enumerate(steps):
        fast.add(*step)
        slow.add(*step)
        assert spy.kernel_calls == t + 1
    assert np.array_equal(stored(fast), stored(slow))
    assert np.array_equal(fast.write_generation, slow.write_generation)


def _step(t: int, container: str, actions: list[Any], scalars: list[Any]) -> list[Any]:
    return [
        containers(observations(t))[container],
        containers(actions)[container],
        containers(scalars)[container],
        containers(observations(t + 1))[container],
        containers([bool(x) for x in scalars])[container],
    ]


@pytest.mark.parametrize("next_obs", ["once", "stored"])
@pytest.mark.parametrize("container", list(containers([0, 0, 0])))
def test_every_container_takes_the_one_kernel_path(
    monkeypatch: pytest.MonkeyPatch, next_obs: str, container: str
) -> None:
    steps = [_step(t, container, ACTIONS["int"], SCALARS["float"]) for t in range(3)]
    _write_both(monkeypatch, next_obs, steps)


@pytest.mark.parametrize("next_obs", ["once", "stored"])
def test_every_scalar_and_action_kind_takes_the_one_kernel_path(
    monkeypatch: pytest.MonkeyPatch, next_obs: str
) -> None:
    kinds = list(ACTIONS.values())
    steps = [
        _step(t, "dict", kinds[t % len(kinds)], scalars)
        for t, scalars in enumerate(SCALARS.values())
    ]
    _write_both(monkeypatch, next_obs, steps)


def test_stacked_arrays_take_the_one_kernel_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field as one array over the agents (a vectorized wrapper's output). The format is
    chosen up front: a ``next_obs="auto"`` buffer's first write stages its step (one kernel) and
    commits it where the format is decided."""
    fast = MultiAgentReplayBuffer(SPECS, 16, next_obs="once", seed=0)
    slow = general(MultiAgentReplayBuffer(SPECS, 16, next_obs="once", seed=0))
    spy = PathSpy(monkeypatch, fast)
    rng = np.random.default_rng(0)
    for t in range(4):
        step = (
            rng.random((3, 4), dtype=np.float32),
            rng.integers(0, 3, 3),
            rng.standard_normal(3),
            rng.random((3, 4), dtype=np.float32),
            np.array([False, t == 3, False]),
        )
        fast.add(*step)
        slow.add(*step)
    assert spy.kernel_calls == 4
    assert np.array_equal(stored(fast), stored(slow))


def test_a_defaultdict_never_gets_entries_added() -> None:
    """Reading an env's defaultdict rewards does not create entries (a missing agent is not
    made up as 0): a wrong agent name still raises."""
    buf = MultiAgentReplayBuffer(SPECS, 8, seed=0)
    obs = dict(zip(AGENTS, observations(0)))
    rewards = defaultdict(int, {"agent_0": 1.0, "agent_1": 0.0, "wrong": 2.0})
    with pytest.raises(ValueError, match="agents"):
        buf.add(obs, {a: 0 for a in AGENTS}, rewards, obs, {a: False for a in AGENTS})
    assert set(rewards) == {"agent_0", "agent_1", "wrong"} and len(buf) == 0


@pytest.mark.parametrize("call", ["extend", "add_envs"])
@pytest.mark.parametrize("next_obs", ["once", "stored"])
def test_a_one_step_extend_takes_adds_path(
    monkeypatch: pytest.MonkeyPatch, call: str, next_obs: str
) -> None:
    """A one-step extend or add_envs is one store-kernel call (its items read at their first
    row), with the bytes, links and ring state of the general path; a longer one is not."""
    fast = MultiAgentReplayBuffer(SPECS, 16, next_obs=next_obs, seed=0)
    slow = general(MultiAgentReplayBuffer(SPECS, 16, next_obs=next_obs, seed=0))
    spy = PathSpy(monkeypatch, fast)
    rng = np.random.default_rng(1)
    obs = {a: rng.random((1, 4), dtype=np.float32) for a in AGENTS}
    for t in range(5):
        nxt = {a: rng.random((1, 4), dtype=np.float32) for a in AGENTS}
        step = (
            obs,
            {a: rng.integers(0, 3, 1) for a in AGENTS},
            {a: rng.standard_normal(1).astype(np.float32) for a in AGENTS},
            nxt,
            {a: np.zeros(1, np.float32) for a in AGENTS},
        )
        getattr(fast, call)(*step)
        getattr(slow, call)(*step)
        obs = nxt if call == "extend" or t % 2 else obs  # streams, and a break
    assert spy.kernel_calls == 5
    assert np.array_equal(stored(fast), stored(slow))
    assert (fast.cursor, fast.total_writes) == (slow.cursor, slow.total_writes)
    if next_obs == "once":
        assert np.array_equal(fast.links.pointers, slow.links.pointers)  # type: ignore[union-attr]


def test_a_one_step_extend_with_a_longer_item_is_refused_as_before() -> None:
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0)
    one = {a: np.zeros((1, 4), np.float32) for a in AGENTS}
    two = dict(one, agent_2=np.zeros((2, 4), np.float32))
    zeros = {a: np.zeros(1, np.float32) for a in AGENTS}
    with pytest.raises(ValueError, match="same number of timesteps"):
        buf.extend(one, {a: np.zeros(1, np.int64) for a in AGENTS}, zeros, two, zeros)
    assert len(buf) == 0


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("obs", [0.0, 1.0, 2.0, 3.0], r"obs\['agent_1'\] is a list: pass a NumPy array"),
        ("reward", np.float16(1.0), r"reward\['agent_1'\] is a numpy.float16"),
        ("next_obs", np.zeros(4, np.float16), r"next_obs\['agent_1'\] has dtype float16"),
    ],
)
def test_a_valid_step_off_the_kernel_path_warns_once_naming_the_input(
    field: str, value: Any, named: str
) -> None:
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0)
    step = {
        "obs": dict(zip(AGENTS, observations(0))),
        "action": {a: 1 for a in AGENTS},
        "reward": {a: 0.5 for a in AGENTS},
        "next_obs": dict(zip(AGENTS, observations(1))),
        "done": {a: False for a in AGENTS},
    }
    step[field] = dict(step[field], agent_1=value)
    with pytest.warns(SlowWriteWarning, match=named) as caught:
        for _ in range(3):
            buf.add(**step)
    assert len(caught) == 1 and len(buf) == 3


def test_a_torch_tensor_is_named_with_its_fix() -> None:
    torch = pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0)
    obs = dict(zip(AGENTS, observations(0)))
    actions = {a: torch.tensor(1) for a in AGENTS}
    with pytest.warns(SlowWriteWarning, match=r"action\['agent_0'\] is a torch.Tensor.*\.item\(\)"):
        buf.add(obs, actions, {a: 0.0 for a in AGENTS}, obs, {a: False for a in AGENTS})


def test_no_warning_where_no_input_is_to_blame() -> None:
    """Specs the kernels do not write (float16 storage, several stored dtypes) and absent
    agents of an alive=True buffer take the other paths without a warning."""
    half = {a: AgentSpec(obs_shape=(4,), action_shape=(3,), obs_dtype=np.float16) for a in AGENTS}
    obs = dict(zip(AGENTS, observations(0)))
    step = (obs, {a: np.zeros(3, np.float32) for a in AGENTS}, {a: 1.0 for a in AGENTS}, obs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MultiAgentReplayBuffer(half, 8).add(*step, {a: False for a in AGENTS})
        alive = MultiAgentReplayBuffer(SPECS, 8, alive=True)
        two = AGENTS[:2]
        alive.add(
            {a: obs[a] for a in two},
            {a: 1 for a in two},
            {a: 1.0 for a in two},
            {a: obs[a] for a in two},
            {a: False for a in two},
        )


# ------------------------------------------------------------------ a real environment
def _mpe_steps(n: int, count: int, continuous: bool) -> tuple[Any, list[tuple[Any, ...]]]:
    simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
    env = simple_spread.parallel_env(N=n, max_cycles=25, continuous_actions=continuous)
    obs, _ = env.reset(seed=0)
    steps = []
    while len(steps) < count:
        if not env.agents:
            obs, _ = env.reset()
        actions = {a: env.action_space(a).sample() for a in env.agents}
        nxt, rewards, terminations, truncations, _ = env.step(actions)
        steps.append((obs, actions, rewards, nxt, terminations, truncations))
        obs = nxt
    return env, steps


@pytest.mark.parametrize("continuous", [False, True])
def test_mpe2_env_step_output_takes_the_one_kernel_path(
    monkeypatch: pytest.MonkeyPatch, continuous: bool
) -> None:
    """mpe2's env.step output, unmodified (rewards a defaultdict of Python floats, bools,
    NumPy int64 or float32 actions), through add and through add_parallel_step."""
    from marlbuf.compat.pettingzoo import add_parallel_step
    from marlbuf.spec import specs_from_env

    env, steps = _mpe_steps(3, 60, continuous)
    assert any(type(rewards) is defaultdict for _, _, rewards, *_ in steps)
    specs = specs_from_env(env)
    direct = MultiAgentReplayBuffer(specs, 128, seed=0)
    adapter = MultiAgentReplayBuffer(specs, 128, seed=0)
    slow = general(MultiAgentReplayBuffer(specs, 128, seed=0))
    spies = (PathSpy(monkeypatch, direct), PathSpy(monkeypatch, adapter))
    for obs, actions, rewards, nxt, terminations, truncations in steps:
        direct.add(obs, actions, rewards, nxt, terminations)
        add_parallel_step(
            adapter, obs, actions, rewards, nxt, terminations, truncations, terminal="terminated"
        )
        slow.add(obs, actions, rewards, nxt, terminations)
    # every step but the first, which a next_obs="auto" buffer stages and commits where its
    # format is decided (the staging paths the spy refuses were not taken)
    assert spies[0].kernel_calls == spies[1].kernel_calls == len(steps) - 1
    assert np.array_equal(stored(direct), stored(slow))
    assert np.array_equal(stored(adapter), stored(slow))
