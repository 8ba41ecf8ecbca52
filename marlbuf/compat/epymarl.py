"""EPyMARL-style episode replay (``components/episode_buffer.py``'s ``ReplayBuffer``) on marlbuf.

EPyMARL (and PyMARL) keep a ring of ``buffer_size`` whole episodes, each padded to
``max_seq_length`` steps with a ``filled`` mask, and train QMIX, VDN, MAPPO and the other
learners on ``buffer.sample(batch_size)``: ``batch_size`` distinct episodes drawn uniformly. This
module gives the same interface over a :class:`~marlbuf.MultiAgentReplayBuffer`, which stores
only the filled steps of each episode (variable-length episodes take the memory of their real
steps) and gathers a batch with one :meth:`~marlbuf.MultiAgentReplayBuffer.gather_sequences`
call of the scheme's fields only (``fields=``: the buffer's own transition fields are neither
copied nor read, and next observations are not stored at all: ``next_obs="none"``; EPyMARL's
learners read the next step's ``obs``). EPyMARL is not imported: the buffer reads any episode
batch that has ``batch_size``, ``max_seq_length`` and ``data.transition_data`` /
``data.episode_data`` dicts of tensors (what
EPyMARL's runners build), and returns :class:`EpisodeBatch` objects that its learners use
unchanged (``batch["obs"][:, t]``, ``batch[:, :max_t]``, ``max_t_filled()``, ``to(device)``,
``batch_size``, ``max_seq_length``, ``device``).

Semantics kept:

* ``scheme``/``groups``/``preprocess`` as EPyMARL takes them (``vshape``, ``group``, ``dtype``,
  ``episode_const``; ``preprocess = {key: (new_key, [transforms])}`` with transforms that have
  ``transform(tensor)`` and ``infer_output_info(vshape, dtype)``, such as EPyMARL's ``OneHot``).
* ``insert_episode_batch`` fills a ring of ``buffer_size`` episode positions; an episode's
  steps are the rows where ``filled`` is 1 (a prefix of the padded episode), stored in order.
* ``sample(batch_size)`` draws ``batch_size`` distinct positions with
  ``np.random.choice(episodes_in_buffer, batch_size, replace=False)`` (NumPy's global legacy
  generator, as EPyMARL; pass ``rng=`` for a generator of your own), or takes positions
  ``0 .. batch_size - 1`` in order when that is every stored episode. Every field comes back
  as ``(batch_size, max_seq_length, ...)`` (per group member ``(..., n_members, *vshape)``) with
  zeros past each episode's filled steps, ``filled`` as an int64 ``(B, max_seq_length, 1)``
  tensor, and the preprocessed fields computed from their source field.

Differences:

* Preprocessed fields (``actions_onehot``) are not stored: they are computed again from their
  source field when a batch is gathered (the same transform EPyMARL's runner applied), and are
  zero past the filled steps, as in EPyMARL's buffer.
* Episode constants (``episode_const``) are stored with every step of their episode.
* ``capacity_steps`` bounds the stored steps. The default, ``buffer_size * max_seq_length``,
  holds the newest ``buffer_size`` episodes whatever their lengths (EPyMARL's exact window).
  A smaller value saves memory when episodes are shorter than ``max_seq_length``; an episode
  of the window whose steps the ring has overwritten is then no longer drawn, and
  ``episodes_in_buffer`` counts the episodes still stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "marlbuf.compat.epymarl returns torch tensors, as EPyMARL's learners expect: "
        "pip install 'marlbuf[algos]'"
    ) from exc

from marlbuf.buffer import MultiAgentReplayBuffer
from marlbuf.samplers import Episodes
from marlbuf.spec import AgentSpec, FieldSpec

#: the key EPyMARL reserves for its mask of real steps
FILLED = "filled"


def _numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of a torch dtype (``None``: float32, EPyMARL's default)."""
    if dtype is None:
        return np.dtype(np.float32)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"scheme dtypes must be torch dtypes (e.g. torch.long); got {dtype!r}")
    return torch.empty(0, dtype=dtype).numpy().dtype


