"""Private Numba kernels.

Every kernel is ``@njit(cache=True, nogil=True)``, takes arrays and scalars only, and trusts its
inputs: the public Python method that calls it validates shapes, dtypes and ranges first.
Each kernel has a slow, obviously-correct NumPy twin in ``tests/naive.py``.
"""

from marlbuf._kernels.rows import first_nonfinite, gather_rows, neighbor_indices, scatter_rows

__all__ = ["first_nonfinite", "gather_rows", "neighbor_indices", "scatter_rows"]
