"""Every sampler on every store in every ``next_obs`` format, through the whole protocol.

One parametrised test drives each (sampler, store, format) case the same way: writes that wrap
the ring, with episode ends, truncations and a second stream written one step at a time; the
sampler's batch kind (rows, sequences, episodes) drawn for two trainers; priorities fed back
(prioritized samplers); a ``state_dict``/``load_state_dict`` round trip into a fresh buffer of
the same store, after which both buffers draw the same batches, and keep doing so after more
writes. Every batch is checked bit for bit against the reference: the NumPy buffer in RAM with
next observations in every row (``next_obs="stored"``), the same specs, sampler and seed.
A store that refuses an option by design (:data:`marlbuf.stores.capabilities.CAPABILITIES`)
must refuse it with the table's message.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.samplers import (
    Episodes,
    Neighbor,
    Prioritized,
    PrioritizedNeighbor,
    Sampler,
    Sequence,
    Uniform,
)
from marlbuf.stores.capabilities import refusal

torch: Any
try:
    import torch

    from marlbuf.stores.torch import DeviceBatch, DeviceSequenceBatch
except ImportError:  # the torch stores' cases are skipped
    torch = None

CAPACITY = 40
BATCH = 4

#: sampler name -> a fresh sampler (one per buffer: samplers hold per-buffer state)
SAMPLERS: dict[str, Callable[[], Sampler]] = {
    "uniform": Uniform,
    "uniform-random_order": lambda: Uniform(order="random"),
    "uniform-distinct": lambda: Uniform(replace=False),
    "neighbor": lambda: Neighbor(2),
    "prioritized": lambda: Prioritized(alpha=0.7, priority="squared"),
    "prioritized_neighbor": lambda: PrioritizedNeighbor(thresholds=(0.5,), run_lengths=(1, 2)),
    "sequence": lambda: Sequence(4, burn_in=1),
    "sequence-prioritized": lambda: Sequence(3, prioritized=True),
    "episodes": Episodes,
    "episodes-prioritized": lambda: Episodes(max_length=6, prioritized=True),
}

#: store name -> constructor keywords (``folder``: where a mapped store keeps its files)
STORES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "ram-interleaved": lambda folder: {},
    "ram-agent_major": lambda folder: {"layout": "agent_major"},
    "mapped": lambda folder: {"path": folder},
    "torch-cpu": lambda folder: {"device": "cpu"},
    "torch-cuda": lambda folder: {"device": "cuda"},
    "torch-cpu-agent_major": lambda folder: {"device": "cpu", "layout": "agent_major"},
    "torch-cpu-mapped": lambda folder: {"device": "cpu", "path": folder},
}

#: stores that refuse by design: store -> (feature of the capabilities table, store, given)
REFUSED = {
    "torch-cpu-agent_major": ("layout='agent_major'", "torch", "device='cpu'"),
    "torch-cpu-mapped": ("path=", "torch", "device='cpu'"),
}

#: format name -> (next_obs, batch_dtype, float16 observations and actions, batch_layout)
FORMATS: dict[str, tuple[str, str, bool, str]] = {
    "stored": ("stored", "float32", False, "rows"),
    "once": ("once", "float32", False, "rows"),
    "none": ("none", "float32", False, "rows"),
    "once-float16": ("once", "storage", True, "rows"),
    "once-per_agent": ("once", "float32", False, "per_agent"),
}

STORE_PARAMS = [
    pytest.param(name, marks=pytest.mark.cuda) if name == "torch-cuda" else name for name in STORES
]


def make_specs(half: bool) -> dict[str, AgentSpec]:
    """Three agents of different sizes: one with 2-D observations, one discrete actor, each with
    a per-agent extra field; float16 observations (and one float16 action) when ``half``."""
    obs_dtype = np.float16 if half else np.float32
    hidden = {"hidden": FieldSpec((2,))}
    return {
        "a0": AgentSpec((3,), (2,), obs_dtype=obs_dtype, extras=hidden),
        "a1": AgentSpec((2, 2), (2,), obs_dtype=obs_dtype, action_dtype=obs_dtype, extras=hidden),
        "a2": AgentSpec((4,), (3,), obs_dtype=obs_dtype, n_discrete_actions=3, extras=hidden),
    }


def steps(specs: dict[str, AgentSpec], count: int, seed: int) -> dict[str, Any]:
    """``count`` consecutive steps of one stream: each obs is the previous step's next_obs
    except after an episode end (a reset observation), with about one episode end (done or
    truncated) in five steps and the last step ending its episode."""
    rng = np.random.default_rng(seed)
    obs = {
        a: rng.standard_normal((count + 1, *s.obs_shape)).astype(s.obs_dtype)
        for a, s in specs.items()
    }
    done = (rng.random(count) < 0.12).astype(np.float32)
    truncated = (rng.random(count) < 0.08) & (done == 0)
    done[-1] = 1
    next_obs = {a: o[1:].copy() for a, o in obs.items()}
    for a in specs:  # after an episode end the next step starts from a reset observation
        next_obs[a][(done == 1) | truncated] += 1
    action: dict[str, Any] = {}
    for a, s in specs.items():
        if s.n_discrete_actions:
            action[a] = rng.integers(0, s.n_discrete_actions, count)
        else:
            action[a] = rng.standard_normal((count, *s.action_shape)).astype(s.action_dtype)
    return {
        "obs": {a: o[:-1] for a, o in obs.items()},
        "action": action,
        "reward": {a: rng.standard_normal(count).astype(np.float32) for a in specs},
        "next_obs": next_obs,
        "done": {a: done for a in specs},
        "truncated": truncated,
        "hidden": {a: rng.standard_normal((count, 2)).astype(np.float32) for a in specs},
        "state": rng.standard_normal((count, 3)).astype(np.float32),
        "alive": {a: rng.random(count) < 0.9 for a in specs},
    }


def one_step(data: dict[str, Any], t: int) -> dict[str, Any]:
    """Step ``t`` of ``steps()`` output, as ``add`` takes it."""
    return {
        f: v[t] if not isinstance(v, dict) else {a: x[t] for a, x in v.items()}
        for f, v in data.items()
    }


def steps_between(data: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Steps ``start`` to ``stop`` of ``steps()`` output."""
    return {
        f: v[start:stop] if not isinstance(v, dict) else {a: x[start:stop] for a, x in v.items()}
        for f, v in data.items()
    }


