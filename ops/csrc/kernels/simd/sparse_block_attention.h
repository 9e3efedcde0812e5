// SparseBlockAttention over 16-lane vectors: cache write and block-wise online softmax, with the
// scalar kernel's exact operation order (per block: logits, block max, rescale, weights, values).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "../sparse_block_attention.h"
#include "canonical.h"

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
      for (int64_t d = 0; d < D; d += kChunk) {
        store_row(load_row(key + (p - past) * D, d, D), key_cache + p * D, d, D);
        store_row(load_row(value + (p - past) * D, d, D), value_cache + p * D, d, D);
      }
    }
  }
}

// Prefetches of a contiguous byte range (the rows of the next phase) spread evenly over `ticks`
// calls of tick(), one per step of the phase's arithmetic: requests go out at an even pace while
// the arithmetic runs, and the memory never idles. Bursts of whole rows, or passes that asked for
// nothing, left it idle (10-30% slower than this, measured).
struct SpreadPrefetch {
  const char* next;
  const char* end;
  int64_t lines_per_tick;

  SpreadPrefetch(const void* begin, int64_t bytes, int64_t ticks)
      : next(static_cast<const char*>(begin)), end(begin == nullptr ? nullptr : next + bytes),
        lines_per_tick(((bytes + 63) / 64 + ticks - 1) / std::max<int64_t>(1, ticks)) {}

  QUEST_INLINE void tick() {
    for (int64_t i = 0; i < lines_per_tick && next < end; ++i, next += 64) __builtin_prefetch(next, 0, 2);
  }
};

// logits[h * Pp + t] = dot(query row h, key row t) for `Heads` (1 to 4) query rows and `Rows`
// consecutive key rows: Heads x Rows independent canonical sums in registers, each key chunk
// loaded once for all the heads.
template <int Heads, int Rows, typename TC>
QUEST_INLINE void logits_tile(const float* q, int64_t Dp, const TC* keys, int64_t D, float* logits, int64_t Pp,
                              SpreadPrefetch* ahead) {
  static_assert(Heads >= 1 && Heads <= 4, "one to four query rows per tile");
  Lanes acc[Heads * Rows];
  unrolled<Heads * Rows>([&](auto j) { acc[j] = Lanes::zero(); });
  for (int64_t d = 0; d < D; d += kChunk) {
    if (ahead != nullptr) ahead->tick();
    Lanes x[Heads];
    unrolled<Heads>([&](auto h) { x[h] = Lanes::load(q + h * Dp + d); });
    unrolled<Rows>([&](auto r) {
      const Lanes k = load_row(keys + r * D, d, D);
      unrolled<Heads>([&](auto h) { acc[h * Rows + r] = acc[h * Rows + r] + x[h] * k; });
    });
  }
  unrolled<Rows>([&](auto r) {
    if constexpr (Heads == 4) {
      float folded[4];
      Lanes::fold4(acc[r], acc[Rows + r], acc[2 * Rows + r], acc[3 * Rows + r], folded);
      for (int h = 0; h < 4; ++h) logits[h * Pp + r] = folded[h];
    } else {
      unrolled<Heads>([&](auto h) { logits[h * Pp + r] = acc[h * Rows + r].fold(); });
    }
  });
}

// The rows of a block a query attends (its keys, then its values) and the next block's keys. The
// block's key pass prefetches its values, its value passes the next block's keys.
template <typename TC>
struct RowStream {
  const TC* keys;
  const TC* values;
  const TC* next_keys;  // null after the last block
  int64_t count, next_count, D;
  bool prefetching = true;  // off when the rows are already in cache (a query tile's later queries)

  int64_t row_bytes() const { return D * static_cast<int64_t>(sizeof(TC)); }
};

