// Numpy-style broadcasting for elementwise cores, independent of torch and ORT.
//
// Both front ends describe their operands as (shape, element strides); the
// torch extension passes real strides (so non-contiguous inputs need no copy),
// ORT passes contiguous ones. make_binary_plan() folds that into the fewest
// loop dimensions, and for_each_inner_run() walks any [begin, end) slice of
// the contiguous output, so each thread of either runtime's parallel-for
// handles its own slice with long, vectorisable inner runs.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace opforge {
namespace core {

constexpr int kMaxDims = 16;

// Element strides of a contiguous tensor of `shape` seen through broadcasting
// to `out_shape` (rank n >= rank): stride 0 on broadcast dimensions.
inline void broadcast_contiguous_strides(const int64_t* shape, int rank, const int64_t* out_shape, int n,
                                         int64_t* strides) {
  int64_t running = 1;
  for (int i = n - 1; i >= 0; --i) {
    const int j = i - (n - rank);
    const int64_t d = j >= 0 ? shape[j] : 1;
    strides[i] = (d == 1 && out_shape[i] != 1) || j < 0 ? 0 : running;
    running *= d;
  }
}

// Loop structure of out[i] = f(a[...], b[...]) with out contiguous.
struct BinaryPlan {
  int ndim = 0;               // after coalescing; dims are outermost first
  int64_t size[kMaxDims];
  int64_t stride_a[kMaxDims];  // in elements; 0 means broadcast along that dim
  int64_t stride_b[kMaxDims];
  int64_t numel = 1;
};

// Requires n <= kMaxDims (callers check and report the rank).
inline BinaryPlan make_binary_plan(int n, const int64_t* out_shape, const int64_t* sa, const int64_t* sb) {
  BinaryPlan p;
  for (int i = 0; i < n; ++i) p.numel *= out_shape[i];
  // Walk innermost -> outermost, merging a dimension into the one inside it
  // when both operands step through them as one run.
  int64_t size[kMaxDims], a[kMaxDims], b[kMaxDims];
  int m = 0;
  for (int i = n - 1; i >= 0; --i) {
    if (out_shape[i] == 1) continue;  // size-1 dims carry no iteration
    if (m > 0 && sa[i] == a[m - 1] * size[m - 1] && sb[i] == b[m - 1] * size[m - 1]) {
      size[m - 1] *= out_shape[i];
      continue;
    }
    size[m] = out_shape[i];
    a[m] = sa[i];
    b[m] = sb[i];
    ++m;
  }
  if (m == 0) {  // 0-d or all-ones: one element
    size[0] = 1;
    a[0] = b[0] = 0;
    m = 1;
  }
  p.ndim = m;
  for (int k = 0; k < m; ++k) {  // reverse back to outermost-first
    p.size[k] = size[m - 1 - k];
    p.stride_a[k] = a[m - 1 - k];
    p.stride_b[k] = b[m - 1 - k];
  }
  return p;
}

// Operand offsets of output element `linear`: the per-thread index math of
// the CUDA kernel's broadcasting path (host+device).
OPFORGE_HD_INLINE void plan_offsets(const BinaryPlan& p, int64_t linear, int64_t* offset_a, int64_t* offset_b) {
  int64_t oa = 0, ob = 0;
  for (int k = p.ndim - 1; k >= 0; --k) {
    const int64_t i = linear % p.size[k];
    linear /= p.size[k];
    oa += i * p.stride_a[k];
    ob += i * p.stride_b[k];
  }
  *offset_a = oa;
  *offset_b = ob;
}

// Calls fn(offset_a, offset_b, offset_out, count, inner_stride_a, inner_stride_b)
// for consecutive runs along the innermost dimension covering output
// elements [begin, end).
template <typename Fn>
inline void for_each_inner_run(const BinaryPlan& p, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  const int last = p.ndim - 1;
  const int64_t inner = p.size[last];
  int64_t idx[kMaxDims];
  int64_t rem = begin;
  int64_t off_a = 0, off_b = 0;
  for (int k = last; k >= 0; --k) {
    idx[k] = rem % p.size[k];
    rem /= p.size[k];
    off_a += idx[k] * p.stride_a[k];
    off_b += idx[k] * p.stride_b[k];
  }
  int64_t pos = begin;
  while (pos < end) {
    const int64_t count = (inner - idx[last]) < (end - pos) ? (inner - idx[last]) : (end - pos);
    fn(off_a, off_b, pos, count, p.stride_a[last], p.stride_b[last]);
    pos += count;
    if (pos >= end) break;
    // Advance the multi-index past the run just done (odometer carry).
    off_a += count * p.stride_a[last];
    off_b += count * p.stride_b[last];
    idx[last] += count;
    for (int k = last; k > 0 && idx[k] == p.size[k]; --k) {
      off_a -= p.size[k] * p.stride_a[k];
      off_b -= p.size[k] * p.stride_b[k];
      idx[k] = 0;
      ++idx[k - 1];
      off_a += p.stride_a[k - 1];
      off_b += p.stride_b[k - 1];
    }
  }
}

}  // namespace core
}  // namespace opforge
