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
// torch's, so float32 results agree with torch to the last bits.
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
//     edge, reflection -> the exact reflection (fmod; torch's float32
//     reflection loses precision past ~2^24 and differs there).
// A tap outside the map under zeros padding gets weight 0 and a clamped index
// (the sum stays branch-free); a non-finite input value at that clamped index
// would then give NaN (0 * inf) where torch's masked read gives 0.
//
// Speed (CPU): work items are (image, block of kGridSampleBlock output
// pixels, block of channels). An item computes its pixels' taps once (plane
// offsets and weights: 1 nearest, 2 x 2 bilinear, 4 + 4 separable bicubic)
// and applies them to each channel plane in a unit-stride loop over the
// pixels: gathers the compiler vectorises at the widest vectors the CPU has
// (cpu_dispatch.h). Each output element is computed by the same code whatever
// the split, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
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
  p.batch = input[0];
  p.channels = input[1];
  p.in_h = input[2];
  p.in_w = input[3];
  p.out_h = grid[1];
  p.out_w = grid[2];
  p.interpolation = interpolation;
  p.padding = padding;
  p.align_corners = align_corners != 0;
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

// ---- CPU kernel -------------------------------------------------------------------------

// Output pixels per work item (one tap table).
constexpr int64_t kGridSampleBlock = 256;
// Tap reads per work item the channel blocking aims at (channels split when more).
constexpr int64_t kGridSampleItemWork = int64_t(1) << 17;

// How the output is cut into work items: (image, pixel block, channel block).
struct GridSampleWork {
  int64_t pixel_blocks = 0, channel_block = 1, channel_blocks = 0, items = 0;
};

inline int64_t grid_sample_taps(const GridSampleParams& p) {
  return p.interpolation == kGridSampleNearest ? 1 : p.interpolation == kGridSampleBicubic ? 16 : 4;
}

inline GridSampleWork grid_sample_work(const GridSampleParams& p) {
  GridSampleWork w;
  const int64_t pixels = p.out_plane();
  if (p.batch == 0 || p.channels == 0 || pixels == 0) return w;
  w.pixel_blocks = (pixels + kGridSampleBlock - 1) / kGridSampleBlock;
  const int64_t block = std::min(pixels, kGridSampleBlock);
  const int64_t per_channel = block * grid_sample_taps(p);
  w.channel_block = std::min(p.channels, std::max<int64_t>(1, kGridSampleItemWork / per_channel));
  w.channel_blocks = (p.channels + w.channel_block - 1) / w.channel_block;
  w.items = p.batch * w.pixel_blocks * w.channel_blocks;  // <= output elements: fits
  return w;
}

// One pixel block's taps. I: the plane-offset type (int32_t when H*W fits).
// nearest: off[0], w[0]; bilinear: off[0..3], w[0..3] (2-D, corners nw ne sw se);
// bicubic: off[i] = row i's offset, col[j], w[j] = x weights, wy[i] = y weights.
template <typename A, typename I>
struct GridSampleTaps {
  alignas(64) I off[4][kGridSampleBlock];
  alignas(64) I col[4][kGridSampleBlock];
  alignas(64) A w[4][kGridSampleBlock];
  alignas(64) A wy[4][kGridSampleBlock];
};

