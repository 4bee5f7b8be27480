// Multi-scale deformable attention (Deformable DETR's ms_deform_attn_core_pytorch,
// mmcv's argument order): the compute core shared by the torch extension
// (opforge::ms_deform_attn) and the ORT kernels. Plain C++ templates; the
// caller provides the parallel-for.
//
//   out[n, q, m*D + d] = sum_{l, p} attention_weights[n, q, m, l, p] *
//                        bilinear(level l of value[n, :, m, d], sampling_locations[n, q, m, l, p])
//
// where level l is value[n, start_l : start_l + H_l*W_l] viewed as an H_l x W_l
// map (row-major) and the location (x, y) in [0, 1]^2 is sampled as
// grid_sample(align_corners=False, padding_mode="zeros") does
// (ms_deform_attn_sample.h).
//
// Speed: value is [N, S, M, D], so the D channels a head samples at one
// position are contiguous. Each sampling point's corners and weights are
// computed ONCE and applied to the whole D-vector (a unit-stride loop the
// compiler vectorises, at the widest vectors the CPU has: cpu_dispatch.h);
// value is read in place (no per-level copies, no transposes), and each
// head's rows are prefetched while the previous head is computed.
//
// The CPU kernels take float or double; the front ends widen 16-bit tensors
// to float32 first (one pass, then every sample is a plain float load) and
// round the results once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "channel_rows.h"
#include "cpu_dispatch.h"
#include "format.h"
#include "ms_deform_attn_sample.h"
#include "shape.h"

