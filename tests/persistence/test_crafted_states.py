"""Crafted buffer states: every field mutated alone and in pairs is either refused with a clear
``ValueError`` or loads to a state that behaves exactly like an honest one; crafted files never
make the loader spend memory on sizes the file does not hold."""

from __future__ import annotations

import copy
import itertools
import json
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marlbuf import MultiAgentReplayBuffer
from marlbuf.samplers import Prioritized
from tests.persistence.encoded_steps import SPECS, check_consistent, encoded

CAPACITY = 16

#: honest buffers to mutate: (id, constructor keywords, steps written)
CONFIGS = [
    ("once-wrapped", {"next_obs": "once"}, 37),
    ("once-filling", {"next_obs": "once"}, 9),
    ("dense-prioritized", {"next_obs": "stored", "sampler": Prioritized()}, 21),
    ("once-prioritized-filling", {"next_obs": "once", "sampler": Prioritized()}, 11),
]

State = dict[str, Any]


def _honest(kwargs: dict[str, Any], steps: int) -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, seed=0, **kwargs)
    t = 0
    while t < steps:  # extends of 3 and adds, on two streams for the links' pending table
        n = min(3, steps - t)
        buf.extend(**encoded(np.arange(t, t + n)))
        t += n
    buf.add_envs(**encoded(np.arange(t, t + 1)), first_stream=5)  # a second stream's pending
    return buf


def _set(path: str, value: Callable[[Any], Any]) -> Callable[[State], None]:
    """A mutation: the value at ``path`` ("links/next_slot") replaced by ``value(old)``."""
    keys = path.split("/")

    def mutate(state: State) -> None:
        node = state
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value(node[keys[-1]])

    return mutate


def _edit(index: Any, new: Any) -> Callable[[Any], Any]:
    def edit(array: Any) -> Any:
        array = np.array(array, copy=True)
        if array.size == 0:
            return np.full((1, *array.shape[1:]), new, dtype=array.dtype)
        array[index] = new
        return array

    return edit


