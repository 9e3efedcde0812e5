// How the CPU kernels carry out the selection rule (select_rule.h) over a query's blocks.
// The best blocks by the rule's order over all of a query's blocks at once, and the row selection
// every CPU variant shares.
//
// Variants differ only in how they score blocks; the way they keep and rank blocks lives here
// once, so every variant selects exactly the same blocks.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "select_rule.h"
#include "sparse_block_select.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace quest {

// Bit j set where values[j] > bound (Strict) or values[j] >= bound, for j < 32 (ordered compares:
// never for NaN). Written with the baseline instruction set's vectors (SSE2 on x86-64, NEON on
// AArch64): this header is compiled for baseline only (it is included before the ISA target
// regions), where GCC leaves a loop that builds a bit mask scalar, and the floor of the shared
// pass (collect_above_floor) spent most of its time in that loop.
template <bool Strict>
inline uint32_t compare_mask32(const float* values, float bound) {
  uint32_t mask = 0;
#if defined(__SSE2__)
  const __m128 b = _mm_set1_ps(bound);
  for (int j = 0; j < 32; j += 4) {
    const __m128 v = _mm_loadu_ps(values + j);
    const __m128 hit = Strict ? _mm_cmpgt_ps(v, b) : _mm_cmpge_ps(v, b);  // ordered: false for NaN
    mask |= static_cast<uint32_t>(_mm_movemask_ps(hit)) << j;
  }
#elif defined(__ARM_NEON) && defined(__aarch64__)
  const float32x4_t b = vdupq_n_f32(bound);
  const uint32_t weights_bits[4] = {1, 2, 4, 8};
  const uint32x4_t weights = vld1q_u32(weights_bits);
  for (int j = 0; j < 32; j += 4) {
    const float32x4_t v = vld1q_f32(values + j);
    const uint32x4_t hit = Strict ? vcgtq_f32(v, b) : vcgeq_f32(v, b);  // false for NaN
    mask |= vaddvq_u32(vandq_u32(hit, weights)) << j;
  }
#else
  for (int j = 0; j < 32; ++j) mask |= static_cast<uint32_t>(Strict ? values[j] > bound : values[j] >= bound) << j;
#endif
  return mask;
}

// True when block a ranks before block b by `values` (the rule's order, select_rule.h).
inline bool ranks_before(const float* values, int32_t a, int32_t b) { return ranks_before(values[a], a, values[b], b); }

// A value's order-preserving bits: greater for a greater number, NaN lowest (0), -0 as +0.
inline uint32_t order_bits(float v) {
  uint32_t bits = 0;  // NaN
  if (!std::isnan(v)) {
    const float canonical = v == 0.0f ? 0.0f : v;
    std::memcpy(&bits, &canonical, sizeof bits);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // numbers above 0, in order
  }
  return bits;
}

// The number whose order_bits are `bits` (not NaN: bits > 0).
inline float from_order_bits(uint32_t bits) {
  bits = (bits & 0x80000000u) ? (bits & 0x7FFFFFFFu) : ~bits;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// A block's rank as one integer, greater for a block that ranks before (ranks_before): the value's
// order-preserving bits (NaN lowest, -0 as +0) above the complement of the index (ties to the
// lower index). Sorting candidates by it needs no NaN tests and no trip to the values.
inline uint64_t rank_key(const float* values, int32_t m) {
  return (static_cast<uint64_t>(order_bits(values[m])) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(m));
}

inline int32_t key_block(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key)); }

// The k-th greatest (1 <= k <= n) of keys[0, n), found a byte at a time from the top (a radix
// select): count the keys still in play by their next byte, keep the byte where the k-th falls,
// carry on with those keys alone. `keys` is scratch (reordered); `spare` holds n more. Where
// nth_element over collect_above_floor's set maxima mispredicted a branch per compare, this costs
// a few passes over ever fewer keys (the floor's share of the 32K select 9.5% -> 6%, perf on an AVX2
// EPYC). Not for the 64-bit rank keys of the candidates: their nth_element measured faster.
inline uint32_t kth_greatest(uint32_t* keys, int64_t n, int64_t k, uint32_t* spare) {
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (n == 1) return keys[0];  // the k-th of one key (k is 1): the lower bytes are its own
    uint32_t count[256] = {};
    for (int64_t j = 0; j < n; ++j) ++count[(keys[j] >> shift) & 0xFFu];
    uint32_t byte = 0xFFu;
    for (; byte > 0 && count[byte] < k; --byte) k -= count[byte];
    prefix |= byte << shift;
    int64_t kept = 0;  // the keys in that byte, without a branch per key
    for (int64_t j = 0; j < n; ++j) {
      spare[kept] = keys[j];
      kept += ((keys[j] >> shift) & 0xFFu) == byte;
    }
    std::swap(keys, spare);
    n = kept;
  }
  return prefix;
}

