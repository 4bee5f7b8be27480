// Argument checks of opforge::deform_conv2d shared by its CPU and CUDA
// kernels: shapes and hyper-parameters in the core
// (core::deform_conv2d_check, also used by the ORT kernels), then dtypes, naming the op and
// the argument. Raised as RuntimeError (std::runtime_error through the stable ABI), like
// torchvision's kernels, since this op is a drop-in for torchvision::deform_conv2d; the
// Python entry points re-raise them as opforge.OpInputError, which is also a
// ValueError and a TypeError.
//
// Also the two accumulating GEMMs the kernels use (out += A @ B, 2-D and batched): ATen's
// addmm_ / baddbmm_ take Scalar arguments (beta, alpha), which cannot cross
// torch_call_dispatcher (call_aten fails at run time: "Not yet supported conversion from
// StableIValue to IValue for schema type: Scalar"), so they go through the AOTInductor C
// shims addmm.out / baddbmm.out with out = self (MKL/BLAS, cuBLAS), as torchvision's own
// stable-ABI kernels do.
#pragma once

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#ifdef OPFORGE_WITH_CUDA
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#endif

#include <string>
#include <utility>

#include "core/deform_conv2d.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::DeformConv2dParams deform_conv2d_check_args(const Tensor& input, const Tensor& weight, const Tensor& offset,
                                                         const Tensor& mask, const Tensor& bias, int64_t stride_h,
                                                         int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dil_h,
                                                         int64_t dil_w, int64_t groups, int64_t offset_groups,
                                                         bool use_mask) {
  // Shapes and hyper-parameters first, then dtypes: torchvision's order (its test suite
  // feeds a float64 input to a float32 layer with a wrong-sized mask and expects the shape
  // error).
  core::DeformConv2dParams p;
  const IntList input_sizes = input.sizes(), weight_sizes = weight.sizes(), offset_sizes = offset.sizes();
  const IntList mask_sizes = mask.sizes(), bias_sizes = bias.sizes();
  const std::string err = core::deform_conv2d_check(
      input_sizes.data(), static_cast<int>(input_sizes.size()), weight_sizes.data(),
      static_cast<int>(weight_sizes.size()), offset_sizes.data(), static_cast<int>(offset_sizes.size()),
      use_mask ? mask_sizes.data() : nullptr, static_cast<int>(mask_sizes.size()), bias_sizes.data(),
      static_cast<int>(bias_sizes.size()), stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups,
      use_mask, p);
  check_rule(err);
  const ScalarType t = input.scalar_type();
  check(is_supported_float(t), "opforge::deform_conv2d: input has dtype ", dtype_name(t),
        "; supported dtypes are float32, float64, float16 and bfloat16");
  const std::pair<const char*, const Tensor*> others[] = {
      {"weight", &weight}, {"offset", &offset}, {"mask", &mask}, {"bias", &bias}};
  for (const auto& [name, tensor] : others) {
    if (std::string(name) == "mask" && !use_mask) continue;
    check(tensor->scalar_type() == t, "opforge::deform_conv2d: ", name, " has dtype ",
          dtype_name(tensor->scalar_type()), " but input has dtype ", dtype_name(t), "; all must match");
  }
  return p;
}

// The grad of the backward ops: the forward output's shape [N, O, oh, ow].
inline void deform_conv2d_check_grad(const core::DeformConv2dParams& p, const Tensor& grad) {
  check(grad.dim() == 4 && grad.size(0) == p.batch && grad.size(1) == p.out_channels && grad.size(2) == p.out_h &&
            grad.size(3) == p.out_w,
        "opforge::deform_conv2d backward: grad has shape ", shape_str(grad.sizes()), ", expected [", p.batch, ", ",
        p.out_channels, ", ", p.out_h, ", ", p.out_w, "]");
}

// self += mat1 @ mat2 (aten::addmm_ with beta = alpha = 1), 2-D, CPU tensors.
inline void addmm_inplace(const Tensor& self, const Tensor& mat1, const Tensor& mat2) {
  check(self.is_cpu(), "opforge::deform_conv2d: addmm_inplace on a tensor on ", device_str(self));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_addmm_out(self.get(), self.get(), mat1.get(), mat2.get(), 1.0, 1.0));
}

// self += batch1 @ batch2 (aten::baddbmm_ with beta = alpha = 1), 3-D; CPU tensors, and CUDA
// ones in a library's CUDA part (OPFORGE_WITH_CUDA).
inline void baddbmm_inplace(const Tensor& self, const Tensor& batch1, const Tensor& batch2) {
#ifdef OPFORGE_WITH_CUDA
  if (self.is_cuda()) {
    STABLE_TORCH_ERROR_CODE_CHECK(
        aoti_torch_cuda_baddbmm_out(self.get(), self.get(), batch1.get(), batch2.get(), 1.0, 1.0));
    return;
  }
#endif
  check(self.is_cpu(), "opforge::deform_conv2d: baddbmm_inplace on a tensor on ", device_str(self));
  STABLE_TORCH_ERROR_CODE_CHECK(
      aoti_torch_cpu_baddbmm_out(self.get(), self.get(), batch1.get(), batch2.get(), 1.0, 1.0));
}

}  // namespace opforge
