"""Every damage of a memory-mapped folder's redo log either is refused or opens with every row
holding the step its write generation names and every write that returned kept: the log cut at
every offset of its last three records (by truncation, or with the rest zeroed), every single
bit of those records flipped, a call killed while its record was being written cut at every
offset (which must open, without that call), and lost, emptied, zeroed and older logs after
clean and unclean closes. Folders are opened read-only (``mode="r"``: nothing is changed, the
same checks run), so one folder serves every case. The default run checks a sample of the
offsets and bits; ``pytest -m slow`` checks every one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer, mapped

SPECS = {
    "a": AgentSpec(obs_shape=(2,), action_shape=(1,)),
    "b": AgentSpec(obs_shape=(1,), action_shape=(2,), obs_dtype=np.float64),
}
CAPACITY = 24
#: the default run checks one offset (or bit) in this many
SAMPLE = 37


def steps(first: int, n: int) -> dict:
    """``n`` steps numbered from ``first``: every field holds its step number."""
    t = np.arange(first, first + n, dtype=np.float64)
    out: dict = {f: {} for f in FIELDS}
    for agent, spec in SPECS.items():
        out["obs"][agent] = np.repeat(t[:, None], spec.obs_shape[0], 1).astype(spec.obs_dtype)
        out["next_obs"][agent] = out["obs"][agent] + 1
        out["action"][agent] = np.repeat(t[:, None], spec.action_shape[0], 1).astype(np.float32)
        out["reward"][agent] = t.astype(np.float32)
        out["done"][agent] = np.zeros(n, np.float32)
    return out


def write(buf: MultiAgentReplayBuffer, first: int, calls: int) -> int:
    t = first
    for k in range(calls):
        n = (1, 3, 2, 5)[k % 4]
        if n == 1:
            buf.add(**{f: {a: x[0] for a, x in per.items()} for f, per in steps(t, 1).items()})
        else:
            buf.extend(**steps(t, n))
        t += n
    return t


def record_size(steps_: int) -> int:
    return mapped.RECORD_HEADER_BYTES + 8 * steps_ * ROW_WORDS + mapped.RECORD_TRAILER_BYTES


ROW_WORDS = MultiAgentReplayBuffer(SPECS, 2, next_obs="stored")._codec.row_words


def outcome(folder: Path, total: int) -> str:
    """``"refused"``, or ``"kept"`` after checking that the folder opens with ``total`` writes,
    every row holding its generation's step (an assertion error otherwise)."""
    try:
        buf = MultiAgentReplayBuffer.open(folder, mode="r")
    except ValueError:
        return "refused"
    with buf:
        assert buf.total_writes == total, f"{buf.total_writes} writes kept of {total}"
        size = len(buf)
        gens = buf.write_generation[:size]
        got = buf.gather(np.arange(size)).reward["a"]
        np.testing.assert_array_equal(got, gens.astype(np.float32), err_msg="wrong rows")
    return "kept"


@pytest.fixture(scope="module")
def died(tmp_path_factory) -> tuple[Path, int, list[tuple[int, int]]]:
    """A folder whose writer died after 9 calls (fewer steps than the capacity: a dropped
    record would not be written over), with ``(start, end)`` of its last three records."""
    folder = tmp_path_factory.mktemp("died") / "m"
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, path=folder, next_obs="stored", seed=0)
    total = write(buf, 0, 9)
    assert buf._mapped is not None
    end = buf._mapped._offset
    spans = []
    for n in ((1, 3, 2, 5) * 3)[:9][::-1][:3]:  # the last three calls, newest first
        spans.append((end - record_size(n), end))
        end -= record_size(n)
    buf._mapped.release()
    return folder, total, spans[::-1]


def _offsets(first: int, last: int, every: int) -> range:
    return range(first, last + 1, every)


#: every offset or bit (``slow``), or one in :data:`SAMPLE` (the default run)
EVERY = [pytest.param(1, marks=pytest.mark.slow, id="every"), pytest.param(SAMPLE, id="sample")]


