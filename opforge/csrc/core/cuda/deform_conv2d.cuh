// CUDA kernels of deform_conv2d: thin grid-stride wrappers around the shared
// work-item bodies (core/deform_conv2d_gpu.h). The GEMMs are the caller's:
// ATen (cuBLAS) in the torch extension, cuBLAS directly in the ORT library.
#pragma once

#include <cstdint>

#include "../deform_conv2d_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    deform_im2col_kernel(const DeformConv2dParams p, int64_t items, const T* __restrict__ input,
                         const T* __restrict__ offset, const T* __restrict__ mask, int64_t first_image,
                         T* __restrict__ col) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    deform_im2col_item<T, A>(p, i, input, offset, mask, first_image, col);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    deform_backward_kernel(const DeformConv2dParams p, int64_t items, const T* __restrict__ input,
                           const T* __restrict__ offset, const T* __restrict__ mask, int64_t first_image,
                           const T* __restrict__ grad_col, A* __restrict__ grad_input, T* __restrict__ grad_offset,
                           T* __restrict__ grad_mask) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    deform_backward_item<T, A>(p, i, input, offset, mask, first_image, grad_col, grad_input, grad_offset, grad_mask);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fill_bias_kernel(int64_t items, int64_t out_channels, int64_t pixels, const T* __restrict__ bias,
                     T* __restrict__ out) {
  for (int64_t i = global_thread(); i < items; i += grid_threads()) fill_bias_item(i, out_channels, pixels, bias, out);
}

template <typename T>
cudaError_t launch_deform_im2col(const DeformConv2dParams& p, const T* input, const T* offset, const T* mask,
                                 int64_t first_image, int64_t images, T* col, cudaStream_t stream) {
  const int64_t items = deform_gpu_items(p, images);
  if (items == 0) return cudaSuccess;
  deform_im2col_kernel<T, typename acc<T>::type>
      <<<grid_for(items), kThreads, 0, stream>>>(p, items, input, offset, mask, first_image, col);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_deform_backward(const DeformConv2dParams& p, const T* input, const T* offset, const T* mask,
                                   int64_t first_image, int64_t images, const T* grad_col,
                                   typename acc<T>::type* grad_input, T* grad_offset, T* grad_mask,
                                   cudaStream_t stream) {
  const int64_t items = deform_gpu_items(p, images);
  if (items == 0) return cudaSuccess;
  deform_backward_kernel<T, typename acc<T>::type><<<grid_for(items), kThreads, 0, stream>>>(
      p, items, input, offset, mask, first_image, grad_col, grad_input, grad_offset, grad_mask);
  return cudaGetLastError();
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
