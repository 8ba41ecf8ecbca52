"""Kernels of the write path: one step of ``add`` checked, staged and stored.

The kernels take ``add``'s five fields as tuples in agent order — per-agent arrays
(observations, continuous or one-hot actions) and scalars (integer actions, rewards, dones) —
exactly as the caller's dicts hold them, so the values are read by compiled code, not converted
by NumPy call by call. A 0-d array is read as the scalar it holds (what some environments return
as a reward or an action). The ``*_leading_step`` variants take the items of a one-step
``extend`` or ``add_envs``: every item with a leading axis of length 1 (``obs[agent]`` of shape
``(1, *obs_shape)``, ``reward[agent]`` of shape ``(1,)``), read at its first row without a
copy. Every kernel first *checks* the whole step without writing anything: each item has its
expected shape and a dtype the kernel takes (bools, integers, float32, float64), every float is
finite and within the stored dtype's range, every integer action is a discrete action in range.
Anything else (or any item type the kernel does not take) makes it return without a write, and
the caller hands the step to the complete validation
(:meth:`marlbuf.staging.RowCodec.stage`), which explains the problem. The tuples may mix item
types (a Python float and a NumPy float32 reward): each item type gets its own code
(``literal_unroll``), and a type the kernel does not take compiles to "not the common case".

Then the step is written:

* :func:`stage_step` into a staging row (for callers that still commit rows: memory-mapped
  buffers log them first, sequence samplers read their done flags);
* :func:`store_dense_step` / :func:`store_lean_step` straight into the storage row at a ring
  slot (interleaved rows in RAM), the write generation recorded and, observations stored once,
  the next-observation links updated (:class:`marlbuf.writer.NextObsLinks`): one call per add.

:func:`commit_dense_step` does the same from an already staged dense row (with observations
stored once, :func:`marlbuf._kernels.links.commit_lean_step`).

All five fields of a row share one float dtype here (the caller checks); offsets are in
elements of that dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import literal_unroll, njit, types
from numba.extending import overload

from marlbuf._config import DISCRETE_SUM_TOLERANCE
from marlbuf._kernels.links import link_slot

#: Columns of the step plan (one row per agent, int64): element offsets of the agent's obs,
#: action, reward, next_obs and done in a dense row, of its done in a lean row (observations
#: stored once; obs, action and reward sit where they are in a dense row, and a side row has the
#: obs section's layout), its number of discrete actions (0: continuous), then the expected
#: shape of an obs item (ndim, then the dims) and of an action item (ndim, then the dims), each
#: padded to the largest ndim.
(
    PLAN_OBS,
    PLAN_ACTION,
    PLAN_REWARD,
    PLAN_NEXT_OBS,
    PLAN_DONE,
    PLAN_DONE_LEAN,
    PLAN_DISCRETE,
    PLAN_OBS_DIMS,
) = range(8)


#: What :func:`store_lean_step` returns for a step it did not take (nothing written).
STEP_DECLINED = -3


# ----------------------------------------------------------------------------- items
def _at_step(x):
    """An item of ``add`` as the kernels read it: a 0-d array as its scalar, else itself."""


@overload(_at_step)
def _at_step_impl(x):
    if isinstance(x, types.Array) and x.ndim == 0:
        return lambda x: x[()]
    return lambda x: x


def _at_first(x):
    """An item of a one-step ``extend``/``add_envs`` as the kernels read it: its first row."""


@overload(_at_first)
def _at_first_impl(x):
    if isinstance(x, types.Array) and x.ndim >= 1:
        return lambda x: x[0]
    return lambda x: x  # never read: the leading check declined it


def _one_row(x):
    """Whether the item of a one-step ``extend``/``add_envs`` has a leading axis of length 1."""


@overload(_one_row)
def _one_row_impl(x):
    if isinstance(x, types.Array) and x.ndim >= 1:
        return lambda x: x.shape[0] == 1
    return lambda x: False


def _read_type(item: Any, leading: bool) -> Any:
    """The Numba type of an item as the kernels read it (see :func:`_at_step` and
    :func:`_at_first`), or ``None`` for an item a one-step ``extend`` cannot take."""
    if leading:
        if not isinstance(item, types.Array) or item.ndim == 0:
            return None
        return item.dtype if item.ndim == 1 else item.copy(ndim=item.ndim - 1, layout="A")
    if isinstance(item, types.Array) and item.ndim == 0:
        return item.dtype
    return item


# ----------------------------------------------------------------------------- typing helpers
def _takes(dtype: Any) -> bool:
    """Whether the kernels read items of this Numba dtype."""
    if isinstance(dtype, (types.Boolean, types.Integer)):
        return True
    return isinstance(dtype, types.Float) and dtype.bitwidth in (32, 64)


def _stored_dtype(carrier: Any) -> np.dtype:
    """The NumPy float dtype of a Numba array or scalar type."""
    dtype = carrier.dtype if isinstance(carrier, types.Array) else carrier
    return np.dtype(str(dtype))


def _limit_of(carrier):
    """The largest finite value of the stored float dtype (that of ``carrier``, an array or a
    scalar)."""


@overload(_limit_of)
def _limit_of_impl(carrier):
    limit = float(np.finfo(_stored_dtype(carrier)).max)
    return lambda carrier: limit


def _typed(words, carrier):
    """The row ``words`` (uint64) viewed in the stored dtype (that of ``carrier``)."""


@overload(_typed)
def _typed_impl(words, carrier):
    if _stored_dtype(carrier) == np.dtype(np.float32):
        return lambda words, carrier: words.view(np.float32)
    return lambda words, carrier: words.view(np.float64)


# ----------------------------------------------------------------------------- checks
# (the overloads' bodies hold their loops: a call into another jitted function per item costs
# more than the item's work at a few agents)
def _check_array(x, plan, k, dims, limit):
    """Whether the array ``x`` has the shape ``plan[k, dims]`` (ndim, then the dims) and every
    value stores finite (magnitude at most ``limit``: False for NaN and inf)."""


@overload(_check_array)
def _check_array_impl(x, plan, k, dims, limit):
    if not (isinstance(x, types.Array) and _takes(x.dtype)) or x.ndim == 0:
        return lambda x, plan, k, dims, limit: False  # 0-d items: the complete path
    nd = x.ndim
    if not isinstance(x.dtype, types.Float):  # ints and bools are finite and in range

        def shape_only(x, plan, k, dims, limit):
            if plan[k, dims] != nd:
                return False
            for d in range(nd):
                if x.shape[d] != plan[k, dims + 1 + d]:
                    return False
            return True

        return shape_only

    def check(x, plan, k, dims, limit):
        if plan[k, dims] != nd:
            return False
        for d in range(nd):
            if x.shape[d] != plan[k, dims + 1 + d]:
                return False
        ok = True
        for i in range(x.shape[0]):
            ok &= abs(x[i]) <= limit
        return ok

    def check_nd(x, plan, k, dims, limit):
        if plan[k, dims] != nd:
            return False
        for d in range(nd):
            if x.shape[d] != plan[k, dims + 1 + d]:
                return False
        flat = x.ravel()  # a view when C-contiguous, else a copy
        ok = True
        for i in range(flat.shape[0]):
            ok &= abs(flat[i]) <= limit
        return ok

    return check if nd == 1 else check_nd


def _check_action(x, plan, k, dims, limit):
    """Whether ``x`` is a discrete action in range (an integer, for an agent with
    ``plan[k, PLAN_DISCRETE]`` actions) or an action array as :func:`_check_array` takes."""


@njit(cache=True, nogil=True)
def _one_action(a: np.ndarray) -> bool:
    """Whether the 1-D action ``a`` of a discrete agent is one action: probabilities (each in
    [0, 1], summing to 1 within ``DISCRETE_SUM_TOLERANCE``), a one-hot vector among them."""
    total = 0.0
    for i in range(a.shape[0]):
        value = np.float64(a[i])
        if not (0.0 <= value <= 1.0):
            return False
        total += value
    return abs(total - 1.0) <= DISCRETE_SUM_TOLERANCE


@overload(_check_action)
def _check_action_impl(x, plan, k, dims, limit):
    if isinstance(x, types.Array) and x.ndim == 1:

        def check(x, plan, k, dims, limit):
            if not _check_array(x, plan, k, dims, limit):
                return False
            return plan[k, PLAN_DISCRETE] == 0 or _one_action(x)

        return check
    if isinstance(x, types.Array):  # a discrete agent's action is 1-D: the others only

        def check_nd(x, plan, k, dims, limit):
            return plan[k, PLAN_DISCRETE] == 0 and _check_array(x, plan, k, dims, limit)

        return check_nd
    if isinstance(x, types.Integer):  # not a bool: Numba's bool is not an Integer
        if x.signed:  # type: ignore[attr-defined]
            return lambda x, plan, k, dims, limit: 0 <= x < plan[k, PLAN_DISCRETE]
        return lambda x, plan, k, dims, limit: x < np.uint64(max(plan[k, PLAN_DISCRETE], 0))
    return lambda x, plan, k, dims, limit: False


def _check_scalar(x, limit):
    """Whether the scalar ``x`` (bool, integer or float) stores finite."""


@overload(_check_scalar)
def _check_scalar_impl(x, limit):
    if isinstance(x, (types.Boolean, types.Integer)):
        return lambda x, limit: True
    if isinstance(x, types.Float) and x.bitwidth in (32, 64):
        return lambda x, limit: abs(x) <= limit
    return lambda x, limit: False


@njit(cache=True, nogil=True)
def _action_dims(plan: np.ndarray) -> int:
    """The plan column of the action shape (obs and action shapes take the same width)."""
    return PLAN_OBS_DIMS + (plan.shape[1] - PLAN_OBS_DIMS) // 2


@njit(cache=True, nogil=True)
def _obs_bytes(plan: np.ndarray, itemsize: int) -> int:
    """The length in bytes of the obs section: up to the end of the last agent's obs."""
    last = plan.shape[0] - 1
    size = 1
    for d in range(plan[last, PLAN_OBS_DIMS]):
        size *= plan[last, PLAN_OBS_DIMS + 1 + d]
    return (plan[last, PLAN_OBS] + size) * itemsize


