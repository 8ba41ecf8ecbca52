"""Plans: which buffer field each leaf of a vault holds, and how per-agent fields are packed
into leaves.

A :class:`Plan` maps a vault's leaves to one buffer's fields (and gives the buffer's specs):
OG-MARL's keys by default (:data:`DEFAULT_KEYS`), ``keys=`` for others, and for a vault marlbuf
wrote its ``"marlbuf"`` entry, checked against its leaves. :class:`Packing` stacks the agents of
one per-agent field into one leaf (flattened and zero-padded when their shapes differ), and
:func:`buffer_leaves` lists the leaves a buffer is written as. The entry's format and the names
of marlbuf's private arrays are here too, shared by reading, writing and the recorder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlbuf.offline.vault import PRIVATE_ROOT, LeafSpec, VaultError, VaultInfo, VaultReader
from marlbuf.spec import AgentSpec, FieldSpec

#: OG-MARL's leaves and the marlbuf field each holds (see :mod:`marlbuf.offline.read`).
DEFAULT_KEYS: dict[str, str | None] = {
    "observations": "obs",
    "actions": "action",
    "rewards": "reward",
    "terminals": "done",
    "truncations": "truncated",
    "infos.legals": "extra:legals",
    "infos.state": "global:state",
    "infos.alive": "alive",
}

#: The ``"marlbuf"`` entry of ``metadata.json``: its format name and version.
ENTRY_FORMAT = "marlbuf-vault"
ENTRY_VERSION = 1
#: Private arrays: the next observations that are not the following step's (rows of the
#: observations leaf's shape) and where they belong (stream, step); each step's stream.
NEXT_OBS = PRIVATE_ROOT + ".next_obs."
NEXT_OBS_AT = PRIVATE_ROOT + ".next_obs_at."
STREAMS = PRIVATE_ROOT + ".stream."

_ROLES = ("obs", "action", "reward", "done", "truncated", "alive")


# ------------------------------------------------------------------------------ packing
@dataclass(frozen=True)
class Packing:
    """How one per-agent field of every agent sits in one leaf of step shape ``(N, *E)``:
    stacked when every agent has the same shape, else flattened and zero-padded to the widest.

    Attributes
    ----------
    shapes : tuple of tuple of int
        Per agent, the item shape.
    dtypes : tuple of numpy dtype
        Per agent, the dtype.
    step_shape : tuple of int
        ``(N, *E)``.
    dtype : numpy dtype
        The leaf's: NumPy's common type of the agents' (each converts back exactly).
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    step_shape: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def of(cls, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any]) -> Packing:
        shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        dtypes = tuple(np.dtype(d) for d in dtypes)
        common = np.result_type(*dtypes)
        if len(set(shapes)) == 1:
            return cls(shapes, dtypes, (len(shapes), *shapes[0]), common)
        width = max(math.prod(s) for s in shapes)
        return cls(shapes, dtypes, (len(shapes), width), common)

    @property
    def padded(self) -> bool:
        return len(set(self.shapes)) > 1

    def pack(self, arrays: Sequence[np.ndarray], out: np.ndarray) -> None:
        """Per agent ``(n, *shape)`` into ``out`` of shape ``(n, N, *E)``."""
        if not self.padded:
            for i, arr in enumerate(arrays):
                out[:, i] = arr
            return
        out[...] = 0
        for i, arr in enumerate(arrays):
            out[:, i, : math.prod(self.shapes[i])] = arr.reshape(len(arr), -1)

    def pack_field(self, batch: Any, name: str, out: np.ndarray, rows: int) -> None:
        """The first ``rows`` rows of every agent's ``name`` in ``batch`` into ``out`` of
        shape ``(rows, N, *E)``: agents of one shape by one copy of ``batch.concat(name)``
        (a view of the gathered rows, every agent side by side), else agent by agent."""
        if self.padded:
            self.pack([v[:rows] for v in batch.field(name).values()], out)
            return
        joined = batch.concat(name)[:rows]
        np.copyto(out, joined.reshape(out.shape), casting="same_kind")

    def unpack(self, leaf: np.ndarray, exact: bool) -> list[np.ndarray]:
        """``leaf`` of shape ``(n, N, *E)`` as per-agent ``(n, *shape)`` arrays (views where
        possible); with ``exact`` each in its agent's dtype."""
        n = leaf.shape[0]
        out = []
        for i, (shape, dtype) in enumerate(zip(self.shapes, self.dtypes)):
            part = leaf[:, i]
            if self.padded:
                part = part[:, : math.prod(shape)].reshape(n, *shape)
            out.append(part.astype(dtype, copy=False) if exact else part)
        return out