// Writes to `out` the indices of the nonzero bytes of marks [0, n), ascending; returns how many.
// A row of chosen blocks comes from their marks (one byte per eligible block, set exactly for the
// chosen ones) in a scan eight bytes at a time, in a fraction of the time sorting them took.
inline int64_t ascending_marked(const uint8_t* marks, int64_t n, int32_t* out) {
  int64_t count = 0, m = 0;
  for (; m + 8 <= n; m += 8) {
    uint64_t word;
    std::memcpy(&word, marks + m, sizeof word);
    for (; word != 0; word &= word - 1)  // a mark is 0 or 1: one bit per marked byte
      out[count++] = static_cast<int32_t>(m + std::countr_zero(word) / 8);
  }
  for (; m < n; ++m)
    if (marks[m]) out[count++] = static_cast<int32_t>(m);
  return count;
}

// Reusable buffers of one row's selection.
struct SelectScratch {
  std::vector<float> scores;       // [eligible]
  std::vector<int32_t> chosen;     // chosen blocks, in the order they were taken
  std::vector<uint64_t> best;      // rank keys of the candidates for the best blocks (see offer)
  std::vector<uint8_t> taken;      // [eligible]
  std::vector<float> set_max;      // collect_above_floor's set maxima
  std::vector<uint32_t> set_keys;  // their order bits (order_bits), and scratch
  std::vector<float> query;        // variant-owned: the (reduced) query rows
  std::vector<float> query_positive;  // variant-owned: their lanes' q > 0 masks
  std::vector<float> key;          // variant-owned: one probed key row
  std::vector<float> head_scores;  // variant-owned: scores of every query head of a group
  std::vector<float> row_factor;   // variant-owned: int8 bounds' per-row factors a / 127
  std::vector<int8_t> row_bytes;   // variant-owned: int8 bounds' quantized rows as dot-product operands
  std::vector<int32_t> row_bias;   // variant-owned: their integer corrections
  std::vector<float> super_scores;       // hierarchical: superblock scores of the sharing selections
  std::vector<uint64_t> super_ranking;   // hierarchical: rank keys, then each row's best superblocks
  std::vector<uint8_t> is_candidate;     // hierarchical: [eligible superblocks]
  std::vector<int32_t> candidate_superblocks;  // hierarchical: ascending
  std::vector<int32_t> candidate_blocks;       // hierarchical: their eligible blocks, ascending
  std::vector<float> candidate_scores;         // hierarchical: scores of candidate_blocks (compact)
  std::vector<float> candidate_head_scores;    // hierarchical, shared pass: [rows][candidate_blocks]
  std::vector<uint8_t> block_taken;            // hierarchical: `taken` by block while it is by candidate
  int64_t keep = 0;                // blocks to choose
  int32_t offered = 0;             // blocks [0, offered) went through offer()
  int32_t worst = -1;              // the threshold block (see offer); -1 before there is one

  // Starts choosing the best `count` untaken blocks by `values`, offered in ascending order; with
  // count 0, a scan that offers blocks while no selection waits for them (offers are ignored).
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
    if (keep == 0 || taken[m]) return;  // keep == 0: a scan no selection waits for (taken may be empty)
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