# ----------------------------------------------------------------------------- writes
def _write_array(x, dst, start):
    """Write the (checked) array ``x`` into ``dst[start:]`` in C order."""


@overload(_write_array)
def _write_array_impl(x, dst, start):
    if not isinstance(x, types.Array):
        return lambda x, dst, start: None  # never called: the check declined it

    def write(x, dst, start):
        out = dst[start:]  # indices from 0: no negative-index fix-up, so the loop vectorizes
        for i in range(x.shape[0]):
            out[i] = x[i]

    def write_nd(x, dst, start):
        flat = x.ravel()
        out = dst[start:]
        for i in range(flat.shape[0]):
            out[i] = flat[i]

    return write if x.ndim == 1 else write_nd


def _write_action(x, dst, start, n):
    """Write the (checked) action ``x``: an integer one-hot over ``n`` elements, an array as
    is."""


@overload(_write_action)
def _write_action_impl(x, dst, start, n):
    if isinstance(x, types.Integer):

        def one_hot(x, dst, start, n):
            out = dst[start:]
            for i in range(n):
                out[i] = 0
            out[np.int64(x)] = 1

        return one_hot
    return lambda x, dst, start, n: _write_array(x, dst, start)


def _write_scalar(x, dst, pos):
    """``dst[pos] = x`` for a (checked) scalar."""


