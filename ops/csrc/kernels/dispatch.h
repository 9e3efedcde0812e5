// The one dispatch table: which kernel variant runs each op on this CPU.
#pragma once

#include <vector>

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
  // Sums `count` floats as fast as the instruction set streams them: the benchmarks' bandwidth probe.
  float (*read_probe)(const float* data, int64_t count);
};

// The scalar reference kernels, always built.
const KernelTable& scalar_kernels();

// Every variant built into this library that this CPU can run, best first; scalar is last.
std::vector<const KernelTable*> supported_kernels();

// The variant in use, chosen at first call: the one named by the environment variable
// QUEST_ORT_ISA (scalar, avx2, avx512, avx512vnni, neon) when this CPU supports it, else the best supported.
const KernelTable& active_kernels();

}  // namespace quest
