// Scalar reference kernel of QuestMetadata.
#include <vector>

#include "../arith.h"
#include "../quest_metadata.h"

namespace quest {
namespace {

// Merges key row k, token p's, into its block: rounded outward to the bounds' dtype (up into the
// max, down into the min), so the bounds hold the key, and every value a cache of that precision
// or finer may round it to.
template <typename TK, typename TC>
void merge_key(const TK* k, int64_t p, int64_t D, int64_t P, TC* block_max, TC* block_min) {
  TC* hi = block_max + (p / P) * D;
  TC* lo = block_min + (p / P) * D;
  const bool starts = p % P == 0;
  for (int64_t d = 0; d < D; ++d) {
    const float above = to_float(from_float_above<TC>(to_float(k[d])));
    const float below = to_float(from_float_below<TC>(to_float(k[d])));
    hi[d] = from_float<TC>(starts ? above : max_select(to_float(hi[d]), above));
    lo[d] = from_float<TC>(starts ? below : min_select(to_float(lo[d]), below));
  }
}

template <typename T, typename TC>
void run(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  const int64_t D = prm.head_dim, P = prm.block_size;
  std::vector<int8_t> quantized(static_cast<size_t>(D));
  std::vector<float> held(static_cast<size_t>(D));  // an int8-cached key as the cache holds it
  for (int64_t item = begin; item < end; ++item) {
    const QuestMetadataItem<T, TC> slices(prm, item);
    const T* key = slices.key;
    TC *block_max = slices.block_max, *block_min = slices.block_min;
    const int64_t past = slices.past, total = slices.total;
    for (int64_t p = past; p < total; ++p) {
      const T* k = key + (p - past) * D;
      if (!prm.int8_keys) {
        merge_key(k, p, D, P, block_max, block_min);
        continue;
      }
      const Half scale = quantize_row(k, D, quantized.data());
      for (int64_t d = 0; d < D; ++d) held[d] = dequantize(quantized[d], scale);
      merge_key(held.data(), p, D, P, block_max, block_min);
    }
  }
}

}  // namespace

void quest_metadata_scalar(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  with_dtypes(prm.key_type, prm.cache_type,
              [&]<typename T, typename TC>() { run<T, TC>(prm, begin, end); });
}

}  // namespace quest
