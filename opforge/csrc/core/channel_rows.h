// Loops over a contiguous run of channels, shared by the cores that sample a
// channels-last map bilinearly (deform_conv2d's NHWC columns, ms_deform_attn's
// D-vectors, roi_align_rotated's C-vectors): each sampling point's four taps
// and weights are computed once and applied to whole rows, unit-stride loops
// the compiler vectorises at the widest vectors the CPU has (cpu_dispatch.h).
#pragma once

#include <cstdint>

#include "cpu_dispatch.h"

namespace opforge {
namespace core {

// dst[0:n] = w0*a0 + w1*a1 + w2*a2 + w3*a3 (the four taps of one point).
template <typename T>
OPFORGE_ALWAYS_INLINE void blend4(const T* __restrict a0, const T* __restrict a1, const T* __restrict a2,
                                  const T* __restrict a3, T w0, T w1, T w2, T w3, T* __restrict dst, int64_t n) {
  for (int64_t c = 0; c < n; ++c) dst[c] = w0 * a0[c] + w1 * a1[c] + w2 * a2[c] + w3 * a3[c];
}

// acc[0:n] += w0*a0 + w1*a1 + w2*a2 + w3*a3.
template <typename T>
OPFORGE_ALWAYS_INLINE void blend4_add(const T* __restrict a0, const T* __restrict a1, const T* __restrict a2,
                                      const T* __restrict a3, T w0, T w1, T w2, T w3, T* __restrict acc, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += w0 * a0[c] + w1 * a1[c] + w2 * a2[c] + w3 * a3[c];
}

// acc[0:n] += w * a (one tap, or one tap's gradient row). Where the four taps
// of a point can be the same row (clamped at a map's last row or column), each
// is its own pass: one loop writing four possibly-equal rows could not promise
// the compiler they are distinct.
template <typename T>
OPFORGE_ALWAYS_INLINE void axpy(const T* __restrict a, T w, T* __restrict acc, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += w * a[c];
}

}  // namespace core
}  // namespace opforge
