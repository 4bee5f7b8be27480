// CUDA launchers of roi_align_rotated: the shared work items
// (core/roi_align_rotated_gpu.h), one thread per output element.
#pragma once

#include <cstdint>

#include "../roi_align_rotated_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T>
cudaError_t launch_roi_align_rotated_forward(const RoiAlignRotatedParams& p, const T* input, const T* rois, T* out,
                                             cudaStream_t stream) {
  return launch_items<roi_align_rotated_forward_item<T, typename acc<T>::type>>(roi_align_rotated_items(p), stream,
                                                                                 p, input, rois, out);
}

// grad_input (float32 for the 16-bit types) must start zeroed: the items scatter into it.
template <typename T>
cudaError_t launch_roi_align_rotated_backward(const RoiAlignRotatedParams& p, const T* grad_output, const T* rois,
                                              typename acc<T>::type* grad_input, cudaStream_t stream) {
  return launch_items<roi_align_rotated_backward_item<T, typename acc<T>::type>>(roi_align_rotated_items(p), stream,
                                                                                  p, grad_output, rois, grad_input);
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
