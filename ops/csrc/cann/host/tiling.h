// Host-side tiling of the Ascend kernels: plain C++ with no CANN header, shared by the NPU host
// code (ops/csrc/cann/ort) and the CPU emulator that executes the same plans here.
//
// A plan fixes, for one call: which vector core takes which work items, how each item's data is
// cut into chunks that fit the unified buffer (UB), where every UB buffer lives (32-byte aligned,
// disjoint, inside the UB), and the padded row width that keeps DataCopyPad rows aligned and the
// canonical 16-lane score order intact. The plans themselves are plain data (plan_types.h),
// passed to the kernels by value.
#pragma once

#include <cstdint>
#include <string>

#include "plan_types.h"

namespace quest::cann {

int64_t elem_bytes(ElemType type);
CoreSplit split_items(int64_t items, int32_t max_cores);

// A plan, or why the call cannot run on the NPU (the op then reports it, naming the limit).
template <typename Plan>
struct Planned {
  bool ok = false;
  Plan plan{};
  std::string error;
};

Planned<MetadataPlan> plan_metadata(const MetadataShape& shape, const NpuSpec& npu);
// "" when the NPU select kernel implements these attributes, else why not (it scores the bound
// with one selection per KV head: not score='probe', not group_reduce='none').
std::string check_select_support(const std::string& score, const std::string& group_reduce);
// The hierarchical selection (super_max, super_min) has no NPU kernel.
inline constexpr const char* kNoHierarchicalSelect =
    "SparseBlockSelect on CANN: superblock inputs (hierarchical selection) have no NPU kernel; "
    "run this model's function-body export, or export without superblocks";
Planned<SelectPlan> plan_select(const SelectShape& shape, const NpuSpec& npu);

// Every slice of a plan, named, for the checks (aligned, disjoint, inside the UB).
std::string check_slices(const UbSlice* slices, const char* const* names, int count, int64_t ub_bytes);
std::string check_plan(const MetadataPlan& plan, int64_t ub_bytes);
std::string check_plan(const SelectPlan& plan, int64_t ub_bytes);

}  // namespace quest::cann
