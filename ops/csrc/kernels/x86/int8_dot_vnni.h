// SparseBlockSelect's integer bounds of int8 codes with AVX-512 VNNI dot products (vpdpbusd).
//
// Included by simd/sparse_block_select.h, inside its namespace quest::QUEST_ISA, in a target region
// with avx512bw and avx512vnni (the avx512vnni variant, x86/avx512_vnni.cc, which includes
// <immintrin.h>), after the helpers it shares with the generic scoring. Integer sums have no
// order, so the scores are the scalar kernel's bits.
#pragma once

// Channels per dot-product step: one 64-byte vector of codes.
inline constexpr int64_t kByteChunk = 64;

// Quantized rows (quantize_rows) as the operands of vpdpbusd, which multiplies unsigned bytes by
// signed ones: per row, `plus` (u where q > 0, else 0; unsigned) and `minus` (-u where q < 0, else
// 0; signed), each Db bytes, zero past D. The min term takes the codes as the unsigned operand
// flipped by 128 (lo + 128 in 0 .. 255): (lo + 128) * (-u) = -u * lo - 128 u, so
// I = dot(plus, hi) + dot(lo + 128, minus) + bias with bias = 128 * (sum of u where q < 0), and both
// dot products go to the same accumulator: half the accumulators of separate sums, which lets a
// 4 rows x 4 blocks tile keep its sixteen in registers.
struct ByteRows {
  const int8_t* bytes;   // [rows][2][Db]: plus, then minus
  const int32_t* bias;   // [rows]
  const float* factor;   // [rows]: a / 127 (quantize_rows)
  int64_t heads, Db;     // heads: the rows that count (the others are padding of zeros)
};

// The byte rows of `rows` rows of r (r.heads of them quantized, the others rows of zeros).
inline ByteRows byte_rows(const BoundRows& r, int64_t rows, int64_t D, SelectScratch& s) {
  const int64_t Db = (D + kByteChunk - 1) / kByteChunk * kByteChunk;
  s.row_bytes.assign(rows * 2 * Db, 0);
  s.row_bias.assign(rows, 0);
  for (int64_t g = 0; g < r.heads; ++g) {
    int8_t* plus = s.row_bytes.data() + g * 2 * Db;
    int8_t* minus = plus + Db;
    for (int64_t d = 0; d < D; ++d) {
      const int32_t v = static_cast<int32_t>(r.rows[g * r.Dp + d]);  // a signed magnitude: -127 .. 127
      plus[d] = static_cast<int8_t>(v > 0 ? v : 0);
      minus[d] = static_cast<int8_t>(v < 0 ? v : 0);
      s.row_bias[g] += v < 0 ? -128 * v : 0;
    }
  }
  return {s.row_bytes.data(), s.row_bias.data(), r.factor, r.heads, Db};
}

// The sums of four accumulators' sixteen int32 lanes, as [a, b, c, d]: halves, then quarters of
// two accumulators per register, then within 128-bit lanes.
QUEST_INLINE __m128i lane_sums4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
  const __m512i cd = _mm512_add_epi32(_mm512_shuffle_i64x2(c, d, 0x44), _mm512_shuffle_i64x2(c, d, 0xEE));
  // ab: 128-bit lanes [a, a, b, b] (two partial quarters each), cd likewise: pair them up.
  const __m512i four = _mm512_add_epi32(_mm512_shuffle_i64x2(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i64x2(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i two = _mm512_add_epi32(four, _mm512_shuffle_epi32(four, _MM_PERM_BADC));
  const __m512i one = _mm512_add_epi32(two, _mm512_shuffle_epi32(two, _MM_PERM_CDAB));
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                           0, 0, 0), one));
}

// Integer bounds minus their bias of Rows rows (from row g) against Blocks consecutive blocks of
// codes hi / lo [D]: sums[k * Blocks + b]. Each chunk of codes is loaded once for every row, each
// chunk of a row once for every block; a tail chunk loads codes masked (zero past D, where the
// rows' bytes are zero too).
template <int Rows, int Blocks>
QUEST_INLINE void integer_tile(const ByteRows& q, int64_t g, const int8_t* hi, const int8_t* lo, int64_t D,
                               int32_t* sums) {
  __m512i acc[Rows * Blocks];
  unrolled<Rows * Blocks>([&](auto j) { acc[j] = _mm512_setzero_si512(); });
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(-128));
  const auto chunk = [&](int64_t d, __mmask64 live) QUEST_INLINE_LAMBDA {
    __m512i h[Blocks], l[Blocks];
    unrolled<Blocks>([&](auto b) {
      h[b] = _mm512_maskz_loadu_epi8(live, hi + b * D + d);
      l[b] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(live, lo + b * D + d), flip);
    });
    unrolled<Rows>([&](auto k) {
      const int8_t* row = q.bytes + (g + k) * 2 * q.Db + d;
      const __m512i plus = _mm512_loadu_si512(row), minus = _mm512_loadu_si512(row + q.Db);
      unrolled<Blocks>([&](auto b) {
        acc[k * Blocks + b] = _mm512_dpbusd_epi32(acc[k * Blocks + b], plus, h[b]);
        acc[k * Blocks + b] = _mm512_dpbusd_epi32(acc[k * Blocks + b], l[b], minus);
      });
    });
  };
  int64_t d = 0;
  for (; d + kByteChunk <= D; d += kByteChunk) chunk(d, ~__mmask64{0});
  if (d < D) chunk(d, (__mmask64{1} << (D - d)) - 1);
  if constexpr (Rows * Blocks == 1) {
    sums[0] = _mm512_reduce_add_epi32(acc[0]);
  } else {
    static_assert(Rows * Blocks % 4 == 0);
    unrolled<Rows * Blocks / 4>([&](auto j) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sums + 4 * j),
                       lane_sums4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    });
  }
}

