"""Rotary position embedding in standard ops (opset 18), for graphs whose attention op applied it
internally (GroupQueryAttention with do_rotary=1)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def _ints(op, *values):
    return op.Constant(value=ir.tensor(np.asarray(values, dtype=np.int64)))


def apply_rotary(op, x, cos_cache, sin_cache, positions, head_dim: int, interleaved: bool):
    """x [B, heads, S, D] rotated at `positions` [B, S] with caches [max_position, D/2].

    ```
    cos_cache -Gather(positions)-Unsqueeze(1)--> cos [B,1,S,D/2]   (sin likewise)
    rotate-half:  x1, x2 = x[..., :D/2], x[..., D/2:]
                  Concat(x1*cos - x2*sin, x2*cos + x1*sin)
    interleaved:  x1, x2 = x[..., 0::2], x[..., 1::2]  (Reshape [.., D/2, 2])
                  interleave(x1*cos - x2*sin, x2*cos + x1*sin)
    ```
    """
    half = head_dim // 2
    cos = op.Unsqueeze(op.Gather(cos_cache, positions, axis=0), _ints(op, 1))
    sin = op.Unsqueeze(op.Gather(sin_cache, positions, axis=0), _ints(op, 1))
    cos, sin = op.CastLike(cos, x), op.CastLike(sin, x)
    if not interleaved:
        x1 = op.Slice(x, _ints(op, 0), _ints(op, half), _ints(op, -1))
        x2 = op.Slice(x, _ints(op, half), _ints(op, head_dim), _ints(op, -1))
        return op.Concat(op.Sub(op.Mul(x1, cos), op.Mul(x2, sin)), op.Add(op.Mul(x2, cos), op.Mul(x1, sin)), axis=-1)
    pairs = op.Reshape(x, _ints(op, 0, 0, 0, half, 2))
    x1 = op.Squeeze(op.Slice(pairs, _ints(op, 0), _ints(op, 1), _ints(op, -1)), _ints(op, -1))
    x2 = op.Squeeze(op.Slice(pairs, _ints(op, 1), _ints(op, 2), _ints(op, -1)), _ints(op, -1))
    first = op.Unsqueeze(op.Sub(op.Mul(x1, cos), op.Mul(x2, sin)), _ints(op, -1))
    second = op.Unsqueeze(op.Add(op.Mul(x2, cos), op.Mul(x1, sin)), _ints(op, -1))
    return op.Reshape(op.Concat(first, second, axis=-1), _ints(op, 0, 0, 0, head_dim))
