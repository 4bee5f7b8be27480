// CUDA kernel of opforge::my_add: the same checks and broadcasting plan as the
// CPU kernel (my_add_args.h), then the core's CUDA kernel (core/cuda/my_add.cuh:
// 16-byte vectorised grid-stride loop, or the general broadcasting one) on
// torch's current stream.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "opforge/torch_cuda.h"
#include "my_add_args.h"

namespace opforge {

at::Tensor my_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  MyAddPlan prep = my_add_prepare(a, b);
  if (prep.out.numel() == 0) return prep.out;
  const c10::cuda::CUDAGuard guard(a.device());
  check_launch(core::cuda::my_add(gpu_dtype(a.scalar_type()), prep.plan, a.const_data_ptr(), b.const_data_ptr(),
                                  prep.out.mutable_data_ptr(), current_stream(a)),
               "opforge::my_add");
  return prep.out;
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("my_add", &my_add_cuda);
}

}  // namespace opforge
