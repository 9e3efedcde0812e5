// The thin ORT layer shared by every op: schema-driven attribute and input validation, output
// allocation, ORT's thread pool, error conversion, and the registration template.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/types.h"
#include "quest_schemas.gen.h"

namespace quest::ort {

// A validation failure; becomes an ORT_INVALID_ARGUMENT status naming the op and the input.
class OpError : public std::runtime_error {
 public:
  OpError(const schema::OpSchema& op, const std::string& message)
      : std::runtime_error(std::string(op.name) + ": " + message) {}
};

std::string format_shape(const std::vector<int64_t>& shape);

// The op's attributes, read once per kernel, defaulted and range-checked against the schema.
class Attributes {
 public:
  Attributes(const schema::OpSchema& op, const OrtKernelInfo* info);
  int64_t get_int(const char* name) const { return ints_.at(name); }
  float get_float(const char* name) const { return floats_.at(name); }
  const std::string& get_string(const char* name) const { return strings_.at(name); }

 private:
  std::map<std::string, int64_t> ints_;
  std::map<std::string, float> floats_;
  std::map<std::string, std::string> strings_;
};

struct TensorArg {
  const OrtValue* value = nullptr;  // null when an optional input is absent
  std::vector<int64_t> shape;
  const void* data = nullptr;
  bool present() const { return value != nullptr; }
  template <typename V>
  const V* as() const { return static_cast<const V*>(data); }
};

// Every input checked against the schema: presence, element type, rank, and dims that agree with
// each other and with the attributes. Dim symbols (B, N, S, ...) are then looked up by name.
class BoundInputs {
 public:
  BoundInputs(const schema::OpSchema& op, OrtKernelContext* context, const Attributes& attributes);
  const TensorArg& operator[](int index) const { return inputs_[index]; }
  int64_t dim(const char* symbol) const { return dims_.at(symbol); }
  DType activation_type() const { return type_vars_.at("T"); }
  DType cache_type() const { return type_vars_.at("TC"); }
  // Bytes of a tensor of `spec`'s element type (T and TC as bound by the inputs) and `shape`.
  size_t byte_size(const schema::TensorSpec& spec, const std::vector<int64_t>& shape) const;
  const schema::OpSchema& op() const { return op_; }
  // The shape of output `index` from its dim symbols.
  std::vector<int64_t> output_shape(int index) const;
  [[noreturn]] void fail(const std::string& message) const { throw OpError(op_, message); }

 private:
  void bind_dim(const char* symbol, int64_t value, const std::string& origin);
  const schema::OpSchema& op_;
  std::vector<TensorArg> inputs_;
  std::map<std::string, int64_t> dims_;
  std::map<std::string, std::string> dim_origins_;
  std::map<std::string, DType> type_vars_;
  std::map<std::string, std::string> type_origins_;
};

// Resolves and validates the per-row lengths of a call against `limit` tokens (capacity C for
// the attention, M * P for the metadata ops). Returns total_lens (default past_lens + S).
std::vector<int32_t> resolve_total_lens(const BoundInputs& in, int past_index, int total_index,
                                        int64_t new_tokens, int64_t limit, const char* limit_name);

// int8 block bounds come with their exponents, float bounds with none: input `input`
// (block_exponent) is required with TC = int8 and refused otherwise, and so is output `output`
// (QuestMetadata's block_exponent_out; kNoOutput for an op without it) when the node has it.
inline constexpr int kNoOutput = -1;
void check_block_exponent(const BoundInputs& in, int input, int output = kNoOutput,
                          const std::vector<bool>& outputs = {});

// Validates the optional exact_lens (0 <= exact_lens[b] <= total[b], the resolved total_lens);
// returns its data, or null when it is absent. chunk_lens takes the same rule.
const int32_t* check_exact_lens(const BoundInputs& in, int exact_index, const std::vector<int32_t>& total);

// Which outputs a node has, by index: an optional output the node leaves out (an empty name, or
// past its last output) is absent.
std::vector<bool> node_outputs(const OrtKernelInfo* info);

// Allocates output `index` with its schema shape; returns its data pointer.
void* allocate_output(OrtKernelContext* context, const BoundInputs& in, int index);

// The outputs of one call, allocated with their schema shapes. With IOBinding an output may be
// memory the caller chose, and the kernels read their inputs while they write their outputs: so
// an output that shares a byte with any input, or with another output, is refused (OpError naming
// the op and both tensors), except an output bound to exactly its in-place input's buffer (same
// start, same size), which the kernels update in place. Allocate every output before writing any:
// a refused binding then leaves every buffer as it was.
class BoundOutputs {
 public:
  static constexpr int kNoAlias = -1;
  BoundOutputs(OrtKernelContext* context, const BoundInputs& in) : context_(context), in_(in) {}
  // Allocates output `index`; `alias` is the input it may share exactly (in place), or kNoAlias.
  void* allocate(int index, int alias = kNoAlias);

