// mmdeploy's two class-wise NMS node forms (core/nms_multiclass.h), as mmdeploy's
// exporters write them (mmdeploy/mmcv/ops/nms_rotated.py, nms_match.py):
//
//   mmdeploy::NMSRotated  inputs  (boxes [N,B,5] (cx, cy, w, h, angle), scores [N,C,B])
//                         attrs   iou_threshold, score_threshold (FLOAT, required)
//                         output  int64 [K,3] rows (batch, class, box)
//   mmdeploy::NMSMatch    inputs  (boxes [N,B,4] (x1, y1, x2, y2), scores [N,C,B],
//                                  iou_threshold [1], score_threshold [1]: float32, or
//                                  the boxes' type in a float16-converted model)
//                         output  int64 [K,4] rows (batch, class, leader, member)
//
// No rows is a (0, 3) / (0, 4) output. The (image, class) pairs run in parallel on
// ORT's intra-op pool (one pair: its suppression does); rows come out in pair order.
// 16-bit boxes and scores are widened to float32 exactly.
#include <string>
#include <vector>

#include "core/nms_multiclass.h"
#include "mmdeploy_ops.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

constexpr const char* kNmsRotatedOp = "mmdeploy::NMSRotated";
constexpr const char* kNmsMatchOp = "mmdeploy::NMSMatch";

// Runs pair(n, c, inner_parallel, rows) for every (image, class) pair and writes the
// rows (width columns) to the output.
template <typename Pair>
Ort::Status run_pairs(OrtKernelContext* ctx, const core::NmsMulticlassParams& p, int64_t width, const Pair& pair,
                      Ort::Custom::Tensor<int64_t>& output) {
  const int64_t pairs = p.pairs();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(pairs));
  std::vector<std::string> errors(static_cast<size_t>(pairs));
  const auto serial = [](int64_t total, int64_t, const auto& body) { body(int64_t(0), total); };
  const auto pooled = [ctx](int64_t total, int64_t grain, const auto& body) { parallel_for(ctx, total, grain, body); };
  if (pairs == 1) {
    errors[0] = pair(0, 0, pooled, rows[0]);
  } else {
    parallel_for(ctx, pairs, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) errors[k] = pair(k / p.classes, k % p.classes, serial, rows[k]);
    });
  }
  size_t total = 0;
  for (int64_t k = 0; k < pairs; ++k) {
    if (!errors[k].empty()) return invalid_argument(errors[k]);
    total += rows[k].size();
  }
  int64_t* out = output.Allocate({static_cast<int64_t>(total) / width, width});
  for (const auto& r : rows) out = std::copy(r.begin(), r.end(), out);
  return Ort::Status(nullptr);
}

struct NmsRotatedAttrs {
  float iou_threshold, score_threshold;
  explicit NmsRotatedAttrs(const OrtKernelInfo* info) {
    check_node_arity(info, kNmsRotatedOp, {"boxes", "scores"});
    iou_threshold = node_attribute<float>(info, kNmsRotatedOp, "iou_threshold");
    score_threshold = node_attribute<float>(info, kNmsRotatedOp, "score_threshold");
    core::NmsMulticlassParams unused;
    const int64_t boxes[3] = {0, 0, 5}, scores[3] = {0, 0, 0};
    if (std::string err = core::nms_multiclass_check(kNmsRotatedOp, boxes, 3, scores, 3, 5, iou_threshold,
                                                     score_threshold, unused);
        !err.empty())
      node_error(err);
  }
};

template <typename T>
struct NmsRotatedKernel : NmsRotatedAttrs {
  NmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info) : NmsRotatedAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<int64_t>& output) {
    const std::vector<int64_t> bs = boxes.Shape(), ss = scores.Shape();
    core::NmsMulticlassParams p;
    if (std::string err = core::nms_multiclass_check(kNmsRotatedOp, bs.data(), static_cast<int>(bs.size()), ss.data(),
                                                     static_cast<int>(ss.size()), 5, iou_threshold, score_threshold, p);
        !err.empty())
      return invalid_argument(err);
    const auto wide_boxes = widened(boxes.Data(), static_cast<size_t>(p.batch * p.boxes * 5));
    const auto wide_scores = widened(scores.Data(), static_cast<size_t>(p.pairs() * p.boxes));
    return run_pairs(
        ctx, p, 3,
        [&](int64_t n, int64_t c, const auto& inner, std::vector<int64_t>& rows) {
          return core::nms_rotated_pair(kNmsRotatedOp, p, wide_boxes.data() + n * p.boxes * 5,
                                        wide_scores.data() + (n * p.classes + c) * p.boxes, n, c, inner, rows);
        },
        output);
  }
};

// A threshold input: one finite value (shape [1] as mmdeploy writes it, or a scalar).
template <typename U>
std::string threshold_value(const Ort::Custom::Tensor<U>& t, const char* name, double* value) {
  if (t.NumberOfElement() != 1)
    return std::string(kNmsMatchOp) + ": " + name + " must hold one value (shape [1]), got shape " +
           shape_str(t.Shape());
  *value = static_cast<double>(core::load(*core_ptr(t.Data())));
  return "";
}

template <typename T, typename U>
struct NmsMatchKernel {
  NmsMatchKernel(const OrtApi*, const OrtKernelInfo* info) {
    check_node_arity(info, kNmsMatchOp, {"boxes", "scores", "iou_threshold", "score_threshold"});
  }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      const Ort::Custom::Tensor<U>& iou_threshold, const Ort::Custom::Tensor<U>& score_threshold,
                      Ort::Custom::Tensor<int64_t>& output) {
    double iou = 0, score = 0;
    if (std::string err = threshold_value(iou_threshold, "iou_threshold", &iou); !err.empty())
      return invalid_argument(err);
    if (std::string err = threshold_value(score_threshold, "score_threshold", &score); !err.empty())
      return invalid_argument(err);
    const std::vector<int64_t> bs = boxes.Shape(), ss = scores.Shape();
    core::NmsMulticlassParams p;
    if (std::string err = core::nms_multiclass_check(kNmsMatchOp, bs.data(), static_cast<int>(bs.size()), ss.data(),
                                                     static_cast<int>(ss.size()), 4, iou, score, p);
        !err.empty())
      return invalid_argument(err);
    const auto wide_boxes = widened(boxes.Data(), static_cast<size_t>(p.batch * p.boxes * 4));
    const auto wide_scores = widened(scores.Data(), static_cast<size_t>(p.pairs() * p.boxes));
    return run_pairs(
        ctx, p, 4,
        [&](int64_t n, int64_t c, const auto&, std::vector<int64_t>& rows) {
          return core::nms_match_pair(kNmsMatchOp, p, wide_boxes.data() + n * p.boxes * 4,
                                      wide_scores.data() + (n * p.classes + c) * p.boxes, n, c, rows);
        },
        output);
  }
};

}  // namespace

static void append_nms_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsRotatedKernel<T>>(kNmsRotated, kCpuEp));
    // Thresholds are float32 Constants; a float16 conversion may give them the boxes' type.
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsMatchKernel<T, float>>(kNmsMatch, kCpuEp));
    if constexpr (!std::is_same_v<T, float>)
      ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsMatchKernel<T, T>>(kNmsMatch, kCpuEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_nms_ops);
