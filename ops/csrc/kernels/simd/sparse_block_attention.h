// SparseBlockAttention over 16-lane vectors: the cache write, then per query its selected blocks
// (or, when it attends exactly, the exact walk of exact_attention.h), one online-softmax step per
// block in the scalar kernel's operation order (logits, max, rescale, weights, values).
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "../sparse_block_attention.h"
#include "attention_tiles.h"
#include "canonical.h"
#include "exact_attention.h"

namespace quest::QUEST_ISA {

template <typename T, typename TC>
void write_cache_items(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, C = prm.capacity;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const T* key = static_cast<const T*>(prm.key) + item * S * D;
    const T* value = static_cast<const T*>(prm.value) + item * S * D;
    TC* key_cache = static_cast<TC*>(prm.key_cache) + item * C * D;
    TC* value_cache = static_cast<TC*>(prm.value_cache) + item * C * D;
    for (int64_t p = past; p < total; ++p) {
      if constexpr (std::is_same_v<TC, int8_t>) {  // the scalar row format (int8_rows.h), bit for bit
        prm.key_scale[item * C + p] = quantize_row(key + (p - past) * D, D, key_cache + p * D);
        prm.value_scale[item * C + p] = quantize_row(value + (p - past) * D, D, value_cache + p * D);
      } else {
        for (int64_t d = 0; d < D; d += kChunk) {
          store_row(load_row(key + (p - past) * D, d, D), key_cache + p * D, d, D);
          store_row(load_row(value + (p - past) * D, d, D), value_cache + p * D, d, D);
        }
      }
    }
  }
}

struct AttentionScratch {
  std::vector<float> queries, accumulators, logits, max_logit, denominator;
  std::vector<int32_t> blocks;
  std::vector<std::vector<BlockMass>> masses;
  // Per-head lists walked as one (attend_union): each head's blocks and its place in them.
  std::vector<int32_t> head_blocks;
  std::vector<int64_t> head_counts, head_next;
  ExactScratch exact;

  void fit(int64_t G, int64_t Dp, int64_t Pp) {
    queries.resize(G * Dp);
    accumulators.resize(G * Dp);
    max_logit.resize(G);
    denominator.resize(G);
    if (static_cast<int64_t>(masses.size()) < G) masses.resize(G);  // the lists only grow, keeping storage
    logits.resize(G * Pp);
  }
  QueryState state() { return {queries.data(), accumulators.data(), max_logit.data(), denominator.data(), masses.data()}; }
};

// Loads the query's G rows (zero-padded) and clears its softmax state.
template <typename T>
void begin_query(const T* query, int64_t S, int64_t D, int64_t G, int64_t Dp, const QueryState& q) {
  for (int64_t g = 0; g < G; ++g) load_padded(query + g * S * D, D, q.queries + g * Dp);
  std::fill(q.accumulators, q.accumulators + G * Dp, 0.0f);
  std::fill(q.max_logit, q.max_logit + G, -std::numeric_limits<float>::infinity());
  std::fill(q.denominator, q.denominator + G, kNothingAttended);
  for (int64_t g = 0; g < G; ++g) q.masses[g].clear();
}

// One block of one query for `G` heads, in the scalar kernel's order: logits, then per head the
// softmax step (and the block's mass), then the weighted values (with int8 caches each weight times
// its value row's scale).
template <typename TC>
void attend_block(const SparseBlockAttentionParams& prm, const RowStream<TC>& rows, int32_t block, bool importance,
                  int64_t G, int64_t Dp, int64_t Pp, AttentionScratch& s, const QueryState& q) {
  step_logits(q.queries, G, Dp, rows, Pp, prm, s.logits.data());
  for (int64_t g = 0; g < G; ++g) {
    float* weights = s.logits.data() + g * Pp;
    softmax_step(weights, rows.count, q.max_logit[g], q.denominator[g], q.accumulators + g * Dp, Dp);
    if (importance)
      record_masses(weights, static_cast<int64_t>(block) * prm.block_size, rows.count, prm.block_size,
                    q.max_logit[g], q.masses[g]);
  }
  if (rows.value_scales != nullptr) times_row_scales(s.logits.data(), G, rows.count, Pp, rows.value_scales);
  step_values(rows, Dp, G, nullptr, s.logits.data(), Pp, q.accumulators);
}

