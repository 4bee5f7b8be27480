// Declarations shared by opforge's own ORT kernels (CPU and CUDA EP); the
// generic glue is the public opforge/ort_op.h.
//
// Each of opforge's node forms has one lite-kernel template here, <Op>Kernel<T, Ep>:
// it checks the node at kernel creation and, per run, the input shapes, the values of
// the index inputs (read on the host through Ep::Io), allocates the output, and
// leaves only the computation to Ep, the execution provider's part (the CPU one in
// <op>_kernel.cc or <op>_cpu.h, the CUDA one under cuda/). So the CPU and CUDA EP
// kernels of a node form accept the same nodes and inputs, with the same messages,
// and give the same output shapes.
#pragma once

#include "opforge/ort_op.h"  // the public ORT glue every opforge-built library uses

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/broadcast.h"
#include "core/deform_conv2d_tap.h"
#include "core/ms_deform_attn_sample.h"
#include "core/nms_rotated.h"
#include "core/roi_align_rotated.h"  // the checks (the CPU kernels come with them)

namespace opforge {
namespace ort {

// The custom ONNX domain of opforge's own ops; must match opforge/spec.py: DOMAIN.
inline constexpr const char* kDomain = "opforge";

// The cores' compute type for storage type T: double for double, float32 otherwise.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// `count` host elements of storage type T in compute_t<T>: 16-bit types widened
// (exactly), float and double copied. For small data the kernels read on the
// host (rois, boxes, scores); large tensors are converted in parallel.
template <typename T>
std::vector<compute_t<T>> widened(const T* data, size_t count) {
  std::vector<compute_t<T>> out(count);
  const auto* src = core_ptr(data);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<compute_t<T>>(core::load(src[i]));
  return out;
}

// Elements per task of the parallel conversions.
inline constexpr int64_t kWidenGrain = int64_t(1) << 16;

// The same for large tensors, in parallel on ORT's intra-op pool.
template <typename T>
std::vector<compute_t<T>> widened(OrtKernelContext* ctx, const T* data, size_t count) {
  std::vector<compute_t<T>> out(count);
  const auto* src = core_ptr(data);
  parallel_for(ctx, static_cast<int64_t>(count), kWidenGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = static_cast<compute_t<T>>(core::load(src[i]));
  });
  return out;
}

// ---- the host side of a kernel -------------------------------------------------------
// Some inputs are read on the host (index data checked before anything is indexed with
// it, NMS boxes) and some outputs are written from it (NMS's kept indices). An Io does
// both for one run, the same calls on every EP: fetch (a view of an input's values,
// ready after wait()) and store (host values into an output). HostIo is the CPU EP's:
// its tensors are host memory. The CUDA EP's copies (CudaHostIo, cuda/cuda_host_io.h).
// `what` names the step in a failure's message, `op` the node form.

// An input's values on the host: data points at the tensor's own memory, or into `copy`.
template <typename T>
struct HostView {
  const T* data = nullptr;
  std::vector<T> copy;
};

class HostIo {
 public:
  HostIo(OrtKernelContext*, const char*) {}
  template <typename T>
  Ort::Status fetch(const T* data, size_t, const char*, HostView<T>& view) {
    view.data = data;
    return Ort::Status(nullptr);
  }
  Ort::Status wait(const char*) { return Ort::Status(nullptr); }
  template <typename T>
  Ort::Status store(const T* values, size_t count, T* out, const char*) {
    std::copy(values, values + count, out);
    return Ort::Status(nullptr);
  }
};

// ---- opforge::my_add -----------------------------------------------------------------
// The node check (kernel creation) and the shape checks + broadcasting plan.
void check_my_add_node(const OrtKernelInfo* info);
Ort::Status my_add_plan(const std::vector<int64_t>& shape_a, const std::vector<int64_t>& shape_b,
                        std::vector<int64_t>& out_shape, core::BinaryPlan& plan);

// ep.run(ctx, plan, a, b, out) computes a non-empty output.
template <typename T, typename Ep>
struct MyAddKernel {
  Ep ep;

