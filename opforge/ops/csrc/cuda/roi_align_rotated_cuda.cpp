// CUDA kernels of opforge::roi_align_rotated and its backward: the core's
// CUDA kernels (core/cuda/roi_align_rotated.cuh) on torch's current stream.
// The rois are copied to the host and checked first (a small synchronous
// copy: the kernels index the input with their batch indices and size their
// loops by them, so they must be known good before they run). 16-bit dtypes
// compute in float32; grad_input accumulates (atomics) in a float32 buffer for
// them and is rounded once.
#include <vector>

// First: it declares the CUDA shims (USE_CUDA) before any torch header includes shim.h.
#include "opforge/torch_cuda.h"

#include "roi_align_rotated_args.h"

namespace opforge {

Tensor roi_align_rotated_cuda(const Tensor& input, const Tensor& rois, int64_t output_height, int64_t output_width,
                              double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise) {
  const core::RoiAlignRotatedParams p = roi_align_rotated_check_args(
      input, sizes_of(input), rois, output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise);
  const CudaDeviceGuard guard(input);
  roi_align_rotated_checked_rois(p, rois);
  Tensor out = empty_tensor({p.rois, p.channels, p.pooled_h, p.pooled_w}, input.scalar_type(), input);
  if (out.numel() == 0) return out;
  const Tensor x = prepared(input), r = prepared(rois);
  check_launch(core::cuda::roi_align_rotated_forward(gpu_dtype(input.scalar_type()), p, x.const_data_ptr(),
                                                     r.const_data_ptr(), out.mutable_data_ptr(),
                                                     current_stream(input)),
               "opforge::roi_align_rotated");
  return out;
}

Tensor roi_align_rotated_backward_cuda(const Tensor& grad_output, const Tensor& rois, std::vector<int64_t> input_size,
                                       int64_t output_height, int64_t output_width, double spatial_scale,
                                       int64_t sampling_ratio, bool aligned, bool clockwise) {
  const core::RoiAlignRotatedParams p =
      roi_align_rotated_check_args(grad_output, input_size, rois, output_height, output_width, spatial_scale,
                                   sampling_ratio, aligned, clockwise, &grad_output);
  const CudaDeviceGuard guard(grad_output);
  roi_align_rotated_checked_rois(p, rois);
  const ScalarType t = grad_output.scalar_type();
  Tensor grad_input = zeros_tensor(input_size, compute_type(t), grad_output);
  if (grad_output.numel() > 0) {
    const Tensor g = prepared(grad_output), r = prepared(rois);
    check_launch(core::cuda::roi_align_rotated_backward(gpu_dtype(t), p, g.const_data_ptr(), r.const_data_ptr(),
                                                        grad_input.mutable_data_ptr(), current_stream(grad_output)),
                 "opforge::roi_align_rotated backward");
  }
  return to_dtype(grad_input, t);
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("roi_align_rotated", TORCH_BOX(&roi_align_rotated_cuda));
  m.impl("_roi_align_rotated_backward", TORCH_BOX(&roi_align_rotated_backward_cuda));
}

}  // namespace opforge
