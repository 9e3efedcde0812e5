// The canonical arithmetic of arith.h over 16-lane vectors: the same operations in the same order,
// so every SIMD variant returns bit-identical results to the scalar kernels.
//
// Included by an instruction-set translation unit (x86/avx2.cc, ...) after it defines QUEST_ISA and
// its `Lanes` type, inside its target region.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../arith.h"

namespace quest::QUEST_ISA {

inline constexpr int64_t kChunk = kLanes;

// Hot helpers are forced inline: a call per key row (with a realigned frame for the vectors)
// costs more than the row's arithmetic.
#define QUEST_INLINE inline __attribute__((always_inline))
// The same for a lambda (after its parameters) that updates a tile's accumulators: out of line
// they live in memory, a store and a load around every step.
#define QUEST_INLINE_LAMBDA __attribute__((always_inline))

inline int64_t padded(int64_t n) { return (n + kChunk - 1) / kChunk * kChunk; }

template <typename T>
QUEST_INLINE Lanes load_partial(const T* p, int64_t n) {
  T buffer[kChunk] = {};  // +0 in the lanes past n: adding a +0 product never changes a lane
  std::copy(p, p + n, buffer);
  return Lanes::load(buffer);
}

template <typename T>
QUEST_INLINE void store_partial(const Lanes& v, T* p, int64_t n) {
  T buffer[kChunk];
  v.store(buffer);
  std::copy(buffer, buffer + n, p);
}

// Lanes [d, d + 16) of a row of D values, zero past D.
template <typename T>
QUEST_INLINE Lanes load_row(const T* row, int64_t d, int64_t D) {
  return d + kChunk <= D ? Lanes::load(row + d) : load_partial(row + d, D - d);
}

template <typename T>
QUEST_INLINE void store_row(const Lanes& v, T* row, int64_t d, int64_t D) {
  if (d + kChunk <= D)
    v.store(row + d);
  else
    store_partial(v, row + d, D - d);
}

QUEST_INLINE float first_lane(const Lanes& v) {
  float lanes[kChunk];
  v.store(lanes);
  return lanes[0];
}

// load_row and store_row where the caller knows at compile time (Full) that [d, d + 16) lies
// within D: no check for a partial chunk on the way.
template <bool Full, typename T>
QUEST_INLINE Lanes load_lanes(const T* row, int64_t d, int64_t D) {
  if constexpr (Full)
    return Lanes::load(row + d);
  else
    return load_row(row, d, D);
}

template <bool Full, typename T>
QUEST_INLINE void store_lanes(const Lanes& v, T* row, int64_t d, int64_t D) {
  if constexpr (Full)
    v.store(row + d);
  else
    store_row(v, row, d, D);
}

template <typename TC>
Lanes round_to(const Lanes& v) {
  if constexpr (std::is_same_v<TC, Half>)
    return v.round_half();
  else
    return v;
}

// f(std::integral_constant<int, I>{}) for I = 0 .. N-1, unrolled from the start: indices into
// small arrays of vectors are constants before any optimisation pass, so the arrays stay in
// registers (a loop the compiler unrolls late leaves them on the stack). The expanding lambda is
// forced inline too: GCC once kept a large one out of line (a 4 x 4 tile of integer dot products,
// a 3 x 4 tile of attention logits), where every accumulator went through memory after each step.
template <int N, typename F>
QUEST_INLINE void unrolled(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) QUEST_INLINE_LAMBDA {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

// canonical_exp on every lane.
QUEST_INLINE Lanes exp_lanes(Lanes x) {
  const Lanes lowest = Lanes::broadcast(-87.0f);
  const Lanes in_range = x;
  x = Lanes::min_select(Lanes::zero(), x);  // x > 0 ? 0 : x
  const Lanes n = Lanes::floor(Lanes::fma(x, Lanes::broadcast(1.44269504088896341f), Lanes::broadcast(0.5f)));
  Lanes r = Lanes::fma(n, Lanes::broadcast(-0.693359375f), x);
  r = Lanes::fma(n, Lanes::broadcast(2.12194440e-4f), r);
  Lanes p = Lanes::broadcast(1.9875691500e-4f);
  p = Lanes::fma(p, r, Lanes::broadcast(1.3981999507e-3f));
  p = Lanes::fma(p, r, Lanes::broadcast(8.3334519073e-3f));
  p = Lanes::fma(p, r, Lanes::broadcast(4.1665795894e-2f));
  p = Lanes::fma(p, r, Lanes::broadcast(1.6666665459e-1f));
  p = Lanes::fma(p, r, Lanes::broadcast(5.0000001201e-1f));
  p = Lanes::fma(p, r * r, r);
  p = p + Lanes::broadcast(1.0f);
  // Lanes below -87 (or NaN) give 0; their n may be out of range, but the mask discards them.
  return Lanes::keep_where_at_least(p * Lanes::pow2(Lanes::max_select(n, Lanes::broadcast(-126.0f))), in_range, lowest);
}

// The canonical dot product of a zero-padded float row `q` with a row `k` of D values.
template <typename TC>
QUEST_INLINE float dot(const float* q, const TC* k, int64_t D) {
  Lanes acc = Lanes::zero();
  int64_t d = 0;
  for (; d + kChunk <= D; d += kChunk) acc = acc + Lanes::load(q + d) * Lanes::load(k + d);
  if (d < D) acc = acc + Lanes::load(q + d) * load_partial(k + d, D - d);
  return acc.fold();
}

// Loads a row of D values of type T into a float row zero-padded to a multiple of 16.
template <typename T>
void load_padded(const T* row, int64_t D, float* out) {
  for (int64_t d = 0; d < padded(D); d += kChunk) load_row(row, d, D).store(out + d);
}

}  // namespace quest::QUEST_ISA
