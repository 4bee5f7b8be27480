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
// No rows is a (0, 3) / (0, 4) output. Both EPs run the same kernels: the rows are
// computed on the host from host copies of boxes and scores (the Io: HostIo on the
// CPU EP; CudaHostIo copies them there and the rows back), the (image, class) pairs
// in parallel on ORT's intra-op pool (a single pair: its suppression is); rows come
// out in pair order. 16-bit boxes and scores are widened exactly.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/nms_multiclass.h"
#include "mmdeploy_ops.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

// Tasks the (image, class) pairs are split into, at most: each task keeps its rows and
// its first error, so the memory besides the rows does not grow with the pair count.
inline constexpr int64_t kNmsMaxPairTasks = 256;

// Runs pair(n, c, inner_parallel, rows) for every (image, class) pair; the rows of all
// pairs, in pair order, into `rows`. "" or the first pair's error. No boxes: no rows,
// and nothing is visited (N x C may be huge when B is 0).
template <typename Pair>
std::string run_pairs(OrtKernelContext* ctx, const core::NmsMulticlassParams& p, const Pair& pair,
                      std::vector<int64_t>& rows) {
  rows.clear();
  const int64_t pairs = p.pairs();
  if (pairs == 0 || p.boxes == 0) return "";
  const auto serial = [](int64_t total, int64_t, const auto& body) { body(int64_t(0), total); };
  const auto pooled = [ctx](int64_t total, int64_t grain, const auto& body) { parallel_for(ctx, total, grain, body); };
  if (pairs == 1) return pair(0, 0, pooled, rows);
  const int64_t grain = (pairs + kNmsMaxPairTasks - 1) / kNmsMaxPairTasks;
  const int64_t tasks = (pairs + grain - 1) / grain;
  std::vector<std::vector<int64_t>> task_rows(static_cast<size_t>(tasks));
  std::vector<std::string> task_errors(static_cast<size_t>(tasks));
  parallel_for(ctx, pairs, grain, [&](int64_t begin, int64_t end) {
    const int64_t t = begin / grain;
    for (int64_t k = begin; k < end && task_errors[t].empty(); ++k)
      task_errors[t] = pair(k / p.classes, k % p.classes, serial, task_rows[t]);
  });
  for (int64_t t = 0; t < tasks; ++t) {
    if (!task_errors[t].empty()) return task_errors[t];
    rows.insert(rows.end(), task_rows[t].begin(), task_rows[t].end());
  }
  return "";
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

  Ort::Status check(const std::vector<int64_t>& bs, const std::vector<int64_t>& ss, core::NmsMulticlassParams& p) const {
    const std::string err = core::nms_multiclass_check(kNmsRotatedOp, bs.data(), static_cast<int>(bs.size()), ss.data(),
                                                       static_cast<int>(ss.size()), 5, iou_threshold, score_threshold, p);
    return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
  }
};

// NMSRotated's rows (flattened, 3 per row) from host boxes and scores of storage type T.
template <typename T>
Ort::Status nms_rotated_rows(OrtKernelContext* ctx, const core::NmsMulticlassParams& p, const T* boxes,
                             const T* scores, std::vector<int64_t>& rows) {
  const auto wide_boxes = widened(boxes, static_cast<size_t>(p.batch * p.boxes * 5));
  const auto wide_scores = widened(scores, static_cast<size_t>(p.pairs() * p.boxes));
  const std::string err = run_pairs(
      ctx, p,
      [&](int64_t n, int64_t c, const auto& inner, std::vector<int64_t>& out) {
        return core::nms_rotated_pair(kNmsRotatedOp, p, wide_boxes.data() + n * p.boxes * 5,
                                      wide_scores.data() + (n * p.classes + c) * p.boxes, n, c, inner, out);
      },
      rows);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
}

inline void check_nms_match_node(const OrtKernelInfo* info) {
  check_node_arity(info, kNmsMatchOp, {"boxes", "scores", "iou_threshold", "score_threshold"});
}

// The threshold inputs hold one value each (shape [1] as mmdeploy writes them, or scalars).
template <typename U>
Ort::Status check_nms_match_thresholds(const Ort::Custom::Tensor<U>& iou, const Ort::Custom::Tensor<U>& score) {
  for (const auto* t : {&iou, &score})
    if (t->NumberOfElement() != 1)
      return invalid_argument(std::string(kNmsMatchOp) + ": " + (t == &iou ? "iou_threshold" : "score_threshold") +
                              " must hold one value (shape [1]), got shape " + shape_str(t->Shape()));
  return Ort::Status(nullptr);
}

// NMSMatch's shapes and thresholds checked into p.
inline Ort::Status check_nms_match(const std::vector<int64_t>& bs, const std::vector<int64_t>& ss, double iou,
                                   double score, core::NmsMulticlassParams& p) {
  const std::string err = core::nms_multiclass_check(kNmsMatchOp, bs.data(), static_cast<int>(bs.size()), ss.data(),
                                                     static_cast<int>(ss.size()), 4, iou, score, p);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
}

