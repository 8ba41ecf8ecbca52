"""Stateful (hypothesis) test: the buffer against a naive list-of-transitions model.

Every rule drives the public API of one or more buffers that must behave identically: the
original, and (after a ``state_dict``/``load_state_dict`` or ``save``/``load`` rule) a restored
copy. Each result is compared with the model and between the copies, bit for bit.

Model: ``history`` holds every transition ever written, in write order; write ``w`` went to
slot ``w % capacity``, so slot ``s`` holds the newest write ``w < total`` with
``w % capacity == s`` and its write generation is ``w``. Prioritized samplers are modelled too:
one raw priority per trainer and slot, new slots at the trainer's running maximum, updates
from ``|td| + eps`` dropped for slots overwritten since they were sampled.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.prioritized import LinearBeta
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Uniform

LAYOUTS = ["interleaved", "agent_major"]
SAMPLERS = ["uniform", "uniform_noreplace", "neighbor", "prioritized", "prioritized_neighbor"]

#: agents in order; the first two or all three are used. Different obs sizes and dtypes, and a
#: discrete actor (stored one-hot) in second place so that every buffer has one.
ALL_SPECS = {
    "a0": AgentSpec(obs_shape=(3,), action_shape=(2,)),
    "d1": AgentSpec(obs_shape=(5,), action_shape=(4,), n_discrete_actions=4),
    "w2": AgentSpec(obs_shape=(2, 2), action_shape=(3,), obs_dtype=np.float64),
}
EPS = 1e-6
ALPHA = 0.6

SETTINGS = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
#: the quick run of the default test selection: fewer programs of the same length
QUICK = settings(SETTINGS, max_examples=4)


def build_sampler(kind: str, capacity: int, run_length: int):
    if kind == "uniform":
        return Uniform()
    if kind == "uniform_noreplace":
        return Uniform(replace=False)
    if kind == "neighbor":
        return Neighbor(run_length)
    beta = LinearBeta(0.4, 1.0, steps=7)  # beta moves with every batch: its state must persist
    if kind == "prioritized":
        return Prioritized(alpha=ALPHA, beta=beta, eps=EPS)
    # the longest run must fit the capacity (the sampler rejects a longer one at bind)
    lengths = (1, 2, 4) if capacity >= 4 else (1, 1, capacity)
    return PrioritizedNeighbor(alpha=ALPHA, beta=beta, eps=EPS, run_lengths=lengths)


#: storage formats: the default (observations stored once, float32 batches), next_obs in
#: every row with agent a0's observations stored in float16 (converted to float32 batches), and
#: no next_obs at all (writes leave it out, batches refuse it)
STORAGES = {"once": ("once", False), "stored+half": ("stored", True), "none": ("none", False)}


def half_obs(specs: dict) -> dict:
    out = dict(specs)
    a0 = specs["a0"]
    out["a0"] = AgentSpec(a0.obs_shape, a0.action_shape, obs_dtype=np.float16)
    return out


def host_batch(batch):
    """A batch as NumPy arrays (a torch store's DeviceBatch is copied to the host)."""
    return batch.to_numpy() if hasattr(batch, "to_numpy") else batch


def make_machine(
    layout: str, sampler_kind: str, storage: str = "once", store: str = "ram"
) -> type[RuleBasedStateMachine]:
    """The state machine for one configuration; ``store``: ``"ram"`` (NumPy arrays),
    ``"mapped"`` (``path=``) or ``"torch"`` (``device="cpu"``)."""
    weighted = sampler_kind.startswith("prioritized")
    next_obs, half = STORAGES[storage]
    #: the fields batches hold (and writes pass)
    fields = tuple(f for f in FIELDS if not (next_obs == "none" and f == "next_obs"))

    class BufferMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tmp = tempfile.TemporaryDirectory()
            self.saves = 0

        # ------------------------------------------------------------------ set-up
        @initialize(
            capacity=st.integers(1, 17),
            n_agents=st.sampled_from([2, 3]),
            run_length=st.integers(1, 3),
            seed=st.integers(0, 2**32 - 1),
        )
        def setup(self, capacity, n_agents, run_length, seed):
            self.capacity = capacity
            self.run_length = min(run_length, capacity)
            self.specs = dict(list(ALL_SPECS.items())[:n_agents])
            if half:  # the model holds the stored (float16) values; batches are float32
                self.specs = half_obs(self.specs)
            self.n_trainers = n_agents
            self.bufs = [self._new_buffer(seed)]
            self.prev_out: list[dict] = [{}]  # per buffer: batch size -> a batch to reuse
            self.history: list[dict] = []
            self.prio = np.zeros((self.n_trainers, capacity))  # raw priority, 0 = unwritten
            self.max_prio = np.ones(self.n_trainers)
            self.last: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # trainer -> (idx, gens)
            # trainers whose latest batch every copy drew (a restored copy drew none yet):
            # only those may update with plain indices
            self.drawn_since_restore: set[int] = set()

        def _new_buffer(self, seed):
            where: dict = {}
            if store == "mapped":
                self.saves += 1
                where["path"] = Path(self.tmp.name) / f"mapped{self.saves}"
            elif store == "torch":
                where["device"] = "cpu"
            return MultiAgentReplayBuffer(
                self.specs,
                self.capacity,
                layout=layout,
                sampler=build_sampler(sampler_kind, self.capacity, self.run_length),
                seed=seed,
                next_obs=next_obs,
                **where,
            )

        def teardown(self) -> None:
            for buf in getattr(self, "bufs", []):
                buf.close()
            self.tmp.cleanup()

        # ------------------------------------------------------------------ the model
        @property
        def total(self) -> int:
            return len(self.history)

        @property
        def size(self) -> int:
            return min(self.total, self.capacity)

        def generation_of(self, slot: int) -> int:
            """The newest write that landed in ``slot`` (its write generation)."""
            assert 0 <= slot < self.size
            return slot + self.capacity * ((self.total - 1 - slot) // self.capacity)

        def model_write(self, transitions: list[dict]) -> None:
            for tr in transitions:
                slot = self.total % self.capacity
                self.history.append(tr)
                self.prio[:, slot] = self.max_prio  # every trainer: its running max

        def must_sample(self, batch_size: int) -> bool:
            """Whether ``sample(batch_size)`` must succeed (else it must raise ValueError)."""
            if batch_size < 1 or self.size == 0:
                return False
            if batch_size > self.size and sampler_kind in ("uniform_noreplace", "neighbor"):
                return False  # draws of distinct slots: at most the stored data
            if sampler_kind == "neighbor":
                if batch_size % self.run_length:
                    return False
                if self.size < self.capacity:  # filling: runs may not reach unwritten slots
                    return batch_size // self.run_length <= self.size - self.run_length + 1
            return True

        # ------------------------------------------------------------------ data
        def make_steps(self, steps: int, seed: int, style: int) -> tuple[dict, list[dict]]:
            """``extend`` arguments for ``steps`` timesteps and the model's transitions.

            ``style`` varies the input form: float64 inputs, bool dones, discrete actions as
            integer indices or as one-hot rows.
            """
            rng = np.random.default_rng(seed)
            args: dict = {f: {} for f in FIELDS}
            for agent, spec in self.specs.items():
                in_dt = np.float64 if style & 1 else np.float32
                args["obs"][agent] = rng.standard_normal((steps, *spec.obs_shape)).astype(in_dt)
                args["next_obs"][agent] = rng.standard_normal((steps, *spec.obs_shape)).astype(
                    in_dt
                )
                if spec.n_discrete_actions:
                    index = rng.integers(0, spec.n_discrete_actions, steps)
                    if style & 2:
                        args["action"][agent] = index
                    else:
                        args["action"][agent] = np.eye(spec.n_discrete_actions)[index]
                else:
                    args["action"][agent] = rng.standard_normal((steps, *spec.action_shape))
                args["reward"][agent] = rng.standard_normal(steps).astype(in_dt)
                done = rng.random(steps) < 0.3
                args["done"][agent] = done if style & 4 else done.astype(np.float32)
            transitions = []
            for t in range(steps):
                tr: dict = {f: {} for f in FIELDS}
                for agent, spec in self.specs.items():
                    for f in FIELDS:
                        x = np.asarray(args[f][agent][t])
                        if f == "action" and spec.n_discrete_actions and x.ndim == 0:
                            x = np.eye(spec.n_discrete_actions)[x]
                        tr[f][agent] = x.astype(spec.dtype(f))
                transitions.append(tr)
            return args, transitions

        # ------------------------------------------------------------------ checks
        def check_batch(self, batch, buf, batch_size, trainer, sampled=True):
            batch = host_batch(batch)
            size = self.size
            assert len(batch) == batch_size
            idx = batch.indices
            assert idx.shape == (batch_size,) and idx.dtype == np.int64
            assert idx.min() >= 0 and idx.max() < size, (idx, size)
            expected_gens = np.array([self.generation_of(int(i)) for i in idx], dtype=np.int64)
            np.testing.assert_array_equal(batch.generations, expected_gens)
            if next_obs == "none":
                with pytest.raises(ValueError, match="next_obs='none'"):
                    batch.field("next_obs")
            for f in fields:
                for agent, spec in self.specs.items():
                    got = batch.field(f)[agent]
                    assert got.shape == (batch_size, *spec.shape(f)), (f, agent, got.shape)
                    stored = spec.dtype(f)
                    batch_dt = np.dtype(np.float32) if stored == np.float16 else stored
                    assert got.dtype == batch_dt, (f, agent, got.dtype)
                    want = np.stack([self.history[g][f][agent] for g in expected_gens])
                    want = want.astype(batch_dt)  # float16 storage: exact in float32
                    assert np.ascontiguousarray(got).tobytes() == want.tobytes(), (
                        f"{f}[{agent!r}] differs from the model at indices {idx}"
                    )
            if trainer is not None:
                assert batch.trainer == trainer
            if not sampled:  # an explicit gather: no weights
                assert batch.weights is None
                return
            if weighted:
                w = batch.weights
                assert w is not None and w.shape == (batch_size,) and w.dtype == np.float32
                assert np.all(w > 0) and np.all(w <= 1), w
                assert w.max() == 1.0, w
            else:
                assert batch.weights is None
            if sampler_kind == "uniform_noreplace":
                assert len(set(idx.tolist())) == batch_size, idx
            if sampler_kind == "neighbor" and self.run_length > 1:
                runs = idx.reshape(-1, self.run_length)
                np.testing.assert_array_equal(np.diff(runs, axis=1) % self.capacity, 1)
                # distinct references
                assert len(set(runs[:, 0].tolist())) == runs.shape[0], idx
                if size < self.capacity:  # no wrap while filling
                    np.testing.assert_array_equal(np.diff(runs, axis=1), 1)

        def same_batches(self, batches):
            """Batches drawn by the copies for the same call are identical, bit for bit."""
            batches = [host_batch(b) for b in batches]
            first = batches[0]
            for other in batches[1:]:
                np.testing.assert_array_equal(other.indices, first.indices)
                np.testing.assert_array_equal(other.generations, first.generations)
                if first.weights is None:
                    assert other.weights is None
                else:
                    assert other.weights.tobytes() == first.weights.tobytes()
                for f in fields:
                    for agent in self.specs:
                        a = np.ascontiguousarray(first.field(f)[agent])
                        b = np.ascontiguousarray(other.field(f)[agent])
                        assert a.tobytes() == b.tobytes()

        # ------------------------------------------------------------------ writing
        @rule(seed=st.integers(0, 2**32 - 1), style=st.integers(0, 7), as_list=st.booleans())
        def add(self, seed, style, as_list):
            args, transitions = self.make_steps(1, seed, style)
            step = {f: {a: x[0] for a, x in per.items()} for f, per in args.items()}
            if style & 4:
                step["done"] = {a: bool(x) for a, x in step["done"].items()}
                step["reward"] = {a: float(x) for a, x in step["reward"].items()}
                # a Python float is float64: cast like the stored dtype does
                for tr in transitions:
                    for a in self.specs:
                        tr["reward"][a] = np.asarray(step["reward"][a]).astype(
                            self.specs[a].dtype("reward")
                        )
            if style & 2:
                for agent, spec in self.specs.items():
                    if spec.n_discrete_actions:
                        step["action"][agent] = int(step["action"][agent])
            if as_list:
                step = {f: [per[a] for a in self.specs] for f, per in step.items()}
            if next_obs == "none":
                del step["next_obs"]
            for buf in self.bufs:
                buf.add(**step)
            self.model_write(transitions)

        @rule(
            steps=st.integers(1, 40),
            seed=st.integers(0, 2**32 - 1),
            style=st.integers(0, 7),
        )
        def extend(self, steps, seed, style):
            steps = min(steps, 2 * self.capacity + 3)  # also longer than the capacity
            args, transitions = self.make_steps(steps, seed, style)
            if next_obs == "none":
                del args["next_obs"]
            for buf in self.bufs:
                buf.extend(**args)
            self.model_write(transitions)

        # ------------------------------------------------------------------ sampling
        def pick_batch_size(self, raw: int, fits: bool) -> int:
            """Mostly a size the data can serve (``fits``), else ``raw`` itself (0..20)."""
            if not fits or self.size == 0:
                return raw
            step = self.run_length if sampler_kind == "neighbor" else 1
            return step * (1 + raw % max(1, self.size // step))

        @rule(
            raw=st.integers(0, 20),
            fits=st.booleans(),
            trainer=st.integers(0, 2),
            use_out=st.booleans(),
        )
        def sample(self, raw, fits, trainer, use_out):
            batch_size = self.pick_batch_size(raw, fits)
            trainer = min(trainer, self.n_trainers - 1)
            if not self.must_sample(batch_size):
                for buf in self.bufs:
                    with pytest.raises(ValueError):
                        buf.sample(batch_size, trainer=trainer)
                return
            batches = []
            for buf, prev in zip(self.bufs, self.prev_out):
                out = prev.get(batch_size) if use_out else None
                batch = buf.sample(batch_size, trainer=trainer, out=out)
                self.check_batch(batch, buf, batch_size, trainer)
                prev[batch_size] = batch
                batches.append(batch)
            self.same_batches(batches)
            self.last[trainer] = (batches[0].indices.copy(), batches[0].generations.copy())
            self.drawn_since_restore.add(trainer)

        @rule(
            raw=st.integers(1, 20),
            fits=st.booleans(),
            n=st.integers(1, 3),
            shared=st.booleans(),
            use_out=st.booleans(),
        )
        def sample_for_trainers(self, raw, fits, n, shared, use_out):
            batch_size = self.pick_batch_size(raw, fits)
            n = min(n, self.n_trainers)
            if (shared and weighted) or not self.must_sample(batch_size):
                for buf in self.bufs:
                    with pytest.raises(ValueError):
                        buf.sample_for_trainers(batch_size, n_trainers=n, shared_index=shared)
                return
            rounds = []
            for buf, prev in zip(self.bufs, self.prev_out):
                key = ("round", batch_size, n, shared)
                out = prev.get(key) if use_out else None
                batches = buf.sample_for_trainers(
                    batch_size, n_trainers=n, shared_index=shared, out=out
                )
                assert len(batches) == n
                if shared:
                    assert all(b is batches[0] for b in batches)
                for t, batch in enumerate(batches):
                    self.check_batch(batch, buf, batch_size, None if shared else t)
                prev[key] = batches
                rounds.append(batches)
            for per_trainer in zip(*rounds):
                self.same_batches(list(per_trainer))
            for t, batch in enumerate(rounds[0]):
                self.last[0 if shared else t] = (batch.indices.copy(), batch.generations.copy())
                self.drawn_since_restore.add(0 if shared else t)

        @rule(
            raw=st.lists(st.integers(0, 2**31), min_size=1, max_size=12),
            bad=st.sampled_from([None, None, None, -1, 0, 1]),
        )
        def gather(self, raw, bad):
            """Indices of filled slots; with ``bad``, one of them is -1, size or size + 1."""
            idx = np.asarray(raw, dtype=np.int64) % max(1, self.size)
            if bad is not None:
                idx[len(idx) // 2] = -1 if bad < 0 else self.size + bad
            if idx.min() < 0 or idx.max() >= self.size:
                for buf in self.bufs:
                    with pytest.raises(ValueError):
                        buf.gather(idx)
                return
            batches = [buf.gather(idx) for buf in self.bufs]
            for buf, batch in zip(self.bufs, batches):
                self.check_batch(batch, buf, len(idx), None, sampled=False)
                np.testing.assert_array_equal(batch.indices, idx)
            self.same_batches(batches)

        # ------------------------------------------------------------------ priorities
        @precondition(lambda self: weighted and bool(self.last))
        @rule(
            trainer=st.integers(0, 2),
            seed=st.integers(0, 2**32 - 1),
            with_generations=st.booleans(),
        )
        def update_priorities(self, trainer, seed, with_generations):
            if trainer not in self.last:
                trainer = min(self.last)
            idx, gens = self.last[trainer]
            current = np.array([self.generation_of(int(i)) for i in idx])
            stale = current != gens
            if stale.any() or trainer not in self.drawn_since_restore:
                # update_priorities without generations on overwritten slots has its own test
                # (test_stale_priorities_without_generations); here the batch's are passed, as
                # they must be for a copy restored since the batch was drawn
                with_generations = True
            rng = np.random.default_rng(seed)
            td = rng.uniform(-3, 3, idx.shape[0]) * (rng.random(idx.shape[0]) < 0.8)
            for buf in self.bufs:
                kwargs = {"generations": gens} if with_generations else {}
                buf.update_priorities(idx, td, trainer=trainer, **kwargs)
            largest = 0.0
            for i, slot in enumerate(idx):
                if not stale[i]:
                    self.prio[trainer, slot] = abs(td[i]) + EPS
                    largest = max(largest, abs(td[i]) + EPS)
            self.max_prio[trainer] = max(self.max_prio[trainer], largest)

        # ------------------------------------------------------------------ persistence
        @rule(how=st.sampled_from(["state_dict", "save"]), seed=st.integers(0, 2**32 - 1))
        def restore(self, how, seed):
            """Replace the second copy by one restored from the newest copy's saved state.

            The copy is then compared with the never-saved original on every later call.
            """
            source = self.bufs[-1]
            if how == "state_dict":
                state = source.state_dict()
                restored = self._new_buffer(seed)  # another seed: the state must bring the RNG
                restored.load_state_dict(state)
            else:
                self.saves += 1
                path = Path(self.tmp.name) / f"buf{self.saves}.npz"
                source.save(path)
                restored = MultiAgentReplayBuffer.load(
                    path, device="cpu" if store == "torch" else None
                )
                assert restored.layout == layout and restored.specs == source.specs
                assert repr(restored.sampler) == repr(source.sampler)
            self.bufs = [self.bufs[0], restored]
            self.prev_out = [self.prev_out[0], {}]
            self.drawn_since_restore = set()

        # ------------------------------------------------------------------ invariants
        @invariant()
        def metadata_matches_model(self):
            expected_gen = np.full(self.capacity, -1, dtype=np.int64)
            for slot in range(self.size):
                expected_gen[slot] = self.generation_of(slot)
            for buf in self.bufs:
                assert len(buf) == self.size
                assert buf.total_writes == self.total
                assert buf.cursor == self.total % self.capacity
                np.testing.assert_array_equal(buf.write_generation, expected_gen)

        @invariant()
        def every_slot_matches_model(self):
            if self.size == 0:
                return
            everything = np.arange(self.size)
            for buf in self.bufs:
                self.check_batch(buf.gather(everything), buf, self.size, None, sampled=False)

        @invariant()
        def priorities_match_model(self):
            if not weighted:
                return
            for buf in self.bufs:
                trees = buf.sampler.trees
                for t in range(self.n_trainers):
                    np.testing.assert_allclose(
                        trees.leaves(t), self.prio[t] ** ALPHA, rtol=1e-12, atol=0
                    )
                    if trees.track_max:
                        np.testing.assert_allclose(
                            trees.priorities(t), self.prio[t], rtol=1e-12, atol=0
                        )
                np.testing.assert_allclose(trees.max_priority, self.max_prio, rtol=1e-12)

    BufferMachine.__name__ = f"BufferMachine_{layout}_{sampler_kind}_{store}"
    return BufferMachine


@pytest.mark.slow
@pytest.mark.parametrize("sampler_kind", SAMPLERS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_buffer_state_machine(layout, sampler_kind):
    run_state_machine_as_test(make_machine(layout, sampler_kind), settings=SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("sampler_kind", ["uniform", "prioritized_neighbor"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_buffer_state_machine_dense_half(layout, sampler_kind):
    """next_obs stored in every row, float16 observations converted in the gather."""
    run_state_machine_as_test(make_machine(layout, sampler_kind, "stored+half"), settings=SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("sampler_kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_buffer_state_machine_without_next_obs(layout, sampler_kind):
    """next_obs="none": writes leave next_obs out, batches hold every other field (and refuse
    next_obs), state files round-trip."""
    run_state_machine_as_test(make_machine(layout, sampler_kind, "none"), settings=SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["mapped", "torch"])
def test_buffer_state_machine_without_next_obs_on_every_store(store):
    """next_obs="none" on the memory-mapped store and the torch store (on the CPU)."""
    if store == "torch":
        pytest.importorskip("torch")
    machine = make_machine("interleaved", "neighbor", "none", store=store)
    run_state_machine_as_test(machine, settings=SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("sampler_kind", ["uniform", "neighbor", "prioritized_neighbor"])
@pytest.mark.parametrize("store", ["mapped", "torch"])
def test_buffer_state_machine_on_every_store(store, sampler_kind):
    """The same machine on the memory-mapped store and the torch store (on the CPU)."""
    if store == "torch":
        pytest.importorskip("torch")
    machine = make_machine("interleaved", sampler_kind, store=store)
    run_state_machine_as_test(machine, settings=SETTINGS)


#: (layout, sampler, storage, store): every layout, sampler, storage format and store once
QUICK_CASES = [
    ("interleaved", "prioritized_neighbor", "once", "ram"),
    ("agent_major", "uniform_noreplace", "once", "ram"),
    ("agent_major", "uniform", "stored+half", "ram"),
    ("interleaved", "prioritized", "none", "ram"),
    ("interleaved", "neighbor", "once", "mapped"),
    ("interleaved", "uniform", "once", "torch"),
]


@pytest.mark.parametrize(("layout", "sampler_kind", "storage", "store"), QUICK_CASES)
def test_buffer_state_machine_quick(layout, sampler_kind, storage, store):
    """A few programs of each configuration of :data:`QUICK_CASES`; the tests marked slow run
    the whole grid with more programs."""
    if store == "torch":
        pytest.importorskip("torch")
    machine = make_machine(layout, sampler_kind, storage, store=store)
    run_state_machine_as_test(machine, settings=QUICK)
