// Chooses the kernel variant once per process, from the CPU's features and QUEST_ORT_ISA.
#include "dispatch.h"

#include <cstdlib>
#include <cstring>

namespace quest {

#if defined(__x86_64__) || defined(_M_X64)
const KernelTable& avx512vnni_kernels();
const KernelTable& avx512_kernels();
const KernelTable& avx2_kernels();
#elif defined(__aarch64__)
const KernelTable& neon_kernels();
#endif

namespace {
float read_probe_scalar(const float* data, int64_t count) {
  float a = 0.0f, b = 0.0f, c = 0.0f, d = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) a += data[i], b += data[i + 1], c += data[i + 2], d += data[i + 3];
  for (; i < count; ++i) a += data[i];
  return (a + b) + (c + d);
}
}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{"scalar", quest_metadata_scalar, sparse_block_select_scalar,
                                 write_cache_tokens_scalar, sparse_block_attention_scalar, read_probe_scalar};
  return table;
}

std::vector<const KernelTable*> supported_kernels() {
  std::vector<const KernelTable*> tables;
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  // F16C for float16 storage; FMA3 for the attention's fused multiply-adds (every AVX2 CPU has it,
  // but it is a feature bit of its own).
  const bool f16c_fma = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  // VNNI (with AVX512BW's byte loads) only changes how int8 bounds are scored: a variant of its own
  // so that QUEST_ORT_ISA=avx512 still runs (and tests compare) the float scoring of the codes.
  const bool avx512 = __builtin_cpu_supports("avx512f") && f16c_fma;
  if (avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
    tables.push_back(&avx512vnni_kernels());
  if (avx512) tables.push_back(&avx512_kernels());
  if (__builtin_cpu_supports("avx2") && f16c_fma) tables.push_back(&avx2_kernels());
#elif defined(__aarch64__)
  tables.push_back(&neon_kernels());  // NEON is part of every AArch64 CPU
#endif
  tables.push_back(&scalar_kernels());
  return tables;
}

const KernelTable& active_kernels() {
  static const KernelTable& table = []() -> const KernelTable& {
    const std::vector<const KernelTable*> tables = supported_kernels();
    const char* requested = std::getenv("QUEST_ORT_ISA");
    if (requested != nullptr)
      for (const KernelTable* candidate : tables)
        if (std::strcmp(candidate->isa, requested) == 0) return *candidate;
    return *tables.front();
  }();
  return table;
}

}  // namespace quest
