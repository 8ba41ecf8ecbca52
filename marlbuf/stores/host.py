"""The host stores: NumPy arrays in RAM or in memory-mapped files, gathered by Numba kernels.

Two layouts hold the same data and return the same batches, bit for bit:

* :class:`AgentMajorStorage` — per agent, per field, one preallocated array (the layout of
  openai/maddpg, SB3, cpprb): a joint batch of N agents costs 5N small gathers.
* :class:`InterleavedStorage` — one 2-D table ``[capacity, row_bytes]``; a row holds every
  agent's fields for one timestep (key-value layout, Gogineni et al. Sec. 5.3), so a joint batch
  is one gather of wide rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from marlbuf import _config
from marlbuf._kernels import (
    HALF_TO_FLOAT_BITS,
    gather_lean_rows,
    gather_next_field,
    gather_segments,
    gather_spans,
    scatter_lean,
    scatter_rows,
)
from marlbuf._kernels.plan import HALF_TO_FLOAT
from marlbuf.batch import NotGathered
from marlbuf.rows import RowViews
from marlbuf.spec import GLOBAL
from marlbuf.stores.base import (
    FieldSelection,
    Storage,
    StoreOptions,
    build_plan,
    copy_options,
    ring_ranges,
)

if TYPE_CHECKING:
    from marlbuf.writer import NextObsLinks


class AgentMajorStorage(Storage):
    """Per agent, per field, one ``(capacity, *shape)`` array (page-aligned)."""

    layout = "agent_major"

    def __init__(self, options: StoreOptions) -> None:
        super().__init__(options)
        self.batch_layout = "per_agent"  # the only way this layout gathers
        # no next_obs arrays when observations are stored once (or not at all)
        self.fields = tuple(
            f for f in self.codec.field_names if not (self.lean and f == "next_obs")
        )
        # one array per (field, agent): "obs/agent_0", ...; a global field's is its name
        self._data: dict[str, dict[str, np.ndarray]] = {f: {} for f in self.fields}
        for fs in self.codec.slots:
            if fs.field in self._data:
                name = fs.field if fs.agent == GLOBAL else f"{fs.field}/{fs.agent}"
                self._data[fs.field][fs.agent] = self.allocate(
                    name, (self.capacity, *fs.shape), fs.dtype
                )
        # (field, agent, 2-D source view) for the gather loop, built once
        self._flat = [
            (f, a, arr.reshape(self.capacity, -1))
            for f in self.fields
            for a, arr in self._data[f].items()
        ]
        # observations stored once: each agent's next_obs comes from its obs array (successor)
        # or its part of the side table, copied in the widest word that divides both
        self._next: list[tuple[str, np.dtype, int]] = []
        if self.links is not None:
            nobs = {fs.agent: fs for fs in self.codec.slots if fs.field == "next_obs"}
            for agent in self.specs:
                fs = nobs[agent]
                relative = fs.offset - self.codec.next_obs_start
                unit = 8
                while fs.nbytes % unit or relative % unit:
                    unit //= 2
                self._next.append((agent, np.dtype(f"u{unit}"), relative // unit))

    @property
    def nbytes(self) -> int:
        data = sum(a.nbytes for per_agent in self._data.values() for a in per_agent.values())
        return data + (self.links.nbytes if self.links is not None else 0)

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        if views is None:
            views = self.codec.views(rows)
        ranges = ring_ranges(slots)
        for f in self.fields:
            for agent, dst in self._data[f].items():
                src = views[f][agent]
                for lo, hi, s0 in ranges:
                    dst[lo:hi] = src[s0 : s0 + (hi - lo)]

    def gather(
        self,
        indices: np.ndarray,
        out_block: np.ndarray | None = None,
        select: FieldSelection | None = None,
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        n = indices.shape[0]
        if select is None:
            select = self.default_select
        block = self._new_block(n, select) if out_block is None else out_block
        if select is None:
            out = self._carve(block, n)
            flat = self._flat
            next_fields = self._next
        else:  # the chosen fields only, carved from a block of their own
            out = self._select_views(block, n, select)
            flat = [x for x in self._flat if x[0] in out]
            next_fields = self._next if "next_obs" in out else []
        for field_name, agent, src in flat:
            dst = out[field_name][agent]
            # Numba has no float16: half-precision arrays are moved as their 2-byte patterns
            bits = src.view(np.uint16) if src.dtype == np.float16 else src
            if dst.dtype == src.dtype:
                self._gather_kernel(dst.nbytes)(bits, indices, dst.reshape(n, -1).view(bits.dtype))
            else:  # half precision to float32: gathered, then widened (a second pass)
                narrow = np.empty((n, src.shape[1]), dtype=src.dtype)
                self._gather_kernel(narrow.nbytes)(bits, indices, narrow.view(np.uint16))
                np.copyto(dst.reshape(n, -1), narrow)
        links = self.links
        if links is not None:
            for agent, word, side_offset in next_fields:
                dst = out["next_obs"][agent]
                obs = self._data["obs"][agent].reshape(self.capacity, -1)
                narrow = dst if dst.dtype == obs.dtype else np.empty((n, obs.shape[1]), obs.dtype)
                gather_next_field(
                    obs.view(word),
                    links.side.view(word),
                    indices,
                    links.next_slot,
                    links.side_row,
                    side_offset,
                    narrow.reshape(n, -1).view(word),
                )
                if narrow is not dst:
                    np.copyto(dst.reshape(n, -1), narrow)
        return out, block

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            f if a == GLOBAL else f"{f}/{a}": arr
            for f in self.fields
            for a, arr in self._data[f].items()
        }

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        if field_name in self._not_stored:
            NotGathered(field_name, self.field_names, False).refuse()
        if field_name not in self._data:  # next_obs stored once: assembled by a gather
            fields, _ = self.gather(np.arange(count, dtype=np.int64))
            view = fields[field_name][agent]
        else:
            view = self._data[field_name][agent][:count]
        view.flags.writeable = False
        return view


class InterleavedStorage(Storage):
    """One page-aligned table ``[capacity, row_bytes]``; a row is one timestep of every agent.

    The row is field-major (all agents' obs, then all actions, rewards, next obs, dones; see
    :func:`marlbuf.spec.interleaved_row_layout`) and padded to a whole number of cache lines. The
    table is kept as 8-byte words so that the gather kernel moves words, not bytes.
    """

    #: ``gather`` writes a row of zeros for the index -1 (sequence batches' masked steps)
    zero_fills = True

    layout = "interleaved"

    def __init__(self, options: StoreOptions) -> None:
        super().__init__(options)
        self.row_bytes = self.codec.row_bytes  # a gathered (dense) row
        self.row_words = self.codec.row_words
        # a stored row: dense, or lean (no next_obs) when observations are stored once or not
        # at all
        self.table_row_bytes = self.codec.lean_row_bytes if self.lean else self.row_bytes
        self.table = self.allocate(
            "table", (self.capacity, self.table_row_bytes // 8), np.dtype(np.uint64)
        )
        codec = self.codec
        done_lean, done_dense, done_bytes = codec.done_span
        words = lambda nbytes: -(-nbytes // 8)  # noqa: E731 - sections start on words
        self._lean_args = (
            words(codec.head_bytes),
            done_lean // 8,
            done_dense // 8,
            words(done_bytes),
        )
        # the default gather (lean rows -> dense rows batch, no conversion): three block copies
        # per row, in 8-byte words (see gather_lean_rows)
        next_bytes = codec.obs_bytes
        whole, rest = divmod(next_bytes, 8)
        next_words = whole if rest else whole - 1  # the last (partial) word goes through a mask
        last_mask = (1 << (8 * rest)) - 1 if rest else (1 << 64) - 1
        self._lean_rows_args = tuple(
            np.uint64(x)
            for x in (
                words(codec.head_bytes),
                codec.next_obs_start // 8,
                next_words,
                last_mask,
                done_lean // 8,
                done_dense // 8,
                words(done_bytes),
            )
        )
        #: rows per block of the general gather (its staging area stays in cache)
        self._block_rows = max(
            _config.GATHER_BLOCK_MIN_ROWS, _config.GATHER_BLOCK_BYTES // self.table_row_bytes
        )
        self._plans: dict[int, np.ndarray] = {}
        self._selected_plans: dict[tuple[str, ...], dict[int, tuple[np.ndarray, bool]]] = {}
        self._no_links = np.zeros(0, dtype=np.int64)
        self._no_side = np.zeros((1, 8), dtype=np.uint8)

    def _plan(self, n: int) -> np.ndarray:
        """The gather plan for ``n``-row batches (rows batches: the same for every ``n``)."""
        key = 0 if self.batch_layout == "rows" else n
        if key not in self._plans:
            stored = self.codec.lean_slots if self.lean else self.codec.slots
            obs_slots = {fs.agent: fs for fs in self.codec.slots if fs.field == "obs"}
            if self.batch_layout == "rows":
                step = self.batch_codec.row_bytes
                targets = [
                    (fs.field, fs.agent, fs.offset, step, fs.dtype) for fs in self.batch_codec.slots
                ]
            else:
                layout, _ = self._carving(n)
                targets = [
                    (f, a, offset, nbytes // n, dtype) for f, a, offset, nbytes, dtype, _ in layout
                ]
            self._plans = {key: build_plan(stored, obs_slots, targets, self.links is not None)}
        return self._plans[key]

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes) + (self.links.nbytes if self.links is not None else 0)

    def write(self, slots: np.ndarray, rows: np.ndarray, views: RowViews | None) -> None:
        if not self.lean:
            scatter_rows(self.table, slots, rows)
        else:
            scatter_lean(self.table, slots, rows, *self._lean_args)

    def gather(
        self,
        indices: np.ndarray,
        out_block: np.ndarray | None = None,
        select: FieldSelection | None = None,
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        if select is None:
            select = self.default_select  # None unless next observations are not stored
        if select is not None:
            return self._gather_selected(indices, out_block, select)
        n = indices.shape[0]
        block = self._new_block(n) if out_block is None else out_block
        rows = self.batch_layout == "rows"
        if rows and self.links is None and not self.converts:
            # stored rows are batch rows: one straight word copy per row
            self._gather_table_rows(self.table, indices, block)
            return self._row_views.views(block), block
        links = self.links
        if rows and links is not None and not self.converts:
            # observations stored once, rows batch: head, next_obs and tail as block copies
            head, next_dst, next_words, last_mask, tail_src, tail_dst, tail = self._lean_rows_args
            gather_lean_rows(
                self.table,
                links.side.view(np.uint64),
                indices,
                links.next_slot,
                links.side_row,
                head,
                next_dst,
                next_words,
                last_mask,
                tail_src,
                tail_dst,
                tail,
                block,
                *copy_options(self.table_row_bytes, block.nbytes),
            )
            return self._row_views.views(block), block
        # rows batch: a few long segments, run straight from the table; per-agent arrays:
        # many short ones, run over staged blocks of rows
        self._run_plan(indices, self._plan(n), links, block.reshape(-1), rows, staged=not rows)
        if rows:
            return self._row_views.views(block), block
        return self._carve(block, n), block

    def _gather_selected(
        self, indices: np.ndarray, out_block: np.ndarray | None, select: FieldSelection
    ) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
        """:meth:`gather` of the fields of ``select``: the general kernel with a plan of the
        chosen (field, agent) slots into a block of the selection's format (next observations
        are looked up only when ``next_obs`` is chosen)."""
        n = indices.shape[0]
        block = self._new_block(n, select) if out_block is None else out_block
        rows = self.batch_layout == "rows"
        if rows and select is self.default_select and self.rows_are_batch_rows:
            # next_obs="none", rows batch: stored rows are batch rows, one word copy per row
            self._gather_table_rows(self.table, indices, block)
            return select.views(block), block
        plan, direct = self._selected_plan(select, n)
        # next observations are looked up only when chosen; a plan that copies out of the row
        # itself runs straight from the table (staging whole rows would copy the fields left
        # out for nothing), as does any plan of a rows batch (a few long segments)
        links = self.links if "next_obs" in select.names else None
        self._run_plan(indices, plan, links, block.reshape(-1), rows, staged=not (rows or direct))
        return self._select_views(block, n, select), block

    def _run_plan(
        self,
        indices: np.ndarray,
        plan: np.ndarray,
        links: NextObsLinks | None,
        flat: np.ndarray,
        rows: bool,
        staged: bool,
    ) -> None:
        """Run the gather ``plan`` (:func:`build_plan`'s rows) for ``indices`` into the flat
        batch block ``flat``: with ``staged``, over staged blocks of rows (``gather_segments``:
        plans of many short segments), else row by row straight from the table
        (``gather_spans``); ``links``: where next observations live (``None`` when the plan
        reads none). Streaming stores only for ``rows`` batches: per-agent arrays are written
        as many short runs into as many arrays, which streaming stores make slower."""
        kind, src, dst, length, step, from_next = plan
        side = links.side if links is not None else self._no_side
        # every batch block is a whole number of 8-byte words (rows of words, or per-agent
        # arrays each starting on a cache line), so all three views cover it
        arguments = (
            self.table,
            side.view(np.uint64),
            indices,
            self._no_links if links is None else links.next_slot,
            self._no_links if links is None else links.side_row,
            kind,
            src,
            dst,
            length,
            step,
            from_next,
            HALF_TO_FLOAT_BITS,
            flat.view(np.uint64),
            flat.view(np.uint32),
            flat.view(np.uint8),
        )
        ahead, lines, streaming = copy_options(self.table_row_bytes, flat.nbytes)
        if staged:
            gather_segments(*arguments, self._block_rows, ahead, lines)
        else:
            gather_spans(*arguments, ahead, lines, streaming and rows)

    def _selected_plan(self, select: FieldSelection, n: int) -> tuple[np.ndarray, bool]:
        """The gather plan of ``select``'s fields for ``n``-row batches (kept per selection
        and, for per-agent batches, per ``n``), and whether it only copies out of the row
        itself (no next observations, no float16 conversion: run straight from the table)."""
        plans = self._selected_plans.setdefault(select.names, {})
        key = 0 if self.batch_layout == "rows" else n
        if key not in plans:
            stored = self.codec.lean_slots if self.lean else self.codec.slots
            obs_slots = {fs.agent: fs for fs in self.codec.slots if fs.field == "obs"}
            if self.batch_layout == "rows":
                targets = [
                    (fs.field, fs.agent, fs.offset, select.row_bytes, fs.dtype)
                    for fs in select.slots
                ]
            else:
                targets = [
                    (f, a, offset, nbytes // n, dtype)
                    for f, a, offset, nbytes, dtype, _ in select.carving(n)[0]
                ]
            plans.clear()  # one batch size at a time, as the default plans
            plan = build_plan(stored, obs_slots, targets, self.links is not None)
            direct = not (plan[5].any() or (plan[0] == HALF_TO_FLOAT).any())
            plans[key] = (plan, bool(direct))
        return plans[key]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"table": self.table}

    def read_field(self, field_name: str, agent: str, count: int) -> np.ndarray:
        if field_name in self._not_stored:
            NotGathered(field_name, self.field_names, False).refuse()
        if not self.lean:
            view = self.codec.views(self.table[:count])[field_name][agent]
        elif field_name == "next_obs":  # stored once: assembled by a gather
            fields, _ = self.gather(np.arange(count, dtype=np.int64))
            view = fields[field_name][agent]
        else:
            fs = next(x for x in self.codec.lean_slots if (x.field, x.agent) == (field_name, agent))
            raw = self.table[:count].view(np.uint8)
            view = (
                raw[:, fs.offset : fs.offset + fs.nbytes].view(fs.dtype).reshape(count, *fs.shape)
            )
        view.flags.writeable = False
        return view


LAYOUTS: dict[str, type[Storage]] = {
    AgentMajorStorage.layout: AgentMajorStorage,
    InterleavedStorage.layout: InterleavedStorage,
}
