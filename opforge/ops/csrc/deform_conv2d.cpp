// CPU kernels of opforge::deform_conv2d and its backward: the shared sampling
// core (core/deform_conv2d.h) + ATen's GEMM (MKL/BLAS through mm.out / addmm.out),
// parallel over (image, pixel tile) with torch's intra-op pool.
#include <algorithm>
#include <tuple>
#include <vector>

#include "core/deform_conv2d.h"
#include "deform_conv2d_args.h"
#include "opforge/torch_c_shim.h"
#include "opforge/torch_op.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {

using core::DeformConv2dParams;

Tensor deform_conv2d_cpu(const Tensor& input_, const Tensor& weight_, const Tensor& offset_, const Tensor& mask_,
                         const Tensor& bias_, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                         int64_t dil_h, int64_t dil_w, int64_t groups, int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input_, weight_, offset_, mask_, bias_, stride_h, stride_w,
                                                        pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
  if (is_16bit(input_.scalar_type())) {
    // 16-bit floats: sample and accumulate in float32 (CPUs have no fast 16-bit
    // FMA path here), round the result once.
    const ScalarType f = ScalarType::Float;
    return to_dtype(deform_conv2d_cpu(to_dtype(input_, f), to_dtype(weight_, f), to_dtype(offset_, f),
                                      use_mask ? to_dtype(mask_, f) : mask_, to_dtype(bias_, f), stride_h, stride_w,
                                      pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask),
                    input_.scalar_type());
  }
  const Tensor input = prepared(input_), weight = prepared(weight_), offset = prepared(offset_);
  const Tensor mask = use_mask ? prepared(mask_) : mask_;
  const Tensor bias = prepared(bias_);
  Tensor out = empty_tensor({p.batch, p.out_channels, p.out_h, p.out_w}, input.scalar_type(), input);
  if (p.batch == 0) return out;
  if (p.samples_nothing()) {
    torch::stable::copy_(out, reshaped(bias, {1, p.out_channels, 1, 1}));  // broadcast
    return out;
  }

  // Channels-last input and tap-major weight: the sampling then needs no
  // gathers (see im2col_nhwc_tile) and the GEMM reads columns pixel-major.
  const Tensor input_nhwc = prepared(permuted(input, {0, 2, 3, 1}));
  const int64_t Cg = p.in_channels_per_group();
  const Tensor weight_tm = prepared(transpose(reshaped(weight, {p.out_channels, Cg, p.taps()}), 1, 2));

  dispatch_compute(input.scalar_type(), "opforge::deform_conv2d", [&]<typename T>() {
    const int64_t P = p.out_pixels(), tile = core::forward_tile_pixels(p, sizeof(T));
    const int64_t tiles_per_image = (P + tile - 1) / tile;
    const T* in = data<T>(input_nhwc);
    const T* off = data<T>(offset);
    const T* msk = use_mask ? data<T>(mask) : nullptr;
    const T* w = data<T>(weight_tm);
    const T* b = data<T>(bias);
    T* o = mutable_data<T>(out);
    parallel_for(0, p.batch * tiles_per_image, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> colT;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t n = task / tiles_per_image, p0 = (task % tiles_per_image) * tile;
        core::deform_conv2d_forward_tile(p, in, off, msk, w, b, o, n, p0, std::min(tile, P - p0), colT);
      }
    });
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_cpu(
    const Tensor& grad_, const Tensor& input_, const Tensor& weight_, const Tensor& offset_, const Tensor& mask_,
    const Tensor& bias_, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dil_h,
    int64_t dil_w, int64_t groups, int64_t offset_groups, bool use_mask) {
  const DeformConv2dParams p = deform_conv2d_check_args(input_, weight_, offset_, mask_, bias_, stride_h, stride_w,
                                                        pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
  deform_conv2d_check_grad(p, grad_);
  if (is_16bit(input_.scalar_type())) {
    auto f = [](const Tensor& t) { return to_dtype(t, ScalarType::Float); };
    auto [gi, gw, go, gm, gb] =
        deform_conv2d_backward_cpu(f(grad_), f(input_), f(weight_), f(offset_), use_mask ? f(mask_) : mask_, f(bias_),
                                   stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask);
    const ScalarType t = input_.scalar_type();
    return {to_dtype(gi, t), to_dtype(gw, t), to_dtype(go, t), to_dtype(gm, use_mask ? t : mask_.scalar_type()),
            to_dtype(gb, t)};
  }
  const Tensor grad = prepared(grad_, input_.scalar_type());
  const Tensor input = prepared(input_), weight = prepared(weight_), offset = prepared(offset_);
  const Tensor mask = use_mask ? prepared(mask_) : mask_;

  Tensor grad_input = zeros_as(input);
  Tensor grad_weight = zeros_as(weight);
  Tensor grad_offset = zeros_as(offset);
  // contiguous whatever the mask's layout (a channels_last mask is dense but
  // not contiguous): coord_grad_tile writes it as [N, G*kh*kw, oh, ow]
  Tensor grad_mask = zeros_as(mask_);
  const std::vector<int64_t> reduce_dims{0, 2, 3};
  Tensor grad_bias = torch::stable::sum(grad, IntList(reduce_dims));
  if (p.batch == 0 || p.samples_nothing())
    return {grad_input, grad_weight, grad_offset, grad_mask, to_dtype(grad_bias, bias_.scalar_type())};

  dispatch_compute(input.scalar_type(), "opforge::deform_conv2d_backward", [&]<typename T>() {
    const int64_t P = p.out_pixels(), kk = p.taps();
    const int64_t Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
    const int64_t tile = std::min<int64_t>(256, P), tiles = (P + tile - 1) / tile;
    const T* in = data<T>(input);
    const T* off = data<T>(offset);
    const T* msk = use_mask ? data<T>(mask) : nullptr;
    T* gin = mutable_data<T>(grad_input);
    T* goff = mutable_data<T>(grad_offset);
    T* gmsk = use_mask ? mutable_data<T>(grad_mask) : nullptr;
    // One image at a time bounds the column buffers to C*kh*kw*oh*ow each.
    const Tensor col = empty_tensor({p.in_channels * kk, P}, input.scalar_type(), input);
    const Tensor grad_col = empty_tensor({p.in_channels * kk, P}, input.scalar_type(), input);
    T* colp = mutable_data<T>(col);
    const T* gcol = data<T>(grad_col);
    // The per-group views the GEMMs read and write, made once.
    std::vector<Tensor> w_t, gw, col_t, gcol_g;
    for (int64_t g = 0; g < p.weight_groups; ++g) {
      w_t.push_back(transpose(reshaped(narrowed(weight, 0, g * Og, Og), {Og, Kg}), 0, 1));  // [Kg, Og]
      gw.push_back(reshaped(narrowed(grad_weight, 0, g * Og, Og), {Og, Kg}));               // [Og, Kg]
      col_t.push_back(transpose(narrowed(col, 0, g * Kg, Kg), 0, 1));                       // [P, Kg]
      gcol_g.push_back(narrowed(grad_col, 0, g * Kg, Kg));                                  // [Kg, P]
    }
    for (int64_t n = 0; n < p.batch; ++n) {
      parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
        core::TapTable<T> taps;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t p0 = t * tile;
          core::im2col_tile(p, in, off, msk, n, p0, std::min(tile, P - p0), colp + p0, P, taps);
        }
      });
      const Tensor grad_n = reshaped(narrowed(grad, 0, n, 1), {p.out_channels, P});
      for (int64_t g = 0; g < p.weight_groups; ++g) {
        const Tensor go = narrowed(grad_n, 0, g * Og, Og);                   // [Og, P]
        addmm_inplace(gw[g], go, col_t[g]);                                  // dW += dY @ col^T
        call_aten("aten::mm", "out", w_t[g], go, gcol_g[g]);                 // dcol = W^T @ dY
      }
      parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
        core::TapTable<T> taps;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t p0 = t * tile;
          core::coord_grad_tile(p, in, off, msk, n, p0, std::min(tile, P - p0), gcol + p0, P, goff, gmsk, taps);
        }
      });
      parallel_for(0, p.in_channels, 1, [&](int64_t c0, int64_t c1) {
        core::TapTable<T> taps;
        core::col2im_channels(p, off, msk, n, c0, c1, gcol, P, gin, taps);
      });
    }
  });
  return {grad_input, grad_weight, grad_offset, grad_mask, to_dtype(grad_bias, bias_.scalar_type())};
}

