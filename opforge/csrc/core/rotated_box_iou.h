// Exact IoU of two rotated rectangles, in float64, host + device: the part of
// the rotated NMS core that the CPU code and the CUDA kernels share verbatim,
// so every front end suppresses the same boxes.
//
// Boxes are (cx, cy, w, h, angle in radians) as mmcv's: the width axis points
// along (cos a, sin a) in (x, y), so with y pointing down a positive angle
// turns clockwise on screen (mmcv's nms_rotated default, clockwise=True).
// The intersection is the convex polygon left of box B's four edges clipped
// out of box A (Sutherland-Hodgman, at most 8 vertices), its area by the
// shoelace formula; both boxes are first moved so that the midpoint of their
// centres is the origin, which keeps the coordinates small and the products
// exact to double rounding even for boxes far from the origin.
//
// Any finite boxes: the clipping multiplies coordinates, so sides beyond about
// 1e154 would overflow float64 (two identical boxes got IoU NaN and were both
// kept) and sides below about 1e-154 would underflow (their area became 0, an
// empty box). The IoU does not change when both boxes are scaled by the same
// factor, and scaling by a power of two is exact, so a pair with such a box is
// scaled until its extent is about 1 first (rotated_box_scaled_pair). Pairs of
// moderate boxes, every pair of usual detections, skip that: their arithmetic
// and cost are unchanged.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace opforge {
namespace core {

// Sides in [2^-500, 2^500] keep every product of the clipping and every area
// inside float64's normal range (2^-1022 .. 2^1024), with room to spare: two
// such boxes reach the clipping only when their circumscribed circles meet, so
// their coordinates about the centres' midpoint stay below about 2^502.
constexpr double kRotatedBoxModerateMin = 0x1p-500;
constexpr double kRotatedBoxModerateMax = 0x1p500;
// Centres within 2^1020 of the origin: the sum of two (for their midpoint) stays finite.
constexpr double kRotatedBoxCentreMax = 0x1p1020;

// One box, precomputed once: its centre, half-width vector u = (w/2)(cos, sin),
// half-height vector v = (h/2)(-sin, cos), area, and the radius of its
// circumscribed circle (for the disjointness test). A box with w <= 0 or
// h <= 0 is empty: area 0, and its IoU with every box is 0.
//
// A box with a side outside [kRotatedBoxModerateMin, kRotatedBoxModerateMax]
// or its centre beyond kRotatedBoxCentreMax is "extreme": area is -1 (the
// mark) and (ux, uy, vx, vy) hold (w, h, cos, sin) instead, because u and v of
// a side below 2^-1022 would lose digits and w * h can overflow or underflow;
// rotated_box_scaled_pair scales those raw numbers. Its radius is still the
// circumscribed circle's (finite). The layout stays 8 doubles: the CUDA paths
// copy the array to the device as is.
struct RotatedBoxGeometry {
  double cx, cy, ux, uy, vx, vy, area, radius;
};

OPFORGE_HD_INLINE RotatedBoxGeometry rotated_box_geometry(double cx, double cy, double w, double h, double angle) {
  RotatedBoxGeometry g;
  const double c = cos_hd(angle), s = sin_hd(angle);
  const bool empty = !(w > 0.0 && h > 0.0);
  g.cx = cx;
  g.cy = cy;
  if (!empty && !(w >= kRotatedBoxModerateMin && w <= kRotatedBoxModerateMax && h >= kRotatedBoxModerateMin &&
                  h <= kRotatedBoxModerateMax && ::fabs(cx) <= kRotatedBoxCentreMax &&
                  ::fabs(cy) <= kRotatedBoxCentreMax)) {
    g.ux = w;
    g.uy = h;
    g.vx = c;
    g.vy = s;
    g.area = -1.0;
    // sqrt(w^2 + h^2) / 2 without squaring the larger side (it may be ~1e308)
    const double big = w > h ? w : h, small = w > h ? h : w, r = small / big;
    g.radius = (0.5 * big) * ::sqrt(1.0 + r * r);
    return g;
  }
  g.ux = 0.5 * w * c;
  g.uy = 0.5 * w * s;
  g.vx = -0.5 * h * s;
  g.vy = 0.5 * h * c;
  g.area = empty ? 0.0 : w * h;
  g.radius = empty ? 0.0 : 0.5 * ::sqrt(w * w + h * h);
  return g;
}

// Corners of g shifted by (-mx, -my), counter-clockwise (u x v = |u||v| > 0).
OPFORGE_HD_INLINE void rotated_box_corners(const RotatedBoxGeometry& g, double mx, double my, double x[4],
                                           double y[4]) {
  const double cx = g.cx - mx, cy = g.cy - my;
  x[0] = cx - g.ux - g.vx;
  y[0] = cy - g.uy - g.vy;
  x[1] = cx + g.ux - g.vx;
  y[1] = cy + g.uy - g.vy;
  x[2] = cx + g.ux + g.vx;
  y[2] = cy + g.uy + g.vy;
  x[3] = cx - g.ux + g.vx;
  y[3] = cy - g.uy + g.vy;
}

// The IoU of two non-empty boxes in the moderate form (u, v and area, not the
// extreme mark), at any distance: centres too far apart for float64's squares
// give an infinite dx * dx, which the disjointness test reads as apart,
// rightly, since the circles' reach is at most 2^501.
OPFORGE_HD_INLINE double rotated_box_iou_moderate(const RotatedBoxGeometry& a, const RotatedBoxGeometry& b) {
  const double dx = a.cx - b.cx, dy = a.cy - b.cy, reach = a.radius + b.radius;
  // Circumscribed circles apart (with a margin for rounding): the boxes are disjoint.
  if (dx * dx + dy * dy > reach * reach * (1.0 + 1e-9)) return 0.0;
  // No overflow: moderate boxes' centres are within 2^1020 of the origin.
  const double mx = 0.5 * (a.cx + b.cx), my = 0.5 * (a.cy + b.cy);
  // Clipping a convex n-gon by a half-plane adds at most one vertex: 4 -> at most 8.
  constexpr int kMax = 16;
  double px[kMax], py[kMax], qx[kMax], qy[kMax];
  rotated_box_corners(a, mx, my, px, py);
  int n = 4;
  double ex[4], ey[4];
  rotated_box_corners(b, mx, my, ex, ey);
  for (int e = 0; e < 4 && n > 0; ++e) {
    const double x0 = ex[e], y0 = ey[e], x1 = ex[(e + 1) & 3], y1 = ey[(e + 1) & 3];
    const double dxe = x1 - x0, dye = y1 - y0;
    int m = 0;
    for (int i = 0; i < n; ++i) {
      const int j = (i + 1) % n;
      // Signed distance (times the edge length) of each vertex: >= 0 is inside (left of the edge).
      const double di = dxe * (py[i] - y0) - dye * (px[i] - x0);
      const double dj = dxe * (py[j] - y0) - dye * (px[j] - x0);
      const bool in_i = di >= 0.0, in_j = dj >= 0.0;
      if (in_i && m < kMax) {
        qx[m] = px[i];
        qy[m] = py[i];
        ++m;
      }
      if (in_i != in_j && m < kMax) {
        const double t = di / (di - dj);  // di and dj differ in sign: no division by zero
        qx[m] = px[i] + t * (px[j] - px[i]);
        qy[m] = py[i] + t * (py[j] - py[i]);
        ++m;
      }
    }
    n = m;
    for (int i = 0; i < n; ++i) {
      px[i] = qx[i];
      py[i] = qy[i];
    }
  }
  if (n < 3) return 0.0;
  double twice = 0.0;
  for (int i = 0; i < n; ++i) {
    const int j = (i + 1) % n;
    twice += px[i] * py[j] - px[j] * py[i];
  }
  double inter = 0.5 * (twice < 0.0 ? -twice : twice);
  const double smaller = a.area < b.area ? a.area : b.area;
  if (inter > smaller) inter = smaller;  // rounding can overshoot a box inside the other
  const double uni = a.area + b.area - inter;
  return uni > 0.0 ? inter / uni : 0.0;
}

// Powers of two from their bits, and the exponent of a double, without libm
// calls (device code too).
OPFORGE_HD_INLINE double rotated_box_pow2(int n) {  // 2^n, n in [-1022, 1023]
  const uint64_t bits = static_cast<uint64_t>(n + 1023) << 52;
  double v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

OPFORGE_HD_INLINE int rotated_box_ilogb(double x) {  // floor(log2(x)), x > 0 finite (subnormals too)
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int e = static_cast<int>((bits >> 52) & 0x7ff);
  if (e != 0) return e - 1023;
  x *= rotated_box_pow2(64);
  memcpy(&bits, &x, sizeof bits);
  return static_cast<int>((bits >> 52) & 0x7ff) - 1023 - 64;
}

// x * 2^k for k in [-1023, 1074], in two exact steps; the result rounds only where it is
// subnormal: a value 2^-1022 of the pair's extent, below float64's precision of the IoU.
OPFORGE_HD_INLINE double rotated_box_scale(double x, int k) {
  const int half = k / 2;
  return x * rotated_box_pow2(half) * rotated_box_pow2(k - half);
}

// g's axes, area and radius scaled by 2^k, in the moderate form; the centre is set by the caller.
OPFORGE_HD_INLINE void rotated_box_scaled_axes(const RotatedBoxGeometry& g, int k, RotatedBoxGeometry& s) {
  if (g.area < 0.0) {  // extreme: (ux, uy, vx, vy) hold (w, h, cos, sin)
    const double w = rotated_box_scale(g.ux, k), h = rotated_box_scale(g.uy, k);
    s.ux = 0.5 * w * g.vx;
    s.uy = 0.5 * w * g.vy;
    s.vx = -0.5 * h * g.vy;
    s.vy = 0.5 * h * g.vx;
    s.area = w * h;
    // (w + h) / 2 >= the circumscribed radius: a looser disjointness test, and no sqrt (its errno
    // path is a libm call); a stored radius of a subnormal-sided box may have rounded low.
    s.radius = 0.5 * (w + h);
  } else {
    s.ux = rotated_box_scale(g.ux, k);
    s.uy = rotated_box_scale(g.uy, k);
    s.vx = rotated_box_scale(g.vx, k);
    s.vy = rotated_box_scale(g.vy, k);
    s.area = rotated_box_scale(rotated_box_scale(g.area, k), k);
    s.radius = rotated_box_scale(g.radius, k);
  }
}

// A pair of non-empty boxes, one of them extreme, scaled by the power of two
// that brings the pair's extent (half the centres' offset per axis, the sides)
// into [1, 2) and centred on their midpoint, in the moderate form.
OPFORGE_HD_INLINE void rotated_box_scaled_pair(const RotatedBoxGeometry& a, const RotatedBoxGeometry& b,
                                               RotatedBoxGeometry& sa, RotatedBoxGeometry& sb) {
  // Halves first: the offset itself overflows when both centres are near +-1e308.
  const double hx = ::fabs(0.5 * a.cx - 0.5 * b.cx), hy = ::fabs(0.5 * a.cy - 0.5 * b.cy);
  const double size_a = a.area < 0.0 ? (a.ux > a.uy ? a.ux : a.uy) : a.radius;
  const double size_b = b.area < 0.0 ? (b.ux > b.uy ? b.ux : b.uy) : b.radius;
  double extent = hx > hy ? hx : hy;
  if (size_a > extent) extent = size_a;
  if (size_b > extent) extent = size_b;  // > 0: both boxes are non-empty
  const int k = -rotated_box_ilogb(extent);
  double dx = a.cx - b.cx, dy = a.cy - b.cy;
  // An offset beyond DBL_MAX: both centres are huge, k < 0, and scaling each first is exact.
  dx = ::fabs(dx) <= 1.7976931348623157e308 ? rotated_box_scale(dx, k)
                                             : rotated_box_scale(a.cx, k) - rotated_box_scale(b.cx, k);
  dy = ::fabs(dy) <= 1.7976931348623157e308 ? rotated_box_scale(dy, k)
                                             : rotated_box_scale(a.cy, k) - rotated_box_scale(b.cy, k);
  rotated_box_scaled_axes(a, k, sa);
  rotated_box_scaled_axes(b, k, sb);
  sa.cx = 0.5 * dx;
  sa.cy = 0.5 * dy;
  sb.cx = -0.5 * dx;
  sb.cy = -0.5 * dy;
}

// kMayBeExtreme false: the caller knows neither box is extreme (an NMS plan with
// no extreme box, every usual one), and the pair costs what it did before
// extreme boxes were handled: even an untaken branch to the scaling in the hot
// loops cost the CPU suppression about 4% (N = 8000, measured).
template <bool kMayBeExtreme = true>
OPFORGE_HD_INLINE double rotated_box_iou(const RotatedBoxGeometry& a, const RotatedBoxGeometry& b) {
  if (!(a.area > 0.0) || !(b.area > 0.0)) {
    if constexpr (kMayBeExtreme) {
      if (a.area == 0.0 || b.area == 0.0) return 0.0;  // an empty box
      RotatedBoxGeometry sa, sb;                       // an extreme box (area -1)
      rotated_box_scaled_pair(a, b, sa, sb);
      return rotated_box_iou_moderate(sa, sb);
    } else {
      return 0.0;  // an empty box
    }
  }
  return rotated_box_iou_moderate(a, b);
}

}  // namespace core
}  // namespace opforge
