// The avx2 variant of every kernel: the generic 16-lane kernels compiled for AVX2 + FMA3 + F16C.
//
// Only the code between push_options and pop_options is compiled for avx2: everything this file
// shares with the rest of the library (standard templates, arith.h) stays baseline x86-64, so the
// linker can never hand a avx2 instruction to a CPU without it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../arith.h"
#include "../block_mass.h"
#include "../dispatch.h"
#include "../int8_bounds.h"
#include "../select_order.h"
#include "../types.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define QUEST_ISA avx2
#define QUEST_INT8_DOT "x86/int8_dot_avx2.h"
#include "lanes_avx2.h"
#include "../simd/table.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace quest {

const KernelTable& avx2_kernels() {
  static const KernelTable table = avx2::make_table("avx2");
  return table;
}

}  // namespace quest
