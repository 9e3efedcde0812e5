// Element types and the (activation, cache) dtype pair every kernel is instantiated for.
#pragma once

#include <cstdint>

#include "half.h"

namespace quest {

enum class DType { F32, F16 };

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

}  // namespace quest
