// ORT adapter of QuestMetadata: validate, resolve lengths, update the metadata in place.
#include "../kernels/dispatch.h"
#include "adapter.h"
#include "ops.h"

namespace quest::ort {

namespace io = schema::QuestMetadata;

QuestMetadataKernel::QuestMetadataKernel(const OrtKernelInfo* info)
    : attributes_(schema(), info), outputs_(node_outputs(info)) {}

const schema::OpSchema& QuestMetadataKernel::schema() { return io::kSchema; }

void QuestMetadataKernel::Compute(OrtKernelContext* context) {
  const BoundInputs in(schema(), context, attributes_);
  const int64_t B = in.dim("B"), N = in.dim("N"), S = in.dim("S"), M = in.dim("M"), P = in.dim("P");
  const std::vector<int32_t> total =
      resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, saturating_mul(M, P), "M * block_size");
  check_block_exponent(in, io::in::block_exponent, io::out::block_exponent_out, outputs_);
  const bool int8 = in.cache_type() == DType::I8;
  BoundOutputs outputs(context, in);
  void* block_max = outputs.allocate(io::out::block_max_out, io::in::block_max);
  void* block_min = outputs.allocate(io::out::block_min_out, io::in::block_min);
  void* exponent = int8 ? outputs.allocate(io::out::block_exponent_out, io::in::block_exponent) : nullptr;
  prepare_in_place(in, io::in::block_max, block_max);
  prepare_in_place(in, io::in::block_min, block_min);
  if (int8) prepare_in_place(in, io::in::block_exponent, exponent);
  // No new token: the metadata stands as it is. (Past this, the B * N work items are bounded by
  // the key's elements, so empty dims next to huge ones cannot make a long empty loop.)
  if (S == 0) return;

  QuestMetadataParams params;
  params.batch = B;
  params.kv_heads = N;
  params.new_tokens = S;
  params.head_dim = in.dim("D");
  params.num_blocks = M;
  params.block_size = P;
  params.past_lens = in[io::in::past_lens].as<int32_t>();
  params.total_lens = total.data();
  params.key_type = in.activation_type();
  params.cache_type = in.cache_type();
  params.key = in[io::in::key].data;
  params.block_max = block_max;
  params.block_min = block_min;
  params.block_exponent = static_cast<int8_t*>(exponent);
  params.int8_keys = attributes_.get_string("key_cache_type") == "int8";
  const QuestMetadataFn kernel = active_kernels().quest_metadata;
  parallel_for(context, B * N, [&](int64_t item) { kernel(params, item, item + 1); });
}

}  // namespace quest::ort