@overload(_write_scalar)
def _write_scalar_impl(x, dst, pos):
    if isinstance(x, (types.Boolean, types.Integer, types.Float)):

        def write(x, dst, pos):
            dst[pos] = x

        return write
    return lambda x, dst, pos: None  # never called: the check declined it


def _always(x):
    """True: an item of ``add`` needs no leading-axis check."""


@overload(_always)
def _always_impl(x):
    return lambda x: True


def _item_helpers(take: Any, whole: Any) -> tuple[Any, Any, Any]:
    """The checks and writes of a step whose item types are mixed within a field (one
    ``literal_unroll`` body per item type), for items read through ``take`` (:func:`_at_step`,
    or :func:`_at_first` for a one-step ``extend``) and checked by ``whole`` first
    (:func:`_always`, or :func:`_one_row`): ``(valid, write_items, write_head)``."""

    @njit(nogil=True)
    def valid(
        obs: Any,
        action: Any,
        reward: Any,
        next_obs: Any,
        done: Any,
        plan: np.ndarray,
        limit: float,
    ) -> bool:
        """Whether the step is the common case (see the module docstring); writes nothing."""
        action_dims = _action_dims(plan)
        ok = True
        k = 0
        for x in literal_unroll(obs):
            ok = ok and whole(x) and _check_array(take(x), plan, k, PLAN_OBS_DIMS, limit)
            k += 1
        k = 0
        for x in literal_unroll(action):
            ok = ok and whole(x) and _check_action(take(x), plan, k, action_dims, limit)
            k += 1
        for x in literal_unroll(reward):
            ok = ok and whole(x) and _check_scalar(take(x), limit)
        k = 0
        for x in literal_unroll(next_obs):
            ok = ok and whole(x) and _check_array(take(x), plan, k, PLAN_OBS_DIMS, limit)
            k += 1
        for x in literal_unroll(done):
            ok = ok and whole(x) and _check_scalar(take(x), limit)
        return ok

    @njit(nogil=True)
    def write_items(items: Any, dst: np.ndarray, plan: np.ndarray, column: int) -> None:
        """Write one array per agent (obs or next_obs) at the offsets ``plan[:, column]``."""
        k = 0
        for x in literal_unroll(items):
            _write_array(take(x), dst, plan[k, column])
            k += 1

    @njit(nogil=True)
    def write_head(
        obs: Any,
        action: Any,
        reward: Any,
        done: Any,
        dst: np.ndarray,
        plan: np.ndarray,
        done_column: int,
    ) -> None:
        """Write obs, action, reward and done (at ``plan[:, done_column]``) into ``dst``."""
        write_items(obs, dst, plan, PLAN_OBS)
        k = 0
        for x in literal_unroll(action):
            _write_action(take(x), dst, plan[k, PLAN_ACTION], plan[k, PLAN_DISCRETE])
            k += 1
        k = 0
        for x in literal_unroll(reward):
            _write_scalar(take(x), dst, plan[k, PLAN_REWARD])
            k += 1
        k = 0
        for x in literal_unroll(done):
            _write_scalar(take(x), dst, plan[k, done_column])
            k += 1

    return valid, write_items, write_head


