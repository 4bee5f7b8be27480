// The CPU EP kernel of mmdeploy's MMCVModulatedDeformConv2d (node form:
// modulated_deform_conv.h), computed by opforge::deform_conv2d's CPU code.
#include <vector>

#include "deform_conv2d_cpu.h"
#include "modulated_deform_conv.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

static void append_modulated_deform_conv_ops(std::vector<LiteOpPtr>& ops) {
  append_float_kernels<ModulatedDeformConvKernel, DeformConv2dCpu>(ops, kModulatedDeformConv, kCpuEp);
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_modulated_deform_conv_ops);
