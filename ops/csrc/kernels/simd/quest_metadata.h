// QuestMetadata over 16-lane vectors: merge each valid key, rounded outward to the bounds' type, into its block.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "../int8_bounds.h"
#include "../quest_metadata.h"
#include "canonical.h"

namespace quest::QUEST_ISA {

// A key rounded outward to the bounds' dtype: up (`Above`) for the max, down for the min. Keys
// that TC holds exactly (of type TC, or any key for float bounds) need no rounding.
template <bool Above, typename T, typename TC>
QUEST_INLINE Lanes bound_value(const Lanes& x) {
  if constexpr (std::is_same_v<T, TC> || std::is_same_v<TC, float>)
    return x;
  else if constexpr (Above)
    return x.round_half_up();
  else
    return x.round_half_down();
}

// Folds row x [D] into amax (per lane the largest |x|, as max(x, -x)) and poison (NaN in a lane
// that saw a NaN or an infinity: x - x is NaN for them, and the NaN stays).
template <typename T>
QUEST_INLINE void fold_magnitudes(const T* x, int64_t D, Lanes& amax, Lanes& poison) {
  for (int64_t d = 0; d < D; d += kChunk) {
    const Lanes v = load_row(x, d, D);
    poison = poison + (v - v);
    amax = Lanes::max_select(amax, Lanes::max_select(v, Lanes::zero() - v));
  }
}

// The scale of key row x as an int8 cache stores it (int8_rows.h quantize_row, bit for bit): 0 for
// a row of zeros, NaN for a row that cannot be stored.
template <typename T>
QUEST_INLINE float int8_row_scale(const T* x, int64_t D) {
  Lanes amax = Lanes::zero(), poison = Lanes::zero();
  fold_magnitudes(x, D, amax, poison);
  if (!Lanes::all_at_least(poison, Lanes::zero())) return canonical_nan();
  // float16(amax / 127) by the vector conversion (round to nearest even, as float_to_half_bits):
  // the scalar conversion, called per row, was a twentieth of the int8 build.
  const float scale = first_lane(Lanes::broadcast(amax.fold_max() / 127.0f).round_half());
  return std::isfinite(scale) ? scale : canonical_nan();  // from 65520 on it rounds to infinity
}

// A key row's int8 scale and its reciprocal, taken once per row (a division per chunk cost more
// than the chunk's other arithmetic). A zero scale (a row of magnitudes at most 127 * 2^-25) gets a
// zero reciprocal, so its row dequantizes to +0 with no branch, as the reference's zero row does.
struct Int8Row {
  float scale = 0.0f, reciprocal = 0.0f;
  QUEST_INLINE static Int8Row of(float scale) { return {scale, scale == 0.0f ? 0.0f : 1.0f / scale}; }
};

// Lanes of a key row as its int8 row holds them: clamp(rint(x * (1 / scale)), -127, 127) * scale,
// exact (zeros for a zero scale, NaN for a NaN one).
QUEST_INLINE Lanes int8_dequantized(const Lanes& x, const Int8Row& row) {
  const Lanes shift = Lanes::broadcast(kRoundingShift);
  const Lanes rounded = (x * Lanes::broadcast(row.reciprocal) + shift) - shift;
  const Lanes low = Lanes::broadcast(-127.0f), high = Lanes::broadcast(127.0f);
  return Lanes::min_select(Lanes::max_select(rounded, low), high) * Lanes::broadcast(row.scale);
}

// quantize_block (int8_bounds.h) over lanes: the same exact operations (|x| as max(x, -x), their
// max, a product by a power of two, floor, and ceil as -floor(-x)), so the same codes and exponent
// bit for bit; only the narrowing of the integral codes to int8 stays scalar. It replaces a libm
// floor and ceil call per channel (the 32K int8 build, side by side, about 1.1x faster).
inline int8_t quantize_block_lanes(const float* hi, const float* lo, int64_t D, bool non_finite, int8_t* max_codes,
                                   int8_t* min_codes, std::vector<float>& codes) {
  Lanes amax = Lanes::zero(), poison = Lanes::zero();
  fold_magnitudes(hi, D, amax, poison);
  fold_magnitudes(lo, D, amax, poison);
  if (non_finite || !Lanes::all_at_least(poison, Lanes::zero())) {
    std::fill(max_codes, max_codes + D, int8_t{0});
    std::fill(min_codes, min_codes + D, int8_t{0});
    return kNonFiniteExponent;
  }
  const int e = exponent_of(amax.fold_max());
  const Lanes inverse = Lanes::broadcast(exponent_scale(static_cast<int8_t>(-e)));  // 2^-e: e in [-126, 122]
  const int64_t Dp = padded(D);
  codes.resize(2 * Dp);
  for (int64_t d = 0; d < D; d += kChunk) {
    (Lanes::zero() - Lanes::floor(Lanes::zero() - load_row(hi, d, D) * inverse)).store(codes.data() + d);
    Lanes::floor(load_row(lo, d, D) * inverse).store(codes.data() + Dp + d);
  }
  // Through plain pointers: an int8 store may alias anything, so indexing the vector reloaded its
  // data pointer (and, for a thread_local vector, its address) on every element.
  const float *max_held = codes.data(), *min_held = max_held + Dp;
  for (int64_t d = 0; d < D; ++d) {
    max_codes[d] = static_cast<int8_t>(max_held[d]);
    min_codes[d] = static_cast<int8_t>(min_held[d]);
  }
  return static_cast<int8_t>(e);
}

// Merges key rows [0, count) (rounded to TR) into one block's max/min (held as TB) for `Chunks`
// chunks from d; key(t, d, full) gives row t's lanes at d, values of type TK (full, a
// std::bool_constant: the caller knows the chunks lie within D, so loads check for no partial
// chunk). The running max/min stay in registers for the whole run and are stored once.
// Float bounds round each key as it comes. Int8 bounds (Int8Held: merged into float32 copies, then
// quantized) round the run's max and min once instead: rounding outward is monotone, so the
// rounded max is the max of the rounded keys, up to the sign of a zero, which their codes cannot
// tell (ceil and floor to an integer code): four float16 conversions per key chunk fewer, 1.07x on
// the 32K int8 build (AVX2 EPYC, alternating runs). Int8 bounds also remember a non-finite key (a
// later merge may drop a NaN): poison gets NaN in a lane where a key, or the run's rounded max or
// min, was NaN or infinite (x - x is NaN for them; a key past float16's range rounds to an
// infinity); the run sums that in a register of its own and adds it once (a sum kept in the
// caller's variable went through memory on every chunk).
// The keys are one sequential stream, which the hardware prefetchers follow best on their own:
// software prefetches 16 rows ahead made the 32K build 25% slower on an AVX-512 EPYC (20 against
// 26 GB/s).
template <int Chunks, bool Full, typename TK, typename TR, bool Int8Held, typename Key, typename TB>
QUEST_INLINE void merge_run(const Key& key, int64_t count, int64_t D, int64_t d, bool starts_block, TB* hi, TB* lo,
                            Lanes& poison) {
  Lanes top[Chunks], bottom[Chunks];  // indexed by constants only (unrolled): they stay in registers
  const auto row = [&](int64_t t, int c) QUEST_INLINE_LAMBDA {
    return key(t, d + c * kChunk, std::bool_constant<Full>{});
  };
  // The run's first merge into the block: it sets the bounds, or meets the ones held.
  const auto open = [&](int c, const Lanes& above, const Lanes& below) QUEST_INLINE_LAMBDA {
    top[c] = starts_block ? above : Lanes::max_select(load_lanes<Full>(hi, d + c * kChunk, D), above);
    bottom[c] = starts_block ? below : Lanes::min_select(load_lanes<Full>(lo, d + c * kChunk, D), below);
  };
  if constexpr (Int8Held) {
    Lanes high[Chunks], low[Chunks];
    Lanes seen = Lanes::zero();
    unrolled<Chunks>([&](auto c) {
      high[c] = low[c] = row(0, c);
      seen = seen + (high[c] - high[c]);
    });
    for (int64_t t = 1; t < count; ++t) {
      unrolled<Chunks>([&](auto c) {
        const Lanes x = row(t, c);
        seen = seen + (x - x);
        high[c] = Lanes::max_select(high[c], x);
        low[c] = Lanes::min_select(low[c], x);
      });
    }
    unrolled<Chunks>([&](auto c) {
      const Lanes above = bound_value<true, TK, TR>(high[c]), below = bound_value<false, TK, TR>(low[c]);
      seen = seen + (above - above) + (below - below);
      open(c, above, below);
    });
    poison = poison + seen;
  } else {
    unrolled<Chunks>([&](auto c) {
      const Lanes x = row(0, c);
      open(c, bound_value<true, TK, TR>(x), bound_value<false, TK, TR>(x));
    });
    for (int64_t t = 1; t < count; ++t) {
      unrolled<Chunks>([&](auto c) {
        const Lanes x = row(t, c);
        top[c] = Lanes::max_select(top[c], bound_value<true, TK, TR>(x));
        bottom[c] = Lanes::min_select(bottom[c], bound_value<false, TK, TR>(x));
      });
    }
  }
  unrolled<Chunks>([&](auto c) {
    store_lanes<Full>(top[c], hi, d + c * kChunk, D);
    store_lanes<Full>(bottom[c], lo, d + c * kChunk, D);
  });
}

// Merges the item's valid keys (row i at position past + i) into its blocks: runs of tokens that
// share a block, merged in token order, as the scalar kernel does. With int8_keys each row is
// first taken as the int8 cache stores it (its scale once per row, then chunk by chunk). int8
// bounds merge into float32 copies of their block (its held codes dequantized, unless the run
// starts it), the run's max and min rounded as float16 bounds are (merge_run), then quantize once
// per run.
template <typename T, typename TC>
void quest_metadata_items(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  constexpr int kChunks = Lanes::kMetadataChunks;
  constexpr bool kInt8 = kInt8Bounds<TC>;
  using Held = std::conditional_t<kInt8, float, TC>;   // what the run merges into
  using Round = std::conditional_t<kInt8, Half, TC>;   // what each key rounds outward to
  thread_local std::vector<Int8Row> rows_of_thread;
  thread_local std::vector<float> held_of_thread, codes_of_thread;
  // Each thread_local's address once per call: used by name in the loops, each use was a
  // __tls_get_addr call (in a shared library), a tenth of the int8 build.
  std::vector<Int8Row>& rows = rows_of_thread;
  std::vector<float>& held = held_of_thread;
  std::vector<float>& codes = codes_of_thread;
  const int64_t D = prm.head_dim, P = prm.block_size;
  for (int64_t item = begin; item < end; ++item) {
    const QuestMetadataItem<T, TC> slices(prm, item);
    const T* key = slices.key;
    TC *block_max = slices.block_max, *block_min = slices.block_min;
    const int64_t past = slices.past, total = slices.total;
    for (int64_t p = past; p < total;) {
      const int64_t m = p / P, run_end = std::min(total, (m + 1) * P), count = run_end - p;
      const T* keys = key + (p - past) * D;
      TC* hi = block_max + m * D;
      TC* lo = block_min + m * D;
      const bool starts_block = p % P == 0;
      Held *top = nullptr, *bottom = nullptr;
      Lanes poison = Lanes::zero();  // int8 bounds: NaN in a lane where a rounded key was NaN or infinite
      if constexpr (kInt8) {
        held.resize(2 * D);
        top = held.data(), bottom = held.data() + D;
        if (!starts_block) dequantize_block(hi, lo, slices.exponent[m], D, top, bottom);
      } else {
        top = hi, bottom = lo;
      }
      const auto merge = [&]<typename TK>(const auto& row_lanes) QUEST_INLINE_LAMBDA {
        int64_t d = 0;
        for (; d + kChunks * kChunk <= D; d += kChunks * kChunk)
          merge_run<kChunks, true, TK, Round, kInt8>(row_lanes, count, D, d, starts_block, top, bottom, poison);
        for (; d < D; d += kChunk)
          merge_run<1, false, TK, Round, kInt8>(row_lanes, count, D, d, starts_block, top, bottom, poison);
      };
      if (prm.int8_keys) {
        rows.resize(static_cast<size_t>(count));
        Int8Row* row = rows.data();
        for (int64_t t = 0; t < count; ++t) row[t] = Int8Row::of(int8_row_scale(keys + t * D, D));
        merge.template operator()<float>([&](int64_t t, int64_t d, auto full) QUEST_INLINE_LAMBDA {
          return int8_dequantized(load_lanes<decltype(full)::value>(keys + t * D, d, D), row[t]);
        });
      } else {
        merge.template operator()<T>([&](int64_t t, int64_t d, auto full) QUEST_INLINE_LAMBDA {
          return load_lanes<decltype(full)::value>(keys + t * D, d, D);
        });
      }
      if constexpr (kInt8) {
        const bool non_finite = (!starts_block && slices.exponent[m] == kNonFiniteExponent) ||
                                !Lanes::all_at_least(poison, Lanes::zero());
        slices.exponent[m] = quantize_block_lanes(top, bottom, D, non_finite, hi, lo, codes);
      }
      p = run_end;
    }
  }
}

}  // namespace quest::QUEST_ISA
