// CPU kernels of opforge::nms_rotated and opforge::batched_nms_rotated: the
// shared core (core/nms_rotated.h), its later-box tests on ATen's intra-op
// pool. The schemas of the op family live here.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "nms_rotated_args.h"

namespace opforge {
namespace {

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor* idxs, double iou_threshold) {
  const core::NmsRotatedParams p = nms_rotated_check_args(boxes, scores, idxs, iou_threshold);
  const core::NmsRotatedPlan plan = nms_rotated_host_plan(p, boxes, scores, idxs);
  const auto parallel = [](int64_t total, int64_t grain, const auto& body) {
    at::parallel_for(0, total, grain, body);
  };
  return nms_rotated_keep_tensor(core::nms_rotated_suppress(p, plan, parallel), boxes.device());
}

}  // namespace

at::Tensor nms_rotated_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  return nms_cpu(boxes, scores, nullptr, iou_threshold);
}

at::Tensor batched_nms_rotated_cpu(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                                   double iou_threshold) {
  return nms_cpu(boxes, scores, &idxs, iou_threshold);
}

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def("nms_rotated(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  m.def("batched_nms_rotated(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("nms_rotated", &nms_rotated_cpu);
  m.impl("batched_nms_rotated", &batched_nms_rotated_cpu);
}

}  // namespace opforge
