// CUDA kernel of grid_sample (mmdeploy::grid_sampler): a grid-stride loop over
// output elements around the shared work item (core/grid_sample.h:
// grid_sample_forward_item, the CPU kernel's per-point arithmetic in its order).
#pragma once

#include <cstdint>

#include "../grid_sample.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

// Item i is output element i of [N, C, Ho, Wo].
template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    grid_sample_forward_kernel(const GridSampleParams p, int64_t items, const T* __restrict__ input,
                               const T* __restrict__ grid, T* __restrict__ out) {
  for (int64_t i = global_thread(); i < items; i += grid_threads()) grid_sample_forward_item<T, A>(p, i, input, grid, out);
}

template <typename T>
cudaError_t launch_grid_sample_forward(const GridSampleParams& p, const T* input, const T* grid, T* out,
                                       cudaStream_t stream) {
  const int64_t items = p.batch * p.channels * p.out_plane();
  if (items == 0) return cudaSuccess;
  grid_sample_forward_kernel<T, typename acc<T>::type><<<grid_for(items), kThreads, 0, stream>>>(p, items, input,
                                                                                                  grid, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
