"""Small graph-building helpers shared by the function bodies (standard ONNX ops only).

Every helper takes the onnxscript builder `op` first, so the same code traces into an inlined
subgraph (a TapeBuilder) or an `ir.Function` (onnxscript.build_function).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...ops.reference._common import LANES
from ...ops.reference.int8_bounds import LOWEST, NON_FINITE

F32 = ir.DataType.FLOAT
F16 = ir.DataType.FLOAT16
F64 = ir.DataType.DOUBLE
I64 = ir.DataType.INT64
I8 = ir.DataType.INT8
# The scale of an int8 cache row that cannot be stored: the positive quiet float16 NaN.
NAN_SCALE = np.array(0x7E00, np.uint16).view(np.float16)
# int8 block bounds: 2^e of every int8 exponent e at index e + 128 (exact float32, subnormal below
# -126; NaN for the non-finite block's 127), looked up rather than computed with Pow, whose
# results ONNX does not promise exact.
EXPONENT_BIAS = 128
EXPONENT_SCALES = np.append(np.ldexp(np.float32(1), np.arange(-EXPONENT_BIAS, NON_FINITE)), np.nan).astype(np.float32)
# The least e >= LOWEST with amax <= 127 * 2^e is LOWEST plus the number of thresholds 127 * 2^j,
# j >= LOWEST, that amax exceeds (exact float32 products; past j = 121 they overflow, and no finite
# amax exceeds 127 * 2^121 * 2).
EXPONENT_THRESHOLDS = np.float32(127) * np.ldexp(np.float32(1), np.arange(LOWEST, 122)).astype(np.float32)


def const(op, value, dtype) -> ir.Value:
    return op.Constant(value=ir.tensor(np.asarray(value, dtype=dtype)))


def ints(op, *values: int) -> ir.Value:
    """A 1-D int64 constant, the form Slice, Reshape, Unsqueeze and Pad take."""
    return const(op, list(values), np.int64)


def dim(op, x, axis: int) -> ir.Value:
    """Dim `axis` of x as a 1-D int64 tensor of one element."""
    if axis == -1:
        return op.Shape(x, start=-1)
    return op.Shape(x, start=axis, end=axis + 1)


def scalar(op, one_element) -> ir.Value:
    return op.Squeeze(one_element, ints(op, 0))


def take(op, x, axis: int, start, end) -> ir.Value:
    """x[..., start:end, ...] along `axis`; start/end are ints or 1-D int64 tensors."""
    start = ints(op, start) if isinstance(start, int) else start
    end = ints(op, end) if isinstance(end, int) else end
    return op.Slice(x, start, end, ints(op, axis))


def positions(op, past_lens, total_lens, new_tokens):
    """(pos [B, S] int64, valid [B, S] bool): token i of row b sits at past_lens[b] + i."""
    past = op.Unsqueeze(op.Cast(past_lens, to=I64), ints(op, 1))
    steps = op.Range(const(op, 0, np.int64), scalar(op, new_tokens), const(op, 1, np.int64))
    pos = op.Add(past, steps)
    total = op.Add(past, new_tokens) if total_lens is None else op.Unsqueeze(op.Cast(total_lens, to=I64), ints(op, 1))
    return pos, op.Less(pos, total)


def select_max(op, a, b) -> ir.Value:
    """`a > b ? a : b`, the kernels' max (also for NaN and signed zeros)."""
    return op.Where(op.Greater(a, b), a, b)


def lane_sum(op, terms, rank: int) -> ir.Value:
    """Sum float32 `terms` of the given rank over the last axis in the kernels' 16-lane order.

    ```
    terms [.., D] -Pad-> [.., R*16] -Reshape-> [.., R, 16] -CumSum(R)-> last row [.., 16]
          -> fold halves 8, 4, 2, 1 with Add -> [..]
    ```
    CumSum adds row r to the running sum of rows < r, the same sequence as each kernel lane.
    """
    D = dim(op, terms, -1)
    lanes = ints(op, LANES)
    padding = op.Sub(op.Mul(op.Div(op.Add(D, ints(op, LANES - 1)), lanes), lanes), D)
    padded = op.Pad(terms, op.Concat(ints(op, *[0] * (2 * rank - 1)), padding, axis=0))
    rows = op.Reshape(padded, op.Concat(op.Shape(terms, end=-1), ints(op, -1, LANES), axis=0))
    running = op.CumSum(rows, const(op, -2, np.int64))
    acc = op.Squeeze(take(op, running, -2, -1, np.iinfo(np.int64).max), ints(op, -2))
    width = LANES // 2
    while width >= 1:
        acc = op.Add(take(op, acc, -1, 0, width), take(op, acc, -1, width, 2 * width))
        width //= 2
    return op.Squeeze(acc, ints(op, -1))