def broadcast(leaf: np.ndarray, n_agents: int) -> np.ndarray:
    """A per-agent scalar leaf part ``(n, N)``, or a team one ``(n,)`` given to every agent."""
    return leaf if leaf.ndim == 2 else np.broadcast_to(leaf[:, None], (leaf.shape[0], n_agents))


# ------------------------------------------------------------------------------ plans
@dataclass
class Plan:
    """How a vault's leaves become one buffer's fields (and the buffer's specs)."""

    agents: list[str]
    specs: dict[str, AgentSpec]
    global_fields: dict[str, FieldSpec]
    alive: bool
    #: leaf key -> role ("obs", ..., "extra:NAME", "global:NAME"); leaves left out are absent
    roles: dict[str, str]
    #: leaf key -> its packing, for per-agent roles
    packings: dict[str, Packing]
    #: whether actions are stored as indices (discrete agents)
    action_index: bool
    #: the vault's "marlbuf" entry when it is read as written (exact round trip)
    entry: dict[str, Any] | None = None

    def key_of(self, role: str) -> str | None:
        return next((k for k, r in self.roles.items() if r == role), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "agents": self.agents,
            "specs": {a: s.to_dict() for a, s in self.specs.items()},
            "global_fields": {n: f.to_dict() for n, f in self.global_fields.items()},
            "alive": self.alive,
            "roles": self.roles,
        }


def buffer_leaves(
    specs: Mapping[str, AgentSpec],
    global_fields: Mapping[str, FieldSpec],
    alive: bool,
    action_index: bool,
) -> dict[str, tuple[str, LeafSpec, Packing | None]]:
    """The leaves a buffer of these options is written as: key -> (role, spec, packing)."""
    agents = list(specs)
    sp = [specs[a] for a in agents]
    n = len(agents)

    def per_agent(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any]) -> Packing:
        return Packing.of(shapes, dtypes)

    out: dict[str, tuple[str, LeafSpec, Packing | None]] = {}
    obs = per_agent([s.obs_shape for s in sp], [s.obs_dtype for s in sp])
    out["observations"] = ("obs", LeafSpec(obs.step_shape, obs.dtype), obs)
    if action_index:
        idx = Packing.of([()] * n, [np.int32] * n)
        out["actions"] = ("action", LeafSpec((n,), np.dtype(np.int32)), idx)
    else:
        act = per_agent([s.action_shape for s in sp], [s.action_dtype for s in sp])
        out["actions"] = ("action", LeafSpec(act.step_shape, act.dtype), act)
    rew = per_agent([()] * n, [s.reward_dtype for s in sp])
    out["rewards"] = ("reward", LeafSpec((n,), rew.dtype), rew)
    done = per_agent([()] * n, [s.done_dtype for s in sp])
    out["terminals"] = ("done", LeafSpec((n,), done.dtype), done)
    out["truncations"] = ("truncated", LeafSpec((n,), np.dtype(np.float32)), None)
    for name in sp[0].extras:
        fields = [s.extras[name] for s in sp]
        pk = per_agent([f.shape for f in fields], [f.dtype for f in fields])
        out[f"infos.{name}"] = (f"extra:{name}", LeafSpec(pk.step_shape, pk.dtype), pk)
    for name, field in global_fields.items():
        out[f"infos.{name}"] = (f"global:{name}", LeafSpec(field.shape, field.dtype), None)
    if alive:
        out["infos.alive"] = ("alive", LeafSpec((n,), np.dtype(np.bool_)), None)
    return out


def read_entry(info: VaultInfo) -> dict[str, Any] | None:
    entry = info.metadata.get("marlbuf")
    if entry is None:
        return None
    if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT:
        raise VaultError(f"vault {str(info.path)!r}: its 'marlbuf' entry is not marlbuf's")
    if entry.get("version") != ENTRY_VERSION:
        raise VaultError(
            f"vault {str(info.path)!r} was written by a marlbuf whose vault entry has version "
            f"{entry.get('version')!r}; this marlbuf reads version {ENTRY_VERSION}"
        )
    return entry


