// Schema-driven validation and the plumbing between ORT and the framework-free kernels.
#include "adapter.h"

#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>

namespace quest::ort {
namespace {

const OrtApi& api() { return Ort::GetApi(); }

// Reads one attribute through the C API; false when the node does not set it.
bool read_int(const OrtKernelInfo* info, const char* name, int64_t* out) {
  OrtStatus* status = api().KernelInfoGetAttribute_int64(info, name, out);
  if (status == nullptr) return true;
  api().ReleaseStatus(status);
  return false;
}

bool read_float(const OrtKernelInfo* info, const char* name, float* out) {
  OrtStatus* status = api().KernelInfoGetAttribute_float(info, name, out);
  if (status == nullptr) return true;
  api().ReleaseStatus(status);
  return false;
}

bool read_string(const OrtKernelInfo* info, const char* name, std::string* out) {
  size_t size = 0;
  OrtStatus* status = api().KernelInfoGetAttribute_string(info, name, nullptr, &size);
  if (status != nullptr) {
    api().ReleaseStatus(status);
    return false;
  }
  std::string value(size, '\0');
  status = api().KernelInfoGetAttribute_string(info, name, value.data(), &size);
  if (status != nullptr) {
    api().ReleaseStatus(status);
    return false;
  }
  value.resize(size > 0 ? size - 1 : 0);  // drop the terminating NUL
  *out = value;
  return true;
}

const char* elem_name(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    default: return "an unsupported type";
  }
}

const char* dtype_name(DType dtype) {
  return dtype == DType::F32 ? "float32" : dtype == DType::F16 ? "float16" : "int8";
}

std::string spec_dims(const schema::TensorSpec& spec) {
  std::string text = "[";
  for (int d = 0; d < spec.rank; ++d) text += std::string(d ? ", " : "") + spec.dims[d];
  return text + "]";
}

// True when the node sets `name` with some attribute kind other than `kind`.
bool set_with_other_kind(const OrtKernelInfo* info, const char* name, schema::AttrKind kind) {
  int64_t i;
  float f;
  std::string s;
  return (kind != schema::AttrKind::Int && read_int(info, name, &i)) ||
         (kind != schema::AttrKind::Float && read_float(info, name, &f)) ||
         (kind != schema::AttrKind::String && read_string(info, name, &s));
}

const char* kind_name(schema::AttrKind kind) {
  return kind == schema::AttrKind::Int ? "an int" : kind == schema::AttrKind::Float ? "a float" : "a string";
}

}  // namespace

std::string format_shape(const std::vector<int64_t>& shape) {
  std::ostringstream text;
  text << "[";
  for (size_t d = 0; d < shape.size(); ++d) text << (d ? ", " : "") << shape[d];
  text << "]";
  return text.str();
}

size_t element_size(DType dtype) { return dtype == DType::F32 ? 4 : dtype == DType::F16 ? 2 : 1; }

