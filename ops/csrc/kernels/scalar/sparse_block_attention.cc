// Scalar reference kernels of SparseBlockAttention: the cache write and block-wise online softmax.
//
// Each query walks its blocks in the given order, one block of at most P positions at a time,
// so the scratch per query is O(min(P, C) + D) whatever the context: prefill never builds an S x C matrix.
#include <algorithm>
#include <vector>

#include "../arith.h"
#include "../sparse_block_attention.h"

namespace quest {
namespace {

template <typename T, typename TC>
void write_tokens(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, C = prm.capacity;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const T* key = static_cast<const T*>(prm.key) + item * S * D;
    const T* value = static_cast<const T*>(prm.value) + item * S * D;
    TC* key_cache = static_cast<TC*>(prm.key_cache) + item * C * D;
    TC* value_cache = static_cast<TC*>(prm.value_cache) + item * C * D;
    for (int64_t p = past; p < total; ++p) {
      const int64_t i = p - past;
      for (int64_t d = 0; d < D; ++d) {
        key_cache[p * D + d] = from_float<TC>(to_float(key[i * D + d]));
        value_cache[p * D + d] = from_float<TC>(to_float(value[i * D + d]));
      }
    }
  }
}

// Online-softmax state of one query head.
struct HeadState {
  float max_logit;
  float denominator;
  float* accumulator;  // [D]
};

// Per-block softmax statistics kept for the block_importance output.
struct BlockMass {
  int32_t block;
  float max_logit;  // the running max the block's weights were taken against
  float weight_sum;
};

template <typename T, typename TC>
void attend(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, C = prm.capacity, P = prm.block_size;
  const int64_t H = prm.num_heads, G = H / prm.kv_heads, K = prm.top_k, width = heads_per_block_list(prm);
  std::vector<float> queries(G * D), accumulators(G * D), logits(rows_per_block(prm));
  std::vector<HeadState> heads(G);
  std::vector<int32_t> blocks;
  std::vector<BlockMass> masses;
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
      const T* query = static_cast<const T*>(prm.query) + ((b * H + n * G) * S + i) * D;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t d = 0; d < D; ++d) queries[g * D + d] = to_float(query[(g * S) * D + d]);
        heads[g] = HeadState{-std::numeric_limits<float>::infinity(), 0.0f, accumulators.data() + g * D};
        std::fill(heads[g].accumulator, heads[g].accumulator + D, 0.0f);
      }
      // Each list of blocks is attended by `width` heads from g0: all G, or one head per list.
      for (int64_t g0 = 0; g0 < G; g0 += width) {
        blocks.clear();
        if (prm.block_indices) {
          const int32_t* row = prm.block_indices + ((item * (G / width) + g0 / width) * S + i) * K;
          for (int64_t j = 0; j < K; ++j)
            if (row[j] >= 0) blocks.push_back(row[j]);
        } else {
          for (int32_t m = 0; m <= p / P; ++m) blocks.push_back(m);
        }
        masses.clear();
        for (const int32_t block : blocks) {
          const int64_t first = block * P, last = std::min<int64_t>(first + P, p + 1);  // [first, last)
          if (first >= last) continue;  // a block entirely after the query attends nothing
          for (int64_t g = g0; g < g0 + width; ++g) {
            HeadState& h = heads[g];
            LaneMax block_max;
            for (int64_t t = first; t < last; ++t) {
              float logit = canonical_dot(queries.data() + g * D, key_cache + t * D, D) * prm.scale;
              if (prm.softcap > 0.0f) logit = prm.softcap * canonical_tanh(logit / prm.softcap);
              logits[t - first] = logit;
              block_max.add(t - first, logit);
            }
            const float new_max = max_select(block_max.fold(), h.max_logit);
            const float rescale = canonical_exp(h.max_logit - new_max);
            h.denominator = h.denominator * rescale;
            for (int64_t d = 0; d < D; ++d) h.accumulator[d] = h.accumulator[d] * rescale;
            LaneSum weights;
            for (int64_t t = first; t < last; ++t) {
              const float w = canonical_exp(logits[t - first] - new_max);
              weights.add(t - first, w);
              const TC* v = value_cache + t * D;
              for (int64_t d = 0; d < D; ++d) h.accumulator[d] = h.accumulator[d] + w * to_float(v[d]);
            }
            const float weight_sum = weights.fold();
            h.denominator = h.denominator + weight_sum;
            h.max_logit = new_max;
            if (importance) masses.push_back(BlockMass{block, new_max, weight_sum});
          }
        }
        // masses are stored block-major, head-minor: entry j belongs to head g0 + j % width.
        for (size_t j = 0; j < masses.size(); ++j) {
          const HeadState& h = heads[g0 + static_cast<int64_t>(j) % width];
          const BlockMass& mass = masses[j];
          importance[mass.block] += mass.weight_sum * canonical_exp(mass.max_logit - h.max_logit) / h.denominator;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        const HeadState& h = heads[g];
        for (int64_t d = 0; d < D; ++d)
          out[g * D + d] = from_float<T>(h.denominator > 0.0f ? h.accumulator[d] / h.denominator : 0.0f);
      }
    }
  }
}

}  // namespace

void write_cache_tokens_scalar(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  with_dtypes(prm.activation_type, prm.cache_type,
              [&]<typename T, typename TC>() { write_tokens<T, TC>(prm, begin, end); });
}

void sparse_block_attention_scalar(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  with_dtypes(prm.activation_type, prm.cache_type,
              [&]<typename T, typename TC>() { attend<T, TC>(prm, begin, end); });
}

}  // namespace quest
