"""How the leaves of a TensorDict map onto marlbuf rows (the part of
:class:`~marlbuf.compat.torchrl.MarlbufStorage` that knows TensorDicts).

The first TensorDict a storage sees fixes its structure, as ``LazyTensorStorage``'s does: every
leaf (nested keys included) with its per-item shape and dtype, and the batch size of every
nested TensorDict (an agent group's ``[n_agents]``). Leaves are then sorted into

* **pairs**: a key ``k`` outside ``"next"`` whose ``("next", *k)`` has the same per-item shape
  and dtype (observations, and whatever else the environment carries from one step to the
  next: ``done`` flags, ``episode_reward``). Pair ``i`` is marlbuf agent ``p{i}``: ``k`` is its
  ``obs``, ``("next", *k)`` its ``next_obs``. With observations stored once, a step's
  ``next_obs`` section is kept only where it differs from the following step's ``obs`` section
  (an episode boundary, a change of environment);
* **singles**: every other leaf (actions, rewards under ``"next"``), each a marlbuf global
  field ``g{j}`` of the same rows.

A leaf is stored as the unsigned integers of its own width (its bits, unchanged): any dtype
(bfloat16, bool, complex) round-trips bit for bit, and NaN payloads survive, with no value
checks or conversions on the way. marlbuf's agent fields ``action``, ``reward`` and ``done``
are one byte each per pair, always zero. Batches are gathered per field into contiguous arrays
(``batch_layout="per_agent"``), so every leaf of a sampled TensorDict is a contiguous tensor
viewing the gathered block.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlbuf.spec import AgentSpec, FieldSpec

#: The names of leaves a storage never stores (the last part of the key): bookkeeping that
#: TorchRL's replay buffers and losses write into TensorDicts (``"index"`` of sampled and
#: extended data, the importance weights, a loss's ``td_error``). Data written with them keeps
#: them; stored rows, and so sampled batches, do not.
EXCLUDED_KEYS: tuple[str, ...] = ("index", "td_error", "priority_weight", "_weight")

#: Unsigned integer type of each item width a leaf can have (wider dtypes, complex128, take
#: several 8-byte units per element).
UNITS: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}

#: ``torch.uint16``/``uint32``/``uint64`` of each unit (the gathered arrays' torch type)
TORCH_UNITS: dict[np.dtype, torch.dtype] = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.uint16): torch.uint16,
    np.dtype(np.uint32): torch.uint32,
    np.dtype(np.uint64): torch.uint64,
}

Key = tuple[str, ...]


def as_key(key: Any) -> Key:
    """A TensorDict key as a tuple of strings (``"done"`` -> ``("done",)``)."""
    return (key,) if isinstance(key, str) else tuple(key)


def key_name(key: Key) -> str:
    """How a key is written in messages: ``"done"`` or ``('next', 'agents', 'observation')``."""
    return repr(key[0]) if len(key) == 1 else repr(key)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the inverse of :func:`torch_dtype`)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; a ``ValueError`` for a name torch does not have."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r} in a MarlbufStorage layout")
    return dtype


@dataclass(frozen=True)
class Leaf:
    """One stored leaf: its key, per-item shape and dtype, and where it lives in the rows.

    ``field`` is ``"obs"``/``"next_obs"`` (of marlbuf agent ``slot``), ``"global"`` (global
    field ``slot``) or ``"empty"`` (no elements: nothing stored).
    """

    key: Key
    shape: tuple[int, ...]
    dtype: torch.dtype
    field: str
    slot: str

    @property
    def unit(self) -> np.dtype:
        """The unsigned integer type its bits are stored as."""
        return UNITS[min(self.dtype.itemsize, 8)]

    @property
    def units(self) -> int:
        """Stored units per item (elements times units per element)."""
        return math.prod(self.shape) * max(1, self.dtype.itemsize // 8)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": list(self.key),
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "field": self.field,
            "slot": self.slot,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Leaf:
        return cls(
            tuple(data["key"]),
            tuple(int(d) for d in data["shape"]),
            torch_dtype(data["dtype"]),
            str(data["field"]),
            str(data["slot"]),
        )


def raw_units(tensor: torch.Tensor, steps: int, unit: np.dtype) -> np.ndarray:
    """The bits of ``tensor`` (``steps`` items) as ``(steps, units)`` unsigned integers on the
    host: a view where the tensor is already contiguous on the CPU."""
    flat = tensor.detach().to("cpu").contiguous().reshape(steps, -1)
    return flat.view(torch.uint8).numpy().view(unit)


class TensorDictLayout:
    """The structure of the TensorDicts one storage holds, and the mapping of their leaves to
    marlbuf agents and global fields (see the module docstring).

    Parameters
    ----------
    leaves : sequence of Leaf
        Every stored leaf, in the order of the first TensorDict.
    nodes : mapping of key to tuple of int
        Every TensorDict of the structure (the root is ``()``) with its per-item batch size.
    excluded : sequence of str
        Leaf names that are never stored (:data:`EXCLUDED_KEYS` by default).
    """

    def __init__(
        self,
        leaves: Sequence[Leaf],
        nodes: Mapping[Key, tuple[int, ...]],
        excluded: Sequence[str] = EXCLUDED_KEYS,
    ) -> None:
        self.leaves = tuple(leaves)
        self.nodes = {tuple(k): tuple(v) for k, v in nodes.items()}
        self.excluded = tuple(excluded)
        self.by_key = {leaf.key: leaf for leaf in self.leaves}
        self.agents = sorted(
            {leaf.slot for leaf in self.leaves if leaf.field == "obs"}, key=_slot_order
        )
        self.globals = [leaf.slot for leaf in self.leaves if leaf.field == "global"]
        #: whether rows keep next observations (there is at least one pair)
        self.has_next = any(leaf.field == "next_obs" for leaf in self.leaves)
        #: the fields a gather asks for: obs (and next_obs) of the pairs, the singles
        self.gather_fields = ("obs", *(("next_obs",) if self.has_next else ()), *self.globals)
        self.specs = {
            leaf.slot: AgentSpec(
                obs_shape=(leaf.units,),
                action_shape=(1,),
                obs_dtype=leaf.unit,
                action_dtype=np.uint8,
                reward_dtype=np.uint8,
                done_dtype=np.uint8,
            )
            for leaf in self.leaves
            if leaf.field == "obs"
        }
        self.global_fields = {
            leaf.slot: FieldSpec((leaf.units,), leaf.unit)
            for leaf in self.leaves
            if leaf.field == "global"
        }
        self.children = _tree(self.nodes, self.leaves)

    # ------------------------------------------------------------------------ building
    @classmethod
    def from_data(
        cls, data: TensorDictBase, lead: int, excluded: Sequence[str] = EXCLUDED_KEYS
    ) -> TensorDictLayout:
        """The layout of ``data``, whose first ``lead`` batch dimensions index its items (1 for
        the data of ``extend``, 0 for one item)."""
        excluded = tuple(excluded)
        tensors: dict[Key, torch.Tensor] = {}
        nodes: dict[Key, tuple[int, ...]] = {(): tuple(data.batch_size[lead:])}
        for raw_key in data.keys(include_nested=True, leaves_only=False):
            key = as_key(raw_key)
            if is_excluded(key, excluded):
                continue
            value = data.get(key)
            if isinstance(value, TensorDictBase) and not _is_non_tensor(value):
                nodes[key] = tuple(value.batch_size[lead:])
            elif isinstance(value, torch.Tensor):
                tensors[key] = value
            else:
                raise ValueError(
                    f"key {key_name(key)} holds {type(value).__name__}, not a tensor: "
                    "MarlbufStorage stores tensors only; exclude it from the data (or add its "
                    "name to exclude_keys=)"
                )
        if not tensors:
            raise ValueError(
                "the TensorDict has no tensor leaves to store (after leaving out "
                f"exclude_keys={excluded})"
            )
        pairs = [
            key
            for key, value in tensors.items()
            if key[0] != "next"
            and ("next", *key) in tensors
            and tensors[("next", *key)].shape[lead:] == value.shape[lead:]
            and tensors[("next", *key)].dtype == value.dtype
            and math.prod(value.shape[lead:]) > 0
        ]
        paired = {("next", *key) for key in pairs}
        leaves: list[Leaf] = []
        n_singles = 0
        for key, value in tensors.items():
            shape, dtype = tuple(value.shape[lead:]), value.dtype
            if key in paired:
                slot = f"p{pairs.index(key[1:])}"
                leaves.append(Leaf(key, shape, dtype, "next_obs", slot))
            elif key in pairs:
                leaves.append(Leaf(key, shape, dtype, "obs", f"p{pairs.index(key)}"))
            elif math.prod(shape) == 0:
                leaves.append(Leaf(key, shape, dtype, "empty", ""))
            elif not pairs and n_singles == 0:
                # no pairs (nothing under "next"): the first leaf is agent p0's obs, the rows
                # keep no next observations
                leaves.append(Leaf(key, shape, dtype, "obs", "p0"))
                n_singles += 1
            else:
                leaves.append(Leaf(key, shape, dtype, "global", f"g{n_singles}"))
                n_singles += 1
        if not any(leaf.field == "obs" for leaf in leaves):
            raise ValueError(
                "every leaf of the TensorDict has zero elements: there is nothing to store"
            )
        return cls(leaves, nodes, excluded)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-safe), the inverse of :meth:`from_dict`."""
        return {
            "leaves": [leaf.to_dict() for leaf in self.leaves],
            "nodes": [[list(k), list(v)] for k, v in self.nodes.items()],
            "excluded": list(self.excluded),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorDictLayout:
        try:
            leaves = [Leaf.from_dict(leaf) for leaf in data["leaves"]]
            nodes = {tuple(k): tuple(int(d) for d in v) for k, v in data["nodes"]}
            excluded = tuple(str(name) for name in data["excluded"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a MarlbufStorage layout: {exc!r}") from exc
        return cls(leaves, nodes, excluded)

    # ------------------------------------------------------------------------ writing
    def check(self, data: TensorDictBase, lead: int) -> dict[Key, torch.Tensor]:
        """Every stored leaf of ``data`` (``lead`` item dimensions), checked against this
        layout: the same keys (less the excluded ones), per-item shapes and dtypes, and nested
        batch sizes; a ``ValueError`` names the first key that differs."""
        seen = {as_key(k) for k in data.keys(include_nested=True, leaves_only=True)}
        seen = {k for k in seen if not is_excluded(k, self.excluded)}
        if seen != set(self.by_key):
            extra = sorted(seen - set(self.by_key))
            missing = sorted(set(self.by_key) - seen)
            if extra:
                raise ValueError(
                    f"key {key_name(extra[0])} was not in the first TensorDict written to this "
                    "MarlbufStorage: a storage keeps the keys of its first write (rows have a "
                    "fixed layout); write it from the start, or leave it out (exclude_keys=)"
                    + (f"; also new: {[key_name(k) for k in extra[1:]]}" if extra[1:] else "")
                )
            raise ValueError(
                f"key {key_name(missing[0])} is missing: every write to this MarlbufStorage "
                "must hold the keys of its first write"
                + (f"; also missing: {[key_name(k) for k in missing[1:]]}" if missing[1:] else "")
            )
        out: dict[Key, torch.Tensor] = {}
        for leaf in self.leaves:
            value = data.get(leaf.key)
            if not isinstance(value, torch.Tensor):
                raise ValueError(
                    f"key {key_name(leaf.key)} holds {type(value).__name__}, not a tensor"
                )
            if tuple(value.shape[lead:]) != leaf.shape:
                raise ValueError(
                    f"key {key_name(leaf.key)} has per-item shape {tuple(value.shape[lead:])}; "
                    f"this storage holds {leaf.shape} (the shape of its first write)"
                )
            if value.dtype != leaf.dtype:
                raise ValueError(
                    f"key {key_name(leaf.key)} has dtype {value.dtype}; this storage holds "
                    f"{leaf.dtype} (the dtype of its first write): convert it before writing"
                )
            out[leaf.key] = value
        for key, size in self.nodes.items():
            node = data.get(key) if key else data
            if tuple(node.batch_size[lead:]) != size:
                raise ValueError(
                    f"the TensorDict at key {key_name(key) if key else '(the root)'} has "
                    f"per-item batch size {tuple(node.batch_size[lead:])}; this storage holds "
                    f"{size}"
                )
        return out

    def marlbuf_fields(self, tensors: Mapping[Key, torch.Tensor], steps: int) -> dict[str, Any]:
        """The keyword arguments of ``MultiAgentReplayBuffer.extend`` for ``steps`` items."""
        obs: dict[str, np.ndarray] = {}
        next_obs: dict[str, np.ndarray] = {}
        fields: dict[str, Any] = {}
        for leaf in self.leaves:
            if leaf.field == "empty":
                continue
            units = raw_units(tensors[leaf.key], steps, leaf.unit)
            if leaf.field == "obs":
                obs[leaf.slot] = units
            elif leaf.field == "next_obs":
                next_obs[leaf.slot] = units
            else:
                fields[leaf.slot] = units
        zeros = np.zeros(steps, dtype=np.uint8)
        fields.update(
            obs=obs,
            action={a: zeros[:, None] for a in obs},
            reward=dict.fromkeys(obs, zeros),
            done=dict.fromkeys(obs, zeros),
        )
        if self.has_next:
            fields["next_obs"] = next_obs
        return fields

    # ------------------------------------------------------------------------ reading
    def tensordict(
        self, batch: Any, lead: tuple[int, ...], device: torch.device | None
    ) -> TensorDictBase:
        """The TensorDict of a gathered marlbuf ``batch`` (a ``Batch`` of arrays or a
        ``DeviceBatch`` of tensors) whose rows are the items of index shape ``lead``."""
        tensors: dict[Key, torch.Tensor] = {}
        for leaf in self.leaves:
            if leaf.field == "empty":
                shape = (*lead, *leaf.shape)
                tensors[leaf.key] = torch.empty(shape, dtype=leaf.dtype, device=device)
                continue
            if leaf.field == "global":
                units = batch.globals[leaf.slot]
            else:
                units = getattr(batch, leaf.field)[leaf.slot]
            if isinstance(units, np.ndarray):
                units = torch.from_numpy(units)
            tensors[leaf.key] = units.view(leaf.dtype).reshape((*lead, *leaf.shape))
        return self.build(tensors, lead, device)

    def empty(self, lead: tuple[int, ...], device: torch.device | None) -> TensorDictBase:
        """A TensorDict of this structure with no items (``lead`` holds a 0)."""
        tensors = {
            leaf.key: torch.empty((*lead, *leaf.shape), dtype=leaf.dtype, device=device)
            for leaf in self.leaves
        }
        return self.build(tensors, lead, device)

    def build(
        self,
        tensors: Mapping[Key, torch.Tensor],
        lead: tuple[int, ...],
        device: torch.device | None,
        key: Key = (),
    ) -> TensorDictBase:
        """The TensorDict at ``key`` of the structure, holding ``tensors``."""
        source: dict[str, Any] = {}
        for name, child in self.children[key]:
            path = (*key, name)
            source[name] = self.build(tensors, lead, device, path) if child else tensors[path]
        return TensorDict(source, batch_size=[*lead, *self.nodes[key]], device=device)


def is_excluded(key: Key, excluded: Sequence[str]) -> bool:
    """Whether a key (or a TensorDict it lies in) has one of the ``excluded`` names."""
    return any(part in excluded for part in key)


def _is_non_tensor(value: Any) -> bool:
    """Whether a TensorDict value is non-tensor data (``NonTensorData``/``NonTensorStack``)."""
    return type(value).__name__ in ("NonTensorData", "NonTensorStack")


def _slot_order(slot: str) -> int:
    return int(slot[1:])


def _tree(
    nodes: Mapping[Key, tuple[int, ...]], leaves: Iterable[Leaf]
) -> dict[Key, list[tuple[str, bool]]]:
    """Per TensorDict of the structure, its entries in order: (name, whether a TensorDict)."""
    children: dict[Key, list[tuple[str, bool]]] = {key: [] for key in nodes}
    ordered = sorted(
        [(key, True) for key in nodes if key] + [(leaf.key, False) for leaf in leaves],
        key=lambda item: len(item[0]),
    )
    for key, is_node in ordered:
        parent = key[:-1]
        if parent not in children:
            raise ValueError(f"the layout lists {key_name(key)} without its parent TensorDict")
        children[parent].append((key[-1], is_node))
    return children
