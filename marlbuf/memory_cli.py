"""``marlbuf memory``: what a buffer will hold, by storage format, against this machine's RAM.

The command (the CLI layer) over :mod:`marlbuf.memory` (the estimates, in the core).
"""

from __future__ import annotations

from dataclasses import replace

from marlbuf import _config
from marlbuf.memory import DEFAULT_EPISODE_LENGTH, GIB, format_options, format_table
from marlbuf.spec import FieldSpec

#: How each part of a format is selected, in Python and on ``marlbuf train``'s command line.
HOW_TO_SELECT = (
    ("dense", 'MultiAgentReplayBuffer(..., next_obs="stored")'),
    ("stored once", 'the default for streams of env steps (next_obs="auto"); next_obs="once"'),
    ("no next_obs", 'next_obs="none": for learners that never read next_obs (QMIX, VDN)'),
    ("float16 obs", "AgentSpec(..., obs_dtype=np.float16); marlbuf train --obs-dtype float16"),
    ("in mapped files", 'MultiAgentReplayBuffer(..., path="DIR"): the rows live in files'),
    ("capacity", "MultiAgentReplayBuffer(specs, capacity); marlbuf train --buffer-size"),
)


def main(argv: list[str] | None = None) -> int:
    """``marlbuf memory``: each storage format's size for an MPE configuration, against this
    machine's available RAM."""
    from marlbuf.cli import ENV_HELP, ArgumentParser, env_name, error
    from marlbuf.storage import available_memory_bytes

    prog = "marlbuf memory"
    parser = ArgumentParser(
        prog,
        description="What a buffer will hold, before allocating it: bytes per transition and "
        "total size of each storage format for the paper's MPE tasks, against the RAM this "
        "machine has available.",
    )
    parser.add_argument("--env", type=env_name, default="cooperative_navigation", help=ENV_HELP)
    parser.add_argument(
        "--agents",
        type=int,
        default=24,
        help="agents (cooperative navigation) or predators (predator-prey; prey added as the "
        "trainer does: max(1, agents // 3))",
    )
    parser.add_argument(
        "--capacity", type=float, default=1e6, help="transitions the buffer holds (1e6 is fine)"
    )
    parser.add_argument(
        "--layout",
        choices=("interleaved", "agent_major"),
        default="interleaved",
        help="interleaved: one padded row per step (the default); agent_major: one array per "
        "field and agent",
    )
    parser.add_argument(
        "--episode-length",
        type=int,
        default=DEFAULT_EPISODE_LENGTH,
        help="steps per episode: observations stored once keep one next observation per "
        "episode end in a side table",
    )
    parser.add_argument(
        "--hidden",
        type=int,
        default=0,
        help="a float32 extra field of this many values per agent (e.g. an RNN state)",
    )
    parser.add_argument(
        "--state", type=int, default=0, help="a float32 global field of this many values"
    )
    parser.add_argument("--alive", action="store_true", help="an alive flag per agent per step")
    args = parser.parse_args(argv)
    for name, value, low in (
        ("--agents", args.agents, 1),
        ("--capacity", args.capacity, 1),
        ("--episode-length", args.episode_length, 1),
        ("--hidden", args.hidden, 0),
        ("--state", args.state, 0),
    ):
        if value < low or not float(value).is_integer():
            return error(prog, f"{name} must be an integer >= {low}; got {name} {value:g}")
    from marlbuf.workloads import Workload

    workload = Workload(args.env, args.agents)
    extras = {"hidden": FieldSpec((args.hidden,))} if args.hidden else {}
    specs = {a: replace(s, extras=extras) for a, s in workload.specs().items()}
    global_fields = {"state": FieldSpec((args.state,))} if args.state else {}
    capacity = int(args.capacity)
    options = format_options(
        specs,
        capacity,
        args.layout,
        episode_length=args.episode_length,
        global_fields=global_fields,
        alive=args.alive,
    )
    available = available_memory_bytes()
    ram = "unknown" if available is None else f"{available / GIB:.2f} GiB"
    print(
        f"{workload.label} ({workload.n_trainers} agents), capacity {capacity:,}, "
        f"{args.layout} layout; RAM available here: {ram}"
    )
    print()
    print("\n".join(format_table(options, available)))
    print()
    print("how to select each part of a format:")
    for part, how in HOW_TO_SELECT:
        print(f"  {part:<16} {how}")
    print(
        "default: what a buffer without options stores for streams of environment steps\n"
        f"(warns): above {_config.MEMORY_WARN_FRACTION:.0%} of the available RAM a buffer warns "
        "(MemoryWarning);\nabove 100% it refuses (MemoryError), naming the formats that fit"
    )
    return 0
