"""Row kernels against their NumPy twins in tests/naive.py."""

from __future__ import annotations

import naive
import numpy as np
import pytest

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf._kernels import gather_rows, neighbor_indices, scatter_rows


@pytest.mark.parametrize("dtype", [np.uint64, np.float32, np.float64, np.int16])
@pytest.mark.parametrize(("capacity", "width", "batch"), [(1, 1, 1), (7, 3, 20), (100, 37, 64)])
def test_gather_rows_matches_naive(dtype, capacity, width, batch):
    rng = np.random.default_rng(capacity * width)
    table = (rng.random((capacity, width)) * 1000).astype(dtype)
    idx = rng.integers(0, capacity, batch)
    out = np.empty((batch, width), dtype)
    gather_rows(table, idx, out)
    np.testing.assert_array_equal(out, naive.gather_rows(table, idx))


def test_gather_rows_empty_batch():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = np.empty((0, 3), np.float32)
    gather_rows(table, np.empty(0, np.int64), out)
    assert out.shape == (0, 3)


@pytest.mark.parametrize("n", [1, 5, 30])
def test_scatter_rows_matches_naive_including_duplicates(n):
    rng = np.random.default_rng(n)
    table = rng.random((10, 4))
    slots = rng.integers(0, 10, n)  # duplicates: the later row wins
    rows = rng.random((n, 4))
    expected = naive.scatter_rows(table, slots, rows)
    scatter_rows(table, slots, rows)
    np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize(("run_length", "capacity"), [(1, 5), (4, 10), (16, 16), (64, 100)])
def test_neighbor_indices_wraps_like_naive(run_length, capacity):
    rng = np.random.default_rng(run_length)
    refs = rng.integers(0, capacity, 7)
    out = np.empty(7 * run_length, np.int64)
    neighbor_indices(refs, run_length, capacity, out)
    np.testing.assert_array_equal(out, naive.neighbor_indices(refs, run_length, capacity))
    assert out.min() >= 0 and out.max() < capacity


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_first_nonfinite_matches_naive(dtype, bad):
    from marlbuf._kernels import first_nonfinite

    rng = np.random.default_rng(7)
    values = rng.standard_normal((5, 40)).astype(dtype)
    values[2, 31] = 3e38 if dtype == np.float32 else 1e308  # large but finite
    starts = np.array([0, 10, 25, 30], np.int64)
    counts = np.array([10, 5, 5, 10], np.int64)
    if bad is not None:
        values[4, 27] = bad  # inside segment 2
    got = first_nonfinite(values, starts, counts)
    assert got == naive.first_nonfinite(values, starts, counts)
    assert got == (-1 if bad is None else 2)


@pytest.mark.parametrize(("capacity", "width", "batch"), [(1, 1, 1), (100, 37, 64), (50, 600, 200)])
def test_gather_rows_parallel_matches_naive(capacity, width, batch):
    from marlbuf._kernels import gather_rows_parallel

    rng = np.random.default_rng(width)
    table = rng.integers(0, 2**60, (capacity, width), dtype=np.uint64)
    idx = rng.integers(0, capacity, batch)
    out = np.empty((batch, width), np.uint64)
    gather_rows_parallel(table, idx, out)
    np.testing.assert_array_equal(out, naive.gather_rows(table, idx))


