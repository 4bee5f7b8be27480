// Argument checks and the host-side plan of opforge::nms_rotated and
// opforge::batched_nms_rotated, shared by their CPU and CUDA kernels: shapes
// and the threshold in the core (core::nms_rotated_check, also used by the ORT
// kernels and the fake impl), dtypes and devices here, then the values, the
// visiting order and the boxes' float64 geometry (core::nms_rotated_prepare)
// on host copies. Raised as RuntimeError (check) with the core's message. idxs
// is int64 or float (integer values only, core::nms_rotated_float_labels).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/nms_rotated.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::NmsRotatedParams nms_rotated_check_args(const Tensor& boxes, const Tensor& scores, const Tensor* idxs,
                                                     double iou_threshold) {
  core::NmsRotatedParams p;
  const IntList bs = boxes.sizes(), ss = scores.sizes();
  const IntList ls = idxs ? idxs->sizes() : IntList();
  check_rule(core::nms_rotated_check(bs.data(), static_cast<int>(boxes.dim()), ss.data(),
                                     static_cast<int>(scores.dim()), idxs ? ls.data() : nullptr,
                                     idxs ? static_cast<int>(idxs->dim()) : -1, static_cast<float>(iou_threshold), p));
  const std::string op = core::nms_rotated_op_name(idxs != nullptr);
  const ScalarType t = boxes.scalar_type();
  check(is_supported_float(t), op, ": boxes has dtype ", dtype_name(t),
        "; supported dtypes are float32, float64, float16 and bfloat16");
  check(scores.scalar_type() == t, op, ": scores has dtype ", dtype_name(scores.scalar_type()),
        " but boxes has dtype ", dtype_name(t), "; they must match");
  // Float idxs are taken as they are (mmcv's labels), their values checked by the core: a cast
  // before the op would turn 1e19 or inf into INT64_MIN silently, in torch and in an exported graph.
  check(idxs == nullptr || idxs->scalar_type() == ScalarType::Long || is_supported_float(idxs->scalar_type()), op,
        ": idxs has dtype ", dtype_name(idxs ? idxs->scalar_type() : ScalarType::Long),
        " but must be int64 (torch.long) or a float dtype holding integers");
  check_same_device(op.c_str(), {{"boxes", &boxes}, {"scores", &scores}, {"idxs", idxs}});
  return p;
}

// `t` on the host, contiguous, in `dtype` (one copy at most).
inline Tensor nms_rotated_host_copy(const Tensor& t, ScalarType dtype) {
  const torch::stable::Device cpu(torch::headeronly::DeviceType::CPU);
  return torch::stable::contiguous(torch::stable::to(t, dtype, std::nullopt, cpu));
}

// The plan (core/nms_rotated.h) from host copies of the inputs, in float64
// for double inputs and float32 otherwise (16-bit values widen exactly); float
// idxs likewise, checked and converted to int64 by the core.
inline core::NmsRotatedPlan nms_rotated_host_plan(const core::NmsRotatedParams& p, const Tensor& boxes,
                                                  const Tensor& scores, const Tensor* idxs) {
  const ScalarType ct = compute_type(boxes.scalar_type());
  const Tensor b = nms_rotated_host_copy(boxes, ct), s = nms_rotated_host_copy(scores, ct);
  Tensor labels;
  std::vector<int64_t> float_labels;
  const int64_t* l = nullptr;
  if (idxs != nullptr && idxs->scalar_type() == ScalarType::Long) {
    labels = nms_rotated_host_copy(*idxs, ScalarType::Long);
    l = data<int64_t>(labels);
  } else if (idxs != nullptr) {
    const ScalarType lt = compute_type(idxs->scalar_type());
    labels = nms_rotated_host_copy(*idxs, lt);
    check_rule(lt == ScalarType::Double ? core::nms_rotated_float_labels(p, data<double>(labels), float_labels)
                                        : core::nms_rotated_float_labels(p, data<float>(labels), float_labels));
    l = float_labels.data();
  }
  core::NmsRotatedPlan plan;
  check_rule(ct == ScalarType::Double
                 ? core::nms_rotated_prepare<double>(p, data<double>(b), data<double>(s), l, plan)
                 : core::nms_rotated_prepare<float>(p, data<float>(b), data<float>(s), l, plan));
  return plan;
}

// The kept indices as an int64 tensor on `like`'s device.
inline Tensor nms_rotated_keep_tensor(const std::vector<int64_t>& keep, const Tensor& like) {
  const std::vector<int64_t> shape{static_cast<int64_t>(keep.size())};
  if (like.is_cpu()) {
    Tensor out = empty_tensor(shape, ScalarType::Long, like);
    std::copy(keep.begin(), keep.end(), mutable_data<int64_t>(out));
    return out;
  }
  Tensor out = torch::stable::empty(IntList(shape), ScalarType::Long, std::nullopt,
                                    torch::stable::Device(torch::headeronly::DeviceType::CPU));
  std::copy(keep.begin(), keep.end(), mutable_data<int64_t>(out));
  return torch::stable::to(out, like.device());
}

}  // namespace opforge
