"""``marlbuf train``: files written, resume continues the logs, bad input exits 2."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from marlbuf.algos.cli import main

SMALL = ["--batch-size", "32", "--buffer-size", "3000", "--warmup", "100", "--no-progress"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_train_writes_logs_checkpoint_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*SMALL, "--out", str(out), "--checkpoint-every", "3", "--no-plot"]
    assert main(["--episodes", "6", *args]) == 0
    rows = read_rows(out / "episodes.csv")
    assert [int(r["episode"]) for r in rows] == list(range(6))
    assert float(rows[-1]["t_env_step"]) > 0
    assert (out / "checkpoint" / "runner.json").exists()
    assert json.loads((out / "config.json").read_text())["batch_size"] == 32
    assert main(["--episodes", "9", "--resume", *args]) == 0
    rows = read_rows(out / "episodes.csv")
    assert [int(r["episode"]) for r in rows] == list(range(9))
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert [json.loads(ln)["episode"] for ln in lines] == list(range(9))


def test_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    straight, split = tmp_path / "a", tmp_path / "b"
    assert main(["--episodes", "10", *SMALL, "--out", str(straight), "--no-plot"]) == 0
    assert main(["--episodes", "5", *SMALL, "--out", str(split), "--no-plot"]) == 0
    assert main(["--episodes", "10", "--resume", *SMALL, "--out", str(split), "--no-plot"]) == 0
    a = [r["return"] for r in read_rows(straight / "episodes.csv")]
    b = [r["return"] for r in read_rows(split / "episodes.csv")]
    assert a == b


def test_reward_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "run"
    assert main(["--episodes", "3", *SMALL, "--out", str(out)]) == 0
    assert (out / "rewards.png").stat().st_size > 1000


def test_updates_start_is_marked_in_the_log_closing_lines_and_plot(
    tmp_path: Path,
    capsys,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """A short default-looking run seems to get worse; the log says when updates started, the
    closing lines compare the return before them with the last episodes, and the figure shades
    the warm-up and marks the first update round."""
    from marlbuf.algos import cli

    out = tmp_path / "run"
    marked: list[tuple[int, int] | None] = []
    real_plot = cli.plot_rewards

    def plot(csv_path: Path, png_path: Path, title: str) -> bool:
        marked.append(cli.first_update_episode(read_rows(csv_path)))
        return real_plot(csv_path, png_path, title)

    monkeypatch.setattr(cli, "plot_rewards", plot)
    assert main(["--episodes", "12", *SMALL, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    rows = read_rows(out / "episodes.csv")
    first = next(i for i, r in enumerate(rows) if int(r["update_rounds"]) > 0)
    episode, step = first + 1, int(rows[first]["steps"])  # the log counts episodes from 1
    assert f"first update round ran in episode {episode} (by step {step})" in err
    assert f"in episode {episode}), then one every" in err  # the header's prediction agrees
    closing = err[err.index("update rounds; this session") :]
    assert f"updates started in episode {episode} (step {step})" in closing
    assert f"mean return of the {first} episodes before" in closing and "of the last" in closing
    assert marked == [(episode, step)]
    if (out / "rewards.png").exists():  # matplotlib installed
        assert (out / "rewards.png").stat().st_size > 1000
    # a run that ends in the warm-up says so instead
    assert main(["--episodes", "2", *SMALL, "--out", str(tmp_path / "short"), "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert "no update round ran" in err and "updates started" not in err
    assert cli.closing_update_line(read_rows(tmp_path / "short" / "episodes.csv")) is None


@pytest.mark.parametrize(
    "bad",
    [
        ["--agents", "0"],
        ["--sampler", "prioritized", "--shared-index"],
        ["--sampler", "neighbor", "--run-length", "48"],
        ["--overlap-gather"],
        ["--episodes", "0"],
        ["--env", "cooperative_navigation", "--prey", "2"],
    ],
)
def test_bad_options_exit_2_before_any_work(bad: list[str], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "never"
    assert main([*SMALL, "--out", str(out), *bad]) == 2
    assert "marlbuf train:" in capsys.readouterr().err
    assert not out.exists()


def test_resume_without_checkpoint_is_an_error(tmp_path: Path) -> None:
    assert main([*SMALL, "--out", str(tmp_path), "--resume"]) == 2


@pytest.mark.parametrize("suite", ["update", "end_to_end"])
def test_trainer_bench_suites_run_tiny(monkeypatch: pytest.MonkeyPatch, suite: str) -> None:
    import importlib

    from marlbuf.workloads import Workload

    module = importlib.import_module(f"marlbuf.bench.suites.{suite}")
    tiny = {
        "workloads": [Workload("predator_prey", 3)],
        "batch_size": 32,
        "capacity": 500,
        "repeats": 1,
    }
    monkeypatch.setattr(module, "QUICK", tiny)
    payload = module.run(quick=True)
    expected = ["baseline", "marlbuf"] + (["faithful"] if suite == "end_to_end" else [])
    assert [r["config"] for r in payload["rows"]] == expected
    assert payload["summary"]["speedup_PP-3+1"] > 0
    json.dumps(payload)
    assert "| workload |" in payload["markdown"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX SIGINT delivery")
@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    out = tmp_path / "run"
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "marlbuf", "train", "--episodes", "100000", *SMALL]
    proc = subprocess.Popen([*cmd, "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            table = out / "episodes.csv"
            if table.exists() and len(table.read_text().splitlines()) > 3:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    meta = json.loads((out / "checkpoint" / "runner.json").read_text())
    rows = read_rows(out / "episodes.csv")
    assert meta["episodes"] == len(rows) > 2


def test_resume_takes_the_configuration_from_the_checkpoint(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    first = ["--episodes", "3", *SMALL, "--out", str(out), "--no-plot", "--seed", "4"]
    assert main([*first, "--sampler", "neighbor", "--run-length", "8"]) == 0
    # no configuration flags: batch size, sampler, seed ... come from the checkpoint
    assert main(["--resume", "--out", str(out), "--episodes", "5", "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["batch_size"], config["sampler"], config["seed"]) == (32, "neighbor", 4)
    assert [int(r["episode"]) for r in read_rows(out / "episodes.csv")] == list(range(5))
    # the episode target is part of the run: resuming without --episodes runs to it (5)
    assert main(["--resume", "--out", str(out), "--no-progress", "--no-plot"]) == 0
    assert len(read_rows(out / "episodes.csv")) == 5
    # the same values as the checkpoint's, and run-control flags, are accepted
    again = ["--resume", "--out", str(out), "--batch-size", "32", "--sampler", "neighbor"]
    assert main([*again, "--threads", "1", "--checkpoint-every", "2", "--no-progress"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("flag", "value", "shown"),
    [
        ("--batch-size", "64", "--batch-size is 64 here but 32 in the checkpoint"),
        ("--sampler", "prioritized", "--sampler is prioritized here but uniform"),
        ("--shared-index", None, "--shared-index is on here but off"),
        ("--warmup", "200", "--warmup is 200 here but 100"),
        ("--lr", "0.02", "--lr is 0.02 here but 0.01"),
    ],
)
def test_resume_refuses_a_changed_configuration_flag(
    tmp_path: Path, capsys, flag: str, value: str | None, shown: str
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    assert main(["--episodes", "2", *SMALL, "--out", str(out), "--no-plot"]) == 0
    before = (out / "episodes.csv").read_text()
    capsys.readouterr()
    changed = [flag] if value is None else [flag, value]
    assert main(["--resume", "--out", str(out), "--episodes", "4", *changed]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("marlbuf train: error: ")
    assert shown in err
    assert (out / "episodes.csv").read_text() == before  # nothing ran


def test_an_existing_run_needs_resume_or_overwrite(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    args = [*SMALL, "--out", str(out), "--no-plot"]
    assert main(["--episodes", "3", *args]) == 0
    capsys.readouterr()
    assert main(["--episodes", "2", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "already holds a run" in err
    assert len(read_rows(out / "episodes.csv")) == 3  # untouched
    assert main(["--episodes", "2", "--resume", "--overwrite", *args]) == 2
    (out / "notes.txt").write_text("mine")
    assert main(["--episodes", "2", "--overwrite", *args]) == 0
    assert [int(r["episode"]) for r in read_rows(out / "episodes.csv")] == [0, 1]
    assert json.loads((out / "checkpoint" / "runner.json").read_text())["episodes"] == 2
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files are replaced
    # a folder without a run in it is fine
    other = tmp_path / "other"
    other.mkdir()
    assert main(["--episodes", "1", *SMALL, "--out", str(other), "--no-plot"]) == 0


def test_a_mismatched_resume_is_one_line_without_traceback(tmp_path: Path) -> None:
    import os
    import subprocess

    out = tmp_path / "run"
    assert main(["--episodes", "2", *SMALL, "--out", str(out), "--no-plot"]) == 0
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "marlbuf", "train", "--out", str(out), "--resume"]
    proc = subprocess.run(
        [*cmd, "--agents", "6"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("marlbuf train: error: --agents is 6 here but 3 in the checkpoint")
