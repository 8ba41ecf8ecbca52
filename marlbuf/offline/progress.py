"""``progress=`` of the conversions and the recorder: a tqdm bar, lines on stderr, or a
callback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class Progress:
    """``progress=`` of the conversions: ``False``, ``True`` (tqdm when installed, else a line
    on stderr per tenth), or a callable ``(done, total)``."""

    def __init__(self, progress: Any, total: int, what: str) -> None:
        self.total, self.done, self.what = max(1, total), 0, what
        self.callback: Callable[[int, int], Any] | None = None
        self.bar: Any = None
        self.shown = -1
        if callable(progress):
            self.callback = progress
        elif progress is True:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=what, unit="step", unit_scale=True)
            except ImportError:
                self.bar = None
        elif progress is not False:
            raise TypeError(f"progress must be a bool or a callable; got progress={progress!r}")
        self.text = progress is True and self.bar is None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.callback is not None:
            self.callback(self.done, self.total)
        if self.text:
            tenth = 10 * self.done // self.total
            if tenth != self.shown:
                self.shown = tenth
                print(f"{self.what}: {self.done:,}/{self.total:,} steps", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
