// The attention's register tiles over 16-lane vectors, shared by the sparse and the exact walks:
// logits of query rows against key rows, one online-softmax step per row, weighted value rows.
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "../block_mass.h"
#include "../sparse_block_attention.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

// Prefetches of a contiguous byte range (the rows of the next phase) spread evenly over `ticks`
// calls of tick(), one per step of the phase's arithmetic: requests go out at an even pace while
// the arithmetic runs, and the memory never idles. Bursts of whole rows, or passes that asked for
// nothing, left it idle (10-30% slower than this, measured).
struct SpreadPrefetch {
  const char* next;
  const char* end;
  int64_t lines_per_tick;

  SpreadPrefetch(const void* begin, int64_t bytes, int64_t ticks)
      : next(static_cast<const char*>(begin)), end(begin == nullptr ? nullptr : next + bytes),
        lines_per_tick(((bytes + 63) / 64 + ticks - 1) / std::max<int64_t>(1, ticks)) {}

  bool active() const { return next < end; }

  QUEST_INLINE void tick() {
    for (int64_t i = 0; i < lines_per_tick && next < end; ++i, next += 64) __builtin_prefetch(next, 0, 2);
  }
};

// The unfolded canonical sums of `Heads` (1 to 4) query rows against `Rows` consecutive key rows
// (`D` apart, D values each) into acc[h * Rows + r], each key chunk loaded once for all the heads.
// `Full`: D is a multiple of 16 (widened rows), no chunk is partial; `Prefetching`: each chunk
// ticks `ahead` (else it is not touched). Both are compile-time, so the loop holds only loads and
// multiply-adds. An ISA with a tile of its own for 2 x 2 (AVX2: Lanes::logits_2x2) takes it there.
template <int Heads, int Rows, bool Full, bool Prefetching, typename TC>
QUEST_INLINE void accumulate_logits(const float* q, int64_t Dp, const TC* keys, int64_t D, Lanes* acc,
                                    SpreadPrefetch* ahead) {
  using Tile = std::conditional_t<Heads == 4, Lanes, Lanes>;  // dependent: looked up only if used
  if constexpr (Heads == 2 && Rows == 2 && Full && std::is_same_v<TC, float> && Tile::kLogits2x2) {
    Tile::logits_2x2(q, q + Dp, keys, keys + D, D, acc, [&] {
      if constexpr (Prefetching) ahead->tick();
    });
    return;
  }
  unrolled<Heads * Rows>([&](auto j) { acc[j] = Lanes::zero(); });
  for (int64_t d = 0; d < D; d += kChunk) {
    if constexpr (Prefetching) ahead->tick();
    Lanes x[Heads];
    unrolled<Heads>([&](auto h) { x[h] = Lanes::load(q + h * Dp + d); });
    unrolled<Rows>([&](auto r) {
      const Lanes k = load_lanes<Full>(keys + r * D, d, D);
      unrolled<Heads>([&](auto h) { acc[h * Rows + r] = Lanes::fma(x[h], k, acc[h * Rows + r]); });
    });
  }
}

// logits[h * Pp + t] = fused dot(query row h, key row t) for `Heads` (1 to 4) query rows and `Rows`
// consecutive key rows: Heads x Rows independent canonical sums in registers, then folded.
template <int Heads, int Rows, bool Full, bool Prefetching, typename TC>
QUEST_INLINE void logits_tile(const float* q, int64_t Dp, const TC* keys, int64_t D, float* logits, int64_t Pp,
                              SpreadPrefetch* ahead) {
  static_assert(Heads >= 1 && Heads <= 4, "one to four query rows per tile");
  Lanes acc[Heads * Rows];
  accumulate_logits<Heads, Rows, Full, Prefetching>(q, Dp, keys, D, acc, ahead);
  using Tile = std::conditional_t<Heads == 4, Lanes, Lanes>;  // dependent: fold16 is looked up only if used
  if constexpr (Heads == 4 && Rows == 4 && Tile::kFold16) {
    Tile::fold16(acc, logits, Pp);
    return;
  }
  if constexpr (Heads == 2 && Rows == 2) {  // the four sums folded together
    float folded[4];
    Lanes::fold4(acc[0], acc[1], acc[2], acc[3], folded);
    for (int j = 0; j < 4; ++j) logits[(j / Rows) * Pp + j % Rows] = folded[j];
    return;
  }
  unrolled<Rows>([&](auto r) {
    if constexpr (Heads == 4) {
      float folded[4];
      Lanes::fold4(acc[r], acc[Rows + r], acc[2 * Rows + r], acc[3 * Rows + r], folded);
      for (int h = 0; h < 4; ++h) logits[h * Pp + r] = folded[h];
    } else {
      unrolled<Heads>([&](auto h) { logits[h * Pp + r] = acc[h * Rows + r].fold(); });
    }
  });
}

