"""Half-precision storage: exact round trip, range checks, conversion inside the gather."""

from __future__ import annotations

import numpy as np
import pytest
from datagen import random_step_data

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf._kernels import HALF_TO_FLOAT_BITS, gather_plan
from marlbuf._kernels.plan import HALF_TO_FLOAT

HALF = {
    "p": AgentSpec(obs_shape=(5,), action_shape=(3,), obs_dtype=np.float16),
    "q": AgentSpec(
        obs_shape=(2, 3), action_shape=(2,), obs_dtype=np.float16, action_dtype=np.float16
    ),
    "r": AgentSpec(obs_shape=(4,), action_shape=(4,), n_discrete_actions=4),
}


def on_host(x):
    """A tensor (a torch store's batch field) as a host array; arrays as they are."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


WIDE = {
    "p": AgentSpec(obs_shape=(5,), action_shape=(3,)),
    "q": AgentSpec(obs_shape=(2, 3), action_shape=(2,)),
    "r": AgentSpec(obs_shape=(4,), action_shape=(4,), n_discrete_actions=4),
}


def test_conversion_kernel_equals_numpy_astype_for_every_half():
    """All 65,536 float16 bit patterns (NaNs, infs, subnormals, signed zeros)."""
    halves = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    table = np.zeros((256, 128), dtype=np.uint64)
    table.view(np.uint16)[:, :256] = halves
    out = np.zeros(256 * 256, dtype=np.uint32)
    plan = np.array([[HALF_TO_FLOAT], [0], [0], [256], [256], [0]], dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    side = np.zeros((1, 8), np.uint8)
    gather_plan(
        table, table.view(np.uint32), table.view(np.uint16), table.view(np.uint8),
        side.view(np.uint64), side.view(np.uint32), side.view(np.uint16), side,
        np.arange(256, dtype=np.int64), none, none, *plan, HALF_TO_FLOAT_BITS,
        out.view(np.uint64), out, out.view(np.uint8),
    )  # fmt: skip
    expected = halves.reshape(-1).view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(out, expected)


def _representable(data):
    """Data whose half-precision fields hold exactly representable values."""
    for f in ("obs", "next_obs"):
        for a in ("p", "q"):
            data[f][a] = data[f][a].astype(np.float16).astype(np.float32)
    data["action"]["q"] = data["action"]["q"].astype(np.float16).astype(np.float32)
    return data


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("next_obs", ["once", "stored"])
@pytest.mark.parametrize("batch_layout", ["rows", "per_agent"])
def test_half_storage_returns_float32_batches_exactly(store, layout, next_obs, batch_layout):
    if store and layout == "agent_major":
        pytest.skip("a torch store's table is interleaved rows")
    data = _representable(random_step_data(WIDE, 40, np.random.default_rng(0)))
    kw = {"layout": layout, "next_obs": next_obs, "batch_layout": batch_layout, "seed": 2}
    half = MultiAgentReplayBuffer(HALF, 32, **kw, **store)
    wide = MultiAgentReplayBuffer(WIDE, 32, **kw)
    half.extend(**data)
    wide.extend(**data)
    for x, y in [
        (half.sample(16), wide.sample(16)),
        *zip(half.sample_for_trainers(8), wide.sample_for_trainers(8)),
    ]:
        np.testing.assert_array_equal(x.indices, y.indices)
        for f in FIELDS:
            for a in HALF:
                value = on_host(x.field(f)[a])
                assert value.dtype == y.field(f)[a].dtype
                assert (
                    np.ascontiguousarray(value).tobytes()
                    == np.ascontiguousarray(y.field(f)[a]).tobytes()
                ), (f, a)
    same_store = MultiAgentReplayBuffer(WIDE, 32, **kw, **store)
    assert half.storage.nbytes <= same_store.storage.nbytes


def test_storage_precision_batches(store):
    data = _representable(random_step_data(WIDE, 20, np.random.default_rng(1)))
    buf = MultiAgentReplayBuffer(HALF, 32, batch_dtype="storage", seed=0, **store)
    buf.extend(**data)
    batch = buf.gather(np.arange(20))
    obs, action, next_obs = (
        on_host(batch.field(f)[a]) for f, a in (("obs", "p"), ("action", "q"), ("next_obs", "q"))
    )
    assert obs.dtype == np.float16 and action.dtype == np.float16
    assert on_host(batch.obs["r"]).dtype == np.float32
    np.testing.assert_array_equal(next_obs.astype(np.float32), data["next_obs"]["q"])


@pytest.mark.parametrize("mode", ["add", "extend"])
def test_values_beyond_half_range_are_rejected(store, mode):
    buf = MultiAgentReplayBuffer(HALF, 8, **store)
    data = random_step_data(WIDE, 2, np.random.default_rng(2))
    data["obs"]["q"][0, 1, 1] = 70000.0
    if mode == "add":
        data = {f: {a: x[0] for a, x in per.items()} for f, per in data.items()}
    with pytest.raises(
        ValueError, match=r"obs\['q'\] holds 70000, outside the range of the stored float16"
    ):
        getattr(buf, mode)(**data)
    assert len(buf) == 0 and buf.total_writes == 0
    if store:  # a torch table starts zeroed: nothing was written into it
        assert not on_host(buf.storage.table).any()


def test_half_nan_is_rejected_by_the_fast_path(store):
    buf = MultiAgentReplayBuffer(HALF, 8, **store)
    data = random_step_data(WIDE, 1, np.random.default_rng(3))
    step = {f: {a: x[0] for a, x in per.items()} for f, per in data.items()}
    step["next_obs"]["p"] = np.array([0, 0, np.inf, 0, 0], dtype=np.float16)
    with pytest.raises(ValueError, match=r"next_obs\['p'\] contains NaN or inf"):
        buf.add(**step)
    assert len(buf) == 0 and buf.total_writes == 0
    if store:
        assert not on_host(buf.storage.table).any()


def test_half_rows_halve_the_observation_bytes():
    specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
    half = {a: AgentSpec((144,), (5,), obs_dtype=np.float16) for a in specs}
    dense = MultiAgentReplayBuffer(specs, 10, next_obs="stored")
    lean = MultiAgentReplayBuffer(half, 10)
    assert lean.storage.table.nbytes / dense.storage.table.nbytes < 0.27
