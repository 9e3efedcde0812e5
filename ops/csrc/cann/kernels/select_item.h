// The per-item selection of the SparseBlockSelect Ascend kernel, on the AI core's scalar unit.
// sparse_block_select_npu.cpp calls it; the CPU emulator (emulator/emulated_kernels.cc) compiles and runs this
// same code over its model of a core. The rule is kernels/select_rule.h; here it is carried out
// chunk by chunk with no allocation and no standard library, arrays behind accessors (.get(i) /
// .set(i, v): UB or GM tensors on the NPU, bounds-checked memory in the emulator).
#pragma once

#include <cstdint>

#include "../../kernels/select_rule.h"
#include "../host/plan_types.h"

namespace quest::cann {

// The blocks taken so far (forced, then by importance, then by score): at most K, in the order taken.
template <class Blocks>
struct Chosen {
  Blocks blocks;  // int32
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
  Scores scores;  // float
  Blocks blocks;  // int32
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

// The rule's selection (select_blocks) of one item on a core. `Core` is the kernel (or the
// emulator's model of it) and moves the data:
//   past_len(b), total_len(b)             the lengths of batch row b
//   set_index(at, block)                  element `at` of the output block_indices
//   chosen_blocks()                       the int32 accessor of the plan's `chosen` buffer [K]
//   importance_chunk(kv_item, c0, count)  loads the importance of blocks [c0, c0 + count), returns its accessor
//   load_query(b, n, i)                   the (reduced) query rows of the item, for score_chunk
//   score_chunk(kv_item, c0, count, buffer)  scores blocks [c0, c0 + count) (max over the query
//                                         rows) with bounds buffer `buffer` (0/1), returns their accessor
// The candidates of a best-K list live in `scores` / `blocks` (UB or this core's GM workspace).
template <class Core, class ChosenBlocks, class Scores, class Blocks>
struct ItemSelection {
  Core& core;
  const SelectPlan& plan;
  int64_t item, b, n, i;
  Chosen<ChosenBlocks> chosen;
  Scores scores;
  Blocks blocks;

  QUEST_AICORE void take_all(int64_t eligible) {
    const int64_t K = plan.shape.top_k;
    for (int64_t j = 0; j < K; ++j) core.set_index(item * K + j, j < eligible ? static_cast<int32_t>(j) : -1);
  }
  QUEST_AICORE void begin(int64_t) { chosen.size = 0; }
  QUEST_AICORE int64_t taken_count() const { return chosen.size; }
  QUEST_AICORE void take(int32_t m) { chosen.take(m); }
  QUEST_AICORE bool has_importance() const { return plan.shape.has_importance; }
  QUEST_AICORE void take_best_importance(int64_t eligible, int64_t count) {
    BestList<Scores, Blocks> best{scores, blocks, 0, count};
    for (int64_t c0 = 0; c0 < eligible; c0 += plan.blocks_per_chunk) {
      const int64_t in_chunk = chunk_size(c0, eligible);
      offer_untaken(best, core.importance_chunk(kv_item(), c0, in_chunk), c0, in_chunk);
    }
    take_list(best);
  }
  QUEST_AICORE void take_best_scores(int64_t eligible, int64_t count) {
    core.load_query(b, n, i);
    BestList<Scores, Blocks> best{scores, blocks, 0, count};
    int buffer = 0;
    for (int64_t c0 = 0; c0 < eligible; c0 += plan.blocks_per_chunk, buffer ^= 1) {
      const int64_t in_chunk = chunk_size(c0, eligible);
      offer_untaken(best, core.score_chunk(kv_item(), c0, in_chunk, buffer), c0, in_chunk);
    }
    take_list(best);
  }
  QUEST_AICORE void finish() {
    chosen.sort();
    const int64_t K = plan.shape.top_k;
    for (int64_t j = 0; j < K; ++j) core.set_index(item * K + j, j < chosen.size ? chosen.blocks.get(j) : -1);
  }

 private:
  QUEST_AICORE int64_t kv_item() const { return b * plan.shape.kv_heads + n; }
  QUEST_AICORE int64_t chunk_size(int64_t c0, int64_t eligible) const {
    return plan.blocks_per_chunk < eligible - c0 ? plan.blocks_per_chunk : eligible - c0;
  }
  template <class Values>
  QUEST_AICORE void offer_untaken(BestList<Scores, Blocks>& best, const Values& values, int64_t c0, int64_t count) {
    for (int64_t j = 0; j < count; ++j)
      if (!chosen.contains(static_cast<int32_t>(c0 + j))) best.offer(values.get(j), static_cast<int32_t>(c0 + j));
  }
  QUEST_AICORE void take_list(const BestList<Scores, Blocks>& best) {
    for (int64_t j = 0; j < best.size; ++j) chosen.take(best.blocks.get(j));
  }
};

// Item (b, n, query position) of the plan: its row of block_indices. The kernel and the emulator
// call this for every item of a core, in order.
template <class Core, class Scores, class Blocks>
QUEST_AICORE void select_item(Core& core, const SelectPlan& plan, int64_t item, const Scores& scores,
                              const Blocks& blocks) {
  const SelectShape& s = plan.shape;
  const int64_t N = s.kv_heads, S = s.query_len, K = s.top_k;
  const int64_t b = item / (N * S), n = item / S % N, i = item % S;
  const int64_t p = core.past_len(b) + i;
  if (p >= core.total_len(b)) {
    for (int64_t j = 0; j < K; ++j) core.set_index(item * K + j, -1);
    return;
  }
  auto chosen_blocks = core.chosen_blocks();
  ItemSelection<Core, decltype(chosen_blocks), Scores, Blocks> selection{
      core, plan, item, b, n, i, {chosen_blocks, 0}, scores, blocks};
  select_blocks(s, p / s.block_size, selection);
}

}  // namespace quest::cann
