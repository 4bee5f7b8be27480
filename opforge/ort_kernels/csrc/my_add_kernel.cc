// ORT kernel of opforge::my_add (domain "opforge", version 1): the same core as
// the torch extension (core/my_add.h), run on ORT's intra-op thread pool.
#include "core/my_add.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

Ort::Status my_add_plan(const std::vector<int64_t>& shape_a, const std::vector<int64_t>& shape_b,
                        std::vector<int64_t>& out_shape, core::BinaryPlan& plan) {
  core::MyAddShapes<int64_t> shapes;
  shapes.a = core::Shape<int64_t>{shape_a};
  shapes.b = core::Shape<int64_t>{shape_b};
  shapes.a_name = "A";
  shapes.b_name = "B";
  std::vector<std::vector<int64_t>> out;
  if (std::string err = core::my_add_output_shapes(shapes, out); !err.empty()) return invalid_argument(err);
  out_shape = out[0];
  const int n = static_cast<int>(out_shape.size());
  plan = core::BinaryPlan{};
  plan.numel = 1;
  for (int64_t d : out_shape) plan.numel *= d;
  if (plan.numel == 0) return Ort::Status(nullptr);
  std::vector<int64_t> sa(n), sb(n);
  core::broadcast_contiguous_strides(shape_a.data(), static_cast<int>(shape_a.size()), out_shape.data(), n, sa.data());
  core::broadcast_contiguous_strides(shape_b.data(), static_cast<int>(shape_b.size()), out_shape.data(), n, sb.data());
  plan = core::make_binary_plan(n, out_shape.data(), sa.data(), sb.data());
  return Ort::Status(nullptr);
}

void check_my_add_node(const OrtKernelInfo* info) { check_node_arity(info, "opforge::my_add", {"A", "B"}); }

namespace {

// The CPU EP's part: the core's broadcasting loop on ORT's intra-op pool.
struct MyAddCpu {
  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const core::BinaryPlan& plan, const T* a, const T* b, T* out) const {
    const auto* pa = core_ptr(a);
    const auto* pb = core_ptr(b);
    auto* pc = core_ptr(out);
    parallel_for(ctx, plan.numel, core::kMyAddGrain,
                 [&](int64_t begin, int64_t end) { core::my_add_range(plan, pa, pb, pc, begin, end); });
    return Ort::Status(nullptr);
  }
};

}  // namespace

const FloatKernels<MyAddKernel, MyAddCpu> my_add_kernels("my_add", kCpuEp);

}  // namespace ort
}  // namespace opforge
