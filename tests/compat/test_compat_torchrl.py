"""marlbuf inside TorchRL (``marlbuf.compat.torchrl``): the storage against ``LazyTensorStorage``
bit for bit, the samplers against their formulas, state round trips and the clear errors.

Runs wherever TorchRL installs (the shared venv's 0.14.1 and the BenchMARL venv's 0.11.1, both
run by CI); nothing needs a GPU (the CUDA case is marked ``cuda``).
"""

from __future__ import annotations

import copy
import inspect
import io
import pickle
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from naive import naive_written_min  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    TensorStorage,
)

from marlbuf._kernels.blockmin import lower_block_mins, refresh_block_mins  # noqa: E402
from marlbuf.compat import NotEnoughDataError  # noqa: E402
from marlbuf.compat.torchrl import (  # noqa: E402
    EXCLUDED_KEYS,
    MarlbufNeighborSampler,
    MarlbufPrioritizedNeighborSampler,
    MarlbufPrioritizedSampler,
    MarlbufStorage,
    MarlbufUniformSampler,
    StorageIndexError,
)

HAS_CUDA = torch.cuda.is_available()
CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available())"),
]

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


# ------------------------------------------------------------------------------ helpers
def random_bits(shape: tuple[int, ...], dtype: Any, gen: Any) -> Any:
    """A tensor of ``dtype`` with arbitrary bit patterns (NaN payloads, -0, denormals)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, itemsize), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def bits(tensor: Any) -> Any:
    flat = tensor.reshape(-1)
    flat = flat.new_empty(flat.shape).copy_(flat)  # stride 1 even for a single element
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat


def assert_same(got: Any, want: Any) -> None:
    """Same keys, nested batch sizes, dtypes, shapes, and bits of every leaf (``want`` without
    the bookkeeping keys a MarlbufStorage never stores: TorchRL's storages keep an ``"index"``
    written into the data after the first write)."""
    want = want.exclude(*(k for k in EXCLUDED_KEYS if k in want.keys()))
    got = got.exclude(*(k for k in EXCLUDED_KEYS if k in got.keys()))
    got_keys = set(got.keys(include_nested=True, leaves_only=True))
    want_keys = set(want.keys(include_nested=True, leaves_only=True))
    assert got_keys == want_keys
    assert got.batch_size == want.batch_size
    for key in got.keys(include_nested=True, leaves_only=False):
        a, b = got.get(key), want.get(key)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert a.device == b.device, key
            assert torch.equal(bits(a), bits(b)), key
        else:
            assert a.batch_size == b.batch_size, key


def maddpg_td(steps: int, n_agents: int = 3, obs_dim: int = 6, seed: int = 0) -> Any:
    """A MADDPG-shaped TensorDict of one stream: agents' observations of steps t and t + 1."""
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(steps + 1, n_agents, obs_dim, generator=gen)
    episode_reward = torch.randn(steps + 1, n_agents, 1, generator=gen)
    done = torch.zeros(steps + 1, 1, dtype=torch.bool)
    return TensorDict(
        {
            "agents": TensorDict(
                {
                    "observation": obs[:-1],
                    "action": torch.randn(steps, n_agents, 2, generator=gen),
                    "episode_reward": episode_reward[:-1],
                },
                batch_size=[steps, n_agents],
            ),
            "done": done[:-1],
            "next": TensorDict(
                {
                    "agents": TensorDict(
                        {
                            "observation": obs[1:],
                            "reward": torch.randn(steps, n_agents, 1, generator=gen),
                            "episode_reward": episode_reward[1:],
                        },
                        batch_size=[steps, n_agents],
                    ),
                    "done": done[1:],
                },
                batch_size=[steps],
            ),
        },
        batch_size=[steps],
    )


def pair(capacity: int, **kwargs: Any) -> tuple[Any, Any]:
    return (
        TensorDictReplayBuffer(storage=MarlbufStorage(capacity, **kwargs), batch_size=8),
        TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=8),
    )


