// SparseBlockSelect's integer bounds of int8 codes with AVX2 byte dot products (vpmaddubsw, vpmaddwd).
//
// Included by simd/sparse_block_select.h, inside its namespace quest::QUEST_ISA, in the avx2
// variant's target region (x86/avx2.cc, which includes <immintrin.h> and <cstring>), after the helpers it shares
// with the generic scoring. Integer sums have no order, so the scores are the scalar kernel's bits.
// Scored as floats, each 8-lane chunk of codes took four conversions before any arithmetic; the
// integer form takes five operations per row for 32 channels, conversions included.
#pragma once

// Channels per dot-product step: one 32-byte vector of codes.
inline constexpr int64_t kByteChunk = 32;

// Quantized rows (quantize_rows) as the unsigned operands of vpmaddubsw: per row, `plus` (u where
// q > 0, else 0) and `minus` (u where q < 0, else 0), each Db bytes, zero past D. A pair of
// channels then gives maddubs(plus, hi) - maddubs(minus, lo) = the pair's two terms of
// I = sum(plus * hi) - sum(minus * lo), exact in 16 bits: each channel is in one of the two sums
// (or neither), with |u * code| <= 127 * 128, so the pair's terms and their difference stay within
// +-32512, codes of -128 included. vpmaddwd by ones then widens the pairs into int32 sums.
struct ByteRows {
  const uint8_t* bytes;  // [rows][2][Db]: plus, then minus
  const float* factor;   // [rows]: a / 127 (quantize_rows)
  int64_t heads, Db;     // heads: the rows that count (the others are padding of zeros)
  int64_t scored;        // rows [0, scored) hold a nonzero byte; the rows after it are zero rows
};

// The byte rows of `rows` rows of r (r.heads of them quantized, the others rows of zeros).
inline ByteRows byte_rows(const BoundRows& r, int64_t rows, int64_t D, SelectScratch& s) {
  const int64_t Db = (D + kByteChunk - 1) / kByteChunk * kByteChunk;
  s.row_bytes.assign(rows * 2 * Db, 0);
  int64_t scored = 0;
  for (int64_t g = 0; g < r.heads; ++g) {
    auto* plus = reinterpret_cast<uint8_t*>(s.row_bytes.data()) + g * 2 * Db;
    uint8_t* minus = plus + Db;
    for (int64_t d = 0; d < D; ++d) {
      const int32_t v = static_cast<int32_t>(r.rows[g * r.Dp + d]);  // a signed magnitude: -127 .. 127
      plus[d] = static_cast<uint8_t>(v > 0 ? v : 0);
      minus[d] = static_cast<uint8_t>(v < 0 ? -v : 0);
      if (v != 0) scored = g + 1;
    }
  }
  return {reinterpret_cast<const uint8_t*>(s.row_bytes.data()), r.factor, r.heads, Db, scored};
}

// 32 codes from `codes + d`, zero past D (a tail chunk is copied, never read past the row).
QUEST_INLINE __m256i load_codes(const int8_t* codes, int64_t d, int64_t D) {
  if (d + kByteChunk <= D) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + d));
  alignas(32) int8_t tail[kByteChunk] = {};
  std::memcpy(tail, codes + d, static_cast<size_t>(D - d));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
}

// The sums of four accumulators' eight int32 lanes, as [a, b, c, d].
QUEST_INLINE __m128i lane_sums4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// Integer bounds I of Rows rows (from row g) against Blocks consecutive blocks of codes hi / lo [D]:
// sums[k * Blocks + b] (sums holds Rows * Blocks rounded up to four, or one). Each chunk of codes is
// loaded once for every row.
template <int Rows, int Blocks>
QUEST_INLINE void integer_tile(const ByteRows& q, int64_t g, const int8_t* hi, const int8_t* lo, int64_t D,
                               int32_t* sums) {
  constexpr int kSums = Rows * Blocks, kFolded = kSums == 1 ? 1 : (kSums + 3) / 4 * 4;
  __m256i acc[kFolded];  // the ones past kSums stay zero: whole groups of four to fold
  unrolled<kFolded>([&](auto j) { acc[j] = _mm256_setzero_si256(); });
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t d = 0; d < D; d += kByteChunk) {
    __m256i h[Blocks], l[Blocks];
    unrolled<Blocks>([&](auto b) {
      h[b] = load_codes(hi + b * D, d, D);
      l[b] = load_codes(lo + b * D, d, D);
    });
    unrolled<Rows>([&](auto k) {
      const uint8_t* row = q.bytes + (g + k) * 2 * q.Db + d;
      const __m256i plus = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
      const __m256i minus = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + q.Db));
      unrolled<Blocks>([&](auto b) {
        const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(plus, h[b]), _mm256_maddubs_epi16(minus, l[b]));
        acc[k * Blocks + b] = _mm256_add_epi32(acc[k * Blocks + b], _mm256_madd_epi16(pairs, ones));
      });
    });
  }
  if constexpr (kFolded == 1) {
    const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(acc[0]), _mm256_extracti128_si256(acc[0], 1));
    const __m128i two = _mm_add_epi32(half, _mm_shuffle_epi32(half, _MM_SHUFFLE(1, 0, 3, 2)));
    sums[0] = _mm_cvtsi128_si32(_mm_add_epi32(two, _mm_shuffle_epi32(two, _MM_SHUFFLE(2, 3, 0, 1))));
  } else {
    unrolled<kFolded / 4>([&](auto j) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sums + 4 * j),
                       lane_sums4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    });
  }
}