def write(bufs: list[Any], data: dict[str, Any], **kw: Any) -> None:
    """The same writes into every buffer (without next observations where it keeps none)."""
    for buf in bufs:
        given = (
            data if buf.next_obs != "none" else {k: v for k, v in data.items() if k != "next_obs"}
        )
        buf.extend(**given, **kw)


def add(bufs: list[Any], data: dict[str, Any], stream: int) -> None:
    for t in range(len(data["done"]["a0"])):
        step = one_step(data, t)
        for buf in bufs:
            given = (
                step
                if buf.next_obs != "none"
                else {k: v for k, v in step.items() if k != "next_obs"}
            )
            buf.add(**given, stream=stream)


def add_envs(bufs: list[Any], data: dict[str, Any]) -> None:
    """``steps()`` output written as one step of as many environments (streams 0, 1, ...),
    each ending its episode (the streams continue with other steps)."""
    data = {**data, "done": {a: np.ones_like(d) for a, d in data["done"].items()}}
    for buf in bufs:
        given = {k: v for k, v in data.items() if k != "next_obs" or buf.next_obs != "none"}
        buf.add_envs(**given)


def on_host(x: Any) -> np.ndarray:
    """A tensor (any device) as a host array; host arrays as they are."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_same_batch(want: Any, got: Any, next_obs: bool = True) -> None:
    """Every field, extra, global and alive flag, index, generation, weight and (sequences and
    episodes) mask, slot and length of ``got`` equal ``want``'s, bit for bit, with the dtypes
    and shapes of the reference."""
    assert got.trainer == want.trainer
    fields = ["obs", "action", "reward", "done"] + (["next_obs"] if next_obs else [])
    pairs = [
        (f"{f}[{a}]", v, getattr(got, f)[a]) for f in fields for a, v in getattr(want, f).items()
    ]
    pairs += [
        (f"{n}[{a}]", v, got.extras[n][a]) for n, per in want.extras.items() for a, v in per.items()
    ]
    pairs += [(n, v, got.globals[n]) for n, v in want.globals.items()]
    pairs += [(f"alive[{a}]", v, got.alive[a]) for a, v in (want.alive or {}).items()]
    for name in ("indices", "generations", "mask", "slots", "lengths"):
        if getattr(want, name, None) is not None:
            pairs.append((name, getattr(want, name), getattr(got, name)))
    if want.weights is None:
        assert got.weights is None
    else:
        pairs.append(("weights", want.weights, got.weights))
    for name, expected, value in pairs:
        value = on_host(value)
        assert (value.dtype, value.shape) == (expected.dtype, expected.shape), name
        assert np.ascontiguousarray(value).tobytes() == np.ascontiguousarray(expected).tobytes(), (
            name
        )
    if not next_obs:
        with pytest.raises(ValueError, match="next_obs='none'"):
            got.next_obs["a0"]


def td_errors(buf: Any, batch: Any) -> Any:
    """Fixed TD errors for ``batch`` (as a tensor on a torch store's device)."""
    values = np.linspace(0.25, 3.0, len(batch.indices))
    if buf.device is not None:
        return torch.as_tensor(values, device=buf.device)
    return values


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("store", STORE_PARAMS)
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampler_store_and_format_through_the_protocol(
    sampler: str, store: str, fmt: str, tmp_path: Any
) -> None:
    if store.startswith("torch"):
        if torch is None:
            pytest.skip("torch is not installed")
        if store == "torch-cuda" and not torch.cuda.is_available():
            pytest.skip("needs a CUDA device (torch.cuda.is_available())")
    next_obs, batch_dtype, half, batch_layout = FORMATS[fmt]
    specs = make_specs(half)
    kw: dict[str, Any] = {
        "global_fields": {"state": FieldSpec((3,))},
        "alive": True,
        "batch_dtype": batch_dtype,
        "batch_layout": batch_layout,
        "seed": 11,
    }

    def build(where: dict[str, Any], **options: Any) -> Any:
        return MultiAgentReplayBuffer(
            specs, CAPACITY, sampler=SAMPLERS[sampler](), **kw, **options, **where
        )

    if store in REFUSED:
        with pytest.raises(ValueError) as refused:
            build(STORES[store](tmp_path / "rows"), next_obs=next_obs)
        assert str(refused.value) == refusal(*REFUSED[store])
        assert not (tmp_path / "rows").exists()  # nothing half made
        return

    ref = build({}, next_obs="stored")
    buf = build(STORES[store](tmp_path / "rows"), next_obs=next_obs)
    assert buf.next_obs == next_obs and buf.sampler.batch_kind == ref.sampler.batch_kind
    keep_next = next_obs != "none"
    write([ref, buf], steps(specs, 30, 0))
    add([ref, buf], steps(specs, 5, 1), stream=1)  # a second stream, one step at a time
    add_envs([ref, buf], steps(specs, 3, 4))  # three streams, one step each
    write([ref, buf], steps(specs, 25, 2))  # wraps the ring
    assert (len(buf), buf.cursor, buf.total_writes) == (len(ref), ref.cursor, ref.total_writes)
    np.testing.assert_array_equal(buf.write_generation, ref.write_generation)
    for trainer in (0, 1):
        got = buf.sample(BATCH, trainer)
        assert_same_batch(ref.sample(BATCH, trainer), got, keep_next)
        if buf.device is not None:  # tensors on the device, indices and generations on the host
            kind = DeviceSequenceBatch if ref.sampler.batch_kind != "rows" else DeviceBatch
            assert isinstance(got, kind) and got.device.type == buf.device.type
            assert isinstance(got.indices, np.ndarray)
            np.testing.assert_array_equal(got.indices.generations, got.generations)
            if got.weights is not None:
                assert isinstance(got.weights, torch.Tensor)
                assert got.weights.device.type == buf.device.type
    for want, got in zip(
        ref.sample_for_trainers(BATCH), buf.sample_for_trainers(BATCH), strict=True
    ):
        assert_same_batch(want, got, keep_next)
        if ref.sampler.batch_kind == "rows":
            np.testing.assert_array_equal(got.generations, buf.write_generation[got.indices])
    for want, got in zip(ref.iter_trainers(BATCH), buf.iter_trainers(BATCH), strict=True):
        assert_same_batch(want, got, keep_next)
    if not ref.sampler.weighted:
        want, got = (b.sample_for_trainers(BATCH, shared_index=True) for b in (ref, buf))
        assert all(x is got[0] for x in got)
        assert_same_batch(want[0], got[0], keep_next)
    slots = np.array([0, 7, len(ref) - 1, 7])
    assert_same_batch(ref.gather(slots), buf.gather(slots), keep_next)
    assert_same_batch(ref.latest(6), buf.latest(6), keep_next)
    for field in ("obs", "action", "reward", "done") + (("next_obs",) if keep_next else ()):
        for agent, value in ref.stored(field).items():
            np.testing.assert_array_equal(on_host(buf.stored(field)[agent]), value)
    assert buf.reward_stats() == ref.reward_stats()

    if ref.sampler.weighted:  # priorities fed back change the next draws alike
        want, got = ref.sample(BATCH, 1), buf.sample(BATCH, 1)
        assert_same_batch(want, got, keep_next)
        ref.update_priorities(want.indices, td_errors(ref, want), trainer=1)
        buf.update_priorities(got.indices, td_errors(buf, got), trainer=1)
        assert_same_batch(ref.sample(BATCH, 1), buf.sample(BATCH, 1), keep_next)
    else:
        want, got = ref.sample(BATCH, 1), buf.sample(BATCH, 1)
        assert_same_batch(want, got, keep_next)
        with pytest.raises(TypeError, match="keeps no priorities"):
            buf.update_priorities(got.indices, td_errors(buf, got), trainer=1)

    state = buf.state_dict()
    fresh = build(STORES[store](tmp_path / "fresh"), next_obs=next_obs)
    fresh.load_state_dict(state)
    for trainer in (0, 1):  # the same generator and sampler states: the same next draws
        want = ref.sample(BATCH, trainer)
        assert_same_batch(want, buf.sample(BATCH, trainer), keep_next)
        assert_same_batch(want, fresh.sample(BATCH, trainer), keep_next)
    more = steps(specs, 9, 3)
    add([ref, buf, fresh], steps_between(more, 0, 3), stream=1)  # continues the open stream
    write([ref, buf, fresh], steps_between(more, 3, 9))
    for trainer in (0, 2):
        want = ref.sample(BATCH, trainer)
        assert_same_batch(want, buf.sample(BATCH, trainer), keep_next)
        assert_same_batch(want, fresh.sample(BATCH, trainer), keep_next)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for each in (ref, buf, fresh):
            each.close()
