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


def preselect(importance, current, top_k, sink_blocks, recent_blocks, importance_fraction):
    """Steps 2 and 3 of a query whose own block is `current` and whose eligible blocks exceed top_k:
    (the forced and importance blocks, in the order chosen; the budget left for scores)."""
    eligible = current + 1
    chosen = forced_blocks(current, sink_blocks, recent_blocks)[:top_k]
    remaining = top_k - len(chosen)
    if importance is not None and remaining > 0:
        n_importance = math.floor(float(np.float32(importance_fraction)) * remaining)
        candidates = [m for m in range(eligible) if m not in chosen]
        chosen += rank_order(importance, candidates)[:n_importance]
        remaining -= n_importance
    return chosen, remaining


def select_row(scores, importance, current, top_k, sink_blocks, recent_blocks, importance_fraction, allowed=None):
    """The chosen blocks (ascending) of one (b, n, query position) whose own block is `current`;
    step 4 ranks only the blocks `allowed` [M] marks (hierarchical selection), or every one."""
    eligible = current + 1
    if eligible <= top_k:
        return list(range(eligible))
    chosen, remaining = preselect(importance, current, top_k, sink_blocks, recent_blocks, importance_fraction)
    candidates = [m for m in range(eligible) if m not in chosen and (allowed is None or allowed[m])]
    chosen += rank_order(scores, candidates)[:remaining]
    return sorted(chosen)


