"""Offline data: reading and writing Flashbax vaults, and converting one larger than memory.

The vault: cooperative navigation with 3 agents (mpe2's ``simple_spread`` through
:mod:`marlbuf.envs`, random discrete actions, 25-step episodes), stored with OG-MARL's keys:
``observations`` ``(1, T, 3, 18)`` float32, ``actions`` ``(1, T, 3)`` int32, ``rewards``,
``terminals``, ``truncations`` ``(1, T, 3)`` float32, gzip level 5 (Flashbax's default). A
block of recorded steps is repeated to the vault's size (the repeats lie far beyond gzip's
32 KiB window, so they compress like fresh steps). Three parts:

* **read** (timed interleaved, rotating, median of paired per-round ratios):
  ``read_vault`` (the vault into a :class:`~marlbuf.MultiAgentReplayBuffer`, observations
  stored once) against ``tensorstore_raw`` (TensorStore reading every leaf whole, all leaves
  at once: the decode alone, no conversion, nothing stored) and, when ``flashbax`` imports
  (run the suite with a Python that has it), ``flashbax_read_numpy``: Flashbax's
  ``Vault.read()`` followed by the conversion a user writes in NumPy (arrays per agent,
  one-hot actions, ``next_obs`` from the following step, repeated at episode ends).
* **write** (same method): ``write_vault`` of a buffer holding the vault's steps against
  Flashbax's ``Vault.write`` of a ``TrajectoryBufferState`` holding them (JAX arrays made
  before the timing); both create the vault in a fresh folder and compress with gzip 5.
* **memory**: a child process converts a vault of twice the memory budget into a
  memory-mapped buffer (``read_vault(path=..., chunk_bytes=budget // 32)``) and reports its
  peak resident set (``VmHWM``) while converting (until the complete buffer is closed) and in
  all (the complete buffer reopened at its folder, which loads its metadata), its resident set
  after the imports and at the end, and the buffer's metadata that stays in RAM (write
  generations, next-observation links); once as marlbuf does it, and once with the mapped
  files' pages left resident (``release_pages`` turned off), to show what they would add.

``targets`` holds the goals with PASS/FAIL: read throughput of at least 0.8x raw TensorStore and
at least 1x Flashbax's read with the NumPy conversion, a peak resident set of at most the budget
plus 10%. They are reported, not enforced (the command's exit status does not depend on them).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import (
    check,
    checks_markdown,
    copy_bandwidth,
    markdown_table,
    paired_ratio,
    time_interleaved,
)

SUITE = "offline"
N_AGENTS = 3
N_ACTIONS = 5

QUICK: dict[str, Any] = {
    "steps": 400_000,
    "base_steps": 50_000,
    "repeats": 3,
    "budget_bytes": 512 * 1024**2,
}
FULL: dict[str, Any] = {
    "steps": 2_000_000,
    "base_steps": 200_000,
    "repeats": 5,
    "budget_bytes": 1024**3,
}

#: The memory part converts in chunks of this share of the budget.
CHUNK_SHARE = 32
#: The targets: read against raw TensorStore and against Flashbax + NumPy, and
#: peak memory against the budget.
READ_VS_RAW = 0.8
READ_VS_FLASHBAX = 1.0
MEMORY_SLACK = 1.10


def recorded_steps(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``steps`` of cooperative navigation (3 agents, random discrete actions) as OG-MARL's
    leaves, each ``(1, steps, ...)``."""
    from marlbuf.envs import make

    env = make("cooperative_navigation", n_agents=N_AGENTS, seed=seed, continuous_actions=False)
    rng = np.random.default_rng(seed)
    obs_dim = env.obs_dims[0]
    out = {
        "observations": np.empty((1, steps, N_AGENTS, obs_dim), np.float32),
        "actions": rng.integers(0, N_ACTIONS, (1, steps, N_AGENTS)).astype(np.int32),
        "rewards": np.empty((1, steps, N_AGENTS), np.float32),
        "terminals": np.zeros((1, steps, N_AGENTS), np.float32),
        "truncations": np.zeros((1, steps, N_AGENTS), np.float32),
    }
    obs = env.reset()
    for t in range(steps):
        out["observations"][0, t] = np.stack(obs)
        obs, reward, _, info = env.step(list(out["actions"][0, t]))
        out["rewards"][0, t] = reward
        if info["episode_over"]:
            out["truncations"][0, t] = 1.0
            obs = env.reset()
    env.close()
    return out


