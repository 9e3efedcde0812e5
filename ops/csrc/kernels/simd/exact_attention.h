// The exact (dense causal) walk of SparseBlockAttention over 16-lane vectors: a tile of queries x
// their G heads attends each tile of kExactTile cache positions together, every row in the scalar
// kernel's operation order, so each key and value row is read once per query tile.
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "../sparse_block_attention.h"
#include "attention_tiles.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

// Query rows (queries x G heads) up to which an item's float16 or int8 rows are read where they lie.
inline constexpr int64_t kDirectNarrowRows = 8;

struct ExactScratch {
  std::vector<float> queries, accumulators, max_logit, denominator, logits;  // per row
  std::vector<float> new_max, rescale;  // per row
  std::vector<float> keys, values;  // a float16 (or unpadded) position tile widened to float rows
  std::vector<int64_t> counts;      // positions of the current tile each row attends
  std::vector<std::vector<BlockMass>> masses;
};

// Rows [0, count) of a cache tile as float rows of Dp values (zeros past D).
template <typename TC>
void widen_rows(const TC* rows, int64_t count, int64_t D, int64_t Dp, float* out) {
  for (int64_t t = 0; t < count; ++t) load_padded(rows + t * D, D, out + t * Dp);
}

// Queries [i_begin, i_end) of work item `item` (all valid), each attending every position up to
// its own in tiles of kExactTile positions:
//
//   position tile:        [0, 64)   [64, 128)   ...   [64 j, p]
//   query tile rows r:    logits (r x tile) -> per row: max, rescale, weights -> values (r x D)
//
// Rows end at different positions only in the last tiles (the query tile's own positions): there
// each row's positions past its own are masked out of the max and the weights, and its values pass
// stops at its own last position.
template <typename T, typename TC>
void attend_exact(const SparseBlockAttentionParams& prm, int64_t item, int64_t i_begin, int64_t i_end,
                  const ItemCaches<TC>& cache, ExactScratch& s, float* importance) {
  const int64_t S = prm.query_len, D = prm.head_dim, H = prm.num_heads, G = H / prm.kv_heads, Dp = padded(D);
  const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads, past = prm.past_lens[b], P = prm.block_size;
  // About 64 rows share each position tile's reads: every loaded key and value row is reused many
  // times, and the rows' state stays in L1/L2.
  const int64_t tile_queries = exact_tile_queries(G), most_rows = tile_queries * G;
  constexpr int64_t Pp = kExactTile;
  // float rows are read where they lie; float16 and int8 rows are widened once per position tile
  // when many rows read each of them (int8 rows without their scales, applied per row). A few rows
  // (a decode step's G heads) read them where they lie too: widening, a store and a reload of every
  // row, then cost more than the rows' own arithmetic.
  constexpr bool narrow = !std::is_same_v<TC, float>;
  s.queries.resize(most_rows * Dp);
  s.accumulators.resize(most_rows * Dp);
  s.max_logit.resize(most_rows);
  s.denominator.resize(most_rows);
  s.logits.resize(most_rows * Pp);
  s.counts.resize(most_rows);
  s.new_max.resize(most_rows);
  s.rescale.resize(most_rows);
  if (static_cast<int64_t>(s.masses.size()) < most_rows) s.masses.resize(most_rows);  // lists keep their storage
  const bool widen = narrow && (i_end - i_begin) * G > kDirectNarrowRows;
  if (widen) {
    s.keys.resize(kExactTile * Dp);
    s.values.resize(kExactTile * Dp);
  }
  const T* query = static_cast<const T*>(prm.query) + (b * H + n * G) * S * D;
  for (int64_t i0 = i_begin; i0 < i_end; i0 += tile_queries) {
    const int64_t rows = std::min(tile_queries, i_end - i0) * G;
    for (int64_t r = 0; r < rows; ++r) {
      load_padded(query + ((r % G) * S + i0 + r / G) * D, D, s.queries.data() + r * Dp);
      if (importance != nullptr) s.masses[r].clear();
    }
    std::fill(s.accumulators.begin(), s.accumulators.begin() + rows * Dp, 0.0f);
    std::fill(s.max_logit.begin(), s.max_logit.begin() + rows, -std::numeric_limits<float>::infinity());
    std::fill(s.denominator.begin(), s.denominator.begin() + rows, kNothingAttended);
    const int64_t first_p = past + i0, last_p = first_p + rows / G - 1;
    for (int64_t t0 = 0; t0 <= last_p; t0 += kExactTile) {
      const int64_t span = std::min(kExactTile, last_p + 1 - t0);
      const int64_t r0 = std::max<int64_t>(0, t0 - first_p) * G;  // rows before r0 ended before this tile
      for (int64_t r = r0; r < rows; ++r) s.counts[r] = std::min(span, first_p + r / G + 1 - t0);
      const auto step = [&]<typename TR>(const TR* keys, const TR* values, int64_t stride) {
        RowStream<TR> stream{keys, values, nullptr, span, 0, stride};
        // Rows read where they lie: the key pass prefetches the tile's values, the value pass the
        // next tile's keys. The hardware prefetchers alone left a decode step's walk over 32K
        // positions 1.3x (int8 rows) to 1.5x (float16) slower (measured); widened rows are in cache.
        const int64_t next_t0 = t0 + kExactTile;
        stream.prefetching = !widen;
        if (!widen && next_t0 <= last_p) {
          stream.next_keys = keys + kExactTile * stride;
          stream.next_count = std::min(kExactTile, last_p + 1 - next_t0);
        }
        if (cache.key_scales != nullptr) {
          stream.key_scales = cache.key_scales + t0;
          stream.value_scales = cache.value_scales + t0;
        }
        float* logits = s.logits.data() + r0 * Pp;
        step_logits(s.queries.data() + r0 * Dp, rows - r0, Dp, stream, Pp, prm, logits);
        // Each row's softmax step, in three passes so that the rows' rescale factors come from
        // one vector exp per 16 rows instead of a scalar exp (a long chain of dependent operations)
        // per row: the same values, in the same order for every row.
        for (int64_t r = r0; r < rows; ++r) s.new_max[r] = step_max(s.logits.data() + r * Pp, s.counts[r], s.max_logit[r]);
        for (int64_t r = r0; r < rows; r += kChunk) {
          const int64_t n = std::min<int64_t>(kChunk, rows - r);
          store_partial(exp_lanes(load_partial(s.max_logit.data() + r, n) - load_partial(s.new_max.data() + r, n)),
                        s.rescale.data() + r, n);
        }
        for (int64_t r = r0; r < rows; ++r) {
          float* weights = s.logits.data() + r * Pp;
          weigh_step(weights, s.counts[r], s.new_max[r], s.rescale[r], s.max_logit[r], s.denominator[r],
                     s.accumulators.data() + r * Dp, Dp);
          if (importance != nullptr) record_masses(weights, t0, s.counts[r], P, s.max_logit[r], s.masses[r]);
        }
        if (stream.value_scales != nullptr) times_row_scales(logits, rows - r0, span, Pp, stream.value_scales);
        step_values(stream, Dp, rows - r0, s.counts.data() + r0, logits, Pp, s.accumulators.data() + r0 * Dp);
      };
      if (widen) {
        widen_rows(cache.keys + t0 * D, span, D, Dp, s.keys.data());
        widen_rows(cache.values + t0 * D, span, D, Dp, s.values.data());
        step(s.keys.data(), s.values.data(), Dp);
      } else {
        step(cache.keys + t0 * D, cache.values + t0 * D, D);
      }
    }
    for (int64_t r = 0; r < rows; r += G) {  // query i0 + r / G: its G rows
      const QueryState query_rows{s.queries.data() + r * Dp, s.accumulators.data() + r * Dp, s.max_logit.data() + r,
                                  s.denominator.data() + r, s.masses.data() + r};
      finish_query(query_rows, G, D, Dp, static_cast<T*>(prm.output) + (b * S + i0 + r / G) * H * D + n * G * D,
                   importance);
    }
  }
}

}  // namespace quest::QUEST_ISA