Attributes::Attributes(const schema::OpSchema& op, const OrtKernelInfo* info) {
  for (int a = 0; a < op.num_attributes; ++a) {
    const schema::AttrSpec& spec = op.attributes[a];
    if (set_with_other_kind(info, spec.name, spec.kind))
      throw OpError(op, std::string("attribute '") + spec.name + "' must be " + kind_name(spec.kind));
    double numeric = 0.0;
    switch (spec.kind) {
      case schema::AttrKind::Int: {
        int64_t value = spec.int_default;
        if (!read_int(info, spec.name, &value) && spec.required)
          throw OpError(op, std::string("attribute '") + spec.name + "' is required");
        // The kernels' params hold int32 sizes: a wider value must not wrap around silently.
        if (value < INT32_MIN || value > INT32_MAX)
          throw OpError(op, std::string("attribute '") + spec.name + "' = " + std::to_string(value) +
                                " does not fit in int32");
        ints_[spec.name] = value;
        numeric = static_cast<double>(value);
        break;
      }
      case schema::AttrKind::Float: {
        float value = static_cast<float>(spec.float_default);
        if (!read_float(info, spec.name, &value) && spec.required)
          throw OpError(op, std::string("attribute '") + spec.name + "' is required");
        floats_[spec.name] = value;
        numeric = static_cast<double>(value);
        if (!(value == value)) throw OpError(op, std::string("attribute '") + spec.name + "' is NaN");
        break;
      }
      case schema::AttrKind::String: {
        std::string value = spec.string_default ? spec.string_default : "";
        if (!read_string(info, spec.name, &value) && spec.required)
          throw OpError(op, std::string("attribute '") + spec.name + "' is required");
        bool allowed = spec.num_choices == 0;
        std::string choices;
        for (int c = 0; c < spec.num_choices; ++c) {
          allowed = allowed || value == spec.choices[c];
          choices += std::string(c ? ", " : "") + "'" + spec.choices[c] + "'";
        }
        if (!allowed)
          throw OpError(op, std::string("attribute '") + spec.name + "' is '" + value + "'; expected one of " + choices);
        strings_[spec.name] = value;
        continue;
      }
    }
    std::ostringstream bound;
    if (spec.has_minimum && numeric < spec.minimum) bound << ">= " << spec.minimum;
    if (spec.has_maximum && numeric > spec.maximum) bound << "<= " << spec.maximum;
    if (!bound.str().empty())
      throw OpError(op, std::string("attribute '") + spec.name + "' must be " + bound.str() + ", got " +
                            (spec.kind == schema::AttrKind::Int ? std::to_string(static_cast<int64_t>(numeric))
                                                                : std::to_string(numeric)));
  }
}

void BoundInputs::bind_dim(const char* symbol, int64_t value, const std::string& origin) {
  auto found = dims_.find(symbol);
  if (found == dims_.end()) {
    dims_[symbol] = value;
    dim_origins_[symbol] = origin;
  } else if (found->second != value) {
    std::ostringstream message;
    message << origin << " gives " << symbol << " = " << value << ", but " << dim_origins_[symbol] << " gives "
            << symbol << " = " << found->second;
    fail(message.str());
  }
}

