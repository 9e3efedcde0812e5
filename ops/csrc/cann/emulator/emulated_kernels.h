// The Ascend kernels' plans executed on the CPU, step for step.
// Every core's items in order, every chunk copied into a bounds-checked model of that core's unified buffer at the plan's offsets,
// the same canonical arithmetic and the kernel's own scalar-unit selection (kernels/select_item.h).
// Results must equal the scalar kernels bit for bit; a plan that overlaps, overflows or misaligns a
// buffer throws. SparseBlockAttention runs the FIA block table through a plain float32 attention.
#pragma once

#include "../../kernels/quest_metadata.h"
#include "../../kernels/sparse_block_attention.h"
#include "../../kernels/sparse_block_select.h"
#include "../host/attention_plan.h"
#include "../host/tiling.h"

namespace quest::cann {

void emulate_metadata(const MetadataPlan& plan, const NpuSpec& npu, const QuestMetadataParams& params);
void emulate_select(const SelectPlan& plan, const NpuSpec& npu, const SparseBlockSelectParams& params);
// Writes the new tokens into the caches (the 2-D device copies), then attends row by row.
void emulate_attention(const AttentionShape& shape, const SparseBlockAttentionParams& params);

}  // namespace quest::cann
