"""One front over every store: the same features and the same batches, bit for bit.

The parity test runs every feature of :data:`marlbuf.stores.capabilities.CAPABILITIES` on every
store that offers it (NumPy in RAM, memory-mapped, torch on the CPU, torch on CUDA where a GPU
is present) against the NumPy buffer with the same seed; refusals must be the table's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer  # noqa: E402
from marlbuf.samplers import (  # noqa: E402
    Prioritized,
    Sampler,
    Sequence,
    Uniform,
)
from marlbuf.stores.capabilities import CAPABILITIES, STORES, markdown_table  # noqa: E402
from marlbuf.stores.torch import (  # noqa: E402
    round_of,
    stack_span,
)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _skip_without_cuda(device: str) -> None:
    if device == "cuda" and not CUDA:
        pytest.skip("needs a CUDA device")


def make_specs(half: bool = False, extras: bool = False) -> dict[str, AgentSpec]:
    obs_dtype = np.float16 if half else np.float32
    more = {"hidden": FieldSpec((4,))} if extras else {}
    return {
        f"agent_{i}": AgentSpec(
            obs_shape=(5 + 2 * i,), action_shape=(3,), obs_dtype=obs_dtype, extras=more
        )
        for i in range(3)
    }


def episodes(
    specs: dict[str, AgentSpec], steps: int, seed: int, globals_: bool = False
) -> dict[str, Any]:
    """``steps`` consecutive steps of one stream: next_obs is the following obs except at
    episode ends (done), as an environment writes them."""
    rng = np.random.default_rng(seed)
    obs = {
        a: rng.standard_normal((steps + 1, *s.obs_shape)).astype(s.obs_dtype)
        for a, s in specs.items()
    }
    done = (rng.random(steps) < 0.1).astype(np.float32)
    done[-1] = 1  # the next write starts a new episode
    next_obs = {a: o[1:].copy() for a, o in obs.items()}
    for a in specs:  # an episode end: the next step starts from a reset observation
        next_obs[a][done == 1] += 1
    data: dict[str, Any] = {
        "obs": {a: o[:-1] for a, o in obs.items()},
        "action": {a: rng.standard_normal((steps, 3)).astype(np.float32) for a in specs},
        "reward": {a: rng.standard_normal(steps).astype(np.float32) for a in specs},
        "next_obs": next_obs,
        "done": {a: done for a in specs},
    }
    for name in next(iter(specs.values())).extras:
        data[name] = {a: rng.standard_normal((steps, 4)).astype(np.float32) for a in specs}
    if globals_:
        data["state"] = rng.standard_normal((steps, 6)).astype(np.float32)
    return data


def host(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def assert_same_batch(want: Any, got: Any) -> None:
    """Every field, extra, global, alive flag, index and weight equal bit for bit."""
    for name in ("obs", "action", "reward", "next_obs", "done"):
        for agent, value in getattr(want, name).items():
            np.testing.assert_array_equal(host(getattr(got, name)[agent]), value, err_msg=name)
    for name, per_agent in want.extras.items():
        for agent, value in per_agent.items():
            np.testing.assert_array_equal(host(got.extras[name][agent]), value)
    for name, value in want.globals.items():
        np.testing.assert_array_equal(host(got.globals[name]), value)
    if want.alive is not None:
        for agent, value in want.alive.items():
            np.testing.assert_array_equal(host(got.alive[agent]), value)
    np.testing.assert_array_equal(host(got.indices), want.indices)
    if want.weights is not None:
        np.testing.assert_array_equal(host(got.weights), want.weights)
    mask = getattr(want, "mask", None)
    if mask is not None:
        np.testing.assert_array_equal(host(got.mask), mask)


def build(store: str, tmp_path: Any, specs: dict[str, AgentSpec], **kw: Any) -> Any:
    if store == "mapped":
        return MultiAgentReplayBuffer(specs, path=tmp_path / "buf", **kw)
    if store.startswith("torch"):
        return MultiAgentReplayBuffer(specs, device=store.split("-")[1], **kw)
    return MultiAgentReplayBuffer(specs, **kw)


STORE_PARAMS = ["ram", "mapped", "torch-cpu", pytest.param("torch-cuda", marks=pytest.mark.cuda)]


# ------------------------------------------------------------------------------ parity
def _feature_runs() -> dict[str, Callable[[str, Any], None]]:
    """Per feature of the capabilities table, a check that it works on a store: the store's
    batches equal the NumPy buffer's for the same seed and writes."""

    def compare(store: str, tmp_path: Any, sampler: Callable[[], Sampler], **kw: Any) -> None:
        specs = kw.pop("specs", make_specs())
        globals_ = bool(kw.get("global_fields"))
        trunc = kw.pop("truncated", False)
        ref = MultiAgentReplayBuffer(specs, 64, sampler=sampler(), seed=3, **kw)
        buf = build(store, tmp_path, specs, capacity=64, sampler=sampler(), seed=3, **kw)
        for k in range(3):  # wraps around the ring
            data = episodes(specs, 30, k, globals_)
            cut = np.zeros(30, dtype=bool)
            cut[10] = trunc
            ref.extend(**data, truncated=cut)
            buf.extend(**data, truncated=cut)
        for t in range(2):
            assert_same_batch(ref.sample(8, trainer=t), buf.sample(8, trainer=t))
        if ref.sampler.weighted:
            batch_ref, batch = ref.sample(8), buf.sample(8)
            td = np.linspace(0.5, 3.0, 8)
            ref.update_priorities(batch_ref.indices, td)
            buf.update_priorities(batch.indices, torch.tensor(td) if store != "ram" else td)
            assert_same_batch(ref.sample(8), buf.sample(8))
        buf.close()

    def custom(store: str, tmp_path: Any) -> None:
        class EveryOther(Sampler):  # a user's sampler: even slots only
            def config(self) -> dict[str, Any]:
                return {}

            def sample(self, batch_size: int, size: int, rng: Any, trainer: int = 0) -> Any:
                return 2 * rng.integers(0, size // 2, batch_size), None

        compare(store, tmp_path, EveryOther)

    def deferred(store: str, tmp_path: Any) -> None:
        specs = make_specs()
        ref = MultiAgentReplayBuffer(specs, 64, sampler=Prioritized(), seed=3)
        buf = build(store, tmp_path, specs, capacity=64, sampler=Prioritized(), seed=3)
        data = episodes(specs, 50, 0)
        ref.extend(**data)
        buf.extend(**data)
        a, b = ref.sample_for_trainers(8), buf.sample_for_trainers(8)
        td = [np.full(8, 2.0 + t) for t in range(3)]
        ref.update_priorities_for_trainers([x.indices for x in a], td)
        buf.update_priorities_for_trainers(
            [x.indices for x in b], [torch.tensor(x) for x in td], sync=False
        )
        for t in range(3):
            assert_same_batch(ref.sample(8, trainer=t), buf.sample(8, trainer=t))
        buf.close()

    def convert(store: str, tmp_path: Any) -> None:
        specs = make_specs()
        ref = MultiAgentReplayBuffer(specs, 64, seed=3, next_obs="once")
        ref.extend(**episodes(specs, 50, 0))
        ref.save(tmp_path / "once.npz")
        kw = {"capacity": 64, "seed": 3, "next_obs": "stored"}
        buf = build(store, tmp_path, specs, **kw)
        buf.load_state_dict(MultiAgentReplayBuffer.load(tmp_path / "once.npz").state_dict())
        assert buf.next_obs == "stored"
        assert_same_batch(ref.sample(16), buf.sample(16))
        buf.close()

    return {
        "custom Sampler subclasses": custom,
        "next_obs / batch_dtype / batch_layout options": lambda s, p: compare(
            s,
            p,
            Uniform,
            specs=make_specs(half=True),
            next_obs="once",
            batch_dtype="float32",
            batch_layout="per_agent",
        ),
        "update_priorities(sync=False), update_priorities_for_trainers": deferred,
        "loading another next_obs format": convert,
        "parallel_gather=True": lambda s, p: compare(s, p, Uniform, parallel_gather=True),
    }


FEATURES = _feature_runs()

#: features that test_protocol.py runs on every store (every sampler and next_obs format, with
#: extras, global fields, alive flags and truncations in its writes; agent_major and path= as
#: stores, the torch store's refusals with the table's message)
IN_THE_PROTOCOL_TEST = {
    "extras, global_fields, alive",
    "Sequence sampler",
    "layout='agent_major'",
    "truncated= and extras on writes",
    "path=",
}


def test_every_capability_has_a_check() -> None:
    assert not set(FEATURES) & IN_THE_PROTOCOL_TEST
    assert set(FEATURES) | IN_THE_PROTOCOL_TEST == set(CAPABILITIES)
    table = markdown_table()
    assert all(feature in table for feature in CAPABILITIES)


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("store", STORE_PARAMS)
def test_every_feature_on_every_store(feature: str, store: str, tmp_path: Any) -> None:
    """Supported: the store's batches equal the NumPy buffer's. Refused: with the table's
    reason, before anything is built."""
    if store == "torch-cuda":
        _skip_without_cuda("cuda")
    kind = "torch" if store.startswith("torch") else store
    reason = CAPABILITIES[feature][kind]
    if reason is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            FEATURES[feature](store, tmp_path)
        return
    with pytest.raises(ValueError) as info:
        FEATURES[feature](store, tmp_path)
    assert reason.split(";")[0][:40] in str(info.value)


def test_every_store_is_listed() -> None:
    assert set(STORES) == {s for stores in CAPABILITIES.values() for s in stores}


# ------------------------------------------------------------------------------ torch store
@pytest.mark.parametrize("device", DEVICES)
def test_a_round_is_one_block_and_out_reuses_it(device: str) -> None:
    _skip_without_cuda(device)
    specs = make_specs()
    ref = MultiAgentReplayBuffer(specs, 100, seed=1)
    buf = MultiAgentReplayBuffer(specs, 100, seed=1, device=device)
    data = episodes(specs, 90, 0)
    ref.extend(**data)
    buf.extend(**data)
    first = buf.sample_for_trainers(8)
    ref.sample_for_trainers(8)
    whole = round_of(first)
    assert whole is not None and tuple(whole.rows.shape[:2]) == (3, 8)
    again = buf.sample_for_trainers(8, out=first)
    assert round_of(again) is not None
    assert again[0].block.data_ptr() == first[0].block.data_ptr()
    want = ref.sample_for_trainers(8)
    for w, g in zip(want, again):
        assert_same_batch(w, g)
    critic = stack_span(again, "obs", "action")
    for t in range(3):
        np.testing.assert_array_equal(host(critic[t]), want[t].concat("obs", "action"))


def test_deferred_updates_raise_at_the_next_call() -> None:
    specs = make_specs()
    buf = MultiAgentReplayBuffer(specs, 64, sampler=Prioritized(), seed=0, device="cpu")
    buf.extend(**episodes(specs, 40, 0))
    batch = buf.sample(8)
    buf.update_priorities(batch.indices, torch.full((8,), float("nan")), sync=False)
    with pytest.raises(ValueError, match="finite"):
        buf.check_priority_errors()
    buf.check_priority_errors()  # reported once, then nothing is pending
    with pytest.raises(TypeError, match="sync must be a bool"):
        buf.update_priorities(batch.indices, torch.ones(8), sync="no")


@pytest.mark.parametrize("device", DEVICES)
def test_files_are_the_same_for_every_store(device: str, tmp_path: Any) -> None:
    _skip_without_cuda(device)
    specs = make_specs(extras=True)
    kw = {"sampler": Prioritized(), "seed": 2, "alive": True}
    ref = MultiAgentReplayBuffer(specs, 64, **kw)
    buf = MultiAgentReplayBuffer(specs, 64, device=device, **kw)
    data = episodes(specs, 70, 0)
    ref.extend(**data)
    buf.extend(**data)
    buf.save(tmp_path / "device.npz")
    ref.save(tmp_path / "host.npz")
    on_host = MultiAgentReplayBuffer.load(tmp_path / "device.npz")
    on_device = MultiAgentReplayBuffer.load(tmp_path / "host.npz", device=device)
    assert on_device.device is not None and on_host.device is None
    for t in range(3):
        want = ref.sample(8, t)
        assert_same_batch(want, on_host.sample(8, t))
        assert_same_batch(want, on_device.sample(8, t))
        assert_same_batch(want, buf.sample(8, t))


def test_refusals_name_the_option_and_the_reason(tmp_path: Any) -> None:
    specs = make_specs()
    with pytest.raises(ValueError, match=r"agent_major.*per_agent"):
        MultiAgentReplayBuffer(specs, 10, layout="agent_major", device="cpu")
    with pytest.raises(ValueError, match=r"path=.*not memory-mapped"):
        MultiAgentReplayBuffer(specs, 10, path=tmp_path / "x", device="cpu")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="parallel_gather"):
        MultiAgentReplayBuffer(specs, 10, parallel_gather=True, device="cpu")
    with pytest.raises(ValueError, match="device must be"):
        MultiAgentReplayBuffer(specs, 10, device="tpu:0")
    with pytest.raises(TypeError, match="device must be a string"):
        MultiAgentReplayBuffer(specs, 10, device=3)
    if not CUDA:
        with pytest.raises(ValueError, match="is_available"):
            MultiAgentReplayBuffer(specs, 10, device="cuda")


