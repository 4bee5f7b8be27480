// Argument checks of opforge::roi_align_rotated shared by its CPU and CUDA
// kernels: shapes and attributes in the core (core::roi_align_rotated_check,
// also used by the ORT kernels and, through _roi_align_rotated_output_shapes,
// the fake impl), then dtypes and devices, then the rois' values
// (core::roi_align_rotated_check_rois) on a host copy, with the budgets in force
// (opforge.set_budget), before anything is allocated. Raised as RuntimeError
// (std::runtime_error) with the core's message.
#pragma once

#include <string>
#include <vector>

#include "core/roi_align_rotated.h"
#include "opforge/torch_budget.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::RoiAlignRotatedParams roi_align_rotated_check_args(const Tensor& input_like,
                                                                const std::vector<int64_t>& input_size,
                                                                const Tensor& rois, int64_t output_height,
                                                                int64_t output_width, double spatial_scale,
                                                                int64_t sampling_ratio, bool aligned, bool clockwise,
                                                                const Tensor* grad_output = nullptr) {
  core::RoiAlignRotatedParams p;
  const std::vector<int64_t> rois_size = sizes_of(rois);
  // ONNX stores spatial_scale as float32: the kernels compute with that value.
  check_rule(core::roi_align_rotated_check(input_size.data(), static_cast<int>(input_size.size()), rois_size.data(),
                                           static_cast<int>(rois_size.size()), output_height, output_width,
                                           static_cast<float>(spatial_scale), sampling_ratio, aligned, clockwise, p));
  const char* what = grad_output ? "grad_output" : "input";
  const ScalarType t = input_like.scalar_type();
  check(is_supported_float(t), "opforge::roi_align_rotated: ", what, " has dtype ", dtype_name(t),
        "; supported dtypes are float32, float64, float16 and bfloat16");
  const ScalarType rt = rois.scalar_type();
  check(rt == t, "opforge::roi_align_rotated: rois has dtype ", dtype_name(rt), " but ", what, " has dtype ",
        dtype_name(t), "; they must match");
  if (grad_output != nullptr) {
    std::vector<int64_t> want(4);
    core::roi_align_rotated_output_dims(p, want.data());
    check_grad_output_shape("opforge::roi_align_rotated", *grad_output, want);
  }
  check_same_device("opforge::roi_align_rotated", {{what, &input_like}, {"rois", &rois}});
  return p;
}

// The budgets in force (process-wide, opforge/torch_budget.h; declared in roi_align_rotated.cpp).
inline core::RoiAlignRotatedBudget roi_align_rotated_budget() {
  core::RoiAlignRotatedBudget b;
  b.max_output_elements = budget_value(core::kRoiAlignRotatedMaxOutputElementsKey, b.max_output_elements);
  b.max_samples = budget_value(core::kRoiAlignRotatedMaxSamplesKey, b.max_samples);
  return b;
}

// The rois in the kernels' compute type (float32 for 16-bit, else their own),
// contiguous, on the host, after their values and the call's budgets passed the
// core's check; *samples (when given) gets the call's bilinear samples.
inline Tensor roi_align_rotated_checked_rois(const core::RoiAlignRotatedParams& p, const Tensor& rois,
                                             int64_t* samples = nullptr) {
  const ScalarType t = rois.scalar_type();
  const Tensor host = prepared(to_cpu(rois), compute_type(t));
  const core::RoiAlignRotatedBudget budget = roi_align_rotated_budget();
  check_rule(t == ScalarType::Double
                 ? core::roi_align_rotated_check_rois<double>(p, data<double>(host), budget, samples)
                 : core::roi_align_rotated_check_rois<float>(p, data<float>(host), budget, samples));
  return host;
}

}  // namespace opforge
