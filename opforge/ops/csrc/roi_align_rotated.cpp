// CPU kernels of opforge::roi_align_rotated (rotated RoI Align, mmcv's
// argument order) and its backward: the shared core
// (core/roi_align_rotated.h) on ATen's intra-op pool, forward over rois,
// backward over channel ranges. The schemas of the op family live here.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <vector>

#include "core/roi_align_rotated.h"
#include "roi_align_rotated_args.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {
namespace {

at::ScalarType compute_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

}  // namespace

at::Tensor roi_align_rotated_cpu(const at::Tensor& input, const at::Tensor& rois, int64_t output_height,
                                 int64_t output_width, double spatial_scale, int64_t sampling_ratio, bool aligned,
                                 bool clockwise) {
  const core::RoiAlignRotatedParams p = roi_align_rotated_check_args(
      input, input.sizes(), rois, output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise);
  const at::Tensor host_rois = roi_align_rotated_checked_rois(p, rois);
  const at::ScalarType ct = compute_dtype(input.scalar_type());
  at::Tensor out = at::empty({p.rois, p.channels, p.pooled_h, p.pooled_w}, input.options().dtype(ct));
  if (out.numel() > 0) {
    // channels-last, in the compute dtype: one pass (a no-op for channels_last float input)
    const at::Tensor x = input.to(ct).permute({0, 2, 3, 1}).contiguous();
    AT_DISPATCH_FLOATING_TYPES(ct, "opforge::roi_align_rotated", [&] {
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* r = host_rois.const_data_ptr<scalar_t>();
      scalar_t* o = out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, p.rois, core::roi_align_rotated_forward_grain(p), [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_forward(p, xp, r, o, begin, end);
      });
    });
  }
  return out.to(input.scalar_type());
}

at::Tensor roi_align_rotated_backward_cpu(const at::Tensor& grad_output, const at::Tensor& rois,
                                          at::IntArrayRef input_size, int64_t output_height, int64_t output_width,
                                          double spatial_scale, int64_t sampling_ratio, bool aligned,
                                          bool clockwise) {
  const core::RoiAlignRotatedParams p =
      roi_align_rotated_check_args(grad_output, input_size, rois, output_height, output_width, spatial_scale,
                                   sampling_ratio, aligned, clockwise, &grad_output);
  const at::Tensor host_rois = roi_align_rotated_checked_rois(p, rois);
  const at::ScalarType ct = compute_dtype(grad_output.scalar_type());
  at::Tensor grad_nhwc = at::zeros({p.batch, p.height, p.width, p.channels}, grad_output.options().dtype(ct));
  if (grad_output.numel() > 0) {
    const at::Tensor g = grad_output.to(ct).contiguous();
    AT_DISPATCH_FLOATING_TYPES(ct, "opforge::_roi_align_rotated_backward", [&] {
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const scalar_t* r = host_rois.const_data_ptr<scalar_t>();
      scalar_t* gi = grad_nhwc.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, p.channels, core::roi_align_rotated_backward_grain(p), [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_backward(p, gp, r, gi, begin, end);
      });
    });
  }
  return grad_nhwc.permute({0, 3, 1, 2}).to(grad_output.scalar_type()).contiguous();
}

// The shape rule (core::roi_align_rotated_output_shapes) as the tensor-free op
// opforge::_roi_align_rotated_output_shapes, on SymInt sizes: the fake impl and
// ONNX shape inference call it through opforge.ShapeRule (roi_align_rotated.py).
std::vector<c10::SymInt> roi_align_rotated_output_shapes(c10::SymIntArrayRef input, c10::SymIntArrayRef rois,
                                                         int64_t output_height, int64_t output_width,
                                                         double spatial_scale, int64_t sampling_ratio, bool aligned,
                                                         bool clockwise) {
  core::RoiAlignRotatedShapes<c10::SymInt> in;
  in.input = rule_shape(input);
  in.rois = rule_shape(rois);
  in.output_height = output_height, in.output_width = output_width;
  in.spatial_scale = static_cast<float>(spatial_scale);
  in.sampling_ratio = sampling_ratio, in.aligned = aligned, in.clockwise = clockwise;
  return run_shape_rule(in, core::roi_align_rotated_output_shapes<c10::SymInt>);
}

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def(
      "_roi_align_rotated_output_shapes(SymInt[] input, SymInt[] rois, int output_height, int output_width, "
      "float spatial_scale, int sampling_ratio, bool aligned, bool clockwise) -> SymInt[]",
      &roi_align_rotated_output_shapes);
  m.def(
      "roi_align_rotated(Tensor input, Tensor rois, int output_height, int output_width, float spatial_scale, "
      "int sampling_ratio, bool aligned, bool clockwise) -> Tensor");
  m.def(
      "_roi_align_rotated_backward(Tensor grad_output, Tensor rois, SymInt[] input_size, int output_height, "
      "int output_width, float spatial_scale, int sampling_ratio, bool aligned, bool clockwise) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("roi_align_rotated", &roi_align_rotated_cpu);
  m.impl("_roi_align_rotated_backward", &roi_align_rotated_backward_cpu);
}

}  // namespace opforge
