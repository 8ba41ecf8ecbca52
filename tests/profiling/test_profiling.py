"""Profiler, perf_event_open binding and report: correctness (never speed)."""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from naive import client_request_outside_valgrind

from marlbuf.profiling import Profiler, format_table, write_json
from marlbuf.profiling import callgrind as cg
from marlbuf.profiling import perf_events as pe
from marlbuf.profiling.profiler import NULL_PHASE, OUTSIDE, REPORT_SCHEMA

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="perf is Linux-only")


def _software_events_open() -> bool:
    return all(v == "ok" for v in pe.probe(pe.SOFTWARE_EVENTS).values())


# ------------------------------------------------------------------------ perf_event_open
@linux_only
def test_probe_names_every_event_with_ok_or_a_reason() -> None:
    status = pe.probe()
    assert set(status) == set(pe.EVENTS)
    for name, reason in status.items():
        assert isinstance(reason, str) and reason, name
        assert reason == "ok" or "errno" in reason or "not" in reason


@linux_only
def test_software_group_counts_through_the_perf_path() -> None:
    if not _software_events_open():
        pytest.skip("software perf events do not open here: " + str(pe.probe(pe.SOFTWARE_EVENTS)))
    with pe.CounterGroup(list(pe.SOFTWARE_EVENTS)) as group:
        group.reset()
        group.enable()
        # a fresh anonymous mapping: touching its pages must fault (malloc might reuse pages)
        fresh = mmap.mmap(-1, 64 * mmap.PAGESIZE)
        np.frombuffer(fresh, dtype=np.uint8)[:: mmap.PAGESIZE] = 1
        group.disable()
        reading = group.read()
        group.reset()
        after_reset = group.read()
    fresh.close()
    assert set(reading.values) == set(pe.SOFTWARE_EVENTS)
    assert reading.values["task-clock"] > 0
    assert reading.values["page-faults"] > 0
    assert reading.time_enabled_ns >= reading.time_running_ns > 0
    assert not reading.multiplexed
    assert after_reset.raw["page-faults"] == 0
    assert group.fds == []  # closed by the context manager


def test_no_pmu_error_is_explained_in_plain_words() -> None:
    message = pe.explain_errno(errno.ENOENT, "instructions")
    assert "instructions" in message
    assert "no PMU" in message
    assert "callgrind" in message


def test_permission_error_names_the_sysctl() -> None:
    message = pe.explain_errno(errno.EACCES, "cycles")
    assert "kernel.perf_event_paranoid" in message
    assert "sysctl" in message


def test_group_too_large_is_explained() -> None:
    message = pe.explain_errno(errno.EINVAL, "dTLB-read-misses", member=True)
    assert "group is too large" in message


@linux_only
def test_hardware_group_either_opens_or_raises_a_plain_reason() -> None:
    try:
        group = pe.CounterGroup(list(pe.HARDWARE_EVENTS))
    except pe.PerfEventError as exc:
        assert exc.strerror and "errno" in exc.strerror
        assert exc.strerror.split(":")[0] in pe.HARDWARE_EVENTS
    else:
        group.close()


def test_bad_event_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown perf event 'nope'"):
        pe.CounterGroup(["nope"])
    with pytest.raises(ValueError, match="at least one"):
        pe.CounterGroup([])


def test_not_linux_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pe.sys, "platform", "darwin")
    with pytest.raises(pe.PerfEventError, match="Linux-only"):
        pe.open_event("task-clock")


# ------------------------------------------------------------------------ profiler
def test_hardware_backend_is_never_faked() -> None:
    """Where the PMU is missing, backend='hardware' raises instead of reporting other figures."""
    if all(v == "ok" for v in pe.probe(pe.HARDWARE_EVENTS).values()):
        prof = Profiler(backend="hardware", null_repeats=2)
        assert prof.backend == "hardware"
        prof.close()
        return
    with pytest.raises(pe.PerfEventError):
        Profiler(backend="hardware")
    prof = Profiler(backend="auto", null_repeats=2)
    assert prof.backend == "time"
    rep = prof.report()
    assert not any(m["source"] == "hardware" for m in rep["metrics"].values())
    assert not set(rep["metrics"]) & set(pe.HARDWARE_EVENTS)
    assert any("no hardware counters" in n for n in rep["notes"])


