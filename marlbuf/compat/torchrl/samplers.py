"""marlbuf's samplers as TorchRL samplers (they work with any TorchRL storage of one
dimension: ``MarlbufStorage``, ``LazyTensorStorage``, ``LazyMemmapStorage``)."""

from __future__ import annotations

import json
import warnings
from collections import deque
from collections.abc import Mapping
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers import PrioritizedSampler, Sampler

from marlbuf._kernels.blockmin import lower_block_mins, refresh_block_mins
from marlbuf.compat import NotEnoughDataError
from marlbuf.compat.torchrl.storage import to_numpy_tree, to_torch_tree
from marlbuf.prioritized import finite_float
from marlbuf.samplers import Neighbor, Prioritized, PrioritizedNeighbor, Uniform

#: draws whose indices and write generations a prioritized sampler keeps, so that the priority
#: update of any of them (in any order: prefetching samples ahead) drops slots overwritten
#: since that draw
DRAWS_KEPT = 16

#: reductions of a multi-dimensional priority (``TensorDictReplayBuffer``'s ``reduction``)
REDUCTIONS = ("max", "min", "median", "mean")

#: the largest seed drawn from a torch generator for one draw
SEED_BOUND = 2**62

#: slots per block of the smallest-priority bookkeeping (:mod:`marlbuf._kernels.blockmin`)
MIN_BLOCK = 1024


class Randomness:
    """The NumPy generator behind a sampler's draws.

    Without a torch generator (TorchRL's default) the draws come from one NumPy generator,
    seeded by ``seed`` or, when that is ``None``, at the first draw from torch's global
    generator (so ``torch.manual_seed`` makes runs repeat, as with TorchRL's samplers). When a
    replay buffer hands the sampler a torch generator (``ReplayBuffer(generator=...)``,
    ``set_rng``), each draw takes its seed from that generator, so its state decides the draws.
    """

    def __init__(self, seed: int | None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"seed must be an int or None; got seed={seed!r}")
        self.generator = None if seed is None else np.random.default_rng(int(seed))

    def draw(self, torch_generator: torch.Generator | None) -> np.random.Generator:
        """The generator of one draw."""
        if torch_generator is not None:
            seed = int(torch.randint(SEED_BOUND, (), generator=torch_generator))
            return np.random.Generator(np.random.PCG64(seed))
        if self.generator is None:
            self.generator = np.random.default_rng(int(torch.randint(SEED_BOUND, ())))
        return self.generator

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.generator is None else dict(self.generator.bit_generator.state)

    def load_state_dict(self, state: Any) -> None:
        if state is None:
            self.generator = None
            return
        generator = np.random.default_rng()
        try:
            generator.bit_generator.state = state
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"not a NumPy PCG64 generator state: {state!r:.80}") from exc
        self.generator = generator


