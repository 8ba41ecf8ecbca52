"""A sharded buffer's checkpoint folder: one state file per shard (``shard-<k>.npz``, written
by its actor) and ``manifest.json`` (format and version, the shards' configuration, each
shard's file and counts, the learner's state), written last, through a temporary file, so a
folder with a manifest holds every shard's file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MANIFEST_FORMAT = "marlbuf-sharded"
MANIFEST_VERSION = 1
MANIFEST = "manifest.json"


def shard_file(index: int) -> str:
    """The name of shard ``index``'s state file in a checkpoint folder."""
    return f"shard-{index}.npz"


def write_manifest(
    folder: Path,
    config: Mapping[str, Any],
    counts: Sequence[tuple[int, int]],
    driver: Mapping[str, Any],
) -> None:
    """Write ``folder/manifest.json`` once every shard's file is written: the shards'
    ``config``, each shard's (size, total_writes) in ``counts``, the learner's ``driver``
    state (JSON-safe)."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "n_shards": len(counts),
        "config": config,
        "shards": [
            {"file": shard_file(k), "size": int(s), "total_writes": int(w)}
            for k, (s, w) in enumerate(counts)
        ],
        "driver": driver,
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / MANIFEST)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the checkpoint folder ``folder``, checked: its format and version, and
    every shard file it names present."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no sharded buffer in {folder} (missing {MANIFEST})")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(
            f"{path} is not a marlbuf sharded-buffer manifest of version {MANIFEST_VERSION}; got "
            f"format={manifest.get('format')!r} version={manifest.get('version')!r}"
        )
    missing = [s["file"] for s in manifest["shards"] if not (folder / s["file"]).is_file()]
    if missing:
        raise FileNotFoundError(f"sharded buffer {folder} lacks shard files {missing}")
    return dict(manifest)
