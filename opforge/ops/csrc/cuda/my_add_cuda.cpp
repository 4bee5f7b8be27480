// CUDA kernel of opforge::my_add: the same checks and broadcasting plan as the
// CPU kernel (my_add_args.h), then the core's CUDA kernel (core/cuda/my_add.cuh:
// 16-byte vectorised grid-stride loop, or the general broadcasting one) on
// torch's current stream.
// First: it declares the CUDA shims (USE_CUDA) before any torch header includes shim.h.
#include "opforge/torch_cuda.h"

#include "my_add_args.h"

namespace opforge {

Tensor my_add_cuda(const Tensor& a, const Tensor& b) {
  MyAddPlan prep = my_add_prepare(a, b);
  if (prep.out.numel() == 0) return prep.out;
  const CudaDeviceGuard guard(a);
  check_launch(core::cuda::my_add(gpu_dtype(a.scalar_type()), prep.plan, a.const_data_ptr(), b.const_data_ptr(),
                                  prep.out.mutable_data_ptr(), current_stream(a)),
               "opforge::my_add");
  return prep.out;
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("my_add", TORCH_BOX(&my_add_cuda));
}

}  // namespace opforge
