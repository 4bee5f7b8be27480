// The part of the rotated RoI Align core that the CPU code and the CUDA
// kernels share verbatim (host + device): the problem description, one roi's
// sampling geometry, and where one sampling point lands in the feature map.
// Everything numerical about a sample lives here, once, so torch CPU, torch
// CUDA, ORT CPU and ORT CUDA sample identically.
//
// Semantics (mmcv's roi_align_rotated, itself detectron2's ROIAlignRotated):
// roi k = (batch index, cx, cy, w, h, theta). In feature pixels the centre is
// (cx, cy) * spatial_scale - offset (offset 0.5 when `aligned`, else 0) and the
// size (w, h) * spatial_scale (at least 1 x 1 when not `aligned`: mmdetection's
// legacy clamp). The roi is cut into output_height x output_width bins, each
// sampled on a grid of sampling_ratio^2 points (sampling_ratio <= 0: ceil(bin
// size) points per axis, "adaptive"); a point at (xx, yy) relative to the
// centre is rotated by theta (-theta when `clockwise`) and read bilinearly;
// the bin's value is the mean of its points (a grid of 0 points gives 0).
#pragma once

#include <cstdint>

#include "host_device.h"

namespace opforge {
namespace core {

// input [N, C, H, W] (the CPU kernels read it as [N, H, W, C]: roi_align_rotated.h),
// rois [K, 6], output [K, C, pooled_h, pooled_w].
struct RoiAlignRotatedParams {
  int64_t batch = 0, channels = 0, height = 0, width = 0;  // N, C, H, W
  int64_t rois = 0;                                        // K
  int64_t pooled_h = 0, pooled_w = 0;
  // float32, as ONNX stores the attribute: torch and ORT compute with the same value.
  float spatial_scale = 1.0f;
  int64_t sampling_ratio = 0;  // <= 0: adaptive
  bool aligned = true, clockwise = false;

