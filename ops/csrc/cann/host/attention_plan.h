// SparseBlockAttention on the NPU through aclnnFusedInferAttentionScore (FIA) with a paged KV
// cache: plain C++ (no CANN header) that decides whether a call can run there and builds the
// compacted block table FIA reads. Shared by the NPU host code and the CPU emulator.
//
//   key_cache [B, N, C, D] seen as pages [B*N*M, P, D]   (M = C / P; page (b*N + n)*M + m)
//
//   FIA row r = (b, n, s): G query heads, one query token, KV heads 1
//     table[r]      = pages of the selected blocks of (b, n, s), ascending, past blocks only (every
//                     block up to the query's own when it attends exactly)
//     kv_length[r]  = tokens those pages hold for position p = past_lens[b] + s: P per full
//                     block, p + 1 - m*P for the query's own block (always the last one taken)
//     zero_output   = p is padding (p >= total_lens[b]) or nothing is selected
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tiling.h"

namespace quest::cann {

struct AttentionShape {
  int64_t batch, num_heads, kv_heads, query_len, head_dim, capacity, block_size, top_k;  // top_k 0: dense
  ElemType activation_type, cache_type;
  float softcap;
  bool wants_importance;
  bool per_head_indices;  // block_indices with a row per query head (R = H != N)
};

// Limits of FIA's paged decode path (CANN 8.x, Atlas A2): block size a multiple of 16 up to 512,
// head dim a multiple of 16 up to 512, float16 or bfloat16, at most 64 query heads per KV head.
inline constexpr int64_t kFiaMaxBlockSize = 512, kFiaMaxHeadDim = 512, kFiaMaxGroup = 64;
inline constexpr int64_t kFiaMaxRows = 65536;  // FIA's batch limit: larger calls are split

// "" when the NPU path runs this call, else the reason (the op reports it; the function-body
// export runs such models through CANN's graph mode instead).
std::string check_attention_support(const AttentionShape& shape);

struct FiaRows {
  int64_t rows = 0, width = 0;        // rows = B*N*S; width = K (sparse) or M (some row exact)
  std::vector<int32_t> table;         // [rows, width] page ids; unused entries repeat a valid page
  std::vector<int64_t> kv_lengths;    // [rows] tokens attended (1 for zero rows: FIA needs > 0)
  std::vector<uint8_t> zero_output;   // [rows] 1: the output of this row's G heads is zero
};

// `indices` [B, N, S, K] validated block indices, or null: every query attends exactly;
// `exact_lens` [B] validated, or null: queries at positions below exact_lens[b] attend exactly.
FiaRows build_fia_rows(const AttentionShape& shape, const int32_t* past_lens, const int32_t* total_lens,
                       const int32_t* indices, const int32_t* exact_lens);

// Rows of SparseBlockSelect's output [B, R, S, K] that belong to queries attending exactly
// (positions below exact_lens): one run (first row, row count) per (b, r) that has any. The NPU
// kernel ranks every query; the host then fills these runs with -1 (a byte memset of 0xFF).
struct RowRun {
  int64_t first, count;
};
std::vector<RowRun> exact_select_rows(int64_t batch, int64_t rows_per_batch, int64_t query_len,
                                      const int32_t* past_lens, const int32_t* exact_lens);

// "" when no valid query of the call is a chunk query (at positions in [exact_lens, chunk_lens): a
// sparse prefill's, docs/ops.md), else why the NPU path refuses the call. `exact_lens`, `chunk_lens`
// [B] validated, or null. Without chunk queries the NPU path runs, and SparseBlockSelect's
// chunk_indices output is all -1.
std::string check_chunk_support(const char* op, int64_t batch, int64_t query_len, const int32_t* past_lens,
                                const int32_t* total_lens, const int32_t* exact_lens, const int32_t* chunk_lens);

}  // namespace quest::cann
