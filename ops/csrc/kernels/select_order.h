// The total order that ranks blocks for selection, shared by every SparseBlockSelect variant.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace quest {

// True when block a ranks before block b: higher value first, NaN last, ties to the lower index.
// A strict total order, so the chosen set never depends on the sorting algorithm.
inline bool ranks_before(const float* values, int32_t a, int32_t b) {
  const float va = values[a], vb = values[b];
  const bool nan_a = std::isnan(va), nan_b = std::isnan(vb);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && va != vb) return va > vb;
  return a < b;
}

// Moves the best `count` of `candidates` (by ranks_before on `values`) to its front.
inline void take_best(std::vector<int32_t>& candidates, const float* values, int64_t count) {
  if (count <= 0) return;
  if (count >= static_cast<int64_t>(candidates.size())) return;
  std::nth_element(candidates.begin(), candidates.begin() + (count - 1), candidates.end(),
                   [values](int32_t a, int32_t b) { return ranks_before(values, a, b); });
}

}  // namespace quest
