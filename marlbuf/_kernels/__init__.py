"""Private Numba kernels.

Every kernel is ``@njit(cache=True, nogil=True)``, takes arrays and scalars only, and trusts its
inputs: the public Python method that calls it validates shapes, dtypes and ranges first.
Each kernel has a slow, obviously-correct NumPy twin in ``tests/naive.py``.
"""

from marlbuf._kernels.episodes import sequence_slots
from marlbuf._kernels.links import commit_lean_step as commit_lean_step
from marlbuf._kernels.links import link_rows as link_rows
from marlbuf._kernels.links import link_step as link_step
from marlbuf._kernels.links import next_is_obs as next_is_obs
from marlbuf._kernels.links import release_slots as release_slots
from marlbuf._kernels.once import (
    gather_lean_rows,
    gather_next_field,
    scatter_lean,
)
from marlbuf._kernels.ordered import (
    merge_distinct,
    selection_sample,
    sorted_slots,
    sorted_uniforms,
)
from marlbuf._kernels.plan import (
    HALF_TO_FLOAT_BITS,
    first_nonfinite_half,
    gather_plan,
    gather_segments,
    gather_spans,
)
from marlbuf._kernels.rows import (
    first_nonfinite,
    gather_rows,
    gather_rows_parallel,
    gather_words,
    neighbor_indices,
    scatter_rows,
)
from marlbuf._kernels.staging import commit_dense_step as commit_dense_step
from marlbuf._kernels.staging import stage_leading_step as stage_leading_step
from marlbuf._kernels.staging import stage_step as stage_step
from marlbuf._kernels.staging import store_dense_leading_step as store_dense_leading_step
from marlbuf._kernels.staging import store_dense_step as store_dense_step
from marlbuf._kernels.staging import store_lean_leading_step as store_lean_leading_step
from marlbuf._kernels.staging import store_lean_step as store_lean_step
from marlbuf._kernels.sumtree import (
    apply_td_errors,
    fill_new_slots,
    find_prefix,
    locality_sample,
    per_sample,
    rebuild,
    set_leaves,
)

__all__ = [
    "HALF_TO_FLOAT_BITS",
    "apply_td_errors",
    "fill_new_slots",
    "find_prefix",
    "first_nonfinite",
    "first_nonfinite_half",
    "gather_lean_rows",
    "gather_next_field",
    "gather_plan",
    "gather_rows",
    "gather_rows_parallel",
    "gather_segments",
    "gather_spans",
    "gather_words",
    "locality_sample",
    "merge_distinct",
    "neighbor_indices",
    "per_sample",
    "rebuild",
    "scatter_lean",
    "scatter_rows",
    "selection_sample",
    "sequence_slots",
    "set_leaves",
    "sorted_slots",
    "sorted_uniforms",
]
