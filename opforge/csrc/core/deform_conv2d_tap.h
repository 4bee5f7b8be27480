// The part of the deformable-convolution core that the CPU code and the CUDA
// kernels share verbatim (host + device): the problem description and the
// bilinear tap of one (output pixel, kernel tap). Everything numerical about
// where a sample lands and how it is weighted lives here, once, so torch CPU,
// torch CUDA, ORT CPU and ORT CUDA sample identically by construction.
#pragma once

#include <cmath>  // NAN
#include <cstdint>

#include "host_device.h"

namespace opforge {
namespace core {

struct DeformConv2dParams {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t weight_groups = 1, offset_groups = 1;
  bool use_mask = false;
  int64_t out_h = 0, out_w = 0;

  OPFORGE_HD int64_t taps() const { return kernel_h * kernel_w; }
  OPFORGE_HD int64_t out_pixels() const { return out_h * out_w; }
  OPFORGE_HD int64_t in_pixels() const { return in_h * in_w; }
  OPFORGE_HD int64_t channels_per_offset_group() const { return in_channels / offset_groups; }
  OPFORGE_HD int64_t in_channels_per_group() const { return in_channels / weight_groups; }
  OPFORGE_HD int64_t out_channels_per_group() const { return out_channels / weight_groups; }
  // Rows of the column matrix of one weight group: (C/wg) * kh * kw.
  OPFORGE_HD int64_t col_rows_per_group() const { return in_channels_per_group() * taps(); }
  // No input element to sample (H*W = 0 or C = 0; padding can still make the
  // output non-empty): every column is 0, the output is the bias. The front
  // ends take this path before any sampler runs, because the samplers read
  // corner 0 of the plane unconditionally (its weight is then 0).
  OPFORGE_HD bool samples_nothing() const { return in_pixels() == 0 || in_channels == 0; }
};

// One bilinear tap: the sampling point (y, x) of output pixel (oy, ox) and
// kernel tap (i, j) displaced by (dy, dx), weighted by mask value mv.
// Corner order: 0 = (y_low, x_low), 1 = (y_low, x_high), 2 = (y_high, x_low), 3 = (y_high, x_high).
template <typename T>
struct Tap {
  int32_t idx[4];  // corner element index in the HxW plane (0 when outside; weight is then 0)
  T w[4];          // forward weights: bilinear * mask, 0 outside the sampling window (torchvision)
  T frac_h, frac_w;
  uint8_t valid;   // bit c: corner c inside the image
  bool inside;     // sampling point inside (-1, H) x (-1, W)
  bool nan_point;  // the sampling point is NaN (a NaN offset)
};

// NaN semantics, torchvision's: its kernels test the sampling window with
// comparisons that are all false for NaN, so a NaN offset or a NaN mask value
// makes that tap's column entry NaN (forward output, and grad_weight through the
// columns), a NaN offset makes that point's grad_offset and grad_mask NaN, and
// grad_input receives nothing from it (its scatter only visits in-image corners,
// and a NaN point has none). Infinite offsets are simply outside (0).
// Here: every forward weight is NaN (corner 0's index is 0, inside any non-empty
// plane), the fractions are NaN for a NaN point, and adjoint scatters skip
// corners that are not `valid`.

template <typename T>
OPFORGE_HD_INLINE Tap<T> compute_tap(const DeformConv2dParams& p, int64_t oy, int64_t ox, int64_t i, int64_t j,
                                         T dy, T dx, T mv) {
  const int64_t H = p.in_h, W = p.in_w;
  const T y = static_cast<T>(oy * p.stride_h - p.pad_h + i * p.dil_h) + dy;
  const T x = static_cast<T>(ox * p.stride_w - p.pad_w + j * p.dil_w) + dx;
  const T fy = floor_hd(y), fx = floor_hd(x);
  // Guard the int conversion for huge/nan offsets: such points are outside anyway.
  const bool finite = fy > T(-2) && fy < static_cast<T>(H + 1) && fx > T(-2) && fx < static_cast<T>(W + 1);
  const int64_t yl = finite ? static_cast<int64_t>(fy) : -2, xl = finite ? static_cast<int64_t>(fx) : -2;
  const int64_t yh = yl + 1, xh = xl + 1;
  const T lh = finite ? y - fy : T(0), lw = finite ? x - fx : T(0), hh = T(1) - lh, hw = T(1) - lw;
  const bool v_yl = yl >= 0 && yl < H, v_yh = yh >= 0 && yh < H, v_xl = xl >= 0 && xl < W, v_xh = xh >= 0 && xh < W;
  const bool c0 = v_yl && v_xl, c1 = v_yl && v_xh, c2 = v_yh && v_xl, c3 = v_yh && v_xh;
  Tap<T> t;
  t.inside = finite && y > T(-1) && y < static_cast<T>(H) && x > T(-1) && x < static_cast<T>(W);
  t.nan_point = y != y || x != x;
  const T s = t.inside ? mv : T(0);
  t.idx[0] = c0 ? static_cast<int32_t>(yl * W + xl) : 0;
  t.idx[1] = c1 ? static_cast<int32_t>(yl * W + xh) : 0;
  t.idx[2] = c2 ? static_cast<int32_t>(yh * W + xl) : 0;
  t.idx[3] = c3 ? static_cast<int32_t>(yh * W + xh) : 0;
  t.w[0] = c0 ? s * hh * hw : T(0);
  t.w[1] = c1 ? s * hh * lw : T(0);
  t.w[2] = c2 ? s * lh * hw : T(0);
  t.w[3] = c3 ? s * lh * lw : T(0);
  t.frac_h = lh;
  t.frac_w = lw;
  t.valid = static_cast<uint8_t>((c0 ? 1 : 0) | (c1 ? 2 : 0) | (c2 ? 4 : 0) | (c3 ? 8 : 0));
  if (t.nan_point || mv != mv) {
    const T nan = static_cast<T>(NAN);
    for (int c = 0; c < 4; ++c) t.w[c] = nan;
    if (t.nan_point) t.frac_h = t.frac_w = nan;
  }
  return t;
}

}  // namespace core
}  // namespace opforge