def _slot_array(index: Any, name: str = "index") -> np.ndarray:
    """A sampler's ``index`` argument as a flat int64 array (ints, tensors, arrays, lists)."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    array = np.asarray(index)
    if array.dtype.kind not in "iu" and array.size:
        raise TypeError(f"{name} must hold integers; got dtype {array.dtype}")
    if array.ndim > 1:
        raise ValueError(
            f"{name} must be one-dimensional (samplers of marlbuf index one-dimensional "
            f"storages); got shape {array.shape}"
        )
    return array.reshape(-1).astype(np.int64, copy=False)


def _storage_size(storage: Any) -> int:
    if getattr(storage, "ndim", 1) != 1:
        raise ValueError(
            f"marlbuf's samplers work on one-dimensional storages; got ndim={storage.ndim}"
        )
    size = len(storage)
    if size == 0:
        raise NotEnoughDataError("Cannot sample from an empty storage: extend the buffer first")
    return size


def _save_json(path: Any, name: str, state: Mapping[str, Any]) -> None:
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(state))


def _load_json(path: Any, name: str) -> Any:
    try:
        return json.loads((Path(path) / name).read_text())
    except FileNotFoundError as exc:
        raise ValueError(
            f"{path} holds no {name}: was it written by this sampler's dumps?"
        ) from exc


class SeededSampler(Sampler):
    """A TorchRL sampler of marlbuf's whose only state is its generator (:class:`Randomness`):
    saved by ``state_dict`` and ``dumps`` (``marlbuf_sampler.json``), nothing to empty."""

    randomness: Randomness

    def _empty(self) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.randomness.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.randomness.load_state_dict(state_dict.get("rng"))

    def dumps(self, path: Any) -> None:
        _save_json(path, "marlbuf_sampler.json", self.state_dict())

    def loads(self, path: Any) -> None:
        self.load_state_dict(_load_json(path, "marlbuf_sampler.json"))


class MarlbufUniformSampler(SeededSampler):
    """Uniform draws, by default in memory order (marlbuf's :class:`~marlbuf.samplers.Uniform`):
    a TorchRL sampler in the place of ``RandomSampler``.

    Parameters
    ----------
    replace : bool, default True
        With replacement (``RandomSampler``'s law) or without (a uniform subset per batch; not
        ``SamplerWithoutReplacement``'s epochs).
    order : {"memory", "random"}, default "memory"
        ``"memory"``: indices ascending, so the storage's gather reads its rows front to back
        (the batch is the same set of slots, drawn in sorted order; see
        :class:`marlbuf.samplers.Uniform`). ``"random"``: the order of independent draws.
    seed : int, optional
        Seed of the draws (see :class:`Randomness`).
    """

    def __init__(self, replace: bool = True, order: str = "memory", seed: int | None = None):
        self.uniform = Uniform(replace, order)
        self.randomness = Randomness(seed)

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        size = _storage_size(storage)
        rng = self.randomness.draw(self._rng)
        indices, _ = self.uniform.sample(self.uniform.check_batch_size(batch_size), size, rng)
        return torch.from_numpy(indices), {}

    def __repr__(self) -> str:
        return f"MarlbufUniformSampler({self.uniform.config()})"


class MarlbufNeighborSampler(SeededSampler):
    """Cache-locality neighbor sampling (marlbuf's :class:`~marlbuf.samplers.Neighbor`): a
    batch of ``B`` rows is ``B / run_length`` runs of ``run_length`` consecutive items, whose
    starts are uniform without replacement (every stored item equally likely once the ring is
    full). Runs may cross episode boundaries: every item is a self-contained transition.

    Parameters
    ----------
    run_length : int, default 16
        Items per run; must divide the batch size.
    seed : int, optional
        Seed of the draws (see :class:`Randomness`).
    """

    def __init__(self, run_length: int = 16, seed: int | None = None) -> None:
        self.neighbor = Neighbor(run_length)
        self.randomness = Randomness(seed)
        self.capacity = 0

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        size = _storage_size(storage)
        if self.capacity != storage.max_size:  # runs wrap at the storage's capacity
            self.neighbor = Neighbor(self.neighbor.run_length)
            self.neighbor.bind(storage.max_size, 1)
            self.capacity = storage.max_size
        rng = self.randomness.draw(self._rng)
        indices, _ = self.neighbor.sample(self.neighbor.check_batch_size(batch_size), size, rng)
        return torch.from_numpy(indices), {}

    def __repr__(self) -> str:
        return f"MarlbufNeighborSampler(run_length={self.neighbor.run_length})"


class MarlbufPrioritizedSampler(PrioritizedSampler):
    """Proportional prioritized replay on marlbuf's float64 Numba sum-tree, with TorchRL's
    ``PrioritizedSampler`` constructor and conventions, and nothing compiled at install.

    A subclass of ``PrioritizedSampler`` (so ``TensorDictReplayBuffer`` feeds priorities back
    through ``update_tensordict_priority``, reading its ``priority_key``) that never builds
    TorchRL's segment trees: it works where TorchRL's compiled extension does not load.

    * A priority ``p`` (``update_priority(index, priority)``, ``p >= 0``) enters the tree as
      ``(p + eps) ** alpha``; slot ``i`` is drawn with probability
      ``P(i) = (p_i + eps)^alpha / sum_k (p_k + eps)^alpha``.
    * Written items (``mark_update``, called by the writer) get the running maximum priority
      ``max(1, every p so far)``, as ``PrioritizedSampler`` gives them ``default_priority``.
    * ``info["priority_weight"]`` is ``(P(i) / min_k P(k)) ** -beta`` over the stored items
      (TorchRL's normalisation, by the smallest priority of the items written, kept per
      block of slots: :mod:`marlbuf._kernels.blockmin`), in ``dtype``.
    * Stale priorities: an update for a slot written since the draw that returned it is
      dropped (the sampler counts writes per slot; the last :data:`DRAWS_KEPT` draws are kept,
      so updates in any order, prefetched batches included, are judged against their own
      draw). Indices it never handed out (priorities set explicitly) are always applied.

    Parameters
    ----------
    max_capacity : int
        The storage's capacity.
    alpha : float
        Priority exponent, ``>= 0``.
    beta : float
        Importance-sampling exponent, ``>= 0`` (settable; a ``ParameterScheduler`` anneals it).
    eps : float, default 1e-8
        Added to every priority, ``>= 0``.
    dtype : torch.dtype, default torch.float
        The weights' dtype (float32 or float64); the trees are float64 either way.
    reduction : {"max", "min", "median", "mean"}, default "max"
        How ``TensorDictReplayBuffer`` reduces a priority with several values per item.
    max_priority_within_buffer : bool, default False
        Only ``False`` (the running maximum since construction) is supported.
    device : torch.device or str, optional
        Accepted for compatibility; the trees stay in host memory, indices and weights come
        back on the CPU (the replay buffer moves them to the batch's device).
    order : {"random", "memory"}, default "random"
        Order of a batch's indices (see :class:`marlbuf.samplers.Prioritized`).
    seed : int, optional
        Seed of the draws (see :class:`Randomness`).
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: Any = None,
        *,
        order: str = "random",
        seed: int | None = None,
    ) -> None:
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, (int, np.integer)):
            raise TypeError(f"max_capacity must be an int; got max_capacity={max_capacity!r}")
        if max_capacity < 1:
            raise ValueError(f"max_capacity must be positive; got max_capacity={max_capacity}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64; got dtype={dtype}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}; got reduction={reduction!r}")
        if max_priority_within_buffer:
            raise ValueError(
                "max_priority_within_buffer=True is not supported: new items get the running "
                "maximum priority since construction (max_priority_within_buffer=False)"
            )
        self._max_capacity = int(max_capacity)
        self._alpha = finite_float("alpha", alpha, 0.0)
        self._beta = finite_float("beta", beta, 0.0)
        self._eps = finite_float("eps", eps, 0.0)
        self.dtype = dtype
        self.reduction = reduction
        self._max_priority_within_buffer = False
        self._device = None if device is None else torch.device(device)
        self.order = order
        self.randomness = Randomness(seed)
        self._reset()

    def _marlbuf_sampler(self, alpha: float) -> Prioritized:
        """The marlbuf sampler that keeps the tree (beta 0: the weights are computed here)."""
        return Prioritized(alpha=alpha, beta=0.0, eps=self._eps, priority="given", order=self.order)

    def _reset(self) -> None:
        """Empty trees: no slot written, the running maximum priority 1 (+ eps)."""
        self.priorities = self._marlbuf_sampler(self._alpha)
        self.priorities.bind(self._max_capacity, 1)
        # TorchRL's first default priority is 1, entering the tree as (1 + eps) ** alpha
        self.priorities.raise_max_priority(np.array([1.0 + self._eps]))
        n_blocks = -(-self._max_capacity // MIN_BLOCK)
        self.block_min = np.full(n_blocks, np.inf, dtype=np.float64)
        self.block_arg = np.full(n_blocks, -1, dtype=np.int64)
        self.block_dirty = np.zeros(n_blocks, dtype=np.bool_)
        self.write_generation = np.full(self._max_capacity, -1, dtype=np.int64)
        self.writes = 0
        self.draws: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=DRAWS_KEPT)

    # --------------------------------------------------------------- TorchRL's attributes
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(alpha={self._alpha}, beta={self._beta}, eps={self._eps}, "
            f"reduction={self.reduction})"
        )

    @property
    def max_size(self) -> int:
        return self._max_capacity

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def alpha(self) -> float:
        """The priority exponent. Setting it re-exponentiates the stored priorities in one
        O(capacity) pass (from 0 they cannot be recovered: they stay uniform, with a warning,
        until each is updated, as in ``PrioritizedSampler``)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        value = finite_float("alpha", value, 0.0)
        if value == self._alpha:
            return
        state = self.priorities.state_dict()
        leaves = state["leaves"]
        if self._alpha == 0.0:
            if (leaves > 0).any():
                warnings.warn(
                    "changing alpha away from 0 cannot recover the priorities (every stored "
                    "priority ** 0 is 1): they stay uniform until each is updated",
                    stacklevel=2,
                )
        else:
            written = leaves > 0
            leaves[written] = leaves[written] ** (value / self._alpha)
        priorities = self._marlbuf_sampler(value)
        priorities.bind(self._max_capacity, 1)
        priorities.load_state_dict(state)
        self.priorities, self._alpha = priorities, value
        self._forget_minima()

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = finite_float("beta", value, 0.0)

    @property
    def default_priority(self) -> float:
        """The priority a written item gets: the running maximum (TorchRL's raw domain)."""
        return self.priorities.max_priority(0) - self._eps

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:
            raise RuntimeError(
                f"{type(self).__name__} cannot be shared between processes: sample and update "
                "priorities in the process that owns it"
            )
        state = dict(self.__dict__)
        state["_rng"] = None
        return state

    # --------------------------------------------------------------- drawing
    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        size = _storage_size(storage)
        if size > self._max_capacity:
            raise ValueError(
                f"the storage holds {size} items, more than max_capacity="
                f"{self._max_capacity}: build the sampler with the storage's capacity"
            )
        batch_size = self.priorities.check_batch_size(batch_size)
        rng = self.randomness.draw(self._rng)
        indices, weights = self._draw(batch_size, size, rng)
        self.draws.append((indices, self.write_generation[indices]))
        return torch.from_numpy(indices), {
            "priority_weight": torch.from_numpy(weights.astype(_numpy_dtype(self.dtype)))
        }

    def _draw(
        self, batch_size: int, size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        indices, _ = self.priorities.sample(batch_size, size, rng, 0)
        smallest = self.smallest()
        if not smallest > 0.0:
            raise ValueError(
                "a stored item has priority 0 (eps=0 and a zero priority): its importance "
                "weight would be infinite; use eps > 0"
            )
        leaves = self.leaves()[indices]
        return indices, (leaves / smallest) ** -self._beta

    def smallest(self) -> float:
        """The smallest tree value ``(p + eps) ** alpha`` of the items written (``+inf``
        before any): what the importance weights are normalised by."""
        return float(
            refresh_block_mins(
                self.leaves(),
                self.write_generation,
                self.block_min,
                self.block_arg,
                self.block_dirty,
                MIN_BLOCK,
            )
        )

    def leaves(self) -> np.ndarray:
        """The tree's leaves, ``(p + eps) ** alpha`` per slot (a view: shape
        (max_capacity,), float64; 0 for slots never written)."""
        return np.asarray(self.priorities.trees.leaves(0))

    def priority(self, index: Any) -> torch.Tensor:
        """The tree's value ``(p + eps) ** alpha`` of each item of ``index`` (float64; 0 for
        slots never written)."""
        slots = self._checked_slots(_slot_array(index))
        return torch.from_numpy(self.leaves()[slots])

    # --------------------------------------------------------------- priorities
    def _checked_slots(self, slots: np.ndarray) -> np.ndarray:
        if slots.size and (slots.min() < 0 or slots.max() >= self._max_capacity):
            raise ValueError(
                f"index must lie in [0, {self._max_capacity}) (max_capacity); got min "
                f"{slots.min()}, max {slots.max()}"
            )
        return slots

    def _stale(self, slots: np.ndarray, current: np.ndarray) -> np.ndarray:
        """Which of ``slots`` (whose write generations are ``current`` now) were written since
        the kept draw they equal (none when they equal no kept draw: priorities set
        explicitly)."""
        for drawn, generations in reversed(self.draws):
            if drawn.shape == slots.shape and np.array_equal(drawn, slots):
                return current != generations
        return np.zeros(slots.shape, dtype=np.bool_)

    @torch.no_grad()
    def update_priority(self, index: Any, priority: Any, *, storage: Any = None) -> None:
        """Set the priorities of ``index`` (an int or 1-D indices; entries ``-1`` are skipped,
        as TorchRL's writers mark items not to update) to ``priority`` (one value, or one per
        index; finite and ``>= 0``). Nothing changes when a value is refused."""
        slots = _slot_array(index)
        values = priority
        if isinstance(values, torch.Tensor):
            values = values.detach().cpu().numpy()
        values = np.asarray(values, dtype=np.float64)
        if values.size == 1:
            values = np.full(slots.shape, values.reshape(()), dtype=np.float64)
        elif values.size != slots.size:
            raise ValueError(
                f"priority must be one number or one per index ({slots.size}); got shape "
                f"{values.shape}"
            )
        values = values.reshape(slots.shape)
        keep = slots >= 0
        if not keep.all():
            slots, values = slots[keep], values[keep]
        if not slots.size:
            return
        slots = self._checked_slots(slots)
        current = self.write_generation[slots]
        self.priorities.update_priorities(slots, values, 0, self._stale(slots, current))
        fresh = slots[current < 0]
        if fresh.size:  # a priority set before any write: the slot now counts as written
            fresh = np.unique(fresh)
            self.write_generation[fresh] = self.writes + np.arange(fresh.size, dtype=np.int64)
            self.writes += int(fresh.size)
        self._copy_leaves(slots)

    def mark_update(self, index: Any, *, storage: Any = None) -> None:
        """Items at ``index`` were (over)written: they get the running maximum priority, and
        updates of earlier draws of them are dropped from now on."""
        slots = _slot_array(index)
        slots = self._checked_slots(slots[slots >= 0])
        if not slots.size:
            return
        self.priorities.on_write(slots)
        self._copy_leaves(slots)
        self.write_generation[slots] = self.writes + np.arange(slots.shape[0], dtype=np.int64)
        self.writes += int(slots.shape[0])

    def _copy_leaves(self, slots: np.ndarray) -> None:
        """Bring the block minima up to the tree's leaves at ``slots``."""
        slots = np.ascontiguousarray(slots)
        leaves = np.ascontiguousarray(self.leaves()[slots])
        lower_block_mins(self.block_min, self.block_arg, self.block_dirty, slots, leaves, MIN_BLOCK)

    def _forget_minima(self) -> None:
        """Every block minimum is recomputed at the next draw."""
        self.block_min[:] = np.inf
        self.block_arg[:] = -1
        self.block_dirty[:] = True

    def add(self, index: Any) -> None:
        return None

    def extend(self, index: Any) -> None:
        return None

    def _empty(self) -> None:
        """Forget every priority (``rb.empty()``); updates of earlier draws are dropped."""
        writes = self.writes + self._max_capacity
        draws = self.draws
        self._reset()
        self.writes = writes  # later generations never equal those of a kept draw
        self.draws = draws

    # --------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Plain data and tensors (``torch.load(weights_only=True)`` reads it)."""
        return {
            "marlbuf_sampler": type(self).__name__,
            "max_capacity": self._max_capacity,
            "alpha": self._alpha,
            "beta": self._beta,
            "eps": self._eps,
            "tree": to_torch_tree(self.priorities.state_dict()),
            "write_generation": torch.from_numpy(self.write_generation.copy()),
            "writes": self.writes,
            "rng": self.randomness.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state = to_numpy_tree(dict(state_dict))
        if state.get("marlbuf_sampler") != type(self).__name__:
            raise ValueError(
                f"not a {type(self).__name__} state (its state_dict() output); a TorchRL "
                "PrioritizedSampler's state holds its own segment trees and cannot be loaded"
            )
        if state.get("max_capacity") != self._max_capacity:
            raise ValueError(
                f"the state is of a sampler of max_capacity={state.get('max_capacity')!r}; "
                f"this one has max_capacity={self._max_capacity}"
            )
        generation = np.asarray(state["write_generation"], dtype=np.int64)
        if generation.shape != (self._max_capacity,):
            raise ValueError(
                f"state 'write_generation' has shape {generation.shape}; expected "
                f"({self._max_capacity},)"
            )
        alpha = finite_float("alpha", state["alpha"], 0.0)
        beta = finite_float("beta", state["beta"], 0.0)
        eps = finite_float("eps", state["eps"], 0.0)
        old = (self._alpha, self._eps)
        self._alpha, self._eps = alpha, eps
        try:
            priorities = self._marlbuf_sampler(alpha)
            priorities.bind(self._max_capacity, 1)
            priorities.load_state_dict(state["tree"])
            randomness = Randomness(None)
            randomness.load_state_dict(state.get("rng"))
        except BaseException:
            self._alpha, self._eps = old
            raise
        self._beta = beta
        self.priorities, self.randomness = priorities, randomness
        self.write_generation = generation.copy()
        self.writes = int(state["writes"])
        self.draws.clear()
        self._forget_minima()

    def dumps(self, path: Any) -> None:
        """Write the state into folder ``path``: ``marlbuf_sampler.json`` and
        ``marlbuf_sampler.npz`` (no pickle)."""
        state = to_numpy_tree(self.state_dict())
        arrays = {f"tree_{k}": v for k, v in state.pop("tree").items()}
        arrays["write_generation"] = state.pop("write_generation")
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "marlbuf_sampler.npz", **arrays)
        _save_json(folder, "marlbuf_sampler.json", state)

    def loads(self, path: Any) -> None:
        state = _load_json(path, "marlbuf_sampler.json")
        with np.load(Path(path) / "marlbuf_sampler.npz", allow_pickle=False) as arrays:
            state["tree"] = {
                k.removeprefix("tree_"): arrays[k] for k in arrays.files if k.startswith("tree_")
            }
            state["write_generation"] = arrays["write_generation"]
        self.load_state_dict(state)

    # TorchRL's PrioritizedSampler methods that build or move its segment trees: here they
    # reset marlbuf's trees, or do nothing (the trees stay in host memory)
    def _init(self) -> None:
        self._reset()

    def _maybe_init_from_storage(self, storage: Any) -> None:
        return None


class MarlbufPrioritizedNeighborSampler(MarlbufPrioritizedSampler):
    """Information-prioritized locality-aware sampling (marlbuf's
    :class:`~marlbuf.samplers.PrioritizedNeighbor`) as a TorchRL prioritized sampler.

    References are drawn by priority (``(p + eps) ** alpha``, as in
    :class:`MarlbufPrioritizedSampler`); each contributes a run of 1, 2 or 4 consecutive items
    (by its normalised priority ``p / max p``) until the batch is full. The weights are marlbuf's:
    ``(N P(j)) ** -beta`` with each row's exact inclusion probability ``P(j)``, divided by the
    batch's largest (so ``<= 1``; not TorchRL's normalisation by the smallest stored priority).
    Priorities flow back per row, as for the other prioritized samplers.

    Parameters
    ----------
    max_capacity, alpha, eps, dtype, reduction, max_priority_within_buffer, device, seed
        As in :class:`MarlbufPrioritizedSampler`.
    beta : float
        In ``[0, 1]``.
    thresholds, run_lengths, weights
        As in :class:`marlbuf.samplers.PrioritizedNeighbor`.
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: Any = None,
        *,
        thresholds: Any = (0.33, 0.66),
        run_lengths: Any = (1, 2, 4),
        weights: str = "exact",
        seed: int | None = None,
    ) -> None:
        self.thresholds = tuple(thresholds)
        self.run_lengths = tuple(run_lengths)
        self.weight_mode = weights
        finite_float("beta", beta, 0.0, 1.0)
        super().__init__(
            max_capacity,
            alpha,
            beta,
            eps,
            dtype,
            reduction,
            max_priority_within_buffer,
            device,
            seed=seed,
        )

    def _marlbuf_sampler(self, alpha: float) -> Prioritized:
        return PrioritizedNeighbor(
            alpha=alpha,
            beta=self._beta,
            eps=self._eps,
            thresholds=self.thresholds,
            run_lengths=self.run_lengths,
            weights=self.weight_mode,
            priority="given",
        )

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = finite_float("beta", value, 0.0, 1.0)
        self.priorities.beta = self._beta

    def _draw(
        self, batch_size: int, size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        indices, weights = self.priorities.sample(batch_size, size, rng, 0)
        if weights is None:  # pragma: no cover - PrioritizedNeighbor always weighs
            raise RuntimeError("PrioritizedNeighbor returned no weights")
        return indices, weights

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(alpha={self._alpha}, beta={self._beta}, eps={self._eps}, "
            f"run_lengths={self.run_lengths})"
        )


def _numpy_dtype(dtype: torch.dtype) -> type:
    return np.float64 if dtype == torch.float64 else np.float32


__all__ = [
    "DRAWS_KEPT",
    "MarlbufNeighborSampler",
    "MarlbufPrioritizedNeighborSampler",
    "MarlbufPrioritizedSampler",
    "MarlbufUniformSampler",
    "Randomness",
    "SeededSampler",
]