#: the mixed-type helpers of ``add``'s items and of a one-step ``extend``'s
_STEP_HELPERS = _item_helpers(_at_step, _always)
_LEADING_HELPERS = _item_helpers(_at_first, _one_row)


@njit(cache=True, nogil=True)
def _zero(dst: np.ndarray, gaps: np.ndarray) -> None:
    """Zero the element ranges ``gaps[g, 0]:gaps[g, 1]`` of ``dst`` (a row's padding)."""
    for g in range(gaps.shape[0]):
        for i in range(gaps[g, 0], gaps[g, 1]):
            dst[i] = 0


# ----------------------------------------------------------------------------- one body
#: What :func:`_body` writes to: a staging row, a dense storage row, a lean storage row (and a
#: side row); ``| _LEADING``: from the items of a one-step ``extend``/``add_envs``
_STAGE, _DENSE, _LEAN = range(3)
_LEADING = 4
_STAGE_LEADING, _DENSE_LEADING, _LEAN_LEADING = (k | _LEADING for k in (_STAGE, _DENSE, _LEAN))


def _read_types(obs, action, reward, next_obs, done, leading):
    """Per field, the one type its items are read as (:func:`_read_type`), when each field's
    tuple holds one item type that the index-loop body takes: 1-D arrays of a dtype the kernels
    read (obs, next_obs, array actions), integer actions, and bool, integer, float32 or float64
    scalars (reward, done); else ``None``."""
    fields = (obs, action, reward, next_obs, done)
    if not all(isinstance(items, types.UniTuple) for items in fields):
        return None
    read = [_read_type(items.dtype, leading) for items in fields]
    if any(t is None for t in read):
        return None
    o, act, r, no, d = read
    for t in (o, no):
        if not (isinstance(t, types.Array) and t.ndim == 1 and _takes(t.dtype)):
            return None
    if not isinstance(act, types.Integer) and not (
        isinstance(act, types.Array) and act.ndim == 1 and _takes(act.dtype)
    ):
        return None
    if not (_takes(r) and _takes(d)):
        return None
    return read