BoundInputs::BoundInputs(const schema::OpSchema& op, OrtKernelContext* context, const Attributes& attributes)
    : op_(op), inputs_(op.num_inputs) {
  for (int s = 0; s < op.num_symbol_attrs; ++s) {
    const schema::SymbolAttr& bound = op.symbol_attrs[s];
    bind_dim(bound.symbol, attributes.get_int(bound.attribute), std::string("attribute '") + bound.attribute + "'");
  }
  Ort::KernelContext ctx(context);
  const size_t provided = ctx.GetInputCount();
  for (int i = 0; i < op.num_inputs; ++i) {
    const schema::TensorSpec& spec = op.inputs[i];
    TensorArg& arg = inputs_[i];
    if (static_cast<size_t>(i) < provided) arg.value = static_cast<const OrtValue*>(ctx.GetInput(i));
    if (!arg.present()) {
      if (!spec.optional) fail(std::string("required input '") + spec.name + "' is missing");
      continue;
    }
    Ort::ConstValue value(arg.value);
    if (!value.IsTensor()) fail(std::string("input '") + spec.name + "' must be a tensor");
    const auto info = value.GetTensorTypeAndShapeInfo();
    const ONNXTensorElementDataType type = info.GetElementType();
    arg.shape = info.GetShape();
    arg.data = value.GetTensorRawData();
    const std::string where = std::string("input '") + spec.name + "'";
    switch (spec.elem) {
      case schema::Elem::Int32:
      case schema::Elem::Int8:
      case schema::Elem::Float32:
      case schema::Elem::Float16: {
        const auto want = spec.elem == schema::Elem::Int32     ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
                          : spec.elem == schema::Elem::Int8    ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8
                          : spec.elem == schema::Elem::Float32 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
                                                               : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
        if (type != want) fail(where + " has element type " + elem_name(type) + "; expected " + elem_name(want));
        break;
      }
      case schema::Elem::T:
      case schema::Elem::TC: {
        const char* var = spec.elem == schema::Elem::T ? "T" : "TC";
        const bool int8 = spec.elem == schema::Elem::TC && op.int8_cache;
        if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
            !(int8 && type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8))
          fail(where + " has element type " + elem_name(type) + "; expected float32" +
               (int8 ? ", float16 or int8" : " or float16"));
        const DType dtype = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT     ? DType::F32
                            : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? DType::F16
                                                                            : DType::I8;
        auto found = type_vars_.find(var);
        if (found == type_vars_.end()) {
          type_vars_[var] = dtype;
          type_origins_[var] = where;
        } else if (found->second != dtype) {
          fail(where + " has element type " + dtype_name(dtype) + ", but " + type_origins_[var] + " has " +
               dtype_name(found->second) + " (both are type " + var + ")");
        }
        break;
      }
    }
    if (static_cast<int>(arg.shape.size()) != spec.rank)
      fail(where + " must have rank " + std::to_string(spec.rank) + " " + spec_dims(spec) + ", got shape " +
           format_shape(arg.shape));
    for (int d = 0; d < spec.rank; ++d)
      bind_dim(spec.dims[d], arg.shape[d], where + " dim " + std::to_string(d));
  }
  // Every op multiplies over the head dim; an empty head has no meaning (and would divide by zero
  // in tiling plans), so it is refused here, for every adapter.
  if (const auto head_dim = dims_.find("D"); head_dim != dims_.end() && head_dim->second < 1)
    fail(dim_origins_.at("D") + " (D) must be positive");
  for (int k = 0; k < op.num_derived; ++k) {
    const schema::DerivedSpec& derived = op.derived[k];
    const int64_t a = dims_.at(derived.a), b = dims_.at(derived.b);
    int64_t value = 0;
    switch (derived.kind) {
      case schema::DerivedKind::Product: value = a * b; break;
      case schema::DerivedKind::CeilDiv: value = (a + b - 1) / b; break;
      case schema::DerivedKind::Pick: value = attributes.get_string(derived.when) == derived.value ? b : a; break;
    }
    // A derived symbol an input holds (SparseBlockSelect's MS) must be what its formula gives.
    if (const auto bound = dims_.find(derived.name); bound != dims_.end() && bound->second != value)
      fail(dim_origins_.at(derived.name) + " is " + std::to_string(bound->second) + ", but " + derived.name + " = " +
           (derived.kind == schema::DerivedKind::Product   ? std::string(derived.a) + "*" + derived.b
            : derived.kind == schema::DerivedKind::CeilDiv ? "ceil(" + std::string(derived.a) + "/" + derived.b + ")"
                                                           : std::string(derived.a) + " or " + derived.b) +
           " = " + std::to_string(value));
    dims_[derived.name] = value;
  }
}

std::vector<int64_t> BoundInputs::output_shape(int index) const {
  const schema::TensorSpec& spec = op_.outputs[index];
  std::vector<int64_t> shape(spec.rank);
  for (int d = 0; d < spec.rank; ++d) shape[d] = dims_.at(spec.dims[d]);
  return shape;
}

