// CPU kernels of opforge::roi_align_rotated (rotated RoI Align, mmcv's
// argument order) and its backward: the shared core
// (core/roi_align_rotated.h) on torch's intra-op pool, forward over output
// bins, backward over channel ranges. The schemas of the op family and the
// declarations of its budgets live here.
#include <vector>

#include "core/roi_align_rotated.h"
#include "opforge/torch_c_shim.h"
#include "opforge/torch_op.h"
#include "opforge/torch_shape_rule.h"
#include "roi_align_rotated_args.h"

namespace opforge {

// The op's budgets (core/roi_align_rotated.h says why and how large), which opforge.set_budget
// changes; the CPU and CUDA kernels check every call against them.
const BudgetDecl roi_align_rotated_max_output_elements(core::kRoiAlignRotatedMaxOutputElementsKey,
                                                       core::kRoiAlignRotatedMaxOutputElements);
const BudgetDecl roi_align_rotated_max_samples(core::kRoiAlignRotatedMaxSamplesKey, core::kRoiAlignRotatedMaxSamples);

Tensor roi_align_rotated_cpu(const Tensor& input, const Tensor& rois, int64_t output_height, int64_t output_width,
                             double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise) {
  const core::RoiAlignRotatedParams p = roi_align_rotated_check_args(
      input, sizes_of(input), rois, output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise);
  int64_t samples = 0;
  const Tensor host_rois = roi_align_rotated_checked_rois(p, rois, &samples);
  const ScalarType ct = compute_type(input.scalar_type());
  Tensor out = empty_tensor({p.rois, p.channels, p.pooled_h, p.pooled_w}, ct, input);
  if (out.numel() > 0) {
    // channels-last, in the compute dtype: one pass (a no-op for channels_last float input)
    const Tensor x = prepared(permuted(to_dtype(input, ct), {0, 2, 3, 1}));
    dispatch_compute(ct, "opforge::roi_align_rotated", [&]<typename T>() {
      const T* xp = data<T>(x);
      const T* r = data<T>(host_rois);
      T* o = mutable_data<T>(out);
      const core::RoiAlignRotatedWork work = core::roi_align_rotated_work(p, torch::stable::get_num_threads());
      parallel_for(0, work.items, core::roi_align_rotated_forward_grain(p, work, samples),
                   [&](int64_t begin, int64_t end) { core::roi_align_rotated_forward(p, work, xp, r, o, begin, end); });
    });
  }
  return to_dtype(out, input.scalar_type());
}

Tensor roi_align_rotated_backward_cpu(const Tensor& grad_output, const Tensor& rois, std::vector<int64_t> input_size,
                                      int64_t output_height, int64_t output_width, double spatial_scale,
                                      int64_t sampling_ratio, bool aligned, bool clockwise) {
  const core::RoiAlignRotatedParams p =
      roi_align_rotated_check_args(grad_output, input_size, rois, output_height, output_width, spatial_scale,
                                   sampling_ratio, aligned, clockwise, &grad_output);
  const Tensor host_rois = roi_align_rotated_checked_rois(p, rois);
  const ScalarType ct = compute_type(grad_output.scalar_type());
  Tensor grad_nhwc = zeros_tensor({p.batch, p.height, p.width, p.channels}, ct, grad_output);
  if (grad_output.numel() > 0) {
    const Tensor g = prepared(grad_output, ct);
    dispatch_compute(ct, "opforge::_roi_align_rotated_backward", [&]<typename T>() {
      const T* gp = data<T>(g);
      const T* r = data<T>(host_rois);
      T* gi = mutable_data<T>(grad_nhwc);
      parallel_for(0, p.channels, core::roi_align_rotated_backward_grain(p), [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_backward(p, gp, r, gi, begin, end);
      });
    });
  }
  return prepared(to_dtype(permuted(grad_nhwc, {0, 3, 1, 2}), grad_output.scalar_type()));
}

namespace {

// The shape rule (core::roi_align_rotated_output_shapes), which the fake impl and ONNX shape
// inference run through opforge.ShapeRule (roi_align_rotated.py).
std::string roi_align_rotated_rule(const RuleArgs& args, RuleShapes& out) {
  core::RoiAlignRotatedShapes<RuleDim> in;
  in.input = args.shape(0);
  in.rois = args.shape(1);
  in.output_height = args.integer(2), in.output_width = args.integer(3);
  in.spatial_scale = static_cast<float>(args.real(4));
  in.sampling_ratio = args.integer(5), in.aligned = args.boolean(6), in.clockwise = args.boolean(7);
  return core::roi_align_rotated_output_shapes(in, out);
}

}  // namespace

OPFORGE_SHAPE_RULE(opforge, _roi_align_rotated_output_shapes,
                   "(SymInt[] input, SymInt[] rois, int output_height, int output_width, float spatial_scale, "
                   "int sampling_ratio, bool aligned, bool clockwise)",
                   roi_align_rotated_rule);

STABLE_TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def(
      "roi_align_rotated(Tensor input, Tensor rois, int output_height, int output_width, float spatial_scale, "
      "int sampling_ratio, bool aligned, bool clockwise) -> Tensor");
  m.def(
      "_roi_align_rotated_backward(Tensor grad_output, Tensor rois, SymInt[] input_size, int output_height, "
      "int output_width, float spatial_scale, int sampling_ratio, bool aligned, bool clockwise) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("roi_align_rotated", TORCH_BOX(&roi_align_rotated_cpu));
  m.impl("_roi_align_rotated_backward", TORCH_BOX(&roi_align_rotated_backward_cpu));
}

// AOTInductor's C shim (opforge/torch_c_shim.h): the CPU kernel, called by a .pt2 directly.
OPFORGE_AOTI_C_SHIM(opforge, cpu, roi_align_rotated,
                    (AtenTensorHandle input, AtenTensorHandle rois, int64_t output_height, int64_t output_width,
                     double spatial_scale, int64_t sampling_ratio, int32_t aligned, int32_t clockwise,
                     AtenTensorHandle* ret0)) {
  const char* op = "opforge::roi_align_rotated";
  return c_shim::give(roi_align_rotated_cpu(c_shim::borrow_cpu(input, op, "input"), c_shim::borrow_cpu(rois, op, "rois"),
                                            output_height, output_width, spatial_scale, sampling_ratio, aligned != 0,
                                            clockwise != 0),
                      ret0);
}

}  // namespace opforge
