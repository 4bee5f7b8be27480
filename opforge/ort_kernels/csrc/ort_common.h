// Declarations shared by opforge's own ORT kernels (CPU and CUDA EP); the
// generic glue is the public opforge/ort_op.h.
#pragma once

#include "opforge/ort_op.h"  // the public ORT glue every opforge-built library uses

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

// my_add's node check (kernel creation) and shape checks + broadcasting plan (CPU and CUDA kernels).
void check_my_add_node(const OrtKernelInfo* info);
Ort::Status my_add_plan(const std::vector<int64_t>& shape_a, const std::vector<int64_t>& shape_b,
                        std::vector<int64_t>& out_shape, core::BinaryPlan& plan);

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

// ms_deform_attn's node check at kernel creation (inputs, one output, the
// im2col_step attribute); returns im2col_step.
int64_t check_ms_deform_attn_node(const OrtKernelInfo* info);
// ms_deform_attn's input shapes checked by core::ms_deform_attn_check (CPU and CUDA EP kernels): fills p.
Ort::Status ms_deform_attn_shapes(const std::vector<int64_t>& value, const std::vector<int64_t>& spatial_shapes,
                                  const std::vector<int64_t>& level_start_index,
                                  const std::vector<int64_t>& sampling_locations,
                                  const std::vector<int64_t>& attention_weights, int64_t im2col_step,
                                  core::MsDeformAttnParams& p);

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

// nms_rotated's / batched_nms_rotated's node check at kernel creation (inputs,
// one output, the iou_threshold attribute); returns iou_threshold.
float check_nms_rotated_node(const OrtKernelInfo* info, bool batched);
// Their input shapes checked by core::nms_rotated_check; labels null unless batched.
Ort::Status nms_rotated_shapes(const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                               const std::vector<int64_t>* labels, float iou_threshold, core::NmsRotatedParams& p);

// core::nms_rotated_prepare over host data of storage type T (CPU and CUDA EP kernels).
template <typename T>
std::string nms_rotated_host_plan(const core::NmsRotatedParams& p, const T* boxes, const T* scores,
                                  const int64_t* labels, core::NmsRotatedPlan& plan) {
  const auto wide_boxes = widened(boxes, static_cast<size_t>(5 * p.boxes));
  const auto wide_scores = widened(scores, static_cast<size_t>(p.boxes));
  return core::nms_rotated_prepare(p, wide_boxes.data(), wide_scores.data(), labels, plan);
}

// The lite-op kernels of nms_rotated and batched_nms_rotated for one EP: Run is the EP's
// computation, Run(ctx, iou_threshold, boxes, scores, labels or null, keep) -> Ort::Status.
template <typename T, Ort::Status (*Run)(OrtKernelContext*, float, const Ort::Custom::Tensor<T>&,
                                          const Ort::Custom::Tensor<T>&, const Ort::Custom::Tensor<int64_t>*,
                                          Ort::Custom::Tensor<int64_t>&)>
struct NmsRotatedKernel {
  float iou_threshold;
  NmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info) : iou_threshold(check_nms_rotated_node(info, false)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<int64_t>& keep) {
    return Run(ctx, iou_threshold, boxes, scores, nullptr, keep);
  }
};

template <typename T, Ort::Status (*Run)(OrtKernelContext*, float, const Ort::Custom::Tensor<T>&,
                                          const Ort::Custom::Tensor<T>&, const Ort::Custom::Tensor<int64_t>*,
                                          Ort::Custom::Tensor<int64_t>&)>
struct BatchedNmsRotatedKernel {
  float iou_threshold;
  BatchedNmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info)
      : iou_threshold(check_nms_rotated_node(info, true)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      const Ort::Custom::Tensor<int64_t>& idxs, Ort::Custom::Tensor<int64_t>& keep) {
    return Run(ctx, iou_threshold, boxes, scores, &idxs, keep);
  }
};

}  // namespace ort
}  // namespace opforge
