"""Sizes are checked before anything is allocated: a constructor argument, a tiny crafted state
file or a crafted memory-mapped manifest that declares huge fields is refused with an error
naming the shape, in a child process whose address space is limited (``RLIMIT_AS``) to what it
had after importing marlbuf plus :data:`HEADROOM`: nothing it allocated on the way to the
refusal came near that."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import marlbuf
from marlbuf import AgentSpec, MultiAgentReplayBuffer, mapped, persistence

pytest.importorskip("resource")

#: what the child may allocate after its imports (the refusals' memory bound)
HEADROOM = 256 << 20

CHILD = """
import json, resource, sys
import numpy as np
import marlbuf
from marlbuf import AgentSpec, MultiAgentReplayBuffer

def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

case, arg = sys.argv[1], sys.argv[2]
# warm up what the refusal path imports and compiles, then limit the address space
MultiAgentReplayBuffer({"a": AgentSpec(obs_shape=(2,), action_shape=(2,))}, 4).state_dict()
limit = status("VmSize") + int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
rss = status("VmRSS")
try:
    if case == "constructor":
        MultiAgentReplayBuffer({"a": AgentSpec(obs_shape=(int(arg),), action_shape=(2,))}, 1)
    elif case == "discrete":
        n = int(arg)
        spec = AgentSpec(obs_shape=(2,), action_shape=(n,), n_discrete_actions=n)
        MultiAgentReplayBuffer({"a": spec}, 1)
    elif case == "load":
        MultiAgentReplayBuffer.load(arg)
    else:
        MultiAgentReplayBuffer.open(arg)
except (MemoryError, ValueError) as exc:
    out = {"error": type(exc).__name__, "message": str(exc)}
else:
    out = {"error": None, "message": ""}
out["grew"] = status("VmHWM") - rss
print(json.dumps(out))
"""


def _child(case: str, arg: str, headroom: int = HEADROOM) -> dict:
    env = {"PYTHONPATH": str(Path(marlbuf.__file__).parents[1]), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, arg, str(headroom)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _refused(out: dict, *names: str) -> None:
    assert out["error"] in ("MemoryError", "ValueError"), out
    for name in names:
        assert name in out["message"], out["message"]
    assert out["grew"] < HEADROOM, out  # resident memory grew by less than the bound


def test_a_huge_constructor_shape_is_refused_in_bounded_memory():
    _refused(_child("constructor", str(10**9)), "obs_shape (1000000000,)")


def test_a_huge_discrete_action_count_is_refused_or_fits():
    """n_discrete_actions=20000: each row holds 20000 floats (80 kB), which fits; the one-hot
    encoding must not build a 20000 x 20000 identity table (1.6 GB) on the way."""
    out = _child("discrete", str(20_000))
    assert out["error"] is None, out
    assert out["grew"] < HEADROOM, out


def _crafted_state(tmp_path: Path) -> Path:
    """A small buffer file whose header declares a 4 GB observation (about 6 kB on disk)."""
    specs = {"a": AgentSpec(obs_shape=(3,), action_shape=(2,))}
    buf = MultiAgentReplayBuffer(specs, 8, seed=0)
    buf.save(tmp_path / "small.npz")
    state = persistence.read_state(tmp_path / "small.npz")
    state["specs"]["a"]["obs_shape"] = [10**9]
    persistence.write_state(state, tmp_path / "crafted.npz")
    assert (tmp_path / "crafted.npz").stat().st_size < 16_000
    return tmp_path / "crafted.npz"


def test_a_tiny_crafted_state_file_is_refused_in_bounded_memory(tmp_path):
    _refused(_child("load", str(_crafted_state(tmp_path))), "obs_shape (1000000000,)")


def test_a_crafted_manifest_is_refused_in_bounded_memory(tmp_path):
    folder = tmp_path / "m"
    specs = {"a": AgentSpec(obs_shape=(3,), action_shape=(2,))}
    MultiAgentReplayBuffer(specs, 8, path=folder, seed=0).close()
    manifest = json.loads((folder / mapped.MANIFEST).read_text())
    manifest["specs"]["a"]["obs_shape"] = [10**9]
    (folder / mapped.MANIFEST).write_text(json.dumps(manifest))
    _refused(_child("open", str(folder)), "obs_shape (1000000000,)")


@pytest.mark.parametrize("capacity", [10**12, 2**40])
def test_a_crafted_capacity_is_refused_in_bounded_memory(tmp_path, capacity):
    specs = {"a": AgentSpec(obs_shape=(3,), action_shape=(2,))}
    buf = MultiAgentReplayBuffer(specs, 8, seed=0)
    buf.save(tmp_path / "small.npz")
    state = persistence.read_state(tmp_path / "small.npz")
    state["capacity"] = capacity
    persistence.write_state(state, tmp_path / "crafted.npz")
    out = _child("load", str(tmp_path / "crafted.npz"))
    _refused(out, f"capacity={capacity:,}")


def test_sizes_are_in_the_errors_of_the_parent_process_too():
    with pytest.raises(MemoryError, match=r"obs_shape \(100000000000,\)"):
        MultiAgentReplayBuffer({"a": AgentSpec(obs_shape=(10**11,), action_shape=(2,))}, 1)
    assert np.dtype(np.float32).itemsize == 4
