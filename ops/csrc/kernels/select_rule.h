// The selection rule of SparseBlockSelect, written once for every kernel that selects.
// Its users: the CPU kernels (select_order.h), the Ascend kernel and its CPU emulator
// (cann/kernels/select_item.h).
//
// Kernels differ in how they score blocks and keep the chosen ones; what a query selects is decided
// here. Only <cstdint>, no allocation and no standard library, so that the AscendC compiler takes
// it as it is: the kernels reach their buffers through the selection object they pass in.
#pragma once

#include <cstdint>

#ifndef QUEST_AICORE
#if defined(__CCE_AICORE__) || defined(__CCE_KT_TEST__) || defined(ASCENDC_CPU_DEBUG)
#define QUEST_AICORE __aicore__ inline
#else
#define QUEST_AICORE inline
#endif
#endif

namespace quest {

// True when block a (value va) ranks before block b (value vb): higher value first, NaN last,
// ties to the lower index. A strict total order, so the chosen set never depends on the algorithm
// that finds the best blocks.
QUEST_AICORE bool ranks_before(float va, int32_t a, float vb, int32_t b) {
  const bool nan_a = va != va, nan_b = vb != vb;
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && va != vb) return va > vb;
  return a < b;
}

// floor(fraction * remaining) in double: the blocks chosen by importance.
QUEST_AICORE int64_t importance_quota(float fraction, int64_t remaining) {
  const double exact = static_cast<double>(fraction) * static_cast<double>(remaining);
  int64_t quota = static_cast<int64_t>(exact);
  if (static_cast<double>(quota) > exact) --quota;
  return quota;
}

// Selects the blocks of a query whose own block is `current`, into `selection`:
//   every eligible block [0, current] when they fit in top_k; else the forced blocks in priority
//   order (the recent blocks newest first, then the sinks ascending; at most top_k), then the
//   importance quota of what remains (the best blocks by importance), then the rest (the best
//   blocks by score); the row lists the chosen blocks ascending, -1 padded.
// `rule` holds top_k, sink_blocks, recent_blocks and importance_fraction (SparseBlockSelectParams,
// cann::SelectShape). `selection` is the kernel's way of keeping blocks:
//   take_all(eligible)                      the row is blocks [0, eligible), -1 padded
//   begin(eligible)                         nothing taken yet
//   taken_count()                           blocks taken so far
//   take(m)                                 takes block m, unless it is taken already
//   has_importance()                        whether the call has block importance
//   take_best_importance(eligible, count)   take the best `count` untaken blocks of [0, eligible)
//   take_best_scores(eligible, count)       by ranks_before of their importance / scores
//   finish()                                the row: the taken blocks ascending, -1 padded
template <class Rule, class Selection>
QUEST_AICORE void select_blocks(const Rule& rule, int64_t current, Selection& selection) {
  const int64_t K = rule.top_k, eligible = current + 1;
  if (eligible <= K) {
    selection.take_all(eligible);
    return;
  }
  selection.begin(eligible);
  for (int64_t m = current; m > current - rule.recent_blocks && m >= 0 && selection.taken_count() < K; --m)
    selection.take(static_cast<int32_t>(m));
  const int64_t sinks = rule.sink_blocks < eligible ? rule.sink_blocks : eligible;
  for (int64_t m = 0; m < sinks && selection.taken_count() < K; ++m) selection.take(static_cast<int32_t>(m));
  int64_t remaining = K - selection.taken_count();
  if (selection.has_importance() && remaining > 0) {
    const int64_t quota = importance_quota(rule.importance_fraction, remaining);
    if (quota > 0) selection.take_best_importance(eligible, quota);
    remaining -= quota;
  }
  if (remaining > 0) selection.take_best_scores(eligible, remaining);
  selection.finish();
}

// The most forced blocks a chunk of `chunk_size` queries can have: the blocks its positions touch
// (at most (Q + P - 2) / P + 1), the window and the sinks. chunk_top_k must hold them.
QUEST_AICORE int64_t most_chunk_forced(int64_t chunk_size, int64_t block_size, int64_t window, int64_t sinks) {
  return (chunk_size + block_size - 2) / block_size + 1 + window + sinks;
}

// Selects the blocks of a chunk of queries whose blocks are [first, last] (its first and last
// member's), into `selection` (select_blocks' interface; importance is not used):
//   forced: the chunk's own blocks, the chunk_window blocks before them, the chunk_sink leading
//   blocks; then by score
//   ceil(chunk_share * candidates) of the other eligible blocks [0, last] (computed in double), at
//   least top_k and chunk_floor, at most chunk_top_k minus the forced; every eligible block when the
//   candidates are no more than that. `rule` holds top_k, chunk_sink, chunk_top_k, chunk_share,
//   chunk_window, chunk_floor (SparseBlockSelectParams); chunk_top_k holds every forced block (most_chunk_forced).
template <class Rule, class Selection>
QUEST_AICORE void select_chunk_blocks(const Rule& rule, int64_t first, int64_t last, Selection& selection) {
  const int64_t eligible = last + 1;
  const int64_t window_start = first - rule.chunk_window > 0 ? first - rule.chunk_window : 0;
  const int64_t sinks = rule.chunk_sink < window_start ? rule.chunk_sink : window_start;  // those not in the window
  const int64_t forced = eligible - window_start + sinks;
  const int64_t candidates = eligible - forced;
  const double wanted_exact = static_cast<double>(rule.chunk_share) * static_cast<double>(candidates);
  int64_t wanted = static_cast<int64_t>(wanted_exact);
  if (static_cast<double>(wanted) < wanted_exact) ++wanted;  // ceil
  const int64_t floor = rule.chunk_floor > rule.top_k ? rule.chunk_floor : rule.top_k;
  int64_t keep = wanted > floor ? wanted : floor;
  if (keep > rule.chunk_top_k - forced) keep = rule.chunk_top_k - forced;
  if (candidates <= keep) {
    selection.take_all(eligible);
    return;
  }
  selection.begin(eligible);
  for (int64_t m = last; m >= window_start; --m) selection.take(static_cast<int32_t>(m));
  for (int64_t m = 0; m < sinks; ++m) selection.take(static_cast<int32_t>(m));
  if (keep > 0) selection.take_best_scores(eligible, keep);
  selection.finish();
}

}  // namespace quest