def _vshape(key: str, info: Mapping[str, Any]) -> tuple[int, ...]:
    if "vshape" not in info:
        raise ValueError(
            f"scheme[{key!r}] must define vshape (e.g. {{'vshape': (5,)}}); got {info}"
        )
    vshape = info["vshape"]
    shape = (vshape,) if isinstance(vshape, (int, np.integer)) else tuple(vshape)
    if not all(isinstance(n, (int, np.integer)) and n >= 1 for n in shape):
        raise ValueError(f"scheme[{key!r}]['vshape'] must be positive ints; got {vshape!r}")
    return tuple(int(n) for n in shape)


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class EpisodeBatch:
    """A batch of padded episodes with EPyMARL's ``EpisodeBatch`` interface (read side).

    Parameters
    ----------
    scheme : dict
        Field descriptions (EPyMARL's scheme, with ``filled`` and the preprocessed fields).
    groups : dict
        Group name -> number of members.
    batch_size : int
        Episodes ``B``.
    max_seq_length : int
        Steps ``T`` per episode.
    data : SimpleNamespace
        ``transition_data`` (key -> tensor ``(B, T, ...)``) and ``episode_data`` (key ->
        tensor ``(B, ...)``).
    device : str or torch.device
        Where the tensors are.

    Notes
    -----
    Indexing follows EPyMARL: ``batch[key]`` is the tensor of one field; ``batch[(k1, k2)]`` a
    batch of those fields; ``batch[items]`` with a batch index (an int, a slice, a list or an
    array of episode rows), or a pair ``(episodes, time)`` whose time part is an int or a slice,
    a batch of those rows and steps (views for slices, copies for lists and arrays).
    """

    def __init__(
        self,
        scheme: Mapping[str, Any],
        groups: Mapping[str, int],
        batch_size: int,
        max_seq_length: int,
        data: SimpleNamespace,
        device: Any = "cpu",
    ) -> None:
        self.scheme = dict(scheme)
        self.groups = dict(groups)
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.data = data
        self.device = device

    def to(self, device: Any) -> None:
        """Move every tensor to ``device`` (in place, as EPyMARL's)."""
        for store in (self.data.transition_data, self.data.episode_data):
            for key, value in store.items():
                store[key] = value.to(device)
        self.device = device

    def max_t_filled(self) -> torch.Tensor:
        """The longest episode's filled steps (a tensor of shape (1,), as EPyMARL's)."""
        return torch.sum(self.data.transition_data[FILLED], 1).max(0)[0]

    def __getitem__(self, item: Any) -> Any:
        transition, episode = self.data.transition_data, self.data.episode_data
        if isinstance(item, str):
            if item in episode:
                return episode[item]
            if item in transition:
                return transition[item]
            raise ValueError(f"no field {item!r}; fields: {[*transition, *episode]}")
        if isinstance(item, tuple) and item and all(isinstance(k, str) for k in item):
            data = SimpleNamespace(transition_data={}, episode_data={})
            for key in item:
                if key in transition:
                    data.transition_data[key] = transition[key]
                elif key in episode:
                    data.episode_data[key] = episode[key]
                else:
                    raise KeyError(f"Unrecognised key {key}")
            scheme = {key: self.scheme[key] for key in item}
            groups = {
                self.scheme[key]["group"]: self.groups[self.scheme[key]["group"]]
                for key in item
                if "group" in self.scheme[key]
            }
            return EpisodeBatch(
                scheme, groups, self.batch_size, self.max_seq_length, data, self.device
            )
        rows, steps = self._parse(item)
        data = SimpleNamespace(
            transition_data={k: v[rows, steps] for k, v in transition.items()},
            episode_data={k: v[rows] for k, v in episode.items()},
        )
        return EpisodeBatch(
            self.scheme,
            self.groups,
            _count(rows, self.batch_size),
            _count(steps, self.max_seq_length),
            data,
            self.device,
        )

    @staticmethod
    def _parse(item: Any) -> tuple[Any, Any]:
        if not isinstance(item, tuple):
            item = (item, slice(None))
        if len(item) != 2:
            raise IndexError(f"index an EpisodeBatch by (episodes, time); got {item!r}")
        rows, steps = item
        if isinstance(steps, list):
            raise IndexError("Indexing across Time must be contiguous")
        rows = slice(rows, rows + 1) if isinstance(rows, (int, np.integer)) else rows
        steps = slice(steps, steps + 1) if isinstance(steps, (int, np.integer)) else steps
        if isinstance(rows, np.ndarray):
            rows = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        elif isinstance(rows, list):
            rows = torch.tensor(rows, dtype=torch.int64)
        return rows, steps

    def __repr__(self) -> str:
        return (
            f"EpisodeBatch. Batch Size:{self.batch_size} Max_seq_len:{self.max_seq_length} "
            f"Keys:{self.scheme.keys()} Groups:{self.groups.keys()}"
        )


