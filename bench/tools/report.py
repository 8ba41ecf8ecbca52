"""``REPORT[-quick].md``: the result files of a run as tables a reader takes in at a glance.

The report opens with the answer: the machine it ran on, then a headline section that puts
marlbuf's default buffer against the buffers a user would otherwise use (per-agent NumPy
arrays, openai/maddpg's list of tuples, cpprb, TorchRL, padded episode buffers) per workload, in
plain words, as "x faster" and memory, with the figure. The guard's pass/fail checks follow in
their own section, each check explained, with the machine's copy bandwidth. Then every suite:
its configuration and summary are tables whose numbers have three significant figures and
whose units stand in the headers; the terms of its case names are explained beneath it. A
quick run (one seed, few repeats) says once that its figures indicate and do not decide, and
withholds the verdicts that need several seeds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: What the parts of case names mean (a case is named by its parts joined with "+", "/" or
#: blanks, e.g. ``lean16s+neighbor64+stream``); ``neighbor<n>`` and ``L=<n>`` are patterns.
CASE_TERMS: dict[str, str] = {
    "list_of_tuples": "openai/maddpg's buffer: a Python list of tuples per agent (the paper's "
    "baseline)",
    "numpy_per_agent": "one NumPy array per field and agent, gathered agent by agent (the strong "
    "baseline)",
    "per_agent_arrays": "one NumPy array per field and agent (the strong baseline)",
    "numpy": "a NumPy implementation of the same operation (baseline)",
    "numpy_rows": "a NumPy row write per agent (baseline of add)",
    "interleaved": "marlbuf's interleaved layout: one row per step holding every agent's fields",
    "agent_major": "marlbuf with one array per field and agent",
    "split": "the joint batch followed by a contiguous copy of every per-agent array",
    "uniform": "uniform draws, in draw order",
    "uniform_memory": "uniform draws returned in ascending slot order (memory order)",
    "uniform_random": "uniform draws in draw order",
    "neighbor": "B/n reference points, each followed by a run of n contiguous steps",
    "lean": "observations stored once (a step's next_obs read from the next step's row)",
    "lean16": "observations stored once, in float16; batches converted to float32",
    "lean16s": "observations stored once, in float16; batches kept in float16 (storage precision)",
    "stream": "iter_trainers: each trainer's batch dropped before the next is drawn",
    "parallel": "parallel_gather=True: the gather split over threads",
    "out": "batches gathered into preallocated out= blocks",
    "per_agent": 'batch_layout="per_agent": C-contiguous per-agent arrays',
    "copy_floor": "one memcpy per trainer of exactly the bytes its batch holds",
    "bare_row_gather": "a plain Numba loop gathering the rows into one reused array",
    "default": "MultiAgentReplayBuffer(specs, capacity) with no options",
    "dense": 'next_obs stored in every row (next_obs="stored")',
    "output_write_floor": "zero-filling one batch block per trainer: the round's writes alone",
    "memcpy_floor": "one contiguous copy per trainer of its batch's bytes, from the stored table",
    "default_stream": "the default buffer's iter_trainers round, one batch alive at a time",
    "bare_runs": "the bare row gather of runs of <n> consecutive rows (as Neighbor(<n>) draws)",
    "float16": "the default buffer with float16 observations (float32 batches)",
    "cpprb": "the cpprb library",
    "torchrl": "the TorchRL library",
    "adapter": "marlbuf.compat's drop-in adapter",
    "adapter_copy": "the drop-in adapter with copy=True",
    "adapter_per": "the drop-in prioritized adapter",
    "tf2marl_arrays": "tf2multiagentrl's array buffer",
    "tf2marl_per": "tf2multiagentrl's prioritized buffer (Python segment trees)",
    "own": "the training loop's own NumPy buffer",
    "marlbuf": "marlbuf swapped in (library defaults)",
    "marlbuf_per_agent_batches": 'marlbuf with batch_layout="per_agent"',
    "marlbuf_buffer": "through the buffer (draw, gather, update)",
    "marlbuf_sampler": "the sampler alone (no gather)",
    "padded_episodes": "an EPyMARL-style padded episode buffer",
    "padded_episodes_whole": "the padded episode buffer returning whole episodes",
    "torchrl_pad": "TorchRL's SliceSampler with pad_output=True",
    "torchrl_ragged": "TorchRL's SliceSampler, ragged output",
    "torchrl_pad_cached": "TorchRL's SliceSampler, pad_output=True, trajectory ends cached",
    "gather_runs": "a bare gather of B runs of L rows",
    "L": "sequence length (burn-in included)",
    "faithful": "per-agent loop, per-agent arrays and mpe2's own environment code",
    "baseline": "per-agent loop and per-agent arrays on marlbuf's environment",
    "per_round": "prioritized sampling round",
    "locality_round": "prioritized-locality sampling round",
}

#: Unit of a value by the last part of its key (``ms_median``: the first part).
UNITS = {
    "ms": "ms",
    "us": "µs",
    "s": "s",
    "pct": "%",
    "GBps": "GB/s",
    "GiB": "GiB",
    "MiB": "MiB",
    "bytes": "bytes",
}

#: Summary keys whose values are verdicts: withheld in a quick run of one seed.
VERDICT_KEYS = re.compile(
    r"verdict|recommend|default_run_length|within_uniform_range|every_seed_learns|qualif|losing"
)

#: A verdict written into a table cell after the figures it reads ("-154 (-20%), t +0.0:
#: slightly below uniform's seed range, not a clear loss").
VERDICT_TEXT = re.compile(r":\s*(slightly (above|below)|within|loses|gains|baseline)[^|]*")

QUICK_NOTE = (
    "**Quick sizes: these figures indicate, they do not decide.** One seed and few repeats on "
    "small buffers, on whatever else the machine was doing. Verdicts that need several seeds "
    "are withheld (—). Run a suite without `--quick` for figures to quote, and compare runs "
    "with `marlbuf bench compare A.json B.json`, which warns when the machine, its load or its "
    "copy bandwidth differ, or when the spread of repeats overlaps."
)

WITHHELD = "—"


def number(value: Any) -> str:
    """``value`` for a table: floats with three significant figures (thousands separated),
    integers with separators, lists joined, everything else as text."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "—"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(number(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {number(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|")


