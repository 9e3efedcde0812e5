// The tiling plans of the Ascend kernels (see tiling.h): core splits and UB layouts.
#include "tiling.h"

#include <algorithm>
#include <sstream>

namespace quest::cann {
namespace {

// DataCopyPad moves at most this many rows (blockCount) per call.
constexpr int64_t kMaxCopyRows = 4095;

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Carves 32-byte aligned slices from a core's UB, front to back.
class UbCarver {
 public:
  UbSlice take(int64_t bytes) {
    UbSlice slice{used_, round_up(std::max<int64_t>(bytes, 1), kUbAlign)};
    used_ += slice.bytes;
    return slice;
  }
  int64_t used() const { return used_; }

 private:
  int64_t used_ = 0;
};

std::string too_large(const char* op, int64_t head_dim, int64_t ub_bytes) {
  std::ostringstream message;
  message << op << ": head_dim D = " << head_dim << " does not fit the NPU's unified buffer (" << ub_bytes
          << " bytes per vector core) even one row at a time";
  return message.str();
}

}  // namespace

int64_t elem_bytes(ElemType type) { return type == ElemType::F32 ? 4 : 2; }

CoreSplit split_items(int64_t items, int32_t max_cores) {
  CoreSplit split;
  split.items = items;
  split.cores = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(items, max_cores)));
  split.base = items / split.cores;
  split.extra = items % split.cores;
  return split;
}

Planned<MetadataPlan> plan_metadata(const MetadataShape& shape, const NpuSpec& npu) {
  Planned<MetadataPlan> result;
  MetadataPlan& plan = result.plan;
  plan.shape = shape;
  plan.split = split_items(shape.batch * shape.kv_heads, npu.vector_cores);
  plan.dim_padded = round_up(shape.head_dim, kLanes);
  const int64_t Dp = plan.dim_padded, key = elem_bytes(shape.key_type), cache = elem_bytes(shape.cache_type);
  // Fixed: the running max/min (float32) and their cache-dtype copies for the copy out.
  const int64_t fixed = 2 * round_up(Dp * 4, kUbAlign) + 2 * round_up(Dp * cache, kUbAlign);
  // Per key row: two buffered copies in the key dtype and one float32 copy.
  const int64_t per_row = 2 * Dp * key + Dp * 4;
  const int64_t fits = (npu.ub_bytes - fixed - 3 * kUbAlign) / per_row;
  if (fits < 1) {
    result.error = too_large("QuestMetadata", shape.head_dim, npu.ub_bytes);
    return result;
  }
  plan.rows_per_chunk = std::min({fits, kMaxCopyRows, std::max<int64_t>(1, std::min(shape.block_size, shape.new_tokens))});
  UbCarver ub;
  for (UbSlice& slice : plan.keys) slice = ub.take(plan.rows_per_chunk * Dp * key);
  plan.keys_f32 = ub.take(plan.rows_per_chunk * Dp * 4);
  plan.acc_max = ub.take(Dp * 4);
  plan.acc_min = ub.take(Dp * 4);
  plan.out_max = ub.take(Dp * cache);
  plan.out_min = ub.take(Dp * cache);
  plan.ub_used = ub.used();
  result.error = check_plan(plan, npu.ub_bytes);
  result.ok = result.error.empty();
  return result;
}

std::string check_select_support(const std::string& score, const std::string& group_reduce) {
  const std::string fallback = "; run this model's function-body export";
  if (score != "bound") return "SparseBlockSelect on CANN: score='" + score + "' has no NPU kernel (only 'bound')" + fallback;
  if (group_reduce == "none")
    return "SparseBlockSelect on CANN: group_reduce='none' has no NPU kernel (only 'mean' and 'max')" + fallback;
  return "";
}

