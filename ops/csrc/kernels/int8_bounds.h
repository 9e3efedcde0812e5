// The int8 block bound format: D int8 codes per bound and one exponent per block (docs/ops.md, int8 block bounds).
//
// The format is plain scalar code here, the C++ reference of every kernel variant. Its operations are
// exact (max, a product by a power of two, floor, ceil), so a SIMD variant that quantizes blocks over
// lanes (simd/quest_metadata.h, quantize_block_lanes) writes the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "arith.h"

namespace quest {

inline constexpr int8_t kNonFiniteExponent = 127;  // a block that held a NaN or infinite bound
inline constexpr int kLowestExponent = -126;       // a block of zeros; no block quantizes below it

// True for bounds of type TC that are int8 codes (with per-block exponents). The probe score never
// runs with them: its key cache shares TC, and the adapter refuses the pair.
template <typename TC>
inline constexpr bool kInt8Bounds = std::is_same_v<TC, int8_t>;

// 2^e in float32 for an int8 exponent: exact for every e < 127 (normal down to 2^-126, subnormal
// 2^-127 and 2^-128, built from bits: a libm ldexp per block showed in the select's profile), NaN
// for kNonFiniteExponent.
inline float exponent_scale(int8_t e) {
  if (e == kNonFiniteExponent) return canonical_nan();
  const uint32_t bits = e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 1u << (e + 149);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale;
}

// The least e >= kLowestExponent with amax <= 127 * 2^e, for a finite amax >= 0: with
// amax = m * 2^k, m in [0.5, 1), 127 * 2^(k - 7) = (127 / 128) * 2^k holds amax exactly when
// m <= 127 / 128, else 2^(k - 6) does.
inline int exponent_of(float amax) {
  if (amax == 0.0f) return kLowestExponent;
  int k = 0;
  const float m = std::frexp(amax, &k);
  const int e = m <= 127.0f / 128.0f ? k - 7 : k - 6;
  return e < kLowestExponent ? kLowestExponent : e;
}

// Quantizes a block's float32 bounds hi/lo [D] into codes and returns the exponent: the block is
// non-finite (codes 0, kNonFiniteExponent) when `non_finite` says a merged value was, or a bound
// is NaN or infinite; else max_code = ceil(hi * 2^-e), min_code = floor(lo * 2^-e), float32
// products (exact for the float16 values merged into a block).
inline int8_t quantize_block(const float* hi, const float* lo, int64_t D, bool non_finite, int8_t* max_codes,
                             int8_t* min_codes) {
  float amax = 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    non_finite = non_finite || !std::isfinite(hi[d]) || !std::isfinite(lo[d]);
    amax = max_select(max_select(std::fabs(hi[d]), std::fabs(lo[d])), amax);
  }
  if (non_finite) {
    std::memset(max_codes, 0, static_cast<size_t>(D));
    std::memset(min_codes, 0, static_cast<size_t>(D));
    return kNonFiniteExponent;
  }
  const int e = exponent_of(amax);
  float inverse;  // 2^-e, a normal float32: e lies in [-126, 122] for a finite amax
  const uint32_t bits = static_cast<uint32_t>(127 - e) << 23;
  std::memcpy(&inverse, &bits, sizeof inverse);
  for (int64_t d = 0; d < D; ++d) {
    max_codes[d] = static_cast<int8_t>(std::ceil(hi[d] * inverse));
    min_codes[d] = static_cast<int8_t>(std::floor(lo[d] * inverse));
  }
  return static_cast<int8_t>(e);
}

// int8 bounds score a query row quantized to 7 bits (docs/ops.md, int8 block bounds): a = max |q[d]|,
// u[d] = min(127, rint(|q[d]| * (127 / a))) (float32 operations, ties to even), u = 0 when a = 0.
inline constexpr float kQueryLevels = 127.0f;
// The largest D of int8 bounds: |I| <= 1024 * 127 * 128 < 2^24, so float32 sums of the integer
// terms are exact in any order (the SIMD variants score them as floats) and float(I) is exact.
inline constexpr int64_t kMostInt8BoundChannels = 1024;

// Quantizes the row q[D] into v[D]: u[d] with the sign of q[d] (0 where q[d] is +-0, and everywhere
// when a is 0, NaN or infinite), and returns the row's factor a / 127 (the canonical NaN when a is
// NaN or infinite: every score of the row is then NaN). Scalar code shared by every variant: a
// row is quantized once per query for all its blocks, and its bits cannot differ between ISAs.
inline float quantize_query_row(const float* q, int64_t D, float* v) {
  float a = 0.0f;
  bool nan = false;
  for (int64_t d = 0; d < D; ++d) {
    const float x = std::fabs(q[d]);
    nan = nan || x != x;
    a = x > a ? x : a;
  }
  const bool usable = !nan && a > 0.0f && a < std::numeric_limits<float>::infinity();
  // A subnormal a makes the ratio infinite: every nonzero channel then saturates at 127, as the
  // float32 formula gives. A zero channel is skipped, never 0 * inf.
  const float ratio = usable ? kQueryLevels / a : 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    const float u = usable && q[d] != 0.0f ? std::min(kQueryLevels, std::nearbyint(std::fabs(q[d]) * ratio)) : 0.0f;
    v[d] = q[d] < 0.0f ? -u : u;
  }
  return nan || !(a < std::numeric_limits<float>::infinity()) ? canonical_nan() : a / kQueryLevels;
}

// A block's held bounds code * 2^e as float32 into hi/lo [D] (NaN for a non-finite block; a
// product past float32's range is infinite, and counts as non-finite when it survives the merge).
inline void dequantize_block(const int8_t* max_codes, const int8_t* min_codes, int8_t e, int64_t D, float* hi,
                             float* lo) {
  const float scale = exponent_scale(e);
  for (int64_t d = 0; d < D; ++d) {
    hi[d] = static_cast<float>(max_codes[d]) * scale;
    lo[d] = static_cast<float>(min_codes[d]) * scale;
  }
}

}  // namespace quest
