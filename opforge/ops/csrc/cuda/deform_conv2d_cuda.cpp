// CUDA kernels of opforge::deform_conv2d and its backward, torchvision's
// scheme made leaner:
//   forward : per chunk of images, the core's im2col kernel (one thread per
//             (image, offset group, tap, pixel): the bilinear tap is computed
//             once and reused for every channel of the group) writes columns
//             [images, C*kh*kw, P]; one batched cuBLAS GEMM (ATen bmm) per chunk
//             multiplies them by the weight, straight into the output.
//   backward: per chunk, dcol = W^T dY (bmm), dW += dY col^T (bmm, summed over
//             the chunk), then ONE fused kernel scatters grad_input (atomics, in
//             float32 for 16-bit dtypes) and writes grad_offset / grad_mask,
//             reading dcol once (torchvision runs two kernels over it).
// Everything runs on torch's current stream; 16-bit dtypes sample in float32
// and multiply in cuBLAS with float32 accumulation.
#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "core/deform_conv2d_gpu.h"
#include "cuda_utils.h"
#include "deform_conv2d_args.h"
#include "torch_utils.h"

namespace opforge {
namespace {

using core::DeformConv2dParams;

// Column buffer budget per chunk (forward: one buffer; backward: two).
constexpr int64_t kColumnBudgetBytes = int64_t(256) << 20;

void check_devices(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
                   const at::Tensor& mask, const at::Tensor& bias, bool use_mask, const at::Tensor* grad = nullptr) {
  const at::Tensor none;
  check_same_device("opforge::deform_conv2d", {{"input", &input},
                                               {"weight", &weight},
                                               {"offset", &offset},
                                               {"mask", use_mask ? &mask : &none},
                                               {"bias", &bias},
                                               {"grad", grad ? grad : &none}});
}

// [G, Og, Kg] weight, expanded to every image of a chunk: [images*G, Og, Kg].
at::Tensor weight_per_image(const at::Tensor& weight_g, int64_t images) {
  return weight_g.unsqueeze(0).expand({images, -1, -1, -1}).reshape({-1, weight_g.size(1), weight_g.size(2)});
}

}  // namespace

at::Tensor deform_conv2d_cuda(const at::Tensor& input_, const at::Tensor& weight_, const at::Tensor& offset_,
                              const at::Tensor& mask_, const at::Tensor& bias_, int64_t stride_h, int64_t stride_w,
                              int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups,
                              int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input_, weight_, offset_, mask_, bias_, stride_h, stride_w,
                                                        pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
  check_devices(input_, weight_, offset_, mask_, bias_, use_mask);
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous(), offset = offset_.contiguous();
  const at::Tensor mask = use_mask ? mask_.contiguous() : mask_;
  const at::Tensor bias = bias_.contiguous();
  at::Tensor out = at::empty({p.batch, p.out_channels, p.out_h, p.out_w}, input.options());
  if (p.batch == 0) return out;

  const auto dtype = gpu_dtype(input.scalar_type());
  const cudaStream_t stream = current_stream(input);
  const int64_t G = p.weight_groups, Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  const int64_t P = p.out_pixels();
  const int64_t chunk = core::deform_gpu_chunk_images(p, static_cast<int64_t>(input.element_size()), kColumnBudgetBytes);
  const at::Tensor weight_g = weight.view({G, Og, Kg});
  at::Tensor col_buffer = at::empty({chunk * p.in_channels * p.taps() * P}, input.options());
  check_launch(core::cuda::fill_bias(dtype, p.batch, p.out_channels, P, bias.const_data_ptr(), out.mutable_data_ptr(),
                                     stream),
               "opforge::deform_conv2d");
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, p.batch - b0);
    check_launch(core::cuda::deform_im2col(dtype, p, input.const_data_ptr(), offset.const_data_ptr(),
                                           use_mask ? mask.const_data_ptr() : nullptr, b0, images,
                                           col_buffer.mutable_data_ptr(), stream),
                 "opforge::deform_conv2d");
    const at::Tensor col = col_buffer.narrow(0, 0, images * p.in_channels * p.taps() * P).view({images * G, Kg, P});
    at::Tensor out_chunk = out.narrow(0, b0, images).view({images * G, Og, P});
    out_chunk.baddbmm_(weight_per_image(weight_g, images), col);  // bias already in out (beta = 1)
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_cuda(
    const at::Tensor& grad_, const at::Tensor& input_, const at::Tensor& weight_, const at::Tensor& offset_,
    const at::Tensor& mask_, const at::Tensor& bias_, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups, int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input_, weight_, offset_, mask_, bias_, stride_h, stride_w,
                                                        pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
  check_devices(input_, weight_, offset_, mask_, bias_, use_mask, &grad_);
  TORCH_CHECK_VALUE(grad_.dim() == 4 && grad_.size(0) == p.batch && grad_.size(1) == p.out_channels &&
                        grad_.size(2) == p.out_h && grad_.size(3) == p.out_w,
                    "opforge::deform_conv2d backward: grad has shape ", grad_.sizes(), ", expected [", p.batch, ", ",
                    p.out_channels, ", ", p.out_h, ", ", p.out_w, "]");
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::ScalarType t = input_.scalar_type();
  const at::ScalarType acc_t = is_16bit(t) ? at::kFloat : t;
  const at::Tensor grad = grad_.contiguous().to(t);
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous(), offset = offset_.contiguous();
  const at::Tensor mask = use_mask ? mask_.contiguous() : mask_;

  at::Tensor grad_input_acc = at::zeros(input.sizes(), input.options().dtype(acc_t));
  at::Tensor grad_weight_acc = at::zeros(weight.sizes(), weight.options().dtype(acc_t));
  at::Tensor grad_offset = at::empty_like(offset);  // every element written by the kernel
  at::Tensor grad_mask = use_mask ? at::empty_like(mask) : at::zeros_like(mask_);
  at::Tensor grad_bias = at::sum(grad, at::IntArrayRef{0, 2, 3}, /*keepdim=*/false, acc_t);
  if (p.batch == 0)
    return {grad_input_acc.to(t), grad_weight_acc.to(t), grad_offset.zero_(), grad_mask,
            grad_bias.to(bias_.scalar_type())};

  const auto dtype = gpu_dtype(t);
  const cudaStream_t stream = current_stream(input);
  const int64_t G = p.weight_groups, Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  const int64_t P = p.out_pixels(), col_per_image = p.in_channels * p.taps() * P;
  const int64_t chunk = core::deform_gpu_chunk_images(p, static_cast<int64_t>(input.element_size()), kColumnBudgetBytes / 2);
  const at::Tensor weight_g = weight.view({G, Og, Kg});
  at::Tensor col_buffer = at::empty({chunk * col_per_image}, input.options());
  at::Tensor grad_col_buffer = at::empty({chunk * col_per_image}, input.options());
  at::Tensor grad_weight_g = grad_weight_acc.view({G, Og, Kg});
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, p.batch - b0);
    check_launch(core::cuda::deform_im2col(dtype, p, input.const_data_ptr(), offset.const_data_ptr(),
                                           use_mask ? mask.const_data_ptr() : nullptr, b0, images,
                                           col_buffer.mutable_data_ptr(), stream),
                 "opforge::deform_conv2d backward");
    const at::Tensor col = col_buffer.narrow(0, 0, images * col_per_image).view({images * G, Kg, P});
    at::Tensor grad_col = grad_col_buffer.narrow(0, 0, images * col_per_image).view({images * G, Kg, P});
    const at::Tensor go = grad.narrow(0, b0, images).view({images * G, Og, P});
    at::bmm_out(grad_col, weight_per_image(weight_g, images).transpose(1, 2), go);  // dcol = W^T dY
    grad_weight_g += at::sum(at::bmm(go, col.transpose(1, 2)).view({images, G, Og, Kg}), at::IntArrayRef{0}, false, acc_t);  // dW
    check_launch(core::cuda::deform_backward(dtype, p, input.const_data_ptr(), offset.const_data_ptr(),
                                             use_mask ? mask.const_data_ptr() : nullptr, b0, images,
                                             grad_col.const_data_ptr(), grad_input_acc.mutable_data_ptr(),
                                             grad_offset.mutable_data_ptr(),
                                             use_mask ? grad_mask.mutable_data_ptr() : nullptr, stream),
                 "opforge::deform_conv2d backward");
  }
  return {grad_input_acc.to(t), grad_weight_acc.to(t), grad_offset, grad_mask, grad_bias.to(bias_.scalar_type())};
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("deform_conv2d", &deform_conv2d_cuda);
  m.impl("_deform_conv2d_backward", &deform_conv2d_backward_cuda);
}

}  // namespace opforge