// The key and value rows a step attends (`count` rows, `D` apart) and the next step's keys, which
// the step's value passes prefetch (its key pass prefetches its own values).
template <typename TC>
struct RowStream {
  const TC* keys;
  const TC* values;
  const TC* next_keys;  // null: nothing to prefetch after this step
  int64_t count, next_count, D;
  bool prefetching = true;  // off when the rows are already in cache (a query tile's later queries)
  const Half* key_scales = nullptr;    // int8 caches: the rows' scales; null for float caches
  const Half* value_scales = nullptr;

  int64_t row_bytes() const { return D * static_cast<int64_t>(sizeof(TC)); }
};

// Logits of `Heads` query rows (from g) against every key row of the step, each step of the
// arithmetic prefetching its share of the value rows.
template <int Heads, typename TC>
QUEST_INLINE void head_logits(const float* queries, int64_t g, int64_t Dp, const RowStream<TC>& rows, int64_t Pp,
                              float* logits, SpreadPrefetch& values) {
  constexpr int kRows = Lanes::tile_rows(Heads);
  const TC* keys = rows.keys;
  const int64_t count = rows.count, D = rows.D;
  const auto walk = [&]<bool Full, bool Prefetching>() {
    // A local copy: its cursor stays in a register across the tiles (through `values` it went to
    // memory and back at every tick).
    SpreadPrefetch ahead = values;
    int64_t t = 0;
    for (; t + kRows <= count; t += kRows)
      logits_tile<Heads, kRows, Full, Prefetching>(queries + g * Dp, Dp, keys + t * D, D, logits + g * Pp + t, Pp,
                                                   &ahead);
    for (; t < count; ++t)
      logits_tile<Heads, 1, Full, Prefetching>(queries + g * Dp, Dp, keys + t * D, D, logits + g * Pp + t, Pp, &ahead);
    values = ahead;
  };
  const bool full = D % kChunk == 0, prefetching = values.active();
  if (full && !prefetching)
    walk.template operator()<true, false>();
  else if (full)
    walk.template operator()<true, true>();
  else
    walk.template operator()<false, true>();
}

// Steps head_logits makes for `rows_count` query rows in groups of Lanes::kLogitHeads (tiles of key
// rows x 16-lane chunks, one tick each): what the prefetches are spread over.
inline int64_t key_pass_steps(int64_t count, int64_t D, int64_t rows_count) {
  const auto group = [&](int64_t heads) {
    const int64_t rows = Lanes::tile_rows(static_cast<int>(heads));
    return (count / rows + count % rows) * ((D + kChunk - 1) / kChunk);
  };
  constexpr int64_t kHeads = Lanes::kLogitHeads;
  return rows_count / kHeads * group(kHeads) + (rows_count % kHeads != 0 ? group(rows_count % kHeads) : 0);
}

// x[g * Pp + t] *= scales[t] for `rows_count` rows and positions [0, count): an int8 cache's row
// scales on the logits (before the logit scale) or on the weights (before the values). Lanes past
// count get 0: scratch there, never read.
QUEST_INLINE void times_row_scales(float* x, int64_t rows_count, int64_t count, int64_t Pp, const Half* scales) {
  for (int64_t t = 0; t < count; t += kChunk) {
    const Lanes row_scales = load_row(scales, t, count);
    for (int64_t g = 0; g < rows_count; ++g) (Lanes::load(x + g * Pp + t) * row_scales).store(x + g * Pp + t);
  }
}

