// QuestMetadata on the Ascend vector cores (AscendC; built only with -DQUEST_ORT_CANN=ON and a CANN
// toolkit, never on the machines that develop this package: see docs/cann.md for what was verified).
//
// It executes a MetadataPlan (host/tiling.h) step for step as the CPU emulator does
// (emulator/emulated_kernels.cc, which the tests check against the reference): each core takes
// its (b, n) items; per touched block it continues from the stored bounds (or starts at the
// block's first token), folds the new key rows in order with Max/Min in float32 after rounding
// them through the cache dtype, and writes the block's bounds back. UB buffers sit at the plan's
// offsets inside one TBuf; phases are ordered with PIPE_ALL barriers (correct first: overlapping
// copy-in with compute through events is left for a measured NPU version).
#include "npu_common.h"

using namespace AscendC;
using quest::cann::MetadataPlan;
using quest::cann::UbSlice;

namespace {

using namespace quest::cann::npu;

template <typename T, typename TC>
class MetadataKernel {
 public:
  __aicore__ inline void Run(GM_ADDR key, GM_ADDR block_max, GM_ADDR block_min, GM_ADDR past_lens,
                             GM_ADDR total_lens, const MetadataPlan& plan) {
    const auto& s = plan.shape;
    const int64_t S = s.new_tokens, D = s.head_dim, M = s.num_blocks, P = s.block_size, Dp = plan.dim_padded;
    TPipe pipe;
    TBuf<TPosition::VECCALC> buffer;
    pipe.InitBuffer(buffer, static_cast<uint32_t>(plan.ub_used));
    const LocalTensor<uint8_t> ub = buffer.Get<uint8_t>();
    const LocalTensor<T> keys[2] = {slice<T>(ub, plan.keys[0]), slice<T>(ub, plan.keys[1])};
    const LocalTensor<float> keys_f32 = slice<float>(ub, plan.keys_f32);
    const LocalTensor<float> acc_max = slice<float>(ub, plan.acc_max), acc_min = slice<float>(ub, plan.acc_min);
    const LocalTensor<TC> out_max = slice<TC>(ub, plan.out_max), out_min = slice<TC>(ub, plan.out_min);
    GlobalTensor<int32_t> past_gm, total_gm;
    past_gm.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(past_lens));
    total_gm.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(total_lens));
    const int32_t core = static_cast<int32_t>(GetBlockIdx());
    for (int64_t item = plan.split.begin(core); item < plan.split.end(core); ++item) {
      const int64_t past = past_gm.GetValue(item / s.kv_heads), total = total_gm.GetValue(item / s.kv_heads);
      GlobalTensor<T> key_gm;
      GlobalTensor<TC> max_gm, min_gm;
      key_gm.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(key) + item * S * D);
      max_gm.SetGlobalBuffer(reinterpret_cast<__gm__ TC*>(block_max) + item * M * D);
      min_gm.SetGlobalBuffer(reinterpret_cast<__gm__ TC*>(block_min) + item * M * D);
      for (int64_t m = past / P; past < total && m <= (total - 1) / P; ++m) {
        const int64_t first = past > m * P ? past : m * P, last = total < (m + 1) * P ? total : (m + 1) * P;
        if (first != m * P) {  // continue from the block's stored bounds
          copy_rows_in(out_max, max_gm[m * D], 1, D, Dp);
          copy_rows_in(out_min, min_gm[m * D], 1, D, Dp);
          to_float(acc_max, out_max, Dp);
          to_float(acc_min, out_min, Dp);
          PipeBarrier<PIPE_ALL>();
        }
        int which = 0;
        for (int64_t t0 = first; t0 < last; t0 += plan.rows_per_chunk, which ^= 1) {
          const int64_t rows = plan.rows_per_chunk < last - t0 ? plan.rows_per_chunk : last - t0;
          copy_rows_in(keys[which], key_gm[(t0 - past) * D], rows, D, Dp);
          to_float(keys_f32, keys[which], rows * Dp);
          PipeBarrier<PIPE_ALL>();
          for (int64_t r = 0; r < rows; ++r) {
            // Round outward through the bounds' dtype (out_max and out_min are free here): up into
            // the max, down into the min, so the bounds hold the key.
            const LocalTensor<float> row = keys_f32[r * Dp];
            from_float<TC, RoundMode::CAST_CEIL>(out_max, row, Dp);
            from_float<TC, RoundMode::CAST_FLOOR>(out_min, row, Dp);
            PipeBarrier<PIPE_ALL>();
            const bool starts = t0 + r == m * P;
            to_float(row, out_max, Dp);
            PipeBarrier<PIPE_ALL>();
            if (starts)
              Muls(acc_max, row, 1.0f, static_cast<int32_t>(Dp));
            else
              Max(acc_max, acc_max, row, static_cast<int32_t>(Dp));
            PipeBarrier<PIPE_ALL>();
            to_float(row, out_min, Dp);
            PipeBarrier<PIPE_ALL>();
            if (starts)
              Muls(acc_min, row, 1.0f, static_cast<int32_t>(Dp));
            else
              Min(acc_min, acc_min, row, static_cast<int32_t>(Dp));
            PipeBarrier<PIPE_ALL>();
          }
        }
        from_float(out_max, acc_max, Dp);
        from_float(out_min, acc_min, Dp);
        PipeBarrier<PIPE_ALL>();
        DataCopyExtParams copy{1, static_cast<uint32_t>(D * sizeof(TC)), 0, 0, 0};
        DataCopyPad(max_gm[m * D], out_max, copy);
        DataCopyPad(min_gm[m * D], out_min, copy);
        PipeBarrier<PIPE_ALL>();
      }
    }
  }
};

}  // namespace

// One kernel per (key dtype, cache dtype) pair; the host picks by the tensors' element types.
#define QUEST_METADATA_KERNEL(NAME, T, TC)                                                                    \
  extern "C" __global__ __aicore__ void NAME(GM_ADDR key, GM_ADDR block_max, GM_ADDR block_min,               \
                                             GM_ADDR past_lens, GM_ADDR total_lens, MetadataPlan plan) {      \
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);                                                          \
    MetadataKernel<T, TC>().Run(key, block_max, block_min, past_lens, total_lens, plan);                     \
  }

QUEST_METADATA_KERNEL(quest_metadata_f16_f16, half, half)
QUEST_METADATA_KERNEL(quest_metadata_f32_f16, float, half)
QUEST_METADATA_KERNEL(quest_metadata_f16_f32, half, float)
QUEST_METADATA_KERNEL(quest_metadata_f32_f32, float, float)
QUEST_METADATA_KERNEL(quest_metadata_bf16_bf16, bfloat16_t, bfloat16_t)
QUEST_METADATA_KERNEL(quest_metadata_f32_bf16, float, bfloat16_t)
