// The part of the multi-scale deformable attention core that the CPU code and
// the CUDA kernels share verbatim (host + device): the problem description and
// where one sampling point lands in its level. Everything numerical about a
// sample (its corners, their weights, and which of them count) lives here,
// once, so torch CPU, torch CUDA, ORT CPU and ORT CUDA sample identically.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace opforge {
namespace core {

// value [N, S, M, D], sampling_locations [N, Lq, M, L, P, 2], attention_weights
// [N, Lq, M, L, P], output [N, Lq, M*D]; all contiguous. The levels' geometry
// (spatial_shapes [L, 2] rows (H, W), level_start_index [L]) is data, read by
// the kernels through pointers once ms_deform_attn_check_levels accepted it.
struct MsDeformAttnParams {
  int64_t batch = 0, value_len = 0, heads = 0, channels = 0;  // N, S, M, D
  int64_t queries = 0, levels = 0, points = 0;                // Lq, L, P

  // Sampling points of one (n, q, m): L * P.
  OPFORGE_HD int64_t points_per_head() const { return levels * points; }
  // Elements between two positions of value (and of grad_value): M * D.
  OPFORGE_HD int64_t value_row() const { return heads * channels; }
};

// The bilinear corners of one sampling point in one H x W level, pixel
// coordinates x = loc_x * W - 0.5, y = loc_y * H - 0.5 (grid_sample with
// align_corners=False). Corner order: 0 = (y0, x0), 1 = (y0, x0+1),
// 2 = (y0+1, x0), 3 = (y0+1, x0+1); a corner outside the map contributes
// nothing (padding_mode="zeros").
//
// x is rounded exactly as the reference form computes it: the grid
// g = 2 * loc - 1 (Deformable DETR's and transformers' code), then
// grid_sample's (g + 1) * (W / 2) - 0.5, each step rounded (no FMA). A point on
// a pixel line (transformers initialises every sampling offset there) then
// has the same floor, hence the same one-sided gradient, as grid_sample's.
template <typename A>
struct MsDeformAttnCorners {
  int64_t pos[4];  // corner's position in the level (y * W + x); meaningful only where `valid` has its bit
  A w[4];          // bilinear weights (0 for corners outside)
  A lx, ly;        // fractional parts of x and y: the weights' derivatives
  unsigned valid;  // bit k: corner k inside the map; 0: the point samples nothing
};

// The point test runs in floating point BEFORE any conversion to an integer:
// a NaN or infinite coordinate fails it (every comparison with NaN is false)
// and samples nothing, like grid_sample, so no index is ever formed from a
// NaN or a huge float. A point with x < -1 or x >= W has no corner inside;
// x = -1 has one, with weight 0 but a gradient (grid_sample's, too); inside
// [-1, W) the floor converts exactly (|x| <= W <= 2^63).
template <typename A>
OPFORGE_HD_INLINE A ms_deform_attn_pixel(A loc, int64_t size) {
  const A grid = A(2) * loc - A(1);  // 2 * loc is exact: no rounding for an FMA to skip
  return mul_rn_hd(grid + A(1), static_cast<A>(size) * A(0.5)) - A(0.5);  // W * 0.5 == W / 2 exactly
}

template <typename A>
OPFORGE_HD_INLINE MsDeformAttnCorners<A> ms_deform_attn_corners(A loc_x, A loc_y, int64_t h, int64_t w) {
  MsDeformAttnCorners<A> c;
  const A x = ms_deform_attn_pixel(loc_x, w), y = ms_deform_attn_pixel(loc_y, h);
  if (!(x >= A(-1) && x < static_cast<A>(w) && y >= A(-1) && y < static_cast<A>(h))) {
    c.valid = 0;
    c.lx = c.ly = A(0);
    for (int k = 0; k < 4; ++k) {
      c.pos[k] = 0;
      c.w[k] = A(0);
    }
    return c;
  }
  const A fx = floor_hd(x), fy = floor_hd(y);
  const int64_t x0 = static_cast<int64_t>(fx), y0 = static_cast<int64_t>(fy);
  c.lx = x - fx;
  c.ly = y - fy;
  const A hx = A(1) - c.lx, hy = A(1) - c.ly;
  // x0 >= -1 and x0 + 1 <= W (and the same for y): only these four tests can fail.
  const bool in_x0 = x0 >= 0, in_x1 = x0 + 1 < w, in_y0 = y0 >= 0, in_y1 = y0 + 1 < h;
  const bool in[4] = {in_y0 && in_x0, in_y0 && in_x1, in_y1 && in_x0, in_y1 && in_x1};
  const A bilinear[4] = {hy * hx, hy * c.lx, c.ly * hx, c.ly * c.lx};
  const int64_t pos[4] = {y0 * w + x0, y0 * w + x0 + 1, (y0 + 1) * w + x0, (y0 + 1) * w + x0 + 1};
  c.valid = 0;
  for (int k = 0; k < 4; ++k) {
    c.valid |= in[k] ? (1u << k) : 0u;
    c.pos[k] = in[k] ? pos[k] : 0;
    c.w[k] = in[k] ? bilinear[k] : A(0);
  }
  return c;
}

// d(bilinear weight k)/dx and /dy for the corner order above, from the
// fractional parts: weight 0 = (1-ly)(1-lx), 1 = (1-ly)lx, 2 = ly(1-lx), 3 = ly lx.
template <typename A>
OPFORGE_HD_INLINE void ms_deform_attn_weight_derivatives(const MsDeformAttnCorners<A>& c, A dx[4], A dy[4]) {
  const A hx = A(1) - c.lx, hy = A(1) - c.ly;
  dx[0] = -hy;
  dx[1] = hy;
  dx[2] = -c.ly;
  dx[3] = c.ly;
  dy[0] = -hx;
  dy[1] = -c.lx;
  dy[2] = hx;
  dy[3] = c.lx;
}

}  // namespace core
}  // namespace opforge
