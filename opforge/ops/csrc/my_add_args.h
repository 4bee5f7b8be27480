// Argument checks and broadcasting plan of opforge::my_add, shared by its
// CPU and CUDA kernels (errors name op and argument).
#pragma once

#include <string>
#include <vector>

#include "core/my_add.h"
#include "opforge/torch_op.h"

namespace opforge {

struct MyAddPlan {
  Tensor out;             // allocated, contiguous, on a's device
  core::BinaryPlan plan;  // valid when out.numel() > 0
};

inline MyAddPlan my_add_prepare(const Tensor& a, const Tensor& b) {
  check(a.scalar_type() == b.scalar_type(), "opforge::my_add: a and b must have the same dtype, got a: ",
        dtype_name(a.scalar_type()), " and b: ", dtype_name(b.scalar_type()));
  check(is_supported_float(a.scalar_type()), "opforge::my_add: a has dtype ", dtype_name(a.scalar_type()),
        "; supported dtypes are float16, bfloat16, float32 and float64");
  check_same_device("opforge::my_add", {{"a", &a}, {"b", &b}});
  core::MyAddShapes<int64_t> shapes;
  shapes.a = shape_of(a);
  shapes.b = shape_of(b);
  std::vector<std::vector<int64_t>> out;
  check_rule(core::my_add_output_shapes(shapes, out));
  const std::vector<int64_t>& out_shape = out[0];

  MyAddPlan r;
  r.out = empty_tensor(out_shape, a.scalar_type(), a);
  if (r.out.numel() == 0) return r;
  const auto sa = broadcast_strides(a, out_shape);
  const auto sb = broadcast_strides(b, out_shape);
  r.plan = core::make_binary_plan(static_cast<int>(out_shape.size()), out_shape.data(), sa.data(), sb.data());
  return r;
}

}  // namespace opforge
