// CUDA-side scalar plumbing: 16-bit conversions for the shared host+device
// cores, launch geometry, the one grid-stride kernel form, and the
// storage-type mapping used by kernels.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../host_device.h"

namespace opforge {
namespace core {

// Explicit intrinsics: torch compiles with __CUDA_NO_HALF_CONVERSIONS__ and
// friends, which remove __half's implicit float conversions.
template <>
struct ScalarIO<__half, float> {
  static __host__ __device__ __forceinline__ float load(__half x) { return __half2float(x); }
  static __host__ __device__ __forceinline__ __half store(float x) { return __float2half_rn(x); }
};
template <>
struct ScalarIO<__nv_bfloat16, float> {
  static __host__ __device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __host__ __device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

namespace cuda {

// Accumulation type: float for the 16-bit types, else the type itself.
template <typename T>
struct acc {
  using type = T;
};
template <>
struct acc<__half> {
  using type = float;
};
template <>
struct acc<__nv_bfloat16> {
  using type = float;
};

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `work` items: enough to fill any current
// GPU many times over, capped so huge tensors loop instead of overflowing.
inline unsigned grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  constexpr int64_t kMaxBlocks = int64_t(1) << 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// A kernel parameter of type T: pointers become __restrict__ (the operands of one launch never
// overlap), so read-only operands load through the non-coherent cache.
template <typename T>
struct kernel_param {
  using type = T;
};
template <typename T>
struct kernel_param<T*> {
  using type = T* __restrict__;
};

// The one kernel form of the shared cores: a grid-stride loop that runs the op's work item,
// item(p, i, args...) for i in [0, items). core/<op>_gpu.h holds the items; the host
// emulation tests run the same items in a loop.
template <auto item, typename Params, typename... Args>
__global__ void __launch_bounds__(kThreads)
    for_each_item_kernel(const Params p, int64_t items, typename kernel_param<Args>::type... args) {
  for (int64_t i = global_thread(); i < items; i += grid_threads()) item(p, i, args...);
}

template <auto item, typename Params, typename... Args>
cudaError_t launch_items(int64_t items, cudaStream_t stream, const Params& p, Args... args) {
  if (items <= 0) return cudaSuccess;
  for_each_item_kernel<item, Params, Args...><<<grid_for(items), kThreads, 0, stream>>>(p, items, args...);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
