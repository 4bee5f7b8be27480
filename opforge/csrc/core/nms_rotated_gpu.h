// The CUDA kernel's per-work-item body for rotated NMS, written as plain
// host+device C++ (no CUDA API): cuda/nms_rotated.cuh runs one item per
// thread, and a host program can compile this header with g++ and run every
// item in a loop to check the GPU's part without a GPU.
//
// Work item: one 64-bit word of the suppression mask, (row i, word w): bit b
// is set when box i (in visiting order) would suppress box j = 64 w + b, for
// j > i. The O(N^2) IoUs run here, in parallel; the greedy pass over the rows
// is sequential and cheap, and runs on the host (nms_rotated_reduce_mask).
#pragma once

#include <cstdint>

#include "rotated_box_iou.h"

namespace opforge {
namespace core {

// Rows [row_begin, row_begin + rows) of the mask of n boxes (words per row);
// labels null unless batched; item in [0, rows * words). kExtreme: the plan has
// an extreme box (NmsRotatedPlan::extreme), whose pairs are scaled; the usual
// instance has no code for that (rotated_box_iou.h says why).
template <bool kExtreme>
OPFORGE_HD_INLINE void nms_rotated_mask_item(int64_t n, int64_t words, int64_t row_begin, int64_t item,
                                             const RotatedBoxGeometry* geometry, const int64_t* labels,
                                             double iou_threshold, uint64_t* mask) {
  const int64_t i = row_begin + item / words, w = item % words;
  const int64_t j0 = w * 64, stop = j0 + 64 < n ? j0 + 64 : n;
  uint64_t bits = 0;
  for (int64_t j = (j0 > i + 1 ? j0 : i + 1); j < stop; ++j) {
    if (labels != nullptr && labels[i] != labels[j]) continue;
    if (rotated_box_iou<kExtreme>(geometry[i], geometry[j]) > iou_threshold) bits |= uint64_t(1) << (j - j0);
  }
  mask[item] = bits;
}

}  // namespace core
}  // namespace opforge