  OPFORGE_HD int64_t bins() const { return pooled_h * pooled_w; }
  OPFORGE_HD int64_t map_size() const { return height * width; }
};

// The sampling grid per axis is bounded (roi_align_rotated_check_rois refuses
// more) so that no roi in a model can make a kernel loop without bound: an
// adaptive grid follows the roi's size, which is data.
constexpr int64_t kRoiAlignRotatedMaxGridPoints = int64_t(1) << 16;  // per bin, grid_h * grid_w
// A grid size past any allowed one (the saturated value of a huge or non-finite size).
constexpr int64_t kRoiAlignRotatedGridOverflow = kRoiAlignRotatedMaxGridPoints + 1;

// One roi's sampling geometry in the accumulation type A.
template <typename A>
struct RotatedRoi {
  int64_t image;          // batch index
  A center_x, center_y;   // feature pixels, alignment offset applied
  A start_x, start_y;     // -w/2, -h/2: the roi's corner relative to its centre
  A bin_w, bin_h;         // bin size in feature pixels
  A cos_t, sin_t;         // of the angle as sampled (negated when clockwise)
  int64_t grid_w, grid_h; // points per bin along each axis (saturated at kRoiAlignRotatedGridOverflow)
  A count;                // the mean's divisor: max(grid_h * grid_w, 1)
};

// Points per axis: the fixed ratio, or ceil(bin size) saturated so that a huge,
// infinite or NaN size never reaches an integer conversion.
template <typename A>
OPFORGE_HD_INLINE int64_t roi_align_rotated_grid(int64_t sampling_ratio, A bin) {
  if (sampling_ratio > 0) return sampling_ratio;
  const A g = ceil_hd(bin);
  return g <= static_cast<A>(kRoiAlignRotatedMaxGridPoints) ? (g > A(0) ? static_cast<int64_t>(g) : 0)
                                                            : kRoiAlignRotatedGridOverflow;
}

// roi = the 6 values of one roi, already loaded in A. The batch index must
// have passed roi_align_rotated_check_rois (an integer in [0, N)).
template <typename A>
OPFORGE_HD_INLINE RotatedRoi<A> rotated_roi(const RoiAlignRotatedParams& p, const A* roi) {
  RotatedRoi<A> r;
  const A scale = static_cast<A>(p.spatial_scale);
  const A offset = p.aligned ? A(0.5) : A(0);
  r.image = static_cast<int64_t>(roi[0]);
  r.center_x = roi[1] * scale - offset;
  r.center_y = roi[2] * scale - offset;
  A w = roi[3] * scale, h = roi[4] * scale;
  const A theta = p.clockwise ? -roi[5] : roi[5];
  r.cos_t = cos_hd(theta);
  r.sin_t = sin_hd(theta);
  if (!p.aligned) {  // mmdetection's legacy behaviour: rois at least one pixel wide and high
    w = w > A(1) ? w : A(1);
    h = h > A(1) ? h : A(1);
  }
  r.bin_w = w / static_cast<A>(p.pooled_w);
  r.bin_h = h / static_cast<A>(p.pooled_h);
  r.start_x = -w / A(2);
  r.start_y = -h / A(2);
  r.grid_w = roi_align_rotated_grid(p.sampling_ratio, r.bin_w);
  r.grid_h = roi_align_rotated_grid(p.sampling_ratio, r.bin_h);
  const int64_t points = r.grid_w * r.grid_h;  // both <= 2^16 + 1: no overflow
  r.count = static_cast<A>(points > 0 ? points : 1);
  return r;
}

// One sampling point's four bilinear taps in the H x W map: positions
// y * W + x (all inside the map) and weights. `valid` false: the point lies
// outside [-1, H] x [-1, W] (or is NaN) and contributes nothing.
template <typename A>
struct RoiSample {
  int64_t pos[4];
  A w[4];
  bool valid;
};

// Point (ix, iy) of bin (ph, pw). Coordinates are tested in floating point
// before any integer conversion, so a NaN or infinite coordinate (an angle or
// size beyond float's range) samples nothing instead of forming an index.
// Inside the box, coordinates below 0 are clamped to 0 and those past the
// last row/column to it (roi_align's border rule).
template <typename A>
OPFORGE_HD_INLINE RoiSample<A> rotated_roi_sample(const RotatedRoi<A>& r, int64_t height, int64_t width, int64_t ph,
                                                  int64_t pw, int64_t iy, int64_t ix) {
  RoiSample<A> s;
  const A yy = r.start_y + static_cast<A>(ph) * r.bin_h +
               (static_cast<A>(iy) + A(0.5)) * r.bin_h / static_cast<A>(r.grid_h);
  const A xx = r.start_x + static_cast<A>(pw) * r.bin_w +
               (static_cast<A>(ix) + A(0.5)) * r.bin_w / static_cast<A>(r.grid_w);
  A y = yy * r.cos_t - xx * r.sin_t + r.center_y;
  A x = yy * r.sin_t + xx * r.cos_t + r.center_x;
  const A fh = static_cast<A>(height), fw = static_cast<A>(width);
  if (!(y >= A(-1) && y <= fh && x >= A(-1) && x <= fw)) {
    s.valid = false;
    for (int k = 0; k < 4; ++k) {
      s.pos[k] = 0;
      s.w[k] = A(0);
    }
    return s;
  }
  s.valid = true;
  if (y <= A(0)) y = A(0);
  if (x <= A(0)) x = A(0);
  int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<A>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<A>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const A ly = y - static_cast<A>(y_low), lx = x - static_cast<A>(x_low);
  const A hy = A(1) - ly, hx = A(1) - lx;
  s.pos[0] = y_low * width + x_low;
  s.pos[1] = y_low * width + x_high;
  s.pos[2] = y_high * width + x_low;
  s.pos[3] = y_high * width + x_high;
  s.w[0] = hy * hx;
  s.w[1] = hy * lx;
  s.w[2] = ly * hx;
  s.w[3] = ly * lx;
  return s;
}

}  // namespace core
}  // namespace opforge