def test_callgrind_backend_needs_callgrind() -> None:
    with pytest.raises(RuntimeError, match="valgrind --tool=callgrind"):
        Profiler(backend="callgrind")


@pytest.mark.parametrize("bad", ["", "a/b", "<x>", 3])
def test_bad_phase_names(bad: object) -> None:
    prof = Profiler(backend="time", null_repeats=0, software_events=False)
    with pytest.raises(ValueError, match="phase name"):
        with prof.phase(bad):  # type: ignore[arg-type]
            pass


def test_bad_backend_and_repeats() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        Profiler(backend="pmu")
    with pytest.raises(ValueError, match="null_repeats"):
        Profiler(backend="time", null_repeats=-1)


class _FakeClockProfiler(Profiler):
    """Every counter read costs exactly 1 unit (the boundary overhead) plus what the test
    adds to ``work`` between reads, so the correction can be checked to the unit."""

    clock = 0.0

    def _read(self) -> dict[str, float]:
        type(self).clock += 1.0
        return {"wall_s": self.clock, "cpu_s": 2 * self.clock}


def _work(units: float) -> None:
    _FakeClockProfiler.clock += units


def test_overhead_correction_arithmetic() -> None:
    prof = _FakeClockProfiler(backend="time", null_repeats=5, software_events=False)
    assert prof.null_phase() == {"wall_s": 1.0, "cpu_s": 2.0}
    for _ in range(3):
        with prof.phase("update_all_trainers"):
            _work(10)
            with prof.phase("sampling"):
                _work(4)
            with prof.phase("target_q"):
                _work(6)
    rep = prof.report()
    rows = {r["path"]: r for r in rep["phases"]}
    parent, sampling = rows["update_all_trainers"], rows["update_all_trainers/sampling"]
    assert parent["calls"] == 3 and parent["segments"] == 9  # 3 entries + 6 child entries
    assert sampling["exclusive"]["wall_s"] == 12.0
    assert sampling["exclusive_raw"]["wall_s"] == 15.0
    assert rows["update_all_trainers/target_q"]["exclusive"]["wall_s"] == 18.0
    assert parent["exclusive"]["wall_s"] == 30.0
    assert parent["inclusive"]["wall_s"] == 60.0
    assert parent["inclusive"]["cpu_s"] == 120.0
    # every raw unit is either a phase's corrected figure or overhead: nothing lost
    corrected = sum(r["exclusive"]["wall_s"] for r in rep["phases"])
    assert corrected + rep["total_overhead"]["wall_s"] == pytest.approx(rep["total_raw"]["wall_s"])


def test_time_backend_report_schema_and_json(tmp_path) -> None:
    prof = Profiler(backend="time", null_repeats=20)
    table = np.arange(100_000, dtype=np.float32)
    rng = np.random.default_rng(0)
    for _ in range(3):
        with prof.phase("update_all_trainers"):
            with prof.phase("sampling"):
                table[rng.integers(0, table.size, 1024)].sum()
            with prof.phase("q_p_loss"):
                pass
    rep = prof.report()
    prof.close()
    assert rep["schema"] == REPORT_SCHEMA
    assert rep["backend"] == "time"
    assert rep["null_repeats"] == 20
    assert [r["path"] for r in rep["phases"]] == [
        "update_all_trainers",
        "update_all_trainers/sampling",
        "update_all_trainers/q_p_loss",
        OUTSIDE,
    ]
    assert NULL_PHASE not in {r["path"] for r in rep["phases"]}
    for name, meta in rep["metrics"].items():
        assert meta["source"] in {"time", "software", "hardware", "simulated", "modelled"}, name
        assert meta["unit"] and meta["description"]
    for row in rep["phases"]:
        assert set(row) >= {"path", "name", "parent", "depth", "calls", "exclusive", "inclusive"}
        for m in rep["metrics"]:
            assert row["exclusive"][m] >= 0
    rows = {r["path"]: r for r in rep["phases"]}
    assert rows["update_all_trainers/sampling"]["parent"] == "update_all_trainers"
    assert rows["update_all_trainers/sampling"]["depth"] == 1
    assert rows["update_all_trainers"]["calls"] == 3
    parent = rows["update_all_trainers"]
    children = [r for r in rep["phases"] if r["parent"] == "update_all_trainers"]
    for m in rep["metrics"]:
        expected = parent["exclusive"][m] + sum(c["inclusive"][m] for c in children)
        assert parent["inclusive"][m] == pytest.approx(expected)
    assert "numba_num_threads" in rep["threads"]
    path = write_json(rep, tmp_path / "p.json")
    assert json.loads(path.read_text()) == rep
    text = format_table(rep)
    assert "wall ms" in text and "time: wall ms" in text and "sampling" in text


