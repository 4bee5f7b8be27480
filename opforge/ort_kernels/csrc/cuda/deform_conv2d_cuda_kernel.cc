// ORT CUDA-EP kernel of opforge::deform_conv2d: same attributes and checks as
// the CPU kernel; the computation is deform_conv2d_cuda.h (shared with mmdeploy's
// node form).
#include "cuda/deform_conv2d_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

template <typename T>
struct DeformConv2dCudaKernel : DeformConv2dAttrs {
  CublasHandle cublas;

  DeformConv2dCudaKernel(const OrtApi*, const OrtKernelInfo* info) : DeformConv2dAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& weight,
                      const Ort::Custom::Tensor<T>& offset, const Ort::Custom::Tensor<T>& mask,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& output) {
    core::DeformConv2dParams p;
    const std::string err = check(input.Shape(), weight.Shape(), offset.Shape(), mask.Shape(), bias.Shape(), p);
    if (!err.empty()) return invalid_argument(err);
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    return deform_conv2d_cuda_run<T>(ctx, cublas, "opforge::deform_conv2d", p, input.Data(), weight.Data(),
                                     offset.Data(), use_mask ? mask.Data() : nullptr, bias.Data(), out);
  }
};

static void append_deform_conv2d_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<DeformConv2dCudaKernel<T>>("deform_conv2d", kCudaEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_deform_conv2d_cuda_ops);