// Logits of `Heads` query rows (from g) against every key row of the block, each step of the
// arithmetic prefetching its share of the value rows.
template <int Heads, typename TC>
QUEST_INLINE void head_logits(const float* queries, int64_t g, int64_t Dp, const RowStream<TC>& rows, int64_t Pp,
                              float* logits, SpreadPrefetch& values) {
  constexpr int kRows = Lanes::kTileRows;
  const TC* keys = rows.keys;
  const int64_t count = rows.count, D = rows.D;
  int64_t t = 0;
  for (; t + kRows <= count; t += kRows)
    logits_tile<Heads, kRows>(queries + g * Dp, Dp, keys + t * D, D, logits + g * Pp + t, Pp, &values);
  for (; t < count; ++t) logits_tile<Heads, 1>(queries + g * Dp, Dp, keys + t * D, D, logits + g * Pp + t, Pp, &values);
}

// Steps head_logits makes for one group of heads (tiles of key rows x 16-lane chunks, one tick
// each): what the group's share of the prefetches is spread over.
inline int64_t key_pass_steps(int64_t count, int64_t D) {
  constexpr int kRows = Lanes::kTileRows;
  return (count / kRows + count % kRows) * ((D + kChunk - 1) / kChunk);
}

// Scaled (and soft-capped) logits [G][count] of the G query rows against key rows [0, count):
// four heads at a time, then the one to three left.
template <typename TC>
void block_logits(const float* queries, int64_t G, int64_t Dp, const RowStream<TC>& rows, int64_t Pp,
                  const SparseBlockAttentionParams& prm, float* logits) {
  const int64_t count = rows.count;
  const int64_t steps = (G + 3) / 4 * key_pass_steps(count, rows.D);
  SpreadPrefetch values(rows.prefetching ? rows.values : nullptr, count * rows.row_bytes(), steps);
  int64_t g = 0;
  for (; g + 4 <= G; g += 4) head_logits<4>(queries, g, Dp, rows, Pp, logits, values);
  switch (G - g) {
    case 3: head_logits<3>(queries, g, Dp, rows, Pp, logits, values); break;
    case 2: head_logits<2>(queries, g, Dp, rows, Pp, logits, values); break;
    case 1: head_logits<1>(queries, g, Dp, rows, Pp, logits, values); break;
    default: break;
  }
  // The scale on whole vectors (the lanes past count hold scratch, overwritten before any use).
  const Lanes scale = Lanes::broadcast(prm.scale);
  for (g = 0; g < G; ++g)
    for (int64_t t = 0; t < count; t += kChunk) (Lanes::load(logits + g * Pp + t) * scale).store(logits + g * Pp + t);
  if (prm.softcap > 0.0f)
    for (g = 0; g < G; ++g)
      for (int64_t t = 0; t < count; ++t)
        logits[g * Pp + t] = prm.softcap * canonical_tanh(logits[g * Pp + t] / prm.softcap);
}

// accumulators[h] += weights[h * Pp + t] * value row t, for t = 0 .. count-1 in order, for `Heads`
// heads and `Chunks` 16-lane chunks from d: the accumulators stay in registers across the rows.
// `Partial`: the chunks may run past D (zeros there); otherwise they are loaded unchecked.
template <int Heads, int Chunks, bool Partial, typename TC>
QUEST_INLINE void value_tile(const TC* values, int64_t count, int64_t D, int64_t d, const float* weights, int64_t Pp,
                             float* accumulators, int64_t Dp, SpreadPrefetch& ahead) {
  Lanes acc[Heads * Chunks];
  unrolled<Heads>([&](auto h) {
    unrolled<Chunks>([&](auto c) { acc[h * Chunks + c] = Lanes::load(accumulators + h * Dp + d + c * kChunk); });
  });
  for (int64_t t = 0; t < count; ++t) {
    ahead.tick();
    const TC* v = values + t * D;
    Lanes w[Heads];
    unrolled<Heads>([&](auto h) { w[h] = Lanes::broadcast(weights[h * Pp + t]); });
    unrolled<Chunks>([&](auto c) {
      const Lanes x = Partial ? load_row(v, d + c * kChunk, D) : Lanes::load(v + d + c * kChunk);
      unrolled<Heads>([&](auto h) { acc[h * Chunks + c] = acc[h * Chunks + c] + w[h] * x; });
    });
  }
  unrolled<Heads>([&](auto h) {
    unrolled<Chunks>([&](auto c) { acc[h * Chunks + c].store(accumulators + h * Dp + d + c * kChunk); });
  });
}

