// SparseBlockSelect over 16-lane vectors: bound scores in the canonical order, shared selection.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../chunk_rows.h"
#include "../int8_bounds.h"
#include "../select_order.h"
#include "../sparse_block_select.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

// Query head g of KV head n's group at (b, i): a row of D values.
template <typename T>
const T* group_query_row(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t g, int64_t i) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, S = prm.query_len;
  return static_cast<const T*>(prm.query) + ((b * prm.num_heads + n * G + g) * S + i) * D;
}

// Rows rounded up to whole tiles of four (the scoring's tiles; rows past the real ones are zeros).
inline int64_t whole_tiles(int64_t rows) { return (rows + 3) / 4 * 4; }

// The G query rows of (b, n, i), zero-padded, into rows [G][Dp]; with `heads` above G, rows of
// zeros after them (scored like the others and ignored: whole tiles of four rows).
template <typename T>
void load_group_rows(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, std::vector<float>& rows,
                     int64_t heads = 0) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, Dp = padded(D);
  rows.assign(std::max(G, heads) * Dp, 0.0f);
  for (int64_t g = 0; g < G; ++g) load_padded(group_query_row<T>(prm, b, n, g, i), D, rows.data() + g * Dp);
}

// The G query rows of (b, n, i), zero-padded; with mean reduction reduced to one row; with no
// reduction row `own` of the group alone. Returns rows.
template <typename T>
int64_t load_query_rows(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, int64_t own,
                        std::vector<float>& rows) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, Dp = padded(D);
  if (prm.reduce == GroupReduce::None) {
    rows.resize(Dp);
    load_padded(group_query_row<T>(prm, b, n, own, i), D, rows.data());
    return 1;
  }
  load_group_rows<T>(prm, b, n, i, rows);
  if (prm.reduce == GroupReduce::Max) return G;
  const Lanes heads = Lanes::broadcast(static_cast<float>(G));
  for (int64_t d = 0; d < Dp; d += kChunk) {
    Lanes total = Lanes::load(rows.data() + d);
    for (int64_t g = 1; g < G; ++g) total = total + Lanes::load(rows.data() + g * Dp + d);
    (total / heads).store(rows.data() + d);
  }
  return 1;
}

// Query rows [heads][Dp] with, per lane, the mask of q > 0 (Lanes::positive_mask), made once per
// query for every block it scores, and whether the rows hold no infinity (see ordered_term). With
// int8 bounds the rows are quantized (quantize_rows) and `factor` holds each row's a / 127.
struct BoundRows {
  const float* rows;
  const float* positive;
  int64_t heads, Dp;
  bool no_infinity;
  const float* factor = nullptr;
};

inline BoundRows bound_rows(const float* rows, int64_t heads, int64_t Dp, std::vector<float>& positive,
                            const float* factor = nullptr) {
  positive.resize(heads * Dp);
  for (int64_t j = 0; j < heads * Dp; j += kChunk) Lanes::positive_mask(Lanes::load(rows + j)).store(positive.data() + j);
  const bool no_infinity = std::none_of(rows, rows + heads * Dp, [](float q) { return std::isinf(q); });
  return {rows, positive.data(), heads, Dp, no_infinity, factor};
}

// int8 bounds: each of the rows [heads][Dp] (D values, zeros past D) quantized in place to its signed
// magnitudes (quantize_query_row), their factors into `factor`. The codes then score as floats: every
// term and partial sum is an integer below 2^24, so the float sums are the exact integer bound
// in any order, and the ordered form q * (q > 0 ? hi : lo) is the contract's term (+-0 rows add 0).
inline const float* quantize_rows(float* rows, int64_t heads, int64_t Dp, int64_t D, std::vector<float>& factor) {
  factor.resize(heads);
  for (int64_t g = 0; g < heads; ++g) factor[g] = quantize_query_row(rows + g * Dp, D, rows + g * Dp);
  return factor.data();
}

