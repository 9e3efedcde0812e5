// IEEE binary16 storage type and exact conversions: to nearest even, and toward +inf or -inf for
// block bounds (portable scalar code).
#pragma once

#include <cstdint>
#include <cstring>

namespace quest {

// The cache/activation element for float16 tensors: raw bits, converted explicitly.
struct Half {
  uint16_t bits;
};

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {  // inf or NaN (payload kept, quiet bit set as hardware does)
    bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: normalise
    uint32_t e = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? (0x200u | ((abs >> 13) & 0x3FFu)) : 0u));
  }
  if (abs >= 0x477FF000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal (2^-25): zero
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24 for exponents 102..112
    const uint32_t kept = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    const uint32_t rounded = kept + ((rest > halfway || (rest == halfway && (kept & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even
  const uint32_t rebased = abs - 0x38000000u;
  const uint32_t kept = rebased >> 13;
  const uint32_t rest = rebased & 0x1FFFu;
  const uint32_t rounded = kept + ((rest > 0x1000u || (rest == 0x1000u && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

// Rounding toward +inf and toward -inf: the least float16 value >= f and the greatest <= f (NaN
// stays NaN). The nearest value, stepped once outward when it lies on the wrong side of f.
inline uint16_t float_to_half_bits_up(float f) {
  const uint16_t h = float_to_half_bits(f);
  if (!(half_bits_to_float(h) < f)) return h;
  return static_cast<uint16_t>((h & 0x8000u) ? h - 1u : h + 1u);  // a negative value steps toward zero
}

inline uint16_t float_to_half_bits_down(float f) {
  const uint16_t h = float_to_half_bits(f);
  if (!(half_bits_to_float(h) > f)) return h;
  return static_cast<uint16_t>((h & 0x8000u) ? h + 1u : h - 1u);  // +0 is never above: f < 0 rounds to -0
}

inline float to_float(float x) { return x; }
inline float to_float(Half x) { return half_bits_to_float(x.bits); }

template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) { return x; }
template <>
inline Half from_float<Half>(float x) { return Half{float_to_half_bits(x)}; }

// The least (`above`) or greatest (`below`) value of T on that side of x: block bounds that hold x.
template <typename T>
inline T from_float_above(float x);
template <typename T>
inline T from_float_below(float x);
template <>
inline float from_float_above<float>(float x) { return x; }
template <>
inline float from_float_below<float>(float x) { return x; }
template <>
inline Half from_float_above<Half>(float x) { return Half{float_to_half_bits_up(x)}; }
template <>
inline Half from_float_below<Half>(float x) { return Half{float_to_half_bits_down(x)}; }

}  // namespace quest
