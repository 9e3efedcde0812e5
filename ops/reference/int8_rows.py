"""The int8 KV cache's row format in NumPy: D int8 values and one float16 scale per row.

Every step is one IEEE float32 operation (a division, a reciprocal, a product, a rounding to float16,
a rounding to the nearest even integer), so these are the kernels' bits exactly (`ops/csrc/kernels/int8_rows.h`).
"""

from __future__ import annotations

import numpy as np

NAN_SCALE = np.array(0x7E00, dtype=np.uint16).view(np.float16)  # the positive quiet float16 NaN


def quantize_rows(x) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [..., D], scale float16 [...]) of rows x [..., D]: scale = float16(amax / 127),
    q = clamp(rint(x * (1 / scale)), -127, 127) (float32 reciprocal and product); q all 0 when the scale is 0, and also when it is not
    finite (a NaN or infinite element, or amax past 127 * 65504), with the scale then NaN."""
    x32 = np.asarray(x).astype(np.float32)
    finite = np.isfinite(x32).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(x32), x32, 0)).max(axis=-1, initial=0), 0).astype(np.float32)
    with np.errstate(over="ignore"):
        scale = (amax / np.float32(127)).astype(np.float16)
    usable = finite & np.isfinite(scale) & (scale != 0)
    scale = np.where(finite & np.isfinite(scale), scale, NAN_SCALE).astype(np.float16)
    reciprocal = np.float32(1) / np.where(usable, scale.astype(np.float32), np.float32(1))[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.clip(np.rint(np.where(usable[..., None], x32, 0) * reciprocal), -127, 127)
    return q.astype(np.int8), scale


def dequantize_rows(q, scale) -> np.ndarray:
    """q * scale as float32 (exact: 7 bits times 11); a NaN scale gives a NaN row."""
    return np.asarray(q).astype(np.float32) * np.asarray(scale).astype(np.float32)[..., None]
