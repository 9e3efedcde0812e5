// Host entry points that launch the Ascend kernels on a stream (defined in kernels/launch.cpp,
// compiled by CANN's ascendc_library). Plain C++: the ORT adapter includes it.
#pragma once

#include "../host/plan_types.h"

namespace quest::cann::npu {

// Pointers are NPU device memory; lengths are device copies of the resolved int32 lengths.
void launch_quest_metadata(const MetadataPlan& plan, void* stream, const void* key, void* block_max, void* block_min,
                           const void* past_lens, const void* total_lens);
void launch_sparse_block_select(const SelectPlan& plan, void* stream, const void* query, const void* block_max,
                                const void* block_min, const void* past_lens, const void* total_lens,
                                const void* importance, void* block_indices, void* workspace);

}  // namespace quest::cann::npu
