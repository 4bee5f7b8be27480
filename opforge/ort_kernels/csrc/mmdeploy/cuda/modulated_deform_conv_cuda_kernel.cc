// The CUDA EP kernel of mmdeploy's MMCVModulatedDeformConv2d (node form:
// modulated_deform_conv.h), computed by opforge::deform_conv2d's CUDA code
// (cuda/deform_conv2d_cuda.h); a node without bias adds zeros.
#include <vector>

#include "cuda/deform_conv2d_cuda.h"
#include "mmdeploy/modulated_deform_conv.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

static void append_modulated_deform_conv_cuda_ops(std::vector<LiteOpPtr>& ops) {
  append_float_kernels<ModulatedDeformConvKernel, DeformConv2dCuda>(ops, kModulatedDeformConv, kCudaEp);
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_modulated_deform_conv_cuda_ops);
