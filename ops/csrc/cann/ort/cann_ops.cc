// The Quest ops on ONNX Runtime's CANNExecutionProvider (libquest_ort_cann.so; built only with
// -DQUEST_ORT_CANN=ON and a CANN toolkit: docs/cann.md says what was verified without an NPU).
//
// Each kernel validates with the same schema-driven adapter as the CPU library (lengths and block
// indices arrive in host memory: they are declared CPU inputs), plans with host/tiling.h, and
// launches on the stream ORT gives the node:
//   QuestMetadata      -> the AscendC metadata kernel
//   SparseBlockSelect  -> the AscendC select kernel (score 'bound'; 'probe' is refused)
//   SparseBlockAttention -> 2-D copies of the new tokens into the caches, then
//                           aclnnFusedInferAttentionScore over the compacted block table
//                           (host/attention_plan.h), then zeroes for padded or empty rows
// Device scratch (lengths, block tables, workspaces) is allocated per call and freed after the
// stream has finished with it.
#include <acl/acl.h>
#include <aclnn/acl_meta.h>
#include <aclnnop/aclnn_fused_infer_attention_score.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../../ort/adapter.h"
#include "../../ort/ops.h"
#include "cann_ops.h"
#include "../host/attention_plan.h"
#include "../host/tiling.h"
#include "../kernels/launch.h"

