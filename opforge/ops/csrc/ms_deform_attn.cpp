// CPU kernels of opforge::ms_deform_attn (multi-scale deformable attention,
// mmcv's argument order) and its backward: the shared core
// (core/ms_deform_attn.h) on ATen's intra-op pool, forward over queries,
// backward over (image, head) pairs. The schemas of the op family live here.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "core/ms_deform_attn.h"
#include "ms_deform_attn_args.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {
namespace {

using core::MsDeformAttnParams;

// The tensor the kernels read: contiguous, and float32 for the 16-bit dtypes
// (widened once, so every sample is a plain float load; results are rounded once).
at::Tensor in_compute_dtype(const at::Tensor& x) {
  const at::ScalarType t = x.scalar_type();
  return (t == at::kHalf || t == at::kBFloat16 ? x.to(at::kFloat) : x).contiguous();
}

// float32 / float64 tensors, contiguous, already checked.
at::Tensor forward_cpu(const MsDeformAttnParams& p, const at::Tensor& value, const at::Tensor& spatial_shapes,
                       const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                       const at::Tensor& attention_weights) {
  at::Tensor out = at::empty({p.batch, p.queries, p.heads * p.channels}, value.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "opforge::ms_deform_attn", [&] {
    const scalar_t* v = value.const_data_ptr<scalar_t>();
    const int64_t* shapes = spatial_shapes.const_data_ptr<int64_t>();
    const int64_t* starts = level_start_index.const_data_ptr<int64_t>();
    const scalar_t* loc = sampling_locations.const_data_ptr<scalar_t>();
    const scalar_t* attn = attention_weights.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, p.batch * p.queries, core::ms_deform_attn_forward_grain(p), [&](int64_t begin, int64_t end) {
      core::ms_deform_attn_forward(p, v, shapes, starts, loc, attn, o, begin, end);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(const MsDeformAttnParams& p, const at::Tensor& grad_output,
                                                             const at::Tensor& value, const at::Tensor& spatial_shapes,
                                                             const at::Tensor& level_start_index,
                                                             const at::Tensor& sampling_locations,
                                                             const at::Tensor& attention_weights) {
  at::Tensor grad_value = at::zeros(value.sizes(), value.options());
  at::Tensor grad_loc = at::empty(sampling_locations.sizes(), value.options());
  at::Tensor grad_attn = at::empty(attention_weights.sizes(), value.options());
  if (grad_loc.numel() == 0) return {grad_value, grad_loc, grad_attn};
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "opforge::_ms_deform_attn_backward", [&] {
    const scalar_t* g = grad_output.const_data_ptr<scalar_t>();
    const scalar_t* v = value.const_data_ptr<scalar_t>();
    const int64_t* shapes = spatial_shapes.const_data_ptr<int64_t>();
    const int64_t* starts = level_start_index.const_data_ptr<int64_t>();
    const scalar_t* loc = sampling_locations.const_data_ptr<scalar_t>();
    const scalar_t* attn = attention_weights.const_data_ptr<scalar_t>();
    scalar_t* gv = grad_value.mutable_data_ptr<scalar_t>();
    scalar_t* gl = grad_loc.mutable_data_ptr<scalar_t>();
    scalar_t* ga = grad_attn.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
      core::ms_deform_attn_backward(p, g, v, shapes, starts, loc, attn, gv, gl, ga, begin, end);
    });
  });
  return {grad_value, grad_loc, grad_attn};
}

}  // namespace

at::Tensor ms_deform_attn_cpu(const at::Tensor& value, const at::Tensor& spatial_shapes,
                              const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                              const at::Tensor& attention_weights, int64_t im2col_step) {
  const MsDeformAttnParams p = ms_deform_attn_check_args(value, spatial_shapes, level_start_index, sampling_locations,
                                                         attention_weights, im2col_step);
  const at::Tensor shapes = spatial_shapes.contiguous(), starts = level_start_index.contiguous();
  ms_deform_attn_check_levels(p, shapes, starts);
  return forward_cpu(p, in_compute_dtype(value), shapes, starts, in_compute_dtype(sampling_locations),
                     in_compute_dtype(attention_weights))
      .to(value.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
    int64_t im2col_step) {
  const MsDeformAttnParams p = ms_deform_attn_check_args(value, spatial_shapes, level_start_index, sampling_locations,
                                                         attention_weights, im2col_step, &grad_output);
  const at::Tensor shapes = spatial_shapes.contiguous(), starts = level_start_index.contiguous();
  ms_deform_attn_check_levels(p, shapes, starts);
  auto [grad_value, grad_loc, grad_attn] =
      backward_cpu(p, in_compute_dtype(grad_output), in_compute_dtype(value), shapes, starts,
                   in_compute_dtype(sampling_locations), in_compute_dtype(attention_weights));
  const at::ScalarType t = value.scalar_type();
  return {grad_value.to(t), grad_loc.to(t), grad_attn.to(t)};
}

// The shape rule (core::ms_deform_attn_output_shapes) as the tensor-free op
// opforge::_ms_deform_attn_output_shapes, on SymInt sizes: the fake impl and ONNX
// shape inference call it through opforge.ShapeRule (ms_deform_attn.py).
std::vector<c10::SymInt> ms_deform_attn_output_shapes(c10::SymIntArrayRef value, c10::SymIntArrayRef spatial_shapes,
                                                      c10::SymIntArrayRef level_start_index,
                                                      c10::SymIntArrayRef sampling_locations,
                                                      c10::SymIntArrayRef attention_weights, int64_t im2col_step) {
  core::MsDeformAttnShapes<c10::SymInt> in;
  in.value = rule_shape(value);
  in.spatial_shapes = rule_shape(spatial_shapes);
  in.level_start_index = rule_shape(level_start_index);
  in.sampling_locations = rule_shape(sampling_locations);
  in.attention_weights = rule_shape(attention_weights);
  in.im2col_step = im2col_step;
  return run_shape_rule(in, core::ms_deform_attn_output_shapes<c10::SymInt>);
}

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def(
      "_ms_deform_attn_output_shapes(SymInt[] value, SymInt[] spatial_shapes, SymInt[] level_start_index, "
      "SymInt[] sampling_locations, SymInt[] attention_weights, int im2col_step) -> SymInt[]",
      &ms_deform_attn_output_shapes);
  m.def(
      "ms_deform_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, Tensor sampling_locations, "
      "Tensor attention_weights, int im2col_step) -> Tensor");
  m.def(
      "_ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_locations, Tensor attention_weights, int im2col_step) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("ms_deform_attn", &ms_deform_attn_cpu);
  m.impl("_ms_deform_attn_backward", &ms_deform_attn_backward_cpu);
}

}  // namespace opforge
