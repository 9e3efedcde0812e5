// SparseBlockSelect over 16-lane vectors: bound scores in the canonical order, shared selection.
#pragma once

#include <algorithm>
#include <vector>

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

// The G query rows of (b, n, i), zero-padded, into rows [G][Dp].
template <typename T>
void load_group_rows(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, std::vector<float>& rows) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, Dp = padded(D);
  rows.resize(G * Dp);
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

// Bounds of four (query row, block) pairs at once: independent sums, each in canonical order.
// Plain locals (no arrays of vectors) keep the accumulators and pointers in registers.
template <typename TC>
QUEST_INLINE void bounds4(const float* q0, const float* q1, const float* q2, const float* q3, const TC* h0, const TC* h1,
             const TC* h2, const TC* h3, const TC* l0, const TC* l1, const TC* l2, const TC* l3, int64_t D,
             float* out) {
  Lanes a0 = Lanes::zero(), a1 = a0, a2 = a0, a3 = a0;
  const auto term = [](const float* q, const TC* hi, const TC* lo, int64_t d, int64_t D) {
    const Lanes qd = Lanes::load(q + d);
    return Lanes::max_select(qd * load_row(hi, d, D), qd * load_row(lo, d, D));
  };
  int64_t d = 0;
  for (; d + kChunk <= D; d += kChunk) {
    Lanes x0 = Lanes::load(q0 + d), x1 = Lanes::load(q1 + d), x2 = Lanes::load(q2 + d), x3 = Lanes::load(q3 + d);
    a0 = a0 + Lanes::max_select(x0 * Lanes::load(h0 + d), x0 * Lanes::load(l0 + d));
    a1 = a1 + Lanes::max_select(x1 * Lanes::load(h1 + d), x1 * Lanes::load(l1 + d));
    a2 = a2 + Lanes::max_select(x2 * Lanes::load(h2 + d), x2 * Lanes::load(l2 + d));
    a3 = a3 + Lanes::max_select(x3 * Lanes::load(h3 + d), x3 * Lanes::load(l3 + d));
  }
  if (d < D) {
    a0 = a0 + term(q0, h0, l0, d, D);
    a1 = a1 + term(q1, h1, l1, d, D);
    a2 = a2 + term(q2, h2, l2, d, D);
    a3 = a3 + term(q3, h3, l3, d, D);
  }
  Lanes::fold4(a0, a1, a2, a3, out);  // the four canonical folds, shuffled into shared registers
}

template <typename TC>
QUEST_INLINE float bound1(const float* q, const TC* hi, const TC* lo, int64_t D) {
  Lanes acc = Lanes::zero();
  int64_t d = 0;
  for (; d + kChunk <= D; d += kChunk) {
    const Lanes qd = Lanes::load(q + d);
    acc = acc + Lanes::max_select(qd * Lanes::load(hi + d), qd * Lanes::load(lo + d));
  }
  if (d < D) {
    const Lanes qd = Lanes::load(q + d);
    acc = acc + Lanes::max_select(qd * load_partial(hi + d, D - d), qd * load_partial(lo + d, D - d));
  }
  return acc.fold();
}

// The bound of each of `heads` query rows against one block, passed to emit(row, bound) in row
// order: four rows share each read of the block, the one to three left go alone (bounds4 and
// bound1 are the same canonical sum).
template <typename TC, typename Emit>
QUEST_INLINE void for_each_row_bound(const float* rows, int64_t heads, int64_t Dp, const TC* hi, const TC* lo,
                                     int64_t D, Emit&& emit) {
  int64_t g = 0;
  for (; g + 4 <= heads; g += 4) {
    const float* q = rows + g * Dp;
    float bound[4];
    bounds4(q, q + Dp, q + 2 * Dp, q + 3 * Dp, hi, hi, hi, hi, lo, lo, lo, lo, D, bound);
    for (int64_t j = 0; j < 4; ++j) emit(g + j, bound[j]);
  }
  for (; g < heads; ++g) emit(g, bound1(rows + g * Dp, hi, lo, D));
}

