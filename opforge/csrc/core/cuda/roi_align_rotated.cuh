// CUDA kernels of roi_align_rotated: grid-stride wrappers around the shared
// work-item bodies (core/roi_align_rotated_gpu.h).
#pragma once

#include <cstdint>

#include "../roi_align_rotated_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    roi_align_rotated_forward_kernel(const RoiAlignRotatedParams p, int64_t items, const T* __restrict__ input,
                                     const T* __restrict__ rois, T* __restrict__ out) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    roi_align_rotated_forward_item<T, A>(p, i, input, rois, out);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    roi_align_rotated_backward_kernel(const RoiAlignRotatedParams p, int64_t items, const T* __restrict__ grad_output,
                                      const T* __restrict__ rois, A* __restrict__ grad_input) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    roi_align_rotated_backward_item<T, A>(p, i, grad_output, rois, grad_input);
}

template <typename T>
cudaError_t launch_roi_align_rotated_forward(const RoiAlignRotatedParams& p, const T* input, const T* rois, T* out,
                                             cudaStream_t stream) {
  const int64_t items = roi_align_rotated_items(p);
  if (items == 0) return cudaSuccess;
  roi_align_rotated_forward_kernel<T, typename acc<T>::type>
      <<<grid_for(items), kThreads, 0, stream>>>(p, items, input, rois, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_roi_align_rotated_backward(const RoiAlignRotatedParams& p, const T* grad_output, const T* rois,
                                              typename acc<T>::type* grad_input, cudaStream_t stream) {
  const int64_t items = roi_align_rotated_items(p);
  if (items == 0) return cudaSuccess;
  roi_align_rotated_backward_kernel<T, typename acc<T>::type>
      <<<grid_for(items), kThreads, 0, stream>>>(p, items, grad_output, rois, grad_input);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
