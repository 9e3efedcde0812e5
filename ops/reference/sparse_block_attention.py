"""NumPy reference of SparseBlockAttention: cache write, then causal attention over chosen blocks."""

from __future__ import annotations

import numpy as np

from ._common import resolve_exact_lens, resolve_total_lens, valid_positions
from .int8_rows import dequantize_rows, quantize_rows


def attended_positions(row_indices, p, block_size):
    """Cache positions t <= p inside the chosen blocks (every t <= p when row_indices is None)."""
    if row_indices is None:
        return np.arange(p + 1)
    spans = [np.arange(m * block_size, min((m + 1) * block_size, p + 1)) for m in row_indices if m >= 0]
    return np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)


def check_block_indices(block_indices, num_blocks, num_heads, kv_num_heads):
    """Rows per KV head (R = N) or per query head (R = H); entries -1 or a block in
    [0, num_blocks), with no block twice in one row."""
    if block_indices is None:
        return
    if block_indices.shape[1] not in (kv_num_heads, num_heads):
        raise ValueError(f"block_indices dim 1 is {block_indices.shape[1]}: expected N = {kv_num_heads} "
                         f"or H = {num_heads}")
    flat = np.asarray(block_indices).reshape(-1, block_indices.shape[-1])
    if ((flat < -1) | (flat >= num_blocks)).any():
        raise ValueError(f"block_indices must lie in [-1, {num_blocks})")
    for row in flat:
        chosen = row[row >= 0]
        if np.unique(chosen).size != chosen.size:
            raise ValueError(f"block_indices repeats a block in row {row.tolist()}")


