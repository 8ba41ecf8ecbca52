"""The interleaved row format of one set of specs: where every field of every agent sits.

:class:`RowGeometry` is what the stores read: the slots of a dense row and of a lean row (without
the next-observation section), their sizes, the sections that move between the two, and
per-field, per-agent views of an array of rows. The staging of incoming transitions into such
rows (:class:`marlbuf.staging.RowCodec`) builds on it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from marlbuf import _config
from marlbuf.spec import (
    ALIVE,
    FIELDS,
    AgentSpec,
    FieldSpec,
    extra_names,
    interleaved_row_layout,
    row_fields,
)

#: per field, per agent, a view of rows (global fields under :data:`marlbuf.spec.GLOBAL`)
RowViews = dict[str, dict[str, np.ndarray]]


class RowGeometry:
    """Interleaved row format of one set of specs: offsets, sections and views.

    Parameters
    ----------
    specs : Mapping[str, AgentSpec]
        One spec per agent, in row order.
    global_fields : Mapping[str, FieldSpec] or None
        Fields stored once per step, after the per-agent fields.
    alive : bool
        Whether rows end with the per-agent alive mask.
    """

    def __init__(
        self,
        specs: Mapping[str, AgentSpec],
        global_fields: Mapping[str, FieldSpec] | None = None,
        alive: bool = False,
    ) -> None:
        self.specs = dict(specs)
        self.agents = list(self.specs)
        #: per-agent extra fields (``AgentSpec(extras=...)``), global fields, alive mask
        self.extra_names = extra_names(self.specs)
        self.global_fields: dict[str, FieldSpec] = dict(global_fields or {})
        self.alive = bool(alive)
        #: per-agent fields in row order (the five transition fields, then the extras)
        self.agent_fields = row_fields(self.specs)
        #: every field of a row in order: per-agent fields, global fields, then ``alive``
        self.field_names: tuple[str, ...] = (
            self.agent_fields + tuple(self.global_fields) + ((ALIVE,) if self.alive else ())
        )
        #: whether rows hold more than the five transition fields (extras, globals, alive)
        self.more = len(self.field_names) > len(FIELDS)
        #: what add/extend/add_envs take as keyword arguments beyond the five fields
        self.keywords = self.field_names[len(FIELDS) :]
        self.slots, self.row_bytes = interleaved_row_layout(
            self.specs, _config.ROW_ALIGN_BYTES, None, global_fields=self.global_fields, alive=alive
        )
        self.row_words = self.row_bytes // 8
        #: per slot, what :meth:`views` needs: (field, agent, offset, shape, dtype, strides of
        #: one item)
        self._view_plan = [
            (s.field, s.agent, s.offset, s.shape, s.dtype, _c_strides(s.shape, s.dtype))
            for s in self.slots
        ]
        # observations stored once: the obs section is [0, obs_bytes); the next_obs section
        # [next_obs_start, next_obs_start + obs_bytes) has the same internal layout. The lean
        # row keeps obs, action, reward at the same offsets and lays out the tail (done, extras,
        # global fields, alive) after them, with the tail's internal layout unchanged.
        obs_slots = [s for s in self.slots if s.field == "obs"]
        nobs_slots = [s for s in self.slots if s.field == "next_obs"]
        self.next_obs_start = nobs_slots[0].offset
        self.obs_bytes = obs_slots[-1].offset + obs_slots[-1].nbytes
        assert all(
            n.offset - self.next_obs_start == o.offset for o, n in zip(obs_slots, nobs_slots)
        )
        self.lean_slots, self.lean_row_bytes = interleaved_row_layout(
            self.specs,
            _config.ROW_ALIGN_BYTES,
            row_fields(self.specs, lean=True),
            global_fields=self.global_fields,
            alive=alive,
        )
        reward_slots = [s for s in self.slots if s.field == "reward"]
        #: obs, action and reward: the same bytes [0, head_bytes) in both formats
        self.head_bytes = reward_slots[-1].offset + reward_slots[-1].nbytes
        # the tail starts at the (word-aligned) done section in both formats
        tail_dense = self.slots[[s.field for s in self.slots].index("done") :]
        tail_lean = self.lean_slots[[s.field for s in self.lean_slots].index("done") :]
        dense_start, lean_start = tail_dense[0].offset, tail_lean[0].offset
        #: (lean offset, dense offset, bytes) of the tail (done onwards), which moves between
        #: the formats
        self.done_span: tuple[int, int, int] = (
            lean_start,
            dense_start,
            tail_dense[-1].offset + tail_dense[-1].nbytes - dense_start,
        )
        assert all(
            dl.offset - lean_start == dd.offset - dense_start
            for dl, dd in zip(tail_lean, tail_dense)
        )

    def views(self, rows: np.ndarray) -> RowViews:
        """Per field, per agent, strided views of ``rows`` (shape (n, row_words), uint64).

        Global fields are keyed by the agent :data:`marlbuf.spec.GLOBAL`."""
        n = rows.shape[0]
        out: RowViews = {f: {} for f in self.field_names}
        if not rows.flags.c_contiguous:
            raw = rows.view(np.uint8)
            for s in self.slots:
                part = raw[:, s.offset : s.offset + s.nbytes].view(s.dtype)
                out[s.field][s.agent] = part.reshape((n, *s.shape))
            return out
        row_bytes = rows.shape[1] * rows.itemsize
        # one ndarray construction per view (a slice, .view and .reshape cost three): the
        # view's base is ``rows``, so it keeps ``rows`` (and what owns its memory) alive
        for field_name, agent, offset, shape, dtype, inner in self._view_plan:
            out[field_name][agent] = np.ndarray(
                (n, *shape), dtype, rows, offset, (row_bytes, *inner)
            )
        return out


def _c_strides(shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array of ``shape`` and ``dtype``."""
    strides = []
    step = dtype.itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))
