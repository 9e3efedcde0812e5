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

  // Register tiling that fits the 16 vector registers (two per Lanes): key rows per logits tile and
  // 16-lane chunks per value tile, for `heads` query rows (1 to 4): eight accumulators. Fewer heads
  // (a decode step's G = 2) take more rows and chunks: one row per tile left each tile's FMA chains
  // waiting on each other, and each chunk pass re-widened the int8 value rows (measured: the int8
  // exact walk of a decode step 1.3x faster). The logits take query rows two at a time (kLogitHeads):
  // a 2 x 2 tile loads four chunks for eight multiply-adds where four rows by one key loaded five
  // (an exact 512-query prompt step, GroupQueryAttention's time over its own: 0.69 -> 0.75 at 4K,
  // 0.61 -> 0.77 at 8K; make bench-prefill-step-avx2).
  static constexpr int tile_rows(int heads) { return heads <= 2 ? 4 / heads : 1; }
  static constexpr int kLogitHeads = 2;  // query rows per logits tile
  static constexpr int value_chunks(int heads) { return heads <= 2 ? 4 / heads : 1; }
  static constexpr int kMetadataChunks = 2;  // chunks of running max and min kept in registers
  static constexpr bool kFold16 = false;  // no 4 x 4 fold: a logits tile of four heads holds one key row

  static Lanes zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Lanes broadcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static Lanes load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Lanes load(const Half* p) {
    __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256 high = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
#if defined(__clang__)
    // Clang turns a compare of widened float16 vectors into a float16 compare it runs lane by lane
    // (lanes_avx512.h, load): an empty asm hides the widening; no instruction, the same bits.
    __asm__("" : "+x"(low), "+x"(high));
#endif
    return {low, high};
  }
  // Sixteen int8 values widened exactly (sign-extended, then converted). Eight bytes per half, so
  // that each sign extension takes its bytes from memory: one 16-byte load split by a shift cost a
  // shuffle more per half, in walks bound by their arithmetic (a decode step's exact attention
  // over 128K int8 rows, one thread: 33.7 -> 28.4 ms on an AVX2 EPYC).
  static Lanes load(const int8_t* p) {
    const __m128i low = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i high = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(low)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(high))};
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
  // x in its finite lanes, the canonical NaN in the others (arith.h finite_or_nan).
  static __m256 finite_or_nan(__m256 x) {
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 finite = _mm256_cmp_ps(magnitude, _mm256_set1_ps(__builtin_inff()), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_set1_ps(__builtin_nanf("")), x, finite);
  }
  static Lanes finite_or_nan(Lanes x) { return {finite_or_nan(x.lo), finite_or_nan(x.hi)}; }
  // All-one bits in the lanes where q > 0 (ordered: not for NaN or zeros), zero bits elsewhere.
  static Lanes positive_mask(Lanes q) {
    const __m256 zero = _mm256_setzero_ps();
    return {_mm256_cmp_ps(q.lo, zero, _CMP_GT_OQ), _mm256_cmp_ps(q.hi, zero, _CMP_GT_OQ)};
  }
  // a in the lanes whose mask is set, b elsewhere (masks from positive_mask: all bits or none).
  // The blend is written out: GCC 12 turns _mm256_blendv_ps into a select on `mask < 0` and, not
  // knowing the mask is all bits or none, emitted a vpcmpgtd before every blend (the bound
  // scoring's inner loop: eight more instructions per 16 dimensions on 40).
  static __m256 blend(__m256 mask, __m256 a, __m256 b) {
    __m256 out;
    __asm__("vblendvps %1, %2, %3, %0" : "=x"(out) : "x"(mask), "x"(a), "x"(b));
    return out;
  }
  static Lanes select_bits(Lanes mask, Lanes a, Lanes b) { return {blend(mask.lo, a.lo, b.lo), blend(mask.hi, a.hi, b.hi)}; }
  // True when a >= b in every lane (ordered: false if either holds a NaN).
  static bool all_at_least(Lanes a, Lanes b) {
    const __m256 ge = _mm256_and_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GE_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GE_OQ));
    return _mm256_movemask_ps(ge) == 0xFF;
  }
  // a * b + c rounded once (the attention's canonical multiply-add; FMA3 comes with AVX2 here).
  static Lanes fma(Lanes a, Lanes b, Lanes c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
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
  // ... toward +inf and toward -inf (block bounds that hold every lane).
  Lanes round_half_up() const {
    return {_mm256_cvtph_ps(_mm256_cvtps_ph(lo, _MM_FROUND_TO_POS_INF)), _mm256_cvtph_ps(_mm256_cvtps_ph(hi, _MM_FROUND_TO_POS_INF))};
  }
  Lanes round_half_down() const {
    return {_mm256_cvtph_ps(_mm256_cvtps_ph(lo, _MM_FROUND_TO_NEG_INF)), _mm256_cvtph_ps(_mm256_cvtps_ph(hi, _MM_FROUND_TO_NEG_INF))};
  }
  // The unfolded canonical sums of query rows q0, q1 against key rows k0, k1 (D a multiple of 16),
  // in out[0..3] = (q0 k0, q0 k1, q1 k0, q1 k1); tick() once per 16-lane chunk. The empty asm takes
  // the eight loaded registers as they are: left alone, GCC folded each load into both of its
  // multiply-adds as a memory operand, 12 loads for 8 multiply-adds instead of 8.
  static constexpr bool kLogits2x2 = true;
  template <typename Tick>
  static void logits_2x2(const float* q0, const float* q1, const float* k0, const float* k1, int64_t D, Lanes* out,
                         Tick&& tick) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t d = 0; d < D; d += 16) {
      tick();
      __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q0 + d + 8);
      __m256 x2 = _mm256_loadu_ps(q1 + d), x3 = _mm256_loadu_ps(q1 + d + 8);
      __m256 y0 = _mm256_loadu_ps(k0 + d), y1 = _mm256_loadu_ps(k0 + d + 8);
      __m256 y2 = _mm256_loadu_ps(k1 + d), y3 = _mm256_loadu_ps(k1 + d + 8);
      __asm__("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(y0), "+x"(y1), "+x"(y2), "+x"(y3));
      a0 = _mm256_fmadd_ps(x0, y0, a0), a1 = _mm256_fmadd_ps(x1, y1, a1);
      a2 = _mm256_fmadd_ps(x0, y2, a2), a3 = _mm256_fmadd_ps(x1, y3, a3);
      a4 = _mm256_fmadd_ps(x2, y0, a4), a5 = _mm256_fmadd_ps(x3, y1, a5);
      a6 = _mm256_fmadd_ps(x2, y2, a6), a7 = _mm256_fmadd_ps(x3, y3, a7);
    }
    out[0] = {a0, a1}, out[1] = {a2, a3}, out[2] = {a4, a5}, out[3] = {a6, a7};
  }

  // Four canonical folds at once: the same additions as fold(), shuffled into shared registers.
  static void fold4(const Lanes& a, const Lanes& b, const Lanes& c, const Lanes& d, float* out) {
    const __m256 a8 = _mm256_add_ps(a.lo, a.hi), b8 = _mm256_add_ps(b.lo, b.hi);
    const __m256 c8 = _mm256_add_ps(c.lo, c.hi), d8 = _mm256_add_ps(d.lo, d.hi);
    // [a 4 | b 4] and [c 4 | d 4]
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a8, b8, 0x20), _mm256_permute2f128_ps(a8, b8, 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c8, d8, 0x20), _mm256_permute2f128_ps(c8, d8, 0x31));
    // per 128-bit half: [x0 + x2, x1 + x3, y0 + y2, y1 + y3] with (x, y) = (a, c) low, (b, d) high
    const __m256 two = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    const __m256 one = _mm256_add_ps(two, _mm256_permute_ps(two, 0xB1));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, one);
    out[0] = lanes[0], out[1] = lanes[4], out[2] = lanes[2], out[3] = lanes[6];
  }

  // The canonical max fold: lane[i] = max(lane[i], lane[i + w]) for w = 8, 4, 2, 1.
  float fold_max() const {
    const __m256 eight = _mm256_max_ps(lo, hi);
    const __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
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
