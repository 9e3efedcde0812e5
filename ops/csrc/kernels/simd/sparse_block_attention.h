// SparseBlockAttention over 16-lane vectors: cache write and block-wise online softmax, with the
// scalar kernel's exact operation order (per block: logits, block max, rescale, weights, values).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "../sparse_block_attention.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

template <typename T, typename TC>
void write_cache_items(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, C = prm.capacity;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const T* key = static_cast<const T*>(prm.key) + item * S * D;
    const T* value = static_cast<const T*>(prm.value) + item * S * D;
    TC* key_cache = static_cast<TC*>(prm.key_cache) + item * C * D;
    TC* value_cache = static_cast<TC*>(prm.value_cache) + item * C * D;
    for (int64_t p = past; p < total; ++p) {
      for (int64_t d = 0; d < D; d += kChunk) {
        store_row(load_row(key + (p - past) * D, d, D), key_cache + p * D, d, D);
        store_row(load_row(value + (p - past) * D, d, D), value_cache + p * D, d, D);
      }
    }
  }
}

// logits[h * Pp + t] = dot(query row h, key row t) for `Heads` (1 to 4) query rows and `Rows`
// consecutive key rows: Heads x Rows independent canonical sums in registers, each key chunk
// loaded once for all the heads.
template <int Heads, int Rows, typename TC>
QUEST_INLINE void logits_tile(const float* q, int64_t Dp, const TC* keys, int64_t D, float* logits, int64_t Pp) {
  static_assert(Heads >= 1 && Heads <= 4, "one to four query rows per tile");
  Lanes acc[Heads * Rows];
  for (int j = 0; j < Heads * Rows; ++j) acc[j] = Lanes::zero();
  for (int64_t d = 0; d < D; d += kChunk) {
    Lanes x[Heads];
    for (int h = 0; h < Heads; ++h) x[h] = Lanes::load(q + h * Dp + d);
    for (int r = 0; r < Rows; ++r) {
      const Lanes k = load_row(keys + r * D, d, D);
      for (int h = 0; h < Heads; ++h) acc[h * Rows + r] = acc[h * Rows + r] + x[h] * k;
    }
  }
  for (int r = 0; r < Rows; ++r) {
    if constexpr (Heads == 4) {
      float folded[4];
      Lanes::fold4(acc[r], acc[Rows + r], acc[2 * Rows + r], acc[3 * Rows + r], folded);
      for (int h = 0; h < 4; ++h) logits[h * Pp + r] = folded[h];
    } else {
      for (int h = 0; h < Heads; ++h) logits[h * Pp + r] = acc[h * Rows + r].fold();
    }
  }
}

// The rows a block reads in order (its keys, then its values), and the next block's keys after
// them: prefetch(i) asks for the row kAhead rows past row i of that sequence.
template <typename TC>
struct RowStream {
  static constexpr int64_t kAhead = 16;
  const TC* keys;
  const TC* values;
  const TC* next_keys;  // null after the last block
  int64_t count, next_count, D;

  QUEST_INLINE void prefetch(int64_t i) const {
    int64_t row = i + kAhead;
    if (row < count) return prefetch_row(keys + row * D, D);
    row -= count;
    if (row < count) return prefetch_row(values + row * D, D);
    row -= count;
    if (next_keys != nullptr && row < next_count) prefetch_row(next_keys + row * D, D);
  }
};

// Logits of `Heads` query rows (from g) against every key row of the block; the pass that reads
// the keys first (`stream`) also prefetches ahead of them.
template <int Heads, typename TC>
QUEST_INLINE void head_logits(const float* queries, int64_t g, int64_t Dp, const RowStream<TC>& rows, int64_t Pp,
                              float* logits, bool stream) {
  constexpr int kRows = Lanes::kTileRows;
  const TC* keys = rows.keys;
  const int64_t count = rows.count, D = rows.D;
  int64_t t = 0;
  for (; t + kRows <= count; t += kRows) {
    if (stream)
      for (int r = 0; r < kRows; ++r) rows.prefetch(t + r);
    logits_tile<Heads, kRows>(queries + g * Dp, Dp, keys + t * D, D, logits + g * Pp + t, Pp);
  }
  for (; t < count; ++t) {
    if (stream) rows.prefetch(t);
    logits_tile<Heads, 1>(queries + g * Dp, Dp, keys + t * D, D, logits + g * Pp + t, Pp);
  }
}

