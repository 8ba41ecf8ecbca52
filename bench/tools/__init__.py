"""What the suites share and what reads their results: timing and result files
(:mod:`~marlbuf.bench.tools.common`), the report and its figures, and the pairwise comparison of
two versions (``python -m marlbuf.bench.pairwise``)."""
