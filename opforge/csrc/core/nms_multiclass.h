// Class-wise NMS over batched detections, the two forms mmdeploy's exporters write
// for detection heads (mmdeploy::NMSRotated and mmdeploy::NMSMatch): boxes
// (N, B, D) shared by the classes, class-major scores (N, C, B), and one NMS per
// (image, class) pair. Plain C++, no framework types; the caller gives the
// parallel-for. Both visit boxes in decreasing score with a stable order (equal
// scores keep the lower index first), so results are repeatable, unlike
// mmdeploy's std::sort.
//
//   * NMSRotated (rotated boxes, D = 5): the boxes with score > score_threshold
//     (NaN never is) go through opforge's nms_rotated (core/nms_rotated.h: exact
//     float64 IoU, suppression when IoU > iou_threshold); rows (n, c, box) per kept
//     box, pairs in (n, c) order, each pair's rows by decreasing score. Dropping
//     the low scores first is mmdeploy's result: a box can only suppress boxes of a
//     lower or equal score, which are below the threshold too.
//   * NMSMatch (axis-aligned (x1, y1, x2, y2), D = 4; mmcv's nms_match): every box
//     of the pair takes part; each box not yet matched leads a group of the later
//     unmatched boxes whose IoU with it is >= iou_threshold (IoU = inter /
//     (area_i + area_j - inter + 1e-10), in float64, then rounded to float32 as
//     mmdeploy's kernel returns it: a pair at IoU 0.5 - 1e-10 is 0.5f and matches
//     at threshold 0.5). Rows (n, c, leader, member) for each member of a group
//     whose leader's score is > score_threshold.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "format.h"
#include "nms_rotated.h"

