// CUDA kernels of opforge::ms_deform_attn and its backward: the core's CUDA
// kernels (core/cuda/ms_deform_attn.cuh) on torch's current stream. The level
// geometry is copied to the host and checked first (a small synchronous copy:
// the kernels index value with it, so it must be known good before they run).
// 16-bit dtypes compute in float32; grad_value accumulates (atomics) in a
// float32 buffer for them and is rounded once.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <tuple>

#include "ms_deform_attn_args.h"
#include "opforge/torch_cuda.h"

namespace opforge {
namespace {

// Checks the index tensors' values on host copies (on the current stream,
// synchronously) and returns them contiguous on the device for the kernels.
std::tuple<at::Tensor, at::Tensor> checked_levels(const core::MsDeformAttnParams& p, const at::Tensor& spatial_shapes,
                                                  const at::Tensor& level_start_index) {
  ms_deform_attn_check_levels(p, spatial_shapes.to(at::kCPU), level_start_index.to(at::kCPU));
  return {spatial_shapes.contiguous(), level_start_index.contiguous()};
}

}  // namespace

at::Tensor ms_deform_attn_cuda(const at::Tensor& value, const at::Tensor& spatial_shapes,
                               const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                               const at::Tensor& attention_weights, int64_t im2col_step) {
  const core::MsDeformAttnParams p = ms_deform_attn_check_args(value, spatial_shapes, level_start_index,
                                                               sampling_locations, attention_weights, im2col_step);
  const c10::cuda::CUDAGuard guard(value.device());
  const auto [shapes, starts] = checked_levels(p, spatial_shapes, level_start_index);
  at::Tensor out = at::empty({p.batch, p.queries, p.heads * p.channels}, value.options());
  if (out.numel() == 0) return out;
  const at::Tensor v = value.contiguous(), loc = sampling_locations.contiguous(), attn = attention_weights.contiguous();
  check_launch(core::cuda::ms_deform_attn_forward(gpu_dtype(value.scalar_type()), p, v.const_data_ptr(),
                                                  shapes.const_data_ptr<int64_t>(), starts.const_data_ptr<int64_t>(),
                                                  loc.const_data_ptr(), attn.const_data_ptr(), out.mutable_data_ptr(),
                                                  current_stream(value)),
               "opforge::ms_deform_attn");
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
    int64_t im2col_step) {
  const core::MsDeformAttnParams p = ms_deform_attn_check_args(
      value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step, &grad_output);
  const c10::cuda::CUDAGuard guard(value.device());
  const auto [shapes, starts] = checked_levels(p, spatial_shapes, level_start_index);
  const at::ScalarType t = value.scalar_type();
  const bool narrow = t == at::kHalf || t == at::kBFloat16;
  at::Tensor grad_value = at::zeros(value.sizes(), value.options().dtype(narrow ? at::kFloat : t));
  at::Tensor grad_loc = at::empty(sampling_locations.sizes(), value.options());
  at::Tensor grad_attn = at::empty(attention_weights.sizes(), value.options());
  if (grad_loc.numel() > 0) {
    const at::Tensor g = grad_output.contiguous(), v = value.contiguous(), loc = sampling_locations.contiguous(),
                     attn = attention_weights.contiguous();
    check_launch(core::cuda::ms_deform_attn_backward(gpu_dtype(t), p, g.const_data_ptr(), v.const_data_ptr(),
                                                     shapes.const_data_ptr<int64_t>(),
                                                     starts.const_data_ptr<int64_t>(), loc.const_data_ptr(),
                                                     attn.const_data_ptr(), grad_value.mutable_data_ptr(),
                                                     grad_loc.mutable_data_ptr(), grad_attn.mutable_data_ptr(),
                                                     current_stream(value)),
                 "opforge::ms_deform_attn backward");
  }
  return {grad_value.to(t), grad_loc, grad_attn};
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("ms_deform_attn", &ms_deform_attn_cuda);
  m.impl("_ms_deform_attn_backward", &ms_deform_attn_backward_cuda);
}

}  // namespace opforge