namespace {

// The shape rule (core::deform_conv2d_output_shapes), which the fake impl and ONNX shape
// inference run through opforge.ShapeRule (deform_conv2d.py), so they accept, refuse and size
// exactly as the kernels do. mask is read only when use_mask.
std::string deform_conv2d_rule(const RuleArgs& args, RuleShapes& out) {
  core::DeformConv2dShapes<RuleDim> in;
  in.input = args.shape(0);
  in.weight = args.shape(1);
  in.offset = args.shape(2);
  in.mask = args.shape(3);
  in.bias = args.shape(4);
  in.stride_h = args.integer(5), in.stride_w = args.integer(6), in.pad_h = args.integer(7);
  in.pad_w = args.integer(8), in.dil_h = args.integer(9), in.dil_w = args.integer(10);
  in.groups = args.integer(11), in.offset_groups = args.integer(12), in.use_mask = args.boolean(13);
  return core::deform_conv2d_output_shapes(in, out);
}

}  // namespace

OPFORGE_SHAPE_RULE(opforge, _deform_conv2d_output_shapes,
                   "(SymInt[] input, SymInt[] weight, SymInt[] offset, SymInt[] mask, SymInt[] bias, int stride_h, "
                   "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
                   "int offset_groups, bool use_mask)",
                   deform_conv2d_rule);

STABLE_TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def(
      "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, int stride_h, "
      "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, int offset_groups, "
      "bool use_mask) -> Tensor");
  m.def(
      "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
      "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
      "int offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("deform_conv2d", TORCH_BOX(&deform_conv2d_cpu));
  m.impl("_deform_conv2d_backward", TORCH_BOX(&deform_conv2d_backward_cpu));
}

// AOTInductor's C shim (opforge/torch_c_shim.h): the CPU kernel, called by a .pt2 directly.
OPFORGE_AOTI_C_SHIM(opforge, cpu, deform_conv2d,
                    (AtenTensorHandle input, AtenTensorHandle weight, AtenTensorHandle offset, AtenTensorHandle mask,
                     AtenTensorHandle bias, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                     int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups,
                     int32_t use_mask, AtenTensorHandle* ret0)) {
  const char* op = "opforge::deform_conv2d";
  return c_shim::give(
      deform_conv2d_cpu(c_shim::borrow_cpu(input, op, "input"), c_shim::borrow_cpu(weight, op, "weight"),
                        c_shim::borrow_cpu(offset, op, "offset"), c_shim::borrow_cpu(mask, op, "mask"),
                        c_shim::borrow_cpu(bias, op, "bias"), stride_h, stride_w, pad_h, pad_w, dilation_h,
                        dilation_w, groups, offset_groups, use_mask != 0),
      ret0);
}

}  // namespace opforge
