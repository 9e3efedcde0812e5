// The Ascend kernels' plans executed on the CPU (see emulated_kernels.h).
#include "emulated_kernels.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../kernels/arith.h"
#include "../../kernels/types.h"
#include "../kernels/select_item.h"

namespace quest::cann {
namespace {

// One core's unified buffer. It starts full of garbage, as the real one does: a kernel that reads
// what it did not write shows up as a wrong result.
class UnifiedBuffer {
 public:
  explicit UnifiedBuffer(int64_t bytes) : bytes_(static_cast<size_t>(bytes), 0xA5) {}

  template <typename V>
  class View {
   public:
    View(V* data, int64_t count, const char* name) : data_(data), count_(count), name_(name) {}
    V get(int64_t i) const { return data_[check(i)]; }
    void set(int64_t i, V value) { data_[check(i)] = value; }
    V* at(int64_t i, int64_t n) {  // n elements from i
      if (n > 0) check(i + n - 1);
      return data_ + i;
    }

   private:
    int64_t check(int64_t i) const {
      if (i < 0 || i >= count_)
        throw std::runtime_error(std::string("UB access outside ") + name_ + " at element " + std::to_string(i) +
                                 " of " + std::to_string(count_));
      return i;
    }
    V* data_;
    int64_t count_;
    const char* name_;
  };

  template <typename V>
  View<V> view(const UbSlice& slice, const char* name) {
    if (slice.offset < 0 || slice.offset + slice.bytes > static_cast<int64_t>(bytes_.size()) || slice.offset % kUbAlign)
      throw std::runtime_error(std::string("UB slice ") + name + " is misplaced");
    return View<V>(reinterpret_cast<V*>(bytes_.data() + slice.offset), slice.bytes / static_cast<int64_t>(sizeof(V)),
                   name);
  }