// NMSMatch's rows (flattened, 4 per row) from host boxes and scores of storage type T.
template <typename T>
Ort::Status nms_match_rows(OrtKernelContext* ctx, const core::NmsMulticlassParams& p, const T* boxes, const T* scores,
                           std::vector<int64_t>& rows) {
  const auto wide_boxes = widened(boxes, static_cast<size_t>(p.batch * p.boxes * 4));
  const auto wide_scores = widened(scores, static_cast<size_t>(p.pairs() * p.boxes));
  const std::string err = run_pairs(
      ctx, p,
      [&](int64_t n, int64_t c, const auto&, std::vector<int64_t>& out) {
        return core::nms_match_pair(kNmsMatchOp, p, wide_boxes.data() + n * p.boxes * 4,
                                    wide_scores.data() + (n * p.classes + c) * p.boxes, n, c, out);
      },
      rows);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
}

// Boxes (box_width values each) and scores of checked shapes on the host.
template <typename T, typename Io>
Ort::Status fetch_boxes_scores(Io& io, const core::NmsMulticlassParams& p, int64_t box_width,
                               const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                               HostView<T>& host_boxes, HostView<T>& host_scores) {
  if (Ort::Status s = io.fetch(boxes.Data(), static_cast<size_t>(p.batch * p.boxes * box_width),
                               "copying boxes to the host", host_boxes);
      !s.IsOK())
    return s;
  if (Ort::Status s = io.fetch(scores.Data(), static_cast<size_t>(p.pairs() * p.boxes), "copying scores to the host",
                               host_scores);
      !s.IsOK())
    return s;
  return io.wait("synchronising the copies");
}

// The rows (width columns) as the node's int64 output.
template <typename Io>
Ort::Status write_rows(Io& io, const std::vector<int64_t>& rows, int64_t width, Ort::Custom::Tensor<int64_t>& output) {
  int64_t* out = output.Allocate({static_cast<int64_t>(rows.size()) / width, width});
  return io.store(rows.data(), rows.size(), out, "copying the rows to the device");
}

// NMSRotated's kernel (named apart from opforge::ort::NmsRotatedKernel, opforge's own node form).
template <typename T, typename Io>
struct MmdeployNmsRotatedKernel : NmsRotatedAttrs {
  MmdeployNmsRotatedKernel(const OrtApi*, const OrtKernelInfo* info) : NmsRotatedAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<int64_t>& output) {
    core::NmsMulticlassParams p;
    if (Ort::Status bad = check(boxes.Shape(), scores.Shape(), p); !bad.IsOK()) return bad;
    Io io(ctx, kNmsRotatedOp);
    HostView<T> host_boxes, host_scores;
    if (Ort::Status s = fetch_boxes_scores(io, p, 5, boxes, scores, host_boxes, host_scores); !s.IsOK()) return s;
    std::vector<int64_t> rows;
    if (Ort::Status bad = nms_rotated_rows(ctx, p, host_boxes.data, host_scores.data, rows); !bad.IsOK()) return bad;
    return write_rows(io, rows, 3, output);
  }
};

// NMSMatch's kernel; U: the thresholds' type.
template <typename T, typename U, typename Io>
struct NmsMatchKernel {
  NmsMatchKernel(const OrtApi*, const OrtKernelInfo* info) { check_nms_match_node(info); }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      const Ort::Custom::Tensor<U>& iou_threshold, const Ort::Custom::Tensor<U>& score_threshold,
                      Ort::Custom::Tensor<int64_t>& output) {
    if (Ort::Status bad = check_nms_match_thresholds(iou_threshold, score_threshold); !bad.IsOK()) return bad;
    Io io(ctx, kNmsMatchOp);
    HostView<U> iou_value, score_value;
    if (Ort::Status s = io.fetch(iou_threshold.Data(), 1, "copying iou_threshold", iou_value); !s.IsOK()) return s;
    if (Ort::Status s = io.fetch(score_threshold.Data(), 1, "copying score_threshold", score_value); !s.IsOK())
      return s;
    if (Ort::Status s = io.wait("synchronising the copies"); !s.IsOK()) return s;
    const double iou = core::load(*core_ptr(iou_value.data));
    const double score = core::load(*core_ptr(score_value.data));
    core::NmsMulticlassParams p;
    if (Ort::Status bad = check_nms_match(boxes.Shape(), scores.Shape(), iou, score, p); !bad.IsOK()) return bad;
    HostView<T> host_boxes, host_scores;
    if (Ort::Status s = fetch_boxes_scores(io, p, 4, boxes, scores, host_boxes, host_scores); !s.IsOK()) return s;
    std::vector<int64_t> rows;
    if (Ort::Status bad = nms_match_rows(ctx, p, host_boxes.data, host_scores.data, rows); !bad.IsOK()) return bad;
    return write_rows(io, rows, 4, output);
  }
};

// Both node forms' kernels for one EP. NMSMatch: for every float T with U = float32 and,
// for the other types, U = T: the thresholds are float32 Constants, and a float16
// conversion gives them the boxes' type.
template <typename Io>
void append_nms_kernels(std::vector<LiteOpPtr>& ops, const char* ep) {
  append_float_kernels<MmdeployNmsRotatedKernel, Io>(ops, kNmsRotated, ep);
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsMatchKernel<T, float, Io>>(kNmsMatch, ep));
    if constexpr (!std::is_same_v<T, float>)
      ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsMatchKernel<T, T, Io>>(kNmsMatch, ep));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