template <typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_build_taps(const GridSampleParams& p, const A* grid, int64_t n,
                                                  GridSampleTaps<A, I>& t) {
  const int64_t W = p.in_w, H = p.in_h, pad = p.padding;
  const bool ac = p.align_corners;
  int64_t ix[4], iy[4];
  A wx[4], wy[4];
  switch (p.interpolation) {
    case kGridSampleNearest:
      for (int64_t q = 0; q < n; ++q) {
        grid_sample_nearest_axis(grid[2 * q], W, pad, ac, ix, wx);
        grid_sample_nearest_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
        t.off[0][q] = static_cast<I>(iy[0] * W + ix[0]);
        t.w[0][q] = wy[0] * wx[0];
      }
      break;
    case kGridSampleBicubic:
      for (int64_t q = 0; q < n; ++q) {
        grid_sample_bicubic_axis(grid[2 * q], W, pad, ac, ix, wx);
        grid_sample_bicubic_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
        for (int j = 0; j < 4; ++j) {
          t.off[j][q] = static_cast<I>(iy[j] * W);
          t.col[j][q] = static_cast<I>(ix[j]);
          t.w[j][q] = wx[j];
          t.wy[j][q] = wy[j];
        }
      }
      break;
    default:
      for (int64_t q = 0; q < n; ++q) {
        grid_sample_bilinear_axis(grid[2 * q], W, pad, ac, ix, wx);
        grid_sample_bilinear_axis(grid[2 * q + 1], H, pad, ac, iy, wy);
        t.off[0][q] = static_cast<I>(iy[0] * W + ix[0]);
        t.off[1][q] = static_cast<I>(iy[0] * W + ix[1]);
        t.off[2][q] = static_cast<I>(iy[1] * W + ix[0]);
        t.off[3][q] = static_cast<I>(iy[1] * W + ix[1]);
        t.w[0][q] = wy[0] * wx[0];
        t.w[1][q] = wy[0] * wx[1];
        t.w[2][q] = wy[1] * wx[0];
        t.w[3][q] = wy[1] * wx[1];
      }
      break;
  }
}

// One channel plane x through one block's taps into dst[0:n] (unit stride: vectorised gathers).
template <typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_nearest_row(const A* __restrict x, const I* __restrict o,
                                                   const A* __restrict w, A* __restrict dst, int64_t n) {
  for (int64_t q = 0; q < n; ++q) dst[q] = x[o[q]] * w[q];
}

template <typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_bilinear_row(const A* __restrict x, const GridSampleTaps<A, I>& t,
                                                    A* __restrict dst, int64_t n) {
  const I* __restrict o0 = t.off[0];
  const I* __restrict o1 = t.off[1];
  const I* __restrict o2 = t.off[2];
  const I* __restrict o3 = t.off[3];
  const A* __restrict w0 = t.w[0];
  const A* __restrict w1 = t.w[1];
  const A* __restrict w2 = t.w[2];
  const A* __restrict w3 = t.w[3];
  for (int64_t q = 0; q < n; ++q) dst[q] = x[o0[q]] * w0[q] + x[o1[q]] * w1[q] + x[o2[q]] * w2[q] + x[o3[q]] * w3[q];
}

template <typename A, typename I>
OPFORGE_ALWAYS_INLINE void grid_sample_bicubic_row(const A* __restrict x, const GridSampleTaps<A, I>& t,
                                                   A* __restrict dst, int64_t n) {
  const I* __restrict c0 = t.col[0];
  const I* __restrict c1 = t.col[1];
  const I* __restrict c2 = t.col[2];
  const I* __restrict c3 = t.col[3];
  const A* __restrict wx0 = t.w[0];
  const A* __restrict wx1 = t.w[1];
  const A* __restrict wx2 = t.w[2];
  const A* __restrict wx3 = t.w[3];
  for (int i = 0; i < 4; ++i) {
    const I* __restrict r = t.off[i];
    const A* __restrict wy = t.wy[i];
    if (i == 0) {
      for (int64_t q = 0; q < n; ++q) {
        const A* row = x + r[q];
        dst[q] = (row[c0[q]] * wx0[q] + row[c1[q]] * wx1[q] + row[c2[q]] * wx2[q] + row[c3[q]] * wx3[q]) * wy[q];
      }
    } else {
      for (int64_t q = 0; q < n; ++q) {
        const A* row = x + r[q];
        dst[q] += (row[c0[q]] * wx0[q] + row[c1[q]] * wx1[q] + row[c2[q]] * wx2[q] + row[c3[q]] * wx3[q]) * wy[q];
      }
    }
  }
}