  MyAddKernel(const OrtApi*, const OrtKernelInfo* info) { check_my_add_node(info); }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& a, const Ort::Custom::Tensor<T>& b,
                      Ort::Custom::Tensor<T>& out) {
    core::BinaryPlan plan;
    std::vector<int64_t> out_shape;
    if (Ort::Status error = my_add_plan(a.Shape(), b.Shape(), out_shape, plan); !error.IsOK()) return error;
    T* po = out.Allocate(out_shape);
    if (plan.numel == 0) return Ort::Status(nullptr);
    return ep.run(ctx, plan, a.Data(), b.Data(), po);
  }
};

// ---- opforge::deform_conv2d ----------------------------------------------------------

// deform_conv2d's node attributes (the torch schema's int arguments) and
// their check against the input shapes (core::deform_conv2d_check).
struct DeformConv2dAttrs {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups;
  bool use_mask;
  explicit DeformConv2dAttrs(const OrtKernelInfo* info);
  std::string check(const std::vector<int64_t>& input, const std::vector<int64_t>& weight,
                    const std::vector<int64_t>& offset, const std::vector<int64_t>& mask,
                    const std::vector<int64_t>& bias, core::DeformConv2dParams& p) const;
};

// ep.run(ctx, op, p, input, weight, offset, mask or null, bias, out): the computation of
// every node form meaning torchvision's deform_conv2d (DeformConv2dCpu in
// deform_conv2d_cpu.h, DeformConv2dCuda in cuda/deform_conv2d_cuda.h).
template <typename T, typename Ep>
struct DeformConv2dKernel : DeformConv2dAttrs {
  Ep ep;

  DeformConv2dKernel(const OrtApi*, const OrtKernelInfo* info) : DeformConv2dAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& weight,
                      const Ort::Custom::Tensor<T>& offset, const Ort::Custom::Tensor<T>& mask,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& output) {
    core::DeformConv2dParams p;
    const std::string err = check(input.Shape(), weight.Shape(), offset.Shape(), mask.Shape(), bias.Shape(), p);
    if (!err.empty()) return invalid_argument(err);
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    return ep.run(ctx, "opforge::deform_conv2d", p, input.Data(), weight.Data(), offset.Data(),
                  use_mask ? mask.Data() : nullptr, bias.Data(), out);
  }
};

// ---- opforge::ms_deform_attn ---------------------------------------------------------

// ms_deform_attn's node check at kernel creation (inputs, one output, the
// im2col_step attribute); returns im2col_step.
int64_t check_ms_deform_attn_node(const OrtKernelInfo* info);
// ms_deform_attn's input shapes checked by core::ms_deform_attn_check (CPU and CUDA EP kernels): fills p.
Ort::Status ms_deform_attn_shapes(const std::vector<int64_t>& value, const std::vector<int64_t>& spatial_shapes,
                                  const std::vector<int64_t>& level_start_index,
                                  const std::vector<int64_t>& sampling_locations,
                                  const std::vector<int64_t>& attention_weights, int64_t im2col_step,
                                  core::MsDeformAttnParams& p);
// The level geometry's values (on the host) checked by core::ms_deform_attn_check_levels,
// then the output's shape.
Ort::Status ms_deform_attn_output_shape(const core::MsDeformAttnParams& p, const int64_t* spatial_shapes,
                                        const int64_t* level_start_index, std::vector<int64_t>& shape);

// The index tensors are run-time data from the model or its caller: their values are
// checked on the host (Ep::Io) before anything is indexed with them; a bad one is an
// INVALID_ARGUMENT status. ep.run(ctx, p, value, spatial_shapes, level_start_index,
// sampling_locations, attention_weights, out) computes a non-empty output.
template <typename T, typename Ep>
struct MsDeformAttnKernel {
  int64_t im2col_step;
  Ep ep;

