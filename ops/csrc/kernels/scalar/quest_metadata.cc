// Scalar reference kernel of QuestMetadata.
#include <type_traits>
#include <vector>

#include "../arith.h"
#include "../quest_metadata.h"

namespace quest {
namespace {

// Merges the item's key rows (row i at position past + i) into its blocks.
template <typename TK, typename TC>
void merge_keys(const QuestMetadataParams& prm, int64_t item, const TK* key) {
  const int64_t D = prm.head_dim, M = prm.num_blocks, P = prm.block_size;
  const int64_t b = item / prm.kv_heads;
  TC* block_max = static_cast<TC*>(prm.block_max) + item * M * D;
  TC* block_min = static_cast<TC*>(prm.block_min) + item * M * D;
  const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
  for (int64_t p = past; p < total; ++p) {
    const TK* k = key + (p - past) * D;
    TC* hi = block_max + (p / P) * D;
    TC* lo = block_min + (p / P) * D;
    // The key rounded outward to the bounds' dtype (up into the max, down into the min): the
    // bounds hold the key, and every value a cache of that precision or finer may round it to.
    for (int64_t d = 0; d < D; ++d) {
      const float above = to_float(from_float_above<TC>(to_float(k[d])));
      const float below = to_float(from_float_below<TC>(to_float(k[d])));
      const bool starts = p % P == 0;
      hi[d] = from_float<TC>(starts ? above : max_select(to_float(hi[d]), above));
      lo[d] = from_float<TC>(starts ? below : min_select(to_float(lo[d]), below));
    }
  }
}

template <typename T, typename TC>
void run(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  std::vector<float> scratch;
  for (int64_t item = begin; item < end; ++item)
    with_bounded_keys<T>(prm, item, scratch, [&](const auto* keys) {
      merge_keys<std::remove_cv_t<std::remove_pointer_t<decltype(keys)>>, TC>(prm, item, keys);
    });
}

}  // namespace

void quest_metadata_scalar(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  with_dtypes(prm.key_type, prm.cache_type,
              [&]<typename T, typename TC>() { run<T, TC>(prm, begin, end); });
}

}  // namespace quest
