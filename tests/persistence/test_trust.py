"""Hostile and unlucky files: what ``save``/``load`` may replace or read, stream ids, clear
errors for bad input, and memory-mapped folders that are altered, shared, read-only or full.

Every test here reproduces a probe that the 0.3 code failed (a file replaced, a hang, a write
outside the folder, a raw NumPy or OS error)."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from marlbuf import MultiAgentReplayBuffer, _config, mapped, persistence
from marlbuf.samplers import Prioritized
from tests.persistence.encoded_steps import SPECS, check_consistent, encoded, killed_after, one_step

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX special files")


def _buffer(**kwargs) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0, **kwargs)
    buf.extend(**encoded(np.arange(5)))
    return buf


# ---------------------------------------------------------------------------- save targets
@posix_only
def test_save_never_replaces_links_folders_or_special_files(tmp_path):
    buf = _buffer()
    target = tmp_path / "real.npz"
    target.write_bytes(b"precious")
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.npz"
    dangling.symlink_to(tmp_path / "nowhere")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, match in (
        (link, "symbolic link"),
        (dangling, "symbolic link to .* which does not exist"),
        (fifo, "FIFO"),
        (folder, "is a folder; pass the path of a file"),
    ):
        for overwrite in (False, True):
            with pytest.raises(ValueError, match=match):
                buf.save(path, overwrite=overwrite)
    assert link.is_symlink() and target.read_bytes() == b"precious"
    assert dangling.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not list(tmp_path.glob("*.tmp"))


@posix_only
def test_save_never_replaces_a_device(tmp_path):
    before = os.stat("/dev/null")
    with pytest.raises(ValueError, match="character device"):
        _buffer().save("/dev/null", overwrite=True)
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_save_replaces_a_foreign_file_only_with_overwrite(tmp_path):
    buf = _buffer()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(ValueError, match="not a marlbuf buffer file; pass overwrite=True"):
        buf.save(notes)
    assert notes.read_text() == "mine"
    buf.save(notes, overwrite=True)
    check_consistent(MultiAgentReplayBuffer.load(notes))
    empty = tmp_path / "empty.npz"
    empty.touch()  # e.g. made by tempfile: replaced
    buf.save(empty)
    buf.save(empty)  # a buffer file: replaced
    check_consistent(MultiAgentReplayBuffer.load(empty))


def test_save_path_errors_say_what_is_wrong(tmp_path):
    buf = _buffer()
    with pytest.raises(ValueError, match="path must name a file; got path=''"):
        buf.save("")
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike"):
        buf.save(3)  # type: ignore[arg-type]
    if os.path.isdir("/proc/self"):
        with pytest.raises(OSError, match="does not accept new files"):
            buf.save("/proc/self/x.npz")


# ---------------------------------------------------------------------------- load sources
def _in_thread(call, timeout: float = 10.0):
    """``call()`` in a daemon thread; fails the test if it does not return in time (a hang)."""
    result: list = []

    def run() -> None:
        try:
            call()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert result, "the call hung"
    return result[0]


@posix_only
def test_load_refuses_special_files_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, match in ((fifo, "FIFO"), ("/dev/zero", "character device")):
        exc = _in_thread(lambda p=path: MultiAgentReplayBuffer.load(p))
        assert isinstance(exc, ValueError) and "not a regular file" in str(exc), exc
        assert match in str(exc)
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"is a folder.*MultiAgentReplayBuffer\.open"):
        MultiAgentReplayBuffer.load(folder)
    dangling = tmp_path / "dangling.npz"
    dangling.symlink_to(tmp_path / "gone.npz")
    with pytest.raises(FileNotFoundError, match=r"symbolic link to .* which does not exist"):
        MultiAgentReplayBuffer.load(dangling)
    buf = _buffer()
    buf.save(tmp_path / "real.npz")
    (tmp_path / "link.npz").symlink_to(tmp_path / "real.npz")  # a link to a file: read
    check_consistent(MultiAgentReplayBuffer.load(tmp_path / "link.npz"))


# ---------------------------------------------------------------------------- clear errors
def test_bad_states_give_value_errors_naming_the_field():
    buf = _buffer()
    state = buf.state_dict()
    target = MultiAgentReplayBuffer(SPECS, 16, seed=1)
    bad_rng = {**state, "rng": {**state["rng"], "state": {"state": -(2**200), "inc": 1}}}
    with pytest.raises(ValueError, match="unusable rng state"):
        target.load_state_dict(bad_rng)
    with pytest.raises(ValueError, match="specs=list"):
        target.load_state_dict({**state, "specs": list(state["specs"].values())})
    with pytest.raises(ValueError, match="not a complete marlbuf buffer state"):
        target.load_state_dict({k: v for k, v in state.items() if k != "storage"})
    with pytest.raises(TypeError, match="a buffer state is a mapping"):
        target.load_state_dict([1, 2])  # type: ignore[arg-type]
    assert target.total_writes == 0  # nothing changed


@pytest.mark.parametrize(
    ("layout", "batch_layout"),
    [("interleaved", "rows"), ("interleaved", "per_agent"), ("agent_major", "rows")],
)
def test_gather_of_no_indices_is_a_clear_error(layout, batch_layout):
    buf = _buffer(layout=layout, batch_layout=batch_layout)
    for empty in ([], np.array([], dtype=np.int64)):
        with pytest.raises(ValueError, match="indices is empty; gather needs at least one"):
            buf.gather(empty)


# ---------------------------------------------------------------------------- stream ids
@pytest.mark.parametrize("where", ["memory", "mapped"])
def test_stream_ids_are_int64(tmp_path, where):
    kwargs = {"path": tmp_path / "m"} if where == "mapped" else {}
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0, next_obs="once", **kwargs)
    for stream in (2**70, 2**63, np.uint64(2**64 - 1)):
        with pytest.raises(ValueError, match="stream ids are int64"):
            buf.add(**one_step(0), stream=stream)
        with pytest.raises(ValueError, match="stream ids are int64"):
            buf.extend(**encoded(np.arange(2)), stream=stream)
    with pytest.raises(ValueError, match="past the largest stream id"):
        buf.add_envs(**encoded(np.arange(3)), first_stream=2**63 - 2)
    assert buf.total_writes == 0  # nothing was written
    buf.add(**one_step(0), stream=2**63 - 1)  # the largest is fine
    buf.add_envs(**encoded(np.arange(1, 3)), first_stream=2**63 - 2)
    buf.save(tmp_path / "s.npz")  # and the buffer can still be saved and loaded
    loaded = MultiAgentReplayBuffer.load(tmp_path / "s.npz")
    assert loaded.total_writes == 3
    assert loaded.links is not None and max(loaded.links.pending) == 2**63 - 1
    buf.close()


# ---------------------------------------------------------------------------- mapped folders
def _closed_folder(tmp_path: Path, name: str = "m") -> Path:
    folder = tmp_path / name
    with MultiAgentReplayBuffer(SPECS, 16, seed=0, path=folder) as buf:
        buf.extend(**encoded(np.arange(20)))
    return folder


def test_manifest_files_outside_the_folder_are_refused(tmp_path):
    victim = tmp_path / "victim.bin"
    folder = _closed_folder(tmp_path)
    manifest = json.loads((folder / mapped.MANIFEST).read_text())
    table = folder / manifest["arrays"]["table"]["file"]
    victim.write_bytes(table.read_bytes())  # the right size: only the path is wrong
    before = victim.read_bytes()
    for name in (str(victim), "../victim.bin", "sub/array-0.bin", "log"):
        crafted = json.loads(json.dumps(manifest))
        crafted["arrays"]["table"]["file"] = name
        (folder / mapped.MANIFEST).write_text(json.dumps(crafted))
        with pytest.raises(ValueError, match=r"plain names 'array-<i>\.bin' inside the folder"):
            MultiAgentReplayBuffer.open(folder)
    (folder / mapped.MANIFEST).write_text(json.dumps(manifest))
    # a storage file that is a link to a file outside, or a hard link to one
    table.unlink()
    table.symlink_to(victim)
    with pytest.raises(ValueError, match="is a symbolic link"):
        MultiAgentReplayBuffer.open(folder)
    table.unlink()
    os.link(victim, table)
    with pytest.raises(ValueError, match="other hard link"):
        MultiAgentReplayBuffer.open(folder)
    assert victim.read_bytes() == before  # never written


def test_a_symlinked_log_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 100)
    for closed in (True, False):
        folder = tmp_path / f"m{closed}"
        if closed:
            folder = _closed_folder(tmp_path, folder.name)
        else:
            killed_after(folder, 5)
        (folder / mapped.LOG).unlink()
        (folder / mapped.LOG).symlink_to(victim)
        with pytest.raises(ValueError, match="is a symbolic link"):
            MultiAgentReplayBuffer.open(folder)
        assert victim.read_bytes() == b"x" * 100


def test_a_folder_in_place_of_a_file_is_refused(tmp_path):
    folder = _closed_folder(tmp_path)
    (folder / mapped.CHECKPOINT).unlink()
    (folder / mapped.CHECKPOINT).mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        MultiAgentReplayBuffer.open(folder)


def test_deleting_lock_files_does_not_defeat_the_lock(tmp_path):
    folder = tmp_path / "m"
    first = MultiAgentReplayBuffer(SPECS, 16, seed=0, path=folder)
    first.extend(**encoded(np.arange(4)))
    for name in (mapped.LOCK, "lock"):
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    with pytest.raises(BlockingIOError, match="open in another buffer object"):
        MultiAgentReplayBuffer.open(folder)
    with pytest.raises(BlockingIOError):
        MultiAgentReplayBuffer.open(folder, mode="r")  # not while a writer has it
    first.extend(**encoded(np.arange(4, 8)))
    first.close()
    with MultiAgentReplayBuffer.open(folder) as reopened:
        assert reopened.total_writes == 8  # no write lost
        check_consistent(reopened)


def test_a_second_process_cannot_open_the_folder(tmp_path):
    folder = tmp_path / "m"
    buf = MultiAgentReplayBuffer(SPECS, 16, seed=0, path=folder)
    (folder / "lock").unlink(missing_ok=True)
    code = (
        "import sys\nfrom marlbuf import MultiAgentReplayBuffer\n"
        "try:\n    MultiAgentReplayBuffer.open(sys.argv[1])\n"
        "except BlockingIOError:\n    sys.exit(3)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(mapped.__file__).parents[2]))
    done = subprocess.run([sys.executable, "-c", code, str(folder)], env=env, timeout=120)
    assert done.returncode == 3
    buf.close()


def test_open_read_only_samples_a_frozen_buffer(tmp_path):
    folder = tmp_path / "m"
    with MultiAgentReplayBuffer(SPECS, 16, seed=0, path=folder, sampler=Prioritized()) as buf:
        buf.extend(**encoded(np.arange(20)))
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    first = MultiAgentReplayBuffer.open(folder, mode="r")
    second = MultiAgentReplayBuffer.open(folder, mode="r")  # readers share the folder
    for reader in (first, second):
        check_consistent(reader)
        batch = reader.sample(8)
        reader.update_priorities(batch.indices, np.ones(8))
        with pytest.raises(ValueError, match=r"opened read-only \(mode='r'\)"):
            reader.add(**one_step(20))
        with pytest.raises(ValueError, match="read-only"):
            reader.extend(**encoded(np.arange(20, 22)))
        assert not reader.storage.arrays()["table"].flags.writeable
        reader.flush()
        reader.close()
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes  # nothing written
    with pytest.raises(ValueError, match="mode must be 'r\\+'"):
        MultiAgentReplayBuffer.open(folder, mode="w")


def test_read_only_replays_a_crashed_log_in_memory_only(tmp_path):
    folder = tmp_path / "k"
    _, total = killed_after(folder, 5)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with MultiAgentReplayBuffer.open(folder, mode="r") as reader:
        assert reader.total_writes == total
        check_consistent(reader)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # files untouched
    with MultiAgentReplayBuffer.open(folder) as writer:  # the log is still there to replay
        assert writer.total_writes == total
        check_consistent(writer)


@pytest.mark.parametrize("value", ["abc", 1.5, None])
def test_a_manifest_with_a_bad_value_names_the_file(tmp_path, value):
    folder = _closed_folder(tmp_path)
    manifest = json.loads((folder / mapped.MANIFEST).read_text())
    (folder / mapped.MANIFEST).write_text(json.dumps({**manifest, "capacity": value}))
    with pytest.raises(ValueError, match=r"manifest\.json' is corrupt .*capacity"):
        MultiAgentReplayBuffer.open(folder)
    (folder / mapped.MANIFEST).write_text(json.dumps({**manifest, "layout": "diagonal"}))
    with pytest.raises(ValueError, match=r"manifest\.json' describes no valid buffer"):
        MultiAgentReplayBuffer.open(folder)


# ---------------------------------------------------------------------------- small disks
@contextlib.contextmanager
def _tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A small tmpfs at ``path`` (root only; the test is skipped where it cannot be mounted),
    always unmounted again."""
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def test_read_only_media(tmp_path, monkeypatch):
    monkeypatch.setattr(_config, "MAPPED_LOG_BYTES", mapped.LOG_UNIT_BYTES)
    with _tmpfs(tmp_path / "media", "8m") as media:
        with MultiAgentReplayBuffer(SPECS, 16, seed=0, path=media / "m") as buf:
            buf.extend(**encoded(np.arange(20)))
        del buf  # its writable mappings live as long as it does
        gc.collect()
        subprocess.run(["mount", "-o", "remount,ro", str(media)], check=True)
        with pytest.raises(PermissionError, match="mode='r'"):
            MultiAgentReplayBuffer.open(media / "m")
        with MultiAgentReplayBuffer.open(media / "m", mode="r") as reader:
            check_consistent(reader)
            reader.sample(4)


