// deform_conv2d's GPU algorithm on the torch side, apart from where the
// sampling kernels run: chunks of images, columns [images, C*kh*kw, P], and
// the GEMMs as ATen batched matmuls (cuBLAS on CUDA tensors):
//   forward : out = bias; per chunk: col = im2col; out[b, g] += W_g @ col[b, g]
//   backward: per chunk: col = im2col; dcol[b, g] = W_g^T @ dY[b, g];
//             dW_g += sum_b dY[b, g] @ col[b, g]^T; then the fused sampling
//             backward (grad_input scatter + grad_offset / grad_mask) from dcol.
// `Sampler` supplies fill_bias / im2col / backward: CudaSampler (cuda/
// deform_conv2d_cuda.cpp) launches the core's CUDA kernels on torch's current
// stream; the tests plug in a host sampler running the same work items on the
// CPU, which checks this file's algebra against torchvision without a GPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <tuple>

#include "core/deform_conv2d_gpu.h"
#include "core/deform_conv2d_tap.h"

namespace opforge {

// [G, Og, Kg] weight, repeated for every image of a chunk: [images*G, Og, Kg]
// (small: the batched GEMM then needs no broadcasting support).
inline at::Tensor weight_per_image(const at::Tensor& weight_g, int64_t images) {
  return weight_g.unsqueeze(0).expand({images, -1, -1, -1}).reshape({-1, weight_g.size(1), weight_g.size(2)});
}

// All tensors contiguous, checked (deform_conv2d_args.h); mask undefined or
// ignored when !p.use_mask. column_budget_bytes bounds each column buffer.
template <typename Sampler>
at::Tensor deform_conv2d_batched_forward(const core::DeformConv2dParams& p, const at::Tensor& input,
                                         const at::Tensor& weight, const at::Tensor& offset, const at::Tensor& mask,
                                         const at::Tensor& bias, const Sampler& sampler,
                                         int64_t column_budget_bytes) {
  at::Tensor out = at::empty({p.batch, p.out_channels, p.out_h, p.out_w}, input.options());
  if (p.batch == 0) return out;
  const int64_t G = p.weight_groups, Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  const int64_t P = p.out_pixels(), col_per_image = p.in_channels * p.taps() * P;
  const int64_t chunk =
      core::deform_gpu_chunk_images(p, static_cast<int64_t>(input.element_size()), column_budget_bytes);
  const at::Tensor weight_g = weight.view({G, Og, Kg});
  at::Tensor col_buffer = at::empty({chunk * col_per_image}, input.options());
  sampler.fill_bias(p, bias, out);
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, p.batch - b0);
    at::Tensor col = col_buffer.narrow(0, 0, images * col_per_image).view({images * G, Kg, P});
    sampler.im2col(p, input, offset, mask, b0, images, col);
    at::Tensor out_chunk = out.narrow(0, b0, images).view({images * G, Og, P});
    out_chunk.baddbmm_(weight_per_image(weight_g, images), col);  // += (bias is already in out)
  }
  return out;
}

// Returns (grad_input, grad_weight, grad_offset, grad_mask, grad_bias); 16-bit
// dtypes accumulate grad_input / grad_weight / grad_bias in float32.
template <typename Sampler>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_batched_backward(
    const core::DeformConv2dParams& p, const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const at::Tensor& mask, const Sampler& sampler, int64_t column_budget_bytes) {
  const at::ScalarType t = input.scalar_type();
  const at::ScalarType acc_t = (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
  at::Tensor grad_input_acc = at::zeros(input.sizes(), input.options().dtype(acc_t));
  at::Tensor grad_weight_acc = at::zeros(weight.sizes(), weight.options().dtype(acc_t));
  at::Tensor grad_offset = at::zeros_like(offset);  // the kernel writes every element; zeros for batch 0
  at::Tensor grad_mask = p.use_mask ? at::empty_like(mask) : at::zeros_like(mask);
  at::Tensor grad_bias = at::sum(grad, at::IntArrayRef{0, 2, 3}, /*keepdim=*/false, acc_t);
  if (p.batch > 0) {
    const int64_t G = p.weight_groups, Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
    const int64_t P = p.out_pixels(), col_per_image = p.in_channels * p.taps() * P;
    const int64_t chunk =
        core::deform_gpu_chunk_images(p, static_cast<int64_t>(input.element_size()), column_budget_bytes);
    const at::Tensor weight_g = weight.view({G, Og, Kg});
    at::Tensor col_buffer = at::empty({chunk * col_per_image}, input.options());
    at::Tensor grad_col_buffer = at::empty({chunk * col_per_image}, input.options());
    at::Tensor grad_weight_g = grad_weight_acc.view({G, Og, Kg});
    for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
      const int64_t images = std::min(chunk, p.batch - b0);
      at::Tensor col = col_buffer.narrow(0, 0, images * col_per_image).view({images * G, Kg, P});
      at::Tensor grad_col = grad_col_buffer.narrow(0, 0, images * col_per_image).view({images * G, Kg, P});
      sampler.im2col(p, input, offset, mask, b0, images, col);
      const at::Tensor go = grad.narrow(0, b0, images).view({images * G, Og, P});
      at::bmm_out(grad_col, weight_per_image(weight_g, images).transpose(1, 2), go);  // dcol = W^T dY
      grad_weight_g += at::sum(at::bmm(go, col.transpose(1, 2)).view({images, G, Og, Kg}), at::IntArrayRef{0},
                               /*keepdim=*/false, acc_t);  // dW
      sampler.backward(p, input, offset, mask, b0, images, grad_col, grad_input_acc, grad_offset, grad_mask);
    }
  }
  return {grad_input_acc.to(t), grad_weight_acc.to(t), grad_offset, grad_mask, grad_bias};
}

}  // namespace opforge