// The blocks a query at p attends from one row of block_indices, in the row's order: unselected
// (-1) blocks and blocks after the query attend nothing; dropping them lets the prefetch stream see
// the real next block.
inline void attended_blocks(const int32_t* row, int64_t K, int64_t P, int64_t p, int32_t* out, int64_t& count) {
  count = 0;
  for (int64_t j = 0; j < K; ++j)
    if (row[j] >= 0 && row[j] * P <= p) out[count++] = row[j];
}

// The rows of `block` a query at p attends (up to p), keys then values (and their scales).
template <typename TC>
RowStream<TC> block_rows(const ItemCaches<TC>& cache, int64_t block, int64_t P, int64_t p, int64_t D) {
  const int64_t first = block * P;
  RowStream<TC> rows{cache.keys + first * D, cache.values + first * D, nullptr, std::min(first + P, p + 1) - first, 0, D};
  if (cache.key_scales != nullptr) {
    rows.key_scales = cache.key_scales + first;
    rows.value_scales = cache.value_scales + first;
  }
  return rows;
}

// Asks for every row of a query's blocks (keys, values, an int8 block's scales) before any
// arithmetic, when they add up to at most kUpfrontPrefetchBytes: the blocks lie anywhere in the
// cache, and a block of P rows is too little arithmetic to hide the next one's latency behind, so
// the walk's own one-block-ahead stream alone left the memory idle. Both are needed. Measured (32K,
// 16/8/128, one thread, cold, libraries alternating): the union walk 1.22x faster over int8 caches
// (a union of about 90 KB), 1.10x over float16 (180 KB), 0.92x over float32 (360 KB: past the budget,
// which keeps the stream alone), 2x slower with this replacing the stream. Forced inline: GCC 12
// left an out-of-line instance's prefetches out of the library altogether.
inline constexpr int64_t kUpfrontPrefetchBytes = 256 * 1024;

template <typename TC>
QUEST_INLINE void prefetch_blocks(const ItemCaches<TC>& cache, const int32_t* blocks, int64_t count, int64_t P,
                                  int64_t p, int64_t D) {
  if (count * 2 * P * D * static_cast<int64_t>(sizeof(TC)) > kUpfrontPrefetchBytes) return;
  for (int64_t j = 0; j < count; ++j) {
    const RowStream<TC> rows = block_rows(cache, blocks[j], P, p, D);
    SpreadPrefetch(rows.keys, rows.count * rows.row_bytes(), 1).tick();  // one tick: every line now
    SpreadPrefetch(rows.values, rows.count * rows.row_bytes(), 1).tick();
    if (rows.key_scales != nullptr) {
      __builtin_prefetch(rows.key_scales, 0, 2);
      __builtin_prefetch(rows.value_scales, 0, 2);
    }
  }
}

// The rows of blocks[j] a query at p attends, prefetching on into blocks[j + 1] (if any).
template <typename TC>
RowStream<TC> listed_block_rows(const ItemCaches<TC>& cache, const int32_t* blocks, int64_t count, int64_t j, int64_t P,
                                int64_t p, int64_t D) {
  RowStream<TC> rows = block_rows(cache, blocks[j], P, p, D);
  if (j + 1 < count) {
    const RowStream<TC> next = block_rows(cache, blocks[j + 1], P, p, D);
    rows.next_keys = next.keys;
    rows.next_count = next.count;
    if (next.key_scales != nullptr) {  // an int8 block's scales: a line each, asked for a block ahead
      __builtin_prefetch(next.key_scales, 0, 2);
      __builtin_prefetch(next.value_scales, 0, 2);
    }
  }
  return rows;
}

