// Argument checks and broadcasting plan of opforge::my_add, shared by its
// CPU and CUDA kernels (TypeError / ValueError naming op and argument).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <string>
#include <vector>

#include "core/my_add.h"
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
  core::MyAddShapes<int64_t> shapes;
  shapes.a = core::shape_of(a.sizes().data(), static_cast<int>(a.dim()));
  shapes.b = core::shape_of(b.sizes().data(), static_cast<int>(b.dim()));
  std::vector<std::vector<int64_t>> out;
  const std::string err = core::my_add_output_shapes(shapes, out);
  TORCH_CHECK_VALUE(err.empty(), err);
  const std::vector<int64_t>& out_shape = out[0];
  const int64_t n = static_cast<int64_t>(out_shape.size());

  MyAddPlan r;
  r.out = at::empty(out_shape, a.options());
  if (r.out.numel() == 0) return r;
  const auto sa = broadcast_strides(a, out_shape);
  const auto sb = broadcast_strides(b, out_shape);
  r.plan = core::make_binary_plan(static_cast<int>(n), out_shape.data(), sa.data(), sb.data());
  return r;
}

}  // namespace opforge
