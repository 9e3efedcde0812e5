// Sixteen float lanes in two AVX2 registers (included inside an AVX2 + F16C target region only).
#pragma once

#ifndef QUEST_ISA
#error "define QUEST_ISA (the namespace of this instruction set) before including"
#endif

#include <immintrin.h>

#include "../half.h"

namespace quest::QUEST_ISA {

struct Lanes {
  __m256 lo, hi;  // lanes 0-7 and 8-15

  static Lanes zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Lanes broadcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static Lanes load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Lanes load(const Half* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  void store(float* p) const {
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
  }
  void store(Half* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
  }

  // maxps/minps are exactly `a > b ? a : b` and `a < b ? a : b`, NaN and signed zeros included.
  static Lanes max_select(Lanes a, Lanes b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static Lanes min_select(Lanes a, Lanes b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
  static Lanes floor(Lanes a) { return {_mm256_floor_ps(a.lo), _mm256_floor_ps(a.hi)}; }
  // value where x >= bound (ordered: false for NaN), else +0.
  static Lanes keep_where_at_least(Lanes value, Lanes x, Lanes bound) {
    return {_mm256_and_ps(_mm256_cmp_ps(x.lo, bound.lo, _CMP_GE_OQ), value.lo),
            _mm256_and_ps(_mm256_cmp_ps(x.hi, bound.hi, _CMP_GE_OQ), value.hi)};
  }
  // 2^n for lanes holding integers n in [-126, 127].
  static Lanes pow2(Lanes n) {
    const __m256i bias = _mm256_set1_epi32(127);
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), bias), 23)),
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), bias), 23))};
  }
  // Rounds every lane to the nearest float16 value (ties to even) and back.
  Lanes round_half() const {
    return {_mm256_cvtph_ps(_mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)), _mm256_cvtph_ps(_mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT))};
  }
  // The canonical fold: lane[i] += lane[i + 8], then + 4, + 2, + 1.
  float fold() const {
    const __m256 eight = _mm256_add_ps(lo, hi);
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
  }
};

// Free operators, not hidden friends: GCC applies a `#pragma GCC target` region to these.
inline Lanes operator+(Lanes a, Lanes b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Lanes operator-(Lanes a, Lanes b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline Lanes operator*(Lanes a, Lanes b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Lanes operator/(Lanes a, Lanes b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }

}  // namespace quest::QUEST_ISA
