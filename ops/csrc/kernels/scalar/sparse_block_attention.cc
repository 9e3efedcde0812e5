// Scalar reference kernels of SparseBlockAttention: the cache write and span-wise online softmax.
//
// Each query walks its spans in order, one online-softmax step per span: its selected blocks, or
// (when it attends exactly) tiles of kExactTile positions, or (a chunk query) its positions inside
// its chunk's blocks, kExactTile at a time. The scratch per query is O(span + D) whatever the
// context: prefill never builds an S x C matrix.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "../arith.h"
#include "../block_mass.h"
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
      if constexpr (std::is_same_v<TC, int8_t>) {
        prm.key_scale[item * C + p] = quantize_row(key + i * D, D, key_cache + p * D);
        prm.value_scale[item * C + p] = quantize_row(value + i * D, D, value_cache + p * D);
      } else {
        for (int64_t d = 0; d < D; ++d) {
          key_cache[p * D + d] = from_float<TC>(to_float(key[i * D + d]));
          value_cache[p * D + d] = from_float<TC>(to_float(value[i * D + d]));
        }
      }
    }
  }
}

// Online-softmax state of one query head.
struct HeadState {
  float max_logit;
  float denominator;
  float* accumulator;  // [D]
  std::vector<BlockMass>* masses;
};

// One online-softmax step of head h over the cache positions positions[0 .. count) (ascending):
// logits and their max (the k-th position in lane k % 16), rescale, weights, the values fused into
// the accumulator in position order. With int8 caches a logit is the dot with the int8 row times the
// row's scale, and a value row is weighted by its weight times the row's scale (the softmax sums the
// bare weights). With `masses`, the step's weights of each block it holds, summed in the same lanes,
// are recorded (a selected block: its whole weight sum; a tile: one entry per block).
template <typename TC>
void attend_span(const SparseBlockAttentionParams& prm, const float* query, const ItemCaches<TC>& cache,
                 const int64_t* positions, int64_t count, HeadState& h, std::vector<float>& logits) {
  const int64_t D = prm.head_dim, P = prm.block_size;
  LaneMax span_max;
  bool poisoned = false;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t t = positions[k];
    float logit = fused_dot(query, cache.keys + t * D, D);
    if (cache.key_scales != nullptr) logit = logit * to_float(cache.key_scales[t]);
    logit = logit * prm.scale;
    if (prm.softcap > 0.0f) logit = prm.softcap * canonical_tanh(logit / prm.softcap);
    logits[k] = logit;
    span_max.add(k, logit);
    poisoned |= poisons_row(logit);
  }
  // A NaN running max marks the row poisoned, and stays: max_select(x, NaN) is NaN.
  const float new_max = poisoned ? canonical_nan() : max_select(span_max.fold(), h.max_logit);
  const float rescale = canonical_exp(h.max_logit - new_max);
  h.denominator = h.denominator * rescale;
  for (int64_t d = 0; d < D; ++d) h.accumulator[d] = h.accumulator[d] * rescale;
  LaneSum weights;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t t = positions[k];
    const float w = canonical_exp(logits[k] - new_max);
    logits[k] = w;
    weights.add(k, w);
    const TC* v = cache.values + t * D;
    const float row_weight = cache.value_scales != nullptr ? w * to_float(cache.value_scales[t]) : w;
    for (int64_t d = 0; d < D; ++d) h.accumulator[d] = std::fma(row_weight, to_float(v[d]), h.accumulator[d]);
  }
  h.denominator = h.denominator + weights.fold();
  h.max_logit = new_max;
  if (h.masses == nullptr) return;
  for (int64_t k = 0; k < count;) {
    const int64_t block = positions[k] / P;
    LaneSum segment;
    for (; k < count && positions[k] / P == block; ++k) segment.add(k, logits[k]);
    h.masses->push_back(BlockMass{static_cast<int32_t>(block), new_max, segment.fold()});
  }
}