  MsDeformAttnKernel(const OrtApi*, const OrtKernelInfo* info) : im2col_step(check_ms_deform_attn_node(info)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& value,
                      const Ort::Custom::Tensor<int64_t>& spatial_shapes,
                      const Ort::Custom::Tensor<int64_t>& level_start_index,
                      const Ort::Custom::Tensor<T>& sampling_locations, const Ort::Custom::Tensor<T>& attention_weights,
                      Ort::Custom::Tensor<T>& output) {
    core::MsDeformAttnParams p;
    if (Ort::Status bad = ms_deform_attn_shapes(value.Shape(), spatial_shapes.Shape(), level_start_index.Shape(),
                                                sampling_locations.Shape(), attention_weights.Shape(), im2col_step, p);
        !bad.IsOK())
      return bad;
    // Shapes are known good: spatial_shapes holds 2*L and level_start_index L values (L >= 1).
    constexpr const char* kCopying = "copying spatial_shapes / level_start_index to the host";
    typename Ep::Io io(ctx, "opforge::ms_deform_attn");
    HostView<int64_t> shapes, starts;
    if (Ort::Status s = io.fetch(spatial_shapes.Data(), static_cast<size_t>(2 * p.levels), kCopying, shapes);
        !s.IsOK())
      return s;
    if (Ort::Status s = io.fetch(level_start_index.Data(), static_cast<size_t>(p.levels), kCopying, starts);
        !s.IsOK())
      return s;
    if (Ort::Status s = io.wait(kCopying); !s.IsOK()) return s;
    std::vector<int64_t> out_shape;
    if (Ort::Status bad = ms_deform_attn_output_shape(p, shapes.data, starts.data, out_shape); !bad.IsOK()) return bad;
    T* out = output.Allocate(out_shape);
    if (out_shape[0] * out_shape[1] * out_shape[2] == 0) return Ort::Status(nullptr);
    return ep.run(ctx, p, value.Data(), spatial_shapes.Data(), level_start_index.Data(), sampling_locations.Data(),
                  attention_weights.Data(), out);
  }
};

// ---- roi_align_rotated ---------------------------------------------------------------

// roi_align_rotated's node attributes (the torch schema's scalar arguments; mmdeploy's
// MMCVRoIAlignRotated has the same), checked at kernel creation, and their check with
// the input shapes (core::roi_align_rotated_check). `op` names the node form in errors.
struct RoiAlignRotatedAttrs {
  std::string op;
  int64_t output_height, output_width, sampling_ratio;
  float spatial_scale;
  bool aligned, clockwise;

  explicit RoiAlignRotatedAttrs(const OrtKernelInfo* info, const char* op_name = "opforge::roi_align_rotated")
      : op(op_name) {
    check_node_arity(info, op_name, {"input", "rois"});
    const auto flag = [&](const char* name) {
      const int64_t v = node_attribute<int64_t>(info, op_name, name);
      if (v != 0 && v != 1) node_error(op + ": attribute " + name + " must be 0 or 1, got " + std::to_string(v));
      return v != 0;
    };
    output_height = node_attribute<int64_t>(info, op_name, "output_height");
    output_width = node_attribute<int64_t>(info, op_name, "output_width");
    spatial_scale = node_attribute<float>(info, op_name, "spatial_scale");
    sampling_ratio = node_attribute<int64_t>(info, op_name, "sampling_ratio");
    aligned = flag("aligned");
    clockwise = flag("clockwise");
    if (std::string err =
            core::roi_align_rotated_check_attrs(output_height, output_width, spatial_scale, sampling_ratio);
        !err.empty())
      node_error(in_op_words(err));
  }

  Ort::Status check(const std::vector<int64_t>& input, const std::vector<int64_t>& rois,
                    core::RoiAlignRotatedParams& p) const {
    const std::string err = core::roi_align_rotated_check(
        input.data(), static_cast<int>(input.size()), rois.data(), static_cast<int>(rois.size()), output_height,
        output_width, spatial_scale, sampling_ratio, aligned, clockwise, p);
    return err.empty() ? Ort::Status(nullptr) : invalid_argument(in_op_words(err));
  }

  // The core's messages name opforge::roi_align_rotated; another node form's name replaces it.
  std::string in_op_words(const std::string& msg) const {
    static const std::string core_name = "opforge::roi_align_rotated";
    return msg.compare(0, core_name.size(), core_name) == 0 ? op + msg.substr(core_name.size()) : msg;
  }
};

// The op's budgets (core/roi_align_rotated.h says why and how large) as session config
// entries a trusted caller sets before registering the library, for every node form of the
// op (opforge's and mmdeploy's). Checked when the library is registered.
inline const ConfigKey roi_align_rotated_max_output_elements_key(core::kRoiAlignRotatedMaxOutputElementsKey,
                                                                 positive_integer_entry);
