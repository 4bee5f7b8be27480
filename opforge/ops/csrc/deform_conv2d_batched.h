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
// On LibTorch's stable ABI (opforge/torch_op.h): the GEMMs go through the dispatcher
// (call_aten: bmm, bmm.out) and the C shim baddbmm.out (baddbmm_inplace, deform_conv2d_args.h).
#pragma once

#include <algorithm>
#include <tuple>
#include <vector>

#include "core/deform_conv2d_gpu.h"
#include "core/deform_conv2d_tap.h"
#include "deform_conv2d_args.h"
#include "opforge/torch_op.h"

namespace opforge {

// The chunking forward and backward share: images per chunk (each column
// buffer within the byte budget) and the per-group weight [G, Og, Kg] repeated
// once for a full chunk, [images*G, Og, Kg] (small: the batched GEMM then
// needs no broadcasting support, and no chunk repeats it again).
struct ColumnChunks {
  int64_t groups, out_per_group, rows_per_group, pixels, per_image, images;
  Tensor weight_rep;

  ColumnChunks(const core::DeformConv2dParams& p, const Tensor& input, const Tensor& weight,
               int64_t column_budget_bytes)
      : groups(p.weight_groups),
        out_per_group(p.out_channels_per_group()),
        rows_per_group(p.col_rows_per_group()),
        pixels(p.out_pixels()),
        per_image(p.in_channels * p.taps() * p.out_pixels()),
        images(core::deform_gpu_chunk_images(p, static_cast<int64_t>(input.element_size()), column_budget_bytes)),
        weight_rep(call_aten("aten::repeat", "", reshaped(weight, {groups, out_per_group, rows_per_group}),
                             std::vector<int64_t>{images, 1, 1})) {}  // [images*G, Og, Kg]
  Tensor new_buffer(const Tensor& like) const { return empty_tensor({images * per_image}, like.scalar_type(), like); }
  // Columns of the first n images of a buffer, per (image, group): [n*G, Kg, P].
  Tensor columns(const Tensor& buffer, int64_t n) const {
    return reshaped(narrowed(buffer, 0, 0, n * per_image), {n * groups, rows_per_group, pixels});
  }
  // The weight for n images: [n*G, Og, Kg].
  Tensor weights(int64_t n) const { return narrowed(weight_rep, 0, 0, n * groups); }
};

// All tensors contiguous, checked (deform_conv2d_args.h); mask undefined or
// ignored when !p.use_mask. column_budget_bytes bounds each column buffer.
template <typename Sampler>
Tensor deform_conv2d_batched_forward(const core::DeformConv2dParams& p, const Tensor& input, const Tensor& weight,
                                     const Tensor& offset, const Tensor& mask, const Tensor& bias,
                                     const Sampler& sampler, int64_t column_budget_bytes) {
  Tensor out = empty_tensor({p.batch, p.out_channels, p.out_h, p.out_w}, input.scalar_type(), input);
  if (p.batch == 0) return out;
  sampler.fill_bias(p, bias, out);
  if (p.samples_nothing()) return out;  // all columns 0 (and the samplers must not read the empty input)
  const ColumnChunks chunks(p, input, weight, column_budget_bytes);
  const Tensor col_buffer = chunks.new_buffer(input);
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunks.images) {
    const int64_t images = std::min(chunks.images, p.batch - b0);
    Tensor col = chunks.columns(col_buffer, images);
    sampler.im2col(p, input, offset, mask, b0, images, col);
    const Tensor out_chunk =
        reshaped(narrowed(out, 0, b0, images), {images * chunks.groups, chunks.out_per_group, chunks.pixels});
    baddbmm_inplace(out_chunk, chunks.weights(images), col);  // += (bias is already in out)
  }
  return out;
}

// Returns (grad_input, grad_weight, grad_offset, grad_mask, grad_bias); 16-bit
// dtypes accumulate grad_input / grad_weight / grad_bias in float32.
template <typename Sampler>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_batched_backward(
    const core::DeformConv2dParams& p, const Tensor& grad, const Tensor& input, const Tensor& weight,
    const Tensor& offset, const Tensor& mask, const Sampler& sampler, int64_t column_budget_bytes) {
  const ScalarType t = input.scalar_type();
  const ScalarType acc_t = is_16bit(t) ? ScalarType::Float : t;
  Tensor grad_input_acc = zeros_as(input, acc_t);
  // The sampling backward writes every grad_offset / grad_mask element (as
  // contiguous buffers, whatever the caller's layout) when it runs at all.
  const bool sampling = p.batch > 0 && !p.samples_nothing();
  Tensor grad_offset = sampling ? empty_as(offset) : zeros_as(offset);
  Tensor grad_mask = p.use_mask && sampling ? empty_as(mask) : zeros_as(mask);
  const std::vector<int64_t> reduce_dims{0, 2, 3}, image_dim{0};
  Tensor grad_bias = torch::stable::sum(grad, IntList(reduce_dims), /*keepdim=*/false, acc_t);
  const int64_t G = p.weight_groups, Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  // dW per group, [G, Og, Kg]: the sum over the chunks (an add: no in-place add takes no Scalar).
  Tensor grad_weight_g = zeros_tensor({G, Og, Kg}, acc_t, weight);
  if (sampling) {
    const ColumnChunks chunks(p, input, weight, column_budget_bytes);
    const Tensor col_buffer = chunks.new_buffer(input), grad_col_buffer = chunks.new_buffer(input);
    for (int64_t b0 = 0; b0 < p.batch; b0 += chunks.images) {
      const int64_t images = std::min(chunks.images, p.batch - b0);
      Tensor col = chunks.columns(col_buffer, images);
      Tensor grad_col = chunks.columns(grad_col_buffer, images);
      sampler.im2col(p, input, offset, mask, b0, images, col);
      const Tensor go = reshaped(narrowed(grad, 0, b0, images), {images * G, Og, chunks.pixels});
      call_aten("aten::bmm", "out", transpose(chunks.weights(images), 1, 2), go, grad_col);  // dcol = W^T dY
      const Tensor dw = call_aten("aten::bmm", "", go, transpose(col, 1, 2));               // [images*G, Og, Kg]
      const Tensor dw_sum = torch::stable::sum(reshaped(dw, {images, G, Og, Kg}), IntList(image_dim),
                                               /*keepdim=*/false, acc_t);
      grad_weight_g = torch::stable::subtract(grad_weight_g, dw_sum, -1.0);  // += (exactly: a - (-1) * b)
      sampler.backward(p, input, offset, mask, b0, images, grad_col, grad_input_acc, grad_offset, grad_mask);
    }
  }
  const Tensor grad_weight_acc = reshaped(grad_weight_g, sizes_of(weight));
  return {to_dtype(grad_input_acc, t), to_dtype(grad_weight_acc, t), grad_offset, grad_mask, grad_bias};
}

}  // namespace opforge