// Items [begin, end) of grid_sample_work(p). input and grid in A (float or
// double; 16-bit tensors widened by the caller), out in Out: A itself, or a
// 16-bit type each result is rounded to once (through scratch).
template <typename A, typename I, typename Out>
OPFORGE_ALWAYS_INLINE void grid_sample_forward_impl(const GridSampleParams& p, const GridSampleWork& work,
                                                    const A* input, const A* grid, Out* out, int64_t begin,
                                                    int64_t end, GridSampleTaps<A, I>& t, A* scratch) {
  const int64_t C = p.channels, in_plane = p.in_plane(), out_plane = p.out_plane();
  for (int64_t item = begin; item < end; ++item) {
    const int64_t cb = item % work.channel_blocks;
    const int64_t rest = item / work.channel_blocks;
    const int64_t block = rest % work.pixel_blocks, b = rest / work.pixel_blocks;
    const int64_t q0 = block * kGridSampleBlock, n = std::min(kGridSampleBlock, out_plane - q0);
    const int64_t c0 = cb * work.channel_block, c1 = std::min(C, c0 + work.channel_block);
    grid_sample_build_taps<A, I>(p, grid + (b * out_plane + q0) * 2, n, t);
    for (int64_t c = c0; c < c1; ++c) {
      const A* x = input + (b * C + c) * in_plane;
      Out* o = out + (b * C + c) * out_plane + q0;
      A* dst;
      if constexpr (std::is_same_v<Out, A>)
        dst = o;
      else
        dst = scratch;
      switch (p.interpolation) {
        case kGridSampleNearest:
          grid_sample_nearest_row<A, I>(x, t.off[0], t.w[0], dst, n);
          break;
        case kGridSampleBicubic:
          grid_sample_bicubic_row<A, I>(x, t, dst, n);
          break;
        default:
          grid_sample_bilinear_row<A, I>(x, t, dst, n);
          break;
      }
      if constexpr (!std::is_same_v<Out, A>)
        for (int64_t q = 0; q < n; ++q) o[q] = store<Out>(scratch[q]);
    }
  }
}

// ISA clones (cpu_dispatch.h): the always-inline bodies re-vectorise inside each.
template <typename A, typename I, typename Out>
void grid_sample_forward_base(const GridSampleParams& p, const GridSampleWork& w, const A* input, const A* grid,
                              Out* out, int64_t begin, int64_t end, GridSampleTaps<A, I>& t, A* scratch) {
  grid_sample_forward_impl<A, I, Out>(p, w, input, grid, out, begin, end, t, scratch);
}
#if OPFORGE_X86_DISPATCH
template <typename A, typename I, typename Out>
OPFORGE_TARGET_AVX2 void grid_sample_forward_avx2(const GridSampleParams& p, const GridSampleWork& w, const A* input,
                                                  const A* grid, Out* out, int64_t begin, int64_t end,
                                                  GridSampleTaps<A, I>& t, A* scratch) {
  grid_sample_forward_impl<A, I, Out>(p, w, input, grid, out, begin, end, t, scratch);
}
template <typename A, typename I, typename Out>
OPFORGE_TARGET_AVX512 void grid_sample_forward_avx512(const GridSampleParams& p, const GridSampleWork& w,
                                                      const A* input, const A* grid, Out* out, int64_t begin,
                                                      int64_t end, GridSampleTaps<A, I>& t, A* scratch) {
  grid_sample_forward_impl<A, I, Out>(p, w, input, grid, out, begin, end, t, scratch);
}
#endif

template <typename A, typename I, typename Out>
inline void grid_sample_forward_indexed(const GridSampleParams& p, const GridSampleWork& w, const A* input,
                                        const A* grid, Out* out, int64_t begin, int64_t end) {
  GridSampleTaps<A, I> t;  // 8-32 KiB on the stack: no allocation per item
  alignas(64) A scratch[std::is_same_v<Out, A> ? 1 : kGridSampleBlock];
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return grid_sample_forward_avx512<A, I, Out>(p, w, input, grid, out, begin, end, t, scratch);
    case Isa::kAvx2:
      return grid_sample_forward_avx2<A, I, Out>(p, w, input, grid, out, begin, end, t, scratch);
    default:
      break;
  }
#endif
  grid_sample_forward_base<A, I, Out>(p, w, input, grid, out, begin, end, t, scratch);
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
