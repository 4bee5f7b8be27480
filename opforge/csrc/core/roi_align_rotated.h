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
// (cpu_dispatch.h). The forward splits over rois, or over rows or runs of
// bins when the rois are few (roi_align_rotated_work), so one large roi uses
// every thread. The backward accumulates into a channels-last gradient
// split by channel ranges across threads: no atomics, no per-thread copies of
// the map, and the same summation order whatever the thread count. Every call
// is held to a budget of output elements and bilinear samples, checked before
// anything is allocated (roi_align_rotated_check_rois).
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

// ---- budgets: the memory and work of one call -----------------------------------------
// The rules above keep every size countable and every loop finite, yet allow a 1024 x 1024
// output per roi and 65,536 samples per bin: one roi on a 1 x 1 map could ask for 6.9e10
// bilinear samples (minutes of CPU), and 300 rois of 1024 x 1024 for 1.2 GB of output. A model
// file or its caller's rois choose those sizes, so every kernel also holds a call to two
// budgets, checked on the host before it allocates or runs anything:
//  * output elements, K x C x output_height x output_width: at most 2^26 (256 MiB in float32,
//    the ATen runtime's default budget), 5x what a two-stage detector's head pools
//    (1000 rois x 256 channels x 7 x 7 = 1.25e7; mmrotate's 2000 proposals: 2.5e7);
//  * bilinear samples, K x C x output_height x output_width x points per bin, each roi's
//    adaptive grid counted from its size: at most 2^31, 40x the same head at sampling_ratio 2
//    (5.0e7) and 10x it on adaptive grids of rois sized to their FPN level (up to 4 x 4
//    points per bin; 2000 rois: 5x). A call at the budget takes about 0.6 CPU-seconds at 256
//    channels and 20 at one channel (where placing each point costs more than its channel;
//    measured on one AMD EPYC core), spread over the intra-op threads.
// A trusted caller raises (or lowers) them: in ONNX Runtime with the session config entries
// named below, read when the library is registered; in torch with opforge.set_budget
// (process-wide). The mmdeploy node reads the same entries.
constexpr int64_t kRoiAlignRotatedMaxOutputElements = int64_t(1) << 26;
constexpr int64_t kRoiAlignRotatedMaxSamples = int64_t(1) << 31;
inline constexpr const char* kRoiAlignRotatedMaxOutputElementsKey = "opforge.roi_align_rotated.max_output_elements";
inline constexpr const char* kRoiAlignRotatedMaxSamplesKey = "opforge.roi_align_rotated.max_samples";

struct RoiAlignRotatedBudget {
  int64_t max_output_elements = kRoiAlignRotatedMaxOutputElements;
  int64_t max_samples = kRoiAlignRotatedMaxSamples;
};

// How a message tells the reader to raise budget `key`.
inline std::string roi_align_rotated_budget_hint(const char* key) {
  return std::string("; a trusted caller raises it with '") + key +
         "' (an ONNX Runtime session config entry, set before the library is registered; in torch, "
         "opforge.set_budget)";
}

// The output-elements budget, on the sizes alone.
inline std::string roi_align_rotated_check_output_budget(const RoiAlignRotatedParams& p,
                                                         const RoiAlignRotatedBudget& budget) {
  int64_t n = 0;
  const bool fits = mul_fits(p.rois, p.channels, &n) && mul_fits(n, p.bins(), &n);
  if (fits && n <= budget.max_output_elements) return "";
  return "opforge::roi_align_rotated: the output (K, C, output_height, output_width) = [" +
         std::to_string(p.rois) + ", " + std::to_string(p.channels) + ", " + std::to_string(p.pooled_h) + ", " +
         std::to_string(p.pooled_w) + "] has " + (fits ? std::to_string(n) : std::string("more than 2^63")) +
         " elements, over the budget of " + std::to_string(budget.max_output_elements) + " output elements" +
         roi_align_rotated_budget_hint(kRoiAlignRotatedMaxOutputElementsKey);
}

