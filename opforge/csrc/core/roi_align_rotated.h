// Rotated RoI Align (mmcv's roi_align_rotated; semantics in
// roi_align_rotated_sample.h): the compute core shared by the torch extension
// (opforge::roi_align_rotated) and the ORT kernels. Plain C++ templates; the
// caller provides the parallel-for.
//
// Speed: the CPU kernels read the feature map channels-last, [N, H, W, C]
// (the front ends transpose once, widening 16-bit types to float32 in the same
// pass), so the C channels of one tap are contiguous: each sampling point's
// taps and weights are computed once and applied to whole C-vectors, a
// unit-stride loop the compiler vectorises at the widest vectors the CPU has
// (cpu_dispatch.h). The backward accumulates into a channels-last gradient
// split by channel ranges across threads: no atomics, no per-thread copies of
// the map, and the same summation order whatever the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "channel_rows.h"
#include "cpu_dispatch.h"
#include "format.h"
#include "layout.h"
#include "roi_align_rotated_sample.h"
#include "shape.h"

namespace opforge {
namespace core {

// Output bins per axis: far above any detector's (7, 14, 28), and small enough
// that an attribute in a model file cannot size the output beyond reason.
constexpr int64_t kRoiAlignRotatedMaxPooled = 1024;
// sampling_ratio^2 must fit the per-bin grid bound.
constexpr int64_t kRoiAlignRotatedMaxSamplingRatio = 256;

// The rule on the node's attributes alone (also applied when an ORT kernel is created).
inline std::string roi_align_rotated_check_attrs(int64_t pooled_h, int64_t pooled_w, double spatial_scale,
                                                 int64_t sampling_ratio) {
  const std::string op = "opforge::roi_align_rotated: ";
  if (pooled_h < 1 || pooled_h > kRoiAlignRotatedMaxPooled || pooled_w < 1 || pooled_w > kRoiAlignRotatedMaxPooled)
    return op + "output_size must be in [1, " + std::to_string(kRoiAlignRotatedMaxPooled) + "] per axis, got (" +
           std::to_string(pooled_h) + ", " + std::to_string(pooled_w) + ")";
  if (!(std::isfinite(spatial_scale) && spatial_scale > 0))
    return op + "spatial_scale must be a finite positive number, got " + std::to_string(spatial_scale);
  if (sampling_ratio > kRoiAlignRotatedMaxSamplingRatio)
    return op + "sampling_ratio must be at most " + std::to_string(kRoiAlignRotatedMaxSamplingRatio) +
           " (points per bin and axis; 0 or less: adaptive), got " + std::to_string(sampling_ratio);
  return "";
}

// What roi_align_rotated's shape rule reads (the schema's arguments, each tensor by its shape).
template <typename Dim>
struct RoiAlignRotatedShapes {
  Shape<Dim> input, rois;
  int64_t output_height = 1, output_width = 1;
  float spatial_scale = 1.0f;  // ONNX stores it as float32: every front end computes with that value
  int64_t sampling_ratio = 0;
  bool aligned = true, clockwise = false;
};

// roi_align_rotated's shape rule, on shapes and attributes: input (N, C, H, W)
// with a non-empty map, rois (K, 6), the attributes above, and (for known sizes)
// every element count and byte size in any dtype within int64. Gives the
// output's shape (K, C, output_height, output_width) in `out`. Returns "" when
// valid, else a message naming the op and the argument. The fake impl (through
// _roi_align_rotated_output_shapes) and every kernel apply it.
template <typename Dim>
std::string roi_align_rotated_output_shapes(const RoiAlignRotatedShapes<Dim>& in, std::vector<std::vector<Dim>>& out) {
  const std::string op = "opforge::roi_align_rotated: ";
  const Shape<Dim>&input = in.input, &rois = in.rois;
  if (input.rank() != 4) return message(op, "input must be 4-D (N, C, H, W), got shape ", input);
  if (rois.rank() != 2 || rois[1] != 6)
    return message(op, "rois must be 2-D (K, 6), one (batch index, cx, cy, w, h, angle) row per roi, got shape ",
                   rois);
  for (int i = 0; i < 4; ++i)
    if (input[i] < 0) return message(op, "input has a negative size: shape ", input);
  if (rois[0] < 0) return message(op, "rois has a negative size: shape ", rois);
  if (input[2] == 0 || input[3] == 0)
    return message(op, "input has an empty feature map (H x W = ", input[2], " x ", input[3],
                   "): there is nothing to sample");
  if (std::string err = roi_align_rotated_check_attrs(in.output_height, in.output_width, in.spatial_scale,
                                                      in.sampling_ratio);
      !err.empty())
    return err;
  const Shape<Dim> out_shape{{rois[0], input[1], Dim(in.output_height), Dim(in.output_width)}};
  // Element counts, and byte counts in any dtype (16 bytes bounds all of them).
  const auto input_dims = known_all(input.dims), out_dims = known_all(out_shape.dims);
  if (input_dims && out_dims && (!numel_fits(*input_dims, 16) || !numel_fits(*out_dims, 16)))
    return message(op, "input ", input, " or the output (K, C, output_height, output_width) = ", out_shape,
                   " has more elements than int64 can count");
  out = {out_shape.dims};
  return "";
}

// The rule for the kernels, on (pointer, rank) shapes: fills p.
inline std::string roi_align_rotated_check(const int64_t* input, int input_rank, const int64_t* rois, int rois_rank,
                                           int64_t pooled_h, int64_t pooled_w, float spatial_scale,
                                           int64_t sampling_ratio, bool aligned, bool clockwise,
                                           RoiAlignRotatedParams& p) {
  RoiAlignRotatedShapes<int64_t> in;
  in.input = shape_of(input, input_rank);
  in.rois = shape_of(rois, rois_rank);
  in.output_height = pooled_h, in.output_width = pooled_w, in.spatial_scale = spatial_scale;
  in.sampling_ratio = sampling_ratio, in.aligned = aligned, in.clockwise = clockwise;
  std::vector<std::vector<int64_t>> out;
  if (std::string err = roi_align_rotated_output_shapes(in, out); !err.empty()) return err;
  p = RoiAlignRotatedParams{};
  p.batch = input[0], p.channels = input[1], p.height = input[2], p.width = input[3];
  p.rois = rois[0], p.pooled_h = pooled_h, p.pooled_w = pooled_w;
  p.spatial_scale = spatial_scale, p.sampling_ratio = sampling_ratio, p.aligned = aligned, p.clockwise = clockwise;
  return "";
}

inline void roi_align_rotated_output_dims(const RoiAlignRotatedParams& p, int64_t out[4]) {
  out[0] = p.rois;
  out[1] = p.channels;
  out[2] = p.pooled_h;
  out[3] = p.pooled_w;
}

// The rule on the rois' values (host copies, float or double: 16-bit rois are
// widened first, exactly), which the kernels index the input with and size
// their loops by. For every roi: the batch index is an integer in [0, N);
// cx, cy, w, h and the angle are finite; w and h are not negative when
// `aligned` (mmcv asserts the same; without it they are clamped to 1); and the
// sampling grid is at most kRoiAlignRotatedMaxGridPoints points per bin (an
// adaptive grid grows with the roi). Every kernel applies it before running.
template <typename A>
inline std::string roi_align_rotated_check_rois(const RoiAlignRotatedParams& p, const A* rois) {
  const std::string op = "opforge::roi_align_rotated: ";
  const auto num = [](A v) { return std::to_string(static_cast<double>(v)); };
  static const char* const names[6] = {"batch index", "cx", "cy", "w", "h", "angle"};
  for (int64_t k = 0; k < p.rois; ++k) {
    const A* roi = rois + 6 * k;
    const std::string row = "rois row " + std::to_string(k);
    for (int i = 1; i < 6; ++i)
      if (!std::isfinite(roi[i])) return op + row + " has a non-finite " + names[i] + " (" + num(roi[i]) + ")";
    const A b = roi[0];
    if (!(b >= A(0) && b < static_cast<A>(p.batch)) || b != std::floor(b))
      return op + row + " has batch index " + num(b) + ", but input has N = " + std::to_string(p.batch) +
             " images: the index must be an integer in [0, " + std::to_string(p.batch) + ")";
    const A scale = static_cast<A>(p.spatial_scale);
    if (p.aligned && (roi[3] * scale < A(0) || roi[4] * scale < A(0)))
      return op + row + " has a negative size (w = " + num(roi[3]) + ", h = " + num(roi[4]) +
             "); with aligned=True sizes must be >= 0";
    const RotatedRoi<A> r = rotated_roi<A>(p, roi);
    if (r.grid_h * r.grid_w > kRoiAlignRotatedMaxGridPoints)
      return op + row + " (w = " + num(roi[3]) + ", h = " + num(roi[4]) + ") needs an adaptive sampling grid of " +
             (r.grid_h >= kRoiAlignRotatedGridOverflow ? std::string("more than 65536") : std::to_string(r.grid_h)) +
             " x " +
             (r.grid_w >= kRoiAlignRotatedGridOverflow ? std::string("more than 65536") : std::to_string(r.grid_w)) +
             " points per bin; at most " + std::to_string(kRoiAlignRotatedMaxGridPoints) +
             " are allowed (pass a positive sampling_ratio to fix the grid)";
  }
  return "";
}

// ---- CPU kernels ------------------------------------------------------------------------

// Rois [begin, end): out[k, c, ph, pw] for all c, ph, pw. input_nhwc is the
// map channels-last; acc is scratch of C elements.
template <typename T>
OPFORGE_ALWAYS_INLINE void roi_align_rotated_forward_impl(const RoiAlignRotatedParams& p, const T* input_nhwc,
                                                          const T* rois, T* out, T* acc, int64_t begin, int64_t end) {
  const int64_t C = p.channels, bins = p.bins();
  for (int64_t k = begin; k < end; ++k) {
    const RotatedRoi<T> r = rotated_roi<T>(p, rois + 6 * k);
    const T* image = input_nhwc + r.image * p.map_size() * C;
    T* out_roi = out + k * C * bins;
    for (int64_t ph = 0; ph < p.pooled_h; ++ph)
      for (int64_t pw = 0; pw < p.pooled_w; ++pw) {
        std::fill(acc, acc + C, T(0));
        for (int64_t iy = 0; iy < r.grid_h; ++iy)
          for (int64_t ix = 0; ix < r.grid_w; ++ix) {
            const RoiSample<T> s = rotated_roi_sample<T>(r, p.height, p.width, ph, pw, iy, ix);
            if (!s.valid) continue;
            blend4_add(image + s.pos[0] * C, image + s.pos[1] * C, image + s.pos[2] * C,
                                     image + s.pos[3] * C, s.w[0], s.w[1], s.w[2], s.w[3], acc, C);
          }
        T* o = out_roi + ph * p.pooled_w + pw;
        for (int64_t c = 0; c < C; ++c) o[c * bins] = acc[c] / r.count;
      }
  }
}

// Channels [c_begin, c_end) of every roi: accumulates grad_nhwc (zeroed by the
// caller) from grad_output [K, C, ph, pw]; g is scratch of (c_end - c_begin).
template <typename T>
OPFORGE_ALWAYS_INLINE void roi_align_rotated_backward_impl(const RoiAlignRotatedParams& p, const T* grad_output,
                                                           const T* rois, T* grad_nhwc, T* g, int64_t c_begin,
                                                           int64_t c_end) {
  const int64_t C = p.channels, bins = p.bins(), n = c_end - c_begin;
  for (int64_t k = 0; k < p.rois; ++k) {
    const RotatedRoi<T> r = rotated_roi<T>(p, rois + 6 * k);
    T* image = grad_nhwc + r.image * p.map_size() * C + c_begin;
    const T* grad_roi = grad_output + (k * C + c_begin) * bins;
    for (int64_t ph = 0; ph < p.pooled_h; ++ph)
      for (int64_t pw = 0; pw < p.pooled_w; ++pw) {
        const int64_t bin = ph * p.pooled_w + pw;
        for (int64_t c = 0; c < n; ++c) g[c] = grad_roi[c * bins + bin] / r.count;
        for (int64_t iy = 0; iy < r.grid_h; ++iy)
          for (int64_t ix = 0; ix < r.grid_w; ++ix) {
            const RoiSample<T> s = rotated_roi_sample<T>(r, p.height, p.width, ph, pw, iy, ix);
            if (!s.valid) continue;
            for (int t = 0; t < 4; ++t) axpy(g, s.w[t], image + s.pos[t] * C, n);
          }
      }
  }
}

// ISA clones (cpu_dispatch.h): the always-inline bodies re-vectorise inside each.
template <typename T>
void roi_align_rotated_forward_base(const RoiAlignRotatedParams& p, const T* x, const T* rois, T* out, T* acc,
                                    int64_t begin, int64_t end) {
  roi_align_rotated_forward_impl(p, x, rois, out, acc, begin, end);
}
template <typename T>
void roi_align_rotated_backward_base(const RoiAlignRotatedParams& p, const T* grad_out, const T* rois, T* grad,
                                     T* g, int64_t begin, int64_t end) {
  roi_align_rotated_backward_impl(p, grad_out, rois, grad, g, begin, end);
}
#if OPFORGE_X86_DISPATCH
template <typename T>
OPFORGE_TARGET_AVX2 void roi_align_rotated_forward_avx2(const RoiAlignRotatedParams& p, const T* x, const T* rois,
                                                        T* out, T* acc, int64_t begin, int64_t end) {
  roi_align_rotated_forward_impl(p, x, rois, out, acc, begin, end);
}
template <typename T>
OPFORGE_TARGET_AVX512 void roi_align_rotated_forward_avx512(const RoiAlignRotatedParams& p, const T* x,
                                                            const T* rois, T* out, T* acc, int64_t begin,
                                                            int64_t end) {
  roi_align_rotated_forward_impl(p, x, rois, out, acc, begin, end);
}
template <typename T>
OPFORGE_TARGET_AVX2 void roi_align_rotated_backward_avx2(const RoiAlignRotatedParams& p, const T* grad_out,
                                                         const T* rois, T* grad, T* g, int64_t begin, int64_t end) {
  roi_align_rotated_backward_impl(p, grad_out, rois, grad, g, begin, end);
}
template <typename T>
OPFORGE_TARGET_AVX512 void roi_align_rotated_backward_avx512(const RoiAlignRotatedParams& p, const T* grad_out,
                                                             const T* rois, T* grad, T* g, int64_t begin,
                                                             int64_t end) {
  roi_align_rotated_backward_impl(p, grad_out, rois, grad, g, begin, end);
}
#endif

// Forward over rois [begin, end): writes out[k] (K, C, ph, pw). T is float or
// double; input_nhwc is [N, H, W, C]; the rois must have passed
// roi_align_rotated_check_rois.
template <typename T>
inline void roi_align_rotated_forward(const RoiAlignRotatedParams& p, const T* input_nhwc, const T* rois, T* out,
                                      int64_t begin, int64_t end) {
  std::vector<T> acc(static_cast<size_t>(std::max<int64_t>(p.channels, 1)));
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return roi_align_rotated_forward_avx512(p, input_nhwc, rois, out, acc.data(), begin, end);
    case Isa::kAvx2:
      return roi_align_rotated_forward_avx2(p, input_nhwc, rois, out, acc.data(), begin, end);
    default:
      break;
  }
#endif
  roi_align_rotated_forward_base(p, input_nhwc, rois, out, acc.data(), begin, end);
}

// Backward over channels [c_begin, c_end) of all rois: accumulates
// grad_nhwc [N, H, W, C] (zeroed by the caller). Tasks over disjoint channel
// ranges write disjoint elements.
template <typename T>
inline void roi_align_rotated_backward(const RoiAlignRotatedParams& p, const T* grad_output, const T* rois,
                                       T* grad_nhwc, int64_t c_begin, int64_t c_end) {
  std::vector<T> g(static_cast<size_t>(std::max<int64_t>(c_end - c_begin, 1)));
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return roi_align_rotated_backward_avx512(p, grad_output, rois, grad_nhwc, g.data(), c_begin, c_end);
    case Isa::kAvx2:
      return roi_align_rotated_backward_avx2(p, grad_output, rois, grad_nhwc, g.data(), c_begin, c_end);
    default:
      break;
  }
#endif
  roi_align_rotated_backward_base(p, grad_output, rois, grad_nhwc, g.data(), c_begin, c_end);
}

// Rois per forward task: about 64k multiply-adds each (bins x grid x 4 taps x C).
inline int64_t roi_align_rotated_forward_grain(const RoiAlignRotatedParams& p) {
  const int64_t grid = p.sampling_ratio > 0 ? p.sampling_ratio * p.sampling_ratio : 4;  // adaptive: a guess
  const double per_roi = 4.0 * double(p.bins()) * double(grid) * double(std::max<int64_t>(p.channels, 1));
  return per_roi >= 65536.0 ? 1 : std::max<int64_t>(1, static_cast<int64_t>(65536.0 / std::max(per_roi, 1.0)));
}

// Channels per backward task: whole cache lines of float (16), so tasks never
// share a line of the gradient, and at least 64 when C allows (vector-friendly).
inline int64_t roi_align_rotated_backward_grain(const RoiAlignRotatedParams& p) {
  return p.channels >= 128 ? 64 : 16;
}

}  // namespace core
}  // namespace opforge
