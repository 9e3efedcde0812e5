"""NumPy reference of SparseBlockSelect: Quest bound scores, forced blocks, importance, top-k."""

from __future__ import annotations

import math

import numpy as np

from . import int8_bounds
from ._common import fmax, lane_sum, resolve_exact_lens, resolve_total_lens


def bound_scores(query, block_max, block_min, kv_num_heads, group_reduce, block_exponent=None):
    """Quest upper bounds [B, N, S, M] in the canonical fp32 order.

    "mean": one bound with the group's mean query (summed over g in order, divided by G);
    "max": each head's own bound, reduced with `s_g > s ? s_g : s` over g in order. int8 bounds
    score in integers (int8_bounds.quantized_query, int8_bounds.integer_bounds), then multiply the
    reduced score by their block's 2^e, NaN for a non-finite block.
    """
    B, H, S, D = query.shape
    N, G = kv_num_heads, H // kv_num_heads
    q = query.astype(np.float32).reshape(B, N, G, S, D)
    kmax = block_max.astype(np.float32)[:, :, None, None, :, :]  # [B, N, 1, 1, M, D]
    kmin = block_min.astype(np.float32)[:, :, None, None, :, :]
    if group_reduce == "mean":
        total = q[:, :, 0]
        for g in range(1, G):
            total = total + q[:, :, g]
        q = (total / np.float32(G))[:, :, None]  # [B, N, 1, S, D]
    if block_exponent is not None:  # int8 bounds: exact integer bounds of the rows quantized to 7 bits
        magnitudes, row_scale = int8_bounds.quantized_query(q)  # [B, N, G', S, D], [B, N, G', S]
        per_head = int8_bounds.integer_bounds(magnitudes, q > 0, q < 0, block_max, block_min)
        with np.errstate(invalid="ignore"):
            per_head = per_head.astype(np.float32) * row_scale[..., None]
    else:
        qd = q[:, :, :, :, None, :]  # [B, N, G', S, 1, D]
        per_head = lane_sum(fmax(qd * kmax, qd * kmin))  # [B, N, G', S, M]
    scores = per_head[:, :, 0]
    for g in range(1, per_head.shape[2]):
        scores = fmax(per_head[:, :, g], scores)
    if block_exponent is not None:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            scores = scores * int8_bounds.scale_of(block_exponent)[:, :, None, :]
    return scores


