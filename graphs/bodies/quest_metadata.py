"""Standard-op function body of QuestMetadata.

```
key --Cast(f32)--outward(TC): up / down--Where(valid, x, -inf/+inf)--.
block_max --Cast(f32)--Where(block starts in this call, -inf, .)--ScatterElements(axis=2, max)--Cast(TC)
block_min --Cast(f32)--Where(block starts in this call, +inf, .)--ScatterElements(axis=2, min)--Cast(TC)
```
With key_cache_type 'int8' the keys are first quantized and dequantized (exactly) as the int8
cache stores them (_building.quantize_rows), so the bounds hold what the attention reads. A block
whose first token arrives in this call restarts from -inf/+inf, so scattering its keys with
max/min sets it; invalid tokens carry the neutral value and change nothing. Two differences
from the kernels, neither of which can change a selection: a -0 key is stored as +0, and NaN keys
may merge differently (the kernels' max is `a > b ? a : b`).

int8 bounds (block_exponent given) merge as float16 bounds over their dequantized codes, then every
touched block is quantized again (_building.quantize_bounds); the differences above vanish there
(a NaN key makes its block non-finite, a -0 code is 0):
```
block_max, block_exponent -code * 2^e (table)--> held bounds -(merge as above, keys outward to float16)
e = 127, or any key of the call non-finite -ScatterElements(max)-> non-finite blocks (sticky until restart)
merged bounds -quantize_bounds-> codes, exponents -Where(touched, ., input)-> outputs
```
"""

from __future__ import annotations

import numpy as np

from ._building import (F32, I8, I64, const, dequantize_bounds, dequantize_rows, dim, finite, int8_bounds, ints,
                        positions, quantize_bounds, quantize_rows)


def _rounded_up(op, x, like):
    """x (float32) rounded toward +inf to the dtype of `like`, as float32: the nearest value, or the
    next one above it where the nearest lies below x. For float16 that next value is found with
    nearest casts alone: below 2^-14 (subnormal spacing) it is b + 2^-24; above, b * (1 + 2^-11 +
    2^-13) (or b * (1 - 2^-11 - 2^-13) for b < 0) lands strictly nearer the next value than any
    other, so casting it rounds there; above -inf it is -65504. For float32 `like` nothing is
    rounded and the Where keeps x."""
    nearest = op.Cast(op.CastLike(x, like), to=F32)
    upward = op.Where(op.GreaterOrEqual(nearest, const(op, 0.0, np.float32)),
                      const(op, 1.0 + 2.0**-11 + 2.0**-13, np.float32), const(op, 1.0 - 2.0**-11 - 2.0**-13, np.float32))
    stepped = op.Where(op.Less(op.Abs(nearest), const(op, 2.0**-14, np.float32)),
                       op.Add(nearest, const(op, 2.0**-24, np.float32)),
                       op.Cast(op.CastLike(op.Mul(nearest, upward), like), to=F32))
    # Below -65504 the nearest value is -inf; the next one up is the lowest finite float16.
    stepped = op.Where(op.Equal(nearest, const(op, -np.inf, np.float32)), const(op, -65504.0, np.float32), stepped)
    return op.Where(op.Less(nearest, x), stepped, nearest)


