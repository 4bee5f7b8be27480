// CPU kernel of opforge::my_add: validates, broadcasts, then runs the shared
// core (core/my_add.h) on ATen's intra-op thread pool.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "core/my_add.h"
#include "torch_utils.h"

namespace opforge {

at::Tensor my_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "opforge::my_add: a and b must have the same dtype, got a: ",
                   a.scalar_type(), " and b: ", b.scalar_type());
  TORCH_CHECK_TYPE(is_supported_float(a.scalar_type()),
                   "opforge::my_add: a has dtype ", a.scalar_type(),
                   "; supported dtypes are float16, bfloat16, float32 and float64");
  TORCH_CHECK_VALUE(a.dim() <= core::kMaxDims && b.dim() <= core::kMaxDims, "opforge::my_add: at most ",
                    core::kMaxDims, " dimensions are supported, got a: ", a.dim(), " and b: ", b.dim());

  const int64_t n = std::max(a.dim(), b.dim());
  std::vector<int64_t> out_shape(n);
  const int bad = core::broadcast_shapes(a.sizes().data(), a.dim(), b.sizes().data(), b.dim(), out_shape.data());
  TORCH_CHECK_VALUE(bad < 0, "opforge::my_add: shapes of a ", shape_str(a.sizes()), " and b ", shape_str(b.sizes()),
                    " are not broadcastable (dimension ", bad - n, " differs)");

  at::Tensor out = at::empty(out_shape, a.options());
  if (out.numel() == 0) return out;

  const auto sa = broadcast_strides(a, out_shape);
  const auto sb = broadcast_strides(b, out_shape);
  const core::BinaryPlan plan = core::make_binary_plan(static_cast<int>(n), out_shape.data(), sa.data(), sb.data());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "opforge::my_add", [&] {
    const auto* pa = core_ptr<scalar_t>(a);
    const auto* pb = core_ptr<scalar_t>(b);
    auto* po = core_mutable_ptr<scalar_t>(out);
    at::parallel_for(0, plan.numel, core::kMyAddGrain,
                     [&](int64_t begin, int64_t end) { core::my_add_range(plan, pa, pb, po, begin, end); });
  });
  return out;
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("my_add", &my_add_cpu);
}

}  // namespace opforge
