"""What one agent stores per transition, and how agents' fields are laid out."""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The per-agent fields of a transition, in storage order. ``add``/``extend`` take these as
#: keyword arguments and ``Batch`` exposes them as attributes.
FIELDS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "done")

#: The row field holding the alive mask (one bool per agent) of a buffer built with
#: ``alive=True``.
ALIVE = "alive"

#: The agent key of a global field's slot in a row (agent names are non-empty strings, so it
#: never collides with an agent).
GLOBAL = ""

#: Names an extra or global field may not take: the fields and keyword arguments of
#: ``add``/``extend``/``add_envs``, and the attributes of sampled batches.
RESERVED_NAMES = frozenset(
    {
        *FIELDS,
        ALIVE,
        "stream",
        "first_stream",
        "truncated",
        "indices",
        "generations",
        "weights",
        "trainer",
        "block",
        "extras",
        "globals",
        "agents",
        "field",
        "as_lists",
        "concat",
        "to_torch",
        "mask",
        "burn_in",
        "slots",
    }
)


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape
    ):
        raise ValueError(
            f"{name} must be a tuple of positive ints (e.g. (18,)); got {name}={shape!r}"
        )
    return tuple(int(d) for d in shape)


def _check_dtype(name: str, dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name} must be a NumPy dtype; got {name}={dtype!r}") from exc
    if dt.kind not in "biuf" or dt.itemsize > 8:
        raise TypeError(
            f"{name} must be a bool, integer or float dtype of at most 8 bytes; got {name}={dt}"
        )
    return dt


@dataclass(frozen=True)
class FieldSpec:
    """Shape and dtype of one extra field: a per-agent extra (``AgentSpec(extras=...)``) or a
    global field (``MultiAgentReplayBuffer(global_fields=...)``).

    Parameters
    ----------
    shape : tuple of int
        Shape of one item (one agent's, or the global one, at one timestep); ``()`` for a
        scalar, an int ``n`` for ``(n,)``.
    dtype : dtype, default float32
        Storage dtype: bool, integer or float of at most 8 bytes (float16 is stored half and,
        like observations, delivered as float32 unless ``batch_dtype="storage"``). Inputs are
        cast with NumPy's ``same_kind`` rule; integers out of the stored range, and float values
        beyond the stored float range, are refused.

    Examples
    --------
    >>> FieldSpec((64,)).dtype, FieldSpec(5, np.bool_).shape
    (dtype('float32'), (5,))
    """

    shape: tuple[int, ...]
    dtype: Any = np.float32

    def __post_init__(self) -> None:
        shape = self.shape
        if isinstance(shape, (tuple, list)) and len(shape) == 0:
            shape = ()  # a scalar per step
        else:
            shape = check_shape("shape", shape)
        object.__setattr__(self, "shape", tuple(shape))
        object.__setattr__(self, "dtype", _check_dtype("dtype", self.dtype))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-safe), the inverse of :meth:`from_dict`."""
        return {"shape": list(self.shape), "dtype": self.dtype.str}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FieldSpec:
        """Rebuild a field spec from :meth:`to_dict` output."""
        return cls(tuple(data["shape"]), np.dtype(data["dtype"]))


def check_field_name(kind: str, name: Any) -> str:
    """``name`` if it may name an extra or global field (an identifier that is not reserved)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(
            f"{kind} names must be Python identifiers (they are keyword arguments of add); "
            f"got {name!r}"
        )
    if name.startswith("_") or name in RESERVED_NAMES:
        raise ValueError(
            f"{kind} name {name!r} is reserved (taken by a transition field, an argument of "
            f"add/extend, or a Batch attribute; names may not start with '_'); reserved: "
            f"{sorted(RESERVED_NAMES)}"
        )
    return name


def check_fields(kind: str, fields: Any) -> dict[str, FieldSpec]:
    """``fields`` (a mapping name -> FieldSpec, or None) validated, as an ordered dict."""
    if fields is None:
        return {}
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"{kind} must be a mapping {{name: FieldSpec}}; got {type(fields).__name__}"
        )
    out: dict[str, FieldSpec] = {}
    for name, fs in fields.items():
        check_field_name(kind, name)
        if not isinstance(fs, FieldSpec):
            raise TypeError(
                f"{kind}[{name!r}] must be a FieldSpec (e.g. FieldSpec((64,))); got {fs!r}"
            )
        out[name] = fs
    return out