def plan_written(info: VaultInfo, entry: Mapping[str, Any], agents: Any) -> Plan:
    """The plan of a vault written by :func:`write_vault` (or the recorder), checked against
    its leaves."""
    where = f"vault {str(info.path)!r}"
    try:
        names = [str(a) for a in entry["agents"]]
        specs = {a: AgentSpec.from_dict(entry["specs"][a]) for a in names}
        global_fields = {
            n: FieldSpec.from_dict(f) for n, f in dict(entry.get("global_fields", {})).items()
        }
        alive = bool(entry.get("alive", False))
        action_index = bool(entry["action_index"])
    except (KeyError, TypeError, ValueError) as exc:
        raise VaultError(f"{where}: its 'marlbuf' entry is damaged ({exc!r})") from exc
    layout = buffer_leaves(specs, global_fields, alive, action_index)
    for key, (_, spec, _) in layout.items():
        leaf = info.leaves.get(key)
        if leaf is None or leaf.step_shape != spec.step_shape or leaf.dtype != spec.dtype:
            found = "missing" if leaf is None else f"{leaf.step_shape} {leaf.dtype}"
            raise VaultError(
                f"{where}: leaf {key!r} does not hold what its 'marlbuf' entry says "
                f"(expected {spec.step_shape} {spec.dtype}, found {found})"
            )
    extra = sorted(set(info.leaves) - set(layout))
    if extra:
        raise VaultError(f"{where}: leaves {extra} are not in its 'marlbuf' entry")
    renamed = _agent_names(agents, len(names), where) if agents is not None else names
    specs = dict(zip(renamed, specs.values()))
    return Plan(
        renamed,
        specs,
        global_fields,
        alive,
        {k: role for k, (role, _, _) in layout.items()},
        {k: pk for k, (_, _, pk) in layout.items() if pk is not None},
        action_index,
        dict(entry),
    )


def _agent_names(agents: Any, n: int, where: str) -> list[str]:
    if isinstance(agents, str) or not isinstance(agents, Sequence):
        raise TypeError(f"agents must be a sequence of names; got agents={agents!r}")
    names = [a for a in agents]
    if len(names) != n or len(set(names)) != n or not all(isinstance(a, str) and a for a in names):
        raise ValueError(
            f"agents must name the {n} agents of {where} (distinct non-empty strings); "
            f"got agents={agents!r}"
        )
    return names


def _roles(info: VaultInfo, keys: Mapping[str, Any] | None) -> dict[str, str]:
    mapping: dict[str, Any] = dict(DEFAULT_KEYS)
    if keys is not None:
        if not isinstance(keys, Mapping):
            raise TypeError(f"keys must be a mapping {{vault key: field}}; got keys={keys!r}")
        mapping.update(keys)
    roles: dict[str, str] = {}
    for key, leaf in info.leaves.items():
        if key not in mapping:
            kind = "per agent" if len(leaf.step_shape) >= 1 else "one per step"
            raise ValueError(
                f"vault leaf {key!r} (step shape {leaf.step_shape}, {leaf.dtype}, {kind}?) has "
                f"no marlbuf field: map it with keys={{{key!r}: 'extra:NAME'}} (per agent), "
                f"'global:NAME' (one per step), 'alive', or None to leave it out"
            )
        role = mapping[key]
        if role is None:
            continue
        if not isinstance(role, str) or not (
            role in _ROLES or role.startswith(("extra:", "global:"))
        ):
            raise ValueError(
                f"keys[{key!r}] must be one of {list(_ROLES)}, 'extra:NAME', 'global:NAME' or "
                f"None; got {role!r}"
            )
        if role in roles.values() and not role.startswith(("extra:", "global:")):
            other = next(k for k, r in roles.items() if r == role)
            raise ValueError(f"vault leaves {other!r} and {key!r} both map to {role!r}")
        roles[key] = role
    for role in ("obs", "action", "reward", "done"):
        if role not in roles.values():
            raise ValueError(
                f"no vault leaf holds {role!r} (the vault's leaves: {sorted(info.leaves)}); "
                f"map one with keys={{KEY: {role!r}}}"
            )
    return roles


