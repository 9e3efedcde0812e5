// Element types and the (activation, cache) dtype pair every kernel is instantiated for.
#pragma once

#include <cstdint>

#include "half.h"

namespace quest {

// I8 is a cache type only: SparseBlockAttention's int8 caches (int8_rows.h) and the int8 block
// bounds of QuestMetadata and SparseBlockSelect (int8_bounds.h), never an activation.
enum class DType { F32, F16, I8 };

// Calls fn.template operator()<T>() with T = float or Half for a runtime dtype.
template <typename Fn>
inline void with_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::F32)
    fn.template operator()<float>();
  else
    fn.template operator()<Half>();
}

// Calls fn.template operator()<T, TC>() for a runtime (activation, cache) dtype pair.
template <typename Fn>
inline void with_dtypes(DType activation, DType cache, Fn&& fn) {
  with_dtype(activation, [&]<typename T>() {
    with_dtype(cache, [&]<typename TC>() { fn.template operator()<T, TC>(); });
  });
}

// Calls fn.template operator()<T, TC>() for an activation dtype and a cache or bounds dtype that may
// also be int8 (SparseBlockAttention's caches, the other ops' block bounds).
template <typename Fn>
inline void with_cache_dtypes(DType activation, DType cache, Fn&& fn) {
  if (cache == DType::I8)
    with_dtype(activation, [&]<typename T>() { fn.template operator()<T, int8_t>(); });
  else
    with_dtypes(activation, cache, fn);
}

}  // namespace quest