  // Offers blocks [offered, end). While the threshold is a number, each run of kRejectRun blocks
  // is compared with it in one vector pass (compare_mask32) that gives the mask of the blocks
  // greater than it; only those are offered, in ascending order. The
  // threshold only rises while a run is offered, so a block not greater than it at the start of
  // the run is not offered by offer() either; offer() re-checks the others.
  static constexpr int64_t kRejectRun = 32;
  void offer_until(const float* values, int64_t end) {
    while (offered < end) {
      if (worst < 0 || std::isnan(values[worst]) || offered + kRejectRun > end) {
        offer(values);
        continue;
      }
      const int32_t run = offered;
      for (uint32_t greater = greater_mask(values + run, values[worst]); greater != 0; greater &= greater - 1) {
        offered = run + std::countr_zero(greater);
        offer(values);
      }
      offered = run + static_cast<int32_t>(kRejectRun);
    }
  }

  // Bit j set where run[j] > threshold, and where run[j] >= floor (ordered: never for NaN); a run
  // none passes costs eight compares.
  static_assert(kRejectRun == 32, "a run's mask is one 32-bit word");
  static uint32_t greater_mask(const float* run, float threshold) { return compare_mask32<true>(run, threshold); }
  static uint32_t at_least_mask(const float* run, float floor) { return compare_mask32<false>(run, floor); }

  // With every value known and nothing offered: the candidates become the untaken blocks whose
  // value is at least a floor that at least `keep` untaken blocks reach, so the best `keep` are
  // among them. The blocks split into `sets` disjoint sets (block m in set m % sets, so the set
  // maxima are a vectorizable elementwise max over rows); with T blocks taken, the (keep + T)-th
  // greatest set maximum is such a floor: of the keep + T sets whose maximum reaches it, at most
  // T have a taken block as their maximum. NaN never is a maximum (ordered compares); a floor of
  // -inf proves nothing (a set of NaN only has that maximum) and leaves the blocks to offer().
  // On 4096 blocks (32K tokens at P = 8) about keep blocks pass, where offer() let in some 250 and
  // pruned them eight times. Blocks past whole rows of sets go through offer() as before.
  static constexpr int64_t kFloorSetsPerPick = 4;  // sets per block to choose (keep + T)
  void collect_above_floor(const float* values, int64_t eligible) {
    const int64_t picks = keep + static_cast<int64_t>(chosen.size());  // chosen: the taken blocks
    const int64_t sets = kFloorSetsPerPick * picks, rows = eligible / std::max<int64_t>(sets, 1);
    if (keep == 0 || rows < 2 || sets < kRejectRun) return;
    set_max.assign(sets, -std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = values + r * sets;
      for (int64_t j = 0; j < sets; ++j) set_max[j] = row[j] > set_max[j] ? row[j] : set_max[j];
    }
    set_keys.resize(2 * sets);  // the maxima's order bits, then kth_greatest's spare
    for (int64_t j = 0; j < sets; ++j) set_keys[j] = order_bits(set_max[j]);  // never NaN: ordered maxima
    const float floor = from_order_bits(kth_greatest(set_keys.data(), sets, picks, set_keys.data() + sets));
    if (!(floor > -std::numeric_limits<float>::infinity())) return;
    const int32_t end = static_cast<int32_t>(rows * sets / kRejectRun * kRejectRun);
    for (int32_t run = 0; run < end; run += static_cast<int32_t>(kRejectRun)) {
      for (uint32_t at_least = at_least_mask(values + run, floor); at_least != 0; at_least &= at_least - 1) {
        const int32_t m = run + std::countr_zero(at_least);
        if (!taken[m]) best.push_back(rank_key(values, m));
      }
    }
    if (static_cast<int64_t>(best.size()) < keep) {  // cannot happen (see above); offer() would still be right
      best.clear();
      return;
    }
    prune();  // the threshold for the blocks past `end`
    offered = end;
  }

