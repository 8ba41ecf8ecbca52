"""marlbuf.envs (see README)."""
