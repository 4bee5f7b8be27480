// 2-D grid sampling (torch.nn.functional.grid_sample, the node mmdeploy writes
// as mmdeploy::grid_sampler): the compute core of the ORT kernel. Plain C++;
// the caller provides the parallel-for.
//
//   out[n, c, oy, ox] = sample(input[n, c], grid[n, oy, ox, 0] (x), grid[n, oy, ox, 1] (y))
//
// Semantics, torch's CPU kernel: a grid value g in [-1, 1] spans the map,
// unnormalised per axis to x = (g + 1) * (size - 1) / 2 (align_corners) or
// (g + 1) * size / 2 - 0.5 (pixel centres at -1 + (2i + 1) / size).
//   interpolation 0 bilinear, 1 nearest (round half to even, torch's
//   nearbyint), 2 bicubic (Keys' kernel, A = -0.75, 4 x 4 taps);
//   padding 0 zeros (taps outside the map read 0), 1 border (coordinates
//   clamped into [0, size - 1]), 2 reflection (coordinates reflected at the
//   border pixels' centres with align_corners, at the map's edges without,
//   then clamped). Bilinear and nearest pad the sampling coordinate; bicubic
//   pads each of its 16 tap coordinates, as torch does.
// The arithmetic (unnormalisation, the weights, the order of the sums) is
// torch's, so results agree with torch's to rounding (a few ulps: where
// either build contracts a multiply-add into an FMA).
//
// The grid is run-time data. Every coordinate is range-checked or clamped in
// floating point before it becomes an integer, so no value reads outside the
// map. Values torch leaves undefined or NaN are defined here:
//   * NaN / +-inf coordinate, zeros padding: the point is outside the map,
//     the result is 0 (torch: 0 for nearest, NaN for bilinear and bicubic);
//   * NaN / +-inf coordinate, border or reflection padding: torch's clamp
//     rule (NaN -> 0, +inf -> size - 1 under border, -inf -> 0; reflection
//     of +-inf -> 0) for all three modes (torch: the same for bilinear and
//     nearest; NaN for bicubic);
//   * huge finite coordinates (1e30): zeros -> outside (0), border -> the
//     edge, reflection -> the exact reflection (fmod; bicubic: of each tap; torch's float32
//     reflection loses precision past ~2^24 and differs there).
// A tap outside the map under zeros padding gets weight 0 and a clamped index
// (the sum stays branch-free); a non-finite input value at that clamped index
// would then give NaN (0 * inf) where torch's masked read gives 0.
//
// Speed (CPU): work items are (image, block of output pixels, block of
// channels). An item computes its pixels' taps once (a table, one struct per
// pixel: 1 tap for nearest, a 2 x 2 window inside the map for bilinear,
// 4 + 4 separable taps for bicubic) and applies them to every channel of the
// block, kGridSampleChannelUnroll planes per pass over the table. The channel
// loops stay scalar on purpose: they are gathers, which compilers do not
// vectorise for current x86 CPUs (and which are slow there). Channels are
// split across items only when (image, pixel block) items are too few to
// feed the threads. Each output element is computed by the same code
// whatever the split, so results do not depend on the thread count (they
// may differ in the last bit between the ISA clones: FMA contraction).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "cpu_dispatch.h"
#include "format.h"
#include "half.h"
#include "host_device.h"

namespace opforge {
namespace core {

enum GridSampleInterpolation : int64_t { kGridSampleBilinear = 0, kGridSampleNearest = 1, kGridSampleBicubic = 2 };
enum GridSamplePadding : int64_t { kGridSampleZeros = 0, kGridSampleBorder = 1, kGridSampleReflection = 2 };

// input [N, C, H, W], grid [N, Ho, Wo, 2], output [N, C, Ho, Wo].
struct GridSampleParams {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0;  // N, C, H, W
  int64_t out_h = 0, out_w = 0;                         // Ho, Wo
  int64_t interpolation = kGridSampleBilinear, padding = kGridSampleZeros;
  bool align_corners = false;

