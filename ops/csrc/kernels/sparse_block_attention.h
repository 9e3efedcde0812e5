// SparseBlockAttention kernel interface: cache write and attention, raw pointers, no framework types.
#pragma once

#include <cstdint>

#include "types.h"

namespace quest {

struct SparseBlockAttentionParams {
  int64_t batch = 0, num_heads = 0, kv_heads = 0, query_len = 0, head_dim = 0;
  int64_t capacity = 0, block_size = 0, num_blocks = 0;  // num_blocks = ceil(capacity / block_size)
  int64_t top_k = 0;                                     // columns of block_indices; 0 when dense
  float scale = 0.0f, softcap = 0.0f;                    // scale already resolved (never 0)
  const int32_t* past_lens = nullptr;      // [B]
  const int32_t* total_lens = nullptr;     // [B], resolved (never null), validated by the adapter
  const int32_t* block_indices = nullptr;  // [B, R, S, K] validated, or null for dense causal
  const int32_t* exact_lens = nullptr;     // [B] validated, or null: positions below attend exactly
  // Chunk queries (sparse prefill): queries at positions in [exact_lens, chunk_lens) attend the blocks
  // of their chunk (call index i / chunk_size), one list per KV head shared by its G heads.
  const int32_t* chunk_indices = nullptr;  // [B, N, num_chunks, chunk_top_k] validated, or null
  const int32_t* chunk_lens = nullptr;     // [B] validated (null exactly when chunk_indices is)
  int64_t chunk_size = 64, num_chunks = 0, chunk_top_k = 0;
  bool per_head_indices = false;           // R = H (each query head its own blocks), else R = N
  DType activation_type = DType::F32, cache_type = DType::F32;
  const void* query = nullptr;  // [B, H, S, D] activation_type
  const void* key = nullptr;    // [B, N, S, D] activation_type (new tokens)
  const void* value = nullptr;  // [B, N, S, D] activation_type (new tokens)
  void* key_cache = nullptr;    // [B, N, C, D] cache_type: the output cache, written in place
  void* value_cache = nullptr;  // [B, N, C, D] cache_type: the output cache, written in place
  Half* key_scale = nullptr;    // [B, N, C] the int8 key cache's row scales, written in place; else null
  Half* value_scale = nullptr;  // [B, N, C] the int8 value cache's row scales, written in place; else null
  void* output = nullptr;       // [B, S, H * D] activation_type
  float* block_importance = nullptr;  // [B, N, num_blocks] or null; zeroed and filled per item
  // Queries per work unit (0: a unit is a whole item). With block_importance, 0: an item's masses
  // are summed by the one unit that holds all its queries.
  int64_t query_chunk = 0;
};

// Query tiles of the exact walk: about 256 rows of a query's G heads, whole queries (each key and
// value row read once per tile; 64 rows measured about 9% slower on a 4K prefill, their state in L1
// gaining less than the rereads cost).
inline int64_t exact_tile_queries(int64_t group) { return group >= 256 ? 1 : 256 / group; }

// One work item's caches: its rows and, for int8 caches, each row's scale (null for float caches).
template <typename TC>
struct ItemCaches {
  const TC* keys;
  const TC* values;
  const Half* key_scales;
  const Half* value_scales;
};

template <typename TC>
inline ItemCaches<TC> item_caches(const SparseBlockAttentionParams& params, int64_t item) {
  const int64_t C = params.capacity, D = params.head_dim;
  const bool int8 = params.key_scale != nullptr;
  return {static_cast<const TC*>(params.key_cache) + item * C * D,
          static_cast<const TC*>(params.value_cache) + item * C * D, int8 ? params.key_scale + item * C : nullptr,
          int8 ? params.value_scale + item * C : nullptr};
}

// The attention's work units: item u / units_per_item (one (b, n)), queries [first, last) of it.
struct AttentionUnit {
  int64_t item, first, last;
};
inline int64_t units_per_item(const SparseBlockAttentionParams& params) {
  return params.query_chunk > 0 ? (params.query_len + params.query_chunk - 1) / params.query_chunk : 1;
}
inline int64_t attention_units(const SparseBlockAttentionParams& params) {
  return params.batch * params.kv_heads * units_per_item(params);
}
inline AttentionUnit attention_unit(const SparseBlockAttentionParams& params, int64_t unit) {
  const int64_t per_item = units_per_item(params);
  if (per_item == 1) return {unit, 0, params.query_len};
  const int64_t first = unit % per_item * params.query_chunk;
  const int64_t last = first + params.query_chunk < params.query_len ? first + params.query_chunk : params.query_len;
  return {unit / per_item, first, last};
}

// The most cache rows one block can hold: block_size, or the capacity when a block is larger than
// the whole cache. Per-block scratch is sized by this, never by block_size alone (which the
// contract lets reach 2^31 - 1).
inline int64_t rows_per_block(const SparseBlockAttentionParams& params) {
  return params.block_size < params.capacity ? params.block_size : params.capacity;
}

// Query heads of a KV head that attend one list of blocks together: the G heads, or each alone.
inline int64_t heads_per_block_list(const SparseBlockAttentionParams& params) {
  return params.per_head_indices ? 1 : params.num_heads / params.kv_heads;
}

// Queries [0, n) of row b attend exactly (every position up to their own, in tiles of kExactTile):
// all of them without block_indices, else those at positions below exact_lens[b].
inline int64_t exact_queries(const SparseBlockAttentionParams& params, int64_t b) {
  if (params.block_indices == nullptr) return params.query_len;
  if (params.exact_lens == nullptr) return 0;
  const int64_t n = static_cast<int64_t>(params.exact_lens[b]) - params.past_lens[b];
  return n < 0 ? 0 : n < params.query_len ? n : params.query_len;
}

// Queries [exact_queries, n) of row b attend with their chunk: those at positions below chunk_lens[b]
// (n is at least exact_queries, at most S).
inline int64_t chunk_queries_end(const SparseBlockAttentionParams& params, int64_t b) {
  const int64_t exact = exact_queries(params, b);
  if (params.chunk_lens == nullptr) return exact;
  const int64_t n = static_cast<int64_t>(params.chunk_lens[b]) - params.past_lens[b];
  return n < exact ? exact : n < params.query_len ? n : params.query_len;
}

// The block list of chunk c of work item `item` (b * N + n): chunk_top_k entries.
inline const int32_t* chunk_list(const SparseBlockAttentionParams& params, int64_t item, int64_t c) {
  return params.chunk_indices + (item * params.num_chunks + c) * params.chunk_top_k;
}

// The positions of [first, last) inside blocks marked in `listed` (one flag per block), ascending,
// into out; returns how many.
inline int64_t listed_positions(const uint8_t* listed, int64_t P, int64_t first, int64_t last, int64_t* out) {
  int64_t count = 0;
  for (int64_t t = first; t < last;) {
    const int64_t block_end = (t / P + 1) * P < last ? (t / P + 1) * P : last;
    if (listed[t / P])
      for (; t < block_end; ++t) out[count++] = t;
    else
      t = block_end;
  }
  return count;
}

// Marks the blocks of a list (entries -1 skipped) in `listed` [num_blocks], cleared first.
inline void mark_listed(const int32_t* list, int64_t K, int64_t num_blocks, uint8_t* listed) {
  for (int64_t m = 0; m < num_blocks; ++m) listed[m] = 0;
  for (int64_t j = 0; j < K; ++j)
    if (list[j] >= 0) listed[list[j]] = 1;
}

// Writes the valid new keys/values of work items [begin, end), one per (b, n), into the caches.
using CacheWriteFn = void (*)(const SparseBlockAttentionParams&, int64_t begin, int64_t end);
// Attends for work units [begin, end) (attention_unit); the caches must already hold the new
// tokens of every unit's item. A unit that starts its item (query 0) zeroes the item's importance.
using SparseBlockAttentionFn = void (*)(const SparseBlockAttentionParams&, int64_t begin, int64_t end);

void write_cache_tokens_scalar(const SparseBlockAttentionParams& params, int64_t begin, int64_t end);
void sparse_block_attention_scalar(const SparseBlockAttentionParams& params, int64_t begin, int64_t end);

}  // namespace quest