std::vector<int32_t> resolve_total_lens(const BoundInputs& in, int past_index, int total_index, int64_t new_tokens,
                                        int64_t limit, const char* limit_name) {
  const int64_t B = in.dim("B");
  const int32_t* past = in[past_index].as<int32_t>();
  const int32_t* given = in[total_index].present() ? in[total_index].as<int32_t>() : nullptr;
  std::vector<int32_t> total(B);
  for (int64_t b = 0; b < B; ++b) {
    std::string row = "[";  // built stepwise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string
    row += std::to_string(b);
    row += "]";
    if (past[b] < 0) in.fail("input 'past_lens'" + row + " = " + std::to_string(past[b]) + " is negative");
    const int64_t value = given ? given[b] : static_cast<int64_t>(past[b]) + new_tokens;
    if (given && value < past[b])
      in.fail("input 'total_lens'" + row + " = " + std::to_string(value) + " is less than past_lens" + row + " = " +
              std::to_string(past[b]));
    if (given && value > past[b] + new_tokens)
      in.fail("input 'total_lens'" + row + " = " + std::to_string(value) + " exceeds past_lens" + row + " + S = " +
              std::to_string(past[b] + new_tokens));
    if (value > limit)
      in.fail(std::string(given ? "input 'total_lens'" : "input 'past_lens'") + row + (given ? " = " : " + S = ") +
              std::to_string(value) + " exceeds " + limit_name + " = " + std::to_string(limit));
    total[b] = static_cast<int32_t>(value);
  }
  return total;
}

void check_block_exponent(const BoundInputs& in, int input, int output, const std::vector<bool>& outputs) {
  const bool int8 = in.cache_type() == DType::I8;
  const std::string name = in.op().inputs[input].name;
  if (int8 && !in[input].present())
    in.fail("input '" + name + "' is required with int8 bounds (each block's power of two: a bound is code * 2^e)");
  if (!int8 && in[input].present())
    in.fail("input '" + name + "' is given, but the bounds are " + dtype_name(in.cache_type()) +
            ": exponents belong to int8 bounds only");
  if (output == kNoOutput) return;
  const std::string output_name = in.op().outputs[output].name;
  const bool bound = static_cast<size_t>(output) < outputs.size() && outputs[output];
  if (int8 && !bound) in.fail("output '" + output_name + "' is required with int8 bounds (the blocks' new exponents)");
  if (!int8 && bound) in.fail("output '" + output_name + "' is bound, but the bounds are not int8: leave it out");
}

const int32_t* check_exact_lens(const BoundInputs& in, int exact_index, const std::vector<int32_t>& total) {
  if (!in[exact_index].present()) return nullptr;
  const int32_t* exact = in[exact_index].as<int32_t>();
  for (size_t b = 0; b < total.size(); ++b) {
    if (exact[b] < 0 || exact[b] > total[b]) {
      std::string row = "[";
      row += std::to_string(b);
      row += "]";
      in.fail(std::string("input '") + in.op().inputs[exact_index].name + "'" + row + " = " + std::to_string(exact[b]) + " is outside [0, total_lens" + row +
              " = " + std::to_string(total[b]) + "]");
    }
  }
  return exact;
}

std::vector<bool> node_outputs(const OrtKernelInfo* info) {
  Ort::ConstKernelInfo kernel_info(info);
  std::vector<bool> present(kernel_info.GetOutputCount());
  for (size_t i = 0; i < present.size(); ++i) present[i] = !kernel_info.GetOutputName(i).empty();
  return present;
}

void* allocate_output(OrtKernelContext* context, const BoundInputs& in, int index) {
  Ort::KernelContext ctx(context);
  const std::vector<int64_t> shape = in.output_shape(index);
  return ctx.GetOutput(index, shape.data(), shape.size()).GetTensorMutableRawData();
}

size_t BoundInputs::byte_size(const schema::TensorSpec& spec, const std::vector<int64_t>& shape) const {
  size_t bytes = spec.elem == schema::Elem::T       ? element_size(activation_type())
                 : spec.elem == schema::Elem::TC      ? element_size(cache_type())
                 : spec.elem == schema::Elem::Float16 ? 2
                 : spec.elem == schema::Elem::Int8    ? 1
                                                      : 4;  // int32, float32
  // Zero first: the other dims of an empty tensor may multiply past size_t (2^31 - 1 heads at S = 0).
  for (int64_t extent : shape)
    if (extent == 0) return 0;
  for (int64_t extent : shape) bytes *= static_cast<size_t>(extent);
  return bytes;
}

