"""Streams and episodes against a naive model, with reloads at random points, on every store.

Random writes (``add``, ``extend``, ``add_envs``; episode ends by done, by truncation and by a
stream switching environment without either; agents done early) go to a buffer and to
:class:`naive.NaiveStreams`; at random points the buffer is reloaded (host: ``save``/``load``
and ``state_dict``/``load_state_dict``; memory-mapped: ``close``/``open`` and a writer that dies
and is reopened from its log; torch, ``device="cpu"``: ``save``/``load`` and
``load_state_dict``). After every reload and at the end, every stored step's episode and step
number, the complete episodes and the stream breaks must be the model's. The default run
checks a few configurations per store; ``pytest -m slow`` checks 200 per store.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from naive import NaiveStreams

from marlbuf import AgentSpec, MultiAgentReplayBuffer
from marlbuf.buffer import StreamBreakWarning
from marlbuf.samplers import Episodes

SPECS = {
    "a": AgentSpec(obs_shape=(3,), action_shape=(2,)),
    "b": AgentSpec(obs_shape=(3,), action_shape=(2,), obs_dtype=np.float64),
}
AGENTS = list(SPECS)
STORES = ["ram", "mapped", "torch"]
FAST, FULL = 6, 200


class Run:
    """One configuration: a buffer and the model, written alike, reloaded at random points."""

    def __init__(self, store: str, seed: int, folder: Path) -> None:
        self.rng = np.random.default_rng(seed)
        self.store, self.folder = store, folder
        rng = self.rng
        layouts = ["interleaved"] if store == "torch" else ["interleaved", "agent_major"]
        self.kwargs: dict[str, Any] = {
            "layout": str(rng.choice(layouts)),
            "next_obs": str(rng.choice(["once", "stored", "none"])),
            "seed": seed,
        }
        if store == "torch":
            self.kwargs["device"] = "cpu"
        self.capacity = int(rng.integers(4, 40))
        self.model = NaiveStreams(self.capacity, compares=self.kwargs["next_obs"] != "none")
        self.env: dict[int, int] = {}  # stream -> environment id
        self.t: dict[int, int] = {}  # stream -> the environment's step counter
        self.envs = 0
        self.reloads = 0
        self.buf = self._new(path=folder / "m" if store == "mapped" else None)

    def _new(self, path: Path | None = None) -> MultiAgentReplayBuffer:
        return MultiAgentReplayBuffer(
            SPECS, self.capacity, sampler=Episodes(), path=path, **self.kwargs
        )

    # ------------------------------------------------------------------ writes
    def _switch(self, stream: int) -> None:
        """The stream continues with another environment (a break if its episode is open)."""
        self.envs += 1
        self.env[stream] = self.envs
        self.t[stream] = int(self.rng.integers(0, 1000))

    def _steps(self, streams: list[int]) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
        """One step for each of ``streams`` (in order; a stream may repeat: consecutive steps):
        fields, ends (done or truncated), truncated, quiet (no agent done)."""
        n = len(streams)
        rng = self.rng
        done_all = rng.random(n) < 0.1
        done_one = ~done_all & (rng.random(n) < 0.1)
        truncated = ~done_all & (rng.random(n) < 0.05)
        obs, nxt = np.zeros((n, 2)), np.zeros((n, 2))
        for k, stream in enumerate(streams):
            # another environment on the stream: at a call's first step only (an extend whose
            # every step switches would be refused as environments given to extend)
            if stream not in self.env or (
                (k == 0 or streams[k - 1] != stream) and rng.random() < 0.12
            ):
                self._switch(stream)
            obs[k] = self.env[stream], self.t[stream]
            nxt[k] = self.env[stream], self.t[stream] + 1
            self.t[stream] += 1
            if done_all[k] or truncated[k]:
                self._switch(stream)  # reset: a new episode of a new environment
        fields: dict[str, dict[str, Any]] = {f: {} for f in ("obs", "action", "reward", "done")}
        if self.kwargs["next_obs"] != "none":
            fields["next_obs"] = {}
        for i, (agent, spec) in enumerate(SPECS.items()):
            cols = np.concatenate([obs, np.full((n, 1), i)], axis=1).astype(spec.obs_dtype)
            fields["obs"][agent] = cols
            if "next_obs" in fields:
                ncols = np.concatenate([nxt, np.full((n, 1), i)], axis=1)
                fields["next_obs"][agent] = ncols.astype(spec.obs_dtype)
            fields["action"][agent] = np.zeros((n, 2), np.float32)
            fields["reward"][agent] = obs[:, 1].astype(np.float32)
            done = done_all | (done_one & (i == 0))
            fields["done"][agent] = done.astype(np.float32)
        ends = done_all | truncated
        return fields, ends, truncated, ~(done_all | done_one)

    def _record(self, streams: list[int], fields: dict, ends, quiet) -> None:
        obs = fields["obs"]["a"]
        nxt = fields["next_obs"]["a"] if "next_obs" in fields else obs
        for k, stream in enumerate(streams):
            self.model.write(
                stream, tuple(obs[k, :2]), tuple(nxt[k, :2]), bool(ends[k]), bool(quiet[k])
            )

    def op(self) -> None:
        kind = int(self.rng.integers(3))
        if kind == 0:
            stream = int(self.rng.integers(3))
            fields, ends, truncated, quiet = self._steps([stream])
            one = {f: {a: x[0] for a, x in per.items()} for f, per in fields.items()}
            self.buf.add(**one, stream=stream, truncated=bool(truncated[0]))
            self._record([stream], fields, ends, quiet)
        elif kind == 1:
            stream = int(self.rng.integers(3))
            steps = int(self.rng.integers(1, self.capacity + 6))
            fields, ends, truncated, quiet = self._steps([stream] * steps)
            self.buf.extend(**fields, stream=stream, truncated=truncated)
            self._record([stream] * steps, fields, ends, quiet)
        else:
            envs = int(self.rng.integers(1, 4))
            streams = list(range(3, 3 + envs))
            fields, ends, truncated, quiet = self._steps(streams)
            self.buf.add_envs(**fields, first_stream=3, truncated=truncated)
            self._record(streams, fields, ends, quiet)

    # ------------------------------------------------------------------ reloads
    def reload(self) -> None:
        self.reloads += 1
        how = int(self.rng.integers(2))
        buf = self.buf
        if self.store == "mapped":
            folder = self.folder / "m"
            if how == 0:
                buf.close()
            else:
                assert buf._mapped is not None
                buf._mapped.release()  # the process dies: reopened from its log
            self.buf = MultiAgentReplayBuffer.open(folder)
        elif how == 0:
            path = self.folder / f"b{self.reloads}.npz"
            buf.save(path)
            device = "cpu" if self.store == "torch" else None
            self.buf = MultiAgentReplayBuffer.load(path, device=device)
        else:
            fresh = self._new()
            fresh.load_state_dict(buf.state_dict())
            self.buf = fresh

    # ------------------------------------------------------------------ the comparison
    def check(self, where: str) -> None:
        buf, ring = self.buf, self.model.ring
        index = buf.episodes
        assert index is not None
        size = len(buf)
        assert size == ring.size, where
        got = list(zip(index.episode[:size].tolist(), index.step[:size].tolist()))
        want = [tuple(item) for item in ring.content[:size]]
        assert got == want, f"{where}: episodes differ ({self.kwargs}, capacity {self.capacity})"
        slots = index.complete_slots()
        complete = dict(zip(slots.tolist(), index.length[slots].tolist()))
        assert complete == ring.complete(), f"{where}: complete episodes differ ({self.kwargs})"
        assert index.breaks == self.model.breaks, f"{where}: stream breaks differ ({self.kwargs})"


def _run(store: str, seed: int, folder: Path) -> None:
    if store == "torch":
        pytest.importorskip("torch")
    run = Run(store, seed, folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StreamBreakWarning)
        for k in range(int(run.rng.integers(8, 30))):
            run.op()
            if run.rng.random() < 0.25:
                run.reload()
                run.check(f"after reload {run.reloads} (op {k})")
    run.check("at the end")
    run.buf.close()


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("seed", range(FAST))
def test_streams_and_episodes_survive_reloads(tmp_path, store, seed):
    _run(store, seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("store", STORES)
def test_streams_and_episodes_survive_reloads_in_every_configuration(tmp_path, store):
    for seed in range(FAST, FAST + FULL):
        folder = tmp_path / str(seed)
        folder.mkdir()
        _run(store, seed, folder)