def _body(
    obs,
    action,
    reward,
    next_obs,
    done,
    plan,
    gaps,
    dst,
    slot,
    generation,
    write_generation,
    side,
    pointers,
    prev_slot,
    prev_generation,
    spare,
    kind,
):
    """Check one step and, if it is the common case, write it (``kind``: :data:`_STAGE` into
    the row ``dst``, :data:`_DENSE` / :data:`_LEAN` into ``dst[slot]`` of a storage table, with
    its padding zeroed, the links updated for a lean row and the write generation recorded).
    Returns :data:`STEP_DECLINED` (nothing written), else 0 (staging, dense) or the free-stack
    instruction of :func:`link_step` (lean)."""


@overload(_body, prefer_literal=True)
def _body_impl(
    obs,
    action,
    reward,
    next_obs,
    done,
    plan,
    gaps,
    dst,
    slot,
    generation,
    write_generation,
    side,
    pointers,
    prev_slot,
    prev_generation,
    spare,
    kind,
):
    if not isinstance(kind, types.IntegerLiteral):
        return None
    target = kind.literal_value & ~_LEADING
    leading = bool(kind.literal_value & _LEADING)
    stage = target == _STAGE
    lean = target == _LEAN
    done_column = PLAN_DONE_LEAN if lean else PLAN_DONE
    read = _read_types(obs, action, reward, next_obs, done, leading)
    valid, write_items, write_head = _LEADING_HELPERS if leading else _STEP_HELPERS
    if read is None:
        # item types mixed within a field, or not the common ones: one helper per item type
        # (slower, as general as the checks)

        def mixed(
            obs,
            action,
            reward,
            next_obs,
            done,
            plan,
            gaps,
            dst,
            slot,
            generation,
            write_generation,
            side,
            pointers,
            prev_slot,
            prev_generation,
            spare,
            kind,
        ):
            if not valid(obs, action, reward, next_obs, done, plan, _limit_of(dst)):
                return STEP_DECLINED
            if stage:
                row = dst
            else:
                row = dst[slot]
            write_head(obs, action, reward, done, row, plan, done_column)
            code = 0
            if lean:
                _zero(row, gaps)
                code, new = link_slot(
                    row.view(np.uint64),
                    slot,
                    _obs_bytes(plan, row.itemsize),
                    side,
                    pointers[0],
                    pointers[1],
                    write_generation,
                    prev_slot,
                    prev_generation,
                    spare,
                )
                write_items(next_obs, _typed(side[new], dst), plan, PLAN_OBS)  # obs layout
            else:
                write_items(next_obs, row, plan, PLAN_NEXT_OBS)
            if not stage:
                if not lean:
                    _zero(row, gaps)
                write_generation[slot] = generation
            return code

        return mixed

    # one item type per field: index loops with every check and copy inline (a call into a
    # helper per item costs more than the item's work at a few agents)
    obs_type, action_type, reward_type, next_type, done_type = read
    float_obs = isinstance(obs_type.dtype, types.Float)
    float_next = isinstance(next_type.dtype, types.Float)
    float_reward = isinstance(reward_type, types.Float)
    float_done = isinstance(done_type, types.Float)
    int_actions = isinstance(action_type, types.Integer)
    signed_actions = int_actions and action_type.signed
    float_actions = not int_actions and isinstance(action_type.dtype, types.Float)
    stored = np.float32 if _stored_dtype(dst) == np.dtype(np.float32) else np.float64
    take = _at_first if leading else _at_step  # an item as read (its first row, or itself)

    def uniform(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        gaps,
        dst,
        slot,
        generation,
        write_generation,
        side,
        pointers,
        prev_slot,
        prev_generation,
        spare,
        kind,
    ):
        limit = _limit_of(dst)
        action_dims = _action_dims(plan)
        n = len(obs)
        if leading:  # every item holds exactly one step
            for k in range(n):
                if not (
                    _one_row(obs[k])
                    and _one_row(action[k])
                    and _one_row(reward[k])
                    and _one_row(next_obs[k])
                    and _one_row(done[k])
                ):
                    return STEP_DECLINED
        for k in range(n):
            x = take(obs[k])
            y = take(next_obs[k])
            size = plan[k, PLAN_OBS_DIMS + 1]
            if plan[k, PLAN_OBS_DIMS] != 1 or x.shape[0] != size or y.shape[0] != size:
                return STEP_DECLINED
            ok = True
            if float_obs:
                for i in range(size):
                    ok &= abs(x[i]) <= limit
            if float_next:
                for i in range(size):
                    ok &= abs(y[i]) <= limit
            if float_reward:
                ok &= abs(take(reward[k])) <= limit
            if float_done:
                ok &= abs(take(done[k])) <= limit
            a = take(action[k])
            if int_actions:
                if signed_actions:
                    ok &= 0 <= a < plan[k, PLAN_DISCRETE]
                else:
                    ok &= a < np.uint64(max(plan[k, PLAN_DISCRETE], 0))
            else:
                if plan[k, action_dims] != 1 or a.shape[0] != plan[k, action_dims + 1]:
                    return STEP_DECLINED
                if float_actions:
                    for i in range(a.shape[0]):
                        ok &= abs(a[i]) <= limit
                if plan[k, PLAN_DISCRETE] > 0:
                    ok &= _one_action(a)  # a vector must be one action (the checks explain)
            if not ok:
                return STEP_DECLINED
        if stage:
            row = dst
        else:
            row = dst[slot]
        for k in range(n):
            x = take(obs[k])
            out = row[plan[k, PLAN_OBS] :]  # indices from 0: the copy loops vectorize
            for i in range(x.shape[0]):
                out[i] = x[i]
            if not lean:
                y = take(next_obs[k])
                out = row[plan[k, PLAN_NEXT_OBS] :]
                for i in range(y.shape[0]):
                    out[i] = y[i]
            a = take(action[k])
            out = row[plan[k, PLAN_ACTION] :]
            if int_actions:
                for i in range(plan[k, PLAN_DISCRETE]):
                    out[i] = 0
                out[np.int64(a)] = 1
            else:
                for i in range(a.shape[0]):
                    out[i] = a[i]
            row[plan[k, PLAN_REWARD]] = take(reward[k])
            row[plan[k, done_column]] = take(done[k])
        code = 0
        if not stage:
            _zero(row, gaps)
        if lean:  # link_slot, inline (as the loops above)
            words = row.view(np.uint64)
            obs_bytes = (plan[n - 1, PLAN_OBS] + plan[n - 1, PLAN_OBS_DIMS + 1]) * row.itemsize
            whole = obs_bytes // 8
            tail_bits = 8 * (obs_bytes - 8 * whole)
            linked = False
            held = -1
            if (
                prev_slot >= 0
                and prev_slot != slot
                and write_generation[prev_slot] == prev_generation
            ):
                held = pointers[1, prev_slot]
                if held >= 0:
                    diff = np.uint64(0)
                    for w in range(whole):
                        diff |= side[held, w] ^ words[w]
                    if tail_bits:
                        tail = (np.uint64(1) << np.uint64(tail_bits)) - np.uint64(1)
                        diff |= (side[held, whole] ^ words[whole]) & tail
                    if diff == 0:
                        pointers[0, prev_slot] = slot
                        pointers[1, prev_slot] = -1
                        linked = True
            old = pointers[1, slot]
            pointers[0, slot] = -1
            if old >= 0:
                new = old
                code = held if linked else -1
            elif linked:
                new = held
                code = -1
            else:
                new = spare
                code = -2
            pointers[1, slot] = new
            next_row = side[new].view(stored)  # a side row has the obs section's layout
            for k in range(n):
                y = take(next_obs[k])
                out = next_row[plan[k, PLAN_OBS] :]
                for i in range(y.shape[0]):
                    out[i] = y[i]
        if not stage:
            write_generation[slot] = generation
        return code

    return uniform


