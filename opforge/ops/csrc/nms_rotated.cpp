// CPU kernels of opforge::nms_rotated and opforge::batched_nms_rotated: the
// shared core (core/nms_rotated.h), its later-box tests on torch's intra-op
// pool. The schemas of the op family live here.
#include "nms_rotated_args.h"
#include "opforge/torch_c_shim.h"
#include "opforge/torch_op.h"

namespace opforge {
namespace {

Tensor nms_cpu(const Tensor& boxes, const Tensor& scores, const Tensor* idxs, double iou_threshold) {
  const core::NmsRotatedParams p = nms_rotated_check_args(boxes, scores, idxs, iou_threshold);
  const core::NmsRotatedPlan plan = nms_rotated_host_plan(p, boxes, scores, idxs);
  return nms_rotated_keep_tensor(core::nms_rotated_suppress(p, plan, ParallelFor{}), boxes);
}

}  // namespace

Tensor nms_rotated_cpu(const Tensor& boxes, const Tensor& scores, double iou_threshold) {
  return nms_cpu(boxes, scores, nullptr, iou_threshold);
}

Tensor batched_nms_rotated_cpu(const Tensor& boxes, const Tensor& scores, const Tensor& idxs, double iou_threshold) {
  return nms_cpu(boxes, scores, &idxs, iou_threshold);
}

STABLE_TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def("nms_rotated(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  m.def("batched_nms_rotated(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("nms_rotated", TORCH_BOX(&nms_rotated_cpu));
  m.impl("batched_nms_rotated", TORCH_BOX(&batched_nms_rotated_cpu));
}

// AOTInductor's C shims (opforge/torch_c_shim.h): the CPU kernels, called by a .pt2 directly.
OPFORGE_AOTI_C_SHIM(opforge, cpu, nms_rotated,
                    (AtenTensorHandle boxes, AtenTensorHandle scores, double iou_threshold, AtenTensorHandle* ret0)) {
  const char* op = "opforge::nms_rotated";
  return c_shim::give(
      nms_rotated_cpu(c_shim::borrow_cpu(boxes, op, "boxes"), c_shim::borrow_cpu(scores, op, "scores"), iou_threshold),
      ret0);
}

OPFORGE_AOTI_C_SHIM(opforge, cpu, batched_nms_rotated,
                    (AtenTensorHandle boxes, AtenTensorHandle scores, AtenTensorHandle idxs, double iou_threshold,
                     AtenTensorHandle* ret0)) {
  const char* op = "opforge::batched_nms_rotated";
  return c_shim::give(batched_nms_rotated_cpu(c_shim::borrow_cpu(boxes, op, "boxes"),
                                              c_shim::borrow_cpu(scores, op, "scores"),
                                              c_shim::borrow_cpu(idxs, op, "idxs"), iou_threshold),
                      ret0);
}

}  // namespace opforge
