// The CPU EP kernel of mmdeploy's MMCVModulatedDeformConv2d (node form:
// modulated_deform_conv.h), computed by opforge::deform_conv2d's CPU code.
#include <optional>
#include <vector>

#include "deform_conv2d_cpu.h"
#include "modulated_deform_conv.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

template <typename T>
struct ModulatedDeformConvKernel : ModulatedDeformConvAttrs {
  ModulatedDeformConvKernel(const OrtApi*, const OrtKernelInfo* info) : ModulatedDeformConvAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& offset,
                      const Ort::Custom::Tensor<T>& mask, const Ort::Custom::Tensor<T>& weight,
                      std::optional<const Ort::Custom::Tensor<T>*> bias, Ort::Custom::Tensor<T>& output) {
    core::DeformConv2dParams p;
    const T* bias_data = nullptr;
    if (Ort::Status bad = check_modulated_deform_conv_inputs(*this, input, offset, mask, weight, bias, p, &bias_data);
        !bad.IsOK())
      return bad;
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    std::vector<T> zeros;
    if (bias_data == nullptr) zeros.assign(static_cast<size_t>(p.out_channels), T{});
    deform_conv2d_run<T>(ctx, p, input.Data(), weight.Data(), offset.Data(), mask.Data(),
                         bias_data ? bias_data : zeros.data(), out);
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_modulated_deform_conv_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<ModulatedDeformConvKernel<T>>(kModulatedDeformConv, kCpuEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_modulated_deform_conv_ops);
