// The CUDA kernels' per-work-item bodies for deformable convolution, written
// as plain host+device C++ (no CUDA API): the __global__ wrappers in
// cuda/deform_conv2d.cuh run one item per thread, and the test suite compiles
// this same header with g++ and runs every item in a loop (atomics become
// plain adds), so the GPU indexing and arithmetic are checked against
// torchvision even on machines without a GPU.
//
// Work item = (image b of the chunk, offset group g, kernel tap k, output
// pixel), pixel fastest so neighbouring threads touch neighbouring columns.
// Each item computes its bilinear tap ONCE (compute_tap, shared with the CPU
// core) and loops over the offset group's channels; torchvision's kernels
// recompute the tap for every channel and read the column gradient twice.
//
// Column layout (one chunk of `images` images starting at `first_image`):
// col[((bl * C + c) * kh*kw + k) * P + pixel], i.e. [images, C*kh*kw, P]; per
// image and weight group a [Kg, P] block that a batched GEMM consumes as is.
//
// Types: T is the storage type, A the accumulation type (float for the 16-bit
// types). ScalarIO<T, A> (host_device.h) converts.
#pragma once

#include <cstdint>

#include "deform_conv2d_tap.h"
#include "host_device.h"

namespace opforge {
namespace core {

// Images per column chunk: the chunk's column buffer (images * C*kh*kw*P
// elements of elem_bytes) stays within budget_bytes, with at least one image.
// Chunking batches many images into one GEMM launch (small images would
// underfill the GPU one by one) while bounding memory for large ones.
inline int64_t deform_gpu_chunk_images(const DeformConv2dParams& p, int64_t elem_bytes, int64_t budget_bytes) {
  const int64_t per_image = p.in_channels * p.taps() * p.out_pixels() * elem_bytes;
  int64_t images = per_image > 0 ? budget_bytes / per_image : p.batch;
  if (images < 1) images = 1;
  return images < p.batch ? images : p.batch;
}

// Work items of a chunk of `images` images.
OPFORGE_HD_INLINE int64_t deform_gpu_items(const DeformConv2dParams& p, int64_t images) {
  return images * p.offset_groups * p.taps() * p.out_pixels();
}

struct DeformItem {
  int64_t image_in_chunk, image, group, tap, pixel;
};

OPFORGE_HD_INLINE DeformItem deform_item(const DeformConv2dParams& p, int64_t item, int64_t first_image) {
  const int64_t P = p.out_pixels(), kk = p.taps();
  DeformItem it;
  it.pixel = item % P;
  item /= P;
  it.tap = item % kk;
  item /= kk;
  it.group = item % p.offset_groups;
  it.image_in_chunk = item / p.offset_groups;
  it.image = first_image + it.image_in_chunk;
  return it;
}

template <typename T, typename A>
OPFORGE_HD_INLINE Tap<A> deform_item_tap(const DeformConv2dParams& p, const DeformItem& it, const T* offset,
                                         const T* mask, A* mask_value) {
  using IO = ScalarIO<T, A>;
  const int64_t P = p.out_pixels(), kk = p.taps(), G = p.offset_groups;
  const T* off = offset + ((it.image * G + it.group) * 2 * kk + 2 * it.tap) * P + it.pixel;
  const A mv = p.use_mask ? IO::load(mask[((it.image * G + it.group) * kk + it.tap) * P + it.pixel]) : A(1);
  *mask_value = mv;
  return compute_tap<A>(p, it.pixel / p.out_w, it.pixel % p.out_w, it.tap / p.kernel_w, it.tap % p.kernel_w,
                        IO::load(off[0]), IO::load(off[P]), mv);
}

// Forward sampling: fills the column entries of one item for every channel of
// its offset group.
template <typename T, typename A>
OPFORGE_HD_INLINE void deform_im2col_item(const DeformConv2dParams& p, int64_t item, const T* input,
                                          const T* offset, const T* mask, int64_t first_image, T* col) {
  using IO = ScalarIO<T, A>;
  const DeformItem it = deform_item(p, item, first_image);
  A mv;
  const Tap<A> t = deform_item_tap<T, A>(p, it, offset, mask, &mv);
  const int64_t C = p.in_channels, HW = p.in_pixels(), kk = p.taps(), P = p.out_pixels();
  const int64_t c0 = it.group * p.channels_per_offset_group();
  const T* plane = input + (it.image * C + c0) * HW;
  T* dst = col + ((it.image_in_chunk * C + c0) * kk + it.tap) * P + it.pixel;
  for (int64_t c = 0; c < p.channels_per_offset_group(); ++c, plane += HW, dst += kk * P) {
    const A v = t.w[0] * IO::load(plane[t.idx[0]]) + t.w[1] * IO::load(plane[t.idx[1]]) +
                t.w[2] * IO::load(plane[t.idx[2]]) + t.w[3] * IO::load(plane[t.idx[3]]);
    *dst = IO::store(v);
  }
}

// Backward sampling, fused: from the column gradient of one item, scatter
// grad_input (the adjoint of the sampling; atomics, several items hit one
// input pixel) and compute that item's grad_offset pair and grad_mask
// (written, each item owns them). Formulas: torchvision's
// deformable_col2im / deformable_col2im_coord, as the CPU core.
// grad_input is in A (float for 16-bit T) so the atomics accumulate exactly.
template <typename T, typename A>
OPFORGE_HD_INLINE void deform_backward_item(const DeformConv2dParams& p, int64_t item, const T* input,
                                            const T* offset, const T* mask, int64_t first_image, const T* grad_col,
                                            A* grad_input, T* grad_offset, T* grad_mask) {
  using IO = ScalarIO<T, A>;
  const DeformItem it = deform_item(p, item, first_image);
  A mv;
  const Tap<A> t = deform_item_tap<T, A>(p, it, offset, mask, &mv);
  const int64_t C = p.in_channels, HW = p.in_pixels(), kk = p.taps(), P = p.out_pixels(), G = p.offset_groups;
  const int64_t c0 = it.group * p.channels_per_offset_group();
  const T* plane = input + (it.image * C + c0) * HW;
  A* gplane = grad_input + (it.image * C + c0) * HW;
  const T* gc = grad_col + ((it.image_in_chunk * C + c0) * kk + it.tap) * P + it.pixel;
  const A lh = t.frac_h, lw = t.frac_w, hh = A(1) - lh, hw = A(1) - lw;
  const bool v0 = t.valid & 1, v1 = t.valid & 2, v2 = t.valid & 4, v3 = t.valid & 8;
  A acc_h = 0, acc_w = 0, acc_m = 0;
  for (int64_t c = 0; c < p.channels_per_offset_group(); ++c, plane += HW, gplane += HW, gc += kk * P) {
    const A g = IO::load(*gc);
    if (v0) atomic_add_hd(gplane + t.idx[0], t.w[0] * g);
    if (v1) atomic_add_hd(gplane + t.idx[1], t.w[1] * g);
    if (v2) atomic_add_hd(gplane + t.idx[2], t.w[2] * g);
    if (v3) atomic_add_hd(gplane + t.idx[3], t.w[3] * g);
    const A x0 = v0 ? IO::load(plane[t.idx[0]]) : A(0), x1 = v1 ? IO::load(plane[t.idx[1]]) : A(0);
    const A x2 = v2 ? IO::load(plane[t.idx[2]]) : A(0), x3 = v3 ? IO::load(plane[t.idx[3]]) : A(0);
    // d bilinear/dy, d bilinear/dx (torchvision's get_coordinate_weight: no window check)
    acc_h += g * (lw * (x3 - x1) + hw * (x2 - x0));
    acc_w += g * (lh * (x3 - x2) + hh * (x1 - x0));
    acc_m += g * (hh * hw * x0 + hh * lw * x1 + lh * hw * x2 + lh * lw * x3);
  }
  T* go = grad_offset + ((it.image * G + it.group) * 2 * kk + 2 * it.tap) * P + it.pixel;
  go[0] = IO::store(mv * acc_h);
  go[P] = IO::store(mv * acc_w);
  if (p.use_mask) grad_mask[((it.image * G + it.group) * kk + it.tap) * P + it.pixel] = IO::store(t.inside || t.nan_point ? acc_m : A(0));
}

// The forward GEMM of one weight group over a chunk, as a column-major
// strided-batched GEMM C = A @ B (cuBLAS's convention, no transposes), batched
// over the chunk's images. Row-major out[b, g] [Og, P] += W_g [Og, Kg] @
// col[b, g] [Kg, P] is, column-major, out^T [P, Og] += col^T [P, Kg] @ W_g^T
// [Kg, Og]. Offsets are in elements from the col / weight / out base pointers.
struct StridedGemm {
  int64_t m, n, k;
  int64_t a_offset, lda, stride_a;  // A = the chunk's columns
  int64_t b_offset, ldb, stride_b;  // B = the group's weight (shared: stride 0)
  int64_t c_offset, ldc, stride_c;  // C = the output
  int64_t batch;
};

OPFORGE_HD_INLINE StridedGemm deform_forward_gemm(const DeformConv2dParams& p, int64_t group, int64_t first_image,
                                                  int64_t images) {
  const int64_t P = p.out_pixels(), Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  StridedGemm g;
  g.m = P;
  g.n = Og;
  g.k = Kg;
  g.a_offset = group * Kg * P;
  g.lda = P;
  g.stride_a = p.weight_groups * Kg * P;
  g.b_offset = group * Og * Kg;
  g.ldb = Kg;
  g.stride_b = 0;
  g.c_offset = (first_image * p.out_channels + group * Og) * P;
  g.ldc = P;
  g.stride_c = p.out_channels * P;
  g.batch = images;
  return g;
}

// out[b, o, pixel] = bias[o]: the GEMM then accumulates onto it (beta = 1).
template <typename T>
OPFORGE_HD_INLINE void fill_bias_item(int64_t item, int64_t out_channels, int64_t pixels, const T* bias, T* out) {
  out[item] = bias[(item / pixels) % out_channels];
}

}  // namespace core
}  // namespace opforge