namespace opforge {
namespace core {

// im2col_step is mmcv's batching knob: its CUDA kernels process the batch in
// chunks of im2col_step images to bound a temporary buffer. These kernels
// need no temporary per image (they read value in place and write the output
// directly), so the argument has no effect on the result or the memory used;
// it is accepted, and must be positive as mmcv requires, so that models and
// calls written for mmcv run unchanged.
inline std::string ms_deform_attn_check_im2col_step(int64_t im2col_step) {
  if (im2col_step <= 0)
    return "opforge::ms_deform_attn: im2col_step must be positive, got " + std::to_string(im2col_step);
  return "";
}

// What ms_deform_attn's shape rule reads: each tensor input's shape, and im2col_step.
template <typename Dim>
struct MsDeformAttnShapes {
  Shape<Dim> value, spatial_shapes, level_start_index, sampling_locations, attention_weights;
  int64_t im2col_step = 64;
};

// ms_deform_attn's shape rule, on shapes alone: ranks, N / M / L / P agreement,
// the trailing 2 of sampling_locations, spatial_shapes (L, 2), level_start_index
// (L,), at least one level, im2col_step > 0, and (for known sizes) every element
// count and byte size in any dtype fits int64. Gives the output's shape
// (N, Lq, M*D) in `out`. Returns "" when valid, else a message naming the op and
// the argument. Every kernel and the fake impl (through
// _ms_deform_attn_output_shapes) apply it, so they accept the same shapes.
template <typename Dim>
std::string ms_deform_attn_output_shapes(const MsDeformAttnShapes<Dim>& in, std::vector<std::vector<Dim>>& out) {
  const std::string op = "opforge::ms_deform_attn: ";
  const Shape<Dim>&value = in.value, &spatial_shapes = in.spatial_shapes, &level_start_index = in.level_start_index,
        &loc = in.sampling_locations, &attn = in.attention_weights;
  if (value.rank() != 4) return message(op, "value must be 4-D (N, S, M, D), got shape ", value);
  if (spatial_shapes.rank() != 2)
    return message(op, "spatial_shapes must be 2-D (L, 2), one (H, W) row per level, got shape ", spatial_shapes);
  if (level_start_index.rank() != 1)
    return message(op, "level_start_index must be 1-D (L,), got shape ", level_start_index);
  if (loc.rank() != 6) return message(op, "sampling_locations must be 6-D (N, Lq, M, L, P, 2), got shape ", loc);
  if (attn.rank() != 5) return message(op, "attention_weights must be 5-D (N, Lq, M, L, P), got shape ", attn);
  const std::pair<const char*, const Shape<Dim>*> tensors[] = {{"value", &value},
                                                               {"spatial_shapes", &spatial_shapes},
                                                               {"level_start_index", &level_start_index},
                                                               {"sampling_locations", &loc},
                                                               {"attention_weights", &attn}};
  for (const auto& [name, shape] : tensors)
    for (int i = 0; i < shape->rank(); ++i)
      if ((*shape)[i] < 0) return message(op, name, " has a negative size: shape ", *shape);
  if (std::string err = ms_deform_attn_check_im2col_step(in.im2col_step); !err.empty()) return err;
  const Dim &batch = value[0], &heads = value[2], &channels = value[3], &levels = spatial_shapes[0];
  if (spatial_shapes[1] != 2)
    return message(op, "spatial_shapes must be (L, 2), one (H, W) row per level, got shape ", spatial_shapes);
  // No levels: nothing to attend to. Refused rather than answered with zeros:
  // a model without feature levels is a bug, and the level checks need one.
  if (levels == 0) return message(op, "needs at least one level: spatial_shapes has shape ", spatial_shapes);
  if (level_start_index[0] != levels)
    return message(op, "level_start_index has ", level_start_index[0], " entries but spatial_shapes has ", levels,
                   " levels (rows)");
  if (loc[0] != batch)
    return message(op, "sampling_locations has N = ", loc[0], " (dim 0) but value has N = ", batch, " (dim 0)");
  if (loc[2] != heads)
    return message(op, "sampling_locations has M = ", loc[2], " heads (dim 2) but value has M = ", heads, " (dim 2)");
  if (loc[3] != levels)
    return message(op, "sampling_locations has L = ", loc[3], " levels (dim 3) but spatial_shapes has ", levels,
                   " rows");
  if (loc[5] != 2) return message(op, "sampling_locations must end in a dim of size 2 (x, y), got shape ", loc);
  static const char* const dim_names[5] = {"N", "Lq", "M", "L", "P"};
  for (int i = 0; i < 5; ++i)
    if (attn[i] != loc[i])
      return message(op, "attention_weights has ", dim_names[i], " = ", attn[i], " (dim ", i,
                     ") but sampling_locations has ", loc[i], ": attention_weights must be (N, Lq, M, L, P) = ",
                     Shape<Dim>{{loc.dims.begin(), loc.dims.begin() + 5}}, ", got ", attn);
  // Element counts, and byte counts in any dtype (16 bytes bounds all of them),
  // of known sizes. M*D on its own too: it is the output's last dim even when N
  // or Lq is 0.
  const auto v = known_all(value.dims), l = known_all(loc.dims);
  if (v && l) {
    int64_t out_row;
    if (!mul_fits((*v)[2], (*v)[3], &out_row) || !numel_fits(*v, 16) || !numel_fits(*l, 16) ||
        !numel_fits({(*v)[0], (*l)[1], (*v)[2], (*v)[3]}, 16))
      return message(op, "value ", value, ", sampling_locations ", loc,
                     " or the output (N, Lq, M*D) has more elements than int64 can count");
  }
  out = {{batch, loc[1], heads * channels}};
  return "";
}

// The rule for the kernels, on (pointer, rank) shapes: fills p.
inline std::string ms_deform_attn_check(const int64_t* value, int value_rank, const int64_t* spatial_shapes,
                                        int spatial_shapes_rank, const int64_t* level_start_index,
                                        int level_start_index_rank, const int64_t* sampling_locations,
                                        int sampling_locations_rank, const int64_t* attention_weights,
                                        int attention_weights_rank, int64_t im2col_step, MsDeformAttnParams& p) {
  MsDeformAttnShapes<int64_t> in;
  in.value = shape_of(value, value_rank);
  in.spatial_shapes = shape_of(spatial_shapes, spatial_shapes_rank);
  in.level_start_index = shape_of(level_start_index, level_start_index_rank);
  in.sampling_locations = shape_of(sampling_locations, sampling_locations_rank);
  in.attention_weights = shape_of(attention_weights, attention_weights_rank);
  in.im2col_step = im2col_step;
  std::vector<std::vector<int64_t>> out;
  if (std::string err = ms_deform_attn_output_shapes(in, out); !err.empty()) return err;
  p = MsDeformAttnParams{};
  p.batch = value[0], p.value_len = value[1], p.heads = value[2], p.channels = value[3];
  p.levels = spatial_shapes[0], p.queries = sampling_locations[1], p.points = sampling_locations[4];
  return "";
}

// The output shape (N, Lq, M*D) of checked params.
inline void ms_deform_attn_output_dims(const MsDeformAttnParams& p, int64_t out[3]) {
  out[0] = p.batch;
  out[1] = p.queries;
  out[2] = p.heads * p.channels;
}

// The rule on the level geometry, which is data (host copies of spatial_shapes
// [L, 2] and level_start_index [L]) that the kernels index value with: every
// H, W > 0, H*W and the running sum in int64 without overflow, the sizes sum
// to S, and level l starts at the sum of the sizes before it. The index
// tensors come from the caller (in ORT, a model or its feeds), so every
// kernel applies this before reading value: after it, every corner position
// start_l + y*W_l + x is in [0, S). p must have passed ms_deform_attn_check.
inline std::string ms_deform_attn_check_levels(const MsDeformAttnParams& p, const int64_t* spatial_shapes,
                                               const int64_t* level_start_index) {
  const std::string op = "opforge::ms_deform_attn: ";
  const auto str = [](int64_t v) { return std::to_string(v); };
  int64_t total = 0;
  bool total_fits = true;
  for (int64_t l = 0; l < p.levels; ++l) {
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    const std::string row = "spatial_shapes row " + str(l) + " is (" + str(h) + ", " + str(w) + ")";
    if (h <= 0 || w <= 0) return op + row + ": sizes must be positive";
    int64_t size;
    if (__builtin_mul_overflow(h, w, &size)) return op + row + ": H*W overflows int64";
    total_fits = total_fits && !__builtin_add_overflow(total, size, &total);
  }
  if (!total_fits) return op + "the levels' sizes (H*W of each spatial_shapes row) overflow int64 when summed";
  if (total != p.value_len)
    return op + "the levels' sizes sum to " + str(total) + " but value has S = " + str(p.value_len) + " (dim 1)";
  int64_t start = 0;
  for (int64_t l = 0; l < p.levels; ++l) {
    if (level_start_index[l] != start)
      return op + "level_start_index[" + str(l) + "] is " + str(level_start_index[l]) +
             " but spatial_shapes puts level " + str(l) + " at " + str(start);
    start += spatial_shapes[2 * l] * spatial_shapes[2 * l + 1];
  }
  return "";
}

// ---- CPU kernels ------------------------------------------------------------------------
// Both take ranges of independent work items, so torch's at::parallel_for and
// ORT's thread pool split them the same way:
//   forward : item = n * Lq + q (one query: all its heads' output channels);
//   backward: item = n * M + m (one head of one image: it alone writes
//             grad_value[n, :, m, :], so items need no atomics).

// Asks for the n elements at data to be brought towards L1 (every cache line).
template <typename T>
OPFORGE_ALWAYS_INLINE void ms_deform_attn_prefetch(const T* data, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t i = 0; i < n; i += kLine) __builtin_prefetch(data + i);
  if (n > 0) __builtin_prefetch(data + n - 1);
}

// Sampling points are gathered one batch ahead of their arithmetic: a
// point's corner rows are scattered over a map that need not fit in L2, so
// the next batch's rows are prefetched while this batch's are used,
// overlapping the memory latency with work instead of paying it point by
// point. A batch is up to kMsDeformAttnBatch points of one head (n, q, m),
// typically all of its L*P; the bound keeps the scratch on the stack and
// the prefetched lines in L1 however many points a head has.
constexpr int64_t kMsDeformAttnBatch = 64;

template <typename T>
struct MsDeformAttnPoint {
  MsDeformAttnCorners<T> c;
  int64_t level;  // element offset of position 0 of the point's level, at this head's channels
  T aw;
  T w, h;         // the level's size: d(pixel x)/d(loc x) and d(pixel y)/d(loc y)
};

// A head's points in batches: batch b of a run of heads first, first +
// stride, ... is points [i0, i0 + count) (i = l * P + p) of head `head`.
struct MsDeformAttnBatch {
  int64_t head, i0, count;
};

inline MsDeformAttnBatch ms_deform_attn_batch(const MsDeformAttnParams& p, int64_t first, int64_t stride,
                                              int64_t batches_per_head, int64_t b) {
  MsDeformAttnBatch out;
  out.head = first + (b / batches_per_head) * stride;
  out.i0 = (b % batches_per_head) * kMsDeformAttnBatch;
  out.count = std::min(kMsDeformAttnBatch, p.points_per_head() - out.i0);
  return out;
}

// Fills pts with the batch's points and prefetches the value rows they read
// (and the grad_value rows they update, when given).
template <typename T>
OPFORGE_ALWAYS_INLINE void ms_deform_attn_gather(const MsDeformAttnParams& p, const MsDeformAttnBatch& batch,
                                                 const int64_t* spatial_shapes, const int64_t* level_start_index,
                                                 const T* sampling_locations, const T* attention_weights,
                                                 const T* value, const T* grad_value, MsDeformAttnPoint<T>* pts) {
  const int64_t D = p.channels, row = p.value_row(), P = p.points;
  const int64_t n = batch.head / (p.heads * p.queries), m = batch.head % p.heads;
  const int64_t image = n * p.value_len * row + m * D;
  int64_t l = batch.i0 / P, in_level = batch.i0 % P;
  for (int64_t i = 0; i < batch.count; ++i, ++in_level) {
    if (in_level == P) {
      ++l;
      in_level = 0;
    }
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    const int64_t pt = batch.head * p.points_per_head() + batch.i0 + i;
    MsDeformAttnPoint<T>& b = pts[i];
    b.c = ms_deform_attn_corners<T>(sampling_locations[2 * pt], sampling_locations[2 * pt + 1], h, w);
    b.level = image + level_start_index[l] * row;
    b.aw = attention_weights[pt];
    b.w = static_cast<T>(w);
    b.h = static_cast<T>(h);
    for (int k = 0; k < 4; ++k)
      if (b.c.valid & (1u << k)) {
        ms_deform_attn_prefetch(value + b.level + b.c.pos[k] * row, D);
        if (grad_value) ms_deform_attn_prefetch(grad_value + b.level + b.c.pos[k] * row, D);
      }
  }
}

template <typename T>
OPFORGE_ALWAYS_INLINE void ms_deform_attn_forward_impl(const MsDeformAttnParams& p, const T* value,
                                                       const int64_t* spatial_shapes,
                                                       const int64_t* level_start_index, const T* sampling_locations,
                                                       const T* attention_weights, T* out, int64_t begin,
                                                       int64_t end) {
  const int64_t D = p.channels, row = p.value_row();
  // The items' heads, first to last, are contiguous: (item, m) = item * M + m.
  const int64_t first = begin * p.heads, heads = (end - begin) * p.heads;
  std::fill(out + first * D, out + (first + heads) * D, T(0));
  const int64_t per_head = (p.points_per_head() + kMsDeformAttnBatch - 1) / kMsDeformAttnBatch;
  const int64_t batches = heads * per_head;
  MsDeformAttnPoint<T> buffers[2][kMsDeformAttnBatch];
  MsDeformAttnPoint<T>*cur = buffers[0], *next = buffers[1];
  if (batches > 0)
    ms_deform_attn_gather<T>(p, ms_deform_attn_batch(p, first, 1, per_head, 0), spatial_shapes, level_start_index,
                             sampling_locations, attention_weights, value, nullptr, cur);
  for (int64_t b = 0; b < batches; ++b) {
    if (b + 1 < batches)
      ms_deform_attn_gather<T>(p, ms_deform_attn_batch(p, first, 1, per_head, b + 1), spatial_shapes,
                               level_start_index, sampling_locations, attention_weights, value, nullptr, next);
    const MsDeformAttnBatch batch = ms_deform_attn_batch(p, first, 1, per_head, b);
    T* acc = out + batch.head * D;
    for (int64_t i = 0; i < batch.count; ++i) {
      const MsDeformAttnCorners<T>& c = cur[i].c;
      const T* level = value + cur[i].level;
      const T aw = cur[i].aw;
      if (c.valid == 15) {
        blend4_add(level + c.pos[0] * row, level + c.pos[1] * row, level + c.pos[2] * row,
                              level + c.pos[3] * row, aw * c.w[0], aw * c.w[1], aw * c.w[2], aw * c.w[3], acc, D);
      } else if (c.valid != 0) {
        for (int k = 0; k < 4; ++k)
          if (c.valid & (1u << k)) axpy(level + c.pos[k] * row, aw * c.w[k], acc, D);
      } else if (!std::isfinite(aw)) {
        // The point samples 0, and weight * 0 is NaN for a non-finite
        // weight, as in the reference composition (grid_sample, then weigh).
        for (int64_t d = 0; d < D; ++d) acc[d] += aw * T(0);
      }
    }
    std::swap(cur, next);
  }
}

// Per-corner dot products g . v_k, and grad_v_k += a_k * g, over one D-vector.
// The dot products accumulate in kLanes partial sums so the loop vectorises
// (a single running sum is a serial dependency the compiler must keep).
template <typename T>
OPFORGE_ALWAYS_INLINE void ms_deform_attn_backward4(const T* __restrict g, const T* __restrict v0,
                                                    const T* __restrict v1, const T* __restrict v2,
                                                    const T* __restrict v3, T a0, T a1, T a2, T a3,
                                                    T* __restrict gv0, T* __restrict gv1, T* __restrict gv2,
                                                    T* __restrict gv3, int64_t n, T dot[4]) {
  constexpr int kLanes = 8;
  T part[4][kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T gd = g[d + j];
      part[0][j] += gd * v0[d + j];
      part[1][j] += gd * v1[d + j];
      part[2][j] += gd * v2[d + j];
      part[3][j] += gd * v3[d + j];
      gv0[d + j] += a0 * gd;
      gv1[d + j] += a1 * gd;
      gv2[d + j] += a2 * gd;
      gv3[d + j] += a3 * gd;
    }
  for (int k = 0; k < 4; ++k) {
    dot[k] = T(0);
    for (int j = 0; j < kLanes; ++j) dot[k] += part[k][j];
  }
  for (; d < n; ++d) {
    const T gd = g[d];
    dot[0] += gd * v0[d];
    dot[1] += gd * v1[d];
    dot[2] += gd * v2[d];
    dot[3] += gd * v3[d];
    gv0[d] += a0 * gd;
    gv1[d] += a1 * gd;
    gv2[d] += a2 * gd;
    gv3[d] += a3 * gd;
  }
}

// One corner's share of the above (corners at the map's edge).
template <typename T>
OPFORGE_ALWAYS_INLINE T ms_deform_attn_backward1(const T* __restrict g, const T* __restrict v, T a,
                                                 T* __restrict gv, int64_t n) {
  constexpr int kLanes = 8;
  T part[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      part[j] += g[d + j] * v[d + j];
      gv[d + j] += a * g[d + j];
    }
  T dot = T(0);
  for (int j = 0; j < kLanes; ++j) dot += part[j];
  for (; d < n; ++d) {
    dot += g[d] * v[d];
    gv[d] += a * g[d];
  }
  return dot;
}

// grad_value must be zeroed by the caller (items accumulate into it);
// grad_sampling_locations and grad_attention_weights are written.
template <typename T>
OPFORGE_ALWAYS_INLINE void ms_deform_attn_backward_impl(const MsDeformAttnParams& p, const T* grad_output,
                                                        const T* value, const int64_t* spatial_shapes,
                                                        const int64_t* level_start_index,
                                                        const T* sampling_locations, const T* attention_weights,
                                                        T* grad_value, T* grad_sampling_locations,
                                                        T* grad_attention_weights, int64_t begin, int64_t end) {
  const int64_t M = p.heads, D = p.channels, LP = p.points_per_head(), row = p.value_row();
  const int64_t per_head = (LP + kMsDeformAttnBatch - 1) / kMsDeformAttnBatch, batches = p.queries * per_head;
  MsDeformAttnPoint<T> buffers[2][kMsDeformAttnBatch];
  MsDeformAttnPoint<T>*cur = buffers[0], *next = buffers[1];
  for (int64_t item = begin; item < end; ++item) {
    // item = (n, m): its heads (n, q, m) for q = 0, 1, ... are M apart
    const int64_t first = (item / M) * p.queries * M + item % M;
    if (batches > 0)
      ms_deform_attn_gather<T>(p, ms_deform_attn_batch(p, first, M, per_head, 0), spatial_shapes, level_start_index,
                               sampling_locations, attention_weights, value, grad_value, cur);
    for (int64_t b = 0; b < batches; ++b) {
      if (b + 2 < batches) {
        // Inputs two batches ahead: M heads apart, a stride the hardware
        // prefetchers follow poorly; the gather below then finds them in cache.
        const MsDeformAttnBatch later = ms_deform_attn_batch(p, first, M, per_head, b + 2);
        const int64_t pt = later.head * LP + later.i0;
        ms_deform_attn_prefetch(sampling_locations + 2 * pt, 2 * later.count);
        ms_deform_attn_prefetch(attention_weights + pt, later.count);
        ms_deform_attn_prefetch(grad_output + later.head * D, D);
      }
      if (b + 1 < batches)
        ms_deform_attn_gather<T>(p, ms_deform_attn_batch(p, first, M, per_head, b + 1), spatial_shapes,
                                 level_start_index, sampling_locations, attention_weights, value, grad_value, next);
      const MsDeformAttnBatch batch = ms_deform_attn_batch(p, first, M, per_head, b);
      const T* g = grad_output + batch.head * D;
      for (int64_t i = 0; i < batch.count; ++i) {
        const MsDeformAttnCorners<T>& c = cur[i].c;
        const T* level = value + cur[i].level;
        T* grad_level = grad_value + cur[i].level;
        const T aw = cur[i].aw;
        T dot[4] = {T(0), T(0), T(0), T(0)};  // grad_output . value at each corner
        if (c.valid == 15) {
          ms_deform_attn_backward4(g, level + c.pos[0] * row, level + c.pos[1] * row, level + c.pos[2] * row,
                                   level + c.pos[3] * row, aw * c.w[0], aw * c.w[1], aw * c.w[2], aw * c.w[3],
                                   grad_level + c.pos[0] * row, grad_level + c.pos[1] * row,
                                   grad_level + c.pos[2] * row, grad_level + c.pos[3] * row, D, dot);
        } else {
          for (int k = 0; k < 4; ++k)
            if (c.valid & (1u << k))
              dot[k] = ms_deform_attn_backward1(g, level + c.pos[k] * row, aw * c.w[k], grad_level + c.pos[k] * row, D);
        }
        // out = aw * sum_k w_k(x, y) v_k with x = loc_x * W - 0.5, y = loc_y * H - 0.5.
        // A point that samples nothing has dot = 0 and gets zero gradients (no aw * 0 here).
        T dx[4], dy[4];
        ms_deform_attn_weight_derivatives(c, dx, dy);
        T sample = T(0), along_x = T(0), along_y = T(0);
        for (int k = 0; k < 4; ++k) {
          sample += c.w[k] * dot[k];
          along_x += dx[k] * dot[k];
          along_y += dy[k] * dot[k];
        }
        const int64_t pt = batch.head * LP + batch.i0 + i;
        grad_attention_weights[pt] = sample;
        grad_sampling_locations[2 * pt] = c.valid ? aw * along_x * cur[i].w : T(0);
        grad_sampling_locations[2 * pt + 1] = c.valid ? aw * along_y * cur[i].h : T(0);
      }
      std::swap(cur, next);
    }
  }
}

// ISA clones (cpu_dispatch.h): the always-inline bodies re-vectorise inside each.
template <typename T>
void ms_deform_attn_forward_base(const MsDeformAttnParams& p, const T* value, const int64_t* shapes,
                                 const int64_t* starts, const T* loc, const T* attn, T* out, int64_t begin,
                                 int64_t end) {
  ms_deform_attn_forward_impl(p, value, shapes, starts, loc, attn, out, begin, end);
}
template <typename T>
void ms_deform_attn_backward_base(const MsDeformAttnParams& p, const T* grad_out, const T* value,
                                  const int64_t* shapes, const int64_t* starts, const T* loc, const T* attn,
                                  T* grad_value, T* grad_loc, T* grad_attn, int64_t begin, int64_t end) {
  ms_deform_attn_backward_impl(p, grad_out, value, shapes, starts, loc, attn, grad_value, grad_loc, grad_attn, begin,
                               end);
}
#if OPFORGE_X86_DISPATCH
template <typename T>
OPFORGE_TARGET_AVX2 void ms_deform_attn_forward_avx2(const MsDeformAttnParams& p, const T* value,
                                                     const int64_t* shapes, const int64_t* starts, const T* loc,
                                                     const T* attn, T* out, int64_t begin, int64_t end) {
  ms_deform_attn_forward_impl(p, value, shapes, starts, loc, attn, out, begin, end);
}
template <typename T>
OPFORGE_TARGET_AVX512 void ms_deform_attn_forward_avx512(const MsDeformAttnParams& p, const T* value,
                                                         const int64_t* shapes, const int64_t* starts, const T* loc,
                                                         const T* attn, T* out, int64_t begin, int64_t end) {
  ms_deform_attn_forward_impl(p, value, shapes, starts, loc, attn, out, begin, end);
}
template <typename T>
OPFORGE_TARGET_AVX2 void ms_deform_attn_backward_avx2(const MsDeformAttnParams& p, const T* grad_out,
                                                      const T* value, const int64_t* shapes, const int64_t* starts,
                                                      const T* loc, const T* attn, T* grad_value, T* grad_loc,
                                                      T* grad_attn, int64_t begin, int64_t end) {
  ms_deform_attn_backward_impl(p, grad_out, value, shapes, starts, loc, attn, grad_value, grad_loc, grad_attn, begin,
                               end);
}
template <typename T>
OPFORGE_TARGET_AVX512 void ms_deform_attn_backward_avx512(const MsDeformAttnParams& p, const T* grad_out,
                                                          const T* value, const int64_t* shapes,
                                                          const int64_t* starts, const T* loc, const T* attn,
                                                          T* grad_value, T* grad_loc, T* grad_attn, int64_t begin,
                                                          int64_t end) {
  ms_deform_attn_backward_impl(p, grad_out, value, shapes, starts, loc, attn, grad_value, grad_loc, grad_attn, begin,
                               end);
}
#endif

// Forward items [begin, end) (item = n * Lq + q): writes out[n, q, :]. T is
// float or double; the level geometry must have passed ms_deform_attn_check_levels.
template <typename T>
inline void ms_deform_attn_forward(const MsDeformAttnParams& p, const T* value, const int64_t* spatial_shapes,
                                   const int64_t* level_start_index, const T* sampling_locations,
                                   const T* attention_weights, T* out, int64_t begin, int64_t end) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return ms_deform_attn_forward_avx512(p, value, spatial_shapes, level_start_index, sampling_locations,
                                           attention_weights, out, begin, end);
    case Isa::kAvx2:
      return ms_deform_attn_forward_avx2(p, value, spatial_shapes, level_start_index, sampling_locations,
                                         attention_weights, out, begin, end);
    default:
      break;
  }