# ----------------------------------------------------------------------------- kernels
@njit(cache=True, nogil=True)
def stage_step(
    obs: Any,
    action: Any,
    reward: Any,
    next_obs: Any,
    done: Any,
    row: np.ndarray,
    plan: np.ndarray,
) -> bool:
    """Check one step of every agent and, if it is the common case, write it into ``row``.

    Parameters
    ----------
    obs, next_obs : tuple of ndarray, one per agent (agent order)
        Items of the shape in the plan (bools, integers, float32 or float64).
    action : tuple, one per agent
        An integer in ``[0, n)`` for a discrete agent (stored one-hot), or an array of the
        action shape.
    reward, done : tuple of scalars, one per agent
        Bools, integers, float32 or float64.
    row : ndarray, shape (row_elements,), float32 or float64
        A dense staging row viewed in the dtype the five fields are stored in; the five fields'
        elements are overwritten (padding is left as it is).
    plan : ndarray, shape (n_agents, columns), int64
        Offsets and shapes (see :data:`PLAN_OBS` and the columns after it).

    Returns
    -------
    bool
        Whether the step was the common case and was written. ``False``: ``row`` is unchanged.
    """
    unused = plan[0]  # the arguments _body reads only for storage rows
    code = _body(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        plan,
        row,
        0,
        0,
        unused,
        plan,
        plan,
        -1,
        -1,
        -1,
        _STAGE,
    )
    return code != STEP_DECLINED