@pytest.mark.parametrize("rows_output", [True, False])
def test_gather_plan_matches_naive(rows_output):
    """Every segment kind, from the row itself and from the successor or the side table."""
    from marlbuf._kernels import HALF_TO_FLOAT_BITS, gather_plan
    from marlbuf._kernels.plan import COPY8, COPY32, COPY64, HALF_TO_FLOAT

    rng = np.random.default_rng(0)
    table = rng.integers(0, 256, size=(20, 64), dtype=np.uint8)
    table.view(np.float16)[:, 20:28] = rng.standard_normal((20, 8)).astype(np.float16)
    side = rng.integers(0, 256, size=(4, 64), dtype=np.uint8)
    next_slot = np.where(rng.random(20) < 0.3, -1, (np.arange(20) + 1) % 20).astype(np.int64)
    side_row = np.where(next_slot < 0, rng.integers(0, 4, 20), -1).astype(np.int64)
    idx = rng.integers(0, 20, size=9).astype(np.int64)
    idx[[2, 7]] = -1  # masked sequence steps: every segment zero
    n = idx.shape[0]
    # (kind, src units, length units, unit bytes of the destination, from_next)
    segments = [
        (COPY64, 0, 2, 8, 0),
        (COPY32, 5, 3, 4, 0),
        (COPY8, 33, 5, 1, 0),
        (HALF_TO_FLOAT, 20, 8, 4, 0),
        (COPY64, 1, 3, 8, 1),
        (HALF_TO_FLOAT, 22, 4, 4, 1),
    ]
    plan, offset, row_bytes = [], 0, 128
    for kind, src, length, unit, nxt in segments:
        nbytes = length * unit
        if rows_output:  # one row of row_bytes per gathered row
            plan.append((kind, src, offset // unit, length, row_bytes // unit, nxt))
            offset += -(-nbytes // 8) * 8
        else:  # per segment, n contiguous runs
            plan.append((kind, src, offset // unit, length, length, nxt))
            offset += -(-n * nbytes // 8) * 8
    plan_arr = np.array(plan, dtype=np.int64).T.copy()
    total = n * row_bytes if rows_output else offset
    out = np.zeros(total, dtype=np.uint8)
    gather_plan(
        table.view(np.uint64), table.view(np.uint32), table.view(np.uint16), table,
        side.view(np.uint64), side.view(np.uint32), side.view(np.uint16), side,
        idx, next_slot, side_row, *plan_arr, HALF_TO_FLOAT_BITS,
        out.view(np.uint64), out.view(np.uint32), out,
    )  # fmt: skip
    expected = naive.gather_plan(table, side, idx, next_slot, side_row, plan_arr, total)
    np.testing.assert_array_equal(out, expected)
    # the blocked kernel the storages run: the same plan, the same bytes, any block size
    from marlbuf._kernels import gather_segments

    for block_rows in (1, 4, 64):
        fast = np.zeros(total, dtype=np.uint8)
        gather_segments(
            table.view(np.uint64), side.view(np.uint64), idx, next_slot, side_row, *plan_arr,
            HALF_TO_FLOAT_BITS, fast.view(np.uint64), fast.view(np.uint32), fast, block_rows,
        )  # fmt: skip
        np.testing.assert_array_equal(fast, expected, err_msg=f"block_rows={block_rows}")


@pytest.mark.parametrize(
    "obs_shape, obs_dtype",
    [((18,), np.float32), ((7,), np.float32), ((5,), np.uint8), ((3,), np.float64)],
)
def test_gather_lean_rows_matches_naive(obs_shape, obs_dtype):
    """The default gather against its twin and against the dense format: successor rows, side
    rows (episode ends and independent steps), two streams, wraparound, masked steps (-1), and
    sections that end on a word or inside one."""
    from marlbuf._kernels import gather_lean_rows

    specs = {
        f"a{i}": AgentSpec(obs_shape=obs_shape, action_shape=(3,), obs_dtype=obs_dtype)
        for i in range(3)
    }
    capacity = 40
    lean = MultiAgentReplayBuffer(specs, capacity, next_obs="once", seed=0)
    dense = MultiAgentReplayBuffer(specs, capacity, next_obs="stored", seed=0)
    rng = np.random.default_rng(len(obs_shape) + obs_shape[0])

    def draw(*shape):
        if np.dtype(obs_dtype).kind == "u":
            return rng.integers(0, 4, shape).astype(obs_dtype)
        return rng.standard_normal(shape).astype(obs_dtype)

    current = {s: {a: draw(*obs_shape) for a in specs} for s in (0, 1)}
    for step in range(3 * capacity // 2):  # wraps around the ring
        stream = step % 2
        ends = step % 7 == 6
        nxt = {a: draw(*obs_shape) for a in specs}
        for buf in (lean, dense):
            buf.add(
                obs=current[stream],
                action={a: np.zeros(3, np.float32) + step for a in specs},
                reward={a: float(step) for a in specs},
                next_obs=nxt,
                done={a: ends for a in specs},
                stream=stream,
            )
        current[stream] = {a: draw(*obs_shape) for a in specs} if ends else nxt
    links = lean.links
    assert (links.next_slot >= 0).any() and (links.next_slot < 0).any()
    storage = lean.storage
    idx = np.concatenate([np.arange(capacity), [-1, 0, -1, capacity - 1]]).astype(np.int64)
    out = np.full((idx.shape[0], storage.batch_codec.row_words), 7, dtype=np.uint64)
    gather_lean_rows(
        storage.table, links.side.view(np.uint64), idx, links.next_slot, links.side_row,
        *storage._lean_rows_args, out,
    )  # fmt: skip
    expected = naive.gather_lean_rows(
        storage.table, links.side, idx, links.next_slot, links.side_row, storage.codec
    )
    np.testing.assert_array_equal(out, expected)
    dense_rows = np.where(idx[:, None] >= 0, dense.storage.table[np.maximum(idx, 0)], 0)
    np.testing.assert_array_equal(out, dense_rows)