  OPFORGE_HD int64_t in_plane() const { return in_h * in_w; }
  OPFORGE_HD int64_t out_plane() const { return out_h * out_w; }
};

// ---- the attributes and shapes ----------------------------------------------------------

inline constexpr const char* kGridSampleOp = "mmdeploy::grid_sampler";

// The rule on the node's attributes alone (applied when an ORT kernel is created).
inline std::string grid_sample_check_attrs(int64_t interpolation, int64_t padding, int64_t align_corners) {
  const std::string op = std::string(kGridSampleOp) + ": ";
  if (interpolation < 0 || interpolation > 2)
    return op + "attribute interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), got " +
           std::to_string(interpolation);
  if (padding < 0 || padding > 2)
    return op + "attribute padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got " +
           std::to_string(padding);
  if (align_corners != 0 && align_corners != 1)
    return op + "attribute align_corners must be 0 or 1, got " + std::to_string(align_corners);
  return "";
}

// The rule on shapes and attributes: input (N, C, H, W) with a non-empty map
// (unless there is nothing to sample), grid (N, Ho, Wo, 2) with input's N,
// and every element count (and byte size in any dtype) within int64. Fills p.
// Returns "" when valid, else a message naming the op and the argument.
inline std::string grid_sample_check(const int64_t* input, int input_rank, const int64_t* grid, int grid_rank,
                                     int64_t interpolation, int64_t padding, int64_t align_corners,
                                     GridSampleParams& p) {
  const std::string op = std::string(kGridSampleOp) + ": ";
  if (std::string err = grid_sample_check_attrs(interpolation, padding, align_corners); !err.empty()) return err;
  if (input_rank != 4) return op + "input must be 4-D (N, C, H, W), got shape " + dims_str(input, input_rank);
  if (grid_rank != 4)
    return op + "grid must be 4-D (N, Ho, Wo, 2), got shape " + dims_str(grid, grid_rank);
  for (int i = 0; i < 4; ++i)
    if (input[i] < 0) return op + "input has a negative size: shape " + dims_str(input, 4);
  for (int i = 0; i < 4; ++i)
    if (grid[i] < 0) return op + "grid has a negative size: shape " + dims_str(grid, 4);
  if (grid[3] != 2)
    return op + "grid's last dimension must be 2 (x, y), got shape " + dims_str(grid, 4);
  if (grid[0] != input[0])
    return op + "grid has " + std::to_string(grid[0]) + " images (shape " + dims_str(grid, 4) + ") but input has " +
           std::to_string(input[0]) + " (shape " + dims_str(input, 4) + "): the batch sizes must match";
  p = GridSampleParams{};
  p.batch = input[0], p.channels = input[1], p.in_h = input[2], p.in_w = input[3];
  p.out_h = grid[1], p.out_w = grid[2];
  p.interpolation = interpolation, p.padding = padding, p.align_corners = align_corners != 0;
  // Element counts, and byte counts in any dtype (16 bytes bounds all of them).
  const int64_t out_dims[4] = {p.batch, p.channels, p.out_h, p.out_w};
  int64_t input_numel = 1, grid_numel = 1, out_numel = 1, bytes = 0;
  bool fits = true;
  for (int i = 0; i < 4; ++i) {
    fits = fits && !__builtin_mul_overflow(input_numel, input[i], &input_numel);
    fits = fits && !__builtin_mul_overflow(grid_numel, grid[i], &grid_numel);
    fits = fits && !__builtin_mul_overflow(out_numel, out_dims[i], &out_numel);
  }
  fits = fits && !__builtin_mul_overflow(input_numel, int64_t(16), &bytes) &&
         !__builtin_mul_overflow(grid_numel, int64_t(16), &bytes) &&
         !__builtin_mul_overflow(out_numel, int64_t(16), &bytes);
  if (!fits)
    return op + "input " + dims_str(input, 4) + ", grid " + dims_str(grid, 4) + " or the output (N, C, Ho, Wo) = " +
           dims_str(out_dims, 4) + " has more elements than int64 can count";
  if ((p.in_h == 0 || p.in_w == 0) && out_numel != 0)
    return op + "input has an empty feature map (H x W = " + std::to_string(p.in_h) + " x " + std::to_string(p.in_w) +
           ") but the output " + dims_str(out_dims, 4) + " is not empty: there is nothing to sample";
  return "";
}

inline void grid_sample_output_dims(const GridSampleParams& p, int64_t out[4]) {
  out[0] = p.batch;
  out[1] = p.channels;
  out[2] = p.out_h;
  out[3] = p.out_w;
}

// ---- one sampling point (host + device) -------------------------------------------------

OPFORGE_HD_INLINE float gs_fabs(float x) { return ::fabsf(x); }
OPFORGE_HD_INLINE double gs_fabs(double x) { return ::fabs(x); }
OPFORGE_HD_INLINE float gs_fmod(float x, float y) { return ::fmodf(x, y); }
OPFORGE_HD_INLINE double gs_fmod(double x, double y) { return ::fmod(x, y); }
OPFORGE_HD_INLINE float gs_nearbyint(float x) { return ::nearbyintf(x); }
OPFORGE_HD_INLINE double gs_nearbyint(double x) { return ::nearbyint(x); }
// Finite (not NaN, not +-inf), without <cmath>'s overloads.
template <typename A>
OPFORGE_HD_INLINE bool gs_finite(A x) {
  return x - x == A(0);
}

// Grid value -> pixel coordinate along an axis of `size` pixels (torch's formulas).
template <typename A>
OPFORGE_HD_INLINE A grid_sample_unnormalize(A g, int64_t size, bool align_corners) {
  return align_corners ? (g + A(1)) * (static_cast<A>(size - 1) / A(2))
                       : (g + A(1)) * (static_cast<A>(size) / A(2)) - A(0.5);
}

// Clamp into [0, size - 1]; NaN -> 0 (torch's vectorised clip_coordinates).
template <typename A>
OPFORGE_HD_INLINE A grid_sample_clip(A x, int64_t size) {
  const A hi = static_cast<A>(size - 1);
  x = x > A(0) ? x : A(0);
  return x < hi ? x : hi;
}

// Reflection at the border pixels' centres (align_corners) or at the map's
// edges, exactly (fmod); NaN and +-inf give NaN (clipped to 0 afterwards).
template <typename A>
OPFORGE_HD_INLINE A grid_sample_reflect(A x, int64_t size, bool align_corners) {
  if (align_corners) {
    if (size <= 1) return A(0);
    const A twice_span = A(2) * static_cast<A>(size - 1);
    const A extra = gs_fmod(gs_fabs(x), twice_span);
    const A other = twice_span - extra;
    return extra < other ? extra : other;
  }
  const A twice_span = A(2) * static_cast<A>(size);
  const A extra = gs_fmod(gs_fabs(x + A(0.5)), twice_span);
  const A other = twice_span - extra;
  return (extra < other ? extra : other) - A(0.5);
}

// The padding mode's coordinate transform (identity for zeros padding).
template <typename A>
OPFORGE_HD_INLINE A grid_sample_pad(A x, int64_t size, int64_t padding, bool align_corners) {
  if (padding == kGridSampleBorder) return grid_sample_clip(x, size);
  if (padding == kGridSampleReflection) return grid_sample_clip(grid_sample_reflect(x, size, align_corners), size);
  return x;
}

// One axis of one sampling point: its taps' indices (in [0, size)) and
// weights. A tap outside the map (zeros padding) has weight 0 and index 0.
// Nearest: 1 tap.
template <typename A>
OPFORGE_HD_INLINE void grid_sample_nearest_axis(A g, int64_t size, int64_t padding, bool align_corners, int64_t* idx,
                                                A* w) {
  const A x = gs_nearbyint(grid_sample_pad(grid_sample_unnormalize(g, size, align_corners), size, padding,
                                           align_corners));
  const bool inside = x > A(-1) && x < static_cast<A>(size);  // false for NaN
  idx[0] = inside ? static_cast<int64_t>(x) : 0;
  w[0] = inside ? A(1) : A(0);
}

// Bilinear: 2 taps, floor(x) and floor(x) + 1, weights 1 - t and t.
template <typename A>
OPFORGE_HD_INLINE void grid_sample_bilinear_axis(A g, int64_t size, int64_t padding, bool align_corners, int64_t* idx,
                                                 A* w) {
  const A x = grid_sample_pad(grid_sample_unnormalize(g, size, align_corners), size, padding, align_corners);
  if (!(x > A(-1) && x < static_cast<A>(size))) {  // zeros padding: no tap inside (or NaN / inf)
    idx[0] = idx[1] = 0;
    w[0] = w[1] = A(0);
    return;
  }
  const A x0 = floor_hd(x);
  const A t = x - x0;
  const int64_t i0 = static_cast<int64_t>(x0);  // in [-1, size - 1]
  const bool in0 = i0 >= 0, in1 = i0 + 1 < size;
  idx[0] = in0 ? i0 : 0;
  idx[1] = in1 ? i0 + 1 : size - 1;
  w[0] = in0 ? A(1) - t : A(0);
  w[1] = in1 ? t : A(0);
}

// Keys' cubic convolution kernel, A = -0.75 (torch's get_cubic_upsample_coefficients).
template <typename A>
OPFORGE_HD_INLINE void grid_sample_cubic_coefficients(A t, A* c) {
  const A a = A(-0.75);
  const A x1 = t + A(1), x2 = A(1) - t, x3 = x2 + A(1);
  c[0] = ((a * x1 - A(5) * a) * x1 + A(8) * a) * x1 - A(4) * a;
  c[1] = ((a + A(2)) * t - (a + A(3))) * t * t + A(1);
  c[2] = ((a + A(2)) * x2 - (a + A(3))) * x2 * x2 + A(1);
  c[3] = ((a * x3 - A(5) * a) * x3 + A(8) * a) * x3 - A(4) * a;
}

// Bicubic: 4 taps floor(x) - 1 .. floor(x) + 2, each padded on its own.
template <typename A>
OPFORGE_HD_INLINE void grid_sample_bicubic_axis(A g, int64_t size, int64_t padding, bool align_corners, int64_t* idx,
                                                A* w) {
  A x = grid_sample_unnormalize(g, size, align_corners);
  // Non-finite: zeros padding keeps it (outside, below); border / reflection clamp it as for
  // the other modes (NaN -> 0, +inf -> the last pixel under border), then it samples that pixel.
  if (!gs_finite(x)) x = grid_sample_pad(x, size, padding, align_corners);
  if (padding == kGridSampleZeros && !(x > A(-2) && x < static_cast<A>(size + 1))) {
    // No tap inside (border / reflection pad each tap below: any finite x is fine there).
    for (int j = 0; j < 4; ++j) {
      idx[j] = 0;
      w[j] = A(0);
    }
    return;
  }
  const A x0 = floor_hd(x);
  grid_sample_cubic_coefficients(x - x0, w);
  for (int j = 0; j < 4; ++j) {
    // zeros: in [-3, size + 2]; border / reflection: in [0, size - 1]
    const A tap = grid_sample_pad(x0 + static_cast<A>(j - 1), size, padding, align_corners);
    const bool inside = tap > A(-1) && tap < static_cast<A>(size);
    idx[j] = inside ? static_cast<int64_t>(tap) : 0;
    if (!inside) w[j] = A(0);
  }
}

// One output element: the point (gx, gy) of one channel's H x W plane, in the
// accumulation type A (T's values are read through ScalarIO<T, A>). The CPU
// kernel below computes exactly this, in the same order, vectorised over pixels.
template <typename A, typename T>
OPFORGE_HD_INLINE A grid_sample_point(const GridSampleParams& p, const T* plane, A gx, A gy) {
  const int64_t W = p.in_w, H = p.in_h;
  int64_t ix[4], iy[4];
  A wx[4], wy[4];
  if (p.interpolation == kGridSampleNearest) {
    grid_sample_nearest_axis(gx, W, p.padding, p.align_corners, ix, wx);
    grid_sample_nearest_axis(gy, H, p.padding, p.align_corners, iy, wy);
    return ScalarIO<T, A>::load(plane[iy[0] * W + ix[0]]) * (wy[0] * wx[0]);
  }
  if (p.interpolation == kGridSampleBicubic) {
    grid_sample_bicubic_axis(gx, W, p.padding, p.align_corners, ix, wx);
    grid_sample_bicubic_axis(gy, H, p.padding, p.align_corners, iy, wy);
    A sum = A(0);
    for (int i = 0; i < 4; ++i) {
      const T* row = plane + iy[i] * W;
      const A r = ScalarIO<T, A>::load(row[ix[0]]) * wx[0] + ScalarIO<T, A>::load(row[ix[1]]) * wx[1] +
                  ScalarIO<T, A>::load(row[ix[2]]) * wx[2] + ScalarIO<T, A>::load(row[ix[3]]) * wx[3];
      sum = i == 0 ? r * wy[0] : sum + r * wy[i];
    }
    return sum;
  }
  grid_sample_bilinear_axis(gx, W, p.padding, p.align_corners, ix, wx);
  grid_sample_bilinear_axis(gy, H, p.padding, p.align_corners, iy, wy);
  return ScalarIO<T, A>::load(plane[iy[0] * W + ix[0]]) * (wy[0] * wx[0]) +
         ScalarIO<T, A>::load(plane[iy[0] * W + ix[1]]) * (wy[0] * wx[1]) +
         ScalarIO<T, A>::load(plane[iy[1] * W + ix[0]]) * (wy[1] * wx[0]) +
         ScalarIO<T, A>::load(plane[iy[1] * W + ix[1]]) * (wy[1] * wx[1]);
}

// The GPU kernel's work item i: output element i of [N, C, Ho, Wo] (grid and input of
// storage type T, accumulated in A). core/cuda/grid_sample.cuh runs it per thread; the
// host emulation tests (tests/csrc/gpu_cores_host.cpp) run it in a loop.
template <typename T, typename A>
OPFORGE_HD_INLINE void grid_sample_forward_item(const GridSampleParams& p, int64_t i, const T* input, const T* grid,
                                                T* out) {
  const int64_t pixels = p.out_plane();
  const int64_t pixel = i % pixels, plane = i / pixels, n = plane / p.channels;
  const T* g = grid + (n * pixels + pixel) * 2;
  const A gx = ScalarIO<T, A>::load(g[0]), gy = ScalarIO<T, A>::load(g[1]);
  out[i] = ScalarIO<T, A>::store(grid_sample_point<A, T>(p, input + plane * p.in_plane(), gx, gy));
}

// ---- CPU kernel -------------------------------------------------------------------------

// Output pixels per work item (one tap table), at most: long unit-stride sweeps over a
// channel plane for the cheap modes, a table that stays in L1 for bicubic.
constexpr int64_t kGridSampleBlock = 2048;
// Work items are split by channels (taps then computed once per channel block) only when
// the (image, pixel block) items alone are fewer than this, to give every thread work.
constexpr int64_t kGridSampleMinItems = 32;
// Channels one pass over a block's taps serves (the taps are loaded once for all of them).
constexpr int64_t kGridSampleChannelUnroll = 4;

inline int64_t grid_sample_block(const GridSampleParams& p) {  // grid_sample_table_bytes has these
  return p.interpolation == kGridSampleNearest ? 2048 : p.interpolation == kGridSampleBicubic ? 256 : 1024;
}

// How the output is cut into work items: (image, pixel block, channel block).
struct GridSampleWork {
  int64_t block = 0, pixel_blocks = 0, channel_block = 1, channel_blocks = 0, items = 0;
};

inline GridSampleWork grid_sample_work(const GridSampleParams& p) {
  GridSampleWork w;
  const int64_t pixels = p.out_plane();
  if (p.batch == 0 || p.channels == 0 || pixels == 0) return w;
  w.block = grid_sample_block(p);
  w.pixel_blocks = (pixels + w.block - 1) / w.block;
  const int64_t spatial = p.batch * w.pixel_blocks;  // <= output elements: no overflow below
  int64_t split = 1;
  if (spatial < kGridSampleMinItems)  // at least 2 x K channels per item
    split = std::min((kGridSampleMinItems + spatial - 1) / spatial,
                     std::max<int64_t>(1, p.channels / (2 * kGridSampleChannelUnroll)));
  const int64_t per = (p.channels + split - 1) / split;
  w.channel_block = (per + kGridSampleChannelUnroll - 1) / kGridSampleChannelUnroll * kGridSampleChannelUnroll;
  w.channel_blocks = (p.channels + w.channel_block - 1) / w.channel_block;
  w.items = spatial * w.channel_blocks;
  return w;
}

// One output pixel's taps, by mode (a block's table is an array of them: one stream
// per loop). I: the plane-offset type (int32_t when H*W fits).
template <typename A, typename I>
struct GridSampleNearestTap {  // the pixel; weight 1, or 0 outside under zeros padding
  I off;
  A w;
};
template <typename A, typename I>
struct GridSamplePairTap {  // bilinear, H and W >= 2: the 2 x 2 window at off, in the map;
  I off;                    // corner weights nw ne sw se, the taps outside the map folded out
  A w[4];
};
template <typename A, typename I>
struct GridSampleBilinearTap {  // bilinear, H or W = 1: the four corners
  I off[4];
  A w[4];
};
template <typename A, typename I>
struct GridSampleBicubicTap {  // row offsets (i * W), columns, x and y weights
  I row[4], col[4];
  A wx[4], wy[4];
};

// Bytes of one block's table, enough for every mode's tap form and block.
template <typename A, typename I>
constexpr size_t grid_sample_table_bytes() {
  return std::max({sizeof(GridSampleNearestTap<A, I>) * 2048, sizeof(GridSampleBilinearTap<A, I>) * 1024,
                   sizeof(GridSampleBicubicTap<A, I>) * 256});
}

// An axis' two bilinear taps (from grid_sample_bilinear_axis: invalid ones have weight 0)
// as a window [s, s + 1] inside [0, size) (size >= 2) with weights (a, b): adding the
// exact zeros keeps every non-zero term, in torch's order.
template <typename A>
OPFORGE_HD_INLINE int64_t grid_sample_bilinear_window(const int64_t* idx, const A* w, int64_t size, A* a, A* b) {
  const int64_t s = idx[0] < size - 2 ? idx[0] : size - 2;
  *a = (idx[0] == s ? w[0] : A(0)) + (idx[1] == s ? w[1] : A(0));
  *b = (idx[0] == s + 1 ? w[0] : A(0)) + (idx[1] == s + 1 ? w[1] : A(0));
  return s;
}

// Fills `table` (grid_sample_table_bytes) with the taps of n pixels of grid.
template <typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_build_taps(const GridSampleParams& p, bool pair, const A* grid, int64_t n,
                                                  void* table) {
  const int64_t W = p.in_w, H = p.in_h, pad = p.padding;
  const bool ac = p.align_corners;
  int64_t ix[4], iy[4];
  A wx[4], wy[4];
  switch (p.interpolation) {
    case kGridSampleNearest: {
      auto* t = static_cast<GridSampleNearestTap<A, I>*>(table);
      for (int64_t q = 0; q < n; ++q) {
        grid_sample_nearest_axis(grid[2 * q], W, pad, ac, ix, wx);
        grid_sample_nearest_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
        t[q].off = static_cast<I>(iy[0] * W + ix[0]);
        t[q].w = wy[0] * wx[0];
      }
      break;
    }
    case kGridSampleBicubic: {
      auto* t = static_cast<GridSampleBicubicTap<A, I>*>(table);
      for (int64_t q = 0; q < n; ++q) {
        grid_sample_bicubic_axis(grid[2 * q], W, pad, ac, ix, wx);
        grid_sample_bicubic_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
        for (int j = 0; j < 4; ++j) {
          t[q].row[j] = static_cast<I>(iy[j] * W);
          t[q].col[j] = static_cast<I>(ix[j]);
          t[q].wx[j] = wx[j];
          t[q].wy[j] = wy[j];
        }
      }
      break;
    }
    default:
      if (pair) {
        auto* t = static_cast<GridSamplePairTap<A, I>*>(table);
        for (int64_t q = 0; q < n; ++q) {
          grid_sample_bilinear_axis(grid[2 * q], W, pad, ac, ix, wx);
          grid_sample_bilinear_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
          A xa, xb, ya, yb;
          const int64_t sx = grid_sample_bilinear_window(ix, wx, W, &xa, &xb);
          const int64_t sy = grid_sample_bilinear_window(iy, wy, H, &ya, &yb);
          t[q].off = static_cast<I>(sy * W + sx);
          t[q].w[0] = ya * xa;
          t[q].w[1] = ya * xb;
          t[q].w[2] = yb * xa;
          t[q].w[3] = yb * xb;
        }
      } else {
        auto* t = static_cast<GridSampleBilinearTap<A, I>*>(table);
        for (int64_t q = 0; q < n; ++q) {
          grid_sample_bilinear_axis(grid[2 * q], W, pad, ac, ix, wx);
          grid_sample_bilinear_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
          t[q].off[0] = static_cast<I>(iy[0] * W + ix[0]);
          t[q].off[1] = static_cast<I>(iy[0] * W + ix[1]);
          t[q].off[2] = static_cast<I>(iy[1] * W + ix[0]);
          t[q].off[3] = static_cast<I>(iy[1] * W + ix[1]);
          t[q].w[0] = wy[0] * wx[0];
          t[q].w[1] = wy[0] * wx[1];
          t[q].w[2] = wy[1] * wx[0];
          t[q].w[3] = wy[1] * wx[1];
        }
      }
      break;
  }
}

// K channel planes (x + k * in_plane) through one block's taps into dst + k * dst_stride,
// [0, n). A pixel's taps are loaded once for the K channels; the loops are scalar
// (gathers, which compilers leave scalar for today's CPUs), K independent chains each.
template <int K, typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_nearest_rows(const A* x, int64_t in_plane,
                                                    const GridSampleNearestTap<A, I>* t, A* dst, int64_t dst_stride,
                                                    int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    const int64_t o = t[q].off;
    const A w = t[q].w;
    A r[K];
    for (int k = 0; k < K; ++k) r[k] = x[k * in_plane + o] * w;
    for (int k = 0; k < K; ++k) dst[k * dst_stride + q] = r[k];
  }
}

template <int K, typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_pair_rows(const A* x, int64_t in_plane, int64_t W,
                                                 const GridSamplePairTap<A, I>* t, A* dst, int64_t dst_stride,
                                                 int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    const int64_t o = t[q].off;
    const A w0 = t[q].w[0], w1 = t[q].w[1], w2 = t[q].w[2], w3 = t[q].w[3];
    A r[K];
    for (int k = 0; k < K; ++k) {
      const A* top = x + k * in_plane + o;
      const A* bottom = top + W;
      r[k] = top[0] * w0 + top[1] * w1 + bottom[0] * w2 + bottom[1] * w3;
    }
    for (int k = 0; k < K; ++k) dst[k * dst_stride + q] = r[k];
  }
}

