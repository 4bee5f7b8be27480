// opforge's torch CUDA glue, on LibTorch's stable ABI (opforge/torch_op.h): dtype mapping onto the
// cores' launch API, the caller's stream and device, and launch-status checks that raise naming the
// op. Compiled only into a library's CUDA part (opforge.build.TorchLibrary's companion), which links
// the CUDA runtime; the CPU part never includes it.
#pragma once

#include <cuda_runtime_api.h>

// The CUDA shims (aoti_torch_get_current_cuda_stream, in libtorch_cuda) are declared under USE_CUDA,
// which opforge.build.TorchLibrary defines for the CUDA part's sources (so the include order does not
// matter); defined here too for a build by hand that includes this header first.
#ifndef USE_CUDA
#define USE_CUDA
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "core/cuda/launch.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::cuda::Dtype gpu_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
      return core::cuda::Dtype::kFloat32;
    case ScalarType::Double:
      return core::cuda::Dtype::kFloat64;
    case ScalarType::Half:
      return core::cuda::Dtype::kFloat16;
    case ScalarType::BFloat16:
      return core::cuda::Dtype::kBFloat16;
    default:
      throw std::runtime_error(core::message("opforge: no CUDA kernel for dtype ", dtype_name(t)));
  }
}

// Makes t's device current for the kernel's scope (stable c10::cuda::CUDAGuard).
struct CudaDeviceGuard {
  explicit CudaDeviceGuard(const Tensor& t) : guard(t.get_device_index()) {}
  torch::stable::accelerator::DeviceGuard guard;
};

// torch's current stream on t's device: kernels run ordered with the rest of the caller's work
// (and under CUDA graphs / user streams), never on the legacy default stream.
inline cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

inline void check_launch(cudaError_t err, const char* what) {
  check(err == cudaSuccess, what, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace opforge
