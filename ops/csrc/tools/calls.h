// Loading one op call of a driver case (inputs and params), running it, writing its outputs:
// shared by the kernel driver (every ISA variant) and the CANN emulator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/quest_metadata.h"
#include "../kernels/sparse_block_attention.h"
#include "../kernels/sparse_block_select.h"
#include "case_io.h"

namespace quest::tools {

// exact_lens.bin when the case gives it (with_exact 1), else empty (the params get null).
inline std::vector<char> read_exact_lens(const Case& c, int64_t B) {
  return c.has("with_exact") && c.integer("with_exact") ? c.read("exact_lens", 4 * B) : std::vector<char>();
}

// chunk_lens.bin when the case has chunk queries (with_chunks 1), else empty.
inline std::vector<char> read_chunk_lens(const Case& c, int64_t B) {
  return c.has("with_chunks") && c.integer("with_chunks") ? c.read("chunk_lens", 4 * B) : std::vector<char>();
}

inline const int32_t* lens_or_null(const std::vector<char>& lens) {
  return lens.empty() ? nullptr : reinterpret_cast<const int32_t*>(lens.data());
}

// block_exponent.bin [B, N, M] of int8 block bounds (TC int8: QuestMetadata's and SparseBlockSelect's
// bounds), else empty (the params get null).
inline std::vector<char> read_block_exponent(const Case& c, DType bounds, int64_t blocks) {
  return bounds == DType::I8 ? c.read("block_exponent", static_cast<size_t>(blocks)) : std::vector<char>();
}

// run_<op>(case, variant, run): builds the op's params from the case, calls run(params), then
// writes the outputs as <variant>.<output>.bin.
template <typename Run>
void run_metadata(const Case& c, const std::string& variant, Run&& run) {
  const int64_t B = c.integer("B"), N = c.integer("N"), S = c.integer("S"), D = c.integer("D"), M = c.integer("M");
  const DType T = c.dtype("T"), TC = c.dtype("TC");
  auto key = c.read("key", bytes_of(T, B * N * S * D));
  auto block_max = c.read("block_max", bytes_of(TC, B * N * M * D));
  auto block_min = c.read("block_min", bytes_of(TC, B * N * M * D));
  auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  auto exponent = read_block_exponent(c, TC, B * N * M);
  QuestMetadataParams p;
  p.batch = B, p.kv_heads = N, p.new_tokens = S, p.head_dim = D, p.num_blocks = M, p.block_size = c.integer("P");
  p.past_lens = reinterpret_cast<const int32_t*>(past.data());
  p.total_lens = reinterpret_cast<const int32_t*>(total.data());
  p.key_type = T, p.cache_type = TC, p.key = key.data(), p.block_max = block_max.data(), p.block_min = block_min.data();
  p.block_exponent = exponent.empty() ? nullptr : reinterpret_cast<int8_t*>(exponent.data());
  p.int8_keys = c.has("key_cache_type") && c.text("key_cache_type") == "int8";
  run(p);
  c.write(variant, "block_max_out", block_max.data(), block_max.size());
  c.write(variant, "block_min_out", block_min.data(), block_min.size());
  if (!exponent.empty()) c.write(variant, "block_exponent_out", exponent.data(), exponent.size());
}

template <typename Run>
void run_select(const Case& c, const std::string& variant, Run&& run) {
  const int64_t B = c.integer("B"), H = c.integer("H"), N = c.integer("N"), S = c.integer("S"), D = c.integer("D");
  const int64_t M = c.integer("M"), K = c.integer("K");
  const DType T = c.dtype("T"), TC = c.dtype("TC");
  auto query = c.read("query", bytes_of(T, B * H * S * D));
  auto block_max = c.read("block_max", bytes_of(TC, B * N * M * D));
  auto block_min = c.read("block_min", bytes_of(TC, B * N * M * D));
  auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  const std::vector<char> exponent = read_block_exponent(c, TC, B * N * M);
  std::vector<char> importance;
  if (c.integer("with_importance")) importance = c.read("block_importance", 4 * B * N * M);
  std::vector<int32_t> indices(B * c.integer("R") * S * K);
  const std::vector<char> exact = read_exact_lens(c, B);
  const bool probe = c.text("score") == "probe";
  std::vector<char> key_cache, key;
  if (probe) {
    key_cache = c.read("key_cache", bytes_of(TC, B * N * c.integer("C") * D));
    key = c.read("key", bytes_of(T, B * N * S * D));
  }
  SparseBlockSelectParams p;
  p.batch = B, p.num_heads = H, p.kv_heads = N, p.query_len = S, p.head_dim = D, p.num_blocks = M;
  p.block_size = c.integer("P"), p.top_k = K, p.sink_blocks = c.integer("sink_blocks");
  p.recent_blocks = c.integer("recent_blocks");
  const std::string reduce = c.text("group_reduce");
  p.reduce = reduce == "max" ? GroupReduce::Max : reduce == "none" ? GroupReduce::None : GroupReduce::Mean;
  p.importance_fraction = c.real("importance_fraction");
  p.score = probe ? ScoreMode::Probe : ScoreMode::Bound;
  p.num_probes = c.integer("num_probes");
  p.capacity = probe ? c.integer("C") : 0;
  p.key_cache = probe ? key_cache.data() : nullptr;
  p.key = probe ? key.data() : nullptr;
  p.past_lens = reinterpret_cast<const int32_t*>(past.data());
  p.total_lens = reinterpret_cast<const int32_t*>(total.data());
  p.block_importance = importance.empty() ? nullptr : reinterpret_cast<const float*>(importance.data());
  p.exact_lens = lens_or_null(exact);
  p.query_type = T, p.cache_type = TC, p.query = query.data(), p.block_max = block_max.data();
  p.block_min = block_min.data(), p.block_indices = indices.data();
  p.block_exponent = exponent.empty() ? nullptr : reinterpret_cast<const int8_t*>(exponent.data());
  // Superblocks (with_superblocks 1): super_max/super_min [B, N, MS, D] (and super_exponent [B, N, MS]).
  std::vector<char> super_max, super_min, super_exponent;
  if (c.has("with_superblocks") && c.integer("with_superblocks")) {
    const int64_t MS = c.integer("MS");
    super_max = c.read("super_max", bytes_of(TC, B * N * MS * D));
    super_min = c.read("super_min", bytes_of(TC, B * N * MS * D));
    if (TC == DType::I8) super_exponent = c.read("super_exponent", static_cast<size_t>(B * N * MS));
    p.super_max = super_max.data(), p.super_min = super_min.data(), p.num_superblocks = MS;
    p.super_exponent = super_exponent.empty() ? nullptr : reinterpret_cast<const int8_t*>(super_exponent.data());
    p.superblock_size = c.integer("U"), p.candidate_factor = c.integer("candidate_factor");
  }
  // Chunk queries: their lists into chunk_indices [B, N, ceil(S / Q), KC].
  const std::vector<char> chunk_lens = read_chunk_lens(c, B);
  std::vector<int32_t> chunk_indices;
  if (!chunk_lens.empty()) {
    p.chunk_lens = lens_or_null(chunk_lens);
    p.chunk_size = c.integer("Q"), p.chunk_top_k = c.integer("KC"), p.chunk_share = c.real("chunk_share");
    p.chunk_window = c.integer("chunk_window"), p.chunk_pool = c.integer("chunk_pool");
    p.chunk_sink = c.integer("chunk_sink");
    p.chunk_floor = c.integer("chunk_floor");
    chunk_indices.resize(B * N * num_chunks(p) * p.chunk_top_k);
    p.chunk_indices = chunk_indices.data();
  }
  run(p);
  c.write(variant, "block_indices", indices.data(), indices.size() * 4);
  if (!chunk_lens.empty()) c.write(variant, "chunk_indices", chunk_indices.data(), chunk_indices.size() * 4);
}

template <typename Run>
void run_attention(const Case& c, const std::string& variant, Run&& run) {
  const int64_t B = c.integer("B"), H = c.integer("H"), N = c.integer("N"), S = c.integer("S"), D = c.integer("D");
  const int64_t C = c.integer("C"), P = c.integer("P"), K = c.integer("K");
  const DType T = c.dtype("T"), TC = c.dtype("TC");
  auto query = c.read("query", bytes_of(T, B * H * S * D));
  auto key = c.read("key", bytes_of(T, B * N * S * D));
  auto value = c.read("value", bytes_of(T, B * N * S * D));
  auto key_cache = c.read("key_cache", bytes_of(TC, B * N * C * D));
  auto value_cache = c.read("value_cache", bytes_of(TC, B * N * C * D));
  auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  // int8 caches: each row's float16 scale, key_scale.bin / value_scale.bin [B, N, C], updated in place.
  std::vector<char> key_scale, value_scale;
  if (TC == DType::I8) {
    key_scale = c.read("key_scale", bytes_of(DType::F16, B * N * C));
    value_scale = c.read("value_scale", bytes_of(DType::F16, B * N * C));
  }
  std::vector<char> indices;
  const int64_t R = c.integer("R");  // rows of block_indices: N, or H when per query head
  if (K > 0) indices = c.read("block_indices", 4 * B * R * S * K);
  const std::vector<char> exact = read_exact_lens(c, B);
  const std::vector<char> chunk_lens = read_chunk_lens(c, B);
  const int64_t Q = c.has("Q") ? c.integer("Q") : 64, chunks = (S + Q - 1) / Q;
  std::vector<char> chunk_indices;
  if (!chunk_lens.empty()) chunk_indices = c.read("chunk_indices", 4 * B * N * chunks * c.integer("KC"));
  const int64_t num_blocks = (C + P - 1) / P;
  std::vector<char> output(bytes_of(T, B * S * H * D));
  std::vector<float> importance(B * N * num_blocks);
  SparseBlockAttentionParams p;
  p.batch = B, p.num_heads = H, p.kv_heads = N, p.query_len = S, p.head_dim = D, p.capacity = C;
  p.block_size = P, p.num_blocks = num_blocks, p.top_k = K, p.scale = c.real("scale"), p.softcap = c.real("softcap");
  p.past_lens = reinterpret_cast<const int32_t*>(past.data());
  p.total_lens = reinterpret_cast<const int32_t*>(total.data());
  p.block_indices = indices.empty() ? nullptr : reinterpret_cast<const int32_t*>(indices.data());
  p.exact_lens = lens_or_null(exact);
  if (!chunk_lens.empty()) {
    p.chunk_lens = lens_or_null(chunk_lens);
    p.chunk_indices = reinterpret_cast<const int32_t*>(chunk_indices.data());
    p.chunk_size = Q, p.num_chunks = chunks, p.chunk_top_k = c.integer("KC");
  }
  p.per_head_indices = !indices.empty() && R != N;
  p.activation_type = T, p.cache_type = TC, p.query = query.data(), p.key = key.data(), p.value = value.data();
  p.key_cache = key_cache.data(), p.value_cache = value_cache.data(), p.output = output.data();
  if (TC == DType::I8) {
    p.key_scale = reinterpret_cast<Half*>(key_scale.data());
    p.value_scale = reinterpret_cast<Half*>(value_scale.data());
  }
  p.block_importance = importance.data();
  run(p);
  c.write(variant, "output", output.data(), output.size());
  c.write(variant, "key_cache_out", key_cache.data(), key_cache.size());
  c.write(variant, "value_cache_out", value_cache.data(), value_cache.size());
  c.write(variant, "block_importance", importance.data(), importance.size() * 4);
  if (TC == DType::I8) {
    c.write(variant, "key_scale_out", key_scale.data(), key_scale.size());
    c.write(variant, "value_scale_out", value_scale.data(), value_scale.size());
  }
}

}  // namespace quest::tools
