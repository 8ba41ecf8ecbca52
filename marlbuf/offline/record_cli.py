"""``marlbuf record``: run a policy in a PettingZoo environment and record it as a vault.

Examples::

    marlbuf record --env simple_spread --agents 3 --steps 100000 --seed 0 \\
        --out vaults/simple_spread.vlt/random
    marlbuf record --env simple_spread --agents 3 --steps 25000 --envs 4 \\
        --policy runs/cn3/checkpoint --out vaults/simple_spread.vlt/maddpg
    marlbuf record --env pettingzoo.butterfly.pistonball_v6:parallel_env --steps 1000 \\
        --out data/pistonball.npz

``--out`` is a new vault folder (``<base>/<name>/<uid>``, what Flashbax's ``Vault(name,
rel_dir=base, vault_uid=uid)`` and marlbuf's ``read_vault`` read) or, ending in ``.npz``, a
buffer file (``MultiAgentReplayBuffer.load``). Several environments (``--envs K``) are
recorded as K streams.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from marlbuf.cli import ArgumentParser, error

PROG = "marlbuf record"


def _value(text: str) -> Any:
    """An ``--env-arg`` value: JSON (numbers, true/false, null, lists), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def env_arg(text: str) -> tuple[str, Any]:
    """``argparse`` type of ``--env-arg KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE; got {text!r}")
    return key, _value(value)


def env_factory(name: str) -> Any:
    """The ``parallel_env`` factory of an mpe2 task (``simple_spread`` or
    ``simple_spread_v3``) or the callable ``MODULE:NAME``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        factory = getattr(importlib.import_module(module), attr, None)
        if not callable(factory):
            raise ValueError(f"{module} has no callable {attr!r}")
        return factory
    from mpe2 import all_modules

    tasks = {key.split("/", 1)[1]: module for key, module in all_modules.mpe_environments.items()}
    found = tasks.get(name) or next(
        (m for key, m in sorted(tasks.items()) if key.rsplit("_v", 1)[0] == name), None
    )
    if found is None:
        names = sorted(key.rsplit("_v", 1)[0] for key in tasks)
        raise ValueError(
            f"unknown environment {name!r}; mpe2 tasks: {', '.join(names)}, or MODULE:FACTORY "
            "for any PettingZoo parallel environment"
        )
    return found.parallel_env


def build_parser() -> ArgumentParser:
    p = ArgumentParser(PROG, __doc__)
    p.add_argument(
        "--env",
        required=True,
        help="mpe2 task (simple_spread, simple_tag, ...) or MODULE:FACTORY of a PettingZoo "
        "parallel environment",
    )
    p.add_argument("--agents", type=int, default=None, help="agents (passed as N=, e.g. mpe2's)")
    p.add_argument(
        "--env-arg",
        type=env_arg,
        action="append",
        metavar="KEY=VALUE",
        help="another keyword argument of the environment (repeatable; values read as JSON)",
    )
    p.add_argument("--max-cycles", type=int, default=25, help="episode length (mpe2 tasks)")
    p.add_argument("--continuous", action="store_true", help="continuous actions (mpe2 tasks)")
    p.add_argument("--steps", type=int, required=True, help="steps per environment")
    p.add_argument("--envs", type=int, default=1, help="environments side by side (streams)")
    p.add_argument(
        "--policy",
        default="random",
        help="'random' or a marlbuf train checkpoint folder (its actors act)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the resets and random actions")
    p.add_argument(
        "--state", action="store_true", help="also record env.state() (OG-MARL's infos.state)"
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="new vault folder (<base>/<name>/<uid>), or a .npz file for a buffer",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    for flag, value in (("--steps", args.steps), ("--envs", args.envs)):
        if value < 1:
            return error(PROG, f"{flag} must be at least 1; got {value}")
    if args.out.exists():
        return error(PROG, f"--out {str(args.out)!r} already exists; choose a new path")
    try:
        factory = env_factory(args.env)
    except (ImportError, ValueError) as exc:
        return error(PROG, str(exc))
    kwargs: dict[str, Any] = dict(args.env_arg or [])
    if ":" not in args.env:
        kwargs.setdefault("max_cycles", args.max_cycles)
        kwargs.setdefault("continuous_actions", args.continuous)
    if args.agents is not None:
        kwargs.setdefault("N", args.agents)
    try:
        envs = [factory(**kwargs) for _ in range(args.envs)]
    except TypeError as exc:
        return error(PROG, f"{args.env} does not take {sorted(kwargs)}: {exc}")
    from marlbuf.offline.record import record

    to_buffer = args.out.suffix == ".npz"
    try:
        result = record(
            envs,
            args.steps,
            args.policy,
            vault=None if to_buffer else args.out,
            seed=args.seed,
            state=args.state,
            progress=not args.quiet,
            metadata={
                "recorded_with": {
                    "env": args.env,
                    "kwargs": kwargs,
                    "policy": str(args.policy),
                    "seed": args.seed,
                }
            },
        )
    except (ValueError, FileNotFoundError) as exc:
        return error(PROG, str(exc))
    if to_buffer:
        result.save(args.out)  # type: ignore[union-attr]
    total = args.steps * args.envs
    print(f"{PROG}: {total:,} steps of {args.env} -> {args.out}")
    return 0
