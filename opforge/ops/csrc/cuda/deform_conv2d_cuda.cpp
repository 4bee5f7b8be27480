// CUDA kernels of opforge::deform_conv2d and its backward: the batched-GEMM
// algorithm of deform_conv2d_batched.h with the core's CUDA sampling kernels
// (core/cuda/deform_conv2d.cuh), all on torch's current stream. Compared with
// torchvision's CUDA path:
//   * im2col: one thread per (image, offset group, tap, pixel) computes the
//     bilinear tap once and reuses it for every channel of the group
//     (torchvision recomputes it per channel);
//   * backward: ONE fused kernel scatters grad_input (atomics, in float32 for
//     16-bit dtypes) and writes grad_offset / grad_mask, reading the column
//     gradient once (torchvision runs two kernels over it);
//   * GEMMs: one batched cuBLAS call (ATen bmm / baddbmm) per chunk of images.
// 16-bit dtypes sample in float32 and multiply with float32 accumulation.
#include <tuple>

#include "opforge/torch_cuda.h"
#include "deform_conv2d_args.h"
#include "deform_conv2d_batched.h"
#include "opforge/torch_op.h"

namespace opforge {
namespace {

using core::DeformConv2dParams;

// Column buffer budget per chunk (the backward holds two of them).
constexpr int64_t kColumnBudgetBytes = int64_t(256) << 20;

// The sampling kernels, launched on torch's current stream of the tensors' device.
struct CudaSampler {
  const char* op;

  void fill_bias(const DeformConv2dParams& p, const Tensor& bias, Tensor& out) const {
    check_launch(core::cuda::fill_bias(gpu_dtype(out.scalar_type()), p.batch, p.out_channels, p.out_pixels(),
                                       bias.const_data_ptr(), out.mutable_data_ptr(), current_stream(out)),
                 op);
  }
  void im2col(const DeformConv2dParams& p, const Tensor& input, const Tensor& offset, const Tensor& mask,
              int64_t first_image, int64_t images, Tensor& col) const {
    check_launch(core::cuda::deform_im2col(gpu_dtype(input.scalar_type()), p, input.const_data_ptr(),
                                           offset.const_data_ptr(), p.use_mask ? mask.const_data_ptr() : nullptr,
                                           first_image, images, col.mutable_data_ptr(), current_stream(input)),
                 op);
  }
  void backward(const DeformConv2dParams& p, const Tensor& input, const Tensor& offset, const Tensor& mask,
                int64_t first_image, int64_t images, const Tensor& grad_col, Tensor& grad_input_acc,
                Tensor& grad_offset, Tensor& grad_mask) const {
    check_launch(core::cuda::deform_backward(gpu_dtype(input.scalar_type()), p, input.const_data_ptr(),
                                             offset.const_data_ptr(), p.use_mask ? mask.const_data_ptr() : nullptr,
                                             first_image, images, grad_col.const_data_ptr(),
                                             grad_input_acc.mutable_data_ptr(), grad_offset.mutable_data_ptr(),
                                             p.use_mask ? grad_mask.mutable_data_ptr() : nullptr,
                                             current_stream(input)),
                 op);
  }
};

void check_devices(const Tensor& input, const Tensor& weight, const Tensor& offset, const Tensor& mask,
                   const Tensor& bias, bool use_mask, const Tensor* grad = nullptr) {
  check_same_device("opforge::deform_conv2d", {{"input", &input},
                                               {"weight", &weight},
                                               {"offset", &offset},
                                               {"mask", use_mask ? &mask : nullptr},
                                               {"bias", &bias},
                                               {"grad", grad}});
}

}  // namespace

Tensor deform_conv2d_cuda(const Tensor& input, const Tensor& weight, const Tensor& offset, const Tensor& mask,
                          const Tensor& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                          int64_t dil_h, int64_t dil_w, int64_t groups, int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                                        pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
  check_devices(input, weight, offset, mask, bias, use_mask);
  const CudaDeviceGuard guard(input);
  return deform_conv2d_batched_forward(p, prepared(input), prepared(weight), prepared(offset),
                                       use_mask ? prepared(mask) : mask, prepared(bias),
                                       CudaSampler{"opforge::deform_conv2d"}, kColumnBudgetBytes);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_cuda(
    const Tensor& grad, const Tensor& input, const Tensor& weight, const Tensor& offset, const Tensor& mask,
    const Tensor& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dil_h,
    int64_t dil_w, int64_t groups, int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                                        pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
  check_devices(input, weight, offset, mask, bias, use_mask, &grad);
  deform_conv2d_check_grad(p, grad);
  const CudaDeviceGuard guard(input);
  auto [gi, gw, go, gm, gb] = deform_conv2d_batched_backward(
      p, prepared(grad, input.scalar_type()), prepared(input), prepared(weight), prepared(offset),
      use_mask ? prepared(mask) : mask, CudaSampler{"opforge::deform_conv2d backward"}, kColumnBudgetBytes / 2);
  return {gi, gw, go, gm, to_dtype(gb, bias.scalar_type())};
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("deform_conv2d", TORCH_BOX(&deform_conv2d_cuda));
  m.impl("_deform_conv2d_backward", TORCH_BOX(&deform_conv2d_backward_cuda));
}

}  // namespace opforge
