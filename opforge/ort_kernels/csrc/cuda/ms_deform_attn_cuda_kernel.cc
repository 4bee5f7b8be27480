// ORT CUDA-EP kernel of opforge::ms_deform_attn: the CPU kernel's node, shape and
// level checks (MsDeformAttnKernel in ort_common.h), then the same CUDA kernel as
// torch's CUDA path on ORT's compute stream. The index tensors live on the device
// here; CudaHostIo copies them to the host for the check before the kernel indexes
// value with them: one small synchronous copy per run, correctness over speed.
#include <vector>

#include "cuda/cuda_host_io.h"
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace {

// The CUDA EP's part: the shared CUDA core on ORT's compute stream.
struct MsDeformAttnCuda {
  using Io = CudaHostIo;

  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const core::MsDeformAttnParams& p, const T* value, const int64_t* shapes,
                  const int64_t* starts, const T* locations, const T* weights, T* out) const {
    return cuda_status(core::cuda::ms_deform_attn_forward(gpu_dtype<T>(), p, value, shapes, starts, locations, weights,
                                                          out, compute_stream(ctx)),
                       "opforge::ms_deform_attn", "CUDA kernel launch");
  }
};

}  // namespace

const FloatKernels<MsDeformAttnKernel, MsDeformAttnCuda> ms_deform_attn_cuda_kernels("ms_deform_attn", kCudaEp);

}  // namespace ort
}  // namespace opforge