// Passes head_values makes over the value rows (one per group of chunks, a tick per row each):
// what a group of heads' share of the prefetches is spread over.
inline int64_t value_passes(int64_t Dp) {
  const int64_t group = Lanes::kValueChunks * kChunk;
  return Dp / group + (Dp % group) / kChunk;
}

// Adds the weighted value rows to the accumulators of `Heads` heads, chunk group by chunk group.
template <int Heads, typename TC>
QUEST_INLINE void head_values(const TC* values, int64_t count, int64_t D, int64_t Dp, const float* weights,
                              int64_t Pp, float* accumulators, SpreadPrefetch& ahead) {
  constexpr int kChunks = Lanes::kValueChunks;
  int64_t d = 0;
  for (; d + kChunks * kChunk <= D; d += kChunks * kChunk)
    value_tile<Heads, kChunks, false>(values, count, D, d, weights, Pp, accumulators, Dp, ahead);
  for (; d + kChunks * kChunk <= Dp; d += kChunks * kChunk)
    value_tile<Heads, kChunks, true>(values, count, D, d, weights, Pp, accumulators, Dp, ahead);
  for (; d < Dp; d += kChunk)
    value_tile<Heads, 1, true>(values, count, D, d, weights, Pp, accumulators, Dp, ahead);
}

// Adds the block's weighted value rows to the G accumulators, in row order: four heads at a
// time, then the one to three left; every pass over the rows prefetches its share of the next keys.
template <typename TC>
void block_values(const RowStream<TC>& rows, int64_t Dp, int64_t G, const float* weights, int64_t Pp,
                  float* accumulators) {
  const TC* values = rows.values;
  const int64_t count = rows.count, D = rows.D;
  const int64_t value_rows = (G + 3) / 4 * value_passes(Dp) * count;
  SpreadPrefetch ahead(rows.prefetching ? rows.next_keys : nullptr, rows.next_count * rows.row_bytes(), value_rows);
  int64_t g = 0;
  for (; g + 4 <= G; g += 4)
    head_values<4>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, ahead);
  switch (G - g) {
    case 3: head_values<3>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, ahead); break;
    case 2: head_values<2>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, ahead); break;
    case 1: head_values<1>(values, count, D, Dp, weights + g * Pp, Pp, accumulators + g * Dp, ahead); break;
    default: break;
  }
}

struct BlockMass {
  int32_t block;
  float max_logit;
  float weight_sum;
};

// One query's online-softmax state: its G query rows and, per head, the accumulator, the running
// max and denominator, and each attended block's mass (for block_importance): in one list, the
// heads' masses in turn block by block, or (masses_per_head) a list per head.
struct QueryState {
  float* queries;       // [G][Dp]
  float* accumulators;  // [G][Dp]
  float* max_logit;     // [G]
  float* denominator;   // [G]
  std::vector<BlockMass>* masses;
  bool masses_per_head = false;

  // The state of the heads from g on.
  QueryState heads(int64_t g, int64_t Dp) const {
    return {queries + g * Dp, accumulators + g * Dp, max_logit + g, denominator + g,
            masses_per_head ? masses + g : masses, masses_per_head};
  }
  std::vector<BlockMass>& masses_of(int64_t g) const { return masses_per_head ? masses[g] : *masses; }
};

struct AttentionScratch {
  std::vector<float> queries, accumulators, logits, weights, max_logit, denominator;
  std::vector<int32_t> blocks;
  std::vector<std::vector<BlockMass>> masses;
  // Per-head lists walked as one (attend_union): each head's blocks, their union, each head's masses.
  std::vector<int32_t> head_blocks;
  std::vector<int64_t> head_counts, head_next;
  std::vector<std::vector<BlockMass>> head_masses;