# ------------------------------------------------------------------------------ structures
@st.composite
def structures(draw: Any) -> dict[str, Any]:
    """A random TensorDict structure: groups with agent axes, leaves of any dtype and per-item
    shape (zero-sized ones too), keys paired under "next" (stored once) or not."""
    groups = {f"group{g}": draw(st.integers(1, 3)) for g in range(draw(st.integers(0, 2)))}
    leaves = []
    for i in range(draw(st.integers(1, 6))):
        where = draw(st.sampled_from([None, *groups]))
        lead = () if where is None else (groups[where],)
        shape = (*lead, *draw(st.lists(st.integers(0 if i == 5 else 1, 3), max_size=2)))
        leaves.append(
            {
                "key": (*(() if where is None else (where,)), f"leaf{i}"),
                "shape": tuple(shape),
                "dtype": draw(st.sampled_from(DTYPES)),
                # paired: also under "next" (its next value equals the next step's: a stream);
                # next-only: a reward; twin: under "next" with another dtype (not a pair)
                "kind": draw(st.sampled_from(["pair", "pair", "root", "next", "twin"])),
            }
        )
    return {"groups": groups, "leaves": leaves}


def make_data(structure: dict[str, Any], steps: int, seed: int, breaks: float) -> Any:
    """``steps`` items of ``structure``; a pair's next value is the next step's value except
    at random breaks (episode ends)."""
    gen = torch.Generator().manual_seed(seed)
    source: dict[Any, Any] = {}
    for leaf in structure["leaves"]:
        key, shape, dtype = leaf["key"], leaf["shape"], leaf["dtype"]
        stream = random_bits((steps + 1, *shape), dtype, gen)
        if leaf["kind"] in ("pair", "root", "twin"):
            source[key] = stream[:-1]
        if leaf["kind"] == "pair":
            nxt = stream[1:].clone()
            cut = torch.rand(steps, generator=gen) < breaks
            nxt[cut] = random_bits((int(cut.sum()), *shape), dtype, gen)
            source[("next", *key)] = nxt
        elif leaf["kind"] == "next":
            source[("next", *key)] = stream[1:]
        elif leaf["kind"] == "twin":
            other = torch.float32 if dtype != torch.float32 else torch.int32
            source[("next", *key)] = random_bits((steps, *shape), other, gen)
    td = TensorDict({}, batch_size=[steps])
    for name, n_agents in structure["groups"].items():
        td.set(name, TensorDict({}, batch_size=[steps, n_agents]))
    if any(k[0] == "next" for k in source):
        td.set("next", TensorDict({}, batch_size=[steps]))
        for name, n_agents in structure["groups"].items():
            if any(k[:2] == ("next", name) for k in source):
                td.set(("next", name), TensorDict({}, batch_size=[steps, n_agents]))
    for key, value in source.items():
        td.set(key, value)
    return td


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    structure=structures(),
    capacity=st.integers(2, 12),
    chunks=st.lists(st.integers(1, 20), min_size=1, max_size=5),
    breaks=st.sampled_from([0.0, 0.2, 1.0]),
    next_obs=st.sampled_from(["auto", "once", "stored"]),
    contiguous=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_storage_equals_lazy_tensor_storage_bit_for_bit(
    structure: dict[str, Any],
    capacity: int,
    chunks: list[int],
    breaks: float,
    next_obs: str,
    contiguous: bool,
    seed: int,
) -> None:
    ours, ref = pair(capacity, next_obs=next_obs, contiguous=contiguous)
    for i, steps in enumerate(chunks):
        data = make_data(structure, steps, seed + i, breaks)
        assert torch.equal(ours.extend(data.clone()), ref.extend(data.clone()))
        assert len(ours) == len(ref)
        rng = np.random.default_rng(seed + i)
        index = torch.from_numpy(rng.integers(0, len(ref), size=(3, 4)))
        assert_same(ours.storage.get(index), ref.storage.get(index))
    everything = torch.arange(len(ref))
    assert_same(ours.storage.get(everything), ref.storage.get(everything))
    assert_same(ours.storage.get(len(ref) - 1), ref.storage.get(len(ref) - 1))
    assert_same(ours.storage.get(-1), ref.storage.get(-1))
    assert_same(ours.storage.get(slice(1, None, 2)), ref.storage.get(slice(1, None, 2)))
    assert_same(ours[:], ref[:])