// Scaled (and soft-capped) logits [rows][count] of `rows` query rows against key rows [0, count):
// Lanes::kLogitHeads rows at a time, then the ones left.
template <typename TC>
void step_logits(const float* queries, int64_t rows_count, int64_t Dp, const RowStream<TC>& rows, int64_t Pp,
                 const SparseBlockAttentionParams& prm, float* logits) {
  const int64_t count = rows.count;
  const int64_t steps = key_pass_steps(count, rows.D, rows_count);
  SpreadPrefetch values(rows.prefetching ? rows.values : nullptr, count * rows.row_bytes(), steps);
  int64_t g = 0;
  constexpr int kHeads = Lanes::kLogitHeads;
  for (; g + kHeads <= rows_count; g += kHeads) head_logits<kHeads>(queries, g, Dp, rows, Pp, logits, values);
  switch (rows_count - g) {
    case 3: head_logits<3>(queries, g, Dp, rows, Pp, logits, values); break;
    case 2: head_logits<2>(queries, g, Dp, rows, Pp, logits, values); break;
    case 1: head_logits<1>(queries, g, Dp, rows, Pp, logits, values); break;
    default: break;
  }
  if (rows.key_scales != nullptr) times_row_scales(logits, rows_count, count, Pp, rows.key_scales);
  // The scale on whole vectors (the lanes past count hold scratch, overwritten before any use).
  const Lanes scale = Lanes::broadcast(prm.scale);
  for (g = 0; g < rows_count; ++g)
    for (int64_t t = 0; t < count; t += kChunk) (Lanes::load(logits + g * Pp + t) * scale).store(logits + g * Pp + t);
  if (prm.softcap > 0.0f)
    for (g = 0; g < rows_count; ++g)
      for (int64_t t = 0; t < count; ++t)
        logits[g * Pp + t] = prm.softcap * canonical_tanh(logits[g * Pp + t] / prm.softcap);
}

// The max of a step's `count` scaled logits (row t in lane t % 16) and the running max: the step's
// new running max, or NaN when a logit poisons the row (NaN or +inf; the NaN then stays, as
// max_select(x, NaN) is NaN). The logits past count, up to the padded width, become -inf (they
// add nothing to the max and weigh exp(-inf) = 0).
QUEST_INLINE float step_max(float* logits, int64_t count, float max_logit) {
  int poisoned = 0;  // an int: GCC vectorizes the int reduction only
  for (int64_t t = 0; t < count; ++t) poisoned |= poisons_row(logits[t]);
  std::fill(logits + count, logits + padded(count), -std::numeric_limits<float>::infinity());
  Lanes lane_max = Lanes::broadcast(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < count; t += kChunk) lane_max = Lanes::max_select(Lanes::load(logits + t), lane_max);
  return poisoned ? canonical_nan() : max_select(lane_max.fold_max(), max_logit);
}

// The rest of the step, given its new max and rescale = exp(old max - new max): the head's state
// rescaled, the weights written over the logits, their sum added to the denominator.
QUEST_INLINE void weigh_step(float* logits, int64_t count, float new_max, float rescale, float& max_logit,
                             float& denominator, float* accumulator, int64_t Dp) {
  denominator = denominator * rescale;
  if (rescale != 1.0f) {  // x * 1 is x, bit for bit (NaN, infinities and signed zeros too): skip the pass
    const Lanes scale_lanes = Lanes::broadcast(rescale);
    for (int64_t d = 0; d < Dp; d += kChunk) (Lanes::load(accumulator + d) * scale_lanes).store(accumulator + d);
  }
  const Lanes shift = Lanes::broadcast(new_max);
  Lanes lane_sum = Lanes::zero();
  for (int64_t t = 0; t < count; t += kChunk) {
    const Lanes w = exp_lanes(Lanes::load(logits + t) - shift);
    w.store(logits + t);
    lane_sum = lane_sum + w;
  }
  denominator = denominator + lane_sum.fold();
  max_logit = new_max;
}

