"""Environment throughput: transitions per second of the paper's MPE tasks (random policy).

One timed call is one episode: ``reset`` + 25 steps with uniform random float32 actions, so the
figures include the reset and, for marlbuf, the wrapper's action checks. Cases, timed side by
side with interleaved repeats:

* ``mpe2_parallel`` — mpe2's own PettingZoo ``parallel_env`` with dict actions (the baseline:
  what a trainer would use without ``marlbuf.envs``);
* ``marlbuf_env`` — :func:`marlbuf.envs.make` with its defaults: drives mpe2's AEC env
  directly, with the vectorized world step, rewards and observations of
  :mod:`marlbuf.envs._fast` (bit-identical to mpe2);
* ``marlbuf_env_fast_off`` — ``make(..., fast=False)``: mpe2's own per-entity loops (for
  predator-prey with the shared predator reward computed once per step);
* ``marlbuf_env_unpatched`` — predator-prey only: ``fast=False, shared_predator_reward=False``,
  mpe2's code untouched (only the wrapper differs from ``mpe2_parallel``);
* ``rollout+buffer`` — :func:`marlbuf.envs.rollout` of one episode into an interleaved
  ``MultiAgentReplayBuffer`` (the env side of a training loop, ``buffer.add`` included).

Every agent is a trainer (prey included), so each row also reports ``n_trainers``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marlbuf import MultiAgentReplayBuffer
from marlbuf.bench.tools.common import markdown_table, quiet_threads, time_interleaved
from marlbuf.envs import EPISODE_LENGTH, MPEEnv, make, rollout
from marlbuf.workloads import PAPER_WORKLOADS, Workload

SUITE = "envs"

QUICK: dict[str, Any] = {
    "workloads": [Workload("cooperative_navigation", 3), Workload("predator_prey", 3)],
    "repeats": 3,
}
FULL: dict[str, Any] = {"workloads": PAPER_WORKLOADS, "repeats": 5}


def _make(workload: Workload, **kwargs: Any) -> MPEEnv:
    if workload.env == "cooperative_navigation":
        return make(workload.env, n_agents=workload.n, seed=0, **kwargs)
    return make(workload.env, n_predators=workload.n, seed=0, **kwargs)


def _mpe2_parallel(env: MPEEnv) -> Any:
    """mpe2's PettingZoo parallel env with the configuration of ``env``."""
    from mpe2 import simple_spread_v3, simple_tag_v3

    c = env.config
    common = {"max_cycles": EPISODE_LENGTH, "continuous_actions": True}
    if env.name == "cooperative_navigation":
        return simple_spread_v3.parallel_env(N=c["n_agents"], local_ratio=0.5, **common)
    return simple_tag_v3.parallel_env(
        num_adversaries=c["n_predators"],
        num_good=c["n_prey"],
        num_obstacles=c["n_landmarks"],
        **common,
    )


def _episode_mpe2(parallel: Any, agents: list[str], rng: np.random.Generator) -> None:
    parallel.reset()
    for _ in range(EPISODE_LENGTH):
        actions = rng.random((len(agents), 5), dtype=np.float32)
        parallel.step({a: actions[i] for i, a in enumerate(agents)})


def _episode_marlbuf(env: MPEEnv) -> None:
    env.reset()
    for _ in range(EPISODE_LENGTH):
        env.step(env.random_actions())


def _cases(workload: Workload) -> dict[str, Callable[[], None]]:
    env = _make(workload)
    parallel = _mpe2_parallel(env)
    parallel.reset(seed=0)
    rng = np.random.default_rng(0)
    cases: dict[str, Callable[[], None]] = {
        "mpe2_parallel": lambda: _episode_mpe2(parallel, env.agents, rng),
        "marlbuf_env": lambda: _episode_marlbuf(env),
    }
    slow = _make(workload, fast=False)
    cases["marlbuf_env_fast_off"] = lambda: _episode_marlbuf(slow)
    if workload.env == "predator_prey":
        unpatched = _make(workload, fast=False, shared_predator_reward=False)
        cases["marlbuf_env_unpatched"] = lambda: _episode_marlbuf(unpatched)
    fill_env = _make(workload)
    buffer = MultiAgentReplayBuffer(fill_env.specs(), capacity=100 * EPISODE_LENGTH, seed=0)

    def episode_into_buffer() -> None:
        rollout(fill_env, EPISODE_LENGTH, buffer=buffer)

    cases["rollout+buffer"] = episode_into_buffer
    return cases


def run(quick: bool = False) -> dict[str, Any]:
    """Time one episode per case and workload; transitions/s and ratios to ``mpe2_parallel``."""
    threads = quiet_threads()
    cfg = QUICK if quick else FULL
    rows: list[Mapping[str, Any]] = []
    summary: dict[str, Any] = {}
    for workload in cfg["workloads"]:
        timings = time_interleaved(_cases(workload), repeats=cfg["repeats"], warmup=1)
        baseline = timings["mpe2_parallel"]["median"]
        for case, t in timings.items():
            rows.append(
                {
                    "env": workload.label,
                    "case": case,
                    "n_trainers": workload.n_trainers,
                    "obs_dims": sorted(set(workload.obs_dims()), reverse=True),
                    "ms_median": 1e3 * t["median"] / EPISODE_LENGTH,  # per step
                    "ms_min": 1e3 * t["min"] / EPISODE_LENGTH,
                    "ms_max": 1e3 * t["max"] / EPISODE_LENGTH,
                    "transitions_per_second": EPISODE_LENGTH / t["median"],
                    "speedup_vs_mpe2_parallel": baseline / t["median"],
                    "repeats": t["n"],
                }
            )
        ours = timings["marlbuf_env"]["median"]
        summary[workload.label] = {
            "transitions_per_second": EPISODE_LENGTH / ours,
            "speedup_vs_mpe2_parallel": baseline / ours,
            "with_buffer_add_transitions_per_second": EPISODE_LENGTH
            / timings["rollout+buffer"]["median"],
        }
    columns = ["env", "case", "n_trainers", "ms_median", "transitions_per_second"]
    columns.append("speedup_vs_mpe2_parallel")
    return {
        "rows": rows,
        "summary": summary,
        "config": {
            "workloads": [w.label for w in cfg["workloads"]],
            "repeats": cfg["repeats"],
            "timed_unit": f"one episode: reset + {EPISODE_LENGTH} steps, random float32 actions",
            "threads": threads,
        },
        "table": markdown_table(rows, columns),
    }


if __name__ == "__main__":  # pragma: no cover
    import sys

    from marlbuf.bench.tools.common import write_result

    quick_run = "--quick" in sys.argv
    payload = run(quick=quick_run)
    print(payload["table"])
    print(write_result(SUITE, payload, quick=quick_run))
