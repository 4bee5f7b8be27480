// Marks core functions that both the CPU code (g++) and the CUDA kernels
// (nvcc) compile, so the two back ends share one copy of the arithmetic.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define OPFORGE_HD __host__ __device__
#define OPFORGE_HD_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define OPFORGE_HD
// always_inline so the CPU ISA clones (cpu_dispatch.h) re-vectorise it in place
#define OPFORGE_HD_INLINE inline __attribute__((always_inline))
#else
#define OPFORGE_HD
#define OPFORGE_HD_INLINE inline
#endif

namespace opforge {
namespace core {

// floor, ceil, cos and sin for float/double on host and device, without <cmath>'s std:: overloads
// (not all of which are __device__).
OPFORGE_HD_INLINE float floor_hd(float x) { return ::floorf(x); }
OPFORGE_HD_INLINE double floor_hd(double x) { return ::floor(x); }
OPFORGE_HD_INLINE float ceil_hd(float x) { return ::ceilf(x); }
OPFORGE_HD_INLINE double ceil_hd(double x) { return ::ceil(x); }
OPFORGE_HD_INLINE float cos_hd(float x) { return ::cosf(x); }
OPFORGE_HD_INLINE double cos_hd(double x) { return ::cos(x); }
OPFORGE_HD_INLINE float sin_hd(float x) { return ::sinf(x); }
OPFORGE_HD_INLINE double sin_hd(double x) { return ::sin(x); }

// a * b rounded on its own: never fused with a following add into one FMA (compilers contract
// a * b + c by default where the CPU or GPU has FMA), for arithmetic that must round exactly as
// a reference does (ms_deform_attn's sampling position, as grid_sample computes it).
template <typename A>
OPFORGE_HD_INLINE A mul_rn_hd(A a, A b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(A) == sizeof(double)) return __dmul_rn(a, b);
  else return __fmul_rn(a, b);
#else
  A product = a * b;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+x"(product));  // an opaque register: the product is rounded before any later add
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+w"(product));
#else
  volatile A rounded = product;
  product = rounded;
#endif
  return product;
#endif
}

// Storage <-> accumulation conversions for code shared by CPU and GPU: plain
// casts here; cuda/scalar.cuh specialises them for __half / __nv_bfloat16
// (whose implicit conversions torch's nvcc flags switch off).
template <typename T, typename A>
struct ScalarIO {
  static OPFORGE_HD_INLINE A load(T x) { return static_cast<A>(x); }
  static OPFORGE_HD_INLINE T store(A x) { return static_cast<T>(x); }
};

// atomicAdd on the device; a plain add in host emulation (items run serially).
template <typename A>
OPFORGE_HD_INLINE void atomic_add_hd(A* address, A value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(address, value);
#else
  *address += value;
#endif
}

}  // namespace core
}  // namespace opforge
