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
def test_half_storage_returns_float32_batches_exactly(layout, next_obs, batch_layout):
    data = _representable(random_step_data(WIDE, 40, np.random.default_rng(0)))
    kw = {"layout": layout, "next_obs": next_obs, "batch_layout": batch_layout, "seed": 2}
    half = MultiAgentReplayBuffer(HALF, 32, **kw)
    wide = MultiAgentReplayBuffer(WIDE, 32, **kw)
    half.extend(**data)
    wide.extend(**data)
    x, y = half.sample(16), wide.sample(16)
    np.testing.assert_array_equal(x.indices, y.indices)
    for f in FIELDS:
        for a in HALF:
            assert x.field(f)[a].dtype == y.field(f)[a].dtype
            assert x.field(f)[a].tobytes() == np.ascontiguousarray(y.field(f)[a]).tobytes(), (f, a)
    assert half.storage.nbytes <= wide.storage.nbytes


def test_storage_precision_batches():
    data = _representable(random_step_data(WIDE, 20, np.random.default_rng(1)))
    buf = MultiAgentReplayBuffer(HALF, 32, batch_dtype="storage", seed=0)
    buf.extend(**data)
    batch = buf.gather(np.arange(20))
    assert batch.obs["p"].dtype == np.float16 and batch.action["q"].dtype == np.float16
    np.testing.assert_array_equal(batch.next_obs["q"].astype(np.float32), data["next_obs"]["q"])


@pytest.mark.parametrize("mode", ["add", "extend"])
def test_values_beyond_half_range_are_rejected(mode):
    buf = MultiAgentReplayBuffer(HALF, 8)
    data = random_step_data(WIDE, 2, np.random.default_rng(2))
    data["obs"]["q"][0, 1, 1] = 70000.0
    if mode == "add":
        data = {f: {a: x[0] for a, x in per.items()} for f, per in data.items()}
    with pytest.raises(
        ValueError, match=r"obs\['q'\] holds 70000, outside the range of the stored float16"
    ):
        getattr(buf, mode)(**data)
    assert len(buf) == 0


def test_half_nan_is_rejected_by_the_fast_path():
    buf = MultiAgentReplayBuffer(HALF, 8)
    data = random_step_data(WIDE, 1, np.random.default_rng(3))
    step = {f: {a: x[0] for a, x in per.items()} for f, per in data.items()}
    step["next_obs"]["p"] = np.array([0, 0, np.inf, 0, 0], dtype=np.float16)
    with pytest.raises(ValueError, match=r"next_obs\['p'\] contains NaN or inf"):
        buf.add(**step)


def test_half_rows_halve_the_observation_bytes():
    specs = {f"agent_{i}": AgentSpec(obs_shape=(144,), action_shape=(5,)) for i in range(24)}
    half = {a: AgentSpec((144,), (5,), obs_dtype=np.float16) for a in specs}
    dense = MultiAgentReplayBuffer(specs, 10, next_obs="stored")
    lean = MultiAgentReplayBuffer(half, 10)
    assert lean.storage.table.nbytes / dense.storage.table.nbytes < 0.27
