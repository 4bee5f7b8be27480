// CUDA launchers of ms_deform_attn: the shared work items
// (core/ms_deform_attn_gpu.h), one thread per output channel element
// (forward, grad_value) or per sampling point (its location and weight grads).
#pragma once

#include <cstdint>

#include "../ms_deform_attn_gpu.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

template <typename T>
cudaError_t launch_ms_deform_attn_forward(const MsDeformAttnParams& p, const T* value, const int64_t* spatial_shapes,
                                          const int64_t* level_start_index, const T* sampling_locations,
                                          const T* attention_weights, T* out, cudaStream_t stream) {
  return launch_items<ms_deform_attn_forward_item<T, typename acc<T>::type>>(
      ms_deform_attn_channel_items(p), stream, p, value, spatial_shapes, level_start_index, sampling_locations,
      attention_weights, out);
}

// grad_value (float32 for the 16-bit types) must start zeroed: its pass scatters into it.
template <typename T>
cudaError_t launch_ms_deform_attn_backward(const MsDeformAttnParams& p, const T* grad_output, const T* value,
                                           const int64_t* spatial_shapes, const int64_t* level_start_index,
                                           const T* sampling_locations, const T* attention_weights,
                                           typename acc<T>::type* grad_value, T* grad_sampling_locations,
                                           T* grad_attention_weights, cudaStream_t stream) {
  using A = typename acc<T>::type;
  if (cudaError_t err = launch_items<ms_deform_attn_grad_value_item<T, A>>(
          ms_deform_attn_channel_items(p), stream, p, grad_output, spatial_shapes, level_start_index,
          sampling_locations, attention_weights, grad_value);
      err != cudaSuccess)
    return err;
  return launch_items<ms_deform_attn_grad_point_item<T, A>>(
      ms_deform_attn_point_items(p), stream, p, grad_output, value, spatial_shapes, level_start_index,
      sampling_locations, attention_weights, grad_sampling_locations, grad_attention_weights);
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
