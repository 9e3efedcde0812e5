// QuestMetadata kernel interface: parameters and raw pointers, no framework types.
#pragma once

#include <cstdint>

#include "types.h"

namespace quest {

struct QuestMetadataParams {
  int64_t batch = 0, kv_heads = 0, new_tokens = 0, head_dim = 0, num_blocks = 0, block_size = 0;
  const int32_t* past_lens = nullptr;   // [B]
  const int32_t* total_lens = nullptr;  // [B], resolved (never null), validated by the adapter
  DType key_type = DType::F32, cache_type = DType::F32;
  const void* key = nullptr;  // [B, N, S, D] key_type
  void* block_max = nullptr;  // [B, N, M, D] cache_type, updated in place
  void* block_min = nullptr;  // [B, N, M, D] cache_type, updated in place
  // [B, N, M] with int8 bounds (cache_type I8; docs/ops.md, int8 block bounds), updated in place; else null.
  int8_t* block_exponent = nullptr;
  bool int8_keys = false;     // key_cache_type 'int8': bound each key as the int8 cache stores it
};

// One work item's slices: its new keys [S, D], its block bounds [M, D], its row's lengths.
template <typename T, typename TC>
struct QuestMetadataItem {
  const T* key;
  TC* block_max;
  TC* block_min;
  int8_t* exponent;  // [M] with int8 bounds, else null
  int64_t past, total;

  QuestMetadataItem(const QuestMetadataParams& prm, int64_t item)
      : key(static_cast<const T*>(prm.key) + item * prm.new_tokens * prm.head_dim),
        block_max(static_cast<TC*>(prm.block_max) + item * prm.num_blocks * prm.head_dim),
        block_min(static_cast<TC*>(prm.block_min) + item * prm.num_blocks * prm.head_dim),
        exponent(prm.block_exponent ? prm.block_exponent + item * prm.num_blocks : nullptr),
        past(prm.past_lens[item / prm.kv_heads]),
        total(prm.total_lens[item / prm.kv_heads]) {}
};

// Updates the metadata of work items [begin, end), one item per (b, n) = b * kv_heads + n.
using QuestMetadataFn = void (*)(const QuestMetadataParams&, int64_t begin, int64_t end);

void quest_metadata_scalar(const QuestMetadataParams& params, int64_t begin, int64_t end);

}  // namespace quest
