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
any non-candidate), ties to the lower index as ONNX TopK specifies. Chunk queries (chunk_lens) get
all -1 rows here and their chunk's selection in chunk_indices (_chunk_select). int8 bounds (block_exponent
given) score their codes with each row quantized to 7-bit magnitudes (quantized_query_rows): the
same bound is then an exact integer in float32, times the row's a / 127; the reduced score is
multiplied by the block's 2^e (a table lookup, NaN for 127): one float32 product, as the contract has it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...ops.reference.sparse_block_select import most_chunk_forced
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


def _chunk_rows(op, query, members, num_heads, kv_num_heads, chunk_size, pool):
    """(rows [B, N, G, NC, J, D] float32, real [B, 1, 1, NC, J, 1]): per chunk of chunk_size queries and
    pool group j (call indices [c * Q + j * pool, + pool)), per head g, the mean of the members'
    queries, summed in call order (CumSum; zeros where a query is no member add nothing) and divided
    by their count; `real`: the group has members.

    ```
    query -Cast-Reshape[B,N,G,S,D]-Pad(S -> NC*Q)-Where(member, ., 0)-Reshape[B,N,G,NC,Q,D]
       -Pad(Q -> J*pool)-Reshape[B,N,G,NC,J,pool,D]-CumSum(pool), last-> sums / counts
    ```
    """
    G, Q = num_heads // kv_num_heads, chunk_size
    groups = -(-Q // pool)
    S = dim(op, query, 2)
    padding = op.Sub(op.Mul(op.Div(op.Add(S, ints(op, Q - 1)), ints(op, Q)), ints(op, Q)), S)
    shape_q = op.Concat(dim(op, query, 0), ints(op, kv_num_heads, G), op.Shape(query, start=2), axis=0)
    q = op.Reshape(op.Cast(query, to=F32), shape_q)  # [B, N, G, S, D]
    q = op.Pad(q, op.Concat(ints(op, 0, 0, 0, 0, 0, 0, 0, 0), padding, ints(op, 0), axis=0))
    member = op.Pad(members, op.Concat(ints(op, 0, 0, 0), padding, axis=0))  # [B, NC*Q]
    q = op.Where(op.Unsqueeze(member, ints(op, 1, 2, 4)), q, const(op, 0.0, np.float32))
    by_chunk = op.Concat(dim(op, query, 0), ints(op, kv_num_heads, G, -1, Q), dim(op, query, 3), axis=0)
    q = op.Reshape(q, by_chunk)  # [B, N, G, NC, Q, D]
    extra = groups * pool - Q
    q = op.Pad(q, ints(op, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, extra, 0))
    q = op.Reshape(q, op.Concat(op.Shape(q, end=4), ints(op, groups, pool), dim(op, query, 3), axis=0))
    sums = op.Squeeze(take(op, op.CumSum(q, const(op, 5, np.int64)), 5, pool - 1, pool), ints(op, 5))
    flags = op.Reshape(op.Cast(member, to=F32), op.Concat(dim(op, query, 0), ints(op, -1, Q), axis=0))
    flags = op.Pad(flags, ints(op, 0, 0, 0, 0, 0, extra))
    counts = op.ReduceSum(op.Reshape(flags, op.Concat(op.Shape(flags, end=2), ints(op, groups, pool), axis=0)),
                          ints(op, 3), keepdims=0)  # [B, NC, J]
    real = op.Greater(counts, const(op, 0.0, np.float32))
    divisor = op.Where(real, counts, const(op, 1.0, np.float32))
    rows = op.Div(sums, op.Unsqueeze(divisor, ints(op, 1, 2, 5)))
    return rows, op.Unsqueeze(real, ints(op, 1, 2, 5))


def _chunk_select(op, query, block_max, block_min, block_exponent, past_lens, pos, valid, exact_lens, chunk_lens, *,
                  num_heads, kv_num_heads, block_size, top_k, chunk_sink, chunk_size, chunk_top_k, chunk_share,
                  chunk_window, chunk_pool, chunk_floor):
    """chunk_indices [B, N, NC, KC] int32 (docs/ops.md, chunk queries).

    ```
    members (valid, not below exact_lens, below chunk_lens) -Reshape[B,NC,Q]-> first / last member -> blocks
    _chunk_rows -> bounds [B,N,G,NC,J,M] -> max over real rows (NaN when the first real row's is) -> scores
    forced (own, window, sinks), keep = min(KC - F, max(K, ceil(share * candidates))) -rank-> chosen
    chosen -TopK(M - m)-> ascending ids, -1 padded to KC; chunks without members all -1
    ```
    """
    Q, P = chunk_size, block_size
    M = dim(op, block_max, 2)
    members = op.And(valid, op.Less(pos, op.Unsqueeze(op.Cast(chunk_lens, to=I64), ints(op, 1))))
    if exact_lens is not None:
        members = op.And(members, op.GreaterOrEqual(pos, op.Unsqueeze(op.Cast(exact_lens, to=I64), ints(op, 1))))
    rows, real = _chunk_rows(op, query, members, num_heads, kv_num_heads, Q, chunk_pool)  # [B,N,G,NC,J,D]
    factor = None
    if block_exponent is not None:
        rows, factor = quantized_query_rows(op, rows)
    q = op.Unsqueeze(rows, ints(op, 5))  # [B, N, G, NC, J, 1, D]
    kmax = op.Unsqueeze(op.Cast(block_max, to=F32), ints(op, 2, 3, 4))  # [B, N, 1, 1, 1, M, D]
    kmin = op.Unsqueeze(op.Cast(block_min, to=F32), ints(op, 2, 3, 4))
    if factor is None:
        per_row = lane_sum(op, select_max(op, op.Mul(q, kmax), op.Mul(q, kmin)), rank=7)  # [B, N, G, NC, J, M]
    else:
        chosen_bound = op.Where(op.Greater(q, const(op, 0.0, np.float32)), kmax, kmin)
        per_row = op.Mul(lane_sum(op, op.Mul(q, chosen_bound), rank=7), factor)
    # The rows in order (group, then head), `s_r > s ? s_r : s` from the first real row: the max of the
    # real rows that are numbers, or NaN when the first real row's bound is NaN.
    neg_inf = const(op, -np.inf, np.float32)
    numbers = op.Where(op.And(real, op.Equal(per_row, per_row)), per_row, neg_inf)
    best = op.ReduceMax(numbers, ints(op, 2, 4), keepdims=0)  # [B, N, NC, M]
    padded = op.Pad(members, op.Concat(ints(op, 0, 0, 0), op.Sub(op.Mul(
        op.Div(op.Add(dim(op, query, 2), ints(op, Q - 1)), ints(op, Q)), ints(op, Q)), dim(op, query, 2)), axis=0))
    by_chunk = op.Reshape(padded, op.Concat(dim(op, query, 0), ints(op, -1, Q), axis=0))  # [B, NC, Q]
    offsets = op.Range(const(op, 0, np.int64), const(op, Q, np.int64), const(op, 1, np.int64))
    first = op.ReduceMin(op.Where(by_chunk, offsets, const(op, Q, np.int64)), ints(op, 2), keepdims=0)  # [B, NC]
    last = op.ReduceMax(op.Where(by_chunk, offsets, const(op, -1, np.int64)), ints(op, 2), keepdims=0)
    has_members = op.Less(first, const(op, Q, np.int64))
    group = op.Div(op.Min(first, const(op, Q - 1, np.int64)), const(op, chunk_pool, np.int64))  # [B, NC]
    head0 = op.Squeeze(take(op, per_row, 2, 0, 1), ints(op, 2))  # [B, N, NC, J, M]
    at = op.Expand(op.Unsqueeze(group, ints(op, 1, 3, 4)), op.Concat(op.Shape(head0, end=3), ints(op, 1), M, axis=0))
    first_row = op.Squeeze(op.GatherElements(head0, at, axis=3), ints(op, 3))  # [B, N, NC, M]
    scores = op.Where(op.Equal(first_row, first_row), best, const(op, np.nan, np.float32))
    if block_exponent is not None:
        scores = op.Mul(scores, op.Unsqueeze(exponent_scale(op, block_exponent), ints(op, 2)))

    chunk_first = op.Mul(op.Range(const(op, 0, np.int64), op.Squeeze(op.Shape(first, start=1), ints(op, 0)),
                                  const(op, 1, np.int64)), const(op, Q, np.int64))  # [NC]
    past = op.Unsqueeze(op.Cast(past_lens, to=I64), ints(op, 1))  # [B, 1]: the position of call index 0
    first_block = op.Div(op.Add(op.Add(past, chunk_first), first), const(op, P, np.int64))  # [B, NC]
    last_block = op.Div(op.Add(op.Add(past, chunk_first), op.Max(last, const(op, 0, np.int64))), const(op, P, np.int64))
    blocks = op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)), const(op, 1, np.int64))  # [M]
    unsq = lambda x: op.Unsqueeze(x, ints(op, 1, 3))  # [B, NC] -> [B, 1, NC, 1]
    eligible = op.And(op.LessOrEqual(blocks, unsq(last_block)), unsq(has_members))  # [B, 1, NC, M]
    window_start = op.Max(op.Sub(first_block, const(op, chunk_window, np.int64)), const(op, 0, np.int64))
    forced = op.And(eligible, op.Or(op.GreaterOrEqual(blocks, unsq(window_start)),
                                    op.Less(blocks, const(op, chunk_sink, np.int64))))
    count = lambda x: op.ReduceSum(op.Cast(x, to=I64), ints(op, -1), keepdims=1)
    n_forced = count(forced)
    candidates_n = op.Sub(count(eligible), n_forced)
    share = float(np.float32(chunk_share))  # the kernels read the attribute as float32
    wanted = op.Cast(op.Ceil(op.Mul(op.Cast(candidates_n, to=F64), const(op, share, np.float64))), to=I64)
    floor = const(op, max(top_k, chunk_floor), np.int64)
    keep = op.Min(op.Sub(const(op, chunk_top_k, np.int64), n_forced), op.Max(floor, wanted))
    everything = op.LessOrEqual(candidates_n, keep)  # [B, 1, NC, 1]
    shape = op.Concat(dim(op, query, 0), ints(op, kv_num_heads), op.Shape(first, start=1), M, axis=0)
    eligible, forced = op.Expand(eligible, shape), op.Expand(forced, shape)
    candidates = op.And(eligible, op.Not(forced))
    ranked = op.And(candidates, op.Less(_rank(op, scores, candidates, M), keep))
    # (ONNX Runtime's Where takes no booleans: And / Or instead)
    chosen = op.Or(op.And(everything, eligible), op.And(op.Not(everything), op.Or(forced, ranked)))
    return _ascending_ids(op, chosen, blocks, M, chunk_top_k)