def test_exception_inside_a_phase_closes_it() -> None:
    prof = Profiler(backend="time", null_repeats=0, software_events=False)
    with pytest.raises(KeyError):
        with prof.phase("env_step"):
            raise KeyError("boom")
    with prof.phase("buffer_add"):
        pass
    paths = [r["path"] for r in prof.report()["phases"]]
    assert paths == ["env_step", "buffer_add", OUTSIDE]


# ------------------------------------------------------------------------ callgrind helpers
def test_client_request_is_a_no_op_natively() -> None:
    if not cg.supported():
        assert cg.client_request(cg.VG_USERREQ_RUNNING_ON_VALGRIND, default=7) == 7
        return
    from marlbuf._kernels.client_request import client_request_kernel

    block = np.zeros(6, dtype=np.uint64)
    block[0] = cg.VG_USERREQ_RUNNING_ON_VALGRIND
    got = client_request_kernel(np.uint64(block.ctypes.data), np.uint64(42))
    assert got == client_request_outside_valgrind(block, 42)
    assert cg.running_on_valgrind() == 0
    assert cg.valgrind_tool() is None
    cg.dump_stats_at("nothing happens natively")
    with pytest.raises(ValueError, match="at most 5"):
        cg.client_request(1, 1, 2, 3, 4, 5, 6)


def test_read_dump_summary_pads_omitted_trailing_zeros(tmp_path) -> None:
    dump = tmp_path / "callgrind.out.7.1"
    dump.write_text(
        "# callgrind format\nversion: 1\ndesc: Trigger: Client Request: marlbuf:sampling\n"
        "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\nsummary: 100 20 10 3 5\n\nfl=(1) x\n"
    )
    (tmp_path / "callgrind.out.7.2").write_text(
        "desc: Trigger: Program termination\nevents: Ir\nsummary: 5\n"
    )
    assert cg.read_dump_caches(dump) == []
    label, costs = cg.read_dump_summary(dump)
    assert label == "marlbuf:sampling"
    assert costs == {
        "Ir": 100,
        "Dr": 20,
        "Dw": 10,
        "I1mr": 3,
        "D1mr": 5,
        "D1mw": 0,
        "ILmr": 0,
        "DLmr": 0,
        "DLmw": 0,
    }
    assert [p.name for p in cg.dump_files(tmp_path / "callgrind.out.7")] == [
        "callgrind.out.7.1",
        "callgrind.out.7.2",
    ]
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    with pytest.raises(ValueError, match="not a callgrind dump"):
        cg.read_dump_summary(bad)


def test_valgrind_command_pins_the_caches() -> None:
    cmd = cg.valgrind_command(["python", "x.py"], "/tmp/out.%p")
    assert cmd[:3] == ["valgrind", "--tool=callgrind", "--cache-sim=yes"]
    assert "--D1=32768,8,64" in cmd and "--LL=33554432,16,64" in cmd
    assert cmd[-2:] == ["python", "x.py"]


