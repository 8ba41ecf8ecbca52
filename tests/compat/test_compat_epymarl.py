"""marlbuf.compat.epymarl against a padded episode ring written here from the semantics of
EPyMARL's episode buffer: field by field, with the same draws, and through a short QMIX-style
learner loop that must give the same losses and parameters on both."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from marlbuf.compat.epymarl import EpisodeBatch, ReplayBuffer  # noqa: E402

N_AGENTS, N_ACTIONS, OBS, STATE = 3, 5, 6, 8
LIMIT = 12  # episode limit: episodes hold up to LIMIT transitions + the final observation
MAX_T = LIMIT + 1


class OneHot:
    """A transform with EPyMARL's interface: integer actions (..., 1) -> one-hot (..., n)."""

    def __init__(self, out_dim: int) -> None:
        self.out_dim = out_dim

    def transform(self, tensor: Any) -> Any:
        out = tensor.new_zeros(*tensor.shape[:-1], self.out_dim)
        out.scatter_(-1, tensor.long(), 1)
        return out.float()

    def infer_output_info(self, vshape: Any, dtype: Any) -> tuple[tuple[int, ...], Any]:
        return (self.out_dim,), torch.float32


SCHEME = {
    "state": {"vshape": STATE},
    "obs": {"vshape": OBS, "group": "agents"},
    "actions": {"vshape": (1,), "group": "agents", "dtype": torch.long},
    "avail_actions": {"vshape": (N_ACTIONS,), "group": "agents", "dtype": torch.int},
    "reward": {"vshape": (1,)},
    "terminated": {"vshape": (1,), "dtype": torch.uint8},
}
GROUPS = {"agents": N_AGENTS}
PREPROCESS = {"actions": ("actions_onehot", [OneHot(N_ACTIONS)])}


# ------------------------------------------------------------------ the reference
class RefBatch:
    """Padded episodes as tensors ``(B, T, ...)``, with the read interface EPyMARL's learners
    use (key and time-slice indexing, ``max_t_filled``, sizes)."""

    def __init__(self, data: dict[str, Any], batch_size: int, max_seq_length: int) -> None:
        self.data, self.batch_size, self.max_seq_length = data, batch_size, max_seq_length

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, str):
            return self.data[item]
        rows, steps = item if isinstance(item, tuple) else (item, slice(None))
        data = {k: v[rows][:, steps] for k, v in self.data.items()}
        first = next(iter(data.values()))
        return RefBatch(data, first.shape[0], first.shape[1])

    def max_t_filled(self) -> Any:
        return self.data["filled"].sum(1).max(0)[0]


class PaddedRing:
    """A ring of ``size`` padded episodes (``MAX_T`` steps each): an insert copies every step
    of each episode, padding included, to the next positions (wrapping); the preprocessed
    field is computed over the whole inserted slice and then replaced by the episode's own
    copy, as the episode's fields are written in scheme order; a sample draws distinct
    positions with ``np.random.choice(n, B, replace=False)``, or takes ``[:B]`` when ``B`` is
    every stored episode."""

    def __init__(self, size: int) -> None:
        self.size, self.index, self.episodes_in_buffer = size, 0, 0
        self.data: dict[str, Any] = {}
        for key, info in SCHEME.items():
            vshape = info["vshape"] if isinstance(info["vshape"], tuple) else (info["vshape"],)
            shape = ((N_AGENTS,) if "group" in info else ()) + vshape
            self.data[key] = torch.zeros(size, MAX_T, *shape, dtype=info.get("dtype", torch.float))
        self.data["actions_onehot"] = torch.zeros(size, MAX_T, N_AGENTS, N_ACTIONS)
        self.data["filled"] = torch.zeros(size, MAX_T, 1, dtype=torch.long)

    def insert(self, episodes: dict[str, Any]) -> None:
        count = episodes["filled"].shape[0]
        for e in range(count):
            slot = self.index
            for key, value in episodes.items():
                self.data[key][slot] = value[e]
                if key == "actions":
                    self.data["actions_onehot"][slot] = OneHot(N_ACTIONS).transform(value[e])
            self.index = (self.index + 1) % self.size
            self.episodes_in_buffer = min(self.size, self.episodes_in_buffer + 1)

    def sample(self, batch_size: int) -> RefBatch:
        if self.episodes_in_buffer == batch_size:
            ids: Any = slice(0, batch_size)
        else:
            ids = np.random.choice(self.episodes_in_buffer, batch_size, replace=False)  # noqa: NPY002 - EPyMARL draws from the global generator
        return RefBatch({k: v[ids] for k, v in self.data.items()}, batch_size, MAX_T)