def repeat_heads(op, x, repeats: int, rank: int) -> ir.Value:
    """[B, N, ...] of the given rank -> [B, N*repeats, ...], each head `repeats` times in a row.

    ```
    x -Unsqueeze(2)-> [B, N, 1, ...] -Expand-> [B, N, repeats, ...] -Reshape-> [B, N*repeats, ...]
    ```
    """
    expanded = op.Expand(op.Unsqueeze(x, ints(op, 2)), ints(op, 1, 1, repeats, *[1] * (rank - 2)))
    return op.Reshape(expanded, op.Concat(op.Shape(x, end=1), ints(op, -1), op.Shape(x, start=2), axis=0))


def write_tokens(op, cache, new_tokens, pos, valid) -> ir.Value:
    """cache [B,N,C,D] with new_tokens [B,N,S,D] (cast to the cache type) at rows pos [B,S].

    ```
    cache -Concat(dummy row C)-ScatterElements(axis=2, rows: pos, or C when invalid)-Slice(:C)
    ```
    Invalid tokens land in the dummy row, which is sliced away.
    """
    C = dim(op, cache, 2)
    write_row = op.Where(valid, pos, op.Reshape(C, ints(op, 1, 1)))  # [B, S]
    write_at = op.Expand(op.Unsqueeze(write_row, ints(op, 1, 3)), op.Shape(new_tokens))
    dummy = op.ConstantOfShape(op.Concat(op.Shape(cache, end=2), ints(op, 1), dim(op, cache, 3), axis=0),
                               value=ir.tensor(np.zeros(1, np.float32)))
    extended = op.Concat(cache, op.CastLike(dummy, cache), axis=2)
    written = op.ScatterElements(extended, write_at, op.CastLike(new_tokens, cache), axis=2)
    return op.Slice(written, ints(op, 0), C, ints(op, 2))


def quantize_rows(op, x):
    """(q int8 [..., D], scale float16 [..., 1]) of rows x [..., D], as an int8 cache stores them
    (docs/ops.md, int8 caches; ops/reference/int8_rows.py).

    ```
    x -Cast(f32)-Abs-ReduceMax(D)-Div(127)-Cast(f16)-> scale      (NaN when the row or scale is not finite)
    x -Mul(1 / scale, or 1 where unusable)-Round-Clip(-127, 127)-Where(usable, ., 0)-Cast(int8)-> q
    ```
    Cast rounds float32 to float16 to nearest even and Round halves to even, one IEEE operation
    each as the float32 Div and Mul, so the bits are the kernels'. (Non-finite as x - x != 0, as
    the attention body tests it.)
    """
    wide = op.Cast(x, to=F32)
    zero, one = const(op, 0.0, np.float32), const(op, 1.0, np.float32)
    finite = op.Equal(op.Sub(wide, wide), zero)
    row_finite = op.Greater(op.ReduceMin(op.Cast(finite, to=F32), ints(op, -1), keepdims=1), zero)  # [..., 1]
    amax = op.ReduceMax(op.Abs(wide), ints(op, -1), keepdims=1)  # (what a non-finite row gives is not used)
    scale = op.Cast(op.Div(amax, const(op, 127.0, np.float32)), to=F16)
    wide_scale = op.Cast(scale, to=F32)
    stored = op.And(row_finite, op.Equal(op.Sub(wide_scale, wide_scale), zero))  # past 127 * 65504 it is inf
    usable = op.And(stored, op.Not(op.Equal(wide_scale, zero)))
    # One division per row, as the contract. Reciprocal, not Div(1, .): ONNX Runtime's DivMulFusion
    # rewrites Div(1, s) feeding a Mul into Div(x, s), whose rounding differs (56.4999 for 56.500004).
    reciprocal = op.Reciprocal(op.Where(usable, wide_scale, one))
    rounded = op.Round(op.Mul(wide, reciprocal))
    q = op.Where(usable, op.Clip(rounded, const(op, -127.0, np.float32), const(op, 127.0, np.float32)), zero)
    return op.Cast(q, to=I8), op.Where(stored, scale, const(op, NAN_SCALE, np.float16))


def dequantize_rows(op, q, scale) -> ir.Value:
    """q [..., D] * scale [..., 1] in float32: exact (7 bits times 11); a NaN scale, a NaN row."""
    return op.Mul(op.Cast(q, to=F32), op.Cast(scale, to=F32))


def finite(op, x) -> ir.Value:
    """x - x == 0: false for NaN and infinities (not IsNaN/IsInf, which CANN's graph mode does not take)."""
    return op.Equal(op.Sub(x, x), const(op, 0.0, np.float32))


def exponent_scale(op, exponent, negate: bool = False) -> ir.Value:
    """2^e (or, with `negate`, 2^-e for LOWEST <= e < 127) float32 of int8 exponents, by table lookup."""
    index = op.Cast(exponent, to=I64)
    if negate:
        index = op.Neg(index)
    return op.Gather(const(op, EXPONENT_SCALES, np.float32), op.Add(index, const(op, EXPONENT_BIAS, np.int64)))


