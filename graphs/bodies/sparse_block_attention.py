"""Standard-op function body of SparseBlockAttention (a portable fallback: it materialises the
[B, N, G, S, C] logits, so it suits short contexts and graph-mode providers, not long prefill).

```
key/value -Cast(TC)-ScatterElements(axis=2) into [cache ; dummy row C]-Slice(:C)-> cache_out
query -Cast(f32)-Reshape[B,N,G,S,D]-MatMul(K^T)*scale-(softcap)-Where(mask, ., -inf)-softmax
   mask = causal (t <= p, valid query) AND (p < exact_lens[b]
          OR (p < chunk_lens[b] ? block(t) in chunk_indices[b, n, s // Q] : block(t) in block_indices[b, n or h, s]))
probabilities -(NaN rows)-MatMul(V, non-finite as 0)-(NaN where attended V non-finite)-Transpose-Reshape[B,S,H*D]-Cast(T)-> output
probabilities -ReduceSum(G, S)-Pad(M*min(P,C))-Reshape[B,N,M,min(P,C)]-ReduceSum-> block_importance
```
Invalid tokens write into the dummy row C, which is sliced away; queries with nothing to attend
output zeros. With int8 caches (key_scale and value_scale given) each new row is quantized
(_building.quantize_rows), its int8 values and float16 scale scattered alike, and the attention
reads the caches dequantized, q * scale, exact in float32:
```
key -quantize_rows-> (q, scale) -ScatterElements-> key_cache_out, key_scale_out -Mul-> K (float32)
```
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ._building import F32, I64, const, dequantize_rows, dim, ints, positions, quantize_rows, write_tokens


def sparse_block_attention_body(
    op,
    query,
    key,
    value,
    key_cache,
    value_cache,
    past_lens,
    block_indices=None,
    total_lens=None,
    exact_lens=None,
    key_scale=None,
    value_scale=None,
    chunk_indices=None,
    chunk_lens=None,
    *,
    num_heads: int,
    kv_num_heads: int,
    block_size: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    chunk_size: int = 64,
    with_importance: bool = False,
):
    G = num_heads // kv_num_heads
    C = dim(op, key_cache, 2)
    S = dim(op, query, 2)
    pos, valid = positions(op, past_lens, total_lens, S)
    if (key_scale is None) != (value_scale is None):
        raise ValueError("SparseBlockAttention: key_scale and value_scale come together (int8 caches)")
    if key_scale is None:
        key_cache_out = write_tokens(op, key_cache, key, pos, valid)
        value_cache_out = write_tokens(op, value_cache, value, pos, valid)
        k, v = op.Cast(key_cache_out, to=F32), op.Cast(value_cache_out, to=F32)
        scale_outputs = []
    else:
        key_cache_out, key_scale_out, k = _write_int8_rows(op, key_cache, key_scale, key, pos, valid)
        value_cache_out, value_scale_out, v = _write_int8_rows(op, value_cache, value_scale, value, pos, valid)
        scale_outputs = [key_scale_out, value_scale_out]

    shape_q = op.Concat(dim(op, query, 0), ints(op, kv_num_heads, G), op.Shape(query, start=2), axis=0)
    q = op.Reshape(op.Cast(query, to=F32), shape_q)  # [B, N, G, S, D]
    k = op.Unsqueeze(k, ints(op, 2))  # [B, N, 1, C, D]
    v = op.Unsqueeze(v, ints(op, 2))
    if scale == 0.0:
        scale_value = op.Div(const(op, 1.0, np.float32), op.Sqrt(op.Cast(dim(op, query, 3), to=F32)))
    else:
        scale_value = const(op, [scale], np.float32)
    logits = op.Mul(op.MatMul(q, op.Transpose(k, perm=[0, 1, 2, 4, 3])), scale_value)  # [B, N, G, S, C]
    if softcap > 0.0:
        cap = const(op, softcap, np.float32)
        logits = op.Mul(cap, op.Tanh(op.Div(logits, cap)))

    cache_rows = op.Range(const(op, 0, np.int64), op.Squeeze(C, ints(op, 0)), const(op, 1, np.int64))  # [C]
    pos_bs1 = op.Unsqueeze(pos, ints(op, 2))  # [B, S, 1]
    mask = op.And(op.LessOrEqual(cache_rows, pos_bs1), op.Unsqueeze(valid, ints(op, 2)))  # [B, S, C]
    mask = op.Unsqueeze(mask, ints(op, 1))  # [B, 1, S, C]
    num_blocks = op.Div(op.Add(C, ints(op, block_size - 1)), ints(op, block_size))
    block_ids = op.Range(const(op, 0, np.int64), op.Squeeze(num_blocks, ints(op, 0)), const(op, 1, np.int64))
    mask = op.Unsqueeze(mask, ints(op, 2))  # [B, 1, 1, S, C]
    if (chunk_indices is None) != (chunk_lens is None):
        raise ValueError("SparseBlockAttention: chunk_indices and chunk_lens come together (chunk queries)")
    row_block = op.Div(cache_rows, const(op, block_size, np.int64))

    def listed(indices, per_query):
        """[B, N, R/N, S, C]: whether cache row t's block is in the query's row of `indices` [B, R, S', K]
        (S' = S, or the chunks, gathered per query by `per_query`)."""
        rows = op.Reshape(op.Cast(indices, to=I64),
                          op.Concat(dim(op, indices, 0), ints(op, kv_num_heads, -1), op.Shape(indices, start=2), axis=0))
        if per_query is not None:
            rows = op.Gather(rows, per_query, axis=3)  # [B, N, R/N, S, K]
        hits = op.Equal(op.Unsqueeze(rows, ints(op, 5)), block_ids)  # [B, N, R/N, S, K, M]
        chosen = op.Cast(op.ReduceMax(op.Cast(hits, to=ir.DataType.INT32), ints(op, 4), keepdims=0), to=ir.DataType.BOOL)
        return op.Gather(chosen, row_block, axis=4)

    def below(lens):  # [B, 1, 1, S, 1]: the queries at positions below lens[b]
        under = op.Less(pos, op.Unsqueeze(op.Cast(lens, to=I64), ints(op, 1)))  # [B, S]
        return op.Reshape(under, op.Concat(dim(op, under, 0), ints(op, 1, 1), dim(op, under, 1), ints(op, 1), axis=0))

    selected = None  # None: every position up to the query's own
    if block_indices is not None:  # rows per KV head (R = N) or per query head (R = H), broadcast over G
        selected = listed(block_indices, None)
    if chunk_indices is not None:  # queries below chunk_lens read their chunk's row, call index i // Q
        steps = op.Range(const(op, 0, np.int64), op.Squeeze(S, ints(op, 0)), const(op, 1, np.int64))
        chunk_rows = listed(chunk_indices, op.Div(steps, const(op, chunk_size, np.int64)))
        chunked = below(chunk_lens)  # (ONNX Runtime's Where takes no booleans: And / Or instead)
        rest = op.Not(chunked) if selected is None else op.And(op.Not(chunked), selected)
        selected = op.Or(op.And(chunked, chunk_rows), rest)
    if selected is not None:
        if exact_lens is not None:  # queries below exact_lens attend every position up to their own
            selected = op.Or(selected, below(exact_lens))
        mask = op.And(mask, selected)

    neg_inf, nan = const(op, -np.inf, np.float32), const(op, np.nan, np.float32)
    zero = const(op, 0.0, np.float32)
    masked = op.Where(mask, logits, neg_inf)
    raw_max = op.ReduceMax(masked, ints(op, -1), keepdims=1)
    row_max = op.Where(op.Equal(raw_max, neg_inf), zero, raw_max)  # rows with nothing to attend
    weights = op.Where(mask, op.Exp(op.Sub(masked, row_max)), zero)
    total = op.ReduceSum(weights, ints(op, -1), keepdims=1)
    probabilities = op.Div(weights, op.Where(op.Greater(total, zero), total, const(op, 1.0, np.float32)))
    # Non-finite numbers (docs/ops.md): a row with an attended NaN or +inf logit, or only -inf ones,
    # is NaN, its weights too (so its blocks' importance); an attended non-finite value makes its
    # output dimension NaN. Unattended positions (masked) never reach the output.
    # (NaN as x != x, infinities by Equal: IsNaN and IsInf are not on CANN's graph-mode list.)
    inf = const(op, np.inf, np.float32)
    nan_rows = op.Or(_any_attended(op, mask, op.Or(op.Not(op.Equal(logits, logits)), op.Equal(logits, inf))),
                     op.And(_any_attended(op, mask, None), op.Equal(raw_max, neg_inf)))  # [B, N, G, S, 1]
    probabilities = op.Where(op.And(nan_rows, mask), nan, probabilities)
    bad_values = op.Or(op.Not(op.Equal(v, v)), op.Equal(op.Abs(v), inf))  # [B, N, 1, C, D]
    attended = op.MatMul(probabilities, op.Where(bad_values, zero, v))  # [B, N, G, S, D]
    bad_outputs = op.Greater(op.MatMul(op.Cast(mask, to=F32), op.Cast(bad_values, to=F32)), zero)
    attended = op.Where(op.Or(nan_rows, bad_outputs), nan, attended)
    merged = op.Reshape(op.Transpose(attended, perm=[0, 3, 1, 2, 4]), op.Concat(op.Shape(query, end=1), S, ints(op, -1), axis=0))
    output = op.CastLike(merged, query)
    outputs = [output, key_cache_out, value_cache_out]
    # The scale outputs follow block_importance, and a function's outputs have no gaps: an int8
    # body computes the importance too (a node that leaves it out never reads it).
    if with_importance or scale_outputs:
        per_row = op.ReduceSum(probabilities, ints(op, 2, 3), keepdims=0)  # [B, N, C]
        # A block longer than the cache is the whole cache (M = 1): rows of min(P, C) positions then
        # make the same blocks, and the padding stays below C (P = 2^31 - 1 would pad to 8 GB).
        rows_per_block = op.Min(ints(op, block_size), C)
        padding = op.Sub(op.Mul(num_blocks, rows_per_block), C)
        padded = op.Pad(per_row, op.Concat(ints(op, 0, 0, 0, 0, 0), padding, axis=0))
        blocks = op.Reshape(padded, op.Concat(op.Shape(per_row, end=2), num_blocks, rows_per_block, axis=0))
        outputs.append(op.ReduceSum(blocks, ints(op, -1), keepdims=0))
    return tuple(outputs + scale_outputs)


def _write_int8_rows(op, cache, scales, new_rows, pos, valid):
    """(cache_out, scales_out, the cache dequantized [B, N, C, D] float32) after quantizing
    new_rows [B, N, S, D] and writing them and their scales at pos."""
    q, scale = quantize_rows(op, new_rows)  # [B, N, S, D] int8, [B, N, S, 1] float16
    cache_out = write_tokens(op, cache, q, pos, valid)
    # The scales as rows of one value: [B, N, C, 1], written as the cache rows are.
    scales_out = op.Squeeze(write_tokens(op, op.Unsqueeze(scales, ints(op, 3)), scale, pos, valid), ints(op, 3))
    return cache_out, scales_out, dequantize_rows(op, cache_out, op.Unsqueeze(scales_out, ints(op, 3)))


def _any_attended(op, mask, flags):
    """[..., S, 1]: whether any attended position (mask) of the row holds a flag (every attended
    position when flags is None)."""
    hits = mask if flags is None else op.And(mask, flags)
    return op.Greater(op.ReduceMax(op.Cast(hits, to=F32), ints(op, -1), keepdims=1), const(op, 0.0, np.float32))