// One query's G per-head lists (block_indices rows `lists`, `stride` apart), when each is strictly
// ascending, walked as one:
//
//   union of the lists, ascending:  b0      b1      b2 ...
//   head 0 (list 0 has b0, b2)      attend  -       attend
//   head 1 (list 1 has b0, b1)      attend  attend  -
//
// Each block is read from memory once and attended by every head that chose it (the later heads
// from cache). Every head sees its own blocks in its own order, so outputs and importance are bit
// for bit those of the walk list by list; a list out of order (or with a repeat) would not be, and
// returns false with nothing done.
template <typename T, typename TC>
bool attend_union(const SparseBlockAttentionParams& prm, const int32_t* lists, int64_t stride, int64_t p,
                  const ItemCaches<TC>& cache, int64_t G, int64_t Dp, int64_t Pp, AttentionScratch& s,
                  const QueryState& state, T* out, float* importance) {
  const int64_t K = prm.top_k, P = prm.block_size, D = prm.head_dim;
  s.head_blocks.resize(G * K);
  s.head_counts.resize(G);
  s.head_next.assign(G, 0);
  s.blocks.clear();
  for (int64_t g = 0; g < G; ++g) {
    int32_t* mine = s.head_blocks.data() + g * K;
    attended_blocks(lists + g * stride, K, P, p, mine, s.head_counts[g]);
    for (int64_t j = 1; j < s.head_counts[g]; ++j)
      if (mine[j] <= mine[j - 1]) return false;
    s.blocks.insert(s.blocks.end(), mine, mine + s.head_counts[g]);
  }
  std::sort(s.blocks.begin(), s.blocks.end());
  s.blocks.erase(std::unique(s.blocks.begin(), s.blocks.end()), s.blocks.end());
  const int64_t distinct = static_cast<int64_t>(s.blocks.size());
  prefetch_blocks(cache, s.blocks.data(), distinct, P, p, D);
  for (int64_t j = 0; j < distinct; ++j) {
    const int32_t block = s.blocks[j];
    RowStream<TC> rows = listed_block_rows(cache, s.blocks.data(), distinct, j, P, p, D);
    const auto chose = [&](int64_t g) {
      const int64_t next = s.head_next[g];
      return next < s.head_counts[g] && s.head_blocks[g * K + next] == block;
    };
    // Runs of consecutive heads that chose the block attend it together (their key and value rows
    // loaded once per tile); the first run reads it from memory and streams ahead, the rest hit cache.
    for (int64_t g0 = 0; g0 < G;) {
      if (!chose(g0)) {
        ++g0;
        continue;
      }
      int64_t g1 = g0 + 1;
      while (g1 < G && chose(g1)) ++g1;
      attend_block(prm, rows, block, importance != nullptr, g1 - g0, Dp, Pp, s, state.heads(g0, Dp));
      rows.prefetching = false;
      for (int64_t g = g0; g < g1; ++g) ++s.head_next[g];
      g0 = g1;
    }
  }
  finish_query(state, G, D, Dp, out, importance);
  return true;
}