def quantized_query_rows(op, q):
    """Scoring rows q [..., D] float32 as int8 bounds score them (docs/ops.md, int8 block bounds):
    (the magnitudes u = min(127, rint(|q| * (127 / a))) signed like q, 0 where q is 0 or the row's
    a = max |q| is 0 or not finite; the row's factor a / 127 [..., 1], NaN for a NaN or infinite a).

    ```
    q -Abs-ReduceMax-> a (NaN if any q is: Not(Equal(q, q)))
    127 / a -Mul(|q|)-Round-Min(127)-> u -Where(q > 0, u, q < 0 ? -u : 0)-> signed
    a / 127 (NaN unless a is finite) -> factor
    ```
    """
    nan = const(op, np.nan, np.float32)
    levels = const(op, 127.0, np.float32)
    has_nan = op.ReduceMax(op.Cast(op.Not(op.Equal(q, q)), to=F32), ints(op, -1), keepdims=1)
    a = op.Where(op.Greater(has_nan, const(op, 0.0, np.float32)), nan,
                 op.ReduceMax(op.Abs(q), ints(op, -1), keepdims=1))
    usable = op.And(finite(op, a), op.Greater(a, const(op, 0.0, np.float32)))
    ratio = op.Div(levels, op.Where(usable, a, const(op, 1.0, np.float32)))
    u = op.Where(usable, op.Min(levels, op.Round(op.Mul(op.Abs(q), ratio))), const(op, 0.0, np.float32))
    zero = const(op, 0.0, np.float32)
    signed = op.Where(op.Greater(q, zero), u, op.Where(op.Less(q, zero), op.Neg(u), zero))
    factor = op.Where(finite(op, a), op.Div(a, levels), nan)
    return signed, factor


def dequantize_bounds(op, codes, exponent) -> ir.Value:
    """int8 bounds [..., M, D] with their exponents [..., M] as float32 `code * 2^e` (one exact product,
    short of overflow; NaN in a non-finite block): docs/ops.md, int8 block bounds."""
    return op.Mul(op.Cast(codes, to=F32), op.Unsqueeze(exponent_scale(op, exponent), ints(op, -1)))


def quantize_bounds(op, hi, lo, non_finite):
    """(max codes, min codes [..., M, D], exponents [..., M]) as float32 integers of float32 bounds
    hi/lo (ops/reference/int8_bounds.py quantize). `non_finite` [..., M] marks blocks that held a
    NaN or infinite bound; so does a non-finite hi or lo. Such blocks get codes 0 and exponent 127.

    ```
    max(|hi|, |lo|) -ReduceMax(D)-> amax -Greater(127 * 2^j)-count-> e -Gather-> 2^-e
    hi * 2^-e -Ceil-> max codes      lo * 2^-e -Floor-> min codes      (both exact products)
    ```
    The caller casts them to int8 (Cast of an integral float32 in [-127, 127] is exact).
    """
    zero = const(op, 0.0, np.float32)
    every = op.Cast(op.And(finite(op, hi), finite(op, lo)), to=F32)
    bad = op.Or(non_finite, op.Not(op.Greater(op.ReduceMin(every, ints(op, -1), keepdims=0), zero)))
    amax = op.ReduceMax(op.Max(op.Abs(hi), op.Abs(lo)), ints(op, -1), keepdims=0)
    amax = op.Where(bad, zero, amax)  # a non-finite block's amax is not used: any finite number will do
    exceeded = op.Greater(op.Unsqueeze(amax, ints(op, -1)), const(op, EXPONENT_THRESHOLDS, np.float32))
    e = op.Add(op.ReduceSum(op.Cast(exceeded, to=I64), ints(op, -1), keepdims=0), const(op, LOWEST, np.int64))
    inverse = op.Unsqueeze(exponent_scale(op, e, negate=True), ints(op, -1))
    wide_bad = op.Unsqueeze(bad, ints(op, -1))
    top = op.Where(wide_bad, zero, op.Ceil(op.Mul(hi, inverse)))
    bottom = op.Where(wide_bad, zero, op.Floor(op.Mul(lo, inverse)))
    return top, bottom, op.Where(bad, const(op, NON_FINITE, np.int64), e)


def int8_bounds(op_name: str, block_max, block_exponent) -> bool:
    """Whether a node's bounds are int8, which `block_exponent` marks (required with int8 bounds and
    refused with float ones). An expanded node knows the bounds' type and refuses a mismatch naming
    the input; a model-local function cannot see it (the kernels check it)."""
    dtype = getattr(block_max, "dtype", None)
    if dtype is not None and (dtype == I8) != (block_exponent is not None):
        raise ValueError(f"{op_name}: input 'block_exponent' is required with int8 bounds and refused with float "
                         f"ones; 'block_max' is {dtype}")
    return block_exponent is not None