// Row g's score float(I) * (a / 127) of one block.
QUEST_INLINE float row_score(const ByteRows& q, int64_t g, int32_t sum) { return static_cast<float>(sum) * q.factor[g]; }

// score_blocks for int8 bounds: the rows' scores (I * factor) max-reduced in row order, times each
// block's 2^e; four blocks at a time (one row: a tile of four blocks; more: four rows per block),
// offered to the selection as the generic scan offers them.
inline void integer_score_blocks(const ByteRows& q, const int8_t* kmax, const int8_t* kmin, const int8_t* exponent,
                                 int64_t D, int64_t eligible, float* scores, SelectScratch& selection) {
  const auto block_score = [&](int64_t m) {
    float score = 0.0f;
    int32_t sums[4];
    for (int64_t g = 0; g < q.heads; g += 4) {
      integer_tile<4, 1>(q, g, kmax + m * D, kmin + m * D, D, sums);
      for (int64_t k = 0; k < 4 && g + k < q.heads; ++k) {
        const float row = row_score(q, g + k, sums[k]);
        score = g + k == 0 ? row : max_select(row, score);
      }
    }
    return score;
  };
  int64_t m = 0;
  for (; m + 4 <= eligible; m += 4) {
    for (int64_t ahead = m + kPrefetchBlocks; ahead < m + kPrefetchBlocks + 4; ++ahead)
      prefetch_bounds(kmax, kmin, ahead, eligible, D);
    if (q.heads == 1) {
      int32_t sums[4];
      integer_tile<1, 4>(q, 0, kmax + m * D, kmin + m * D, D, sums);
      for (int64_t b = 0; b < 4; ++b) scores[m + b] = row_score(q, 0, sums[b]) * exponent_scale(exponent[m + b]);
    } else {
      for (int64_t b = 0; b < 4; ++b) scores[m + b] = block_score(m + b) * exponent_scale(exponent[m + b]);
    }
    static_assert(kOfferBatch == 4);
    selection.offer_until(scores, m + 4);
  }
  for (; m < eligible; ++m) {
    prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
    if (q.heads == 1) {
      int32_t sum = 0;
      integer_tile<1, 1>(q, 0, kmax + m * D, kmin + m * D, D, &sum);
      scores[m] = row_score(q, 0, sum) * exponent_scale(exponent[m]);
    } else {
      scores[m] = block_score(m) * exponent_scale(exponent[m]);
    }
  }
}

// Rows [g, g + Rows) (Rows of 1 to 4) against one block m: scores[(g + k) * eligible + m].
template <int Rows>
QUEST_INLINE void per_row_scores(const ByteRows& q, int64_t g, const int8_t* kmax, const int8_t* kmin, int64_t m,
                                 int64_t D, float scale, int64_t eligible, float* scores) {
  int32_t sums[4];
  integer_tile<Rows, 1>(q, g, kmax + m * D, kmin + m * D, D, sums);
  for (int64_t k = 0; k < Rows; ++k) scores[(g + k) * eligible + m] = row_score(q, g + k, sums[k]) * scale;
}

// score_blocks_per_row for int8 bounds: scores[g * eligible + m] = (I * factor) * 2^e for every
// row. Rows past `scored` are zero rows (the padding to a tile of four, or a query of zeros): I is
// 0 there, so their scores take the same products without the dot products. Up to two rows score
// two blocks per tile (each row's bytes loaded once for both).
inline void integer_score_blocks_per_row(const ByteRows& q, int64_t rows, const int8_t* kmax, const int8_t* kmin,
                                         const int8_t* exponent, int64_t D, int64_t eligible, float* scores) {
  const int64_t full = q.scored / 4 * 4, left = q.scored - full;
  const auto score_pair = [&]<int Rows>(int64_t g, int64_t m) {
    int32_t sums[4];
    integer_tile<Rows, 2>(q, g, kmax + m * D, kmin + m * D, D, sums);
    for (int64_t k = 0; k < Rows; ++k)
      for (int64_t b = 0; b < 2; ++b)
        scores[(g + k) * eligible + m + b] = row_score(q, g + k, sums[k * 2 + b]) * exponent_scale(exponent[m + b]);
  };
  int64_t m = 0;
  if (q.scored <= 2) {
    for (; m + 2 <= eligible; m += 2) {
      prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
      prefetch_bounds(kmax, kmin, m + 1 + kPrefetchBlocks, eligible, D);
      if (q.scored == 2) score_pair.template operator()<2>(0, m);
      if (q.scored == 1) score_pair.template operator()<1>(0, m);
      for (int64_t g = q.scored; g < rows; ++g)
        for (int64_t b = 0; b < 2; ++b) scores[g * eligible + m + b] = row_score(q, g, 0) * exponent_scale(exponent[m + b]);
    }
  }
  for (; m < eligible; ++m) {
    prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
    const float scale = exponent_scale(exponent[m]);
    for (int64_t g = 0; g < full; g += 4) per_row_scores<4>(q, g, kmax, kmin, m, D, scale, eligible, scores);
    switch (left) {
      case 3: per_row_scores<3>(q, full, kmax, kmin, m, D, scale, eligible, scores); break;
      case 2: per_row_scores<2>(q, full, kmax, kmin, m, D, scale, eligible, scores); break;
      case 1: per_row_scores<1>(q, full, kmax, kmin, m, D, scale, eligible, scores); break;
      default: break;
    }
    for (int64_t g = q.scored; g < rows; ++g) scores[g * eligible + m] = row_score(q, g, 0) * scale;
  }
}