def test_pairs_are_stored_once_and_the_rest_once_per_row() -> None:
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(1000), batch_size=8)
    rb.extend(maddpg_td(400, obs_dim=18))
    layout = rb.storage.layout
    paired = {leaf.key for leaf in layout.leaves if leaf.field in ("obs", "next_obs")}
    assert paired == {
        ("agents", "observation"),
        ("next", "agents", "observation"),
        ("agents", "episode_reward"),
        ("next", "agents", "episode_reward"),
        ("done",),
        ("next", "done"),
    }
    assert rb.storage.buffer.next_obs == "once"
    dense = TensorDictReplayBuffer(storage=MarlbufStorage(1000, next_obs="stored"), batch_size=8)
    dense.extend(maddpg_td(400, obs_dim=18))
    assert rb.storage.buffer.nbytes < 0.7 * dense.storage.buffer.nbytes
    assert_same(rb[:], dense[:])


def test_sampled_leaves_are_contiguous_views_of_one_gathered_block() -> None:
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(100), batch_size=16)
    rb.extend(maddpg_td(50))
    sample = rb.storage.get(torch.arange(16))
    leaves = list(sample.values(include_nested=True, leaves_only=True))
    assert all(t.is_contiguous() for t in leaves)
    # one gathered block behind every leaf: they lie side by side (a few bytes of alignment)
    start = min(t.data_ptr() for t in leaves)
    stop = max(t.data_ptr() + t.numel() * t.element_size() for t in leaves)
    assert stop - start < 1.1 * sum(t.numel() * t.element_size() for t in leaves)
    strided = MarlbufStorage(100, contiguous=False)
    strided.set(torch.arange(50), maddpg_td(50))
    observation = strided.get(torch.arange(16))["agents", "observation"]
    assert not observation.is_contiguous()  # a view of whole gathered rows
    assert torch.equal(observation, sample["agents", "observation"])


def test_no_next_keys_stores_without_next_observations() -> None:
    data = TensorDict(
        {"a": torch.arange(20.0).reshape(10, 2), "b": {"c": torch.arange(10)}}, batch_size=[10]
    )
    ours, ref = pair(16)
    ours.extend(data)
    ref.extend(data)
    assert ours.storage.buffer.next_obs == "none"
    assert_same(ours[:], ref[:])


@pytest.mark.parametrize(
    "sampler", [RandomSampler, SamplerWithoutReplacement], ids=["random", "without_replacement"]
)
def test_torchrls_own_samplers_draw_the_same_batches(sampler: Any) -> None:
    batches = []
    for storage in (MarlbufStorage(300), LazyTensorStorage(300)):
        torch.manual_seed(3)
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler(), batch_size=32)
        rb.extend(maddpg_td(200, seed=1))
        rb.extend(maddpg_td(200, seed=2))  # wraps around
        batches.append([rb.sample() for _ in range(5)])
    for got, want in zip(*batches):
        assert_same(got, want)


def test_prioritized_sampler_of_torchrl_where_it_loads() -> None:
    try:
        PrioritizedSampler(16, 0.6, 0.4)
    except RuntimeError as exc:  # the compiled extension does not load against this torch
        assert "SegmentTree" in str(exc)
        pytest.skip(f"TorchRL's PrioritizedSampler does not load here: {exc}")
    ours = TensorDictReplayBuffer(
        storage=MarlbufStorage(64), sampler=PrioritizedSampler(64, 0.6, 0.4), batch_size=8
    )
    ours.extend(maddpg_td(40))
    sample = ours.sample()
    sample["td_error"] = torch.rand(8)
    ours.update_tensordict_priority(sample)


def test_loss_keys_stay_out_of_stored_rows() -> None:
    data = maddpg_td(20)
    data["td_error"] = torch.rand(20)
    data["agents", "td_error"] = torch.rand(20, 3)
    data["index"] = torch.arange(20)
    ours = TensorDictReplayBuffer(
        storage=MarlbufStorage(50), sampler=MarlbufPrioritizedSampler(50, 0.6, 0.4), batch_size=8
    )
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(50), batch_size=8)
    ours.extend(data)  # its td_error sets the priorities, and is not stored
    ref.extend(data.exclude("td_error", ("agents", "td_error"), "index"))
    np.testing.assert_allclose(
        ours.sampler.priority(torch.arange(20)).numpy(),
        (data["td_error"].double().numpy() + 1e-8) ** 0.6,
        rtol=1e-6,
    )
    assert_same(ours.storage.get(torch.arange(20)), ref.storage.get(torch.arange(20)))
    sample = ours.sample()
    sample["td_error"] = torch.rand(8)  # what a loss writes: the stored rows never see it
    ours.extend(maddpg_td(5, seed=4))  # later writes may leave them out
    assert "td_error" not in ours.storage.get(torch.arange(25)).keys()


