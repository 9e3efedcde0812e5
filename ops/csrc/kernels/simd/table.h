// The kernel table of one instruction set: its generic kernels, instantiated per (T, TC).
#pragma once

#include "../dispatch.h"
#include "quest_metadata.h"
#include "read_probe.h"
#include "sparse_block_attention.h"
#include "sparse_block_select.h"

namespace quest::QUEST_ISA {

inline void quest_metadata(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.key_type, prm.cache_type,
                    [&]<typename T, typename TC>() { quest_metadata_items<T, TC>(prm, begin, end); });
}

inline void sparse_block_select(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.query_type, prm.cache_type,
                    [&]<typename T, typename TC>() { sparse_block_select_items<T, TC>(prm, begin, end); });
}

inline void write_cache_tokens(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.activation_type, prm.cache_type,
                    [&]<typename T, typename TC>() { write_cache_items<T, TC>(prm, begin, end); });
}

inline void sparse_block_attention(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.activation_type, prm.cache_type,
                    [&]<typename T, typename TC>() { attention_items<T, TC>(prm, begin, end); });
}

inline KernelTable make_table(const char* name) {
  return KernelTable{name, quest_metadata, sparse_block_select, write_cache_tokens, sparse_block_attention, read_probe};
}

}  // namespace quest::QUEST_ISA
