// CUDA kernels of my_add: a 16-byte-vectorised grid-stride kernel for the
// common all-contiguous case, and the general broadcasting/strided work item
// (core/my_add_gpu.h) through launch_items. Both use the shared element body.
#pragma once

#include <cstdint>

#include "../my_add_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// n elements, all three pointers 16-byte aligned: one 16-byte load per
// operand per step, then a scalar tail.
template <typename T, typename A, int kVec>
__global__ void __launch_bounds__(kThreads)
    my_add_contiguous_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n) {
  using P = Pack<T, kVec>;
  const int64_t packs = n / kVec, step = grid_threads();
  const P* pa = reinterpret_cast<const P*>(a);
  const P* pb = reinterpret_cast<const P*>(b);
  P* po = reinterpret_cast<P*>(out);
  for (int64_t i = global_thread(); i < packs; i += step) {
    const P x = pa[i], y = pb[i];
    P r;
#pragma unroll
    for (int j = 0; j < kVec; ++j) r.v[j] = my_add_element<T, A>(x.v[j], y.v[j]);
    po[i] = r;
  }
  for (int64_t i = packs * kVec + global_thread(); i < n; i += step) out[i] = my_add_element<T, A>(a[i], b[i]);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
cudaError_t launch_my_add(const BinaryPlan& plan, const T* a, const T* b, T* out, cudaStream_t stream) {
  using A = typename acc<T>::type;
  constexpr int kVec = 16 / sizeof(T);
  const bool contiguous = plan.ndim == 1 && plan.stride_a[0] == 1 && plan.stride_b[0] == 1;
  if (!contiguous) return launch_items<my_add_item<T, A>>(plan.numel, stream, plan, a, b, out);  // broadcasting
  if (aligned16(a) && aligned16(b) && aligned16(out)) {
    my_add_contiguous_kernel<T, A, kVec><<<grid_for(plan.numel / kVec + 1), kThreads, 0, stream>>>(a, b, out, plan.numel);
  } else {
    my_add_contiguous_kernel<T, A, 1><<<grid_for(plan.numel), kThreads, 0, stream>>>(a, b, out, plan.numel);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
