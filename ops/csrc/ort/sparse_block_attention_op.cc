// ORT adapter of SparseBlockAttention: validate everything, write the new tokens, then attend.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../kernels/dispatch.h"
#include "adapter.h"
#include "ops.h"

namespace quest::ort {

namespace io = schema::SparseBlockAttention;

namespace {

// Every entry of the `rows` rows of K of input `index` is -1 or a block in [0, num_blocks), no block
// twice in one row.
void check_block_rows(const BoundInputs& in, int index, int64_t rows, int64_t K, int64_t num_blocks) {
  const std::string name = std::string("input '") + in.op().inputs[index].name + "'";
  const int32_t* data = in[index].as<int32_t>();
  std::vector<uint8_t> seen(static_cast<size_t>(num_blocks), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* row = data + r * K;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t m = row[j];
      if (m == -1) continue;
      if (m < -1 || m >= num_blocks) {
        for (int64_t u = 0; u < j; ++u)
          if (row[u] >= 0) seen[row[u]] = 0;
        in.fail(name + " row " + std::to_string(r) + " holds " + std::to_string(m) + ", outside [-1, " +
                std::to_string(num_blocks) + ")");
      }
      if (seen[m]) in.fail(name + " row " + std::to_string(r) + " repeats block " + std::to_string(m));
      seen[m] = 1;
    }
    for (int64_t j = 0; j < K; ++j)
      if (row[j] >= 0) seen[row[j]] = 0;
  }
}

// Rows per KV head (R = N) or per query head (R = H), each a valid row of blocks.
void check_block_indices(const BoundInputs& in, int64_t num_blocks) {
  if (!in[io::in::block_indices].present()) return;
  const int64_t R = in.dim("R"), N = in.dim("N"), H = in.dim("H");
  if (R != N && R != H)
    in.fail("input 'block_indices' dim 1 is " + std::to_string(R) + ": expected N = " + std::to_string(N) +
            " (blocks per KV head) or H = " + std::to_string(H) + " (blocks per query head)");
  check_block_rows(in, io::in::block_indices, in.dim("B") * R * in.dim("S"), in.dim("K"), num_blocks);
}

// chunk_indices and chunk_lens come together; a row of blocks per KV head (the schema binds N) and
// chunk of the call: NC = ceil(S / chunk_size).
void check_chunk_indices(const BoundInputs& in, int64_t num_blocks) {
  const bool indices = in[io::in::chunk_indices].present(), lens = in[io::in::chunk_lens].present();
  if (indices != lens)
    in.fail(std::string("input '") + (indices ? "chunk_indices" : "chunk_lens") + "' needs input '" +
            (indices ? "chunk_lens" : "chunk_indices") + "': chunk queries take both");
  if (!indices) return;
  const int64_t Q = in.dim("Q"), S = in.dim("S"), chunks = (S + Q - 1) / Q;
  if (in.dim("NC") != chunks)
    in.fail("input 'chunk_indices' dim 2 is " + std::to_string(in.dim("NC")) + ": expected ceil(S / chunk_size) = " +
            std::to_string(chunks) + " (S = " + std::to_string(S) + ", chunk_size = " + std::to_string(Q) + ")");
  check_block_rows(in, io::in::chunk_indices, in.dim("B") * in.dim("N") * chunks, in.dim("KC"), num_blocks);
}

// An int8 cache comes with its row scales, as inputs and as outputs (the new rows' scales are
// written there); a float cache with none.
void check_scales(const BoundInputs& in, const std::vector<bool>& outputs) {
  const bool int8 = in.cache_type() == DType::I8;
  for (const auto& [input, output] : {std::pair{io::in::key_scale, io::out::key_scale_out},
                                      std::pair{io::in::value_scale, io::out::value_scale_out}}) {
    const std::string name = in.op().inputs[input].name, output_name = in.op().outputs[output].name;
    if (int8 && !in[input].present())
      in.fail("input '" + name + "' is required with int8 caches (each row's scale)");
    if (!int8 && in[input].present())
      in.fail("input '" + name + "' is given, but the caches are " +
              (in.cache_type() == DType::F32 ? "float32" : "float16") + ": scales belong to int8 caches only");
    const bool bound = static_cast<size_t>(output) < outputs.size() && outputs[output];
    if (int8 && !bound) in.fail("output '" + output_name + "' is required with int8 caches (the new rows' scales)");
    if (!int8 && bound) in.fail("output '" + output_name + "' is bound, but the caches are not int8: leave it out");
  }
}

}  // namespace

