"""NumPy reference of int8 block bounds: codes on a per-block power-of-two grid (docs/ops.md)."""

from __future__ import annotations

import numpy as np

NON_FINITE = 127  # the exponent of a block that holds a NaN or infinite bound
LOWEST = -126  # the exponent of a block of zeros


def scale_of(exponent) -> np.ndarray:
    """2^e as float32 for int8 exponents (exact for every e < 127), NaN for e = NON_FINITE."""
    e = np.asarray(exponent).astype(np.int32)
    scales = np.ldexp(np.float32(1.0), np.minimum(e, 126)).astype(np.float32)
    return np.where(e == NON_FINITE, np.float32(np.nan), scales).astype(np.float32)


def dequantize(codes, exponent) -> np.ndarray:
    """Bounds `code * 2^e` [..., M, D] as float32 (NaN everywhere in a non-finite block)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(codes).astype(np.float32) * scale_of(exponent)[..., None]


def exponent_of(amax) -> np.ndarray:
    """The least integer e >= LOWEST with amax <= 127 * 2^e (amax finite and >= 0), as int32."""
    amax = np.asarray(amax, dtype=np.float32)
    mantissa, power = np.frexp(amax)  # amax = mantissa * 2^power, mantissa in [0.5, 1)
    e = np.where(mantissa <= np.float32(127 / 128), power - 7, power - 6)
    return np.maximum(np.where(amax == 0, LOWEST, e), LOWEST).astype(np.int32)


def quantize(hi, lo, non_finite) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(max codes, min codes, exponents) of float32 bounds hi/lo [..., M, D]; `non_finite` [..., M]
    marks blocks that held a NaN or infinite bound (codes 0, exponent NON_FINITE)."""
    hi, lo = np.asarray(hi, np.float32), np.asarray(lo, np.float32)
    bad = np.asarray(non_finite) | ~np.isfinite(hi).all(-1) | ~np.isfinite(lo).all(-1)
    with np.errstate(invalid="ignore"):
        amax = np.maximum(np.abs(hi), np.abs(lo)).max(-1)
    e = exponent_of(np.where(bad, 0, amax))
    inverse = np.ldexp(np.float32(1.0), -e).astype(np.float32)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):  # the products of non-finite blocks are discarded
        top = np.where(bad[..., None], 0, np.ceil(hi * inverse))
        bottom = np.where(bad[..., None], 0, np.floor(lo * inverse))
    return top.astype(np.int8), bottom.astype(np.int8), np.where(bad, NON_FINITE, e).astype(np.int8)


QUERY_LEVELS = 127  # a scoring row's magnitudes, quantized: 0 .. 127
MOST_CHANNELS = 1024  # the largest D of int8 bounds: every integer bound is below 2^24, exact in float32


def quantized_query(q) -> tuple[np.ndarray, np.ndarray]:
    """Rows q [..., D] (float32) as the int8 bounds' scores take them: magnitudes
    u = min(127, rint(|q| * (127 / a))) with a = max |q| of the row (u = 0 when a = 0), and the row's
    factor a / 127 (float32; NaN when a is NaN or infinite, which makes every score of the row NaN)."""
    q = np.asarray(q, np.float32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a = np.abs(q).max(-1)
        safe = np.isfinite(a) & (a > 0)
        ratio = np.where(safe, np.float32(QUERY_LEVELS) / np.where(safe, a, 1), 0).astype(np.float32)
        u = np.minimum(np.float32(QUERY_LEVELS), np.rint(np.abs(q) * ratio[..., None])).astype(np.float32)
        u = np.where(safe[..., None], u, 0)
        factor = np.where(np.isfinite(a), a / np.float32(QUERY_LEVELS), np.float32(np.nan)).astype(np.float32)
    return u.astype(np.int64), factor


def integer_bounds(magnitudes, positive, negative, codes_max, codes_min) -> np.ndarray:
    """I = sum of u * max_code over q > 0 minus sum of u * min_code over q < 0, exactly (int64):
    rows [..., S, D] against blocks [B, N, M, D] -> [..., S, M] (rows lead with B, N)."""
    plus = np.where(positive, magnitudes, 0)
    minus = np.where(negative, magnitudes, 0)
    top = np.asarray(codes_max, np.int64)[:, :, None]  # [B, N, 1, M, D]
    bottom = np.asarray(codes_min, np.int64)[:, :, None]
    return np.einsum("bngsd,bngmd->bngsm", plus, top) - np.einsum("bngsd,bngmd->bngsm", minus, bottom)
