// SparseBlockSelect over 16-lane vectors: bound scores in the canonical order, shared selection.
#pragma once

#include <vector>

#include "../select_order.h"
#include "../sparse_block_select.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

// The G query rows of (b, n, i), zero-padded; with mean reduction reduced to one row. Returns rows.
template <typename T>
int64_t load_query_rows(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, std::vector<float>& rows) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, S = prm.query_len, Dp = padded(D);
  const T* query = static_cast<const T*>(prm.query) + (((b * prm.num_heads) + n * G) * S + i) * D;
  rows.resize(G * Dp);
  for (int64_t g = 0; g < G; ++g) load_padded(query + g * S * D, D, rows.data() + g * Dp);
  if (prm.reduce == GroupReduce::Max) return G;
  const Lanes heads = Lanes::broadcast(static_cast<float>(G));
  for (int64_t d = 0; d < Dp; d += kChunk) {
    Lanes total = Lanes::load(rows.data() + d);
    for (int64_t g = 1; g < G; ++g) total = total + Lanes::load(rows.data() + g * Dp + d);
    (total / heads).store(rows.data() + d);
  }
  return 1;
}

template <typename TC>
float bound(const float* q, const TC* kmax, const TC* kmin, int64_t D) {
  Lanes acc = Lanes::zero();
  for (int64_t d = 0; d < D; d += kChunk) {
    const Lanes qd = Lanes::load(q + d);
    acc = acc + Lanes::max_select(qd * load_row(kmax, d, D), qd * load_row(kmin, d, D));
  }
  return acc.fold();
}

template <typename T, typename TC>
void sparse_block_select_items(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, K = prm.top_k, P = prm.block_size, M = prm.num_blocks, D = prm.head_dim;
  const int64_t Dp = padded(D);
  thread_local SelectScratch s;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const float* importance = prm.block_importance ? prm.block_importance + item * M : nullptr;
    const TC* kmax = static_cast<const TC*>(prm.block_max) + item * M * D;
    const TC* kmin = static_cast<const TC*>(prm.block_min) + item * M * D;
    for (int64_t i = 0; i < S; ++i) {
      int32_t* row = prm.block_indices + (item * S + i) * K;
      const int64_t p = past + i;
      if (p >= total) {
        std::fill(row, row + K, -1);
        continue;
      }
      select_row(prm, importance, p / P, row, s, [&](int64_t eligible, float* scores) {
        const int64_t heads = load_query_rows<T>(prm, b, n, i, s.query);
        const float* q = s.query.data();
        for (int64_t m = 0; m < eligible; ++m) {
          float score = bound(q, kmax + m * D, kmin + m * D, D);
          for (int64_t g = 1; g < heads; ++g) score = max_select(bound(q + g * Dp, kmax + m * D, kmin + m * D, D), score);
          scores[m] = score;
        }
      });
    }
  }
}

}  // namespace quest::QUEST_ISA
