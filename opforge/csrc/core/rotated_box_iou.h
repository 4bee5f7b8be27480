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
#pragma once

#include <cstdint>

#include "host_device.h"

namespace opforge {
namespace core {

// One box, precomputed once: its centre, half-width vector u = (w/2)(cos, sin),
// half-height vector v = (h/2)(-sin, cos), area, and the radius of its
// circumscribed circle (for the disjointness test). A box with w <= 0 or
// h <= 0 is empty: area 0, and its IoU with every box is 0.
struct RotatedBoxGeometry {
  double cx, cy, ux, uy, vx, vy, area, radius;
};

OPFORGE_HD_INLINE RotatedBoxGeometry rotated_box_geometry(double cx, double cy, double w, double h, double angle) {
  RotatedBoxGeometry g;
  const double c = cos_hd(angle), s = sin_hd(angle);
  const bool empty = !(w > 0.0 && h > 0.0);
  g.cx = cx;
  g.cy = cy;
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

OPFORGE_HD_INLINE double rotated_box_iou(const RotatedBoxGeometry& a, const RotatedBoxGeometry& b) {
  if (!(a.area > 0.0) || !(b.area > 0.0)) return 0.0;
  const double dx = a.cx - b.cx, dy = a.cy - b.cy, reach = a.radius + b.radius;
  // Circumscribed circles apart (with a margin for rounding): the boxes are disjoint.
  if (dx * dx + dy * dy > reach * reach * (1.0 + 1e-9)) return 0.0;
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

}  // namespace core
}  // namespace opforge
