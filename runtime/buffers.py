"""Cache buffers for in-place decoding: allocated once, zeroed, backed by huge pages where possible.

A decode step reads blocks scattered over the whole cache; with 4 KB pages every block costs
several TLB misses. On Linux the buffers are aligned to 2 MB and advised MADV_HUGEPAGE
(transparent huge pages in "madvise" mode, the common default); elsewhere they are plain arrays.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


def cache_buffer(shape, dtype) -> np.ndarray:
    """A zeroed C-contiguous array of `shape`, 2 MB aligned and advised to use huge pages."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + HUGE_PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    array = raw[start : start + size].view(dtype).reshape(shape)
    madvise = _madvise()
    if madvise is not None and size >= HUGE_PAGE:
        madvise(array.ctypes.data, size - size % HUGE_PAGE, _MADV_HUGEPAGE)  # advisory: failure is harmless
    array.fill(0)  # touch every page now, so decode steps never fault
    return array