// Row g's scores float(I) * (a / 127) of four blocks, from their biased sums.
QUEST_INLINE __m128 row_scores4(const ByteRows& q, int64_t g, const int32_t* sums) {
  const __m128i biased = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums));
  const __m128i exact = _mm_add_epi32(biased, _mm_set1_epi32(q.bias[g]));
  return _mm_mul_ps(_mm_cvtepi32_ps(exact), _mm_set1_ps(q.factor[g]));
}

QUEST_INLINE __m128 block_scales4(const int8_t* exponent) {
  return _mm_setr_ps(exponent_scale(exponent[0]), exponent_scale(exponent[1]), exponent_scale(exponent[2]),
                     exponent_scale(exponent[3]));
}

// score_blocks for int8 bounds: the rows' scores (I * factor) max-reduced in row order (maxps is
// `a > b ? a : b`), times each block's 2^e; four blocks at a time, offered to the selection as the
// generic scan offers them.
inline void integer_score_blocks(const ByteRows& q, const int8_t* kmax, const int8_t* kmin, const int8_t* exponent,
                                 int64_t D, int64_t eligible, float* scores, SelectScratch& selection) {
  int64_t m = 0;
  for (; m + 4 <= eligible; m += 4) {
    for (int64_t ahead = m + kPrefetchBlocks; ahead < m + kPrefetchBlocks + 4; ++ahead)
      prefetch_bounds(kmax, kmin, ahead, eligible, D);
    __m128 score = _mm_setzero_ps();
    alignas(16) int32_t sums[16];
    if (q.heads == 1) {
      integer_tile<1, 4>(q, 0, kmax + m * D, kmin + m * D, D, sums);
      score = row_scores4(q, 0, sums);
    } else {
      for (int64_t g = 0; g < q.heads; g += 4) {
        integer_tile<4, 4>(q, g, kmax + m * D, kmin + m * D, D, sums);
        for (int64_t k = 0; k < 4 && g + k < q.heads; ++k) {
          const __m128 row = row_scores4(q, g + k, sums + 4 * k);
          score = g + k == 0 ? row : _mm_max_ps(row, score);
        }
      }
    }
    _mm_storeu_ps(scores + m, _mm_mul_ps(score, block_scales4(exponent + m)));
    static_assert(kOfferBatch == 4);
    selection.offer_until(scores, m + 4);
  }
  for (; m < eligible; ++m) {
    prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
    float score = 0.0f;
    for (int64_t g = 0; g < q.heads; ++g) {
      int32_t sum = 0;
      integer_tile<1, 1>(q, g, kmax + m * D, kmin + m * D, D, &sum);
      const float row = static_cast<float>(sum + q.bias[g]) * q.factor[g];
      score = g == 0 ? row : max_select(row, score);
    }
    scores[m] = score * exponent_scale(exponent[m]);
  }
}

// score_blocks_per_row for int8 bounds: every row (a multiple of four) against four blocks per
// tile, scores[g * eligible + m] = (I * factor) * 2^e.
inline void integer_score_blocks_per_row(const ByteRows& q, int64_t rows, const int8_t* kmax, const int8_t* kmin,
                                         const int8_t* exponent, int64_t D, int64_t eligible, float* scores) {
  int64_t m = 0;
  alignas(16) int32_t sums[16];
  for (; m + 4 <= eligible; m += 4) {
    for (int64_t ahead = m + kPrefetchBlocks; ahead < m + kPrefetchBlocks + 4; ++ahead)
      prefetch_bounds(kmax, kmin, ahead, eligible, D);
    const __m128 scale = block_scales4(exponent + m);
    for (int64_t g = 0; g < rows; g += 4) {
      // A last tile of at most two rows that count (groups of 2, 6, ...) skips its rows of zeros:
      // their scores are never read.
      const int64_t live = q.heads - g <= 2 ? 2 : 4;
      if (live == 2)
        integer_tile<2, 4>(q, g, kmax + m * D, kmin + m * D, D, sums);
      else
        integer_tile<4, 4>(q, g, kmax + m * D, kmin + m * D, D, sums);
      for (int64_t k = 0; k < live; ++k)
        _mm_storeu_ps(scores + (g + k) * eligible + m, _mm_mul_ps(row_scores4(q, g + k, sums + 4 * k), scale));
    }
  }
  for (; m < eligible; ++m) {
    prefetch_bounds(kmax, kmin, m + kPrefetchBlocks, eligible, D);
    const float scale = exponent_scale(exponent[m]);
    for (int64_t g = 0; g < rows; g += 4) {
      integer_tile<4, 1>(q, g, kmax + m * D, kmin + m * D, D, sums);
      for (int64_t k = 0; k < 4; ++k)
        scores[(g + k) * eligible + m] = (static_cast<float>(sums[k] + q.bias[g + k]) * q.factor[g + k]) * scale;
    }
  }
}
