// ORT kernel of opforge::deform_conv2d (domain "opforge", version 1): inputs
// (input, weight, offset, mask, bias), int attributes stride_h, stride_w, pad_h,
// pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask — the torch
// schema one to one. Same core as the torch extension (core/deform_conv2d.h:
// gather-free channels-last sampling + the core's packed GEMM), parallel over
// (image, pixel tile) on ORT's intra-op pool. float16 / bfloat16 compute in
// float32 and round once (as the torch CPU kernel does).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/deform_conv2d.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

DeformConv2dAttrs::DeformConv2dAttrs(const OrtKernelInfo* info) {
  constexpr const char* op = "opforge::deform_conv2d";
  // All five inputs, always (the torch schema's; an unused mask is an empty tensor, as torchvision passes it).
  check_node_arity(info, op, {"input", "weight", "offset", "mask", "bias"});
  const auto attr = [&](const char* name) { return node_attribute<int64_t>(info, op, name); };
  stride_h = attr("stride_h");
  stride_w = attr("stride_w");
  pad_h = attr("pad_h");
  pad_w = attr("pad_w");
  dil_h = attr("dilation_h");
  dil_w = attr("dilation_w");
  groups = attr("groups");
  offset_groups = attr("offset_groups");
  const int64_t mask_flag = attr("use_mask");
  if (mask_flag != 0 && mask_flag != 1)
    node_error(std::string(op) + ": attribute use_mask must be 0 or 1, got " + std::to_string(mask_flag));
  use_mask = mask_flag != 0;
  if (std::string err = core::deform_conv2d_check_attrs(stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups,
                                                        offset_groups);
      !err.empty())
    node_error(err);
}

std::string DeformConv2dAttrs::check(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                                     const std::vector<int64_t>& os, const std::vector<int64_t>& ms,
                                     const std::vector<int64_t>& bs, core::DeformConv2dParams& p) const {
  return core::deform_conv2d_check(xs.data(), static_cast<int>(xs.size()), ws.data(), static_cast<int>(ws.size()),
                                   os.data(), static_cast<int>(os.size()), ms.data(), static_cast<int>(ms.size()),
                                   bs.data(), static_cast<int>(bs.size()), stride_h, stride_w, pad_h, pad_w, dil_h,
                                   dil_w, groups, offset_groups, use_mask, p);
}

// The float32/float64 computation on NCHW buffers (x, w, off, msk may be
// null when !p.use_mask, bias) into out.
template <typename F>
void deform_conv2d_cpu(OrtKernelContext* ctx, const core::DeformConv2dParams& p, const F* x, const F* weight,
                       const F* off, const F* msk, const F* bias, F* out) {
  const int64_t C = p.in_channels, HW = p.in_pixels();
  std::vector<F> x_nhwc(static_cast<size_t>(p.batch * C * HW));
  parallel_for(ctx, p.batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) core::nchw_to_nhwc(x + b * C * HW, x_nhwc.data() + b * C * HW, C, HW);
  });
  std::vector<F> w_tm(static_cast<size_t>(p.out_channels * p.in_channels_per_group() * p.taps()));
  core::weight_to_tap_major(weight, w_tm.data(), p.out_channels, p.in_channels_per_group(), p.taps());

  const int64_t P = p.out_pixels(), tile = core::forward_tile_pixels(p, sizeof(F));
  const int64_t tiles = (P + tile - 1) / tile;
  parallel_for(ctx, p.batch * tiles, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<F> colT;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, p0 = (t % tiles) * tile;
      core::deform_conv2d_forward_tile(p, x_nhwc.data(), off, msk, w_tm.data(), bias, out, b, p0,
                                       std::min(tile, P - p0), colT);
    }
  });
}

// 16-bit storage -> float32 copy (core/half.h conversions, exact).
template <typename T>
std::vector<float> widen(const T* data, size_t count) {
  std::vector<float> v(count);
  const auto* src = core_ptr(data);
  for (size_t i = 0; i < count; ++i) v[i] = core::load(src[i]);
  return v;
}

template <typename T>
struct DeformConv2dKernel : DeformConv2dAttrs {
  DeformConv2dKernel(const OrtApi*, const OrtKernelInfo* info) : DeformConv2dAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& weight,
                      const Ort::Custom::Tensor<T>& offset, const Ort::Custom::Tensor<T>& mask,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& output) {
    core::DeformConv2dParams p;
    const std::string err = check(input.Shape(), weight.Shape(), offset.Shape(), mask.Shape(), bias.Shape(), p);
    if (!err.empty()) return invalid_argument(err);
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    if (p.batch == 0) return Ort::Status(nullptr);
    if (p.samples_nothing()) {  // nothing to sample: the output is the bias
      const T* b = bias.Data();
      const int64_t P = p.out_pixels();
      for (int64_t i = 0; i < p.batch * p.out_channels; ++i) std::fill(out + i * P, out + (i + 1) * P, b[i % p.out_channels]);
      return Ort::Status(nullptr);
    }
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      deform_conv2d_cpu<T>(ctx, p, input.Data(), weight.Data(), offset.Data(), use_mask ? mask.Data() : nullptr,
                           bias.Data(), out);
    } else {
      // float16 / bfloat16: computed in float32 (like the torch CPU kernel), rounded once.
      const auto f = [](const Ort::Custom::Tensor<T>& t) { return widen(t.Data(), t.NumberOfElement()); };
      const std::vector<float> x = f(input), w = f(weight), off = f(offset), b = f(bias);
      const std::vector<float> m = use_mask ? f(mask) : std::vector<float>();
      std::vector<float> y(static_cast<size_t>(p.batch * p.out_channels * p.out_pixels()));
      deform_conv2d_cpu<float>(ctx, p, x.data(), w.data(), off.data(), use_mask ? m.data() : nullptr, b.data(),
                               y.data());
      auto* dst = core_ptr(out);
      for (size_t i = 0; i < y.size(); ++i) dst[i] = core::store<std::remove_pointer_t<decltype(dst)>>(y[i]);
    }
    return Ort::Status(nullptr);
  }
};

static void append_deform_conv2d_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<DeformConv2dKernel<T>>("deform_conv2d", kCpuEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_deform_conv2d_ops);
