// CPU kernel of opforge::my_add: validates, broadcasts, then runs the shared
// core (core/my_add.h) on ATen's intra-op thread pool.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "core/my_add.h"
#include "my_add_args.h"
#include "opforge/torch_op.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {

at::Tensor my_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  MyAddPlan prep = my_add_prepare(a, b);
  if (prep.out.numel() == 0) return prep.out;
  const core::BinaryPlan& plan = prep.plan;
  at::Tensor& out = prep.out;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "opforge::my_add", [&] {
    const auto* pa = core_ptr<scalar_t>(a);
    const auto* pb = core_ptr<scalar_t>(b);
    auto* po = core_mutable_ptr<scalar_t>(out);
    at::parallel_for(0, plan.numel, core::kMyAddGrain,
                     [&](int64_t begin, int64_t end) { core::my_add_range(plan, pa, pb, po, begin, end); });
  });
  return out;
}

// The shape rule (core::my_add_output_shapes) as the tensor-free op
// opforge::_my_add_output_shapes, on SymInt sizes: the fake impl and ONNX shape
// inference call it through opforge.ShapeRule (my_add.py).
std::vector<c10::SymInt> my_add_output_shapes(c10::SymIntArrayRef a, c10::SymIntArrayRef b) {
  core::MyAddShapes<c10::SymInt> in;
  in.a = rule_shape(a);
  in.b = rule_shape(b);
  return run_shape_rule(in, core::my_add_output_shapes<c10::SymInt>);
}

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def("_my_add_output_shapes(SymInt[] a, SymInt[] b) -> SymInt[]", &my_add_output_shapes);
  m.def("my_add(Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("my_add", &my_add_cpu);
}

}  // namespace opforge
