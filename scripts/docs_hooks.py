"""MkDocs hook (``mkdocs.yml``: ``hooks``): adds the benchmark pages, generated from the
committed result files by :mod:`marlbuf.bench.tools.site`, and their figures to the site."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    if str(ROOT) not in sys.path:  # the repository's marlbuf, installed or not
        sys.path.insert(0, str(ROOT))
    from marlbuf.bench.tools import site

    for path, text in site.pages().items():
        files.append(File.generated(config, path, content=text))
    for path, source in site.figures().items():
        files.append(File.generated(config, path, abs_src_path=str(source)))
    return files
