"""The marlbuf console script."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marlbuf import cli
from marlbuf.profiling import info


def test_usage_and_unknown_command(capsys):
    assert cli.main([]) == 0
    assert "commands:" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_info_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cores_usable"] >= 1
    assert {"numba", "numpy", "caches", "perf_counters"} <= set(data)


def test_info_table(capsys):
    import marlbuf

    assert info.main([]) == 0
    out = capsys.readouterr().out
    assert "numba" in out and f"marlbuf                {marlbuf.__version__}" in out
    assert "torch " in out and "cuda " in out and "ray " in out
    # one line per distinct perf status: a shared reason is printed once
    statuses = [line for line in out.splitlines() if line.startswith("perf counters")]
    assert len(statuses) == len({line.split(": ", 1)[1] for line in statuses})


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "marlbuf", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _no_pmu() -> bool:
    from marlbuf.profiling.cli import hardware_unavailable

    return hardware_unavailable() is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["info", "--bogus"],
        ["bench", "no_such_suite"],
        ["train", "--sampler", "lifo"],
        ["train", "--agents", "many"],
        ["train", "--agents", "0"],
        ["train", "--episodes", "0"],
        ["profile", "--sampler", "lifo"],
        ["profile", "--updates", "0"],
        pytest.param(
            ["profile", "--backend", "hardware", "--workload", "sampling"],
            marks=pytest.mark.skipif(not _no_pmu(), reason="hardware counters open here"),
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_2(tmp_path, argv):
    if argv[0] in ("train", "profile"):
        argv = [*argv, "--out", str(tmp_path / "never")]
    proc = _run(*argv)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    prefix = "marlbuf: error: " if argv[0] == "frobnicate" else f"marlbuf {argv[0]}: error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("module", ["marlbuf.algos.cli", "marlbuf.profiling.cli"])
def test_help_shows_every_default(module):
    import importlib

    if module == "marlbuf.algos.cli":
        pytest.importorskip("torch")
    parser = importlib.import_module(module).build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.default is argparse.SUPPRESS:  # --help
            continue
        shown = formatter._get_help_string(action)
        assert action.help and "default" in shown, action.option_strings
    assert "(default: 1024)" in parser.format_help()


def test_bench_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    assert "(default: all but" in text and "result folder (default:" in text


def test_memory_command_prints_every_format(capsys):
    from marlbuf import cli

    assert cli.main(["memory", "--agents", "3", "--capacity", "1e4"]) == 0
    out = capsys.readouterr().out
    assert "CN-3" in out and "stored once, float16 obs" in out and "x" in out
    assert cli.main(["memory", "--agents", "0"]) == 2
    assert "--agents must be an integer >= 1" in capsys.readouterr().err


def test_memory_command_counts_extra_fields(capsys):
    from marlbuf import cli

    assert cli.main(["memory", "--agents", "3", "--capacity", "1e4"]) == 0
    plain = capsys.readouterr().out
    args = ["memory", "--agents", "3", "--capacity", "1e4", "--hidden", "64", "--state", "8"]
    assert cli.main([*args, "--alive"]) == 0
    extra = capsys.readouterr().out

    def stored(text):  # the dense row's bytes per transition (metadata alike in both runs)
        row = next(line for line in text.splitlines() if line.startswith("dense "))
        return int(row.split()[1].replace(",", ""))

    # 3 agents x 64 float32 + 8 float32 + 3 bytes more, rows padded to 64 bytes
    assert stored(extra) - stored(plain) > 3 * 64 * 4 + 8 * 4 + 3 - 64
    assert cli.main(["memory", "--hidden", "-1"]) == 2


def test_version_matches_pyproject_and_changelog(capsys):
    import re

    from marlbuf import __version__

    root = Path(__file__).resolve().parents[2]
    pyproject = (root / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.*)"$', pyproject, re.M)[1] == __version__
    assert f"## {__version__}" in (root / "CHANGELOG.md").read_text()
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"marlbuf {__version__}"


TRAIN_SMALL = ["--batch-size", "32", "--buffer-size", "3000", "--no-plot"]


def test_train_header_says_when_updates_start_and_a_short_run_says_it_trained_nothing(
    tmp_path, capsys
):
    pytest.importorskip("torch")
    from marlbuf.algos.cli import main as train

    argv = ["--episodes", "3", "--no-progress", "--log-every", "2", "--out", str(tmp_path / "a")]
    assert train([*argv, *TRAIN_SMALL]) == 0
    err = capsys.readouterr().err
    # default warm-up: batch 32 * 25 = 800 transitions -> first round at step 800, episode 32
    assert "warm-up 800 transitions (--warmup); the first update round at step 800" in err
    assert "this run of 3 episodes ends before it" in err
    assert "episode 2/3, 50 steps, 0 update rounds" in err  # --log-every without a bar
    assert "no update round ran" in err and "--episodes 32 or more" in err
    assert "--warmup (at least --batch-size, 32)" in err

    argv = ["--episodes", "4", "--warmup", "50", "--no-progress", "--out", str(tmp_path / "b")]
    assert train([*argv, *TRAIN_SMALL]) == 0
    err = capsys.readouterr().err
    assert "first update round at step 100 (in episode 4)" in err
    assert "1 update rounds" in err and "no update round ran" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--agents", "0"], "--agents must be a positive int; got --agents=0"),
        (["--warmup", "10"], "--warmup must be an int >= --batch-size (1024); got --warmup=10"),
        (["--prey", "2"], "--prey applies to predator_prey only"),
        (["--log-every", "0"], "--log-every must be >= 1; got 0"),
    ],
)
def test_train_errors_name_the_flag(tmp_path, capsys, argv, expected):
    from marlbuf.algos.cli import main as train

    assert train([*argv, "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "n_agents" not in err and "warmup_steps" not in err and "n_prey" not in err


def test_reward_curve_has_a_point_per_episode():
    from marlbuf.algos.cli import trailing_mean

    assert trailing_mean([1.0, 2.0, 3.0, 4.0], 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert trailing_mean([5.0], 100).tolist() == [5.0]  # one episode still draws its mean
    assert len(trailing_mean(list(range(60)), 60)) == 60


@pytest.mark.parametrize("command", ["info", "bench", "train", "profile", "memory"])
def test_help_reads_as_plain_words(command, capsys):
    if command == "train":
        pytest.importorskip("torch")
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and "['" not in text  # no reStructuredText, no list reprs
    assert "(default: False)" not in text and "(default: None)" not in text


HEAVY = ("torch", "ray", "matplotlib")


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["train", "--help"],
        ["train", "--no-such-flag"],
        ["info"],
        ["bench", "--list"],
        ["bench", "--no-such-flag"],
    ],
)
def test_first_calls_import_no_torch_ray_or_matplotlib(args: list[str]) -> None:
    """The quick commands start in a fresh process without importing torch, Ray or
    matplotlib (each takes seconds); ``import marlbuf`` alone imports neither NumPy's
    dependants nor Numba."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['marlbuf', *{args!r}]\n"
        "try:\n"
        "    runpy.run_module('marlbuf', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('IMPORTED', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "IMPORTED []" in done.stdout, done.stdout + done.stderr


def test_import_marlbuf_is_lazy() -> None:
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, marlbuf\n"
        "before = 'numba' in sys.modules, 'marlbuf.buffer' in sys.modules\n"
        "from marlbuf import MultiAgentReplayBuffer, samplers\n"
        "after = 'numba' in sys.modules, 'torch' in sys.modules\n"
        "from marlbuf.version import __version__\n"
        "print(before, after, marlbuf.__version__ == __version__)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["(False,", "False)", "(True,", "False)", "True"], done.stderr


@pytest.mark.slow
def test_first_calls_suite_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from marlbuf.bench.suites import first_calls

    monkeypatch.setattr(first_calls, "QUICK", {"repeats": 1})
    payload = first_calls.run(quick=True)
    cases = [r["case"] for r in payload["rows"]]
    assert cases[:2] == ["import marlbuf", "from marlbuf import MultiAgentReplayBuffer"]
    assert all(r["s_median"] > 0 for r in payload["rows"])
    assert {t["status"] for t in payload["targets"]} <= {"PASS", "FAIL"}
    assert payload["config"]["first_add_s"] > 0
