// ORT CUDA-EP kernel of opforge::my_add: the CPU kernel's checks and
// broadcasting plan (my_add_plan), then the shared CUDA core on ORT's compute
// stream — the same kernels torch's CUDA path launches.
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

template <typename T>
struct MyAddCudaKernel {
  MyAddCudaKernel(const OrtApi*, const OrtKernelInfo* info) { check_my_add_node(info); }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& a, const Ort::Custom::Tensor<T>& b,
                      Ort::Custom::Tensor<T>& out) {
    const InputDeviceGuard device(ctx);
    core::BinaryPlan plan;
    std::vector<int64_t> out_shape;
    if (Ort::Status error = my_add_plan(a.Shape(), b.Shape(), out_shape, plan); !error.IsOK()) return error;
    T* po = out.Allocate(out_shape);
    if (plan.numel == 0) return Ort::Status(nullptr);
    return cuda_status(core::cuda::my_add(gpu_dtype<T>(), plan, a.Data(), b.Data(), po, compute_stream(ctx)),
                       "opforge::my_add", "CUDA kernel launch");
  }
};

static void append_my_add_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<MyAddCudaKernel<decltype(tag)>>("my_add", kCudaEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_my_add_cuda_ops);
