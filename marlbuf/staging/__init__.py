"""Validation and staging of incoming transitions (the writer's front half).

Every ``add``/``extend`` is first written into *staging rows* in the interleaved row format
(:func:`marlbuf.spec.interleaved_row_layout`), checked there, and only then committed to the
storage — whatever its layout. So validation is one mechanism for both layouts, a rejected call
leaves the storage untouched, and the costly checks run over whole rows at once: shapes and
dtypes per agent (cheap tuple and dict look-ups), NaN/inf by one Numba scan of the staged
floats instead of one ``np.isfinite`` per agent and field.

Three paths are tried in order, each handing what it cannot prove valid to the next:

* :mod:`marlbuf.staging.codec` (:class:`RowCodec`): ``add``'s common case, checked whole by a
  one-step kernel (:mod:`marlbuf._kernels.staging`) that reads the caller's items directly
  (:meth:`RowCodec.step_items`, :class:`StepPlan`) and writes only after every check passed:
  into the staging row (:meth:`RowCodec.stage_step`) or, for the buffer, straight into the
  storage;
* :mod:`marlbuf.staging.fast` (``FastStaging``): one vectorised copy per field
  (:meth:`RowCodec.stage_fast`);
* :mod:`marlbuf.staging.checked` (``CheckedStaging``): the complete checks, whose messages
  explain any rejection (:meth:`RowCodec.stage`), and :func:`steps_of`.
"""

from marlbuf.staging.checked import MISSING, steps_of
from marlbuf.staging.codec import RowCodec, StepItems, StepPlan

__all__ = ["MISSING", "RowCodec", "StepItems", "StepPlan", "steps_of"]