SparseBlockAttentionKernel::SparseBlockAttentionKernel(const OrtKernelInfo* info)
    : attributes_(schema(), info), outputs_(node_outputs(info)) {
  check_head_grouping(schema(), attributes_);
}

const schema::OpSchema& SparseBlockAttentionKernel::schema() { return io::kSchema; }

void SparseBlockAttentionKernel::Compute(OrtKernelContext* context) {
  const BoundInputs in(schema(), context, attributes_);
  const int64_t B = in.dim("B"), N = in.dim("N"), S = in.dim("S"), C = in.dim("C"), D = in.dim("D");
  const int64_t num_blocks = in.dim("MC");
  const std::vector<int32_t> total =
      resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, C, "the cache capacity C (key_cache dim 2)");
  check_block_indices(in, num_blocks);
  check_chunk_indices(in, num_blocks);
  check_scales(in, outputs_);
  const int32_t* exact_lens = check_exact_lens(in, io::in::exact_lens, total);
  const int32_t* chunk_lens = check_exact_lens(in, io::in::chunk_lens, total);

  BoundOutputs outputs(context, in);
  void* output = outputs.allocate(io::out::output);
  void* key_cache = outputs.allocate(io::out::key_cache_out, io::in::key_cache);
  void* value_cache = outputs.allocate(io::out::value_cache_out, io::in::value_cache);
  const bool has_importance = outputs_.size() > static_cast<size_t>(io::out::block_importance) &&
                              outputs_[io::out::block_importance];
  float* importance = has_importance ? static_cast<float*>(outputs.allocate(io::out::block_importance)) : nullptr;
  const bool int8 = in.cache_type() == DType::I8;
  void* key_scale = int8 ? outputs.allocate(io::out::key_scale_out, io::in::key_scale) : nullptr;
  void* value_scale = int8 ? outputs.allocate(io::out::value_scale_out, io::in::value_scale) : nullptr;
  prepare_in_place(in, io::in::key_cache, key_cache);
  prepare_in_place(in, io::in::value_cache, value_cache);
  if (int8) {
    prepare_in_place(in, io::in::key_scale, key_scale);
    prepare_in_place(in, io::in::value_scale, value_scale);
  }
  if (S == 0) {  // no query: nothing attended, nothing written (importance is all zero)
    if (importance != nullptr) std::fill(importance, importance + B * N * num_blocks, 0.0f);
    return;
  }

  const float scale = attributes_.get_float("scale");
  SparseBlockAttentionParams params;
  params.batch = B;
  params.num_heads = in.dim("H");
  params.kv_heads = N;
  params.query_len = S;
  params.head_dim = D;
  params.capacity = C;
  params.block_size = in.dim("P");
  params.num_blocks = num_blocks;
  params.scale = scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(D)) : scale;
  params.softcap = attributes_.get_float("softcap");
  params.past_lens = in[io::in::past_lens].as<int32_t>();
  params.total_lens = total.data();
  params.block_indices = in[io::in::block_indices].as<int32_t>();
  params.exact_lens = exact_lens;
  params.per_head_indices = params.block_indices != nullptr && in.dim("R") != N;
  params.top_k = in[io::in::block_indices].present() ? in.dim("K") : 0;
  params.chunk_indices = in[io::in::chunk_indices].as<int32_t>();
  params.chunk_lens = chunk_lens;
  params.chunk_size = in.dim("Q");
  params.num_chunks = params.chunk_indices != nullptr ? in.dim("NC") : 0;
  params.chunk_top_k = params.chunk_indices != nullptr ? in.dim("KC") : 0;
  params.activation_type = in.activation_type();
  params.cache_type = in.cache_type();
  params.query = in[io::in::query].data;
  params.key = in[io::in::key].data;
  params.value = in[io::in::value].data;
  params.key_cache = key_cache;
  params.value_cache = value_cache;
  params.key_scale = static_cast<Half*>(key_scale);
  params.value_scale = static_cast<Half*>(value_scale);
  params.output = output;
  params.block_importance = importance;
  // Prefill calls split each item's queries into tiles of the exact walk, so that every thread has
  // work whatever B * N is (3 KV heads on 2 threads would leave one idle a third of the time);
  // the block importance, summed per item, keeps an item in one unit.
  const int64_t tile = exact_tile_queries(params.num_heads / N);
  params.query_chunk = importance == nullptr && S > tile ? tile : 0;
  const KernelTable& kernels = active_kernels();
  parallel_for(context, B * N, [&](int64_t item) { kernels.write_cache_tokens(params, item, item + 1); });
  parallel_for(context, attention_units(params),
               [&](int64_t unit) { kernels.sparse_block_attention(params, unit, unit + 1); });
}

}  // namespace quest::ort
