// Argument checks of opforge::ms_deform_attn shared by its CPU and CUDA
// kernels: shapes in the core (core::ms_deform_attn_check, also used by the ORT
// kernels and, through _ms_deform_attn_output_shapes, the fake impl), then
// dtypes and devices, then the level geometry (core::ms_deform_attn_check_levels)
// on host copies of the index tensors. Raised as RuntimeError
// (std::runtime_error) with the core's message.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/ms_deform_attn.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::MsDeformAttnParams ms_deform_attn_check_args(const Tensor& value, const Tensor& spatial_shapes,
                                                          const Tensor& level_start_index,
                                                          const Tensor& sampling_locations,
                                                          const Tensor& attention_weights, int64_t im2col_step,
                                                          const Tensor* grad_output = nullptr) {
  core::MsDeformAttnParams p;
  const std::vector<int64_t> v = sizes_of(value), s = sizes_of(spatial_shapes), l = sizes_of(level_start_index),
                             loc = sizes_of(sampling_locations), attn = sizes_of(attention_weights);
  check_rule(core::ms_deform_attn_check(v.data(), static_cast<int>(v.size()), s.data(), static_cast<int>(s.size()),
                                        l.data(), static_cast<int>(l.size()), loc.data(),
                                        static_cast<int>(loc.size()), attn.data(), static_cast<int>(attn.size()),
                                        im2col_step, p));
  if (grad_output != nullptr) {
    std::vector<int64_t> want(3);
    core::ms_deform_attn_output_dims(p, want.data());
    check_grad_output_shape("opforge::ms_deform_attn", *grad_output, want);
  }
  const ScalarType t = value.scalar_type();
  check(is_supported_float(t), "opforge::ms_deform_attn: value has dtype ", dtype_name(t),
        "; supported dtypes are float32, float64, float16 and bfloat16");
  const std::pair<const char*, const Tensor*> floats[] = {{"sampling_locations", &sampling_locations},
                                                          {"attention_weights", &attention_weights},
                                                          {"grad_output", grad_output}};
  for (const auto& [name, tensor] : floats) {
    if (tensor == nullptr) continue;
    const ScalarType tt = tensor->scalar_type();
    check(tt == t, "opforge::ms_deform_attn: ", name, " has dtype ", dtype_name(tt), " but value has dtype ",
          dtype_name(t),
          grad_output ? "; value, sampling_locations, attention_weights and grad_output must share one dtype"
                      : "; value, sampling_locations and attention_weights must share one dtype");
  }
  const std::pair<const char*, const Tensor*> indices[] = {{"spatial_shapes", &spatial_shapes},
                                                           {"level_start_index", &level_start_index}};
  for (const auto& [name, tensor] : indices) {
    const ScalarType tt = tensor->scalar_type();
    check(tt == ScalarType::Long, "opforge::ms_deform_attn: ", name, " has dtype ", dtype_name(tt),
          " but must be int64 (torch.long)");
  }
  check_same_device("opforge::ms_deform_attn", {{"value", &value},
                                                {"spatial_shapes", &spatial_shapes},
                                                {"level_start_index", &level_start_index},
                                                {"sampling_locations", &sampling_locations},
                                                {"attention_weights", &attention_weights},
                                                {"grad_output", grad_output}});
  return p;
}

// The level geometry check on host tensors (int64, any layout): the kernels
// index value with these numbers, so this runs before any of them does.
inline void ms_deform_attn_check_levels(const core::MsDeformAttnParams& p, const Tensor& spatial_shapes_host,
                                        const Tensor& level_start_index_host) {
  const Tensor shapes = prepared(spatial_shapes_host), starts = prepared(level_start_index_host);
  check_rule(core::ms_deform_attn_check_levels(p, data<int64_t>(shapes), data<int64_t>(starts)));
}

}  // namespace opforge
