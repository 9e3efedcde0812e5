// Sixteen float lanes in four NEON registers (AArch64, ARMv8.0: NEON and half conversions are baseline).
#pragma once

#ifndef QUEST_ISA
#error "define QUEST_ISA (the namespace of this instruction set) before including"
#endif

#include <arm_neon.h>

#include "../half.h"

namespace quest::QUEST_ISA {

struct Lanes {
  float32x4_t a, b, c, d;  // lanes 0-3, 4-7, 8-11, 12-15

  // Register tiling that fits the 32 vector registers (four per Lanes): key rows per logits tile
  // and 16-lane chunks per value tile, for `heads` query rows (1 to 4).
  static constexpr int tile_rows(int) { return 1; }
  static constexpr int kLogitHeads = 4;  // query rows per logits tile
  static constexpr bool kLogits2x2 = false;  // no 2 x 2 logits tile of its own
  static constexpr int value_chunks(int) { return 1; }
  static constexpr int kMetadataChunks = 2;  // chunks of running max and min kept in registers
  static constexpr bool kFold16 = false;  // no 4 x 4 fold: the logits tile holds one key row

  static Lanes zero() { return broadcast(0.0f); }
  static Lanes broadcast(float x) {
    const float32x4_t v = vdupq_n_f32(x);
    return {v, v, v, v};
  }
  static Lanes load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}; }
  static Lanes load(const Half* p) {
    const float16x8_t low = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p)));
    const float16x8_t high = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p + 8)));
    return {vcvt_f32_f16(vget_low_f16(low)), vcvt_high_f32_f16(low), vcvt_f32_f16(vget_low_f16(high)),
            vcvt_high_f32_f16(high)};
  }
  // Sixteen int8 values widened exactly (sign-extended twice, then converted).
  static Lanes load(const int8_t* p) {
    const int8x16_t bytes = vld1q_s8(p);
    const int16x8_t low = vmovl_s8(vget_low_s8(bytes)), high = vmovl_high_s8(bytes);
    return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(low))), vcvtq_f32_s32(vmovl_high_s16(low)),
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(high))), vcvtq_f32_s32(vmovl_high_s16(high))};
  }
  void store(float* p) const {
    vst1q_f32(p, a);
    vst1q_f32(p + 4, b);
    vst1q_f32(p + 8, c);
    vst1q_f32(p + 12, d);
  }
  void store(Half* p) const {
    vst1q_u16(reinterpret_cast<uint16_t*>(p), vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(a), b)));
    vst1q_u16(reinterpret_cast<uint16_t*>(p + 8), vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(c), d)));
  }

  // Compare and select, not vmaxq (which propagates NaN): exactly `x > y ? x : y`.
  static float32x4_t gt_select(float32x4_t x, float32x4_t y) { return vbslq_f32(vcgtq_f32(x, y), x, y); }
  static float32x4_t lt_select(float32x4_t x, float32x4_t y) { return vbslq_f32(vcltq_f32(x, y), x, y); }
  static Lanes max_select(Lanes x, Lanes y) { return {gt_select(x.a, y.a), gt_select(x.b, y.b), gt_select(x.c, y.c), gt_select(x.d, y.d)}; }
  static Lanes min_select(Lanes x, Lanes y) { return {lt_select(x.a, y.a), lt_select(x.b, y.b), lt_select(x.c, y.c), lt_select(x.d, y.d)}; }
  // x in its finite lanes, the canonical NaN in the others (arith.h finite_or_nan).
  static float32x4_t finite_or_nan(float32x4_t x) {
    return vbslq_f32(vcltq_f32(vabsq_f32(x), vdupq_n_f32(__builtin_inff())), x, vdupq_n_f32(__builtin_nanf("")));
  }
  static Lanes finite_or_nan(Lanes x) { return {finite_or_nan(x.a), finite_or_nan(x.b), finite_or_nan(x.c), finite_or_nan(x.d)}; }
  // All-one bits in the lanes where q > 0 (ordered: not for NaN or zeros), zero bits elsewhere.
  static float32x4_t positive(float32x4_t x) { return vreinterpretq_f32_u32(vcgtq_f32(x, vdupq_n_f32(0.0f))); }
  static Lanes positive_mask(Lanes q) { return {positive(q.a), positive(q.b), positive(q.c), positive(q.d)}; }
  // x in the lanes whose mask bits are set, y elsewhere.
  static float32x4_t bit_select(float32x4_t mask, float32x4_t x, float32x4_t y) {
    return vbslq_f32(vreinterpretq_u32_f32(mask), x, y);
  }
  static Lanes select_bits(Lanes m, Lanes x, Lanes y) {
    return {bit_select(m.a, x.a, y.a), bit_select(m.b, x.b, y.b), bit_select(m.c, x.c, y.c), bit_select(m.d, x.d, y.d)};
  }
  // True when x >= y in every lane (false if either holds a NaN).
  static bool all_at_least(Lanes x, Lanes y) {
    const uint32x4_t ge = vandq_u32(vandq_u32(vcgeq_f32(x.a, y.a), vcgeq_f32(x.b, y.b)),
                                    vandq_u32(vcgeq_f32(x.c, y.c), vcgeq_f32(x.d, y.d)));
    return vminvq_u32(ge) != 0;
  }
  // x * y + z rounded once (the attention's canonical multiply-add; FMLA is baseline AArch64).
  static Lanes fma(Lanes x, Lanes y, Lanes z) {
    return {vfmaq_f32(z.a, x.a, y.a), vfmaq_f32(z.b, x.b, y.b), vfmaq_f32(z.c, x.c, y.c), vfmaq_f32(z.d, x.d, y.d)};
  }
  static Lanes floor(Lanes x) { return {vrndmq_f32(x.a), vrndmq_f32(x.b), vrndmq_f32(x.c), vrndmq_f32(x.d)}; }
  // value where x >= bound (false for NaN), else +0.
  static float32x4_t keep(float32x4_t value, float32x4_t x, float32x4_t bound) {
    return vreinterpretq_f32_u32(vandq_u32(vcgeq_f32(x, bound), vreinterpretq_u32_f32(value)));
  }
  static Lanes keep_where_at_least(Lanes value, Lanes x, Lanes bound) {
    return {keep(value.a, x.a, bound.a), keep(value.b, x.b, bound.b), keep(value.c, x.c, bound.c), keep(value.d, x.d, bound.d)};
  }
  // 2^n for lanes holding integers n in [-126, 127].
  static float32x4_t pow2(float32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
  static Lanes pow2(Lanes n) { return {pow2(n.a), pow2(n.b), pow2(n.c), pow2(n.d)}; }
  // Rounds every lane to the nearest float16 value (ties to even) and back.
  static float32x4_t round_half(float32x4_t x) { return vcvt_f32_f16(vcvt_f16_f32(x)); }
  Lanes round_half() const { return {round_half(a), round_half(b), round_half(c), round_half(d)}; }
  // ... toward +inf (`Up`) or -inf: the nearest value, stepped once outward where it lies on the
  // wrong side (FCVTN rounds by FPCR, which stays at nearest; a negative value steps up by -1 in
  // its bits, a positive one by +1).
  template <bool Up>
  static float32x4_t round_half_outward(float32x4_t x) {
    const float16x4_t h = vcvt_f16_f32(x);
    const float32x4_t back = vcvt_f32_f16(h);
    const uint16x4_t wrong = vmovn_u32(Up ? vcltq_f32(back, x) : vcgtq_f32(back, x));
    const uint16x4_t bits = vreinterpret_u16_f16(h);
    const uint16x4_t negative = vtst_u16(bits, vdup_n_u16(0x8000));
    // Up: +1 for positive, -1 for negative; down: the opposite. As a wrapped uint16 add of 1 or 0xFFFF.
    const uint16x4_t step = Up ? vbsl_u16(negative, vdup_n_u16(0xFFFF), vdup_n_u16(1))
                               : vbsl_u16(negative, vdup_n_u16(1), vdup_n_u16(0xFFFF));
    return vcvt_f32_f16(vreinterpret_f16_u16(vadd_u16(bits, vand_u16(step, wrong))));
  }
  Lanes round_half_up() const {
    return {round_half_outward<true>(a), round_half_outward<true>(b), round_half_outward<true>(c), round_half_outward<true>(d)};
  }
  Lanes round_half_down() const {
    return {round_half_outward<false>(a), round_half_outward<false>(b), round_half_outward<false>(c),
            round_half_outward<false>(d)};
  }
  static void fold4(const Lanes& w, const Lanes& x, const Lanes& y, const Lanes& z, float* out) {
    out[0] = w.fold(), out[1] = x.fold(), out[2] = y.fold(), out[3] = z.fold();
  }

  // The canonical max fold: lane[i] = max(lane[i], lane[i + w]) for w = 8, 4, 2, 1.
  float fold_max() const {
    const float32x4_t four = gt_select(gt_select(a, c), gt_select(b, d));
    const float32x2_t low = vget_low_f32(four), high = vget_high_f32(four);
    const float32x2_t two = vbsl_f32(vcgt_f32(low, high), low, high);
    const float x = vget_lane_f32(two, 0), y = vget_lane_f32(two, 1);
    return x > y ? x : y;
  }

  // The canonical fold: lane[i] += lane[i + 8], then + 4, + 2, + 1.
  float fold() const {
    const float32x4_t four = vaddq_f32(vaddq_f32(a, c), vaddq_f32(b, d));
    const float32x2_t two = vadd_f32(vget_low_f32(four), vget_high_f32(four));
    return vget_lane_f32(two, 0) + vget_lane_f32(two, 1);
  }
};

// Free operators, not hidden friends: GCC applies a `#pragma GCC target` region to these.
inline Lanes operator+(Lanes x, Lanes y) { return {vaddq_f32(x.a, y.a), vaddq_f32(x.b, y.b), vaddq_f32(x.c, y.c), vaddq_f32(x.d, y.d)}; }
inline Lanes operator-(Lanes x, Lanes y) { return {vsubq_f32(x.a, y.a), vsubq_f32(x.b, y.b), vsubq_f32(x.c, y.c), vsubq_f32(x.d, y.d)}; }
inline Lanes operator*(Lanes x, Lanes y) { return {vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b), vmulq_f32(x.c, y.c), vmulq_f32(x.d, y.d)}; }
inline Lanes operator/(Lanes x, Lanes y) { return {vdivq_f32(x.a, y.a), vdivq_f32(x.b, y.b), vdivq_f32(x.c, y.c), vdivq_f32(x.d, y.d)}; }

}  // namespace quest::QUEST_ISA
