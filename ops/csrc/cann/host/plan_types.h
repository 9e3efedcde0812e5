// The tiling plans of the Ascend kernels as plain data: what the host computes (tiling.h) and the
// kernels receive by value. Only <cstdint>, so the AscendC compiler takes it as it is.
#pragma once

#include <cstdint>

#if defined(__CCE_AICORE__) || defined(__CCE_KT_TEST__) || defined(ASCENDC_CPU_DEBUG)
#define QUEST_PLAN_FN __aicore__ inline
#else
#define QUEST_PLAN_FN inline
#endif

namespace quest::cann {

// What the tiling needs to know of the NPU. Defaults: Ascend 910B1/B2 (48 vector cores, 192 KB
// UB per vector core); the host code reads the real values from the platform at run time.
struct NpuSpec {
  int32_t vector_cores = 48;
  int64_t ub_bytes = 192 * 1024;
  // The select candidates stay in UB while they take at most ub_bytes / this; else they live in a
  // GM workspace (tests raise it to force that path).
  int64_t candidate_ub_divisor = 4;
};

inline constexpr int64_t kUbAlign = 32;  // UB addresses and DataCopy granularity, bytes
inline constexpr int64_t kLanes = 16;    // the canonical score lanes (docs/ops.md)

enum class ElemType : int32_t { F32 = 0, F16 = 1, BF16 = 2 };

// A contiguous split of `items` work items over `cores` cores: the first `extra` cores take
// `base + 1` items, the others `base`.
struct CoreSplit {
  int64_t items = 0;
  int32_t cores = 0;
  int64_t base = 0, extra = 0;
  QUEST_PLAN_FN int64_t begin(int32_t core) const { return core * base + (core < extra ? core : extra); }
  QUEST_PLAN_FN int64_t end(int32_t core) const { return begin(core) + base + (core < extra ? 1 : 0); }
};

// One buffer in a core's UB: byte offset and size, both multiples of kUbAlign.
struct UbSlice {
  int64_t offset = 0, bytes = 0;
};

struct MetadataShape {
  int64_t batch, kv_heads, new_tokens, head_dim, num_blocks, block_size;
  ElemType key_type, cache_type;
};

// QuestMetadata: one work item per (b, n). Within an item the blocks this call touches, in order;
// within a block its new key rows, `rows_per_chunk` at a time (double-buffered).
struct MetadataPlan {
  MetadataShape shape;
  CoreSplit split;
  int64_t dim_padded;      // D rounded up to 16 elements: whole 32-byte UB rows for every dtype
  int64_t rows_per_chunk;  // key rows per UB load, 1..P
  UbSlice keys[2];         // [rows_per_chunk, dim_padded] key_type, double-buffered
  UbSlice keys_f32;        // the same rows as float32 (each rounded outward through the bounds dtype in turn)
  UbSlice acc_max, acc_min;  // the block's running max / min, [dim_padded] float32
  UbSlice out_max, out_min;  // the block's max / min in the cache dtype, for the copy out
  int64_t ub_used;
};

struct SelectShape {
  int64_t batch, num_heads, kv_heads, query_len, head_dim, num_blocks, block_size, top_k;
  int64_t sink_blocks, recent_blocks;
  bool reduce_max, has_importance;
  float importance_fraction;
  ElemType query_type, cache_type;
};

// SparseBlockSelect (bound score): one work item per (b, n, query position). The item's eligible
// blocks are scored `blocks_per_chunk` at a time; a running best-K list on the scalar unit keeps
// the candidates (in UB when it fits, else in a per-core GM workspace).
struct SelectPlan {
  SelectShape shape;
  CoreSplit split;
  int64_t dim_padded;        // D rounded up to 16 lanes; the padding is +0.0 (it leaves lanes unchanged)
  int64_t query_rows;        // G with max reduction, 1 with mean
  int64_t blocks_per_chunk;  // 1..M, a multiple of 8 unless M is smaller
  UbSlice query;             // [query_rows, dim_padded] float32
  UbSlice bounds[2];         // [2 (max, min), blocks_per_chunk, dim_padded] cache dtype, double-buffered
  UbSlice bounds_f32;        // [2, blocks_per_chunk, dim_padded] float32
  UbSlice products;          // [2, blocks_per_chunk, dim_padded] float32: q*max, q*min
  UbSlice lanes;             // [blocks_per_chunk, 16] float32
  UbSlice best_scores;       // [blocks_per_chunk] float32 (max over the query rows)
  UbSlice importance;        // [blocks_per_chunk] float32
  UbSlice chosen;            // [top_k] int32: forced and importance blocks, then the result
  UbSlice candidate_scores;  // [top_k] float32, when candidates_in_ub
  UbSlice candidate_blocks;  // [top_k] int32, when candidates_in_ub
  bool candidates_in_ub;
  int64_t workspace_bytes;   // GM workspace for all cores (0 when candidates_in_ub)
  int64_t ub_used;
};

}  // namespace quest::cann
