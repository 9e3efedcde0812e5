// The exact (dense causal) walk of SparseBlockAttention over 16-lane vectors: a tile of queries x
// their G heads attends each tile of kExactTile cache positions together, every row in the scalar
// kernel's operation order, so each key and value row is read once per query tile. Chunk queries
// (sparse prefill) take the same walk over the positions inside their chunk's blocks.
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
  std::vector<int64_t> positions;   // a chunk's attended positions, ascending
  std::vector<Half> key_scales, value_scales;  // their int8 rows' scales, gathered
  std::vector<uint8_t> listed;      // [num_blocks]: the blocks of the chunk being walked
  std::vector<std::vector<BlockMass>> masses;
};

// Rows [0, count) of a cache tile as float rows of Dp values (zeros past D).
template <typename TC>
void widen_rows(const TC* rows, int64_t count, int64_t D, int64_t Dp, float* out) {
  for (int64_t t = 0; t < count; ++t) load_padded(rows + t * D, D, out + t * Dp);
}

// The rows at `positions` [count] as float rows of Dp values, and their scales (int8 caches).
template <typename TC>
void gather_rows(const TC* rows, const Half* scales, const int64_t* positions, int64_t count, int64_t D, int64_t Dp,
                 float* out, Half* out_scales) {
  for (int64_t k = 0; k < count; ++k) {
    load_padded(rows + positions[k] * D, D, out + k * Dp);
    if (scales != nullptr) out_scales[k] = scales[positions[k]];
  }
}

// The weights of a step over positions[0 .. count) (ascending), summed per metadata block they hold
// (the k-th in lane k % 16, as the step's own sum), appended to `masses`.
inline void record_masses_at(const float* weights, const int64_t* positions, int64_t count, int64_t P, float max_logit,
                             std::vector<BlockMass>& masses) {
  for (int64_t k = 0; k < count;) {
    const int64_t block = positions[k] / P;
    LaneSum segment;
    for (; k < count && positions[k] / P == block; ++k) segment.add(k, weights[k]);
    masses.push_back(BlockMass{static_cast<int32_t>(block), max_logit, segment.fold()});
  }
}

