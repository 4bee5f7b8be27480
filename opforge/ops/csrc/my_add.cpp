// CPU kernel of opforge::my_add: validates, broadcasts, then runs the shared
// core (core/my_add.h) on torch's intra-op thread pool.
#include "core/my_add.h"
#include "my_add_args.h"
#include "opforge/torch_c_shim.h"
#include "opforge/torch_op.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {

Tensor my_add_cpu(const Tensor& a, const Tensor& b) {
  MyAddPlan prep = my_add_prepare(a, b);
  if (prep.out.numel() == 0) return prep.out;
  const core::BinaryPlan& plan = prep.plan;
  dispatch_float(a.scalar_type(), "opforge::my_add", [&]<typename T>() {
    const T* pa = data<T>(a);
    const T* pb = data<T>(b);
    T* po = mutable_data<T>(prep.out);
    parallel_for(0, plan.numel, core::kMyAddGrain,
                 [&](int64_t begin, int64_t end) { core::my_add_range(plan, pa, pb, po, begin, end); });
  });
  return prep.out;
}

namespace {

// The shape rule (core::my_add_output_shapes), which the fake impl and ONNX shape inference run
// through opforge.ShapeRule (my_add.py).
std::string my_add_rule(const RuleArgs& args, RuleShapes& out) {
  core::MyAddShapes<RuleDim> in;
  in.a = args.shape(0);
  in.b = args.shape(1);
  return core::my_add_output_shapes(in, out);
}

}  // namespace

OPFORGE_SHAPE_RULE(opforge, _my_add_output_shapes, "(SymInt[] a, SymInt[] b)", my_add_rule);

STABLE_TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def("my_add(Tensor a, Tensor b) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("my_add", TORCH_BOX(&my_add_cpu));
}

// AOTInductor's C shim (opforge/torch_c_shim.h): a .pt2 built by opforge.aoti_compile_and_package
// calls the CPU kernel here directly, without the dispatcher.
OPFORGE_AOTI_C_SHIM(opforge, cpu, my_add, (AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* ret0)) {
  const char* op = "opforge::my_add";
  return c_shim::give(my_add_cpu(c_shim::borrow_cpu(a, op, "a"), c_shim::borrow_cpu(b, op, "b")), ret0);
}

}  // namespace opforge