template <typename T, typename TC>
void attend(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, P = prm.block_size;
  const int64_t H = prm.num_heads, G = H / prm.kv_heads, K = prm.top_k, width = heads_per_block_list(prm);
  const int64_t Dp = (D + kLanes - 1) / kLanes * kLanes;
  std::vector<float> queries(G * Dp), accumulators(G * D), logits(std::max(rows_per_block(prm), kExactTile));
  std::vector<int64_t> positions(std::max(rows_per_block(prm), kExactTile)), chunk_positions;
  std::vector<uint8_t> listed(prm.chunk_indices != nullptr ? prm.num_blocks : 0);
  std::vector<HeadState> heads(G);
  std::vector<std::vector<BlockMass>> masses(G);
  std::vector<int32_t> blocks;
  // Every head of the query over positions [first, last): one step each.
  const auto attend_range = [&](const auto& cache, int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) positions[t - first] = t;
    for (int64_t g = 0; g < G; ++g)
      attend_span(prm, queries.data() + g * Dp, cache, positions.data(), last - first, heads[g], logits);
  };
  for (int64_t unit = begin; unit < end; ++unit) {
    const AttentionUnit u = attention_unit(prm, unit);
    const int64_t item = u.item, b = item / prm.kv_heads, n = item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b], exact = exact_queries(prm, b);
    const int64_t chunked = chunk_queries_end(prm, b);
    const ItemCaches<TC> cache = item_caches<TC>(prm, item);
    float* importance = prm.block_importance ? prm.block_importance + item * prm.num_blocks : nullptr;
    if (importance && u.first == 0) std::fill(importance, importance + prm.num_blocks, 0.0f);
    for (int64_t i = u.first; i < u.last; ++i) {
      T* out = static_cast<T*>(prm.output) + (b * S + i) * H * D + n * G * D;
      const int64_t p = past + i;
      if (p >= total) {
        std::fill(out, out + G * D, from_float<T>(0.0f));
        continue;
      }
      const T* query = static_cast<const T*>(prm.query) + ((b * H + n * G) * S + i) * D;
      std::fill(queries.begin(), queries.end(), 0.0f);
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t d = 0; d < D; ++d) queries[g * Dp + d] = to_float(query[(g * S) * D + d]);
        masses[g].clear();
        heads[g] = HeadState{-std::numeric_limits<float>::infinity(), kNothingAttended, accumulators.data() + g * D,
                             importance ? &masses[g] : nullptr};
        std::fill(heads[g].accumulator, heads[g].accumulator + D, 0.0f);
      }
      if (i < exact) {  // every position up to p, tile by tile
        for (int64_t first = 0; first <= p; first += kExactTile)
          attend_range(cache, first, std::min(first + kExactTile, p + 1));
      } else if (i < chunked) {  // the positions up to p inside the chunk's blocks, kExactTile at a time
        mark_listed(chunk_list(prm, item, i / prm.chunk_size), prm.chunk_top_k, prm.num_blocks, listed.data());
        chunk_positions.resize(p + 1);
        const int64_t attended = listed_positions(listed.data(), P, 0, p + 1, chunk_positions.data());
        for (int64_t k = 0; k < attended; k += kExactTile)
          for (int64_t g = 0; g < G; ++g)
            attend_span(prm, queries.data() + g * Dp, cache, chunk_positions.data() + k,
                        std::min(kExactTile, attended - k), heads[g], logits);
      } else {  // each list of blocks is attended by `width` heads from g0: all G, or one head per list
        for (int64_t g0 = 0; g0 < G; g0 += width) {
          const int32_t* row = prm.block_indices + ((item * (G / width) + g0 / width) * S + i) * K;
          blocks.assign(row, row + K);
          for (const int32_t block : blocks) {
            const int64_t first = static_cast<int64_t>(block) * P, last = std::min<int64_t>(first + P, p + 1);
            if (block < 0 || first >= last) continue;  // unselected, or entirely after the query
            for (int64_t t = first; t < last; ++t) positions[t - first] = t;
            for (int64_t g = g0; g < g0 + width; ++g)
              attend_span(prm, queries.data() + g * Dp, cache, positions.data(), last - first, heads[g], logits);
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        const HeadState& h = heads[g];
        add_masses(masses[g], h.max_logit, h.denominator, importance);
        const bool nan_row = is_nan_row(h.max_logit, h.denominator);
        for (int64_t d = 0; d < D; ++d) out[g * D + d] = from_float<T>(row_output(h.accumulator[d], h.denominator, nan_row));
      }
    }
  }
}

}  // namespace

void write_cache_tokens_scalar(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.activation_type, prm.cache_type,
                    [&]<typename T, typename TC>() { write_tokens<T, TC>(prm, begin, end); });
}

void sparse_block_attention_scalar(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.activation_type, prm.cache_type,
                    [&]<typename T, typename TC>() { attend<T, TC>(prm, begin, end); });
}

}  // namespace quest
