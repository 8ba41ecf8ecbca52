"""Interoperability with the real Flashbax, both ways (``pytest -m vault``; needs ``flashbax``
and CPU JAX, which the CI installs in a venv of their own).

* Vaults Flashbax's ``Vault`` writes (fresh ones, from ``tests/fixtures/vaults/make_fixtures.py``)
  load into marlbuf with every field equal to the arrays Flashbax was given.
* Vaults marlbuf writes (``write_vault``, and the recorder's) are read by Flashbax's
  ``Vault.read()`` with every leaf equal to the buffer's contents.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Episodes

pytestmark = pytest.mark.vault
fbx_vault = pytest.importorskip("flashbax.vault")
pytest.importorskip("tensorstore")

from marlbuf.offline import read_vault, record, write_vault  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vaults"


def _fixture_maker():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flashbax_read(path: Path) -> dict[str, np.ndarray]:
    """Flashbax's ``Vault(...).read()`` of the vault at ``path``, leaves by dotted key."""
    import jax

    vault = fbx_vault.Vault(path.parent.name, rel_dir=str(path.parent.parent), vault_uid=path.name)
    experience = vault.read().experience
    flat = jax.tree_util.tree_flatten_with_path(experience)[0]
    return {".".join(str(k.key) for k in keys): np.asarray(v) for keys, v in flat}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The fixture vaults written now by the installed Flashbax, and the arrays it was given."""
    out = tmp_path_factory.mktemp("flashbax")
    maker = _fixture_maker()
    maker.main(str(out))
    with np.load(out / "expected.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return out, arrays


def test_vault_flashbax_wrote_loads_with_every_field_equal(fresh):
    out, arrays = fresh
    buf = read_vault(out / "og_marl_like.vlt" / "Good", sampler=Episodes(), seed=0)
    data = {k.split("/", 2)[2]: v for k, v in arrays.items() if k.startswith("og_marl_like")}
    batch = buf.gather(np.arange(len(buf)))
    for i, a in enumerate(buf.agents):
        np.testing.assert_array_equal(batch.obs[a], data["observations"][0, :, i])
        np.testing.assert_array_equal(batch.action_index[a], data["actions"][0, :, i])
        np.testing.assert_array_equal(batch.reward[a], data["rewards"][0, :, i])
        np.testing.assert_array_equal(batch.done[a], data["terminals"][0, :, i])
        np.testing.assert_array_equal(batch.extras["legals"][a], data["infos.legals"][0, :, i])
    np.testing.assert_array_equal(batch.state, data["infos.state"][0])
    assert buf.complete_episodes == 6
    two = read_vault(out / "continuous.vlt" / "two_streams")
    data = {k.split("/", 2)[2]: v for k, v in arrays.items() if k.startswith("continuous")}
    for b in range(2):
        batch = two.gather(np.arange(40 * b, 40 * b + 40))
        for i, a in enumerate(two.agents):
            np.testing.assert_array_equal(batch.obs[a], data["observations"][b, :, i])
            np.testing.assert_array_equal(batch.action[a], data["actions"][b, :, i])


def test_committed_fixtures_match_what_flashbax_writes(fresh):
    out, arrays = fresh
    with np.load(FIXTURES / "expected.npz") as committed:
        assert sorted(committed.files) == sorted(arrays)
        for key in arrays:
            np.testing.assert_array_equal(committed[key], arrays[key])
    for vault in ("og_marl_like.vlt/Good", "continuous.vlt/two_streams"):
        ours, theirs = _flashbax_read(FIXTURES / vault), _flashbax_read(out / vault)
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key])


def test_vault_marlbuf_wrote_is_read_by_flashbax_with_every_leaf_equal(tmp_path):
    rng = np.random.default_rng(0)
    specs = {
        f"agent_{i}": AgentSpec(
            (6,), (4,), n_discrete_actions=4, extras={"legals": FieldSpec((4,), np.bool_)}
        )
        for i in range(3)
    }
    buf = MultiAgentReplayBuffer(
        specs, 300, global_fields={"state": FieldSpec((9,))}, sampler=Episodes(), seed=0
    )
    for _ in range(12):
        n = int(rng.integers(5, 30))
        obs = {a: rng.normal(size=(n + 1, 6)).astype(np.float32) for a in specs}
        buf.extend(
            obs={a: v[:-1] for a, v in obs.items()},
            action={a: rng.integers(0, 4, n) for a in specs},
            reward={a: rng.normal(size=n) for a in specs},
            next_obs={a: v[1:] for a, v in obs.items()},
            done={a: np.zeros(n) for a in specs},
            truncated=np.arange(n) == n - 1,
            legals={a: rng.random((n, 4)) < 0.5 for a in specs},
            state=rng.normal(size=(n, 9)).astype(np.float32),
        )
    path = write_vault(buf, tmp_path / "vaults" / "mine.vlt" / "u")
    leaves = _flashbax_read(path)
    assert set(leaves) == {
        "observations",
        "actions",
        "rewards",
        "terminals",
        "truncations",
        "infos.legals",
        "infos.state",
    }
    batch = buf.gather(np.arange(len(buf)))
    agents = buf.agents
    np.testing.assert_array_equal(
        leaves["observations"][0], np.stack([batch.obs[a] for a in agents], 1)
    )
    np.testing.assert_array_equal(
        leaves["actions"][0], np.stack([batch.action_index[a] for a in agents], 1)
    )
    np.testing.assert_array_equal(
        leaves["rewards"][0], np.stack([batch.reward[a] for a in agents], 1)
    )
    np.testing.assert_array_equal(
        leaves["terminals"][0], np.stack([batch.done[a] for a in agents], 1)
    )
    np.testing.assert_array_equal(
        leaves["infos.legals"][0], np.stack([batch.extras["legals"][a] for a in agents], 1)
    )
    np.testing.assert_array_equal(leaves["infos.state"][0], batch.state)
    ends = np.flatnonzero(leaves["truncations"][0, :, 0])
    assert len(ends) == 12 and (leaves["truncations"][0, ends] == 1).all()


def test_recorded_vault_is_read_by_flashbax(tmp_path):
    simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
    envs = [simple_spread.parallel_env(N=3, max_cycles=25) for _ in range(2)]
    path = record(envs, 60, seed=0, vault=tmp_path / "ss.vlt" / "random", state=True)
    leaves = _flashbax_read(path)
    assert leaves["observations"].shape == (2, 60, 3, 18)
    assert leaves["actions"].dtype == np.int32 and leaves["infos.state"].shape == (2, 60, 54)
    back = read_vault(path)
    for b in range(2):
        batch = back.gather(np.arange(60 * b, 60 * b + 60))
        for i, a in enumerate(back.agents):
            np.testing.assert_array_equal(batch.obs[a], leaves["observations"][b, :, i])
            np.testing.assert_array_equal(batch.action_index[a], leaves["actions"][b, :, i])
    assert "jax" in sys.modules  # this group does run against the real thing
