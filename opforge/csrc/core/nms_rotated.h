// Rotated non-maximum suppression (mmcv's nms_rotated, returning the kept
// indices like torchvision's nms): the compute core shared by the torch
// extension (opforge::nms_rotated, opforge::batched_nms_rotated) and the ORT
// kernels. Plain C++; the caller provides the parallel-for.
//
// Boxes are visited in decreasing score (a stable sort: equal scores keep the
// lower index first); each box not yet suppressed is kept and suppresses every
// later box whose exact IoU with it (rotated_box_iou.h) is > iou_threshold and,
// in the batched form, whose label is equal. The result lists the kept boxes'
// indices in that visiting order, so it is sorted by decreasing score.
//
// Every front end runs the same steps: nms_rotated_check (shapes, attribute),
// nms_rotated_prepare (values checked, order, per-box geometry in float64, on
// the host), then suppression: nms_rotated_suppress on the CPU, or the GPU's
// mask items (nms_rotated_gpu.h) with nms_rotated_reduce_mask on the host.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "format.h"
#include "rotated_box_iou.h"

namespace opforge {
namespace core {

struct NmsRotatedParams {
  int64_t boxes = 0;         // N
  bool batched = false;      // labels given: only boxes of one label suppress each other
  float iou_threshold = 0;   // float32, as ONNX stores the attribute
};

inline std::string nms_rotated_op_name(bool batched) {
  return batched ? "opforge::batched_nms_rotated" : "opforge::nms_rotated";
}

inline std::string nms_rotated_check_threshold(bool batched, double iou_threshold) {
  if (!(iou_threshold >= 0.0 && iou_threshold <= 1.0))
    return nms_rotated_op_name(batched) + ": iou_threshold must be in [0, 1], got " + std::to_string(iou_threshold);
  return "";
}

// The rule on shapes and the threshold: boxes (N, 5), scores (N,), labels
// (N,) when batched (labels_rank < 0: not batched), iou_threshold in [0, 1].
inline std::string nms_rotated_check(const int64_t* boxes, int boxes_rank, const int64_t* scores, int scores_rank,
                                     const int64_t* labels, int labels_rank, float iou_threshold,
                                     NmsRotatedParams& p) {
  const bool batched = labels_rank >= 0;
  const std::string op = nms_rotated_op_name(batched) + ": ";
  if (boxes_rank != 2 || boxes[1] != 5 || boxes[0] < 0)
    return op + "boxes must be 2-D (N, 5), one (cx, cy, w, h, angle) row per box, got shape " +
           dims_str(boxes, boxes_rank);
  if (scores_rank != 1 || scores[0] != boxes[0])
    return op + "scores must be 1-D (N,) with N = " + std::to_string(boxes[0]) + " (boxes' rows), got shape " +
           dims_str(scores, scores_rank);
  if (batched && (labels_rank != 1 || labels[0] != boxes[0]))
    return op + "idxs must be 1-D (N,) with N = " + std::to_string(boxes[0]) + " (boxes' rows), got shape " +
           dims_str(labels, labels_rank);
  if (std::string err = nms_rotated_check_threshold(batched, iou_threshold); !err.empty()) return err;
  p = NmsRotatedParams{};
  p.boxes = boxes[0];
  p.batched = batched;
  p.iou_threshold = iou_threshold;
  return "";
}

// Float idxs (mmcv's labels are its detections' float class column) are
// categories only when they are integers int64 holds: then the conversion is
// exact and two labels are equal as floats exactly when they are equal as
// int64. Any other value (0.5, 1e19, inf, NaN) is refused: a C cast of one
// outside int64's range is undefined (x86 gives INT64_MIN for 1e19, 1e30,
// +-inf and NaN alike, which merged their categories), and torchvision's
// offset trick is not exact for them either. F is float (float32 and the
// 16-bit types, widened exactly) or double; the message shows the value in F's
// shortest digits. Returns "" or a message naming the element.
template <typename F>
inline std::string nms_rotated_float_labels(const NmsRotatedParams& p, const F* idxs, std::vector<int64_t>& labels) {
  labels.resize(static_cast<size_t>(p.boxes));
  for (int64_t i = 0; i < p.boxes; ++i) {
    const F v = idxs[i];
    // [-2^63, 2^63): both ends are powers of two, exact in F; NaN fails both tests.
    if (!(v >= F(-9223372036854775808.0) && v < F(9223372036854775808.0)) || v != std::floor(v))
      return nms_rotated_op_name(p.batched) + ": idxs must hold integer categories in int64's range [-2^63, 2^63), got "
             "idxs[" + std::to_string(i) + "] = " + number_str(v);
    labels[static_cast<size_t>(i)] = static_cast<int64_t>(v);
  }
  return "";
}

// What suppression works on, in visiting order: box i of the order is input
// box order[i], with its geometry and label.
struct NmsRotatedPlan {
  std::vector<int64_t> order;
  std::vector<RotatedBoxGeometry> geometry;
  std::vector<int64_t> labels;  // empty unless batched
  bool extreme = false;         // some box is extreme (rotated_box_iou.h): its pairs are scaled
};

// Checks the values (every box coordinate finite; no NaN score) and builds the
// plan. T is float or double (16-bit inputs are widened first, exactly);
// labels is null unless batched. Returns "" or a message naming the argument.
template <typename T>
inline std::string nms_rotated_prepare(const NmsRotatedParams& p, const T* boxes, const T* scores,
                                       const int64_t* labels, NmsRotatedPlan& plan) {
  const std::string op = nms_rotated_op_name(p.batched) + ": ";
  static const char* const names[5] = {"cx", "cy", "w", "h", "angle"};
  for (int64_t i = 0; i < p.boxes; ++i) {
    for (int j = 0; j < 5; ++j)
      if (!std::isfinite(boxes[5 * i + j]))
        return op + "boxes row " + std::to_string(i) + " has a non-finite " + names[j] + " (" +
               std::to_string(static_cast<double>(boxes[5 * i + j])) + ")";
    if (std::isnan(scores[i]))
      return op + "scores[" + std::to_string(i) + "] is NaN: boxes cannot be ordered by it";
  }
  plan.order.resize(static_cast<size_t>(p.boxes));
  std::iota(plan.order.begin(), plan.order.end(), int64_t(0));
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [scores](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  plan.geometry.resize(static_cast<size_t>(p.boxes));
  plan.labels.assign(p.batched ? static_cast<size_t>(p.boxes) : 0, 0);
  for (int64_t i = 0; i < p.boxes; ++i) {
    const T* b = boxes + 5 * plan.order[i];
    plan.geometry[i] = rotated_box_geometry(b[0], b[1], b[2], b[3], b[4]);
    plan.extreme = plan.extreme || plan.geometry[i].area < 0.0;
    if (p.batched) plan.labels[i] = labels[plan.order[i]];
  }
  return "";
}

// Whether box j (later in the order) is suppressed by box i; kExtreme: plan.extreme.
template <bool kExtreme>
inline bool nms_rotated_suppresses(const NmsRotatedParams& p, const NmsRotatedPlan& plan, int64_t i, int64_t j) {
  if (p.batched && plan.labels[i] != plan.labels[j]) return false;
  return rotated_box_iou<kExtreme>(plan.geometry[i], plan.geometry[j]) > static_cast<double>(p.iou_threshold);
}

// Candidate boxes per parallel task: a window this large only happens when
// boxes are huge or piled up; below it the window is scanned inline (a
// parallel region per kept box cost seconds on a loaded machine).
constexpr int64_t kNmsRotatedGrain = 4096;

// The CPU suppression: greedy, each kept box tested only against the boxes
// that could overlap it. Boxes are sorted by the left end of their
// circumscribed circle's x-extent; a box can only overlap boxes whose
// x-extents meet its own, found by binary search in that order (a window of
// left ends [left_i - widest extent, right_i]). Extents are widened by a
// relative 1e-6, so a box outside the window is apart by more than
// rotated_box_iou's own disjointness margin: its IoU would be exactly 0, and
// the result is the plain greedy's, for any threshold in [0, 1]. Windows of
// more than kNmsRotatedGrain boxes are split over parallel_for(total, grain,
// body(begin, end)). Returns the kept boxes' input indices.
template <bool kExtreme, typename ParallelFor>
inline std::vector<int64_t> nms_rotated_suppress_loop(const NmsRotatedParams& p, const NmsRotatedPlan& plan,
                                                      const ParallelFor& parallel_for) {
  const int64_t n = p.boxes;
  std::vector<double> left(static_cast<size_t>(n)), right(static_cast<size_t>(n));
  double widest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const RotatedBoxGeometry& g = plan.geometry[i];
    // The absolute floor keeps a margin for boxes whose numbers are all subnormal (a relative one
    // would round to 0 there); it is far below the relative part for any other box.
    const double margin = 1e-6 * (std::fabs(g.cx) + g.radius) + 1e-300;
    left[i] = g.cx - g.radius - margin;
    right[i] = g.cx + g.radius + margin;
    widest = std::max(widest, right[i] - left[i]);
  }
  std::vector<int64_t> by_left(static_cast<size_t>(n));
  std::iota(by_left.begin(), by_left.end(), int64_t(0));
  std::sort(by_left.begin(), by_left.end(), [&](int64_t a, int64_t b) { return left[a] < left[b]; });
  std::vector<double> sorted_left(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) sorted_left[k] = left[by_left[k]];

  std::vector<unsigned char> removed(static_cast<size_t>(n), 0);
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < n; ++i) {
    if (removed[i]) continue;
    keep.push_back(plan.order[i]);
    const int64_t lo = std::lower_bound(sorted_left.begin(), sorted_left.end(), left[i] - widest) - sorted_left.begin();
    const int64_t hi = std::upper_bound(sorted_left.begin(), sorted_left.end(), right[i]) - sorted_left.begin();
    if (hi <= lo) continue;
    // Each candidate j is written by the one task that owns it: no races.
    parallel_for(hi - lo, kNmsRotatedGrain, [&](int64_t begin, int64_t end) {
      for (int64_t k = lo + begin; k < lo + end; ++k) {
        const int64_t j = by_left[k];
        if (j > i && !removed[j] && right[j] >= left[i] && nms_rotated_suppresses<kExtreme>(p, plan, i, j))
          removed[j] = 1;
      }
    });
  }
  return keep;
}

// The loop for the plan: the extreme boxes' scaling is compiled in only when some box needs it.
template <typename ParallelFor>
inline std::vector<int64_t> nms_rotated_suppress(const NmsRotatedParams& p, const NmsRotatedPlan& plan,
                                                 const ParallelFor& parallel_for) {
  return plan.extreme ? nms_rotated_suppress_loop<true>(p, plan, parallel_for)
                      : nms_rotated_suppress_loop<false>(p, plan, parallel_for);
}

// ---- the GPU's suppression mask, reduced on the host ---------------------------------------
// Row i of the mask has one bit per later box j: set when i would suppress j.
// Words of 64 boxes; rows are computed in chunks so the mask memory is bounded
// (kNmsRotatedMaskBytes) however many boxes there are.
constexpr int64_t kNmsRotatedWordBits = 64;
constexpr int64_t kNmsRotatedMaskBytes = int64_t(64) << 20;

inline int64_t nms_rotated_words(int64_t n) { return (n + kNmsRotatedWordBits - 1) / kNmsRotatedWordBits; }

// Rows per chunk of the mask (at least one).
inline int64_t nms_rotated_chunk_rows(int64_t n) {
  const int64_t words = std::max<int64_t>(nms_rotated_words(n), 1);
  return std::max<int64_t>(1, std::min<int64_t>(n, kNmsRotatedMaskBytes / (8 * words)));
}

// Greedy over mask rows [row_begin, row_end) (mask holds those rows, `words`
// words each); `removed` (words words) carries the suppressed set between chunks.
inline void nms_rotated_reduce_mask(const uint64_t* mask, int64_t row_begin, int64_t row_end, int64_t words,
                                    const std::vector<int64_t>& order, std::vector<uint64_t>& removed,
                                    std::vector<int64_t>& keep) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    if (removed[i / kNmsRotatedWordBits] & (uint64_t(1) << (i % kNmsRotatedWordBits))) continue;
    keep.push_back(order[i]);
    const uint64_t* row = mask + (i - row_begin) * words;
    for (int64_t w = i / kNmsRotatedWordBits; w < words; ++w) removed[w] |= row[w];
  }
}

}  // namespace core
}  // namespace opforge
