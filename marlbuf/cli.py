"""The ``marlbuf`` console script.

Each subcommand lives in its own module with a ``main(argv) -> int`` function and is imported
only when it is called, so ``marlbuf info`` never imports torch and ``marlbuf train`` never
imports matplotlib.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module holding ``main(argv)``, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("marlbuf.info", "what this machine offers: cores, caches, Numba, perf counters"),
    "bench": ("marlbuf.bench.cli", "benchmark samplers, layouts and trainers (see --help)"),
    "train": (
        "marlbuf.algos.cli",
        "train MADDPG / MATD3 on MPE predator-prey / cooperative navigation",
    ),
    "profile": ("marlbuf.profiling.cli", "time and cache counters per training phase"),
}


def _usage() -> str:
    lines = ["usage: marlbuf <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "Run 'marlbuf <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``marlbuf <command> ...`` to the command's module."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"marlbuf: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
