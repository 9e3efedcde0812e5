// The library's entry points: RegisterCustomOps for ORT, and two introspection symbols for tests.
#include <climits>
#include <mutex>

#include "../kernels/dispatch.h"
#include "adapter.h"
#include "ops.h"
#ifdef QUEST_ORT_WITH_CANN
#include "../cann/ort/cann_ops.h"  // libquest_ort_cann.so registers its NPU kernels as well
#endif

namespace quest::ort {

void check_head_grouping(const schema::OpSchema& op, const Attributes& attributes) {
  const int64_t H = attributes.get_int("num_heads"), N = attributes.get_int("kv_num_heads");
  if (H % N != 0)
    throw OpError(op, "attribute 'num_heads' = " + std::to_string(H) + " is not a multiple of 'kv_num_heads' = " +
                          std::to_string(N));
}

int64_t saturating_mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > INT32_MAX / b ? INT32_MAX : a * b;
}

namespace {

constexpr ONNXTensorElementDataType kFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kHalf = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kInt8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;

// One registration per (activation T, cache TC) pair; ORT picks the one matching the node. The
// int8 pairs only for an op whose schema lets TC be int8.
template <typename Kernel>
void add_variants(Ort::CustomOpDomain& domain) {
  static QuestCustomOp<Kernel> variants[] = {{kFloat, kFloat}, {kFloat, kHalf}, {kHalf, kFloat},
                                             {kHalf, kHalf},   {kFloat, kInt8}, {kHalf, kInt8}};
  for (auto& variant : variants)
    if (Kernel::schema().int8_cache || variant.cache_type() != kInt8) domain.Add(&variant);
}

}  // namespace

void add_cpu_ops(Ort::CustomOpDomain& domain) {
  add_variants<QuestMetadataKernel>(domain);
  add_variants<SparseBlockSelectKernel>(domain);
  add_variants<SparseBlockAttentionKernel>(domain);
}

}  // namespace quest::ort

extern "C" {

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) return nullptr;  // an ORT older than the headers: nothing can be reported
  Ort::InitApi(api);
  try {
    // One domain object for the process: ORT keeps pointers to it for every session.
    static std::once_flag once;
    static Ort::CustomOpDomain* domain = nullptr;
    std::call_once(once, [] {
      domain = new Ort::CustomOpDomain(quest::schema::kDomain);
      quest::ort::add_cpu_ops(*domain);
#ifdef QUEST_ORT_WITH_CANN
      quest::ort::add_cann_ops(*domain);
#endif
    });
    Ort::UnownedSessionOptions(options).Add(*domain);
    return nullptr;
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
}

// Comma-separated names of the ops this library registers (the schema coverage test reads it).
__attribute__((visibility("default"))) const char* QuestOrtOpNames() {
  static const std::string names = [] {
    std::string joined;
    for (const quest::schema::OpSchema* op :
         {&quest::ort::QuestMetadataKernel::schema(), &quest::ort::SparseBlockSelectKernel::schema(),
          &quest::ort::SparseBlockAttentionKernel::schema()})
      joined += std::string(joined.empty() ? "" : ",") + op->name;
    return joined;
  }();
  return names.c_str();
}

// Bytes of cache or metadata copied because an output was not bound to its input's buffer.
__attribute__((visibility("default"))) uint64_t QuestOrtCopiedBytes() { return quest::ort::copied_bytes().load(); }

// The kernel variant in use on this CPU ("avx512vnni", "avx512", "avx2", "neon" or "scalar").
__attribute__((visibility("default"))) const char* QuestOrtKernelIsa() { return quest::active_kernels().isa; }

// Streams `count` floats with the active variant (the benchmarks' read-bandwidth probe).
__attribute__((visibility("default"))) float QuestOrtReadProbe(const float* data, int64_t count) {
  return quest::active_kernels().read_probe(data, count);
}

// Comma-separated variants this CPU can run, best first (QUEST_ORT_ISA picks among them).
__attribute__((visibility("default"))) const char* QuestOrtSupportedIsas() {
  static const std::string names = [] {
    std::string joined;
    for (const quest::KernelTable* table : quest::supported_kernels())
      joined += std::string(joined.empty() ? "" : ",") + table->isa;
    return joined;
  }();
  return names.c_str();
}
}