  // Sizes the buffers for `slots` queries (the per-query mass lists only grow, keeping their storage).
  void fit(int64_t slots, int64_t G, int64_t Dp, int64_t Pp) {
    queries.resize(slots * G * Dp);
    accumulators.resize(slots * G * Dp);
    max_logit.resize(slots * G);
    denominator.resize(slots * G);
    if (static_cast<int64_t>(masses.size()) < slots) masses.resize(slots);
    logits.resize(G * Pp);
    weights.resize(G * Pp);
  }
  QueryState slot(int64_t i, int64_t G, int64_t Dp) {
    return {queries.data() + i * G * Dp, accumulators.data() + i * G * Dp, max_logit.data() + i * G,
            denominator.data() + i * G, &masses[i]};
  }
};

// Loads query i's G rows (zero-padded) and clears its softmax state.
template <typename T>
void begin_query(const T* query, int64_t S, int64_t D, int64_t G, int64_t Dp, const QueryState& q) {
  for (int64_t g = 0; g < G; ++g) load_padded(query + g * S * D, D, q.queries + g * Dp);
  std::fill(q.accumulators, q.accumulators + G * Dp, 0.0f);
  std::fill(q.max_logit, q.max_logit + G, -std::numeric_limits<float>::infinity());
  std::fill(q.denominator, q.denominator + G, 0.0f);
  q.masses->clear();
}

// One block of one query, in the scalar kernel's order: logits, then per head the block max,
// rescale and weights, then the weighted values.
template <typename TC>
void attend_block(const SparseBlockAttentionParams& prm, const RowStream<TC>& rows, int32_t block, bool importance,
                  int64_t G, int64_t Dp, int64_t Pp, AttentionScratch& s, const QueryState& q) {
  const int64_t count = rows.count;
  // Logits: key rows tiled against up to four heads at a time (independent sums, canonical order each).
  block_logits(q.queries, G, Dp, rows, Pp, prm, s.logits.data());
  for (int64_t g = 0; g < G; ++g) {
    float* logits = s.logits.data() + g * Pp;
    float* acc = q.accumulators + g * Dp;
    // -inf past the block's rows: they add nothing to the max and weigh exp(-inf) = 0.
    std::fill(logits + count, logits + padded(count), -std::numeric_limits<float>::infinity());
    Lanes lane_max = Lanes::broadcast(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < count; t += kChunk) lane_max = Lanes::max_select(Lanes::load(logits + t), lane_max);
    const float new_max = max_select(lane_max.fold_max(), q.max_logit[g]);
    const float rescale = canonical_exp(q.max_logit[g] - new_max);
    q.denominator[g] = q.denominator[g] * rescale;
    const Lanes scale_lanes = Lanes::broadcast(rescale);
    for (int64_t d = 0; d < Dp; d += kChunk) (Lanes::load(acc + d) * scale_lanes).store(acc + d);
    const Lanes shift = Lanes::broadcast(new_max);
    float* weights = s.weights.data() + g * Pp;
    Lanes lane_sum = Lanes::zero();
    for (int64_t t = 0; t < count; t += kChunk) {
      const Lanes w = exp_lanes(Lanes::load(logits + t) - shift);
      w.store(weights + t);
      lane_sum = lane_sum + w;
    }
    const float weight_sum = lane_sum.fold();
    q.denominator[g] = q.denominator[g] + weight_sum;
    q.max_logit[g] = new_max;
    if (importance) q.masses_of(g).push_back(BlockMass{block, new_max, weight_sum});
  }
  // Values: added, weighted, to the G accumulators in t order.
  block_values(rows, Dp, G, s.weights.data(), Pp, q.accumulators);
}

