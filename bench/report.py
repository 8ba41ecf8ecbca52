"""``REPORT[-quick].md``: the result files of a run as tables a reader takes in at a glance.

Every section belongs to a suite whose result file exists (or that was skipped or failed in
this run, with the reason); its configuration and summary are tables whose numbers have three
significant figures and whose units stand in the headers; the terms of its case names are
explained beneath it. A quick run (one seed, few repeats) says that its verdicts are not
conclusive and withholds those that need several seeds.
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
    "**Quick sizes.** One seed and few repeats on small buffers: the timings and ratios "
    "indicate, they do not decide. Verdicts that need several seeds are withheld (—); run a "
    "suite without `--quick` for figures to quote."
)

WITHHELD = "— (one seed: not decided)"


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


def write_report(
    results_dir: Path,
    quick: bool,
    suites: Iterable[str],
    notes: Mapping[str, str] | None = None,
    figures: list[Path] | None = None,
    figures_error: str | None = None,
) -> Path:
    """Write ``REPORT[-quick].md`` in ``results_dir`` from the result files there.

    Parameters
    ----------
    results_dir : Path
        Where the ``<suite>[-quick].json`` files are, and where the report goes.
    quick : bool
        The quick results (and the note that they do not decide).
    suites : iterable of str
        Suite names in report order; only those with a result file or a note get a section.
    notes : mapping of str to str, optional
        Why a suite has no fresh result in this run (skipped: a missing extra; failed).
    figures : list of Path, optional
        Figures to link at the end.
    figures_error : str, optional
        Why there are no figures (matplotlib missing).
    """
    from marlbuf.bench.common import result_path

    notes = notes or {}
    kind = "quick" if quick else "full"
    report = [f"# marlbuf benchmark report ({kind} sizes)", ""]
    if quick:
        report += [QUICK_NOTE, ""]
    missing = []
    for name in suites:
        path = result_path(name, quick, results_dir)
        if path.is_file():
            report += suite_section(name, path, notes.get(name))
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
    if figures:
        report += ["## figures", ""]
        report += [f"![{p.stem}]({p.parent.name}/{p.name})" for p in figures] + [""]
    elif figures_error:
        report += [f"figures skipped: {figures_error}", ""]
    out = Path(results_dir) / f"REPORT{'-quick' if quick else ''}.md"
    out.write_text("\n".join(report))
    return out