inline const ConfigKey roi_align_rotated_max_samples_key(core::kRoiAlignRotatedMaxSamplesKey, positive_integer_entry);

// The budgets of the session a kernel is created for (config_entry: only in its constructor).
inline core::RoiAlignRotatedBudget roi_align_rotated_session_budget() {
  core::RoiAlignRotatedBudget b;
  b.max_output_elements = config_integer(core::kRoiAlignRotatedMaxOutputElementsKey, b.max_output_elements);
  b.max_samples = config_integer(core::kRoiAlignRotatedMaxSamplesKey, b.max_samples);
  return b;
}

// opforge's own node form, as the kernel template takes a node form's name (OpName::value).
struct RoiAlignRotatedOp {
  static constexpr const char* value = "opforge::roi_align_rotated";
};

// The kernel of every node form meaning mmcv's roi_align_rotated; OpName::value names it
// in errors. The rois are run-time data: their values are checked on the host (Ep::Io)
// before anything is read with them, in the compute type, with the session's budgets,
// before the output is allocated. ep.run(ctx, op, p, input, rois, host_rois (compute type),
// samples (the call's bilinear samples), out) computes a non-empty output.
template <typename T, typename OpName, typename Ep>
struct RoiAlignRotatedKernel {
  RoiAlignRotatedAttrs attrs;
  core::RoiAlignRotatedBudget budget;
  Ep ep;

  RoiAlignRotatedKernel(const OrtApi*, const OrtKernelInfo* info)
      : attrs(info, OpName::value), budget(roi_align_rotated_session_budget()) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& rois, Ort::Custom::Tensor<T>& output) {
    core::RoiAlignRotatedParams p;
    if (Ort::Status bad = attrs.check(input.Shape(), rois.Shape(), p); !bad.IsOK()) return bad;
    typename Ep::Io io(ctx, OpName::value);
    HostView<T> host;
    const size_t roi_values = static_cast<size_t>(6 * p.rois);
    if (Ort::Status s = io.fetch(rois.Data(), roi_values, "copying rois to the host", host); !s.IsOK()) return s;
    if (Ort::Status s = io.wait("copying rois to the host"); !s.IsOK()) return s;
    const std::vector<compute_t<T>> wide_rois = widened(host.data, roi_values);
    int64_t samples = 0;
    if (std::string err = core::roi_align_rotated_check_rois(p, wide_rois.data(), budget, &samples); !err.empty())
      return invalid_argument(attrs.in_op_words(err));
    int64_t dims[4];
    core::roi_align_rotated_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    if (dims[0] * dims[1] * dims[2] * dims[3] == 0) return Ort::Status(nullptr);
    return ep.run(ctx, OpName::value, p, input.Data(), rois.Data(), wide_rois.data(), samples, out);
  }
};

// ---- opforge::nms_rotated, opforge::batched_nms_rotated ------------------------------

// nms_rotated's / batched_nms_rotated's node check at kernel creation (inputs,
// one output, the iou_threshold attribute); returns iou_threshold.
float check_nms_rotated_node(const OrtKernelInfo* info, bool batched);
// Their input shapes checked by core::nms_rotated_check; labels null unless batched.
Ort::Status nms_rotated_shapes(const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                               const std::vector<int64_t>* labels, float iou_threshold, core::NmsRotatedParams& p);