# ------------------------------------------------------------------ episodes like a runner's
def runner_batch(rng: np.random.Generator, count: int, lengths: Any = None) -> SimpleNamespace:
    """``count`` episodes as an EPyMARL runner fills its batch: ``length`` transitions then
    the final state/obs/avail_actions (and an action) at row ``length``; ``filled`` on rows
    ``0 .. length``; ``terminated`` on the last transition unless the limit cut it."""
    if lengths is None:
        lengths = rng.integers(3, LIMIT + 1, size=count)
    data = {
        "state": torch.zeros(count, MAX_T, STATE),
        "obs": torch.zeros(count, MAX_T, N_AGENTS, OBS),
        "actions": torch.zeros(count, MAX_T, N_AGENTS, 1, dtype=torch.long),
        "avail_actions": torch.zeros(count, MAX_T, N_AGENTS, N_ACTIONS, dtype=torch.int),
        "reward": torch.zeros(count, MAX_T, 1),
        "terminated": torch.zeros(count, MAX_T, 1, dtype=torch.uint8),
        "actions_onehot": torch.zeros(count, MAX_T, N_AGENTS, N_ACTIONS),
        "filled": torch.zeros(count, MAX_T, 1, dtype=torch.long),
    }
    for e, length in enumerate(lengths):
        rows = int(length) + 1
        data["state"][e, :rows] = torch.from_numpy(rng.normal(size=(rows, STATE))).float()
        data["obs"][e, :rows] = torch.from_numpy(rng.normal(size=(rows, N_AGENTS, OBS))).float()
        avail = rng.random((rows, N_AGENTS, N_ACTIONS)) < 0.7
        avail[..., 0] = True
        data["avail_actions"][e, :rows] = torch.from_numpy(avail.astype(np.int32))
        actions = rng.integers(0, N_ACTIONS, size=(rows, N_AGENTS, 1))
        data["actions"][e, :rows] = torch.from_numpy(actions)
        data["actions_onehot"][e, :rows] = OneHot(N_ACTIONS).transform(data["actions"][e, :rows])
        data["reward"][e, : rows - 1] = torch.from_numpy(rng.normal(size=(rows - 1, 1))).float()
        data["terminated"][e, rows - 2] = int(length < LIMIT)
        data["filled"][e, :rows] = 1
    return SimpleNamespace(
        batch_size=count,
        max_seq_length=MAX_T,
        data=SimpleNamespace(transition_data=data, episode_data={}),
    )


def make(size: int, **kwargs: Any) -> ReplayBuffer:
    return ReplayBuffer(SCHEME, GROUPS, size, MAX_T, preprocess=PREPROCESS, **kwargs)


