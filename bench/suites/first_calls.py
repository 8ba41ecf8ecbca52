"""First calls: what a new process pays before marlbuf does its work.

Each case runs in fresh processes (``sys.executable``), after one untimed process has filled
Numba's on-disk cache and the operating system's file cache (a warm machine, second process),
and reports the median wall time of ``repeats`` processes:

* ``import marlbuf`` and ``from marlbuf import MultiAgentReplayBuffer`` (which imports NumPy and
  Numba);
* the console script's quick commands: ``--help``, ``--version``, ``train --help``, a ``train``
  flag error, ``info``, ``bench --list`` (none imports torch, Ray or matplotlib);
* inside one process, after ``from marlbuf import MultiAgentReplayBuffer``: building a CN-3
  buffer, its first ``add`` (mpe2-style dicts: float32 observations, integer actions, a
  ``defaultdict`` of Python float rewards, bool dones), 31 more ``add`` calls and the first
  ``sample(32)``; and, in another process, the first call of a small cached kernel alone
  (``numba_start_ms``): Numba's own start-up on a process's first compiled call (its type
  registries, which import ``numba.np.arraymath`` and, where SciPy is installed, SciPy's
  BLAS bindings). Every kernel of the first ``add`` and ``sample`` loads from Numba's cache
  (``cache=True``); nothing is compiled in a second process.

Targets: ``import marlbuf`` at most 0.5 s; each quick command at most 1 s; the first ``add`` +
``sample`` after the import at most 0.3 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np

from marlbuf.bench.tools.common import check, checks_markdown, markdown_table

SUITE = "first_calls"

FULL = {"repeats": 7}
QUICK = {"repeats": 3}

#: the quick commands of the console script (arguments after ``marlbuf``)
COMMANDS = {
    "marlbuf --help": ["--help"],
    "marlbuf --version": ["--version"],
    "marlbuf train --help": ["train", "--help"],
    "marlbuf train (flag error)": ["train", "--no-such-flag"],
    "marlbuf info": ["info"],
    "marlbuf bench --list": ["bench", "--list"],
}
IMPORT_TARGET, COMMAND_TARGET, FIRST_CALL_TARGET = 0.5, 1.0, 0.3

#: the first add + sample, timed inside the process (seconds, printed as JSON)
_FIRST_CALLS = """
import json, time
from collections import defaultdict
start = time.perf_counter()
from marlbuf import AgentSpec, MultiAgentReplayBuffer
imported = time.perf_counter()
import numpy as np
agents = [f"agent_{i}" for i in range(3)]
specs = {a: AgentSpec(obs_shape=(18,), action_shape=(5,), n_discrete_actions=5) for a in agents}
buf = MultiAgentReplayBuffer(specs, 10_000, seed=0)
built = time.perf_counter()
obs = {a: np.zeros(18, np.float32) for a in agents}
step = (obs, {a: 1 for a in agents}, defaultdict(int, {a: -0.5 for a in agents}), obs,
        {a: False for a in agents})
buf.add(*step)
added = time.perf_counter()
for _ in range(31):
    buf.add(*step)
buf.sample(32)
sampled = time.perf_counter()
print(json.dumps({"import_s": imported - start, "build_s": built - imported,
                  "first_add_s": added - built, "add_sample_s": sampled - built}))
"""

#: the first call of one small cached kernel: Numba's start-up alone
_NUMBA_START = """
import json, time
import numpy as np
from marlbuf._kernels import first_nonfinite
rows = np.zeros((1, 8)); starts = np.zeros(1, np.int64); counts = np.ones(1, np.int64)
start = time.perf_counter()
first_nonfinite(rows, starts, counts)
print(json.dumps({"numba_start_s": time.perf_counter() - start}))
"""


def _wall(args: list[str]) -> float:
    """Seconds one process of ``python args`` takes, start to exit."""
    import time

    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, check=False
    )
    return time.perf_counter() - start


def _inside(code: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(quick: bool = False) -> dict[str, Any]:
    """Every case (module docstring); returns the JSON payload."""
    repeats = (QUICK if quick else FULL)["repeats"]
    walls = {
        "import marlbuf": ["-c", "import marlbuf"],
        "from marlbuf import MultiAgentReplayBuffer": [
            "-c",
            "from marlbuf import MultiAgentReplayBuffer",
        ],
        **{name: ["-m", "marlbuf", *args] for name, args in COMMANDS.items()},
    }
    rows: list[dict[str, Any]] = []
    for name, args in walls.items():
        _wall(args)  # fills the caches
        times = [_wall(args) for _ in range(repeats)]
        rows.append({"case": name, "s_median": float(np.median(times)), "s_min": min(times)})
    _inside(_FIRST_CALLS)
    _inside(_NUMBA_START)
    inside = [_inside(_FIRST_CALLS) for _ in range(repeats)]
    start = [_inside(_NUMBA_START)["numba_start_s"] for _ in range(repeats)]
    first = {key: float(np.median([x[key] for x in inside])) for key in inside[0]}
    rows.append({"case": "first add + sample after the import", "s_median": first["add_sample_s"]})
    rows.append({"case": "  of which the first add", "s_median": first["first_add_s"]})
    rows.append(
        {"case": "  Numba's start-up (first cached call)", "s_median": float(np.median(start))}
    )
    checks = [
        check("import marlbuf (s)", rows[0]["s_median"], IMPORT_TARGET, workload="import"),
        *(
            check(f"{r['case']} (s)", r["s_median"], COMMAND_TARGET, workload="command")
            for r in rows
            if r["case"].startswith("marlbuf ")
        ),
        check("first add + sample (s)", first["add_sample_s"], FIRST_CALL_TARGET, workload="calls"),
    ]
    markdown = (
        f"Median of {repeats} fresh processes after one that filled the caches.\n\n"
        + markdown_table(rows, ["case", "s_median"])
        + "\n\nTargets:\n\n"
        + checks_markdown(checks)
    )
    return {
        "rows": rows,
        "targets": checks,
        "markdown": markdown,
        "summary": {r["case"]: round(r["s_median"], 3) for r in rows},
        "config": {"repeats": repeats, "python": sys.version.split()[0], **first},
    }


if __name__ == "__main__":  # pragma: no cover
    from marlbuf.bench.tools.common import write_result

    quick = "--quick" in sys.argv
    payload = run(quick=quick)
    print(payload["markdown"])
    print(write_result(SUITE, payload, quick))