namespace opforge {
namespace core {

struct NmsMulticlassParams {
  int64_t batch = 0, boxes = 0, classes = 0;  // N, B, C
  int64_t box_dim = 0;                        // 5 rotated, 4 axis-aligned
  double iou_threshold = 0, score_threshold = 0;
  int64_t pairs() const { return batch * classes; }
};

// Shapes and thresholds: boxes (N, B, box_dim), scores (N, C, B); iou_threshold in
// [0, 1]; score_threshold not NaN. `op` names the node form in messages.
inline std::string nms_multiclass_check(const std::string& op, const int64_t* boxes, int boxes_rank,
                                        const int64_t* scores, int scores_rank, int64_t box_dim,
                                        double iou_threshold, double score_threshold, NmsMulticlassParams& p) {
  const std::string coords = box_dim == 5 ? "(cx, cy, w, h, angle)" : "(x1, y1, x2, y2)";
  if (boxes_rank != 3 || boxes[2] != box_dim)
    return op + ": boxes must be 3-D (N, B, " + std::to_string(box_dim) + "), one " + coords +
           " row per box, got shape " + dims_str(boxes, boxes_rank);
  if (scores_rank != 3 || scores[0] != boxes[0] || scores[2] != boxes[1])
    return op + ": scores must be 3-D (N, C, B) with N = " + std::to_string(boxes[0]) + " and B = " +
           std::to_string(boxes[1]) + " (boxes' first two dims; class-major), got shape " +
           dims_str(scores, scores_rank);
  if (!(iou_threshold >= 0.0 && iou_threshold <= 1.0))
    return op + ": iou_threshold must be in [0, 1], got " + std::to_string(iou_threshold);
  if (std::isnan(score_threshold)) return op + ": score_threshold is NaN";
  p = NmsMulticlassParams{};
  p.batch = boxes[0], p.boxes = boxes[1], p.classes = scores[1], p.box_dim = box_dim;
  p.iou_threshold = iou_threshold, p.score_threshold = score_threshold;
  return "";
}

// The decreasing-score visiting order of one score row (stable); "" or a message
// naming the NaN score (NaN cannot be ordered).
template <typename T>
inline std::string nms_multiclass_order(const std::string& op, const T* scores, int64_t n, int64_t c, int64_t count,
                                        std::vector<int64_t>& order) {
  for (int64_t i = 0; i < count; ++i)
    if (std::isnan(scores[i]))
      return op + ": scores[" + std::to_string(n) + ", " + std::to_string(c) + ", " + std::to_string(i) +
             "] is NaN: boxes cannot be ordered by it";
  order.resize(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [scores](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  return "";
}

// ---- NMSRotated --------------------------------------------------------------------------
// Pair (n, c): its (n, c, box) rows appended to rows. boxes: image n's (B, 5), scores:
// the pair's (B,); T float or double. inner_parallel splits the suppression of one pair
// (use a serial one when pairs already run in parallel). "" or a message.
template <typename T, typename ParallelFor>
inline std::string nms_rotated_pair(const std::string& op, const NmsMulticlassParams& p, const T* boxes,
                                    const T* scores, int64_t n, int64_t c, const ParallelFor& inner_parallel,
                                    std::vector<int64_t>& rows) {
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < p.boxes; ++i)
    if (scores[i] > p.score_threshold) picked.push_back(i);
  if (picked.empty()) return "";
  std::vector<T> cand_boxes(picked.size() * 5), cand_scores(picked.size());
  for (size_t k = 0; k < picked.size(); ++k) {
    std::copy(boxes + 5 * picked[k], boxes + 5 * picked[k] + 5, cand_boxes.begin() + 5 * k);
    cand_scores[k] = scores[picked[k]];
  }
  NmsRotatedParams np;
  np.boxes = static_cast<int64_t>(picked.size());
  np.iou_threshold = static_cast<float>(p.iou_threshold);
  NmsRotatedPlan plan;
  if (std::string err = nms_rotated_prepare(np, cand_boxes.data(), cand_scores.data(), nullptr, plan); !err.empty()) {
    // The core names its candidate row; say which input box that is.
    static const char* const names[5] = {"cx", "cy", "w", "h", "angle"};
    for (size_t k = 0; k < picked.size(); ++k)
      for (int j = 0; j < 5; ++j)
        if (!std::isfinite(cand_boxes[5 * k + j]))
          return op + ": boxes[" + std::to_string(n) + ", " + std::to_string(picked[k]) + "] has a non-finite " +
                 names[j] + " (" + std::to_string(static_cast<double>(cand_boxes[5 * k + j])) +
                 ") and a score above score_threshold";
    return op + ": " + err;
  }
  for (int64_t k : nms_rotated_suppress(np, plan, inner_parallel)) {
    rows.push_back(n);
    rows.push_back(c);
    rows.push_back(picked[static_cast<size_t>(k)]);
  }
  return "";
}

// ---- NMSMatch ----------------------------------------------------------------------------
// Pair (n, c): its (n, c, leader, member) rows appended to rows. boxes: image n's (B, 4),
// scores: the pair's (B,); T float or double. "" or a message.
template <typename T>
inline std::string nms_match_pair(const std::string& op, const NmsMulticlassParams& p, const T* boxes,
                                  const T* scores, int64_t n, int64_t c, std::vector<int64_t>& rows) {
  static const char* const names[4] = {"x1", "y1", "x2", "y2"};
  for (int64_t i = 0; i < p.boxes; ++i)
    for (int j = 0; j < 4; ++j)
      if (!std::isfinite(boxes[4 * i + j]))
        return op + ": boxes[" + std::to_string(n) + ", " + std::to_string(i) + "] has a non-finite " + names[j] +
               " (" + std::to_string(static_cast<double>(boxes[4 * i + j])) + ")";
  std::vector<int64_t> order;
  if (std::string err = nms_multiclass_order(op, scores, n, c, p.boxes, order); !err.empty()) return err;
  // Visiting order, structure of arrays, float64.
  const size_t m = order.size();
  std::vector<double> x1(m), y1(m), x2(m), y2(m), area(m);
  for (size_t k = 0; k < m; ++k) {
    const T* b = boxes + 4 * order[k];
    x1[k] = b[0];
    y1[k] = b[1];
    x2[k] = b[2];
    y2[k] = b[3];
    area[k] = (x2[k] - x1[k]) * (y2[k] - y1[k]);
  }
  std::vector<unsigned char> matched(m, 0);
  std::vector<int64_t> group;
  for (size_t i = 0; i < m; ++i) {
    if (matched[i]) continue;
    group.clear();
    for (size_t j = i + 1; j < m; ++j) {
      if (matched[j]) continue;
      const double w = std::max(0.0, std::min(x2[i], x2[j]) - std::max(x1[i], x1[j]));
      const double h = std::max(0.0, std::min(y2[i], y2[j]) - std::max(y1[i], y1[j]));
      const double inter = w * h;
      // mmdeploy's nms_match_iou returns float: its exported models compare that rounded value with
      // `>=`, so ties within float32's rounding of the threshold match (float64 alone would not).
      const float iou = static_cast<float>(inter / (area[i] + area[j] - inter + 1e-10));
      if (static_cast<double>(iou) >= p.iou_threshold) {
        matched[j] = 1;
        group.push_back(order[j]);
      }
    }
    if (group.empty() || !(scores[order[i]] > p.score_threshold)) continue;
    for (int64_t member : group) {
      rows.push_back(n);
      rows.push_back(c);
      rows.push_back(order[i]);
      rows.push_back(member);
    }
  }
  return "";
}

}  // namespace core
}  // namespace opforge