// Scaled (and soft-capped) logits [G][count] of the G query rows against key rows [0, count):
// four heads at a time, then the one to three left.
template <typename TC>
void block_logits(const float* queries, int64_t G, int64_t Dp, const RowStream<TC>& rows, int64_t Pp,
                  const SparseBlockAttentionParams& prm, float* logits) {
  const int64_t count = rows.count;
  int64_t g = 0;
  for (; g + 4 <= G; g += 4) head_logits<4>(queries, g, Dp, rows, Pp, logits, g == 0);
  switch (G - g) {
    case 3: head_logits<3>(queries, g, Dp, rows, Pp, logits, g == 0); break;
    case 2: head_logits<2>(queries, g, Dp, rows, Pp, logits, g == 0); break;
    case 1: head_logits<1>(queries, g, Dp, rows, Pp, logits, g == 0); break;
    default: break;
  }
  for (g = 0; g < G; ++g) {
    for (int64_t t = 0; t < count; ++t) {
      float logit = logits[g * Pp + t] * prm.scale;
      if (prm.softcap > 0.0f) logit = prm.softcap * canonical_tanh(logit / prm.softcap);
      logits[g * Pp + t] = logit;
    }
  }
}

// accumulators[h] += weights[h * Pp + t] * value row t, for t = 0 .. count-1 in order, for `Heads`
// heads and `Chunks` 16-lane chunks from d: the accumulators stay in registers across the rows.
template <int Heads, int Chunks, typename TC>
QUEST_INLINE void value_tile(const TC* values, int64_t count, int64_t D, int64_t d, const float* weights, int64_t Pp,
                             float* accumulators, int64_t Dp, const RowStream<TC>* rows) {
  Lanes acc[Heads * Chunks];
  for (int h = 0; h < Heads; ++h)
    for (int c = 0; c < Chunks; ++c) acc[h * Chunks + c] = Lanes::load(accumulators + h * Dp + d + c * kChunk);
  for (int64_t t = 0; t < count; ++t) {
    if (rows != nullptr) rows->prefetch(count + t);
    const TC* v = values + t * D;
    Lanes w[Heads];
    for (int h = 0; h < Heads; ++h) w[h] = Lanes::broadcast(weights[h * Pp + t]);
    for (int c = 0; c < Chunks; ++c) {
      const Lanes x = load_row(v, d + c * kChunk, D);
      for (int h = 0; h < Heads; ++h) acc[h * Chunks + c] = acc[h * Chunks + c] + w[h] * x;
    }
  }
  for (int h = 0; h < Heads; ++h)
    for (int c = 0; c < Chunks; ++c) acc[h * Chunks + c].store(accumulators + h * Dp + d + c * kChunk);
}

// Adds the weighted value rows to the accumulators of `Heads` heads, chunk group by chunk group;
// the first pass over the rows (while `first` is set) prefetches ahead of them.
template <int Heads, typename TC>
QUEST_INLINE void head_values(const TC* values, int64_t count, int64_t D, int64_t Dp, const float* weights,
                              int64_t Pp, float* accumulators, const RowStream<TC>*& first) {
  constexpr int kChunks = Lanes::kValueChunks;
  int64_t d = 0;
  for (; d + kChunks * kChunk <= Dp; d += kChunks * kChunk, first = nullptr)
    value_tile<Heads, kChunks>(values, count, D, d, weights, Pp, accumulators, Dp, first);
  for (; d < Dp; d += kChunk, first = nullptr)
    value_tile<Heads, 1>(values, count, D, d, weights, Pp, accumulators, Dp, first);
}

// Adds the block's weighted value rows to the G accumulators, in row order: four heads at a
// time, then the one to three left.
template <typename TC>
void block_values(const RowStream<TC>& rows, int64_t Dp, int64_t G, const float* weights, int64_t Pp,
                  float* accumulators) {
  const TC* values = rows.values;
  const int64_t count = rows.count, D = rows.D;
  const RowStream<TC>* first = &rows;
  int64_t g = 0;
  for (; g + 4 <= G; g += 4)
    head_values<4>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, first);
  switch (G - g) {
    case 3: head_values<3>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, first); break;
    case 2: head_values<2>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, first); break;
    case 1: head_values<1>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, first); break;
    default: break;
  }
}

struct BlockMass {
  int32_t block;
  float max_logit;
  float weight_sum;
};

struct AttentionScratch {
  std::vector<float> queries, accumulators, logits, weights, max_logit, denominator;
  std::vector<int32_t> blocks;
  std::vector<BlockMass> masses;
};