def test_a_full_disk_is_reported_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(_config, "MAPPED_LOG_BYTES", 2 * mapped.LOG_UNIT_BYTES)
    with _tmpfs(tmp_path / "small", "6m") as disk:
        buf = MultiAgentReplayBuffer(SPECS, 16, seed=0, path=disk / "m")
        free = shutil.disk_usage(disk).free
        with open(disk / "filler", "wb") as fh:  # the rest of the disk taken
            with contextlib.suppress(OSError):
                fh.write(bytes(free))
        t, error = 0, None
        for _ in range(2000):
            before = buf.total_writes
            try:
                buf.extend(**encoded(np.arange(t, t + 64)))
            except OSError as exc:
                error = exc
                break
            t += 64
        assert error is not None and error.errno == errno.ENOSPC
        assert "no space left" in str(error) and "changed nothing" in str(error)
        assert buf.total_writes == before  # the call that failed changed nothing
        check_consistent(buf)
        (disk / "filler").unlink()
        buf.extend(**encoded(np.arange(t, t + 64)))  # room again: it goes on
        buf.close()
        with MultiAgentReplayBuffer.open(disk / "m") as reopened:
            assert reopened.total_writes == t + 64
            check_consistent(reopened)


def test_creation_reserves_room_for_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(_config, "MAPPED_LOG_BYTES", 64 * mapped.LOG_UNIT_BYTES)
    with _tmpfs(tmp_path / "tiny", "8m") as disk:
        with pytest.raises(OSError, match="storage and redo log need"):
            MultiAgentReplayBuffer(SPECS, 16, seed=0, path=disk / "m")
        assert not (disk / "m").exists()


