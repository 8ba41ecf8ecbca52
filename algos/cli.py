"""``marlbuf train``: MADDPG / MATD3 on MPE cooperative navigation or predator-prey.

Writes into ``--out`` (default ``runs/<algo>-<env>-<N>-s<seed>``):

* ``episodes.csv`` and ``episodes.jsonl`` — one line per episode: return (sum over agents, as
  openai/maddpg prints it), the same in the original MPE's units, per-agent returns, update
  rounds so far, wall time and the episode's time per phase;
* ``config.json`` — the full :class:`~marlbuf.algos.TrainConfig`;
* ``checkpoint/`` — networks, optimizers, buffer and RNG states every ``--checkpoint-every``
  episodes, at the end, and on Ctrl-C; ``--resume`` continues from it exactly;
* ``rewards.png`` — the reward curve (needs matplotlib; skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import re
import shutil
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from marlbuf.algos.config import (
    ALGOS,
    ENV_IMPLS,
    FORMULATIONS,
    LAYOUTS,
    SAMPLE_ORDERS,
    SAMPLERS,
    TrainConfig,
)
from marlbuf.cli import ENV_HELP, ArgumentParser, env_name, error

PROG = "marlbuf train"

#: Episodes of the default run: about 4 minutes on one core (see docs/training.md for what the
#: reward curve should look like).
DEFAULT_EPISODES = 6000

#: Flags that set :class:`TrainConfig` fields: flag name (argparse dest) -> the fields it sets.
CONFIG_FLAGS: dict[str, tuple[str, ...]] = {
    "algo": ("algo",),
    "env": ("env",),
    "agents": ("n_agents",),
    "prey": ("n_prey",),
    "env_impl": ("env_impl",),
    "layout": ("layout",),
    "sampler": ("sampler",),
    "sample_order": ("sample_order",),
    "run_length": ("run_length",),
    "alpha": ("alpha",),
    "beta": ("beta",),
    "beta_final": ("beta_final",),
    "beta_anneal_rounds": ("beta_anneal_rounds",),
    "priority_index": ("priority_index",),
    "seed": ("seed",),
    "threads": ("threads",),
    "device": ("device",),
    "buffer_device": ("buffer_device",),
    "obs_dtype": ("obs_dtype",),
    "batch_size": ("batch_size",),
    "buffer_size": ("buffer_size",),
    "warmup": ("warmup_steps",),
    "update_every": ("update_every",),
    "lr": ("lr_actor", "lr_critic"),
    "formulation": ("formulation",),
    "target_init": ("target_init",),
    "shared_index": ("shared_index",),
    "overlap_gather": ("overlap_gather",),
}

#: Flags that may differ from the checkpoint on ``--resume``: they say how long and how this
#: invocation runs, not what is computed (a resumed run gives the same numbers with any of
#: them). Every other flag, when given with ``--resume``, must equal the checkpoint's value.
RESUME_MAY_CHANGE = (
    "episodes",
    "checkpoint_every",
    "threads",
    "device",
    "overlap_gather",
    "no_plot",
    "no_progress",
    "log_every",
)

#: Episodes between progress lines when no progress bar is shown (``--no-progress``).
DEFAULT_LOG_EVERY = 100

#: What a run writes into ``--out``: a folder holding any of these is an existing run.
RUN_FILES = ("checkpoint", "episodes.csv", "episodes.jsonl", "config.json", "rewards.png")


def flag(dest: str) -> str:
    """The command-line spelling of the option stored under ``dest``."""
    return "--" + dest.replace("_", "-")


def flags_in(message: str) -> str:
    """``message`` (a :class:`TrainConfig` or runner error) with configuration field names
    replaced by the flags that set them: ``n_agents=0`` reads ``--agents=0``.

    Field names with an underscore are replaced wherever they stand as a word; one-word names
    (``env``, ``seed``) only where a value follows (``env=CN``), so that prose keeps its words.
    """
    for dest, fields in CONFIG_FLAGS.items():
        for name in fields:
            pattern = rf"\b{name}\b" if "_" in name else rf"\b{name}(?==)"
            message = re.sub(pattern, flag(dest), message)
    return message


def first_update_step(config: TrainConfig) -> int:
    """The env step (counted from 1) at which the first update round runs: the first multiple
    of ``update_every`` once the warm-up is stored (openai/maddpg's rule, as
    :meth:`Runner.update_due`)."""
    every = config.update_every
    return max(every, -(-config.effective_warmup // every) * every)


def episodes_for_steps(steps: int, episode_length: int) -> int:
    """Whole episodes that contain ``steps`` env steps."""
    return -(-steps // episode_length)


def build_parser() -> ArgumentParser:
    """The ``marlbuf train`` argument parser (``--help`` shows every default)."""
    p = ArgumentParser(PROG, "Train MADDPG / MATD3 on MPE (paper defaults; deviations are flags).")
    p.add_argument("--algo", choices=ALGOS, default="maddpg", help="trainer")
    p.add_argument("--env", type=env_name, default="cooperative_navigation", help=ENV_HELP)
    p.add_argument("--agents", type=int, default=3, help="agents (CN) or predators (PP), 1-48")
    p.add_argument("--prey", type=int, default=None, help="PP prey (default: max(1, N // 3))")
    p.add_argument(
        "--env-impl",
        choices=ENV_IMPLS,
        default="fast",
        help="fast: vectorized MPE step (bit-identical); mpe2: mpe2's own code",
    )
    p.add_argument("--layout", choices=LAYOUTS, default="interleaved", help="buffer layout")
    p.add_argument("--sampler", choices=SAMPLERS, default="uniform", help="buffer sampler")
    p.add_argument(
        "--sample-order",
        choices=SAMPLE_ORDERS,
        default=None,
        help="uniform/prioritized: indices in ascending slot order (memory: the same batch as a "
        "set, gathered front to back) or in draw order (random); default: the sampler's own "
        "(uniform memory, prioritized random)",
    )
    p.add_argument(
        "--run-length",
        type=int,
        default=1,
        help="neighbor: slots per reference (1: no runs; longer runs sample faster but lost "
        "return on cooperative navigation, see docs/training.md 'Choosing a run length')",
    )
    p.add_argument("--alpha", type=float, default=0.6, help="prioritized: priority exponent")
    p.add_argument(
        "--priority-index",
        choices=("host", "device"),
        default="host",
        help="prioritized: priority trees on the host, or in tensors on the buffer's device "
        "(with --buffer-device; updates and draws without copies to the host)",
    )
    p.add_argument("--beta", type=float, default=0.5, help="prioritized: initial IS exponent")
    p.add_argument("--beta-final", type=float, default=1.0, help="prioritized: final IS exponent")
    p.add_argument(
        "--beta-anneal-rounds",
        type=int,
        default=None,
        help="prioritized: update rounds of the beta annealing (default: the whole run)",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=DEFAULT_EPISODES,
        help="total episodes of the run, counted from its first: with --resume the run "
        "continues until it has this many (default: "
        f"{DEFAULT_EPISODES}; with --resume: the checkpointed run's total)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds env, sampler, networks, noise")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:k]")
    p.add_argument(
        "--buffer-device",
        default=None,
        help="keep the replay buffer on this device (the --device): the whole update round "
        "runs there without host round-trips (default: a host buffer, batches copied through "
        "pinned memory)",
    )
    p.add_argument(
        "--obs-dtype",
        choices=("float32", "float16"),
        default="float32",
        help="observation storage in the replay buffer (float16: half the bytes, float32 batches)",
    )
    p.add_argument("--batch-size", type=int, default=1024, help="rows per trainer per update")
    p.add_argument("--buffer-size", type=int, default=1_000_000, help="replay capacity")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="transitions stored before the first update round (default: --batch-size * 25, "
        "25,600 at the default batch; a run shorter than that never updates)",
    )
    p.add_argument("--update-every", type=int, default=100, help="env steps per update round")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (actor and critic)")
    p.add_argument(
        "--formulation",
        choices=FORMULATIONS,
        default="batched",
        help="batched: stacked weights; loop: one module per agent (same numbers)",
    )
    p.add_argument(
        "--target-init",
        choices=("copy", "independent"),
        default="copy",
        help="target networks start as copies, or independently drawn (openai/maddpg)",
    )
    p.add_argument(
        "--shared-index",
        action="store_true",
        help="one index array for all trainers (deviation from MADDPG)",
    )
    p.add_argument(
        "--overlap-gather",
        action="store_true",
        help="loop formulation: gather the next trainer's batch in a background thread",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run folder (default: runs/<algo>-<env>-<agents>-s<seed>)",
    )
    p.add_argument("--checkpoint-every", type=int, default=500, help="episodes (0: only at end)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in OUT from its checkpoint, with its configuration; only "
        + ", ".join(flag(d) for d in RESUME_MAY_CHANGE)
        + " may differ",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an OUT that already holds a run (its checkpoint and logs are "
        "deleted)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip rewards.png")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar; print a progress line every --log-every episodes instead",
    )
    p.add_argument(
        "--log-every",
        type=int,
        default=None,
        help="episodes between progress lines (default: "
        f"{DEFAULT_LOG_EVERY} with --no-progress or without tqdm; none beside the progress bar)",
    )
    p.add_argument(
        "--actors",
        type=int,
        default=0,
        help="distributed training on Ray: this many rollout actors (each with its own env "
        "and buffer shard) and one learner; 0: the single-process loop (needs the "
        "[distributed] extra; no --resume, checkpoints hold the learner only)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --actors: join this Ray cluster ('auto': the running one); default: start "
        "a local Ray instance limited to --actors CPUs",
    )
    p.add_argument(
        "--weights-every",
        type=int,
        default=10,
        help="with --actors: update rounds between policy broadcasts to the actors",
    )
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of parsed arguments (raises ``ValueError`` on bad input)."""
    total_rounds = args.beta_anneal_rounds
    if total_rounds is None:
        total_rounds = max(1, args.episodes * 25 // max(1, args.update_every))
    return TrainConfig(
        algo=args.algo,
        env=args.env,
        n_agents=args.agents,
        n_prey=args.prey,
        env_impl=args.env_impl,
        layout=args.layout,
        sampler=args.sampler,
        sample_order=args.sample_order,
        run_length=args.run_length,
        alpha=args.alpha,
        beta=args.beta,
        beta_final=args.beta_final,
        beta_anneal_rounds=total_rounds,
        priority_index=args.priority_index,
        batch_size=args.batch_size,
        buffer_size=args.buffer_size,
        warmup_steps=args.warmup,
        update_every=args.update_every,
        lr_actor=args.lr,
        lr_critic=args.lr,
        formulation=args.formulation,
        shared_index=args.shared_index,
        target_init=args.target_init,
        overlap_gather=args.overlap_gather,
        seed=args.seed,
        threads=args.threads,
        device=args.device,
        buffer_device=args.buffer_device,
        obs_dtype=args.obs_dtype,
    )


class _StopFlag:
    """First Ctrl-C: finish the current episode, save, exit. Second: stop at once."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nmarlbuf train: stopping after this episode and saving a checkpoint "
            "(Ctrl-C again to abort without saving)",
            file=sys.stderr,
        )


CSV_FIELDS = [
    "episode",
    "steps",
    "return",
    "return_original",
    "update_rounds",
    "wall_s",
    "agent_returns",
]


def log_episode(record: Any, jsonl_file: Any, writer: csv.DictWriter) -> None:
    """One episode's line in ``episodes.jsonl`` and row in ``episodes.csv`` (per-agent returns
    joined, phase times as ``t_<phase>``)."""
    row = record.to_dict()
    jsonl_file.write(json.dumps(row) + "\n")
    flat = {k: row[k] for k in CSV_FIELDS if k != "agent_returns"}
    flat["agent_returns"] = " ".join(f"{r:.4g}" for r in record.agent_returns)
    flat.update({f"t_{k}": f"{v:.6f}" for k, v in record.phases.items()})
    writer.writerow(flat)


def trailing_mean(values: Any, window: int) -> Any:
    """Mean of the last ``window`` values at every position (of fewer at the start).

    Parameters
    ----------
    values : ndarray of shape (n,)
        Per-episode returns.
    window : int
        Values averaged, >= 1.

    Returns
    -------
    ndarray of shape (n,), float64
        One point per value, so a curve drawn from it exists however short the run.
    """
    import numpy as np

    values = np.asarray(values, np.float64)
    sums = np.cumsum(values)
    lagged = np.concatenate([np.zeros(window), sums[:-window]])[: len(values)]
    return (sums - lagged) / np.minimum(np.arange(1, len(values) + 1), window)


def first_update_episode(rows: list[dict[str, str]]) -> tuple[int, int] | None:
    """The episode, counted from 1 (the log's ``episode`` column counts from 0), in which the
    first update round ran, and the run's steps at its end, from ``episodes.csv`` rows
    (``update_rounds`` counts the rounds run so far); ``None`` when no round ran."""
    for row in rows:
        if int(row["update_rounds"]) > 0:
            return int(row["episode"]) + 1, int(row["steps"])
    return None


def updates_started_line(first_episode: int, first_step: int) -> str:
    """The log line printed when the first update round has run (episodes counted from 1, as
    the header and the progress lines count them)."""
    return (
        f"updates started: the first update round ran in episode {first_episode:,} (by step "
        f"{first_step:,}); until then the buffer filled with the untrained policy. The return "
        "usually dips for a few hundred episodes while the critics learn (docs/training.md)"
    )


def closing_update_line(rows: list[dict[str, str]], window: int = 100) -> str | None:
    """The closing line about updates: the episode they started in, the mean return of the
    ``window`` episodes before it and of the last ``window`` episodes (original MPE units), so
    that a dip after the start reads as what it is; ``None`` when no update round ran."""
    first = first_update_episode(rows)
    if first is None:
        return None
    returns = [float(r["return_original"]) for r in rows]
    episodes = [int(r["episode"]) + 1 for r in rows]
    start = episodes.index(first[0])
    before = returns[max(0, start - window) : start]
    last = returns[max(start, len(returns) - window) :]
    line = f"updates started in episode {first[0]:,} (step {first[1]:,})"
    if before:
        line += (
            f"; mean return of the {len(before)} episodes before: {sum(before) / len(before):.1f}"
        )
    line += f", of the last {len(last)}: {sum(last) / len(last):.1f}"
    if len(returns) - start < 1000:
        line += (
            " (a short run after the first update: the return dips for a few hundred episodes "
            "before it climbs, see docs/training.md)"
        )
    return line


def plot_rewards(csv_path: Path, png_path: Path, title: str) -> bool:
    """Reward curve (raw and a 100-episode moving mean) from ``episodes.csv``, the warm-up
    shaded and the first update round marked; ``False`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    import numpy as np

    with open(csv_path) as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return False
    episodes = np.array([int(r["episode"]) + 1 for r in rows])  # counted from 1, as the log
    returns = np.array([float(r["return_original"]) for r in rows])
    window = min(100, len(returns))
    smooth = trailing_mean(returns, window)
    marker = "o" if len(returns) < 50 else None  # a line of few points shows its points
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(episodes, returns, color="0.6", lw=0.5, marker=marker, ms=2, label="episode")
    ax.plot(episodes, smooth, color="C0", lw=1.5, label=f"mean of the last {window} episodes")
    first = first_update_episode(rows)
    if first is None:
        ax.axvspan(episodes[0], episodes[-1], color="0.9", zorder=0, label="warm-up: no update yet")
    else:
        if first[0] > episodes[0]:
            ax.axvspan(episodes[0], first[0], color="0.9", zorder=0, label="warm-up: no updates")
        ax.axvline(
            first[0], color="C3", lw=1.0, ls="--", label=f"updates start (episode {first[0]:,})"
        )
    ax.set_xlabel("episode")
    ax.set_ylabel("return (original MPE units, sum over agents)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True


def warmup_line(config: TrainConfig, episodes: int) -> str:
    """The header line that says when updates start, and whether this run reaches them."""
    first = first_update_step(config)
    line = (
        f"warm-up {config.effective_warmup:,} transitions (--warmup); the first update round "
        f"at step {first:,} (in episode {episodes_for_steps(first, config.episode_length):,}), "
        f"then one every {config.update_every} steps (--update-every)"
    )
    if episodes * config.episode_length < first:
        line += f"; this run of {episodes:,} episodes ends before it"
    return line


def no_update_note(config: TrainConfig, steps: int) -> str:
    """Why a run that ended trained nothing, and the flags that change it."""
    first = first_update_step(config)
    return (
        f"no update round ran, so nothing was trained: updates start at step {first:,}, once "
        f"the warm-up (--warmup, default --batch-size * 25) of {config.effective_warmup:,} "
        f"transitions is stored, and this run ended at step {steps:,}. Run "
        f"--episodes {episodes_for_steps(first, config.episode_length)} or more, or lower "
        f"--warmup (at least --batch-size, {config.batch_size})"
    )


def _remove_run(out: Path) -> None:
    """Delete what an earlier run wrote into ``out`` (the caller checked it may)."""
    for name in (*RUN_FILES, "checkpoint.tmp", "checkpoint.old"):
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


def _truncate_logs(out: Path, episodes: int) -> None:
    """Drop log lines of episodes after the checkpoint (a run killed without saving)."""
    jsonl = out / "episodes.jsonl"
    if jsonl.exists():
        lines = [ln for ln in jsonl.read_text().splitlines() if ln.strip()]
        kept = [ln for ln in lines if json.loads(ln)["episode"] < episodes]
        jsonl.write_text("".join(ln + "\n" for ln in kept))
    table = out / "episodes.csv"
    if table.exists():
        with open(table, newline="") as fh:
            rows = list(csv.reader(fh))
        if rows:
            body = [r for r in rows[1:] if r and int(r[0]) < episodes]
            with open(table, "w", newline="") as fh:
                csv.writer(fh).writerows([rows[0], *body])


class UsageError(ValueError):
    """A user error of ``marlbuf train``: reported as one line, exit status 2."""


_UNSET = object()


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the options that ``argv`` names (whatever their values)."""
    # argparse fills in a default only where the namespace lacks the attribute, so a namespace
    # pre-filled with a marker shows which options the command line set
    dests = vars(parser.parse_args(argv))
    probe = parser.parse_args(argv, namespace=argparse.Namespace(**dict.fromkeys(dests, _UNSET)))
    return {k for k, v in vars(probe).items() if v is not _UNSET}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset (default)" if value is None else str(value)


def resumed_config(
    args: argparse.Namespace, given: set[str], checkpoint: Path
) -> tuple[TrainConfig, int]:
    """The checkpoint's configuration with the run-control flags of this command applied, and
    the episodes to run to; :class:`UsageError` for a flag that would change the numbers."""
    meta_path = checkpoint / "runner.json"
    if not meta_path.exists():
        raise UsageError(
            f"--resume but no checkpoint in {checkpoint} (run without --resume to start)"
        )
    try:
        saved = TrainConfig.from_dict(json.loads(meta_path.read_text())["config"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read the checkpoint {meta_path}: {exc}") from exc
    changes: dict[str, Any] = {}
    for dest in sorted(given & set(CONFIG_FLAGS)):
        value = getattr(args, dest)
        for name in CONFIG_FLAGS[dest]:
            if dest in RESUME_MAY_CHANGE:
                changes[name] = value
            elif getattr(saved, name) != value:
                raise UsageError(
                    f"{flag(dest)} is {_shown(value)} here but {_shown(getattr(saved, name))} in "
                    f"the checkpoint {checkpoint}; --resume keeps the run's configuration (only "
                    f"{', '.join(flag(d) for d in RESUME_MAY_CHANGE)} may change): drop the flag, "
                    "or start a new run with --overwrite or another --out"
                )
    episodes = (
        args.episodes if "episodes" in given else int(saved.extra.get("episodes", args.episodes))
    )
    changes["extra"] = {**saved.extra, "episodes": episodes}
    return dataclasses.replace(saved, **changes), episodes


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``marlbuf train``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    out = args.out or Path("runs") / f"{args.algo}-{args.env}-{args.agents}-s{args.seed}"
    checkpoint = out / "checkpoint"
    try:
        if args.resume and args.overwrite:
            raise UsageError("--resume and --overwrite exclude each other; choose one")
        if args.episodes < 1:
            raise UsageError(f"--episodes must be >= 1; got {args.episodes}")
        if args.checkpoint_every < 0:
            raise UsageError(f"--checkpoint-every must be >= 0; got {args.checkpoint_every}")
        if args.log_every is not None and args.log_every < 1:
            raise UsageError(f"--log-every must be >= 1; got {args.log_every}")
        if args.resume:
            config, episodes = resumed_config(args, given_flags(parser, argv), checkpoint)
        else:
            existing = [name for name in RUN_FILES if (out / name).exists()]
            if existing and not args.overwrite:
                raise UsageError(
                    f"{out} already holds a run ({', '.join(existing)}); continue it with "
                    "--resume, replace it with --overwrite, or choose another --out"
                )
            config, episodes = config_from_args(args), args.episodes
            config.extra["episodes"] = episodes  # what a later --resume runs to by default
    except (ValueError, TypeError) as exc:  # UsageError and TrainConfig's own checks
        return error(PROG, flags_in(str(exc)))
    if args.actors or args.ray_address is not None:
        from marlbuf.algos.distributed import main_distributed

        return main_distributed(args, config, episodes, out)
    from marlbuf.algos.runner import PhaseTimer, Runner

    timer = PhaseTimer()
    try:
        runner = Runner(config, profiler=timer)
    except (ValueError, TypeError, MemoryError) as exc:
        return error(PROG, flags_in(str(exc)))
    if args.resume:
        try:
            runner.load_checkpoint(checkpoint)
        except (ValueError, OSError) as exc:
            runner.close()
            return error(PROG, f"cannot resume from {checkpoint}: {exc}")
        _truncate_logs(out, runner.episodes)
    else:
        _remove_run(out)
        out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
    remaining = episodes - runner.episodes
    where = "" if config.buffer_device is None else f", buffer on {config.buffer_device}"
    print(
        f"marlbuf train: {config.algo} on {config.env}, {runner.n_trainers} trainers "
        f"(obs {sorted(set(runner.env.obs_dims))}), {config.layout}/{config.sampler}, "
        f"{config.formulation}{where}; episodes {runner.episodes}..{episodes}; out {out}",
        file=sys.stderr,
    )
    print(f"marlbuf train: {warmup_line(config, episodes)}", file=sys.stderr)
    stop = _StopFlag()
    previous_handler = signal.signal(signal.SIGINT, stop)
    csv_file = open(out / "episodes.csv", "a", newline="")
    jsonl_file = open(out / "episodes.jsonl", "a")
    writer = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS + [f"t_{p}" for p in timer.totals])
    if csv_file.tell() == 0:
        writer.writeheader()
    recent: deque[float] = deque(maxlen=100)
    last_phases = timer.snapshot()
    start = time.perf_counter()
    steps_at_start = runner.total_steps
    bar: Any = None
    if not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=episodes, initial=runner.episodes, unit="ep", file=sys.stderr)
        except ImportError:
            bar = None
    log_every = args.log_every or (DEFAULT_LOG_EVERY if bar is None else 0)

    rounds_before = runner.update_rounds  # a line marks the episode of the first update round

    def on_episode(record: Any) -> None:
        nonlocal last_phases, rounds_before
        if rounds_before == 0 and record.update_rounds > 0:
            line = f"marlbuf train: {updates_started_line(record.episode + 1, record.steps)}"
            (bar.write if bar is not None else print)(line, file=sys.stderr)
        rounds_before = record.update_rounds
        now = timer.snapshot()
        record.phases = {k: now[k] - last_phases.get(k, 0.0) for k in now}
        last_phases = now
        log_episode(record, jsonl_file, writer)
        recent.append(record.ret_original)
        if bar is not None:
            rate = (runner.total_steps - steps_at_start) / max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(
                steps_s=f"{rate:.0f}", ret=f"{sum(recent) / len(recent):.1f}", refresh=False
            )
            bar.update(1)
        if log_every and runner.episodes % log_every == 0:
            elapsed = max(time.perf_counter() - start, 1e-9)
            print(
                f"marlbuf train: episode {runner.episodes:,}/{episodes:,}, "
                f"{runner.total_steps:,} steps, {runner.update_rounds:,} update rounds, "
                f"return {sum(recent) / len(recent):.1f} (mean of the last {len(recent)}), "
                f"{(runner.total_steps - steps_at_start) / elapsed:,.0f} steps/s",
                file=sys.stderr,
            )
        if args.checkpoint_every and runner.episodes % args.checkpoint_every == 0:
            csv_file.flush()
            jsonl_file.flush()
            runner.save_checkpoint(checkpoint)

    status = 0
    try:
        runner.train(remaining, on_episode=on_episode, should_stop=lambda: stop.requested)
        runner.save_checkpoint(checkpoint)
        if stop.requested:
            print(f"marlbuf train: interrupted; checkpoint saved in {checkpoint}", file=sys.stderr)
            status = 130
    except KeyboardInterrupt:
        print("marlbuf train: aborted without saving", file=sys.stderr)
        status = 130
    finally:
        signal.signal(signal.SIGINT, previous_handler)
        if bar is not None:
            bar.close()
        csv_file.close()
        jsonl_file.close()
        runner.close()
    elapsed = time.perf_counter() - start
    print(
        f"marlbuf train: {runner.episodes} episodes, {runner.total_steps} steps, "
        f"{runner.update_rounds} update rounds; this session {elapsed:.1f} s",
        file=sys.stderr,
    )
    if status == 0 and runner.update_rounds == 0:
        print(f"marlbuf train: {no_update_note(config, runner.total_steps)}", file=sys.stderr)
    with open(out / "episodes.csv", newline="") as fh:
        closing = closing_update_line(list(csv.DictReader(fh)))
    if closing is not None:
        print(f"marlbuf train: {closing}", file=sys.stderr)
    if not args.no_plot and status == 0:
        title = f"{config.algo} {config.env} N={config.n_agents} ({config.sampler})"
        if plot_rewards(out / "episodes.csv", out / "rewards.png", title):
            print(f"marlbuf train: reward curve in {out / 'rewards.png'}", file=sys.stderr)
        else:
            print("marlbuf train: no plot (pip install 'marlbuf[bench]' for matplotlib)")
    return status