// The G query rows of (b, n, i) prepared for scoring each on its own (a selection per query head):
// loaded into whole tiles of four (rows of zeros after the G), quantized for int8 bounds, and
// `heads` = G, the rows that count: the padding may be scored, its scores are never read.
template <typename T, typename TC>
BoundRows group_bound_rows(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, SelectScratch& s) {
  const int64_t G = prm.num_heads / prm.kv_heads, tiles = whole_tiles(G), D = prm.head_dim, Dp = padded(D);
  load_group_rows<T>(prm, b, n, i, s.query, tiles);
  const float* factor = nullptr;
  if constexpr (kInt8Bounds<TC>) factor = quantize_rows(s.query.data(), tiles, Dp, D, s.row_factor);
  BoundRows rows = bound_rows(s.query.data(), tiles, Dp, s.query_positive, factor);
  rows.heads = G;
  return rows;
}

// The canonical bound term max(q * hi, q * lo) (`a > b ? a : b`) of a chunk whose lanes all hold
// hi >= lo, for a query with no infinite lane: there it is q * (q > 0 ? hi : lo), value for value
// (monotone rounding; a NaN q, or q = 0 against an infinite bound, gives what the max gives), so
// one select and one multiply replace two multiplies and a max. Only zero signs may differ (+0 for
// -0), and a lane summed from +0 cannot tell them apart. An infinite q breaks it (q = +inf,
// hi = 0 > lo: NaN here, -inf from the max), so such queries take the general form throughout.
// Real bounds and queries always take this path.
QUEST_INLINE Lanes ordered_term(Lanes q, Lanes positive, Lanes hi, Lanes lo) { return q * Lanes::select_bits(positive, hi, lo); }
QUEST_INLINE Lanes general_term(Lanes q, Lanes hi, Lanes lo) { return Lanes::max_select(q * hi, q * lo); }

// Bounds of `Rows` query rows (1 to 4, from row g; q and positive masks) against one block:
// independent sums, each in canonical order, to out[0 .. Rows-1]. Each chunk of the block's bounds
// is loaded once for the rows; the accumulators are indexed by constants only (unrolled), so they
// stay in registers.
template <int Rows, typename TC>
QUEST_INLINE void row_bounds(const BoundRows& r, int64_t g, const TC* hi, const TC* lo, int64_t D, float* out) {
  static_assert(Rows >= 1 && Rows <= 4);
  const float* q = r.rows + g * r.Dp;
  const float* positive = r.positive + g * r.Dp;
  Lanes acc[4];
  unrolled<4>([&](auto k) { acc[k] = Lanes::zero(); });
  const auto chunk = [&](int64_t d, Lanes h, Lanes l) QUEST_INLINE_LAMBDA {
    // int8 bounds always take the ordered form: it is their term even where max < min.
    if (kInt8Bounds<TC> || (r.no_infinity && Lanes::all_at_least(h, l))) {
      unrolled<Rows>([&](auto k) {
        acc[k] = acc[k] + ordered_term(Lanes::load(q + k * r.Dp + d), Lanes::load(positive + k * r.Dp + d), h, l);
      });
    } else {
      unrolled<Rows>([&](auto k) { acc[k] = acc[k] + general_term(Lanes::load(q + k * r.Dp + d), h, l); });
    }
  };
  int64_t d = 0;
  for (; d + kChunk <= D; d += kChunk) chunk(d, Lanes::load(hi + d), Lanes::load(lo + d));
  if (d < D) chunk(d, load_partial(hi + d, D - d), load_partial(lo + d, D - d));  // zero past D, like q
  if constexpr (Rows == 1) {
    out[0] = acc[0].fold();
  } else {
    float folded[4];
    Lanes::fold4(acc[0], acc[1], acc[2], acc[3], folded);  // the canonical folds, shuffled into shared registers
    std::copy_n(folded, Rows, out);
  }
}

