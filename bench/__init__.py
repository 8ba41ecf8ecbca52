"""marlbuf.bench (see README)."""