@pytest.mark.parametrize("every", EVERY)
@pytest.mark.parametrize("zeroed", [False, True])
def test_a_log_cut_anywhere_in_its_last_records_is_refused(died, zeroed, every):
    folder, total, spans = died
    log = folder / mapped.LOG
    data = log.read_bytes()
    for cut in _offsets(spans[0][0], spans[-1][1] - 1, every):
        if zeroed:
            with open(log, "r+b") as fh:
                fh.seek(cut)
                fh.write(bytes(spans[-1][1] - cut))
        else:
            os.truncate(log, cut)
        try:
            assert outcome(folder, total) == "refused", f"cut at {cut}"
        finally:
            log.write_bytes(data)


@pytest.mark.parametrize("every", EVERY)
def test_every_flipped_bit_in_the_last_records_is_refused(died, every):
    folder, total, spans = died
    log = folder / mapped.LOG
    positions = [
        (byte, bit)
        for byte in range(spans[0][0], spans[-1][1])
        for bit in range(8)
        if (byte * 8 + bit) % every == 0
    ]
    with open(log, "r+b") as fh:
        for byte, bit in positions:
            fh.seek(byte)
            value = fh.read(1)[0]
            fh.seek(byte)
            fh.write(bytes([value ^ (1 << bit)]))
            fh.flush()
            try:
                assert outcome(folder, total) == "refused", f"bit {bit} of byte {byte}"
            finally:
                fh.seek(byte)
                fh.write(bytes([value]))
                fh.flush()


@pytest.mark.parametrize("every", EVERY)
def test_a_call_killed_while_logging_is_dropped_at_every_cut(tmp_path, every):
    """The record of a call in flight, cut at every offset (the rest never written, its stamps
    and rows not yet written): the folder opens with every call that returned."""
    folder = tmp_path / "m"
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, path=folder, next_obs="stored", seed=0)
    total = write(buf, 0, 6)
    store = buf._mapped
    assert store is not None and store._stamps is not None
    stamps = store._stamps.copy()
    start = store._offset
    rows, _ = buf._codec.stage(steps(total, 4), 4)
    store.log(rows, 4, 0)  # the record of a call that does not return
    store._stamps[:] = stamps  # killed before its stamps (and rows) were written
    end = store._offset
    store.release()
    log = folder / mapped.LOG
    data = log.read_bytes()
    for cut in range(start, end, every):
        with open(log, "r+b") as fh:
            fh.seek(cut)
            fh.write(bytes(end - cut))  # the rest of the record never written
        try:
            assert outcome(folder, total) == "kept", f"cut at {cut}"
        finally:
            log.write_bytes(data)
    assert outcome(folder, total + 4) == "kept"  # the whole record: the call is kept


def _clean(folder: Path) -> int:
    with MultiAgentReplayBuffer(SPECS, CAPACITY, path=folder, next_obs="stored", seed=0) as buf:
        return write(buf, 0, 7)


@pytest.mark.parametrize("damage", ["deleted", "emptied", "zeroed", "older"])
@pytest.mark.parametrize("history", ["closed", "died", "closed, reopened, died"])
def test_lost_emptied_zeroed_and_older_logs(tmp_path, damage, history):
    folder = tmp_path / "m"
    total = _clean(folder)
    older = (folder / mapped.LOG).read_bytes()  # the clean log close() left
    wrote = False
    if history == "died":
        shutil.rmtree(folder)
        buf = MultiAgentReplayBuffer(SPECS, CAPACITY, path=folder, next_obs="stored", seed=0)
        total = write(buf, 0, 3)
        older = (folder / mapped.LOG).read_bytes()
        total = write(buf, total, 4)
        assert buf._mapped is not None
        buf._mapped.release()
        wrote = True
    elif history != "closed":
        buf = MultiAgentReplayBuffer.open(folder)
        total = write(buf, total, 4)
        assert buf._mapped is not None
        buf._mapped.release()
        wrote = True
    log = folder / mapped.LOG
    if damage == "deleted":
        log.unlink()
    elif damage == "emptied":
        os.truncate(log, 0)
    elif damage == "zeroed":
        with open(log, "r+b") as fh:
            fh.write(bytes(mapped.LOG_HEADER_BYTES))
    else:
        log.write_bytes(older)
    result = outcome(folder, total)
    # writes since the checkpoint that nothing describes any more: refused; else kept
    assert result == ("refused" if wrote else "kept"), (history, damage, result)