// Bounds of four query rows (from row g) against four consecutive blocks (rows of D values from
// hi and lo): the sixteen sums row_bounds<4> makes, each in the same canonical order, to
// out[row * stride + block]. Each chunk of the query rows is loaded once for the four blocks, and
// one 4 x 4 fold (fold16) replaces four fold4s: per block this leaves the scoring arithmetic and
// little else. Every chunk takes the ordered form (ordered_term) while a mask register collects,
// without a branch, whether every lane of every chunk allowed it; where one did not (max < min, a
// NaN bound, an infinite query lane: never for bounds QuestMetadata wrote and real queries), the
// four blocks are scored again chunk by chunk as row_bounds does. For ISAs with fold16 and lane
// masks (AVX-512: Lanes::kFold16).
template <typename TC>
QUEST_INLINE void bounds4x4(const BoundRows& r, int64_t g, const TC* hi, const TC* lo, int64_t D, float* out,
                            int64_t stride) {
  using Tile = std::conditional_t<sizeof(TC) != 0, Lanes, Lanes>;  // dependent: looked up only if used
  const float* q = r.rows + g * r.Dp;
  const float* positive = r.positive + g * r.Dp;
  Lanes acc[16];  // acc[4 * row + block], the layout fold16 folds
  unrolled<16>([&](auto j) { acc[j] = Lanes::zero(); });
  typename Tile::LaneMask ordered = Tile::kAllLanes;
  const auto chunk = [&](int64_t d, auto&& load_bound) QUEST_INLINE_LAMBDA {
    Lanes x[4], p[4];
    unrolled<4>([&](auto h) {
      x[h] = Lanes::load(q + h * r.Dp + d);
      p[h] = Lanes::load(positive + h * r.Dp + d);
    });
    unrolled<4>([&](auto b) {
      const Lanes h = load_bound(hi + b * D), l = load_bound(lo + b * D);
      ordered = Tile::still_at_least(ordered, h, l);
      unrolled<4>([&](auto k) { acc[4 * k + b] = acc[4 * k + b] + ordered_term(x[k], p[k], h, l); });
    });
  };
  int64_t d = 0;
  for (; d + kChunk <= D; d += kChunk) chunk(d, [&](const TC* row) { return Lanes::load(row + d); });
  if (d < D) chunk(d, [&](const TC* row) { return load_partial(row + d, D - d); });  // zero past D, like q
  if (kInt8Bounds<TC> || (r.no_infinity && ordered == Tile::kAllLanes)) [[likely]] {
    Tile::fold16(acc, out, stride);
    return;
  }
  for (int64_t b = 0; b < 4; ++b) {
    float bound[4];
    row_bounds<4>(r, g, hi + b * D, lo + b * D, D, bound);
    for (int64_t k = 0; k < 4; ++k) out[k * stride + b] = bound[k];
  }
}

// The bound of each query row against one block, passed to emit(row, bound) in row order: four
// rows share each read of the block, then the one to three left share one (row_bounds is the same
// canonical sum for any number of rows). One row at a time, a group of two (Qwen3-0.6B's) converted
// each chunk of float16 bounds twice.
template <typename TC, typename Emit>
QUEST_INLINE void for_each_row_bound(const BoundRows& r, const TC* hi, const TC* lo, int64_t D, Emit&& emit) {
  float bound[4];
  int64_t g = 0;
  for (; g + 4 <= r.heads; g += 4) {
    row_bounds<4>(r, g, hi, lo, D, bound);
    for (int64_t j = 0; j < 4; ++j) emit(g + j, bound[j]);
  }
  const int64_t left = r.heads - g;
  if (left == 0) return;
  if (left == 1) row_bounds<1>(r, g, hi, lo, D, bound);
  if (left == 2) row_bounds<2>(r, g, hi, lo, D, bound);
  if (left == 3) row_bounds<3>(r, g, hi, lo, D, bound);
  for (int64_t j = 0; j < left; ++j) emit(g + j, bound[j]);
}

// Block `m`'s bounds on their way to the cache while earlier blocks are scored, when m is in range.
// The scan reads two streams per KV head (max and min); measured on cold data at 32K, the hardware
// prefetchers alone left the scoring waiting on memory.
inline constexpr int64_t kPrefetchBlocks = 32;

