// How a finished online-softmax row becomes outputs, shared by the scalar and SIMD attention: the
// blocks' attention masses into block_importance, and the normalised output values.
//
// Included by each instruction-set translation unit before its target region (like
// select_order.h), so these inline functions are compiled for baseline only.
#pragma once

#include <cstdint>
#include <vector>

#include "arith.h"

namespace quest {

// The softmax mass one step gave one metadata block, kept for the block_importance output.
struct BlockMass {
  int32_t block;
  float max_logit;  // the running max the step's weights were taken against
  float weight_sum;
};

// Adds a head's recorded masses to block_importance, in the order they were recorded: each step's
// weights renormalised to the head's final max and denominator (NaN for a NaN row).
inline void add_masses(const std::vector<BlockMass>& masses, float max_logit, float denominator, float* importance) {
  const bool nan_row = is_nan_row(max_logit, denominator);
  for (const BlockMass& mass : masses)
    importance[mass.block] += nan_row ? canonical_nan()
                                      : mass.weight_sum * canonical_exp(mass.max_logit - max_logit) / denominator;
}

// One output value of a finished row from its accumulator lane: NaN for a NaN row, zero for a row
// that attended nothing, else the normalised value, NaN where it is not finite (docs/ops.md,
// non-finite numbers). The SIMD variants compute the same per 16 lanes.
inline float row_output(float accumulator, float denominator, bool nan_row) {
  if (nan_row) return canonical_nan();
  return denominator > 0.0f ? finite_or_nan(accumulator / denominator) : 0.0f;
}

}  // namespace quest
