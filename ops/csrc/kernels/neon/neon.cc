// The NEON variant of every kernel (AArch64): the generic 16-lane kernels on four NEON registers.
//
// ARMv8.0 is enough: NEON and the float16 <-> float32 conversions are baseline on AArch64. The
// ARMv8.2 half-precision arithmetic is deliberately not used: scores and softmax are float32 by
// contract, and max/min merges are exact in either precision.
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

#define QUEST_ISA neon
#include "lanes_neon.h"
#include "../simd/table.h"

namespace quest {

const KernelTable& neon_kernels() {
  static const KernelTable table = neon::make_table("neon");
  return table;
}

}  // namespace quest