template <int K, typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_bilinear_rows(const A* x, int64_t in_plane,
                                                     const GridSampleBilinearTap<A, I>* t, A* dst,
                                                     int64_t dst_stride, int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    const int64_t o0 = t[q].off[0], o1 = t[q].off[1], o2 = t[q].off[2], o3 = t[q].off[3];
    const A w0 = t[q].w[0], w1 = t[q].w[1], w2 = t[q].w[2], w3 = t[q].w[3];
    A r[K];
    for (int k = 0; k < K; ++k) {
      const A* xk = x + k * in_plane;
      r[k] = xk[o0] * w0 + xk[o1] * w1 + xk[o2] * w2 + xk[o3] * w3;
    }
    for (int k = 0; k < K; ++k) dst[k * dst_stride + q] = r[k];
  }
}

template <int K, typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_bicubic_rows(const A* x, int64_t in_plane,
                                                    const GridSampleBicubicTap<A, I>* t, A* dst, int64_t dst_stride,
                                                    int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    const GridSampleBicubicTap<A, I>& tap = t[q];
    const int64_t c0 = tap.col[0], c1 = tap.col[1], c2 = tap.col[2], c3 = tap.col[3];
    const A wx0 = tap.wx[0], wx1 = tap.wx[1], wx2 = tap.wx[2], wx3 = tap.wx[3];
    A r[K];
    for (int i = 0; i < 4; ++i) {
      const int64_t row = tap.row[i];
      const A wy = tap.wy[i];
      for (int k = 0; k < K; ++k) {
        const A* xr = x + k * in_plane + row;
        const A v = (xr[c0] * wx0 + xr[c1] * wx1 + xr[c2] * wx2 + xr[c3] * wx3) * wy;
        r[k] = i == 0 ? v : r[k] + v;
      }
    }
    for (int k = 0; k < K; ++k) dst[k * dst_stride + q] = r[k];
  }
}

