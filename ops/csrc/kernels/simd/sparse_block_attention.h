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
  const int64_t H = prm.num_heads, G = H / prm.kv_heads, K = prm.top_k, Dp = padded(D), Pp = padded(P);
  thread_local AttentionScratch s;
  s.queries.resize(G * Dp);
  s.accumulators.resize(G * Dp);
  s.logits.resize(G * Pp);
  s.weights.resize(Pp);
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
      for (const int32_t block : s.blocks) {
        const int64_t first = block * P, last = std::min<int64_t>(first + P, p + 1);
        if (first >= last) continue;
        const int64_t count = last - first;
        for (int64_t g = 0; g < G; ++g) {
          const float* q = s.queries.data() + g * Dp;
          float* logits = s.logits.data() + g * Pp;
          for (int64_t t = 0; t < count; ++t) {
            float logit = dot(q, key_cache + (first + t) * D, D) * prm.scale;
            if (prm.softcap > 0.0f) logit = prm.softcap * canonical_tanh(logit / prm.softcap);
            logits[t] = logit;
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          const float* logits = s.logits.data() + g * Pp;
          float* acc = s.accumulators.data() + g * Dp;
          float block_max = -std::numeric_limits<float>::infinity();
          for (int64_t t = 0; t < count; ++t) block_max = max_select(logits[t], block_max);
          const float new_max = max_select(block_max, s.max_logit[g]);
          const float rescale = canonical_exp(s.max_logit[g] - new_max);
          s.denominator[g] = s.denominator[g] * rescale;
          const Lanes scale_lanes = Lanes::broadcast(rescale);
          for (int64_t d = 0; d < Dp; d += kChunk) (Lanes::load(acc + d) * scale_lanes).store(acc + d);
          const Lanes shift = Lanes::broadcast(new_max);
          for (int64_t t = 0; t < count; t += kChunk) exp_lanes(Lanes::load(logits + t) - shift).store(s.weights.data() + t);
          float weight_sum = 0.0f;
          for (int64_t t = 0; t < count; ++t) {
            const float w = s.weights[t];
            weight_sum = weight_sum + w;
            const Lanes wv = Lanes::broadcast(w);
            const TC* v = value_cache + (first + t) * D;
            for (int64_t d = 0; d < D; d += kChunk) (Lanes::load(acc + d) + wv * load_row(v, d, D)).store(acc + d);
          }
          s.denominator[g] = s.denominator[g] + weight_sum;
          s.max_logit[g] = new_max;
          if (importance) s.masses.push_back(BlockMass{block, new_max, weight_sum});
        }
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
