// The selection procedure every SparseBlockSelect variant shares: forced blocks, importance, top-k.
//
// Variants differ only in how they score blocks; the order that ranks blocks and the procedure
// that fills the budget live here once, so every variant selects exactly the same blocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
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

// A block's rank as one integer, greater for a block that ranks before (ranks_before): the value's
// order-preserving bits (NaN lowest, -0 as +0) above the complement of the index (ties to the
// lower index). Sorting candidates by it needs no NaN tests and no trip to the values.
inline uint64_t rank_key(const float* values, int32_t m) {
  const float v = values[m];
  uint32_t bits = 0;  // NaN
  if (!std::isnan(v)) {
    const float canonical = v == 0.0f ? 0.0f : v;
    std::memcpy(&bits, &canonical, sizeof bits);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // numbers above 0, in order
  }
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(m));
}

inline int32_t key_block(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key)); }

// Reusable buffers of one row's selection.
struct SelectScratch {
  std::vector<float> scores;       // [eligible]
  std::vector<int32_t> chosen;     // chosen blocks, in the order they were taken
  std::vector<uint64_t> best;      // rank keys of the candidates for the best blocks (see offer)
  std::vector<uint8_t> taken;      // [eligible]
  std::vector<float> query;        // variant-owned: the (reduced) query rows
  std::vector<float> query_positive;  // variant-owned: their lanes' q > 0 masks
  std::vector<float> key;          // variant-owned: one probed key row
  std::vector<float> head_scores;  // variant-owned: scores of every query head of a group
  int64_t keep = 0;                // blocks to choose
  int32_t offered = 0;             // blocks [0, offered) went through offer()
  int32_t worst = -1;              // the threshold block (see offer); -1 before there is one

  // Starts choosing the best `count` untaken blocks by `values`, offered in ascending order.
  void begin_best(int64_t count) {
    best.clear();
    keep = count;
    offered = 0;
    worst = -1;
  }

  // Offers block `offered` (its value ready in values). Candidates collect the blocks that rank
  // before the threshold block `worst`, the keep-th best candidate at the last prune; when they
  // reach twice `keep` they are pruned to the best `keep` (a partial sort by the total order) and
  // the threshold rises. A block (above every candidate's index, so never first on a tie) ranks
  // before the threshold exactly when its value is greater, or is a number while the threshold's
  // is NaN: one compare rejects almost every block, and a block let in costs an append where a
  // heap paid a sift.
  void offer(const float* values) {
    const int32_t m = offered++;
    if (taken[m] || keep == 0) return;
    if (worst >= 0 && !ranks_before(values, m, worst)) return;
    best.push_back(rank_key(values, m));
    if (static_cast<int64_t>(best.size()) == (worst < 0 ? keep : 2 * keep)) prune();
  }

  // Keeps the best `keep` candidates; the keep-th becomes the threshold.
  void prune() {
    std::nth_element(best.begin(), best.begin() + (keep - 1), best.end(), std::greater<uint64_t>());
    best.resize(keep);
    worst = key_block(best[keep - 1]);
  }

  // Offers blocks [offered, end). While the threshold is a number, a run of kRejectRun blocks none
  // of which is greater is rejected by one branch-free pass (a fixed count, so the compiler
  // vectorizes it); in a run that holds a greater block, the blocks before it are rejected (what
  // offer() does with them) and it alone is offered.
  static constexpr int64_t kRejectRun = 32;
  void offer_until(const float* values, int64_t end) {
    while (offered < end) {
      if (worst < 0 || std::isnan(values[worst])) {
        offer(values);
        continue;
      }
      const float threshold = values[worst];
      if (offered + kRejectRun <= end && !any_greater(values + offered, threshold)) {
        offered += static_cast<int32_t>(kRejectRun);
        continue;
      }
      const int64_t stop = std::min<int64_t>(end, offered + kRejectRun);
      while (offered < stop && !(values[offered] > threshold)) ++offered;
      if (offered < stop) offer(values);
    }
  }

  static bool any_greater(const float* run, float threshold) {
    int greater = 0;  // an int, not a bool: GCC vectorizes the int reduction only
    for (int64_t j = 0; j < kRejectRun; ++j) greater |= run[j] > threshold;
    return greater != 0;
  }

  // Offers the blocks up to `eligible` not offered yet, then takes the kept ones.
  void end_best(const float* values, int64_t eligible) {
    offer_until(values, eligible);
    if (static_cast<int64_t>(best.size()) > keep) prune();
    for (const uint64_t key : best) {
      const int32_t m = key_block(key);
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
    // Scoring may offer blocks to the selection as their scores are written (s.offer_until, ascending),
    // so that its work overlaps the reads; the blocks it did not offer follow here.
    s.scores.resize(eligible);
    s.begin_best(remaining);
    score_blocks(eligible, s.scores.data());
    s.end_best(s.scores.data(), eligible);
  }
  std::sort(s.chosen.begin(), s.chosen.end());
  std::copy(s.chosen.begin(), s.chosen.end(), row);
}

}  // namespace quest