namespace quest::ort {
namespace {

namespace cann = quest::cann;

void check_acl(aclError status, const char* what) {
  if (status != ACL_SUCCESS) throw std::runtime_error(std::string("CANN: ") + what + " failed with ACL error " +
                                                      std::to_string(static_cast<int>(status)));
}

// Placement on the NPU: lengths and block indices come in host memory (ORT copies them), so the
// adapter validates them exactly as on the CPU; everything else is an NPU device pointer.
struct CannPlacement {
  static const char* execution_provider() { return "CANNExecutionProvider"; }
  static bool host_input(const schema::OpSchema& op, size_t index) {
    const std::string name = op.inputs[index].name;
    return name == "past_lens" || name == "total_lens" || name == "block_indices" || name == "exact_lens" ||
           name == "chunk_lens" || name == "chunk_indices";
  }
};

cann::ElemType elem(DType dtype) { return dtype == DType::F32 ? cann::ElemType::F32 : cann::ElemType::F16; }

cann::NpuSpec npu_spec() {
  static const cann::NpuSpec spec = [] {
    cann::NpuSpec s;
    int32_t device = 0;
    int64_t cores = 0;
    if (aclrtGetDevice(&device) == ACL_SUCCESS &&
        aclGetDeviceCapability(static_cast<uint32_t>(device), ACL_DEVICE_INFO_VECTOR_CORE_NUM, &cores) == ACL_SUCCESS &&
        cores > 0)
      s.vector_cores = static_cast<int32_t>(cores);
    return s;
  }();
  return spec;
}

// Device memory that lives until the stream has run everything queued on it.
class DeviceScratch {
 public:
  explicit DeviceScratch(aclrtStream stream) : stream_(stream) {}
  ~DeviceScratch() {
    aclrtSynchronizeStream(stream_);
    for (void* p : buffers_) aclrtFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    check_acl(aclrtMalloc(&p, bytes ? bytes : 1, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc");
    buffers_.push_back(p);
    return p;
  }
  void* upload(const void* host, size_t bytes) {
    void* p = alloc(bytes);
    check_acl(aclrtMemcpy(p, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE), "copying to the NPU");
    return p;
  }

 private:
  aclrtStream stream_;
  std::vector<void*> buffers_;
};

aclrtStream stream_of(OrtKernelContext* context) {
  void* stream = Ort::KernelContext(context).GetGPUComputeStream();
  if (stream == nullptr) throw std::runtime_error("CANN: the node has no NPU stream (is it placed on CANN?)");
  return static_cast<aclrtStream>(stream);
}

// The output buffer of an in-place op: the input's when IOBinding bound them together, else a
// device copy of the input first.
void prepare_in_place_npu(const TensorArg& input, void* output, const BoundInputs& in, aclrtStream stream) {
  if (input.data == output) return;
  size_t bytes = element_size(in.cache_type());
  for (int64_t d : input.shape) bytes *= static_cast<size_t>(d);
  check_acl(aclrtMemcpyAsync(output, bytes, input.data, bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            "copying a cache into its output");
}

// The AscendC metadata and select kernels take float bounds only (only float pairs are registered
// here, so ORT leaves int8 bounds to the CPU op); refused here too, before elem() could read them
// as float16.
void refuse_int8_bounds(const BoundInputs& in) {
  if (in.cache_type() == DType::I8)
    in.fail("int8 block bounds are not supported on CANN: its kernels take float bounds only");
}

class CannMetadataKernel : public KernelBase<CannMetadataKernel> {
 public:
  explicit CannMetadataKernel(const OrtKernelInfo* info) : attributes_(schema(), info), outputs_(node_outputs(info)) {
    // The AscendC kernel bounds the keys as given; int8 caches (whose attention runs on the CPU
    // op: only float16 caches are registered here) need the keys' dequantized values.
    if (attributes_.get_string("key_cache_type") != "float")
      throw OpError(schema(), "key_cache_type '" + attributes_.get_string("key_cache_type") +
                                  "' is not supported on CANN: its kernels take float caches only");
  }
  static const schema::OpSchema& schema() { return schema::QuestMetadata::kSchema; }

  void Compute(OrtKernelContext* context) {
    namespace io = schema::QuestMetadata;
    const BoundInputs in(schema(), context, attributes_);
    const int64_t B = in.dim("B"), N = in.dim("N"), S = in.dim("S"), M = in.dim("M"), P = in.dim("P");
    const std::vector<int32_t> total =
        resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, saturating_mul(M, P), "M * block_size");
    refuse_int8_bounds(in);
    check_block_exponent(in, io::in::block_exponent, io::out::block_exponent_out, outputs_);
    const auto planned = cann::plan_metadata(
        {B, N, S, in.dim("D"), M, P, elem(in.activation_type()), elem(in.cache_type())}, npu_spec());
    if (!planned.ok) in.fail(planned.error);
    aclrtStream stream = stream_of(context);
    void* block_max = allocate_output(context, in, io::out::block_max_out);
    void* block_min = allocate_output(context, in, io::out::block_min_out);
    prepare_in_place_npu(in[io::in::block_max], block_max, in, stream);
    prepare_in_place_npu(in[io::in::block_min], block_min, in, stream);
    DeviceScratch scratch(stream);
    void* past = scratch.upload(in[io::in::past_lens].data, 4 * B);
    void* totals = scratch.upload(total.data(), 4 * B);
    cann::npu::launch_quest_metadata(planned.plan, stream, in[io::in::key].data, block_max, block_min, past, totals);
  }

 private:
  Attributes attributes_;
  std::vector<bool> outputs_;  // which outputs the node has (block_exponent_out is optional)
};

class CannSelectKernel : public KernelBase<CannSelectKernel> {
 public:
  explicit CannSelectKernel(const OrtKernelInfo* info) : attributes_(schema(), info), outputs_(node_outputs(info)) {
    const std::string unsupported =
        cann::check_select_support(attributes_.get_string("score"), attributes_.get_string("group_reduce"));
    if (!unsupported.empty()) throw OpError(schema(), unsupported);
    check_head_grouping(schema(), attributes_);
  }
  static const schema::OpSchema& schema() { return schema::SparseBlockSelect::kSchema; }

  void Compute(OrtKernelContext* context) {
    namespace io = schema::SparseBlockSelect;
    const BoundInputs in(schema(), context, attributes_);
    const int64_t B = in.dim("B"), N = in.dim("N"), S = in.dim("S"), M = in.dim("M"), P = in.dim("P");
    const std::vector<int32_t> total =
        resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, saturating_mul(M, P), "M * block_size");
    refuse_int8_bounds(in);
    check_block_exponent(in, io::in::block_exponent);
    if (in[io::in::super_max].present() || in[io::in::super_min].present())
      in.fail(cann::kNoHierarchicalSelect);
    const bool importance = in[io::in::block_importance].present();
    const int32_t* exact = check_exact_lens(in, io::in::exact_lens, total);
    const std::string chunks = cann::check_chunk_support("SparseBlockSelect", B, S, in[io::in::past_lens].as<int32_t>(),
                                                         total.data(), exact,
                                                         check_exact_lens(in, io::in::chunk_lens, total));
    if (!chunks.empty()) in.fail(chunks);
    const cann::SelectShape shape{B, in.dim("H"), N, S, in.dim("D"), M, P, attributes_.get_int("top_k"),
                                  attributes_.get_int("sink_blocks"), attributes_.get_int("recent_blocks"),
                                  attributes_.get_string("group_reduce") == "max", importance,
                                  attributes_.get_float("importance_fraction"), elem(in.activation_type()),
                                  elem(in.cache_type())};
    const auto planned = cann::plan_select(shape, npu_spec());
    if (!planned.ok) in.fail(planned.error);
    aclrtStream stream = stream_of(context);
    void* indices = allocate_output(context, in, io::out::block_indices);
    const bool has_chunks = outputs_.size() > static_cast<size_t>(io::out::chunk_indices) && outputs_[io::out::chunk_indices];
    if (has_chunks) {  // no chunk query (refused above): every chunk's row is -1
      const size_t bytes = 4 * static_cast<size_t>(B * N * in.dim("NC") * in.dim("KC"));
      check_acl(aclrtMemsetAsync(allocate_output(context, in, io::out::chunk_indices), bytes, 0xFF, bytes, stream),
                "marking the chunks' rows empty");
    }
    DeviceScratch scratch(stream);
    void* past = scratch.upload(in[io::in::past_lens].data, 4 * B);
    void* totals = scratch.upload(total.data(), 4 * B);
    void* workspace = planned.plan.workspace_bytes ? scratch.alloc(planned.plan.workspace_bytes) : nullptr;
    cann::npu::launch_sparse_block_select(planned.plan, stream, in[io::in::query].data, in[io::in::block_max].data,
                                    in[io::in::block_min].data, past, totals,
                                    importance ? in[io::in::block_importance].data : nullptr, indices, workspace);
    // The kernel ranks every query; the rows of queries that attend exactly become -1 (bytes 0xFF).
    const int64_t row_bytes = 4 * attributes_.get_int("top_k");
    for (const cann::RowRun& run : cann::exact_select_rows(B, N, S, in[io::in::past_lens].as<int32_t>(), exact))
      check_acl(aclrtMemsetAsync(static_cast<char*>(indices) + run.first * row_bytes, run.count * row_bytes, 0xFF,
                                 run.count * row_bytes, stream),
                "marking the rows of queries that attend exactly");
  }

 private:
  Attributes attributes_;
  std::vector<bool> outputs_;  // which outputs the node has (chunk_indices is optional)
};

aclDataType acl_type(cann::ElemType type) {
  return type == cann::ElemType::F16 ? ACL_FLOAT16 : type == cann::ElemType::BF16 ? ACL_BF16 : ACL_FLOAT;
}

aclTensor* device_tensor(std::vector<int64_t> dims, aclDataType type, void* data) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return aclCreateTensor(dims.data(), dims.size(), type, strides.data(), 0, ACL_FORMAT_ND, dims.data(), dims.size(),
                         data);
}

class CannAttentionKernel : public KernelBase<CannAttentionKernel> {
 public:
  explicit CannAttentionKernel(const OrtKernelInfo* info) : attributes_(schema(), info) {
    check_head_grouping(schema(), attributes_);
  }
  static const schema::OpSchema& schema() { return schema::SparseBlockAttention::kSchema; }

