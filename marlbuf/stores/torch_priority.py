"""The priority index in tensors: float64 sum-trees (and max-trees) on a torch device.

:class:`TensorPriorityTrees` is the torch counterpart of :class:`marlbuf.prioritized.PriorityTrees`
(proportional prioritized replay, Schaul et al., 2016, Sec. 3.3): the same flat tree layout
(:mod:`marlbuf._kernels.sumtree`), the same rules for updates, searches and importance weights,
written as batched tensor operations so that a learner on a GPU updates and samples priorities
where its TD errors are, without copying them to the host and without waiting for the device.

* **No waits.** Updates validate their input on the device and apply it masked by the result:
  an update returns its result code as a 0-d tensor, and :func:`check_td_result` (or
  :func:`first_td_error` over several updates) waits for it when the caller chooses to. The
  running maximum priority is a tensor on the device too.
* **Work proportional to the batch.** An update of ``B`` entries sorts them (``O(B log B)``:
  the last write to a slot wins, as in the sequential kernel, with no atomics), writes the
  leaves, then recomputes only the touched parents, one tree level at a time
  (``O(B log capacity)``); a draw is ``B`` descents, one gather per level. No update or draw
  visits every slot: only saving and loading the state do.
* **The same bits as the Numba trees.** Every internal node is recomputed as
  ``left + right`` (``max(left, right)``) from its two children, never adjusted by a delta, so
  a tree is an exact function of its leaves: the function :func:`marlbuf._kernels.rebuild`
  computes, bit for bit. Raw priorities (``|d| + eps``, ...), max-trees and running maxima are
  bit-identical to the host index's. The sum-tree leaves ``priority ** alpha`` are too when
  ``alpha`` is 0 or 1; for other exponents they may differ in the last bit, since the host
  index itself raises to a power with two libraries (NumPy's vectorised ``**`` in
  ``fill_new``/``set``, the C library's ``pow`` inside the Numba update kernel) and torch has
  its own (SLEEF on the CPU, CUDA's libdevice), each within about one unit in the last place
  of the exact power, none correctly rounded. Searches and weights follow
  :func:`marlbuf._kernels.per_sample` operation by operation, so the same tree and the same
  uniforms give the same slots.

torch is imported by this module and the torch store's (:mod:`marlbuf.stores.torch`) only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from marlbuf._kernels.sumtree import (
    MODE_ABS,
    MODE_GIVEN,
    MODE_SQUARED,
    TD_NEGATIVE,
    TD_NOT_FINITE,
    TD_OK,
    TD_OVERFLOW,
)
from marlbuf.prioritized import checked_tree_state, finite_float, raise_td_error
from marlbuf.stores.torch_rows import check_device

Tensor = torch.Tensor
#: what the methods accept as indices and values: host arrays, sequences or tensors (on any
#: device; they are moved to the trees' device)
ArrayLike = Tensor | np.ndarray | Sequence[Any]


def check_td_result(
    code: Tensor | int, position: Tensor | int, td: ArrayLike, setting: str
) -> None:
    """Wait for the result of :meth:`TensorPriorityTrees.apply_td_errors` and raise its
    ``ValueError`` if the update was refused (then it wrote nothing).

    Parameters
    ----------
    code, position : Tensor, shape (), int64, or int
        The update's result code (``TD_OK`` = 0, ``TD_NOT_FINITE``, ``TD_NEGATIVE``,
        ``TD_OVERFLOW``) and the position of its first bad entry (-1 when none).
    td : Tensor or ndarray, shape (n,), real
        The TD errors the update was given (read only when it was refused).
    setting : str
        The sampler's options, named in the overflow message.
    """
    code_value = int(code)  # waits for the device
    if code_value != TD_OK:
        raise_td_error(code_value, int(position), torch.as_tensor(td), setting)


def first_td_error(
    results: Sequence[tuple[Tensor | int, Tensor | int, ArrayLike]],
) -> tuple[int, int, ArrayLike | None]:
    """The first refused update among several, with one wait for all their results.

    Parameters
    ----------
    results : sequence of (code, position, td)
        Results of :meth:`TensorPriorityTrees.apply_td_errors` (0-d tensors) with the TD errors
        each was given, in the order the updates were made.

    Returns
    -------
    (code, position, td) : (int, int, TD errors or None)
        The first result whose code is not ``TD_OK``, as Python ints; ``(TD_OK, -1, None)`` when
        every update was applied. Pass it to :func:`check_td_result` to raise.
    """
    if not results:
        return TD_OK, -1, None
    device = next((c.device for c, _, _ in results if isinstance(c, Tensor)), None)
    table = torch.stack(
        [
            torch.stack([torch.as_tensor(v, dtype=torch.int64, device=device) for v in (c, p)])
            for c, p, _ in results
        ]
    )
    for (code, position), (_, _, td) in zip(table.tolist(), results):  # one wait
        if code != TD_OK:
            return code, position, td
    return TD_OK, -1, None


def _run_ends(sorted_keys: Tensor) -> Tensor:
    """``True`` at the last entry of each run of equal values of ``sorted_keys`` (shape (n,))."""
    ends = torch.ones_like(sorted_keys, dtype=torch.bool)
    ends[:-1] = sorted_keys[:-1] != sorted_keys[1:]
    return ends


def _run_starts(sorted_keys: Tensor) -> Tensor:
    """``True`` at the first entry of each run of equal values of ``sorted_keys`` (shape (n,))."""
    starts = torch.ones_like(sorted_keys, dtype=torch.bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return starts


def _larger(left: Tensor, right: Tensor) -> Tensor:
    """Python's (and Numba's) ``max(left, right)``: ``left`` unless ``right`` is greater, so
    that ties between ``0.0`` and ``-0.0`` keep the same bits as the host kernels."""
    return torch.where(right > left, right, left)


class TensorPriorityTrees:
    """One float64 sum-tree of ``priority ** alpha`` per trainer over ``capacity`` slots, and
    optionally one max-tree of the raw priorities, in tensors on a torch device.

    The torch counterpart of :class:`marlbuf.prioritized.PriorityTrees`, with the same layout,
    the same update and search rules and the same state (see the module docstring for what is
    bit-identical). Updates and draws never wait for the device; :meth:`total`,
    :meth:`state_dict`, :meth:`probabilities` and :meth:`draw` do, since they return host
    values. Indices are trusted to be in ``[0, capacity)`` (the caller checks them on the host:
    an index out of range is an assertion on a CUDA device, not an exception).

    Why float64 and recomputed parents: a float32 tree, or one adjusted by ``new - old`` up the
    path, drifts after millions of updates until a subtree of zero leaves carries a small
    positive sum and gets sampled; a parent recomputed from its children has no drift at all.

    Parameters
    ----------
    capacity : int
        Slots (leaves), ``>= 1``.
    n_trees : int
        Trees (one per trainer), ``>= 1``.
    alpha : float
        Priority exponent, ``>= 0``; leaves hold ``priority ** alpha``.
    track_max : bool
        Also keep a max-tree of raw priorities per trainer.
    device : str or torch.device
        ``"cpu"``, ``"cuda"`` or ``"cuda:k"``.

    Attributes
    ----------
    sums : Tensor, shape (n_trees, 2 * leaf_offset), float64
        The sum-trees (root at column 1, slot ``s`` at column ``leaf_offset + s``; column 0 and
        the leaves past ``capacity`` stay 0).
    maxes : Tensor, shape (n_trees, 2 * leaf_offset) or (n_trees, 0), float64
        The max-trees, if tracked.
    max_priority : Tensor, shape (n_trees,), float64
        Running maximum of the raw priorities ever set (starts at 1): new slots get it.
    leaf_offset : int
        The smallest power of two ``>= capacity``.

    Examples
    --------
    >>> import numpy as np
    >>> from marlbuf._kernels.sumtree import MODE_ABS
    >>> trees = TensorPriorityTrees(5, n_trees=1, alpha=1.0, track_max=False, device="cpu")
    >>> trees.fill_new(np.arange(5))
    >>> code, position = trees.apply_td_errors(
    ...     0, np.array([1, 3]), np.array([-3.0, 1.0]), np.zeros(2, bool), MODE_ABS, 0.0, 1.0
    ... )
    >>> check_td_result(code, position, np.array([-3.0, 1.0]), "priority='abs', alpha=1.0")
    >>> trees.leaves(0).tolist(), trees.total(0)
    ([1.0, 3.0, 1.0, 1.0, 1.0], 7.0)
    >>> slots, weights = trees.sample(0, np.array([0.0, 0.2, 0.99]), beta=1.0)
    >>> slots.tolist(), weights.tolist()
    ([0, 1, 4], [1.0, 0.3333333432674408, 1.0])
    """

    def __init__(
        self, capacity: int, n_trees: int, alpha: float, track_max: bool, device: Any
    ) -> None:
        for name, value in (("capacity", capacity), ("n_trees", n_trees)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        self.capacity = int(capacity)
        self.n_trees = int(n_trees)
        self.alpha = finite_float("alpha", alpha, 0.0)
        self.track_max = bool(track_max)
        self.device = check_device(device)
        self.leaf_offset = 1 << max(0, (self.capacity - 1).bit_length())  # power of two >= cap
        self.depth = self.leaf_offset.bit_length() - 1  # levels above the leaves
        width = 2 * self.leaf_offset
        options: dict[str, Any] = {"dtype": torch.float64, "device": self.device}
        self.sums = torch.zeros((self.n_trees, width), **options)
        self.maxes = torch.zeros((self.n_trees, width if self.track_max else 0), **options)
        self.max_priority = torch.ones(self.n_trees, **options)

    def _tensor(self, values: ArrayLike, dtype: torch.dtype) -> Tensor:
        """``values`` as a ``dtype`` tensor on the trees' device, outside any autograd graph
        (TD errors straight from a critic's loss may require grad)."""
        if isinstance(values, Tensor):
            values = values.detach()
        return torch.as_tensor(values, dtype=dtype, device=self.device)

    # ------------------------------------------------------------------------- reading
    def leaves(self, trainer: int) -> Tensor:
        """View of one trainer's ``priority ** alpha`` per slot: shape (capacity,), float64."""
        return self.sums[trainer, self.leaf_offset : self.leaf_offset + self.capacity]

    def priorities(self, trainer: int) -> Tensor:
        """View of one trainer's raw priority per slot (the max-tree leaves): shape
        (capacity,), float64. Needs ``track_max``."""
        if not self.track_max:
            raise ValueError(
                "raw priorities are kept only with track_max=True (the max-trees); this index "
                "was built with track_max=False"
            )
        return self.maxes[trainer, self.leaf_offset : self.leaf_offset + self.capacity]

    def total(self, trainer: int) -> float:
        """``sum_k p_k^alpha`` of one trainer (its root), as a host float: waits for the
        device."""
        return float(self.sums[trainer, 1])

    def total_tensor(self, trainer: int) -> Tensor:
        """``sum_k p_k^alpha`` of one trainer as a 0-d float64 tensor on the device (a copy of
        the root, taken without waiting)."""
        return self.sums[trainer, 1].clone()

    def probabilities(self, trainer: int, slots: ArrayLike) -> np.ndarray:
        """``P(i) = p_i^alpha / sum_k p_k^alpha`` of one trainer at ``slots`` (int64, any
        shape), as a host float64 array of that shape (the host index's division: same bits
        for the same leaves). Waits for the device."""
        index = self._tensor(slots, torch.int64)
        row = self.sums[trainer]
        return (row[self.leaf_offset + index] / row[1]).cpu().numpy()

    # ------------------------------------------------------------------------- updates
    def fill_new(self, slots: ArrayLike) -> None:
        """Every tree gives ``slots`` (shape (T,), int64, in range; repeats allowed) its
        running maximum: leaf ``max_priority[t] ** alpha`` (raw ``max_priority[t]`` in the
        max-tree), then recomputes the touched parents. ``O(T log capacity)``, no wait."""
        index = self._tensor(slots, torch.int64)
        if index.shape[0] == 0:
            return
        keys = torch.sort(index).values
        self._write(
            slice(None),
            self.leaf_offset + keys,
            _run_starts(keys),
            self.max_priority.pow(self.alpha)[:, None],
            self.max_priority[:, None],
        )

    def set(self, trainer: int, slots: ArrayLike, priorities: ArrayLike) -> None:
        """Set raw ``priorities`` (shape (n,), float64, finite, ``>= 0``) at ``slots`` (shape
        (n,), int64, in range; on repeats the last entry wins) in one trainer's trees and raise
        its running maximum. Trusts its input, as :meth:`PriorityTrees.set` does. No wait."""
        index = self._tensor(slots, torch.int64)
        values = self._tensor(priorities, torch.float64)
        if index.shape[0] == 0:
            return
        self._set_last(trainer, index, values.pow(self.alpha), values, None)
        current = self.max_priority[trainer]
        self.max_priority[trainer] = _larger(current, values.max())

    def raise_max(self, priorities: ArrayLike) -> None:
        """Raise every tree's running maximum to at least ``priorities[t]`` (shape
        (n_trees,), float64, checked by the caller). No wait."""
        values = self._tensor(priorities, torch.float64)
        torch.maximum(self.max_priority, values, out=self.max_priority)

    def apply_td_errors(
        self,
        trainer: int,
        indices: ArrayLike,
        td: ArrayLike,
        stale: ArrayLike | None,
        mode: int,
        eps: float,
        alpha: float,
    ) -> tuple[Tensor, Tensor]:
        """Validate TD errors, turn them into priorities and set the non-stale ones: the
        device form of :func:`marlbuf._kernels.apply_td_errors`, without waiting for it.

        Every entry is checked first (stale ones too); if any is bad, nothing is written and
        the running maximum stays. Otherwise the leaves get ``priority ** alpha`` (on repeated
        indices the last non-stale entry wins) and the running maximum is raised to the largest
        non-stale priority. ``O(B log B + B log capacity)`` for ``B`` entries.

        Parameters
        ----------
        trainer : int
            Whose trees.
        indices : Tensor or ndarray, shape (B,), int64
            Sampled slots, in ``[0, capacity)`` (checked by the caller).
        td : Tensor or ndarray, shape (B,), real
            TD errors (priorities with ``MODE_GIVEN``); converted to float64.
        stale : Tensor or ndarray, shape (B,), bool, or None
            Entries whose slot was overwritten since it was sampled: not written. ``None``: no
            entry is stale.
        mode : int
            ``MODE_ABS`` (``|d| + eps``), ``MODE_SQUARED`` (``d * d + eps``) or ``MODE_GIVEN``
            (``d + eps``, ``d >= 0``) of :mod:`marlbuf._kernels.sumtree`.
        eps, alpha : float
            Priority offset and exponent.

        Returns
        -------
        (code, position) : (Tensor, Tensor), shape (), int64, on the device
            ``TD_OK`` and -1, or the code of the first bad entry (``TD_NOT_FINITE``,
            ``TD_NEGATIVE``, ``TD_OVERFLOW``) and its position. :func:`check_td_result` waits for
            them and raises the host index's error.
        """
        if mode not in (MODE_ABS, MODE_SQUARED, MODE_GIVEN):
            raise ValueError(
                f"mode must be MODE_ABS ({MODE_ABS}), MODE_SQUARED ({MODE_SQUARED}) or "
                f"MODE_GIVEN ({MODE_GIVEN}) of marlbuf._kernels.sumtree; got mode={mode!r}"
            )
        if isinstance(td, Tensor):
            dtype: Any = td.dtype
            real = not (td.is_complex() or td.dtype == torch.bool)
        else:
            td = np.asarray(td)
            dtype = td.dtype
            real = dtype.kind in "iuf"
        if not real:
            raise TypeError(
                f"td_errors must be a real numeric array; got dtype {dtype} ({td!r:.80})"
            )
        index = self._tensor(indices, torch.int64)
        values = self._tensor(td, torch.float64)
        if stale is None:
            dropped = torch.zeros(index.shape, dtype=torch.bool, device=self.device)
        else:
            dropped = self._tensor(stale, torch.bool)
        if not (index.dim() == 1 and values.shape == index.shape == dropped.shape):
            raise ValueError(
                "indices, td and stale must be 1-D and of one length; got shapes "
                f"{tuple(index.shape)}, {tuple(values.shape)}, {tuple(dropped.shape)}"
            )
        count = index.shape[0]
        if count == 0:
            int64: dict[str, Any] = {"dtype": torch.int64, "device": self.device}
            return torch.full((), TD_OK, **int64), torch.full((), -1, **int64)
        # the kernel's arithmetic, one operation per kernel launch: no fused multiply-add can
        # change the rounding of d * d + eps
        if mode == MODE_ABS:
            priority = values.abs() + eps
        elif mode == MODE_SQUARED:
            priority = values * values + eps
        else:
            priority = values + eps
        mass = priority.pow(alpha)
        # per entry, the kernel's first failing test: finite, then >= 0, then no overflow
        overflow = ~(torch.isfinite(priority) & torch.isfinite(mass))
        codes = torch.where(overflow, TD_OVERFLOW, TD_OK)
        if mode == MODE_GIVEN:
            codes = torch.where(values < 0.0, TD_NEGATIVE, codes)
        codes = torch.where(torch.isfinite(values), codes, TD_NOT_FINITE)
        positions = torch.arange(count, device=self.device)
        first = torch.where(codes != TD_OK, positions, count).amin()  # count: none is bad
        refused = first < count
        code = torch.where(positions == first, codes, TD_OK).amax()
        position = torch.where(refused, first, -1)
        kept = ~dropped & ~refused
        self._set_last(trainer, index, mass, priority, kept)
        largest = torch.where(kept, priority, 0.0).amax()  # the kernel's `largest` (0 if none)
        current = self.max_priority[trainer]
        self.max_priority[trainer] = torch.where(refused, current, _larger(current, largest))
        return code, position

    def _set_last(
        self, trainer: int, index: Tensor, masses: Tensor, priorities: Tensor, kept: Tensor | None
    ) -> None:
        """Write ``masses`` (sum-tree) and ``priorities`` (max-tree) at slots ``index`` of one
        trainer's trees, only where ``kept`` (all when ``None``), the last entry per slot
        winning, then fix the parents. A stable sort groups the entries of each slot in their
        order; entries not kept sort after every slot (the key ``capacity``) and write nothing."""
        keys = index if kept is None else torch.where(kept, index, self.capacity)
        sorted_keys, order = torch.sort(keys, stable=True)
        real = sorted_keys < self.capacity
        nodes = torch.where(real, self.leaf_offset + sorted_keys, 0)
        self._write(
            slice(trainer, trainer + 1),
            nodes,
            _run_ends(sorted_keys) & real,
            masses[order][None, :],
            priorities[order][None, :],
        )

    def _write(
        self,
        rows: slice,
        nodes: Tensor,
        leaf_write: Tensor,
        masses: Tensor,
        priorities: Tensor,
    ) -> None:
        """Set leaves and recompute their ancestors from their children, level by level.

        ``nodes`` (shape (m,), int64) holds leaf nodes in ascending order followed by zeros
        (node 0 is outside the tree: entries that write nothing); ``leaf_write`` (shape (m,),
        bool) marks one entry per distinct leaf, which writes ``masses`` and ``priorities``
        (shape (k, m) or (k, 1) for the ``k`` trees of ``rows``). Every other entry writes 0.0
        into node 0, which keeps it 0: the scatter has no conflicting duplicates, so its result
        does not depend on the order a device applies them. Shifting ascending nodes right keeps
        them ascending, so a parent shared by several entries is recomputed by its first one
        only."""
        sums = self.sums[rows]
        maxes = self.maxes[rows]
        sum_pairs = sums.view(sums.shape[0], self.leaf_offset, 2)  # pair n: children of node n
        max_pairs = maxes.view(maxes.shape[0], self.leaf_offset, 2) if self.track_max else None
        target = torch.where(leaf_write, nodes, 0)
        sums[:, target] = torch.where(leaf_write, masses, 0.0)
        if max_pairs is not None:
            maxes[:, target] = torch.where(leaf_write, priorities, 0.0)
        for _ in range(self.depth):
            nodes = nodes >> 1  # node 0 stays 0
            target = torch.where(_run_starts(nodes), nodes, 0)
            inside = target != 0
            children = sum_pairs.index_select(1, target)  # (k, m, 2)
            sums[:, target] = torch.where(inside, children[..., 0] + children[..., 1], 0.0)
            if max_pairs is not None:
                children = max_pairs.index_select(1, target)
                largest = _larger(children[..., 0], children[..., 1])
                maxes[:, target] = torch.where(inside, largest, 0.0)

    # ------------------------------------------------------------------------- searches
    def find_prefix(self, trainer: int, targets: ArrayLike) -> Tensor:
        """Batched prefix-sum search: the slot whose interval
        ``[sum of earlier leaves, that + its leaf)`` holds each target, as an int64 tensor of
        shape (n,) on the device; the device form of :func:`marlbuf._kernels.find_prefix`.

        All targets descend together, one gather of both children per level. A target goes
        right when it is ``>=`` the left sum *and* the right subtree is not empty, so rounding
        never steers into a zero subtree: a zero-priority leaf is never returned while the total
        is positive, and a target at (or past) the total ends at the last non-zero leaf.

        Parameters
        ----------
        trainer : int
            Whose sum-tree (with a positive total).
        targets : Tensor or ndarray, shape (n,), float64
            Prefix sums in ``[0, total)``.
        """
        remaining = self._tensor(targets, torch.float64)
        pairs = self.sums[trainer].view(self.leaf_offset, 2)
        nodes = torch.ones(remaining.shape, dtype=torch.int64, device=self.device)
        for _ in range(self.depth):
            children = pairs.index_select(0, nodes)  # (n, 2): left and right child
            left_sum = children[:, 0]
            go_right = (remaining >= left_sum) & (children[:, 1] > 0.0)
            remaining = torch.where(go_right, remaining - left_sum, remaining)
            nodes = 2 * nodes + go_right
        return nodes - self.leaf_offset

    def sample(self, trainer: int, uniforms: ArrayLike, beta: float) -> tuple[Tensor, Tensor]:
        """Proportional prioritized sampling with max-normalised importance weights: the device
        form of :func:`marlbuf._kernels.per_sample` (same targets, same descents, same weight
        arithmetic).

        ``w_i = (N P(i))^-beta / max_b (N P(b))^-beta = (min_b p_b / p_i)^beta`` where ``p`` are
        the sampled leaves (Schaul et al., 2016, Sec. 3.4): ``N`` and the total cancel in the
        normalisation. Computed in float64, then rounded to float32.

        Parameters
        ----------
        trainer : int
            Whose sum-tree (with a positive total: the caller checks).
        uniforms : Tensor or ndarray, shape (B,), float64
            Draws in ``[0, 1)``, one per row (``uniforms * total`` are the targets).
        beta : float
            Importance-sampling exponent in ``[0, 1]``.

        Returns
        -------
        (slots, weights) : (Tensor, Tensor), shapes (B,), int64 and float32, on the device
        """
        draws = self._tensor(uniforms, torch.float64)
        row = self.sums[trainer]
        slots = self.find_prefix(trainer, draws * row[1])
        if slots.shape[0] == 0:
            return slots, torch.zeros(0, dtype=torch.float32, device=self.device)
        masses = row[self.leaf_offset + slots]
        weights = (masses.amin() / masses).pow(beta)
        return slots, weights.to(torch.float32)

    def draw(
        self, trainer: int, uniforms: ArrayLike, beta: float
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """:meth:`sample` with its result on the host, for a sampler that returns host arrays:
        ``(slots int64 (B,), weights float32 (B,), total)``, the tree's total read with the
        batch, in one copy from the device (one wait)."""
        slots, weights = self.sample(trainer, uniforms, beta)
        # int64 slots < 2**53 and float32 weights are exact in float64: one packed copy
        packed = torch.cat(
            (slots.to(torch.float64), weights.to(torch.float64), self.sums[trainer, 1:2])
        ).cpu()
        count = slots.shape[0]
        host = packed.numpy()
        return (
            host[:count].astype(np.int64),
            host[count : 2 * count].astype(np.float32),
            float(host[2 * count]),
        )

    # ------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Leaves only, as host arrays with the keys and shapes of
        :meth:`marlbuf.prioritized.PriorityTrees.state_dict` (``leaves`` and, with
        ``track_max``, ``priorities``: (n_trees, capacity) float64; ``max_priority``:
        (n_trees,) float64), so either index loads the other's state. Waits for the device."""
        end = self.leaf_offset + self.capacity
        state: dict[str, Any] = {
            "leaves": self.sums[:, self.leaf_offset : end].cpu().numpy().copy(),
            "max_priority": self.max_priority.cpu().numpy().copy(),
        }
        if self.track_max:
            state["priorities"] = self.maxes[:, self.leaf_offset : end].cpu().numpy().copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict` output (of either index, checked by
        :func:`marlbuf.prioritized.checked_tree_state`) and rebuild every internal node level
        by level: bit-identical to :func:`marlbuf._kernels.rebuild`. ``O(capacity)``."""
        arrays, max_priority = checked_tree_state(
            state, self.n_trees, self.capacity, self.track_max
        )
        trees = [(self.sums, arrays["leaves"], False)]
        if self.track_max:
            trees.append((self.maxes, arrays["priorities"], True))
        for tree, leaves, is_max in trees:
            tree.zero_()
            tree[:, self.leaf_offset : self.leaf_offset + self.capacity] = torch.as_tensor(
                leaves, device=self.device
            )
            pairs = tree.view(self.n_trees, self.leaf_offset, 2)
            level = self.leaf_offset // 2
            while level >= 1:  # nodes [level, 2 * level) from their children
                left, right = pairs[:, level : 2 * level, 0], pairs[:, level : 2 * level, 1]
                tree[:, level : 2 * level] = _larger(left, right) if is_max else left + right
                level //= 2
        self.max_priority.copy_(torch.as_tensor(max_priority, device=self.device))
