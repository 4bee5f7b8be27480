// The torch CUDA path of deform_conv2d (opforge/ops/csrc/deform_conv2d_batched.h:
// chunking, column layout, every batched GEMM and transpose) with a host
// sampler that runs the CUDA kernels' work items (core/deform_conv2d_gpu.h) on
// the CPU. Built by tests/test_gpu_cores_emulated.py with
// torch.utils.cpp_extension.load; registers torch.ops.opforge_gpu_emulation.*.
// Not part of the package.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "core/deform_conv2d_gpu.h"
#include "deform_conv2d_args.h"
#include "deform_conv2d_batched.h"

namespace {

using opforge::core::DeformConv2dParams;

struct HostSampler {
  void fill_bias(const DeformConv2dParams& p, const at::Tensor& bias, at::Tensor& out) const {
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "fill_bias", [&] {
      for (int64_t i = 0; i < out.numel(); ++i)
        opforge::core::fill_bias_item(i, p.out_channels, p.out_pixels(), bias.const_data_ptr<scalar_t>(),
                                      out.mutable_data_ptr<scalar_t>());
    });
  }
  void im2col(const DeformConv2dParams& p, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& mask,
              int64_t first_image, int64_t images, at::Tensor& col) const {
    AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "im2col", [&] {
      for (int64_t i = 0; i < opforge::core::deform_gpu_items(p, images); ++i)
        opforge::core::deform_im2col_item<scalar_t, scalar_t>(
            p, i, input.const_data_ptr<scalar_t>(), offset.const_data_ptr<scalar_t>(),
            p.use_mask ? mask.const_data_ptr<scalar_t>() : nullptr, first_image, col.mutable_data_ptr<scalar_t>());
    });
  }
  void backward(const DeformConv2dParams& p, const at::Tensor& input, const at::Tensor& offset,
                const at::Tensor& mask, int64_t first_image, int64_t images, const at::Tensor& grad_col,
                at::Tensor& grad_input, at::Tensor& grad_offset, at::Tensor& grad_mask) const {
    AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "backward", [&] {
      for (int64_t i = 0; i < opforge::core::deform_gpu_items(p, images); ++i)
        opforge::core::deform_backward_item<scalar_t, scalar_t>(
            p, i, input.const_data_ptr<scalar_t>(), offset.const_data_ptr<scalar_t>(),
            p.use_mask ? mask.const_data_ptr<scalar_t>() : nullptr, first_image, grad_col.const_data_ptr<scalar_t>(),
            grad_input.mutable_data_ptr<scalar_t>(), grad_offset.mutable_data_ptr<scalar_t>(),
            p.use_mask ? grad_mask.mutable_data_ptr<scalar_t>() : nullptr);
    });
  }
};

// The op's int arguments in one list (stride, padding and dilation, h and w each, then groups and
// offset_groups), checked with the tensors as the torch front end checks them.
DeformConv2dParams checked_params(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
                                  const at::Tensor& mask, const at::Tensor& bias, at::IntArrayRef geometry,
                                  bool use_mask) {
  TORCH_CHECK(geometry.size() == 8, "geometry: stride, padding, dilation (h, w each), groups, offset_groups");
  const int64_t* g = geometry.data();
  return opforge::deform_conv2d_check_args(input, weight, offset, mask, bias, g[0], g[1], g[2], g[3], g[4], g[5], g[6],
                                           g[7], use_mask);
}

at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset, const at::Tensor& mask,
                   const at::Tensor& bias, at::IntArrayRef geometry, bool use_mask, int64_t column_budget_bytes) {
  const DeformConv2dParams p = checked_params(input, weight, offset, mask, bias, geometry, use_mask);
  return opforge::deform_conv2d_batched_forward(p, input.contiguous(), weight.contiguous(), offset.contiguous(),
                                                mask.contiguous(), bias.contiguous(), HostSampler{},
                                                column_budget_bytes);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
    const at::Tensor& mask, const at::Tensor& bias, at::IntArrayRef geometry, bool use_mask,
    int64_t column_budget_bytes) {
  const DeformConv2dParams p = checked_params(input, weight, offset, mask, bias, geometry, use_mask);
  return opforge::deform_conv2d_batched_backward(p, grad.contiguous(), input.contiguous(), weight.contiguous(),
                                                 offset.contiguous(), mask.contiguous(), HostSampler{},
                                                 column_budget_bytes);
}

}  // namespace

TORCH_LIBRARY(opforge_gpu_emulation, m) {
  m.def("forward", &forward);
  m.def("backward", &backward);
}
