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


@pytest.mark.parametrize("width", [1, 3, 8, 9, 37, 72])
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("ahead, lines", [(1, 1), (4, 16)])
def test_gather_words_matches_naive(width, streaming, ahead, lines):
    """Random rows, runs of consecutive slots (one span each), a run ending at the last slot
    (no wrap into slot 0), rows of zeros (-1), every row width around a line, both store
    kinds, into a block that starts off a line boundary as well as on one."""
    from marlbuf._kernels import gather_words

    capacity = 50
    rng = np.random.default_rng(width)
    table = rng.integers(0, 2**63, (capacity, width), dtype=np.uint64)
    runs = [np.arange(5, 17), [capacity - 3, capacity - 2, capacity - 1, 0, 1], [-1, -1]]
    idx = np.concatenate([rng.integers(0, capacity, 20), *runs, [3, -1, 4, 5]]).astype(np.int64)
    raw = np.full(idx.shape[0] * width + 8, 7, np.uint64)
    for skip in (0, 1, 3):
        out = raw[skip : skip + idx.shape[0] * width].reshape(idx.shape[0], width)
        out[:] = 7
        gather_words(table, idx, out, ahead, lines, streaming)
        np.testing.assert_array_equal(out, naive.gather_rows_or_zeros(table, idx))
    gather_words(table, idx[:0], out[:0], ahead, lines, streaming)  # an empty batch


@pytest.mark.parametrize("streaming", [False, True])
def test_word_spans_match_slices(streaming):
    """The span copies of every length up to three lines, at every source and destination
    phase within a line: exactly the slice assignment, nothing outside it written."""
    from numba import njit

    from marlbuf._kernels.memops import move_words

    @njit
    def move(dst, dst0, src, src0, count, stream):
        move_words(dst, np.uint64(dst0), src, np.uint64(src0), np.uint64(count), stream)

    src = np.arange(1, 65, dtype=np.uint64)
    for count in range(25):
        for src0 in range(8):
            for dst0 in range(8):
                dst = np.zeros(40, np.uint64)
                move(dst, dst0, src, src0, count, streaming)
                expected = np.zeros(40, np.uint64)
                expected[dst0 : dst0 + count] = src[src0 : src0 + count]
                np.testing.assert_array_equal(dst, expected)


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


@pytest.mark.parametrize("half", [False, True])
def test_first_nonfinite_reports_the_first_segment_not_the_first_row(half):
    # a bad value in a later segment of an earlier row: the scan goes row by row, the answer
    # is still the lowest segment with a bad value, as the segment-by-segment naive scan says
    from marlbuf._kernels import first_nonfinite, first_nonfinite_half

    rng = np.random.default_rng(11)
    dtype = np.float16 if half else np.float32
    starts = np.array([0, 6, 9, 20], np.int64)
    counts = np.array([6, 3, 11, 4], np.int64)
    for seed in range(20):
        values = rng.standard_normal((9, 24)).astype(dtype)
        bad = np.random.default_rng(seed).integers(0, [9, 24], size=(seed % 4, 2))
        for row, col in bad:
            values[row, col] = (np.nan, np.inf, -np.inf)[(row + col) % 3]
        if half:
            got = first_nonfinite_half(values.view(np.uint16), starts, counts)
        else:
            got = first_nonfinite(values, starts, counts)
        assert got == naive.first_nonfinite(values, starts, counts), (seed, bad)


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
    """Every segment kind, from the row itself and from the successor or the side table; spans
    shorter than a vector and longer (float16 widened 16 at a time, the last vector
    overlapping), every half bit pattern class (subnormals, infinities, NaN payloads)."""
    from marlbuf._kernels import HALF_TO_FLOAT_BITS, gather_plan
    from marlbuf._kernels.plan import COPY8, COPY32, COPY64, HALF_TO_FLOAT

    rng = np.random.default_rng(0)
    table = rng.integers(0, 256, size=(20, 256), dtype=np.uint8)
    table.view(np.float16)[:, 20:28] = rng.standard_normal((20, 8)).astype(np.float16)
    side = rng.integers(0, 256, size=(4, 256), dtype=np.uint8)
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
        (HALF_TO_FLOAT, 40, 37, 4, 0),  # random bits: every class of half, NaNs included
        (HALF_TO_FLOAT, 61, 16, 4, 1),
        (COPY64, 12, 17, 8, 0),
    ]
    plan, offset, row_bytes = [], 0, 512
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
    # the blocked kernel the storages run: the same plan, the same bytes, any block size and
    # prefetch distance, into a block on a line boundary or off it
    from marlbuf._kernels import gather_segments

    raw = np.zeros(total + 64, dtype=np.uint8)
    for block_rows, ahead, skip in ((1, 1, 0), (4, 3, 8), (64, 8, 0)):
        start = (-raw.ctypes.data) % 64 + skip
        fast = raw[start : start + total]
        fast[:] = 0
        gather_segments(
            table.view(np.uint64), side.view(np.uint64), idx, next_slot, side_row, *plan_arr,
            HALF_TO_FLOAT_BITS, fast.view(np.uint64), fast.view(np.uint32), fast, block_rows,
            ahead, 16,
        )  # fmt: skip
        np.testing.assert_array_equal(fast, expected, err_msg=f"block_rows={block_rows}")
    # the row-by-row kernel of rows batches: the same bytes, with links and float16
    from marlbuf._kernels import gather_spans

    for ahead, streaming, skip in ((1, False, 0), (3, True, 8), (8, True, 0)):
        start = (-raw.ctypes.data) % 64 + skip
        fast = raw[start : start + total]
        fast[:] = 0
        gather_spans(
            table.view(np.uint64), side.view(np.uint64), idx, next_slot, side_row, *plan_arr,
            HALF_TO_FLOAT_BITS, fast.view(np.uint64), fast.view(np.uint32), fast,
            ahead, 16, streaming,
        )  # fmt: skip
        np.testing.assert_array_equal(fast, expected, err_msg=f"gather_spans ahead={ahead}")


