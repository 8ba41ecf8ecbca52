"""The marlbuf console script."""

from __future__ import annotations

import json

from marlbuf import cli, info


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
    assert info.main([]) == 0
    assert "numba" in capsys.readouterr().out