Planned<SelectPlan> plan_select(const SelectShape& shape, const NpuSpec& npu) {
  Planned<SelectPlan> result;
  SelectPlan& plan = result.plan;
  plan.shape = shape;
  plan.split = split_items(shape.batch * shape.kv_heads * shape.query_len, npu.vector_cores);
  plan.dim_padded = round_up(shape.head_dim, kLanes);
  plan.query_rows = shape.reduce_max ? shape.num_heads / shape.kv_heads : 1;
  const int64_t Dp = plan.dim_padded, K = shape.top_k, cache = elem_bytes(shape.cache_type);
  // Candidates stay in UB when they take at most a share of it (a quarter by default); else each
  // core keeps them in its slice of a GM workspace (the scalar unit reads both alike).
  const int64_t candidate_bytes = 2 * round_up(K * 4, kUbAlign);
  plan.candidates_in_ub = candidate_bytes <= npu.ub_bytes / npu.candidate_ub_divisor;
  const int64_t fixed = round_up(plan.query_rows * Dp * 4, kUbAlign) + round_up(K * 4, kUbAlign) +
                        (plan.candidates_in_ub ? candidate_bytes : 0);
  // Per block: max and min, double-buffered in the cache dtype, as float32, their two products,
  // 16 lanes, and two floats (best score over the query rows, importance).
  const int64_t per_block = 2 * 2 * Dp * cache + 2 * Dp * 4 + 2 * Dp * 4 + kLanes * 4 + 2 * 4;
  int64_t fits = (npu.ub_bytes - fixed - 11 * kUbAlign) / per_block;
  if (fits < 1) {
    result.error = too_large("SparseBlockSelect", shape.head_dim, npu.ub_bytes);
    return result;
  }
  const int64_t blocks = std::max<int64_t>(1, shape.num_blocks);
  plan.blocks_per_chunk = std::min({fits, blocks, kMaxCopyRows});
  if (plan.blocks_per_chunk < blocks && plan.blocks_per_chunk >= 8) plan.blocks_per_chunk -= plan.blocks_per_chunk % 8;
  const int64_t nb = plan.blocks_per_chunk;
  UbCarver ub;
  plan.query = ub.take(plan.query_rows * Dp * 4);
  for (UbSlice& slice : plan.bounds) slice = ub.take(2 * nb * Dp * cache);
  plan.bounds_f32 = ub.take(2 * nb * Dp * 4);
  plan.products = ub.take(2 * nb * Dp * 4);
  plan.lanes = ub.take(nb * kLanes * 4);
  plan.best_scores = ub.take(nb * 4);
  plan.importance = ub.take(nb * 4);
  plan.chosen = ub.take(K * 4);
  if (plan.candidates_in_ub) {
    plan.candidate_scores = ub.take(K * 4);
    plan.candidate_blocks = ub.take(K * 4);
    plan.workspace_bytes = 0;
  } else {
    plan.workspace_bytes = plan.split.cores * 2 * round_up(K * 4, kUbAlign);
  }
  plan.ub_used = ub.used();
  result.error = check_plan(plan, npu.ub_bytes);
  result.ok = result.error.empty();
  return result;
}

std::string check_slices(const UbSlice* slices, const char* const* names, int count, int64_t ub_bytes) {
  std::ostringstream problems;
  for (int i = 0; i < count; ++i) {
    const UbSlice& a = slices[i];
    if (a.offset % kUbAlign || a.bytes % kUbAlign || a.bytes <= 0)
      problems << names[i] << " is not a positive run of 32-byte units; ";
    if (a.offset < 0 || a.offset + a.bytes > ub_bytes) problems << names[i] << " lies outside the UB; ";
    for (int j = i + 1; j < count; ++j) {
      const UbSlice& b = slices[j];
      if (a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes)
        problems << names[i] << " overlaps " << names[j] << "; ";
    }
  }
  return problems.str();
}

std::string check_plan(const MetadataPlan& plan, int64_t ub_bytes) {
  const UbSlice slices[] = {plan.keys[0], plan.keys[1], plan.keys_f32, plan.acc_max,
                            plan.acc_min, plan.out_max, plan.out_min};
  const char* const names[] = {"keys[0]", "keys[1]", "keys_f32", "acc_max", "acc_min", "out_max", "out_min"};
  return check_slices(slices, names, 7, ub_bytes);
}

std::string check_plan(const SelectPlan& plan, int64_t ub_bytes) {
  const UbSlice slices[] = {plan.query,    plan.bounds[0],  plan.bounds[1],   plan.bounds_f32,
                            plan.products, plan.lanes,      plan.best_scores, plan.importance,
                            plan.chosen,   plan.candidate_scores, plan.candidate_blocks};
  const char* const names[] = {"query",       "bounds[0]",  "bounds[1]", "bounds_f32",       "products",        "lanes",
                               "best_scores", "importance", "chosen",    "candidate_scores", "candidate_blocks"};
  return check_slices(slices, names, plan.candidates_in_ub ? 11 : 9, ub_bytes);
}

}  // namespace quest::cann