template <typename T, typename TC>
void attention_items(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, C = prm.capacity, P = prm.block_size;
  const int64_t H = prm.num_heads, G = H / prm.kv_heads, K = prm.top_k, Dp = padded(D);
  const int64_t Pp = padded(rows_per_block(prm));
  thread_local AttentionScratch s;
  s.queries.resize(G * Dp);
  s.accumulators.resize(G * Dp);
  s.logits.resize(G * Pp);
  s.weights.resize(G * Pp);
  s.max_logit.resize(G);
  s.denominator.resize(G);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const TC* key_cache = static_cast<const TC*>(prm.key_cache) + item * C * D;
    const TC* value_cache = static_cast<const TC*>(prm.value_cache) + item * C * D;
    float* importance = prm.block_importance ? prm.block_importance + item * prm.num_blocks : nullptr;
    if (importance) std::fill(importance, importance + prm.num_blocks, 0.0f);
    for (int64_t i = 0; i < S; ++i) {
      T* out = static_cast<T*>(prm.output) + (b * S + i) * H * D + n * G * D;
      const int64_t p = past + i;
      if (p >= total) {
        std::fill(out, out + G * D, from_float<T>(0.0f));
        continue;
      }
      s.blocks.clear();
      if (prm.block_indices) {
        const int32_t* row = prm.block_indices + (item * S + i) * K;
        for (int64_t j = 0; j < K; ++j)
          if (row[j] >= 0) s.blocks.push_back(row[j]);
      } else {
        for (int32_t m = 0; m <= p / P; ++m) s.blocks.push_back(m);
      }
      const T* query = static_cast<const T*>(prm.query) + ((b * H + n * G) * S + i) * D;
      for (int64_t g = 0; g < G; ++g) load_padded(query + g * S * D, D, s.queries.data() + g * Dp);
      std::fill(s.accumulators.begin(), s.accumulators.end(), 0.0f);
      std::fill(s.max_logit.begin(), s.max_logit.end(), -std::numeric_limits<float>::infinity());
      std::fill(s.denominator.begin(), s.denominator.end(), 0.0f);
      s.masses.clear();
      // Blocks after the query attend nothing; drop them so the prefetch stream sees the real next block.
      s.blocks.erase(std::remove_if(s.blocks.begin(), s.blocks.end(), [&](int32_t m) { return m * P > p; }),
                     s.blocks.end());
      for (size_t j = 0; j < s.blocks.size(); ++j) {
        const int64_t block = s.blocks[j];
        const int64_t first = block * P, last = std::min<int64_t>(first + P, p + 1);
        const int64_t count = last - first;
        RowStream<TC> rows{key_cache + first * D, value_cache + first * D, nullptr, count, 0, D};
        if (j + 1 < s.blocks.size()) {
          const int64_t next = s.blocks[j + 1] * P;
          rows.next_keys = key_cache + next * D;
          rows.next_count = std::min<int64_t>(next + P, p + 1) - next;
        }
        // Logits: key rows tiled against four heads at a time (independent sums, canonical order each).
        block_logits(s.queries.data(), G, Dp, rows, Pp, prm, s.logits.data());
        // Online softmax per head: block max, rescale, weights (the scalar kernel's order).
        for (int64_t g = 0; g < G; ++g) {
          float* logits = s.logits.data() + g * Pp;
          float* acc = s.accumulators.data() + g * Dp;
          // -inf past the block's rows: they add nothing to the max and weigh exp(-inf) = 0.
          std::fill(logits + count, logits + padded(count), -std::numeric_limits<float>::infinity());
          Lanes lane_max = Lanes::broadcast(-std::numeric_limits<float>::infinity());
          for (int64_t t = 0; t < count; t += kChunk) lane_max = Lanes::max_select(Lanes::load(logits + t), lane_max);
          const float new_max = max_select(lane_max.fold_max(), s.max_logit[g]);
          const float rescale = canonical_exp(s.max_logit[g] - new_max);
          s.denominator[g] = s.denominator[g] * rescale;
          const Lanes scale_lanes = Lanes::broadcast(rescale);
          for (int64_t d = 0; d < Dp; d += kChunk) (Lanes::load(acc + d) * scale_lanes).store(acc + d);
          const Lanes shift = Lanes::broadcast(new_max);
          float* weights = s.weights.data() + g * Pp;
          Lanes lane_sum = Lanes::zero();
          for (int64_t t = 0; t < count; t += kChunk) {
            const Lanes w = exp_lanes(Lanes::load(logits + t) - shift);
            w.store(weights + t);
            lane_sum = lane_sum + w;
          }
          const float weight_sum = lane_sum.fold();
          s.denominator[g] = s.denominator[g] + weight_sum;
          s.max_logit[g] = new_max;
          if (importance) s.masses.push_back(BlockMass{static_cast<int32_t>(block), new_max, weight_sum});
        }
        // Values: added, weighted, to the G accumulators in t order.
        block_values(rows, Dp, G, s.weights.data(), Pp, s.accumulators.data());
      }
      for (int64_t g = 0; g < G; ++g) {
        const float* acc = s.accumulators.data() + g * Dp;
        const float denominator = s.denominator[g];
        const Lanes denominators = Lanes::broadcast(denominator);
        for (int64_t d = 0; d < D; d += kChunk) {
          const Lanes result = denominator > 0.0f ? Lanes::load(acc + d) / denominators : Lanes::zero();
          store_row(result, out + g * D, d, D);
        }
      }
      for (size_t j = 0; j < s.masses.size(); ++j) {
        const int64_t g = static_cast<int64_t>(j) % G;
        const BlockMass& mass = s.masses[j];
        importance[mass.block] += mass.weight_sum * canonical_exp(mass.max_logit - s.max_logit[g]) / s.denominator[g];
      }
    }
  }
}

}  // namespace quest::QUEST_ISA
