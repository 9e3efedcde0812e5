// Scalar reference kernel of SparseBlockSelect: canonical-order bound scores, then the selection.
#include <algorithm>
#include <vector>

#include "../arith.h"
#include "../chunk_rows.h"
#include "../int8_bounds.h"
#include "../select_order.h"
#include "../sparse_block_select.h"

namespace quest {
namespace {

template <typename TC>
float bound(const float* q, const TC* kmax, const TC* kmin, int64_t D) {
  LaneSum sum;
  for (int64_t d = 0; d < D; ++d)
    sum.add(d, max_select(q[d] * to_float(kmax[d]), q[d] * to_float(kmin[d])));
  return sum.fold();
}

// The exact integer bound of int8 codes for a quantized row v (quantize_query_row):
// I = sum over v > 0 of u * max_code - sum over v < 0 of u * min_code, v carrying u's sign.
int64_t integer_bound(const float* v, const int8_t* kmax, const int8_t* kmin, int64_t D) {
  int64_t total = 0;
  for (int64_t d = 0; d < D; ++d) {
    const int32_t u = static_cast<int32_t>(v[d]);
    total += u > 0 ? u * kmax[d] : u * kmin[d];
  }
  return total;
}

// Loads the G query heads of (b, n, i) as float; with mean reduction folds them into one head;
// with no reduction loads head `own` of the group alone.
template <typename T>
int64_t load_queries(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t i, int64_t own,
                     std::vector<float>& out, GroupReduce reduce) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, S = prm.query_len;
  const T* query = static_cast<const T*>(prm.query);
  out.resize(G * D);
  if (reduce == GroupReduce::None) {
    const T* q = query + (((b * prm.num_heads) + n * G + own) * S + i) * D;
    for (int64_t d = 0; d < D; ++d) out[d] = to_float(q[d]);
    return 1;
  }
  for (int64_t g = 0; g < G; ++g) {
    const T* q = query + (((b * prm.num_heads) + n * G + g) * S + i) * D;
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = to_float(q[d]);
  }
  if (reduce == GroupReduce::Max) return G;
  for (int64_t d = 0; d < D; ++d) {
    float total = out[d];
    for (int64_t g = 1; g < G; ++g) total = total + out[g * D + d];
    out[d] = total / static_cast<float>(G);
  }
  return 1;
}

// Probe scores of blocks [0, eligible) for the query at p: per block, the running max over its
// probes (in order) and the query rows (in order) of the canonical dot product.
template <typename T, typename TC>
void probe_blocks(const SparseBlockSelectParams& prm, int64_t item, int64_t p, int64_t heads, int64_t eligible,
                  const std::vector<float>& rows, std::vector<float>& key, float* scores) {
  const int64_t D = prm.head_dim, P = prm.block_size, S = prm.query_len, C = prm.capacity;
  const int64_t past = prm.past_lens[item / prm.kv_heads];
  const TC* cache = static_cast<const TC*>(prm.key_cache) + item * C * D;
  const T* fresh = static_cast<const T*>(prm.key) + item * S * D;
  key.resize(D);
  for (int64_t m = 0; m < eligible; ++m) {
    float best = 0.0f;
    const int64_t probes = probe_count(m, p, P, prm.num_probes);
    for (int64_t j = 0; j < probes; ++j) {
      const int64_t t = probe_position(m, p, P, prm.num_probes, j);
      for (int64_t d = 0; d < D; ++d)  // a new key as the cache will hold it
        key[d] = t < past ? to_float(cache[t * D + d]) : to_float(from_float<TC>(to_float(fresh[(t - past) * D + d])));
      for (int64_t r = 0; r < heads; ++r) {
        const float value = canonical_dot(rows.data() + r * D, key.data(), D);
        best = (j == 0 && r == 0) ? value : max_select(value, best);
      }
    }
    scores[m] = best;
  }
}

// With int8 bounds, quantizes the `rows` query rows (D apart, D values each) in place and keeps
// their factors in s.row_factor (score_rows then scores their integer bounds); float bounds score
// the rows as they are.
template <typename TC>
void prepare_rows(int64_t rows, int64_t D, SelectScratch& s) {
  if constexpr (kInt8Bounds<TC>) {
    s.row_factor.resize(rows);
    for (int64_t g = 0; g < rows; ++g)
      s.row_factor[g] = quantize_query_row(s.query.data() + g * D, D, s.query.data() + g * D);
  }
}

// Scores of `count` bounds (kmax/kmin rows of D values, exponent per bound with int8 bounds) for the
// `rows` prepared rows at `first_row` of s.query: each row's bound, the rows max-reduced in order;
// with int8 bounds each row's integer bound times its factor, and the reduced score times the
// bound's 2^e (NaN for a non-finite one).
template <typename TC>
void score_rows(const TC* kmax, const TC* kmin, const int8_t* exponent, int64_t first_row, int64_t rows, int64_t D,
                int64_t count, const SelectScratch& s, float* scores) {
  const float* query = s.query.data() + first_row * D;
  for (int64_t m = 0; m < count; ++m) {
    float score = 0.0f;
    for (int64_t g = 0; g < rows; ++g) {
      float row;
      if constexpr (kInt8Bounds<TC>)
        row = static_cast<float>(integer_bound(query + g * D, kmax + m * D, kmin + m * D, D)) *
              s.row_factor[first_row + g];
      else
        row = bound(query + g * D, kmax + m * D, kmin + m * D, D);
      score = g == 0 ? row : max_select(row, score);
    }
    if constexpr (kInt8Bounds<TC>) score = score * exponent_scale(exponent[m]);
    scores[m] = score;
  }
}

template <typename TC>
void score_item(const SelectItem<TC>& item, int64_t rows, int64_t D, int64_t eligible, SelectScratch& s,
                float* scores) {
  prepare_rows<TC>(rows, D, s);
  score_rows(item.kmax, item.kmin, item.exponent, 0, rows, D, eligible, s, scores);
}

// Step 4 of a hierarchical query (docs/ops.md, hierarchical selection): the superblock scores of each
// selection sharing the candidates (with GroupReduce::None every query head of the group, each its own
// row; else the one reduced score), the candidates, then the best `count` of their blocks by the
// query's own score (`own`'s row, or the reduced one).
template <typename T, typename TC>
void choose_hierarchically(const SparseBlockSelectParams& prm, const SelectItem<TC>& item, int64_t i, int64_t own,
                           int64_t p, int64_t eligible, int64_t count, SelectScratch& s) {
  const int64_t D = prm.head_dim, U = prm.superblock_size, eligible_super = (p / prm.block_size) / U + 1;
  const bool per_head = prm.reduce == GroupReduce::None;
  const int64_t selections = per_head ? prm.num_heads / prm.kv_heads : 1;
  // Every head's row (loaded as the max reduction loads them), or the reduced rows.
  const int64_t rows = per_head ? load_queries<T>(prm, item.b, item.n, i, 0, s.query, GroupReduce::Max)
                                : load_queries<T>(prm, item.b, item.n, i, own, s.query, prm.reduce);
  prepare_rows<TC>(rows, D, s);
  s.super_scores.resize(selections * eligible_super);
  for (int64_t r = 0; r < selections; ++r)
    score_rows(item.super_max, item.super_min, item.super_exponent, per_head ? r : 0, per_head ? 1 : rows, D,
               eligible_super, s, s.super_scores.data() + r * eligible_super);
  collect_candidates(s.super_scores.data(), selections, eligible_super, candidate_superblocks(prm), U, eligible, s);
  s.candidate_scores.resize(s.candidate_blocks.size());
  int64_t at = 0;
  for (const int32_t u : s.candidate_superblocks) {
    const int64_t first = u * U, blocks = std::min(U, eligible - first);
    score_rows(item.kmax + first * D, item.kmin + first * D, item.exponent ? item.exponent + first : nullptr,
               per_head ? own : 0, per_head ? 1 : rows, D, blocks, s, s.candidate_scores.data() + at);
    at += blocks;
  }
  choose_best_candidates(s.candidate_scores.data(), count, s);
}

template <typename T, typename TC>
void run(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  const int64_t P = prm.block_size, D = prm.head_dim;
  SelectScratch s;
  for_each_chunk_row<TC>(prm, begin, end, [&](const SelectItem<TC>& item, ChunkMembers members, int64_t first_block,
                                              int64_t last_block, int32_t* row) {
    const int64_t c = members.first / prm.chunk_size;
    select_chunk_row(prm, first_block, last_block, row, s, [&](int64_t eligible, float* scores) {
      const int64_t rows = load_chunk_rows<T>(prm, item.b, item.n, c, members, D, s.query);
      score_item(item, rows, D, eligible, s, scores);
    });
  });
  for_each_select_row<TC>(prm, begin, end, [&](const SelectItem<TC>& item, int64_t i, int64_t own, int64_t p,
                                                int32_t* row) {
    if (selects_hierarchically(prm, p / P)) {
      select_row_hierarchical(prm, item.importance, p / P, row, s, [&](int64_t eligible, int64_t count) {
        choose_hierarchically<T, TC>(prm, item, i, own, p, eligible, count, s);
      });
      return;
    }
    select_row(prm, item.importance, p / P, row, s, [&](int64_t eligible, float* scores) {
      const int64_t heads = load_queries<T>(prm, item.b, item.n, i, own, s.query, prm.reduce);
      if constexpr (!kInt8Bounds<TC>) {
        if (prm.score == ScoreMode::Probe)
          return probe_blocks<T, TC>(prm, item.index, p, heads, eligible, s.query, s.key, scores);
      }
      score_item(item, heads, D, eligible, s, scores);
    });
  });
}

}  // namespace

void sparse_block_select_scalar(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.query_type, prm.cache_type,
                    [&]<typename T, typename TC>() { run<T, TC>(prm, begin, end); });
}

}  // namespace quest