// One head's online-softmax step over its `count` scaled logits: the max, the rescale of the head's
// state, and the weights written over the logits.
QUEST_INLINE void softmax_step(float* logits, int64_t count, float& max_logit, float& denominator, float* accumulator,
                               int64_t Dp) {
  const float new_max = step_max(logits, count, max_logit);
  weigh_step(logits, count, new_max, canonical_exp(max_logit - new_max), max_logit, denominator, accumulator, Dp);
}

// The weights of a step over positions [first, first + count), summed per metadata block it
// overlaps (position t in lane (t - first) % 16, as the step's own sum), appended to `masses`.
inline void record_masses(const float* weights, int64_t first, int64_t count, int64_t P, float max_logit,
                          std::vector<BlockMass>& masses) {
  for (int64_t block = first / P; block * P < first + count; ++block) {
    LaneSum segment;
    for (int64_t t = std::max(first, block * P); t < std::min(first + count, (block + 1) * P); ++t)
      segment.add(t - first, weights[t - first]);
    masses.push_back(BlockMass{static_cast<int32_t>(block), max_logit, segment.fold()});
  }
}

// One query's online-softmax state: its G query rows and, per head, the accumulator, the running
// max and denominator, and the mass of each block it attended (for block_importance).
struct QueryState {
  float* queries;       // [G][Dp]
  float* accumulators;  // [G][Dp]
  float* max_logit;     // [G]
  float* denominator;   // [G]
  std::vector<BlockMass>* masses;  // [G]

  // The state of the heads from g on.
  QueryState heads(int64_t g, int64_t Dp) const {
    return {queries + g * Dp, accumulators + g * Dp, max_logit + g, denominator + g, masses + g};
  }
};

// Writes the query's normalised output and adds its blocks' attention mass to `importance`; NaN
// where the contract says so (docs/ops.md, non-finite numbers).
template <typename T>
void finish_query(const QueryState& q, int64_t G, int64_t D, int64_t Dp, T* out, float* importance) {
  for (int64_t g = 0; g < G; ++g) {
    const float* acc = q.accumulators + g * Dp;
    const float denominator = q.denominator[g];
    const bool nan_row = is_nan_row(q.max_logit[g], denominator);
    const Lanes denominators = Lanes::broadcast(denominator);
    for (int64_t d = 0; d < D; d += kChunk) {
      const Lanes result = nan_row             ? Lanes::broadcast(canonical_nan())
                           : denominator > 0.0f ? Lanes::finite_or_nan(Lanes::load(acc + d) / denominators)
                                                : Lanes::zero();
      store_row(result, out + g * D, d, D);
    }
    if (importance != nullptr)
      add_masses(q.masses[g], q.max_logit[g], q.denominator[g], importance);
  }
}

// accumulators[h] = fma(weights[h * Pp + t], value row t, accumulators[h]) for t = first .. count-1
// in order, for `Heads` heads and `Chunks` 16-lane chunks from d: the accumulators stay in registers
// across the rows. `Partial`: the chunks may run past D (zeros there); otherwise loaded unchecked.
template <int Heads, int Chunks, bool Partial, typename TC>
QUEST_INLINE void value_tile(const TC* values, int64_t first, int64_t count, int64_t D, int64_t d,
                             const float* weights, int64_t Pp, float* accumulators, int64_t Dp, SpreadPrefetch& ahead) {
  Lanes acc[Heads * Chunks];
  unrolled<Heads>([&](auto h) {
    unrolled<Chunks>([&](auto c) { acc[h * Chunks + c] = Lanes::load(accumulators + h * Dp + d + c * kChunk); });
  });
  SpreadPrefetch local = ahead;  // in registers across the rows (as head_logits' copy)
  for (int64_t t = first; t < count; ++t) {
    local.tick();
    const TC* v = values + t * D;
    Lanes w[Heads];
    unrolled<Heads>([&](auto h) { w[h] = Lanes::broadcast(weights[h * Pp + t]); });
    unrolled<Chunks>([&](auto c) {
      const Lanes x = Partial ? load_row(v, d + c * kChunk, D) : Lanes::load(v + d + c * kChunk);
      unrolled<Heads>([&](auto h) { acc[h * Chunks + c] = Lanes::fma(w[h], x, acc[h * Chunks + c]); });
    });
  }
  unrolled<Heads>([&](auto h) {
    unrolled<Chunks>([&](auto c) { acc[h * Chunks + c].store(accumulators + h * Dp + d + c * kChunk); });
  });
  ahead = local;
}

