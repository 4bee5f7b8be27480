// mmdeploy::grid_sampler's node form (see grid_sampler_kernel.cc), its checks and its
// kernel, shared by the CPU and CUDA EP kernels.
#pragma once

#include <string>
#include <vector>

#include "core/grid_sample.h"
#include "mmdeploy_ops.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

struct GridSamplerAttrs {
  int64_t interpolation, padding, align_corners;

  explicit GridSamplerAttrs(const OrtKernelInfo* info) {
    check_node_arity(info, core::kGridSampleOp, {"input", "grid"});
    interpolation = int_attribute_or(info, core::kGridSampleOp, "interpolation_mode", 0);
    padding = int_attribute_or(info, core::kGridSampleOp, "padding_mode", 0);
    align_corners = int_attribute_or(info, core::kGridSampleOp, "align_corners", 0);
    if (std::string err = core::grid_sample_check_attrs(interpolation, padding, align_corners); !err.empty())
      node_error(err);
  }

  // The input shapes checked with the attributes into p.
  Ort::Status check(const std::vector<int64_t>& xs, const std::vector<int64_t>& gs, core::GridSampleParams& p) const {
    const std::string err = core::grid_sample_check(xs.data(), static_cast<int>(xs.size()), gs.data(),
                                                    static_cast<int>(gs.size()), interpolation, padding, align_corners, p);
    return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
  }
};

// The node's kernel: ep.run(ctx, p, input, grid, out) computes a non-empty output. The grid
// needs no host-side check: every coordinate is clamped before it becomes an index.
template <typename T, typename Ep>
struct GridSamplerKernel : GridSamplerAttrs {
  Ep ep;

  GridSamplerKernel(const OrtApi*, const OrtKernelInfo* info) : GridSamplerAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& grid,
                      Ort::Custom::Tensor<T>& output) {
    core::GridSampleParams p;
    if (Ort::Status bad = check(input.Shape(), grid.Shape(), p); !bad.IsOK()) return bad;
    int64_t dims[4];
    core::grid_sample_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    if (dims[0] * dims[1] * dims[2] * dims[3] == 0) return Ort::Status(nullptr);
    return ep.run(ctx, p, input.Data(), grid.Data(), out);
  }
};

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
