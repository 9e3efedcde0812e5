// Sixteen float lanes in one AVX-512 register (included inside an AVX-512 target region only).
#pragma once

#ifndef QUEST_ISA
#error "define QUEST_ISA (the namespace of this instruction set) before including"
#endif

#include <immintrin.h>

#include "../half.h"

namespace quest::QUEST_ISA {

struct Lanes {
  __m512 v;

  static Lanes zero() { return {_mm512_setzero_ps()}; }
  static Lanes broadcast(float x) { return {_mm512_set1_ps(x)}; }
  static Lanes load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Lanes load(const Half* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(Half* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  // maxps/minps are exactly `a > b ? a : b` and `a < b ? a : b`, NaN and signed zeros included.
  static Lanes max_select(Lanes a, Lanes b) { return {_mm512_max_ps(a.v, b.v)}; }
  static Lanes min_select(Lanes a, Lanes b) { return {_mm512_min_ps(a.v, b.v)}; }
  static Lanes floor(Lanes a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)}; }
  // value where x >= bound (ordered: false for NaN), else +0.
  static Lanes keep_where_at_least(Lanes value, Lanes x, Lanes bound) {
    return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.v, bound.v, _CMP_GE_OQ), value.v)};
  }
  // 2^n for lanes holding integers n in [-126, 127].
  static Lanes pow2(Lanes n) {
    const __m512i biased = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(biased, 23))};
  }
  // Rounds every lane to the nearest float16 value (ties to even) and back.
  Lanes round_half() const { return {_mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))}; }
  // The canonical fold: lane[i] += lane[i + 8], then + 4, + 2, + 1.
  float fold() const {
    const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
  }
};

// Free operators, not hidden friends: GCC applies a `#pragma GCC target` region to these.
inline Lanes operator+(Lanes a, Lanes b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Lanes operator-(Lanes a, Lanes b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Lanes operator*(Lanes a, Lanes b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Lanes operator/(Lanes a, Lanes b) { return {_mm512_div_ps(a.v, b.v)}; }

}  // namespace quest::QUEST_ISA
