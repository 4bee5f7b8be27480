// CUDA kernels of opforge::ms_deform_attn and its backward: the core's CUDA
// kernels (core/cuda/ms_deform_attn.cuh) on torch's current stream. The level
// geometry is copied to the host and checked first (a small synchronous copy:
// the kernels index value with it, so it must be known good before they run).
// 16-bit dtypes compute in float32; grad_value accumulates (atomics) in a
// float32 buffer for them and is rounded once.
#include <tuple>

// First: it declares the CUDA shims (USE_CUDA) before any torch header includes shim.h.
#include "opforge/torch_cuda.h"

#include "ms_deform_attn_args.h"

namespace opforge {
namespace {

// Checks the index tensors' values on host copies (on the current stream,
// synchronously) and returns them contiguous on the device for the kernels.
std::tuple<Tensor, Tensor> checked_levels(const core::MsDeformAttnParams& p, const Tensor& spatial_shapes,
                                          const Tensor& level_start_index) {
  ms_deform_attn_check_levels(p, to_cpu(spatial_shapes), to_cpu(level_start_index));
  return {prepared(spatial_shapes), prepared(level_start_index)};
}

}  // namespace

Tensor ms_deform_attn_cuda(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                           const Tensor& sampling_locations, const Tensor& attention_weights, int64_t im2col_step) {
  const core::MsDeformAttnParams p = ms_deform_attn_check_args(value, spatial_shapes, level_start_index,
                                                               sampling_locations, attention_weights, im2col_step);
  const CudaDeviceGuard guard(value);
  const auto [shapes, starts] = checked_levels(p, spatial_shapes, level_start_index);
  Tensor out = empty_tensor({p.batch, p.queries, p.heads * p.channels}, value.scalar_type(), value);
  if (out.numel() == 0) return out;
  const Tensor v = prepared(value), loc = prepared(sampling_locations), attn = prepared(attention_weights);
  check_launch(core::cuda::ms_deform_attn_forward(gpu_dtype(value.scalar_type()), p, v.const_data_ptr(),
                                                  data<int64_t>(shapes), data<int64_t>(starts), loc.const_data_ptr(),
                                                  attn.const_data_ptr(), out.mutable_data_ptr(),
                                                  current_stream(value)),
               "opforge::ms_deform_attn");
  return out;
}

std::tuple<Tensor, Tensor, Tensor> ms_deform_attn_backward_cuda(const Tensor& grad_output, const Tensor& value,
                                                                const Tensor& spatial_shapes,
                                                                const Tensor& level_start_index,
                                                                const Tensor& sampling_locations,
                                                                const Tensor& attention_weights, int64_t im2col_step) {
  const core::MsDeformAttnParams p = ms_deform_attn_check_args(
      value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step, &grad_output);
  const CudaDeviceGuard guard(value);
  const auto [shapes, starts] = checked_levels(p, spatial_shapes, level_start_index);
  const ScalarType t = value.scalar_type();
  Tensor grad_value = zeros_as(value, compute_type(t));
  Tensor grad_loc = empty_as(sampling_locations, t);
  Tensor grad_attn = empty_as(attention_weights, t);
  if (grad_loc.numel() > 0) {
    const Tensor g = prepared(grad_output), v = prepared(value), loc = prepared(sampling_locations),
                 attn = prepared(attention_weights);
    check_launch(core::cuda::ms_deform_attn_backward(gpu_dtype(t), p, g.const_data_ptr(), v.const_data_ptr(),
                                                     data<int64_t>(shapes), data<int64_t>(starts),
                                                     loc.const_data_ptr(), attn.const_data_ptr(),
                                                     grad_value.mutable_data_ptr(), grad_loc.mutable_data_ptr(),
                                                     grad_attn.mutable_data_ptr(), current_stream(value)),
                 "opforge::ms_deform_attn backward");
  }
  return {to_dtype(grad_value, t), grad_loc, grad_attn};
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("ms_deform_attn", TORCH_BOX(&ms_deform_attn_cuda));
  m.impl("_ms_deform_attn_backward", TORCH_BOX(&ms_deform_attn_backward_cuda));
}

}  // namespace opforge