@dataclass(frozen=True)
class AgentSpec:
    """Shapes and dtypes of one agent's transition fields.

    Parameters
    ----------
    obs_shape : tuple of int
        Shape of one observation (``next_obs`` has the same shape), e.g. ``(18,)``.
    action_shape : tuple of int
        Shape of one action, e.g. ``(5,)`` for MPE's continuous/Gumbel-softmax actions.
    obs_dtype, action_dtype : dtype, default float32
        Storage dtypes. Inputs are cast with NumPy's ``same_kind`` rule (float64 -> float32 is
        accepted, float -> int is a ``TypeError``).
    n_discrete_actions : int, optional
        Set for a ``Discrete(n)`` action space: actions are stored **one-hot** as ``(n,)``
        float32 (what MADDPG's critics consume), and ``add`` also accepts the integer index.
    reward_dtype, done_dtype : dtype, default float32
        Storage dtypes of the per-agent reward and done scalars. float32 is what trainers
        consume; the drop-in adapters (:mod:`marlbuf.compat`) set float64 to return exactly what
        the original buffers return for Python-float rewards.
    extras : mapping of str to FieldSpec, optional
        Extra per-agent fields stored with every step (recurrent hidden states, action masks),
        e.g. ``{"hidden": FieldSpec((64,)), "avail_actions": FieldSpec((5,), np.bool_)}``.
        ``add`` takes them as keyword arguments (``hidden={agent: array}``) and batches hold
        them in ``batch.extras[name][agent]`` with shape ``(B, *shape)``. Every agent of a
        buffer must declare the same names (shapes and dtypes may differ). They are per step:
        there is no ``next_`` copy.

    Examples
    --------
    >>> AgentSpec(obs_shape=(18,), action_shape=(5,)).obs_dim
    18
    """

    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    obs_dtype: Any = np.float32
    action_dtype: Any = np.float32
    n_discrete_actions: int | None = None
    reward_dtype: Any = np.float32
    done_dtype: Any = np.float32
    extras: Any = field(default=None, hash=False)
    _dtypes: dict[str, np.dtype] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "obs_shape", check_shape("obs_shape", self.obs_shape))
        object.__setattr__(self, "action_shape", check_shape("action_shape", self.action_shape))
        obs_dt = _check_dtype("obs_dtype", self.obs_dtype)
        act_dt = _check_dtype("action_dtype", self.action_dtype)
        object.__setattr__(self, "obs_dtype", obs_dt)
        object.__setattr__(self, "action_dtype", act_dt)
        rew_dt = _check_dtype("reward_dtype", self.reward_dtype)
        done_dt = _check_dtype("done_dtype", self.done_dtype)
        object.__setattr__(self, "reward_dtype", rew_dt)
        object.__setattr__(self, "done_dtype", done_dt)
        if self.n_discrete_actions is not None:
            n = self.n_discrete_actions
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"n_discrete_actions must be a positive int; got {n!r}")
            if self.action_shape != (int(n),) or act_dt.kind != "f":
                raise ValueError(
                    "a discrete action is stored one-hot: action_shape must be "
                    f"({n},) with a float action_dtype; got action_shape={self.action_shape}, "
                    f"action_dtype={act_dt}"
                )
        extras = check_fields("extras", self.extras)
        object.__setattr__(self, "extras", extras)
        dtypes = {
            "obs": obs_dt,
            "action": act_dt,
            "reward": rew_dt,
            "next_obs": obs_dt,
            "done": done_dt,
            **{name: fs.dtype for name, fs in extras.items()},
        }
        object.__setattr__(self, "_dtypes", dtypes)

    @property
    def obs_dim(self) -> int:
        """Number of scalars in one observation."""
        return math.prod(self.obs_shape)

    @property
    def action_dim(self) -> int:
        """Number of scalars in one action."""
        return math.prod(self.action_shape)

    def shape(self, field_name: str) -> tuple[int, ...]:
        """Shape of one item of ``field_name`` (one of :data:`FIELDS` or an extra's name)."""
        if field_name in ("obs", "next_obs"):
            return self.obs_shape
        if field_name == "action":
            return self.action_shape
        if field_name in ("reward", "done"):
            return ()
        if field_name in self.extras:
            return self.extras[field_name].shape
        raise ValueError(
            f"field must be one of {(*FIELDS, *self.extras)}; got field={field_name!r}"
        )

    def dtype(self, field_name: str) -> np.dtype:
        """Storage dtype of ``field_name``."""
        if field_name not in self._dtypes:
            raise ValueError(
                f"field must be one of {(*FIELDS, *self.extras)}; got field={field_name!r}"
            )
        return self._dtypes[field_name]

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-safe), the inverse of :meth:`from_dict`."""
        return {
            "obs_shape": list(self.obs_shape),
            "action_shape": list(self.action_shape),
            "obs_dtype": self.obs_dtype.str,
            "action_dtype": self.action_dtype.str,
            "n_discrete_actions": self.n_discrete_actions,
            "reward_dtype": self.reward_dtype.str,
            "done_dtype": self.done_dtype.str,
            # only when declared: the dict of a spec without extras is that of earlier versions
            **(
                {"extras": {n: fs.to_dict() for n, fs in self.extras.items()}}
                if self.extras
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentSpec:
        """Rebuild a spec from :meth:`to_dict` output."""
        return cls(
            obs_shape=tuple(data["obs_shape"]),
            action_shape=tuple(data["action_shape"]),
            obs_dtype=np.dtype(data["obs_dtype"]),
            action_dtype=np.dtype(data["action_dtype"]),
            n_discrete_actions=data.get("n_discrete_actions"),
            reward_dtype=np.dtype(data.get("reward_dtype", "<f4")),
            done_dtype=np.dtype(data.get("done_dtype", "<f4")),
            extras={n: FieldSpec.from_dict(fs) for n, fs in data.get("extras", {}).items()},
        )

    @classmethod
    def from_spaces(cls, observation_space: Any, action_space: Any) -> AgentSpec:
        """Build a spec from Gymnasium spaces (duck-typed; Gymnasium is not imported).

        ``Box`` observations keep their shape and are stored float32. ``Box`` actions are stored
        float32 with their shape; ``Discrete(n)`` actions are stored one-hot as ``(n,)`` float32
        (see ``n_discrete_actions``).
        """
        obs_kind = type(observation_space).__name__
        if obs_kind != "Box" or getattr(observation_space, "shape", None) is None:
            raise TypeError(
                f"observation_space must be a Box space; got {observation_space!r}. "
                "Flatten other spaces first (gymnasium.spaces.flatten_space)."
            )
        act_kind = type(action_space).__name__
        if act_kind == "Box":
            return cls(obs_shape=tuple(observation_space.shape), action_shape=action_space.shape)
        if act_kind == "Discrete":
            n = int(action_space.n)
            return cls(
                obs_shape=tuple(observation_space.shape), action_shape=(n,), n_discrete_actions=n
            )
        raise TypeError(f"action_space must be a Box or Discrete space; got {action_space!r}")


def specs_from_env(env: Any, agents: Sequence[str] | None = None) -> dict[str, AgentSpec]:
    """Specs for every agent of a PettingZoo (parallel or AEC) environment, in agent order.

    Parameters
    ----------
    env : PettingZoo environment
        Anything with ``observation_space(agent)`` and ``action_space(agent)`` methods and a
        ``possible_agents`` (or ``agents``) list.
    agents : sequence of str, optional
        Which agents, in which order; defaults to ``env.possible_agents``.
    """
    if agents is None:
        agents = getattr(env, "possible_agents", None) or getattr(env, "agents", None)
    if not agents:
        raise ValueError(f"env has no agents (possible_agents is empty); got env={env!r}")
    return {a: AgentSpec.from_spaces(env.observation_space(a), env.action_space(a)) for a in agents}


def normalize_specs(specs: Any) -> dict[str, AgentSpec]:
    """Validate ``specs`` (a mapping agent name -> AgentSpec) and return an ordered dict."""
    if not isinstance(specs, Mapping):
        raise TypeError(
            "specs must be a mapping {agent_name: AgentSpec}; "
            f"got specs of type {type(specs).__name__}"
        )
    if not specs:
        raise ValueError("specs must name at least one agent; got specs={}")
    out: dict[str, AgentSpec] = {}
    for name, spec in specs.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"agent names must be non-empty strings; got {name!r}")
        if not isinstance(spec, AgentSpec):
            raise TypeError(f"specs[{name!r}] must be an AgentSpec; got {type(spec).__name__}")
        out[name] = spec
    first = next(iter(out))
    for name, spec in out.items():
        if set(spec.extras) != set(out[first].extras):
            raise ValueError(
                "every agent must declare the same extra fields (shapes and dtypes may "
                f"differ): {first!r} declares {sorted(out[first].extras)}, {name!r} declares "
                f"{sorted(spec.extras)}"
            )
    return out


def extra_names(specs: Mapping[str, AgentSpec]) -> tuple[str, ...]:
    """The per-agent extra fields of ``specs``, in the first agent's declaration order."""
    return tuple(next(iter(specs.values())).extras) if specs else ()


