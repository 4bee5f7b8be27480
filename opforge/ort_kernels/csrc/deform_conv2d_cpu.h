// opforge's deform_conv2d computation for ORT's CPU EP on NCHW buffers, shared by the
// kernels of every node form that means torchvision's deform_conv2d
// (opforge::deform_conv2d, mmdeploy's MMCVModulatedDeformConv2d), so their numerics
// and speed are one: gather-free channels-last sampling + the core's packed GEMM
// (core/deform_conv2d.h), parallel over (image, pixel tile) on ORT's intra-op pool.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/deform_conv2d.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

// The float32/float64 computation on NCHW buffers (x, w, off, msk may be
// null when !p.use_mask, bias) into out.
template <typename F>
inline void deform_conv2d_cpu(OrtKernelContext* ctx, const core::DeformConv2dParams& p, const F* x, const F* weight,
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

// The whole node for storage type T, the checked params p (use_mask: msk not null):
// float / double directly; float16 / bfloat16 computed in float32 (like the torch
// CPU kernel) and rounded once. bias has p.out_channels values.
template <typename T>
inline void deform_conv2d_run(OrtKernelContext* ctx, const core::DeformConv2dParams& p, const T* input,
                              const T* weight, const T* offset, const T* mask, const T* bias, T* out) {
  if (p.batch == 0) return;
  const int64_t P = p.out_pixels();
  if (p.samples_nothing()) {  // nothing to sample: the output is the bias
    for (int64_t i = 0; i < p.batch * p.out_channels; ++i) std::fill(out + i * P, out + (i + 1) * P, bias[i % p.out_channels]);
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    deform_conv2d_cpu<T>(ctx, p, input, weight, offset, mask, bias, out);
  } else {
    // float16 / bfloat16: computed in float32 (like the torch CPU kernel), rounded once.
    const int64_t offset_numel = p.batch * 2 * p.offset_groups * p.taps() * P;
    const std::vector<float> x = widened(ctx, input, static_cast<size_t>(p.batch * p.in_channels * p.in_pixels()));
    const std::vector<float> w = widened(ctx, weight, static_cast<size_t>(p.out_channels * p.in_channels_per_group() * p.taps()));
    const std::vector<float> off = widened(ctx, offset, static_cast<size_t>(offset_numel));
    const std::vector<float> b = widened(ctx, bias, static_cast<size_t>(p.out_channels));
    const std::vector<float> m = mask ? widened(ctx, mask, static_cast<size_t>(offset_numel / 2)) : std::vector<float>();
    std::vector<float> y(static_cast<size_t>(p.batch * p.out_channels * P));
    deform_conv2d_cpu<float>(ctx, p, x.data(), w.data(), off.data(), mask ? m.data() : nullptr, b.data(), y.data());
    auto* dst = core_ptr(out);
    for (size_t i = 0; i < y.size(); ++i) dst[i] = core::store<std::remove_pointer_t<decltype(dst)>>(y[i]);
  }
}

// The CPU EP's part of DeformConv2dKernel (ort_common.h) and of mmdeploy's
// ModulatedDeformConvKernel: deform_conv2d_run; a null bias is none (zeros, as
// torchvision adds for a node without one).
struct DeformConv2dCpu {
  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const char* /*op*/, const core::DeformConv2dParams& p, const T* input,
                  const T* weight, const T* offset, const T* mask, const T* bias, T* out) const {
    std::vector<T> zeros;
    if (bias == nullptr) {
      zeros.assign(static_cast<size_t>(p.out_channels), T{});
      bias = zeros.data();
    }
    deform_conv2d_run<T>(ctx, p, input, weight, offset, mask, bias, out);
    return Ort::Status(nullptr);
  }
};

}  // namespace ort
}  // namespace opforge
