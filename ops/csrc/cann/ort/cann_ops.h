// The registration of the Quest ops' NPU kernels (cann_ops.cc), in libquest_ort_cann.so only.
#pragma once

namespace Ort {
struct CustomOpDomain;  // onnxruntime_cxx_api.h
}

namespace quest::ort {

// Adds the CANNExecutionProvider kernel of every op to `domain`, next to the CPU ones.
void add_cann_ops(Ort::CustomOpDomain& domain);

}  // namespace quest::ort
