"""Slow, obviously-correct NumPy references for every kernel and for buffer semantics.

Each function here is the readable twin of a Numba kernel or of a buffer behaviour; tests compare
the fast path against it. Sections are headed by the part of the library they check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# ------------------------------------------------------------------------- buffer core


def gather_rows(table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``table[indices]``, one row at a time."""
    return np.stack([table[i].copy() for i in indices]) if len(indices) else table[:0].copy()


def gather_rows_or_zeros(table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``table[indices]``, one row at a time, with a row of zeros for the index -1."""
    out = np.zeros((len(indices), *table.shape[1:]), dtype=table.dtype)
    for i, slot in enumerate(indices):
        if slot >= 0:
            out[i] = table[slot]
    return out


def scatter_rows(table: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A copy of ``table`` with ``rows[i]`` written at ``slots[i]`` in order."""
    out = table.copy()
    for slot, row in zip(slots, rows):
        out[slot] = row
    return out


def neighbor_indices(refs: np.ndarray, run_length: int, capacity: int) -> np.ndarray:
    """Runs of ``run_length`` slots starting at each reference, wrapping modulo capacity."""
    return np.array(
        [(int(r) + k) % capacity for r in refs for k in range(run_length)], dtype=np.int64
    )


class NaiveRing:
    """A list-based ring buffer of joint transitions with the semantics of
    ``MultiAgentReplayBuffer`` (cursor, size, overwrite-oldest)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: list[dict | None] = [None] * capacity
        self.cursor = 0
        self.size = 0

    def add(self, transition: dict) -> None:
        self.slots[self.cursor] = transition
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def get(self, slot: int) -> dict:
        item = self.slots[slot]
        assert item is not None, "read of an unwritten slot"
        return item


def first_nonfinite(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> int:
    """Index of the first segment ``values[:, start:start+count]`` with a NaN/inf, or -1."""
    for s, (start, count) in enumerate(zip(starts, counts)):
        if not np.isfinite(values[:, start : start + count]).all():
            return s
    return -1


# =============================================================================================
# Prioritized sampling (marlbuf/_kernels/sumtree.py)
# =============================================================================================


def naive_tree(leaves: np.ndarray, leaf_offset: int, is_max: bool = False) -> np.ndarray:
    """A whole sum- (or max-) tree built level by level from ``leaves`` (shape (capacity,))."""
    tree = np.zeros(2 * leaf_offset, dtype=np.float64)
    tree[leaf_offset : leaf_offset + leaves.shape[0]] = leaves
    level_start = leaf_offset
    while level_start > 1:
        children = tree[level_start : 2 * level_start].reshape(-1, 2)
        parents = children.max(axis=1) if is_max else children[:, 0] + children[:, 1]
        tree[level_start // 2 : level_start] = parents
        level_start //= 2
    return tree


def naive_stored_nodes(leaf_offset: int) -> np.ndarray:
    """Which nodes a priority tree stores (bool, shape (2 * leaf_offset,)): the root, the
    leaves' level ``D = log2(leaf_offset)`` and every third level above it (``D - 3``, ...)."""
    depth = leaf_offset.bit_length() - 1
    stored = np.zeros(2 * leaf_offset, dtype=bool)
    stored[1] = True
    for level in range(depth, -1, -3):
        stored[1 << level : 2 << level] = True
    return stored


def naive_binary_find(tree: np.ndarray, leaf_offset: int, targets: np.ndarray) -> np.ndarray:
    """The descent of a full binary tree (``naive_tree``), one target and one level at a time:
    go right when the target is not below the left child's sum and the right child is not
    empty, subtracting the left sum as the kernels do (``remaining - left * go_right``)."""
    found = np.empty(targets.shape[0], dtype=np.int64)
    for i, target in enumerate(targets):
        node, remaining = 1, float(target)
        while node < leaf_offset:
            left, right = tree[2 * node], tree[2 * node + 1]
            go_right = bool(remaining >= left and right > 0.0)
            remaining = remaining - left * go_right
            node = 2 * node + go_right
        found[i] = node - leaf_offset
    return found


def naive_find(leaves: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The slot whose cumulative-sum interval ``[cumsum[s] - leaves[s], cumsum[s])`` holds each
    target: the first slot whose cumulative sum exceeds it."""
    return np.searchsorted(np.cumsum(leaves), targets, side="right").astype(np.int64)


def naive_per_sample(
    leaves: np.ndarray, uniforms: np.ndarray, beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Proportional sampling by cumulative sums; weights ``(N P)^-beta`` over the batch max."""
    slots = naive_find(leaves, uniforms * leaves.sum())
    probability = leaves[slots] / leaves.sum()
    weights = (leaves.shape[0] * probability) ** -beta
    return slots, (weights / weights.max()).astype(np.float32)


def naive_run_length(normalised: float, thresholds: np.ndarray, run_lengths: np.ndarray) -> int:
    """``run_lengths[m]`` for the number ``m`` of thresholds ``<= normalised``."""
    return int(run_lengths[sum(1 for t in thresholds if normalised >= t)])


def naive_locality_sample(
    leaves: np.ndarray,
    priorities: np.ndarray,
    size: int,
    uniforms: np.ndarray,
    thresholds: np.ndarray,
    run_lengths: np.ndarray,
    beta: float,
    inherit: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Prioritized-locality sampling, one reference at a time, in plain Python.

    ``leaves``/``priorities`` have shape (capacity,); the buffer is full when ``size`` equals
    the capacity (then runs wrap), else runs stop at slot ``size - 1``.
    """
    capacity = leaves.shape[0]
    batch = uniforms.shape[0]
    full = size == capacity
    total = leaves.sum()
    max_priority = priorities.max()
    cumulative = np.cumsum(leaves)
    slots: list[int] = []
    masses: list[float] = []
    draw = 0
    while len(slots) < batch:
        ref = int(np.searchsorted(cumulative, uniforms[draw] * total, side="right"))
        draw += 1
        length = naive_run_length(priorities[ref] / max_priority, thresholds, run_lengths)
        if not full:
            length = min(length, size - ref)
        for k in range(length):
            if len(slots) == batch:
                break
            slots.append((ref + k) % capacity)
            masses.append(leaves[ref])
    if not inherit:
        masses = []
        for row in slots:
            mass = 0.0
            for k in range(int(max(run_lengths))):
                start = row - k
                if start < 0 and not full:
                    break
                start %= capacity
                if naive_run_length(priorities[start] / max_priority, thresholds, run_lengths) > k:
                    mass += leaves[start]
            masses.append(mass)
    mass_array = np.asarray(masses)
    weights = mass_array**-beta
    return np.asarray(slots, dtype=np.int64), (weights / weights.max()).astype(np.float32)


def naive_inclusion_probabilities(
    leaves: np.ndarray,
    priorities: np.ndarray,
    size: int,
    thresholds: np.ndarray,
    run_lengths: np.ndarray,
) -> np.ndarray:
    """Per-row probability by brute force: every reference spreads its probability over its run;
    dividing by the expected run length turns expected rows per reference into a share."""
    capacity = leaves.shape[0]
    full = size == capacity
    reference = leaves / leaves.sum()
    max_priority = priorities.max()
    expected_rows = np.zeros(capacity)
    expected_length = 0.0
    for ref in range(capacity):
        if reference[ref] == 0:
            continue
        length = naive_run_length(priorities[ref] / max_priority, thresholds, run_lengths)
        if not full:
            length = min(length, size - ref)
        expected_length += reference[ref] * length
        for k in range(length):
            expected_rows[(ref + k) % capacity] += reference[ref]
    return expected_rows / expected_length


# =============================================================================================
# Drop-in adapters (marlbuf/compat/)
# =============================================================================================
# Re-statements of the ORIGINAL buffers' semantics (not their code), to drive next to the
# adapters with the original trainers' call sequences.


class OpenAIListBuffer:
    """openai/maddpg's per-agent buffer: a list of ``(obs, act, rew, obs_next, done)`` tuples
    used as a ring; ``sample_index`` stacks the items at the indices with ``np.array``."""

    def __init__(self, size: float) -> None:
        self.items: list[tuple[Any, ...]] = []
        self.capacity = int(size)
        self.next_slot = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, obs: Any, act: Any, rew: Any, obs_next: Any, done: Any) -> None:
        item = (obs, act, rew, obs_next, done)
        if self.next_slot == len(self.items):
            self.items.append(item)  # still filling
        else:
            self.items[self.next_slot] = item  # overwrite the oldest
        self.next_slot = (self.next_slot + 1) % self.capacity

    def make_index(self, batch_size: int, rng: np.random.Generator) -> list[int]:
        return [int(rng.integers(0, len(self.items))) for _ in range(batch_size)]

    def latest_index_unshuffled(self, batch_size: int) -> list[int]:
        return [(self.next_slot - 1 - i) % self.capacity for i in range(batch_size)]

    def sample_index(self, idxes: Any) -> tuple[np.ndarray, ...]:
        columns: list[list[Any]] = [[], [], [], [], []]
        for i in idxes:
            for column, value in zip(columns, self.items[i]):
                column.append(value)
        return tuple(np.array(column) for column in columns)

    def collect(self) -> tuple[np.ndarray, ...]:
        return self.sample_index(range(len(self.items)))


class Tf2marlNaiveBuffer:
    """tf2multiagentrl's ``EfficientReplayBuffer``: per-agent float32 arrays for obs, actions and
    next obs, one float32 reward and done per slot; the length counts every stored slot (the
    original's off-by-one while filling is *not* reproduced)."""

    def __init__(self, size: int, obs_dims: list[int], act_dims: list[int]) -> None:
        self.capacity = size
        self.obs = [np.zeros((size, d), np.float32) for d in obs_dims]
        self.acts = [np.zeros((size, d), np.float32) for d in act_dims]
        self.next_obs = [np.zeros((size, d), np.float32) for d in obs_dims]
        self.reward = np.zeros(size, np.float32)
        self.done = np.zeros(size, np.float32)
        self.next_slot = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs_n: Any, act_n: Any, reward: float, next_obs_n: Any, done: float) -> None:
        slot = self.next_slot
        for agent in range(len(self.obs)):
            self.obs[agent][slot] = obs_n[agent]
            self.acts[agent][slot] = act_n[agent]
            self.next_obs[agent][slot] = next_obs_n[agent]
        self.reward[slot] = reward
        self.done[slot] = done
        self.next_slot = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample_index(self, indices: Any) -> tuple[Any, ...]:
        idx = np.asarray(indices)
        return (
            [o[idx] for o in self.obs],
            [a[idx].copy() for a in self.acts],
            self.reward[idx],
            [o[idx] for o in self.next_obs],
            self.done[idx],
        )


class Tf2marlNaivePrioritized(Tf2marlNaiveBuffer):
    """tf2multiagentrl's ``PrioritizedReplayBuffer`` semantics on top of the arrays: a leaf
    ``priority ** alpha`` per slot, new slots at the running max priority, weights
    ``(P(i) N)^-beta`` over the largest possible weight (that of the smallest leaf)."""

    def __init__(self, size: int, obs_dims: list[int], act_dims: list[int], alpha: float) -> None:
        super().__init__(size, obs_dims, act_dims)
        self.alpha = alpha
        self.leaf = np.zeros(size, np.float64)
        self.max_priority = 1.0

    def add(self, obs_n: Any, act_n: Any, reward: float, next_obs_n: Any, done: float) -> None:
        slot = self.next_slot
        super().add(obs_n, act_n, reward, next_obs_n, done)
        self.leaf[slot] = self.max_priority**self.alpha

    def weights(self, indices: Any, beta: float) -> np.ndarray:
        stored = self.leaf[: self.size]
        total = stored.sum()
        largest = (stored.min() / total * self.size) ** -beta
        return np.array(
            [(self.leaf[i] / total * self.size) ** -beta / largest for i in indices], np.float32
        )

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        for slot, priority in zip(indices, priorities):
            self.leaf[slot] = float(priority) ** self.alpha
            self.max_priority = max(self.max_priority, float(priority))


# ---------------------------------------------------------------------------------------------
# Profiling: the valgrind client-request kernel. On a real CPU the magic sequence is
# a no-op, so the request's answer is the caller's default.
# ---------------------------------------------------------------------------------------------
def client_request_outside_valgrind(block: np.ndarray, default: int) -> int:
    """What ``client_request_kernel`` returns when no valgrind runs: ``default``."""
    return int(default)


class NaiveLRUCache:
    """A set-associative LRU cache as Python lists: the twin of ``_kernels.cachemodel``."""

    def __init__(self, n_sets: int, ways: int) -> None:
        self.sets: list[list[int]] = [[] for _ in range(n_sets)]  # most recent last
        self.ways = ways

    def access(self, blocks: np.ndarray) -> int:
        misses = 0
        for block in (int(b) for b in blocks):
            line = self.sets[block % len(self.sets)]
            if block in line:
                line.remove(block)
            else:
                misses += 1
                if len(line) == self.ways:
                    line.pop(0)  # evict the least recently used
            line.append(block)
        return misses


# ------------------------------------------------------------------- per-agent batches


def gather_plan(
    table: np.ndarray,
    side: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    plan: np.ndarray,
    out_bytes: int,
) -> np.ndarray:
    """``gather_plan`` one element at a time: ``table`` and ``side`` are uint8 rows, ``plan`` the
    (6, n_segments) kind/src/dst/len/step/next array; returns the uint8 output."""
    unit = {0: (np.uint64, np.uint64), 1: (np.uint32, np.uint32), 2: (np.uint8, np.uint8)}
    out = np.zeros(out_bytes, dtype=np.uint8)
    for i, slot in enumerate(indices):
        if slot < 0:  # a masked sequence step: every segment stays zero
            continue
        for kind, src, dst, length, step, from_next in plan.T:
            row = table[slot]
            if from_next:
                row = table[next_slot[slot]] if next_slot[slot] >= 0 else side[side_row[slot]]
            if kind == 3:  # float16 -> float32
                values = row.view(np.float16)[src : src + length].astype(np.float32)
                out.view(np.float32)[dst + i * step : dst + i * step + length] = values
                continue
            src_t, dst_t = unit[int(kind)]
            values = row.view(src_t)[src : src + length]
            out.view(dst_t)[dst + i * step : dst + i * step + length] = values
    return out


# --------------------------------------------------------------------------- sequences


class NaiveEpisodeRing:
    """A list-of-episodes model of the ring: which (episode, step) each slot holds.

    Every write names its stream and whether it ends the stream's episode (all agents done or
    truncated); a stream's next write begins a new episode. Writes go one at a time, oldest
    slot first, as the buffer's ring does (``extend`` of more than ``capacity`` steps included).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.cursor = 0
        self.size = 0
        self.content: list[tuple[int, int] | None] = [None] * capacity
        self.open: dict[int, tuple[int, int]] = {}  # stream -> (episode, next step number)
        self.episodes = 0
        self.ended: set[int] = set()  # episodes whose last step was written

    def write(self, stream: int, ends: bool) -> None:
        if stream in self.open:
            episode, step = self.open.pop(stream)
        else:
            episode, step = self.episodes, 0
            self.episodes += 1
        self.content[self.cursor] = (episode, step)
        if not ends:
            self.open[stream] = (episode, step + 1)
        else:
            self.ended.add(episode)
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sequence(self, start: int, before: int, after: int) -> list[int]:
        """Slots of steps ``-before .. +after`` of the start's episode (-1: not stored)."""
        item = self.content[start]
        assert item is not None, "a start must hold data"
        episode, step = item
        where = {held: slot for slot, held in enumerate(self.content) if held is not None}
        return [where.get((episode, step + j), -1) for j in range(-before, after + 1)]

    def complete(self) -> dict[int, int]:
        """First slot -> number of steps of every ended episode whose every step is stored."""
        steps: dict[int, list[int]] = {}
        for held in self.content:
            if held is not None:
                steps.setdefault(held[0], []).append(held[1])
        out = {}
        for slot, held in enumerate(self.content):
            if held is not None and held[1] == 0 and held[0] in self.ended:
                numbers = sorted(steps[held[0]])
                assert numbers == list(range(len(numbers))), "a stored episode has a gap"
                out[slot] = len(numbers)
        return out

    def valid_starts(self, length: int) -> list[int]:
        """Slots whose episode has ``length - 1`` more steps stored (``pad=False`` starts)."""
        return [s for s in range(self.size) if self.sequence(s, 0, length - 1)[-1] >= 0]


def r2d2_priority(td: np.ndarray, valid: np.ndarray, eta: float) -> np.ndarray:
    """``eta * max |td| + (1 - eta) * mean |td|`` over each row's valid entries, row by row."""
    out = []
    for row, keep in zip(td, valid):
        values = [abs(float(x)) for x, k in zip(row, keep) if k]
        out.append(eta * max(values) + (1 - eta) * sum(values) / len(values))
    return np.array(out)


# ------------------------------------------------------------------ memory-ordered draws
# (marlbuf/_kernels/ordered.py)


def sorted_uniforms(exponentials: np.ndarray) -> np.ndarray:
    """Normalised partial sums of the spacings: ``(E_0 + .. + E_k) / (E_0 + .. + E_B)``, in a
    plain loop (the sums accumulate left to right, as the kernel's)."""
    total = 0.0
    for e in exponentials:
        total += float(e)
    out, partial = [], 0.0
    for e in exponentials[:-1]:
        partial += float(e)
        out.append(partial / total)
    return np.array(out, dtype=np.float64)


def sorted_slots(exponentials: np.ndarray, size: int) -> np.ndarray:
    """``min(floor(partial sum * (size / total)), size - 1)`` per spacing but the last."""
    total = 0.0
    for e in exponentials:
        total += float(e)
    scale = size / total
    out, partial = [], 0.0
    for e in exponentials[:-1]:
        partial += float(e)
        out.append(min(int(np.floor(partial * scale)), size - 1))
    return np.array(out, dtype=np.int64)


def merge_distinct(kept: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The sorted distinct union of two arrays."""
    return np.array(sorted(set(kept.tolist()) | set(new.tolist())), dtype=np.int64)


def selection_sample(uniforms: np.ndarray, count: int) -> np.ndarray:
    """Algorithm S one slot at a time: take slot ``t`` with probability
    ``(count - taken) / (size - t)`` (``u < that``, written without a division)."""
    size, taken = len(uniforms), []
    for t, u in enumerate(uniforms):
        if len(taken) < count and (size - t) * u < count - len(taken):
            taken.append(t)
    return np.array(taken, dtype=np.int64)


def gather_lean_rows(
    table: np.ndarray,
    side: np.ndarray,
    indices: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    codec: Any,
) -> np.ndarray:
    """Dense batch rows (uint64, shape (B, row_words)) from lean rows, byte by byte: the head
    and the tail from the row, the next_obs section from the successor's obs or the side row,
    zeros elsewhere; index -1 is a row of zeros."""
    lean_tail, dense_tail, tail_bytes = codec.done_span
    out = np.zeros((indices.shape[0], codec.row_words), dtype=np.uint64)
    raw = out.view(np.uint8)
    lean = table.view(np.uint8)
    side_bytes = side.view(np.uint8)
    for i, slot in enumerate(indices.tolist()):
        if slot < 0:
            continue
        raw[i, : codec.head_bytes] = lean[slot, : codec.head_bytes]
        source = lean[next_slot[slot]] if next_slot[slot] >= 0 else side_bytes[side_row[slot]]
        start = codec.next_obs_start
        raw[i, start : start + codec.obs_bytes] = source[: codec.obs_bytes]
        raw[i, dense_tail : dense_tail + tail_bytes] = lean[
            slot, lean_tail : lean_tail + tail_bytes
        ]
    return out


# ------------------------------------------------------------------ one-step writes (fast add)
# Twins of marlbuf/_kernels/staging.py. A step is five per-field tuples of the agents' items; a
# plan row per agent holds the element offsets and item shapes (PLAN_* columns of the module).


def _plan_columns() -> Any:
    from marlbuf._kernels import staging

    return staging


def read_items(
    items: tuple[tuple[Any, ...], ...], leading: bool = False
) -> tuple[tuple[Any, ...], ...] | None:
    """The items as the kernels read them: a 0-d array as its scalar; with ``leading`` (a
    one-step extend) every item must be an array with a leading axis of length 1 and is read
    at its first row (``None`` when one is not)."""
    out = []
    for field in items:
        read = []
        for x in field:
            if leading:
                if type(x) is not np.ndarray or x.ndim == 0 or x.shape[0] != 1:
                    return None
                x = x[0]
            elif type(x) is np.ndarray and x.ndim == 0:
                x = x[()]
            read.append(x)
        out.append(tuple(read))
    return tuple(out)


def step_is_common(
    items: tuple[tuple[Any, ...], ...], plan: np.ndarray, stored: np.dtype, leading: bool = False
) -> bool:
    """Whether the kernels take the step: every item of a type they read, of the planned
    shape, every float finite and within the stored dtype's range, every integer action a
    discrete action in range (bools are not actions). Items as :func:`read_items` reads them."""
    read = read_items(items, leading)
    if read is None:
        return False
    items = read
    k_ = _plan_columns()
    limit = float(np.finfo(stored).max)
    action_dims = k_.PLAN_OBS_DIMS + (plan.shape[1] - k_.PLAN_OBS_DIMS) // 2

    def numeric(dtype: np.dtype) -> bool:
        return dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize in (4, 8))

    def array_ok(x: Any, k: int, dims: int) -> bool:
        if type(x) is not np.ndarray or not numeric(x.dtype) or x.ndim == 0:
            return False
        shape = tuple(int(d) for d in plan[k, dims + 1 : dims + 1 + plan[k, dims]])
        if x.shape != shape:
            return False
        return x.dtype.kind != "f" or bool(np.all(np.abs(x.astype(np.float64)) <= limit))

    def scalar_ok(x: Any) -> bool:
        if isinstance(x, (bool, np.bool_)):
            return True
        if isinstance(x, (int, np.integer)):
            return -(2**63) <= int(x) < 2**64
        if isinstance(x, (float, np.float32, np.float64)):
            return abs(float(x)) <= limit
        return False

    obs, action, reward, next_obs, done = items
    for k in range(plan.shape[0]):
        dims = k_.PLAN_OBS_DIMS
        if not (array_ok(obs[k], k, dims) and array_ok(next_obs[k], k, dims)):
            return False
        a = action[k]
        if isinstance(a, (bool, np.bool_)):
            return False
        if isinstance(a, (int, np.integer)):
            if not 0 <= int(a) < int(plan[k, k_.PLAN_DISCRETE]):
                return False
        elif not array_ok(a, k, action_dims):
            return False
        if not (scalar_ok(reward[k]) and scalar_ok(done[k])):
            return False
    return True


def write_step(
    items: tuple[tuple[Any, ...], ...],
    plan: np.ndarray,
    row: np.ndarray,
    done_column: int,
    next_column: int | None,
) -> None:
    """Write a (common) step into ``row`` (a 1-D array in the stored dtype): obs, one-hot or
    array actions, rewards, dones at ``done_column``, next_obs at ``next_column`` (None: not
    written)."""
    k_ = _plan_columns()
    obs, action, reward, next_obs, done = items
    for k in range(plan.shape[0]):
        o = np.asarray(obs[k]).reshape(-1)
        row[plan[k, k_.PLAN_OBS] : plan[k, k_.PLAN_OBS] + o.size] = o
        a = action[k]
        start = plan[k, k_.PLAN_ACTION]
        if isinstance(a, (int, np.integer)):
            n = int(plan[k, k_.PLAN_DISCRETE])
            row[start : start + n] = np.eye(n)[int(a)]
        else:
            flat = np.asarray(a).reshape(-1)
            row[start : start + flat.size] = flat
        row[plan[k, k_.PLAN_REWARD]] = reward[k]
        row[plan[k, done_column]] = done[k]
        if next_column is not None:
            no = np.asarray(next_obs[k]).reshape(-1)
            row[plan[k, next_column] : plan[k, next_column] + no.size] = no


def stage_step(
    items: tuple[tuple[Any, ...], ...], row: np.ndarray, plan: np.ndarray, leading: bool = False
) -> tuple[bool, np.ndarray]:
    """``(taken, staging row after the call)``."""
    k_ = _plan_columns()
    out = row.copy()
    if not step_is_common(items, plan, row.dtype, leading):
        return False, out
    read = read_items(items, leading)
    assert read is not None
    write_step(read, plan, out, k_.PLAN_DONE, k_.PLAN_NEXT_OBS)
    return True, out


# Twins of marlbuf/_kernels/links.py (the next-observation links).


def link_step(
    row: np.ndarray,
    slot: int,
    obs_bytes: int,
    next_obs_start: int,
    side: np.ndarray,
    next_slot: np.ndarray,
    side_row: np.ndarray,
    write_generation: np.ndarray,
    prev_slot: int,
    prev_generation: int,
    free: list[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The link update of one step as ``NextObsLinks.commit_one`` did it in Python (byte
    comparison, the free stack as a list): ``(side, next_slot, side_row, free)`` after it.
    ``row`` is the staged dense row as bytes (uint8); ``side`` bytes too."""
    side, next_slot, side_row, free = side.copy(), next_slot.copy(), side_row.copy(), list(free)
    if prev_slot >= 0 and prev_slot != slot and write_generation[prev_slot] == prev_generation:
        held = int(side_row[prev_slot])
        if held >= 0 and side[held, :obs_bytes].tobytes() == row[:obs_bytes].tobytes():
            next_slot[prev_slot] = slot
            side_row[prev_slot] = -1
            free.append(held)
    old = int(side_row[slot])
    if old >= 0:
        free.append(old)
    next_slot[slot] = -1
    new = free.pop()
    side[new, :obs_bytes] = row[next_obs_start : next_obs_start + obs_bytes]
    side_row[slot] = new
    return side, next_slot, side_row, free


def lean_row(dense: np.ndarray, codec: Any) -> np.ndarray:
    """A staged dense row (uint8) as the lean row it is stored as (uint8)."""
    lean_tail, dense_tail, tail_bytes = codec.done_span
    out = np.zeros(codec.lean_row_bytes, dtype=np.uint8)
    out[: codec.head_bytes] = dense[: codec.head_bytes]
    out[lean_tail : lean_tail + tail_bytes] = dense[dense_tail : dense_tail + tail_bytes]
    return out


def next_is_obs(rows: np.ndarray, obs_bytes: int, next_obs_start: int) -> np.ndarray:
    """Per consecutive pair of staged dense rows (uint8), whether row t's next_obs section is
    row t + 1's obs section byte for byte."""
    return np.array(
        [
            rows[t, next_obs_start : next_obs_start + obs_bytes].tobytes()
            == rows[t + 1, :obs_bytes].tobytes()
            for t in range(rows.shape[0] - 1)
        ],
        dtype=bool,
    )


# ------------------------------------------------------------------ whole episodes
# (marlbuf/_kernels/episodes.py: episode_heads, episode_tails)


def _linked(
    slot: int, episode: np.ndarray, step: np.ndarray, links: np.ndarray, direction: int
) -> int:
    """The slot ``links[slot]`` when it holds the same episode at step ``+direction``, else -1."""
    target = int(links[slot])
    if target < 0 or episode[target] != episode[slot] or step[target] != step[slot] + direction:
        return -1
    return target


def episode_heads(
    last_slots: np.ndarray, episode: np.ndarray, step: np.ndarray, prev_slot: np.ndarray
) -> np.ndarray:
    """Per last slot, the slot of step 0 of its episode reached by checked links, or -1."""
    out = []
    for last in last_slots:
        current = int(last)
        while current >= 0 and step[current] != 0:
            current = _linked(current, episode, step, prev_slot, -1)
        out.append(current)
    return np.array(out, dtype=np.int64)


def episode_tails(
    first_slots: np.ndarray, episode: np.ndarray, step: np.ndarray, next_slot: np.ndarray
) -> np.ndarray:
    """Per first slot, the last slot reached by checked next links."""
    out = []
    for first in first_slots:
        current = int(first)
        while (following := _linked(current, episode, step, next_slot, 1)) >= 0:
            current = following
        out.append(current)
    return np.array(out, dtype=np.int64)


def link_stream_steps(
    slots: np.ndarray,
    ends: np.ndarray,
    skip: int,
    open_episode: int,
    open_step: int,
    back: int,
    next_episode: int,
    rows: np.ndarray,
    obs_bytes: int,
    next_obs_start: int,
    quiet: np.ndarray,
    full: np.ndarray,
    index: dict[str, np.ndarray],
) -> tuple[int, int, int, int]:
    """Stream breaks, then one (episode, step, previous slot) per step from a list of
    episodes, then the index entries of the kept steps; ``index`` (episode, step, prev_slot,
    next_slot) and ``ends`` are updated in place."""
    breaks = 0
    if obs_bytes:
        for k in range(1, len(ends)):
            same = bytes(rows[k, :obs_bytes]) == bytes(
                rows[k - 1, next_obs_start : next_obs_start + obs_bytes]
            )
            if not ends[k - 1] and quiet[k - 1] and full[k] and not same:
                ends[k - 1] = True
                breaks += 1
    episodes: list[list[int]] = []  # per episode, the positions of its steps in the call
    for k in range(len(ends)):
        if k == 0 or ends[k - 1]:
            episodes.append([])
        episodes[-1].append(k)
    out = []
    for e, positions in enumerate(episodes):
        continued = e == 0 and open_episode >= 0
        ident = open_episode if continued else next_episode
        if not continued:
            next_episode += 1
        for n, k in enumerate(positions):
            number = (open_step + 1 + n) if continued else n
            if n > 0:
                prev = int(slots[k - 1 - skip]) if k - 1 >= skip else -1
            else:
                prev = back if continued and skip == 0 else -1
            out.append((k, ident, number, prev))
    for k, ident, number, prev in out:
        if k >= skip:
            slot = int(slots[k - skip])
            index["episode"][slot] = ident
            index["step"][slot] = number
            index["prev_slot"][slot] = prev
            index["next_slot"][slot] = -1
            if prev >= 0:
                index["next_slot"][prev] = slot
    _, ident, number, _ = out[-1]
    return next_episode, ident, number, breaks


# =============================================================================================
# Block minima (marlbuf/_kernels/blockmin.py)
# =============================================================================================


def naive_written_min(leaves: np.ndarray, written: np.ndarray) -> float:
    """The smallest of ``leaves`` where ``written >= 0`` (``+inf`` when none is written)."""
    chosen = leaves[written >= 0]
    return float(chosen.min()) if chosen.size else float("inf")


def log_checksum(segments: list[np.ndarray]) -> tuple[int, int]:
    """The obvious twin of the log-format-4 checksum (:mod:`marlbuf._kernels.checksum`): word
    ``i`` of each segment (uint64 or int64, read as uint64) to lane ``i % 4``, where
    ``first += word`` then ``second += first`` modulo 2**64; the lanes folded as the kernels
    fold them."""
    mask = (1 << 64) - 1
    first, second = [0] * 4, [0] * 4
    for segment in segments:
        for i, word in enumerate(np.asarray(segment).reshape(-1).view(np.uint64).tolist()):
            lane = i % 4
            first[lane] = (first[lane] + word) & mask
            second[lane] = (second[lane] + first[lane]) & mask

    def rotl(value: int, bits: int) -> int:
        return ((value << bits) | (value >> (64 - bits))) & mask

    seed = 0x9E3779B97F4A7C15
    total = (seed + sum(first)) & mask
    folded = second[0] ^ rotl(second[1], 16) ^ rotl(second[2], 32) ^ rotl(second[3], 48)
    return total, folded


def log_record(
    rows: np.ndarray,
    streams: np.ndarray,
    flags: np.ndarray,
    ident: int,
    seq: int,
    first_generation: int,
    stream: int,
    flag_bits: int,
) -> np.ndarray:
    """The words of one log-format-4 record, built field by field (the twin of
    :func:`marlbuf._kernels.checksum.write_record`)."""
    payload = [rows.reshape(-1).view(np.uint64), streams.view(np.uint64), flags.view(np.uint64)]
    p_sum = log_checksum(payload)
    size = sum(part.shape[0] for part in payload)
    head = [
        int.from_bytes(b"MBUFREC4", "little"),
        ident,
        seq,
        first_generation,
        rows.shape[0],
        stream & ((1 << 64) - 1),
        flag_bits,
        size,
        *p_sum,
    ]
    h_sum = log_checksum([np.array(head, dtype=np.uint64)])
    tail = [int.from_bytes(b"MBUFEND4", "little"), seq, size, *p_sum, *h_sum]
    t_sum = log_checksum([np.array(tail, dtype=np.uint64)])
    return np.concatenate(
        [np.array([*head, *h_sum], dtype=np.uint64), *payload, np.array([*tail, *t_sum], np.uint64)]
    )


def judge_update(
    indices: np.ndarray, as_drawn: np.ndarray, generations: np.ndarray, write_generation: np.ndarray
) -> np.ndarray | None:
    """The twin of :func:`marlbuf._kernels.drawn.judge_update`: the stale mask, or ``None``
    when ``indices`` are not ``as_drawn`` (an empty ``as_drawn`` checks nothing)."""
    if as_drawn.shape[0] and not np.array_equal(indices, as_drawn):
        return None
    return np.asarray(generations) != np.asarray(write_generation)[indices]


class NaiveStreams:
    """A list-of-episodes model of the ring with stream breaks: :class:`NaiveEpisodeRing`, plus
    what the episode index compares. A write names its stream, its observation and next
    observation (any hashable values), whether it ends its episode (all agents done, or
    truncated), whether it may be followed by a comparison (``quiet``: no agent done) and
    whether its own observation may be compared (``full``: every agent present). A step of a
    stream whose previous step was neither done nor truncated, was quiet, and whose next
    observation differs from the step's observation breaks the stream: the open episode ends
    at the previous step, the step begins a new one (counted in :attr:`breaks`)."""

    def __init__(self, capacity: int, compares: bool = True) -> None:
        self.ring = NaiveEpisodeRing(capacity)
        self.compares = compares
        self.last_next: dict[int, Any] = {}
        self.breaks = 0

    def write(
        self,
        stream: int,
        obs: Any,
        next_obs: Any,
        ends: bool,
        quiet: bool = True,
        full: bool = True,
    ) -> None:
        ring = self.ring
        expected = self.last_next.pop(stream, None)
        if self.compares and expected is not None and full and obs != expected:
            self.breaks += 1
            episode, _ = ring.open.pop(stream)
            ring.ended.add(episode)
        ring.write(stream, ends)
        if not ends and quiet and self.compares:
            self.last_next[stream] = next_obs


def first_bad_action(
    rows: np.ndarray, columns: np.ndarray, starts: np.ndarray, limits: np.ndarray
) -> int:
    """The twin of :func:`marlbuf._kernels.actions.first_bad_action`."""
    bounds = [*starts.tolist(), columns.shape[0]]
    agents = starts.shape[0]
    for t in range(rows.shape[0]):
        for a in range(agents):
            values = [float(rows[t, c]) for c in columns[bounds[a] : bounds[a + 1]]]
            inside = all(0.0 <= v <= 1.0 for v in values)
            if not inside or not abs(sum(values) - 1.0) <= limits[a]:
                return t * agents + a
    return -1