def test_out_of_another_kind_is_refused() -> None:
    specs = make_specs()
    buf = MultiAgentReplayBuffer(specs, 64, seed=0, device="cpu")
    ref = MultiAgentReplayBuffer(specs, 64, seed=0)
    data = episodes(specs, 40, 0)
    buf.extend(**data)
    ref.extend(**data)
    with pytest.raises(TypeError, match="DeviceBatch"):
        buf.sample(8, out=object())
    with pytest.raises(ValueError, match="DeviceBatch"):
        buf.sample(8, out=ref.sample(8))
    with pytest.raises(ValueError, match="shape"):
        buf.sample(4, out=buf.sample(8))


def test_sequences_on_the_device_are_masked_zeros() -> None:
    specs = make_specs()
    buf = MultiAgentReplayBuffer(specs, 64, sampler=Sequence(6), seed=0, device="cpu")
    buf.extend(**episodes(specs, 60, 0))
    batch = buf.sample(16)
    assert batch.mask.dtype == torch.bool and tuple(batch.mask.shape) == (16, 6)
    obs = batch.obs["agent_0"]
    assert tuple(obs.shape) == (16, 6, 5)
    assert torch.all(obs[~batch.mask] == 0)
    assert tuple(batch.concat("obs", "action").shape[:2]) == (16, 6)


