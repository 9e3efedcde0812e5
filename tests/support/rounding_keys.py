"""float32 keys that exercise rounding into float16, and rows at the edges of the int8 cache format.

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


def int8_rows(width: int = 8) -> np.ndarray:
    """float32 rows [R, width] at the int8 cache format's edges (docs/ops.md, int8 caches): a zero
    row; rows whose scale amax / 127 rounds to 0, to a float16 subnormal, or exactly halfway
    between two float16 values (to even: 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9); values whose
    x * (1 / scale) lies halfway between integers (to even), or just past halfway where x / scale is not; amax at 127 * 65519 (the scale 65504) and
    127 * 65520 (inf: the NaN scale); a NaN, an infinity, float32 subnormals; then the rounding
    keys above as rows."""
    tie_low, tie_high = 127 * (1 + 2.0**-11), 127 * (1 + 3 * 2.0**-11)
    edges = [
        [0.0] * 8,
        [1e-7, -1e-7, 0, 0, 5e-8, 0, 0, 0],
        [127 * 2.0**-20, 3 * 2.0**-20, -5 * 2.0**-20, 0, 0, 0, 0, 1e-9],
        [tie_low, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -127],
        [-tie_high, 2.5, -3.5, 0.5, 126.5, -126.5, 1, 0],
        [127 * 65519.0, 1, -1, 0, 65504, -1e6, 3, 0],
        [127 * 65520.0, 1, -1, 0, 0, 0, 0, 0],
        [1, np.nan, 2, 3, 0, 0, 0, 0],
        [1, 2, np.inf, 3, 0, 0, 0, 0],
        [-np.inf, 2, 3, 0, 0, 0, 0, 0],
        [1e-40, -1e-40, 3e-45, 0, 0, 0, 0, 0],
        [-5, 1, 2, -3, 4, 0.25, -0.125, 5],
        # Scale 0.025390625: 1.4345703125 * float32(1 / scale) rounds up to 56.500004 (code 57),
        # where 1.4345703125 / scale is 56.4999 (56): the contract's reciprocal, not a division.
        [3.224609375, 1.4345703125, -1.4345703125, 0, 0, 0, 0, 0],
    ]
    rows = np.array(edges, dtype=np.float32)
    rows = np.pad(rows, [(0, 0), (0, max(width - 8, 0))])[:, :width]
    keys = rounding_keys()
    return np.concatenate([rows, keys[: keys.size // width * width].reshape(-1, width)])
