// The CUDA EP kernel of mmdeploy::grid_sampler (node form and checks: grid_sampler.h):
// one thread per output element running the CPU kernel's per-point arithmetic
// (core/grid_sample.h: grid_sample_point) on ORT's compute stream; 16-bit types
// accumulate in float32. The grid stays on the device: every coordinate is clamped
// before it becomes an index, so no grid value needs a host-side check.
#include <vector>

#include "core/cuda/launch.h"
#include "mmdeploy/grid_sampler.h"
#include "opforge/ort_cuda.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

// The CUDA EP's part: the shared CUDA core on ORT's compute stream.
struct GridSamplerCuda {
  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const core::GridSampleParams& p, const T* input, const T* grid,
                  T* out) const {
    const InputDeviceGuard device(ctx);
    return cuda_status(core::cuda::grid_sample_forward(gpu_dtype<T>(), p, input, grid, out, compute_stream(ctx)),
                       core::kGridSampleOp, "CUDA kernel launch");
  }
};

}  // namespace

const FloatKernels<GridSamplerKernel, GridSamplerCuda> grid_sampler_cuda_kernels(kGridSampler, kCudaEp);

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
