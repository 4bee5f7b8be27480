// ORT CUDA-EP kernel of opforge::my_add: the CPU kernel's checks and
// broadcasting plan (MyAddKernel in ort_common.h), then the shared CUDA core on
// ORT's compute stream — the same kernels torch's CUDA path launches.
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

namespace {

// The CUDA EP's part: the shared CUDA core on ORT's compute stream.
struct MyAddCuda {
  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const core::BinaryPlan& plan, const T* a, const T* b, T* out) const {
    const InputDeviceGuard device(ctx);
    return cuda_status(core::cuda::my_add(gpu_dtype<T>(), plan, a, b, out, compute_stream(ctx)), "opforge::my_add",
                       "CUDA kernel launch");
  }
};

}  // namespace

const FloatKernels<MyAddKernel, MyAddCuda> my_add_cuda_kernels("my_add", kCudaEp);

}  // namespace ort
}  // namespace opforge