// Writes the query's normalised output and adds its blocks' attention mass to `importance`.
template <typename T>
void finish_query(const QueryState& q, int64_t G, int64_t D, int64_t Dp, T* out, float* importance) {
  for (int64_t g = 0; g < G; ++g) {
    const float* acc = q.accumulators + g * Dp;
    const float denominator = q.denominator[g];
    const Lanes denominators = Lanes::broadcast(denominator);
    for (int64_t d = 0; d < D; d += kChunk) {
      const Lanes result = denominator > 0.0f ? Lanes::load(acc + d) / denominators : Lanes::zero();
      store_row(result, out + g * D, d, D);
    }
  }
  const auto add_mass = [&](const BlockMass& mass, int64_t g) {
    importance[mass.block] += mass.weight_sum * canonical_exp(mass.max_logit - q.max_logit[g]) / q.denominator[g];
  };
  if (q.masses_per_head) {
    for (int64_t g = 0; g < G; ++g)
      for (const BlockMass& mass : q.masses[g]) add_mass(mass, g);
    return;
  }
  for (size_t j = 0; j < q.masses->size(); ++j) add_mass((*q.masses)[j], static_cast<int64_t>(j) % G);
}

// The blocks a query at p attends from one row of block_indices, in the row's order: unselected
// (-1) blocks and blocks after the query attend nothing; dropping them lets the prefetch stream see
// the real next block.
inline void attended_blocks(const int32_t* row, int64_t K, int64_t P, int64_t p, int32_t* out, int64_t& count) {
  count = 0;
  for (int64_t j = 0; j < K; ++j)
    if (row[j] >= 0 && row[j] * P <= p) out[count++] = row[j];
}

// The rows of `block` a query at p attends (up to p), keys then values.
template <typename TC>
RowStream<TC> block_rows(const TC* key_cache, const TC* value_cache, int64_t block, int64_t P, int64_t p, int64_t D) {
  const int64_t first = block * P;
  return {key_cache + first * D, value_cache + first * D, nullptr, std::min(first + P, p + 1) - first, 0, D};
}