template <typename TC>
QUEST_INLINE void prefetch_bounds(const TC* kmax, const TC* kmin, int64_t m, int64_t eligible, int64_t D) {
  if (m >= eligible) return;
  const char* hi = reinterpret_cast<const char*>(kmax + m * D);
  const char* lo = reinterpret_cast<const char*>(kmin + m * D);
  for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(TC)); byte += 64) {
    __builtin_prefetch(hi + byte);
    __builtin_prefetch(lo + byte);
  }
}

// Scores of blocks [0, eligible): the query rows (1 with mean reduction), max-reduced over rows
// in row order. Blocks go strictly in memory order (the access pattern the prefetchers stream best).
// The scores go to the row's selection (`selection.offer_until`) four blocks at a time as they are
// written: its work then runs while the next blocks' bounds are on their way from memory (after the
// whole scan it left the reads idle: 32K select 8-18% slower from memory, 5% faster from cache),
// and small batches keep its branches out of the scoring loop.
inline constexpr int64_t kOfferBatch = 4;

// int8 bounds score integers: the integer bound I of blocks [m, m + count) of each of `rows` rows
// (scores[row * stride + block]) becomes (I * the row's factor) * the block's 2^e (NaN for a
// non-finite block), two products in the scalar kernel's order (with one row per selection there
// is no reduction between them).
QUEST_INLINE void scale_blocks(float* scores, int64_t rows, int64_t stride, int64_t m, int64_t count,
                               const int8_t* exponent, const float* factor) {
  for (int64_t j = m; j < m + count; ++j) {
    const float scale = exponent_scale(exponent[j]);
    for (int64_t g = 0; g < rows; ++g) scores[g * stride + j] = (scores[g * stride + j] * factor[g]) * scale;
  }
}

// An ISA with an integer dot product of bytes scores int8 bounds with it (QUEST_INT8_DOT names its
// header: integer_score_blocks, integer_score_blocks_per_row); the others score the codes as floats.
#if defined(QUEST_INT8_DOT)
#include QUEST_INT8_DOT
#endif

template <typename TC>
void score_blocks(const BoundRows& r, const TC* kmax, const TC* kmin, const int8_t* exponent, int64_t D,
                  int64_t eligible, float* scores, SelectScratch& selection) {
#if defined(QUEST_INT8_DOT)
  if constexpr (kInt8Bounds<TC>) {
    const int64_t rows = r.heads == 1 ? 1 : whole_tiles(r.heads);  // the mean row alone, else tiles of four
    return integer_score_blocks(byte_rows(r, rows, D, selection), kmax, kmin, exponent, D, eligible, scores,
                                selection);
  }
#endif
  for (int64_t m = 0; m < eligible; ++m) {
    prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
    float score = 0.0f;
    for_each_row_bound(r, kmax + m * D, kmin + m * D, D, [&](int64_t g, float bound) {
      if constexpr (kInt8Bounds<TC>) bound = bound * r.factor[g];  // the row's score, before the reduction
      score = g == 0 ? bound : max_select(bound, score);
    });
    if constexpr (kInt8Bounds<TC>) score = score * exponent_scale(exponent[m]);  // before the selection sees it
    scores[m] = score;
    if ((m + 1) % kOfferBatch == 0) selection.offer_until(scores, m + 1);
  }
}

// Scores of blocks [0, eligible) for each query row on its own: scores[g * eligible + m], for
// rows padded to a multiple of four (load_group_rows). One pass over the metadata for all the
// rows, where a pass per row would read it once per row; four blocks at a time (bounds4x4) where
// the ISA keeps their sixteen sums in registers.
inline constexpr int64_t kBlockTile = 4;

