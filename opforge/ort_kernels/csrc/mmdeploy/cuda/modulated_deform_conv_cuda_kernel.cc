// The CUDA EP kernel of mmdeploy's MMCVModulatedDeformConv2d (node form:
// modulated_deform_conv.h), computed by opforge::deform_conv2d's CUDA code
// (cuda/deform_conv2d_cuda.h); a node without bias adds zeros.
#include <optional>
#include <vector>

#include "cuda/deform_conv2d_cuda.h"
#include "mmdeploy/modulated_deform_conv.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

template <typename T>
struct ModulatedDeformConvCudaKernel : ModulatedDeformConvAttrs {
  CublasHandle cublas;

  ModulatedDeformConvCudaKernel(const OrtApi*, const OrtKernelInfo* info) : ModulatedDeformConvAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& offset,
                      const Ort::Custom::Tensor<T>& mask, const Ort::Custom::Tensor<T>& weight,
                      std::optional<const Ort::Custom::Tensor<T>*> bias, Ort::Custom::Tensor<T>& output) {
    core::DeformConv2dParams p;
    const T* bias_data = nullptr;
    if (Ort::Status bad = check_modulated_deform_conv_inputs(*this, input, offset, mask, weight, bias, p, &bias_data);
        !bad.IsOK())
      return bad;
    const bool has_bias = bias_data != nullptr;
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    if (p.batch == 0) return Ort::Status(nullptr);
    const InputDeviceGuard device(ctx);
    const cudaStream_t stream = compute_stream(ctx);
    // No bias: zeros on the device (all-zero bits are 0 in every float type).
    StreamScratch zeros(has_bias ? 1 : static_cast<size_t>(p.out_channels) * sizeof(T), stream);
    if (!has_bias) {
      cudaError_t ce = zeros.status();
      if (ce == cudaSuccess) ce = cudaMemsetAsync(zeros.get(), 0, static_cast<size_t>(p.out_channels) * sizeof(T), stream);
      if (Ort::Status s = cuda_status(ce, kModulatedDeformConvOp, "zero bias"); !s.IsOK()) return s;
    }
    return deform_conv2d_cuda_run<T>(ctx, cublas, kModulatedDeformConvOp, p, input.Data(), weight.Data(),
                                     offset.Data(), mask.Data(),
                                     has_bias ? bias_data : static_cast<const T*>(zeros.get()), out);
  }
};

}  // namespace

static void append_modulated_deform_conv_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<ModulatedDeformConvCudaKernel<T>>(kModulatedDeformConv, kCudaEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_modulated_deform_conv_cuda_ops);