def unit_of(key: str) -> str:
    """The unit a key names (``ms_median`` -> ms, ``copy_bandwidth_GBps`` -> GB/s), or ``""``
    (ratios and counts)."""
    parts = re.split(r"[_ ]", key)
    for part in (parts[-1], parts[0]):
        if part in UNITS:
            return UNITS[part]
    return ""


def header_with_unit(cell: str) -> str:
    """A column header with its unit moved into brackets: ``ms_median`` -> ``median (ms)``."""
    name = cell.strip()
    unit = unit_of(name)
    if not unit:
        return cell
    parts = re.split(r"_", name)
    token = next(p for p in (parts[-1], parts[0]) if UNITS.get(p) == unit)
    rest = "_".join(p for p in parts if p != token) or "value"
    return f" {rest} ({unit}) "


def with_units(markdown: str) -> str:
    """``markdown`` with the header row of each table given its units (:func:`header_with_unit`)."""
    out, in_table = [], False
    for line in markdown.splitlines():
        if line.startswith("|") and not in_table:
            cells = line.strip().strip("|").split("|")
            line = "|" + "|".join(header_with_unit(c) for c in cells) + "|"
        in_table = line.startswith("|")
        out.append(line)
    return "\n".join(out)


def flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, value)`` for every leaf of nested mappings (paths joined with " / ")."""
    if isinstance(data, Mapping) and data:
        out: list[tuple[str, Any]] = []
        for key, value in data.items():
            out += flatten(value, f"{prefix} / {key}" if prefix else str(key))
        return out
    return [(prefix, data)]


def key_value_table(items: Iterable[tuple[str, Any]], quick_one_seed: bool = False) -> str:
    """A two- or three-column markdown table (what, value, unit) of ``items``."""
    rows = []
    for key, value in items:
        if quick_one_seed and VERDICT_KEYS.search(key):
            value = WITHHELD
        shown = number(value)
        if isinstance(value, (list, tuple)) and len(value) > 4:  # long lists: one per line
            shown = "<br>".join(number(v) for v in value)
        rows.append((key.replace("|", "\\|"), shown, unit_of(key)))
    with_units = any(unit for _, _, unit in rows)
    header = (
        "| what | value | unit |\n|---|---|---|" if with_units else "| what | value |\n|---|---|"
    )
    body = [
        f"| {key} | {shown} | {unit} |" if with_units else f"| {key} | {shown} |"
        for key, shown, unit in rows
    ]
    return "\n".join([header, *body])


def case_terms(names: Iterable[str]) -> list[tuple[str, str]]:
    """The glossary entries of the parts of ``names``, in order of first appearance."""
    seen: dict[str, str] = {}
    for name in names:
        for part in re.split(r"[+/ ]", str(name)):
            key = part
            if re.fullmatch(r"neighbor_?\d+", part):
                key = "neighbor"
                part = re.sub(r"_?(\d+)", r"<n>", part)
            elif re.fullmatch(r"bare_runs\d+", part):
                key, part = "bare_runs", "bare_runs<n>"
            elif part.startswith("L="):
                key, part = "L", "L=<n>"
            if key in CASE_TERMS and part not in seen:
                seen[part] = CASE_TERMS[key]
    return list(seen.items())


def withhold_verdict_columns(markdown: str) -> str:
    """``markdown`` with the cells of verdict columns (:data:`VERDICT_KEYS`) replaced by a
    dash, and verdicts written after a cell's figures cut off."""
    out: list[str] = []
    verdict_columns: list[int] = []
    for line in markdown.splitlines():
        if not line.startswith("|"):
            verdict_columns = []
            out.append(line)
            continue
        cells = line.strip().strip("|").split("|")
        if not verdict_columns and not set(line) <= set("|-: "):
            verdict_columns = [i for i, c in enumerate(cells) if VERDICT_KEYS.search(c.lower())]
            out.append(line)
            continue
        if verdict_columns and not set(line) <= set("|-: "):
            cells = [" — " if i in verdict_columns else c for i, c in enumerate(cells)]
            line = VERDICT_TEXT.sub("", "|" + "|".join(cells) + "|")
        out.append(line)
    return "\n".join(out)