template <typename TC>
void score_blocks_per_row(const BoundRows& r, const TC* kmax, const TC* kmin, const int8_t* exponent, int64_t D,
                          int64_t eligible, float* scores, SelectScratch& scratch) {
  // Sixteen accumulators stay in registers only where a Lanes is one register (AVX-512; AVX2 and
  // NEON hold a Lanes in two and four, and spill): the others score block by block.
  using Tile = std::conditional_t<sizeof(TC) != 0, Lanes, Lanes>;  // dependent: kFold16 is looked up per ISA
#if defined(QUEST_INT8_DOT)
  if constexpr (kInt8Bounds<TC>) {
    const int64_t rows = whole_tiles(r.heads);
    return integer_score_blocks_per_row(byte_rows(r, rows, D, scratch), rows, kmax, kmin, exponent, D, eligible, scores);
  }
#endif
  static_cast<void>(scratch);  // byte rows of the integer dot product only
  int64_t m = 0;
  if constexpr (Tile::kFold16) {
    for (; m + kBlockTile <= eligible; m += kBlockTile) {
      for (int64_t ahead = m + kPrefetchBlocks; ahead < m + kPrefetchBlocks + kBlockTile; ++ahead)
        prefetch_bounds(kmax, kmin, ahead, eligible, D);
      for (int64_t g = 0; g < r.heads; g += 4)
        bounds4x4(r, g, kmax + m * D, kmin + m * D, D, scores + g * eligible + m, eligible);
      if constexpr (kInt8Bounds<TC>) scale_blocks(scores, r.heads, eligible, m, kBlockTile, exponent, r.factor);
    }
  }
  for (; m < eligible; ++m) {
    prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
    for_each_row_bound(r, kmax + m * D, kmin + m * D, D, [&](int64_t g, float bound) { scores[g * eligible + m] = bound; });
    if constexpr (kInt8Bounds<TC>) scale_blocks(scores, r.heads, eligible, m, 1, exponent, r.factor);
  }
}

// score_blocks for many rows (a chunk's): the rows' bounds max-reduced in row order, as score_blocks
// reduces them, but where the ISA keeps sixteen sums in registers (Lanes::kFold16) four rows against
// four blocks at a time (bounds4x4), each block's bounds read once per four rows from L1 instead of
// once per row. `rows` holds r.heads rows padded with rows of zeros to a multiple of four (scored,
// never reduced). Float bounds only: int8 ones take score_blocks (an integer dot product, or floats).
template <typename TC>
void score_blocks_many_rows(const BoundRows& r, const TC* kmax, const TC* kmin, const int8_t* exponent, int64_t D,
                            int64_t eligible, float* scores, SelectScratch& selection) {
  using Tile = std::conditional_t<sizeof(TC) != 0, Lanes, Lanes>;  // dependent: kFold16 is looked up per ISA
  if constexpr (kInt8Bounds<TC> || !Tile::kFold16) {
    return score_blocks(r, kmax, kmin, exponent, D, eligible, scores, selection);
  } else {
    int64_t m = 0;
    float tile[4 * kBlockTile];  // [row][block] of one 4 x 4 tile
    for (; m + kBlockTile <= eligible; m += kBlockTile) {
      for (int64_t ahead = m + kPrefetchBlocks; ahead < m + kPrefetchBlocks + kBlockTile; ++ahead)
        prefetch_bounds(kmax, kmin, ahead, eligible, D);
      for (int64_t g = 0; g < r.heads; g += 4) {
        bounds4x4(r, g, kmax + m * D, kmin + m * D, D, tile, kBlockTile);
        for (int64_t k = 0; k < 4 && g + k < r.heads; ++k)
          for (int64_t j = 0; j < kBlockTile; ++j)
            scores[m + j] = g + k == 0 ? tile[k * kBlockTile + j] : max_select(tile[k * kBlockTile + j], scores[m + j]);
      }
      selection.offer_until(scores, m + kBlockTile);
    }
    for (; m < eligible; ++m) {
      float score = 0.0f;
      for_each_row_bound(r, kmax + m * D, kmin + m * D, D, [&](int64_t g, float bound) {
        score = g == 0 ? bound : max_select(bound, score);
      });
      scores[m] = score;
    }
  }
}

