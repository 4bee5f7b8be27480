// Runtime instruction-set dispatch for the cores' hot CPU loops.
//
// The libraries are built for baseline x86-64 (SSE2) so they run anywhere, but
// memory-bound elementwise loops still gain from wide vectors when data sits
// in cache. OPFORGE_ISA_CLONES(name, body-call) defines `name_avx2` /
// `name_avx512` copies of a loop with GCC/Clang target attributes; the plain
// loop (marked always_inline) is re-vectorised inside each copy, and
// cpu_isa() picks one at run time.
#pragma once

#include <cstdlib>
#include <cstring>

namespace opforge {
namespace core {

enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define OPFORGE_X86_DISPATCH 1
#define OPFORGE_ALWAYS_INLINE inline __attribute__((always_inline))
#define OPFORGE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define OPFORGE_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")))

// The best ISA this CPU supports, lowered by OPFORGE_CPU_ISA=baseline|avx2|avx512
// if set (read once; lets tests cover every path on one machine).
inline Isa cpu_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    Isa best = Isa::kBaseline;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
      best = Isa::kAvx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      best = Isa::kAvx2;
    const char* env = std::getenv("OPFORGE_CPU_ISA");
    if (env == nullptr) return best;
    const Isa wanted = std::strcmp(env, "baseline") == 0 ? Isa::kBaseline
                       : std::strcmp(env, "avx2") == 0   ? Isa::kAvx2
                                                         : Isa::kAvx512;
    return wanted < best ? wanted : best;
  }();
  return isa;
}
#else
#define OPFORGE_X86_DISPATCH 0
#define OPFORGE_ALWAYS_INLINE inline
inline Isa cpu_isa() { return Isa::kBaseline; }
#endif

}  // namespace core
}  // namespace opforge