@pytest.mark.parametrize("f16c", [True, False])
@pytest.mark.parametrize("streaming", [False, True])
def test_widen_span_is_astype_for_every_half(monkeypatch, f16c, streaming):
    """The vector widening equals NumPy's ``astype(np.float32)`` for all 65,536 float16 bit
    patterns (NaN payloads, signalling ones included; subnormals; zeros of both signs), with
    F16C conversions and with the integer arithmetic used where the CPU has none, at every
    length up to three vectors and every phase of the destination within a line."""
    from numba import njit

    from marlbuf._kernels import HALF_TO_FLOAT_BITS, memops

    if f16c and not memops._has_f16c():
        pytest.skip("this CPU has no F16C")
    monkeypatch.setattr(memops, "_has_f16c", lambda: f16c)

    @njit  # compiled here, after the patch: the intrinsic picks its conversion at compile time
    def widen(dst, dst0, src, src0, count, stream):
        memops.widen_span(
            dst, np.uint64(dst0), src, np.uint64(src0), np.uint64(count), HALF_TO_FLOAT_BITS,
            stream,
        )  # fmt: skip

    halves = np.arange(1 << 16, dtype=np.uint16)
    want = halves.view(np.float16).astype(np.float32).view(np.uint32)
    got = np.zeros(1 << 16, dtype=np.uint32)
    widen(got, 0, halves, 0, halves.shape[0], streaming)
    np.testing.assert_array_equal(got, want)
    source = halves[np.random.default_rng(3).permutation(1 << 16)[:64]]
    for count in range(50):
        for dst0 in range(16):
            out = np.zeros(80, dtype=np.uint32)
            widen(out, dst0, source, 5, count, streaming)
            expected = np.zeros(80, dtype=np.uint32)
            expected[dst0 : dst0 + count] = (
                source[5 : 5 + count].view(np.float16).astype(np.float32).view(np.uint32)
            )
            np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("rows_output", [True, False])