namespace {
bool overlap(uintptr_t begin_a, uintptr_t end_a, uintptr_t begin_b, uintptr_t end_b) {
  return begin_a < end_b && begin_b < end_a;
}
}  // namespace

void* BoundOutputs::allocate(int index, int alias) {
  void* data = allocate_output(context_, in_, index);
  const schema::OpSchema& op = in_.op();
  const char* name = op.outputs[index].name;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + in_.byte_size(op.outputs[index], in_.output_shape(index));
  for (int i = 0; i < op.num_inputs; ++i) {
    const TensorArg& input = in_[i];
    if (!input.present()) continue;
    const auto input_begin = reinterpret_cast<uintptr_t>(input.data);
    const uintptr_t input_end = input_begin + in_.byte_size(op.inputs[i], input.shape);
    if (!overlap(begin, end, input_begin, input_end)) continue;
    if (i == alias && begin == input_begin && end == input_end) continue;  // in place
    const std::string output = std::string("output '") + name + "'";
    const std::string input_name = std::string("input '") + op.inputs[i].name + "'";
    if (i == alias)
      in_.fail(output + " partly overlaps its " + input_name + ": bind it to exactly that buffer (in place) or to " +
               "memory of its own");
    in_.fail(output + " overlaps " + input_name + ": bind it to memory of its own" +
             (alias == kNoAlias ? std::string()
                                : std::string(", or in place to exactly the buffer of input '") + op.inputs[alias].name +
                                      "'"));
  }
  for (const Bytes& other : allocated_)
    if (overlap(begin, end, other.begin, other.end))
      in_.fail(std::string("outputs '") + op.outputs[other.index].name + "' and '" + name +
               "' overlap: bind them to separate memory");
  allocated_.push_back({index, begin, end});
  return data;
}

std::atomic<uint64_t>& copied_bytes() {
  static std::atomic<uint64_t> counter{0};
  return counter;
}

bool prepare_in_place(const BoundInputs& in, int index, void* output) {
  const TensorArg& input = in[index];
  if (input.data == output) return true;
  const size_t bytes = in.byte_size(in.op().inputs[index], input.shape);
  if (bytes > 0) std::memcpy(output, input.data, bytes);
  copied_bytes() += bytes;
  return false;
}

namespace {
struct ParallelJob {
  const std::function<void(int64_t)>* fn;
  std::mutex lock;
  std::exception_ptr error;  // the first failure; items are independent, the rest still run
};
void run_item(void* job_ptr, size_t item) {
  auto* job = static_cast<ParallelJob*>(job_ptr);
  try {
    (*job->fn)(static_cast<int64_t>(item));
  } catch (...) {
    std::lock_guard<std::mutex> guard(job->lock);
    if (!job->error) job->error = std::current_exception();
  }
}
}  // namespace

void parallel_for(OrtKernelContext* context, int64_t total, const std::function<void(int64_t)>& fn) {
  if (total <= 0) return;
  ParallelJob job;
  job.fn = &fn;
  if (total == 1) {
    run_item(&job, 0);
  } else {
    // One batch per item: ORT's pool then hands them out one at a time to whichever thread is free
    // (with fewer batches it splits the range in equal parts up front, however uneven the items).
    Ort::ThrowOnError(api().KernelContext_ParallelFor(context, run_item, static_cast<size_t>(total),
                                                      static_cast<size_t>(total), &job));
  }
  if (job.error) std::rethrow_exception(job.error);
}

OrtStatusPtr status_from_current_exception() {
  try {
    throw;
  } catch (const OpError& e) {
    return api().CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  } catch (const Ort::Exception& e) {
    return api().CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return api().CreateStatus(ORT_FAIL, e.what());
  } catch (...) {
    return api().CreateStatus(ORT_FAIL, "unknown error");
  }
}

}  // namespace quest::ort
