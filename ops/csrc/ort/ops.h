// The ORT kernel classes of the Quest ops, one per op, each bound to its generated schema.
#pragma once

#include "adapter.h"

namespace quest::ort {

// The CPU kernels of every op, one registration per dtype pair (register.cc).
void add_cpu_ops(Ort::CustomOpDomain& domain);

// num_heads must be a multiple of kv_num_heads (checked when the session is created).
void check_head_grouping(const schema::OpSchema& op, const Attributes& attributes);
// a * b, saturated at INT32_MAX: lengths are int32, so any larger limit never binds.
int64_t saturating_mul(int64_t a, int64_t b);

class QuestMetadataKernel : public KernelBase<QuestMetadataKernel> {
 public:
  explicit QuestMetadataKernel(const OrtKernelInfo* info);
  static const schema::OpSchema& schema();
  void Compute(OrtKernelContext* context);

 private:
  Attributes attributes_;
  std::vector<bool> outputs_;  // which outputs the node has (block_exponent_out is optional)
};

class SparseBlockSelectKernel : public KernelBase<SparseBlockSelectKernel> {
 public:
  explicit SparseBlockSelectKernel(const OrtKernelInfo* info);
  static const schema::OpSchema& schema();
  void Compute(OrtKernelContext* context);

 private:
  Attributes attributes_;
  std::vector<bool> outputs_;  // which outputs the node has (chunk_indices is optional)
};

// chunk_top_k holds every forced block a chunk can have (select_rule.h most_chunk_forced), checked
// when the session is created.
void check_chunk_budget(const schema::OpSchema& op, const Attributes& attributes);

class SparseBlockAttentionKernel : public KernelBase<SparseBlockAttentionKernel> {
 public:
  explicit SparseBlockAttentionKernel(const OrtKernelInfo* info);
  static const schema::OpSchema& schema();
  void Compute(OrtKernelContext* context);

 private:
  Attributes attributes_;
  std::vector<bool> outputs_;  // which outputs the node has (optional ones may be absent)
};

}  // namespace quest::ort
