// SparseBlockSelect (bound score) on the Ascend vector cores (AscendC; built only with
// -DQUEST_ORT_CANN=ON and a CANN toolkit: see docs/cann.md for what was verified and what not).
//
// It executes a SelectPlan (host/tiling.h); the per-item selection is select_item.h's, which the
// CPU emulator (emulator/emulated_kernels.cc, checked bit for bit against the reference here) runs
// as it is, with its model of the data moves and vector steps below:
//
//   per item (b, n, query position), on its core (select_item.h):
//     forced blocks, then the importance quota ........ scalar unit
//     query rows -> float32 (mean: Add rows, Div by G) vector
//     per chunk of blocks:
//       DataCopyPad max/min rows -> Cast to float32    MTE2, vector
//       Mul q*max, Mul q*min, Max                       vector, per block row
//       lanes = +0; lanes += 16-wide columns in d order vector (strided Add, one per column)
//       fold 8 (vector), 4, 2, 1 (scalar: operands under 32 bytes are not addressable)
//       best-of-query-rows, offer to the best-K list    scalar unit
//     chosen blocks ascending, -1 padded -> GM         scalar unit
//
// Phases are ordered with PIPE_ALL barriers (correct first). The scores use the canonical order
// of docs/ops.md: 16 lanes, increasing d, fold 8/4/2/1; the query mean divides by G.
#include "npu_common.h"

#include "select_item.h"

using namespace AscendC;
using quest::cann::SelectPlan;