#: single-field mutations: name -> mutation (skipped where the state lacks the field)
MUTATIONS: dict[str, Callable[[State], None]] = {
    "size+1": _set("size", lambda v: v + 1),
    "size-1": _set("size", lambda v: v - 1),
    "size=0": _set("size", lambda v: 0),
    "cursor+1": _set("cursor", lambda v: v + 1),
    "cursor=-1": _set("cursor", lambda v: -1),
    "total_writes+1": _set("total_writes", lambda v: v + 1),
    "total_writes+capacity": _set("total_writes", lambda v: v + CAPACITY),
    "total_writes=2**63": _set("total_writes", lambda v: 2**63),
    "total_writes=-1": _set("total_writes", lambda v: -1),
    "total_writes=str": _set("total_writes", lambda v: "12"),
    "write_generation[0]+1": _set("write_generation", _edit(0, 10**6)),
    "write_generation[-1]=-1": _set("write_generation", _edit(-1, -1)),
    "write_generation float": _set("write_generation", lambda v: np.asarray(v, np.float64)),
    "next_slot[0]=-2": _set("links/next_slot", _edit(0, -2)),
    "next_slot[0]=capacity": _set("links/next_slot", _edit(0, CAPACITY)),
    "next_slot[-1]=0": _set("links/next_slot", _edit(-1, 0)),
    "next_slot all -1": _set("links/next_slot", lambda v: np.full_like(v, -1)),
    "side_row[0]=-1": _set("links/side_row", _edit(0, -1)),
    "side_row[1]=side_row[0]": _set("links/side_row", lambda v: _edit(1, v[0])(v)),
    "side_row[0]=10**6": _set("links/side_row", _edit(0, 10**6)),
    "next_slot=side_row=-1": lambda s: (
        _set("links/next_slot", lambda v: np.full_like(v, -1))(s),
        _set("links/side_row", lambda v: np.full_like(v, -1))(s),
    ),
    "free dropped": _set("links/free", lambda v: np.asarray(v)[1:]),
    "free duplicate": _set("links/free", lambda v: np.concatenate([v, np.asarray(v)[:1]])),
    "free=-1": _set("links/free", _edit(0, -1)),
    "side huge": _set("links/side", lambda v: np.zeros((10**5, v.shape[1]), np.uint8)),
    "side wrong width": _set("links/side", lambda v: np.zeros((v.shape[0], 3), np.uint8)),
    "pending stream=-1": _set("links/pending", _edit((0, 0), -1)),
    "pending stream=2**63-1": _set("links/pending", _edit((0, 0), 2**63 - 1)),
    "pending slot=capacity": _set("links/pending", _edit((0, 1), CAPACITY)),
    "pending gen=-1": _set("links/pending", _edit((0, 2), -1)),
    "pending gen stale": _set("links/pending", _edit((0, 2), 0)),
    "pending duplicate stream": _set(
        "links/pending", lambda v: np.concatenate([v, np.asarray(v)[:1]])
    ),
    "pending wrong shape": _set("links/pending", lambda v: np.zeros((2, 2), np.int64)),
    "links missing": _set("links", lambda v: {}),
    "leaves on unwritten": _set("sampler/state/leaves", _edit((0, -1), 5.0)),
    "leaves negative": _set("sampler/state/leaves", _edit((0, 0), -1.0)),
    "leaves nan": _set("sampler/state/leaves", _edit((0, 0), np.nan)),
    "leaves wrong shape": _set("sampler/state/leaves", lambda v: np.zeros((1, 3))),
    "max_priority nan": _set("sampler/state/max_priority", _edit(0, np.nan)),
    "max_priority 0": _set("sampler/state/max_priority", _edit(0, 0.0)),
    "batches_drawn -1": _set("sampler/state/batches_drawn", _edit(0, -1)),
    "batches_drawn wrong shape": _set("sampler/state/batches_drawn", lambda v: np.zeros(7)),
    "sampler state not a mapping": _set("sampler/state", lambda v: [v]),
    "rng bad": _set("rng", lambda v: {**v, "state": {"state": -(2**200), "inc": 3}}),
    "rng other generator": _set("rng", lambda v: {"bit_generator": "MT19937", "state": {}}),
    "rng missing": _set("rng", lambda v: None),
    "specs list": _set("specs", lambda v: list(v.values())),
    "n_trainers huge": _set("n_trainers", lambda v: 10**7),
    "capacity other": _set("capacity", lambda v: v + 1),
    "storage rows short": _set("storage", lambda v: {k: a[:-1] for k, a in v.items()}),
    "storage dtype": _set("storage", lambda v: {k: a.view(np.int8) for k, a in v.items()}),
    "format other": _set("format", lambda v: "other"),
    "sampler not a dict": _set("sampler", lambda v: [v]),
}


def _applicable(state: State, name: str) -> bool:
    probe = copy.deepcopy(state)
    try:
        MUTATIONS[name](probe)
    except (KeyError, IndexError, TypeError):
        return False  # the state has no such field (e.g. links of a dense buffer)
    return True


def _outcome(honest: MultiAgentReplayBuffer, kwargs: dict[str, Any], state: State) -> str:
    """``"refused"`` (a ValueError that says what is wrong), ``"unchanged"`` (loaded, the
    same as the honest state) or ``"consistent"`` (loaded, behaves like an honest state);
    anything else fails the test."""
    target = MultiAgentReplayBuffer(SPECS, CAPACITY, seed=1, **kwargs)
    before = target.state_dict()
    try:
        target.load_state_dict(state)
    except ValueError as exc:
        assert len(str(exc)) > 20, exc  # says what is wrong
        after = target.state_dict()  # a refused state changes nothing
        assert (after["size"], after["total_writes"]) == (before["size"], before["total_writes"])
        return "refused"
    check_consistent(target)  # every row holds the step its generation names
    for t in range(3):  # and the buffer goes on like an honest one
        start = target.total_writes
        target.extend(**encoded(np.arange(start, start + 2 + t)))
        check_consistent(target)
        target.sample(4)
    honest_state = honest.state_dict()
    same = (state["total_writes"], state["cursor"]) == (
        honest_state["total_writes"],
        honest_state["cursor"],
    )
    return "unchanged" if same else "consistent"


