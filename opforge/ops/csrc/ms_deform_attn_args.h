// Argument checks of opforge::ms_deform_attn shared by its CPU and CUDA
// kernels: shapes in the core (core::ms_deform_attn_check, also used by the ORT
// kernels and, through _ms_deform_attn_output_shapes, the fake impl), then
// dtypes and devices, then the level geometry (core::ms_deform_attn_check_levels)
// on host copies of the index tensors. Raised as RuntimeError (TORCH_CHECK)
// with the core's message.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "core/ms_deform_attn.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::MsDeformAttnParams ms_deform_attn_check_args(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                                          const at::Tensor& level_start_index,
                                                          const at::Tensor& sampling_locations,
                                                          const at::Tensor& attention_weights, int64_t im2col_step,
                                                          const at::Tensor* grad_output = nullptr) {
  core::MsDeformAttnParams p;
  const std::string err = core::ms_deform_attn_check(
      value.sizes().data(), static_cast<int>(value.dim()), spatial_shapes.sizes().data(),
      static_cast<int>(spatial_shapes.dim()), level_start_index.sizes().data(),
      static_cast<int>(level_start_index.dim()), sampling_locations.sizes().data(),
      static_cast<int>(sampling_locations.dim()), attention_weights.sizes().data(),
      static_cast<int>(attention_weights.dim()), im2col_step, p);
  TORCH_CHECK(err.empty(), err);
  if (grad_output != nullptr) {
    int64_t want[3];
    core::ms_deform_attn_output_dims(p, want);
    check_grad_output_shape("opforge::ms_deform_attn", *grad_output, at::IntArrayRef(want, 3));
  }
  const at::ScalarType t = value.scalar_type();
  TORCH_CHECK(is_supported_float(t), "opforge::ms_deform_attn: value has dtype ", t,
              "; supported dtypes are float32, float64, float16 and bfloat16");
  const std::pair<const char*, const at::Tensor*> floats[] = {{"sampling_locations", &sampling_locations},
                                                              {"attention_weights", &attention_weights},
                                                              {"grad_output", grad_output}};
  for (const auto& [name, tensor] : floats)
    TORCH_CHECK(tensor == nullptr || tensor->scalar_type() == t, "opforge::ms_deform_attn: ", name, " has dtype ",
                tensor->scalar_type(), " but value has dtype ", t,
                grad_output ? "; value, sampling_locations, attention_weights and grad_output must share one dtype"
                            : "; value, sampling_locations and attention_weights must share one dtype");
  const std::pair<const char*, const at::Tensor*> indices[] = {{"spatial_shapes", &spatial_shapes},
                                                               {"level_start_index", &level_start_index}};
  for (const auto& [name, tensor] : indices)
    TORCH_CHECK(tensor->scalar_type() == at::kLong, "opforge::ms_deform_attn: ", name, " has dtype ",
                tensor->scalar_type(), " but must be int64 (torch.long)");
  const at::Tensor none;
  check_same_device("opforge::ms_deform_attn", {{"value", &value},
                                                {"spatial_shapes", &spatial_shapes},
                                                {"level_start_index", &level_start_index},
                                                {"sampling_locations", &sampling_locations},
                                                {"attention_weights", &attention_weights},
                                                {"grad_output", grad_output ? grad_output : &none}});
  return p;
}

// The level geometry check on host tensors (int64, any layout): the kernels
// index value with these numbers, so this runs before any of them does.
inline void ms_deform_attn_check_levels(const core::MsDeformAttnParams& p, const at::Tensor& spatial_shapes_host,
                                        const at::Tensor& level_start_index_host) {
  const at::Tensor shapes = spatial_shapes_host.contiguous(), starts = level_start_index_host.contiguous();
  const std::string err =
      core::ms_deform_attn_check_levels(p, shapes.const_data_ptr<int64_t>(), starts.const_data_ptr<int64_t>());
  TORCH_CHECK(err.empty(), err);
}

}  // namespace opforge
