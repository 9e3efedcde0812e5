// Scalar reference kernel of SparseBlockSelect: canonical-order bound scores, then the selection.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../arith.h"
#include "../select_order.h"
#include "../sparse_block_select.h"

namespace quest {
namespace {

// Per-item scratch, sized once per work range.
struct Scratch {
  std::vector<float> query;  // the (reduced) query heads of one position, as float
  std::vector<float> scores;
  std::vector<int32_t> chosen, candidates;
  std::vector<uint8_t> taken;
};

template <typename TC>
float bound(const float* q, const TC* kmax, const TC* kmin, int64_t D) {
  LaneSum sum;
  for (int64_t d = 0; d < D; ++d)
    sum.add(d, max_select(q[d] * to_float(kmax[d]), q[d] * to_float(kmin[d])));
  return sum.fold();
}

// Loads the G query heads of (b, n, i) as float; with mean reduction folds them into one head.
template <typename T>
int64_t load_queries(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, std::vector<float>& out) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, S = prm.query_len;
  const T* query = static_cast<const T*>(prm.query);
  out.resize(G * D);
  for (int64_t g = 0; g < G; ++g) {
    const T* q = query + (((b * prm.num_heads) + n * G + g) * S + i) * D;
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = to_float(q[d]);
  }
  if (prm.reduce == GroupReduce::Max) return G;
  for (int64_t d = 0; d < D; ++d) {
    float total = out[d];
    for (int64_t g = 1; g < G; ++g) total = total + out[g * D + d];
    out[d] = total / static_cast<float>(G);
  }
  return 1;
}

template <typename TC>
void score_blocks(const SparseBlockSelectParams& prm, int64_t item, int64_t heads, int64_t eligible, Scratch& s) {
  const int64_t D = prm.head_dim, M = prm.num_blocks;
  const TC* kmax = static_cast<const TC*>(prm.block_max) + item * M * D;
  const TC* kmin = static_cast<const TC*>(prm.block_min) + item * M * D;
  s.scores.resize(eligible);
  for (int64_t m = 0; m < eligible; ++m) {
    float score = bound(s.query.data(), kmax + m * D, kmin + m * D, D);
    for (int64_t g = 1; g < heads; ++g)
      score = max_select(bound(s.query.data() + g * D, kmax + m * D, kmin + m * D, D), score);
    s.scores[m] = score;
  }
}

// Appends the best `count` untaken eligible blocks by `values` to s.chosen.
void choose_by(const float* values, int64_t eligible, int64_t count, Scratch& s) {
  if (count <= 0) return;
  s.candidates.clear();
  for (int32_t m = 0; m < eligible; ++m)
    if (!s.taken[m]) s.candidates.push_back(m);
  take_best(s.candidates, values, count);
  const int64_t n = std::min<int64_t>(count, static_cast<int64_t>(s.candidates.size()));
  for (int64_t j = 0; j < n; ++j) {
    s.taken[s.candidates[j]] = 1;
    s.chosen.push_back(s.candidates[j]);
  }
}

void take(int32_t m, Scratch& s) {
  if (s.taken[m]) return;
  s.taken[m] = 1;
  s.chosen.push_back(m);
}

template <typename T, typename TC>
void run(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, K = prm.top_k, P = prm.block_size, M = prm.num_blocks;
  Scratch s;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const float* importance = prm.block_importance ? prm.block_importance + item * M : nullptr;
    for (int64_t i = 0; i < S; ++i) {
      int32_t* row = prm.block_indices + (item * S + i) * K;
      std::fill(row, row + K, -1);
      const int64_t p = past + i;
      if (p >= total) continue;
      const int64_t current = p / P, eligible = current + 1;
      if (eligible <= K) {
        for (int64_t m = 0; m < eligible; ++m) row[m] = static_cast<int32_t>(m);
        continue;
      }
      s.chosen.clear();
      s.taken.assign(eligible, 0);
      // Forced blocks in priority order: recent newest first, then sinks ascending; at most K.
      for (int64_t m = current; m > current - prm.recent_blocks && m >= 0; --m) take(static_cast<int32_t>(m), s);
      for (int64_t m = 0; m < std::min(prm.sink_blocks, eligible); ++m) take(static_cast<int32_t>(m), s);
      if (static_cast<int64_t>(s.chosen.size()) > K) {
        for (int64_t j = K; j < static_cast<int64_t>(s.chosen.size()); ++j) s.taken[s.chosen[j]] = 0;
        s.chosen.resize(K);
      }
      int64_t remaining = K - static_cast<int64_t>(s.chosen.size());
      if (importance && remaining > 0) {
        const auto by_importance =
            static_cast<int64_t>(std::floor(static_cast<double>(prm.importance_fraction) * static_cast<double>(remaining)));
        choose_by(importance, eligible, by_importance, s);
        remaining -= by_importance;
      }
      if (remaining > 0) {
        const int64_t heads = load_queries<T>(prm, b, n, i, s.query);
        score_blocks<TC>(prm, item, heads, eligible, s);
        choose_by(s.scores.data(), eligible, remaining, s);
      }
      std::sort(s.chosen.begin(), s.chosen.end());
      std::copy(s.chosen.begin(), s.chosen.end(), row);
    }
  }
}

}  // namespace

void sparse_block_select_scalar(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  with_dtypes(prm.query_type, prm.cache_type,
              [&]<typename T, typename TC>() { run<T, TC>(prm, begin, end); });
}

}  // namespace quest