def _count(index: Any, size: int) -> int:
    """Entries an index selects out of ``size`` (a slice, a list, an array or a tensor)."""
    if isinstance(index, slice):
        return len(range(*index.indices(size)))
    return len(index)


class ReplayBuffer:
    """EPyMARL's episode ``ReplayBuffer`` on a :class:`~marlbuf.MultiAgentReplayBuffer`.

    Parameters
    ----------
    scheme : dict
        EPyMARL's scheme: key -> ``{"vshape": int or tuple, "group": name (optional), "dtype":
        torch dtype (default float32), "episode_const": bool (optional)}``. ``"filled"`` is
        reserved.
    groups : dict
        Group name -> members (``{"agents": n_agents}``).
    buffer_size : int
        Episodes kept (the newest ``buffer_size``).
    max_seq_length : int
        Steps per stored episode at most (EPyMARL: ``episode_limit + 1``); batches have this
        many steps.
    preprocess : dict, optional
        ``{key: (new_key, [transforms])}``: ``new_key`` is computed from ``key`` by the
        transforms when a batch is gathered.
    device : str or torch.device, default "cpu"
        Where sampled batches' tensors go.
    capacity_steps : int, optional
        Steps the underlying buffer stores; default ``buffer_size * max_seq_length`` (see the
        module notes).
    rng : numpy Generator, optional
        Draws episode positions; default: NumPy's global generator (``np.random.choice``), as
        EPyMARL's buffer.

    Attributes
    ----------
    buffer : MultiAgentReplayBuffer
        The store (an :class:`~marlbuf.samplers.Episodes` sampler keeps its episode index).
    last_episode_ids : ndarray, shape (B,), int64
        The ring positions of the latest ``sample``'s episodes, in batch order.

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> scheme = {"obs": {"vshape": 4, "group": "agents"}, "reward": {"vshape": (1,)},
    ...           "actions": {"vshape": (1,), "group": "agents", "dtype": torch.long}}
    >>> buf = ReplayBuffer(scheme, {"agents": 2}, buffer_size=10, max_seq_length=6)
    >>> filled = torch.zeros(1, 6, 1, dtype=torch.long)
    >>> filled[0, :4] = 1
    >>> episode = SimpleNamespace(batch_size=1, max_seq_length=6, data=SimpleNamespace(
    ...     transition_data={"obs": torch.ones(1, 6, 2, 4), "filled": filled}, episode_data={}))
    >>> buf.insert_episode_batch(episode)
    >>> batch = buf.sample(1)
    >>> batch["obs"].shape, int(batch.max_t_filled()), float(batch["obs"][0, 4].sum())
    (torch.Size([1, 6, 2, 4]), 4, 0.0)
    """

    def __init__(
        self,
        scheme: Mapping[str, Any],
        groups: Mapping[str, int],
        buffer_size: int,
        max_seq_length: int,
        preprocess: Mapping[str, Any] | None = None,
        device: Any = "cpu",
        *,
        capacity_steps: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        if FILLED in scheme:
            raise ValueError('"filled" is a reserved key for masking; remove it from scheme')
        for name, value in (("buffer_size", buffer_size), ("max_seq_length", max_seq_length)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        self.buffer_size = int(buffer_size)
        self.max_seq_length = int(max_seq_length)
        self.groups = dict(groups)
        self.preprocess = dict(preprocess or {})
        self.device = device
        self.rng = rng
        self.scheme = {key: dict(info) for key, info in scheme.items()}
        #: per stored key: (marlbuf field name, group size or 0, vshape, numpy dtype, constant)
        self._fields: dict[str, tuple[str, int, tuple[int, ...], np.dtype, bool]] = {}
        for k, (key, info) in enumerate(self.scheme.items()):
            vshape = _vshape(key, info)
            group = info.get("group")
            if group is not None and group not in self.groups:
                raise ValueError(
                    f"scheme[{key!r}] is in group {group!r}, which groups does not size; "
                    f"groups={self.groups}"
                )
            members = int(self.groups[group]) if group is not None else 0
            dtype = _numpy_dtype(info.get("dtype"))
            self._fields[key] = (
                f"field{k}",
                members,
                vshape,
                dtype,
                bool(info.get("episode_const")),
            )
        for key, (new_key, transforms) in self.preprocess.items():
            if key not in self._fields:
                raise ValueError(f"preprocess key {key!r} is not in scheme {list(self.scheme)}")
            vshape, dtype = self.scheme[key]["vshape"], self.scheme[key].get("dtype", torch.float32)
            for transform in transforms:
                vshape, dtype = transform.infer_output_info(vshape, dtype)
            self.scheme[new_key] = {"vshape": vshape, "dtype": dtype}
            for copied in ("group", "episode_const"):
                if copied in self.scheme[key]:
                    self.scheme[new_key][copied] = self.scheme[key][copied]
        self.scheme[FILLED] = {"vshape": (1,), "dtype": torch.long}
        # agents: the members of the largest group (every group field is stored per member)
        self._members = max([m for _, m, _, _, _ in self._fields.values()] + [1])
        agents = [f"member_{i}" for i in range(self._members)]
        extras = {
            name: FieldSpec(vshape, dtype)
            for name, members, vshape, dtype, _ in self._fields.values()
            if members
        }
        globals_ = {
            name: FieldSpec(vshape if not members else (members, *vshape), dtype)
            for name, members, vshape, dtype, _ in self._fields.values()
            if not members or members != self._members
        }
        extras = {n: s for n, s in extras.items() if n not in globals_}
        # the transition fields are not EPyMARL's: one byte each, and no next_obs at all
        # (next_obs="none"; episodes end by truncation, and without next observations no step
        # is taken for a stream break)
        spec = AgentSpec(
            (1,), (1,), np.uint8, np.uint8, None, np.uint8, np.uint8, extras=extras or None
        )
        capacity = (
            self.buffer_size * self.max_seq_length if capacity_steps is None else capacity_steps
        )
        self.buffer = MultiAgentReplayBuffer(
            {a: spec for a in agents},
            capacity,
            sampler=Episodes(),
            next_obs="none",
            global_fields=globals_ or None,
            seed=0,
        )
        self._agents = agents
        #: the scheme's fields: a batch gathers these only (the one-byte transition fields
        #: are never read)
        self._gathered = tuple(name for name, *_ in self._fields.values())
        #: per ring position: the first slot of its episode, that slot's write generation
        self._first = np.zeros(self.buffer_size, dtype=np.int64)
        self._generation = np.full(self.buffer_size, -1, dtype=np.int64)
        self.buffer_index = 0
        self._positions_used = 0
        self.last_episode_ids = np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------------ writing
    def insert_episode_batch(self, ep_batch: Any) -> None:
        """Store the episodes of ``ep_batch`` (EPyMARL's ``EpisodeBatch`` or one of this
        module's): the filled steps of each, in order, at the next ring positions."""
        transition = {k: _as_numpy(v) for k, v in ep_batch.data.transition_data.items()}
        episode = {k: _as_numpy(v) for k, v in ep_batch.data.episode_data.items()}
        if FILLED not in transition:
            raise ValueError("the episode batch has no 'filled' field (its mask of real steps)")
        filled = transition[FILLED].reshape(transition[FILLED].shape[:2]) != 0  # (E, T)
        count, steps = filled.shape
        lengths = filled.sum(axis=1)
        if not (filled == (np.arange(steps) < lengths[:, None])).all():
            raise ValueError("'filled' must mark a prefix of each episode's steps (1s, then 0s)")
        if (lengths < 1).any() or lengths.max() > self.max_seq_length:
            raise ValueError(
                f"every episode needs 1 to max_seq_length={self.max_seq_length} filled steps; "
                f"got {lengths.tolist()}"
            )
        total = int(lengths.sum())
        if total > self.buffer.capacity:
            raise ValueError(
                f"{total} filled steps do not fit capacity_steps={self.buffer.capacity}; insert "
                "fewer episodes at once or build the buffer with a larger capacity_steps"
            )
        for key in (*transition, *episode):
            if key not in self.scheme:
                raise KeyError(f"{key} not found in transition or episode data")
        rows = np.broadcast_to(np.arange(steps), filled.shape)[filled]  # step of each row
        episode_of = np.repeat(np.arange(count), lengths)
        extras: dict[str, Any] = {}
        for key, (name, members, vshape, dtype, constant) in self._fields.items():
            shape = (members, *vshape) if members else vshape
            source = episode.get(key) if constant else transition.get(key)
            if source is None:
                values = np.zeros((total, *shape), dtype)
            elif constant:
                values = source.reshape(count, *shape)[episode_of]
            elif count == 1:  # one episode (an episode runner's insert): its first rows
                values = source.reshape(steps, *shape)[:total]
            else:
                values = source.reshape(count, steps, *shape)[episode_of, rows]
            if members and members == self._members:
                extras[name] = {a: values[:, i] for i, a in enumerate(self._agents)}
            else:
                extras[name] = values
        one = np.zeros((total, 1), np.uint8)
        scalar = np.zeros(total, np.uint8)
        per_agent = {a: one for a in self._agents}
        per_agent_scalar = {a: scalar for a in self._agents}
        ends = np.cumsum(lengths)
        truncated = np.zeros(total, dtype=bool)
        truncated[ends - 1] = True
        cursor = self.buffer.cursor
        self.buffer.extend(
            per_agent,
            per_agent,
            per_agent_scalar,
            done=per_agent_scalar,
            truncated=truncated,
            **extras,
        )
        firsts = (cursor + ends - lengths) % self.buffer.capacity
        positions = (self.buffer_index + np.arange(count)) % self.buffer_size
        self._first[positions] = firsts
        self._generation[positions] = self.buffer.write_generation[firsts]
        self.buffer_index = int((self.buffer_index + count) % self.buffer_size)
        self._positions_used = min(self.buffer_size, self._positions_used + count)

    # ------------------------------------------------------------------------ sampling
    def _held(self) -> np.ndarray:
        """Per used ring position, whether its episode is still stored (shape (n,), bool)."""
        used = self._positions_used
        firsts = self._first[:used]
        return self.buffer.write_generation[firsts] == self._generation[:used]

    @property
    def episodes_in_buffer(self) -> int:
        """Episodes that can be drawn (EPyMARL's count; see ``capacity_steps``)."""
        return int(np.count_nonzero(self._held()))

    def can_sample(self, batch_size: int) -> bool:
        """Whether ``batch_size`` distinct episodes are stored."""
        return self.episodes_in_buffer >= batch_size

    def sample(self, batch_size: int) -> EpisodeBatch:
        """``batch_size`` distinct stored episodes, drawn uniformly (see the module notes)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int; got batch_size={batch_size!r}")
        held = self._held()
        available = int(np.count_nonzero(held))
        if not 1 <= batch_size <= available:
            raise ValueError(
                f"batch_size={batch_size} distinct episodes, but {available} are stored; "
                "check can_sample(batch_size) first"
            )
        choice = np.random.choice if self.rng is None else self.rng.choice
        if held.all():
            if available == batch_size:
                ids = np.arange(batch_size, dtype=np.int64)
            else:
                ids = np.asarray(choice(available, batch_size, replace=False), dtype=np.int64)
        else:
            ids = np.asarray(choice(np.flatnonzero(held), batch_size, replace=False), np.int64)
        self.last_episode_ids = ids
        return self._gather(ids)

    def episodes(self, ids: Any) -> EpisodeBatch:
        """The episodes at ring positions ``ids`` (shape (B,), ints in
        ``[0, buffer_size)``, stored), padded to ``max_seq_length`` steps."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or not ids.size:
            raise ValueError(f"ids must be a non-empty 1-D array of positions; got {ids!r}")
        used = self._positions_used
        if ids.min() < 0 or ids.max() >= used or not self._held()[ids].all():
            raise ValueError(f"ids must be positions of stored episodes (of {used}); got {ids}")
        return self._gather(ids)

    def _gather(self, ids: np.ndarray) -> EpisodeBatch:
        """:meth:`episodes` of checked ``ids``. Every tensor is contiguous, as EPyMARL's (its
        learners may call ``view`` on them): one copy out of the gathered block per field."""
        batch = self.buffer.gather_sequences(
            self._first[ids], self.max_seq_length, fields=self._gathered
        )
        mask = batch.mask
        transition: dict[str, torch.Tensor] = {}
        episode: dict[str, torch.Tensor] = {}
        for key, (name, members, _, _, constant) in self._fields.items():
            if members and members == self._members:
                values = batch.stacked(name)  # (B, T, members, *vshape), a view where it can
            else:
                values = batch.globals[name]
            tensor = torch.from_numpy(np.ascontiguousarray(values))
            if constant:
                episode[key] = tensor[:, 0].clone()
            else:
                transition[key] = tensor
        hidden: torch.Tensor | None = None
        for key, (new_key, transforms) in self.preprocess.items():
            source = episode[key] if key in episode else transition[key]
            value = source
            for transform in transforms:
                value = transform.transform(value)
            if key in episode:
                episode[new_key] = value
            else:
                if hidden is None:
                    hidden = torch.from_numpy(~mask)
                # zero past the filled steps, as EPyMARL's buffer holds it
                shape = (*hidden.shape, *([1] * (value.dim() - 2)))
                value = value.masked_fill_(hidden.view(shape), 0)
                transition[new_key] = value
        transition[FILLED] = torch.from_numpy(mask.astype(np.int64)[..., None])
        out = EpisodeBatch(
            self.scheme,
            self.groups,
            int(ids.shape[0]),
            self.max_seq_length,
            SimpleNamespace(transition_data=transition, episode_data=episode),
            "cpu",
        )
        if str(self.device) != "cpu":
            out.to(self.device)
        else:
            out.device = self.device
        return out

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer. {self.episodes_in_buffer}/{self.buffer_size} episodes. "
            f"Keys:{self.scheme.keys()} Groups:{self.groups.keys()}"
        )


__all__ = ["EpisodeBatch", "ReplayBuffer"]
