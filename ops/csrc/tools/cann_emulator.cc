// CPU emulation of the Ascend (CANN) kernels: runs one driver case through the tiling plan the NPU
// host code would make, exactly as the plan says, and writes cann.<output>.bin.
//
// Usage: quest_cann_emulator CASE_DIR
// The case folder is the kernel driver's (tools/case_io.h); optional fields npu_cores and
// npu_ub_bytes set the emulated NPU (default: Ascend 910B, 48 vector cores, 192 KB UB), and
// npu_candidate_ub_divisor (plan_types.h) can force the select candidates into the GM workspace.
// Prints one line describing the plan; exits 3 with "unsupported: <reason>" when the NPU path
// refuses the call.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "../cann/emulator/emulated_kernels.h"
#include "calls.h"

using quest::tools::Case;
namespace cann = quest::cann;

namespace {

cann::ElemType elem(quest::DType dtype) { return dtype == quest::DType::F32 ? cann::ElemType::F32 : cann::ElemType::F16; }

int unsupported(const std::string& why) {
  std::printf("unsupported: %s\n", why.c_str());
  return 3;
}

// As the CANN op library: a call with chunk queries is refused (cann::check_chunk_support).
std::string chunk_support(const Case& c, const char* op) {
  const int64_t B = c.integer("B");
  const auto chunk_lens = quest::tools::read_chunk_lens(c, B);
  if (chunk_lens.empty()) return "";
  const auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  const auto exact = quest::tools::read_exact_lens(c, B);
  return cann::check_chunk_support(op, B, c.integer("S"), reinterpret_cast<const int32_t*>(past.data()),
                                   reinterpret_cast<const int32_t*>(total.data()), quest::tools::lens_or_null(exact),
                                   quest::tools::lens_or_null(chunk_lens));
}

void print_split(const cann::CoreSplit& split) {
  std::printf("cores %d items %lld", split.cores, static_cast<long long>(split.items));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CASE_DIR\n", argv[0]);
    return 2;
  }
  try {
    const Case c = quest::tools::load_case(argv[1]);
    cann::NpuSpec npu;
    if (c.has("npu_cores")) npu.vector_cores = static_cast<int32_t>(c.integer("npu_cores"));
    if (c.has("npu_ub_bytes")) npu.ub_bytes = c.integer("npu_ub_bytes");
    if (c.has("npu_candidate_ub_divisor")) npu.candidate_ub_divisor = c.integer("npu_candidate_ub_divisor");
    const std::string op = c.text("op");
    // As the CANN op library (cann/ort/cann_ops.cc): int8 block bounds have no NPU kernel.
    if ((op == "QuestMetadata" || op == "SparseBlockSelect") && c.dtype("TC") == quest::DType::I8)
      return unsupported("int8 block bounds are not supported on CANN: its kernels take float bounds only");
    if (op == "QuestMetadata") {
      // As the CANN QuestMetadata kernel (cann/ort/cann_ops.cc): its bounds are of the keys as given.
      if (c.has("key_cache_type") && c.text("key_cache_type") != "float")
        return unsupported("key_cache_type '" + c.text("key_cache_type") +
                           "' is not supported on CANN: its kernels take float caches only");
      cann::MetadataShape shape{c.integer("B"), c.integer("N"), c.integer("S"), c.integer("D"), c.integer("M"),
                                c.integer("P"), elem(c.dtype("T")), elem(c.dtype("TC"))};
      const auto planned = cann::plan_metadata(shape, npu);
      if (!planned.ok) return unsupported(planned.error);
      quest::tools::run_metadata(c, "cann", [&](auto& p) { cann::emulate_metadata(planned.plan, npu, p); });
      print_split(planned.plan.split);
      std::printf(" rows_per_chunk %lld ub_used %lld\n", static_cast<long long>(planned.plan.rows_per_chunk),
                  static_cast<long long>(planned.plan.ub_used));
    } else if (op == "SparseBlockSelect") {
      const std::string why = cann::check_select_support(c.text("score"), c.text("group_reduce"));
      if (!why.empty()) return unsupported(why);
      if (c.has("with_superblocks") && c.integer("with_superblocks")) return unsupported(cann::kNoHierarchicalSelect);
      const std::string chunks = chunk_support(c, "SparseBlockSelect");
      if (!chunks.empty()) return unsupported(chunks);
      cann::SelectShape shape{c.integer("B"), c.integer("H"), c.integer("N"), c.integer("S"), c.integer("D"),
                              c.integer("M"), c.integer("P"), c.integer("K"), c.integer("sink_blocks"),
                              c.integer("recent_blocks"), c.text("group_reduce") == "max",
                              c.integer("with_importance") != 0, c.real("importance_fraction"),
                              elem(c.dtype("T")), elem(c.dtype("TC"))};
      const auto planned = cann::plan_select(shape, npu);
      if (!planned.ok) return unsupported(planned.error);
      quest::tools::run_select(c, "cann", [&](auto& p) {
        // As the CANN op library: without chunk queries the chunks' rows are all -1 (a memset of 0xFF).
        if (p.chunk_indices != nullptr)
          std::fill(p.chunk_indices, p.chunk_indices + p.batch * p.kv_heads * quest::num_chunks(p) * p.chunk_top_k, -1);
        cann::emulate_select(planned.plan, npu, p);
      });
      print_split(planned.plan.split);
      std::printf(" blocks_per_chunk %lld candidates_in_ub %d ub_used %lld\n",
                  static_cast<long long>(planned.plan.blocks_per_chunk), planned.plan.candidates_in_ub ? 1 : 0,
                  static_cast<long long>(planned.plan.ub_used));
    } else if (op == "SparseBlockAttention") {
      // int8 caches have no NPU kernel (only float16 caches are registered there): the CPU op runs them.
      if (c.dtype("TC") == quest::DType::I8) return unsupported("int8 caches have no NPU kernel: the CPU op runs them");
      cann::AttentionShape shape{c.integer("B"), c.integer("H"), c.integer("N"), c.integer("S"), c.integer("D"),
                                 c.integer("C"), c.integer("P"), c.integer("K"), elem(c.dtype("T")),
                                 elem(c.dtype("TC")), c.real("softcap"), c.has("wants_importance") && c.integer("wants_importance"),
                                 c.integer("K") > 0 && c.integer("R") != c.integer("N")};
      std::string why = chunk_support(c, "SparseBlockAttention");
      if (why.empty()) why = cann::check_attention_support(shape);
      if (!why.empty()) return unsupported(why);
      quest::tools::run_attention(c, "cann", [&](auto& p) { cann::emulate_attention(shape, p); });
      std::printf("fia rows %lld\n", static_cast<long long>(shape.batch * shape.kv_heads * shape.query_len));
    } else {
      throw std::runtime_error("unknown op " + op);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quest_cann_emulator: %s\n", e.what());
    return 1;
  }
  return 0;
}