def _ascending_ids(op, chosen, blocks, M, width):
    """The chosen blocks [..., M] as ascending ids, -1 padded to `width`, int32.

    ```
    chosen -Where(M - m, 0)-TopK(min(M, width))-> ids (-1 where unchosen) -Pad(-1) to width
    ```
    """
    K = const(op, width, np.int64)
    order_key = op.Where(chosen, op.Sub(M, blocks), const(op, 0, np.int64))
    key_values, block_ids = op.TopK(order_key, op.Min(M, op.Reshape(K, ints(op, 1))), axis=-1, largest=1, sorted=1,
                                    _outputs=2)
    ids = op.Where(op.Greater(key_values, const(op, 0, np.int64)), block_ids, const(op, -1, np.int64))
    pad_right = op.Max(op.Sub(op.Reshape(K, ints(op, 1)), M), ints(op, 0))
    ids = op.Pad(ids, op.Concat(ints(op, 0, 0, 0, 0, 0, 0, 0), pad_right, axis=0), const(op, -1, np.int64))
    return op.Cast(ids, to=ir.DataType.INT32)


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
    chunk_lens=None,
    super_max=None,
    super_min=None,
    super_exponent=None,
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
    chunk_size: int = 64,
    chunk_top_k: int = 1024,
    chunk_share: float = 0.0625,
    chunk_window: int = 64,
    chunk_sink: int = 16,
    chunk_pool: int = 16,
    chunk_floor: int = 64,
    superblock_size: int = 8,
    candidate_factor: int = 16,
    with_chunks: bool = False,
):
    """block_indices, and with `with_chunks` (the node has output chunk_indices) chunk_indices too."""
    if (super_max is None) != (super_min is None):
        raise ValueError("SparseBlockSelect: inputs 'super_max' and 'super_min' come together")
    if super_max is not None and score == "probe":
        raise ValueError("SparseBlockSelect: score='probe' takes no superblocks")
    if super_max is not None and (block_exponent is None) != (super_exponent is None):
        raise ValueError("SparseBlockSelect: 'super_exponent' comes with int8 bounds ('block_exponent'), and only then")
    superblocks = None if super_max is None else (super_max, super_min, super_exponent, superblock_size,
                                                  candidate_factor)
    if int8_bounds("SparseBlockSelect", block_max, block_exponent) and score == "probe":
        raise ValueError("SparseBlockSelect: score='probe' needs float bounds (its 'key_cache' shares their type); "
                         "got int8 bounds ('block_exponent' given)")
    most = most_chunk_forced(chunk_size, block_size, chunk_window, chunk_sink)
    if chunk_top_k < most:
        raise ValueError(f"SparseBlockSelect: attribute 'chunk_top_k' = {chunk_top_k} cannot hold a chunk's forced "
                         f"blocks: up to {most}")
    per_token = _per_token_select(op, query, block_max, block_min, past_lens, total_lens, block_importance, key_cache,
                                  key, exact_lens, block_exponent, chunk_lens, num_heads=num_heads,
                                  kv_num_heads=kv_num_heads, block_size=block_size, top_k=top_k,
                                  sink_blocks=sink_blocks, recent_blocks=recent_blocks, group_reduce=group_reduce,
                                  importance_fraction=importance_fraction, score=score, num_probes=num_probes,
                                  superblocks=superblocks)
    if not with_chunks:
        return per_token
    pos, valid = positions(op, past_lens, total_lens, dim(op, query, 2))
    if chunk_lens is None:  # no chunk queries: every chunk row all -1
        chunk_lens = op.Cast(op.Mul(past_lens, const(op, 0, np.int32)), to=ir.DataType.INT32)
    chunks = _chunk_select(op, query, block_max, block_min, block_exponent, past_lens, pos, valid, exact_lens,
                           chunk_lens,
                           num_heads=num_heads, kv_num_heads=kv_num_heads, block_size=block_size, top_k=top_k,
                           chunk_sink=chunk_sink, chunk_size=chunk_size, chunk_top_k=chunk_top_k,
                           chunk_share=chunk_share, chunk_window=chunk_window, chunk_pool=chunk_pool,
                           chunk_floor=chunk_floor)
    return per_token, chunks