// The rule on the rois' values (host copies, float or double: 16-bit rois are
// widened first, exactly), which the kernels index the input with and size
// their loops by. For every roi: the batch index is an integer in [0, N);
// cx, cy, w, h and the angle are finite; w and h are not negative when
// `aligned` (mmcv asserts the same; without it they are clamped to 1); and the
// sampling grid is at most kRoiAlignRotatedMaxGridPoints points per bin (an
// adaptive grid grows with the roi). Then the budgets above: the output's
// elements, and the bilinear samples of all rois (written to *samples when
// given, which sizes the CPU kernels' tasks). Every kernel applies it before
// it allocates or runs anything.
template <typename A>
inline std::string roi_align_rotated_check_rois(const RoiAlignRotatedParams& p, const A* rois,
                                                const RoiAlignRotatedBudget& budget = RoiAlignRotatedBudget{},
                                                int64_t* samples = nullptr) {
  const std::string op = "opforge::roi_align_rotated: ";
  if (std::string err = roi_align_rotated_check_output_budget(p, budget); !err.empty()) return err;
  const auto num = [](A v) { return std::to_string(static_cast<double>(v)); };
  static const char* const names[6] = {"batch index", "cx", "cy", "w", "h", "angle"};
  int64_t points = 0;  // sampling points per bin and channel, summed over the rois (saturating)
  int64_t grid_h = 0, grid_w = 0;  // the largest grid, for the message
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
    if (!add_fits(points, r.grid_h * r.grid_w, &points)) points = INT64_MAX;
    grid_h = std::max(grid_h, r.grid_h), grid_w = std::max(grid_w, r.grid_w);
  }
  // samples = points x C x bins, saturating: the comparison is all that needs the exact value.
  int64_t total = 0;
  const bool fits = mul_fits(points, p.channels, &total) && mul_fits(total, p.bins(), &total);
  if (samples != nullptr) *samples = fits ? total : INT64_MAX;
  if (fits && total <= budget.max_samples) return "";
  const std::string count = fits ? std::to_string(total) : std::string("more than 2^63");
  const std::string dims = std::to_string(p.rois) + " x " + std::to_string(p.channels) + " x " +
                           std::to_string(p.pooled_h) + " x " + std::to_string(p.pooled_w);
  const std::string how =
      p.sampling_ratio > 0
          ? "K x C x output_height x output_width x sampling_ratio^2 = " + dims + " x " +
                std::to_string(p.sampling_ratio * p.sampling_ratio)
          : "K x C x output_height x output_width x points per bin, each roi's adaptive grid counted: " + dims +
                " x up to " + std::to_string(grid_h) + " x " + std::to_string(grid_w);
  return op + "the call would take " + count + " bilinear samples (" + how + "), over the budget of " +
         std::to_string(budget.max_samples) + " samples" + roi_align_rotated_budget_hint(kRoiAlignRotatedMaxSamplesKey);
}

// ---- CPU kernels ------------------------------------------------------------------------

// How the forward splits its work into items, which tasks of the intra-op pool take in
// ranges: whole rois when there are enough of them for the threads (or one thread), the
// fastest loop per roi; else rows of bins; else runs of bins within rows (one roi of 7 x 7
// bins, which many samples per bin can make long). So one large roi spreads over the
// threads like many small ones, and the common case of many rois keeps its loop.
// `threads`: the pool's size, 0 when unknown (ORT does not tell a kernel: planned as for 32).
enum class RoiAlignRotatedSplit { kRois, kRows, kRowRuns };

struct RoiAlignRotatedWork {
  RoiAlignRotatedSplit split = RoiAlignRotatedSplit::kRois;
  int64_t runs = 1;   // runs per row (kRowRuns), else 1
  int64_t items = 0;  // work items in all
};

inline RoiAlignRotatedWork roi_align_rotated_work(const RoiAlignRotatedParams& p, int64_t threads) {
  const int64_t enough = 8 * (threads > 0 ? threads : 32);  // items for the threads to balance
  const int64_t rows = p.rois * p.pooled_h;
  if (threads == 1 || p.rois >= enough) return {RoiAlignRotatedSplit::kRois, 1, p.rois};
  if (rows >= enough) return {RoiAlignRotatedSplit::kRows, 1, rows};
  const int64_t runs = std::min(p.pooled_w, (enough + std::max<int64_t>(rows, 1) - 1) / std::max<int64_t>(rows, 1));
  return {RoiAlignRotatedSplit::kRowRuns, runs, rows * runs};
}