def _max_action(info: VaultInfo, key: str, chunk_steps: int) -> int:
    reader = VaultReader(info, [key])
    top = -1
    for t0 in range(0, info.steps, chunk_steps):
        values = reader.read(t0, min(info.steps, t0 + chunk_steps))[key]
        if values.size:
            top = max(top, int(values.max()))
    return top + 1


def plan_foreign(info: VaultInfo, keys: Any, agents: Any, n_actions: Any, chunk_steps: int) -> Plan:
    """The plan of any vault whose leaves map to fields by ``keys`` (OG-MARL's by default)."""
    where = f"vault {str(info.path)!r}"
    roles = _roles(info, keys)
    by_role = {r: k for k, r in roles.items()}
    obs = info.leaves[by_role["obs"]]
    if not obs.step_shape:
        raise ValueError(f"{where}: leaf {obs.key!r} has no agent axis (expected (B, T, N, ...))")
    n = obs.step_shape[0]
    names = [f"agent_{i}" for i in range(n)] if agents is None else _agent_names(agents, n, where)

    def per_agent(key: str, scalar: bool) -> Any:
        leaf = info.leaves[key]
        if scalar and leaf.step_shape in ((), (n,)):
            return leaf
        if not leaf.step_shape or leaf.step_shape[0] != n:
            raise ValueError(
                f"{where}: leaf {key!r} has step shape {leaf.step_shape}, but the agent axis "
                f"of {obs.key!r} holds {n} agents (expected ({n}, ...))"
            )
        return leaf

    for role in ("reward", "done", "truncated", "alive"):
        if role in by_role:
            per_agent(by_role[role], scalar=role != "alive")
    action = per_agent(by_role["action"], scalar=False)
    extras: dict[str, FieldSpec] = {}
    global_fields: dict[str, FieldSpec] = {}
    for key, role in roles.items():
        kind, _, name = role.partition(":")
        leaf = info.leaves[key]
        if kind == "extra":
            per_agent(key, scalar=False)
            extras[name] = FieldSpec(leaf.step_shape[1:], leaf.dtype)
        elif kind == "global":
            global_fields[name] = FieldSpec(leaf.step_shape, leaf.dtype)
    action_index = action.step_shape == (n,) and action.dtype.kind in "iub"
    if action_index:
        if n_actions is None and "extra:legals" in roles.values():
            n_actions = info.leaves[by_role["extra:legals"]].step_shape[-1]
        if n_actions is None:
            n_actions = max(1, _max_action(info, action.key, chunk_steps))
        if isinstance(n_actions, bool) or not isinstance(n_actions, (int, np.integer)):
            raise TypeError(f"n_actions must be an int; got n_actions={n_actions!r}")
        k = int(n_actions)
        specs = {
            a: AgentSpec(
                obs.step_shape[1:],
                (k,),
                obs_dtype=obs.dtype,
                n_discrete_actions=k,
                reward_dtype=_scalar_dtype(info, by_role["reward"]),
                done_dtype=_scalar_dtype(info, by_role["done"]),
                extras=extras,
            )
            for a in names
        }
    else:
        if action.dtype.kind not in "iuf":
            raise ValueError(f"{where}: leaf {action.key!r} of dtype {action.dtype} is no action")
        specs = {
            a: AgentSpec(
                obs.step_shape[1:],
                action.step_shape[1:],
                obs_dtype=obs.dtype,
                action_dtype=action.dtype,
                reward_dtype=_scalar_dtype(info, by_role["reward"]),
                done_dtype=_scalar_dtype(info, by_role["done"]),
                extras=extras,
            )
            for a in names
        }
    packings = {}
    for key, role in roles.items():
        leaf = info.leaves[key]
        if role in ("obs", "action") or role.startswith("extra:"):
            shape = leaf.step_shape[1:]
            packings[key] = Packing(
                tuple([shape] * n), tuple([leaf.dtype] * n), leaf.step_shape, leaf.dtype
            )
    return Plan(
        names, specs, global_fields, "alive" in by_role, roles, packings, action_index, None
    )


def _scalar_dtype(info: VaultInfo, key: str) -> np.dtype:
    return info.leaves[key].dtype
