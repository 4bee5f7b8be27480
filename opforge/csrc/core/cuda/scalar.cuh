// CUDA-side scalar plumbing: 16-bit conversions for the shared host+device
// cores, launch geometry, and the storage-type mapping used by kernels.cuh.
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

}  // namespace cuda
}  // namespace core
}  // namespace opforge