// Bin (ph, pw) of roi r: out_roi[c, ph, pw] for all c. image is r's map channels-last;
// acc is scratch of C elements.
template <typename T>
OPFORGE_ALWAYS_INLINE void roi_align_rotated_bin(const RoiAlignRotatedParams& p, const RotatedRoi<T>& r,
                                                 const T* image, T* out_roi, T* acc, int64_t ph, int64_t pw) {
  const int64_t C = p.channels, bins = p.bins();
  std::fill(acc, acc + C, T(0));
  for (int64_t iy = 0; iy < r.grid_h; ++iy)
    for (int64_t ix = 0; ix < r.grid_w; ++ix) {
      const RoiSample<T> s = rotated_roi_sample<T>(r, p.height, p.width, ph, pw, iy, ix);
      if (!s.valid) continue;
      blend4_add(image + s.pos[0] * C, image + s.pos[1] * C, image + s.pos[2] * C, image + s.pos[3] * C, s.w[0],
                 s.w[1], s.w[2], s.w[3], acc, C);
    }
  T* o = out_roi + ph * p.pooled_w + pw;
  for (int64_t c = 0; c < C; ++c) o[c * bins] = acc[c] / r.count;
}

// Work items [begin, end) of split `kSplit`, `runs` runs per row (roi_align_rotated_work):
// out[k, c, ph, pw] for all c and the items' bins. A roi's geometry is computed once per
// task that touches it. Each split is an instantiation of its own, with its own ISA clones:
// measured with GCC, the loop over whole rois ran 5-12% slower on small bins and few
// channels with a row- or bin-bounded loop beside it, or in its place (more values live
// than registers hold), and the row-bounded loops stay 8-14% slower on one thread there.
// input_nhwc is the map channels-last; acc is scratch of C elements.
template <typename T, RoiAlignRotatedSplit kSplit>
OPFORGE_ALWAYS_INLINE void roi_align_rotated_forward_impl(const RoiAlignRotatedParams& p, int64_t runs,
                                                          const T* input_nhwc, const T* rois, T* out, T* acc,
                                                          int64_t begin, int64_t end) {
  const int64_t C = p.channels, bins = p.bins();
  if constexpr (kSplit == RoiAlignRotatedSplit::kRois) {
    for (int64_t k = begin; k < end; ++k) {
      const RotatedRoi<T> r = rotated_roi<T>(p, rois + 6 * k);
      const T* image = input_nhwc + r.image * p.map_size() * C;
      T* out_roi = out + k * C * bins;
      for (int64_t ph = 0; ph < p.pooled_h; ++ph)
        for (int64_t pw = 0; pw < p.pooled_w; ++pw) roi_align_rotated_bin(p, r, image, out_roi, acc, ph, pw);
    }
  } else {
    const int64_t per_roi = p.pooled_h * runs;
    for (int64_t k = begin / per_roi; k * per_roi < end; ++k) {
      const RotatedRoi<T> r = rotated_roi<T>(p, rois + 6 * k);
      const T* image = input_nhwc + r.image * p.map_size() * C;
      T* out_roi = out + k * C * bins;
      const int64_t first = std::max(begin - k * per_roi, int64_t(0)), stop = std::min(end - k * per_roi, per_roi);
      if constexpr (kSplit == RoiAlignRotatedSplit::kRows) {
        for (int64_t ph = first; ph < stop; ++ph)
          for (int64_t pw = 0; pw < p.pooled_w; ++pw) roi_align_rotated_bin(p, r, image, out_roi, acc, ph, pw);
      } else {
        for (int64_t item = first; item < stop; ++item) {
          const int64_t ph = item / runs, run = item - ph * runs, pw_end = (run + 1) * p.pooled_w / runs;
          for (int64_t pw = run * p.pooled_w / runs; pw < pw_end; ++pw)
            roi_align_rotated_bin(p, r, image, out_roi, acc, ph, pw);
        }
      }
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
template <typename T, RoiAlignRotatedSplit kSplit>
void roi_align_rotated_forward_base(const RoiAlignRotatedParams& p, int64_t runs, const T* x, const T* rois, T* out,
                                    T* acc, int64_t begin, int64_t end) {
  roi_align_rotated_forward_impl<T, kSplit>(p, runs, x, rois, out, acc, begin, end);
}
template <typename T>
void roi_align_rotated_backward_base(const RoiAlignRotatedParams& p, const T* grad_out, const T* rois, T* grad,
                                     T* g, int64_t begin, int64_t end) {
  roi_align_rotated_backward_impl(p, grad_out, rois, grad, g, begin, end);
}
#if OPFORGE_X86_DISPATCH
template <typename T, RoiAlignRotatedSplit kSplit>
OPFORGE_TARGET_AVX2 void roi_align_rotated_forward_avx2(const RoiAlignRotatedParams& p, int64_t runs, const T* x,
                                                        const T* rois, T* out, T* acc, int64_t begin, int64_t end) {
  roi_align_rotated_forward_impl<T, kSplit>(p, runs, x, rois, out, acc, begin, end);
}
template <typename T, RoiAlignRotatedSplit kSplit>
OPFORGE_TARGET_AVX512 void roi_align_rotated_forward_avx512(const RoiAlignRotatedParams& p, int64_t runs,
                                                            const T* x, const T* rois, T* out, T* acc,
                                                            int64_t begin, int64_t end) {
  roi_align_rotated_forward_impl<T, kSplit>(p, runs, x, rois, out, acc, begin, end);
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

// Forward over work items [begin, end) of [0, work.items) (roi_align_rotated_work):
// writes those items' bins of out (K, C, ph, pw) in every channel. T is float or double;
// input_nhwc is [N, H, W, C]; the rois must have passed roi_align_rotated_check_rois.
template <typename T, RoiAlignRotatedSplit kSplit>
inline void roi_align_rotated_forward_as(const RoiAlignRotatedParams& p, int64_t runs, const T* input_nhwc,
                                         const T* rois, T* out, T* acc, int64_t begin, int64_t end) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return roi_align_rotated_forward_avx512<T, kSplit>(p, runs, input_nhwc, rois, out, acc, begin, end);
    case Isa::kAvx2:
      return roi_align_rotated_forward_avx2<T, kSplit>(p, runs, input_nhwc, rois, out, acc, begin, end);
    default:
      break;
  }
#endif
  roi_align_rotated_forward_base<T, kSplit>(p, runs, input_nhwc, rois, out, acc, begin, end);
}

template <typename T>
inline void roi_align_rotated_forward(const RoiAlignRotatedParams& p, const RoiAlignRotatedWork& work,
                                      const T* input_nhwc, const T* rois, T* out, int64_t begin, int64_t end) {
  std::vector<T> acc(static_cast<size_t>(std::max<int64_t>(p.channels, 1)));
  T* a = acc.data();
  switch (work.split) {
    case RoiAlignRotatedSplit::kRois:
      return roi_align_rotated_forward_as<T, RoiAlignRotatedSplit::kRois>(p, 1, input_nhwc, rois, out, a, begin, end);
    case RoiAlignRotatedSplit::kRows:
      return roi_align_rotated_forward_as<T, RoiAlignRotatedSplit::kRows>(p, 1, input_nhwc, rois, out, a, begin, end);
    case RoiAlignRotatedSplit::kRowRuns:
      return roi_align_rotated_forward_as<T, RoiAlignRotatedSplit::kRowRuns>(p, work.runs, input_nhwc, rois, out, a,
                                                                             begin, end);
  }
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

// Items per forward task (of work's items): about 2^18 multiply-adds each, a few
// microseconds (ORT runs each task as a call of its own). `samples` is the count
// roi_align_rotated_check_rois gave (every roi's grid, adaptive ones included), so an
// item's cost is its mean: 4 taps x C per sample, plus the geometry of its points and
// the C-vector each of its bins clears and stores.
inline int64_t roi_align_rotated_forward_grain(const RoiAlignRotatedParams& p, const RoiAlignRotatedWork& work,
                                               int64_t samples) {
  constexpr double kTask = double(int64_t(1) << 18);
  const double items = std::max(1.0, double(work.items));
  const double channels = double(std::max<int64_t>(p.channels, 1));
  const double per_item = 4.0 * double(samples) / items + 16.0 * double(samples) / (items * channels) +
                          2.0 * channels * double(p.bins()) * double(p.rois) / items;
  return per_item >= kTask ? 1 : std::max<int64_t>(1, static_cast<int64_t>(kTask / std::max(per_item, 1.0)));
}

// Channels per backward task: whole cache lines of float (16), so tasks never
// share a line of the gradient, and at least 64 when C allows (vector-friendly).
inline int64_t roi_align_rotated_backward_grain(const RoiAlignRotatedParams& p) {
  return p.channels >= 128 ? 64 : 16;
}

}  // namespace core
}  // namespace opforge