// Queries [i_begin, i_end) of work item `item` (all valid), each attending every position up to
// its own in spans of kExactTile positions:
//
//   position span:        [0, 64)   [64, 128)   ...   [64 j, p]
//   query tile rows r:    logits (r x span) -> per row: max, rescale, weights -> values (r x D)
//
// Rows end at different positions only in the last spans (the query tile's own positions): there
// each row's positions past its own are masked out of the max and the weights, and its values pass
// stops at its own last position.
// With `listed` (a flag per block: one chunk's blocks, every query of [i_begin, i_end) in that chunk)
// the spans are the positions inside listed blocks, ascending, kExactTile at a time: a span of
// consecutive positions is read where it lies, any other gathered into rows of its own.
template <typename T, typename TC>
void attend_exact(const SparseBlockAttentionParams& prm, int64_t item, int64_t i_begin, int64_t i_end,
                  const ItemCaches<TC>& cache, ExactScratch& s, float* importance, const uint8_t* listed = nullptr) {
  const int64_t S = prm.query_len, D = prm.head_dim, H = prm.num_heads, G = H / prm.kv_heads, Dp = padded(D);
  const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads, past = prm.past_lens[b], P = prm.block_size;
  // About 64 rows share each position span's reads: every loaded key and value row is reused many
  // times, and the rows' state stays in L1/L2.
  const int64_t tile_queries = exact_tile_queries(G), most_rows = tile_queries * G;
  constexpr int64_t Pp = kExactTile;
  // float rows are read where they lie; float16 and int8 rows are widened once per position span
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
  if (widen || listed != nullptr) {
    s.keys.resize(kExactTile * Dp);
    s.values.resize(kExactTile * Dp);
  }
  if (listed != nullptr) {
    s.key_scales.resize(kExactTile);
    s.value_scales.resize(kExactTile);
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
    // The positions the tile's rows attend, ascending: every one up to last_p, or a chunk's listed ones.
    int64_t attended = last_p + 1;
    if (listed != nullptr) {
      s.positions.resize(last_p + 1);
      attended = listed_positions(listed, P, 0, last_p + 1, s.positions.data());
    }
    const auto position = [&](int64_t k) { return listed != nullptr ? s.positions[k] : k; };
    // Whether the span of `count` attended positions from the k-th lie one after another.
    const auto consecutive = [&](int64_t k, int64_t count) { return position(k + count - 1) - position(k) == count - 1; };
    for (int64_t k0 = 0; k0 < attended; k0 += kExactTile) {
      const int64_t span = std::min(kExactTile, attended - k0), t0 = position(k0);
      const int64_t* gathered = consecutive(k0, span) ? nullptr : s.positions.data() + k0;
      // Rows before r0 attend nothing of this span: their positions lie before its first.
      const int64_t r0 = std::max<int64_t>(0, t0 - first_p) * G;
      for (int64_t r = r0; r < rows; ++r) {
        const int64_t p = first_p + r / G;
        s.counts[r] = gathered == nullptr ? std::min(span, p + 1 - t0)
                                          : std::upper_bound(gathered, gathered + span, p) - gathered;
      }
      // `direct`: the rows are read where they lie in the cache (else from a span of widened rows).
      const auto step = [&]<typename TR>(const TR* keys, const TR* values, int64_t stride, bool direct,
                                         const Half* key_scales, const Half* value_scales) {
        RowStream<TR> stream{keys, values, nullptr, span, 0, stride};
        // Rows read where they lie: the key pass prefetches the span's values, the value pass the
        // next span's keys (when they lie one after another too). The hardware prefetchers alone
        // left a decode step's walk over 32K positions 1.3x (int8 rows) to 1.5x (float16) slower
        // (measured); widened rows are in cache.
        const int64_t next = k0 + kExactTile, next_count = std::min(kExactTile, attended - next);
        stream.prefetching = direct;
        if constexpr (std::is_same_v<TR, TC>) {
          if (direct && next < attended && consecutive(next, next_count)) {
            stream.next_keys = cache.keys + position(next) * D;
            stream.next_count = next_count;
          }
        }
        stream.key_scales = key_scales;
        stream.value_scales = value_scales;
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
          if (importance == nullptr) continue;
          if (gathered != nullptr)
            record_masses_at(weights, gathered, s.counts[r], P, s.max_logit[r], s.masses[r]);
          else
            record_masses(weights, t0, s.counts[r], P, s.max_logit[r], s.masses[r]);
        }
        if (stream.value_scales != nullptr) times_row_scales(logits, rows - r0, span, Pp, stream.value_scales);
        step_values(stream, Dp, rows - r0, s.counts.data() + r0, logits, Pp, s.accumulators.data() + r0 * Dp);
      };
      const bool int8 = cache.key_scales != nullptr;
      if (gathered != nullptr) {
        gather_rows(cache.keys, cache.key_scales, gathered, span, D, Dp, s.keys.data(), s.key_scales.data());
        gather_rows(cache.values, cache.value_scales, gathered, span, D, Dp, s.values.data(), s.value_scales.data());
        step(s.keys.data(), s.values.data(), Dp, false, int8 ? s.key_scales.data() : nullptr,
             int8 ? s.value_scales.data() : nullptr);
      } else if (widen) {
        widen_rows(cache.keys + t0 * D, span, D, Dp, s.keys.data());
        widen_rows(cache.values + t0 * D, span, D, Dp, s.values.data());
        step(s.keys.data(), s.values.data(), Dp, false, int8 ? cache.key_scales + t0 : nullptr,
             int8 ? cache.value_scales + t0 : nullptr);
      } else {
        step(cache.keys + t0 * D, cache.values + t0 * D, D, true, int8 ? cache.key_scales + t0 : nullptr,
             int8 ? cache.value_scales + t0 : nullptr);
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