def test_callgrind_warns_when_the_filled_table_fits_in_the_simulated_cache() -> None:
    from marlbuf.profiling import cli

    cache = cg.simulated_ll_bytes()
    assert cache == 32 * 2**20
    small = cli.build_parser().parse_args(["--backend", "callgrind", "--fill", "4000"])
    small.sampler = ["uniform", "neighbor"]
    (warning,) = cli.cache_fit_warnings(small)  # one per table size, naming every case
    assert "interleaved/uniform/N=3, interleaved/neighbor/N=3" in warning
    assert "fits in the simulated 32 MiB last-level cache" in warning
    advised = int(warning.split("--fill ")[1].split()[0])
    assert (
        cli.cache_fit_warnings(
            cli.build_parser().parse_args(["--backend", "callgrind", "--fill", str(advised)])
        )
        == []
    )
    default = cli.build_parser().parse_args(["--backend", "callgrind", "--agents", "3", "24"])
    assert cli.cache_fit_warnings(default) == []  # the default fill is 256 MiB worth
    result = {
        "config": {"backend": "callgrind"},
        "runs": [
            {"label": "a", "buffer_bytes": cache // 2, "fill_steps": 1000},
            {"label": "b", "buffer_bytes": 8 * cache, "fill_steps": 16000},
        ],
    }
    (after,) = cli.result_cache_warnings(result)
    assert "the filled table of a (16.0 MiB, 1,000 transitions)" in after
    assert f"--fill {4 * 2 * 1000}" in after  # four times the cache: 4 x 2 x 1000 steps
    assert cli.result_cache_warnings({**result, "config": {"backend": "time"}}) == []


def test_valgrind_messages_go_to_a_log_file() -> None:
    cmd = cg.valgrind_command(["python", "x.py"], "out.%p", log_file="/tmp/v.log")
    assert "--log-file=/tmp/v.log" in cmd and cmd.index("--log-file=/tmp/v.log") < cmd.index(
        "python"
    )
    assert not [a for a in cg.valgrind_command(["python"], "o") if "log-file" in a]


def test_no_phases_after_the_report() -> None:
    prof = Profiler(backend="time", null_repeats=0)
    with prof.phase("sampling"):
        pass
    first = prof.report()
    assert prof.report()["phases"] == first["phases"]  # report() is repeatable
    with pytest.raises(RuntimeError, match="finished"):
        with prof.phase("sampling"):
            pass


# ------------------------------------------------------------------------ marlbuf profile
def test_profile_cli_sampling_sweep(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from marlbuf.profiling.cli import main

    out = tmp_path / "prof"
    argv = ["--workload", "sampling", "--agents", "2", "3", "--layout", "agent_major"]
    argv += ["interleaved", "--sampler", "uniform", "neighbor", "--batch-size", "64"]
    argv += ["--run-length", "8", "--fill", "2000", "--updates", "2", "--backend", "time"]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "profile.json").read_text())
    assert len(result["runs"]) == 8
    for run in result["runs"]:
        names = [r["name"] for r in run["report"]["phases"]]
        assert names == ["update_all_trainers", "sampling", OUTSIDE]
        assert run["report"]["phases"][1]["calls"] == 2
        assert run["fill_steps"] == 2000
    assert set(result["summary"]) == {
        f"{lay}/N={n}" for lay in ("agent_major", "interleaved") for n in (2, 3)
    }
    for entry in result["summary"].values():
        assert entry["wall_s"]["source"] == "time"
        assert "neighbor_over_uniform" in entry["wall_s"]
    assert (out / "phases.png").stat().st_size > 0
    assert (out / "sampling_counters.png").stat().st_size > 0
    assert "## agent_major/uniform/N=2" in (out / "profile.md").read_text()
    assert "sampling" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (["--env", "chess"], "--env"),
        (["--sampler", "neighbor", "--batch-size", "100", "--run-length", "16"], "--run-length"),
        (["--layout", "columnar"], "--layout"),
        (["--sampler", "lifo"], "--sampler"),
        (["--updates", "0"], "--updates"),
        (["--agents", "x"], "--agents"),
        (["--backend", "perf"], "--backend"),
    ],
)
def test_profile_cli_rejects_bad_arguments_in_one_line(
    tmp_path, capsys: pytest.CaptureFixture[str], bad: list[str], named: str
) -> None:
    from marlbuf.profiling.cli import main

    out = tmp_path / "never"
    try:
        status = main([*bad, "--out", str(out)])
    except SystemExit as exc:  # argparse's own errors (bad int, unknown choice)
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("marlbuf profile: error: ")
    assert named in err
    assert not out.exists()