# ------------------------------------------------------------------------------ errors
def test_a_key_added_later_is_named() -> None:
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(50), batch_size=4)
    rb.extend(maddpg_td(10))
    later = maddpg_td(5)
    later["agents", "mask"] = torch.ones(5, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"key \('agents', 'mask'\) was not in the first"):
        rb.extend(later)
    assert len(rb) == 10 and rb.storage.buffer.cursor == 10  # nothing written


def test_a_missing_key_a_changed_shape_and_dtype_are_named() -> None:
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(50), batch_size=4)
    rb.extend(maddpg_td(10))
    with pytest.raises(ValueError, match=r"key \('next', 'done'\) is missing"):
        rb.storage.set(torch.arange(10, 15), maddpg_td(5).exclude(("next", "done")))
    with pytest.raises(ValueError, match=r"key \('agents', 'observation'\) has per-item shape"):
        rb.storage.set(torch.arange(10, 15), maddpg_td(5, obs_dim=7))
    wrong = maddpg_td(5)
    wrong["agents", "action"] = wrong["agents", "action"].double()
    with pytest.raises(ValueError, match=r"key \('agents', 'action'\) has dtype torch.float64"):
        rb.storage.set(torch.arange(10, 15), wrong)
    assert len(rb) == 10


def test_writes_at_chosen_indices_are_refused() -> None:
    storage = MarlbufStorage(50)
    storage.set(torch.arange(10), maddpg_td(10))
    with pytest.raises(ValueError, match="ring order"):
        storage.set(torch.arange(20, 25), maddpg_td(5))
    with pytest.raises(ValueError, match="not supported"):
        storage[torch.arange(3)] = maddpg_td(3)
    assert len(storage) == 10


def test_reads_outside_the_stored_items_and_of_an_empty_storage() -> None:
    storage = MarlbufStorage(50)
    with pytest.raises(NotEnoughDataError, match="empty MarlbufStorage"):
        storage.get(torch.arange(3))
    storage.set(torch.arange(10), maddpg_td(10))
    with pytest.raises(StorageIndexError, match=r"index 10 is outside the 10 stored items"):
        storage.get(torch.tensor([1, 10]))
    with pytest.raises(IndexError):
        storage.get(-11)
    assert storage.get(torch.empty(0, dtype=torch.long)).batch_size == torch.Size([0])
    assert storage.contains(9) and not storage.contains(10)
    assert storage.contains(torch.tensor([-1, 12])).tolist() == [True, False]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="next_obs must be one of"):
        MarlbufStorage(10, next_obs="none")
    with pytest.raises(ValueError, match="positive whole number"):
        MarlbufStorage(0)
    with pytest.raises(TypeError, match="exclude_keys"):
        MarlbufStorage(10, exclude_keys="td_error")
    if not HAS_CUDA:
        with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False"):
            MarlbufStorage(10, device="cuda")
    with pytest.raises(ValueError, match="path= keeps rows"):
        MarlbufStorage(10, path="x", backend="torch")
    with pytest.raises(TypeError, match="stores TensorDicts"):
        MarlbufStorage(10).set(0, torch.zeros(3))
    with pytest.raises(ValueError, match=r"'note' holds \w+, not a tensor"):
        data = maddpg_td(3)
        data["note"] = "text"
        MarlbufStorage(10).set(torch.arange(3), data)


