"""A driver of numbered steps on several streams, shared by the sequence and episode tests.

:class:`StreamDriver` writes random steps through ``add``, ``extend``, ``add_envs`` and whole
episodes into a buffer over :data:`SPECS` and into a :class:`naive.NaiveEpisodeRing` alike, so
that a test compares the buffer's episode index and its sampled batches with the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from naive import NaiveEpisodeRing

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.samplers import Sampler

#: two agents with 3 observation values and 2 action values each
SPECS = {f"agent_{i}": AgentSpec(obs_shape=(3,), action_shape=(2,)) for i in range(2)}
AGENTS = list(SPECS)
#: step numbers of stream k start at k * STREAM_STRIDE (exact in float32 for streams below 16)
STREAM_STRIDE = 1_000_000


def make_buffer(
    sampler: Sampler, capacity: int, config: tuple[str, str, str] = ("interleaved", "rows", "once")
) -> MultiAgentReplayBuffer:
    """A buffer over :data:`SPECS` with ``sampler``; ``config`` is (layout, batch_layout,
    next_obs)."""
    layout, batch_layout, next_obs = config
    return MultiAgentReplayBuffer(
        SPECS,
        capacity,
        layout=layout,
        batch_layout=batch_layout,
        next_obs=next_obs,
        sampler=sampler,
        seed=1,
    )


def reloaded(
    buf: MultiAgentReplayBuffer, how: str, folder: Path, fresh: Callable[[], MultiAgentReplayBuffer]
) -> MultiAgentReplayBuffer:
    """A copy of ``buf`` through a file in ``folder`` (``how="file"``) or through its
    ``state_dict`` loaded into ``fresh()`` (``how="state_dict"``)."""
    if how == "file":
        buf.save(folder / "buf.npz")
        return MultiAgentReplayBuffer.load(folder / "buf.npz")
    other = fresh()
    other.load_state_dict(buf.state_dict())
    return other


class StreamDriver:
    """Writes numbered steps into a buffer over :data:`SPECS` and a :class:`NaiveEpisodeRing`.

    Each step gets a number ``n`` (unique: ``stream * STREAM_STRIDE`` plus the stream's step
    counter), stored as every agent's reward and in each value of its obs (``n + agent
    index``), so that every gathered row names the step it came from. Its next_obs is the obs
    of the stream's next step (``n + 1 + agent index``), as an environment's would be: no write
    is a stream break. A step ends an episode when every agent is done or it is truncated.
    """

    def __init__(self, buf: MultiAgentReplayBuffer, seed: int = 0) -> None:
        self.buf = buf
        self.naive = NaiveEpisodeRing(buf.capacity)
        self.rng = np.random.default_rng(seed)
        self.count = 0  # steps written, all streams
        self.counters: dict[int, int] = {}  # per stream, steps written
        self.slot_value = np.full(buf.capacity, -1.0)  # the number of the step in each slot

    @staticmethod
    def fields(numbers: np.ndarray, done: np.ndarray) -> dict:
        """``extend`` fields of steps ``numbers`` (shape (T,)); ``done`` of shape (T,) (every
        agent alike) or (T, n_agents)."""
        values = np.asarray(numbers).astype(np.float32)
        # (T, n_agents), a (T,) flag repeated for every agent
        flags = np.broadcast_to(
            np.asarray(done).reshape(len(values), -1), (len(values), len(AGENTS))
        )
        return {
            "obs": {a: np.repeat(values[:, None], 3, 1) + i for i, a in enumerate(AGENTS)},
            "action": {a: np.zeros((len(values), 2), np.float32) for a in AGENTS},
            "reward": {a: values.copy() for a in AGENTS},
            "next_obs": {a: np.repeat(values[:, None] + 1, 3, 1) + i for i, a in enumerate(AGENTS)},
            "done": {a: flags[:, i].astype(np.float32) for i, a in enumerate(AGENTS)},
        }

    @staticmethod
    def one_step(fields: dict) -> dict:
        """The first step of ``fields`` in ``add`` form."""
        return {f: {a: x[0] for a, x in per.items()} for f, per in fields.items()}

    def numbers(self, streams: list[int]) -> np.ndarray:
        """The numbers of the next steps of ``streams`` (one step each, in order)."""
        seen: dict[int, int] = {}
        out = []
        for stream in streams:
            step = self.counters.get(stream, 0) + seen.get(stream, 0)
            seen[stream] = seen.get(stream, 0) + 1
            out.append(stream * STREAM_STRIDE + step)
        return np.array(out, dtype=np.int64)

    def record(self, streams: list[int], ends: np.ndarray) -> None:
        """Tell the model that one step of each of ``streams`` was written; ``ends`` (shape
        (len(streams),)) marks the steps that end their episode."""
        for stream, number, end in zip(streams, self.numbers(streams), ends):
            self.slot_value[self.naive.cursor] = number
            self.naive.write(stream, bool(end))
            self.counters[stream] = self.counters.get(stream, 0) + 1
            self.count += 1

    def _flags(self, steps: int, p_done: float, p_trunc: float) -> tuple[np.ndarray, np.ndarray]:
        done = self.rng.random((steps, len(AGENTS))) < p_done
        done[self.rng.random(steps) < p_done] = True  # sometimes every agent at once
        truncated = self.rng.random(steps) < p_trunc
        return done, truncated

    def add(self, stream: int = 0, p_done: float = 0.2, p_trunc: float = 0.05) -> None:
        done, truncated = self._flags(1, p_done, p_trunc)
        step = self.one_step(self.fields(self.numbers([stream]), done))
        cut: object = bool(truncated[0])
        if cut and self.rng.random() < 0.5:  # per agent form: one agent's flag is enough
            cut = {AGENTS[1]: True}
        self.buf.add(**step, stream=stream, truncated=cut)
        self.record([stream], done.all(axis=1) | truncated)

    def extend(
        self, steps: int, stream: int = 0, p_done: float = 0.1, p_trunc: float = 0.05
    ) -> None:
        done, truncated = self._flags(steps, p_done, p_trunc)
        fields = self.fields(self.numbers([stream] * steps), done)
        cut: object = truncated if truncated.any() else False
        if truncated.any() and self.rng.random() < 0.5:
            cut = {AGENTS[0]: truncated, AGENTS[1]: np.zeros(steps, bool)}
        self.buf.extend(**fields, stream=stream, truncated=cut)
        self.record([stream] * steps, done.all(axis=1) | truncated)

    def add_envs(
        self, n_envs: int, first: int = 0, p_done: float = 0.2, p_trunc: float = 0.05
    ) -> None:
        done, truncated = self._flags(n_envs, p_done, p_trunc)
        streams = list(range(first, first + n_envs))
        fields = self.fields(self.numbers(streams), done)
        self.buf.add_envs(**fields, first_stream=first, truncated=truncated)
        self.record(streams, done.all(axis=1) | truncated)

    def episode(self, length: int, stream: int = 0) -> None:
        """One whole episode, truncated at its last step (EPyMARL's way of inserting)."""
        numbers = self.numbers([stream] * length)
        end = np.arange(length) == length - 1
        self.buf.extend(**self.fields(numbers, np.zeros(length)), stream=stream, truncated=end)
        self.record([stream] * length, end)

    def random_ops(self, n_ops: int, n_streams: int = 3, episodes: bool = False) -> None:
        """``n_ops`` random calls of ``add``, ``extend`` and ``add_envs`` (and of
        :meth:`episode` with ``episodes=True``) on streams ``0 .. n_streams - 1``."""
        for _ in range(n_ops):
            op = self.rng.integers(4 if episodes else 3)
            if op == 0:
                self.add(int(self.rng.integers(n_streams)))
            elif op == 1:
                self.extend(int(self.rng.integers(1, 12)), int(self.rng.integers(n_streams)))
            elif op == 2:
                self.add_envs(int(self.rng.integers(1, n_streams + 1)))
            else:
                self.episode(int(self.rng.integers(1, 9)), int(self.rng.integers(n_streams)))

    def check_values(self, batch) -> None:
        """Every valid step of a sequence or episode ``batch`` holds the numbers of the step its
        slot names; padding is zero."""
        value = np.where(batch.mask, self.slot_value[np.maximum(batch.slots, 0)], 0.0)
        for i, agent in enumerate(AGENTS):
            np.testing.assert_array_equal(batch.reward[agent], value)
            for k in range(3):
                np.testing.assert_array_equal(
                    batch.obs[agent][..., k], np.where(batch.mask, value + i, 0)
                )
                np.testing.assert_array_equal(
                    batch.next_obs[agent][..., k], np.where(batch.mask, value + 1 + i, 0)
                )
            assert not batch.done[agent][~batch.mask].any()
