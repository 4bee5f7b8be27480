// Argument checks and broadcasting plan of opforge::my_add, shared by its
// CPU and CUDA kernels (TypeError / ValueError naming op and argument).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

#include "core/broadcast.h"
#include "opforge/torch_op.h"

namespace opforge {

struct MyAddPlan {
  at::Tensor out;           // allocated, contiguous, on a's device
  core::BinaryPlan plan;    // valid when out.numel() > 0
};

inline MyAddPlan my_add_prepare(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "opforge::my_add: a and b must have the same dtype, got a: ",
                   a.scalar_type(), " and b: ", b.scalar_type());
  TORCH_CHECK_TYPE(is_supported_float(a.scalar_type()),
                   "opforge::my_add: a has dtype ", a.scalar_type(),
                   "; supported dtypes are float16, bfloat16, float32 and float64");
  check_same_device("opforge::my_add", {{"a", &a}, {"b", &b}});
  TORCH_CHECK_VALUE(a.dim() <= core::kMaxDims && b.dim() <= core::kMaxDims, "opforge::my_add: at most ",
                    core::kMaxDims, " dimensions are supported, got a: ", a.dim(), " and b: ", b.dim());

  const int64_t n = std::max(a.dim(), b.dim());
  std::vector<int64_t> out_shape(n);
  const int bad = core::broadcast_shapes(a.sizes().data(), a.dim(), b.sizes().data(), b.dim(), out_shape.data());
  TORCH_CHECK_VALUE(bad < 0, "opforge::my_add: shapes of a ", shape_str(a.sizes()), " and b ", shape_str(b.sizes()),
                    " are not broadcastable (dimension ", bad - n, " differs)");

  MyAddPlan r;
  r.out = at::empty(out_shape, a.options());
  if (r.out.numel() == 0) return r;
  const auto sa = broadcast_strides(a, out_shape);
  const auto sb = broadcast_strides(b, out_shape);
  r.plan = core::make_binary_plan(static_cast<int>(n), out_shape.data(), sa.data(), sb.data());
  return r;
}

}  // namespace opforge
