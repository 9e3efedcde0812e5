// The canonical fp32 arithmetic every kernel variant reproduces bit for bit (see docs/ops.md).
//
// The compiler never fuses on its own (the library builds with -ffp-contract=off): the selection
// scores are `acc = acc + a * b` lane by lane, and the attention's multiply-adds are explicit fused
// ones (std::fma here, one FMA instruction per lane in the SIMD variants), which round once, the
// same on every instruction set.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "half.h"
#include "int8_rows.h"

namespace quest {

inline constexpr int kLanes = 16;

// `a > b ? a : b` and `a < b ? a : b`: x86 maxps/minps semantics, also for NaN and signed zeros.
inline float max_select(float a, float b) { return a > b ? a : b; }
inline float min_select(float a, float b) { return a < b ? a : b; }

// Sixteen lane accumulators: term d goes to lane d % 16; fold() halves 8, 4, 2, 1.
struct LaneSum {
  float lane[kLanes] = {};
  void add(int64_t d, float term) { lane[d & (kLanes - 1)] += term; }
  // lane = fma(a, b, lane): the attention's fused dot products.
  void fused(int64_t d, float a, float b) { lane[d & (kLanes - 1)] = std::fma(a, b, lane[d & (kLanes - 1)]); }
  float fold() {
    for (int width = kLanes / 2; width >= 1; width /= 2)
      for (int i = 0; i < width; ++i) lane[i] = lane[i] + lane[i + width];
    return lane[0];
  }
};

// Sixteen lane maxima: value t goes to lane t % 16 (lane = value > lane ? value : lane, from -inf);
// fold() halves 8, 4, 2, 1 with lane[i] = lane[i] > lane[i + w] ? lane[i] : lane[i + w].
struct LaneMax {
  float lane[kLanes];
  LaneMax() {
    for (float& x : lane) x = -std::numeric_limits<float>::infinity();
  }
  void add(int64_t t, float value) { lane[t & (kLanes - 1)] = max_select(value, lane[t & (kLanes - 1)]); }
  float fold() {
    for (int width = kLanes / 2; width >= 1; width /= 2)
      for (int i = 0; i < width; ++i) lane[i] = max_select(lane[i], lane[i + width]);
    return lane[0];
  }
};

template <typename TA, typename TB>
inline float canonical_dot(const TA* a, const TB* b, int64_t n) {
  LaneSum sum;
  for (int64_t d = 0; d < n; ++d) sum.add(d, to_float(a[d]) * to_float(b[d]));
  return sum.fold();
}

// The attention's dot product: lane l accumulates fma(a[d], b[d], lane) for d = l, l + 16, ... in
// increasing d, over the rows zero-padded to a multiple of 16 (as the SIMD variants load them),
// then the canonical fold.
template <typename TA, typename TB>
inline float fused_dot(const TA* a, const TB* b, int64_t n) {
  LaneSum sum;
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  for (int64_t d = 0; d < padded; ++d) sum.fused(d, d < n ? to_float(a[d]) : 0.0f, d < n ? to_float(b[d]) : 0.0f);
  return sum.fold();
}

// Positions per step of the exact (dense causal) attention walk: a query at p attends the tiles
// [64 j, 64 j + 64) for j = 0 .. p / 64, each one online-softmax step, whatever the block size.
inline constexpr int64_t kExactTile = 64;

// exp(x) for the softmax, where x <= 0: range reduction by ln 2 and a degree-6 polynomial, with
// fused multiply-adds, multiplies and adds only so that every SIMD variant can repeat it exactly.
// Below -87 (and for NaN) it returns 0; above 0 it clamps to exp(0) = 1.
inline float canonical_exp(float x) {
  if (!(x >= -87.0f)) return 0.0f;
  if (x > 0.0f) x = 0.0f;
  const float n = std::floor(std::fma(x, 1.44269504088896341f, 0.5f));
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r);
  p = p + 1.0f;
  const int32_t biased = static_cast<int32_t>(n) + 127;  // n in [-126, 0]: a normal power of two
  const uint32_t bits = static_cast<uint32_t>(biased) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// tanh(x) through canonical_exp of a non-positive argument, for the logit soft cap. A NaN stays a
// NaN (a poisoned logit must stay visible past the cap).
inline float canonical_tanh(float x) {
  if (x != x) return x;
  const float ax = x < 0.0f ? -x : x;
  const float e = canonical_exp(-2.0f * ax);
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

// The NaN every output holds where the contract says NaN (docs/ops.md, non-finite numbers): the
// positive quiet NaN with no payload, so that every variant writes the same bits (x86 arithmetic
// makes the negative "indefinite" NaN, AArch64 the positive one, and a NaN operand passes its
// payload on).
inline float canonical_nan() { return std::numeric_limits<float>::quiet_NaN(); }

// x where it is finite, else the canonical NaN: an output whose float32 sum met a NaN or an
// infinity.
inline float finite_or_nan(float x) { return std::fabs(x) < std::numeric_limits<float>::infinity() ? x : canonical_nan(); }

// A logit that makes its whole row NaN: NaN or +inf (softmax over it is undefined).
inline bool poisons_row(float logit) { return !(logit < std::numeric_limits<float>::infinity()); }

// The softmax denominator before any step: -0. A step, even one whose weights are all 0, adds a
// +0 lane sum and leaves +0 or more, so a row that attended only -inf logits (+0) is told from one
// that attended nothing (-0, which outputs zeros).
inline constexpr float kNothingAttended = -0.0f;

// True when the row's output is NaN: a poisoned logit (NaN running max), or only -inf logits.
inline bool is_nan_row(float max_logit, float denominator) {
  return max_logit != max_logit || (denominator == 0.0f && !std::signbit(denominator));
}

}  // namespace quest
