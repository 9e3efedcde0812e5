// QuestMetadata over 16-lane vectors: merge each valid key, rounded to the cache type, into its block.
#pragma once

#include "../quest_metadata.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

template <typename T, typename TC>
void quest_metadata_items(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.new_tokens, D = prm.head_dim, M = prm.num_blocks, P = prm.block_size;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads;
    const T* key = static_cast<const T*>(prm.key) + item * S * D;
    TC* block_max = static_cast<TC*>(prm.block_max) + item * M * D;
    TC* block_min = static_cast<TC*>(prm.block_min) + item * M * D;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    for (int64_t p = past; p < total; ++p) {
      const T* k = key + (p - past) * D;
      TC* hi = block_max + (p / P) * D;
      TC* lo = block_min + (p / P) * D;
      const bool first = p % P == 0;
      for (int64_t d = 0; d < D; d += kChunk) {
        const Lanes x = round_to<TC>(load_row(k, d, D));
        store_row(first ? x : Lanes::max_select(load_row(hi, d, D), x), hi, d, D);
        store_row(first ? x : Lanes::min_select(load_row(lo, d, D), x), lo, d, D);
      }
    }
  }
}

}  // namespace quest::QUEST_ISA