# ------------------------------------------------------------------------------ state
def test_state_dict_round_trips_through_torch_save_with_weights_only() -> None:
    rb = TensorDictReplayBuffer(
        storage=MarlbufStorage(64),
        sampler=MarlbufPrioritizedSampler(64, 0.7, 0.5, seed=1),
        batch_size=8,
    )
    rb.extend(maddpg_td(50))
    rb.extend(maddpg_td(30, seed=5))  # wraps around
    sample = rb.sample()
    sample["td_error"] = torch.rand(8)
    rb.update_tensordict_priority(sample)
    blob = io.BytesIO()
    torch.save(rb.state_dict(), blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)
    twin = TensorDictReplayBuffer(
        storage=MarlbufStorage(64), sampler=MarlbufPrioritizedSampler(64, 0.7, 0.5), batch_size=8
    )
    twin.load_state_dict(state)
    assert_same(twin[:], rb[:])
    everything = torch.arange(64)
    assert torch.equal(twin.sampler.priority(everything), rb.sampler.priority(everything))
    assert_same(twin.sample(), rb.sample())  # the same draws after the same state
    rb.extend(maddpg_td(7, seed=9))
    twin.extend(maddpg_td(7, seed=9))
    assert_same(twin[:], rb[:])


def test_dumps_and_loads_through_the_replay_buffer(tmp_path: Any) -> None:
    def build() -> Any:
        return TensorDictReplayBuffer(
            storage=MarlbufStorage(64),
            sampler=MarlbufPrioritizedSampler(64, 0.7, 0.5, seed=2),
            batch_size=8,
        )

    rb = build()
    rb.extend(maddpg_td(80))
    sample = rb.sample()
    sample["td_error"] = torch.rand(8)
    rb.update_tensordict_priority(sample)
    rb.dumps(tmp_path / "rb")
    loaded = build()
    loaded.loads(tmp_path / "rb")
    assert len(loaded) == 64
    assert_same(loaded[:], rb[:])
    everything = torch.arange(64)
    assert torch.equal(loaded.sampler.priority(everything), rb.sampler.priority(everything))
    assert_same(loaded.sample(), rb.sample())
    empty = TensorDictReplayBuffer(storage=MarlbufStorage(64), batch_size=8)
    empty.dumps(tmp_path / "empty")
    other = TensorDictReplayBuffer(storage=MarlbufStorage(64), batch_size=8)
    other.loads(tmp_path / "empty")
    assert len(other) == 0


def test_foreign_states_are_refused_and_change_nothing() -> None:
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(32), batch_size=4)
    rb.extend(maddpg_td(10))
    lazy = LazyTensorStorage(32)
    lazy.set(torch.arange(4), maddpg_td(4))
    with pytest.raises(ValueError, match="not a MarlbufStorage state"):
        rb.storage.load_state_dict(lazy.state_dict())
    with pytest.raises(ValueError, match="max_size=16"):
        rb.storage.load_state_dict(MarlbufStorage(16).state_dict())
    assert len(rb) == 10


def test_copy_pickle_and_empty() -> None:
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(32), batch_size=4)
    rb.extend(maddpg_td(10))
    clone = pickle.loads(pickle.dumps(rb.storage))
    assert_same(clone.get(torch.arange(10)), rb.storage.get(torch.arange(10)))
    assert_same(copy.deepcopy(rb.storage).get(torch.arange(10)), rb.storage.get(torch.arange(10)))
    rb.empty()
    assert len(rb) == 0
    rb.extend(maddpg_td(5, seed=3))
    ref = LazyTensorStorage(32)
    ref.set(torch.arange(5), maddpg_td(5, seed=3))
    assert_same(rb.storage.get(torch.arange(5)), ref.get(torch.arange(5)))


def test_memory_mapped_rows(tmp_path: Any) -> None:
    folder = tmp_path / "rows"
    rb = TensorDictReplayBuffer(storage=MarlbufStorage(64, path=folder), batch_size=8)
    rb.extend(maddpg_td(100))
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(64), batch_size=8)
    ref.extend(maddpg_td(100))
    assert rb.storage.buffer.path == str(folder)
    assert_same(rb[:], ref[:])
    rb.dumps(tmp_path / "saved")
    rb.empty()
    rb.extend(maddpg_td(3, seed=4))
    assert len(rb) == 3
    loaded = TensorDictReplayBuffer(storage=MarlbufStorage(64), batch_size=8)
    loaded.loads(tmp_path / "saved")
    assert_same(loaded[:], ref[:])
    rb.storage.buffer.close()


