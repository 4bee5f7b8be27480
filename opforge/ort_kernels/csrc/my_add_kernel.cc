// ORT kernel of opforge::my_add (domain "opforge", version 1): the same core as
// the torch extension (core/my_add.h), run on ORT's intra-op thread pool.
#include "core/my_add.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

Ort::Status my_add_plan(const std::vector<int64_t>& shape_a, const std::vector<int64_t>& shape_b,
                        std::vector<int64_t>& out_shape, core::BinaryPlan& plan) {
  if (shape_a.size() > core::kMaxDims || shape_b.size() > core::kMaxDims)
    return invalid_argument("opforge::my_add: at most " + std::to_string(core::kMaxDims) +
                            " dimensions are supported, got A: " + std::to_string(shape_a.size()) +
                            " and B: " + std::to_string(shape_b.size()));
  const int n = static_cast<int>(shape_a.size() > shape_b.size() ? shape_a.size() : shape_b.size());
  out_shape.assign(n, 0);
  const int bad = core::broadcast_shapes(shape_a.data(), static_cast<int>(shape_a.size()), shape_b.data(),
                                         static_cast<int>(shape_b.size()), out_shape.data());
  if (bad >= 0)
    return invalid_argument("opforge::my_add: shapes of A " + shape_str(shape_a) + " and B " + shape_str(shape_b) +
                            " are not broadcastable (dimension " + std::to_string(bad - n) + " differs)");
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

template <typename T>
struct MyAddKernel {
  MyAddKernel(const OrtApi*, const OrtKernelInfo* info) { check_my_add_node(info); }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& a, const Ort::Custom::Tensor<T>& b,
                      Ort::Custom::Tensor<T>& out) {
    core::BinaryPlan plan;
    std::vector<int64_t> out_shape;
    if (Ort::Status error = my_add_plan(a.Shape(), b.Shape(), out_shape, plan); !error.IsOK()) return error;
    T* po = out.Allocate(out_shape);
    if (plan.numel == 0) return Ort::Status(nullptr);

    const auto* pa = core_ptr(a.Data());
    const auto* pb = core_ptr(b.Data());
    auto* pc = core_ptr(po);
    parallel_for(ctx, plan.numel, core::kMyAddGrain,
                 [&](int64_t begin, int64_t end) { core::my_add_range(plan, pa, pb, pc, begin, end); });
    return Ort::Status(nullptr);
  }
};

static void append_my_add_ops(std::vector<LiteOpPtr>& ops) {
  // One kernel per element type under the same name: ORT picks by input type.
  for_each_float_type([&](auto tag) {
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<MyAddKernel<decltype(tag)>>("my_add", kCpuEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_my_add_ops);