#endif
  ms_deform_attn_forward_base(p, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, out,
                              begin, end);
}

// Backward items [begin, end) (item = n * M + m): accumulates grad_value[n, :, m, :]
// (zeroed by the caller) and writes grad_sampling_locations / grad_attention_weights
// of every (q, l, p) of that head.
template <typename T>
inline void ms_deform_attn_backward(const MsDeformAttnParams& p, const T* grad_output, const T* value,
                                    const int64_t* spatial_shapes, const int64_t* level_start_index,
                                    const T* sampling_locations, const T* attention_weights, T* grad_value,
                                    T* grad_sampling_locations, T* grad_attention_weights, int64_t begin,
                                    int64_t end) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return ms_deform_attn_backward_avx512(p, grad_output, value, spatial_shapes, level_start_index,
                                            sampling_locations, attention_weights, grad_value,
                                            grad_sampling_locations, grad_attention_weights, begin, end);
    case Isa::kAvx2:
      return ms_deform_attn_backward_avx2(p, grad_output, value, spatial_shapes, level_start_index,
                                          sampling_locations, attention_weights, grad_value, grad_sampling_locations,
                                          grad_attention_weights, begin, end);
    default:
      break;
  }
#endif
  ms_deform_attn_backward_base(p, grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                               attention_weights, grad_value, grad_sampling_locations, grad_attention_weights, begin,
                               end);
}

// Forward items per parallel task: about 32k multiply-adds each, so small
// problems stay on one thread and large ones split evenly.
inline int64_t ms_deform_attn_forward_grain(const MsDeformAttnParams& p) {
  // in double: the product of sizes of two different tensors may exceed int64
  const double per_item =
      4.0 * double(p.heads) * double(p.points_per_head()) * double(std::max<int64_t>(p.channels, 1));
  return per_item >= 32768.0 ? 1 : std::max<int64_t>(1, static_cast<int64_t>(32768.0 / std::max(per_item, 1.0)));
}

}  // namespace core
}  // namespace opforge