namespace {

using namespace quest::cann::npu;
namespace core = quest::cann;

template <typename V>
struct UbArray {  // the scalar unit's view of a UB tensor
  LocalTensor<V> t;
  __aicore__ inline V get(int64_t i) const { return t.GetValue(i); }
  __aicore__ inline void set(int64_t i, V v) { t.SetValue(i, v); }
};

template <typename V>
struct GmArray {  // the scalar unit's view of this core's GM workspace
  GlobalTensor<V> t;
  __aicore__ inline V get(int64_t i) const { return t.GetValue(i); }
  __aicore__ inline void set(int64_t i, V v) { t.SetValue(i, v); }
};

__aicore__ inline float max_select(float a, float b) { return a > b ? a : b; }

template <typename T, typename TC>
class SelectKernel {
 public:
  __aicore__ inline void Run(GM_ADDR query, GM_ADDR block_max, GM_ADDR block_min, GM_ADDR past_lens,
                             GM_ADDR total_lens, GM_ADDR importance, GM_ADDR indices, GM_ADDR workspace,
                             const SelectPlan& plan) {
    plan_ = plan;
    pipe_.InitBuffer(buffer_, static_cast<uint32_t>(plan.ub_used));
    ub_ = buffer_.Get<uint8_t>();
    query_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
    max_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ TC*>(block_max));
    min_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ TC*>(block_min));
    past_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(past_lens));
    total_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(total_lens));
    if (plan.shape.has_importance) importance_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(importance));
    out_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(indices));
    const int32_t core_id = static_cast<int32_t>(GetBlockIdx());
    if (plan.candidates_in_ub) {
      const UbArray<float> scores{slice<float>(ub_, plan.candidate_scores)};
      const UbArray<int32_t> blocks{slice<int32_t>(ub_, plan.candidate_blocks)};
      for (int64_t item = plan.split.begin(core_id); item < plan.split.end(core_id); ++item)
        core::select_item(*this, plan_, item, scores, blocks);
    } else {
      const int64_t per_core = plan.workspace_bytes / plan.split.cores;
      GmArray<float> scores;
      GmArray<int32_t> blocks;
      scores.t.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + core_id * per_core));
      blocks.t.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(workspace + core_id * per_core + per_core / 2));
      for (int64_t item = plan.split.begin(core_id); item < plan.split.end(core_id); ++item)
        core::select_item(*this, plan_, item, scores, blocks);
    }
  }

  // The data moves and vector steps of core::select_item (select_item.h, "Core").
  __aicore__ inline int64_t past_len(int64_t b) const { return past_gm_.GetValue(b); }
  __aicore__ inline int64_t total_len(int64_t b) const { return total_gm_.GetValue(b); }
  __aicore__ inline void set_index(int64_t at, int32_t block) { out_gm_.SetValue(at, block); }
  __aicore__ inline UbArray<int32_t> chosen_blocks() const { return {slice<int32_t>(ub_, plan_.chosen)}; }

  __aicore__ inline UbArray<float> importance_chunk(int64_t kv_item, int64_t c0, int64_t count) {
    const LocalTensor<float> importance = slice<float>(ub_, plan_.importance);
    copy_rows_in(importance, importance_gm_[kv_item * plan_.shape.num_blocks + c0], 1, count, count);
    return {importance};
  }

  // The query rows of (b, n, i) as float32, zero padded; with mean reduction one row (sum / G).
  __aicore__ inline void load_query(int64_t b, int64_t n, int64_t i) {
    const auto& s = plan_.shape;
    const int64_t G = s.num_heads / s.kv_heads, D = s.head_dim, S = s.query_len, Dp = plan_.dim_padded;
    const LocalTensor<float> rows = slice<float>(ub_, plan_.query);
    const LocalTensor<float> scratch = slice<float>(ub_, plan_.products);
    const LocalTensor<T> staged = slice<T>(ub_, plan_.bounds[0]);
    for (int64_t g = 0; g < G; ++g) {
      copy_rows_in(staged, query_gm_[((b * s.num_heads + n * G + g) * S + i) * D], 1, D, Dp);
      if (s.reduce_max) {
        to_float(rows[g * Dp], staged, Dp);
      } else if (g == 0) {
        to_float(rows, staged, Dp);
      } else {
        to_float(scratch, staged, Dp);
        PipeBarrier<PIPE_ALL>();
        Add(rows, rows, scratch, static_cast<int32_t>(Dp));
      }
      PipeBarrier<PIPE_ALL>();
    }
    if (!s.reduce_max) {
      Duplicate(scratch, static_cast<float>(G), static_cast<int32_t>(Dp));
      PipeBarrier<PIPE_ALL>();
      Div(rows, rows, scratch, static_cast<int32_t>(Dp));
      PipeBarrier<PIPE_ALL>();
    }
  }

  // best_scores[j] for blocks c0 .. c0 + count - 1: the bound of each query row, max over rows.
  __aicore__ inline UbArray<float> score_chunk(int64_t kv_item, int64_t c0, int64_t count, int which) {
    const auto& s = plan_.shape;
    const int64_t D = s.head_dim, M = s.num_blocks, Dp = plan_.dim_padded, nb = plan_.blocks_per_chunk;
    const LocalTensor<TC> bounds = slice<TC>(ub_, plan_.bounds[which]);
    const LocalTensor<float> bounds_f32 = slice<float>(ub_, plan_.bounds_f32);
    const LocalTensor<float> products = slice<float>(ub_, plan_.products);
    const LocalTensor<float> lanes = slice<float>(ub_, plan_.lanes);
    const LocalTensor<float> best_scores = slice<float>(ub_, plan_.best_scores);
    const LocalTensor<float> query = slice<float>(ub_, plan_.query);
    copy_rows_in(bounds, max_gm_[(kv_item * M + c0) * D], count, D, Dp);
    copy_rows_in(bounds[nb * Dp], min_gm_[(kv_item * M + c0) * D], count, D, Dp);
    to_float(bounds_f32, bounds, count * Dp);
    to_float(bounds_f32[nb * Dp], bounds[nb * Dp], count * Dp);
    PipeBarrier<PIPE_ALL>();
    for (int64_t r = 0; r < plan_.query_rows; ++r) {
      const LocalTensor<float> q = query[r * Dp];
      for (int64_t j = 0; j < count; ++j) {
        Mul(products[j * Dp], bounds_f32[j * Dp], q, static_cast<int32_t>(Dp));
        Mul(products[(nb + j) * Dp], bounds_f32[(nb + j) * Dp], q, static_cast<int32_t>(Dp));
        Max(products[j * Dp], products[j * Dp], products[(nb + j) * Dp], static_cast<int32_t>(Dp));
      }
      Duplicate(lanes, 0.0f, static_cast<int32_t>(count * core::kLanes));
      PipeBarrier<PIPE_ALL>();
      // Column c of every block row into its lanes: 16 floats (2 blocks of 32 bytes) per repeat,
      // lanes rows 2 blocks apart, product rows Dp / 8 blocks apart; at most 255 repeats a call.
      for (int64_t c = 0; c < Dp / core::kLanes; ++c) {
        for (int64_t j0 = 0; j0 < count; j0 += 255) {
          const int64_t reps = count - j0 < 255 ? count - j0 : 255;
          Add(lanes[j0 * core::kLanes], lanes[j0 * core::kLanes], products[j0 * Dp + c * core::kLanes],
              static_cast<uint64_t>(core::kLanes), static_cast<uint8_t>(reps),
              BinaryRepeatParams(1, 1, 1, 2, 2, static_cast<uint8_t>(Dp / 8)));
        }
        PipeBarrier<PIPE_V>();
      }
      // Fold 8 on the vector unit (lanes 8..15 start 32 bytes in), then 4, 2, 1 on the scalar unit.
      for (int64_t j0 = 0; j0 < count; j0 += 255) {
        const int64_t reps = count - j0 < 255 ? count - j0 : 255;
        Add(lanes[j0 * core::kLanes], lanes[j0 * core::kLanes], lanes[j0 * core::kLanes + 8], static_cast<uint64_t>(8),
            static_cast<uint8_t>(reps), BinaryRepeatParams(1, 1, 1, 2, 2, 2));
      }
      PipeBarrier<PIPE_ALL>();
      for (int64_t j = 0; j < count; ++j) {
        float l[8];
        for (int w = 0; w < 8; ++w) l[w] = lanes.GetValue(j * core::kLanes + w);
        for (int w = 4; w >= 1; w /= 2)
          for (int x = 0; x < w; ++x) l[x] = l[x] + l[x + w];
        best_scores.SetValue(j, r == 0 ? l[0] : max_select(l[0], best_scores.GetValue(j)));
      }
      PipeBarrier<PIPE_ALL>();
    }
    return {best_scores};
  }

 private:

  SelectPlan plan_;
  TPipe pipe_;
  TBuf<TPosition::VECCALC> buffer_;
  LocalTensor<uint8_t> ub_;
  GlobalTensor<T> query_gm_;
  GlobalTensor<TC> max_gm_, min_gm_;
  GlobalTensor<int32_t> past_gm_, total_gm_, out_gm_;
  GlobalTensor<float> importance_gm_;
};

}  // namespace

// One kernel per (query dtype, cache dtype) pair; the host picks by the tensors' element types.
#define QUEST_SELECT_KERNEL(NAME, T, TC)                                                                       \
  extern "C" __global__ __aicore__ void NAME(GM_ADDR query, GM_ADDR block_max, GM_ADDR block_min,              \
                                             GM_ADDR past_lens, GM_ADDR total_lens, GM_ADDR importance,        \
                                             GM_ADDR indices, GM_ADDR workspace, SelectPlan plan) {            \
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);                                                           \
    SelectKernel<T, TC>().Run(query, block_max, block_min, past_lens, total_lens, importance, indices,         \
                              workspace, plan);                                                               \
  }

QUEST_SELECT_KERNEL(sparse_block_select_f16_f16, half, half)
QUEST_SELECT_KERNEL(sparse_block_select_f32_f16, float, half)
QUEST_SELECT_KERNEL(sparse_block_select_f16_f32, half, float)
QUEST_SELECT_KERNEL(sparse_block_select_f32_f32, float, float)
QUEST_SELECT_KERNEL(sparse_block_select_bf16_bf16, bfloat16_t, bfloat16_t)
QUEST_SELECT_KERNEL(sparse_block_select_f32_bf16, float, bfloat16_t)
