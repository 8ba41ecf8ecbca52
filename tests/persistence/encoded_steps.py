"""Steps whose every value encodes their timestep, and the checks and writers built on them,
shared by the persistence tests (memory-mapped folders, crafted states, snapshots, trust).

A buffer written only with :func:`encoded` steps can be checked without a model: every visible
slot must decode to the step its write generation names (:func:`check_consistent`). The crash
test's child process imports this module by name (its folder on ``sys.path``), so it imports
nothing from the tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marlbuf import FIELDS, AgentSpec, MultiAgentReplayBuffer

#: two agents of different shapes and dtypes; every value of step ``t`` is a function of ``t``
SPECS = {
    "a0": AgentSpec(obs_shape=(4,), action_shape=(2,)),
    "a1": AgentSpec(obs_shape=(3,), action_shape=(3,), obs_dtype=np.float64),
}
CAPACITY = 48
EPISODE = 7  # step t ends an episode when t % EPISODE == EPISODE - 1
MAX_STEPS_PER_CALL = 19


def _obs(ts: np.ndarray, agent: int, n: int) -> np.ndarray:
    cols = [ts, ts + 0.5, np.full_like(ts, agent), -ts]
    return np.stack(cols[:n], axis=1)


def encoded(ts: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Steps ``ts`` (shape (T,)) in ``extend`` form: every field encodes its timestep."""
    ts = np.asarray(ts, dtype=np.float64)
    done = (ts % EPISODE) == EPISODE - 1
    out: dict[str, dict[str, np.ndarray]] = {f: {} for f in FIELDS}
    for i, (agent, spec) in enumerate(SPECS.items()):
        n = spec.obs_shape[0]
        nxt = np.where(done[:, None], -1.0 - _obs(ts, i, n), _obs(ts + 1, i, n))
        out["obs"][agent] = _obs(ts, i, n).astype(spec.obs_dtype)
        out["next_obs"][agent] = nxt.astype(spec.obs_dtype)
        out["action"][agent] = np.stack([ts + i] * spec.action_shape[0], 1).astype(np.float32)
        out["reward"][agent] = (ts + 0.25 * i).astype(np.float32)
        out["done"][agent] = done.astype(np.float32)
    return out


def one_step(t: int) -> dict[str, dict[str, np.ndarray]]:
    """Step ``t`` in ``add`` form."""
    return {f: {a: x[0] for a, x in per.items()} for f, per in encoded(np.array([t])).items()}


def write_encoded(buf: MultiAgentReplayBuffer, t: int, steps: int) -> int:
    """Steps ``t .. t + steps - 1`` written by one call (``add`` for one step, ``extend`` for
    more); returns the next step's number."""
    if steps == 1:
        buf.add(**one_step(t))
    else:
        buf.extend(**encoded(np.arange(t, t + steps)))
    return t + steps


def extend_calls(buf: MultiAgentReplayBuffer, calls: int) -> int:
    """``calls`` extends of 1, 2, 3, 4, 1, ... steps from step 0; returns the steps written."""
    t = 0
    for k in range(calls):
        steps = 1 + k % 4
        buf.extend(**encoded(np.arange(t, t + steps)))
        t += steps
    return t


def check_consistent(buf: MultiAgentReplayBuffer) -> None:
    """Every visible slot decodes to the step its write generation names; counters agree."""
    total, size = buf.total_writes, len(buf)
    assert size == min(total, buf.capacity)
    assert buf.cursor == total % buf.capacity
    gens = buf.write_generation[:size]
    np.testing.assert_array_equal(np.sort(gens), np.arange(total - size, total))
    if size:
        batch = buf.gather(np.arange(size))
        want = encoded(gens)
        for f in FIELDS:
            for agent in SPECS:
                np.testing.assert_array_equal(
                    batch.field(f)[agent], want[f][agent], err_msg=f"{f}/{agent}"
                )


def killed_after(folder: Path, calls: int) -> tuple[MultiAgentReplayBuffer, int]:
    """A memory-mapped buffer at ``folder`` that made ``calls`` extends (:func:`extend_calls`)
    and then "died" (its files released, never closed); returns it and the steps written."""
    buf = MultiAgentReplayBuffer(SPECS, 16, path=folder, seed=0)
    t = extend_calls(buf, calls)
    assert buf._mapped is not None
    buf._mapped.release()
    return buf, t