@pytest.mark.parametrize("contiguous", [True, False])
def test_torch_backend_on_the_cpu_equals_the_numpy_one(contiguous: bool) -> None:
    ours, ref = pair(40, backend="torch", contiguous=contiguous)
    for seed in range(3):
        data = maddpg_td(25, seed=seed)
        ours.extend(data)
        ref.extend(data)
    index = torch.randint(0, 40, (33,))
    assert_same(ours.storage.get(index), ref.storage.get(index))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA)])
def test_rows_on_a_gpu_equal_lazy_tensor_storage_there(device: str) -> None:
    ours = TensorDictReplayBuffer(storage=MarlbufStorage(40, device=device), batch_size=8)
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(40, device=device), batch_size=8)
    for seed in range(3):
        data = maddpg_td(25, seed=seed)
        ours.extend(data)
        ref.extend(data)
    index = torch.randint(0, 40, (33,), device=device)
    assert_same(ours.storage.get(index), ref.storage.get(index))


def test_storage_overrides_what_touches_tensor_storage_internals() -> None:
    """Every method and property TensorStorage defines is MarlbufStorage's own, except those
    that only call the ones overridden (a new TorchRL method fails here until checked)."""
    inherited_on_purpose = {
        "__init__",  # called with storage=None; every attribute it sets is overridden or used
        "_is_full",  # len(self) == max_size
        "_len_along_dim0",  # len(self) for ndim=1
        "_max_size_along_dim0",  # max_size for ndim=1
        "_rand_given_ndim",  # Storage's randint over len(self) for ndim=1
        "_rand_given_ndim_impl",
        "_storage_keys",  # None: nothing is a locked TensorDict
        "_set_tree_map",  # reached only from TensorStorage.set
        "_get_new_len",  # reached only from TensorStorage.set
        "_wait_for_init",  # LazyTensorStorage's shared initialisation only
        "_raise_informative_lock_error",  # reached only from TensorStorage.set
        "_conditional_patch_leaf",  # conditional updates: supports_conditional_update=False
        "_validate_conditional_patch",
        "_apply_conditional_patch",
    }
    own = vars(MarlbufStorage)
    for name, value in vars(TensorStorage).items():
        if name.startswith("__") and name not in ("__init__", "__len__", "__getstate__"):
            continue
        if callable(value) or isinstance(value, property):
            assert name in own or name in inherited_on_purpose, name


def test_prioritized_sampler_overrides_what_touches_torchrls_trees() -> None:
    own = {
        **vars(MarlbufPrioritizedSampler),
    }
    for name, value in vars(PrioritizedSampler).items():
        if name.startswith("__") and name not in ("__init__", "__getstate__", "__repr__"):
            continue
        if callable(value) or isinstance(value, (property, staticmethod, classmethod)):
            allowed = name in (
                "_tree_argmax",  # read TorchRL's trees: reached only from methods overridden
                "_retransform_priority_trees",
                "_recompute_max_priority_from_tree",
                "_maybe_erase_max_priority",
                "_max_priority",
                "_tree_device_from_storage",
            )
            assert name in own or allowed, name


