// Runtime instruction-set dispatch for the cores' hot CPU loops.
//
// The libraries are built for baseline x86-64 (SSE2) so they run anywhere, but
// memory-bound elementwise loops still gain from wide vectors when data sits
// in cache. OPFORGE_ISA_CLONES(name, body-call) defines `name_avx2` /
// `name_avx512` copies of a loop with GCC/Clang target attributes; the plain
// loop (marked always_inline) is re-vectorised inside each copy, and
// cpu_isa() picks one at run time.
#pragma once

namespace opforge {
namespace core {

enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define OPFORGE_X86_DISPATCH 1
#define OPFORGE_ALWAYS_INLINE inline __attribute__((always_inline))
#define OPFORGE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define OPFORGE_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")))

inline Isa cpu_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kBaseline;
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
