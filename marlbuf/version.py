"""The package version (a leaf module: the command line reads it without importing the buffer)."""

__version__ = "0.4.0"
