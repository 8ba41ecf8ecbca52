"""EPyMARL-style episode replay (``components/episode_buffer.py``'s ``ReplayBuffer``) on marlbuf.

EPyMARL (and PyMARL) keep a ring of ``buffer_size`` whole episodes, each padded to
``max_seq_length`` steps with a ``filled`` mask, and train QMIX, VDN, MAPPO and the other
learners on ``buffer.sample(batch_size)``: ``batch_size`` distinct episodes drawn uniformly. This
module gives the same interface over a compact ring of steps: only the filled steps of each
episode are stored, one row per step holding every scheme field at a fixed byte offset, and the
ring grows with the steps stored (variable-length episodes take the memory of their real
steps; fixed-length episodes of ``max_seq_length`` steps occupy exactly the rows padding would,
so nothing is lost on them either). EPyMARL is not imported: the buffer reads any episode batch
that has ``data.transition_data`` / ``data.episode_data`` dicts of tensors (what EPyMARL's
runners build), and returns :class:`EpisodeBatch` objects that its learners use unchanged
(``batch["obs"][:, t]``, ``batch[:, :max_t]``, ``max_t_filled()``, ``to(device)``,
``batch_size``, ``max_seq_length``, ``device``).

Both directions are one kernel call per batch (:mod:`marlbuf._kernels.padded`):

* ``insert_episode_batch`` reads each field of the batch as it is (a view of the tensor's
  memory, no conversion when its dtype is the scheme's), checks the whole batch in one pass
  (``filled`` a prefix of 1 to ``max_seq_length`` steps per episode, every float finite, every
  index of a one-hot field in range) and only then writes the filled steps into the ring; a
  rejected batch changes nothing.
* ``sample`` writes every field of the drawn episodes, zeros past each episode's end, the
  one-hot fields and ``filled``, into one block of memory recycled once no tensor of an earlier
  batch views it; what does not depend on the draw (row offsets, output layout per batch size,
  field checks) is computed once per buffer.

Semantics kept:

* ``scheme``/``groups``/``preprocess`` as EPyMARL takes them (``vshape``, ``group``, ``dtype``,
  ``episode_const``; ``preprocess = {key: (new_key, [transforms])}`` with transforms that have
  ``transform(tensor)`` and ``infer_output_info(vshape, dtype)``, such as EPyMARL's ``OneHot``).
* ``insert_episode_batch`` fills a ring of ``buffer_size`` episode positions; an episode's
  steps are the rows where ``filled`` is 1 (a prefix of the padded episode), stored in order.
  Values of another dtype than the scheme's are converted, as EPyMARL's copy converts them.
* ``sample(batch_size)`` draws ``batch_size`` distinct positions with
  ``np.random.choice(episodes_in_buffer, batch_size, replace=False)`` (NumPy's global legacy
  generator, as EPyMARL; pass ``rng=`` for a generator of your own), or takes positions
  ``0 .. batch_size - 1`` in order when that is every stored episode. Every field comes back
  as a contiguous ``(batch_size, max_seq_length, ...)`` tensor (per group member
  ``(..., n_members, *vshape)``) with zeros past each episode's filled steps, ``filled`` as an
  int64 ``(B, max_seq_length, 1)`` tensor, and the preprocessed fields computed from their
  source field.

Differences:

* Preprocessed fields (``actions_onehot``) are not stored: they are computed again from their
  source field when a batch is gathered (the same transform EPyMARL's insert applies; a
  transform that one-hot encodes an int64 field, which the buffer checks by running it on every
  class at construction, is computed by the gather kernel), and are zero past the filled steps,
  as in EPyMARL's buffer after a runner's insert. The insert runs the check the transform
  implies, as EPyMARL's insert runs the transform: an index out of range is refused there.
* Episode constants (``episode_const``) are stored with every step of their episode.
* NaN or inf in a float field is refused at the insert (EPyMARL stores it).
* ``capacity_steps`` bounds the stored steps. The default, ``buffer_size * max_seq_length``,
  holds the newest ``buffer_size`` episodes whatever their lengths (EPyMARL's exact window).
  A smaller value bounds the memory when episodes are shorter than ``max_seq_length``; an
  episode of the window whose steps do not fit is then no longer drawn, and
  ``episodes_in_buffer`` counts the episodes still stored.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "marlbuf.compat.epymarl returns torch tensors, as EPyMARL's learners expect: "
        "pip install 'marlbuf[algos]'"
    ) from exc

from marlbuf import _config
from marlbuf._kernels.padded import (
    BAD_LENGTH,
    CHECK_FLOAT32,
    CHECK_FLOAT64,
    CHECK_INDEX32,
    CHECK_INDEX64,
    NOT_FINITE,
    NOT_PREFIX,
    gather_episodes,
    store_episodes,
)
from marlbuf.storage import BlockPool, available_memory_bytes

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
    """A tensor's (or array's) values as a NumPy array, without a copy on the CPU."""
    if isinstance(value, torch.Tensor):
        try:
            return value.numpy()  # a CPU tensor that needs no gradient: the common case
        except (RuntimeError, TypeError):
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
        #: the longest episode's filled steps when the gather knew it (``None``: counted)
        self._max_filled: int | None = None

    def to(self, device: Any) -> None:
        """Move every tensor to ``device`` (in place, as EPyMARL's)."""
        for store in (self.data.transition_data, self.data.episode_data):
            for key, value in store.items():
                store[key] = value.to(device)
        self.device = device

    def max_t_filled(self) -> torch.Tensor:
        """The longest episode's filled steps (a tensor of shape (1,), as EPyMARL's)."""
        if self._max_filled is not None:
            return torch.full((1,), self._max_filled, dtype=torch.long, device=self.device)
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
        every = rows.__class__ is slice and rows == _EVERY
        if every and steps.__class__ is slice and steps.step is None:
            # batch[:, :max_t], the learners' truncation: views of every episode (the tensors
            # themselves where the slice keeps every step: fixed-length episodes)
            whole = steps.start in (None, 0) and (
                steps.stop is None or steps.stop >= self.max_seq_length
            )
            data = SimpleNamespace(
                transition_data=dict(transition)
                if whole
                else {k: v[:, steps] for k, v in transition.items()},
                episode_data=dict(episode),
            )
        else:
            data = SimpleNamespace(
                transition_data={k: v[rows, steps] for k, v in transition.items()},
                episode_data={k: v[rows] for k, v in episode.items()},
            )
        out = EpisodeBatch(
            self.scheme,
            self.groups,
            _count(rows, self.batch_size),
            _count(steps, self.max_seq_length),
            data,
            self.device,
        )
        if self._max_filled is not None and every:
            out._max_filled = min(self._max_filled, out.max_seq_length)
        return out

    @staticmethod
    def _parse(item: Any) -> tuple[Any, Any]:
        if not isinstance(item, tuple):
            item = (item, slice(None))
        if len(item) != 2:
            raise IndexError(f"index an EpisodeBatch by (episodes, time); got {item!r}")
        rows, steps = item
        if isinstance(steps, list):
            raise IndexError("Indexing across Time must be contiguous")
        if isinstance(steps, slice) and isinstance(steps.stop, torch.Tensor):
            steps = slice(steps.start, int(steps.stop), steps.step)  # [:, :max_t_filled()]
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


#: the one-hot outputs of a gather without one-hot fields (the kernel takes a non-empty tuple)
_NO_ONE_HOT = (np.zeros(0, dtype=np.float32),)

#: the batch index of every episode (``batch[:, ...]``)
_EVERY = slice(None)


def _count(index: Any, size: int) -> int:
    """Entries an index selects out of ``size`` (a slice, a list, an array or a tensor)."""
    if isinstance(index, slice):
        return len(range(*index.indices(size)))
    return len(index)


class _Field(NamedTuple):
    """A stored scheme field: where its values sit in a row and what they are."""

    key: str
    #: the values of one step: ``(members, *vshape)`` for a group field, else ``vshape``
    shape: tuple[int, ...]
    dtype: np.dtype
    #: an episode constant (``episode_const``): one value per episode, stored with every step
    constant: bool
    #: byte offset in a row, and bytes per step
    offset: int
    width: int


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
    return int(value)


def _one_hot_classes(transforms: Any, vshape: tuple[int, ...], dtype: Any) -> int | None:
    """The number of classes when ``transforms`` is one transform that one-hot encodes an
    integer field of ``vshape`` ``(1,)`` into float32 (as EPyMARL's ``OneHot``), checked by
    running it on every class; else ``None`` (the transforms are then run as they are)."""
    if len(transforms) != 1 or vshape != (1,) or dtype.is_floating_point or dtype == torch.bool:
        return None
    transform = transforms[0]
    try:
        out_vshape, out_dtype = transform.infer_output_info(vshape, dtype)
        out = (out_vshape,) if isinstance(out_vshape, (int, np.integer)) else tuple(out_vshape)
        if len(out) != 1 or out_dtype != torch.float32 or not 1 <= int(out[0]) <= 2**20:
            return None
        classes = int(out[0])
        probe = torch.arange(classes, dtype=dtype).view(1, classes, 1).expand(2, -1, -1)
        got = transform.transform(probe)
    except Exception:  # not a transform of this kind: it is run as it is
        return None
    expected = torch.eye(classes).expand(2, -1, -1)
    if got.dtype != torch.float32 or got.shape != expected.shape or not torch.equal(got, expected):
        return None
    return classes


class ReplayBuffer:
    """EPyMARL's episode ``ReplayBuffer`` on a compact ring of steps (see the module notes).

    Parameters
    ----------
    scheme : dict
        EPyMARL's scheme: key -> ``{"vshape": int or tuple, "group": name (optional), "dtype":
        torch dtype (default float32), "episode_const": bool (optional)}``. ``"filled"`` is
        reserved.
    groups : dict
        Group name -> members, a positive int (``{"agents": n_agents}``).
    buffer_size : int
        Episodes kept (the newest ``buffer_size``).
    max_seq_length : int
        Steps per stored episode at most (EPyMARL: ``episode_limit + 1``); batches have this
        many steps.
    preprocess : dict, optional
        ``{key: (new_key, [transforms])}``: ``new_key`` is computed from ``key`` by the
        transforms when a batch is gathered (a one-hot transform such as EPyMARL's ``OneHot``
        by the gather kernel itself). Each insert runs the check the transforms imply: indices
        of a one-hot field outside its classes, or values any other transform refuses, are a
        ``ValueError`` at the insert.
    device : str or torch.device, default "cpu"
        Where sampled batches' tensors go.
    capacity_steps : int, optional
        Steps the ring holds at most, at least ``max_seq_length``; default
        ``buffer_size * max_seq_length``, which holds the newest ``buffer_size`` episodes
        whatever their lengths (EPyMARL's exact window). The ring grows with the steps stored,
        up to this bound, so episodes shorter than ``max_seq_length`` take the memory of their
        steps only.
    rng : numpy Generator, optional
        Draws episode positions; default: NumPy's global generator (``np.random.choice``), as
        EPyMARL's buffer.

    Attributes
    ----------
    last_episode_ids : ndarray, shape (B,), int64
        The ring positions of the latest ``sample``'s episodes, in batch order.
    nbytes : int
        Bytes of memory the ring's rows take (those ever written; see :attr:`nbytes`).
    row_bytes : int
        Bytes of one stored step (every stored scheme field).

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
        self.buffer_size = _positive_int("buffer_size", buffer_size)
        self.max_seq_length = _positive_int("max_seq_length", max_seq_length)
        self.groups = {name: _positive_int(f"groups[{name!r}]", n) for name, n in groups.items()}
        capacity = (
            self.buffer_size * self.max_seq_length if capacity_steps is None else capacity_steps
        )
        if (
            isinstance(capacity, bool)
            or not isinstance(capacity, (int, np.integer))
            or capacity < self.max_seq_length
        ):
            raise ValueError(
                f"capacity_steps must be an int of at least max_seq_length={self.max_seq_length} "
                f"(room for one whole episode); got capacity_steps={capacity_steps!r}"
            )
        self.capacity_steps = int(capacity)
        self.preprocess = dict(preprocess or {})
        self.device = device
        self.rng = rng
        self.scheme = {key: dict(info) for key, info in scheme.items()}
        if not self.scheme:
            raise ValueError("scheme must describe at least one field; got an empty scheme")
        stored = []
        for key, info in self.scheme.items():
            vshape = _vshape(key, info)
            group = info.get("group")
            if group is not None and group not in self.groups:
                raise ValueError(
                    f"scheme[{key!r}] is in group {group!r}, which groups does not size; "
                    f"groups={self.groups}"
                )
            shape = (self.groups[group], *vshape) if group is not None else vshape
            stored.append((key, shape, _numpy_dtype(info.get("dtype")), info))
        # a row: the fields by decreasing item size, each at a multiple of its item size,
        # padded to 8 bytes (index fields read as int64 by the gather sit on 8-byte offsets)
        stored.sort(key=lambda f: -f[2].itemsize)
        offset = 0
        self._fields: list[_Field] = []
        for key, shape, dtype, info in stored:
            offset += -offset % dtype.itemsize
            width = int(np.prod(shape)) * dtype.itemsize
            self._fields.append(
                _Field(key, shape, dtype, bool(info.get("episode_const")), offset, width)
            )
            offset += width
        self.row_bytes = max(8, offset + -offset % 8)
        self._index = {f.key: k for k, f in enumerate(self._fields)}
        checks = np.zeros(len(self._fields), dtype=np.int64)
        limits = np.zeros(len(self._fields), dtype=np.int64)
        #: preprocessed fields the gather one-hot encodes: new key -> (field index, classes)
        self._one_hot: dict[str, tuple[int, int]] = {}
        #: preprocessed fields computed by their transforms at each gather
        self._transformed: dict[str, tuple[str, list[Any]]] = {}
        for k, f in enumerate(self._fields):
            if f.dtype.kind == "f" and f.dtype.itemsize in (4, 8):
                checks[k] = CHECK_FLOAT32 if f.dtype.itemsize == 4 else CHECK_FLOAT64
        for key, (new_key, transforms) in self.preprocess.items():
            if key not in self._index:
                raise ValueError(f"preprocess key {key!r} is not in scheme {list(self.scheme)}")
            vshape, dtype = self.scheme[key]["vshape"], self.scheme[key].get("dtype", torch.float32)
            classes = _one_hot_classes(list(transforms), _vshape(key, self.scheme[key]), dtype)
            for transform in transforms:
                vshape, dtype = transform.infer_output_info(vshape, dtype)
            self.scheme[new_key] = {"vshape": vshape, "dtype": dtype}
            for copied in ("group", "episode_const"):
                if copied in self.scheme[key]:
                    self.scheme[new_key][copied] = self.scheme[key][copied]
            k = self._index[key]
            f = self._fields[k]
            if classes is not None and f.dtype in (np.int64, np.int32):
                checks[k] = CHECK_INDEX64 if f.dtype == np.int64 else CHECK_INDEX32
                limits[k] = classes
                if f.dtype == np.int64 and not f.constant:
                    self._one_hot[new_key] = (k, classes)
                    continue
            self._transformed[new_key] = (key, list(transforms))
        self.scheme[FILLED] = {"vshape": (1,), "dtype": torch.long}
        self._checks, self._limits = checks, limits
        self._offsets = np.array([f.offset for f in self._fields], dtype=np.int64)
        self._widths = np.array([f.width for f in self._fields], dtype=np.int64)
        self._constant = np.array([f.constant for f in self._fields], dtype=bool)
        self._one_hot_plan = np.array(
            [
                [self._fields[k].offset, self._fields[k].shape[0], classes]
                for k, classes in self._one_hot.values()
            ],
            dtype=np.int64,
        ).reshape(-1, 3)
        largest = self.capacity_steps * self.row_bytes
        available = available_memory_bytes()
        if available is not None and largest > _config.MEMORY_WARN_FRACTION * available:
            raise MemoryError(
                f"capacity_steps={self.capacity_steps} steps of {self.row_bytes} bytes "
                f"({largest / 2**30:.2f} GiB) would not fit this machine's available memory "
                f"({available / 2**30:.2f} GiB); pass a smaller capacity_steps or buffer_size"
            )
        #: the rows: a reservation of capacity_steps + max_seq_length rows of which only the
        #: rows written are backed by memory (an anonymous mapping: its pages are zero until
        #: touched), each episode at its own first row (see _place)
        rows = self.capacity_steps + self.max_seq_length
        # private anonymous memory (a shared mapping would be backed by shmem, page by page)
        self._reserved = mmap.mmap(
            -1, rows * self.row_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        )
        if hasattr(mmap, "MADV_HUGEPAGE"):  # fewer first-touch faults where the system allows
            try:
                self._reserved.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self._table = np.frombuffer(self._reserved, dtype=np.uint8).reshape(rows, self.row_bytes)
        #: per ring position: its episode's first row, filled steps and insertion number
        self._start = np.zeros(self.buffer_size, dtype=np.int64)
        self._length = np.zeros(self.buffer_size, dtype=np.int64)
        self._seq = np.full(self.buffer_size, -1, dtype=np.int64)
        self._inserted = 0  # episodes ever inserted (episode s sits at position s % buffer_size)
        self._oldest = 0  # the insertion number of the oldest episode still stored
        self._tail = 0  # the row after the newest episode
        self._ring = 0  # the ring's size: episodes wrap to row 0 at it (see _place)
        self._live_rows = 0  # rows of the episodes still stored
        self._high = 0  # rows ever written (the backed part of the reservation)
        self.buffer_index = 0
        self._positions_used = 0
        self.last_episode_ids = np.zeros(0, dtype=np.int64)
        self._problem = np.zeros(4, dtype=np.int64)
        self._pool = BlockPool(4)
        self._layouts: dict[int, list[tuple[int, int]]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of memory the rows take: those ever written (the rest of the reservation,
        ``(capacity_steps + max_seq_length) * row_bytes``, is address space the system backs
        with memory only when a row is first written)."""
        return self._high * self.row_bytes

    # ------------------------------------------------------------------------ writing
    def insert_episode_batch(self, ep_batch: Any) -> None:
        """Store the episodes of ``ep_batch`` (EPyMARL's ``EpisodeBatch`` or one of this
        module's): the filled steps of each, in order, at the next ring positions.

        One pass checks the whole batch before anything is stored (``filled`` a prefix of
        each episode with 1 to ``max_seq_length`` steps, every float finite, indices of
        one-hot fields in range, the shapes); a rejected batch raises ``ValueError`` (an
        unknown key ``KeyError``) and changes nothing."""
        transition = ep_batch.data.transition_data
        episode = ep_batch.data.episode_data
        for key in (*transition, *episode):
            if key not in self.scheme:
                raise KeyError(f"{key} not found in transition or episode data")
        if FILLED not in transition:
            raise ValueError("the episode batch has no 'filled' field (its mask of real steps)")
        filled = _as_numpy(transition[FILLED])
        if filled.ndim < 2 or filled.size != filled.shape[0] * filled.shape[1]:
            raise ValueError(
                f"'filled' must have shape (episodes, steps, 1); got {tuple(filled.shape)}"
            )
        count, steps = int(filled.shape[0]), int(filled.shape[1])
        filled = filled.reshape(count, steps)
        if filled.dtype != np.int64:
            filled = filled.astype(np.int64)
        sources = tuple(
            self._source(f, episode if f.constant else transition, count, steps)
            for f in self._fields
        )
        for new_key, (key, transforms) in self._transformed.items():
            self._run_transforms(new_key, key, transforms, transition, episode)
        lengths = np.count_nonzero(filled, axis=1).astype(np.int64)
        if count and (lengths.min() < 1 or lengths.max() > self.max_seq_length):
            bad = int(np.flatnonzero((lengths < 1) | (lengths > self.max_seq_length))[0])
            where = f"episode {bad} of the batch" if count > 1 else "the episode"
            raise ValueError(
                f"every episode needs 1 to max_seq_length={self.max_seq_length} filled steps; "
                f"{where} has {int(lengths[bad])}"
            )
        total = int(lengths.sum())
        if total > self.capacity_steps:
            raise ValueError(
                f"{total} filled steps do not fit capacity_steps={self.capacity_steps}; insert "
                "fewer episodes at once or build the buffer with a larger capacity_steps"
            )
        placed = self._place(lengths)
        if placed is None:
            self._compact(total)
            placed = self._place(lengths, packed=True)
            if placed is None:  # packed, _place makes room itself: not reached
                raise RuntimeError("no room for the batch after packing the ring")
        starts, oldest, live_rows, ring = placed
        if not store_episodes(
            filled, sources, self._constant, self._offsets, self._checks, self._limits,
            self.max_seq_length, self._table, starts, lengths, self._problem,
        ):  # fmt: skip
            raise self._refusal(count)
        seq = self._inserted + np.arange(count)
        taken = seq % self.buffer_size
        self._start[taken] = starts
        self._length[taken] = lengths
        self._seq[taken] = seq
        if count:
            self._tail = int(starts[-1] + lengths[-1])
            self._high = max(self._high, ring)
        self._ring = ring
        self._inserted += count
        self._oldest = oldest
        self._live_rows = live_rows
        self.buffer_index = self._inserted % self.buffer_size
        self._positions_used = min(self.buffer_size, self._inserted)

    def _source(self, f: _Field, data: Mapping[str, Any], count: int, steps: int) -> np.ndarray:
        """Field ``f`` of an inserted batch as bytes, shape ``(count * steps, width)`` (an
        episode constant ``(count, width)``); zeros where the batch does not hold it."""
        rows = count if f.constant else count * steps
        value = data.get(f.key)
        if value is None:
            return np.zeros((rows, f.width), dtype=np.uint8)
        array = _as_numpy(value)
        expected = (count, *f.shape) if f.constant else (count, steps, *f.shape)
        if array.size != rows * (f.width // f.dtype.itemsize):
            raise ValueError(
                f"{f.key} has shape {tuple(array.shape)}; the scheme needs {expected} for "
                f"{count} episodes of {steps} steps"
            )
        if array.dtype != f.dtype:
            array = array.astype(f.dtype)  # as EPyMARL's copy into its tensors converts
        return np.ascontiguousarray(array).reshape(rows, -1).view(np.uint8)

    def _run_transforms(
        self, new_key: str, key: str, transforms: list[Any], transition: Any, episode: Any
    ) -> None:
        """Run a preprocess entry's transforms on an inserted field, as EPyMARL's insert does,
        so that values they refuse are refused at the insert, not at a later sample."""
        value = (episode if self._fields[self._index[key]].constant else transition).get(key)
        if value is None:
            return
        try:
            for transform in transforms:
                value = transform.transform(value)
        except Exception as exc:
            raise ValueError(
                f"preprocess of {key!r} into {new_key!r} refuses the inserted values: {exc}"
            ) from exc

    def _place(
        self, lengths: np.ndarray, packed: bool = False
    ) -> tuple[np.ndarray, int, int, int] | None:
        """Where the episodes of an insert go, without changing anything: ``(starts, oldest,
        stored rows, ring size)`` after it, or ``None`` when the stored episodes must first be
        packed at the front of the rows (:meth:`_compact`).

        The episodes this insert's positions held leave first (the oldest of the window), then
        the oldest others while the stored steps would exceed ``capacity_steps``. The rows are
        a ring of a size of their own (``_ring``), at most the reservation: each episode takes
        consecutive rows after the newest one, and goes back to row 0 when it would pass the
        ring's size and the oldest episode left room there. While nothing has left, the ring
        grows with the episodes (the rows in use, and the memory they take, are what the
        stored episodes need); once it has wrapped, an episode that finds no room between the
        newest and the oldest episode asks for the packing, after which the ring grows by an
        eighth (``packed``: just packed, the oldest episodes leave instead, as when the
        stored steps reach ``capacity_steps``)."""
        size, inserted = self.buffer_size, self._inserted
        rows = self._table.shape[0]
        oldest, live, ring = self._oldest, self._live_rows, self._ring
        starts = np.zeros(lengths.shape[0], dtype=np.int64)

        def start_of(s: int) -> int:
            return int(starts[s - inserted]) if s >= inserted else int(self._start[s % size])

        def length_of(s: int) -> int:
            return int(lengths[s - inserted]) if s >= inserted else int(self._length[s % size])

        window = inserted + lengths.shape[0] - size  # the episodes whose positions are taken
        while oldest < min(window, inserted):
            live -= length_of(oldest)
            oldest += 1
        tail = self._tail
        for i, length in enumerate(int(n) for n in lengths):
            while live + length > self.capacity_steps:
                live -= length_of(oldest)
                oldest += 1
            while True:
                if oldest == inserted + i:  # nothing stored: start at the front
                    start = 0
                    break
                head = start_of(oldest)
                if head < tail:  # the stored rows are [head, tail)
                    if tail + length <= ring:
                        start = tail
                    elif length <= head:  # wrap, as a ring of this size
                        start = 0
                    elif tail + length <= rows:  # grow the ring
                        start = tail
                    else:  # capacity_steps keeps the stored steps below: not reached
                        raise RuntimeError(f"no rows for an episode of {length} steps")
                    break
                if tail + length <= head:  # stored: [head, ring) and [0, tail)
                    start = tail
                    break
                if not packed:
                    return None
                if oldest >= inserted:  # a reservation holds a whole batch: not reached
                    raise RuntimeError(f"no rows for an episode of {length} steps")
                live -= length_of(oldest)
                oldest += 1
            starts[i] = start
            tail = start + length
            ring = max(ring, tail)
            live += length
        return starts, oldest, live, ring

    def _compact(self, incoming: int) -> None:
        """Pack the stored episodes, oldest first, at the front of the rows and size the ring
        for them, ``incoming`` more rows and an eighth (a rare copy: the episodes have grown
        longer than the ring holds)."""
        size = self.buffer_size
        order = np.arange(self._oldest, self._inserted) % size
        lengths = self._length[order]
        rows = np.repeat(self._start[order] - np.cumsum(lengths) + lengths, lengths)
        rows += np.arange(rows.shape[0], dtype=np.int64)
        self._table[: rows.shape[0]] = self._table[rows]  # a gathered copy, then stored
        self._start[order] = np.cumsum(lengths) - lengths
        self._tail = int(lengths.sum())
        need = self._tail + incoming
        self._ring = min(self._table.shape[0], max(self._ring, need + need // 8))
        self._high = max(self._high, self._ring)

    def _refusal(self, count: int) -> ValueError:
        """The error of a batch :func:`store_episodes` refused (its ``problem``)."""
        code, k, e, t = (int(x) for x in self._problem)
        where = f"episode {e} of the batch" if count > 1 else "the episode"
        if code == NOT_PREFIX:
            return ValueError(
                f"'filled' must mark a prefix of each episode's steps (1s, then 0s); {where} "
                f"has a filled step {t} after an empty one"
            )
        if code == BAD_LENGTH:
            return ValueError(
                f"every episode needs 1 to max_seq_length={self.max_seq_length} filled steps; "
                f"{where} has {t}"
            )
        key = self._fields[k].key
        step = "" if self._fields[k].constant else f", step {t}"
        if code == NOT_FINITE:
            return ValueError(
                f"{key} holds NaN or inf ({where}{step}); clean the data before inserting it"
            )
        new_key, classes = next(
            ((n, c) for n, (j, c) in self._one_hot.items() if j == k), (key, self._limits[k])
        )
        return ValueError(
            f"{key} holds an index outside [0, {classes}) ({where}{step}), which the one-hot "
            f"preprocess into {new_key!r} cannot encode; insert actions in range"
        )

    # ------------------------------------------------------------------------ sampling
    def _held(self) -> np.ndarray:
        """Per used ring position, whether its episode is still stored (shape (n,), bool)."""
        return self._seq[: self._positions_used] >= self._oldest

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
        used = self._positions_used
        # episodes leave oldest first: every used position is held while the window's oldest is
        held = None if self._oldest <= self._inserted - used else self._held()
        available = used if held is None else int(np.count_nonzero(held))
        if not 1 <= batch_size <= available:
            raise ValueError(
                f"batch_size={batch_size} distinct episodes, but {available} are stored; "
                "check can_sample(batch_size) first"
            )
        choice = np.random.choice if self.rng is None else self.rng.choice
        if held is None:
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
        array = np.asarray(ids)
        if array.ndim != 1 or not array.size or array.dtype.kind not in "iu":
            raise ValueError(
                f"ids must be a non-empty 1-D array of int positions; got {ids!r} "
                f"(dtype {array.dtype})"
            )
        array = array.astype(np.int64)
        used = self._positions_used
        if array.min() < 0 or array.max() >= used or not self._held()[array].all():
            raise ValueError(f"ids must be positions of stored episodes (of {used}); got {ids}")
        return self._gather(array)

    def _layout(self, batch_size: int) -> list[tuple[int, int]]:
        """Per output of a gather of ``batch_size`` episodes (the fields, the one-hot fields,
        ``filled``), its byte offset and size in the batch's block (64-byte aligned)."""
        layout = self._layouts.get(batch_size)
        if layout is None:
            steps = self.max_seq_length
            sizes = [batch_size * (1 if f.constant else steps) * f.width for f in self._fields]
            sizes += [
                batch_size * steps * self._fields[k].shape[0] * classes * 4
                for k, classes in self._one_hot.values()
            ]
            sizes.append(batch_size * steps * 8)
            layout, offset = [], 0
            for size in sizes:
                layout.append((offset, size))
                offset += size + -size % 64
            self._layouts[batch_size] = layout
        return layout

    def _gather(self, ids: np.ndarray) -> EpisodeBatch:
        """:meth:`episodes` of checked ``ids``: one kernel call writes every field (and the
        one-hot fields and ``filled``) into one recycled block of memory; each tensor is a
        contiguous view of it, as EPyMARL's (its learners may call ``view`` on them)."""
        batch_size, steps = int(ids.shape[0]), self.max_seq_length
        layout = self._layout(batch_size)
        end = layout[-1][0] + layout[-1][1]
        block = self._pool.acquire(end)
        parts = [block[o : o + n] for o, n in layout]
        lengths = self._length[ids]
        n_fields = len(self._fields)
        gather_episodes(
            self._table, self._start[ids], lengths, steps, self._offsets, self._widths,
            self._constant, tuple(parts[:n_fields]), self._one_hot_plan,
            tuple(p.view(np.float32) for p in parts[n_fields:-1]) or _NO_ONE_HOT,
            parts[-1].view(np.int64),
        )  # fmt: skip
        transition: dict[str, torch.Tensor] = {}
        episode: dict[str, torch.Tensor] = {}
        for f, part in zip(self._fields, parts):
            lead = (batch_size,) if f.constant else (batch_size, steps)
            tensor = torch.from_numpy(part.view(f.dtype).reshape(*lead, *f.shape))
            (episode if f.constant else transition)[f.key] = tensor
        for (new_key, (k, classes)), part in zip(self._one_hot.items(), parts[n_fields:-1]):
            shape = (batch_size, steps, self._fields[k].shape[0], classes)
            transition[new_key] = torch.from_numpy(part.view(np.float32).reshape(shape))
        filled = parts[-1].view(np.int64).reshape(batch_size, steps, 1)
        for new_key, (key, transforms) in self._transformed.items():
            constant = key in episode
            value = episode[key] if constant else transition[key]
            for transform in transforms:
                value = transform.transform(value)
            if constant:
                episode[new_key] = value
            else:  # zero past the filled steps, as EPyMARL's buffer holds it
                hidden = torch.from_numpy(filled == 0).view(
                    batch_size, steps, *([1] * (value.dim() - 2))
                )
                transition[new_key] = value.masked_fill_(hidden, 0)
        transition[FILLED] = torch.from_numpy(filled)
        out = EpisodeBatch(
            self.scheme,
            self.groups,
            batch_size,
            steps,
            SimpleNamespace(transition_data=transition, episode_data=episode),
            "cpu",
        )
        out._max_filled = int(lengths.max())
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
