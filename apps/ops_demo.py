"""`quest-ort-demo --ops`: one decode step of one attention layer through the three Quest ops, explained.

The layer has Qwen3-0.6B's attention geometry (16 query heads, 8 KV heads, head dim 128) with a
float16 KV cache holding 32K tokens. A few blocks are planted to match the query, as relevant
context would; the step shows which blocks the query picks, how close the sparse output is to
dense attention, and how many bytes each reads.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

from ..graphs import op_model
from ..ops import native_kernel_isa
from ..runtime.binding import InPlaceStep
from ..runtime.sessions import make_session

H, N, D = 16, 8, 128
G = H // N


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=32768, help="cached tokens before the step")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: all cores)")
    args = parser.parse_args(argv)
    P, K, past = args.block_size, args.top_k, args.context
    C = past + 256
    M = -(-C // P)
    rng = np.random.default_rng(0)
    print(f"quest_ort demo: one decode step, H={H} N={N} D={D}, float16 KV cache of {past} tokens "
          f"(capacity {C}), P={P}, K={K} ({K * P}-token budget); kernels: {native_kernel_isa()}")

    query = rng.standard_normal((1, H, 1, D)).astype(np.float32)
    key_cache = (rng.standard_normal((1, N, C, D)) * 0.5).astype(np.float16)
    value_cache = rng.standard_normal((1, N, C, D)).astype(np.float16)
    planted = sorted(rng.choice(np.arange(2, past // P - 2), size=3, replace=False).tolist())
    for block in planted:  # relevant context: keys aligned with the query of each KV head
        for n in range(N):
            direction = query[0, n * G : (n + 1) * G, 0].mean(0)
            key_cache[0, n, block * P : (block + 1) * P] += (2.0 * direction).astype(np.float16)
    new_key = (rng.standard_normal((1, N, 1, D)) * 0.5).astype(np.float32)
    new_value = rng.standard_normal((1, N, 1, D)).astype(np.float32)
    past_lens = np.array([past], np.int32)

    # Metadata of the cached context, as the prompt's prefill builds it.
    block_max = np.zeros((1, N, M, D), np.float16)
    block_min = np.zeros((1, N, M, D), np.float16)
    build = make_session(op_model("QuestMetadata", dict(key=key_cache[:, :, :past], block_max=block_max,
                                                         block_min=block_min, past_lens=np.zeros(1, np.int32)),
                                  dict(block_size=P)), threads=args.threads)
    aliases = {"block_max_out": "block_max", "block_min_out": "block_min"}
    meta_max, meta_min = ort.OrtValue.ortvalue_from_numpy(block_max), ort.OrtValue.ortvalue_from_numpy(block_min)
    _, ms = _timed(lambda: InPlaceStep(build, aliases).run(
        dict(key=key_cache[:, :, :past], block_max=meta_max, block_min=meta_min,
             past_lens=np.zeros(1, np.int32))))
    print(f"\nprefill metadata: {M} blocks x {N} heads from {past} keys in {ms:.1f} ms")

    # The decode step: metadata update, selection, sparse attention; caches updated in place.
    update = InPlaceStep(make_session(op_model("QuestMetadata", dict(key=new_key, block_max=block_max, block_min=block_min,
                                                                     past_lens=past_lens), dict(block_size=P)),
                                      threads=args.threads), aliases)
    _, ms_update = _timed(lambda: update.run(dict(key=new_key, block_max=meta_max, block_min=meta_min, past_lens=past_lens)))
    select_attributes = dict(num_heads=H, kv_num_heads=N, block_size=P, top_k=K)
    select = make_session(op_model("SparseBlockSelect", dict(query=query, block_max=block_max, block_min=block_min,
                                                             past_lens=past_lens), select_attributes), threads=args.threads)
    (indices,), ms_select = _timed(lambda: select.run(None, dict(query=query, block_max=block_max,
                                                                  block_min=block_min, past_lens=past_lens)))
    attention_inputs = dict(query=query, key=new_key, value=new_value, key_cache=key_cache, value_cache=value_cache,
                            past_lens=past_lens, block_indices=indices)
    attention_attributes = dict(num_heads=H, kv_num_heads=N, block_size=P)
    outputs = ("output", "key_cache_out", "value_cache_out", "block_importance")
    cache_aliases = {"key_cache_out": "key_cache", "value_cache_out": "value_cache"}
    dense_inputs = {**attention_inputs, "block_indices": None}
    dense = InPlaceStep(make_session(op_model("SparseBlockAttention", dense_inputs, attention_attributes, outputs=outputs),
                                     threads=args.threads), cache_aliases)
    sparse = InPlaceStep(make_session(op_model("SparseBlockAttention", attention_inputs, attention_attributes,
                                               outputs=outputs), threads=args.threads), cache_aliases)
    caches = dict(key_cache=ort.OrtValue.ortvalue_from_numpy(key_cache),
                  value_cache=ort.OrtValue.ortvalue_from_numpy(value_cache))
    dense_feeds = {k: v for k, v in {**dense_inputs, **caches}.items() if v is not None}
    # Dense runs first: it writes the new token too (the same row, same value), so both see one cache.
    dense_out, ms_dense = _timed(lambda: dense.run(dense_feeds))
    sparse_out, ms_sparse = _timed(lambda: sparse.run({**attention_inputs, **caches}))

    chosen = indices[0, 0, 0]
    print(f"\ndecode step at position {past}:")
    print(f"  QuestMetadata     updated block {past // P} with the new key              {ms_update:7.2f} ms")
    print(f"  SparseBlockSelect picked {np.count_nonzero(chosen >= 0)} of {past // P + 1} blocks per KV head      {ms_select:7.2f} ms")
    print(f"     KV head 0: {chosen.tolist()}")
    found = [b for b in planted if all(b in indices[0, n, 0] for n in range(N))]
    print(f"     planted relevant blocks {planted}: found by every KV head: {found}")
    print(f"  SparseBlockAttention over {K * P} tokens per head                  {ms_sparse:7.2f} ms")
    print(f"  dense attention (the same op without indices) over {past + 1} tokens   {ms_dense:7.2f} ms")

    difference = sparse_out["output"].astype(np.float64) - dense_out["output"]
    error = np.linalg.norm(difference) / np.linalg.norm(dense_out["output"])
    mass = dense_out["block_importance"][0]  # [N, M]: dense attention mass per block, summed over G heads
    kept = np.mean([mass[n, indices[0, n, 0][indices[0, n, 0] >= 0]].sum() / mass[n].sum() for n in range(N)])
    cache_bytes = 2 * (past + 1) * D * 2 * N
    sparse_bytes = (2 * (past // P + 1) * D * 2 + 2 * K * P * D * 2) * N
    print(f"\nsparse vs dense: relative L2 difference {error:.2%}; "
          f"the selected blocks hold {kept:.1%} of the dense attention mass")
    print(f"bytes read: dense {cache_bytes / 1e6:.1f} MB, sparse {sparse_bytes / 1e6:.1f} MB "
          f"(metadata + selected blocks): {cache_bytes / sparse_bytes:.1f}x less")


if __name__ == "__main__":
    main()
