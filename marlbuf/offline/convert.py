"""Vaults into buffers and buffers into vaults: OG-MARL's keys as marlbuf's fields.

**Reading** (:func:`read_vault`). A vault's leaves are ``(B, T, ...)`` arrays; OG-MARL's map to a
buffer's fields as :data:`DEFAULT_KEYS` says:

==================  ==========================  =========================================
vault key           shape                       marlbuf
==================  ==========================  =========================================
``observations``    ``(B, T, N, *O)``           ``obs`` (and ``next_obs``, see below)
``actions``         ``(B, T, N)`` int           discrete: ``AgentSpec(n_discrete_actions=K)``
                    ``(B, T, N, *A)`` float     continuous actions
``rewards``         ``(B, T, N)`` or ``(B, T)``  ``reward`` (a team reward goes to every agent)
``terminals``       ``(B, T, N)`` or ``(B, T)``  ``done``
``truncations``     ``(B, T, N)`` or ``(B, T)``  where episodes end without termination
``infos.legals``    ``(B, T, N, K)``            the extra field ``legals`` (action masks)
``infos.state``     ``(B, T, *S)``              the global field ``state``
==================  ==========================  =========================================

Agents come from the ``N`` axis (named ``agent_0``, ... or as the caller says). Each of the
``B`` streams is written as its own buffer stream, in time order. A step ends its episode when
every agent is terminal or truncated; the buffer is told ``truncated`` where that happens
without every agent terminal. ``next_obs`` of a step is the following step's ``obs`` (so with
``next_obs="once"`` observations are stored once); a vault holds no observation after the last
step of an episode, or of a stream, so there ``next_obs`` repeats the step's own ``obs``. Any
other leaf needs a place: ``keys={"infos.mask": "extra:mask"}`` (per agent),
``"global:name"`` (one per step), ``"alive"`` (per-agent presence flags) or ``None`` (left
out); a leaf without one is a ``ValueError`` naming it.

**Writing** (:func:`write_vault`). A buffer is written oldest step first as one stream
(``B = 1``) with OG-MARL's keys (the leaves above; every per-agent field of agents whose shapes
differ flattened and zero-padded to the widest, as OG-MARL pads observations; discrete actions
as indices when every stored action is one-hot) and a ``"marlbuf"`` entry in ``metadata.json``
with the buffer's specs and options. Private arrays, which Flashbax never reads, hold what
OG-MARL's keys cannot: the true ``next_obs`` of every step whose ``next_obs`` is not the
following step's ``obs`` (episode ends), and each step's stream when the buffer's episodes
interleave (environments written in turn, ``add_envs``). Reading such a vault back gives the
same rows in the same order, the same episodes, masks and global state.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import heapq
import itertools
import json
import math
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.offline.vault import (
    PRIVATE_ROOT,
    PRIVATE_ROWS,
    LeafSpec,
    VaultError,
    VaultInfo,
    VaultReader,
    VaultWriter,
    read_private_meta,
    vault_info,
)
from marlbuf.spec import AgentSpec, FieldSpec

#: OG-MARL's leaves and the marlbuf field each holds (see the module docstring).
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
#: How much data one chunk of a conversion holds, in memory (uncompressed, every leaf).
DEFAULT_CHUNK_BYTES = 16 * 1024**2
#: Buffer rows gathered and written per append by :func:`write_vault`.
WRITE_CHUNK_BYTES = 64 * 1024**2
#: Vault data per ``extend`` call: staging rows of a few MiB stay in the caches (measured:
#: 8,192-step calls of 3-agent rows took 0.45x the time of 250,000-step calls).
EXTEND_BYTES = 2 * 1024**2
#: Rows of the private next-observation table read at a time.
SIDE_ROWS_PER_READ = 65_536
#: Name and version of the journal of a conversion into a memory-mapped buffer.
JOURNAL = "import.json"
JOURNAL_FORMAT = "marlbuf-vault-import"
#: The largest capacity a written vault's entry may ask for beyond four times its steps.
MAX_SPARE_CAPACITY = 10_000_000
#: Options of the buffer that :func:`read_vault` sets itself.
SET_BY_THE_VAULT = ("specs", "global_fields", "alive")

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


def _broadcast(leaf: np.ndarray, n_agents: int) -> np.ndarray:
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


def _entry(info: VaultInfo) -> dict[str, Any] | None:
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


def _plan_written(info: VaultInfo, entry: Mapping[str, Any], agents: Any) -> Plan:
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


def _plan_foreign(
    info: VaultInfo, keys: Any, agents: Any, n_actions: Any, chunk_steps: int
) -> Plan:
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


# ------------------------------------------------------------------------------ reading
class _SideTable:
    """The private next observations of a written vault, read in order, a block at a time."""

    def __init__(self, reader: VaultReader, rows: int, info: VaultInfo) -> None:
        self.reader = reader
        self.rows = rows
        self.info = info
        self.next_row = 0
        self.at = np.zeros((0, 2), np.int64)
        self.values: np.ndarray | None = None
        self.last = (-1, -1)

    def _more(self) -> bool:
        if self.next_row >= self.rows:
            return False
        stop = min(self.rows, self.next_row + SIDE_ROWS_PER_READ)
        at = self.reader.read_private(NEXT_OBS_AT, slice(self.next_row, stop)).astype(np.int64)
        values = self.reader.read_private(NEXT_OBS, slice(self.next_row, stop))
        keys = at[:, 1] * self.info.streams + at[:, 0]
        if (
            at.ndim != 2
            or at.shape[1] != 2
            or (at < 0).any()
            or (at[:, 0] >= self.info.streams).any()
            or (np.diff(keys) <= 0).any()
            or (len(keys) and keys[0] <= self.last[1] * self.info.streams + self.last[0])
        ):
            raise VaultError(
                f"vault {str(self.info.path)!r}: {NEXT_OBS_AT!r} does not list (stream, step) "
                "pairs in order (damaged vault)"
            )
        self.last = (int(at[-1, 0]), int(at[-1, 1]))
        self.at = np.concatenate([self.at, at])
        self.values = values if self.values is None else np.concatenate([self.values, values])
        self.next_row = stop
        return True

    def take(self, t1: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The entries of steps before ``t1`` not taken yet: ``(stream, step)`` rows and their
        observations."""
        while (not len(self.at) or self.at[-1, 1] < t1) and self._more():
            pass
        cut = int(np.searchsorted(self.at[:, 1], t1))
        at, self.at = self.at[:cut], self.at[cut:]
        if self.values is None:
            return at, None
        values, self.values = self.values[:cut], self.values[cut:]
        return at, values