@pytest.mark.parametrize(
    ("kwargs", "steps"), [(k, s) for _, k, s in CONFIGS], ids=[c[0] for c in CONFIGS]
)
def test_crafted_states_are_refused_or_consistent(kwargs, steps):
    honest = _honest(kwargs, steps)
    state = honest.state_dict()
    names = [n for n in MUTATIONS if _applicable(state, n)]
    cases = [(n,) for n in names] + list(itertools.combinations(names, 2))
    counts = {"refused": 0, "unchanged": 0, "consistent": 0}
    for case in cases:
        crafted = copy.deepcopy(state)
        for name in case:
            MUTATIONS[name](crafted)
        try:
            counts[_outcome(honest, kwargs, crafted)] += 1
        except AssertionError as exc:
            raise AssertionError(f"mutation {case} loaded to an inconsistent state: {exc}") from exc
        except Exception as exc:
            raise AssertionError(f"mutation {case} raised {type(exc).__name__}: {exc}") from exc
    print(f"{len(cases)} crafted states: {counts}")
    assert sum(counts.values()) == len(cases)


def test_the_single_mutations_of_the_report_are_refused():
    """The fields the adversarial pass found accepted: each is refused now."""
    honest = _honest({"next_obs": "once", "sampler": Prioritized()}, 9)
    state = honest.state_dict()
    for name in (
        "total_writes+1",
        "cursor+1",
        "size-1",
        "write_generation[0]+1",
        "next_slot=side_row=-1",
        "free dropped",
        "pending slot=capacity",
        "leaves on unwritten",
        "max_priority 0",
        "batches_drawn -1",
        "batches_drawn wrong shape",
        "sampler state not a mapping",
        "rng bad",
        "specs list",
        "side huge",
    ):
        crafted = copy.deepcopy(state)
        MUTATIONS[name](crafted)
        target = MultiAgentReplayBuffer(
            SPECS, CAPACITY, seed=1, next_obs="once", sampler=Prioritized()
        )
        with pytest.raises(ValueError):
            target.load_state_dict(crafted)


# ---------------------------------------------------------------------------- crafted files
def _members(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files}


@pytest.mark.slow
def test_a_deflated_side_table_is_refused_before_it_is_inflated(tmp_path):
    """A small file whose compressed member inflates to a gigabyte: refused, nothing inflated."""
    buf = _honest({"next_obs": "once"}, 9)
    buf.save(tmp_path / "honest.npz")
    members = _members(tmp_path / "honest.npz")
    crafted = tmp_path / "bomb.npz"
    with zipfile.ZipFile(crafted, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, array in members.items():
            with archive.open(key + ".npy", "w", force_zip64=True) as fh:
                if key == "/links/side":
                    header = {"descr": "|u1", "fortran_order": False, "shape": (2**20, 1024)}
                    np.lib.format.write_array_header_1_0(fh, header)
                    chunk = bytes(2**20)
                    for _ in range(1024):  # 1 GiB of zeros, deflated to about 1 MiB
                        fh.write(chunk)
                else:
                    np.lib.format.write_array(fh, array)
    assert crafted.stat().st_size < 4 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="compressed member"):
            MultiAgentReplayBuffer.load(crafted)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak


def test_a_declared_shape_larger_than_the_member_is_refused(tmp_path):
    """A member whose ``.npy`` header declares a terabyte: refused before allocation."""
    buf = _honest({"next_obs": "once"}, 9)
    buf.save(tmp_path / "honest.npz")
    members = _members(tmp_path / "honest.npz")
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as archive:
        for key, array in members.items():
            with archive.open(key + ".npy", "w", force_zip64=True) as fh:
                if key == "/storage/table":
                    header = {"descr": "<u8", "fortran_order": False, "shape": (2**37, 8)}
                    np.lib.format.write_array_header_1_0(fh, header)
                    fh.write(bytes(64))
                else:
                    np.lib.format.write_array(fh, array)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"at most 16 rows|declares shape"):
            MultiAgentReplayBuffer.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak


def test_n_trainers_is_bounded_by_the_file(tmp_path):
    """``n_trainers=10**7`` in a small file of a prioritized buffer: refused before the buffer
    (10**7 priority trees) is built."""
    buf = _honest({"next_obs": "once", "sampler": Prioritized()}, 9)
    path = tmp_path / "b.npz"
    buf.save(path)
    members = _members(path)
    meta = json.loads(members["__meta__"].tobytes())
    meta["n_trainers"] = 10**7
    members["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(tmp_path / "crafted.npz", **members)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="n_trainers=10000000"):
            MultiAgentReplayBuffer.load(tmp_path / "crafted.npz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
