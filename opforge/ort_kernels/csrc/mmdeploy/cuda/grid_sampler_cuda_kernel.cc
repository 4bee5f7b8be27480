// The CUDA EP kernel of mmdeploy::grid_sampler (node form: grid_sampler.h): one
// thread per output element running the CPU kernel's per-point arithmetic
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

template <typename T>
struct GridSamplerCudaKernel : GridSamplerAttrs {
  GridSamplerCudaKernel(const OrtApi*, const OrtKernelInfo* info) : GridSamplerAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& grid,
                      Ort::Custom::Tensor<T>& output) {
    core::GridSampleParams p;
    if (Ort::Status bad = check(input.Shape(), grid.Shape(), p); !bad.IsOK()) return bad;
    int64_t dims[4];
    core::grid_sample_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    if (dims[0] * dims[1] * dims[2] * dims[3] == 0) return Ort::Status(nullptr);
    const InputDeviceGuard device(ctx);
    return cuda_status(core::cuda::grid_sample_forward(gpu_dtype<T>(), p, input.Data(), grid.Data(), out,
                                                       compute_stream(ctx)),
                       core::kGridSampleOp, "CUDA kernel launch");
  }
};

}  // namespace

static void append_grid_sampler_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<GridSamplerCudaKernel<T>>(kGridSampler, kCudaEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_grid_sampler_cuda_ops);
