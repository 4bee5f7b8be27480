// CUDA kernel of rotated NMS's suppression mask: a grid-stride wrapper around
// the shared work-item body (core/nms_rotated_gpu.h).
#pragma once

#include <cstdint>

#include "../nms_rotated_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <bool kExtreme>
__global__ void __launch_bounds__(kThreads)
    nms_rotated_mask_kernel(int64_t n, int64_t words, int64_t row_begin, int64_t items,
                            const RotatedBoxGeometry* __restrict__ geometry, const int64_t* __restrict__ labels,
                            double iou_threshold, uint64_t* __restrict__ mask) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    nms_rotated_mask_item<kExtreme>(n, words, row_begin, i, geometry, labels, iou_threshold, mask);
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