def candidate_count(top_k: int, superblock_size: int, candidate_factor: int) -> int:
    """The candidate superblocks a hierarchical query keeps: ceil(candidate_factor * top_k / superblock_size)."""
    return -(-candidate_factor * top_k // superblock_size)


def hierarchical_reads(current: int, top_k: int, superblock_size: int, candidate_factor: int) -> tuple[int, int] | None:
    """(superblocks, blocks at most) whose bounds the per-token query whose own block is `current`
    reads when it selects hierarchically (its preselected blocks' superblocks past the candidates
    aside), or None when its selection is flat (it reads blocks 0 .. current); superblock_size 0: none."""
    if not superblock_size or current + 1 <= top_k:
        return None
    eligible_super, count = current // superblock_size + 1, candidate_count(top_k, superblock_size, candidate_factor)
    return None if count >= eligible_super else (eligible_super, min(count * superblock_size, current + 1))


def candidate_superblocks(super_rows, preselected, current: int, count: int, superblock_size: int):
    """The superblocks whose blocks step 4 may choose, for a query whose own block is `current`, or
    None when `count` covers every eligible superblock (the flat selection). `super_rows`: the
    superblock scores of each selection sharing the candidates (a KV head's G query heads with
    group_reduce='none', else its one selection). The preselected blocks' superblocks first, then
    superblocks by turn, min over rows r of rank_r(u) * R + r (the rows taking their best
    superblocks in turn), until `count` are candidates."""
    eligible_super = current // superblock_size + 1
    if count >= eligible_super:
        return None
    candidates = {m // superblock_size for m in preselected}
    rows = len(super_rows)
    turn = np.full(eligible_super, np.iinfo(np.int64).max, np.int64)
    for r, scores in enumerate(super_rows):
        for rank, u in enumerate(rank_order(scores, range(eligible_super))):
            turn[u] = min(turn[u], rank * rows + r)
    for u in np.argsort(turn, kind="stable"):
        if len(candidates) >= count:
            break
        candidates.add(int(u))
    return candidates


def candidate_masks(query, super_max, super_min, super_exponent, past_lens, total, exact, block_importance, *,
                    kv_num_heads, num_blocks, block_size, top_k, sink_blocks, recent_blocks, group_reduce,
                    importance_fraction, superblock_size, candidate_factor):
    """[B, N, S, M] bool: the blocks step 4 may choose per (b, n, query), shared by the KV head's
    selections (docs/ops.md, hierarchical selection); every block where the selection is flat."""
    B, H, S, _ = query.shape
    N, G, U, M = kv_num_heads, H // kv_num_heads, superblock_size, num_blocks
    if group_reduce == "none":  # each query head's own superblock bound, G rows per KV head
        def per_head(x):
            return None if x is None else np.repeat(x, G, axis=1)

        scores = bound_scores(query, per_head(super_max), per_head(super_min), H, "mean", per_head(super_exponent))
        scores = scores.reshape(B, N, G, S, -1)
    else:
        scores = bound_scores(query, super_max, super_min, N, group_reduce, super_exponent)[:, :, None]
    count = candidate_count(top_k, U, candidate_factor)
    allowed = np.ones((B, N, S, M), bool)
    for b in range(B):
        past = int(past_lens[b])
        for i in range(S):
            p = past + i
            current = p // block_size
            if p >= total[b] or p < exact[b] or current + 1 <= top_k:
                continue
            for n in range(N):
                importance = None if block_importance is None else block_importance[b, n]
                chosen, _ = preselect(importance, current, top_k, sink_blocks, recent_blocks, importance_fraction)
                super_rows = [scores[b, n, r, i] for r in range(scores.shape[2])]
                candidates = candidate_superblocks(super_rows, chosen, current, count, U)
                if candidates is not None:
                    allowed[b, n, i] = False
                    for u in candidates:
                        allowed[b, n, i, u * U : (u + 1) * U] = True
    return allowed


def chunk_forced_blocks(first: int, last: int, window: int, sinks: int) -> list[int]:
    """A chunk's forced blocks in priority order: its own blocks (newest first), the `window` blocks
    before them (newest first), then the sinks ascending."""
    order = list(range(last, first - 1, -1))
    order += [m for m in range(first - 1, first - 1 - window, -1) if m >= 0]
    return order + [m for m in range(min(sinks, last + 1)) if m not in order]


def chunk_budget(candidates: int, forced: int, top_k: int, chunk_top_k: int, chunk_share: float,
                 chunk_floor: int) -> int:
    """Blocks a chunk selects by score: ceil(share * candidates) in double, at least top_k and
    chunk_floor, at most what chunk_top_k leaves after the forced blocks."""
    wanted = math.ceil(float(np.float32(chunk_share)) * candidates)
    return min(chunk_top_k - forced, max(top_k, chunk_floor, wanted))


def most_chunk_forced(chunk_size: int, block_size: int, window: int, sinks: int) -> int:
    """The most forced blocks a chunk can have: the blocks chunk_size positions can touch (at most
    (Q + P - 2) // P + 1), the window and the sinks."""
    return (chunk_size + block_size - 2) // block_size + 1 + window + sinks


def chunk_scoring_rows(query, b: int, n: int, members: range, chunk_first: int, kv_num_heads: int,
                       pool: int) -> list[np.ndarray]:
    """The scoring rows of one chunk of KV head n: per pool group (call indices
    [chunk_first + j * pool, + pool), in order) that holds members, per query head g of the group in
    order, the mean of the members' queries (summed in order, divided by their count, float32)."""
    G = query.shape[1] // kv_num_heads
    rows = []
    for start in range(chunk_first, members.stop, pool):
        group = [i for i in range(start, start + pool) if i in members]
        if not group:
            continue
        for g in range(G):
            total = query[b, n * G + g, group[0]].astype(np.float32)
            for i in group[1:]:
                total = total + query[b, n * G + g, i].astype(np.float32)
            rows.append(total / np.float32(len(group)))
    return rows


def chunk_scores(rows, block_max, block_min, block_exponent, b: int, n: int) -> np.ndarray:
    """Scores [M] of one chunk of KV head n: its rows' bounds, max-reduced in row order
    (`s_r > s ? s_r : s`); with int8 bounds each row quantized, its integer bound times its factor,
    and the reduced score times the block's 2^e."""
    q = np.stack(rows)  # [R, D]
    if block_exponent is not None:
        magnitudes, factor = int8_bounds.quantized_query(q)
        top, bottom = block_max[b, n].astype(np.int64), block_min[b, n].astype(np.int64)  # [M, D]
        integer = np.where(q > 0, magnitudes, 0) @ top.T - np.where(q < 0, magnitudes, 0) @ bottom.T  # [R, M]
        with np.errstate(invalid="ignore"):
            per_row = integer.astype(np.float32) * factor[:, None]
    else:
        kmax, kmin = block_max[b, n].astype(np.float32), block_min[b, n].astype(np.float32)  # [M, D]
        qd = q[:, None, :]
        per_row = lane_sum(fmax(qd * kmax, qd * kmin))  # [R, M]
    scores = per_row[0]
    for r in range(1, len(rows)):
        scores = fmax(per_row[r], scores)
    if block_exponent is not None:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            scores = scores * int8_bounds.scale_of(block_exponent[b, n])
    return scores


def chunk_select(query, block_max, block_min, block_exponent, past_lens, total, exact, chunk_lens, *, kv_num_heads,
                 block_size, top_k, chunk_sink, chunk_size, chunk_top_k, chunk_share, chunk_window, chunk_pool,
                 chunk_floor):
    """chunk_indices [B, N, NC, KC]: per chunk of chunk_size queries of the call, the blocks its
    members (valid queries at positions in [exact_lens, chunk_lens)) attend, ascending, -1 padded."""
    B, _, S, _ = query.shape
    N, P, Q = kv_num_heads, block_size, chunk_size
    NC = -(-S // Q)
    out = np.full((B, N, NC, chunk_top_k), -1, dtype=np.int32)
    for b in range(B):
        past = int(past_lens[b])
        first_member = max(int(exact[b]), past) - past
        end_member = min(int(chunk_lens[b]), int(total[b])) - past
        for c in range(NC):
            members = range(max(c * Q, first_member), min(c * Q + Q, end_member, S))
            if len(members) == 0:
                continue
            first, last = (past + members.start) // P, (past + members.stop - 1) // P
            forced = chunk_forced_blocks(first, last, chunk_window, chunk_sink)
            eligible = last + 1
            keep = chunk_budget(eligible - len(forced), len(forced), top_k, chunk_top_k, chunk_share, chunk_floor)
            for n in range(N):
                if eligible - len(forced) <= keep:
                    chosen = list(range(eligible))
                else:
                    rows = chunk_scoring_rows(query, b, n, members, c * Q, N, chunk_pool)
                    scores = chunk_scores(rows, block_max, block_min, block_exponent, b, n)
                    candidates = [m for m in range(eligible) if m not in forced]
                    chosen = sorted(forced + rank_order(scores, candidates)[:keep])
                out[b, n, c, : len(chosen)] = chosen
    return out


def check_chunk_attributes(chunk_size, chunk_top_k, block_size, chunk_window, chunk_sink):
    """chunk_top_k must hold the most forced blocks a chunk can have (its own, the window, the sinks)."""
    most = most_chunk_forced(chunk_size, block_size, chunk_window, chunk_sink)
    if chunk_top_k < most:
        raise ValueError(f"chunk_top_k = {chunk_top_k} cannot hold a chunk's forced blocks: up to {most} "
                         f"(its own blocks, chunk_window = {chunk_window}, chunk_sink = {chunk_sink})")


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
    chunk_lens=None,
    score="bound",
    num_probes=8,
    chunk_size=64,
    chunk_top_k=1024,
    chunk_share=0.0625,
    chunk_window=64,
    chunk_sink=16,
    chunk_pool=16,
    chunk_floor=64,
    super_max=None,
    super_min=None,
    super_exponent=None,
    superblock_size=8,
    candidate_factor=16,
):
    """Return block_indices [B, R, S, top_k] int32, and with chunk_lens given also chunk_indices
    [B, N, ceil(S / chunk_size), chunk_top_k]: chosen blocks ascending, -1 padded; R = N, or H with
    group_reduce="none". Queries at positions below exact_lens[b] attend exactly: all -1; the others
    below chunk_lens[b] select per chunk (chunk_indices), their block_indices rows all -1. int8
    bounds come with block_exponent (docs/ops.md, int8 block bounds)."""
    B, H, S, _ = query.shape
    N, M = kv_num_heads, block_max.shape[2]
    assert H == num_heads and H % N == 0
    if (block_max.dtype == np.int8) != (block_exponent is not None):
        raise ValueError("block_exponent is required with int8 bounds and refused with float ones")
    if block_exponent is not None and query.shape[-1] > int8_bounds.MOST_CHANNELS:
        raise ValueError(f"int8 bounds take head dims up to {int8_bounds.MOST_CHANNELS}, got {query.shape[-1]}")
    if block_exponent is not None and score == "probe":
        raise ValueError("score='probe' needs float bounds (its key_cache shares their type); got int8 bounds")
    check_chunk_attributes(chunk_size, chunk_top_k, block_size, chunk_window, chunk_sink)
    check_superblocks(block_max, super_max, super_min, super_exponent, superblock_size, score)
    total = resolve_total_lens(past_lens, total_lens, query.shape[2], M * block_size, "M * block_size")
    exact = resolve_exact_lens(exact_lens, total)
    chunked = resolve_exact_lens(chunk_lens, total, "chunk_lens")
    chunks = chunk_select(query, block_max, block_min, block_exponent, past_lens, total, exact, chunked,
                          kv_num_heads=N, block_size=block_size, top_k=top_k, chunk_sink=chunk_sink,
                          chunk_size=chunk_size, chunk_top_k=chunk_top_k, chunk_share=chunk_share,
                          chunk_window=chunk_window, chunk_pool=chunk_pool, chunk_floor=chunk_floor)
    # Chunk queries select nothing per token: to the per-token rule they attend exactly.
    per_token_exact = np.where(chunked > exact, chunked, exact)
    indices = per_token_select(query, block_max, block_min, past_lens, total_lens, block_importance,
                               num_heads=H, kv_num_heads=N, block_size=block_size, top_k=top_k,
                               sink_blocks=sink_blocks, recent_blocks=recent_blocks, group_reduce=group_reduce,
                               importance_fraction=importance_fraction, key_cache=key_cache, key=key,
                               exact_lens=per_token_exact if chunk_lens is not None else exact_lens,
                               block_exponent=block_exponent, score=score, num_probes=num_probes,
                               super_max=super_max, super_min=super_min, super_exponent=super_exponent,
                               superblock_size=superblock_size, candidate_factor=candidate_factor)
    return indices if chunk_lens is None else (indices, chunks)


def check_superblocks(block_max, super_max, super_min, super_exponent, superblock_size, score):
    """super_max and super_min come together, ceil(M / superblock_size) of them, with an exponent
    exactly when the bounds are int8; the probe score takes no superblocks."""
    if (super_max is None) != (super_min is None):
        raise ValueError("super_max and super_min come together")
    if super_max is None:
        if super_exponent is not None:
            raise ValueError("super_exponent is given without super_max")
        return
    if score == "probe":
        raise ValueError("score='probe' takes no superblocks")
    wanted = -(-block_max.shape[2] // superblock_size)
    if super_max.shape[2] != wanted or super_min.shape[2] != wanted:
        raise ValueError(f"super_max/super_min hold {super_max.shape[2]}/{super_min.shape[2]} superblocks, want "
                         f"ceil(M / superblock_size) = {wanted}")
    if (block_max.dtype == np.int8) != (super_exponent is not None):
        raise ValueError("super_exponent is required with int8 bounds and refused with float ones")


def per_token_select(query, block_max, block_min, past_lens, total_lens, block_importance, *, num_heads,
                     kv_num_heads, block_size, top_k, sink_blocks, recent_blocks, group_reduce, importance_fraction,
                     key_cache, key, exact_lens, block_exponent, score, num_probes, super_max=None, super_min=None,
                     super_exponent=None, superblock_size=8, candidate_factor=16, allowed=None):
    """block_indices [B, R, S, top_k] of the queries that select per token (docs/ops.md); with
    superblocks, step 4 of each ranks only its candidates' blocks (`allowed`, [B, N, S, M])."""
    B, H, S, _ = query.shape
    N, M = kv_num_heads, block_max.shape[2]
    if super_max is not None:
        total = resolve_total_lens(past_lens, total_lens, S, M * block_size, "M * block_size")
        allowed = candidate_masks(
            query, super_max, super_min, super_exponent, past_lens, total, resolve_exact_lens(exact_lens, total),
            block_importance, kv_num_heads=N, num_blocks=M, block_size=block_size, top_k=top_k,
            sink_blocks=sink_blocks, recent_blocks=recent_blocks, group_reduce=group_reduce,
            importance_fraction=importance_fraction, superblock_size=superblock_size,
            candidate_factor=candidate_factor)
    if group_reduce == "none":
        # Each query head alone is the shared policy over its KV head's inputs, one KV head per query head.
        def per_head(x):
            return None if x is None else np.repeat(x, H // N, axis=1)

        return per_token_select(
            query, per_head(block_max), per_head(block_min), past_lens, total_lens, per_head(block_importance),
            num_heads=H, kv_num_heads=H, block_size=block_size, top_k=top_k, sink_blocks=sink_blocks,
            recent_blocks=recent_blocks, group_reduce="mean", importance_fraction=importance_fraction,
            key_cache=per_head(key_cache), key=per_head(key), exact_lens=exact_lens,
            block_exponent=per_head(block_exponent), score=score, num_probes=num_probes, allowed=per_head(allowed))
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
                    None if allowed is None else allowed[b, n, i],
                )
                out[b, n, i, : len(row)] = row
    return out