@dataclass
class _Chunk:
    """One conversion step: steps ``[t0, t1)`` of every stream."""

    t0: int
    t1: int
    data: dict[str, np.ndarray]


class _Converter:
    """Writes vault chunks into a buffer, stream by stream (each stream's steps in order)."""

    def __init__(
        self,
        info: VaultInfo,
        plan: Plan,
        buffer: MultiAgentReplayBuffer,
        reader: VaultReader,
        side: _SideTable | None,
        skip: int,
    ) -> None:
        self.info, self.plan, self.buffer, self.reader, self.side = info, plan, buffer, reader, side
        self.with_next = buffer.next_obs != "none"
        self.exact = plan.entry is not None
        self.obs_key = plan.key_of("obs")
        #: steps already in the buffer (a resumed conversion): those writes are skipped
        self.skip = skip
        self.written = 0
        #: steps per ``extend`` call
        per_step = sum(leaf.step_bytes for leaf in info.leaves.values())
        self.piece = max(1, EXTEND_BYTES // max(1, per_step))

    def convert(self, chunk: _Chunk) -> None:
        """Write every stream's steps of ``chunk`` (each stream's steps in order)."""
        plan, n_agents = self.plan, len(self.plan.agents)
        n = chunk.t1 - chunk.t0
        side_at, side_values = (
            self.side.take(chunk.t1)
            if self.side is not None
            else (np.zeros((0, 2), np.int64), None)
        )
        done_key, trunc_key = plan.key_of("done"), plan.key_of("truncated")
        assert done_key is not None and self.obs_key is not None
        streams = None
        if STREAMS in self.reader.private:
            streams = self.reader.read_private(STREAMS, slice(chunk.t0, chunk.t1))
        for b in range(self.info.streams):
            data = {k: v[b] for k, v in chunk.data.items()}
            terminal = _broadcast(data[done_key], n_agents) != 0
            ends = terminal.copy()
            if trunc_key is not None:
                ends |= _broadcast(data[trunc_key], n_agents) != 0
            ends = ends.all(axis=1)
            truncated = ends & ~terminal.all(axis=1)
            obs_all = data[self.obs_key]  # with the step after the chunk, where there is one
            data[self.obs_key] = obs_all[:n]
            fields: dict[str, Any] = {}
            for key, role in plan.roles.items():
                leaf = data[key]
                if role in ("obs", "action") or role.startswith("extra:"):
                    value: Any = self._agents(key, leaf)
                elif role in ("reward", "done"):
                    part = _broadcast(leaf, n_agents)
                    value = {
                        a: part[:, i].astype(plan.specs[a].dtype(role), copy=False)
                        for i, a in enumerate(plan.agents)
                    }
                elif role == "alive":
                    value = {a: leaf[:, i] != 0 for i, a in enumerate(plan.agents)}
                elif role.startswith("global:"):
                    value = leaf
                else:  # truncated: given as the episode ends above
                    continue
                name = role.partition(":")[2] if ":" in role else role
                fields[name] = value
            successor = None
            if self.with_next:
                successor = self._successor(obs_all, n, ends, side_at, side_values, b, chunk.t0)
            self._extend(fields, truncated, b, n, streams, successor)

    def _successor(
        self,
        obs_all: np.ndarray,
        n: int,
        ends: np.ndarray,
        side_at: np.ndarray,
        side_values: np.ndarray | None,
        stream: int,
        t0: int,
    ) -> Callable[[int, int], dict[str, np.ndarray]]:
        """``next_obs`` of steps ``[lo, hi)`` of the chunk, per agent: the following step's
        obs, replaced where the vault says otherwise (marlbuf's private table) or holds nothing
        after the step (an episode's last step, the stream's last step: the step's own obs)."""
        if self.exact and side_values is not None:
            mine = side_at[:, 0] == stream
            rows, values = side_at[mine, 1] - t0, side_values[mine]
        else:
            rows = np.flatnonzero(ends)
            values = obs_all[rows]
        if len(obs_all) == n and (not len(rows) or rows[-1] != n - 1):
            rows = np.append(rows, n - 1)  # nothing follows the stream's last step
            values = np.concatenate([values, obs_all[n - 1 : n]])
        obs_key = self.obs_key
        assert obs_key is not None

        def piece(lo: int, hi: int) -> dict[str, np.ndarray]:
            out = np.empty_like(obs_all[lo:hi])
            have = min(hi, len(obs_all) - 1) - lo
            out[:have] = obs_all[lo + 1 : lo + 1 + have]
            a, z = np.searchsorted(rows, [lo, hi])
            out[rows[a:z] - lo] = values[a:z]
            return self._agents(obs_key, out)

        return piece

    def _agents(self, key: str, leaf: np.ndarray) -> dict[str, np.ndarray]:
        parts = self.plan.packings[key].unpack(leaf, self.exact)
        return dict(zip(self.plan.agents, parts))

    def _extend(
        self,
        fields: dict[str, Any],
        truncated: np.ndarray,
        stream: int,
        n: int,
        streams: np.ndarray | None,
        successor: Callable[[int, int], dict[str, np.ndarray]] | None,
    ) -> None:
        """``extend`` the ``n`` steps, in runs of one stream each, each run in pieces of at most
        :attr:`piece` steps (staging rows that stay in the caches are written much faster)."""
        if streams is None:
            runs = [(0, n, stream)]
        else:
            cuts = np.flatnonzero(np.diff(streams)) + 1
            bounds = [0, *cuts.tolist(), n]
            runs = [(lo, hi, int(streams[lo])) for lo, hi in itertools.pairwise(bounds)]
        pieces = [
            (start, min(hi, start + self.piece), s)
            for lo, hi, s in runs
            for start in range(lo, hi, self.piece)
        ]
        for lo, hi, s in pieces:
            steps = hi - lo
            if self.written + steps <= self.skip:  # written before the interruption
                self.written += steps
                continue
            if self.written < self.skip:
                raise VaultError(
                    f"the buffer being filled holds {self.skip} steps, which is not where a "
                    "write of this conversion ends: it was not written by this conversion"
                )
            part = {name: _rows(value, lo, hi) for name, value in fields.items()}
            if successor is not None:
                part["next_obs"] = successor(lo, hi)
            self.buffer.extend(stream=s, truncated=truncated[lo:hi], **part)
            self.written += steps


def _rows(value: Any, lo: int, hi: int) -> Any:
    if isinstance(value, dict):
        return {k: v[lo:hi] for k, v in value.items()}
    return value[lo:hi]


def _chunk_steps(info: VaultInfo, chunk_bytes: int) -> int:
    """Steps per conversion chunk: ``chunk_bytes`` of data, in whole chunks of the widest
    leaf where that fits (a vault chunk is then decoded once)."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)):
        raise TypeError(f"chunk_bytes must be an int; got chunk_bytes={chunk_bytes!r}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive; got chunk_bytes={chunk_bytes}")
    steps = max(1, int(chunk_bytes) // max(1, info.step_bytes))
    widest = max(info.leaves.values(), key=lambda leaf: leaf.step_bytes).chunk_steps
    return steps - steps % widest if steps >= widest else steps


def _chunks(
    reader: VaultReader, steps: int, chunk_steps: int, start: int, obs_key: str
) -> Iterator[_Chunk]:
    """The conversion chunks from step ``start`` on (with the step after each chunk of the
    observations leaf, for the last step's ``next_obs``); the next chunk is being read and
    decoded by TensorStore's threads while the caller converts one."""
    bounds = [(t0, min(steps, t0 + chunk_steps)) for t0 in range(start, steps, chunk_steps)]
    if not bounds:
        return
    pending = reader.start(*bounds[0], one_more=(obs_key,))
    for k, (t0, t1) in enumerate(bounds):
        data = reader.finish(pending)
        if k + 1 < len(bounds):
            pending = reader.start(*bounds[k + 1], one_more=(obs_key,))
        yield _Chunk(t0, t1, data)


class Progress:
    """``progress=`` of the conversions: ``False``, ``True`` (tqdm when installed, else a line
    on stderr per tenth), or a callable ``(done, total)``."""

    def __init__(self, progress: Any, total: int, what: str) -> None:
        self.total, self.done, self.what = max(1, total), 0, what
        self.callback: Callable[[int, int], Any] | None = None
        self.bar: Any = None
        self.shown = -1
        if callable(progress):
            self.callback = progress
        elif progress is True:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=what, unit="step", unit_scale=True)
            except ImportError:
                self.bar = None
        elif progress is not False:
            raise TypeError(f"progress must be a bool or a callable; got progress={progress!r}")
        self.text = progress is True and self.bar is None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.callback is not None:
            self.callback(self.done, self.total)
        if self.text:
            tenth = 10 * self.done // self.total
            if tenth != self.shown:
                self.shown = tenth
                print(f"{self.what}: {self.done:,}/{self.total:,} steps", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def read_vault(
    vault: str | os.PathLike[str],
    *,
    agents: Sequence[str] | None = None,
    keys: Mapping[str, str | None] | None = None,
    n_actions: int | None = None,
    capacity: int | None = None,
    next_obs: str | None = None,
    path: str | os.PathLike[str] | None = None,
    resume: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool | Callable[[int, int], Any] = False,
    **buffer_options: Any,
) -> MultiAgentReplayBuffer:
    """Load a Flashbax vault (OG-MARL's datasets, or one :func:`write_vault` wrote) into a
    :class:`~marlbuf.MultiAgentReplayBuffer`, a chunk at a time.

    Parameters
    ----------
    vault : str or path-like
        The vault's folder, ``<base>/<name>/<uid>`` (``vaults/3m.vlt/Good``), the one holding
        ``metadata.json``.
    agents : sequence of str, optional
        Names for the ``N`` agents of the agent axis (default ``agent_0``, ... or, for a vault
        marlbuf wrote, its agents).
    keys : mapping of str to str or None, optional
        Where leaves go, on top of :data:`DEFAULT_KEYS`: ``{vault key: field}`` with field one
        of ``"obs"``, ``"action"``, ``"reward"``, ``"done"``, ``"truncated"``, ``"alive"``,
        ``"extra:NAME"``, ``"global:NAME"``, or ``None`` to leave the leaf out. A vault marlbuf
        wrote is read as written unless ``keys`` is given.
    n_actions : int, optional
        Discrete actions (integer ``actions``): how many; default the last axis of
        ``infos.legals``, else the largest stored action plus one.
    capacity : int, optional
        Default: every step of the vault (for a vault marlbuf wrote, the capacity of the buffer
        it came from when larger). A smaller one keeps the newest steps.
    next_obs : {"once", "stored", "none", "auto"}, optional
        The buffer's format (see :class:`~marlbuf.MultiAgentReplayBuffer`); default
        ``"once"`` (a vault marlbuf wrote: its buffer's).
    path : str or path-like, optional
        Convert into a memory-mapped buffer in this new folder (for vaults larger than
        memory): resident memory stays bounded by ``chunk_bytes`` and the buffer's metadata
        (write generations, next-observation links: about 24 bytes per step), not by the
        vault. The conversion works in a folder beside it (``.<name>.vault-import``) that
        becomes ``path`` only when complete; if it is interrupted (an exception, Ctrl-C, the
        process killed), calling ``read_vault`` again with the same arguments continues where
        it stopped (``resume=True``), or is refused (``resume=False``, or another vault or
        other options): a half-converted buffer is never taken for a complete one.
    resume : bool, default True
        With ``path``: continue an interrupted conversion of the same vault with the same
        arguments.
    chunk_bytes : int
        Uncompressed bytes of vault data converted at a time (two chunks are in memory: one
        converted while the next is read).
    progress : bool or callable
        ``True`` shows progress (tqdm when installed, else lines on stderr); a callable gets
        ``(steps done, steps in all)`` after every chunk.
    **buffer_options
        Further arguments of :class:`~marlbuf.MultiAgentReplayBuffer` (``sampler``, ``seed``,
        ``layout``, ``n_trainers``, ``batch_layout``, ``batch_dtype``, ``durable``, ...).

    Returns
    -------
    MultiAgentReplayBuffer
        Steps of each stream in time order, streams one after another a chunk at a time
        (stream ``b`` of the vault is buffer stream ``b``).

    Raises
    ------
    VaultError
        A damaged, truncated, crafted or mismatched vault, or another major version: before
        anything is written to a buffer where it can be seen, and the buffer is discarded
        (with ``path``: the partial conversion stays in its work folder, never at ``path``).
    ValueError
        A leaf without a field, a field without a leaf, or invalid arguments.
    """
    info = vault_info(vault)
    for name in SET_BY_THE_VAULT:
        if name in buffer_options:
            raise TypeError(f"read_vault sets {name}= from the vault; got {name}= as well")
    chunk_steps = _chunk_steps(info, chunk_bytes)
    entry = _entry(info) if keys is None else None
    if entry is not None:
        plan = _plan_written(info, entry, agents)
    else:
        plan = _plan_foreign(info, keys, agents, n_actions, chunk_steps)
    total = info.steps * info.streams
    if capacity is None:
        capacity = max(1, total, _written_capacity(info, entry) if entry else 0)
    if next_obs is None:
        next_obs = str(entry.get("next_obs", "once")) if entry else "once"
    private = []
    side_rows = 0
    if plan.entry is not None:
        declared = plan.entry.get("private", [])
        if not isinstance(declared, list) or not set(declared) <= {NEXT_OBS, NEXT_OBS_AT, STREAMS}:
            raise VaultError(f"vault {str(info.path)!r}: its 'marlbuf' entry is damaged (private)")
        private = [n for n in (NEXT_OBS, NEXT_OBS_AT, STREAMS) if n in declared]
        if private:
            for name in private:
                read_private_meta(info, name)
            private.append(PRIVATE_ROWS)
    # a vault chunk that two conversion chunks share stays cached, so it is decoded once
    cache = 2 * sum(
        leaf.chunks[0] * leaf.chunk_steps * leaf.step_bytes for leaf in info.leaves.values()
    )
    reader = VaultReader(info, list(plan.roles), cache_bytes=cache, private=private)
    if NEXT_OBS in reader.private and plan.entry is not None:
        counts = reader.read_private(PRIVATE_ROWS, slice(None))
        declared = list(plan.entry["private"])
        if counts.shape != (len(declared),):
            raise VaultError(f"vault {str(info.path)!r}: {PRIVATE_ROWS!r} is damaged")
        side_rows = int(min(counts[declared.index(NEXT_OBS)], counts[declared.index(NEXT_OBS_AT)]))
    options = dict(
        buffer_options,
        next_obs=next_obs,
        global_fields=plan.global_fields,
        alive=plan.alive,
    )
    if path is None:
        buffer = MultiAgentReplayBuffer(plan.specs, capacity, **options)
        _fill(info, plan, buffer, reader, side_rows, chunk_steps, 0, progress, None)
        return buffer
    return _fill_folder(
        info, plan, Path(path), capacity, options, reader, side_rows, chunk_steps, progress, resume
    )


def _written_capacity(info: VaultInfo, entry: Mapping[str, Any]) -> int:
    """The capacity of the buffer a vault was written from: the default capacity when it
    reads back (a crafted entry cannot make it allocate more than its data needs by much)."""
    capacity = entry.get("capacity", 0)
    steps = info.steps * info.streams
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise VaultError(f"vault {str(info.path)!r}: its 'marlbuf' entry has capacity {capacity!r}")
    if capacity > max(MAX_SPARE_CAPACITY, 4 * steps):
        raise VaultError(
            f"vault {str(info.path)!r}: its 'marlbuf' entry asks for a capacity of {capacity:,} "
            f"for {steps:,} stored steps; pass capacity= to choose one"
        )
    return capacity


def _fill(
    info: VaultInfo,
    plan: Plan,
    buffer: MultiAgentReplayBuffer,
    reader: VaultReader,
    side_rows: int,
    chunk_steps: int,
    skip: int,
    progress: Any,
    after_chunk: Callable[[], Any] | None,
) -> None:
    side = _SideTable(reader, side_rows, info) if NEXT_OBS in reader.private else None
    # a resumed conversion starts at the chunk it was writing (each chunk writes every
    # stream's steps in turn: chunk_steps * streams steps, the last chunk fewer)
    first = skip // (chunk_steps * info.streams)
    start = min(info.steps, first * chunk_steps)
    if side is not None:
        side.take(start)
    converter = _Converter(info, plan, buffer, reader, side, skip - start * info.streams)
    shown = Progress(progress, info.steps * info.streams, f"vault {info.path.name}")
    if start:
        shown.update(start * info.streams)
    try:
        assert converter.obs_key is not None
        for chunk in _chunks(reader, info.steps, chunk_steps, start, converter.obs_key):
            converter.convert(chunk)
            if after_chunk is not None:
                after_chunk()
            shown.update((chunk.t1 - chunk.t0) * info.streams)
    finally:
        shown.close()
    if converter.written < converter.skip:
        raise VaultError(
            f"the buffer being filled holds {skip} steps, more than this conversion writes: "
            "it was not written by this conversion"
        )


def _fingerprint(info: VaultInfo) -> str:
    digest = hashlib.sha256((info.path / "metadata.json").read_bytes())
    digest.update(f"{info.steps}/{info.streams}".encode())
    return digest.hexdigest()


def _json_safe(value: Any) -> Any:
    """Buffer options as the journal records them (objects by their representation)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    config = getattr(value, "config", None)
    if callable(config):
        return {"type": type(value).__name__, "config": _json_safe(config())}
    if isinstance(value, FieldSpec):
        return value.to_dict()
    return repr(value)


def _fill_folder(
    info: VaultInfo,
    plan: Plan,
    target: Path,
    capacity: int,
    options: dict[str, Any],
    reader: VaultReader,
    side_rows: int,
    chunk_steps: int,
    progress: Any,
    resume: bool,
) -> MultiAgentReplayBuffer:
    """:func:`read_vault` into a memory-mapped buffer at ``target``, through a work folder."""
    target = target.absolute()
    if target.exists() or target.is_symlink():
        raise FileExistsError(
            f"{str(target)!r} already exists; read_vault(path=...) converts into a new folder "
            "(open a converted buffer with MultiAgentReplayBuffer.open)"
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"the parent folder of path={str(target)!r} does not exist")
    work = target.parent / f".{target.name}.vault-import"
    journal = {
        "format": JOURNAL_FORMAT,
        "version": 1,
        "vault": str(info.path),
        "fingerprint": _fingerprint(info),
        "chunk_steps": chunk_steps,
        "capacity": int(capacity),
        "plan": plan.to_json(),
        "options": _json_safe(
            {k: v for k, v in options.items() if k not in ("durable", "parallel_gather")}
        ),
    }
    runtime: dict[str, Any] = {
        k: options[k] for k in ("durable", "parallel_gather") if k in options
    }
    if work.exists() or work.is_symlink():
        if not resume:
            raise FileExistsError(
                f"{str(work)!r} holds an unfinished conversion into {str(target)!r}; pass "
                "resume=True to continue it, or delete that folder to start again"
            )
        found = _read_journal(work)
        if found != journal:
            differs = sorted(k for k in set(found) | set(journal) if found.get(k) != journal.get(k))
            raise ValueError(
                f"{str(work)!r} holds an unfinished conversion of {found.get('vault')!r} with "
                f"other settings ({', '.join(differs)} differ); finish it with the arguments it "
                "was started with, or delete that folder to start again"
            )
    else:
        work.mkdir()
        tmp = work / (JOURNAL + ".tmp")
        tmp.write_text(json.dumps(journal))
        os.replace(tmp, work / JOURNAL)
    _fill_work(
        info,
        plan,
        work / "buffer",
        capacity,
        options,
        runtime,
        reader,
        side_rows,
        chunk_steps,
        progress,
    )
    gc.collect()  # the filled buffer's metadata is gone before the complete buffer's is loaded
    _trim_heap()
    os.replace(work / "buffer", target)
    (work / JOURNAL).unlink()
    work.rmdir()
    buffer = MultiAgentReplayBuffer.open(target, **runtime)
    _trim_heap()  # what loading its checkpoint freed
    return buffer


def _fill_work(
    info: VaultInfo,
    plan: Plan,
    folder: Path,
    capacity: int,
    options: dict[str, Any],
    runtime: dict[str, Any],
    reader: VaultReader,
    side_rows: int,
    chunk_steps: int,
    progress: Any,
) -> None:
    """Fill (or continue filling) the memory-mapped buffer of the work folder, then close it."""
    if (folder / "manifest.json").exists():
        buffer = MultiAgentReplayBuffer.open(folder, **runtime)
    else:
        buffer = MultiAgentReplayBuffer(plan.specs, capacity, path=folder, **options)

    def after_chunk() -> None:
        # resident memory follows the chunk, not the vault: the mapped files' pages go back
        # to the OS, and so does the C heap that decoding and staging freed
        buffer.release_pages()
        _trim_heap()

    try:
        _fill(
            info,
            plan,
            buffer,
            reader,
            side_rows,
            chunk_steps,
            buffer.total_writes,
            progress,
            after_chunk,
        )
    finally:
        buffer.close()  # everything written so far is kept: an interrupted call continues


def _trim_heap() -> None:
    """Return the C heap's free memory to the OS (glibc's ``malloc_trim``; nothing elsewhere):
    the chunks that TensorStore's threads decoded and staging copied are freed into malloc's
    arenas, which keep them resident otherwise."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _read_journal(work: Path) -> dict[str, Any]:
    path = work / JOURNAL
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1024**2 + 1)
        found = json.loads(raw.decode()) if len(raw) <= 1024**2 else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{str(work)!r} is not an unfinished conversion (its {JOURNAL} cannot be read: "
            f"{exc}); delete that folder to start again"
        ) from exc
    if not isinstance(found, dict) or found.get("format") != JOURNAL_FORMAT:
        raise ValueError(f"{str(work)!r} is not an unfinished vault conversion; delete it")
    return found