  void Compute(OrtKernelContext* context) {
    namespace io = schema::SparseBlockAttention;
    const BoundInputs in(schema(), context, attributes_);
    const int64_t B = in.dim("B"), H = in.dim("H"), N = in.dim("N"), S = in.dim("S"), D = in.dim("D");
    const int64_t C = in.dim("C"), P = in.dim("P");
    const std::vector<int32_t> total = resolve_total_lens(in, io::in::past_lens, io::in::total_lens, S, C, "C");
    const TensorArg& indices = in[io::in::block_indices];
    const int32_t* exact = check_exact_lens(in, io::in::exact_lens, total);
    const std::string chunks = cann::check_chunk_support("SparseBlockAttention", B, S,
                                                         in[io::in::past_lens].as<int32_t>(), total.data(), exact,
                                                         check_exact_lens(in, io::in::chunk_lens, total));
    if (!chunks.empty()) in.fail(chunks);
    Ort::KernelContext ctx(context);
    const cann::AttentionShape shape{B, H, N, S, D, C, P, indices.present() ? indices.shape[3] : 0,
                                     elem(in.activation_type()), elem(in.cache_type()),
                                     attributes_.get_float("softcap"), ctx.GetOutputCount() > io::out::block_importance,
                                     indices.present() && in.dim("R") != N};
    const std::string unsupported = cann::check_attention_support(shape);
    if (!unsupported.empty()) in.fail(unsupported);
    aclrtStream stream = stream_of(context);
    void* output = allocate_output(context, in, io::out::output);
    void* key_cache = allocate_output(context, in, io::out::key_cache_out);
    void* value_cache = allocate_output(context, in, io::out::value_cache_out);
    prepare_in_place_npu(in[io::in::key_cache], key_cache, in, stream);
    prepare_in_place_npu(in[io::in::value_cache], value_cache, in, stream);
    const int32_t* past = in[io::in::past_lens].as<int32_t>();
    const size_t elem_bytes = element_size(in.cache_type());
    // The new tokens into the caches: per batch row, N rows of (valid x D), pitches S*D and C*D.
    for (int64_t b = 0; b < B; ++b) {
      const size_t width = static_cast<size_t>(total[b] - past[b]) * D * elem_bytes;
      if (width == 0) continue;
      for (auto [source, target] : {std::pair{in[io::in::key].data, key_cache}, {in[io::in::value].data, value_cache}})
        check_acl(aclrtMemcpy2dAsync(static_cast<char*>(target) + (b * N * C + past[b]) * D * elem_bytes,
                                     C * D * elem_bytes, static_cast<const char*>(source) + b * N * S * D * elem_bytes,
                                     S * D * elem_bytes, width, N, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
                  "writing the new tokens into the caches");
    }
    const cann::FiaRows rows =
        cann::build_fia_rows(shape, past, total.data(), indices.present() ? indices.as<int32_t>() : nullptr, exact);
    DeviceScratch scratch(stream);
    const int64_t G = H / N, M = C / P;
    // FIA rows (b, n, s) read the query as [rows, G, 1, D] and write [rows, G, 1, D]: for S = 1
    // these are the op's own query [B, H, 1, D] and output [B, 1, H*D]; for S > 1 the host
    // gathers and scatters through device scratch (two device-to-device 2-D copies).
    void* fia_query = const_cast<void*>(in[io::in::query].data);
    void* fia_out = output;
    if (S > 1) {
      fia_query = scratch.alloc(B * H * S * D * elem_bytes);
      fia_out = scratch.alloc(B * H * S * D * elem_bytes);
      for (int64_t bn = 0; bn < B * N; ++bn)  // [G, S, D] -> [S, G, D] for each (b, n), one head at a time
        for (int64_t g = 0; g < G; ++g)
          check_acl(aclrtMemcpy2dAsync(static_cast<char*>(fia_query) + (bn * S * G + g) * D * elem_bytes,
                                       G * D * elem_bytes,
                                       static_cast<const char*>(in[io::in::query].data) + (bn * G + g) * S * D * elem_bytes,
                                       D * elem_bytes, D * elem_bytes, S, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
                    "gathering the query rows");
    }
    aclTensor* key_pages = device_tensor({B * N * M, P, D}, acl_type(shape.cache_type), key_cache);
    aclTensor* value_pages = device_tensor({B * N * M, P, D}, acl_type(shape.cache_type), value_cache);
    aclTensorList* keys = aclCreateTensorList(&key_pages, 1);
    aclTensorList* values = aclCreateTensorList(&value_pages, 1);
    void* table = scratch.upload(rows.table.data(), rows.table.size() * 4);
    char layout[] = "BNSD";
    for (int64_t r0 = 0; r0 < rows.rows; r0 += cann::kFiaMaxRows) {
      const int64_t count = std::min(cann::kFiaMaxRows, rows.rows - r0);
      aclTensor* query = device_tensor({count, G, 1, D}, acl_type(shape.activation_type),
                                       static_cast<char*>(fia_query) + r0 * G * D * elem_bytes);
      aclTensor* out = device_tensor({count, G, 1, D}, acl_type(shape.activation_type),
                                     static_cast<char*>(fia_out) + r0 * G * D * elem_bytes);
      aclTensor* block_table = device_tensor({count, rows.width}, ACL_INT32,
                                             static_cast<char*>(table) + r0 * rows.width * 4);
      aclIntArray* kv_lengths = aclCreateIntArray(rows.kv_lengths.data() + r0, count);
      uint64_t workspace_bytes = 0;
      aclOpExecutor* executor = nullptr;
      const float scale = attributes_.get_float("scale") > 0.0f ? attributes_.get_float("scale")
                                                                : 1.0f / std::sqrt(static_cast<float>(D));
      const aclnnStatus planned = aclnnFusedInferAttentionScoreGetWorkspaceSize(
          query, keys, values, nullptr, nullptr, nullptr, kv_lengths, nullptr, nullptr, nullptr, nullptr, nullptr,
          nullptr, nullptr, block_table, nullptr, nullptr, G, static_cast<double>(scale), INT32_MAX, INT32_MAX, layout,
          1, 0, 1, P, 0, false, out, nullptr, &workspace_bytes, &executor);
      if (planned != 0) in.fail("aclnnFusedInferAttentionScoreGetWorkspaceSize failed with " + std::to_string(planned));
      void* workspace = workspace_bytes ? scratch.alloc(workspace_bytes) : nullptr;
      const aclnnStatus ran = aclnnFusedInferAttentionScore(workspace, workspace_bytes, executor, stream);
      if (ran != 0) in.fail("aclnnFusedInferAttentionScore failed with " + std::to_string(ran));
      aclDestroyTensor(query);
      aclDestroyTensor(out);
      aclDestroyTensor(block_table);
      aclDestroyIntArray(kv_lengths);
    }
    if (S > 1) {
      for (int64_t bn = 0; bn < B * N; ++bn) {  // [S, G, D] of (b, n) -> output [B, S, H*D] at head n*G
        const int64_t b = bn / N, n = bn % N;
        check_acl(aclrtMemcpy2dAsync(static_cast<char*>(output) + (b * S * H + n * G) * D * elem_bytes,
                                     H * D * elem_bytes, static_cast<const char*>(fia_out) + bn * S * G * D * elem_bytes,
                                     G * D * elem_bytes, G * D * elem_bytes, S, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
                  "scattering the attention rows");
      }
    }
    for (int64_t r = 0; r < rows.rows; ++r) {  // padded positions and empty selections attend nothing
      if (!rows.zero_output[r]) continue;
      const int64_t b = r / (N * S), n = r / S % N, s = r % S;
      check_acl(aclrtMemsetAsync(static_cast<char*>(output) + ((b * S + s) * H + n * G) * D * elem_bytes,
                                 G * D * elem_bytes, 0, G * D * elem_bytes, stream),
                "zeroing rows that attend nothing");
    }
    aclDestroyTensorList(keys);
    aclDestroyTensorList(values);
  }

 private:
  Attributes attributes_;
};

constexpr ONNXTensorElementDataType kFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kHalf = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;

}  // namespace

void add_cann_ops(Ort::CustomOpDomain& domain) {
  // bfloat16 kernels exist (kernels/*.cpp) but the op schema admits float32 and float16 only.
  static QuestCustomOp<CannMetadataKernel, CannPlacement> metadata[] = {
      {kFloat, kFloat}, {kFloat, kHalf}, {kHalf, kFloat}, {kHalf, kHalf}};
  static QuestCustomOp<CannSelectKernel, CannPlacement> select[] = {
      {kFloat, kFloat}, {kFloat, kHalf}, {kHalf, kFloat}, {kHalf, kHalf}};
  static QuestCustomOp<CannAttentionKernel, CannPlacement> attention[] = {{kHalf, kHalf}};
  for (auto& op : metadata) domain.Add(&op);
  for (auto& op : select) domain.Add(&op);
  for (auto& op : attention) domain.Add(&op);
}

}  // namespace quest::ort
