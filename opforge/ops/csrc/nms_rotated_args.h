// Argument checks and the host-side plan of opforge::nms_rotated and
// opforge::batched_nms_rotated, shared by their CPU and CUDA kernels: shapes
// and the threshold in the core (core::nms_rotated_check, also used by the ORT
// kernels and the fake impl), dtypes and devices here, then the values, the
// visiting order and the boxes' float64 geometry (core::nms_rotated_prepare)
// on host copies. Raised as RuntimeError (TORCH_CHECK) with the core's message.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/nms_rotated.h"
#include "opforge/torch_op.h"

namespace opforge {

inline core::NmsRotatedParams nms_rotated_check_args(const at::Tensor& boxes, const at::Tensor& scores,
                                                     const at::Tensor* idxs, double iou_threshold) {
  core::NmsRotatedParams p;
  const std::string err = core::nms_rotated_check(
      boxes.sizes().data(), static_cast<int>(boxes.dim()), scores.sizes().data(), static_cast<int>(scores.dim()),
      idxs ? idxs->sizes().data() : nullptr, idxs ? static_cast<int>(idxs->dim()) : -1,
      static_cast<float>(iou_threshold), p);
  TORCH_CHECK(err.empty(), err);
  const std::string op = core::nms_rotated_op_name(idxs != nullptr);
  const at::ScalarType t = boxes.scalar_type();
  TORCH_CHECK(is_supported_float(t), op, ": boxes has dtype ", t,
              "; supported dtypes are float32, float64, float16 and bfloat16");
  TORCH_CHECK(scores.scalar_type() == t, op, ": scores has dtype ", scores.scalar_type(), " but boxes has dtype ", t,
              "; they must match");
  TORCH_CHECK(idxs == nullptr || idxs->scalar_type() == at::kLong, op, ": idxs has dtype ",
              idxs ? idxs->scalar_type() : at::kLong, " but must be int64 (torch.long)");
  const at::Tensor none;
  check_same_device(op.c_str(), {{"boxes", &boxes}, {"scores", &scores}, {"idxs", idxs ? idxs : &none}});
  return p;
}

// The plan (core/nms_rotated.h) from host copies of the inputs, in float64
// for double inputs and float32 otherwise (16-bit values widen exactly).
inline core::NmsRotatedPlan nms_rotated_host_plan(const core::NmsRotatedParams& p, const at::Tensor& boxes,
                                                  const at::Tensor& scores, const at::Tensor* idxs) {
  const at::ScalarType ct = boxes.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor b = boxes.to(at::kCPU, ct).contiguous(), s = scores.to(at::kCPU, ct).contiguous();
  at::Tensor labels;
  if (idxs != nullptr) labels = idxs->to(at::kCPU).contiguous();
  const int64_t* l = idxs ? labels.const_data_ptr<int64_t>() : nullptr;
  core::NmsRotatedPlan plan;
  const std::string err =
      ct == at::kDouble
          ? core::nms_rotated_prepare<double>(p, b.const_data_ptr<double>(), s.const_data_ptr<double>(), l, plan)
          : core::nms_rotated_prepare<float>(p, b.const_data_ptr<float>(), s.const_data_ptr<float>(), l, plan);
  TORCH_CHECK(err.empty(), err);
  return plan;
}

// The kept indices as an int64 tensor on `device`.
inline at::Tensor nms_rotated_keep_tensor(const std::vector<int64_t>& keep, at::Device device) {
  at::Tensor out = at::empty({static_cast<int64_t>(keep.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(keep.begin(), keep.end(), out.mutable_data_ptr<int64_t>());
  return out.to(device);
}

}  // namespace opforge