template <int K, typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_channels(const GridSampleParams& p, bool pair, const A* x, const void* table,
                                                A* dst, int64_t dst_stride, int64_t n) {
  const int64_t in_plane = p.in_plane();
  switch (p.interpolation) {
    case kGridSampleNearest:
      return grid_sample_nearest_rows<K>(x, in_plane, static_cast<const GridSampleNearestTap<A, I>*>(table), dst,
                                         dst_stride, n);
    case kGridSampleBicubic:
      return grid_sample_bicubic_rows<K>(x, in_plane, static_cast<const GridSampleBicubicTap<A, I>*>(table), dst,
                                         dst_stride, n);
    default:
      if (pair)
        return grid_sample_pair_rows<K>(x, in_plane, p.in_w, static_cast<const GridSamplePairTap<A, I>*>(table), dst,
                                        dst_stride, n);
      return grid_sample_bilinear_rows<K>(x, in_plane, static_cast<const GridSampleBilinearTap<A, I>*>(table), dst,
                                          dst_stride, n);
  }
}

// Items [begin, end) of grid_sample_work(p). input and grid in A (float or
// double; 16-bit tensors widened by the caller), out in Out: A itself, or a
// 16-bit type each result is rounded to once (through scratch, K x block).
template <typename A, typename I, typename Out>
OPFORGE_ALWAYS_INLINE void grid_sample_forward_impl(const GridSampleParams& p, const GridSampleWork& work,
                                                    const A* input, const A* grid, Out* out, int64_t begin,
                                                    int64_t end, void* table, A* scratch) {
  constexpr int64_t K = kGridSampleChannelUnroll;
  const int64_t C = p.channels, in_plane = p.in_plane(), out_plane = p.out_plane();
  const bool pair = p.in_h >= 2 && p.in_w >= 2;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t cb = item % work.channel_blocks;
    const int64_t rest = item / work.channel_blocks;
    const int64_t block = rest % work.pixel_blocks, b = rest / work.pixel_blocks;
    const int64_t q0 = block * work.block, n = std::min(work.block, out_plane - q0);
    const int64_t c0 = cb * work.channel_block, c1 = std::min(C, c0 + work.channel_block);
    grid_sample_build_taps<A, I>(p, pair, grid + (b * out_plane + q0) * 2, n, table);
    for (int64_t c = c0; c < c1;) {
      const int64_t k = c1 - c >= K ? K : 1;
      const A* x = input + (b * C + c) * in_plane;
      Out* o = out + (b * C + c) * out_plane + q0;
      A* dst;
      int64_t stride;
      if constexpr (std::is_same_v<Out, A>) {
        dst = o;
        stride = out_plane;
      } else {
        dst = scratch;
        stride = kGridSampleBlock;
      }
      if (k == K)
        grid_sample_channels<K, A, I>(p, pair, x, table, dst, stride, n);
      else
        grid_sample_channels<1, A, I>(p, pair, x, table, dst, stride, n);
      if constexpr (!std::is_same_v<Out, A>)
        for (int64_t j = 0; j < k; ++j)
          for (int64_t q = 0; q < n; ++q) o[j * out_plane + q] = store<Out>(scratch[j * kGridSampleBlock + q]);
      c += k;
    }
  }
}

