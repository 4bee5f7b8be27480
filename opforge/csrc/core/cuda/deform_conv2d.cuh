// CUDA launchers of deform_conv2d: the shared work items (core/deform_conv2d_gpu.h),
// one thread per (image, offset group, tap, output pixel). The GEMMs are the
// caller's: ATen (cuBLAS) in the torch extension, cuBLAS directly in the ORT library.
#pragma once

#include <cstdint>

#include "../deform_conv2d_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fill_bias_kernel(int64_t items, int64_t out_channels, int64_t pixels, const T* __restrict__ bias,
                     T* __restrict__ out) {
  for (int64_t i = global_thread(); i < items; i += grid_threads()) fill_bias_item(i, out_channels, pixels, bias, out);
}

template <typename T>
cudaError_t launch_deform_im2col(const DeformConv2dParams& p, const T* input, const T* offset, const T* mask,
                                 int64_t first_image, int64_t images, T* col, cudaStream_t stream) {
  return launch_items<deform_im2col_item<T, typename acc<T>::type>>(deform_gpu_items(p, images), stream, p, input,
                                                                     offset, mask, first_image, col);
}

template <typename T>
cudaError_t launch_deform_backward(const DeformConv2dParams& p, const T* input, const T* offset, const T* mask,
                                   int64_t first_image, int64_t images, const T* grad_col,
                                   typename acc<T>::type* grad_input, T* grad_offset, T* grad_mask,
                                   cudaStream_t stream) {
  return launch_items<deform_backward_item<T, typename acc<T>::type>>(deform_gpu_items(p, images), stream, p, input,
                                                                       offset, mask, first_image, grad_col,
                                                                       grad_input, grad_offset, grad_mask);
}

template <typename T>
cudaError_t launch_fill_bias(int64_t batch, int64_t out_channels, int64_t pixels, const T* bias, T* out,
                             cudaStream_t stream) {
  const int64_t items = batch * out_channels * pixels;
  if (items == 0) return cudaSuccess;
  fill_bias_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(items, out_channels, pixels, bias, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
