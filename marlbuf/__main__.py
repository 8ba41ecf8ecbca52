"""``python -m marlbuf`` is the same as the ``marlbuf`` console script."""

import sys

from marlbuf.cli import main

sys.exit(main())
