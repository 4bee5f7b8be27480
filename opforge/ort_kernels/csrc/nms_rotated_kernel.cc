// ORT kernels of opforge::nms_rotated (inputs boxes, scores) and
// opforge::batched_nms_rotated (inputs boxes, scores, idxs) in domain
// "opforge", version 1: float attribute iou_threshold, one int64 output
// "keep" of data-dependent length — the torch schemas one to one. Same core
// as the torch extension (core/nms_rotated.h), the later-box tests of each
// kept box parallel on ORT's intra-op pool. Boxes and scores of the 16-bit
// types are widened to float32 (exactly); the IoU is float64 for every type.
#include <algorithm>
#include <vector>

#include "core/nms_rotated.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

float check_nms_rotated_node(const OrtKernelInfo* info, bool batched) {
  const std::string op = core::nms_rotated_op_name(batched);
  if (batched)
    check_node_arity(info, op.c_str(), {"boxes", "scores", "idxs"});
  else
    check_node_arity(info, op.c_str(), {"boxes", "scores"});
  const float iou_threshold = node_attribute<float>(info, op.c_str(), "iou_threshold");
  if (std::string err = core::nms_rotated_check_threshold(batched, iou_threshold); !err.empty()) node_error(err);
  return iou_threshold;
}

Ort::Status nms_rotated_shapes(const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores,
                               const std::vector<int64_t>* labels, float iou_threshold, core::NmsRotatedParams& p) {
  const std::string err = core::nms_rotated_check(
      boxes.data(), static_cast<int>(boxes.size()), scores.data(), static_cast<int>(scores.size()),
      labels ? labels->data() : nullptr, labels ? static_cast<int>(labels->size()) : -1, iou_threshold, p);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
}

namespace {

// The CPU EP's part: the core's suppression, the later-box tests of each kept box
// parallel on ORT's intra-op pool.
struct NmsRotatedCpu {
  using Io = HostIo;

  Ort::Status suppress(OrtKernelContext* ctx, const core::NmsRotatedParams& p, const core::NmsRotatedPlan& plan,
                       std::vector<int64_t>& keep) const {
    const auto parallel = [ctx](int64_t total, int64_t grain, const auto& body) {
      parallel_for(ctx, total, grain, body);
    };
    keep = core::nms_rotated_suppress(p, plan, parallel);
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_nms_rotated_ops(std::vector<LiteOpPtr>& ops) {
  append_nms_rotated_kernels<NmsRotatedCpu>(ops, kCpuEp);
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_nms_rotated_ops);