#: Short plain words for the parts of case names (``neighbor<n>``: any run length), used where a
#: case is named for a reader who does not know the suites (the headline, the legends of the
#: peers and layout figures).
PLAIN_TERMS: dict[str, str] = {
    "list_of_tuples": "openai/maddpg's list of tuples",
    "numpy_per_agent": "per-agent NumPy arrays",
    "per_agent_arrays": "per-agent NumPy arrays",
    "numpy": "NumPy",
    "numpy_rows": "NumPy row write",
    "interleaved": "interleaved rows",
    "agent_major": "one array per field and agent",
    "split": "split per agent",
    "uniform": "uniform",
    "uniform_memory": "uniform in memory order",
    "uniform_random": "uniform in draw order",
    "neighbor<n>": "neighbor runs of <n>",
    "lean": "observations stored once",
    "lean16": "observations stored once in float16",
    "lean16s": "observations stored once in float16, float16 batches",
    "stream": "one batch alive at a time",
    "parallel": "threaded gather",
    "out": "reused batch memory",
    "per_agent": "contiguous per-agent batches",
    "copy_floor": "memcpy of the batch bytes (floor)",
    "bare_row_gather": "bare Numba row gather",
    "default": "defaults",
    "dense": "next_obs in every row",
    "output_write_floor": "writing the batches alone (floor)",
    "memcpy_floor": "memcpy of each batch's bytes from the table (floor)",
    "default_stream": "defaults, one batch alive at a time",
    "bare_runs": "bare Numba gather of runs",
    "float16": "defaults with float16 observations",
    "cpprb": "cpprb",
    "torchrl": "TorchRL",
    "adapter": "marlbuf's drop-in adapter",
    "adapter_copy": "drop-in adapter, copy=True",
    "adapter_per": "drop-in prioritized adapter",
    "tf2marl_arrays": "tf2multiagentrl's buffer",
    "tf2marl_per": "tf2multiagentrl's prioritized buffer",
    "own": "the loop's own buffer",
    "marlbuf": "marlbuf",
    "marlbuf_per_agent_batches": "marlbuf, per-agent batches",
    "marlbuf_buffer": "marlbuf buffer",
    "marlbuf_sampler": "marlbuf sampler alone",
    "padded_episodes": "padded episode buffer",
    "torchrl_pad": "TorchRL SliceSampler, padded",
    "torchrl_ragged": "TorchRL SliceSampler, ragged",
    "torchrl_pad_cached": "TorchRL SliceSampler, padded, ends cached",
    "padded_episodes_whole": "padded episode buffer, whole episodes",
    "gather_runs": "bare gather of runs",
    "faithful": "per-agent loop and arrays on mpe2",
    "baseline": "per-agent loop and arrays",
    "per_round": "prioritized round",
    "locality_round": "prioritized-locality round",
}

#: Whole case names with a reading of their own: marlbuf's defaults in each suite.
PLAIN_CASES: dict[str, str] = {
    "lean+uniform_memory": "marlbuf, defaults",
    "marlbuf interleaved+uniform": "marlbuf, defaults",
    "marlbuf interleaved+neighbor64": "marlbuf, neighbor runs of 64",
}


def plain_case(name: str) -> str:
    """A case name in plain words: ``lean16s+neighbor64+stream`` -> "observations stored once
    in float16, float16 batches, neighbor runs of 64, one batch alive at a time". Parts
    without a reading stay as they are."""
    if name in PLAIN_CASES:
        return PLAIN_CASES[name]
    words = []
    for part in re.split(r"[+/ ]", str(name)):
        run = re.fullmatch(r"neighbor_?(\d+)", part)
        if run:
            words.append(PLAIN_TERMS["neighbor<n>"].replace("<n>", run.group(1)))
        elif part.startswith("L="):
            words.append(f"sequences of {part[2:]} steps")
        elif part:
            words.append(PLAIN_TERMS.get(part, part))
    return ", ".join(words)


def plain_workload(label: str) -> str:
    """``CN-12`` -> "cooperative navigation, 12 agents"; ``PP-24+8`` -> "predator-prey, 24
    predators + 8 prey"; anything else as it is."""
    cn = re.fullmatch(r"CN-(\d+)", label)
    if cn:
        return f"cooperative navigation, {cn.group(1)} agents"
    pp = re.fullmatch(r"PP-(\d+)\+(\d+)", label)
    if pp:
        return f"predator-prey, {pp.group(1)} predators + {pp.group(2)} prey"
    return label