def test_profile_cli_refuses_the_hardware_backend_without_a_pmu(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from marlbuf.profiling.cli import hardware_unavailable, main

    if hardware_unavailable() is None:
        pytest.skip("this machine's hardware counters open")
    out = tmp_path / "never"
    assert main(["--backend", "hardware", "--workload", "sampling", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith("marlbuf profile: error: --backend hardware: ")
    assert "--backend callgrind" in err
    assert not out.exists()


# Runs ``marlbuf profile --backend callgrind`` with valgrind replaced by a process that writes
# a dump into the dump folder and then waits to be interrupted.
_CALLGRIND_STAND_IN = """
import shutil, sys
from marlbuf.profiling import callgrind, cli

def stand_in(python_argv, out_prefix, valgrind="valgrind", log_file=None):
    code = (
        "import pathlib, sys, time; "
        "pathlib.Path(sys.argv[1].replace('%p', '1')).write_text('dump'); time.sleep(120)"
    )
    return [sys.executable, "-c", code, str(out_prefix)]

callgrind.valgrind_command = stand_in
callgrind.supported = lambda: True
cli._warm_numba_cache = lambda args: None
shutil.which = lambda name: "/bin/true"
sys.exit(cli.main(["--backend", "callgrind", "--workload", "sampling", "--out", sys.argv[1]]))
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_callgrind_dumps_are_removed_on_interrupt(tmp_path, signum: int) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "TMPDIR": str(temp),  # where tempfile puts the dump folder
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _CALLGRIND_STAND_IN, str(tmp_path / "out")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(temp.glob("marlbuf-callgrind-*/callgrind.out.1")):
            assert time.monotonic() < deadline and proc.poll() is None, "no dump appeared"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if signum == signal.SIGINT else 128 + signal.SIGTERM), err
    assert "Traceback" not in err
    assert list(temp.iterdir()) == []  # the dump folder went with its dumps


def test_counters_suite_quick_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from marlbuf.bench.suites import counters

    tiny = {**counters.QUICK, "agents": [2], "fill_steps": 1000, "batch_size": 64, "rounds": 2}
    monkeypatch.setattr(counters, "QUICK", tiny)
    payload = counters.run(quick=True)
    assert counters.SUITE == "counters"
    assert len(payload["rows"]) == 4
    assert set(payload["summary"]) == {
        "agent_major/N=2",
        "interleaved/N=2",
        "uniform/N=2",
        "neighbor/N=2",
    }
    assert "neighbor_over_uniform_model_LL_misses" in payload["summary"]["agent_major/N=2"]
    assert all(r["wall_s_source"] == "time" for r in payload["rows"])
    json.dumps(payload)


@linux_only
def test_hardware_backend_mechanics_with_a_group_that_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hardware backend's group handling, exercised with events that open without a PMU
    (in this test only, software events stand in for the PMU group)."""
    if not _software_events_open():
        pytest.skip("software perf events do not open here")
    monkeypatch.setattr(Profiler, "hardware_events", ("task-clock",))
    prof = Profiler(backend="hardware", null_repeats=10, software_events=False)
    assert prof.backend == "hardware"
    for _ in range(3):
        with prof.phase("sampling"):
            np.ones(10_000).sum()
    rep = prof.report()
    row = rep["phases"][0]
    assert row["calls"] == 3 and row["multiplexed_segments"] == 0
    assert rep["metrics"]["task-clock"]["source"] == "hardware"  # as declared by this test
    assert row["exclusive_raw"]["task-clock"] > 0
    assert any("calling thread only" in n for n in rep["notes"])


def test_no_profiler_hooks_are_a_shared_no_op() -> None:
    from marlbuf.profiling import NullProfiler

    null = NullProfiler()
    assert null.phase("sampling") is null.phase("env_step")  # nothing allocated per call


def test_runner_phase_hooks_are_called_as_documented(tmp_path) -> None:
    """Counted calls (not time): the trainer's phases reach any profiler with phase(name)."""
    algos = pytest.importorskip("marlbuf.algos")
    calls: dict[str, int] = {}

    class CountingProfiler:
        def phase(self, name: str) -> object:
            calls[name] = calls.get(name, 0) + 1
            import contextlib

            return contextlib.nullcontext()

    cfg = algos.TrainConfig(n_agents=2, batch_size=32, buffer_size=2000, warmup_steps=64)
    runner = algos.Runner(cfg, profiler=CountingProfiler())
    runner.collect(70, random_policy=True)
    assert calls == {"action_selection": 70, "env_step": 70, "buffer_add": 70}
    runner.update_round()
    assert calls["update_all_trainers"] == 1
    assert calls["sampling"] == 1
    assert calls["target_q"] >= 1 and calls["q_p_loss"] >= 1
    assert "priority_update" not in calls  # uniform sampler: no priorities to update