// Probe scores, as the scalar kernel orders them: per block, probes in order, rows in order.
template <typename T, typename TC>
void probe_blocks(const SparseBlockSelectParams& prm, int64_t item, int64_t p, int64_t heads, int64_t eligible,
                  const float* rows, int64_t Dp, std::vector<float>& key_row, float* scores) {
  const int64_t D = prm.head_dim, P = prm.block_size, S = prm.query_len, C = prm.capacity;
  const int64_t past = prm.past_lens[item / prm.kv_heads];
  const TC* cache = static_cast<const TC*>(prm.key_cache) + item * C * D;
  const T* fresh = static_cast<const T*>(prm.key) + item * S * D;
  key_row.resize(Dp);
  float* key = key_row.data();
  for (int64_t m = 0; m < eligible; ++m) {
    float best = 0.0f;
    const int64_t probes = probe_count(m, p, P, prm.num_probes);
    for (int64_t j = 0; j < probes; ++j) {
      const int64_t t = probe_position(m, p, P, prm.num_probes, j);
      for (int64_t d = 0; d < D; d += kChunk) {  // a new key as the cache will hold it
        const Lanes k = t < past ? load_row(cache + t * D, d, D) : round_to<TC>(load_row(fresh + (t - past) * D, d, D));
        k.store(key + d);
      }
      for (int64_t r = 0; r < heads; ++r) {
        const float value = dot(rows + r * Dp, key, D);
        best = (j == 0 && r == 0) ? value : max_select(value, best);
      }
    }
    scores[m] = best;
  }
}

// A scorer of runs of an item's blocks, for query rows prepared once: score(kmax, kmin, exponent,
// count, out) writes the scores of `count` consecutive blocks, per row ([row][count], PerRow: as
// score_blocks_per_row) or reduced (as score_blocks; its offers go to a selection that keeps none).
// The hierarchical selection scores many short runs per query: with int8 bounds and an integer dot
// product the byte rows are made here once, not once per run (where they cost more than the run).
template <bool PerRow, typename TC>
auto run_scorer(const BoundRows& rows, int64_t D, SelectScratch& s) {
#if defined(QUEST_INT8_DOT)
  if constexpr (kInt8Bounds<TC>) {
    // Byte rows in whole tiles of four (the mean row alone): rows.heads of them count.
    const int64_t count_rows = !PerRow && rows.heads == 1 ? 1 : whole_tiles(rows.heads);
    const ByteRows bytes = byte_rows(rows, count_rows, D, s);
    return [bytes, count_rows, D, &s](const TC* kmax, const TC* kmin, const int8_t* exponent, int64_t count,
                                      float* out) {
      if constexpr (PerRow)
        integer_score_blocks_per_row(bytes, count_rows, kmax, kmin, exponent, D, count, out);
      else
        integer_score_blocks(bytes, kmax, kmin, exponent, D, count, out, s);
    };
  } else
#endif
  {
    return [rows, D, &s](const TC* kmax, const TC* kmin, const int8_t* exponent, int64_t count, float* out) {
      if constexpr (PerRow)
        score_blocks_per_row(rows, kmax, kmin, exponent, D, count, out, s);
      else
        score_blocks(rows, kmax, kmin, exponent, D, count, out, s);
    };
  }
}

