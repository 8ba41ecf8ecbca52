"""Writers and samplers in threads: no torn rows, ever.

Every stored row encodes its write generation ``t`` in every field of every agent
(``obs[:] = t``, ``action[:] = t``, ``reward = t``, ``next_obs[:] = t + 1``, ``done = t % 2``),
and the capacity is small, so slots are overwritten all the time while other threads sample.
A returned row is *torn* when its fields decode to different ``t`` (parts of two writes); it
is also wrong when its ``t`` is not the generation ``batch.generations`` reports for it or does
not belong to the slot ``batch.indices`` names (slot = ``t % capacity``).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Uniform

CAPACITY = 64
BATCH = 32
SECONDS = 1.0  # per configuration
SPECS = {
    "p": AgentSpec(obs_shape=(6,), action_shape=(2,)),
    "q": AgentSpec(obs_shape=(3,), action_shape=(4,), obs_dtype=np.float64),
}
SAMPLERS = {
    "uniform": lambda: Uniform(),
    "uniform_noreplace": lambda: Uniform(replace=False),
    "neighbor": lambda: Neighbor(4),
    "prioritized": lambda: Prioritized(),
    "prioritized_neighbor": lambda: PrioritizedNeighbor(),
}


def encoded(start: int, steps: int) -> dict[str, dict[str, np.ndarray]]:
    """``extend`` arguments for generations ``start .. start + steps - 1``."""
    t = np.arange(start, start + steps, dtype=np.float64)
    data: dict[str, dict[str, np.ndarray]] = {f: {} for f in FIELDS}
    for agent, spec in SPECS.items():
        data["obs"][agent] = np.broadcast_to(t[:, None], (steps, *spec.obs_shape)).copy()
        data["action"][agent] = np.broadcast_to(t[:, None], (steps, *spec.action_shape)).copy()
        data["reward"][agent] = t.copy()
        data["next_obs"][agent] = data["obs"][agent] + 1
        data["done"][agent] = t % 2
    return data


def decode_problems(buf, batch) -> list[str]:
    """Rows of ``batch`` that are torn (fields of different writes) or whose write does not
    match the slot in ``batch.indices`` or the generation in ``batch.generations``."""
    t = batch.obs["p"][:, 0].astype(np.float64)
    torn = np.zeros(len(batch), dtype=bool)
    for agent in SPECS:
        for f in FIELDS:
            x = batch.field(f)[agent].reshape(len(batch), -1).astype(np.float64)
            want = t + 1 if f == "next_obs" else t % 2 if f == "done" else t
            torn |= (x != want[:, None]).any(axis=1)
    wrong_slot = t.astype(np.int64) % buf.capacity != batch.indices
    wrong_generation = t != batch.generations
    out = []
    for i in np.flatnonzero(torn | wrong_slot | wrong_generation)[:3]:
        kind = "torn" if torn[i] else "wrong slot" if wrong_slot[i] else "wrong generation"
        out.append(
            f"{kind}: row {i}, slot {batch.indices[i]}, generation {batch.generations[i]}, "
            f"obs[p] {batch.obs['p'][i].tolist()}, reward[q] {batch.reward['q'][i]}, "
            f"next_obs[q] {batch.next_obs['q'][i].tolist()}"
        )
    return out


@pytest.mark.parametrize("sampler_kind", list(SAMPLERS))
@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
def test_no_torn_rows_under_concurrent_writes(layout, sampler_kind):
    buf = MultiAgentReplayBuffer(
        SPECS, CAPACITY, layout=layout, sampler=SAMPLERS[sampler_kind](), seed=0
    )
    buf.extend(**encoded(0, CAPACITY))
    weighted = buf.sampler.weighted
    stop = threading.Event()
    problems: list[str] = []
    errors: list[str] = []
    counts = {"writes": CAPACITY, "batches": 0}

    def writer() -> None:
        rng = np.random.default_rng(1)
        t = CAPACITY
        try:
            while not stop.is_set():
                if rng.random() < 0.3:
                    step = {
                        f: {a: x[0] for a, x in per.items()} for f, per in encoded(t, 1).items()
                    }
                    buf.add(**step)
                    t += 1
                else:
                    steps = int(rng.integers(1, 2 * CAPACITY))
                    buf.extend(**encoded(t, steps))
                    t += steps
            counts["writes"] = t
        except Exception as exc:  # reported by the main thread
            errors.append(f"writer: {type(exc).__name__}: {exc}")

    def sampler(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                if rng.random() < 0.5:
                    trainer = int(rng.integers(buf.n_trainers))
                    batches = [buf.sample(BATCH, trainer=trainer)]
                else:
                    batches = buf.sample_for_trainers(BATCH)
                for trainer, batch in enumerate(batches):
                    found = decode_problems(buf, batch)
                    if found:
                        problems.extend(found)
                    if weighted:
                        buf.update_priorities(
                            batch.indices,
                            rng.uniform(0, 2, len(batch)),
                            trainer=batch.trainer if batch.trainer is not None else trainer,
                            generations=batch.generations,
                        )
                counts["batches"] += len(batches)
        except Exception as exc:
            errors.append(f"sampler {seed}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=sampler, args=(s,)) for s in (2, 3)
    ]
    for th in threads:
        th.start()
    time.sleep(SECONDS)
    stop.set()
    for th in threads:
        th.join(timeout=30)
    assert not any(th.is_alive() for th in threads), "a thread did not stop"
    assert not errors, errors
    assert counts["batches"] > 0 and counts["writes"] > 2 * CAPACITY, counts
    torn = [p for p in problems if p.startswith("torn")]
    assert not torn, (
        f"{len(torn)} torn rows (at most 3 counted per batch) in {counts['batches']} batches "
        f"({counts['writes']} writes), e.g.:\n" + "\n".join(torn[:6])
    )
    # an untorn row must also be the write that batch.generations names: update_priorities
    # uses those generations to drop updates for overwritten slots
    assert not problems, (
        f"{len(problems)} rows whose write is not the generation reported in "
        f"batch.generations (at most 3 counted per batch) in {counts['batches']} batches, "
        "e.g.:\n" + "\n".join(problems[:6])
    )
    # the buffer is still consistent once the threads are gone
    everything = buf.gather(np.arange(len(buf)))
    assert decode_problems(buf, everything) == []


@pytest.mark.parametrize("layout", ["interleaved", "agent_major"])
@pytest.mark.parametrize("shape", ["shared_round", "same_batch_twice"])
def test_sample_for_trainers_out_with_one_batch_for_several_trainers(layout, shape):
    """``out`` holding the same Batch for several trainers (what a ``shared_index=True`` round
    returns) is either refused or gives every trainer its own rows, matching its indices."""
    buf = MultiAgentReplayBuffer(SPECS, CAPACITY, layout=layout, seed=0, n_trainers=3)
    buf.extend(**encoded(0, CAPACITY + 5))
    if shape == "shared_round":
        prev = buf.sample_for_trainers(16, shared_index=True)
        assert prev[0] is prev[1] is prev[2]
    else:
        first, second = buf.sample(16), buf.sample(16)
        prev = [first, second, first]
    try:
        batches = buf.sample_for_trainers(16, out=prev)
    except ValueError:
        return
    assert len(batches) == 3
    for trainer, batch in enumerate(batches):
        assert decode_problems(buf, batch) == [], f"trainer {trainer}"
    # the trainers drew their own index arrays; their rows must differ accordingly
    assert not np.array_equal(batches[0].indices, batches[1].indices)
