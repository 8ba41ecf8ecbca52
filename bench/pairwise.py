"""``python -m marlbuf.bench.pairwise``: :mod:`marlbuf.bench.tools.pairwise` run as a script
(two versions of marlbuf measured pairwise in one run)."""

from __future__ import annotations

import sys

from marlbuf.bench.tools.pairwise import main

if __name__ == "__main__":
    sys.exit(main())
