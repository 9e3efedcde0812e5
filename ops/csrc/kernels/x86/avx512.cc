// The avx512 variant of every kernel: the generic 16-lane kernels compiled for AVX-512F (+ F16C for float16).
//
// Only the code between push_options and pop_options is compiled for avx512: everything this file
// shares with the rest of the library (standard templates, arith.h) stays baseline x86-64, so the
// linker can never hand a avx512 instruction to a CPU without it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../arith.h"
#include "../block_mass.h"
#include "../dispatch.h"
#include "../int8_bounds.h"
#include "../select_order.h"
#include "../types.h"

#if !defined(__clang__)
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized on _mm512_undefined_*; not our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif
#define QUEST_ISA avx512
#include "lanes_avx512.h"
#include "../simd/table.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace quest {

const KernelTable& avx512_kernels() {
  static const KernelTable table = avx512::make_table("avx512");
  return table;
}

}  // namespace quest
