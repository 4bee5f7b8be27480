// CPU kernels of opforge::deform_conv2d and its backward: the shared sampling
// core (core/deform_conv2d.h) + ATen's GEMM (MKL/BLAS through at::mm_out),
// parallel over (image, pixel tile) with ATen's intra-op pool.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "core/deform_conv2d.h"
#include "deform_conv2d_args.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {

using core::DeformConv2dParams;

at::Tensor deform_conv2d_cpu(const at::Tensor& input_, const at::Tensor& weight_, const at::Tensor& offset_,
                             const at::Tensor& mask_, const at::Tensor& bias_, int64_t stride_h, int64_t stride_w,
                             int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups,
                             int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input_, weight_, offset_, mask_, bias_, stride_h, stride_w, pad_h, pad_w,
                                          dil_h, dil_w, groups, offset_groups, use_mask);
  if (is_16bit(input_.scalar_type())) {
    // 16-bit floats: sample and accumulate in float32 (CPUs have no fast 16-bit
    // FMA path here), round the result once.
    return deform_conv2d_cpu(input_.to(at::kFloat), weight_.to(at::kFloat), offset_.to(at::kFloat),
                             use_mask ? mask_.to(at::kFloat) : mask_, bias_.to(at::kFloat), stride_h, stride_w, pad_h,
                             pad_w, dil_h, dil_w, groups, offset_groups, use_mask)
        .to(input_.scalar_type());
  }
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous(), offset = offset_.contiguous();
  const at::Tensor mask = use_mask ? mask_.contiguous() : mask_;
  const at::Tensor bias = bias_.contiguous();
  at::Tensor out = at::empty({p.batch, p.out_channels, p.out_h, p.out_w}, input.options());
  if (p.batch == 0) return out;
  if (p.samples_nothing()) return out.copy_(bias.view({1, p.out_channels, 1, 1}).expand_as(out));

  // Channels-last input and tap-major weight: the sampling then needs no
  // gathers (see im2col_nhwc_tile) and the GEMM reads columns pixel-major.
  const at::Tensor input_nhwc = input.permute({0, 2, 3, 1}).contiguous();
  const int64_t Cg = p.in_channels_per_group();
  const at::Tensor weight_tm = weight.view({p.out_channels, Cg, p.taps()}).transpose(1, 2).contiguous();

  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge::deform_conv2d", [&] {
    using T = scalar_t;
    const int64_t P = p.out_pixels(), tile = core::forward_tile_pixels(p, sizeof(T));
    const int64_t tiles_per_image = (P + tile - 1) / tile;
    const T* in = input_nhwc.const_data_ptr<T>();
    const T* off = offset.const_data_ptr<T>();
    const T* msk = use_mask ? mask.const_data_ptr<T>() : nullptr;
    const T* w = weight_tm.const_data_ptr<T>();
    const T* b = bias.const_data_ptr<T>();
    T* o = out.mutable_data_ptr<T>();
    at::parallel_for(0, p.batch * tiles_per_image, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> colT;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t n = task / tiles_per_image, p0 = (task % tiles_per_image) * tile;
        core::deform_conv2d_forward_tile(p, in, off, msk, w, b, o, n, p0, std::min(tile, P - p0), colT);
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_cpu(
    const at::Tensor& grad_, const at::Tensor& input_, const at::Tensor& weight_, const at::Tensor& offset_,
    const at::Tensor& mask_, const at::Tensor& bias_, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups, int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input_, weight_, offset_, mask_, bias_, stride_h, stride_w, pad_h, pad_w,
                                          dil_h, dil_w, groups, offset_groups, use_mask);
  TORCH_CHECK(grad_.dim() == 4 && grad_.size(0) == p.batch && grad_.size(1) == p.out_channels &&
                        grad_.size(2) == p.out_h && grad_.size(3) == p.out_w,
                    "opforge::deform_conv2d backward: grad has shape ", grad_.sizes(), ", expected [", p.batch, ", ",
                    p.out_channels, ", ", p.out_h, ", ", p.out_w, "]");
  if (is_16bit(input_.scalar_type())) {
    auto f = [](const at::Tensor& t) { return t.to(at::kFloat); };
    auto [gi, gw, go, gm, gb] =
        deform_conv2d_backward_cpu(f(grad_), f(input_), f(weight_), f(offset_), use_mask ? f(mask_) : mask_, f(bias_),
                                   stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
    const at::ScalarType t = input_.scalar_type();
    return {gi.to(t), gw.to(t), go.to(t), use_mask ? gm.to(t) : gm.to(mask_.scalar_type()), gb.to(t)};
  }
  const at::Tensor grad = grad_.contiguous().to(input_.scalar_type());
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous(), offset = offset_.contiguous();
  const at::Tensor mask = use_mask ? mask_.contiguous() : mask_;

  at::Tensor grad_input = at::zeros_like(input);
  at::Tensor grad_weight = at::zeros_like(weight);
  at::Tensor grad_offset = at::zeros_like(offset);
  // contiguous whatever the mask's layout (a channels_last mask is dense but
  // not contiguous): coord_grad_tile writes it as [N, G*kh*kw, oh, ow]
  at::Tensor grad_mask = at::zeros(mask_.sizes(), mask_.options());
  at::Tensor grad_bias = grad.sum({0, 2, 3});
  if (p.batch == 0 || p.samples_nothing())
    return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias.to(bias_.scalar_type())};

  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge::deform_conv2d_backward", [&] {
    using T = scalar_t;
    const int64_t P = p.out_pixels(), kk = p.taps();
    const int64_t Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
    const int64_t tile = std::min<int64_t>(256, P), tiles = (P + tile - 1) / tile;
    const T* in = input.const_data_ptr<T>();
    const T* off = offset.const_data_ptr<T>();
    const T* msk = use_mask ? mask.const_data_ptr<T>() : nullptr;
    const at::TensorOptions opts = input.options();
    // One image at a time bounds the column buffers to C*kh*kw*oh*ow each.
    at::Tensor col = at::empty({p.in_channels * kk, P}, opts);
    at::Tensor grad_col = at::empty({p.in_channels * kk, P}, opts);
    T* colp = col.mutable_data_ptr<T>();
    for (int64_t n = 0; n < p.batch; ++n) {
      at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
        core::TapTable<T> taps;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t p0 = t * tile;
          core::im2col_tile(p, in, off, msk, n, p0, std::min(tile, P - p0), colp + p0, P, taps);
        }
      });
      const at::Tensor grad_n = grad[n].view({p.out_channels, P});
      for (int64_t g = 0; g < p.weight_groups; ++g) {
        const at::Tensor go = grad_n.narrow(0, g * Og, Og);                      // [Og, P]
        const at::Tensor w = weight.narrow(0, g * Og, Og).view({Og, Kg});        // [Og, Kg]
        at::Tensor gw = grad_weight.narrow(0, g * Og, Og).view({Og, Kg});
        gw.addmm_(go, col.narrow(0, g * Kg, Kg).t());                             // dW += dY @ col^T
        at::Tensor gcol_g = grad_col.narrow(0, g * Kg, Kg);
        at::mm_out(gcol_g, w.t(), go);                                             // dcol = W^T @ dY
      }
      const T* gcol = grad_col.const_data_ptr<T>();
      at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
        core::TapTable<T> taps;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t p0 = t * tile;
          core::coord_grad_tile(p, in, off, msk, n, p0, std::min(tile, P - p0), gcol + p0, P,
                                grad_offset.mutable_data_ptr<T>(), use_mask ? grad_mask.mutable_data_ptr<T>() : nullptr,
                                taps);
        }
      });
      at::parallel_for(0, p.in_channels, 1, [&](int64_t c0, int64_t c1) {
        core::TapTable<T> taps;
        core::col2im_channels(p, off, msk, n, c0, c1, gcol, P, grad_input.mutable_data_ptr<T>(), taps);
      });
    }
  });
  return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias.to(bias_.scalar_type())};
}