# ------------------------------------------------------------------------------ writing
def _write_order(buffer: MultiAgentReplayBuffer) -> np.ndarray:
    """The filled slots, oldest first."""
    size, capacity = buffer.size, buffer.capacity
    if size < capacity:
        return np.arange(size, dtype=np.int64)
    return (np.arange(size, dtype=np.int64) + buffer.cursor) % capacity


def _exact_one_hot(buffer: MultiAgentReplayBuffer, chunk: int) -> bool:
    """Whether every agent is discrete and every stored action one-hot (so indices keep it)."""
    if not all(s.n_discrete_actions for s in buffer.specs.values()):
        return False
    for values in buffer.stored("action").values():
        for lo in range(0, len(values), chunk):
            part = np.asarray(values[lo : lo + chunk])
            if not (((part == 0) | (part == 1)).all() and (part.sum(axis=1) == 1).all()):
                return False
    return True


def _episode_layout(
    buffer: MultiAgentReplayBuffer, order: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """From the buffer's episode index: whether each step (in write ``order``) ends its
    episode, and each step's stream when episodes interleave (``None`` when they do not)."""
    index = buffer.episodes
    if index is None:
        return None, None
    episode = index.episode[order]
    open_ids = {int(entry[0]) for entry in index.open.values()}
    last = index.next_slot[order] < 0
    if open_ids:
        last &= ~np.isin(episode, np.fromiter(open_ids, np.int64))
    ids, first = np.unique(episode, return_index=True)
    _, last_rev = np.unique(episode[::-1], return_index=True)
    final = len(episode) - 1 - last_rev
    if open_ids:  # an unfinished episode keeps its stream: nothing may continue it
        final[np.isin(ids, np.fromiter(open_ids, np.int64))] = len(episode)
    spans = sorted(zip(first.tolist(), final.tolist(), range(len(ids))))
    stream_of = np.zeros(len(ids), np.int64)
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (last position, stream)
    streams_used = 0
    for start, stop, k in spans:
        while busy and busy[0][0] < start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            s = heapq.heappop(free)
        else:
            s, streams_used = streams_used, streams_used + 1
        stream_of[k] = s
        heapq.heappush(busy, (stop, s))
    if streams_used <= 1:
        return last, None
    position = np.searchsorted(ids, episode)
    return last, stream_of[position].astype(np.int32)


def write_vault(
    buffer: MultiAgentReplayBuffer,
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    compression: Mapping[str, Any] | None = None,
    chunk_bytes: int = WRITE_CHUNK_BYTES,
    progress: bool | Callable[[int, int], Any] = False,
) -> Path:
    """Write a buffer's stored steps as a Flashbax vault (format 1.2) with OG-MARL's keys.

    The vault is written into a temporary folder beside ``path`` and renamed to ``path`` when
    complete, so ``path`` never holds half a vault. Flashbax's ``Vault(vault_name, rel_dir,
    vault_uid).read()`` reads it with ``path = rel_dir/vault_name/vault_uid``;
    :func:`read_vault` reads it back exactly (see the module docstring).

    Parameters
    ----------
    buffer : MultiAgentReplayBuffer
        Written oldest step first (a buffer that has wrapped around reads back with its oldest
        step in slot 0). Steps of an episode whose first steps the ring has overwritten read
        back as a shorter episode.
    path : str or path-like
        The vault's folder, ``<base>/<name>/<uid>``; must not exist (missing parents are
        created).
    metadata : mapping, optional
        Further JSON-safe keys of ``metadata.json`` (``"marlbuf"`` is marlbuf's own).
    compression : mapping, optional
        The zarr compressor (default Flashbax's, gzip level 5; ``{"id": "zstd", "level": 3}``
        writes and reads faster).
    chunk_bytes : int
        Steps are gathered from the buffer and written about this many bytes (of the buffer's
        rows) at a time; TensorStore compresses one such range while the next is gathered
        (larger ranges keep more of its threads busy: measured 1.45x the time of one whole
        write at 16 MiB, 1.07x at 64 MiB).
    progress : bool or callable
        As for :func:`read_vault`.

    Returns
    -------
    Path
        The vault's folder.
    """
    if not isinstance(buffer, MultiAgentReplayBuffer):
        raise TypeError(f"buffer must be a MultiAgentReplayBuffer; got {type(buffer).__name__}")
    final = Path(path).absolute()
    if final.exists() or final.is_symlink():
        raise FileExistsError(f"{str(final)!r} already exists; a vault is written to a new folder")
    if metadata is not None and "marlbuf" in metadata:
        raise ValueError("metadata may not set 'marlbuf' (marlbuf's own entry)")
    with buffer.writer.lock:
        return _write(buffer, final, metadata, compression, chunk_bytes, progress)


def _write(
    buffer: MultiAgentReplayBuffer,
    final: Path,
    metadata: Mapping[str, Any] | None,
    compression: Mapping[str, Any] | None,
    chunk_bytes: int,
    progress: Any,
) -> Path:
    specs = buffer.specs
    agents = list(specs)
    size = buffer.size
    row_bytes = max(1, buffer.nbytes // max(1, buffer.capacity))
    chunk = max(1, int(chunk_bytes) // row_bytes)
    action_index = _exact_one_hot(buffer, chunk)
    layout = buffer_leaves(specs, buffer.global_fields, buffer.alive, action_index)
    order = _write_order(buffer)
    ends, streams = _episode_layout(buffer, order)
    with_next = buffer.next_obs != "none"
    obs_packing = layout["observations"][2]
    assert obs_packing is not None
    private: dict[str, LeafSpec] = {}
    if with_next:
        private[NEXT_OBS] = LeafSpec(obs_packing.step_shape, obs_packing.dtype)
        private[NEXT_OBS_AT] = LeafSpec((2,), np.dtype(np.int64))
    if streams is not None:
        private[STREAMS] = LeafSpec((), np.dtype(np.int32))
    entry = {
        "format": ENTRY_FORMAT,
        "version": ENTRY_VERSION,
        "agents": agents,
        "specs": {a: s.to_dict() for a, s in specs.items()},
        "global_fields": {n: f.to_dict() for n, f in buffer.global_fields.items()},
        "alive": buffer.alive,
        "action_index": action_index,
        "next_obs": buffer.next_obs,
        "capacity": buffer.capacity,
        "layout": buffer.layout,
        "fields": {k: role for k, (role, _, _) in layout.items()},
        "private": list(private),
    }
    tmp = final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer = VaultWriter(
            tmp,
            {k: spec for k, (_, spec, _) in layout.items()},
            1,
            {"marlbuf": entry, **dict(metadata or {})},
            compression,
            private,
            chunk_bytes=min(int(chunk_bytes), 4 * 1024**2),
        )
        step = max(writer.chunk_steps, chunk - chunk % writer.chunk_steps)
        shown = Progress(progress, size, f"vault {final.name}")
        try:
            for lo in range(0, size, step):
                hi = min(size, lo + step)
                _write_chunk(buffer, writer, layout, order, (lo, hi), ends, streams, action_index)
                shown.update(hi - lo)
        finally:
            shown.close()
        writer.close()
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_chunk(
    buffer: MultiAgentReplayBuffer,
    writer: VaultWriter,
    layout: Mapping[str, tuple[str, LeafSpec, Packing | None]],
    order: np.ndarray,
    span: tuple[int, int],
    ends: np.ndarray | None,
    streams: np.ndarray | None,
    action_index: bool,
) -> None:
    """Steps ``span = (lo, hi)`` of write ``order`` (and the step after them, for its obs)."""
    lo, hi = span
    n = hi - lo
    following = int(hi < len(order))
    batch = buffer.gather(order[lo : hi + following])
    agents = list(buffer.specs)
    _, obs_spec, obs_packing = layout["observations"]
    assert obs_packing is not None
    obs_all = np.empty((n + following, *obs_spec.step_shape), obs_spec.dtype)
    obs_packing.pack_field(batch, "obs", obs_all, n + following)
    steps: dict[str, np.ndarray] = {"observations": obs_all[:n]}
    all_done = (batch.concat("done")[:n] != 0).all(axis=1)
    private: dict[str, np.ndarray] = {}
    same = np.zeros(n, bool)
    with_next = buffer.next_obs != "none"
    if with_next:
        next_obs = np.empty((n, *obs_spec.step_shape), obs_spec.dtype)
        obs_packing.pack_field(batch, "next_obs", next_obs, n)
        # compared as stored bytes, as the buffer links next observations
        m = n - 1 + following
        same[:m] = (_words(next_obs[:m]) == _words(obs_all[1 : m + 1])).all(axis=1)
        where = np.flatnonzero(~same)
        private[NEXT_OBS] = next_obs[where]
        private[NEXT_OBS_AT] = np.stack([np.zeros_like(where), where + lo], axis=1)
    if ends is not None:
        end = ends[lo:hi]
    elif with_next:
        end = all_done | ~same
        if not following:
            end[-1] = all_done[-1]  # the newest step: its episode may go on
    else:
        end = all_done
    truncated = (end & ~all_done).astype(np.float32)
    for key, (role, spec, packing) in layout.items():
        if key == "observations":
            continue
        out = np.empty((n, *spec.step_shape), spec.dtype)
        if role == "truncated":
            out[...] = truncated[:, None]
        elif role == "action" and action_index:
            sizes = {buffer.specs[a].n_discrete_actions for a in agents}
            if len(sizes) == 1:  # every agent's one-hot side by side: one argmax
                one_hot = batch.concat("action")[:n].reshape(n, len(agents), -1)
                out[...] = one_hot.argmax(axis=2)
            else:
                for i, a in enumerate(agents):
                    out[:, i] = batch.action[a][:n].argmax(axis=1)
        elif role in ("action", "reward", "done") or role.startswith("extra:"):
            assert packing is not None
            packing.pack_field(batch, role.partition(":")[2] or role, out, n)
        elif role == "alive":
            assert batch.alive is not None
            for i, a in enumerate(agents):
                out[:, i] = batch.alive[a][:n]
        else:
            out[...] = batch.globals[role.partition(":")[2]][:n]
        steps[key] = out
    if streams is not None:
        private[STREAMS] = streams[lo:hi]
    writer.append({k: v[None] for k, v in steps.items()}, private)


def _words(values: np.ndarray) -> np.ndarray:
    """``values`` (shape (n, ...)) as rows of unsigned words, the widest that divide a row (so
    that comparing rows compares their bytes, in as few comparisons as possible)."""
    row = math.prod(values.shape[1:]) * values.dtype.itemsize
    size = next(w for w in (8, 4, 2, 1) if row % w == 0)
    flat = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), row)
    return flat.view(f"<u{size}")