@njit(cache=True, nogil=True)
def store_dense_step(
    obs: Any,
    action: Any,
    reward: Any,
    next_obs: Any,
    done: Any,
    plan: np.ndarray,
    gaps: np.ndarray,
    table: np.ndarray,
    slot: int,
    generation: int,
    write_generation: np.ndarray,
) -> bool:
    """:func:`stage_step` straight into the dense storage row ``table[slot]`` (``table``: the
    storage's rows viewed in the stored dtype, shape (capacity, row_elements)), its padding
    (element ranges ``gaps``, shape (g, 2)) zeroed and ``write_generation[slot] =
    generation`` recorded. Whether the step was taken (``False``: nothing changed)."""
    code = _body(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        gaps,
        table,
        slot,
        generation,
        write_generation,
        plan,
        plan,
        -1,
        -1,
        -1,
        _DENSE,
    )
    return code != STEP_DECLINED


@njit(cache=True, nogil=True)
def store_lean_step(
    obs: Any,
    action: Any,
    reward: Any,
    next_obs: Any,
    done: Any,
    plan: np.ndarray,
    gaps: np.ndarray,
    table: np.ndarray,
    slot: int,
    generation: int,
    write_generation: np.ndarray,
    side: np.ndarray,
    pointers: np.ndarray,
    prev_slot: int,
    prev_generation: int,
    spare: int,
) -> int:
    """:func:`store_dense_step` for observations stored once: obs, action, reward and done
    into the lean row ``table[slot]``, then the links updated as by :func:`link_step` (the new
    obs compared with the side row of the stream's previous transition; ``pointers``: shape
    (2, capacity), int64, the links' ``next_slot`` and ``side_row``) and next_obs written into
    the slot's side row (``side``: shape (side_rows, side_words), uint64). Returns
    :func:`link_step`'s free-stack instruction, or :data:`STEP_DECLINED` (nothing changed)."""
    return _body(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        gaps,
        table,
        slot,
        generation,
        write_generation,
        side,
        pointers,
        prev_slot,
        prev_generation,
        spare,
        _LEAN,
    )


