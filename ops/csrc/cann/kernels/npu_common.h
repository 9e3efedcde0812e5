// Helpers the Ascend kernels share (AscendC): UB slices at plan offsets, padded row copies, and
// exact casts to and from float32. Built only with the CANN toolkit.
#pragma once

#include "kernel_operator.h"

#include "../host/plan_types.h"

namespace quest::cann::npu {

using namespace AscendC;

template <typename V>
__aicore__ inline LocalTensor<V> slice(const LocalTensor<uint8_t>& ub, const UbSlice& s) {
  return ub[s.offset].template ReinterpretCast<V>();
}

// Zero the destination rows, then DataCopyPad `rows` rows of `dim` elements into rows of
// `stride` elements (32-byte aligned): the padding lanes hold +0.0.
template <typename E>
__aicore__ inline void copy_rows_in(const LocalTensor<E>& dst, const GlobalTensor<E>& src, int64_t rows, int64_t dim,
                                    int64_t stride) {
  Duplicate(dst, static_cast<E>(0), static_cast<int32_t>(rows * stride));
  PipeBarrier<PIPE_ALL>();
  const uint32_t row_bytes = static_cast<uint32_t>(dim * sizeof(E));
  const uint32_t padded = (row_bytes + 31) / 32 * 32;
  // Rows land `stride` elements apart: the gap after each padded row, in 32-byte blocks (the
  // plans make stride * sizeof(E) a multiple of 32 and at least the padded row when rows > 1).
  const uint32_t gap = rows > 1 ? static_cast<uint32_t>((stride * sizeof(E) - padded) / 32) : 0;
  DataCopyExtParams copy{static_cast<uint16_t>(rows), row_bytes, 0, gap, 0};
  DataCopyPadExtParams<E> pad{true, 0, static_cast<uint8_t>((padded - row_bytes) / sizeof(E)), static_cast<E>(0)};
  DataCopyPad(dst, src, copy, pad);
  PipeBarrier<PIPE_ALL>();
}

template <typename E>
__aicore__ inline void to_float(const LocalTensor<float>& dst, const LocalTensor<E>& src, int64_t count) {
  if constexpr (IsSameType<E, float>::value) {
    Muls(dst, src, 1.0f, static_cast<int32_t>(count));  // x * 1 keeps every value, -0.0 included
  } else {
    Cast(dst, src, RoundMode::CAST_NONE, static_cast<uint32_t>(count));
  }
}

// float32 into E: to nearest (CAST_RINT), or toward +inf / -inf (CAST_CEIL / CAST_FLOOR) for
// block bounds that hold every value.
template <typename E, RoundMode Mode = RoundMode::CAST_RINT>
__aicore__ inline void from_float(const LocalTensor<E>& dst, const LocalTensor<float>& src, int64_t count) {
  if constexpr (IsSameType<E, float>::value) {
    Muls(dst, src, 1.0f, static_cast<int32_t>(count));
  } else {
    Cast(dst, src, Mode, static_cast<uint32_t>(count));
  }
}

}  // namespace quest::cann::npu
