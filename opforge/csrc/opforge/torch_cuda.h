// opforge's torch CUDA glue: dtype mapping onto the cores' launch API, the
// caller's stream, and launch-status checks that raise naming the op.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "core/cuda/launch.h"

namespace opforge {

inline core::cuda::Dtype gpu_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return core::cuda::Dtype::kFloat32;
    case at::kDouble:
      return core::cuda::Dtype::kFloat64;
    case at::kHalf:
      return core::cuda::Dtype::kFloat16;
    case at::kBFloat16:
      return core::cuda::Dtype::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, "opforge: no CUDA kernel for dtype ", t);
  }
}

// torch's current stream on t's device: kernels run ordered with the rest of
// the caller's work (and under CUDA graphs / user streams), never on the
// legacy default stream.
inline cudaStream_t current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace opforge
