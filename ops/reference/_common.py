"""Arithmetic and length rules shared by the NumPy references: the canonical fp32 score order.

The native kernels compute selection scores in exactly this order (16 lanes, lane l summing the
terms d = l, l+16, ... in increasing d from +0.0, then a halving fold 8, 4, 2, 1), so that block
selections compare bit for bit across the reference, the scalar kernel and every SIMD variant.
"""

from __future__ import annotations

import numpy as np

LANES = 16


def fmax(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`a > b ? a : b`: the max every kernel uses (equal to x86 maxps(a, b), also for NaN and -0)."""
    return np.where(a > b, a, b)


def fmin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`a < b ? a : b`: the min every kernel uses."""
    return np.where(a < b, a, b)


def lane_sum(terms: np.ndarray) -> np.ndarray:
    """Sum float32 `terms` over the last axis in the canonical 16-lane order."""
    terms = np.asarray(terms, dtype=np.float32)
    d = terms.shape[-1]
    padded = -(-d // LANES) * LANES
    if padded != d:  # adding +0.0 never changes a lane (a lane that starts at +0.0 is never -0.0)
        pad = [(0, 0)] * (terms.ndim - 1) + [(0, padded - d)]
        terms = np.pad(terms, pad)
    rows = terms.reshape(*terms.shape[:-1], padded // LANES, LANES)
    acc = np.zeros(rows.shape[:-2] + (LANES,), dtype=np.float32)
    for r in range(rows.shape[-2]):
        acc = acc + rows[..., r, :]
    width = LANES // 2
    while width >= 1:
        acc = acc[..., :width] + acc[..., width : 2 * width]
        width //= 2
    return acc[..., 0]


def resolve_total_lens(
    past_lens: np.ndarray, total_lens: np.ndarray | None, new_tokens: int, limit: int, limit_name: str
) -> np.ndarray:
    """Validate the lengths of a call and return `total_lens` (default `past_lens + S`).

    Raises ValueError naming the offending input, mirroring the kernels' checks.
    """
    past = np.asarray(past_lens, dtype=np.int64)
    if (past < 0).any():
        raise ValueError(f"past_lens must be >= 0, got {past.tolist()}")
    if total_lens is None:
        total = past + new_tokens
        name = "past_lens + S"
    else:
        total = np.asarray(total_lens, dtype=np.int64)
        name = "total_lens"
        if (total < past).any():
            raise ValueError(f"total_lens must be >= past_lens, got {total.tolist()} < {past.tolist()}")
        if (total > past + new_tokens).any():
            raise ValueError(f"total_lens must be <= past_lens + S, got {total.tolist()}")
    if (total > limit).any():
        raise ValueError(f"{name} exceeds {limit_name} = {limit}: {total.tolist()}")
    return total


def resolve_exact_lens(exact_lens: np.ndarray | None, total: np.ndarray, name: str = "exact_lens") -> np.ndarray:
    """Validate `exact_lens` (0 <= exact_lens[b] <= total_lens[b]); absent means 0: no query
    attends exactly. Raises ValueError naming the input, like the kernels. `chunk_lens` takes the
    same rule (`name`)."""
    if exact_lens is None:
        return np.zeros_like(total)
    exact = np.asarray(exact_lens, dtype=np.int64)
    if (exact < 0).any() or (exact > total).any():
        raise ValueError(f"{name} must lie in [0, total_lens], got {exact.tolist()} with total_lens {total.tolist()}")
    return exact


def valid_positions(past: int, total: int):
    """(i, p) for every valid new token of a row: call index i at absolute position p."""
    return [(p - past, p) for p in range(past, total)]
