"""marlbuf.profiling (see README)."""
