// The CUDA kernels' per-work-item bodies for multi-scale deformable attention,
// written as plain host+device C++ (no CUDA API): the __global__ wrappers in
// cuda/ms_deform_attn.cuh run one item per thread, and a host program can
// compile this header with g++ and run every item in a loop (atomics become
// plain adds) to check the GPU indexing and arithmetic without a GPU.
//
// Work items:
//   forward, grad_value: one output element (n, q, m, d), d fastest, so the
//     threads of a warp read (and scatter into) consecutive channels of the
//     same corner rows: coalesced loads and atomics. Each thread walks the
//     head's L*P points; the point's data is the same for the whole warp
//     (broadcast loads).
//   grad of the point: one sampling point (n, q, m, l, p): its gradients are
//     dot products over D, so one thread owns them (no reduction across threads).
// Sampling (corners, weights, the NaN / outside rules) is the CPU core's
// (ms_deform_attn_sample.h); each term is (aw * w_k) * v_k as on the CPU.
//
// Types: T is the storage type, A the accumulation type (float for the 16-bit
// types). ScalarIO<T, A> (host_device.h) converts.
#pragma once

#include <cstdint>

#include "host_device.h"
#include "ms_deform_attn_sample.h"

namespace opforge {
namespace core {

// Items of the forward and of the grad_value pass: N * Lq * M * D.
OPFORGE_HD_INLINE int64_t ms_deform_attn_channel_items(const MsDeformAttnParams& p) {
  return p.batch * p.queries * p.heads * p.channels;
}

// Items of the sampling-point gradient pass: N * Lq * M * L * P.
OPFORGE_HD_INLINE int64_t ms_deform_attn_point_items(const MsDeformAttnParams& p) {
  return p.batch * p.queries * p.heads * p.points_per_head();
}

// out[n, q, m*D + d] for item = ((n * Lq + q) * M + m) * D + d, which is also its output index.
template <typename T, typename A>
OPFORGE_HD_INLINE void ms_deform_attn_forward_item(const MsDeformAttnParams& p, int64_t item, const T* value,
                                                   const int64_t* spatial_shapes, const int64_t* level_start_index,
                                                   const T* sampling_locations, const T* attention_weights, T* out) {
  using IO = ScalarIO<T, A>;
  const int64_t D = p.channels, head = item / D, d = item % D;  // head = (n, q, m)
  const int64_t m = head % p.heads, n = head / (p.heads * p.queries), row = p.value_row();
  const T* image = value + n * p.value_len * row + m * D + d;
  const int64_t P = p.points;
  A acc = A(0);
  for (int64_t l = 0; l < p.levels; ++l) {
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    const T* level = image + level_start_index[l] * row;
    for (int64_t pt = (head * p.levels + l) * P, pt_end = pt + P; pt < pt_end; ++pt) {
      const A aw = IO::load(attention_weights[pt]);
      const MsDeformAttnCorners<A> c = ms_deform_attn_corners<A>(IO::load(sampling_locations[2 * pt]),
                                                                 IO::load(sampling_locations[2 * pt + 1]), h, w);
      // A point that samples nothing adds aw * 0: 0, or NaN for a non-finite weight (as on the CPU).
      if (c.valid == 0) acc += aw * A(0);
      for (int k = 0; k < 4; ++k)
        if (c.valid & (1u << k)) acc += (aw * c.w[k]) * IO::load(level[c.pos[k] * row]);
    }
  }
  out[item] = IO::store(acc);
}

// grad_value (in A, zeroed by the caller) += the adjoint of the sampling, for
// the same items as the forward: item (n, q, m, d) scatters its grad_output
// element into the corners of each of the head's points. Atomics: several
// queries' points share a corner.
template <typename T, typename A>
OPFORGE_HD_INLINE void ms_deform_attn_grad_value_item(const MsDeformAttnParams& p, int64_t item,
                                                      const T* grad_output, const int64_t* spatial_shapes,
                                                      const int64_t* level_start_index, const T* sampling_locations,
                                                      const T* attention_weights, A* grad_value) {
  using IO = ScalarIO<T, A>;
  const int64_t D = p.channels, head = item / D, d = item % D;
  const int64_t m = head % p.heads, n = head / (p.heads * p.queries), row = p.value_row();
  A* grad_image = grad_value + n * p.value_len * row + m * D + d;
  const A g = IO::load(grad_output[item]);
  const int64_t P = p.points;
  for (int64_t l = 0; l < p.levels; ++l) {
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    A* grad_level = grad_image + level_start_index[l] * row;
    for (int64_t pt = (head * p.levels + l) * P, pt_end = pt + P; pt < pt_end; ++pt) {
      const A aw = IO::load(attention_weights[pt]);
      const MsDeformAttnCorners<A> c = ms_deform_attn_corners<A>(IO::load(sampling_locations[2 * pt]),
                                                                 IO::load(sampling_locations[2 * pt + 1]), h, w);
      for (int k = 0; k < 4; ++k)
        if (c.valid & (1u << k)) atomic_add_hd(grad_level + c.pos[k] * row, (aw * c.w[k]) * g);
    }
  }
}

// grad_sampling_locations[pt, :] and grad_attention_weights[pt] of one sampling
// point, item = pt = (((n * Lq + q) * M + m) * L + l) * P + p. Same formulas as
// the CPU core's backward.
template <typename T, typename A>
OPFORGE_HD_INLINE void ms_deform_attn_grad_point_item(const MsDeformAttnParams& p, int64_t item,
                                                      const T* grad_output, const T* value,
                                                      const int64_t* spatial_shapes, const int64_t* level_start_index,
                                                      const T* sampling_locations, const T* attention_weights,
                                                      T* grad_sampling_locations, T* grad_attention_weights) {
  using IO = ScalarIO<T, A>;
  const int64_t D = p.channels, head = item / p.points_per_head(), l = (item / p.points) % p.levels;
  const int64_t m = head % p.heads, n = head / (p.heads * p.queries), row = p.value_row();
  const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
  const A aw = IO::load(attention_weights[item]);
  const MsDeformAttnCorners<A> c = ms_deform_attn_corners<A>(IO::load(sampling_locations[2 * item]),
                                                             IO::load(sampling_locations[2 * item + 1]), h, w);
  A dot[4] = {A(0), A(0), A(0), A(0)};  // grad_output . value at each corner
  if (c.valid != 0) {
    const T* g = grad_output + head * D;
    const T* level = value + (n * p.value_len + level_start_index[l]) * row + m * D;
    for (int k = 0; k < 4; ++k) {
      if (!(c.valid & (1u << k))) continue;
      const T* v = level + c.pos[k] * row;
      for (int64_t d = 0; d < D; ++d) dot[k] += IO::load(g[d]) * IO::load(v[d]);
    }
  }
  A dx[4], dy[4];
  ms_deform_attn_weight_derivatives(c, dx, dy);
  A sample = A(0), along_x = A(0), along_y = A(0);
  for (int k = 0; k < 4; ++k) {
    sample += c.w[k] * dot[k];
    along_x += dx[k] * dot[k];
    along_y += dy[k] * dot[k];
  }
  grad_attention_weights[item] = IO::store(sample);
  grad_sampling_locations[2 * item] = IO::store(c.valid ? aw * along_x * static_cast<A>(w) : A(0));
  grad_sampling_locations[2 * item + 1] = IO::store(c.valid ? aw * along_y * static_cast<A>(h) : A(0));
}

}  // namespace core
}  // namespace opforge
