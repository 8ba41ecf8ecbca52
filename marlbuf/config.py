"""A buffer's configuration as one frozen value: what a saved state's header, a memory-mapped
folder's manifest and a sharded buffer's shards are built from.

:class:`BufferConfig` is written (:meth:`BufferConfig.to_dict`) and parsed
(:meth:`BufferConfig.from_dict`) here and nowhere else; the constructor's arguments are
checked here too (:meth:`BufferConfig.from_arguments`), so a module that needs a buffer's
settings (the mapped folder, persistence, the sharded buffer) takes a config, never the buffer.
:func:`make_rng` makes a buffer's generator from its ``seed=``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marlbuf.memory import estimate
from marlbuf.options import check_capacity, check_row_options, row_options_of
from marlbuf.samplers import Sampler, Uniform
from marlbuf.spec import AgentSpec, FieldSpec, normalize_specs

#: the storage layouts
LAYOUTS = ("interleaved", "agent_major")
#: how next observations are stored: once (from the successor's obs, a side table where they
#: differ), as a field of every row, or not at all (learners that never read next_obs)
NEXT_OBS_MODES = ("once", "stored", "none")
#: what ``next_obs=`` accepts: a format, or ``"auto"`` (the format chosen from the first write)
NEXT_OBS_CHOICES = ("auto", *NEXT_OBS_MODES)


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A ``Generator`` from a seed, an existing generator, or fresh entropy (``None``)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        return np.random.default_rng(seed)
    raise TypeError(f"seed must be an int, a numpy Generator or None; got seed={seed!r}")


def check_trainer(trainer: Any, n_trainers: int) -> int:
    """``trainer`` checked: an int in ``[0, n_trainers)`` (a ``TypeError`` for a non-int or a
    bool, a ``ValueError`` outside the range)."""
    if isinstance(trainer, bool) or not isinstance(trainer, (int, np.integer)):
        raise TypeError(f"trainer must be an int; got trainer={trainer!r}")
    if not 0 <= trainer < n_trainers:
        raise ValueError(
            f"trainer must be in [0, {n_trainers}) (n_trainers={n_trainers}); got trainer={trainer}"
        )
    return int(trainer)


def check_n_trainers(n_trainers: Any, most: int) -> int:
    """``n_trainers`` of a round checked: ``None`` gives ``most``, else an int in
    ``[1, most]`` (``TypeError`` or ``ValueError`` otherwise)."""
    if n_trainers is None:
        return most
    if isinstance(n_trainers, bool) or not isinstance(n_trainers, (int, np.integer)):
        raise TypeError(f"n_trainers must be an int; got n_trainers={n_trainers!r}")
    if not 1 <= n_trainers <= most:
        raise ValueError(f"n_trainers must be in [1, {most}]; got n_trainers={n_trainers}")
    return int(n_trainers)


@dataclass(frozen=True)
class BufferConfig:
    """What a buffer is built from, checked: everything but its data, RNG and runtime settings.

    Attributes
    ----------
    specs : dict of str to AgentSpec
        One spec per agent, in agent order.
    capacity : int
        Transitions kept (per shard, for a sharded buffer).
    layout : {"interleaved", "agent_major"}
    next_obs : {"auto", "once", "stored", "none"}
        The format (``"auto"`` only before a buffer's first write chose it).
    sampler_type, sampler_config : str, dict
        The sampler's class name and :meth:`Sampler.config` (:meth:`sampler` builds it).
    n_trainers : int
    global_fields : dict of str to FieldSpec
    alive : bool
    batch_layout : {"rows", "per_agent"}
    batch_dtype : {"float32", "storage"}
    """

    specs: dict[str, AgentSpec]
    capacity: int
    layout: str
    next_obs: str
    sampler_type: str
    sampler_config: dict[str, Any]
    n_trainers: int
    global_fields: dict[str, FieldSpec] = field(default_factory=dict)
    alive: bool = False
    batch_layout: str = "rows"
    batch_dtype: str = "float32"

    @classmethod
    def from_arguments(
        cls,
        specs: Mapping[str, AgentSpec],
        capacity: Any,
        layout: Any = "interleaved",
        sampler: Any = None,
        n_trainers: Any = None,
        next_obs: Any = "auto",
        batch_layout: str = "rows",
        batch_dtype: str = "float32",
        global_fields: Any = None,
        alive: Any = False,
        parallel_gather: Any = False,
    ) -> tuple[BufferConfig, Sampler]:
        """The constructor's arguments checked (``TypeError``/``ValueError`` naming the
        argument, the value and the fix), with the defaults filled in (``Uniform()``, one
        trainer per agent): the config, and the sampler itself (a new ``Uniform`` for
        ``None``). ``parallel_gather`` is checked but is not part of the config."""
        specs = normalize_specs(specs)
        if next_obs not in NEXT_OBS_CHOICES:
            raise ValueError(
                f"next_obs must be one of {NEXT_OBS_CHOICES}; got next_obs={next_obs!r}"
            )
        fields, alive = check_row_options(specs, global_fields, alive)
        capacity = check_capacity(capacity)
        if sampler is None:
            sampler = Uniform()
        if not isinstance(sampler, Sampler):
            raise TypeError(
                "sampler must be a marlbuf.samplers.Sampler (e.g. Uniform(), Neighbor(64)); "
                f"got sampler={sampler!r}"
            )
        if n_trainers is None:
            n_trainers = len(specs)
        if isinstance(n_trainers, bool) or not isinstance(n_trainers, (int, np.integer)):
            raise TypeError(f"n_trainers must be an int; got n_trainers={n_trainers!r}")
        if n_trainers < 1:
            raise ValueError(f"n_trainers must be >= 1; got n_trainers={n_trainers}")
        if not isinstance(parallel_gather, (bool, np.bool_)):
            raise TypeError(
                f"parallel_gather must be a bool; got parallel_gather={parallel_gather!r}"
            )
        if layout not in LAYOUTS:
            raise ValueError(
                f"layout must be one of ['agent_major', 'interleaved']; got layout={layout!r}"
            )
        config = cls(
            specs=specs,
            capacity=capacity,
            layout=layout,
            next_obs=next_obs,
            sampler_type=type(sampler).__name__,
            sampler_config=sampler.config(),
            n_trainers=int(n_trainers),
            global_fields=fields,
            alive=alive,
            batch_layout=batch_layout,
            batch_dtype=batch_dtype,
        )
        return config, sampler

    def initial_next_obs(self) -> str:
        """The format a new buffer of this configuration stores from the start: ``next_obs``,
        or for ``"auto"`` the format it assumes until its first write decides: ``"stored"``
        where a lean interleaved row takes as many bytes as a dense one (rows padded to cache
        lines: tiny observations), else ``"once"``."""
        if self.next_obs != "auto":
            return self.next_obs
        if self.layout == "interleaved":
            options: dict[str, Any] = {"global_fields": self.global_fields, "alive": self.alive}
            lean = estimate(self.specs, 1, self.layout, "once", **options).table_row_bytes
            dense = estimate(self.specs, 1, "interleaved", "stored", **options).table_row_bytes
            if lean >= dense:
                return "stored"
        return "once"

    def check_trainer(self, trainer: Any) -> int:
        """``trainer`` as a buffer's methods check it (:func:`check_trainer`)."""
        return check_trainer(trainer, self.n_trainers)

    def check_n_trainers(self, n_trainers: Any) -> int:
        """``n_trainers`` of a round as ``sample_for_trainers`` checks it
        (:func:`check_n_trainers`)."""
        return check_n_trainers(n_trainers, self.n_trainers)

    def sampler(self) -> Sampler:
        """A new sampler of this configuration (no state)."""
        return Sampler.from_config(self.sampler_type, self.sampler_config)

    def to_dict(self, batch_options: bool = True) -> dict[str, Any]:
        """The JSON-safe configuration: a saved state's header (``batch_options=False``: the
        batch layout and dtype are runtime choices there) or a mapped folder's manifest."""
        out: dict[str, Any] = {
            "specs": {a: s.to_dict() for a, s in self.specs.items()},
            "capacity": self.capacity,
            "layout": self.layout,
            "next_obs": self.next_obs,
            "global_fields": {name: fs.to_dict() for name, fs in self.global_fields.items()},
            "alive": self.alive,
            "n_trainers": self.n_trainers,
            "sampler": {"type": self.sampler_type, "config": self.sampler_config},
        }
        if batch_options:
            out["batch_layout"] = self.batch_layout
            out["batch_dtype"] = self.batch_dtype
        return out

    @classmethod
    def from_dict(
        cls, header: Mapping[str, Any], capacity_key: str = "capacity", strict: bool = False
    ) -> BufferConfig:
        """The configuration :meth:`to_dict` wrote (a saved state's header, a manifest, a
        sharded buffer's config, whose capacity is ``capacity_key``), read as the version
        that wrote it had it: a header without ``next_obs`` (format version 1) stored it,
        one without ``global_fields``/``alive`` (before version 3) had none; ``batch_layout``
        and ``batch_dtype`` default to ``"rows"`` and ``"float32"``.

        The values are parsed, not checked against each other (:meth:`checked` does that, as
        the constructor would). A missing or malformed entry raises ``KeyError``,
        ``TypeError``, ``AttributeError`` or ``ValueError``: the caller says which file or
        state it was. ``strict``: the capacity and ``n_trainers`` must be ints as written
        (``ValueError`` naming the entry), not values the constructor would convert, every
        entry this version writes must be present, and the sampler must build."""
        specs = {a: AgentSpec.from_dict(s) for a, s in header["specs"].items()}
        capacity, n_trainers = header[capacity_key], header["n_trainers"]
        sampler = header["sampler"]
        if strict:
            Sampler.from_config(sampler["type"], sampler["config"])
            for key in ("layout", "next_obs", "batch_layout", "batch_dtype"):
                header[key]  # every entry present, as this version writes them
            for key, value in ((capacity_key, capacity), ("n_trainers", n_trainers)):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{key}={value!r} (expected an int)")
        global_fields, alive = row_options_of(header)
        return cls(
            specs=specs,
            capacity=capacity,
            layout=header["layout"],
            next_obs=header.get("next_obs", "stored"),
            sampler_type=sampler["type"],
            sampler_config=sampler["config"],
            n_trainers=n_trainers,
            global_fields=global_fields,
            alive=alive,
            batch_layout=header.get("batch_layout", "rows"),
            batch_dtype=header.get("batch_dtype", "float32"),
        )

    def checked(self, parallel_gather: Any = False) -> tuple[BufferConfig, Sampler]:
        """This configuration checked as the constructor checks its arguments (see
        :meth:`from_arguments`), with a new sampler."""
        return BufferConfig.from_arguments(
            self.specs,
            self.capacity,
            self.layout,
            self.sampler(),
            self.n_trainers,
            self.next_obs,
            self.batch_layout,
            self.batch_dtype,
            self.global_fields,
            self.alive,
            parallel_gather,
        )


__all__ = [
    "LAYOUTS",
    "NEXT_OBS_CHOICES",
    "NEXT_OBS_MODES",
    "BufferConfig",
    "check_n_trainers",
    "check_trainer",
    "make_rng",
]