// ISA clones (cpu_dispatch.h): the always-inline bodies are compiled again inside each.
template <typename A, typename I, typename Out>
void grid_sample_forward_base(const GridSampleParams& p, const GridSampleWork& w, const A* input, const A* grid,
                              Out* out, int64_t begin, int64_t end, void* table, A* scratch) {
  grid_sample_forward_impl<A, I, Out>(p, w, input, grid, out, begin, end, table, scratch);
}
#if OPFORGE_X86_DISPATCH
template <typename A, typename I, typename Out>
OPFORGE_TARGET_AVX2 void grid_sample_forward_avx2(const GridSampleParams& p, const GridSampleWork& w, const A* input,
                                                  const A* grid, Out* out, int64_t begin, int64_t end,
                                                  void* table, A* scratch) {
  grid_sample_forward_impl<A, I, Out>(p, w, input, grid, out, begin, end, table, scratch);
}
template <typename A, typename I, typename Out>
OPFORGE_TARGET_AVX512 void grid_sample_forward_avx512(const GridSampleParams& p, const GridSampleWork& w,
                                                      const A* input, const A* grid, Out* out, int64_t begin,
                                                      int64_t end, void* table, A* scratch) {
  grid_sample_forward_impl<A, I, Out>(p, w, input, grid, out, begin, end, table, scratch);
}
#endif

