"""marlbuf.algos (see README)."""
