"""NumPy reference of QuestMetadata: per-block channel max/min of the keys, rounded outward."""

from __future__ import annotations

import numpy as np

from . import int8_bounds
from ._common import fmax, fmin, resolve_total_lens, valid_positions
from .int8_rows import dequantize_rows, quantize_rows


def quest_metadata(key, block_max, block_min, past_lens, total_lens=None, block_exponent=None, *, block_size,
                   key_cache_type="float"):
    """Return (block_max_out, block_min_out) after adding this call's valid new keys, and
    block_exponent_out after them with int8 bounds.

    Keys are rounded outward to the bounds' dtype (toward +inf into the max, toward -inf into the
    min), so the bounds hold every key at any cache precision as fine as theirs; with
    key_cache_type 'int8' each key is first quantized and dequantized as an int8 cache stores it.
    Block p // P is overwritten by the key of token p when p % P == 0 and merged otherwise. int8
    bounds merge as float16 bounds over their dequantized codes, then every touched block is
    quantized again (ops/reference/int8_bounds.py).
    """
    B, N, S, D = key.shape
    M = block_max.shape[2]
    total = resolve_total_lens(past_lens, total_lens, S, M * block_size, "M * block_size")
    int8 = block_max.dtype == np.int8
    if int8 != (block_exponent is not None):
        raise ValueError("block_exponent is required with int8 bounds and refused with float ones")
    if int8:
        out_max = int8_bounds.dequantize(block_max, block_exponent)
        out_min = int8_bounds.dequantize(block_min, block_exponent)
        non_finite = np.asarray(block_exponent) == int8_bounds.NON_FINITE
        touched = np.zeros((B, M), bool)
    else:
        out_max, out_min = block_max.copy(), block_min.copy()
    if key_cache_type == "int8":
        key = dequantize_rows(*quantize_rows(key))
    elif key_cache_type != "float":
        raise ValueError(f"key_cache_type must be 'float' or 'int8', got {key_cache_type!r}")
    above, below = rounded_outward(key, np.float16 if int8 else block_max.dtype)
    for b in range(B):
        for i, p in valid_positions(int(past_lens[b]), int(total[b])):
            m = p // block_size
            fresh = ~(np.isfinite(above[b, :, i]).all(-1) & np.isfinite(below[b, :, i]).all(-1))
            if p % block_size == 0:
                out_max[b, :, m], out_min[b, :, m] = above[b, :, i], below[b, :, i]
                if int8:
                    non_finite[b, :, m] = fresh
            else:
                out_max[b, :, m] = fmax(out_max[b, :, m], above[b, :, i])
                out_min[b, :, m] = fmin(out_min[b, :, m], below[b, :, i])
                if int8:
                    non_finite[b, :, m] |= fresh
            if int8:
                touched[b, m] = True
    if not int8:
        return out_max, out_min
    codes_max, codes_min, exponent = int8_bounds.quantize(out_max, out_min, non_finite)
    keep = ~touched[:, None, :]  # untouched blocks keep their input bits
    codes_max = np.where(keep[..., None], block_max, codes_max)
    codes_min = np.where(keep[..., None], block_min, codes_min)
    return codes_max, codes_min, np.where(keep, block_exponent, exponent).astype(np.int8)


def rounded_outward(x, dtype) -> tuple[np.ndarray, np.ndarray]:
    """`x` rounded to `dtype` toward +inf and toward -inf (exact when `dtype` holds it)."""
    wide = np.asarray(x).astype(np.float32)
    if np.dtype(dtype) == np.float32:
        return wide, wide
    with np.errstate(over="ignore"):  # beyond the dtype's range the nearest value is an infinity
        nearest = wide.astype(dtype)
        back = nearest.astype(np.float32)
        up = np.where(back < wide, np.nextafter(nearest, np.array(np.inf, dtype)), nearest)
        down = np.where(back > wide, np.nextafter(nearest, np.array(-np.inf, dtype)), nearest)
    return up.astype(dtype), down.astype(dtype)