 private:
  struct Bytes {
    int index;
    uintptr_t begin, end;  // [begin, end); empty tensors overlap nothing
  };
  OrtKernelContext* context_;
  const BoundInputs& in_;
  std::vector<Bytes> allocated_;
};

// True when the output buffer is bound to the same memory as the input (IOBinding in place).
// Otherwise copies the input into the output first, so the kernels always update in place (the
// two never overlap: BoundOutputs refused that).
bool prepare_in_place(const BoundInputs& in, int index, void* output);
// Bytes copied by prepare_in_place since the library loaded (tests prove in-place steps copy 0).
std::atomic<uint64_t>& copied_bytes();

// Runs fn(item) for item in [0, total) on ORT's intra-op thread pool, each item taken by the next
// free thread. Items must be independent.
void parallel_for(OrtKernelContext* context, int64_t total, const std::function<void(int64_t)>& fn);

size_t element_size(DType dtype);

// Where a kernel class runs: the execution provider it registers for (null: the CPU) and which
// inputs ORT hands it in host memory. The CANN library (ops/csrc/cann/ort) has its own.
struct CpuPlacement {
  static const char* execution_provider() { return nullptr; }
  static bool host_input(const schema::OpSchema&, size_t) { return false; }
};

// One ORT custom op of a kernel class for one (activation, cache) dtype pair.
// The kernel class provides: Kernel(const OrtKernelInfo*) and void Compute(OrtKernelContext*),
// and a static `schema()` returning its generated schema.
template <typename Kernel, typename Placement = CpuPlacement>
struct QuestCustomOp : Ort::CustomOpBase<QuestCustomOp<Kernel, Placement>, Kernel, true> {
  QuestCustomOp(ONNXTensorElementDataType activation, ONNXTensorElementDataType cache)
      : activation_(activation), cache_(cache) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
    }
  }
  const char* GetName() const { return Kernel::schema().name; }
  ONNXTensorElementDataType cache_type() const { return cache_; }
  const char* GetExecutionProviderType() const { return Placement::execution_provider(); }
  OrtMemType GetInputMemoryType(size_t i) const {
    return Placement::host_input(Kernel::schema(), i) ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  }
  size_t GetInputTypeCount() const { return Kernel::schema().num_inputs; }
  size_t GetOutputTypeCount() const { return Kernel::schema().num_outputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return resolve(Kernel::schema().inputs[i].elem); }
  ONNXTensorElementDataType GetOutputType(size_t i) const { return resolve(Kernel::schema().outputs[i].elem); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return Kernel::schema().inputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return Kernel::schema().outputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }

 private:
  ONNXTensorElementDataType resolve(schema::Elem elem) const {
    switch (elem) {
      case schema::Elem::T: return activation_;
      case schema::Elem::TC: return cache_;
      case schema::Elem::Int32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
      case schema::Elem::Int8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
      case schema::Elem::Float32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
      case schema::Elem::Float16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    }
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
  ONNXTensorElementDataType activation_, cache_;
};

// Turns exceptions from a kernel's Compute into an ORT status.
OrtStatusPtr status_from_current_exception();

template <typename Kernel>
struct KernelBase {
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    try {
      static_cast<Kernel*>(this)->Compute(context);
      return nullptr;
    } catch (...) {
      return status_from_current_exception();
    }
  }
};

}  // namespace quest::ort