@pytest.mark.cuda
def test_a_device_round_does_not_wait_for_the_device() -> None:
    _skip_without_cuda("cuda")
    specs = make_specs()
    buf = MultiAgentReplayBuffer(specs, 1000, seed=0, device="cuda", sampler=Prioritized())
    buf.extend(**episodes(specs, 900, 0))
    batches = buf.sample_for_trainers(64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = buf.sample_for_trainers(64, out=batches)
        td = [torch.ones(64, device="cuda") for _ in range(3)]
        buf.update_priorities_for_trainers([b.indices for b in batches], td, sync=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    buf.check_priority_errors()


@pytest.mark.parametrize("source", ["agent_major/once", "agent_major/stored", "interleaved/once"])
@pytest.mark.parametrize("target", ["ram-interleaved", "ram-agent_major", "torch-cpu"])
def test_states_of_another_layout_or_format_load_everywhere(source: str, target: str) -> None:
    """Every (layout, next_obs) state loads into every store; batches stay the same."""
    layout, next_obs = source.split("/")
    specs = make_specs(half=True)
    ref = MultiAgentReplayBuffer(specs, 48, seed=5, layout=layout, next_obs=next_obs)
    for k in range(2):  # wraps the ring
        ref.extend(**episodes(specs, 30, k))
    kind, option = target.split("-")
    kw: dict[str, Any] = {"device": "cpu"} if kind == "torch" else {"layout": option}
    for mode in ("once", "stored"):
        buf = MultiAgentReplayBuffer(specs, 48, seed=1, next_obs=mode, **kw)
        buf.load_state_dict(ref.state_dict())
        assert (buf.next_obs, buf.layout) == (mode, kw.get("layout", "interleaved"))
        assert_same_batch(ref.gather(np.arange(48)), buf.gather(np.arange(48)))
        assert_same_batch(ref.sample(16, trainer=2), buf.sample(16, trainer=2))
        if mode == "once":  # linked where consecutive, side rows at the episode ends only
            assert 0 < buf.links.side_rows_used < 48
        more = episodes(specs, 5, 7)  # the stream continues after the conversion
        ref.extend(**more)
        buf.extend(**more)
        assert_same_batch(ref.gather(np.arange(48)), buf.gather(np.arange(48)))
        ref = MultiAgentReplayBuffer(specs, 48, seed=5, layout=layout, next_obs=next_obs)
        for k in range(2):
            ref.extend(**episodes(specs, 30, k))
