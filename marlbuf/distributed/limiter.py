"""A samples-per-insert rate limiter (the rule of Reverb's ``SampleToInsertRatio``) shared by
writers and the learner through one small Ray actor.

With ratio ``r``, ``min_size`` and ``error_buffer`` ``e`` the limiter keeps

    ``diff = r * inserts - samples``  inside  ``[r * min_size - e, r * min_size + e]``

by blocking whichever side would leave it: an insert of ``n`` waits while
``diff + r * n > r * min_size + e`` (the learner is behind), a sample of ``n`` waits while
fewer than ``min_size`` items were inserted or ``diff - n < r * min_size - e`` (the writers are
behind). Once sampling has started, ``samples`` therefore stays within ``e`` of
``r * (inserts - min_size)``. Every wait has a timeout and ends in a ``TimeoutError`` that
says which side starved, never a hang.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import ray

from marlbuf.distributed._ray import DEFAULT_TIMEOUT_S, get, worker_env


class _LimiterActor:
    """The shared counters (a Ray async actor: waiting calls do not block others)."""

    def __init__(self, ratio: float, min_size: int, error_buffer: float) -> None:
        self.ratio = ratio
        self.min_size = min_size
        self.low = ratio * min_size - error_buffer
        self.high = ratio * min_size + error_buffer
        self.inserts = 0
        self.samples = 0
        self.blocked = {"insert": 0, "sample": 0}  # calls that had to wait
        self.extreme = 0.0  # largest |samples - ratio * (inserts - min_size)| once sampling
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # created inside the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    def _diff(self) -> float:
        return self.ratio * self.inserts - self.samples

    def _can_insert(self, n: int) -> bool:
        return self._diff() + self.ratio * n <= self.high

    def _can_sample(self, n: int) -> bool:
        return self.inserts >= self.min_size and self._diff() - n >= self.low

    def _note(self) -> None:
        if self.samples:
            gap = abs(self.samples - self.ratio * (self.inserts - self.min_size))
            self.extreme = max(self.extreme, gap)

    async def insert(self, n: int, timeout: float) -> bool:
        return await self._wait("insert", n, timeout)

    async def sample(self, n: int, timeout: float) -> bool:
        return await self._wait("sample", n, timeout)

    async def _wait(self, side: str, n: int, timeout: float) -> bool:
        cond = self._condition()
        ready = self._can_insert if side == "insert" else self._can_sample
        async with cond:
            if not ready(n):
                self.blocked[side] += 1
                try:
                    await asyncio.wait_for(cond.wait_for(lambda: ready(n)), timeout)
                except asyncio.TimeoutError:
                    return False
            if side == "insert":
                self.inserts += n
            else:
                self.samples += n
            self._note()
            cond.notify_all()
            return True

    def stats(self) -> dict[str, Any]:
        return {
            "inserts": self.inserts,
            "samples": self.samples,
            "blocked_inserts": self.blocked["insert"],
            "blocked_samples": self.blocked["sample"],
            "max_gap": self.extreme,
        }


_RemoteLimiter = ray.remote(num_cpus=0, max_restarts=0)(_LimiterActor)


class RateLimiter:
    """Blocks the faster side so that ``samples ≈ samples_per_insert * inserts``.

    Pass it to :class:`~marlbuf.distributed.ShardedReplayBuffer` (``rate_limiter=``): every
    write (through the buffer or a :class:`~marlbuf.distributed.ShardWriter`) counts its
    transitions as inserts, every sampling call counts ``batch_size`` samples (one
    ``sample_for_trainers`` round of all trainers counts once: it is one update on
    ``batch_size`` rows per trainer). Picklable: writers in other processes share the counters.

    Parameters
    ----------
    samples_per_insert : float
        The target ratio ``r`` (> 0), e.g. ``batch_size / update_every``.
    min_size_to_sample : int, default 1
        Inserts before the first sample may proceed (the warm-up).
    error_buffer : float, optional
        How far ``samples`` may drift from ``r * (inserts - min_size)``; default
        ``max(1024, 2 * r * 1024)``. A single call of ``n`` needs ``r * n <= error_buffer``
        (inserts) or ``n <= error_buffer`` (samples), which is what rules out a deadlock.
    timeout : float, default 60
        Seconds a call may wait before ``TimeoutError``.

    Examples
    --------
    >>> limiter = RateLimiter(samples_per_insert=4.0, min_size_to_sample=1000)  # doctest: +SKIP
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int = 1,
        error_buffer: float | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        ratio = _positive("samples_per_insert", samples_per_insert)
        if (
            isinstance(min_size_to_sample, bool)
            or not isinstance(min_size_to_sample, int)
            or min_size_to_sample < 0
        ):
            raise ValueError(
                f"min_size_to_sample must be an int >= 0; got min_size_to_sample="
                f"{min_size_to_sample!r}"
            )
        if error_buffer is None:
            error_buffer = max(1024.0, 2.0 * ratio * 1024)
        self.samples_per_insert = ratio
        self.min_size_to_sample = int(min_size_to_sample)
        self.error_buffer = _positive("error_buffer", error_buffer)
        self.timeout = _positive("timeout", timeout)
        self._actor: Any = _RemoteLimiter.options(runtime_env=worker_env()).remote(
            ratio, self.min_size_to_sample, self.error_buffer
        )

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self.samples_per_insert}, "
            f"min_size_to_sample={self.min_size_to_sample}, error_buffer={self.error_buffer})"
        )

    def await_insert(self, n: int) -> None:
        """Block until ``n`` inserts keep the ratio; count them. ``TimeoutError`` after
        ``timeout`` seconds (the learner is not sampling)."""
        if self.samples_per_insert * n > self.error_buffer:
            raise ValueError(
                f"an insert of n={n} transitions can never fit: samples_per_insert * n = "
                f"{self.samples_per_insert * n:g} exceeds error_buffer={self.error_buffer:g}; "
                "write in smaller chunks or raise error_buffer"
            )
        ok = get(self._actor.insert.remote(int(n), self.timeout), self.timeout + 30, "insert", None)
        if not ok:
            raise TimeoutError(
                f"rate limiter: an insert of {n} waited {self.timeout:g} s for the learner to "
                f"sample (samples_per_insert={self.samples_per_insert:g}, state {self.stats()}); "
                "the sampling side has stopped or is too slow"
            )

    def await_sample(self, n: int) -> None:
        """Block until ``n`` samples keep the ratio; count them. ``TimeoutError`` after
        ``timeout`` seconds (the writers are not inserting)."""
        if n > self.error_buffer:
            raise ValueError(
                f"a sample of n={n} can never fit: it exceeds error_buffer={self.error_buffer:g}; "
                "raise error_buffer to at least the batch size"
            )
        ok = get(self._actor.sample.remote(int(n), self.timeout), self.timeout + 30, "sample", None)
        if not ok:
            raise TimeoutError(
                f"rate limiter: a sample of {n} waited {self.timeout:g} s for writers to insert "
                f"(samples_per_insert={self.samples_per_insert:g}, min_size_to_sample="
                f"{self.min_size_to_sample}, state {self.stats()}); the writers have stopped "
                "or are too slow"
            )

    def stats(self) -> dict[str, Any]:
        """``inserts``, ``samples``, calls that had to wait on each side, and ``max_gap``: the
        largest ``|samples - r * (inserts - min_size)|`` seen after sampling started."""
        return dict(get(self._actor.stats.remote(), self.timeout, "stats", None))

    def close(self) -> None:
        """End the limiter's actor."""
        ray.kill(self._actor)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number; got {name}={value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0; got {name}={value!r}")
    return float(value)


__all__ = ["RateLimiter"]