 private:
  std::vector<unsigned char> bytes_;
};

// An accessor over GM memory for the scalar-unit code when candidates spill to the workspace.
template <typename V>
struct GmArray {
  V* data;
  V get(int64_t i) const { return data[i]; }
  void set(int64_t i, V value) { data[i] = value; }
};

// DataCopyPad of `rows` rows of `dim` elements from GM into UB rows of `stride` elements: the UB
// region is zeroed first (Duplicate), so the padding lanes hold +0.0.
template <typename E, typename View>
void copy_rows_in(View dst, int64_t dst_offset, const E* gm, int64_t rows, int64_t dim, int64_t stride) {
  E* out = dst.at(dst_offset, rows * stride);
  std::memset(static_cast<void*>(out), 0, sizeof(E) * rows * stride);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(static_cast<void*>(out + r * stride), gm + r * dim, sizeof(E) * dim);
}

// Cast of n elements into float32 (CAST_NONE: exact for float16 and bfloat16).
template <typename E, typename From, typename To>
void cast_to_f32(From src, int64_t src_offset, To dst, int64_t dst_offset, int64_t n) {
  const E* in = src.at(src_offset, n);
  float* out = dst.at(dst_offset, n);
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

template <typename T, typename TC>
void metadata_core(const MetadataPlan& plan, const QuestMetadataParams& prm, UnifiedBuffer& ub, int32_t core) {
  const MetadataShape& s = plan.shape;
  const int64_t S = s.new_tokens, D = s.head_dim, M = s.num_blocks, P = s.block_size, Dp = plan.dim_padded;
  UnifiedBuffer::View<T> keys[2] = {ub.view<T>(plan.keys[0], "keys[0]"), ub.view<T>(plan.keys[1], "keys[1]")};
  auto keys_f32 = ub.view<float>(plan.keys_f32, "keys_f32");
  auto acc_max = ub.view<float>(plan.acc_max, "acc_max"), acc_min = ub.view<float>(plan.acc_min, "acc_min");
  auto out_max = ub.view<TC>(plan.out_max, "out_max"), out_min = ub.view<TC>(plan.out_min, "out_min");
  for (int64_t item = plan.split.begin(core); item < plan.split.end(core); ++item) {
    const int64_t past = prm.past_lens[item / s.kv_heads], total = prm.total_lens[item / s.kv_heads];
    const T* key = static_cast<const T*>(prm.key) + item * S * D;
    TC* gm_max = static_cast<TC*>(prm.block_max) + item * M * D;
    TC* gm_min = static_cast<TC*>(prm.block_min) + item * M * D;
    for (int64_t m = past / P; past < total && m <= (total - 1) / P; ++m) {
      const int64_t first = std::max(past, m * P), last = std::min(total, (m + 1) * P);
      if (first != m * P) {  // the block holds earlier tokens: continue from its stored bounds
        copy_rows_in(out_max, 0, gm_max + m * D, 1, D, Dp);
        copy_rows_in(out_min, 0, gm_min + m * D, 1, D, Dp);
        cast_to_f32<TC>(out_max, 0, acc_max, 0, Dp);
        cast_to_f32<TC>(out_min, 0, acc_min, 0, Dp);
      }
      int buffer = 0;
      for (int64_t t0 = first; t0 < last; t0 += plan.rows_per_chunk, buffer ^= 1) {
        const int64_t rows = std::min(plan.rows_per_chunk, last - t0);
        copy_rows_in(keys[buffer], 0, key + (t0 - past) * D, rows, D, Dp);
        const T* in = keys[buffer].at(0, rows * Dp);
        float* x = keys_f32.at(0, rows * Dp);
        for (int64_t e = 0; e < rows * Dp; ++e) x[e] = to_float(in[e]);
        for (int64_t r = 0; r < rows; ++r) {
          // Each key rounded outward through the bounds' dtype (CAST_CEIL into out_max, CAST_FLOOR
          // into out_min, both free here), then back: the bounds hold the key.
          const float* row = keys_f32.at(r * Dp, Dp);
          TC* up = out_max.at(0, Dp);
          TC* down = out_min.at(0, Dp);
          for (int64_t d = 0; d < Dp; ++d) up[d] = from_float_above<TC>(row[d]), down[d] = from_float_below<TC>(row[d]);
          float* hi = acc_max.at(0, Dp);
          float* lo = acc_min.at(0, Dp);
          const bool starts = t0 + r == m * P;
          for (int64_t d = 0; d < Dp; ++d) {
            hi[d] = starts ? to_float(up[d]) : max_select(hi[d], to_float(up[d]));
            lo[d] = starts ? to_float(down[d]) : min_select(lo[d], to_float(down[d]));
          }
        }
      }
      // Cast (exact: every value came from the cache dtype) and copy the D real lanes out.
      TC* hi = out_max.at(0, Dp);
      TC* lo = out_min.at(0, Dp);
      for (int64_t d = 0; d < Dp; ++d) hi[d] = from_float<TC>(acc_max.get(d)), lo[d] = from_float<TC>(acc_min.get(d));
      std::memcpy(static_cast<void*>(gm_max + m * D), hi, sizeof(TC) * D);
      std::memcpy(static_cast<void*>(gm_min + m * D), lo, sizeof(TC) * D);
    }
  }
}

// One core of the select kernel as the emulator runs it: the data moves and vector steps of
// sparse_block_select_npu.cpp over the core's UB, for the kernel's own per-item selection
// (kernels/select_item.h; see Core there).
template <typename T, typename TC>
class SelectCore {
 public:
  SelectCore(const SelectPlan& plan, const SparseBlockSelectParams& prm, UnifiedBuffer& ub)
      : plan_(plan), prm_(prm), ub_(ub) {}

  int64_t past_len(int64_t b) const { return prm_.past_lens[b]; }
  int64_t total_len(int64_t b) const { return prm_.total_lens[b]; }
  void set_index(int64_t at, int32_t block) { prm_.block_indices[at] = block; }
  UnifiedBuffer::View<int32_t> chosen_blocks() { return ub_.view<int32_t>(plan_.chosen, "chosen"); }

  UnifiedBuffer::View<float> importance_chunk(int64_t kv_item, int64_t c0, int64_t count) {
    auto importance = ub_.view<float>(plan_.importance, "importance");
    copy_rows_in(importance, 0, prm_.block_importance + kv_item * plan_.shape.num_blocks + c0, 1, count, count);
    return importance;
  }

  // The (reduced) query rows of one item into the plan's query buffer, zero padded.
  void load_query(int64_t b, int64_t n, int64_t i) {
    const SelectShape& s = plan_.shape;
    const int64_t G = s.num_heads / s.kv_heads, D = s.head_dim, S = s.query_len, Dp = plan_.dim_padded;
    const T* query = static_cast<const T*>(prm_.query);
    auto rows = ub_.view<float>(plan_.query, "query");
    auto scratch = ub_.view<float>(plan_.products, "products");  // free until the scoring starts
    auto staged = ub_.view<T>(plan_.bounds[0], "bounds[0]");
    for (int64_t g = 0; g < G; ++g) {
      copy_rows_in(staged, 0, query + ((b * s.num_heads + n * G + g) * S + i) * D, 1, D, Dp);
      if (s.reduce_max) {
        cast_to_f32<T>(staged, 0, rows, g * Dp, Dp);
      } else if (g == 0) {
        cast_to_f32<T>(staged, 0, rows, 0, Dp);
      } else {
        cast_to_f32<T>(staged, 0, scratch, 0, Dp);
        float* sum = rows.at(0, Dp);
        for (int64_t d = 0; d < Dp; ++d) sum[d] = sum[d] + scratch.get(d);
      }
    }
    if (!s.reduce_max) {
      float* sum = rows.at(0, Dp);
      for (int64_t d = 0; d < Dp; ++d) sum[d] = sum[d] / static_cast<float>(G);
    }
  }

  // best_scores[j] for blocks c0 .. c0 + count - 1: the bound of each query row, max over rows.
  UnifiedBuffer::View<float> score_chunk(int64_t kv_item, int64_t c0, int64_t count, int buffer) {
    const SelectShape& s = plan_.shape;
    const int64_t M = s.num_blocks, D = s.head_dim, Dp = plan_.dim_padded, nb = plan_.blocks_per_chunk;
    auto query = ub_.view<float>(plan_.query, "query");
    auto bounds_f32 = ub_.view<float>(plan_.bounds_f32, "bounds_f32");
    auto products = ub_.view<float>(plan_.products, "products");
    auto lanes = ub_.view<float>(plan_.lanes, "lanes");
    auto best_scores = ub_.view<float>(plan_.best_scores, "best_scores");
    auto bounds = ub_.view<TC>(plan_.bounds[buffer], buffer == 0 ? "bounds[0]" : "bounds[1]");
    const TC* kmax = static_cast<const TC*>(prm_.block_max) + kv_item * M * D;
    const TC* kmin = static_cast<const TC*>(prm_.block_min) + kv_item * M * D;
    copy_rows_in(bounds, 0, kmax + c0 * D, count, D, Dp);
    copy_rows_in(bounds, nb * Dp, kmin + c0 * D, count, D, Dp);
    cast_to_f32<TC>(bounds, 0, bounds_f32, 0, count * Dp);
    cast_to_f32<TC>(bounds, nb * Dp, bounds_f32, nb * Dp, count * Dp);
    for (int64_t r = 0; r < plan_.query_rows; ++r) {
      const float* q = query.at(r * Dp, Dp);
      // Mul, Mul, Max over [count, Dp]: max(q*kmax, q*kmin) element by element.
      float* up = products.at(0, count * Dp);
      float* down = products.at(nb * Dp, count * Dp);
      const float* hi = bounds_f32.at(0, count * Dp);
      const float* lo = bounds_f32.at(nb * Dp, count * Dp);
      for (int64_t j = 0; j < count; ++j)
        for (int64_t d = 0; d < Dp; ++d) {
          up[j * Dp + d] = q[d] * hi[j * Dp + d];
          down[j * Dp + d] = q[d] * lo[j * Dp + d];
          up[j * Dp + d] = max_select(up[j * Dp + d], down[j * Dp + d]);
        }
      // Duplicate(+0), then the 16-lane column adds in increasing d, then the 8/4/2/1 fold.
      float* lane = lanes.at(0, count * kLanes);
      for (int64_t e = 0; e < count * kLanes; ++e) lane[e] = 0.0f;
      for (int64_t c = 0; c < Dp / kLanes; ++c)
        for (int64_t j = 0; j < count; ++j)
          for (int64_t l = 0; l < kLanes; ++l) lane[j * kLanes + l] = lane[j * kLanes + l] + up[j * Dp + c * kLanes + l];
      for (int64_t w = kLanes / 2; w >= 1; w /= 2)
        for (int64_t j = 0; j < count; ++j)
          for (int64_t l = 0; l < w; ++l) lane[j * kLanes + l] = lane[j * kLanes + l] + lane[j * kLanes + l + w];
      for (int64_t j = 0; j < count; ++j)  // the row's score straight from its lanes, as the kernel does
        best_scores.set(j, r == 0 ? lane[j * kLanes] : max_select(lane[j * kLanes], best_scores.get(j)));
    }
    return best_scores;
  }

 private:
  const SelectPlan& plan_;
  const SparseBlockSelectParams& prm_;
  UnifiedBuffer& ub_;
};

template <typename T, typename TC>
void select_core(const SelectPlan& plan, const SparseBlockSelectParams& prm, UnifiedBuffer& ub, int32_t core,
                 std::vector<unsigned char>& workspace) {
  SelectCore<T, TC> kernel(plan, prm, ub);
  // Where the candidates live is decided once per core, as the kernel does: UB, or this core's
  // slice of the GM workspace.
  if (plan.candidates_in_ub) {
    const auto scores = ub.view<float>(plan.candidate_scores, "candidate_scores");
    const auto blocks = ub.view<int32_t>(plan.candidate_blocks, "candidate_blocks");
    for (int64_t item = plan.split.begin(core); item < plan.split.end(core); ++item)
      select_item(kernel, plan, item, scores, blocks);
    return;
  }
  const int64_t slice = plan.workspace_bytes / plan.split.cores;
  unsigned char* base = workspace.data() + core * slice;
  const GmArray<float> scores{reinterpret_cast<float*>(base)};
  const GmArray<int32_t> blocks{reinterpret_cast<int32_t*>(base + slice / 2)};
  for (int64_t item = plan.split.begin(core); item < plan.split.end(core); ++item)
    select_item(kernel, plan, item, scores, blocks);
}

}  // namespace

void emulate_metadata(const MetadataPlan& plan, const NpuSpec& npu, const QuestMetadataParams& prm) {
  with_dtypes(prm.key_type, prm.cache_type, [&]<typename T, typename TC>() {
    for (int32_t core = 0; core < plan.split.cores; ++core) {
      UnifiedBuffer ub(npu.ub_bytes);
      metadata_core<T, TC>(plan, prm, ub, core);
    }
  });
}

void emulate_select(const SelectPlan& plan, const NpuSpec& npu, const SparseBlockSelectParams& prm) {
  std::vector<unsigned char> workspace(static_cast<size_t>(plan.workspace_bytes));
  with_dtypes(prm.query_type, prm.cache_type, [&]<typename T, typename TC>() {
    for (int32_t core = 0; core < plan.split.cores; ++core) {
      UnifiedBuffer ub(npu.ub_bytes);
      select_core<T, TC>(plan, prm, ub, core, workspace);
    }
  });
  // The host's fill of the rows of queries that attend exactly, as ort/cann_ops.cc does on the device.
  for (const RowRun& run : exact_select_rows(prm.batch, prm.kv_heads, prm.query_len, prm.past_lens, prm.exact_lens))
    std::memset(prm.block_indices + run.first * prm.top_k, 0xFF, sizeof(int32_t) * run.count * prm.top_k);
}

void emulate_attention(const AttentionShape& shape, const SparseBlockAttentionParams& prm) {
  const std::string unsupported = check_attention_support(shape);
  if (!unsupported.empty()) throw std::runtime_error(unsupported);
  const int64_t B = shape.batch, H = shape.num_heads, N = shape.kv_heads, S = shape.query_len, D = shape.head_dim;
  const int64_t C = shape.capacity, P = shape.block_size, G = H / N;
  with_dtype(prm.cache_type, [&]<typename T>() {
    const T* key = static_cast<const T*>(prm.key);
    const T* value = static_cast<const T*>(prm.value);
    T* key_cache = static_cast<T*>(prm.key_cache);
    T* value_cache = static_cast<T*>(prm.value_cache);
    // One 2-D copy per batch row: N rows of (valid tokens x D), source pitch S*D, target pitch C*D.
    for (int64_t b = 0; b < B; ++b) {
      const int64_t past = prm.past_lens[b], valid = prm.total_lens[b] - past;
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(static_cast<void*>(key_cache + ((b * N + n) * C + past) * D), key + (b * N + n) * S * D,
                    sizeof(T) * valid * D);
        std::memcpy(static_cast<void*>(value_cache + ((b * N + n) * C + past) * D), value + (b * N + n) * S * D,
                    sizeof(T) * valid * D);
      }
    }
    const FiaRows rows = build_fia_rows(shape, prm.past_lens, prm.total_lens, prm.block_indices, prm.exact_lens);
    const T* query = static_cast<const T*>(prm.query);
    T* output = static_cast<T*>(prm.output);
    std::vector<float> logits, accumulated(D);
    for (int64_t r = 0; r < rows.rows; ++r) {
      const int64_t b = r / (N * S), n = r / S % N, s = r % S;
      for (int64_t g = 0; g < G; ++g) {
        T* out = output + (b * S + s) * H * D + (n * G + g) * D;
        if (rows.zero_output[r]) {
          for (int64_t d = 0; d < D; ++d) out[d] = from_float<T>(0.0f);
          continue;
        }
        const T* q = query + ((b * H + n * G + g) * S + s) * D;
        const int64_t length = rows.kv_lengths[r];
        logits.assign(length, 0.0f);
        float largest = -INFINITY;
        for (int64_t j = 0; j < length; ++j) {
          const int64_t page = rows.table[r * rows.width + j / P], slot = page * P + j % P;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += to_float(q[d]) * to_float(key_cache[slot * D + d]);
          logits[j] = dot * prm.scale;
          largest = std::max(largest, logits[j]);
        }
        float total = 0.0f;
        std::fill(accumulated.begin(), accumulated.end(), 0.0f);
        for (int64_t j = 0; j < length; ++j) {
          const int64_t page = rows.table[r * rows.width + j / P], slot = page * P + j % P;
          const float weight = std::exp(logits[j] - largest);
          total += weight;
          for (int64_t d = 0; d < D; ++d) accumulated[d] += weight * to_float(value_cache[slot * D + d]);
        }
        for (int64_t d = 0; d < D; ++d) out[d] = from_float<T>(accumulated[d] / total);
      }
    }
  });
}

}  // namespace quest::cann