def times(value: float) -> str:
    """A speed ratio for a reader: ``6.85`` -> "6.85×", ``0.77`` -> "0.77× (slower)"."""
    return f"{number(float(value))}×" + (" (slower)" if value < 1 else "")


def load_record(results_dir: Path, suite: str, quick: bool) -> dict[str, Any] | None:
    """The result record of ``suite`` of this kind (quick or full) in ``results_dir``."""
    from marlbuf.bench.tools.common import result_path

    path = result_path(suite, quick, results_dir)
    if not path.is_file():
        return None
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def _median(row: Mapping[str, Any]) -> float | None:
    for key in ("ms_median", "us_median", "s_median"):
        if isinstance(row.get(key), (int, float)):
            return float(row[key])
    return None


def _cases_by_workload(record: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for row in record.get("rows", []) or []:
        value = _median(row)
        if value is not None and "workload" in row and "case" in row:
            out.setdefault(str(row["workload"]), {})[str(row["case"])] = value
    return out


#: The MADDPG sampling round's comparisons of the headline: (suite, marlbuf's case with the
#: library's defaults, baseline case, baseline in plain words). Each ratio is taken within one
#: suite, whose cases are timed in the same process, repeats interleaved.
ROUND_BASELINES = (
    ("sampling", "lean+uniform_memory", "numpy_per_agent", "per-agent NumPy arrays"),
    ("sampling", "lean+uniform_memory", "list_of_tuples", "openai/maddpg's list of tuples"),
    ("peers", "marlbuf interleaved+uniform", "cpprb", "cpprb (one buffer of every field)"),
    ("peers", "marlbuf interleaved+uniform", "torchrl", "TorchRL (one buffer of every field)"),
)


def headline_data(results_dir: Path, quick: bool) -> dict[str, Any]:
    """The figures the headline section (and ``headline.png``) shows, from the result files.

    Returns
    -------
    dict
        ``"round"``: ``{baseline: {workload: x faster}}`` (the baseline's median time over
        marlbuf's defaults', same suite); ``"memory"``: per workload, GiB at the capacity for the
        default format (observations stored once), with float16 observations, and with
        next_obs in every row (as per-agent arrays keep it); ``"others"``: rows of (workload,
        baseline, x faster, what was timed); ``"records"``: the suites read.
    """
    records = {
        name: record
        for name in ("sampling", "peers", "memory", "prioritized", "sequences", "end_to_end")
        if (record := load_record(results_dir, name, quick)) is not None
    }
    rounds: dict[str, dict[str, float]] = {}
    for suite, mine, theirs, plain in ROUND_BASELINES:
        record = records.get(suite)
        if record is None:
            continue
        for workload, cases in _cases_by_workload(record).items():
            if cases.get(mine) and cases.get(theirs):
                rounds.setdefault(plain, {})[workload] = cases[theirs] / cases[mine]
    memory: dict[str, dict[str, float]] = {}
    for row in (records.get("memory") or {}).get("rows", []) or []:
        if "format" in row and "GiB_at_capacity" in row and "bytes_per_transition" in row:
            entry = memory.setdefault(str(row["workload"]), {"capacity": row.get("capacity")})
            entry[str(row["format"])] = float(row["GiB_at_capacity"])
    return {
        "round": rounds,
        "memory": memory,
        "others": _other_workloads(records),
        "records": records,
    }


def _other_workloads(records: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Headline rows beyond the sampling round: prioritized replay, sequences and episodes,
    the training loop; each a same-run ratio the suite recorded."""
    rows: list[dict[str, Any]] = []
    per = records.get("prioritized")
    if per is not None:
        cases = {
            r["case"]: r
            for r in per.get("rows", [])
            if r.get("part") == "per" and isinstance(r.get("us_median"), (int, float))
        }
        mine = cases.get("marlbuf_buffer")
        for theirs, plain in (
            ("cpprb", "cpprb's PrioritizedReplayBuffer"),
            ("numpy", "a NumPy sum tree"),
        ):
            if mine and theirs in cases:
                rows.append(
                    {
                        "workload": f"prioritized replay, capacity {number(mine['capacity'])}",
                        "baseline": plain,
                        "x": float(cases[theirs]["us_median"] / mine["us_median"]),
                        "what": f"sample {mine.get('batch', '')} rows and update their priorities",
                    }
                )
    sequences = records.get("sequences")
    if sequences is not None:
        summary = sequences.get("summary", {}) or {}
        config = sequences.get("config", {}) or {}
        over = (summary.get("sampling burn_in=0") or {}).get("marlbuf_speedup_over") or {}
        for theirs, plain in (
            ("torchrl_pad", "TorchRL's SliceSampler (padded)"),
            ("padded_episodes", "a padded episode buffer (EPyMARL-style)"),
        ):
            if theirs in over:
                rows.append(
                    {
                        "workload": f"sequences of {config.get('length', '?')} steps, "
                        f"{config.get('workload', '')}",
                        "baseline": plain,
                        "x": float(over[theirs]),
                        "what": f"sample {config.get('batch_size', '')} sequences",
                    }
                )
        for name, entry in (summary.get("episodes") or {}).items():
            if "sample_speedup_over_padded_torch" in entry:
                rows.append(
                    {
                        "workload": f"whole episodes, {name}",
                        "baseline": "EPyMARL's padded episode buffer (torch)",
                        "x": float(entry["sample_speedup_over_padded_torch"]),
                        "what": f"sample {config.get('episode_batch', '')} episodes",
                    }
                )
    end_to_end = records.get("end_to_end")
    if end_to_end is not None:
        for key, value in (end_to_end.get("summary") or {}).items():
            if key.startswith("speedup_vs_faithful_"):
                rows.append(
                    {
                        "workload": f"MADDPG training, {key.removeprefix('speedup_vs_faithful_')}",
                        "baseline": "openai/maddpg's structure: per-agent loop and arrays, mpe2",
                        "x": float(value),
                        "what": "100 env steps and an update round (marlbuf's buffer, batched "
                        "learner and MPE)",
                    }
                )
    return rows


def _machine_words(machine: Mapping[str, Any], records: list[Mapping[str, Any]]) -> str:
    """One machine in words: CPU, cores, last-level cache, copy bandwidth, load, versions."""
    bandwidth = machine.get("copy_bandwidth_GBps")
    if bandwidth is None:  # result files from before the machine record held it
        bandwidth = next(
            (
                r["config"]["copy_bandwidth_GBps"]
                for r in records
                if isinstance(r.get("config"), Mapping) and "copy_bandwidth_GBps" in r["config"]
            ),
            None,
        )
    caches = [c for c in machine.get("caches", []) if c.get("type") in ("Unified", "Data")]
    last = max(caches, key=lambda c: c.get("level", 0), default=None)
    parts = [
        f"{machine.get('cpu_model', 'unknown CPU')}, {machine.get('cores_usable', '?')} cores"
        + (f", L{last['level']} cache {last['size']}" if last else ""),
        f"copy bandwidth {number(float(bandwidth))} GB/s" if bandwidth is not None else "",
    ]
    load = _first(machine.get("load_average_1_5_15_min"))
    if load is not None:
        parts.append(f"load average {number(load)} (1 min) when a suite ended")
    versions = [
        f"{name} {machine[key]}"
        for name, key in (("marlbuf", "marlbuf"), ("NumPy", "numpy"), ("Numba", "numba"))
        if machine.get(key)
    ]
    parts.append(", ".join(versions))
    return "; ".join(p for p in parts if p)


def machine_line(records: Iterable[Mapping[str, Any]]) -> str:
    """Where the results were measured, in words (:func:`_machine_words`); where the result
    files come from several machines, each with the suites it ran."""
    records = list(records)
    groups: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for record in records:
        machine = record.get("machine") or {}
        groups.setdefault((machine.get("cpu_model"), machine.get("cores_usable")), []).append(
            record
        )
    if not groups:
        return "Machine: not recorded."
    if len(groups) == 1:
        (members,) = groups.values()
        return "Machine: " + _machine_words(_merged(members), members) + "."
    lines = [
        f"Machines: these result files come from {len(groups)} machines; compare ratios "
        "within a suite, not across them."
    ]
    for members in groups.values():
        suites = ", ".join(str(r.get("suite", "?")) for r in members)
        lines.append(f"- {_machine_words(_merged(members), members)} ({suites})")
    return "\n".join(lines)


def _merged(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The machine records of one machine's result files, the first value of each key."""
    machine: dict[str, Any] = {}
    for record in records:
        for key, value in (record.get("machine") or {}).items():
            machine.setdefault(key, value)
    return machine


def headline_section(
    results_dir: Path, quick: bool, figures: Iterable[Path] = ()
) -> tuple[list[str], dict[str, Any]]:
    """The report's first section: marlbuf's default buffer against the buffers a user would
    otherwise use, per workload; the lines and the data (:func:`headline_data`)."""
    data = headline_data(results_dir, quick)
    lines = ["## Headline: marlbuf against the buffer you would otherwise use", ""]
    rounds: dict[str, dict[str, float]] = data["round"]
    if rounds:
        workloads = list(dict.fromkeys(w for per in rounds.values() for w in per))
        lines += [
            "**MADDPG sampling round** (every trainer draws its own batch of 1024 and gathers "
            "every agent's fields, the O(N²B) step of an update): how many times faster "
            "marlbuf's default buffer (`MultiAgentReplayBuffer(specs, capacity)`) is than",
            "",
            "| workload | " + " | ".join(rounds) + " |",
            "|---|" + "---|" * len(rounds),
        ]
        for workload in workloads:
            cells = [times(per[workload]) if workload in per else "—" for per in rounds.values()]
            lines.append(f"| {plain_workload(workload)} | " + " | ".join(cells) + " |")
        lines += [""]
    memory: dict[str, dict[str, float]] = data["memory"]
    if memory:
        capacities = {entry.get("capacity") for entry in memory.values()}
        at = number(capacities.pop()) if len(capacities) == 1 else "the stated capacity"
        lines += [
            f"**Memory** of {at} transitions (GiB): marlbuf's default stores each observation "
            "once (a step's next_obs is the next step's obs); per-agent arrays, cpprb and "
            "TorchRL store next_obs in every row, as the last column does.",
            "",
            "| workload | marlbuf default | with float16 observations | next_obs in every row "
            "| default / every row |",
            "|---|---|---|---|---|",
        ]
        for workload, entry in memory.items():
            once, half, dense = (entry.get(k) for k in ("once", "once+float16", "dense"))
            ratio = number(once / dense) + "×" if once and dense else "—"
            lines.append(
                f"| {plain_workload(workload)} | {number(once)} | {number(half)} | "
                f"{number(dense)} | {ratio} |"
            )
        lines += [""]
    others = data["others"]
    if others:
        lines += [
            "**Other workloads**, each against its usual implementation:",
            "",
            "| workload | timed | marlbuf against | marlbuf is |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['workload']} | {r['what']} | {r['baseline']} | {times(r['x'])} faster |"
            if r["x"] >= 1
            else f"| {r['workload']} | {r['what']} | {r['baseline']} | {times(r['x'])} |"
            for r in others
        ]
        lines += [""]
    if not (rounds or memory or others):
        flag = " --quick" if quick else ""
        lines += [
            "No headline figures in this folder: they come from the `sampling`, `peers`, "
            f"`memory`, `prioritized`, `sequences` and `end_to_end` suites (`marlbuf bench{flag}` "
            "runs them).",
            "",
        ]
        return lines, data
    lines += [
        "× faster: the baseline's median time over marlbuf's, both timed in the same process "
        "with repeats interleaved (a suite's own comparisons); above 1 marlbuf is faster. "
        "Each suite's section below has the times, the configuration and the other cases.",
        "",
    ]
    shown = [p for p in figures if p.stem in HEADLINE_FIGURES]
    shown.sort(key=lambda p: HEADLINE_FIGURES.index(p.stem))
    lines += [f"![{p.stem}]({p.parent.name}/{p.name})" for p in shown]
    if shown:
        lines += [""]
    return lines, data


#: Figures shown in the headline section, in order (the rest close the report).
HEADLINE_FIGURES = ("headline", "peers", "sampling")

#: What each guard check compares, in plain words, by the start of its name.
CHECK_MEANINGS: dict[str, str] = {
    "default round / dense round": "the MADDPG round of the default buffer against the same "
    "round with next_obs stored in every row: what storing observations once costs in time",
    "dense round / bare row gather": "the buffer's round against a bare Numba loop gathering "
    "the same rows into one reused array: the library's own overhead over the copy",
    "Neighbor(64) round / uniform round": "runs of 64 contiguous rows against uniform draws: "
    "what locality saves; the note gives the floor of writing the round's batches alone",
    "PER sample + update": "cpprb's prioritized buffer against marlbuf's, sampling and "
    "updating priorities: at least this many times faster",
    "add / NumPy row write": "one add() of PettingZoo-style dicts against a per-agent NumPy row "
    "write",
}


def guard_section(path: Path, quick: bool) -> list[str]:
    """The guard's checks, explained: what each compares, the machine's copy bandwidth, the
    PASS/FAIL table and what a FAIL means."""
    from marlbuf.bench.tools.common import checks_markdown

    record = json.loads(path.read_text())
    checks = record.get("checks") or []
    config = record.get("config") or {}
    bandwidth = (record.get("machine") or {}).get("copy_bandwidth_GBps") or config.get(
        "copy_bandwidth_GBps"
    )
    counts = {s: sum(c.get("status") == s for c in checks) for s in ("PASS", "FAIL", "SKIP")}
    lines = [
        "## Checks: the default path against its limits (`guard`)",
        "",
        f"`{path.name}`, {record.get('created', '?')}: {counts['PASS']} passed, "
        f"{counts['FAIL']} failed" + (f", {counts['SKIP']} skipped" if counts["SKIP"] else ""),
        "",
        "Each check is a ratio of two cases timed in the same process (rounds rotated, ratios "
        "paired per round, the median taken), against a limit the default path is meant to "
        "hold (the limits are targets, stated in `marlbuf.bench.suites.guard`). Whether a machine "
        "meets them depends on its memory system"
        + (
            f" (this one copies {number(float(bandwidth))} GB/s: memory-bound checks such as "
            "the neighbor and bare-gather ratios move with it)"
            if bandwidth
            else ""
        )
        + " and on its load. "
        + (
            "At quick sizes a FAIL is a prompt to rerun `marlbuf bench guard` at full size, "
            "not a verdict; `--quick` never fails the command."
            if quick
            else "A FAIL makes `marlbuf bench guard` exit with status 1."
        ),
        "",
    ]
    named = [(prefix, text) for prefix, text in CHECK_MEANINGS.items()]
    seen = [p for p, _ in named if any(str(c.get("check", "")).startswith(p) for c in checks)]
    lines += [f"- **{p}**: {text}." for p, text in named if p in seen] + [""]
    if checks:
        lines += [checks_markdown(checks), ""]
    return lines


def suite_section(name: str, path: Path, note: str | None = None) -> list[str]:
    """The report lines of one suite's result file."""
    record = json.loads(path.read_text())
    quick = bool(record.get("quick"))
    config = record.get("config", {}) or {}
    seeds = config.get("seeds")
    one_seed = quick and (seeds is None or len(seeds) <= 1)
    lines = [f"## {name}", ""]
    if note:
        lines += [note, ""]
    lines += [f"`{path.name}`, {record.get('created', '?')}", ""]
    if record.get("markdown"):
        text = str(record["markdown"])
        if record.get("checks"):  # shown, explained, in the checks section
            text = drop_table(text, "| check |")
        text = withhold_verdict_columns(text) if one_seed else text
        lines += [with_units(text), ""]
    if record.get("summary"):
        lines += ["Summary:", "", key_value_table(flatten(record["summary"]), one_seed), ""]
    terms = case_terms(
        str(r.get("case", "")) for r in record.get("rows", []) or [] if isinstance(r, Mapping)
    )
    if terms:
        lines += ["Case names: " + "; ".join(f"`{part}`: {text}" for part, text in terms), ""]
    if config:
        lines += [
            "<details><summary>configuration</summary>",
            "",
            key_value_table(flatten(config)),
            "",
            "</details>",
            "",
        ]
    return lines


#: Differences between two runs that ``marlbuf bench compare`` warns about: the copy
#: bandwidth (relative), the 1-minute load average per core (absolute).
BANDWIDTH_TOLERANCE = 0.10
LOAD_PER_CORE_TOLERANCE = 0.25


def compare_warnings(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Why the time ratios of two result records may not measure the code alone: different
    machines (CPU, cores, last-level cache) or library versions, a different load, a
    different copy bandwidth, or conditions a record does not state (written before results
    recorded them). Empty when nothing differs."""
    ma, mb = (dict(r.get("machine") or {}) for r in (a, b))
    warnings: list[str] = []

    def cache(machine: Mapping[str, Any]) -> str:
        levels = [c for c in machine.get("caches", []) if c.get("type") in ("Unified", "Data")]
        last = max(levels, key=lambda c: c.get("level", 0), default=None)
        return "" if last is None else f"L{last['level']} {last['size']}"

    where = [(m.get("cpu_model"), m.get("cores_usable"), cache(m)) for m in (ma, mb)]
    if where[0] != where[1]:
        shown = [f"{cpu}, {cores} cores, {llc}".strip(", ") for cpu, cores, llc in where]
        warnings.append(
            f"different machines: A ran on {shown[0]}, B on {shown[1]}; the ratios compare "
            "machines as well as code"
        )
    versions = [
        f"{name} {ma.get(name)} vs {mb.get(name)}"
        for name in ("marlbuf", "python", "numpy", "numba")
        if ma.get(name) and mb.get(name) and ma.get(name) != mb.get(name)
    ]
    if versions:
        warnings.append("different versions: " + "; ".join(versions))
    cores = [max(1, int(m.get("cores_usable") or 1)) for m in (ma, mb)]
    loads = [_first(m.get("load_average_1_5_15_min")) for m in (ma, mb)]
    if loads[0] is not None and loads[1] is not None:
        per_core = [load / n for load, n in zip((loads[0], loads[1]), cores)]
        if abs(per_core[0] - per_core[1]) > LOAD_PER_CORE_TOLERANCE or max(per_core) > 1:
            warnings.append(
                f"different load: 1-minute load average {number(loads[0])} for A, "
                f"{number(loads[1])} for B ({cores[0]} and {cores[1]} cores; a suite counts "
                "about 1 itself): a run on a busy machine is slower for reasons that are not "
                "the code"
            )
    bandwidths = [_first(m.get("copy_bandwidth_GBps")) for m in (ma, mb)]
    if bandwidths[0] is not None and bandwidths[1] is not None:
        if max(bandwidths[0], bandwidths[1]) > min(bandwidths[0], bandwidths[1]) * (
            1 + BANDWIDTH_TOLERANCE
        ):
            warnings.append(
                f"different copy bandwidth: {number(bandwidths[0])} GB/s for A, "
                f"{number(bandwidths[1])} GB/s for B: memory-bound cases move with it"
            )
    unstated = [
        name
        for name, m in (("A", ma), ("B", mb))
        if not m.get("load_average_1_5_15_min") or not m.get("copy_bandwidth_GBps")
    ]
    if unstated:
        verb = "does" if len(unstated) == 1 else "do"
        warnings.append(
            f"{' and '.join(unstated)} {verb} not record the machine's load and copy bandwidth "
            "(written by an older marlbuf): differences in them cannot be checked"
        )
    return warnings


def _first(value: Any) -> float | None:
    """A recorded figure as a float: the number itself, or a list's first entry (the 1-minute
    load average); ``None`` when not recorded."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return float(value) if isinstance(value, (int, float)) else None


def spread(row: Mapping[str, Any], median_key: str) -> tuple[float, float] | None:
    """The min-max range of a row's repeats for the time ``median_key`` (``ms_median`` ->
    ``ms_min``/``ms_max``); ``None`` when the row does not record it."""
    prefix = median_key.removesuffix("_median")
    low, high = row.get(f"{prefix}_min"), row.get(f"{prefix}_max")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return float(low), float(high)
    return None


def spreads_overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two min-max ranges of repeats overlap (the difference of the medians is then
    within what the repeats of one run already vary by); ``None`` when either is unknown."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def drop_table(markdown: str, header_start: str) -> str:
    """``markdown`` without the table whose header row starts with ``header_start`` (and the
    blank line after it)."""
    out: list[str] = []
    dropping = False
    for line in markdown.splitlines():
        if not dropping and line.startswith(header_start):
            dropping = True
            continue
        if dropping:
            if line.startswith("|"):
                continue
            dropping = False
            if not line.strip():
                continue
        out.append(line)
    return "\n".join(out)


def write_report(
    results_dir: Path,
    quick: bool,
    suites: Iterable[str],
    notes: Mapping[str, str] | None = None,
    figures: list[Path] | None = None,
    figures_error: str | None = None,
) -> Path:
    """Write ``REPORT[-quick].md`` in ``results_dir`` from the result files there
    (:func:`render_report`'s text); returns its path."""
    out = Path(results_dir) / f"REPORT{'-quick' if quick else ''}.md"
    out.write_text(render_report(results_dir, quick, suites, notes, figures, figures_error))
    return out


def render_report(
    results_dir: Path,
    quick: bool,
    suites: Iterable[str],
    notes: Mapping[str, str] | None = None,
    figures: list[Path] | None = None,
    figures_error: str | None = None,
) -> str:
    """The report of the result files in ``results_dir``, as markdown.

    The report opens with the machine and the headline section (:func:`headline_section`),
    then the guard's checks (:func:`guard_section`), then a section per suite.

    Parameters
    ----------
    results_dir : Path
        Where the ``<suite>[-quick].json`` files are.
    quick : bool
        The quick results (and, once, the note that they indicate and do not decide).
    suites : iterable of str
        Suite names in report order; only those with a result file or a note get a section.
    notes : mapping of str to str, optional
        Why a suite has no fresh result in this run (skipped: a missing extra; failed).
    figures : list of Path, optional
        Figures: the headline's in the headline section, the others at the end.
    figures_error : str, optional
        Why there are no figures (matplotlib missing).
    """
    from marlbuf.bench.tools.common import result_path

    notes = notes or {}
    suites = list(suites)
    figures = list(figures or [])
    kind = "quick" if quick else "full"
    paths = {name: result_path(name, quick, results_dir) for name in suites}
    present = {name: path for name, path in paths.items() if path.is_file()}
    records = [json.loads(path.read_text()) for path in present.values()]
    report = [f"# marlbuf benchmark report ({kind} sizes)", ""]
    if quick:
        report += [QUICK_NOTE, ""]
    if records:
        report += [machine_line(records), ""]
    headline, _ = headline_section(Path(results_dir), quick, figures)
    report += headline
    if "guard" in present:
        report += guard_section(present["guard"], quick)
    missing = []
    for name in suites:
        if name in present:
            report += suite_section(name, present[name], notes.get(name))
        elif name in notes:
            report += [f"## {name}", "", notes[name], ""]
        else:
            missing.append(name)
    if missing:
        flag = " --quick" if quick else ""
        report += [
            f"Suites without results in this folder: {', '.join(missing)} "
            f"(`marlbuf bench SUITE{flag}` runs one).",
            "",
        ]
    rest = [p for p in figures if p.stem not in HEADLINE_FIGURES]
    if rest:
        report += ["## figures", ""]
        report += [f"![{p.stem}]({p.parent.name}/{p.name})" for p in rest] + [""]
    elif figures_error:
        report += [f"figures skipped: {figures_error}", ""]
    return "\n".join(report)