  // Offers the blocks up to `eligible` not offered yet, then takes the kept ones. When none was
  // offered yet (every value known at once), a floor first skips nearly all of them.
  void end_best(const float* values, int64_t eligible) {
    if (offered == 0) collect_above_floor(values, eligible);
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

// The rule's selection (select_blocks) of one output row [K] in a CPU kernel: blocks kept in the
// scratch, the best ones found by choose_best over all of a query's values at once.
template <typename ScoreBlocks>
struct RowSelection {
  int32_t* row;
  int64_t top_k;
  const float* importance;  // the item's [M] block importance, or null
  SelectScratch& s;
  ScoreBlocks& score_blocks;

  void take_all(int64_t eligible) {
    std::fill(row, row + top_k, -1);
    for (int64_t m = 0; m < eligible; ++m) row[m] = static_cast<int32_t>(m);
  }
  void begin(int64_t eligible) {
    s.chosen.clear();
    s.taken.assign(eligible, 0);
  }
  int64_t taken_count() const { return static_cast<int64_t>(s.chosen.size()); }
  void take(int32_t m) { take_block(m, s); }
  bool has_importance() const { return importance != nullptr; }
  void take_best_importance(int64_t eligible, int64_t count) { choose_best(importance, eligible, count, s); }
  void take_best_scores(int64_t eligible, int64_t count) {
    // Scoring may offer blocks to the selection as their scores are written (s.offer_until, ascending),
    // so that its work overlaps the reads; the blocks it did not offer follow here.
    s.scores.resize(eligible);
    s.begin_best(count);
    if constexpr (std::is_void_v<decltype(score_blocks(eligible, s.scores.data()))>) {
      score_blocks(eligible, s.scores.data());
      s.end_best(s.scores.data(), eligible);
    } else {  // scores it already holds elsewhere (one head's row of a shared pass), not copied
      s.end_best(score_blocks(eligible, s.scores.data()), eligible);
    }
  }
  void finish() {
    const int64_t chosen = ascending_marked(s.taken.data(), static_cast<int64_t>(s.taken.size()), row);
    std::fill(row + chosen, row + top_k, -1);
  }
};

// Selects the blocks of one (b, n, query) whose own block is `current` and writes `row` [K]:
// ascending, -1 padded. `score_blocks(eligible, scores)` fills the bound of blocks [0, eligible),
// or returns where it holds them (const float*); it runs only when the ranking needs the scores.
template <typename ScoreBlocks>
void select_row(const SparseBlockSelectParams& prm, const float* importance, int64_t current, int32_t* row,
                SelectScratch& s, ScoreBlocks&& score_blocks) {
  RowSelection<std::remove_reference_t<ScoreBlocks>> selection{row, prm.top_k, importance, s, score_blocks};
  select_blocks(prm, current, selection);
}

// The rank keys (rank_key) of the best `k` of values [0, n), best first, into keys [n] (its first
// k; the rest is scratch). With many values a floor skips most of them first, as
// SelectScratch::collect_above_floor does: the k-th greatest maximum of 2k disjoint sets (m % sets)
// is reached by at least k values, so the best k are among those at least it (ordered compares:
// never NaN, which ranks last); a floor of -inf proves nothing, and every value is ranked.
inline void best_ranked(const float* values, int64_t n, int64_t k, uint64_t* keys, SelectScratch& s) {
  const int64_t sets = 2 * k, rows = n / std::max<int64_t>(sets, 1);
  int64_t found = 0;
  if (rows >= 2) {
    s.set_max.assign(sets, -std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < sets; ++j) s.set_max[j] = values[r * sets + j] > s.set_max[j] ? values[r * sets + j] : s.set_max[j];
    std::nth_element(s.set_max.begin(), s.set_max.begin() + (k - 1), s.set_max.end(), std::greater<float>());
    const float floor = s.set_max[k - 1];
    if (floor > -std::numeric_limits<float>::infinity())
      for (int64_t m = 0; m < n; ++m)
        if (values[m] >= floor) keys[found++] = rank_key(values, static_cast<int32_t>(m));
  }
  if (found < k) {  // no floor (few values, or one of -inf): rank them all
    found = n;
    for (int64_t m = 0; m < n; ++m) keys[m] = rank_key(values, static_cast<int32_t>(m));
  }
  std::nth_element(keys, keys + (k - 1), keys + found, std::greater<uint64_t>());
  std::sort(keys, keys + k, std::greater<uint64_t>());
}

// The hierarchical selection's step 4 (docs/ops.md, hierarchical selection), written once for the
// CPU kernels, which only score: collect_candidates picks the candidate superblocks from their
// scores, choose_best_candidates the best of their blocks.
//
// Candidates of a query, into s.candidate_superblocks and s.candidate_blocks (ascending): the
// superblocks of the blocks taken so far (s.chosen), then superblocks by turn until `count` are
// candidates. `super_scores` holds `rows` rows [rows][eligible_super] of the scores of superblocks
// [0, eligible_super), one per selection sharing the candidates; a superblock's turn is the least
// rank * rows + r over the rows r (its rank by row r's scores, the rule's order): the rows take
// their best superblocks in turn. Each row's best `count` suffice (count < eligible_super).
inline void collect_candidates(const float* super_scores, int64_t rows, int64_t eligible_super, int64_t count,
                               int64_t superblock_size, int64_t eligible, SelectScratch& s) {
  s.is_candidate.assign(eligible_super, 0);
  int64_t candidates = 0;
  const auto add = [&](int32_t u) {
    candidates += !s.is_candidate[u];
    s.is_candidate[u] = 1;
  };
  for (const int32_t m : s.chosen) add(static_cast<int32_t>(m / superblock_size));
  const int64_t best = count < eligible_super ? count : eligible_super;
  s.super_ranking.resize(rows * eligible_super);
  for (int64_t r = 0; r < rows; ++r)  // row r's best `best` superblocks, best first, at [r * eligible_super)
    best_ranked(super_scores + r * eligible_super, eligible_super, best, s.super_ranking.data() + r * eligible_super, s);
  for (int64_t rank = 0; rank < best && candidates < count; ++rank)
    for (int64_t r = 0; r < rows && candidates < count; ++r) add(key_block(s.super_ranking[r * eligible_super + rank]));
  s.candidate_superblocks.resize(candidates);
  ascending_marked(s.is_candidate.data(), eligible_super, s.candidate_superblocks.data());
  s.candidate_blocks.clear();
  for (const int32_t u : s.candidate_superblocks)
    for (int64_t m = u * superblock_size; m < (u + 1) * superblock_size && m < eligible; ++m)
      s.candidate_blocks.push_back(static_cast<int32_t>(m));
}

// Appends to s.chosen the best `count` untaken blocks of s.candidate_blocks by `values` (values[j]
// scores candidate_blocks[j]; fewer when fewer are left). The candidates rank by their position,
// which is ascending in the block index, so ties break as the rule breaks them.
inline void choose_best_candidates(const float* values, int64_t count, SelectScratch& s) {
  if (count <= 0) return;
  const int64_t candidates = static_cast<int64_t>(s.candidate_blocks.size());
  const size_t before = s.chosen.size();
  s.block_taken.swap(s.taken);  // the selection runs over candidate positions
  s.taken.assign(candidates, 0);
  // The taken blocks are the few in s.chosen, each a candidate (collect_candidates): found by
  // bisection, where a pass over every candidate's mark cost more.
  const int32_t* blocks = s.candidate_blocks.data();
  int64_t untaken = candidates;
  for (const int32_t m : s.chosen) {
    const int32_t* at = std::lower_bound(blocks, blocks + candidates, m);
    if (at != blocks + candidates && *at == m) {
      s.taken[at - blocks] = 1;
      --untaken;
    }
  }
  choose_best(values, candidates, count < untaken ? count : untaken, s);
  s.taken.swap(s.block_taken);
  for (size_t j = before; j < s.chosen.size(); ++j) {
    s.chosen[j] = s.candidate_blocks[s.chosen[j]];
    s.taken[s.chosen[j]] = 1;
  }
}

// The rule's selection of a hierarchical query: RowSelection's, with step 4 left to
// `choose(eligible, count)`, which takes the best `count` blocks among the query's candidates.
template <typename Choose>
struct HierarchicalRowSelection : RowSelection<Choose> {
  void take_best_scores(int64_t eligible, int64_t count) { this->score_blocks(eligible, count); }
};

template <typename Choose>
void select_row_hierarchical(const SparseBlockSelectParams& prm, const float* importance, int64_t current,
                             int32_t* row, SelectScratch& s, Choose&& choose) {
  HierarchicalRowSelection<std::remove_reference_t<Choose>> selection{{row, prm.top_k, importance, s, choose}};
  select_blocks(prm, current, selection);
}

// The inputs of work item (b, n), item = b * kv_heads + n.
template <typename TC>
struct SelectItem {
  int64_t index, b, n, past, total;
  const float* importance;  // [M] or null
  const TC* kmax;           // [M, D]
  const TC* kmin;           // [M, D]
  const int8_t* exponent;   // [M] with int8 bounds (a bound is code * 2^e), else null
  const TC* super_max = nullptr;          // [MS, D], or null: the flat selection
  const TC* super_min = nullptr;          // [MS, D]
  const int8_t* super_exponent = nullptr;  // [MS] with int8 bounds
};

// The CPU kernels' walk over items [begin, end): per item, per query i, its output rows (own head
// 0 .. selections - 1, together); rows of a query past total_lens, attending exactly or with its
// chunk are all -1, the others go to select_query_row(item, i, own, p, row) (p: the query's position).
template <typename TC, typename SelectQueryRow>
void for_each_select_row(const SparseBlockSelectParams& prm, int64_t begin, int64_t end,
                         SelectQueryRow&& select_query_row) {
  const int64_t S = prm.query_len, K = prm.top_k, M = prm.num_blocks, D = prm.head_dim, MS = prm.num_superblocks;
  const int64_t selections = selections_per_item(prm);
  for (int64_t index = begin; index < end; ++index) {
    const int64_t b = index / prm.kv_heads;
    const SelectItem<TC> item{index, b, index % prm.kv_heads, prm.past_lens[b], prm.total_lens[b],
                              prm.block_importance ? prm.block_importance + index * M : nullptr,
                              static_cast<const TC*>(prm.block_max) + index * M * D,
                              static_cast<const TC*>(prm.block_min) + index * M * D,
                              prm.block_exponent ? prm.block_exponent + index * M : nullptr,
                              prm.super_max ? static_cast<const TC*>(prm.super_max) + index * MS * D : nullptr,
                              prm.super_min ? static_cast<const TC*>(prm.super_min) + index * MS * D : nullptr,
                              prm.super_exponent ? prm.super_exponent + index * MS : nullptr};
    for (int64_t i = 0; i < S; ++i) {
      const int64_t p = item.past + i;
      for (int64_t own = 0; own < selections; ++own) {
        int32_t* row = prm.block_indices + (index * selections * S + own * S + i) * K;
        if (p >= item.total || selects_no_blocks(prm, b, p))
          std::fill(row, row + K, -1);
        else
          select_query_row(item, i, own, p, row);
      }
    }
  }
}

// A chunk's selection (select_chunk_blocks) into its chunk_indices row: as a query's, with the row
// chunk_top_k wide.
template <typename ScoreBlocks>
void select_chunk_row(const SparseBlockSelectParams& prm, int64_t first_block, int64_t last_block, int32_t* row,
                      SelectScratch& s, ScoreBlocks&& score_blocks) {
  RowSelection<std::remove_reference_t<ScoreBlocks>> selection{row, prm.chunk_top_k, nullptr, s, score_blocks};
  select_chunk_blocks(prm, first_block, last_block, selection);
}

// The CPU kernels' walk over the chunks of items [begin, end) (when the call has chunk_indices):
// rows of chunks without members are all -1, the others go to
// select_chunk(item, members, first_block, last_block, row).
template <typename TC, typename SelectChunk>
void for_each_chunk_row(const SparseBlockSelectParams& prm, int64_t begin, int64_t end, SelectChunk&& select_chunk) {
  if (prm.chunk_indices == nullptr) return;
  const int64_t M = prm.num_blocks, D = prm.head_dim, chunks = num_chunks(prm), P = prm.block_size;
  for (int64_t index = begin; index < end; ++index) {
    const int64_t b = index / prm.kv_heads;
    const SelectItem<TC> item{index, b, index % prm.kv_heads, prm.past_lens[b], prm.total_lens[b], nullptr,
                              static_cast<const TC*>(prm.block_max) + index * M * D,
                              static_cast<const TC*>(prm.block_min) + index * M * D,
                              prm.block_exponent ? prm.block_exponent + index * M : nullptr};
    for (int64_t c = 0; c < chunks; ++c) {
      int32_t* row = prm.chunk_indices + (index * chunks + c) * prm.chunk_top_k;
      const ChunkMembers members = prm.chunk_lens != nullptr ? chunk_members(prm, b, c) : ChunkMembers{0, 0};
      if (members.first >= members.last)
        std::fill(row, row + prm.chunk_top_k, -1);
      else
        select_chunk(item, members, (item.past + members.first) / P, (item.past + members.last - 1) / P, row);
    }
  }
}

}  // namespace quest