// Passes head_values makes over the value rows for `rows_count` rows in groups of four (one per
// group of chunks, a tick per row each): what the prefetches are spread over.
inline int64_t value_passes(int64_t Dp, int64_t rows_count) {
  const auto group = [&](int64_t heads) {
    const int64_t width = Lanes::value_chunks(static_cast<int>(heads)) * kChunk;
    return Dp / width + (Dp % width) / kChunk;
  };
  return rows_count / 4 * group(4) + (rows_count % 4 != 0 ? group(rows_count % 4) : 0);
}

// Adds the weighted value rows [first, count) to the accumulators of `Heads` heads, chunk group by
// chunk group.
template <int Heads, typename TC>
QUEST_INLINE void head_values(const TC* values, int64_t first, int64_t count, int64_t D, int64_t Dp,
                              const float* weights, int64_t Pp, float* accumulators, SpreadPrefetch& ahead) {
  constexpr int kChunks = Lanes::value_chunks(Heads);
  int64_t d = 0;
  for (; d + kChunks * kChunk <= D; d += kChunks * kChunk)
    value_tile<Heads, kChunks, false>(values, first, count, D, d, weights, Pp, accumulators, Dp, ahead);
  for (; d + kChunks * kChunk <= Dp; d += kChunks * kChunk)
    value_tile<Heads, kChunks, true>(values, first, count, D, d, weights, Pp, accumulators, Dp, ahead);
  for (; d < Dp; d += kChunk)
    value_tile<Heads, 1, true>(values, first, count, D, d, weights, Pp, accumulators, Dp, ahead);
}

// Adds the step's weighted value rows to the accumulators of `rows_count` rows, in row order: four
// rows at a time over the rows all of them attend, then each row alone over the rest of its own
// (`counts[r]` rows for row r, non-decreasing in r; null: every row attends rows.count). Every
// pass over the rows prefetches its share of the next step's keys.
template <typename TC>
void step_values(const RowStream<TC>& rows, int64_t Dp, int64_t rows_count, const int64_t* counts,
                 const float* weights, int64_t Pp, float* accumulators) {
  const TC* values = rows.values;
  const int64_t D = rows.D;
  const auto count_of = [&](int64_t r) { return counts == nullptr ? rows.count : counts[r]; };
  const int64_t value_rows = value_passes(Dp, rows_count) * rows.count;
  SpreadPrefetch ahead(rows.prefetching ? rows.next_keys : nullptr, rows.next_count * rows.row_bytes(), value_rows);
  const auto group = [&]<int Heads>(int64_t g) {
    const int64_t common = count_of(g);
    head_values<Heads>(values, 0, common, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, ahead);
    for (int64_t r = g + 1; r < g + Heads; ++r)
      if (count_of(r) > common)
        head_values<1>(values, common, count_of(r), D, Dp, weights + r * Pp, Pp, accumulators + r * Dp, ahead);
  };
  int64_t g = 0;
  for (; g + 4 <= rows_count; g += 4) group.template operator()<4>(g);
  switch (rows_count - g) {
    case 3: group.template operator()<3>(g); break;
    case 2: group.template operator()<2>(g); break;
    case 1: group.template operator()<1>(g); break;
    default: break;
  }
}

}  // namespace quest::QUEST_ISA