def test_persistence_helpers_are_public():
    assert persistence.file_kind(stat.S_IFIFO) == "a FIFO (named pipe)"


def _naive_word_checksum(words: np.ndarray, first: int, second: int) -> tuple[int, int]:
    """The obvious twin of :func:`marlbuf._kernels.checksum.word_checksum`."""
    mask = (1 << 64) - 1
    for word in words.tolist():
        first = (first + word) & mask
        second = (second + first) & mask
    return first, second


def test_the_log_checksum_kernels_match_their_naive_twins_and_see_damage():
    from naive import log_checksum, log_record

    from marlbuf._kernels.checksum import (
        CHECKSUM_SEED,
        checksum,
        payload_checksum,
        record_checksum,
        word_checksum,
        write_record,
    )

    rng = np.random.default_rng(0)
    empty = np.zeros(0, dtype=np.int64)
    for n in (0, 1, 3, 4, 7, 1000):  # format 4: lanes, tails of every length
        words = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
        assert tuple(int(x) for x in checksum(words)) == log_checksum([words])
    for steps, row_words, stream, cut in ((1, 9, 0, False), (5, 7, 3, True), (3, 2, -1, True)):
        rows = rng.integers(0, 2**64, (steps, row_words), dtype=np.uint64, endpoint=False)
        streams = rng.integers(0, 9, steps) if stream < 0 else empty
        flags = rng.integers(0, 2, steps) if cut else empty
        log = np.zeros(200, dtype=np.uint64)
        end = write_record(log, 3, rows, streams, flags, 77, 5, 1234, stream, int(cut))
        want = log_record(rows, streams, flags, 77, 5, 1234, stream, int(cut))
        assert end == 3 + want.shape[0]
        np.testing.assert_array_equal(log[3:end], want)
        assert not log[:3].any() and not log[end:].any()
        assert tuple(int(x) for x in payload_checksum(rows, streams, flags)) == tuple(
            int(x) for x in want[8:10]
        )
    rows = rng.integers(0, 2**64, (64, 9), dtype=np.uint64, endpoint=False)
    reference = tuple(payload_checksum(rows, empty, empty))
    for row, col, bit in ((5, 3, 0), (0, 0, 17), (63, 8, 63)):  # any flipped bit
        flipped = rows.copy()
        flipped[row, col] ^= np.uint64(1 << bit)
        assert tuple(payload_checksum(flipped, empty, empty)) != reference
    swapped = np.ascontiguousarray(rows[[1, 0, *range(2, 64)]])
    assert tuple(payload_checksum(swapped, empty, empty)) != reference
    zeroed = rows.copy()
    zeroed[10:] = 0
    assert tuple(payload_checksum(zeroed, empty, empty)) != reference
    # format 3 (read for folders of earlier versions)
    for n in (0, 1, 7, 1000):
        words = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
        state = np.array([CHECKSUM_SEED, 0], dtype=np.uint64)
        word_checksum(words, state)
        assert (int(state[0]), int(state[1])) == _naive_word_checksum(words, CHECKSUM_SEED, 0)
    streams = rng.integers(0, 2**63, 64, dtype=np.int64)
    first, second = _naive_word_checksum(rows.reshape(-1), CHECKSUM_SEED, 0)
    first, second = _naive_word_checksum(streams.view(np.uint64), first, second)
    folded = (first ^ (second * CHECKSUM_SEED)) & ((1 << 64) - 1)
    assert int(record_checksum(rows, streams, empty)) == folded
