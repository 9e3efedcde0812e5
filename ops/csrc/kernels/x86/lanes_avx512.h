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

  // Register tiling that fits the 32 vector registers: key rows per logits tile and 16-lane chunks
  // per value tile, for `heads` query rows (1 to 4).
  static constexpr int tile_rows(int) { return 4; }
  static constexpr int kLogitHeads = 4;  // query rows per logits tile
  static constexpr bool kLogits2x2 = false;  // no 2 x 2 logits tile of its own
  static constexpr int value_chunks(int) { return 4; }
  static constexpr int kMetadataChunks = 8;  // chunks of running max and min kept in registers

  static Lanes zero() { return {_mm512_setzero_ps()}; }
  static Lanes broadcast(float x) { return {_mm512_set1_ps(x)}; }
  static Lanes load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Lanes load(const Half* p) {
    __m512 widened = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#if defined(__clang__)
    // Clang turns a compare of two widened float16 vectors (the select's max >= min) into a float16
    // compare, which without AVX512-FP16 it runs lane by lane: the wheels' (zig) float16 select was
    // 5x slower. An empty asm hides the widening from it; no instruction, the same bits.
    __asm__("" : "+v"(widened));
#endif
    return {widened};
  }
  // Sixteen int8 values widened exactly (sign-extended, then converted).
  static Lanes load(const int8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
  }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(Half* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  // maxps/minps are exactly `a > b ? a : b` and `a < b ? a : b`, NaN and signed zeros included.
  static Lanes max_select(Lanes a, Lanes b) { return {_mm512_max_ps(a.v, b.v)}; }
  static Lanes min_select(Lanes a, Lanes b) { return {_mm512_min_ps(a.v, b.v)}; }
  // x in its finite lanes, the canonical NaN in the others (arith.h finite_or_nan).
  static Lanes finite_or_nan(Lanes x) {
    const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(x.v), _mm512_set1_ps(__builtin_inff()), _CMP_LT_OQ);
    return {_mm512_mask_blend_ps(finite, _mm512_set1_ps(__builtin_nanf("")), x.v)};
  }
  // All-one bits in the lanes where q > 0 (ordered: not for NaN or zeros), zero bits elsewhere.
  static Lanes positive_mask(Lanes q) {
    return {_mm512_castsi512_ps(_mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(q.v, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_epi32(-1)))};
  }
  // a in the lanes whose mask bits are set, b elsewhere (one ternary-logic op: mask ? a : b bitwise).
  static Lanes select_bits(Lanes mask, Lanes a, Lanes b) {
    return {_mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(mask.v), _mm512_castps_si512(a.v),
                                                          _mm512_castps_si512(b.v), 0xCA))};
  }
  // Lanes that held a >= b in every compare so far (ordered: not where either held a NaN); starts
  // at kAllLanes. A compare merged into the mask: one instruction, no branch.
  using LaneMask = __mmask16;
  static constexpr LaneMask kAllLanes = 0xFFFF;
  static LaneMask still_at_least(LaneMask so_far, Lanes a, Lanes b) { return _mm512_mask_cmp_ps_mask(so_far, a.v, b.v, _CMP_GE_OQ); }
  // True when a >= b in every lane (ordered: false if either holds a NaN).
  static bool all_at_least(Lanes a, Lanes b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GE_OQ) == 0xFFFF; }
  // a * b + c rounded once (the attention's canonical multiply-add).
  static Lanes fma(Lanes a, Lanes b, Lanes c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
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
  // ... toward +inf and toward -inf (block bounds that hold every lane).
  Lanes round_half_up() const { return {_mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC))}; }
  Lanes round_half_down() const { return {_mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC))}; }
  // Four canonical folds at once: the same additions as fold(), shuffled into shared registers.
  static void fold4(const Lanes& a, const Lanes& b, const Lanes& c, const Lanes& d, float* out) {
    const __m512 ab = _mm512_add_ps(_mm512_castpd_ps(_mm512_shuffle_f64x2(_mm512_castps_pd(a.v), _mm512_castps_pd(b.v), 0x44)), _mm512_castpd_ps(_mm512_shuffle_f64x2(_mm512_castps_pd(a.v), _mm512_castps_pd(b.v), 0xEE)));
    const __m512 cd = _mm512_add_ps(_mm512_castpd_ps(_mm512_shuffle_f64x2(_mm512_castps_pd(c.v), _mm512_castps_pd(d.v), 0x44)), _mm512_castpd_ps(_mm512_shuffle_f64x2(_mm512_castps_pd(c.v), _mm512_castps_pd(d.v), 0xEE)));
    // ab = [a 8 lanes | b 8 lanes]: quarters 0,1 belong to a, 2,3 to b; likewise cd.
    const __m512 four = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 two = _mm512_add_ps(four, _mm512_permute_ps(four, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 one = _mm512_add_ps(two, _mm512_permute_ps(two, _MM_SHUFFLE(2, 3, 0, 1)));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, one);
    out[0] = lanes[0], out[1] = lanes[4], out[2] = lanes[8], out[3] = lanes[12];
  }

  // Sixteen canonical folds at once, acc[4 h + r] to out[h * stride + r] (4 rows h x 4 columns r):
  // every level adds the same lane pairs as fold(), two accumulators' halves per register, so each
  // addition does the work of two, and the last level leaves row h's four results in 128-bit lane h.
  static constexpr bool kFold16 = true;
  // fold16's levels, as members rather than lambdas (for a lambda GCC also emits a function-pointer
  // thunk, and warned that its vector return changes the ABI).
  static __m512 fold_halves(__m512 a, __m512 b) {  // [a lanes i + (i + 8) | b lanes i + (i + 8)], i < 8
    const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_shuffle_f64x2(x, y, 0x44)),
                         _mm512_castpd_ps(_mm512_shuffle_f64x2(x, y, 0xEE)));
  }
  static __m512 fold_pairs(__m512 a, __m512 b) {  // per 128-bit lane: [a0 + a2, a1 + a3, b0 + b2, b1 + b3]
    const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  static void fold16(const Lanes* acc, float* out, int64_t stride) {
    __m512 column[4];  // column r: 128-bit lane h holds row h's four partial sums (i + 4 folded)
    for (int r = 0; r < 4; ++r) {
      const __m512 top = fold_halves(acc[r].v, acc[4 + r].v), bottom = fold_halves(acc[8 + r].v, acc[12 + r].v);
      column[r] = _mm512_add_ps(_mm512_shuffle_f32x4(top, bottom, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(top, bottom, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    const __m512 first = fold_pairs(column[0], column[1]), second = fold_pairs(column[2], column[3]);
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(first, second, _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(first, second, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm_storeu_ps(out, _mm512_castps512_ps128(sums));
    _mm_storeu_ps(out + stride, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(out + 2 * stride, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(out + 3 * stride, _mm512_extractf32x4_ps(sums, 3));
  }

  // The canonical max fold: lane[i] = max(lane[i], lane[i + w]) for w = 8, 4, 2, 1.
  float fold_max() const {
    const __m256 eight = _mm256_max_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
  }

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
