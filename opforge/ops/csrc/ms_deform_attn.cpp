// CPU kernels of opforge::ms_deform_attn (multi-scale deformable attention,
// mmcv's argument order) and its backward: the shared core
// (core/ms_deform_attn.h) on torch's intra-op pool, forward over queries,
// backward over (image, head) pairs. The schemas of the op family live here.
#include <tuple>
#include <vector>

#include "core/ms_deform_attn.h"
#include "ms_deform_attn_args.h"
#include "opforge/torch_c_shim.h"
#include "opforge/torch_op.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {
namespace {

using core::MsDeformAttnParams;

// The tensor the kernels read: contiguous, and float32 for the 16-bit dtypes
// (widened once, so every sample is a plain float load; results are rounded once).
Tensor in_compute_dtype(const Tensor& x) { return prepared(x, compute_type(x.scalar_type())); }

// float32 / float64 tensors, contiguous, already checked.
Tensor forward_cpu(const MsDeformAttnParams& p, const Tensor& value, const Tensor& spatial_shapes,
                   const Tensor& level_start_index, const Tensor& sampling_locations,
                   const Tensor& attention_weights) {
  Tensor out = empty_tensor({p.batch, p.queries, p.heads * p.channels}, value.scalar_type(), value);
  if (out.numel() == 0) return out;
  dispatch_compute(value.scalar_type(), "opforge::ms_deform_attn", [&]<typename T>() {
    const T* v = data<T>(value);
    const int64_t* shapes = data<int64_t>(spatial_shapes);
    const int64_t* starts = data<int64_t>(level_start_index);
    const T* loc = data<T>(sampling_locations);
    const T* attn = data<T>(attention_weights);
    T* o = mutable_data<T>(out);
    parallel_for(0, p.batch * p.queries, core::ms_deform_attn_forward_grain(p), [&](int64_t begin, int64_t end) {
      core::ms_deform_attn_forward(p, v, shapes, starts, loc, attn, o, begin, end);
    });
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor> backward_cpu(const MsDeformAttnParams& p, const Tensor& grad_output,
                                                const Tensor& value, const Tensor& spatial_shapes,
                                                const Tensor& level_start_index, const Tensor& sampling_locations,
                                                const Tensor& attention_weights) {
  const ScalarType t = value.scalar_type();
  Tensor grad_value = zeros_as(value);
  Tensor grad_loc = empty_as(sampling_locations, t);
  Tensor grad_attn = empty_as(attention_weights, t);
  if (grad_loc.numel() == 0) return {grad_value, grad_loc, grad_attn};
  dispatch_compute(t, "opforge::_ms_deform_attn_backward", [&]<typename T>() {
    const T* g = data<T>(grad_output);
    const T* v = data<T>(value);
    const int64_t* shapes = data<int64_t>(spatial_shapes);
    const int64_t* starts = data<int64_t>(level_start_index);
    const T* loc = data<T>(sampling_locations);
    const T* attn = data<T>(attention_weights);
    T* gv = mutable_data<T>(grad_value);
    T* gl = mutable_data<T>(grad_loc);
    T* ga = mutable_data<T>(grad_attn);
    parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
      core::ms_deform_attn_backward(p, g, v, shapes, starts, loc, attn, gv, gl, ga, begin, end);
    });
  });
  return {grad_value, grad_loc, grad_attn};
}

}  // namespace

Tensor ms_deform_attn_cpu(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                          const Tensor& sampling_locations, const Tensor& attention_weights, int64_t im2col_step) {
  const MsDeformAttnParams p = ms_deform_attn_check_args(value, spatial_shapes, level_start_index, sampling_locations,
                                                         attention_weights, im2col_step);
  const Tensor shapes = prepared(spatial_shapes), starts = prepared(level_start_index);
  ms_deform_attn_check_levels(p, shapes, starts);
  return to_dtype(forward_cpu(p, in_compute_dtype(value), shapes, starts, in_compute_dtype(sampling_locations),
                              in_compute_dtype(attention_weights)),
                  value.scalar_type());
}

std::tuple<Tensor, Tensor, Tensor> ms_deform_attn_backward_cpu(const Tensor& grad_output, const Tensor& value,
                                                               const Tensor& spatial_shapes,
                                                               const Tensor& level_start_index,
                                                               const Tensor& sampling_locations,
                                                               const Tensor& attention_weights, int64_t im2col_step) {
  const MsDeformAttnParams p = ms_deform_attn_check_args(value, spatial_shapes, level_start_index, sampling_locations,
                                                         attention_weights, im2col_step, &grad_output);
  const Tensor shapes = prepared(spatial_shapes), starts = prepared(level_start_index);
  ms_deform_attn_check_levels(p, shapes, starts);
  auto [grad_value, grad_loc, grad_attn] =
      backward_cpu(p, in_compute_dtype(grad_output), in_compute_dtype(value), shapes, starts,
                   in_compute_dtype(sampling_locations), in_compute_dtype(attention_weights));
  const ScalarType t = value.scalar_type();
  return {to_dtype(grad_value, t), to_dtype(grad_loc, t), to_dtype(grad_attn, t)};
}

namespace {

// The shape rule (core::ms_deform_attn_output_shapes), which the fake impl and ONNX shape
// inference run through opforge.ShapeRule (ms_deform_attn.py).
std::string ms_deform_attn_rule(const RuleArgs& args, RuleShapes& out) {
  core::MsDeformAttnShapes<RuleDim> in;
  in.value = args.shape(0);
  in.spatial_shapes = args.shape(1);
  in.level_start_index = args.shape(2);
  in.sampling_locations = args.shape(3);
  in.attention_weights = args.shape(4);
  in.im2col_step = args.integer(5);
  return core::ms_deform_attn_output_shapes(in, out);
}

}  // namespace

OPFORGE_SHAPE_RULE(opforge, _ms_deform_attn_output_shapes,
                   "(SymInt[] value, SymInt[] spatial_shapes, SymInt[] level_start_index, "
                   "SymInt[] sampling_locations, SymInt[] attention_weights, int im2col_step)",
                   ms_deform_attn_rule);

STABLE_TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def(
      "ms_deform_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, Tensor sampling_locations, "
      "Tensor attention_weights, int im2col_step) -> Tensor");
  m.def(
      "_ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_locations, Tensor attention_weights, int im2col_step) -> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("ms_deform_attn", TORCH_BOX(&ms_deform_attn_cpu));
  m.impl("_ms_deform_attn_backward", TORCH_BOX(&ms_deform_attn_backward_cpu));
}

// AOTInductor's C shim (opforge/torch_c_shim.h): the CPU kernel, called by a .pt2 directly.
OPFORGE_AOTI_C_SHIM(opforge, cpu, ms_deform_attn,
                    (AtenTensorHandle value, AtenTensorHandle spatial_shapes, AtenTensorHandle level_start_index,
                     AtenTensorHandle sampling_locations, AtenTensorHandle attention_weights, int64_t im2col_step,
                     AtenTensorHandle* ret0)) {
  const char* op = "opforge::ms_deform_attn";
  return c_shim::give(ms_deform_attn_cpu(c_shim::borrow_cpu(value, op, "value"),
                                         c_shim::borrow_cpu(spatial_shapes, op, "spatial_shapes"),
                                         c_shim::borrow_cpu(level_start_index, op, "level_start_index"),
                                         c_shim::borrow_cpu(sampling_locations, op, "sampling_locations"),
                                         c_shim::borrow_cpu(attention_weights, op, "attention_weights"), im2col_step),
                      ret0);
}

}  // namespace opforge