# ------------------------------------------------------------------------------ samplers
def test_block_minima_against_the_naive_twin() -> None:
    rng = np.random.default_rng(0)
    for capacity, block in ((1, 1), (5, 2), (13, 4), (100, 8), (64, 64)):
        n_blocks = -(-capacity // block)
        leaves = np.zeros(capacity)
        written = np.full(capacity, -1, dtype=np.int64)
        block_min = np.full(n_blocks, np.inf)
        block_arg = np.full(n_blocks, -1, dtype=np.int64)
        dirty = np.zeros(n_blocks, dtype=np.bool_)
        for step in range(60):
            slots = rng.integers(0, capacity, size=rng.integers(1, 6))
            values = rng.choice([0.5, 1.0, 2.0, 3.0], size=slots.shape[0])  # ties too
            leaves[slots] = values  # the last duplicate wins
            written[slots] = step
            lower_block_mins(block_min, block_arg, dirty, slots, leaves[slots], block)
            if rng.random() < 0.5:
                got = refresh_block_mins(leaves, written, block_min, block_arg, dirty, block)
                assert got == naive_written_min(leaves, written)


def prioritized_buffer(capacity: int, **kwargs: Any) -> Any:
    rb = TensorDictReplayBuffer(
        storage=MarlbufStorage(capacity),
        sampler=MarlbufPrioritizedSampler(capacity, kwargs.pop("alpha", 0.6), 0.4, **kwargs),
        batch_size=16,
        priority_key="td_error",
    )
    rb.extend(maddpg_td(capacity))
    return rb


def test_prioritized_draws_follow_p_alpha_by_chi_square() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    capacity, alpha, eps = 40, 0.7, 1e-8
    rb = prioritized_buffer(capacity, alpha=alpha, seed=4)
    priorities = torch.linspace(0.05, 3.0, capacity, dtype=torch.float64)
    rb.update_priority(torch.arange(capacity), priorities)
    counts = np.zeros(capacity)
    for _ in range(200):
        index, _ = rb.sampler.sample(rb.storage, 1000)
        counts += np.bincount(index.numpy(), minlength=capacity)
    expected_p = (priorities.numpy() + eps) ** alpha
    expected = counts.sum() * expected_p / expected_p.sum()
    assert scipy_stats.chisquare(counts, expected).pvalue > 1e-3


def test_prioritized_weights_match_torchrls_formula() -> None:
    capacity, alpha, beta, eps = 30, 0.6, 0.4, 1e-8
    rb = prioritized_buffer(capacity, alpha=alpha)
    priorities = torch.rand(capacity, dtype=torch.float64) * 2
    rb.update_priority(torch.arange(capacity), priorities)
    index, info = rb.sampler.sample(rb.storage, 64)
    leaves = (priorities.numpy() + eps) ** alpha
    want = (leaves[index.numpy()] / leaves.min()) ** -beta
    np.testing.assert_allclose(info["priority_weight"].numpy(), want, rtol=1e-6)
    assert info["priority_weight"].dtype == torch.float32
    np.testing.assert_allclose(rb.sampler.priority(torch.arange(capacity)).numpy(), leaves)


def test_priorities_flow_back_through_the_priority_key() -> None:
    rb = prioritized_buffer(50)
    for _ in range(5):
        sample = rb.sample()
        sample["td_error"] = torch.rand(16)
        rb.update_tensordict_priority(sample)
        got = rb.sampler.priority(sample["index"]).numpy()
        # the last value of a repeated index wins
        last = {int(i): float(p) for i, p in zip(sample["index"], sample["td_error"])}
        want = [(last[int(i)] + 1e-8) ** 0.6 for i in sample["index"]]
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_new_items_get_the_running_maximum_priority() -> None:
    rb = prioritized_buffer(20)
    assert rb.sampler.default_priority == pytest.approx(1.0)
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([5.0, 0.5]))
    assert rb.sampler.default_priority == pytest.approx(5.0)
    rb.extend(maddpg_td(3, seed=2))  # overwrites slots 0..2
    np.testing.assert_allclose(
        rb.sampler.priority(torch.arange(3)).numpy(), (5.0 + 1e-8) ** 0.6, rtol=1e-12
    )


def test_updates_of_overwritten_slots_are_dropped() -> None:
    rb = prioritized_buffer(20, seed=0)
    index, _ = rb.sampler.sample(rb.storage, 16)
    first = index.clone()
    rb.extend(maddpg_td(5, seed=3))  # slots 0..4 overwritten since the draw
    later, _ = rb.sampler.sample(rb.storage, 16)  # another draw in between (prefetching)
    before = rb.sampler.priority(torch.arange(20)).clone()
    rb.update_priority(first, torch.full((16,), 9.0))
    after = rb.sampler.priority(torch.arange(20))
    written = torch.zeros(20, dtype=torch.bool)
    written[:5] = True
    changed = after != before
    assert not (changed & written).any()  # overwritten slots kept their new-item priority
    assert changed[first[first >= 5]].all()
    rb.update_priority(later, torch.full((16,), 2.0))  # a later draw still updates
    assert (rb.sampler.priority(later) == (2.0 + 1e-8) ** 0.6).all()


def test_prioritized_sampler_works_over_lazy_tensor_storage() -> None:
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64),
        sampler=MarlbufPrioritizedSampler(64, 0.6, 0.4, seed=0),
        batch_size=16,
        priority_key="td_error",
    )
    rb.extend(maddpg_td(100))
    sample = rb.sample()
    assert sample["priority_weight"].shape == (16,)
    sample["td_error"] = torch.rand(16)
    rb.update_tensordict_priority(sample)


