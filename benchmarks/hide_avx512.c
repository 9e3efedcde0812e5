// An LD_PRELOAD library that hides AVX-512 (and AMX) from `cpuid`, so that this package and ONNX
// Runtime's MLAS both choose their AVX2 kernels on an AVX-512 machine (make bench-prefill-step-avx2).
//
// It turns on CPUID faulting (arch_prctl ARCH_SET_CPUID 0; Linux on CPUs that support it), so every
// `cpuid` raises SIGSEGV; the handler runs the real instruction with faulting briefly off, clears the
// AVX-512/AMX feature bits of leaf 7 and steps over the instruction. Any other SIGSEGV falls through
// to the default action. Where faulting is unavailable it says so and hides nothing.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static void real_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
}

// Leaf 7 subleaf 0: EBX AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ECX VBMI, VBMI2, VNNI, BITALG,
// VPOPCNTDQ; EDX 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8.
// Subleaf 1: EAX AVX512-BF16.
static const uint32_t kLeaf7Ebx = (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
                                  (1u << 30) | (1u << 31);
static const uint32_t kLeaf7Ecx = (1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14);
static const uint32_t kLeaf7Edx = (1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25);

static void on_fault(int signal_number, siginfo_t* info, void* context) {
  (void)info;
  greg_t* regs = ((ucontext_t*)context)->uc_mcontext.gregs;
  const uint8_t* ip = (const uint8_t*)regs[REG_RIP];
  if (ip[0] != 0x0F || ip[1] != 0xA2) {  // not a cpuid: a real fault, handled as if we were not here
    signal(signal_number, SIG_DFL);
    return;
  }
  uint32_t r[4];
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  real_cpuid((uint32_t)regs[REG_RAX], (uint32_t)regs[REG_RCX], r);
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  if (regs[REG_RAX] == 7 && (uint32_t)regs[REG_RCX] == 0) {
    r[1] &= ~kLeaf7Ebx;
    r[2] &= ~kLeaf7Ecx;
    r[3] &= ~kLeaf7Edx;
  } else if (regs[REG_RAX] == 7 && (uint32_t)regs[REG_RCX] == 1) {
    r[0] &= ~(1u << 5);
  }
  regs[REG_RAX] = r[0], regs[REG_RBX] = r[1], regs[REG_RCX] = r[2], regs[REG_RDX] = r[3];
  regs[REG_RIP] += 2;
}

__attribute__((constructor)) static void hide_avx512(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, 0);
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
    static const char message[] = "hide_avx512: CPUID faulting is unavailable here; AVX-512 stays visible\n";
    (void)!write(2, message, sizeof message - 1);
  }
}