def probe_positions(block: int, p: int, block_size: int, num_probes: int) -> list[int]:
    """The positions a probe reads in `block` for a query at `p`: every attended one when there are
    at most num_probes, else num_probes evenly spaced ones (m*P + floor(j * n / num_probes))."""
    first = block * block_size
    n = min(first + block_size, p + 1) - first
    if n <= num_probes:
        return list(range(first, first + n))
    return [first + (j * n) // num_probes for j in range(num_probes)]


def probe_scores(query_rows, key_row_at, current: int, p: int, block_size: int, num_probes: int) -> np.ndarray:
    """Probe scores [current + 1] of one query: per block, the running max (`v > best ? v : best`)
    over its probes in order and, for each probe, over the query rows in order, of the canonical
    dot product of the row with the probed key."""
    blocks = current + 1
    positions = [probe_positions(m, p, block_size, num_probes) for m in range(blocks)]
    flat = [t for ts in positions for t in ts]
    keys = np.stack([key_row_at(t) for t in flat])  # [probes, D]
    rows = np.stack(query_rows)  # [R, D]
    dots = lane_sum(rows[:, None, :] * keys[None, :, :])  # [R, probes]
    table = np.full((num_probes, len(rows), blocks), -np.inf, np.float32)  # absent probes never win
    start = 0
    for m, ts in enumerate(positions):
        table[: len(ts), :, m] = dots[:, start : start + len(ts)].T
        start += len(ts)
    best = table[0, 0].copy()
    for j in range(num_probes):
        for r in range(len(rows)):
            if j == 0 and r == 0:
                continue
            best = fmax(table[j, r], best)
    return best


def query_rows(query, b: int, n: int, i: int, kv_num_heads: int, group_reduce: str) -> list[np.ndarray]:
    """The G query rows of (b, n, i) as float32, or the single mean row (summed in order, / G)."""
    G = query.shape[1] // kv_num_heads
    rows = [query[b, n * G + g, i].astype(np.float32) for g in range(G)]
    if group_reduce == "max":
        return rows
    total = rows[0]
    for row in rows[1:]:
        total = total + row
    return [total / np.float32(G)]


def rank_order(values: np.ndarray, candidates) -> list[int]:
    """Candidates best first: higher value first, NaN last, ties to the lower block index."""
    return sorted(candidates, key=lambda m: (bool(np.isnan(values[m])), -float(values[m]) if not np.isnan(values[m]) else 0.0, m))


def forced_blocks(current: int, sink_blocks: int, recent_blocks: int) -> list[int]:
    """Forced blocks in priority order: the recent blocks newest first, then the sinks ascending."""
    order = [m for m in range(current, current - recent_blocks, -1) if m >= 0]
    order += [m for m in range(min(sink_blocks, current + 1)) if m not in order]
    return order


def select_row(scores, importance, current, top_k, sink_blocks, recent_blocks, importance_fraction):
    """The chosen blocks (ascending) of one (b, n, query position) whose own block is `current`."""
    eligible = current + 1
    if eligible <= top_k:
        return list(range(eligible))
    chosen = forced_blocks(current, sink_blocks, recent_blocks)[:top_k]
    remaining = top_k - len(chosen)
    if importance is not None and remaining > 0:
        n_importance = math.floor(float(np.float32(importance_fraction)) * remaining)
        candidates = [m for m in range(eligible) if m not in chosen]
        chosen += rank_order(importance, candidates)[:n_importance]
        remaining -= n_importance
    candidates = [m for m in range(eligible) if m not in chosen]
    chosen += rank_order(scores, candidates)[:remaining]
    return sorted(chosen)


def sparse_block_select(
    query,
    block_max,
    block_min,
    past_lens,
    total_lens=None,
    block_importance=None,
    *,
    num_heads,
    kv_num_heads,
    block_size,
    top_k,
    sink_blocks=1,
    recent_blocks=1,
    group_reduce="mean",
    importance_fraction=0.0,
    key_cache=None,
    key=None,
    exact_lens=None,
    block_exponent=None,
    score="bound",
    num_probes=8,
):
    """Return block_indices [B, R, S, top_k] int32: chosen blocks ascending, -1 padded; R = N, or H
    with group_reduce="none". Queries at positions below exact_lens[b] attend exactly: all -1.
    int8 bounds come with block_exponent (docs/ops.md, int8 block bounds)."""
    B, H, S, _ = query.shape
    N, M = kv_num_heads, block_max.shape[2]
    assert H == num_heads and H % N == 0
    if (block_max.dtype == np.int8) != (block_exponent is not None):
        raise ValueError("block_exponent is required with int8 bounds and refused with float ones")
    if block_exponent is not None and query.shape[-1] > int8_bounds.MOST_CHANNELS:
        raise ValueError(f"int8 bounds take head dims up to {int8_bounds.MOST_CHANNELS}, got {query.shape[-1]}")
    if block_exponent is not None and score == "probe":
        raise ValueError("score='probe' needs float bounds (its key_cache shares their type); got int8 bounds")
    if group_reduce == "none":
        # Each query head alone is the shared policy over its KV head's inputs, one KV head per query head.
        def per_head(x):
            return None if x is None else np.repeat(x, H // N, axis=1)

        return sparse_block_select(
            query, per_head(block_max), per_head(block_min), past_lens, total_lens, per_head(block_importance),
            num_heads=H, kv_num_heads=H, block_size=block_size, top_k=top_k, sink_blocks=sink_blocks,
            recent_blocks=recent_blocks, group_reduce="mean", importance_fraction=importance_fraction,
            key_cache=per_head(key_cache), key=per_head(key), exact_lens=exact_lens,
            block_exponent=per_head(block_exponent), score=score, num_probes=num_probes)
    total = resolve_total_lens(past_lens, total_lens, S, M * block_size, "M * block_size")
    if score == "probe":
        if key_cache is None or key is None:
            raise ValueError("score='probe' needs the key_cache and key inputs")
        total = resolve_total_lens(past_lens, total_lens, S, key_cache.shape[2], "the cache capacity C")
        stored = key.astype(key_cache.dtype).astype(np.float32)  # new keys as the cache will hold them
        cached = key_cache.astype(np.float32)
    else:
        scores = bound_scores(query, block_max, block_min, N, group_reduce, block_exponent)
    exact = resolve_exact_lens(exact_lens, total)
    out = np.full((B, N, S, top_k), -1, dtype=np.int32)
    for b in range(B):
        past = int(past_lens[b])
        for i in range(S):
            p = past + i
            if p >= total[b] or p < exact[b]:
                continue
            for n in range(N):
                importance = None if block_importance is None else block_importance[b, n]
                if score == "probe":
                    def key_row_at(t, b=b, n=n, past=past):
                        return cached[b, n, t] if t < past else stored[b, n, t - past]

                    row_scores = probe_scores(query_rows(query, b, n, i, N, group_reduce), key_row_at,
                                              p // block_size, p, block_size, num_probes)
                else:
                    row_scores = scores[b, n, i]
                row = select_row(
                    row_scores, importance, p // block_size, top_k,
                    sink_blocks, recent_blocks, importance_fraction,
                )
                out[b, n, i, : len(row)] = row
    return out
