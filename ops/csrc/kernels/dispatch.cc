// Chooses the kernel variant once per process, from the CPU's features and QUEST_ORT_ISA.
#include "dispatch.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace quest {

#if defined(__x86_64__) || defined(_M_X64)
const KernelTable& avx512vnni_kernels();
const KernelTable& avx512_kernels();
const KernelTable& avx2_kernels();
#elif defined(__aarch64__)
const KernelTable& neon_kernels();
#endif

namespace {
#if defined(__x86_64__) || defined(_M_X64)
// The CPU's features from CPUID, and whether the OS saves the registers they use (XCR0). Not
// __builtin_cpu_supports: that reads a table libgcc fills at start, and the wheels' toolchain (zig's
// compiler-rt) leaves it empty, so every CPU looked scalar.
struct X86Features {
  bool avx2 = false, fma = false, f16c = false, avx512f = false, avx512bw = false, avx512vnni = false;
};

X86Features x86_features() {
  X86Features features;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return features;
  const bool osxsave = (ecx >> 27) & 1u, avx = (ecx >> 28) & 1u;
  if (!osxsave || !avx) return features;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0u));
  const bool ymm_saved = (xcr0_low & 0x6u) == 0x6u;             // SSE and AVX state
  const bool zmm_saved = ymm_saved && (xcr0_low & 0xE0u) == 0xE0u;  // opmask, upper ZMM0-15, ZMM16-31
  if (!ymm_saved) return features;
  features.fma = (ecx >> 12) & 1u;
  features.f16c = (ecx >> 29) & 1u;
  unsigned leaf7_ebx = 0, leaf7_ecx = 0;
  if (__get_cpuid_count(7, 0, &eax, &leaf7_ebx, &leaf7_ecx, &edx)) {
    features.avx2 = (leaf7_ebx >> 5) & 1u;
    features.avx512f = zmm_saved && ((leaf7_ebx >> 16) & 1u);
    features.avx512bw = zmm_saved && ((leaf7_ebx >> 30) & 1u);
    features.avx512vnni = zmm_saved && ((leaf7_ecx >> 11) & 1u);
  }
  return features;
}
#endif

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
  const X86Features cpu = x86_features();
  // F16C for float16 storage; FMA3 for the attention's fused multiply-adds (every AVX2 CPU has it,
  // but it is a feature bit of its own).
  const bool f16c_fma = cpu.f16c && cpu.fma;
  // VNNI (with AVX512BW's byte loads) only changes how int8 bounds are scored: a variant of its own
  // so that QUEST_ORT_ISA=avx512 still runs (and tests compare) the float scoring of the codes.
  const bool avx512 = cpu.avx512f && f16c_fma;
  if (avx512 && cpu.avx512bw && cpu.avx512vnni) tables.push_back(&avx512vnni_kernels());
  if (avx512) tables.push_back(&avx512_kernels());
  if (cpu.avx2 && f16c_fma) tables.push_back(&avx2_kernels());
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