def _per_token_select(op, query, block_max, block_min, past_lens, total_lens, block_importance, key_cache, key,
                      exact_lens, block_exponent, chunk_lens, *, num_heads, kv_num_heads, block_size, top_k,
                      sink_blocks, recent_blocks, group_reduce, importance_fraction, score, num_probes,
                      superblocks=None, allowed=None):
    """block_indices [B, R, S, K]: the queries that select per token; step 4 ranks only the blocks
    `allowed` [B, N, S, M] marks (hierarchical selection, from `superblocks`), or all."""
    if superblocks is not None:
        allowed = _candidate_blocks(op, query, block_max, past_lens, total_lens, block_importance, exact_lens,
                                    chunk_lens, superblocks, num_heads=num_heads, kv_num_heads=kv_num_heads,
                                    block_size=block_size, top_k=top_k, sink_blocks=sink_blocks,
                                    recent_blocks=recent_blocks, group_reduce=group_reduce,
                                    importance_fraction=importance_fraction)
    if group_reduce == "none":
        # Each query head alone is the shared policy over its KV head's inputs repeated per query head.
        G = num_heads // kv_num_heads

        def per_head(x, rank):
            return None if x is None else repeat_heads(op, x, G, rank)

        return _per_token_select(
            op, query, per_head(block_max, 4), per_head(block_min, 4), past_lens, total_lens,
            per_head(block_importance, 3), per_head(key_cache, 4), per_head(key, 4), exact_lens,
            per_head(block_exponent, 3), chunk_lens, num_heads=num_heads,
            kv_num_heads=num_heads, block_size=block_size, top_k=top_k, sink_blocks=sink_blocks,
            recent_blocks=recent_blocks, group_reduce="mean", importance_fraction=importance_fraction, score=score,
            num_probes=num_probes, allowed=per_head(allowed, 4))
    M = dim(op, block_max, 2)
    pos, valid = positions(op, past_lens, total_lens, dim(op, query, 2))
    if score == "probe":  # probes read the keys of every valid position, exact ones included
        probe_valid = valid
    chosen, remaining, eligible, blocks = _preselect(op, query, block_max, pos, valid, block_importance, exact_lens,
                                                     chunk_lens, kv_num_heads=kv_num_heads, block_size=block_size,
                                                     top_k=top_k, sink_blocks=sink_blocks,
                                                     recent_blocks=recent_blocks,
                                                     importance_fraction=importance_fraction)
    if score == "probe":
        scores = _probe_scores(op, query, key_cache, key, pos, probe_valid, M, num_heads, kv_num_heads, group_reduce,
                               block_size, num_probes)
    else:
        scores = _bound_scores(op, query, block_max, block_min, num_heads, kv_num_heads, group_reduce, block_exponent)
    candidates = op.And(eligible, op.Not(chosen))
    if allowed is not None:
        candidates = op.And(candidates, allowed)
    chosen = op.Or(chosen, op.And(candidates, op.Less(_rank(op, scores, candidates, M), remaining)))

    return _ascending_ids(op, chosen, blocks, M, top_k)


