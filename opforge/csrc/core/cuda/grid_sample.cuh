// CUDA launcher of grid_sample (mmdeploy::grid_sampler): one thread per output
// element around the shared work item (core/grid_sample.h:
// grid_sample_forward_item, the CPU kernel's per-point arithmetic in its order).
#pragma once

#include <cstdint>

#include "../grid_sample.h"
#include "scalar.cuh"

namespace opforge {
namespace core {
namespace cuda {

// Item i is output element i of [N, C, Ho, Wo].
template <typename T>
cudaError_t launch_grid_sample_forward(const GridSampleParams& p, const T* input, const T* grid, T* out,
                                       cudaStream_t stream) {
  return launch_items<grid_sample_forward_item<T, typename acc<T>::type>>(p.batch * p.channels * p.out_plane(),
                                                                           stream, p, input, grid, out);
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