def make_vault(path: Path, steps: int, base: dict[str, np.ndarray]) -> Path:
    """A vault of ``steps`` steps at ``path``: the ``base`` block repeated."""
    from marlbuf.offline.vault import LeafSpec, VaultWriter

    leaves = {k: LeafSpec(v.shape[2:], v.dtype) for k, v in base.items()}
    writer = VaultWriter(path, leaves)
    block = next(iter(base.values())).shape[1]
    block -= block % writer.chunk_steps if block >= writer.chunk_steps else 0
    for t0 in range(0, steps, block):
        n = min(block, steps - t0)
        writer.append({k: v[:, :n] for k, v in base.items()})
    writer.close()
    return path


def flashbax_available() -> bool:
    try:
        import flashbax.vault  # noqa: F401
    except ImportError:
        return False
    return True


def numpy_conversion(experience: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """What a user writes to turn ``Vault.read().experience`` into per-agent transition
    arrays: obs, one-hot action, reward, next_obs (the following step's obs, the step's own at
    episode ends) and done."""
    obs = np.asarray(experience["observations"])[0]
    actions = np.asarray(experience["actions"])[0]
    rewards = np.asarray(experience["rewards"])[0]
    terminals = np.asarray(experience["terminals"])[0]
    truncations = np.asarray(experience["truncations"])[0]
    ends = ((terminals != 0) | (truncations != 0)).all(axis=1)
    next_obs = np.concatenate([obs[1:], obs[-1:]])
    next_obs[ends] = obs[ends]
    eye = np.eye(N_ACTIONS, dtype=np.float32)
    agents = [f"agent_{i}" for i in range(obs.shape[1])]
    return {
        "obs": {a: obs[:, i] for i, a in enumerate(agents)},
        "action": {a: eye[actions[:, i]] for i, a in enumerate(agents)},
        "reward": {a: rewards[:, i] for i, a in enumerate(agents)},
        "next_obs": {a: next_obs[:, i] for i, a in enumerate(agents)},
        "done": {a: terminals[:, i] for i, a in enumerate(agents)},
    }


def _read_cases(vault: Path) -> dict[str, Any]:
    from marlbuf.offline import read_vault, vault_info
    from marlbuf.offline.vault import VaultReader

    info = vault_info(vault)

    def tensorstore_raw() -> Any:
        reader = VaultReader(info)  # opened afresh each time, as the other cases open theirs
        futures = [a[:, 0 : info.steps].read() for a in reader.arrays.values()]
        return [f.result() for f in futures]

    cases: dict[str, Any] = {
        "read_vault": lambda: read_vault(vault, n_actions=N_ACTIONS),
        "tensorstore_raw": tensorstore_raw,
    }
    if flashbax_available():
        from flashbax.vault import Vault

        def flashbax_read_numpy() -> Any:
            with _quiet():  # Flashbax prints a line whenever it opens a vault
                loaded = Vault(
                    vault.parent.name, rel_dir=str(vault.parent.parent), vault_uid=vault.name
                )
            return numpy_conversion(loaded.read().experience)

        cases["flashbax_read_numpy"] = flashbax_read_numpy
    return cases


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Standard output discarded (a peer's progress prints)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def _write_cases(vault: Path, work: Path) -> tuple[dict[str, Any], Any]:
    from marlbuf.offline import read_vault, write_vault

    buffer = read_vault(vault, n_actions=N_ACTIONS)
    counter = iter(range(1_000_000))

    def fresh(name: str) -> Path:
        path = work / f"{name}-{next(counter)}"
        return path

    def marlbuf_write() -> None:
        target = fresh("marlbuf") / "cn3.vlt" / "w"
        write_vault(buffer, target)
        shutil.rmtree(target.parent.parent)

    cases: dict[str, Any] = {"write_vault": marlbuf_write}
    if flashbax_available():
        import jax.numpy as jnp
        from flashbax.buffers.trajectory_buffer import TrajectoryBufferState
        from flashbax.vault import Vault

        from marlbuf.offline.vault import VaultReader, vault_info

        info = vault_info(vault)
        data = VaultReader(info).read(0, info.steps)
        state = TrajectoryBufferState(
            experience={k: jnp.asarray(v) for k, v in data.items()},
            current_index=jnp.asarray(info.steps),
            is_full=jnp.asarray(False),
        )

        def flashbax_write() -> None:
            base = fresh("flashbax")
            with _quiet():  # Flashbax prints whenever it creates a vault
                out = Vault("cn3.vlt", state.experience, rel_dir=str(base), vault_uid="w")
            out.write(state, source_interval=(0, info.steps))
            shutil.rmtree(base)

        cases["flashbax_vault_write"] = flashbax_write
    return cases, buffer


#: The child of the memory part: converts ``argv[1]`` into ``argv[2]`` with chunks of
#: ``argv[3]`` bytes; ``argv[4] == "keep"`` leaves the mapped pages resident.
CHILD = """
import json, sys
from marlbuf import MultiAgentReplayBuffer
from marlbuf.offline import read_vault

def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1

import tensorstore  # the reader's import, counted in the baseline
if sys.argv[4] == "keep":
    MultiAgentReplayBuffer.release_pages = lambda self: None
converting = {}
reopen = MultiAgentReplayBuffer.open.__func__

def open_converted(cls, *args, **kwargs):  # the last step: the complete buffer reopened
    converting["peak"] = status("VmHWM")
    return reopen(cls, *args, **kwargs)

MultiAgentReplayBuffer.open = classmethod(open_converted)
baseline = status("VmRSS")
buf = read_vault(sys.argv[1], path=sys.argv[2], chunk_bytes=int(sys.argv[3]), n_actions=5)
metadata = int(buf.write_generation.nbytes) + (0 if buf.links is None else 16 * buf.capacity)
print(json.dumps({"peak_rss": status("VmHWM"), "peak_rss_converting": converting["peak"],
                  "rss_at_end": status("VmRSS"), "baseline_rss": baseline,
                  "metadata_bytes": metadata, "steps": len(buf)}))
buf.close()
"""


def _convert_in_child(vault: Path, target: Path, chunk_bytes: int, keep: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(vault),
            str(target),
            str(chunk_bytes),
            "keep" if keep else "release",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the conversion child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no torch here: TensorStore's threads
    bandwidth = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="marlbuf-offline-") as tmp:
        work = Path(tmp)
        if progress:
            print(f"[offline] recording {cfg['base_steps']:,} steps of CN-3 ...", flush=True)
        base = recorded_steps(cfg["base_steps"])
        step_bytes = sum(v[0, 0].nbytes for v in base.values())
        vault = make_vault(work / "vaults" / "cn3.vlt" / "random", cfg["steps"], base)
        from marlbuf.offline import vault_info

        info = vault_info(vault)
        disk = sum(p.stat().st_size for p in vault.rglob("*") if p.is_file())
        # ---------------------------------------------------------------- read
        if progress:
            print(f"[offline] read: {info.steps:,} steps, {info.nbytes / 1e6:.0f} MB", flush=True)
        timings = time_interleaved(
            _read_cases(vault), repeats=cfg["repeats"], warmup=1, rotate=True, keep_samples=True
        )
        raw = timings["tensorstore_raw"]
        for case, t in timings.items():
            rows.append(
                {
                    "part": "read",
                    "case": case,
                    "s_median": t["median"],
                    "s_min": t["min"],
                    "s_max": t["max"],
                    "MBps_median": info.nbytes / t["median"] / 1e6,
                    "throughput_vs_tensorstore_raw": 1.0 / paired_ratio(t, raw),
                }
            )
        ratio_raw = 1.0 / paired_ratio(timings["read_vault"], raw)
        checks.append(
            check(
                "read_vault vs raw TensorStore (throughput)", ratio_raw, READ_VS_RAW, at_most=False
            )
        )
        if "flashbax_read_numpy" in timings:
            ratio_fbx = 1.0 / paired_ratio(timings["read_vault"], timings["flashbax_read_numpy"])
            note = ""
        else:
            ratio_fbx, note = float("nan"), "flashbax not installed in this Python"
        checks.append(
            check(
                "read_vault vs Flashbax Vault.read + NumPy (throughput)",
                ratio_fbx,
                READ_VS_FLASHBAX,
                at_most=False,
                note=note,
            )
        )
        gc.collect()
        # ---------------------------------------------------------------- write
        if progress:
            print("[offline] write ...", flush=True)
        cases, buffer = _write_cases(vault, work)
        timings = time_interleaved(
            cases, repeats=cfg["repeats"], warmup=1, rotate=True, keep_samples=True
        )
        del buffer
        gc.collect()
        for case, t in timings.items():
            rows.append(
                {
                    "part": "write",
                    "case": case,
                    "s_median": t["median"],
                    "s_min": t["min"],
                    "s_max": t["max"],
                    "MBps_median": info.nbytes / t["median"] / 1e6,
                    "throughput_vs_write_vault": 1.0 / paired_ratio(t, timings["write_vault"]),
                }
            )
        # ---------------------------------------------------------------- memory
        budget = int(cfg["budget_bytes"])
        big_steps = 2 * budget // step_bytes
        if progress:
            print(
                f"[offline] memory: a vault of {big_steps:,} steps ({2 * budget / 2**20:.0f} MiB) "
                f"into a mapped buffer, budget {budget / 2**20:.0f} MiB ...",
                flush=True,
            )
        shutil.rmtree(work / "vaults")
        big = make_vault(work / "big" / "cn3.vlt" / "random", big_steps, base)
        memory = {}
        for mode in cfg.get("memory_modes", ("release", "keep")):
            target = work / f"mapped-{mode}"
            memory[mode] = _convert_in_child(
                big, target, budget // CHUNK_SHARE, keep=mode == "keep"
            )
            shutil.rmtree(target)
            rows.append(
                {
                    "part": "memory",
                    "case": "read_vault(path=...)" + ("" if mode == "release" else ", pages kept"),
                    "vault_MiB": 2 * budget / 2**20,
                    "budget_MiB": budget / 2**20,
                    "chunk_MiB": budget / CHUNK_SHARE / 2**20,
                    "peak_rss_MiB": memory[mode]["peak_rss"] / 2**20,
                    "peak_rss_converting_MiB": memory[mode]["peak_rss_converting"] / 2**20,
                    "rss_at_end_MiB": memory[mode]["rss_at_end"] / 2**20,
                    "baseline_rss_MiB": memory[mode]["baseline_rss"] / 2**20,
                    "metadata_MiB": memory[mode]["metadata_bytes"] / 2**20,
                    "peak_over_budget": memory[mode]["peak_rss"] / budget,
                }
            )
        checks.append(
            check(
                "peak RSS / memory budget, vault of twice the budget",
                memory["release"]["peak_rss"] / budget,
                MEMORY_SLACK,
            )
        )
    summary = {
        "read_vs_tensorstore_raw": ratio_raw,
        "read_vs_flashbax_numpy": ratio_fbx,
        "peak_rss_over_budget": memory["release"]["peak_rss"] / budget,
        "peak_rss_converting_over_budget": memory["release"]["peak_rss_converting"] / budget,
        "peak_rss_over_budget_pages_kept": memory["keep"]["peak_rss"] / budget
        if "keep" in memory
        else float("nan"),
        "flashbax": flashbax_available(),
    }
    return {
        "config": {
            "steps": cfg["steps"],
            "bytes_per_step": step_bytes,
            "vault_MB": info.nbytes / 1e6,
            "vault_on_disk_MB": disk / 1e6,
            "repeats": cfg["repeats"],
            "budget_MiB": cfg["budget_bytes"] / 2**20,
            "OMP_WAIT_POLICY": os.environ["OMP_WAIT_POLICY"],
            "copy_bandwidth_GBps": bandwidth / 1e9,
        },
        "rows": rows,
        "targets": checks,
        "summary": summary,
        "markdown": markdown_table(
            [r for r in rows if r["part"] != "memory"],
            [
                "part",
                "case",
                "s_median",
                "MBps_median",
                "throughput_vs_tensorstore_raw",
                "throughput_vs_write_vault",
            ],
        )
        + "\n\n"
        + markdown_table(
            [r for r in rows if r["part"] == "memory"],
            [
                "case",
                "vault_MiB",
                "budget_MiB",
                "chunk_MiB",
                "baseline_rss_MiB",
                "metadata_MiB",
                "peak_rss_converting_MiB",
                "peak_rss_MiB",
                "rss_at_end_MiB",
                "peak_over_budget",
            ],
        )
        + "\n\n"
        + checks_markdown(checks),
    }
