// CUDA kernels of opforge::roi_align_rotated and its backward: the core's
// CUDA kernels (core/cuda/roi_align_rotated.cuh) on torch's current stream.
// The rois are copied to the host and checked first (a small synchronous
// copy: the kernels index the input with their batch indices and size their
// loops by them, so they must be known good before they run). 16-bit dtypes
// compute in float32; grad_input accumulates (atomics) in a float32 buffer for
// them and is rounded once.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "opforge/torch_cuda.h"
#include "roi_align_rotated_args.h"

namespace opforge {

at::Tensor roi_align_rotated_cuda(const at::Tensor& input, const at::Tensor& rois, int64_t output_height,
                                  int64_t output_width, double spatial_scale, int64_t sampling_ratio, bool aligned,
                                  bool clockwise) {
  const core::RoiAlignRotatedParams p = roi_align_rotated_check_args(
      input, input.sizes(), rois, output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise);
  const c10::cuda::CUDAGuard guard(input.device());
  roi_align_rotated_checked_rois(p, rois);
  at::Tensor out = at::empty({p.rois, p.channels, p.pooled_h, p.pooled_w}, input.options());
  if (out.numel() == 0) return out;
  const at::Tensor x = input.contiguous(), r = rois.contiguous();
  check_launch(core::cuda::roi_align_rotated_forward(gpu_dtype(input.scalar_type()), p, x.const_data_ptr(),
                                                     r.const_data_ptr(), out.mutable_data_ptr(),
                                                     current_stream(input)),
               "opforge::roi_align_rotated");
  return out;
}

at::Tensor roi_align_rotated_backward_cuda(const at::Tensor& grad_output, const at::Tensor& rois,
                                           at::IntArrayRef input_size, int64_t output_height, int64_t output_width,
                                           double spatial_scale, int64_t sampling_ratio, bool aligned,
                                           bool clockwise) {
  const core::RoiAlignRotatedParams p =
      roi_align_rotated_check_args(grad_output, input_size, rois, output_height, output_width, spatial_scale,
                                   sampling_ratio, aligned, clockwise, &grad_output);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  roi_align_rotated_checked_rois(p, rois);
  const at::ScalarType t = grad_output.scalar_type();
  const bool narrow = t == at::kHalf || t == at::kBFloat16;
  at::Tensor grad_input = at::zeros(input_size, grad_output.options().dtype(narrow ? at::kFloat : t));
  if (grad_output.numel() > 0) {
    const at::Tensor g = grad_output.contiguous(), r = rois.contiguous();
    check_launch(core::cuda::roi_align_rotated_backward(gpu_dtype(t), p, g.const_data_ptr(), r.const_data_ptr(),
                                                        grad_input.mutable_data_ptr(), current_stream(grad_output)),
                 "opforge::roi_align_rotated backward");
  }
  return grad_input.to(t);
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("roi_align_rotated", &roi_align_rotated_cuda);
  m.impl("_roi_align_rotated_backward", &roi_align_rotated_backward_cuda);
}

}  // namespace opforge
