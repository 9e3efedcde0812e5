// QuestMetadata kernel interface: parameters and raw pointers, no framework types.
#pragma once

#include <cstdint>
#include <vector>

#include "int8_rows.h"
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
  bool int8_keys = false;     // key_cache_type 'int8': bound each key as the int8 cache stores it
};

// Calls fn(rows) with the item's valid key rows (row i: position past_lens[b] + i) as the bounds
// must hold them: the keys themselves, or with int8_keys each row as an int8 cache stores it,
// dequantized (exactly, as float32) into `scratch`.
template <typename T, typename Fn>
inline void with_bounded_keys(const QuestMetadataParams& prm, int64_t item, std::vector<float>& scratch, Fn&& fn) {
  const int64_t S = prm.new_tokens, D = prm.head_dim, b = item / prm.kv_heads;
  const T* key = static_cast<const T*>(prm.key) + item * S * D;
  if (!prm.int8_keys) return fn(key);
  const int64_t rows = prm.total_lens[b] - prm.past_lens[b];
  scratch.resize(static_cast<size_t>(rows * D));
  std::vector<int8_t> quantized(static_cast<size_t>(D));
  for (int64_t r = 0; r < rows; ++r) {
    const Half scale = quantize_row(key + r * D, D, quantized.data());
    for (int64_t d = 0; d < D; ++d) scratch[r * D + d] = dequantize(quantized[d], scale);
  }
  fn(static_cast<const float*>(scratch.data()));
}

// Updates the metadata of work items [begin, end), one item per (b, n) = b * kv_heads + n.
using QuestMetadataFn = void (*)(const QuestMetadataParams&, int64_t begin, int64_t end);

void quest_metadata_scalar(const QuestMetadataParams& params, int64_t begin, int64_t end);

}  // namespace quest
