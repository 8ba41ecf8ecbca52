"""The options of a buffer that several layers read: the constructor's row options, the
capacity, and the header of a saved state or a memory-mapped folder's manifest.

Kept below the buffer so that persistence and the memory-mapped store check what a file
declares without importing the buffer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from marlbuf import _config
from marlbuf.spec import AgentSpec, FieldSpec, check_fields, interleaved_row_layout


def row_options_of(state: Mapping[str, Any]) -> tuple[dict[str, FieldSpec], bool]:
    """``global_fields`` and ``alive`` of a saved state or manifest (absent before format
    version 3: none and False)."""
    try:
        fields = {
            name: FieldSpec.from_dict(fs) for name, fs in state.get("global_fields", {}).items()
        }
        alive = state.get("alive", False)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"buffer state has invalid global_fields: {exc}") from exc
    if not isinstance(alive, bool):
        raise ValueError(f"buffer state has invalid alive={alive!r}; expected a bool")
    return fields, alive


def check_row_options(
    specs: Mapping[str, AgentSpec], global_fields: Any, alive: Any
) -> tuple[dict[str, FieldSpec], bool]:
    """The ``global_fields`` and ``alive`` constructor arguments, checked."""
    fields = check_fields("global_fields", global_fields)
    extras = next(iter(specs.values())).extras
    clash = [name for name in fields if name in extras]
    if clash:
        raise ValueError(
            f"global field names {clash} are also extra fields of the agents' specs; rename one"
        )
    if not isinstance(alive, (bool, np.bool_)):
        raise TypeError(f"alive must be a bool; got alive={alive!r}")
    return fields, bool(alive)


def check_header(state: Mapping[str, Any]) -> None:
    """The header fields of a buffer state (format, version, specs, sampler), checked."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a buffer state is a mapping (what state_dict() returns); got {state!r}")
    if state.get("format") != _config.SAVE_FORMAT:
        raise ValueError(
            f"not a marlbuf buffer state (format={state.get('format')!r}, "
            f"expected {_config.SAVE_FORMAT!r})"
        )
    version = state.get("version")
    if version not in _config.READABLE_SAVE_VERSIONS:
        raise ValueError(
            f"buffer state has format version {version!r}; this marlbuf reads versions "
            f"{list(_config.READABLE_SAVE_VERSIONS)}. Load it with the marlbuf version that "
            "wrote it."
        )
    specs = state.get("specs")
    if (
        not isinstance(specs, Mapping)
        or not specs
        or not all(isinstance(a, str) and isinstance(v, Mapping) for a, v in specs.items())
    ):
        raise ValueError(
            f"buffer state has specs={type(specs).__name__} {specs!r:.80}; expected a mapping of "
            "agent name to spec dict (what state_dict() writes)"
        )
    sampler = state.get("sampler")
    if not isinstance(sampler, Mapping) or not isinstance(sampler.get("config"), Mapping):
        raise ValueError(
            f"buffer state has sampler={sampler!r:.80}; expected a mapping with 'type', "
            "'config' and 'state' (what state_dict() writes)"
        )
    if version == 1 and state.get("layout") == "interleaved":
        # version 1 rows had no word-aligned next_obs/done sections; same bytes only when the
        # sections happen to start on words
        specs = {a: AgentSpec.from_dict(s) for a, s in state["specs"].items()}
        old = interleaved_row_layout(specs, _config.ROW_ALIGN_BYTES, section_align=1)
        if old != interleaved_row_layout(specs, _config.ROW_ALIGN_BYTES):
            raise ValueError(
                "this buffer file (format version 1) uses a row layout this marlbuf no longer "
                "has for these specs; load it with marlbuf 0.1, copy its transitions out with "
                "gather(), and add them to a new buffer"
            )


def check_capacity(capacity: Any) -> int:
    """``capacity`` as an int: ints and integral floats (``1e6``) are accepted."""
    if isinstance(capacity, (float, np.floating)) and float(capacity).is_integer():
        capacity = int(capacity)
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(
            f"capacity must be an int (or an integral float); got capacity={capacity!r}"
        )
    if capacity <= 0:
        raise ValueError(
            f"capacity must be at least 1 transition; got capacity={capacity}. A buffer needs "
            "room for data even when it is only used for evaluation: pass capacity=1"
        )
    return int(capacity)


__all__ = ["check_capacity", "check_header", "check_row_options", "row_options_of"]