def test_prioritized_sampler_arguments_and_alpha_changes() -> None:
    with pytest.raises(ValueError, match="alpha must be"):
        MarlbufPrioritizedSampler(10, -1.0, 0.4)
    with pytest.raises(ValueError, match="max_priority_within_buffer=True is not supported"):
        MarlbufPrioritizedSampler(10, 0.6, 0.4, max_priority_within_buffer=True)
    with pytest.raises(ValueError, match="reduction must be one of"):
        MarlbufPrioritizedSampler(10, 0.6, 0.4, reduction="sum")
    rb = prioritized_buffer(20)
    with pytest.raises(ValueError, match="td_errors must be finite"):
        rb.update_priority(torch.arange(2), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match=r"index must lie in \[0, 20\)"):
        rb.update_priority(torch.tensor([25]), torch.tensor([1.0]))
    priorities = torch.rand(20, dtype=torch.float64) + 0.1
    rb.update_priority(torch.arange(20), priorities)
    rb.sampler.alpha = 0.9
    np.testing.assert_allclose(
        rb.sampler.priority(torch.arange(20)).numpy(), (priorities.numpy() + 1e-8) ** 0.9
    )
    rb.sampler.beta = 0.8
    index, info = rb.sampler.sample(rb.storage, 8)
    leaves = (priorities.numpy() + 1e-8) ** 0.9
    np.testing.assert_allclose(
        info["priority_weight"].numpy(), (leaves[index.numpy()] / leaves.min()) ** -0.8, rtol=1e-6
    )
    assert isinstance(rb.sampler, PrioritizedSampler)
    assert inspect.signature(MarlbufPrioritizedSampler).parameters.keys() >= set(
        inspect.signature(PrioritizedSampler).parameters
    )


def test_neighbor_and_memory_order_samplers() -> None:
    rb = TensorDictReplayBuffer(
        storage=MarlbufStorage(100), sampler=MarlbufNeighborSampler(4, seed=1), batch_size=32
    )
    rb.extend(maddpg_td(60))
    index = rb.sample()["index"].reshape(8, 4)
    assert ((index[:, 1:] - index[:, :-1]) == 1).all()  # runs of 4 consecutive items
    assert (index[:, -1] < 60).all()
    with pytest.raises(ValueError, match="must divide batch_size"):
        rb.sampler.sample(rb.storage, 30)
    rb = TensorDictReplayBuffer(
        storage=MarlbufStorage(100), sampler=MarlbufUniformSampler(seed=1), batch_size=32
    )
    rb.extend(maddpg_td(60))
    index = rb.sample()["index"]
    assert (index[1:] >= index[:-1]).all() and index.max() < 60
    twin = TensorDictReplayBuffer(
        storage=MarlbufStorage(100), sampler=MarlbufUniformSampler(seed=1), batch_size=32
    )
    twin.extend(maddpg_td(60))
    assert torch.equal(twin.sample()["index"], index)


def test_prioritized_neighbor_sampler_feeds_priorities_back() -> None:
    rb = TensorDictReplayBuffer(
        storage=MarlbufStorage(100),
        sampler=MarlbufPrioritizedNeighborSampler(100, 0.6, 0.4, seed=2),
        batch_size=32,
        priority_key="td_error",
    )
    rb.extend(maddpg_td(80))
    sample = rb.sample()
    assert (sample["priority_weight"] <= 1).all()
    sample["td_error"] = torch.rand(32)
    rb.update_tensordict_priority(sample)


def test_a_replay_buffer_generator_decides_the_draws() -> None:
    drawn = []
    for _ in range(2):
        rb = TensorDictReplayBuffer(
            storage=MarlbufStorage(100),
            sampler=MarlbufPrioritizedSampler(100, 0.6, 0.4),
            batch_size=16,
            generator=torch.Generator().manual_seed(7),
        )
        rb.extend(maddpg_td(90))
        drawn.append([rb.sample()["index"] for _ in range(3)])
    assert all(torch.equal(a, b) for a, b in zip(*drawn))


def test_the_storage_docstring_example_runs() -> None:
    import doctest

    import marlbuf.compat.torchrl.storage as module

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
