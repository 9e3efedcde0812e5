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
"""

from __future__ import annotations

import numpy as np

from ._building import F32, I64, const, dequantize_rows, dim, ints, positions, quantize_rows


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


def quest_metadata_body(op, key, block_max, block_min, past_lens, total_lens=None, *, block_size: int,
                        key_cache_type: str = "float"):
    pos, valid = positions(op, past_lens, total_lens, dim(op, key, 2))
    M = dim(op, block_max, 2)
    # Keys are rounded outward to the metadata dtype, as the kernels and the reference do.
    if key_cache_type == "int8":
        wide = dequantize_rows(op, *quantize_rows(op, key))
    elif key_cache_type == "float":
        wide = op.Cast(key, to=F32)
    else:
        raise ValueError(f"QuestMetadata: key_cache_type must be 'float' or 'int8', got {key_cache_type!r}")
    valid_bnsd = op.Unsqueeze(valid, ints(op, 1, 3))
    inf = const(op, np.inf, np.float32)
    keys_for_max = op.Where(valid_bnsd, _rounded_up(op, wide, block_max), op.Neg(inf))
    keys_for_min = op.Where(valid_bnsd, op.Neg(_rounded_up(op, op.Neg(wide), block_min)), inf)
    # Target block of every token (invalid ones point at block 0 with a neutral value).
    block = op.Where(valid, op.Div(pos, const(op, block_size, np.int64)), const(op, 0, np.int64))
    target = op.Expand(op.Unsqueeze(block, ints(op, 1, 3)), op.Shape(key))
    # Blocks whose first position is a valid new token restart.
    starts = op.Mul(op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)), const(op, 1, np.int64)),
                    const(op, block_size, np.int64))
    past = op.Unsqueeze(op.Cast(past_lens, to=I64), ints(op, 1))
    total = op.Add(past, dim(op, key, 2)) if total_lens is None else op.Unsqueeze(op.Cast(total_lens, to=I64), ints(op, 1))
    restart = op.Unsqueeze(op.And(op.GreaterOrEqual(starts, past), op.Less(starts, total)), ints(op, 1, 3))
    base_max = op.Where(restart, op.Neg(inf), op.Cast(block_max, to=F32))
    base_min = op.Where(restart, inf, op.Cast(block_min, to=F32))
    new_max = op.ScatterElements(base_max, target, keys_for_max, axis=2, reduction="max")
    new_min = op.ScatterElements(base_min, target, keys_for_min, axis=2, reduction="min")
    return op.CastLike(new_max, block_max), op.CastLike(new_min, block_min)
