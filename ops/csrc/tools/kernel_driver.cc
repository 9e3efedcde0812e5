// Kernel-level test driver: runs one op case through every kernel variant this CPU supports.
//
// Usage: quest_kernel_driver CASE_DIR
// CASE_DIR/case.txt holds "name value" lines (op, activation/cache dtype, dims, attributes);
// inputs are raw little-endian arrays CASE_DIR/<input>.bin. For each variant the driver writes
// CASE_DIR/<variant>.<output>.bin and prints the variant's name. No ONNX Runtime involved: this is
// how the NEON kernels are checked under qemu-aarch64 (tests/kernels/test_kernel_variants.py).
#include <cstdio>
#include <stdexcept>
#include <string>

#include "../kernels/dispatch.h"
#include "calls.h"

using quest::tools::Case;
using quest::tools::load_case;
using quest::tools::run_attention;
using quest::tools::run_metadata;
using quest::tools::run_select;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CASE_DIR\n", argv[0]);
    return 2;
  }
  try {
    const Case c = load_case(argv[1]);
    const std::string op = c.text("op");
    for (const quest::KernelTable* table : quest::supported_kernels()) {
      const quest::KernelTable& k = *table;
      if (op == "QuestMetadata")
        run_metadata(c, k.isa, [&](auto& p) { k.quest_metadata(p, 0, p.batch * p.kv_heads); });
      else if (op == "SparseBlockSelect")
        run_select(c, k.isa, [&](auto& p) { k.sparse_block_select(p, 0, p.batch * p.kv_heads); });
      else if (op == "SparseBlockAttention")
        run_attention(c, k.isa, [&](auto& p) {
          k.write_cache_tokens(p, 0, p.batch * p.kv_heads);
          k.sparse_block_attention(p, 0, p.batch * p.kv_heads);
        });
      else
        throw std::runtime_error("unknown op " + op);
      std::printf("%s\n", table->isa);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quest_kernel_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
