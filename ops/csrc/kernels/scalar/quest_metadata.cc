// Scalar reference kernel of QuestMetadata.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../arith.h"
#include "../int8_bounds.h"
#include "../quest_metadata.h"

namespace quest {
namespace {

// Merges key row k into its block's bounds hi/lo [D] (held as TB): rounded outward to TR (up into
// the max, down into the min), so the bounds hold the key, and every value a cache of that
// precision or finer may round it to; `starts`: the block's first key, which sets the bounds.
// Returns false when a rounded value is NaN or infinite (int8 bounds remember it: a later merge
// may drop a NaN).
template <typename TR, typename TK, typename TB>
bool merge_key(const TK* k, int64_t D, bool starts, TB* hi, TB* lo) {
  bool finite = true;
  for (int64_t d = 0; d < D; ++d) {
    const float above = to_float(from_float_above<TR>(to_float(k[d])));
    const float below = to_float(from_float_below<TR>(to_float(k[d])));
    finite = finite && std::isfinite(above) && std::isfinite(below);
    hi[d] = from_float<TB>(starts ? above : max_select(to_float(hi[d]), above));
    lo[d] = from_float<TB>(starts ? below : min_select(to_float(lo[d]), below));
  }
  return finite;
}

template <typename T, typename TC>
void run(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  const int64_t D = prm.head_dim, P = prm.block_size;
  std::vector<int8_t> quantized(static_cast<size_t>(D));
  std::vector<float> held(static_cast<size_t>(D));  // an int8-cached key as the cache holds it
  std::vector<float> hi(static_cast<size_t>(D)), lo(static_cast<size_t>(D));  // an int8-bounds block as float32
  for (int64_t item = begin; item < end; ++item) {
    const QuestMetadataItem<T, TC> slices(prm, item);
    TC *block_max = slices.block_max, *block_min = slices.block_min;
    const int64_t past = slices.past, total = slices.total;
    // merge(row): token p's key row as the key cache holds it.
    const auto with_key = [&](int64_t p, const auto& merge) {
      const T* k = slices.key + (p - past) * D;
      if (!prm.int8_keys) return merge(k);
      const Half scale = quantize_row(k, D, quantized.data());
      for (int64_t d = 0; d < D; ++d) held[d] = dequantize(quantized[d], scale);
      return merge(held.data());
    };
    if constexpr (!kInt8Bounds<TC>) {
      for (int64_t p = past; p < total; ++p) {
        TC *hi_p = block_max + (p / P) * D, *lo_p = block_min + (p / P) * D;
        with_key(p, [&](const auto* k) { merge_key<TC>(k, D, p % P == 0, hi_p, lo_p); });
      }
    } else {
      // int8 bounds: per block the call touches, its held codes as float32 (unless the call starts
      // it), the keys merged as into float16 bounds, then quantized once.
      for (int64_t p = past; p < total;) {
        const int64_t m = p / P, run_end = std::min(total, (m + 1) * P);
        bool non_finite = false;
        if (p % P != 0) {
          dequantize_block(block_max + m * D, block_min + m * D, slices.exponent[m], D, hi.data(), lo.data());
          non_finite = slices.exponent[m] == kNonFiniteExponent;
        }
        for (; p < run_end; ++p) {
          const bool starts = p % P == 0;
          with_key(p, [&](const auto* k) {
            non_finite = !merge_key<Half>(k, D, starts, hi.data(), lo.data()) || non_finite;
          });
        }
        slices.exponent[m] = quantize_block(hi.data(), lo.data(), D, non_finite, block_max + m * D, block_min + m * D);
      }
    }
  }
}

}  // namespace

void quest_metadata_scalar(const QuestMetadataParams& prm, int64_t begin, int64_t end) {
  with_cache_dtypes(prm.key_type, prm.cache_type,
                    [&]<typename T, typename TC>() { run<T, TC>(prm, begin, end); });
}

}  // namespace quest
