// CUDA kernels of ms_deform_attn: grid-stride wrappers around the shared
// work-item bodies (core/ms_deform_attn_gpu.h).
#pragma once

#include <cstdint>

#include "../ms_deform_attn_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    ms_deform_attn_forward_kernel(const MsDeformAttnParams p, int64_t items, const T* __restrict__ value,
                                  const int64_t* __restrict__ spatial_shapes,
                                  const int64_t* __restrict__ level_start_index,
                                  const T* __restrict__ sampling_locations, const T* __restrict__ attention_weights,
                                  T* __restrict__ out) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    ms_deform_attn_forward_item<T, A>(p, i, value, spatial_shapes, level_start_index, sampling_locations,
                                      attention_weights, out);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    ms_deform_attn_grad_value_kernel(const MsDeformAttnParams p, int64_t items, const T* __restrict__ grad_output,
                                     const int64_t* __restrict__ spatial_shapes,
                                     const int64_t* __restrict__ level_start_index,
                                     const T* __restrict__ sampling_locations,
                                     const T* __restrict__ attention_weights, A* __restrict__ grad_value) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    ms_deform_attn_grad_value_item<T, A>(p, i, grad_output, spatial_shapes, level_start_index, sampling_locations,
                                         attention_weights, grad_value);
}

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    ms_deform_attn_grad_point_kernel(const MsDeformAttnParams p, int64_t items, const T* __restrict__ grad_output,
                                     const T* __restrict__ value, const int64_t* __restrict__ spatial_shapes,
                                     const int64_t* __restrict__ level_start_index,
                                     const T* __restrict__ sampling_locations,
                                     const T* __restrict__ attention_weights,
                                     T* __restrict__ grad_sampling_locations,
                                     T* __restrict__ grad_attention_weights) {
  for (int64_t i = global_thread(); i < items; i += grid_threads())
    ms_deform_attn_grad_point_item<T, A>(p, i, grad_output, value, spatial_shapes, level_start_index,
                                         sampling_locations, attention_weights, grad_sampling_locations,
                                         grad_attention_weights);
}

template <typename T>
cudaError_t launch_ms_deform_attn_forward(const MsDeformAttnParams& p, const T* value, const int64_t* spatial_shapes,
                                          const int64_t* level_start_index, const T* sampling_locations,
                                          const T* attention_weights, T* out, cudaStream_t stream) {
  const int64_t items = ms_deform_attn_channel_items(p);
  if (items == 0) return cudaSuccess;
  ms_deform_attn_forward_kernel<T, typename acc<T>::type><<<grid_for(items), kThreads, 0, stream>>>(
      p, items, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_ms_deform_attn_backward(const MsDeformAttnParams& p, const T* grad_output, const T* value,
                                           const int64_t* spatial_shapes, const int64_t* level_start_index,
                                           const T* sampling_locations, const T* attention_weights,
                                           typename acc<T>::type* grad_value, T* grad_sampling_locations,
                                           T* grad_attention_weights, cudaStream_t stream) {
  using A = typename acc<T>::type;
  if (const int64_t items = ms_deform_attn_channel_items(p); items > 0) {
    ms_deform_attn_grad_value_kernel<T, A><<<grid_for(items), kThreads, 0, stream>>>(
        p, items, grad_output, spatial_shapes, level_start_index, sampling_locations, attention_weights, grad_value);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  if (const int64_t items = ms_deform_attn_point_items(p); items > 0) {
    ms_deform_attn_grad_point_kernel<T, A><<<grid_for(items), kThreads, 0, stream>>>(
        p, items, grad_output, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        grad_sampling_locations, grad_attention_weights);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
