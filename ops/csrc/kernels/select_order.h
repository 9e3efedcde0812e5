// The selection procedure every SparseBlockSelect variant shares: forced blocks, importance, top-k.
//
// Variants differ only in how they score blocks; the order that ranks blocks and the procedure
// that fills the budget live here once, so every variant selects exactly the same blocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sparse_block_select.h"

namespace quest {

// True when block a ranks before block b: higher value first, NaN last, ties to the lower index.
// A strict total order, so the chosen set never depends on the selection algorithm.
inline bool ranks_before(const float* values, int32_t a, int32_t b) {
  const float va = values[a], vb = values[b];
  const bool nan_a = std::isnan(va), nan_b = std::isnan(vb);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && va != vb) return va > vb;
  return a < b;
}

// Reusable buffers of one row's selection.
struct SelectScratch {
  std::vector<float> scores;       // [eligible]
  std::vector<int32_t> chosen;     // chosen blocks, in the order they were taken
  std::vector<int32_t> best;       // heap of the best candidates so far
  std::vector<uint8_t> taken;      // [eligible]
  std::vector<float> query;        // variant-owned: the (reduced) query rows
  std::vector<float> key;          // variant-owned: one probed key row
  std::vector<float> head_scores;  // variant-owned: scores of every query head of a group
  int64_t keep = 0;                // blocks the heap keeps
  int32_t offered = 0;             // blocks [0, offered) went through offer()

  // Starts a heap of the best `count` untaken blocks by `values`, offered in ascending order.
  void begin_best(int64_t count) {
    best.clear();
    keep = count;
    offered = 0;
  }

  // Offers block `offered` (its value ready in values): a bounded heap whose top is the worst kept
  // block. With the heap full, the block (above every kept index, so never first on a tie) ranks
  // before the worst kept one exactly when its value is greater, or is a number while the worst is
  // NaN: one compare rejects almost every block.
  void offer(const float* values) {
    const int32_t m = offered++;
    const auto worse = [values](int32_t a, int32_t b) { return ranks_before(values, a, b); };
    if (taken[m]) return;
    if (static_cast<int64_t>(best.size()) < keep) {
      best.push_back(m);
      std::push_heap(best.begin(), best.end(), worse);
      return;
    }
    const float worst = values[best.front()], value = values[m];
    if (std::isnan(worst) ? std::isnan(value) : !(value > worst)) return;
    std::pop_heap(best.begin(), best.end(), worse);
    best.back() = m;
    std::push_heap(best.begin(), best.end(), worse);
  }

  // Offers blocks [offered, end). While the heap is full and its worst a number, runs of
  // kRejectRun blocks none of which is greater than the worst are rejected by one branch-free pass
  // each (what offer() would do block by block); a run holding a better block is offered one by one.
  static constexpr int64_t kRejectRun = 32;
  void offer_until(const float* values, int64_t end) {
    while (offered < end) {
      if (static_cast<int64_t>(best.size()) < keep || keep == 0 || std::isnan(values[best.front()])) {
        offer(values);
        continue;
      }
      const float worst = values[best.front()];
      const int64_t stop = std::min<int64_t>(end, offered + kRejectRun);
      bool any_greater = false;
      for (int64_t m = offered; m < stop; ++m) any_greater |= values[m] > worst;
      if (!any_greater) {
        offered = static_cast<int32_t>(stop);
        continue;
      }
      while (offered < stop) offer(values);
    }
  }

  // Offers the blocks up to `eligible` not offered yet, then takes the kept ones.
  void end_best(const float* values, int64_t eligible) {
    offer_until(values, eligible);
    for (const int32_t m : best) {
      taken[m] = 1;
      chosen.push_back(m);
    }
  }
};

// Appends to s.chosen the best `count` untaken blocks of [0, eligible) by `values`:
// O(eligible) compares when count is small.
inline void choose_best(const float* values, int64_t eligible, int64_t count, SelectScratch& s) {
  if (count <= 0) return;
  s.begin_best(count);
  s.end_best(values, eligible);
}

inline void take_block(int32_t m, SelectScratch& s) {
  if (s.taken[m]) return;
  s.taken[m] = 1;
  s.chosen.push_back(m);
}

// Selects the blocks of one (b, n, query) whose own block is `current` and writes `row` [K]:
// ascending, -1 padded. `score_blocks(eligible, scores)` fills the bound of blocks [0, eligible);
// it runs only when the ranking needs the scores.
template <typename ScoreBlocks>
void select_row(const SparseBlockSelectParams& prm, const float* importance, int64_t current, int32_t* row,
                SelectScratch& s, ScoreBlocks&& score_blocks) {
  const int64_t K = prm.top_k, eligible = current + 1;
  std::fill(row, row + K, -1);
  if (eligible <= K) {
    for (int64_t m = 0; m < eligible; ++m) row[m] = static_cast<int32_t>(m);
    return;
  }
  s.chosen.clear();
  s.taken.assign(eligible, 0);
  // Forced blocks in priority order: recent newest first, then sinks ascending; at most K.
  for (int64_t m = current; m > current - prm.recent_blocks && m >= 0; --m) take_block(static_cast<int32_t>(m), s);
  for (int64_t m = 0; m < std::min(prm.sink_blocks, eligible); ++m) take_block(static_cast<int32_t>(m), s);
  if (static_cast<int64_t>(s.chosen.size()) > K) {
    for (size_t j = K; j < s.chosen.size(); ++j) s.taken[s.chosen[j]] = 0;
    s.chosen.resize(K);
  }
  int64_t remaining = K - static_cast<int64_t>(s.chosen.size());
  if (importance != nullptr && remaining > 0) {
    const auto by_importance = static_cast<int64_t>(
        std::floor(static_cast<double>(prm.importance_fraction) * static_cast<double>(remaining)));
    choose_best(importance, eligible, by_importance, s);
    remaining -= by_importance;
  }
  if (remaining > 0) {
    // Scoring may offer blocks to the heap as their scores are written (s.offer_until, ascending),
    // so that the heap's work overlaps the reads; the blocks it did not offer follow here.
    s.scores.resize(eligible);
    s.begin_best(remaining);
    score_blocks(eligible, s.scores.data());
    s.end_best(s.scores.data(), eligible);
  }
  std::sort(s.chosen.begin(), s.chosen.end());
  std::copy(s.chosen.begin(), s.chosen.end(), row);
}

}  // namespace quest
