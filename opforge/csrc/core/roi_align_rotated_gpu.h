// The CUDA kernels' per-work-item bodies for rotated RoI Align, written as
// plain host+device C++ (no CUDA API): the __global__ wrappers in
// cuda/roi_align_rotated.cuh run one item per thread, and a host program can
// compile this header with g++ and run every item in a loop (atomics become
// plain adds) to check the GPU indexing and arithmetic without a GPU.
//
// Work items: one output element (k, c, ph, pw), pw fastest, so a warp's
// threads share a roi and read neighbouring bins of one channel plane (the
// input stays NCHW on the GPU: no transpose pass). Forward: the bin's mean
// over its sampling points. Backward: the same points, scattering
// grad / count * weight into grad_input with atomics (rois overlap).
// Sampling is the CPU core's (roi_align_rotated_sample.h).
//
// Types: T is the storage type, A the accumulation type (float for the 16-bit
// types). ScalarIO<T, A> (host_device.h) converts.
#pragma once

#include <cstdint>

#include "roi_align_rotated_sample.h"

namespace opforge {
namespace core {

inline OPFORGE_HD int64_t roi_align_rotated_items(const RoiAlignRotatedParams& p) {
  return p.rois * p.channels * p.bins();
}

// The roi of item `item`, its 6 values loaded in A.
template <typename T, typename A>
OPFORGE_HD_INLINE RotatedRoi<A> roi_align_rotated_item_roi(const RoiAlignRotatedParams& p, const T* rois,
                                                           int64_t k) {
  using IO = ScalarIO<T, A>;
  A roi[6];
  for (int i = 0; i < 6; ++i) roi[i] = IO::load(rois[6 * k + i]);
  return rotated_roi<A>(p, roi);
}

template <typename T, typename A>
OPFORGE_HD_INLINE void roi_align_rotated_forward_item(const RoiAlignRotatedParams& p, int64_t item, const T* input,
                                                      const T* rois, T* out) {
  using IO = ScalarIO<T, A>;
  const int64_t bins = p.bins(), bin = item % bins, c = (item / bins) % p.channels, k = item / (bins * p.channels);
  const int64_t ph = bin / p.pooled_w, pw = bin % p.pooled_w;
  const RotatedRoi<A> r = roi_align_rotated_item_roi<T, A>(p, rois, k);
  const T* plane = input + (r.image * p.channels + c) * p.map_size();
  A sum = A(0);
  for (int64_t iy = 0; iy < r.grid_h; ++iy)
    for (int64_t ix = 0; ix < r.grid_w; ++ix) {
      const RoiSample<A> s = rotated_roi_sample<A>(r, p.height, p.width, ph, pw, iy, ix);
      if (!s.valid) continue;
      sum += s.w[0] * IO::load(plane[s.pos[0]]) + s.w[1] * IO::load(plane[s.pos[1]]) +
             s.w[2] * IO::load(plane[s.pos[2]]) + s.w[3] * IO::load(plane[s.pos[3]]);
    }
  out[item] = IO::store(sum / r.count);
}

// grad_input (A: float32 for the 16-bit types) must start zeroed.
template <typename T, typename A>
OPFORGE_HD_INLINE void roi_align_rotated_backward_item(const RoiAlignRotatedParams& p, int64_t item,
                                                       const T* grad_output, const T* rois, A* grad_input) {
  using IO = ScalarIO<T, A>;
  const int64_t bins = p.bins(), bin = item % bins, c = (item / bins) % p.channels, k = item / (bins * p.channels);
  const int64_t ph = bin / p.pooled_w, pw = bin % p.pooled_w;
  const RotatedRoi<A> r = roi_align_rotated_item_roi<T, A>(p, rois, k);
  A* plane = grad_input + (r.image * p.channels + c) * p.map_size();
  const A g = IO::load(grad_output[item]) / r.count;
  for (int64_t iy = 0; iy < r.grid_h; ++iy)
    for (int64_t ix = 0; ix < r.grid_w; ++ix) {
      const RoiSample<A> s = rotated_roi_sample<A>(r, p.height, p.width, ph, pw, iy, ix);
      if (!s.valid) continue;
      for (int t = 0; t < 4; ++t) atomic_add_hd(plane + s.pos[t], s.w[t] * g);
    }
}

}  // namespace core
}  // namespace opforge
