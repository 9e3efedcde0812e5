// The selection procedure of SparseBlockSelect as the Ascend kernel runs it on the AI core's scalar
// unit, shared by that kernel and the CPU emulator: no allocation, no standard library, arrays
// behind accessors (UB tensors on the NPU, plain memory in the emulator). It ranks exactly like
// quest::ranks_before (kernels/select_order.h): higher first, NaN last, ties to the lower index.
#pragma once

#include <cstdint>

#if defined(__CCE_AICORE__) || defined(__CCE_KT_TEST__) || defined(ASCENDC_CPU_DEBUG)
#define QUEST_AICORE __aicore__ inline
#else
#define QUEST_AICORE inline
#endif

namespace quest::cann {

QUEST_AICORE bool ranks_before(float va, int32_t a, float vb, int32_t b) {
  const bool nan_a = va != va, nan_b = vb != vb;
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && va != vb) return va > vb;
  return a < b;
}

// The blocks taken so far (forced, then by importance, then by score): at most K, in the order taken.
template <class Blocks>
struct Chosen {
  Blocks blocks;  // .get(i) / .set(i, v), int32
  int64_t size;

  QUEST_AICORE bool contains(int32_t m) const {
    for (int64_t i = 0; i < size; ++i)
      if (blocks.get(i) == m) return true;
    return false;
  }
  QUEST_AICORE void take(int32_t m) {
    if (!contains(m)) blocks.set(size++, m);
  }
  // Ascending, for the output row (insertion sort: K is small).
  QUEST_AICORE void sort() {
    for (int64_t i = 1; i < size; ++i) {
      const int32_t m = blocks.get(i);
      int64_t j = i;
      for (; j > 0 && blocks.get(j - 1) > m; --j) blocks.set(j, blocks.get(j - 1));
      blocks.set(j, m);
    }
  }
};

// The best `capacity` offers so far, best first; `offer` is O(capacity) on the scalar unit.
template <class Scores, class Blocks>
struct BestList {
  Scores scores;  // .get(i) / .set(i, v), float
  Blocks blocks;  // .get(i) / .set(i, v), int32
  int64_t size;
  int64_t capacity;

  QUEST_AICORE void offer(float value, int32_t m) {
    if (capacity <= 0) return;
    if (size == capacity && !ranks_before(value, m, scores.get(size - 1), blocks.get(size - 1))) return;
    int64_t at = size < capacity ? size++ : capacity - 1;
    for (; at > 0 && ranks_before(value, m, scores.get(at - 1), blocks.get(at - 1)); --at) {
      scores.set(at, scores.get(at - 1));
      blocks.set(at, blocks.get(at - 1));
    }
    scores.set(at, value);
    blocks.set(at, m);
  }
};

// The forced blocks of a query whose own block is `current`, in priority order: the recent blocks
// newest first, then the sinks ascending; at most `top_k`.
template <class Blocks>
QUEST_AICORE void take_forced(Chosen<Blocks>& chosen, int64_t current, int64_t sink_blocks, int64_t recent_blocks,
                              int64_t top_k) {
  for (int64_t m = current; m > current - recent_blocks && m >= 0 && chosen.size < top_k; --m)
    chosen.take(static_cast<int32_t>(m));
  const int64_t sinks = sink_blocks < current + 1 ? sink_blocks : current + 1;
  for (int64_t m = 0; m < sinks && chosen.size < top_k; ++m) chosen.take(static_cast<int32_t>(m));
}

// floor(fraction * remaining) in double, as every kernel computes the importance quota.
QUEST_AICORE int64_t importance_quota(float fraction, int64_t remaining) {
  const double exact = static_cast<double>(fraction) * static_cast<double>(remaining);
  int64_t quota = static_cast<int64_t>(exact);
  if (static_cast<double>(quota) > exact) --quota;
  return quota;
}

}  // namespace quest::cann
