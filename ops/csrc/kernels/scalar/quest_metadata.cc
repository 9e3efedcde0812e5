// Scalar reference kernel of QuestMetadata.
#include "../arith.h"
#include "../quest_metadata.h"

namespace quest {
namespace {

template <typename T, typename TC>
void run(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.new_tokens, D = prm.head_dim, M = prm.num_blocks, P = prm.block_size;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads;
    const T* key = static_cast<const T*>(prm.key) + item * S * D;
    TC* block_max = static_cast<TC*>(prm.block_max) + item * M * D;
    TC* block_min = static_cast<TC*>(prm.block_min) + item * M * D;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    for (int64_t p = past; p < total; ++p) {
      const T* k = key + (p - past) * D;
      TC* hi = block_max + (p / P) * D;
      TC* lo = block_min + (p / P) * D;
      if (p % P == 0) {
        for (int64_t d = 0; d < D; ++d) hi[d] = lo[d] = from_float<TC>(to_float(k[d]));
        continue;
      }
      for (int64_t d = 0; d < D; ++d) {
        // Round the key to the cache dtype first: the metadata bounds the keys the cache holds.
        const float x = to_float(from_float<TC>(to_float(k[d])));
        hi[d] = from_float<TC>(max_select(to_float(hi[d]), x));
        lo[d] = from_float<TC>(min_select(to_float(lo[d]), x));
      }
    }
  }
}

}  // namespace

void quest_metadata_scalar(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  with_dtypes(prm.key_type, prm.cache_type,
              [&]<typename T, typename TC>() { run<T, TC>(prm, begin, end); });
}

}  // namespace quest
