// The torch CUDA path of deform_conv2d (opforge/ops/csrc/deform_conv2d_batched.h:
// chunking, column layout, every batched GEMM and transpose) with a host
// sampler that runs the CUDA kernels' work items (core/deform_conv2d_gpu.h) on
// the CPU. A library on LibTorch's stable ABI, built by tests/test_gpu_cores_emulated.py
// with the flags of opforge's torch libraries and loaded with torch.ops.load_library;
// registers torch.ops.opforge_gpu_emulation.*. Not part of the package.
#include <tuple>
#include <vector>

#include "core/deform_conv2d_gpu.h"
#include "deform_conv2d_args.h"
#include "deform_conv2d_batched.h"
#include "opforge/torch_op.h"

namespace {

using opforge::Tensor;
using opforge::core::DeformConv2dParams;

struct HostSampler {
  void fill_bias(const DeformConv2dParams& p, const Tensor& bias, Tensor& out) const {
    opforge::dispatch_compute(out.scalar_type(), "fill_bias", [&]<typename T>() {
      const int64_t n = out.numel();
      for (int64_t i = 0; i < n; ++i)
        opforge::core::fill_bias_item(i, p.out_channels, p.out_pixels(), opforge::data<T>(bias),
                                      opforge::mutable_data<T>(out));
    });
  }
  void im2col(const DeformConv2dParams& p, const Tensor& input, const Tensor& offset, const Tensor& mask,
              int64_t first_image, int64_t images, Tensor& col) const {
    opforge::dispatch_compute(input.scalar_type(), "im2col", [&]<typename T>() {
      for (int64_t i = 0; i < opforge::core::deform_gpu_items(p, images); ++i)
        opforge::core::deform_im2col_item<T, T>(p, i, opforge::data<T>(input), opforge::data<T>(offset),
                                                p.use_mask ? opforge::data<T>(mask) : nullptr, first_image,
                                                opforge::mutable_data<T>(col));
    });
  }
  void backward(const DeformConv2dParams& p, const Tensor& input, const Tensor& offset, const Tensor& mask,
                int64_t first_image, int64_t images, const Tensor& grad_col, Tensor& grad_input, Tensor& grad_offset,
                Tensor& grad_mask) const {
    opforge::dispatch_compute(input.scalar_type(), "backward", [&]<typename T>() {
      for (int64_t i = 0; i < opforge::core::deform_gpu_items(p, images); ++i)
        opforge::core::deform_backward_item<T, T>(
            p, i, opforge::data<T>(input), opforge::data<T>(offset), p.use_mask ? opforge::data<T>(mask) : nullptr,
            first_image, opforge::data<T>(grad_col), opforge::mutable_data<T>(grad_input),
            opforge::mutable_data<T>(grad_offset), p.use_mask ? opforge::mutable_data<T>(grad_mask) : nullptr);
    });
  }
};

// The op's int arguments in one list (stride, padding and dilation, h and w each, then groups and
// offset_groups), checked with the tensors as the torch front end checks them.
DeformConv2dParams checked_params(const Tensor& input, const Tensor& weight, const Tensor& offset, const Tensor& mask,
                                  const Tensor& bias, const std::vector<int64_t>& geometry, bool use_mask) {
  opforge::check(geometry.size() == 8, "geometry: stride, padding, dilation (h, w each), groups, offset_groups");
  const int64_t* g = geometry.data();
  return opforge::deform_conv2d_check_args(input, weight, offset, mask, bias, g[0], g[1], g[2], g[3], g[4], g[5], g[6],
                                           g[7], use_mask);
}

Tensor forward(const Tensor& input, const Tensor& weight, const Tensor& offset, const Tensor& mask, const Tensor& bias,
               std::vector<int64_t> geometry, bool use_mask, int64_t column_budget_bytes) {
  const DeformConv2dParams p = checked_params(input, weight, offset, mask, bias, geometry, use_mask);
  return opforge::deform_conv2d_batched_forward(p, opforge::prepared(input), opforge::prepared(weight),
                                                opforge::prepared(offset), opforge::prepared(mask),
                                                opforge::prepared(bias), HostSampler{}, column_budget_bytes);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> backward(const Tensor& grad, const Tensor& input,
                                                            const Tensor& weight, const Tensor& offset,
                                                            const Tensor& mask, const Tensor& bias,
                                                            std::vector<int64_t> geometry, bool use_mask,
                                                            int64_t column_budget_bytes) {
  const DeformConv2dParams p = checked_params(input, weight, offset, mask, bias, geometry, use_mask);
  return opforge::deform_conv2d_batched_backward(p, opforge::prepared(grad), opforge::prepared(input),
                                                 opforge::prepared(weight), opforge::prepared(offset),
                                                 opforge::prepared(mask), HostSampler{}, column_budget_bytes);
}

}  // namespace

STABLE_TORCH_LIBRARY(opforge_gpu_emulation, m) {
  m.def(
      "forward(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, int[] geometry, bool use_mask, "
      "int column_budget_bytes) -> Tensor");
  m.def(
      "backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, int[] geometry, "
      "bool use_mask, int column_budget_bytes) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(opforge_gpu_emulation, CPU, m) {
  m.impl("forward", TORCH_BOX(&forward));
  m.impl("backward", TORCH_BOX(&backward));
}
