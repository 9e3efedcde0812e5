"""Standard-op function body of SparseBlockSelect, bit-exact with the kernels.

```
(none: block_max/min, importance, key_cache, key repeated per query head, then mean with N = H)
query -Cast(f32)-Reshape[B,N,G,S,D] -(mean: CumSum over G, last, /G)-.
block_max, block_min -Cast(f32)------------------------------------ Where(a>b,a,b) -lane_sum-> per-head
   bounds [B,N,G',S,M] -(max: Where(s_g>s, s_g, s) over g)-> scores [B,N,S,M]
positions (valid, not below exact_lens) -> eligible, forced (recent newest first, then sinks) -rank<K-> kept forced
importance (optional) -rank among the rest < floor(f * remaining)-> importance picks
scores -rank among the rest < quota-> score picks
chosen mask -TopK(M - m)-> ascending block ids, -1 where unchosen, padded to K
```
Ranks come from one TopK over float64 keys: a candidate's value (NaN below -inf, both above
any non-candidate), ties to the lower index as ONNX TopK specifies. int8 bounds (block_exponent
given) score their codes with each row quantized to 7-bit magnitudes (quantized_query_rows): the
same bound is then an exact integer in float32, times the row's a / 127; the reduced score is
multiplied by the block's 2^e (a table lookup, NaN for 127): one float32 product, as the contract has it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ._building import (F32, F64, I64, const, dim, exponent_scale, int8_bounds, ints, lane_sum, positions,
                        quantized_query_rows, repeat_heads, select_max, take, write_tokens)


def _rank(op, values_f32, candidates, M):
    """Rank [B,N,S,M] int64 of every block: candidates first by value (desc, NaN last), ties lower index.

    `values_f32` broadcasts against `candidates` [B, N, S, M].
    """
    as_double = op.Cast(values_f32, to=F64)
    # NaN is the value not equal to itself; Equal/Not rather than IsNaN/IsInf, which CANN's graph
    # mode does not take (graphs/portable.py).
    is_nan = op.Not(op.Equal(values_f32, values_f32))
    is_neg_inf = op.Equal(values_f32, const(op, -np.inf, np.float32))
    key = op.Where(is_neg_inf, const(op, -1e299, np.float64), as_double)
    key = op.Where(is_nan, const(op, -1e300, np.float64), key)
    key = op.Where(candidates, key, const(op, -np.inf, np.float64))
    _, order = op.TopK(key, M, axis=-1, largest=1, sorted=1, _outputs=2)  # block ids, best first
    steps = op.Expand(op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)), const(op, 1, np.int64)), op.Shape(order))
    zeros = op.ConstantOfShape(op.Shape(order), value=ir.tensor(np.zeros(1, np.int64)))
    return op.ScatterElements(zeros, order, steps, axis=-1)  # rank[order[j]] = j


def _query_rows(op, query, num_heads, kv_num_heads, group_reduce):
    """[B, N, G', S, D] float32: the G query rows per KV head, or (mean) their mean: G' = 1."""
    G = num_heads // kv_num_heads
    shape_q = op.Concat(dim(op, query, 0), ints(op, kv_num_heads, G), op.Shape(query, start=2), axis=0)
    q = op.Reshape(op.Cast(query, to=F32), shape_q)  # [B, N, G, S, D]
    if group_reduce == "mean":
        summed = take(op, op.CumSum(q, const(op, 2, np.int64)), 2, G - 1, G)
        q = op.Div(summed, const(op, G, np.float32))  # [B, N, 1, S, D]
    return q


def _probe_scores(op, query, key_cache, key, pos, valid, M, num_heads, kv_num_heads, group_reduce, block_size,
                  num_probes):
    """Probe scores [B, N, S, M]: per block, the running max over probes (in order) and query rows
    (in order) of the canonical dot product with the probed key.

    ```
    key_cache + key -write_tokens--> keys as cached after this call [B,N,C,D] -Transpose[B,C,N,D]
    probe positions [B,S,M,J] (first + j, or first + floor(j*n/J)) -GatherND(batch_dims=1)-> [B,S,M,J,N,D]
    query rows [B,N,G',S,D] x keys -lane_sum-> [B,N,G',S,M,J] -Where(probe exists, ., -inf)
       -running max over j, then rows--> [B,N,S,M]
    ```
    """
    J, P = num_probes, block_size
    cached = write_tokens(op, key_cache, key, pos, valid)
    by_position = op.Transpose(cached, perm=[0, 2, 1, 3])  # [B, C, N, D]
    blocks = op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)), const(op, 1, np.int64))
    first = op.Mul(blocks, const(op, P, np.int64))  # [M]
    end = op.Add(op.Unsqueeze(pos, ints(op, 2)), const(op, 1, np.int64))  # [B, S, 1]
    n = op.Sub(op.Min(op.Add(first, const(op, P, np.int64)), end), first)  # [B, S, M]
    n = op.Unsqueeze(n, ints(op, 3))  # [B, S, M, 1]
    j = op.Range(const(op, 0, np.int64), const(op, J, np.int64), const(op, 1, np.int64))  # [J]
    first4 = op.Reshape(first, ints(op, 1, 1, -1, 1))
    spread = op.Add(first4, op.Div(op.Mul(j, n), const(op, J, np.int64)))
    dense = op.Add(first4, j)
    t = op.Where(op.LessOrEqual(n, const(op, J, np.int64)), dense, spread)  # [B, S, M, J]
    exists = op.Less(j, n)  # [B, S, M, J]
    last = op.Sub(dim(op, key_cache, 2), ints(op, 1))
    t = op.Max(op.Min(t, last), const(op, 0, np.int64))  # absent probes read row 0; masked below
    flat = op.Reshape(t, op.Concat(dim(op, t, 0), ints(op, -1, 1), axis=0))  # [B, S*M*J, 1]
    gathered = op.GatherND(by_position, flat, batch_dims=1)  # [B, S*M*J, N, D]
    keys = op.Reshape(gathered, op.Concat(op.Shape(t), op.Shape(by_position, start=2), axis=0))  # [B,S,M,J,N,D]
    keys = op.Cast(op.Transpose(keys, perm=[0, 4, 1, 2, 3, 5]), to=F32)  # [B, N, S, M, J, D]
    rows = _query_rows(op, query, num_heads, kv_num_heads, group_reduce)  # [B, N, G', S, D]
    rows = op.Unsqueeze(rows, ints(op, 4, 5))  # [B, N, G', S, 1, 1, D]
    dots = lane_sum(op, op.Mul(rows, op.Unsqueeze(keys, ints(op, 2))), rank=7)  # [B, N, G', S, M, J]
    exists = op.Unsqueeze(exists, ints(op, 1, 2))  # [B, 1, 1, S, M, J]
    dots = op.Where(exists, dots, const(op, -np.inf, np.float32))
    heads = 1 if group_reduce == "mean" else num_heads // kv_num_heads
    best = None
    for probe in range(J):
        for row in range(heads):
            value = op.Squeeze(take(op, take(op, dots, 5, probe, probe + 1), 2, row, row + 1), ints(op, 2, 5))
            best = value if best is None else select_max(op, value, best)
    return best  # [B, N, S, M]


def _bound_scores(op, query, block_max, block_min, num_heads, kv_num_heads, group_reduce, block_exponent=None):
    """Bounds [B, N, S, M]; int8 bounds' codes (Cast to float32) against the rows quantized, an exact
    integer, times the row's factor, then the reduced score times 2^e per block."""
    q = _query_rows(op, query, num_heads, kv_num_heads, group_reduce)  # [B, N, G', S, D]
    factor = None
    if block_exponent is not None:
        q, factor = quantized_query_rows(op, q)  # factor [B, N, G', S, 1]
    q = op.Unsqueeze(q, ints(op, 4))  # [B, N, G', S, 1, D]
    kmax = op.Unsqueeze(op.Cast(block_max, to=F32), ints(op, 2, 3))  # [B, N, 1, 1, M, D]
    kmin = op.Unsqueeze(op.Cast(block_min, to=F32), ints(op, 2, 3))
    if factor is None:
        per_head = lane_sum(op, select_max(op, op.Mul(q, kmax), op.Mul(q, kmin)), rank=6)  # [B, N, G', S, M]
    else:  # u * max_code where q > 0, -u * min_code where q < 0, whatever order the codes are in
        chosen = op.Where(op.Greater(q, const(op, 0.0, np.float32)), kmax, kmin)
        per_head = op.Mul(lane_sum(op, op.Mul(q, chosen), rank=6), factor)
    heads = 1 if group_reduce == "mean" else num_heads // kv_num_heads
    scores = take(op, per_head, 2, 0, 1)
    for g in range(1, heads):
        scores = select_max(op, take(op, per_head, 2, g, g + 1), scores)
    scores = op.Squeeze(scores, ints(op, 2))  # [B, N, S, M]
    if block_exponent is not None:
        scores = op.Mul(scores, op.Unsqueeze(exponent_scale(op, block_exponent), ints(op, 2)))
    return scores


def sparse_block_select_body(
    op,
    query,
    block_max,
    block_min,
    past_lens,
    total_lens=None,
    block_importance=None,
    key_cache=None,
    key=None,
    exact_lens=None,
    block_exponent=None,
    *,
    num_heads: int,
    kv_num_heads: int,
    block_size: int,
    top_k: int,
    sink_blocks: int = 1,
    recent_blocks: int = 1,
    group_reduce: str = "mean",
    importance_fraction: float = 0.0,
    score: str = "bound",
    num_probes: int = 8,
):
    if int8_bounds("SparseBlockSelect", block_max, block_exponent) and score == "probe":
        raise ValueError("SparseBlockSelect: score='probe' needs float bounds (its 'key_cache' shares their type); "
                         "got int8 bounds ('block_exponent' given)")
    if group_reduce == "none":
        # Each query head alone is the shared policy over its KV head's inputs repeated per query head.
        G = num_heads // kv_num_heads

        def per_head(x, rank):
            return None if x is None else repeat_heads(op, x, G, rank)

        return sparse_block_select_body(
            op, query, per_head(block_max, 4), per_head(block_min, 4), past_lens, total_lens,
            per_head(block_importance, 3), per_head(key_cache, 4), per_head(key, 4), exact_lens,
            per_head(block_exponent, 3), num_heads=num_heads,
            kv_num_heads=num_heads, block_size=block_size, top_k=top_k, sink_blocks=sink_blocks,
            recent_blocks=recent_blocks, group_reduce="mean", importance_fraction=importance_fraction, score=score,
            num_probes=num_probes)
    M = dim(op, block_max, 2)
    pos, valid = positions(op, past_lens, total_lens, dim(op, query, 2))
    if score == "probe":  # probes read the keys of every valid position, exact ones included
        probe_valid = valid
    if exact_lens is not None:  # queries below exact_lens attend exactly: they select nothing
        valid = op.And(valid, op.GreaterOrEqual(pos, op.Unsqueeze(op.Cast(exact_lens, to=I64), ints(op, 1))))
    current = op.Unsqueeze(op.Div(pos, const(op, block_size, np.int64)), ints(op, 1, 3))  # [B, 1, S, 1]
    blocks = op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)), const(op, 1, np.int64))  # [M]
    eligible = op.And(op.LessOrEqual(blocks, current), op.Unsqueeze(valid, ints(op, 1, 3)))  # [B, 1, S, M]
    eligible = op.Expand(eligible, op.Concat(dim(op, block_max, 0), ints(op, kv_num_heads), dim(op, query, 2), M, axis=0))
    K = const(op, top_k, np.int64)

    # Forced blocks ranked by priority: recent (newest first) above sinks (ascending).
    recent = op.Greater(blocks, op.Sub(current, const(op, recent_blocks, np.int64)))
    sink = op.Less(blocks, const(op, sink_blocks, np.int64))
    blocks_f = op.Cast(blocks, to=F32)
    priority = op.Where(recent, op.Add(blocks_f, op.Cast(op.Mul(M, ints(op, 2)), to=F32)),
                        op.Sub(op.Cast(M, to=F32), blocks_f))
    forced = op.And(eligible, op.Or(recent, sink))
    chosen = op.And(forced, op.Less(_rank(op, priority, forced, M), K))
    chosen_count = op.ReduceSum(op.Cast(chosen, to=I64), ints(op, -1), keepdims=1)
    remaining = op.Sub(K, chosen_count)  # [B, N, S, 1]

    if block_importance is not None and importance_fraction > 0.0:
        fraction = float(np.float32(importance_fraction))  # the kernels read the attribute as float32
        quota = op.Cast(op.Floor(op.Mul(op.Cast(remaining, to=F64), const(op, fraction, np.float64))), to=I64)
        candidates = op.And(eligible, op.Not(chosen))
        importance = op.Unsqueeze(block_importance, ints(op, 2))  # [B, N, 1, M]
        picked = op.And(candidates, op.Less(_rank(op, importance, candidates, M), quota))
        chosen = op.Or(chosen, picked)
        remaining = op.Sub(remaining, quota)

    if score == "probe":
        scores = _probe_scores(op, query, key_cache, key, pos, probe_valid, M, num_heads, kv_num_heads, group_reduce,
                               block_size, num_probes)
    else:
        scores = _bound_scores(op, query, block_max, block_min, num_heads, kv_num_heads, group_reduce, block_exponent)
    candidates = op.And(eligible, op.Not(chosen))
    chosen = op.Or(chosen, op.And(candidates, op.Less(_rank(op, scores, candidates, M), remaining)))

    # Chosen blocks in ascending order: the largest M - m first; unchosen ones become -1.
    order_key = op.Where(chosen, op.Sub(M, blocks), const(op, 0, np.int64))
    width = op.Min(M, op.Reshape(K, ints(op, 1)))
    key_values, block_ids = op.TopK(order_key, width, axis=-1, largest=1, sorted=1, _outputs=2)
    ids = op.Where(op.Greater(key_values, const(op, 0, np.int64)), block_ids, const(op, -1, np.int64))
    pad_right = op.Max(op.Sub(op.Reshape(K, ints(op, 1)), M), ints(op, 0))
    ids = op.Pad(ids, op.Concat(ints(op, 0, 0, 0, 0, 0, 0, 0), pad_right, axis=0), const(op, -1, np.int64))
    return op.Cast(ids, to=ir.DataType.INT32)
