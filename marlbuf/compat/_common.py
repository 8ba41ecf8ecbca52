"""Argument checks shared by the adapters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from marlbuf.spec import check_shape


def check_size(size: Any) -> int:
    """A capacity; the original libraries pass ``1e6`` (a float), so integral floats pass."""
    if isinstance(size, bool) or not isinstance(size, (int, float, np.integer, np.floating)):
        raise TypeError(f"size must be an int (e.g. 1000000 or 1e6); got size={size!r}")
    if not float(size).is_integer() or size < 1:
        raise ValueError(f"size must be a positive whole number; got size={size!r}")
    return int(size)


def check_n_agents(n_agents: Any) -> int:
    """A positive agent count."""
    if isinstance(n_agents, bool) or not isinstance(n_agents, (int, np.integer)) or n_agents < 1:
        raise ValueError(f"n_agents must be a positive int; got n_agents={n_agents!r}")
    return int(n_agents)


def check_shape_list(name: str, shapes: Any, n_agents: int) -> list[tuple[int, ...]]:
    """One shape per agent from a list of tuples/ints or an ``(N, k)`` array (tf2marl's
    ``space_n_to_shape_n`` gives ``np.array([[18], [18], [18]])``)."""
    if (
        isinstance(shapes, (str, bytes))
        or not isinstance(shapes, (Sequence, np.ndarray))
        or len(shapes) != n_agents
    ):
        raise ValueError(
            f"{name} must hold one shape per agent ({n_agents}); got {name}={shapes!r}"
        )
    return [
        check_shape(f"{name}[{i}]", tuple(np.atleast_1d(np.asarray(s)).tolist()))
        for i, s in enumerate(shapes)
    ]
