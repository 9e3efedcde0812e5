// The scoring rows of a chunk of queries (sparse prefill), shared by every SparseBlockSelect kernel.
//
// Included before the ISA target regions (like select_order.h): plain float arithmetic, elementwise,
// so every variant builds the same rows.
#pragma once

#include <cstdint>
#include <vector>

#include "arith.h"
#include "sparse_block_select.h"

namespace quest {

// The scoring rows of chunk c of KV head n in row b, with members [first, last): per pool group
// (call indices [c * Q + j * pool, + pool), in order) that holds members, per query head g of the
// group in order, the mean of the members' queries: summed in call order from the first, divided by
// their count, in float32. Rows of `stride` floats, zeros past D. Returns the row count.
template <typename T>
int64_t load_chunk_rows(const SparseBlockSelectParams& prm, int64_t b, int64_t n, int64_t c, ChunkMembers members,
                        int64_t stride, std::vector<float>& rows) {
  const int64_t G = prm.num_heads / prm.kv_heads, D = prm.head_dim, S = prm.query_len, pool = prm.chunk_pool;
  const T* query = static_cast<const T*>(prm.query) + (b * prm.num_heads + n * G) * S * D;
  const int64_t chunk_first = c * prm.chunk_size;
  const int64_t groups = (members.last - 1 - chunk_first) / pool - (members.first - chunk_first) / pool + 1;
  rows.assign(groups * G * stride, 0.0f);
  int64_t count = 0;
  for (int64_t start = chunk_first + (members.first - chunk_first) / pool * pool; start < members.last; start += pool) {
    const int64_t first = start > members.first ? start : members.first;
    const int64_t last = start + pool < members.last ? start + pool : members.last;
    for (int64_t g = 0; g < G; ++g, ++count) {
      float* row = rows.data() + count * stride;
      const T* head = query + g * S * D;
      for (int64_t d = 0; d < D; ++d) row[d] = to_float(head[first * D + d]);
      for (int64_t i = first + 1; i < last; ++i)
        for (int64_t d = 0; d < D; ++d) row[d] = row[d] + to_float(head[i * D + d]);
      const float members_in_group = static_cast<float>(last - first);
      for (int64_t d = 0; d < D; ++d) row[d] = row[d] / members_in_group;
    }
  }
  return count;
}

}  // namespace quest