// One query's selected blocks: each list attended by `width` heads (all G sharing one list, or
// each head its own), the per-head lists walked as one when they are ascending.
template <typename T, typename TC>
void attend_selected(const SparseBlockAttentionParams& prm, int64_t item, int64_t i, const ItemCaches<TC>& cache,
                     AttentionScratch& s, T* out, float* importance) {
  const int64_t S = prm.query_len, D = prm.head_dim, P = prm.block_size, K = prm.top_k, Dp = padded(D);
  const int64_t b = item / prm.kv_heads, G = prm.num_heads / prm.kv_heads, width = heads_per_block_list(prm);
  const int64_t Pp = padded(rows_per_block(prm)), p = prm.past_lens[b] + i;
  const QueryState state = s.state();
  const int32_t* lists = prm.block_indices + (item * (G / width) * S + i) * K;  // list l at l * S * K
  if (width == 1 && G > 1 &&
      attend_union(prm, lists, S * K, p, cache, G, Dp, Pp, s, state, out, importance))
    return;
  s.blocks.resize(K);
  for (int64_t g0 = 0; g0 < G; g0 += width) {
    const QueryState heads = state.heads(g0, Dp);
    int64_t count = 0;
    attended_blocks(lists + (g0 / width) * S * K, K, P, p, s.blocks.data(), count);
    for (int64_t j = 0; j < count; ++j) {
      const RowStream<TC> rows = listed_block_rows(cache, s.blocks.data(), count, j, P, p, D);
      attend_block(prm, rows, s.blocks[j], importance != nullptr, width, Dp, Pp, s, heads);
    }
  }
  finish_query(state, G, D, Dp, out, importance);
}

// Work units [begin, end) (attention_unit: an item's queries [first, last)): every valid query
// attends, the exact ones (a prefix of the call) in query tiles over every position, then the chunk
// queries in query tiles over their chunk's blocks, the rest query by query over their blocks.
// With the calling thread's scratch `s`, not inlined for the reason select_items_with gives.
template <typename T, typename TC>
[[gnu::noinline]] void attention_items_with(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end,
                                            AttentionScratch& s) {
  const int64_t S = prm.query_len, D = prm.head_dim, H = prm.num_heads;
  const int64_t G = H / prm.kv_heads, Dp = padded(D), Pp = padded(rows_per_block(prm));
  s.fit(G, Dp, Pp);
  for (int64_t unit = begin; unit < end; ++unit) {
    const AttentionUnit u = attention_unit(prm, unit);
    const int64_t b = u.item / prm.kv_heads, n = u.item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const int64_t valid = std::clamp<int64_t>(total - past, 0, S), exact = std::min(exact_queries(prm, b), valid);
    const ItemCaches<TC> cache = item_caches<TC>(prm, u.item);
    float* importance = prm.block_importance != nullptr ? prm.block_importance + u.item * prm.num_blocks : nullptr;
    if (importance != nullptr && u.first == 0) std::fill(importance, importance + prm.num_blocks, 0.0f);
    const T* query = static_cast<const T*>(prm.query) + (b * H + n * G) * S * D;
    auto output = [&](int64_t i) { return static_cast<T*>(prm.output) + (b * S + i) * H * D + n * G * D; };
    for (int64_t i = std::max(valid, u.first); i < u.last; ++i) std::fill(output(i), output(i) + G * D, from_float<T>(0.0f));
    if (u.first < std::min(exact, u.last))
      attend_exact<T, TC>(prm, u.item, u.first, std::min(exact, u.last), cache, s.exact, importance);
    // Chunk queries, chunk by chunk: the exact walk over the positions of the chunk's blocks.
    const int64_t chunked = std::min(chunk_queries_end(prm, b), valid);
    const int64_t Q = prm.chunk_size;
    for (int64_t i = std::max(exact, u.first); i < std::min(chunked, u.last);) {
      const int64_t c = i / Q, end = std::min({c * Q + Q, chunked, u.last});
      s.exact.listed.resize(prm.num_blocks);
      mark_listed(chunk_list(prm, u.item, c), prm.chunk_top_k, prm.num_blocks, s.exact.listed.data());
      attend_exact<T, TC>(prm, u.item, i, end, cache, s.exact, importance, s.exact.listed.data());
      i = end;
    }
    for (int64_t i = std::max(chunked, u.first); i < std::min(valid, u.last); ++i) {
      begin_query(query + i * D, S, D, G, Dp, s.state());
      attend_selected<T, TC>(prm, u.item, i, cache, s, output(i), importance);
    }
  }
}

template <typename T, typename TC>
void attention_items(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  thread_local AttentionScratch scratch;
  attention_items_with<T, TC>(prm, begin, end, scratch);
}

}  // namespace quest::QUEST_ISA