// Both node forms' run: the shapes checked, boxes, scores (and labels) read on the host
// (Ep::Io) and ordered there (core::nms_rotated_prepare, in float64 geometry), the
// suppression ep.suppress(ctx, p, plan, keep) -> Ort::Status, the kept indices stored.
// L: the labels' type, int64 or a float type (integer values only, checked by the core).
template <typename T, typename L, typename Ep>
Ort::Status nms_rotated_run(Ep& ep, OrtKernelContext* ctx, float iou_threshold, const Ort::Custom::Tensor<T>& boxes,
                            const Ort::Custom::Tensor<T>& scores, const Ort::Custom::Tensor<L>* labels,
                            Ort::Custom::Tensor<int64_t>& keep_out) {
  core::NmsRotatedParams p;
  const std::vector<int64_t> label_shape = labels ? labels->Shape() : std::vector<int64_t>{};
  if (Ort::Status bad = nms_rotated_shapes(boxes.Shape(), scores.Shape(), labels ? &label_shape : nullptr,
                                           iou_threshold, p);
      !bad.IsOK())
    return bad;
  const std::string op = core::nms_rotated_op_name(labels != nullptr);
  typename Ep::Io io(ctx, op.c_str());
  const size_t n = static_cast<size_t>(p.boxes);
  HostView<T> host_boxes, host_scores;
  HostView<L> host_labels;
  if (Ort::Status s = io.fetch(boxes.Data(), 5 * n, "copying boxes to the host", host_boxes); !s.IsOK()) return s;
  if (Ort::Status s = io.fetch(scores.Data(), n, "copying scores to the host", host_scores); !s.IsOK()) return s;
  if (labels)
    if (Ort::Status s = io.fetch(labels->Data(), n, "copying idxs to the host", host_labels); !s.IsOK()) return s;
  if (Ort::Status s = io.wait("synchronising the copies"); !s.IsOK()) return s;
  const int64_t* label_values = nullptr;
  std::vector<int64_t> float_labels;
  if constexpr (std::is_same_v<L, int64_t>) {
    label_values = host_labels.data;
  } else if (labels) {
    const auto wide = widened(host_labels.data, n);  // float32 or double, exactly
    if (std::string err = core::nms_rotated_float_labels(p, wide.data(), float_labels); !err.empty())
      return invalid_argument(err);
    label_values = float_labels.data();
  }
  core::NmsRotatedPlan plan;
  const auto wide_boxes = widened(host_boxes.data, 5 * n);
  const auto wide_scores = widened(host_scores.data, n);
  if (std::string err = core::nms_rotated_prepare(p, wide_boxes.data(), wide_scores.data(), label_values, plan);
      !err.empty())
    return invalid_argument(err);
  std::vector<int64_t> keep;
  if (Ort::Status s = ep.suppress(ctx, p, plan, keep); !s.IsOK()) return s;
  int64_t* out = keep_out.Allocate({static_cast<int64_t>(keep.size())});
  return io.store(keep.data(), keep.size(), out, "copying the kept indices to the device");
}

template <typename T, typename Ep>
struct NmsRotatedKernel {
  float iou_threshold;
  Ep ep;
  NmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info) : iou_threshold(check_nms_rotated_node(info, false)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<int64_t>& keep) {
    return nms_rotated_run<T, int64_t>(ep, ctx, iou_threshold, boxes, scores, nullptr, keep);
  }
};

// L: idxs' element type (int64_t, float, double, Ort::Float16_t or Ort::BFloat16_t).
template <typename T, typename L, typename Ep>
struct BatchedNmsRotatedKernel {
  float iou_threshold;
  Ep ep;
  BatchedNmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info)
      : iou_threshold(check_nms_rotated_node(info, true)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      const Ort::Custom::Tensor<L>& idxs, Ort::Custom::Tensor<int64_t>& keep) {
    return nms_rotated_run(ep, ctx, iou_threshold, boxes, scores, &idxs, keep);
  }
};

// Both node forms for one EP: nms_rotated per float type; batched_nms_rotated per float type of
// boxes and scores times idxs' five types (int64 and the float types, as the schema's).
template <typename Ep>
void append_nms_rotated_kernels(std::vector<LiteOpPtr>& ops, const char* ep) {
  append_float_kernels<NmsRotatedKernel, Ep>(ops, "nms_rotated", ep);
  for_each_float_type([&](auto box_tag) {
    using T = decltype(box_tag);
    ops.emplace_back(
        Ort::Custom::CreateLiteCustomOp<BatchedNmsRotatedKernel<T, int64_t, Ep>>("batched_nms_rotated", ep));
    for_each_float_type([&](auto label_tag) {
      ops.emplace_back(Ort::Custom::CreateLiteCustomOp<BatchedNmsRotatedKernel<T, decltype(label_tag), Ep>>(
          "batched_nms_rotated", ep));
    });
  });
}

}  // namespace ort
}  // namespace opforge
