// The one dispatch table: which kernel variant runs each op on this CPU.
#pragma once

#include "quest_metadata.h"
#include "sparse_block_attention.h"
#include "sparse_block_select.h"

namespace quest {

struct KernelTable {
  const char* isa;
  QuestMetadataFn quest_metadata;
  SparseBlockSelectFn sparse_block_select;
  CacheWriteFn write_cache_tokens;
  SparseBlockAttentionFn sparse_block_attention;
};

// The scalar reference kernels, always built.
const KernelTable& scalar_kernels();

// The variant chosen for this CPU at first use.
const KernelTable& active_kernels();

}  // namespace quest