template <typename A, typename I, typename Out>
inline void grid_sample_forward_indexed(const GridSampleParams& p, const GridSampleWork& w, const A* input,
                                        const A* grid, Out* out, int64_t begin, int64_t end) {
  // One allocation per call (a call serves one or more whole items): the tap table, then
  // for 16-bit outputs the K rows of float results before rounding.
  constexpr size_t table_bytes = grid_sample_table_bytes<A, I>();
  constexpr size_t scratch_count = std::is_same_v<Out, A> ? 0 : size_t(kGridSampleChannelUnroll * kGridSampleBlock);
  std::unique_ptr<A[]> buffer(new A[(table_bytes + sizeof(A) - 1) / sizeof(A) + scratch_count]);
  void* table = buffer.get();
  A* scratch = buffer.get() + (table_bytes + sizeof(A) - 1) / sizeof(A);
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return grid_sample_forward_avx512<A, I, Out>(p, w, input, grid, out, begin, end, table, scratch);
    case Isa::kAvx2:
      return grid_sample_forward_avx2<A, I, Out>(p, w, input, grid, out, begin, end, table, scratch);
    default:
      break;
  }
#endif
  grid_sample_forward_base<A, I, Out>(p, w, input, grid, out, begin, end, table, scratch);
}

// Work items [begin, end) of w = grid_sample_work(p): writes their part of
// out [N, C, Ho, Wo]. input [N, C, H, W] and grid [N, Ho, Wo, 2] in A (float
// or double); Out is A or float16_t / bfloat16_t (with A = float). Items write
// disjoint elements, so callers split them over threads; p must have passed
// grid_sample_check.
template <typename A, typename Out>
inline void grid_sample_forward(const GridSampleParams& p, const GridSampleWork& w, const A* input, const A* grid,
                                Out* out, int64_t begin, int64_t end) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "float or double accumulation");
  if (p.in_plane() <= int64_t(INT32_MAX))
    grid_sample_forward_indexed<A, int32_t, Out>(p, w, input, grid, out, begin, end);
  else
    grid_sample_forward_indexed<A, int64_t, Out>(p, w, input, grid, out, begin, end);
}

}  // namespace core
}  // namespace opforge
