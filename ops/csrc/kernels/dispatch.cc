// Chooses the kernel variant once per process.
#include "dispatch.h"

namespace quest {

const KernelTable& scalar_kernels() {
  static const KernelTable table{"scalar", quest_metadata_scalar, sparse_block_select_scalar,
                                 write_cache_tokens_scalar, sparse_block_attention_scalar};
  return table;
}

// Only the scalar variant exists so far; SIMD variants register here, chosen by CPU features.
const KernelTable& active_kernels() { return scalar_kernels(); }

}  // namespace quest
