"""float32 keys that exercise rounding into float16: specials, subnormals, overflow, a wide spread.

Shared by ops/test_fp16.py and kernels/test_kernel_variants.py.
"""

from __future__ import annotations

import numpy as np

SPECIALS = np.array(
    [0.0, -0.0, 1e-8, -1e-8, 2.0**-24, 2.0**-25, -2.0**-25, 3 * 2.0**-26, 2.0**-14, -2.0**-14, 2.0**-14 - 2.0**-25,
     65504.0, 65519.0, 65520.0, -65519.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 1 + 2.0**-11, 1 + 3 * 2.0**-11,
     -(1 + 2.0**-11), 0.1, -0.1, 1 / 3, 2.0 - 2.0**-12, -(2.0 - 2.0**-12)],
    dtype=np.float32,
)


def rounding_keys() -> np.ndarray:
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        random = (rng.standard_normal(4000) * np.exp(rng.uniform(-20, 12, 4000))).astype(np.float32)
    return np.concatenate([SPECIALS, random])