// Scores of blocks [0, eligible): `heads` query rows (1 with mean reduction), max-reduced over rows
// in row order. Blocks go strictly in memory order (the access pattern the prefetchers stream best).
// The scores go to the row's top-k heap (`heap`) four blocks at a time as they are written: the
// heap's work then runs while the next blocks' bounds are on their way from memory (after the whole
// scan it left the reads idle: 32K select 8-18% slower from memory, 5% faster from cache), and
// small batches keep its branches out of the scoring loop.
inline constexpr int64_t kOfferBatch = 4;

template <typename TC>
void score_blocks(const float* rows, int64_t heads, int64_t Dp, const TC* kmax, const TC* kmin, int64_t D,
                  int64_t eligible, float* scores, SelectScratch& heap) {
  for (int64_t m = 0; m < eligible; ++m) {
    float score = 0.0f;
    for_each_row_bound(rows, heads, Dp, kmax + m * D, kmin + m * D, D,
                       [&](int64_t g, float bound) { score = g == 0 ? bound : max_select(bound, score); });
    scores[m] = score;
    if ((m + 1) % kOfferBatch == 0) heap.offer_until(scores, m + 1);
  }
}

// Scores of blocks [0, eligible) for each of `heads` query rows on its own: scores[g * eligible + m].
// One pass over the metadata for all the rows, where a pass per row would read it `heads` times.
template <typename TC>
void score_blocks_per_row(const float* rows, int64_t heads, int64_t Dp, const TC* kmax, const TC* kmin, int64_t D,
                          int64_t eligible, float* scores) {
  for (int64_t m = 0; m < eligible; ++m)
    for_each_row_bound(rows, heads, Dp, kmax + m * D, kmin + m * D, D,
                       [&](int64_t g, float bound) { scores[g * eligible + m] = bound; });
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

template <typename T, typename TC>
void sparse_block_select_items(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, K = prm.top_k, P = prm.block_size, M = prm.num_blocks, D = prm.head_dim;
  const int64_t Dp = padded(D), selections = selections_per_item(prm);
  thread_local SelectScratch scratch;
  SelectScratch& s = scratch;  // one TLS lookup: each use of a thread_local in a shared library is a call
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const float* importance = prm.block_importance ? prm.block_importance + item * M : nullptr;
    const TC* kmax = static_cast<const TC*>(prm.block_max) + item * M * D;
    const TC* kmin = static_cast<const TC*>(prm.block_min) + item * M * D;
    // With a selection per query head and bound scores, the heads of query i score in one shared
    // pass (on the first head that needs scores; the others need them too: same blocks eligible,
    // same forced blocks, same importance).
    const bool shared_pass = selections > 1 && prm.score == ScoreMode::Bound;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t p = past + i;
      bool scored = false;
      for (int64_t own = 0; own < selections; ++own) {  // output row (own head, query i)
        int32_t* row = prm.block_indices + (item * selections * S + own * S + i) * K;
        if (p >= total || attends_exactly(prm, b, p)) {
          std::fill(row, row + K, -1);
          continue;
        }
        select_row(prm, importance, p / P, row, s, [&](int64_t eligible, float* scores) {
          if (shared_pass) {
            if (!scored) {
              load_group_rows<T>(prm, b, n, i, s.query);
              s.head_scores.resize(selections * eligible);
              score_blocks_per_row(s.query.data(), selections, Dp, kmax, kmin, D, eligible, s.head_scores.data());
              scored = true;
            }
            const float* own_scores = s.head_scores.data() + own * eligible;
            std::copy(own_scores, own_scores + eligible, scores);
          } else {
            const int64_t heads = load_query_rows<T>(prm, b, n, i, own, s.query);
            if (prm.score == ScoreMode::Probe)
              probe_blocks<T, TC>(prm, item, p, heads, eligible, s.query.data(), Dp, s.key, scores);
            else
              score_blocks(s.query.data(), heads, Dp, kmax, kmin, D, eligible, scores, s);
          }
        });
      }
    }
  }
}

}  // namespace quest::QUEST_ISA
