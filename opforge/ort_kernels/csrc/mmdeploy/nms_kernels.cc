// The CPU EP kernels of mmdeploy::NMSRotated and mmdeploy::NMSMatch (node forms: nms.h).
#include <algorithm>
#include <string>
#include <vector>

#include "nms.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

// The rows (width columns) as the node's int64 output.
void write_rows(const std::vector<int64_t>& rows, int64_t width, Ort::Custom::Tensor<int64_t>& output) {
  int64_t* out = output.Allocate({static_cast<int64_t>(rows.size()) / width, width});
  std::copy(rows.begin(), rows.end(), out);
}

template <typename T>
struct NmsRotatedKernel : NmsRotatedAttrs {
  NmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info) : NmsRotatedAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<int64_t>& output) {
    core::NmsMulticlassParams p;
    if (Ort::Status bad = check(boxes.Shape(), scores.Shape(), p); !bad.IsOK()) return bad;
    std::vector<int64_t> rows;
    if (Ort::Status bad = nms_rotated_rows(ctx, p, boxes.Data(), scores.Data(), rows); !bad.IsOK()) return bad;
    write_rows(rows, 3, output);
    return Ort::Status(nullptr);
  }
};

template <typename T, typename U>
struct NmsMatchKernel {
  NmsMatchKernel(const OrtApi*, const OrtKernelInfo* info) { check_nms_match_node(info); }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      const Ort::Custom::Tensor<U>& iou_threshold, const Ort::Custom::Tensor<U>& score_threshold,
                      Ort::Custom::Tensor<int64_t>& output) {
    if (Ort::Status bad = check_nms_match_thresholds(iou_threshold, score_threshold); !bad.IsOK()) return bad;
    const double iou = core::load(*core_ptr(iou_threshold.Data()));
    const double score = core::load(*core_ptr(score_threshold.Data()));
    core::NmsMulticlassParams p;
    if (Ort::Status bad = check_nms_match(boxes.Shape(), scores.Shape(), iou, score, p); !bad.IsOK()) return bad;
    std::vector<int64_t> rows;
    if (Ort::Status bad = nms_match_rows(ctx, p, boxes.Data(), scores.Data(), rows); !bad.IsOK()) return bad;
    write_rows(rows, 4, output);
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_nms_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsRotatedKernel<T>>(kNmsRotated, kCpuEp));
  });
  append_nms_match_kernels<NmsMatchKernel>(ops, kCpuEp);
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_nms_ops);