// The rows of blocks[j] a query at p attends, prefetching on into blocks[j + 1] (if any).
template <typename TC>
RowStream<TC> listed_block_rows(const TC* key_cache, const TC* value_cache, const int32_t* blocks, int64_t count,
                                int64_t j, int64_t P, int64_t p, int64_t D) {
  RowStream<TC> rows = block_rows(key_cache, value_cache, blocks[j], P, p, D);
  if (j + 1 < count) {
    const RowStream<TC> next = block_rows(key_cache, value_cache, blocks[j + 1], P, p, D);
    rows.next_keys = next.keys;
    rows.next_count = next.count;
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
                  const TC* key_cache, const TC* value_cache, int64_t G, int64_t Dp, int64_t Pp, AttentionScratch& s,
                  const QueryState& query_state, T* out, float* importance) {
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
  if (static_cast<int64_t>(s.head_masses.size()) < G) s.head_masses.resize(G);
  for (int64_t g = 0; g < G; ++g) s.head_masses[g].clear();
  QueryState state = query_state;
  state.masses = s.head_masses.data();
  state.masses_per_head = true;
  const int64_t distinct = static_cast<int64_t>(s.blocks.size());
  for (int64_t j = 0; j < distinct; ++j) {
    const int32_t block = s.blocks[j];
    RowStream<TC> rows = listed_block_rows(key_cache, value_cache, s.blocks.data(), distinct, j, P, p, D);
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

// Queries that share one pass over the blocks in dense causal prefill: each block is read from
// memory once for the tile instead of once per query.
inline constexpr int64_t kQueryTile = 16;

template <typename T, typename TC>
void attention_items(const SparseBlockAttentionParams& prm, int64_t begin, int64_t end) {
  const int64_t S = prm.query_len, D = prm.head_dim, C = prm.capacity, P = prm.block_size;
  const int64_t H = prm.num_heads, G = H / prm.kv_heads, K = prm.top_k, Dp = padded(D);
  const int64_t width = heads_per_block_list(prm);
  const int64_t Pp = padded(rows_per_block(prm));
  // Dense causal calls attend in tiles of queries (blocks in order, each read once per tile);
  // calls with block indices query by query (each query its own blocks).
  const bool tiled = prm.block_indices == nullptr;
  const int64_t tile = tiled ? kQueryTile : 1;
  thread_local AttentionScratch s;
  s.fit(std::min(S, tile), G, Dp, Pp);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / prm.kv_heads, n = item % prm.kv_heads;
    const int64_t past = prm.past_lens[b], total = prm.total_lens[b];
    const TC* key_cache = static_cast<const TC*>(prm.key_cache) + item * C * D;
    const TC* value_cache = static_cast<const TC*>(prm.value_cache) + item * C * D;
    const bool importance = prm.block_importance != nullptr;
    float* item_importance = importance ? prm.block_importance + item * prm.num_blocks : nullptr;
    if (importance) std::fill(item_importance, item_importance + prm.num_blocks, 0.0f);
    const T* query = static_cast<const T*>(prm.query) + (b * H + n * G) * S * D;
    auto output = [&](int64_t i) { return static_cast<T*>(prm.output) + (b * S + i) * H * D + n * G * D; };
    for (int64_t i0 = 0; i0 < S; i0 += tile) {
      // Queries [i0, i1) that attend: positions before total (the rest output zeros).
      const int64_t i1 = std::min(S, i0 + tile);
      const int64_t attending = std::max<int64_t>(0, std::min(i1, total - past) - i0);
      for (int64_t i = i0 + attending; i < i1; ++i) std::fill(output(i), output(i) + G * D, from_float<T>(0.0f));
      if (attending == 0) continue;
      for (int64_t j = 0; j < attending; ++j) begin_query(query + (i0 + j) * D, S, D, G, Dp, s.slot(j, G, Dp));
      if (tiled) {
        //   block m:  query i0 | query i0+1 | ... (each its own state; block m read once, then cached)
        const int64_t last_block = (past + i0 + attending - 1) / P;
        for (int64_t m = 0; m <= last_block; ++m) {
          bool first_reader = true;
          for (int64_t j = 0; j < attending; ++j) {
            const int64_t p = past + i0 + j;
            if (m * P > p) continue;
            RowStream<TC> rows = block_rows(key_cache, value_cache, m, P, p, D);
            rows.prefetching = first_reader;
            if (m < last_block) {
              rows.next_keys = key_cache + (m + 1) * P * D;
              rows.next_count = std::min<int64_t>(P, past + i0 + attending - (m + 1) * P);
            }
            attend_block(prm, rows, static_cast<int32_t>(m), importance, G, Dp, Pp, s, s.slot(j, G, Dp));
            first_reader = false;
          }
        }
        for (int64_t j = 0; j < attending; ++j)
          finish_query(s.slot(j, G, Dp), G, D, Dp, output(i0 + j), item_importance);
      } else {
        const int64_t p = past + i0;
        const QueryState query_state = s.slot(0, G, Dp);
        const int32_t* lists = prm.block_indices + (item * (G / width) * S + i0) * K;  // list l at l * S * K
        if (width == 1 && G > 1 &&
            attend_union(prm, lists, S * K, p, key_cache, value_cache, G, Dp, Pp, s, query_state, output(i0),
                         item_importance))
          continue;
        // Each list of blocks is attended by `width` heads from g0: all G, or one head per list.
        s.blocks.resize(K);
        for (int64_t g0 = 0; g0 < G; g0 += width) {
          const QueryState heads = query_state.heads(g0, Dp);
          int64_t count = 0;
          attended_blocks(lists + (g0 / width) * S * K, K, P, p, s.blocks.data(), count);
          heads.masses->clear();
          for (int64_t j = 0; j < count; ++j) {
            const RowStream<TC> rows = listed_block_rows(key_cache, value_cache, s.blocks.data(), count, j, P, p, D);
            attend_block(prm, rows, s.blocks[j], importance, width, Dp, Pp, s, heads);
          }
          finish_query(heads, width, D, Dp, output(i0) + g0 * D, item_importance);
        }
      }
    }
  }
}

}  // namespace quest::QUEST_ISA
