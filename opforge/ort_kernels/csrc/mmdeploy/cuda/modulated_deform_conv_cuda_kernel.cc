// The CUDA EP kernel of mmdeploy's MMCVModulatedDeformConv2d (node form:
// modulated_deform_conv.h), computed by opforge::deform_conv2d's CUDA code
// (cuda/deform_conv2d_cuda.h); a node without bias adds zeros.
#include <vector>

#include "cuda/deform_conv2d_cuda.h"
#include "mmdeploy/modulated_deform_conv.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

const FloatKernels<ModulatedDeformConvKernel, DeformConv2dCuda>
    modulated_deform_conv_cuda_kernels(kModulatedDeformConv, kCudaEp);

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