def row_fields(specs: Mapping[str, AgentSpec], lean: bool = False) -> tuple[str, ...]:
    """The per-agent fields of a row in storage order: :data:`FIELDS` (without ``next_obs``
    for the lean row of observations stored once), then the extras."""
    core = tuple(f for f in FIELDS if not (lean and f == "next_obs"))
    return core + extra_names(specs)


@dataclass(frozen=True)
class FieldSlot:
    """Where one agent's field lives inside an interleaved row."""

    agent: str
    field: str
    offset: int  # byte offset inside the row
    nbytes: int
    shape: tuple[int, ...]
    dtype: np.dtype


#: The ``next_obs`` and ``done`` sections of a row start on a multiple of this many bytes (the
#: largest itemsize). So the next_obs section has exactly the internal layout of the ``obs``
#: section (which starts at byte 0): a slot's next observation is copied from its successor's
#: ``obs`` section as one span of words (observations stored once), and the sections that move
#: between the dense and the lean row are whole words.
SECTION_ALIGN = 8


def interleaved_row_layout(
    specs: Mapping[str, AgentSpec],
    row_align: int,
    fields: Sequence[str] | None = None,
    section_align: int = SECTION_ALIGN,
    global_fields: Mapping[str, FieldSpec] | None = None,
    alive: bool = False,
) -> tuple[list[FieldSlot], int]:
    """Byte offsets of every (field, agent) inside one interleaved row.

    The row is **field-major**: every agent's ``obs``, then every agent's ``action``, then
    rewards, next observations and dones, then each per-agent extra field (all agents), each
    global field (one slot, agent :data:`GLOBAL`) and, with ``alive``, one bool per agent
    (field :data:`ALIVE`). So the centralized critic's input (all observations, then all
    actions) is one contiguous slice of a gathered row when the dtypes agree, and a row
    without extras is laid out exactly as before extras existed. Each field starts at a
    multiple of its itemsize, the ``next_obs`` and ``done`` sections at a multiple of
    :data:`SECTION_ALIGN`; the row is padded to ``row_align`` bytes. ``fields`` (default
    :func:`row_fields`) lays out a row without some fields (the lean row without ``next_obs``);
    ``section_align=1`` gives the layout of files written by marlbuf 0.1.

    Returns
    -------
    slots : list of FieldSlot
        In storage order.
    row_bytes : int
        Padded row width in bytes.
    """
    if fields is None:
        fields = row_fields(specs)
    slots: list[FieldSlot] = []
    offset = 0

    def place(agent: str, field_name: str, shape: tuple[int, ...], dt: np.dtype) -> None:
        nonlocal offset
        offset = -(-offset // dt.itemsize) * dt.itemsize  # align to the itemsize
        nbytes = math.prod(shape) * dt.itemsize
        slots.append(FieldSlot(agent, field_name, offset, nbytes, shape, dt))
        offset += nbytes

    for field_name in fields:
        if field_name in ("next_obs", "done"):
            offset = -(-offset // section_align) * section_align
        for agent, spec in specs.items():
            place(agent, field_name, spec.shape(field_name), spec.dtype(field_name))
    for name, fs in (global_fields or {}).items():
        place(GLOBAL, name, fs.shape, fs.dtype)
    if alive:
        for agent in specs:
            place(agent, ALIVE, (), np.dtype(np.bool_))
    row_bytes = -(-offset // row_align) * row_align  # pad to a whole number of cache lines
    return slots, row_bytes
