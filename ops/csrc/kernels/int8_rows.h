// The int8 KV cache's row format: D int8 values and one float16 scale per row (docs/ops.md, int8 caches).
//
// Written once per new token and head, so a plain scalar loop serves every kernel variant: the
// bits then cannot differ between instruction sets, and the cost is one row per token per head.
#pragma once

#include <cmath>
#include <cstdint>

#include "half.h"

namespace quest {

inline float to_float(int8_t x) { return static_cast<float>(x); }

// The scale a row that cannot be stored gets (a NaN or infinite element, or a magnitude past
// 127 * 65504): the positive quiet float16 NaN, so the row dequantizes to NaN everywhere.
inline constexpr uint16_t kNanScale = 0x7E00u;

// x rounded to the nearest integer, ties to even, for |x| < 2^22: adding and removing 1.5 * 2^23
// leaves no fraction bits (the default rounding mode does the rest). One add and one subtract in
// every variant, where a libm call per element made the scalar row 8 times slower; x / scale stays
// within 255 in magnitude, and a NaN stays NaN.
inline constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23
inline float round_to_integer(float x) { return (x + kRoundingShift) - kRoundingShift; }

// Quantizes the row x[0..D) (converted to float32) into q[0..D) and returns its scale:
// scale = float16(amax / 127) rounded to nearest even, q[d] = clamp(rint(x[d] * (1 / scale)), -127,
// 127) (a multiply by the row's reciprocal: a division per element cost the metadata build 40%);
// all q zero when the scale is 0 or not finite (then the NaN scale). q[d] * scale is exact in
// float32 (7 bits times 11), so every implementation dequantizes to the same values.
template <typename T>
inline Half quantize_row(const T* x, int64_t D, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t d = 0; d < D; ++d) {
    const float v = to_float(x[d]);
    finite = finite && std::isfinite(v);
    const float a = std::fabs(v);
    amax = a > amax ? a : amax;
  }
  const Half scale{finite ? float_to_half_bits(amax / 127.0f) : kNanScale};
  const float s = half_bits_to_float(scale.bits);
  if (!std::isfinite(s) || s == 0.0f) {
    for (int64_t d = 0; d < D; ++d) q[d] = 0;
    return std::isfinite(s) ? scale : Half{kNanScale};
  }
  const float reciprocal = 1.0f / s;
  for (int64_t d = 0; d < D; ++d) {
    const float r = round_to_integer(to_float(x[d]) * reciprocal);
    q[d] = static_cast<int8_t>(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
  }
  return scale;
}

// q * scale: the value an int8 cache row holds, exact in float32 (a NaN scale gives NaN).
inline float dequantize(int8_t q, Half scale) { return static_cast<float>(q) * half_bits_to_float(scale.bits); }

}  // namespace quest