def fill(buffers: tuple[ReplayBuffer, PaddedRing], inserts: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(inserts):
        episodes = runner_batch(rng, int(rng.integers(1, 5)))
        buffers[0].insert_episode_batch(episodes)
        buffers[1].insert(episodes.data.transition_data)


def same_batch(got: EpisodeBatch, want: RefBatch, contiguous: bool = False) -> None:
    assert got.batch_size == want.batch_size and got.max_seq_length == want.max_seq_length
    assert set(got.data.transition_data) == set(want.data)
    for key, value in want.data.items():
        tensor = got[key]
        assert tensor.dtype == value.dtype and tensor.shape == value.shape, key
        assert tensor.is_contiguous() or not contiguous, key  # learners may call view()
        assert torch.equal(tensor, value), key
    assert torch.equal(got.max_t_filled(), want.max_t_filled())


# ------------------------------------------------------------------ field by field
@pytest.mark.parametrize("size", [7, 40])
def test_batches_equal_the_padded_ring_field_by_field(size: int) -> None:
    """Inserts of 1-4 episodes (crossing the ring's end), samples with the same draws: every
    field, dtype, shape, filled mask, episodes_in_buffer and can_sample agree."""
    buffers = (make(size), PaddedRing(size))
    for round_ in range(6):
        fill(buffers, 5, seed=round_)
        assert buffers[0].episodes_in_buffer == buffers[1].episodes_in_buffer
        for batch_size in (1, 4, buffers[1].episodes_in_buffer):
            assert buffers[0].can_sample(batch_size)
            np.random.seed(round_ * 10 + batch_size)  # noqa: NPY002 - both buffers draw from it
            got = buffers[0].sample(batch_size)
            np.random.seed(round_ * 10 + batch_size)  # noqa: NPY002 - both buffers draw from it
            want = buffers[1].sample(batch_size)
            same_batch(got, want, contiguous=True)
            assert len(set(buffers[0].last_episode_ids.tolist())) == batch_size
        assert not buffers[0].can_sample(buffers[1].episodes_in_buffer + 1)


def test_one_kernel_call_per_insert_and_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """An insert of several episodes is one call of the store kernel, a sample one call of
    the gather kernel, whatever the number of fields and steps."""
    from marlbuf.compat import epymarl

    calls = {"store": 0, "gather": 0}
    store, gather = epymarl.store_episodes, epymarl.gather_episodes

    def counted(name: str, kernel: Any) -> Any:
        def call(*args: Any) -> Any:
            calls[name] += 1
            return kernel(*args)

        return call

    monkeypatch.setattr(epymarl, "store_episodes", counted("store", store))
    monkeypatch.setattr(epymarl, "gather_episodes", counted("gather", gather))
    buf = make(40)
    rng = np.random.default_rng(0)
    for inserts in range(1, 6):
        buf.insert_episode_batch(runner_batch(rng, 4))
        assert calls["store"] == inserts
    buf.sample(8)
    assert calls["gather"] == 1
    # a preprocessed one-hot field is computed by the gather kernel: no transform call
    assert set(buf._one_hot) == {"actions_onehot"} and not buf._transformed


def test_indexing_as_the_learners_do() -> None:
    buffers = (make(20), PaddedRing(20))
    fill(buffers, 6)
    np.random.seed(3)  # noqa: NPY002 - both buffers draw from it
    got = buffers[0].sample(8)
    np.random.seed(3)  # noqa: NPY002 - both buffers draw from it
    want = buffers[1].sample(8)
    max_t = got.max_t_filled()
    same_batch(got[:, :max_t], want[:, : int(max_t)])
    same_batch(got[[0, 2, 5]], want[[0, 2, 5]])
    same_batch(got[np.array([1, 3])], want[np.array([1, 3])])
    same_batch(got[2:6, 1:4], want[2:6, 1:4])
    assert got[1].batch_size == 1 and got[:, 3].max_seq_length == 1
    assert torch.equal(got["obs"][:, 4], want["obs"][:, 4])
    pair = got[("obs", "state")]
    assert set(pair.data.transition_data) == {"obs", "state"} and pair.groups == GROUPS
    got.to("cpu")
    assert (
        got.device == "cpu" and "EpisodeBatch" in repr(got) and "ReplayBuffer" in repr(buffers[0])
    )
    with pytest.raises(IndexError, match="contiguous"):
        got[:, [0, 1]]
    with pytest.raises(KeyError):
        got[("obs", "nothing")]


def test_a_smaller_capacity_keeps_only_what_it_holds() -> None:
    """capacity_steps below buffer_size * max_seq_length: episodes the ring overwrote leave
    the count and are never drawn; the rest still equal the reference."""
    small = make(30, capacity_steps=60)
    ring = PaddedRing(30)
    fill((small, ring), 12, seed=4)
    held = small.episodes_in_buffer
    assert 0 < held < ring.episodes_in_buffer
    full = make(30)
    fill((full, PaddedRing(30)), 12, seed=4)
    assert small.nbytes <= (60 + MAX_T) * small.row_bytes < full.nbytes / 3
    for _ in range(20):
        batch = small.sample(min(held, 5))
        for b, position in enumerate(small.last_episode_ids.tolist()):
            for key, value in batch.data.transition_data.items():
                assert torch.equal(value[b], ring.data[key][position]), key


def test_own_generator_and_bad_input() -> None:
    buf = make(10, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    buf.insert_episode_batch(runner_batch(rng, 3))
    assert sorted(buf.sample(2).data.transition_data) == sorted(
        [*SCHEME, "actions_onehot", "filled"]
    )
    with pytest.raises(ValueError, match="3 are stored"):
        buf.sample(4)
    bad = runner_batch(rng, 1)
    bad.data.transition_data["filled"][0, -1] = 1  # a gap before the last step
    with pytest.raises(ValueError, match="prefix"):
        buf.insert_episode_batch(bad)
    extra = runner_batch(rng, 1)
    extra.data.transition_data["nothing"] = torch.zeros(1, MAX_T, 1)
    with pytest.raises(KeyError, match="nothing"):
        buf.insert_episode_batch(extra)
    with pytest.raises(ValueError, match="reserved"):
        ReplayBuffer({**SCHEME, "filled": {"vshape": 1}}, GROUPS, 5, MAX_T)
    with pytest.raises(ValueError, match="group"):
        ReplayBuffer({"obs": {"vshape": 2, "group": "enemies"}}, GROUPS, 5, MAX_T)
    with pytest.raises(ValueError, match="vshape"):
        ReplayBuffer({"obs": {"group": "agents"}}, GROUPS, 5, MAX_T)
    with pytest.raises(ValueError, match="capacity_steps"):
        make(10, capacity_steps=20).insert_episode_batch(runner_batch(rng, 4, [LIMIT] * 4))
    assert buf.episodes_in_buffer == 3


# ------------------------------------------------------------------ a QMIX-style learner
class Agent(torch.nn.Module):
    """A recurrent agent network over (obs, last action one-hot, agent id)."""

    def __init__(self) -> None:
        super().__init__()
        width = OBS + N_ACTIONS + N_AGENTS
        self.fc, self.rnn, self.out = (
            torch.nn.Linear(width, 16),
            torch.nn.GRUCell(16, 16),
            torch.nn.Linear(16, N_ACTIONS),
        )

    def forward(self, inputs: Any, hidden: Any) -> tuple[Any, Any]:
        hidden = self.rnn(torch.relu(self.fc(inputs)), hidden)
        return self.out(hidden), hidden


class Mixer(torch.nn.Module):
    """QMIX's monotonic mixer: state-conditioned non-negative weights."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.b1 = torch.nn.Linear(STATE, N_AGENTS * 8), torch.nn.Linear(STATE, 8)
        self.w2, self.b2 = torch.nn.Linear(STATE, 8), torch.nn.Linear(STATE, 1)

    def forward(self, qs: Any, states: Any) -> Any:
        b, t = qs.shape[:2]
        s = states.reshape(-1, STATE)
        hidden = torch.bmm(
            qs.reshape(-1, 1, N_AGENTS), self.w1(s).abs().view(-1, N_AGENTS, 8)
        ) + self.b1(s).view(-1, 1, 8)
        y = torch.bmm(torch.nn.functional.elu(hidden), self.w2(s).abs().view(-1, 8, 1))
        return (y + self.b2(s).view(-1, 1, 1)).view(b, t, 1)


class Learner:
    """One QMIX update per batch, reading the batch only as EPyMARL's learners do."""

    def __init__(self, agent: Agent, mixer: Mixer) -> None:
        self.agent, self.mixer = agent, mixer
        self.target_agent, self.target_mixer = copy.deepcopy(agent), copy.deepcopy(mixer)
        params = [*agent.parameters(), *mixer.parameters()]
        self.optimiser = torch.optim.Adam(params, lr=1e-3)

    def q_values(self, agent: Agent, batch: Any) -> Any:
        hidden = torch.zeros(batch.batch_size * N_AGENTS, 16)
        eye = torch.eye(N_AGENTS).expand(batch.batch_size, -1, -1)
        outs = []
        for t in range(batch.max_seq_length):
            last = (
                batch["actions_onehot"][:, t - 1]
                if t
                else torch.zeros_like(batch["actions_onehot"][:, 0])
            )
            inputs = torch.cat([batch["obs"][:, t], last, eye], dim=-1)
            q, hidden = agent(inputs.reshape(-1, inputs.shape[-1]), hidden)
            outs.append(q.view(batch.batch_size, N_AGENTS, -1))
        return torch.stack(outs, dim=1)

    def train(self, batch: Any) -> float:
        rewards = batch["reward"][:, :-1]
        actions = batch["actions"][:, :-1]
        terminated = batch["terminated"][:, :-1].float()
        mask = batch["filled"][:, :-1].float()
        mask[:, 1:] = mask[:, 1:] * (1 - terminated[:, :-1])
        avail = batch["avail_actions"]
        chosen = torch.gather(self.q_values(self.agent, batch)[:, :-1], 3, actions).squeeze(3)
        target = self.q_values(self.target_agent, batch)[:, 1:]
        target[avail[:, 1:] == 0] = -9999999
        chosen = self.mixer(chosen, batch["state"][:, :-1])
        best = self.target_mixer(target.max(dim=3)[0], batch["state"][:, 1:])
        targets = rewards + 0.99 * (1 - terminated) * best.detach()
        error = (chosen - targets.detach()) * mask
        loss = (error**2).sum() / mask.sum()
        self.optimiser.zero_grad()
        loss.backward()
        self.optimiser.step()
        return float(loss.detach())


def test_a_qmix_learner_loop_gives_the_same_results() -> None:
    """The run loop of EPyMARL (insert, can_sample, sample, cut to max_t_filled, train) on
    both buffers with the same draws: identical losses and parameters at every update."""
    torch.manual_seed(0)
    template = Learner(Agent(), Mixer())
    learners = (copy.deepcopy(template), copy.deepcopy(template))
    buffers = (make(16), PaddedRing(16))
    rng = np.random.default_rng(7)
    updates = 0
    for episode in range(30):
        episodes = runner_batch(rng, 1)
        buffers[0].insert_episode_batch(episodes)
        buffers[1].insert(episodes.data.transition_data)
        if not buffers[0].can_sample(4):
            continue
        losses = []
        for buffer, learner in zip(buffers, learners):
            np.random.seed(episode)  # noqa: NPY002 - both buffers draw from it
            batch = buffer.sample(4)
            max_t = batch.max_t_filled()
            batch = batch[:, : int(max_t)] if isinstance(buffer, PaddedRing) else batch[:, :max_t]
            losses.append(learner.train(batch))
        assert losses[0] == losses[1]
        updates += 1
    assert updates >= 20
    for a, b in zip(learners[0].agent.parameters(), learners[1].agent.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(learners[0].mixer.parameters(), learners[1].mixer.parameters()):
        assert torch.equal(a, b)


def test_episode_constants_and_other_groups() -> None:
    """An ``episode_const`` field comes back once per episode; a field of a group of another
    size is stored as one array per step; both follow the episodes drawn."""
    scheme = {
        **SCHEME,
        "seed": {"vshape": (1,), "episode_const": True, "dtype": torch.long},
        "enemies": {"vshape": (2,), "group": "enemies"},
    }
    groups = {**GROUPS, "enemies": 4}
    buf = ReplayBuffer(scheme, groups, 10, MAX_T, preprocess=PREPROCESS)
    rng = np.random.default_rng(2)
    inserted = []
    for e in range(6):
        episode = runner_batch(rng, 1)
        episode.data.episode_data["seed"] = torch.tensor([[100 + e]])
        enemies = torch.from_numpy(rng.normal(size=(1, MAX_T, 4, 2))).float()
        enemies[0, int(episode.data.transition_data["filled"].sum()) :] = 0
        episode.data.transition_data["enemies"] = enemies
        buf.insert_episode_batch(episode)
        inserted.append(episode)
    batch = buf.sample(4)
    assert batch["seed"].shape == (4, 1) and batch["enemies"].shape == (4, MAX_T, 4, 2)
    for b, position in enumerate(buf.last_episode_ids.tolist()):
        assert int(batch["seed"][b, 0]) == 100 + position
        assert torch.equal(
            batch["enemies"][b], inserted[position].data.transition_data["enemies"][0]
        )
        assert torch.equal(batch["obs"][b], inserted[position].data.transition_data["obs"][0])
    assert batch[1:3]["seed"].shape == (2, 1)  # episode data follow the batch index
    assert set(batch[("seed", "obs")].data.episode_data) == {"seed"}


# ------------------------------------------------------------------ bad input, at the call
def test_an_action_outside_the_one_hot_range_is_refused_at_the_insert() -> None:
    """EPyMARL's insert runs the one-hot transform, which cannot encode an index outside its
    classes: the adapter refuses such an episode at the insert (every later sample drawing it
    would fail otherwise), naming the field, and stores nothing of the batch."""
    buf = make(10)
    rng = np.random.default_rng(5)
    buf.insert_episode_batch(runner_batch(rng, 2))
    stored = buf.episodes([0, 1]).data.transition_data
    before = (buf.episodes_in_buffer, buf.buffer_index, buf.nbytes, buf._table.copy())
    for bad in (N_ACTIONS, -1):
        episodes = runner_batch(rng, 3)
        episodes.data.transition_data["actions"][2, 1, 0, 0] = bad
        with pytest.raises(ValueError, match=r"actions holds an index outside \[0, 5\).*episode 2"):
            buf.insert_episode_batch(episodes)
        assert (buf.episodes_in_buffer, buf.buffer_index, buf.nbytes) == before[:3]
        assert np.array_equal(buf._table, before[3])
        again = buf.episodes([0, 1]).data.transition_data
        assert all(torch.equal(again[k], v) for k, v in stored.items())
    for _ in range(10):
        buf.sample(2)  # every stored episode still samples


def test_nan_is_refused_at_the_insert_and_nothing_changes() -> None:
    buf = make(10)
    rng = np.random.default_rng(6)
    buf.insert_episode_batch(runner_batch(rng, 1))
    episodes = runner_batch(rng, 1)
    episodes.data.transition_data["state"][0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="state holds NaN or inf"):
        buf.insert_episode_batch(episodes)
    assert buf.episodes_in_buffer == 1 and buf.buffer_index == 1


def test_constructor_and_position_edges_are_refused_where_they_are_made() -> None:
    """A group of no members, capacity_steps below one whole episode and positions that are
    not integers are refused at the call that makes them."""
    with pytest.raises(ValueError, match=r"groups\['agents'\] must be a positive int"):
        ReplayBuffer(SCHEME, {"agents": 0}, 5, MAX_T)
    with pytest.raises(ValueError, match=r"groups\['agents'\] must be a positive int"):
        ReplayBuffer(SCHEME, {"agents": 2.0}, 5, MAX_T)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="capacity_steps must be an int of at least"):
        make(10, capacity_steps=MAX_T - 1)
    with pytest.raises(ValueError, match="capacity_steps must be an int of at least"):
        make(10, capacity_steps=float(10 * MAX_T))
    buf = make(10)
    buf.insert_episode_batch(runner_batch(np.random.default_rng(0), 3))
    for ids in ([0.5], np.array([1.0]), [True], [[0, 1]], []):
        with pytest.raises(ValueError, match="int positions"):
            buf.episodes(ids)
    assert buf.episodes([2, 0])["obs"].shape[0] == 2


class Doubled:
    """A transform that is not a one-hot encoding: computed by the transform at each gather."""

    def transform(self, tensor: Any) -> Any:
        if (tensor < 0).any():
            raise RuntimeError("negative values")
        return tensor * 2

    def infer_output_info(self, vshape: Any, dtype: Any) -> tuple[Any, Any]:
        return vshape, dtype


def test_other_transforms_run_at_the_gather_and_check_the_insert() -> None:
    buf = ReplayBuffer(SCHEME, GROUPS, 10, MAX_T, preprocess={"actions": ("twice", [Doubled()])})
    assert set(buf._transformed) == {"twice"} and not buf._one_hot
    rng = np.random.default_rng(3)
    episodes = runner_batch(rng, 2)
    del episodes.data.transition_data["actions_onehot"]  # not in this buffer's scheme
    buf.insert_episode_batch(episodes)
    batch = buf.episodes([0, 1])
    filled = batch["filled"].bool()
    assert torch.equal(batch["twice"], batch["actions"] * 2 * filled.unsqueeze(-1))
    bad = runner_batch(rng, 1)
    del bad.data.transition_data["actions_onehot"]
    bad.data.transition_data["actions"][0, 0, 0, 0] = -3
    with pytest.raises(ValueError, match="preprocess of 'actions' into 'twice' refuses"):
        buf.insert_episode_batch(bad)
    assert buf.episodes_in_buffer == 2


# ------------------------------------------------------------------ EPyMARL's own semantics
def _faithful(size: int) -> Any:
    consumers = pytest.importorskip("marlbuf.bench.baselines.consumers.epymarl")
    return consumers.PaddedReplayBuffer(SCHEME, GROUPS, size, MAX_T, preprocess=PREPROCESS)


@pytest.mark.parametrize("lengths", ["fixed", "mixed"])
def test_equal_to_the_epymarl_faithful_buffer_through_split_inserts(lengths: str) -> None:
    """Against the suite's reproduction of EPyMARL's EpisodeBatch/ReplayBuffer (padded
    tensors, update with view_as, the ring's split insert, np.random.choice draws): batches of
    several episodes crossing the ring's end, fixed or mixed lengths, samples truncated to
    max_t_filled, field by field, dtype and contiguity included."""
    size = 11
    ours, theirs = make(size), _faithful(size)
    rng = np.random.default_rng(9)
    for round_ in range(12):
        count = int(rng.integers(1, 5))
        fixed = [LIMIT] * count if lengths == "fixed" else None
        data = runner_batch(rng, count, fixed).data
        # an EpisodeBatch, as EPyMARL's runners hand over (its split insert slices it)
        episodes = type(theirs).__mro__[1](theirs.scheme, GROUPS, count, MAX_T, data=data)
        ours.insert_episode_batch(episodes)
        theirs.insert_episode_batch(episodes)
        assert ours.episodes_in_buffer == theirs.episodes_in_buffer
        batch_size = min(4, theirs.episodes_in_buffer)
        np.random.seed(round_)  # noqa: NPY002 - both buffers draw from it
        got = ours.sample(batch_size)
        np.random.seed(round_)  # noqa: NPY002 - both buffers draw from it
        want = theirs.sample(batch_size)
        assert torch.equal(got.max_t_filled(), want.max_t_filled())
        for a, b in ((got, want), (got[:, : got.max_t_filled()], want[:, : want.max_t_filled()])):
            assert a.max_seq_length == b.max_seq_length and a.batch_size == b.batch_size
            for key, value in b.data.transition_data.items():
                tensor = a[key]
                assert tensor.dtype == value.dtype and tensor.shape == value.shape, key
                assert torch.equal(tensor, value), key
        for key, value in got.data.transition_data.items():
            assert value.is_contiguous(), key


def test_memory_follows_the_stored_steps() -> None:
    """Mixed lengths: the ring holds what the episodes' steps need (plus an eighth), not
    buffer_size * max_seq_length padded steps as EPyMARL's buffer allocates; fixed lengths
    take what padding would."""
    rng = np.random.default_rng(11)
    mixed, fixed = make(200), make(200)
    for _ in range(300):
        mixed.insert_episode_batch(runner_batch(rng, 1, [int(rng.integers(3, LIMIT + 1))]))
        fixed.insert_episode_batch(runner_batch(rng, 1, [LIMIT]))
    theirs = _faithful(200)
    padded = sum(v.nbytes for v in theirs.data.transition_data.values())
    assert mixed.nbytes <= 0.7 * padded
    assert fixed.nbytes <= 200 * MAX_T * fixed.row_bytes  # never more rows than padding


@pytest.mark.parametrize("capacity_steps", [None, 5 * MAX_T])
def test_episodes_growing_longer_are_packed_and_stay_right(capacity_steps: Any) -> None:
    """Short episodes, then long ones, in batches of one to four: the ring grows, wraps and
    packs its episodes; every stored episode reads back as the reference holds it, and no two
    stored episodes share a row."""
    size = 9
    ours = make(size, capacity_steps=capacity_steps)
    ring = PaddedRing(size)
    rng = np.random.default_rng(12)
    for round_ in range(40):
        count = int(rng.integers(1, 5))
        high = 4 if round_ < 15 else LIMIT
        episodes = runner_batch(rng, count, rng.integers(3, high + 1, size=count))
        ours.insert_episode_batch(episodes)
        ring.insert(episodes.data.transition_data)
        held = np.flatnonzero(ours._held())
        rows = np.concatenate(
            [np.arange(s, s + n) for s, n in zip(ours._start[held], ours._length[held])]
        )
        assert len(set(rows.tolist())) == rows.size  # no row shared
        assert rows.max() < ours._table.shape[0]
        if capacity_steps is None:
            assert ours.episodes_in_buffer == ring.episodes_in_buffer
        batch = ours.episodes(held)
        for b, position in enumerate(held.tolist()):
            for key, value in batch.data.transition_data.items():
                assert torch.equal(value[b], ring.data[key][position]), key