@njit(cache=True, nogil=True)
def stage_leading_step(
    obs: Any,
    action: Any,
    reward: Any,
    next_obs: Any,
    done: Any,
    row: np.ndarray,
    plan: np.ndarray,
) -> bool:
    """:func:`stage_step` of a one-step ``extend``/``add_envs``: every item with a leading axis
    of length 1 (arrays of shape ``(1, *shape)``, scalars as arrays of shape ``(1,)``), read at
    its first row."""
    unused = plan[0]
    code = _body(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        plan,
        row,
        0,
        0,
        unused,
        plan,
        plan,
        -1,
        -1,
        -1,
        _STAGE_LEADING,
    )
    return code != STEP_DECLINED


@njit(cache=True, nogil=True)
def store_dense_leading_step(
    obs: Any,
    action: Any,
    reward: Any,
    next_obs: Any,
    done: Any,
    plan: np.ndarray,
    gaps: np.ndarray,
    table: np.ndarray,
    slot: int,
    generation: int,
    write_generation: np.ndarray,
) -> bool:
    """:func:`store_dense_step` of a one-step ``extend``/``add_envs`` (items as
    :func:`stage_leading_step` takes them)."""
    code = _body(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        gaps,
        table,
        slot,
        generation,
        write_generation,
        plan,
        plan,
        -1,
        -1,
        -1,
        _DENSE_LEADING,
    )
    return code != STEP_DECLINED


@njit(cache=True, nogil=True)
def store_lean_leading_step(
    obs: Any,
    action: Any,
    reward: Any,
    next_obs: Any,
    done: Any,
    plan: np.ndarray,
    gaps: np.ndarray,
    table: np.ndarray,
    slot: int,
    generation: int,
    write_generation: np.ndarray,
    side: np.ndarray,
    pointers: np.ndarray,
    prev_slot: int,
    prev_generation: int,
    spare: int,
) -> int:
    """:func:`store_lean_step` of a one-step ``extend``/``add_envs`` (items as
    :func:`stage_leading_step` takes them)."""
    return _body(
        obs,
        action,
        reward,
        next_obs,
        done,
        plan,
        gaps,
        table,
        slot,
        generation,
        write_generation,
        side,
        pointers,
        prev_slot,
        prev_generation,
        spare,
        _LEAN_LEADING,
    )


@njit(cache=True, nogil=True)
def commit_dense_step(
    table: np.ndarray,
    row: np.ndarray,
    slot: int,
    generation: int,
    write_generation: np.ndarray,
) -> None:
    """Store the staged dense ``row`` (shape (row_words,), uint64) at ``table[slot]`` and record
    its write ``generation`` in ``write_generation[slot]``."""
    dst = table[slot]
    for w in range(dst.shape[0]):
        dst[w] = row[w]
    write_generation[slot] = generation