def check_chunk_inputs(chunk_indices, chunk_lens, total, num_blocks, kv_num_heads, new_tokens, chunk_size):
    """chunk_lens resolved ([B], 0 when absent): chunk_indices and chunk_lens come together, one row of
    blocks per KV head and chunk of the call (NC = ceil(S / chunk_size)), entries as block_indices'."""
    if (chunk_indices is None) != (chunk_lens is None):
        raise ValueError("chunk_indices and chunk_lens come together: give both or neither")
    chunked = resolve_exact_lens(chunk_lens, total, "chunk_lens")
    if chunk_indices is None:
        return chunked
    chunks = -(-new_tokens // chunk_size)
    if chunk_indices.shape[1] != kv_num_heads or chunk_indices.shape[2] != chunks:
        raise ValueError(f"chunk_indices must be [B, N = {kv_num_heads}, NC = ceil(S / chunk_size) = {chunks}, KC], "
                         f"got {list(chunk_indices.shape)}")
    check_block_indices(chunk_indices, num_blocks, kv_num_heads, kv_num_heads)
    return chunked


FLOAT32_MAX = float(np.finfo(np.float32).max)


def softmax_rows(logits):
    """(weights, nan_rows) of logits [rows, n]: a row with a NaN or +inf logit, or only -inf ones,
    is a NaN row (all its weights NaN); elsewhere -inf logits weigh 0. Non-finite numbers: docs/ops.md."""
    nan_rows = np.isnan(logits).any(axis=1) | np.isposinf(logits).any(axis=1) | np.isneginf(logits).all(axis=1)
    usable = np.where(nan_rows[:, None], 0.0, logits)
    with np.errstate(invalid="ignore"):
        weights = np.exp(usable - usable.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    weights[nan_rows] = np.nan
    return weights, nan_rows


def default_scale(head_dim: int) -> np.float32:
    """1/sqrt(D) as the kernels compute it, in float32."""
    return np.float32(1.0) / np.sqrt(np.float32(head_dim))


def sparse_block_attention(
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
    num_heads,
    kv_num_heads,
    block_size,
    scale=0.0,
    softcap=0.0,
    chunk_size=64,
):
    """Return (output [B,S,H*D], key_cache_out, value_cache_out, block_importance [B,N,ceil(C/P)]),
    and with int8 caches also (key_scale_out, value_scale_out): the op's outputs in order.

    A query attends exactly (every position up to its own) when its position is below exact_lens[b];
    else, below chunk_lens[b], the positions of its chunk's blocks (chunk_indices[b, n, i // chunk_size],
    shared by the G heads); else those of its own blocks (block_indices), or exactly without them.

    Attention is computed in float64 on the values the caches hold (new keys and values rounded to
    the cache dtype, or quantized into int8 rows and dequantized), so the kernels' float32
    arithmetic is measured against the exact result.
    """
    B, H, S, D = query.shape
    N, C = kv_num_heads, key_cache.shape[2]
    G, P = H // N, block_size
    M = -(-C // P)
    assert H == num_heads and H % N == 0
    total = resolve_total_lens(past_lens, total_lens, S, C, "the cache capacity C")
    check_block_indices(block_indices, M, H, N)
    exact = resolve_exact_lens(exact_lens, total)
    chunked = check_chunk_inputs(chunk_indices, chunk_lens, total, M, N, S, chunk_size)
    per_head = block_indices is not None and block_indices.shape[1] == H
    int8 = key_cache.dtype == np.int8
    if int8 != (key_scale is not None and value_scale is not None):
        raise ValueError("key_scale and value_scale are required with int8 caches, and only with them")
    kc, vc = key_cache.copy(), value_cache.copy()
    ks, vs = (key_scale.copy(), value_scale.copy()) if int8 else (None, None)
    for b in range(B):
        for i, p in valid_positions(int(past_lens[b]), int(total[b])):
            if int8:
                kc[b, :, p], ks[b, :, p] = quantize_rows(key[b, :, i])
                vc[b, :, p], vs[b, :, p] = quantize_rows(value[b, :, i])
            else:
                kc[b, :, p] = key[b, :, i].astype(kc.dtype)
                vc[b, :, p] = value[b, :, i].astype(vc.dtype)
    scale = np.float64(default_scale(D) if scale == 0.0 else np.float32(scale))
    q64 = query.astype(np.float64)
    if int8:  # float64 of an exact float32 product: the values the rows hold
        k64, v64 = dequantize_rows(kc, ks).astype(np.float64), dequantize_rows(vc, vs).astype(np.float64)
    else:
        k64, v64 = kc.astype(np.float64), vc.astype(np.float64)
    out = np.zeros((B, S, H * D), dtype=np.float64)
    importance = np.zeros((B, N, M), dtype=np.float64)
    for b in range(B):
        for i, p in valid_positions(int(past_lens[b]), int(total[b])):
            # Query heads that share their blocks: a KV head's G heads, or each head alone (per_head).
            for first in range(0, H, 1 if per_head else G):
                heads, n = slice(first, first + (1 if per_head else G)), first // G
                if p < exact[b]:
                    row = None  # every position up to p
                elif p < chunked[b]:
                    row = chunk_indices[b, n, i // chunk_size]
                else:
                    row = None if block_indices is None else block_indices[b, first if per_head else n, i]
                pos = attended_positions(row, p, P)
                if pos.size == 0:
                    continue
                with np.errstate(invalid="ignore", over="ignore"):
                    logits = q64[b, heads, i] @ k64[b, n, pos].T * scale  # [heads, len(pos)]
                logits[np.abs(logits) > FLOAT32_MAX] *= np.inf  # beyond float32: infinite, as the kernels see it
                if softcap > 0.0:
                    logits = softcap * np.tanh(logits / softcap)
                weights, nan_rows = softmax_rows(logits)
                values = v64[b, n, pos]
                nonfinite = ~np.isfinite(values)  # [len(pos), D]
                rows = weights @ np.where(nonfinite, 0.0, values)  # [heads, D]
                rows[:, nonfinite.any(axis=0)] = np.nan
                rows[nan_rows] = np.nan
                out[b, i, heads.start * D : heads.stop * D] = rows.reshape(-1)
                np.add.at(importance[b, n], pos // P, weights.sum(axis=0))
    # NaN outputs are the positive quiet NaN with no payload (what np.nan is), as every kernel writes.
    outputs = (out.astype(query.dtype), kc, vc, importance.astype(np.float32))
    return (*outputs, ks, vs) if int8 else outputs
