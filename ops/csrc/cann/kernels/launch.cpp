// Launches the Ascend kernels with <<<cores, nullptr, stream>>>, picking the kernel of the tensors'
// element types (AscendC; compiled by CANN's ascendc_library with the kernels).
#include "launch.h"

#include <stdexcept>

#include "kernel_operator.h"

using quest::cann::ElemType;
using quest::cann::MetadataPlan;
using quest::cann::SelectPlan;

#define QUEST_DECLARE_METADATA(NAME)                                                                       \
  extern "C" __global__ __aicore__ void NAME(GM_ADDR key, GM_ADDR block_max, GM_ADDR block_min,            \
                                             GM_ADDR past_lens, GM_ADDR total_lens, MetadataPlan plan);
#define QUEST_DECLARE_SELECT(NAME)                                                                          \
  extern "C" __global__ __aicore__ void NAME(GM_ADDR query, GM_ADDR block_max, GM_ADDR block_min,           \
                                             GM_ADDR past_lens, GM_ADDR total_lens, GM_ADDR importance,     \
                                             GM_ADDR indices, GM_ADDR workspace, SelectPlan plan);
QUEST_DECLARE_METADATA(quest_metadata_f16_f16)
QUEST_DECLARE_METADATA(quest_metadata_f32_f16)
QUEST_DECLARE_METADATA(quest_metadata_f16_f32)
QUEST_DECLARE_METADATA(quest_metadata_f32_f32)
QUEST_DECLARE_SELECT(sparse_block_select_f16_f16)
QUEST_DECLARE_SELECT(sparse_block_select_f32_f16)
QUEST_DECLARE_SELECT(sparse_block_select_f16_f32)
QUEST_DECLARE_SELECT(sparse_block_select_f32_f32)

namespace quest::cann::npu {
namespace {

GM_ADDR gm(const void* p) { return reinterpret_cast<GM_ADDR>(const_cast<void*>(p)); }

int pair(ElemType a, ElemType b) { return static_cast<int>(a) * 3 + static_cast<int>(b); }
constexpr int kF16F16 = 1 * 3 + 1, kF32F16 = 0 * 3 + 1, kF16F32 = 1 * 3 + 0, kF32F32 = 0;

}  // namespace

void launch_quest_metadata(const MetadataPlan& plan, void* stream, const void* key, void* block_max, void* block_min,
                           const void* past_lens, const void* total_lens) {
  const uint32_t cores = static_cast<uint32_t>(plan.split.cores);
  const auto args = [&](auto kernel) {
    kernel<<<cores, nullptr, stream>>>(gm(key), gm(block_max), gm(block_min), gm(past_lens), gm(total_lens), plan);
  };
  switch (pair(plan.shape.key_type, plan.shape.cache_type)) {
    case kF16F16: args(quest_metadata_f16_f16); break;
    case kF32F16: args(quest_metadata_f32_f16); break;
    case kF16F32: args(quest_metadata_f16_f32); break;
    case kF32F32: args(quest_metadata_f32_f32); break;
    default: throw std::runtime_error("QuestMetadata on CANN: no kernel for this dtype pair");
  }
}

void launch_sparse_block_select(const SelectPlan& plan, void* stream, const void* query, const void* block_max,
                                const void* block_min, const void* past_lens, const void* total_lens,
                                const void* importance, void* block_indices, void* workspace) {
  const uint32_t cores = static_cast<uint32_t>(plan.split.cores);
  const auto args = [&](auto kernel) {
    kernel<<<cores, nullptr, stream>>>(gm(query), gm(block_max), gm(block_min), gm(past_lens), gm(total_lens),
                                       gm(importance), gm(block_indices), gm(workspace), plan);
  };
  switch (pair(plan.shape.query_type, plan.shape.cache_type)) {
    case kF16F16: args(sparse_block_select_f16_f16); break;
    case kF32F16: args(sparse_block_select_f32_f16); break;
    case kF16F32: args(sparse_block_select_f16_f32); break;
    case kF32F32: args(sparse_block_select_f32_f32); break;
    default: throw std::runtime_error("SparseBlockSelect on CANN: no kernel for this dtype pair");
  }
}

}  // namespace quest::cann::npu
