// ORT adapter of SparseBlockSelect: validate, resolve lengths, select per (batch, KV head).
#include <string>

#include "../kernels/dispatch.h"
#include "../kernels/int8_bounds.h"
#include "../kernels/select_rule.h"
#include "adapter.h"
#include "ops.h"

namespace quest::ort {

namespace io = schema::SparseBlockSelect;

void check_chunk_budget(const schema::OpSchema& op, const Attributes& attributes) {
  const int64_t most = most_chunk_forced(attributes.get_int("chunk_size"), attributes.get_int("block_size"),
                                         attributes.get_int("chunk_window"), attributes.get_int("chunk_sink"));
  if (attributes.get_int("chunk_top_k") < most)
    throw OpError(op, "attribute 'chunk_top_k' = " + std::to_string(attributes.get_int("chunk_top_k")) +
                          " cannot hold a chunk's forced blocks: up to " + std::to_string(most) +
                          " (its own blocks, chunk_window = " + std::to_string(attributes.get_int("chunk_window")) +
                          ", chunk_sink = " + std::to_string(attributes.get_int("chunk_sink")) + ")");
}

// The hierarchical selection's inputs: super_max and super_min together, super_exponent exactly
// when the bounds are int8; the probe score takes none (it reads keys, not bounds).
void check_superblocks(const BoundInputs& in, bool probe) {
  const bool given = in[io::in::super_max].present();
  if (given != in[io::in::super_min].present())
    in.fail("inputs 'super_max' and 'super_min' come together: give both (hierarchical selection) or neither");
  if (!given && in[io::in::super_exponent].present())
    in.fail("input 'super_exponent' is given without 'super_max' and 'super_min'");
  if (!given) return;
  if (probe) in.fail("score='probe' takes no superblocks: leave 'super_max' and 'super_min' out");
  check_block_exponent(in, io::in::super_exponent);
}

SparseBlockSelectKernel::SparseBlockSelectKernel(const OrtKernelInfo* info)
    : attributes_(schema(), info), outputs_(node_outputs(info)) {
  check_head_grouping(schema(), attributes_);
  check_chunk_budget(schema(), attributes_);
}

const schema::OpSchema& SparseBlockSelectKernel::schema() { return io::kSchema; }

void SparseBlockSelectKernel::Compute(OrtKernelContext* context) {
  const BoundInputs in(schema(), context, attributes_);
  const int64_t B = in.dim("B"), N = in.dim("N"), S = in.dim("S"), M = in.dim("M"), P = in.dim("P");
  const std::vector<int32_t> total =
      resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, saturating_mul(M, P), "M * block_size");
  const bool probe = attributes_.get_string("score") == "probe";
  check_block_exponent(in, io::in::block_exponent);
  // int8 bounds score exact integers below 2^24 (docs/ops.md, int8 block bounds), which holds up to D = 1024.
  if (in.cache_type() == DType::I8 && in.dim("D") > kMostInt8BoundChannels)
    in.fail("int8 bounds take head dims D up to " + std::to_string(kMostInt8BoundChannels) + ", got D = " +
            std::to_string(in.dim("D")) + " (use float16 bounds)");
  if (probe && in.cache_type() == DType::I8)  // the probe reads key_cache, which shares TC with the bounds
    in.fail("score='probe' needs float bounds (its key_cache shares their type); got int8 bounds");
  if (probe) {
    if (!in[io::in::key_cache].present() || !in[io::in::key].present())
      in.fail("score='probe' needs the inputs 'key_cache' and 'key'");
    resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, in.dim("C"), "the cache capacity C (key_cache dim 2)");
  }
  check_superblocks(in, probe);
  const int32_t* exact_lens = check_exact_lens(in, io::in::exact_lens, total);
  const int32_t* chunk_lens = check_exact_lens(in, io::in::chunk_lens, total);
  const bool has_chunks = outputs_.size() > static_cast<size_t>(io::out::chunk_indices) && outputs_[io::out::chunk_indices];
  if (chunk_lens != nullptr && !has_chunks)
    in.fail("input 'chunk_lens' is given, but the node has no output 'chunk_indices' for the chunks' selections");
  BoundOutputs outputs(context, in);
  auto* indices = static_cast<int32_t*>(outputs.allocate(io::out::block_indices));
  auto* chunk_indices = has_chunks ? static_cast<int32_t*>(outputs.allocate(io::out::chunk_indices)) : nullptr;
  if (S == 0) return;  // no query, no selection (and no loop over B * N empty work items)

  SparseBlockSelectParams params;
  params.batch = B;
  params.num_heads = in.dim("H");
  params.kv_heads = N;
  params.query_len = S;
  params.head_dim = in.dim("D");
  params.num_blocks = M;
  params.block_size = P;
  params.top_k = in.dim("K");
  params.sink_blocks = attributes_.get_int("sink_blocks");
  params.recent_blocks = attributes_.get_int("recent_blocks");
  const std::string& reduce = attributes_.get_string("group_reduce");
  params.reduce = reduce == "max" ? GroupReduce::Max : reduce == "none" ? GroupReduce::None : GroupReduce::Mean;
  params.importance_fraction = attributes_.get_float("importance_fraction");
  params.score = probe ? ScoreMode::Probe : ScoreMode::Bound;
  params.num_probes = attributes_.get_int("num_probes");
  params.capacity = probe ? in.dim("C") : 0;
  params.key_cache = in[io::in::key_cache].data;
  params.key = in[io::in::key].data;
  params.past_lens = in[io::in::past_lens].as<int32_t>();
  params.total_lens = total.data();
  params.exact_lens = exact_lens;
  params.block_importance = in[io::in::block_importance].as<float>();
  params.query_type = in.activation_type();
  params.cache_type = in.cache_type();
  params.query = in[io::in::query].data;
  params.block_max = in[io::in::block_max].data;
  params.block_min = in[io::in::block_min].data;
  params.block_exponent = in[io::in::block_exponent].as<int8_t>();
  params.block_indices = indices;
  params.chunk_lens = chunk_lens;
  params.chunk_indices = chunk_indices;
  params.chunk_size = in.dim("Q");
  params.chunk_top_k = in.dim("KC");
  params.chunk_share = attributes_.get_float("chunk_share");
  params.chunk_window = attributes_.get_int("chunk_window");
  params.chunk_sink = attributes_.get_int("chunk_sink");
  params.chunk_pool = attributes_.get_int("chunk_pool");
  params.chunk_floor = attributes_.get_int("chunk_floor");
  params.super_max = in[io::in::super_max].data;
  params.super_min = in[io::in::super_min].data;
  params.super_exponent = in[io::in::super_exponent].as<int8_t>();
  params.num_superblocks = in[io::in::super_max].present() ? in.dim("MS") : 0;
  params.superblock_size = in.dim("U");
  params.candidate_factor = attributes_.get_int("candidate_factor");
  const SparseBlockSelectFn kernel = active_kernels().sparse_block_select;
  parallel_for(context, B * N, [&](int64_t item) { kernel(params, item, item + 1); });
}

}  // namespace quest::ort
