"""Files written by marlbuf 0.4.0 load and sample the same batches: state files of save format
4 and memory-mapped folders of manifest version 4 (``tests/fixtures/v4``, written by
``tests/fixtures/make_fixtures_v4.py``, which also recorded the batches): global fields, alive
flags, prioritized sequences and episodes, a format chosen by ``next_obs="auto"``, and folders
whose log holds writes not yet applied."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from marlbuf import FIELDS, MultiAgentReplayBuffer, mapped
from marlbuf.buffer import StreamBreakWarning

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v4"
sys.path.insert(0, str(FIXTURES.parent))
from make_fixtures_v4 import FOLDERS, STATES, draws  # noqa: E402


def _same(buf: MultiAgentReplayBuffer, name: str) -> None:
    expected = np.load(FIXTURES / f"{name}.expected.npz")
    got = draws(buf)
    assert sorted(got) == sorted(expected.files)
    for key in expected.files:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name}: {key}")


@pytest.mark.parametrize("name", sorted(STATES))
def test_v4_state_files_load_and_sample_the_same_batches(name):
    _same(MultiAgentReplayBuffer.load(FIXTURES / f"{name}.npz"), name)


def test_v4_auto_state_file_keeps_the_format_it_chose():
    buf = MultiAgentReplayBuffer.load(FIXTURES / "ram_auto_prioritized_sequence.npz")
    assert buf.next_obs in ("once", "stored")
    assert buf.global_fields and buf.alive


def _copy(name: str, tmp_path: Path) -> Path:
    """The fixture folder in ``tmp_path``, its log padded to whole units again (the fixture
    keeps the log without its trailing zeros)."""
    folder = tmp_path / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIXTURES / name, folder)
    log = folder / mapped.LOG
    data = log.read_bytes()
    if data:
        log.write_bytes(data + bytes(-len(data) % (1 << 20)))
    return folder


@pytest.mark.parametrize("name", sorted(FOLDERS))
@pytest.mark.parametrize("mode", ["r+", "r"])
def test_v4_mapped_folders_open_and_sample_the_same_batches(tmp_path, name, mode):
    with MultiAgentReplayBuffer.open(_copy(name, tmp_path), mode=mode) as buf:
        _same(buf, name)


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_v4_mapped_folders_reopen_after_a_writer_closed_them(tmp_path, name):
    folder = _copy(name, tmp_path)
    MultiAgentReplayBuffer.open(folder).close()  # the log applied, a new checkpoint
    with MultiAgentReplayBuffer.open(folder) as buf:
        _same(buf, name)
    manifest = json.loads((folder / mapped.MANIFEST).read_text())
    assert manifest["version"] == mapped.FORMAT_VERSION


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_v4_mapped_folders_take_new_writes(tmp_path, name):
    folder = _copy(name, tmp_path)
    with MultiAgentReplayBuffer.open(folder) as buf:
        total = buf.total_writes
        row = buf.gather(np.array([0]))
        data = {f: {a: v[0] for a, v in row.field(f).items()} for f in FIELDS}
        data.update({g: v[0] for g, v in row.globals.items()})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StreamBreakWarning)
            buf.add(**data)
    with MultiAgentReplayBuffer.open(folder) as buf:
        assert buf.total_writes == total + 1
