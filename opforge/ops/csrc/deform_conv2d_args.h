// Argument checks of opforge::deform_conv2d shared by its CPU and CUDA
// kernels: shapes and hyper-parameters in the core
// (core::deform_conv2d_check, also used by the ORT kernels), then dtypes, naming the op and
// the argument. Raised as RuntimeError (TORCH_CHECK), like torchvision's
// kernels, since this op is a drop-in for torchvision::deform_conv2d; the
// Python entry points re-raise them as opforge.OpInputError, which is also a
// ValueError and a TypeError.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "core/deform_conv2d.h"

namespace opforge {

inline core::DeformConv2dParams deform_conv2d_check_args(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
                              const at::Tensor& mask, const at::Tensor& bias, int64_t stride_h, int64_t stride_w,
                              int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups,
                              int64_t offset_groups, bool use_mask) {
  // Shapes and hyper-parameters first, then dtypes: torchvision's order (its test suite
  // feeds a float64 input to a float32 layer with a wrong-sized mask and expects the shape
  // error).
  core::DeformConv2dParams p;
  const std::string err = core::deform_conv2d_check(
      input.sizes().data(), static_cast<int>(input.dim()), weight.sizes().data(), static_cast<int>(weight.dim()),
      offset.sizes().data(), static_cast<int>(offset.dim()), use_mask ? mask.sizes().data() : nullptr,
      static_cast<int>(mask.dim()), bias.sizes().data(), static_cast<int>(bias.dim()), stride_h, stride_w, pad_h,
      pad_w, dil_h, dil_w, groups, offset_groups, use_mask, p);
  TORCH_CHECK(err.empty(), err);
  const at::ScalarType t = input.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
                   "opforge::deform_conv2d: input has dtype ", t,
                   "; supported dtypes are float32, float64, float16 and bfloat16");
  const std::pair<const char*, const at::Tensor*> others[] = {
      {"weight", &weight}, {"offset", &offset}, {"mask", &mask}, {"bias", &bias}};
  for (const auto& [name, tensor] : others) {
    if (std::string(name) == "mask" && !use_mask) continue;
    TORCH_CHECK(tensor->scalar_type() == t, "opforge::deform_conv2d: ", name, " has dtype ",
                     tensor->scalar_type(), " but input has dtype ", t, "; all must match");
  }
  return p;
}

inline bool is_16bit(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

}  // namespace opforge