// The shape rule (core::deform_conv2d_output_shapes) as the tensor-free op
// opforge::_deform_conv2d_output_shapes, on SymInt sizes: the fake impl and ONNX
// shape inference call it through opforge.ShapeRule (deform_conv2d.py), so they
// accept, refuse and size exactly as the kernels do. mask is read only when use_mask.
std::vector<c10::SymInt> deform_conv2d_output_shapes(c10::SymIntArrayRef input, c10::SymIntArrayRef weight,
                                                     c10::SymIntArrayRef offset, c10::SymIntArrayRef mask,
                                                     c10::SymIntArrayRef bias, int64_t stride_h, int64_t stride_w,
                                                     int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w,
                                                     int64_t groups, int64_t offset_groups, bool use_mask) {
  core::DeformConv2dShapes<c10::SymInt> in;
  in.input = rule_shape(input);
  in.weight = rule_shape(weight);
  in.offset = rule_shape(offset);
  in.mask = rule_shape(mask);
  in.bias = rule_shape(bias);
  in.stride_h = stride_h, in.stride_w = stride_w, in.pad_h = pad_h, in.pad_w = pad_w, in.dil_h = dil_h;
  in.dil_w = dil_w, in.groups = groups, in.offset_groups = offset_groups, in.use_mask = use_mask;
  return run_shape_rule(in, core::deform_conv2d_output_shapes<c10::SymInt>);
}

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def(
      "_deform_conv2d_output_shapes(SymInt[] input, SymInt[] weight, SymInt[] offset, SymInt[] mask, "
      "SymInt[] bias, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
      "int offset_groups, bool use_mask) -> SymInt[]",
      &deform_conv2d_output_shapes);
  m.def(
      "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, int stride_h, "
      "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, int offset_groups, "
      "bool use_mask) -> Tensor");
  m.def(
      "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
      "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
      "int offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("deform_conv2d", &deform_conv2d_cpu);
  m.impl("_deform_conv2d_backward", &deform_conv2d_backward_cpu);
}

}  // namespace opforge