// Step 4 of a hierarchical query (docs/ops.md, hierarchical selection). With a selection per query
// head, the group's heads score the superblocks and the candidates' blocks in one shared pass (each
// candidate superblock's blocks, four rows at a time, into [rows][candidate blocks]) on the first
// head of the query, recorded in `scored_query`; the others choose from it. Else the query's rows
// (reduced) score the superblocks, then the candidates' blocks. Scans here offer nothing (the
// candidates' best come after them): begin_best(0).
template <typename T, typename TC>
void choose_hierarchically(const SparseBlockSelectParams& prm, const SelectItem<TC>& item, int64_t i, int64_t own,
                           int64_t p, int64_t eligible, int64_t count, SelectScratch& s, int64_t& scored_query) {
  const int64_t D = prm.head_dim, Dp = padded(D), U = prm.superblock_size;
  const int64_t eligible_super = (p / prm.block_size) / U + 1, keep_super = candidate_superblocks(prm);
  // score(first block, blocks, position among candidates) per run of consecutive candidate
  // superblocks, ascending (fewer, longer runs: each run costs a call and its tail). Software
  // prefetches of the next runs' bounds were tried: 1, 4 or 12 superblocks ahead measured alike.
  const auto for_each_candidate = [&](auto&& score) {
    const std::vector<int32_t>& supers = s.candidate_superblocks;
    const int64_t count = static_cast<int64_t>(supers.size());
    int64_t at = 0;
    for (int64_t j = 0; j < count;) {
      int64_t end = j + 1;
      while (end < count && supers[end] == supers[end - 1] + 1) ++end;
      const int64_t first = supers[j] * U, blocks = std::min(supers[end - 1] * U + U, eligible) - first;
      score(first, blocks, at);
      at += blocks;
      j = end;
    }
  };
  const auto exponent_at = [&](int64_t first) { return item.exponent ? item.exponent + first : nullptr; };
  if (prm.reduce == GroupReduce::None) {
    const int64_t G = prm.num_heads / prm.kv_heads, tiles = whole_tiles(G);
    if (scored_query != item.index * prm.query_len + i) {
      const auto score = run_scorer<true, TC>(group_bound_rows<T, TC>(prm, item.b, item.n, i, s), D, s);
      s.super_scores.resize(tiles * eligible_super);
      score(item.super_max, item.super_min, item.super_exponent, eligible_super, s.super_scores.data());
      collect_candidates(s.super_scores.data(), G, eligible_super, keep_super, U, eligible, s);
      const int64_t candidates = static_cast<int64_t>(s.candidate_blocks.size());
      s.candidate_head_scores.resize(tiles * candidates);
      s.candidate_scores.resize(tiles * candidates);  // one run's [rows][blocks]
      for_each_candidate([&](int64_t first, int64_t blocks, int64_t at) {
        score(item.kmax + first * D, item.kmin + first * D, exponent_at(first), blocks, s.candidate_scores.data());
        for (int64_t g = 0; g < G; ++g)
          std::copy_n(s.candidate_scores.data() + g * blocks, blocks, s.candidate_head_scores.data() + g * candidates + at);
      });
      scored_query = item.index * prm.query_len + i;
    }
    choose_best_candidates(s.candidate_head_scores.data() + own * static_cast<int64_t>(s.candidate_blocks.size()),
                           count, s);
    return;
  }
  const int64_t heads = load_query_rows<T>(prm, item.b, item.n, i, own, s.query);
  const float* factor = nullptr;
  if constexpr (kInt8Bounds<TC>) factor = quantize_rows(s.query.data(), heads, Dp, D, s.row_factor);
  const auto score = run_scorer<false, TC>(bound_rows(s.query.data(), heads, Dp, s.query_positive, factor), D, s);
  s.begin_best(0);
  s.super_scores.resize(eligible_super);
  score(item.super_max, item.super_min, item.super_exponent, eligible_super, s.super_scores.data());
  collect_candidates(s.super_scores.data(), 1, eligible_super, keep_super, U, eligible, s);
  s.candidate_scores.resize(s.candidate_blocks.size());
  for_each_candidate([&](int64_t first, int64_t blocks, int64_t at) {
    score(item.kmax + first * D, item.kmin + first * D, exponent_at(first), blocks, s.candidate_scores.data() + at);
  });
  choose_best_candidates(s.candidate_scores.data(), count, s);
}

