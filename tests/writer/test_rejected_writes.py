"""A rejected ``add``/``extend`` raises a clear error and changes nothing, bit for bit.

The buffer is filled partly, completely, or past the end once (wrapped); then every slot of
the storage, the ring metadata, the sampler state and the RNG state are snapshot, and a long
list of invalid calls is tried. Each must raise ``ValueError``/``TypeError`` naming the field
and the agent, and leave every snapshot value as it was. All problems of one buffer are
collected and reported together.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import PrioritizedNeighbor

LAYOUTS = ["interleaved", "agent_major"]
CAPACITY = 8
FILLS = {"partly": 5, "full": CAPACITY, "wrapped": CAPACITY + 3}
T = 3  # timesteps of the extend calls

#: three agents; the last one has float64 observations (and float32 everything else), the
#: middle one a discrete action stored one-hot
SPECS = {
    "a0": AgentSpec(obs_shape=(3,), action_shape=(2,)),
    "d1": AgentSpec(obs_shape=(5,), action_shape=(4,), n_discrete_actions=4),
    "w2": AgentSpec(obs_shape=(2, 2), action_shape=(3,), obs_dtype=np.float64),
}


# ------------------------------------------------------------------------------ data
def valid_extend(rng: np.random.Generator, steps: int = T) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = {f: {} for f in FIELDS}
    for agent, spec in SPECS.items():
        data["obs"][agent] = rng.standard_normal((steps, *spec.obs_shape)).astype(spec.obs_dtype)
        data["next_obs"][agent] = rng.standard_normal((steps, *spec.obs_shape)).astype(
            spec.obs_dtype
        )
        if spec.n_discrete_actions:
            data["action"][agent] = np.eye(4, dtype=np.float32)[rng.integers(0, 4, steps)]
        else:
            data["action"][agent] = rng.standard_normal((steps, *spec.action_shape)).astype(
                np.float32
            )
        data["reward"][agent] = rng.standard_normal(steps).astype(np.float32)
        data["done"][agent] = (rng.random(steps) < 0.5).astype(np.float32)
    return data


def valid_add(rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    return {f: {a: x[0] for a, x in per.items()} for f, per in valid_extend(rng, 1).items()}


def filled_buffer(layout: str, writes: int) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(
        SPECS, CAPACITY, layout=layout, sampler=PrioritizedNeighbor(), seed=0
    )
    rng = np.random.default_rng(writes)
    buf.extend(**valid_extend(rng, writes - 1))
    buf.add(**valid_add(rng))
    # make the sampler state non-trivial: distinct priorities per trainer
    for trainer in range(buf.n_trainers):
        batch = buf.sample(4, trainer=trainer)
        buf.update_priorities(
            batch.indices, rng.uniform(0.1, 3, 4), trainer=trainer, generations=batch.generations
        )
    return buf


# ------------------------------------------------------------------------------ snapshots
def snapshot(buf: MultiAgentReplayBuffer) -> dict[str, Any]:
    return {
        "storage": {k: v.copy() for k, v in buf.storage.arrays().items()},
        "cursor": buf.cursor,
        "size": buf.size,
        "total_writes": buf.total_writes,
        "write_generation": buf.write_generation.copy(),
        "sampler": copy.deepcopy(buf.sampler.state_dict()),
        "rng": copy.deepcopy(buf.rng.bit_generator.state),
    }


def _bytes(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, np.ascontiguousarray(x).tobytes())
    if isinstance(x, dict):
        return {k: _bytes(v) for k, v in x.items()}
    return x


def changes(before: dict[str, Any], buf: MultiAgentReplayBuffer) -> list[str]:
    """Names of the snapshot entries that differ (bit for bit) from ``before``."""
    after = snapshot(buf)
    diff = []
    for key in before:
        if key == "storage":
            for name, arr in before["storage"].items():
                now = after["storage"][name]
                if arr.tobytes() != now.tobytes():
                    rows = np.flatnonzero(
                        (arr.view(np.uint8) != now.view(np.uint8)).reshape(arr.shape[0], -1).any(1)
                    )
                    diff.append(f"storage {name!r} slots {rows.tolist()}")
        elif _bytes(before[key]) != _bytes(after[key]):
            diff.append(key)
    return diff


# ------------------------------------------------------------------------------ invalid calls
Case = tuple[str, str, Callable[[dict], None], tuple[type[Exception], ...], list[str]]


def _set_one(value: Any, bad: float) -> np.ndarray:
    """A float64 copy of ``value`` (float64, so that 1e39 stays finite) whose last element (at
    the last timestep) is ``bad``."""
    arr = np.array(value, dtype=np.float64)
    arr.reshape(-1)[-1] = bad
    return arr


def invalid_cases(mode: str) -> Iterator[Case]:
    """``(description, mode, mutate, expected exceptions, words the message must name)``."""
    lead = (T,) if mode == "extend" else ()
    agents = list(SPECS)

    def setter(f: str, a: str, make: Callable[[Any], Any]) -> Callable[[dict], None]:
        def mutate(data: dict) -> None:
            data[f][a] = make(data[f][a])

        return mutate

    for f in FIELDS:
        for a, spec in SPECS.items():
            for bad in (np.nan, np.inf, -np.inf):
                yield (
                    f"{bad} in {f}[{a!r}]",
                    mode,
                    setter(f, a, lambda v, bad=bad: _set_one(v, bad)),
                    (ValueError,),
                    [f, a],
                )
            if spec.dtype(f) == np.float32:
                # finite in float64 but beyond float32's range: an error about the range
                for big in (1e39, -1e39):
                    yield (
                        f"{big} in float32 {f}[{a!r}]",
                        mode,
                        setter(f, a, lambda v, big=big: _set_one(v, big)),
                        (ValueError,),
                        [f, a, "range"],
                    )
            shape = lead + spec.shape(f)
            wrong_shapes = [(*lead, *spec.shape(f), 2), (*lead, 7)]
            if spec.shape(f):
                wrong_shapes.append((*lead, *spec.shape(f)[:-1], spec.shape(f)[-1] + 1))
            for wrong in wrong_shapes:
                yield (
                    f"shape {wrong} for {f}[{a!r}]",
                    mode,
                    setter(f, a, lambda v, wrong=wrong: np.zeros(wrong, np.float32)),
                    (ValueError,),
                    [f, a],
                )
            for what, make in [
                ("strings", lambda v, shape=shape: np.full(shape, "x")),
                ("complex", lambda v, shape=shape: np.zeros(shape, np.complex64)),
                ("objects", lambda v, shape=shape: np.full(shape, None, dtype=object)),
                ("None", lambda v: None),
                ("a huge Python int", lambda v: 10**40),
            ]:
                yield (
                    f"{what} for {f}[{a!r}]",
                    mode,
                    setter(f, a, make),
                    (ValueError, TypeError),
                    [f, a],
                )
            yield (
                f"missing agent {a!r} in {f}",
                mode,
                lambda data, f=f, a=a: data[f].pop(a),
                (ValueError,),
                [f, a, "missing"],
            )
            if mode == "extend":
                yield (
                    f"{T - 1} timesteps for {f}[{a!r}] (the others {T})",
                    mode,
                    setter(f, a, lambda v: v[:-1]),
                    (ValueError,),
                    [f, a],
                )
                yield (
                    f"{T + 1} timesteps for {f}[{a!r}] (the others {T})",
                    mode,
                    setter(f, a, lambda v: np.concatenate([v, v[:1]])),
                    (ValueError,),
                    [f, a],
                )
        yield (
            f"extra agent in {f}",
            mode,
            lambda data, f=f: data[f].update(ghost=data[f][agents[0]]),
            (ValueError,),
            [f, "ghost"],
        )
        yield (
            f"{f} as a list one short",
            mode,
            lambda data, f=f: data.__setitem__(f, [data[f][a] for a in agents[:-1]]),
            (ValueError,),
            [f],
        )
    for bad in (4, -1, 2**40):
        if mode == "add":
            make: Callable[[Any], Any] = lambda v, bad=bad: bad  # noqa: E731
        else:
            make = lambda v, bad=bad: np.array([0, bad, 1][:T])  # noqa: E731
        yield (
            f"discrete action {bad} out of [0, 4)",
            mode,
            setter("action", "d1", make),
            (ValueError,),
            ["action", "d1"],
        )


def _names(msg: str, word: str) -> bool:
    """Whether ``msg`` names ``word`` as a whole word ("obs" is not found in "next_obs")."""
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", msg) is not None


def try_invalid(buf: MultiAgentReplayBuffer, mode: str, seed: int) -> list[str]:
    problems = []
    rng = np.random.default_rng(seed)
    for number, (what, _, mutate, expected, words) in enumerate(invalid_cases(mode)):
        data = valid_extend(rng) if mode == "extend" else valid_add(rng)
        mutate(data)
        before = snapshot(buf)
        label = f"{mode} with {what}"
        try:
            getattr(buf, mode)(**data)
        except expected as exc:
            msg = str(exc)
            missing = [w for w in words if not _names(msg, w)]
            if missing:
                problems.append(f"{label}: message does not name {missing}: {msg!r}")
            if "range" in words and "NaN or inf" in msg:
                problems.append(f"{label}: a finite value reported as NaN or inf: {msg!r}")
        except Exception as exc:  # anything else is a failure of this case, reported below
            problems.append(f"{label}: raised {type(exc).__name__} ({exc}), expected {expected}")
        else:
            problems.append(f"{label}: accepted (case #{number})")
        changed = changes(before, buf)
        if changed:
            problems.append(f"{label}: changed {changed}")
    return problems


@pytest.mark.parametrize("fill", list(FILLS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rejected_writes_change_nothing(layout, fill):
    buf = filled_buffer(layout, FILLS[fill])
    problems = try_invalid(buf, "add", 1) + try_invalid(buf, "extend", 2)
    # after all those rejected calls a valid add stores exactly its own values
    step = valid_add(np.random.default_rng(3))
    step["action"]["d1"] = 2  # a discrete index, stored one-hot
    buf.add(**step)
    slot = (buf.cursor - 1) % CAPACITY
    row = buf.gather([slot])
    for f in FIELDS:
        for agent, spec in SPECS.items():
            expected = np.asarray(step[f][agent])
            if f == "action" and spec.n_discrete_actions:
                expected = np.eye(4)[2]
            got = row.field(f)[agent][0]
            if got.tobytes() != expected.astype(spec.dtype(f)).tobytes():
                problems.append(f"valid add after rejected calls: {f}[{agent!r}] is {got}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["add", "extend"])
@pytest.mark.parametrize(("field", "agent"), [("obs", "a0"), ("reward", "w2"), ("action", "w2")])
def test_finite_value_beyond_float32_is_out_of_range_not_nan(layout, mode, field, agent):
    """float64 1e39 is finite: it does not fit the float32 storage, so the error is about the
    range, not about NaN or inf (the cast would turn it into inf)."""
    buf = filled_buffer(layout, 5)
    before = snapshot(buf)
    rng = np.random.default_rng(0)
    data = valid_extend(rng) if mode == "extend" else valid_add(rng)
    value = np.array(data[field][agent], dtype=np.float64)
    value.reshape(-1)[0] = 1e39
    data[field][agent] = value
    with pytest.raises(ValueError, match="range") as info:
        getattr(buf, mode)(**data)
    msg = str(info.value)
    assert "NaN or inf" not in msg
    assert _names(msg, field) and _names(msg, agent), msg
    assert changes(before, buf) == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float64_storage_accepts_values_beyond_float32(layout):
    """The range check is against the stored dtype: 1e39 fits a float64 observation."""
    buf = filled_buffer(layout, 5)
    step = valid_add(np.random.default_rng(0))
    step["obs"]["w2"] = np.full((2, 2), 1e39)
    buf.add(**step)
    np.testing.assert_array_equal(buf.gather([5]).obs["w2"][0], np.full((2, 2), 1e39))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bad", ["other sampler", "NaN priority", "short write_generation"])
def test_rejected_load_state_dict_changes_nothing(layout, bad):
    """A state that does not fit is refused before anything is written: a half-loaded buffer
    (new data and size, old priority trees) would sample slots it does not hold."""
    buf = filled_buffer(layout, FILLS["wrapped"])
    source = MultiAgentReplayBuffer(SPECS, CAPACITY, layout=layout, seed=1)  # Uniform sampler
    source.extend(**valid_extend(np.random.default_rng(9), 3))
    if bad == "other sampler":
        state = source.state_dict()  # the Uniform sampler's state has no priority trees
    else:
        other = filled_buffer(layout, 3)
        state = other.state_dict()
        if bad == "NaN priority":
            state["sampler"]["state"]["leaves"][0, 0] = np.nan
        else:
            state["write_generation"] = state["write_generation"][:-1]
    before = snapshot(buf)
    with pytest.raises((ValueError, TypeError)):
        buf.load_state_dict(state)
    changed = changes(before, buf)
    assert not changed, f"a rejected load_state_dict changed {changed}"
    for _ in range(20):
        assert buf.sample(4).indices.max() < len(buf)