def test_gather_spans_matches_naive(rows_output):
    """The direct kernel of field selections: copies of every width out of the row itself,
    rows or per-segment outputs, masked rows (-1) zero, against the naive plan interpreter."""
    from marlbuf._kernels import HALF_TO_FLOAT_BITS, gather_spans
    from marlbuf._kernels.plan import COPY8, COPY32, COPY64

    rng = np.random.default_rng(1)
    table = rng.integers(0, 256, size=(30, 96), dtype=np.uint8)
    no_links = np.zeros(0, dtype=np.int64)
    idx = rng.integers(0, 30, size=11).astype(np.int64)
    idx[[0, 6]] = -1
    n = idx.shape[0]
    # (kind, src units, length units, unit bytes)
    segments = [(COPY64, 1, 3, 8), (COPY32, 9, 5, 4), (COPY8, 71, 3, 1), (COPY64, 10, 1, 8)]
    plan, offset, row_bytes = [], 0, 96
    for kind, src, length, unit in segments:
        nbytes = length * unit
        if rows_output:
            plan.append((kind, src, offset // unit, length, row_bytes // unit, 0))
            offset += -(-nbytes // 8) * 8
        else:
            plan.append((kind, src, offset // unit, length, length, 0))
            offset += -(-n * nbytes // 8) * 8
    plan_arr = np.array(plan, dtype=np.int64).T.copy()
    total = n * row_bytes if rows_output else offset
    expected = naive.gather_plan(table, table[:1], idx, no_links, no_links, plan_arr, total)
    out = np.full(total, 7, dtype=np.uint8)  # bytes outside the segments are left alone
    side = np.zeros((1, 1), dtype=np.uint64)
    gather_spans(
        table.view(np.uint64), side, idx, no_links, no_links, *plan_arr, HALF_TO_FLOAT_BITS,
        out.view(np.uint64), out.view(np.uint32), out, 2, 16, False,
    )  # fmt: skip
    written = np.zeros(total, dtype=bool)
    ones = naive.gather_plan(
        np.ones_like(table), table[:1], np.zeros_like(idx), no_links, no_links, plan_arr, total
    )
    written[ones != 0] = True
    np.testing.assert_array_equal(out[written], expected[written])
    assert (out[~written] == 7).all()


@pytest.mark.parametrize(
    "obs_shape, obs_dtype",
    [((18,), np.float32), ((7,), np.float32), ((5,), np.uint8), ((3,), np.float64)],
)
@pytest.mark.parametrize("ahead, lines, streaming", [(1, 1, False), (13, 16, False), (3, 2, True)])
def test_gather_lean_rows_matches_naive(obs_shape, obs_dtype, ahead, lines, streaming):
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
        *storage._lean_rows_args, out, ahead, lines, streaming,
    )  # fmt: skip
    expected = naive.gather_lean_rows(
        storage.table, links.side, idx, links.next_slot, links.side_row, storage.codec
    )
    np.testing.assert_array_equal(out, expected)
    dense_rows = np.where(idx[:, None] >= 0, dense.storage.table[np.maximum(idx, 0)], 0)
    np.testing.assert_array_equal(out, dense_rows)


# ------------------------------------------------------------------ one-step writes (fast add)
def _step_specs(kind: str) -> dict[str, AgentSpec]:
    """Specs for the one-step kernels: discrete agents with flat observations, observations of
    different shapes (one 2-D, sections ending inside a word), float64 storage, continuous
    actions."""
    if kind == "discrete":
        return {f"a{i}": AgentSpec(obs_shape=(6,), action_shape=(5,), n_discrete_actions=5)
                for i in range(3)}  # fmt: skip
    if kind == "shapes":
        return {
            "a": AgentSpec(obs_shape=(5,), action_shape=(4,), n_discrete_actions=4),
            "b": AgentSpec(obs_shape=(2, 3), action_shape=(2,)),
        }
    if kind == "float64":
        f8 = np.float64
        return {
            f"a{i}": AgentSpec(
                obs_shape=(3,), action_shape=(3,), n_discrete_actions=3, obs_dtype=f8,
                action_dtype=f8, reward_dtype=f8, done_dtype=f8,
            )
            for i in range(2)
        }  # fmt: skip
    return {"solo": AgentSpec(obs_shape=(7,), action_shape=(2,))}


def _step_items(specs, rng, case: str):
    """One step's per-field tuples (agent order) for the case ``case``."""
    agents = list(specs)

    def obs_of(spec):
        return rng.standard_normal(spec.obs_shape).astype(spec.obs_dtype)

    def action_of(spec):
        if spec.n_discrete_actions:
            return int(rng.integers(spec.n_discrete_actions))
        return rng.standard_normal(spec.action_shape).astype(np.float32)

    obs = [obs_of(specs[a]) for a in agents]
    nxt = [obs_of(specs[a]) for a in agents]
    act = [action_of(specs[a]) for a in agents]
    rew = [float(rng.standard_normal()) for _ in agents]
    done = [bool(rng.random() < 0.5) for _ in agents]
    spec = specs[agents[0]]
    discrete = bool(spec.n_discrete_actions)
    if case == "mixed types":  # a field's items of different types
        rew[0] = np.float32(rew[0])
        done[0] = np.float32(1.0)
        if len(agents) > 1:
            done[1] = 1
        if discrete:
            act[0] = np.int64(act[0])
        obs[0] = obs[0].astype(np.float64)
    elif case == "int and bool arrays":
        obs = [np.ones(specs[a].obs_shape, dtype=np.int16) for a in agents]
        nxt = [np.zeros(specs[a].obs_shape, dtype=bool) for a in agents]
    elif case == "strided and read-only":
        obs = [np.repeat(x, 2).reshape(*x.shape, 2)[..., 0] for x in obs]
        for x in nxt:
            x.flags.writeable = False
    elif case == "one-hot arrays" and discrete:
        n = spec.n_discrete_actions
        act[0] = np.eye(n, dtype=np.float32)[act[0]]
    elif case == "nan obs":
        obs[-1].reshape(-1)[0] = np.nan
    elif case == "inf next_obs":
        nxt[0].reshape(-1)[-1] = -np.inf
    elif case == "beyond float32":
        obs[0] = obs[0].astype(np.float64)
        obs[0].reshape(-1)[0] = 3.4028236e38  # finite in float64, beyond the float32 maximum
    elif case == "huge reward":
        rew[0] = 1e300
    elif case == "nan done":
        done[-1] = float("nan")
    elif case == "action out of range" and discrete:
        act[0] = spec.n_discrete_actions
    elif case == "negative action" and discrete:
        act[0] = -1
    elif case == "bool action" and discrete:
        act[0] = True
    elif case == "float action" and discrete:
        act[0] = 1.0
    elif case == "wrong shape":
        nxt[0] = np.zeros(nxt[0].size + 1, np.float32)
    elif case == "wrong ndim":
        obs[0] = obs[0].reshape(1, -1)
    elif case == "float16 obs":
        obs[0] = obs[0].astype(np.float16)
    elif case == "0-d reward":
        rew[0] = np.array(1.5)
    elif case == "0-d action and done" and discrete:
        act[0] = np.array(act[0])
        done[0] = np.array(done[0])
    elif case == "numpy scalars":
        rew = [np.float64(r) for r in rew]
        done = [np.bool_(d) for d in done]
        if discrete:
            act = [np.int64(a) for a in act]
    elif case == "complex reward":
        rew[0] = 1 + 2j
    elif case == "unsigned action" and discrete:
        act[0] = np.uint8(act[0])
    return tuple(obs), tuple(act), tuple(rew), tuple(nxt), tuple(done)


STEP_CASES = [
    "plain", "mixed types", "int and bool arrays", "strided and read-only", "one-hot arrays",
    "nan obs", "inf next_obs", "beyond float32", "huge reward", "nan done",
    "action out of range", "negative action", "bool action", "float action", "wrong shape",
    "wrong ndim", "float16 obs", "0-d reward", "0-d action and done", "numpy scalars",
    "complex reward", "unsigned action",
]  # fmt: skip


@pytest.mark.parametrize("kind", ["discrete", "shapes", "float64", "solo"])
@pytest.mark.parametrize("case", STEP_CASES)
def test_stage_step_matches_naive(kind, case):
    """The one-step staging kernel takes exactly what its twin takes (shapes, dtypes, finite and
    in range, discrete actions in range), writes the same row, and leaves the row untouched
    when it declines."""
    from marlbuf._kernels import stage_step
    from marlbuf.staging import RowCodec

    specs = _step_specs(kind)
    step = RowCodec(specs).step_plan
    assert step is not None
    rng = np.random.default_rng(STEP_CASES.index(case))
    items = _step_items(specs, rng, case)
    row = rng.standard_normal(step.row.shape).astype(step.row.dtype)  # not zeros: untouched?
    taken, expected = naive.stage_step(items, row, step.plan)
    if case == "float16 obs":  # Numba types float16 arrays but cannot compile them
        with pytest.raises(NotImplementedError):
            stage_step(*items, row, step.plan)
        assert not taken
        return
    assert stage_step(*items, row, step.plan) == taken
    np.testing.assert_array_equal(row, expected)
    if case in (
        "plain", "mixed types", "int and bool arrays", "strided and read-only", "0-d reward",
        "0-d action and done", "numpy scalars",
    ):  # fmt: skip
        assert taken  # the common cases are taken


def _leading(items, case: str):
    """``items`` as a one-step extend passes them: every item with a leading axis of 1 (two
    rows for the case ``"two rows"``)."""
    rows = 2 if case == "two rows" else 1
    return tuple(
        tuple(np.repeat(np.asarray(x)[None], rows, axis=0) for x in field) for field in items
    )


@pytest.mark.parametrize("kind", ["discrete", "shapes", "float64", "solo"])
@pytest.mark.parametrize("case", [*STEP_CASES, "two rows"])
def test_stage_leading_step_matches_naive(kind, case):
    """The one-step kernels of a one-step extend (every item with a leading axis of length 1)
    take what the twin takes on the items' first rows, write the same row, and decline an
    item of more than one row."""
    from marlbuf._kernels import stage_leading_step
    from marlbuf.staging import RowCodec

    specs = _step_specs(kind)
    step = RowCodec(specs).step_plan
    assert step is not None
    rng = np.random.default_rng(len(STEP_CASES) + [*STEP_CASES, "two rows"].index(case))
    items = _leading(_step_items(specs, rng, "plain" if case == "two rows" else case), case)
    row = rng.standard_normal(step.row.shape).astype(step.row.dtype)
    taken, expected = naive.stage_step(items, row, step.plan, leading=True)
    if case == "float16 obs":
        with pytest.raises(NotImplementedError):
            stage_leading_step(*items, row, step.plan)
        assert not taken
        return
    assert stage_leading_step(*items, row, step.plan) == taken
    np.testing.assert_array_equal(row, expected)
    if case in ("plain", "mixed types", "int and bool arrays", "0-d reward", "numpy scalars"):
        assert taken  # the common cases are taken
    if case == "two rows":
        assert not taken


def _link_state(capacity, obs_bytes, rng):
    """Links with a few side rows in use and a free stack (as NextObsLinks keeps them)."""
    from marlbuf.writer import NextObsLinks

    links = NextObsLinks(capacity, obs_bytes, initial_rows=8)
    used = [3, 5, 1]
    links.free = [r for r in range(8) if r not in used]
    links.side[:] = rng.integers(0, 256, links.side.shape, dtype=np.uint8)
    links.side_row[[2, 4, 6]] = used  # slots 2, 4, 6 hold side rows
    links.next_slot[[1, 3]] = [2, 4]
    return links


@pytest.mark.parametrize("kind", ["discrete", "shapes", "solo"])
@pytest.mark.parametrize(
    ("slot", "prev", "prev_generation", "same"),
    [
        (7, -1, -1, False),  # the stream's first step
        (7, 6, 60, True),  # links back: the previous next_obs is this obs
        (7, 6, 60, False),  # an episode boundary: no link
        (7, 6, 59, True),  # the previous slot was overwritten since
        (6, 6, 60, True),  # ... by this very write
        (4, 2, 20, True),  # the slot held a side row (reused), the link frees another
        (4, 2, 20, False),
    ],
)
def test_store_steps_match_naive(kind, slot, prev, prev_generation, same):
    """Stored straight into the table: the dense row (padding zeroed), or the lean row plus the
    link update and the side row, and the write generation; as the twins (staging row, lean
    conversion, the Python link update) and as the staged-row kernels."""
    from marlbuf._kernels import (
        commit_dense_step,
        commit_lean_step,
        store_dense_step,
        store_lean_step,
    )
    from marlbuf.staging import RowCodec

    specs = _step_specs(kind)
    codec = RowCodec(specs)
    step = codec.step_plan
    assert step is not None
    rng = np.random.default_rng(slot * 10 + prev + 3 * same)
    items = _step_items(specs, rng, "plain")
    capacity = 10
    generations = np.arange(capacity, dtype=np.int64) * 10
    staged = np.zeros(step.row.shape, step.row.dtype)
    assert naive.stage_step(items, staged, step.plan)[0]
    _, staged = naive.stage_step(items, staged, step.plan)
    dense = staged.view(np.uint8)

    # dense: the staged row, padding included, and the generation
    table = rng.integers(0, 2**63, (capacity, codec.row_words), dtype=np.int64).view(np.uint64)
    wg = generations.copy()
    twin_table, twin_wg = table.copy(), wg.copy()
    assert store_dense_step(*items, step.plan, step.dense_gaps, table.view(step.dtype),
                            slot, 99, wg)  # fmt: skip
    twin_table[slot] = dense.view(np.uint64)
    twin_wg[slot] = 99
    np.testing.assert_array_equal(table, twin_table)
    np.testing.assert_array_equal(wg, twin_wg)
    again, wg2 = rng.integers(0, 9, table.shape).astype(np.uint64), generations.copy()
    commit_dense_step(again, dense.view(np.uint64), slot, 99, wg2)
    np.testing.assert_array_equal(again[slot], twin_table[slot])
    np.testing.assert_array_equal(wg2, twin_wg)

    # lean: the lean row, the links, the side row, the free stack
    links = _link_state(capacity, codec.obs_bytes, rng)
    if prev >= 0 and links.side_row[prev] < 0:
        links.side_row[prev] = links.free.pop()
    if prev >= 0:
        held = links.side_row[prev]
        links.side[held, : codec.obs_bytes] = dense[: codec.obs_bytes]  # this step's obs
        if not same:
            links.side[held, codec.obs_bytes // 2] ^= 1
    lean_table = rng.integers(0, 2**63, (capacity, codec.lean_row_bytes // 8), dtype=np.int64)
    lean_table = lean_table.view(np.uint64)
    twin_side, twin_next, twin_row, twin_free = naive.link_step(
        dense, slot, codec.obs_bytes, codec.next_obs_start, links.side, links.next_slot,
        links.side_row, generations, prev, prev_generation, links.free,
    )  # fmt: skip
    twin_lean = lean_table.copy()
    twin_lean[slot] = naive.lean_row(dense, codec).view(np.uint64)
    for kernel in ("store", "commit"):
        trial = _link_state(capacity, codec.obs_bytes, np.random.default_rng(0))
        for key in ("side", "next_slot", "side_row"):
            getattr(trial, key)[...] = getattr(links, key)
        trial.free = list(links.free)
        out, wg = lean_table.copy(), generations.copy()
        if kernel == "store":
            code = store_lean_step(
                *items, step.plan, step.lean_gaps, out.view(step.dtype), slot, 99, wg,
                trial.side_words, trial.pointers, prev, prev_generation, trial.free[-1],
            )  # fmt: skip
        else:
            code = commit_lean_step(
                out, dense.view(np.uint64), slot, 99, wg, codec.lean_words, trial.side_words,
                trial.next_slot, trial.side_row, prev, prev_generation, trial.free[-1],
            )  # fmt: skip
        trial.apply_step_code(code)
        np.testing.assert_array_equal(out, twin_lean)
        assert wg[slot] == 99 and np.array_equal(np.delete(wg, slot), np.delete(generations, slot))
        np.testing.assert_array_equal(trial.next_slot, twin_next)
        np.testing.assert_array_equal(trial.side_row, twin_row)
        assert trial.free == twin_free
        assert trial.side.tobytes() == twin_side.tobytes()  # bytes past obs_bytes untouched


@pytest.mark.parametrize("obs_shape", [(4,), (5,)])  # sections ending on a word / inside one
def test_link_rows_kernels_match_naive(obs_shape):
    """extend's link kernels: which consecutive rows link (next_obs section == next obs
    section), the side rows the overwritten slots release, and the links and side rows of the
    new rows."""
    from marlbuf._kernels import link_rows, next_is_obs, release_slots
    from marlbuf.staging import RowCodec

    specs = {f"a{i}": AgentSpec(obs_shape=obs_shape, action_shape=(2,)) for i in range(3)}
    codec = RowCodec(specs)
    rng = np.random.default_rng(obs_shape[0])
    n = 12
    rows = rng.integers(0, 2**63, (n, codec.row_words), dtype=np.int64).view(np.uint64)
    raw = rows.view(np.uint8)
    start, size = codec.next_obs_start, codec.obs_bytes
    for t in (0, 1, 2, 5, 6, 9):  # these link to their successor
        raw[t, start : start + size] = raw[t + 1, :size]
    raw[3, start + size - 1] = raw[4, size - 1] ^ 1  # differs in the last byte only
    same = np.ones(n - 1, dtype=bool)
    needed = next_is_obs(rows, size, start // 8, same)
    twin = naive.next_is_obs(raw, size, start)
    np.testing.assert_array_equal(same, twin)
    assert needed == n - int(twin.sum()) == 6

    capacity = 16
    pointers = np.full((2, capacity), -1, dtype=np.int64)
    pointers[1, [3, 8, 14]] = [0, 2, 1]
    pointers[0, [4, 9]] = [5, 10]
    slots = (np.arange(n, dtype=np.int64) + 7) % capacity  # wraps: 7..15, 0..2
    released = np.empty(n, dtype=np.int64)
    count = release_slots(slots, pointers, released)
    assert sorted(released[:count].tolist()) == [1, 2]  # what slots 8 and 14 held
    assert (pointers[:, slots] == -1).all() and pointers[1, 3] == 0 and pointers[0, 4] == 5

    side = rng.integers(0, 256, (8, -(-size // 8) * 8), dtype=np.uint8)
    twin_side = side.copy()
    side_rows = np.array([6, 4, 7, 1, 2, 5], dtype=np.int64)
    link_rows(rows, slots, same, side_rows, side.view(np.uint64), pointers, size, start // 8)
    j = 0
    for t in range(n):
        if t < n - 1 and twin[t]:
            assert pointers[0, slots[t]] == slots[t + 1] and pointers[1, slots[t]] == -1
            continue
        assert pointers[0, slots[t]] == -1 and pointers[1, slots[t]] == side_rows[j]
        twin_side[side_rows[j], :size] = raw[t, start : start + size]
        j += 1
    assert side.tobytes() == twin_side.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_bad_action_matches_naive(dtype):
    from marlbuf._kernels.actions import first_bad_action

    rng = np.random.default_rng(7)
    columns = np.array([2, 3, 4, 8, 9], dtype=np.intp)
    starts = np.array([0, 3], dtype=np.intp)
    limits = np.array([1e-3, 1e-3])
    for _ in range(200):
        rows = np.zeros((4, 12), dtype=dtype)
        for t in range(4):
            for lo, hi in ((2, 5), (8, 10)):
                p = rng.random(hi - lo)
                rows[t, lo:hi] = p / p.sum()
        if rng.random() < 0.7:  # one damaged action: out of range, or not summing to 1
            t, c = int(rng.integers(4)), int(rng.choice(columns))
            rows[t, c] = rng.choice([-0.25, 1.5, rows[t, c] + 0.3, 0.0])
        assert first_bad_action(rows, columns, starts, limits) == naive.first_bad_action(
            rows, columns, starts, limits
        )


def test_judge_update_matches_naive():
    from marlbuf._kernels.drawn import judge_update

    rng = np.random.default_rng(8)
    current = rng.integers(0, 100, 50).astype(np.int64)
    for _ in range(200):
        idx = rng.integers(0, 50, 16).astype(np.int64)
        gens = np.where(rng.random(16) < 0.7, current[idx], current[idx] - 1)
        as_drawn = idx.copy() if rng.random() < 0.5 else rng.permutation(idx)
        if rng.random() < 0.3:
            as_drawn = np.zeros(0, dtype=np.int64)
        stale = np.empty(16, dtype=np.bool_)
        ok = judge_update(idx, as_drawn, gens, current, stale)
        want = naive.judge_update(idx, as_drawn, gens, current)
        assert ok == (want is not None)
        if ok:
            np.testing.assert_array_equal(stale, want)
