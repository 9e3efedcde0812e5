// SparseBlockSelect kernel interface: parameters and raw pointers, no framework types.
#pragma once

#include <cstdint>

#include "types.h"

namespace quest {

// Mean/Max: one selection per KV head for its G query heads; None: one per query head (its own bound).
enum class GroupReduce { Mean, Max, None };
enum class ScoreMode { Bound, Probe };

struct SparseBlockSelectParams {
  int64_t batch = 0, num_heads = 0, kv_heads = 0, query_len = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0, top_k = 0, sink_blocks = 0, recent_blocks = 0;
  GroupReduce reduce = GroupReduce::Mean;
  ScoreMode score = ScoreMode::Bound;
  int64_t num_probes = 8;  // keys read per block by ScoreMode::Probe
  int64_t capacity = 0;    // C of key_cache (probe only)
  float importance_fraction = 0.0f;
  const int32_t* past_lens = nullptr;         // [B]
  const int32_t* total_lens = nullptr;        // [B], resolved (never null), validated by the adapter
  const int32_t* exact_lens = nullptr;        // [B] or null: queries below attend exactly, select nothing
  const float* block_importance = nullptr;    // [B, N, M] or null
  DType query_type = DType::F32, cache_type = DType::F32;
  const void* query = nullptr;      // [B, H, S, D] query_type
  const void* block_max = nullptr;  // [B, N, M, D] cache_type
  const void* block_min = nullptr;  // [B, N, M, D] cache_type
  const int8_t* block_exponent = nullptr;  // [B, N, M] with int8 bounds (cache_type I8), else null
  const void* key_cache = nullptr;  // [B, N, C, D] cache_type: the cache before this call (probe only)
  const void* key = nullptr;        // [B, N, S, D] query_type: this call's new keys (probe only)
  int32_t* block_indices = nullptr;  // [B, R, S, K] output: R = N, or H with GroupReduce::None
  // Chunk queries (sparse prefill): valid queries at positions in [exact_lens, chunk_lens) select one
  // list per chunk of chunk_size queries of the call and KV head, into chunk_indices.
  const int32_t* chunk_lens = nullptr;  // [B] validated, or null: no chunk queries
  int64_t chunk_size = 64, chunk_top_k = 0, chunk_window = 0, chunk_sink = 0, chunk_pool = 1;
  int64_t chunk_floor = 0;  // with top_k, the fewest blocks a chunk selects by score (0: top_k alone)
  float chunk_share = 0.0f;
  int32_t* chunk_indices = nullptr;  // [B, N, ceil(S / chunk_size), chunk_top_k] output, or null
  // Hierarchical selection (docs/ops.md): a per-token query ranks only the blocks of candidate
  // superblocks, chosen by their bounds; null super_max: the flat selection.
  const void* super_max = nullptr;         // [B, N, MS, D] cache_type
  const void* super_min = nullptr;         // [B, N, MS, D] cache_type
  const int8_t* super_exponent = nullptr;  // [B, N, MS] with int8 bounds, else null
  int64_t num_superblocks = 0, superblock_size = 8, candidate_factor = 16;
};

// Candidate superblocks a hierarchical query keeps: ceil(candidate_factor * top_k / superblock_size).
inline int64_t candidate_superblocks(const SparseBlockSelectParams& prm) {
  const int64_t U = prm.superblock_size, most = INT64_MAX - U;
  if (prm.candidate_factor > most / prm.top_k) return most / U;  // more than any cache holds
  return (prm.candidate_factor * prm.top_k + U - 1) / U;
}

// True when the per-token query whose own block is `current` selects hierarchically: superblocks
// are given, its eligible blocks exceed top_k and the candidates would not cover every eligible
// superblock (else its selection is the flat one, exactly).
inline bool selects_hierarchically(const SparseBlockSelectParams& prm, int64_t current) {
  return prm.super_max != nullptr && current + 1 > prm.top_k &&
         candidate_superblocks(prm) < current / prm.superblock_size + 1;
}

inline int64_t num_chunks(const SparseBlockSelectParams& prm) {
  return (prm.query_len + prm.chunk_size - 1) / prm.chunk_size;
}

// Selections per (b, n) work item: G with GroupReduce::None (one per query head), else 1.
inline int64_t selections_per_item(const SparseBlockSelectParams& prm) {
  return prm.reduce == GroupReduce::None ? prm.num_heads / prm.kv_heads : 1;
}

// Positions of `block` a query at `p` attends: min(P, p + 1 - block * P).
inline int64_t probe_span(int64_t block, int64_t p, int64_t P) {
  const int64_t n = p + 1 - block * P;
  return n < P ? n : P;
}
// The positions the probe policy reads in `block` for a query at `p`: all attended positions when
// there are at most num_probes, else num_probes evenly spaced ones (first + j * n / num_probes).
inline int64_t probe_count(int64_t block, int64_t p, int64_t P, int64_t num_probes) {
  const int64_t n = probe_span(block, p, P);
  return n < num_probes ? n : num_probes;
}
inline int64_t probe_position(int64_t block, int64_t p, int64_t P, int64_t num_probes, int64_t j) {
  const int64_t n = probe_span(block, p, P);
  return n <= num_probes ? block * P + j : block * P + (j * n) / num_probes;
}

// True when the query at position p of row b selects nothing per token (its block_indices rows are
// all -1): it attends exactly (below exact_lens), or with its chunk (below chunk_lens).
inline bool selects_no_blocks(const SparseBlockSelectParams& prm, int64_t b, int64_t p) {
  return (prm.exact_lens != nullptr && p < prm.exact_lens[b]) || (prm.chunk_lens != nullptr && p < prm.chunk_lens[b]);
}

// The members of chunk c of row b: its call indices [first, last) that select with the chunk (valid,
// at positions in [exact_lens, chunk_lens)); first >= last when it has none.
struct ChunkMembers {
  int64_t first, last;
};
inline ChunkMembers chunk_members(const SparseBlockSelectParams& prm, int64_t b, int64_t c) {
  const int64_t past = prm.past_lens[b];
  const int64_t exact = prm.exact_lens != nullptr ? prm.exact_lens[b] : 0;
  const int64_t end = prm.chunk_lens[b] < prm.total_lens[b] ? prm.chunk_lens[b] : prm.total_lens[b];
  int64_t first = c * prm.chunk_size, last = first + prm.chunk_size;
  if (first < exact - past) first = exact - past;
  if (last > end - past) last = end - past;
  if (last > prm.query_len) last = prm.query_len;
  return {first, last};
}

// Selects for work items [begin, end), one item per (b, n) = b * kv_heads + n.
using SparseBlockSelectFn = void (*)(const SparseBlockSelectParams&, int64_t begin, int64_t end);

void sparse_block_select_scalar(const SparseBlockSelectParams& params, int64_t begin, int64_t end);

}  // namespace quest
