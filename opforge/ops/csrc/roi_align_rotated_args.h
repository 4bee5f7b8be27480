// Argument checks of opforge::roi_align_rotated shared by its CPU and CUDA
// kernels: shapes and attributes in the core (core::roi_align_rotated_check,
// also used by the ORT kernels and, through _roi_align_rotated_output_shapes,
// the fake impl), then dtypes and devices, then the rois' values
// (core::roi_align_rotated_check_rois) on a host copy. Raised as RuntimeError
// (TORCH_CHECK) with the core's message.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "core/roi_align_rotated.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::RoiAlignRotatedParams roi_align_rotated_check_args(const at::Tensor& input_like,
                                                                at::IntArrayRef input_size, const at::Tensor& rois,
                                                                int64_t output_height, int64_t output_width,
                                                                double spatial_scale, int64_t sampling_ratio,
                                                                bool aligned, bool clockwise,
                                                                const at::Tensor* grad_output = nullptr) {
  core::RoiAlignRotatedParams p;
  // ONNX stores spatial_scale as float32: the kernels compute with that value.
  const std::string err = core::roi_align_rotated_check(
      input_size.data(), static_cast<int>(input_size.size()), rois.sizes().data(), static_cast<int>(rois.dim()),
      output_height, output_width, static_cast<float>(spatial_scale), sampling_ratio, aligned, clockwise, p);
  TORCH_CHECK(err.empty(), err);
  const char* what = grad_output ? "grad_output" : "input";
  const at::ScalarType t = input_like.scalar_type();
  TORCH_CHECK(is_supported_float(t), "opforge::roi_align_rotated: ", what, " has dtype ", t,
              "; supported dtypes are float32, float64, float16 and bfloat16");
  TORCH_CHECK(rois.scalar_type() == t, "opforge::roi_align_rotated: rois has dtype ", rois.scalar_type(), " but ",
              what, " has dtype ", t, "; they must match");
  if (grad_output != nullptr) {
    int64_t want[4];
    core::roi_align_rotated_output_dims(p, want);
    check_grad_output_shape("opforge::roi_align_rotated", *grad_output, at::IntArrayRef(want, 4));
  }
  check_same_device("opforge::roi_align_rotated", {{what, &input_like}, {"rois", &rois}});
  return p;
}

// The rois in the kernels' compute type (float32 for 16-bit, else their own),
// contiguous, on the host, after their values passed the core's check.
inline at::Tensor roi_align_rotated_checked_rois(const core::RoiAlignRotatedParams& p, const at::Tensor& rois) {
  const at::ScalarType t = rois.scalar_type();
  const at::Tensor host = rois.to(at::kCPU, t == at::kDouble ? at::kDouble : at::kFloat).contiguous();
  const std::string err = t == at::kDouble
                              ? core::roi_align_rotated_check_rois<double>(p, host.const_data_ptr<double>())
                              : core::roi_align_rotated_check_rois<float>(p, host.const_data_ptr<float>());
  TORCH_CHECK(err.empty(), err);
  return host;
}

}  // namespace opforge