def _preselect(op, query, block_max, pos, valid, block_importance, exact_lens, chunk_lens, *, kv_num_heads,
               block_size, top_k, sink_blocks, recent_blocks, importance_fraction):
    """Steps 1-3 of every (b, n, query): (chosen [B, N, S, M]: the forced and importance blocks; the
    budget left for scores [B, N, S, 1]; eligible [B, N, S, M]; blocks [M])."""
    M = dim(op, block_max, 2)
    if exact_lens is not None:  # queries below exact_lens attend exactly: they select nothing
        valid = op.And(valid, op.GreaterOrEqual(pos, op.Unsqueeze(op.Cast(exact_lens, to=I64), ints(op, 1))))
    if chunk_lens is not None:  # nor do chunk queries: their chunk selects for them
        valid = op.And(valid, op.GreaterOrEqual(pos, op.Unsqueeze(op.Cast(chunk_lens, to=I64), ints(op, 1))))
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
    return chosen, remaining, eligible, blocks


def _candidate_blocks(op, query, block_max, past_lens, total_lens, block_importance, exact_lens, chunk_lens,
                      superblocks, *, num_heads, kv_num_heads, block_size, top_k, sink_blocks, recent_blocks,
                      group_reduce, importance_fraction):
    """[B, N, S, M] bool: the blocks step 4 may rank (docs/ops.md, hierarchical selection), every
    block where a query's selection is flat.

    ```
    superblock scores per row [B,N,R,S,MS] (R = G query heads with 'none', else 1) -_rank over the
       eligible superblocks-> rank -(* R + r), ReduceMin over R-> turn [B,N,S,MS]
    steps 1-3's chosen blocks [B,N,S,M] -Pad to MS*U, Reshape [..,MS,U], ReduceMax-> preselected superblocks
    value = 1 where preselected, else -turn -_rank-> < count, or preselected -> candidate superblocks
       -Gather(m // U)-> candidate blocks; Or(flat query) -> allowed [B,N,S,M]
    ```
    """
    super_max, super_min, super_exponent, U, factor = superblocks
    G = num_heads // kv_num_heads
    M, MS = dim(op, block_max, 2), dim(op, super_max, 2)
    pos, valid = positions(op, past_lens, total_lens, dim(op, query, 2))
    chosen, _, _, _ = _preselect(op, query, block_max, pos, valid, block_importance, exact_lens, chunk_lens,
                                 kv_num_heads=kv_num_heads, block_size=block_size, top_k=top_k,
                                 sink_blocks=sink_blocks, recent_blocks=recent_blocks,
                                 importance_fraction=importance_fraction)
    if group_reduce == "none":  # each query head's own superblock bound: G rows per KV head
        scores = _bound_scores(op, query, repeat_heads(op, super_max, G, 4), repeat_heads(op, super_min, G, 4),
                               num_heads, num_heads, "mean",
                               None if super_exponent is None else repeat_heads(op, super_exponent, G, 3))
        rows = G
        scores = op.Reshape(scores, op.Concat(dim(op, query, 0), ints(op, kv_num_heads, G), dim(op, query, 2), MS,
                                              axis=0))  # [B, N, G, S, MS]
    else:
        scores = _bound_scores(op, query, super_max, super_min, num_heads, kv_num_heads, group_reduce, super_exponent)
        rows = 1
        scores = op.Unsqueeze(scores, ints(op, 2))  # [B, N, 1, S, MS]
    current = op.Div(pos, const(op, block_size, np.int64))  # [B, S]
    own_super = op.Unsqueeze(op.Div(current, const(op, U, np.int64)), ints(op, 1, 3))  # [B, 1, S, 1]
    supers = op.Range(const(op, 0, np.int64), op.Squeeze(MS, ints(op, 0)), const(op, 1, np.int64))  # [MS]
    eligible_super = op.LessOrEqual(supers, own_super)  # [B, 1, S, MS]
    turn_shape = op.Concat(op.Shape(scores, end=2), ints(op, rows), op.Shape(scores, start=3), axis=0)
    ranks = _rank(op, scores, op.Expand(op.Unsqueeze(eligible_super, ints(op, 1)), turn_shape), MS)
    row_index = const(op, np.arange(rows, dtype=np.int64).reshape(1, 1, rows, 1, 1), np.int64)
    turn = op.ReduceMin(op.Add(op.Mul(ranks, const(op, rows, np.int64)), row_index), ints(op, 2), keepdims=0)
    padded = op.Pad(op.Cast(chosen, to=I64), op.Concat(ints(op, 0, 0, 0, 0, 0, 0, 0), op.Sub(op.Mul(MS, ints(op, U)), M),
                                                      axis=0))
    chosen_shape = op.Concat(op.Shape(chosen, end=3), MS, ints(op, U), axis=0)
    preselected = op.Greater(op.ReduceMax(op.Reshape(padded, chosen_shape), ints(op, 4), keepdims=0),
                             const(op, 0, np.int64))  # [B, N, S, MS]
    value = op.Where(preselected, const(op, 1.0, np.float32), op.Neg(op.Cast(turn, to=F32)))
    eligible_shape = op.Shape(preselected)
    eligible_super = op.Expand(eligible_super, eligible_shape)
    count = const(op, -(-factor * top_k // U), np.int64)
    candidate = op.And(eligible_super, op.Or(preselected, op.Less(_rank(op, value, eligible_super, MS), count)))
    candidate_blocks = op.Gather(op.Cast(candidate, to=I64),
                                 op.Div(op.Range(const(op, 0, np.int64), op.Squeeze(M, ints(op, 0)),
                                                 const(op, 1, np.int64)), const(op, U, np.int64)), axis=3)
    # Flat: every eligible block fits in top_k, or `count` superblocks cover every eligible one.
    flat = op.Or(op.LessOrEqual(op.Add(current, const(op, 1, np.int64)), const(op, top_k, np.int64)),
                 op.GreaterOrEqual(count, op.Add(op.Div(current, const(op, U, np.int64)), const(op, 1, np.int64))))
    flat = op.Unsqueeze(flat, ints(op, 1, 3))  # [B, 1, S, 1]
    return op.Or(flat, op.Greater(candidate_blocks, const(op, 0, np.int64)))