// Items [begin, end) with the calling thread's scratch `s`. Not inlined into the caller that looks
// the thread_local up: in a shared library every use of a thread_local may be a __tls_get_addr call
// (the compiler re-derives its address in loops), a plain reference stays in a register.
template <typename T, typename TC>
[[gnu::noinline]] void select_items_with(const SparseBlockSelectParams& prm, int64_t begin, int64_t end,
                                         SelectScratch& s) {
  const int64_t S = prm.query_len, P = prm.block_size, D = prm.head_dim;
  const int64_t Dp = padded(D), selections = selections_per_item(prm);
  // With a selection per query head and bound scores, the heads of query i score in one shared
  // pass (on the first head that needs scores; the others need them too: same blocks eligible,
  // same forced blocks, same importance).
  const bool shared_pass = selections > 1 && prm.score == ScoreMode::Bound;
  int64_t scored_query = -1;  // item * S + i of the query whose heads' scores s.head_scores holds
  // A chunk's rows (its pool groups x G heads) score as the "max" reduction's rows of one query.
  for_each_chunk_row<TC>(prm, begin, end, [&](const SelectItem<TC>& item, ChunkMembers members, int64_t first_block,
                                              int64_t last_block, int32_t* row) {
    select_chunk_row(prm, first_block, last_block, row, s, [&](int64_t eligible, float* scores) {
      const int64_t rows = load_chunk_rows<T>(prm, item.b, item.n, members.first / prm.chunk_size, members, Dp,
                                              s.query);
      s.query.resize(whole_tiles(rows) * Dp, 0.0f);  // rows of zeros to whole tiles of four (never reduced)
      const float* factor = nullptr;
      if constexpr (kInt8Bounds<TC>) factor = quantize_rows(s.query.data(), rows, Dp, D, s.row_factor);
      BoundRows bound = bound_rows(s.query.data(), whole_tiles(rows), Dp, s.query_positive, factor);
      bound.heads = rows;  // the rows that count: the padding is scored, never reduced
      score_blocks_many_rows(bound, item.kmax, item.kmin, item.exponent, D, eligible, scores, s);
    });
  });
  int64_t candidates_query = -1;  // item * S + i of the query whose candidates' scores s holds (hierarchical)
  for_each_select_row<TC>(prm, begin, end, [&](const SelectItem<TC>& item, int64_t i, int64_t own, int64_t p,
                                               int32_t* row) {
    if (selects_hierarchically(prm, p / P)) {
      select_row_hierarchical(prm, item.importance, p / P, row, s, [&](int64_t eligible, int64_t count) {
        choose_hierarchically<T, TC>(prm, item, i, own, p, eligible, count, s, candidates_query);
      });
      return;
    }
    if (shared_pass) {
      select_row(prm, item.importance, p / P, row, s, [&](int64_t eligible, float*) -> const float* {
        if (scored_query != item.index * S + i) {
          s.head_scores.resize(whole_tiles(selections) * eligible);  // the padding rows' scores too (tiles of four)
          score_blocks_per_row(group_bound_rows<T, TC>(prm, item.b, item.n, i, s), item.kmax, item.kmin,
                               item.exponent, D, eligible, s.head_scores.data(), s);
          scored_query = item.index * S + i;
        }
        return s.head_scores.data() + own * eligible;
      });
      return;
    }
    select_row(prm, item.importance, p / P, row, s, [&](int64_t eligible, float* scores) {
      const int64_t heads = load_query_rows<T>(prm, item.b, item.n, i, own, s.query);
      if constexpr (!kInt8Bounds<TC>) {
        if (prm.score == ScoreMode::Probe)
          return probe_blocks<T, TC>(prm, item.index, p, heads, eligible, s.query.data(), Dp, s.key, scores);
      }
      const float* factor = nullptr;
      if constexpr (kInt8Bounds<TC>) factor = quantize_rows(s.query.data(), heads, Dp, D, s.row_factor);
      score_blocks(bound_rows(s.query.data(), heads, Dp, s.query_positive, factor), item.kmax, item.kmin,
                   item.exponent, D, eligible, scores, s);
    });
  });
}

template <typename T, typename TC>
void sparse_block_select_items(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  thread_local SelectScratch scratch;
  select_items_with<T, TC>(prm, begin, end, scratch);
}

}  // namespace quest::QUEST_ISA