def quest_metadata_body(op, key, block_max, block_min, past_lens, total_lens=None, block_exponent=None, *,
                        block_size: int, key_cache_type: str = "float"):
    int8 = int8_bounds("QuestMetadata", block_max, block_exponent)
    pos, valid = positions(op, past_lens, total_lens, dim(op, key, 2))
    M = dim(op, block_max, 2)
    # Keys are rounded outward to the metadata dtype, as the kernels and the reference do.
    if key_cache_type == "int8":
        wide = dequantize_rows(op, *quantize_rows(op, key))
    elif key_cache_type == "float":
        wide = op.Cast(key, to=F32)
    else:
        raise ValueError(f"QuestMetadata: key_cache_type must be 'float' or 'int8', got {key_cache_type!r}")
    # int8 bounds are defined from the float16 bounds of the same keys: keys round outward to float16.
    rounding = const(op, 0.0, np.float16) if int8 else block_max
    above, below = _rounded_up(op, wide, rounding), op.Neg(_rounded_up(op, op.Neg(wide), rounding))
    valid_bnsd = op.Unsqueeze(valid, ints(op, 1, 3))
    inf = const(op, np.inf, np.float32)
    keys_for_max = op.Where(valid_bnsd, above, op.Neg(inf))
    keys_for_min = op.Where(valid_bnsd, below, inf)
    # Target block of every token (invalid ones point at block 0 with a neutral value).
    block = op.Where(valid, op.Div(pos, const(op, block_size, np.int64)), const(op, 0, np.int64))
    target = op.Expand(op.Unsqueeze(block, ints(op, 1, 3)), op.Shape(key))
    # Blocks whose first position is a valid new token restart.
    starts = op.Mul(op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)), const(op, 1, np.int64)),
                    const(op, block_size, np.int64))
    past = op.Unsqueeze(op.Cast(past_lens, to=I64), ints(op, 1))
    total = op.Add(past, dim(op, key, 2)) if total_lens is None else op.Unsqueeze(op.Cast(total_lens, to=I64), ints(op, 1))
    restart_bm = op.And(op.GreaterOrEqual(starts, past), op.Less(starts, total))  # [B, M]
    restart = op.Unsqueeze(restart_bm, ints(op, 1, 3))
    if int8:
        held_max = dequantize_bounds(op, block_max, block_exponent)
        held_min = dequantize_bounds(op, block_min, block_exponent)
    else:
        held_max, held_min = op.Cast(block_max, to=F32), op.Cast(block_min, to=F32)
    base_max = op.Where(restart, op.Neg(inf), held_max)
    base_min = op.Where(restart, inf, held_min)
    new_max = op.ScatterElements(base_max, target, keys_for_max, axis=2, reduction="max")
    new_min = op.ScatterElements(base_min, target, keys_for_min, axis=2, reduction="min")
    if not int8:
        return op.CastLike(new_max, block_max), op.CastLike(new_min, block_min)

    # A block is non-finite once it held e = 127 (until it restarts) or took a key whose float16
    # bounds are not finite: the merge's max and min may drop a NaN, so it is tracked beside them.
    zero, one = const(op, 0.0, np.float32), const(op, 1.0, np.float32)
    key_finite = op.ReduceMin(op.Cast(op.And(finite(op, above), finite(op, below)), to=F32), ints(op, -1), keepdims=0)
    fresh = op.Where(op.Unsqueeze(valid, ints(op, 1)), op.Sub(one, key_finite), zero)  # [B, N, S]
    held = op.Cast(op.Equal(op.Cast(block_exponent, to=I64), const(op, 127, np.int64)), to=F32)
    held = op.Where(op.Unsqueeze(restart_bm, ints(op, 1)), zero, held)  # [B, N, M]
    target_bns = op.Expand(op.Unsqueeze(block, ints(op, 1)), op.Shape(key, end=3))
    non_finite = op.Greater(op.ScatterElements(held, target_bns, fresh, axis=2, reduction="max"), zero)
    codes_max, codes_min, exponent = quantize_bounds(op, new_max, new_min, non_finite)
    # Blocks no valid key reaches keep their input bits: block m holds a position of [past, total).
    ends = op.Add(starts, const(op, block_size, np.int64))
    touched = op.And(op.And(op.Less(starts, total), op.Greater(ends, past)), op.Less(past, total))  # [B, M]
    touched = op.Unsqueeze(touched, ints(op, 1))  # [B, 1, M]
    wide_touched = op.Unsqueeze(touched, ints(op, 3))
    out_max = op.Where(wide_touched, codes_max, op.Cast(block_max, to=F32))
    out_min = op.Where(wide_touched, codes_min, op.Cast(block_min, to=F32))
    out_exponent = op.Where(touched, exponent, op.Cast(block_exponent, to=I64))
    return op.Cast(out_max, to=I8), op.Cast(out_min, to=I8), op.Cast(out_exponent, to=I8)
