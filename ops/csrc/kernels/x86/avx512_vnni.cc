// The avx512vnni variant: the avx512 kernels, with SparseBlockSelect's int8 bounds scored by VNNI byte dot products.
//
// Only SparseBlockSelect with int8 bounds differs from avx512 (x86/int8_dot_vnni.h); every other
// kernel, and the select with float bounds, is avx512's own. As in avx512.cc, only the code between
// push_options and pop_options is compiled for the instruction set.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../arith.h"
#include "../dispatch.h"
#include "../int8_bounds.h"
#include "../select_order.h"
#include "../sparse_block_select.h"
#include "../types.h"

#if !defined(__clang__)
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized on _mm512_undefined_*; not our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")
#endif
#define QUEST_ISA avx512vnni
#define QUEST_INT8_DOT "x86/int8_dot_vnni.h"
#include "lanes_avx512.h"
#include "../simd/sparse_block_select.h"

namespace quest::avx512vnni {

inline void sparse_block_select_int8(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  with_dtype(prm.query_type, [&]<typename T>() { sparse_block_select_items<T, int8_t>(prm, begin, end); });
}

}  // namespace quest::avx512vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace quest {

const KernelTable& avx512_kernels();

namespace {
void sparse_block_select_vnni(const SparseBlockSelectParams& prm, int64_t begin, int64_t end) {
  if (prm.cache_type == DType::I8) return avx512vnni::sparse_block_select_int8(prm, begin, end);
  avx512_kernels().sparse_block_select(prm, begin, end);
}
}  // namespace

const KernelTable& avx512vnni_kernels() {
  static const KernelTable table = [] {
    KernelTable vnni = avx512_kernels();
    vnni.isa = "avx512vnni";
    vnni.sparse_block_select = sparse_block_select_vnni;
    return vnni;
  }();
  return table;
}

}  // namespace quest
