"""The ``marlbuf`` console script.

Each subcommand lives in its own module with a ``main(argv) -> int`` function and is imported
only when it is called, so ``marlbuf memory`` never imports torch and ``marlbuf train`` imports
matplotlib only to draw its plot at the end (``marlbuf info`` imports torch only to ask whether
CUDA is there).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

# name -> (module holding ``main(argv)``, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": (
        "marlbuf.profiling.info",
        "versions (marlbuf, torch, CUDA, Ray...), cores, caches, perf",
    ),
    "bench": ("marlbuf.bench.cli", "benchmark samplers, layouts and trainers (see --help)"),
    "train": (
        "marlbuf.algos.cli",
        "train MADDPG / MATD3 on MPE predator-prey / cooperative navigation",
    ),
    "profile": ("marlbuf.profiling.cli", "time and cache counters per training phase"),
    "memory": ("marlbuf.memory_cli", "each storage format's size against this machine's RAM"),
    "record": ("marlbuf.algos.record_cli", "record a PettingZoo environment as a vault"),
}


#: The extra that installs each optional top-level module (pyproject's optional dependencies;
#: tests/package/test_cli.py keeps the two in step). tqdm is in [algos] and [bench] alike.
EXTRA_OF: dict[str, str] = {
    "torch": "algos",
    "tqdm": "algos",
    "mpe2": "envs",
    "pettingzoo": "envs",
    "gymnasium": "envs",
    "matplotlib": "bench",
    "cpprb": "peers",
    "torchrl": "peers",
    "tensordict": "peers",
    "ray": "distributed",
}


def missing_extra(exc: BaseException) -> str | None:
    """The one-line reason an ``ImportError`` gives when an optional dependency is missing, or
    ``None`` when it is not about one (a bug to show in full).

    The error itself, or one it was raised from, must name a missing module (``ImportError.name``,
    as ``ModuleNotFoundError`` does): a module of an extra gives ``needs 'torch' (not
    installed): pip install 'marlbuf[algos]'``, or the error's own message where that already
    says what to install; any other module outside marlbuf names ``marlbuf[all]``.
    """
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        name = getattr(error, "name", None) if isinstance(error, ImportError) else None
        top = (name or "").partition(".")[0]
        if top and top != "marlbuf":
            if "pip install" in str(exc):
                return one_line(str(exc))  # a message that already names the extra
            extra = EXTRA_OF.get(top, "all")
            return f"needs {top!r} (not installed): pip install 'marlbuf[{extra}]'"
        error = error.__cause__ or error.__context__
    return None


#: The MPE tasks by every name a command accepts (``--env``): full names and short ones.
ENV_NAMES: dict[str, str] = {
    "cooperative_navigation": "cooperative_navigation",
    "cn": "cooperative_navigation",
    "predator_prey": "predator_prey",
    "pp": "predator_prey",
}

#: How ``--help`` names the accepted ``--env`` values.
ENV_HELP = "MPE task: cooperative_navigation (cn) or predator_prey (pp)"


def env_name(value: str) -> str:
    """``argparse`` type of ``--env``: the task's full name for a full or a short name."""
    try:
        return ENV_NAMES[value.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"unknown task {value!r}; choose cooperative_navigation (cn) or predator_prey (pp)"
        ) from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` in plain words: every option's default appended as ``(default: X)`` unless
    the help text states it already; lists as their items (``a b``), flags as ``off``/``on``,
    an unset option as ``none``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(default, bool):
            shown = "on" if default else "off"
        elif default is None:
            shown = "none"
        elif isinstance(default, (list, tuple)):
            shown = " ".join(map(str, default))
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose errors are one line, ``PROG: error: MESSAGE``, exit 2.

    The same shape as :func:`error`, so that every user error of every subcommand looks alike
    (argparse's own prints the usage first).
    """

    def __init__(self, prog: str, description: str | None = None) -> None:
        # docstrings make the descriptions: their reStructuredText literals read as plain words
        plain = None if description is None else description.replace("``", "")
        super().__init__(prog=prog, description=plain, formatter_class=HelpFormatter)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def one_line(message: str) -> str:
    """``message`` with line breaks and repeated blanks folded into single spaces."""
    return " ".join(message.split())


def error(prog: str, message: str) -> int:
    """Print a user error as one line ``PROG: error: MESSAGE`` to stderr; return exit status 2."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _usage() -> str:
    lines = ["usage: marlbuf [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "Run 'marlbuf <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``marlbuf <command> ...`` to the command's module."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from marlbuf.version import __version__

        print(f"marlbuf {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        return error(
            "marlbuf", f"unknown command {name!r}; choose from {', '.join(COMMANDS)} (see --help)"
        )
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except ImportError as exc:
        # an optional dependency (torch, mpe2, matplotlib, ...) that is not installed: a setup
        # problem to name in one line with its extra, not a bug to show a traceback for
        reason = missing_extra(exc)
        if reason is None:
            raise
        return error(f"marlbuf {name}", reason)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
