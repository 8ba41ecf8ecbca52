"""Files written by earlier versions of marlbuf load and sample the same batches.

``tests/fixtures/v3`` holds state files of save format 3 and memory-mapped folders of manifest
version 3 (written by ``tests/fixtures/make_fixtures.py``); ``tests/fixtures/v4`` those of
format and manifest version 4 as marlbuf 0.4.0 wrote them (``make_fixtures_v4.py``): global
fields, alive flags, prioritized sequences and episodes, a format chosen by
``next_obs="auto"``, and folders whose log holds writes not yet applied. Each script also
recorded the batches its files gave (``<name>.expected.npz``); one driver checks both versions.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from marlbuf import FIELDS, MultiAgentReplayBuffer, mapped
from marlbuf.buffer import StreamBreakWarning

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _script(name: str) -> ModuleType:
    """The fixture script ``tests/fixtures/<name>.py`` (its ``STATES``, ``FOLDERS`` and
    ``draws``)."""
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: version folder -> the script that wrote it
SCRIPTS = {"v3": _script("make_fixtures"), "v4": _script("make_fixtures_v4")}
STATE_FILES = [(v, name) for v, script in SCRIPTS.items() for name in sorted(script.STATES)]
FOLDERS = [(v, name) for v, script in SCRIPTS.items() for name in sorted(script.FOLDERS)]


def _same(buf: MultiAgentReplayBuffer, version: str, name: str) -> None:
    """``buf`` samples the batches the fixture's writer recorded."""
    expected = np.load(FIXTURES / version / f"{name}.expected.npz")
    got = SCRIPTS[version].draws(buf)
    assert sorted(got) == sorted(expected.files)
    for key in expected.files:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name}: {key}")


def _copy(version: str, name: str, tmp_path: Path) -> Path:
    """The fixture folder in ``tmp_path``, its log padded to whole units again (the fixture
    keeps the log without its trailing zeros)."""
    folder = tmp_path / name
    shutil.copytree(FIXTURES / version / name, folder)
    log = folder / mapped.LOG
    data = log.read_bytes()
    if data:
        log.write_bytes(data + bytes(-len(data) % (1 << 20)))
    return folder


@pytest.mark.parametrize(("version", "name"), STATE_FILES)
def test_old_state_files_load_and_sample_the_same_batches(version, name):
    _same(MultiAgentReplayBuffer.load(FIXTURES / version / f"{name}.npz"), version, name)


def test_an_old_auto_state_file_keeps_the_format_it_chose():
    buf = MultiAgentReplayBuffer.load(FIXTURES / "v4" / "ram_auto_prioritized_sequence.npz")
    assert buf.next_obs in ("once", "stored")
    assert buf.global_fields and buf.alive


@pytest.mark.parametrize(("version", "name"), FOLDERS)
@pytest.mark.parametrize("mode", ["r+", "r"])
def test_old_mapped_folders_open_and_sample_the_same_batches(tmp_path, version, name, mode):
    with MultiAgentReplayBuffer.open(_copy(version, name, tmp_path), mode=mode) as buf:
        _same(buf, version, name)


@pytest.mark.parametrize(("version", "name"), FOLDERS)
def test_old_mapped_folders_are_rewritten_in_this_format_by_a_writer(tmp_path, version, name):
    folder = _copy(version, name, tmp_path)
    MultiAgentReplayBuffer.open(folder).close()  # the log applied, a checkpoint in this format
    with MultiAgentReplayBuffer.open(folder) as buf:
        _same(buf, version, name)
    manifest = json.loads((folder / mapped.MANIFEST).read_text())
    assert manifest["version"] == mapped.FORMAT_VERSION


@pytest.mark.parametrize(("version", "name"), FOLDERS)
def test_old_mapped_folders_take_new_writes(tmp_path, version, name):
    folder = _copy(version, name, tmp_path)
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
