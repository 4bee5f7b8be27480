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

// The chunking forward and backward share: images per chunk (each column
// buffer within the byte budget) and the per-group weight [G, Og, Kg] repeated
// once for a full chunk, [images*G, Og, Kg] (small: the batched GEMM then
// needs no broadcasting support, and no chunk repeats it again).
struct ColumnChunks {
  int64_t groups, out_per_group, rows_per_group, pixels, per_image, images;
  at::Tensor weight_rep;

  ColumnChunks(const core::DeformConv2dParams& p, const at::Tensor& input, const at::Tensor& weight,
               int64_t column_budget_bytes)
      : groups(p.weight_groups),
        out_per_group(p.out_channels_per_group()),
        rows_per_group(p.col_rows_per_group()),
        pixels(p.out_pixels()),
        per_image(p.in_channels * p.taps() * p.out_pixels()),
        images(core::deform_gpu_chunk_images(p, static_cast<int64_t>(input.element_size()), column_budget_bytes)) {
    const at::Tensor weight_g = weight.view({groups, out_per_group, rows_per_group});
    weight_rep = weight_g.unsqueeze(0).expand({images, -1, -1, -1}).reshape({-1, out_per_group, rows_per_group});
  }
  at::Tensor new_buffer(const at::Tensor& like) const { return at::empty({images * per_image}, like.options()); }
  // Columns of the first n images of a buffer, per (image, group): [n*G, Kg, P].
  at::Tensor columns(const at::Tensor& buffer, int64_t n) const {
    return buffer.narrow(0, 0, n * per_image).view({n * groups, rows_per_group, pixels});
  }
  // The weight for n images: [n*G, Og, Kg].
  at::Tensor weights(int64_t n) const { return weight_rep.narrow(0, 0, n * groups); }
};

// All tensors contiguous, checked (deform_conv2d_args.h); mask undefined or
// ignored when !p.use_mask. column_budget_bytes bounds each column buffer.
template <typename Sampler>
at::Tensor deform_conv2d_batched_forward(const core::DeformConv2dParams& p, const at::Tensor& input,
                                         const at::Tensor& weight, const at::Tensor& offset, const at::Tensor& mask,
                                         const at::Tensor& bias, const Sampler& sampler,
                                         int64_t column_budget_bytes) {
  at::Tensor out = at::empty({p.batch, p.out_channels, p.out_h, p.out_w}, input.options());
  if (p.batch == 0) return out;
  sampler.fill_bias(p, bias, out);
  if (p.samples_nothing()) return out;  // all columns 0 (and the samplers must not read the empty input)
  const ColumnChunks chunks(p, input, weight, column_budget_bytes);
  const at::Tensor col_buffer = chunks.new_buffer(input);
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunks.images) {
    const int64_t images = std::min(chunks.images, p.batch - b0);
    at::Tensor col = chunks.columns(col_buffer, images);
    sampler.im2col(p, input, offset, mask, b0, images, col);
    at::Tensor out_chunk = out.narrow(0, b0, images).view({images * chunks.groups, chunks.out_per_group, chunks.pixels});
    out_chunk.baddbmm_(chunks.weights(images), col);  // += (bias is already in out)
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
  // The sampling backward writes every grad_offset / grad_mask element (as
  // contiguous buffers, whatever the caller's layout) when it runs at all.
  const bool sampling = p.batch > 0 && !p.samples_nothing();
  at::Tensor grad_offset = sampling ? at::empty(offset.sizes(), offset.options()) : at::zeros(offset.sizes(), offset.options());
  at::Tensor grad_mask = p.use_mask && sampling ? at::empty(mask.sizes(), mask.options()) : at::zeros(mask.sizes(), mask.options());
  at::Tensor grad_bias = at::sum(grad, at::IntArrayRef{0, 2, 3}, /*keepdim=*/false, acc_t);
  if (sampling) {
    const ColumnChunks chunks(p, input, weight, column_budget_bytes);
    const int64_t G = chunks.groups, Og = chunks.out_per_group, Kg = chunks.rows_per_group;
    const at::Tensor col_buffer = chunks.new_buffer(input), grad_col_buffer = chunks.new_buffer(input);
    at::Tensor grad_weight_g = grad_weight_acc.view({G, Og, Kg});
    for (int64_t b0 = 0; b0 < p.batch; b0 += chunks.images) {
      const int64_t images = std::min(chunks.images, p.batch - b0);
      at::Tensor col = chunks.columns(col_buffer, images);
      at::Tensor grad_col = chunks.columns(grad_col_buffer, images);
      sampler.im2col(p, input, offset, mask, b0, images, col);
      const at::Tensor go = grad.narrow(0, b0, images).view({images * G, Og, chunks.pixels});
      at::bmm_out(grad_col, chunks.weights(images).transpose(1, 2), go);  // dcol = W^T dY
      grad_weight_g += at::sum(at::bmm(go, col.transpose(1, 2)).view({images, G, Og, Kg}), at::IntArrayRef{0},
                               /*keepdim=*/false, acc_t);  // dW
      sampler.backward(p, input, offset, mask, b0, images, grad_col, grad_input_acc, grad_offset, grad_mask);
    }
  }
  return {grad_input_acc.to(t), grad_weight_acc.to(t), grad_offset, grad_mask, grad_bias};
}

}  // namespace opforge
