// The CPU EP kernel of mmdeploy's MMCVModulatedDeformConv2d (node form:
// modulated_deform_conv.h), computed by opforge::deform_conv2d's CPU code.
#include <vector>

#include "deform_conv2d_cpu.h"
#include "modulated_deform_conv.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

const FloatKernels<ModulatedDeformConvKernel, DeformConv2dCpu>
    modulated_deform_conv_kernels(kModulatedDeformConv, kCpuEp);

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
