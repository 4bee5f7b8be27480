// ORT CUDA-EP kernel of opforge::deform_conv2d: the CPU kernel's attributes and
// checks (DeformConv2dKernel in ort_common.h); the computation is
// deform_conv2d_cuda.h (shared with mmdeploy's node form).
#include "cuda/deform_conv2d_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

const FloatKernels<DeformConv2dKernel, DeformConv2dCuda> deform_conv2d_cuda_kernels("deform_conv2d", kCudaEp);

}  // namespace ort
}  // namespace opforge
