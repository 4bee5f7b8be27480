// Host emulation of opforge's CUDA kernels, for tests/test_gpu_cores_emulated.py.
//
// The CUDA kernels are grid-stride loops over work-item bodies that live in
// host+device headers (core/deform_conv2d_gpu.h, core/my_add_gpu.h,
// core/ms_deform_attn_gpu.h, core/roi_align_rotated_gpu.h,
// core/nms_rotated_gpu.h). Compiled here by g++, the same bodies run item by
// item (atomics become plain adds), in the kernels' launch order: for
// deform_conv2d with the same chunking and the same GEMM geometry
// (core::deform_forward_gemm, what the ORT CUDA kernel hands cuBLAS) evaluated
// by a naive column-major GEMM; for ms_deform_attn the forward pass, and the
// backward's grad_value pass (into a zeroed buffer of the accumulation type)
// followed by its sampling-point pass; for roi_align_rotated the front end's
// checks (shapes and attributes, then the rois' values on a host copy), the
// forward items, and the backward items scattering into a zeroed buffer of the
// accumulation type; for nms_rotated the host plan (values checked, order,
// float64 geometry), the suppression-mask items in row chunks (the chunk size
// can be forced small) and the host's greedy reduction of each chunk, as
// ops/csrc/cuda/nms_rotated_cuda.cpp runs them; and the exact rotated-box IoU
// the mask items use; for grid_sample (mmdeploy::grid_sampler) the front end's
// shape and attribute checks and the forward items. So the GPU code's indexing and arithmetic are tested
// against torchvision / grid_sample, numpy references and the CPU kernels on
// machines without a GPU. Not part of the package.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/deform_conv2d.h"
#include "core/deform_conv2d_gpu.h"
#include "core/grid_sample.h"
#include "core/ms_deform_attn.h"
#include "core/ms_deform_attn_gpu.h"
#include "core/my_add_gpu.h"
#include "core/nms_rotated.h"
#include "core/nms_rotated_gpu.h"
#include "core/roi_align_rotated.h"
#include "core/roi_align_rotated_gpu.h"
#include "core/rotated_box_iou.h"

using namespace opforge::core;

namespace {

// a: [N, C, H, W, O, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask]
bool make_params(const int64_t* a, DeformConv2dParams& p) {
  const int64_t input[4] = {a[0], a[1], a[2], a[3]};
  const int64_t weight[4] = {a[4], a[1] / a[13], a[5], a[6]};
  const int64_t oh = (a[2] + 2 * a[9] - (a[11] * (a[5] - 1) + 1)) / a[7] + 1;
  const int64_t ow = (a[3] + 2 * a[10] - (a[12] * (a[6] - 1) + 1)) / a[8] + 1;
  const int64_t offset[4] = {a[0], 2 * a[14] * a[5] * a[6], oh, ow};
  const int64_t mask[4] = {a[0], a[14] * a[5] * a[6], oh, ow};
  const int64_t bias[1] = {a[4]};
  return deform_conv2d_check(input, 4, weight, 4, offset, 4, mask, 4, bias, 1, a[7], a[8], a[9], a[10], a[11], a[12],
                             a[13], a[14], a[15] != 0, p)
      .empty();
}

// Column-major C[m, n] += A[m, k] @ B[k, n], batched with strides: what
// cublasGemmStridedBatchedEx(N, N, ..., beta = 1) computes.
template <typename T>
void colmajor_gemm(const StridedGemm& g, const T* A, const T* B, T* C) {
  for (int64_t b = 0; b < g.batch; ++b) {
    const T* a = A + g.a_offset + b * g.stride_a;
    const T* bb = B + g.b_offset + b * g.stride_b;
    T* c = C + g.c_offset + b * g.stride_c;
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) {
        T acc = 0;
        for (int64_t l = 0; l < g.k; ++l) acc += a[i + l * g.lda] * bb[l + j * g.ldb];
        c[i + j * g.ldc] += acc;
      }
  }
}

template <typename T>
int forward(const int64_t* a, int64_t chunk, const T* input, const T* weight, const T* offset, const T* mask,
            const T* bias, T* out) {
  DeformConv2dParams p;
  if (!make_params(a, p)) return 1;
  const int64_t P = p.out_pixels(), total = p.batch * p.out_channels * P;
  for (int64_t i = 0; i < total; ++i) fill_bias_item(i, p.out_channels, P, bias, out);
  std::vector<T> col(chunk * p.in_channels * p.taps() * P);
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, p.batch - b0);
    for (int64_t i = 0; i < deform_gpu_items(p, images); ++i)
      deform_im2col_item<T, T>(p, i, input, offset, p.use_mask ? mask : nullptr, b0, col.data());
    for (int64_t g = 0; g < p.weight_groups; ++g) colmajor_gemm(deform_forward_gemm(p, g, b0, images), col.data(), weight, out);
  }
  return 0;
}

// The torch CUDA backward's algebra (dcol = W^T dY, dW += dY col^T per image and
// group) with naive loops, then the fused backward items.
template <typename T>
int backward(const int64_t* a, int64_t chunk, const T* grad, const T* input, const T* weight, const T* offset,
             const T* mask, T* grad_input, T* grad_weight, T* grad_offset, T* grad_mask) {
  DeformConv2dParams p;
  if (!make_params(a, p)) return 1;
  const int64_t P = p.out_pixels(), G = p.weight_groups, Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  const int64_t per_image = p.in_channels * p.taps() * P;
  std::fill(grad_input, grad_input + p.batch * p.in_channels * p.in_pixels(), T(0));
  std::fill(grad_weight, grad_weight + p.out_channels * Kg, T(0));
  std::vector<T> col(chunk * per_image), gcol(chunk * per_image);
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, p.batch - b0);
    for (int64_t i = 0; i < deform_gpu_items(p, images); ++i)
      deform_im2col_item<T, T>(p, i, input, offset, p.use_mask ? mask : nullptr, b0, col.data());
    for (int64_t bl = 0; bl < images; ++bl)
      for (int64_t g = 0; g < G; ++g) {
        const T* go = grad + ((b0 + bl) * p.out_channels + g * Og) * P;
        const T* w = weight + g * Og * Kg;
        const T* c = col.data() + (bl * G + g) * Kg * P;
        T* gc = gcol.data() + (bl * G + g) * Kg * P;
        for (int64_t r = 0; r < Kg; ++r)
          for (int64_t q = 0; q < P; ++q) {
            T acc = 0;
            for (int64_t o = 0; o < Og; ++o) acc += w[o * Kg + r] * go[o * P + q];
            gc[r * P + q] = acc;
          }
        for (int64_t o = 0; o < Og; ++o)
          for (int64_t r = 0; r < Kg; ++r) {
            T acc = 0;
            for (int64_t q = 0; q < P; ++q) acc += go[o * P + q] * c[r * P + q];
            grad_weight[(g * Og + o) * Kg + r] += acc;
          }
      }
    for (int64_t i = 0; i < deform_gpu_items(p, images); ++i)
      deform_backward_item<T, T>(p, i, input, offset, p.use_mask ? mask : nullptr, b0, gcol.data(), grad_input,
                                 grad_offset, p.use_mask ? grad_mask : nullptr);
  }
  return 0;
}

template <typename T>
int my_add(int n, const int64_t* out_shape, const int64_t* strides_a, const int64_t* strides_b, const T* x,
           const T* y, T* out) {
  const BinaryPlan plan = make_binary_plan(n, out_shape, strides_a, strides_b);
  for (int64_t i = 0; i < plan.numel; ++i) my_add_item<T, T>(plan, i, x, y, out);
  return 0;
}

// a: [N, S, M, D, Lq, L, P]. The op's shape rule and level rule, as the CUDA
// front ends apply them before launching: the items index through
// spatial_shapes / level_start_index, so they only run on accepted geometry.
bool make_ms_params(const int64_t* a, const int64_t* spatial_shapes, const int64_t* level_start_index,
                    MsDeformAttnParams& p) {
  const int64_t value[4] = {a[0], a[1], a[2], a[3]};
  const int64_t shapes[2] = {a[5], 2};
  const int64_t starts[1] = {a[5]};
  const int64_t loc[6] = {a[0], a[4], a[2], a[5], a[6], 2};
  const int64_t attn[5] = {a[0], a[4], a[2], a[5], a[6]};
  return ms_deform_attn_check(value, 4, shapes, 2, starts, 1, loc, 6, attn, 5, 1, p).empty() &&
         ms_deform_attn_check_levels(p, spatial_shapes, level_start_index).empty();
}

// launch_ms_deform_attn_forward: one pass over the channel items.
template <typename T, typename A>
int ms_forward(const int64_t* a, const int64_t* shapes, const int64_t* starts, const T* value, const T* loc,
               const T* attn, T* out) {
  MsDeformAttnParams p;
  if (!make_ms_params(a, shapes, starts, p)) return 1;
  for (int64_t i = 0; i < ms_deform_attn_channel_items(p); ++i)
    ms_deform_attn_forward_item<T, A>(p, i, value, shapes, starts, loc, attn, out);
  return 0;
}

// launch_ms_deform_attn_backward: the grad_value items scatter into a buffer of
// the accumulation type that the front end zeroed, then the point items write
// the location and weight gradients; the front end rounds the buffer to T
// (a plain copy when A is T), done here last so every output element is written.
template <typename T, typename A>
int ms_backward(const int64_t* a, const int64_t* shapes, const int64_t* starts, const T* grad_output, const T* value,
                const T* loc, const T* attn, T* grad_value, T* grad_loc, T* grad_attn) {
  MsDeformAttnParams p;
  if (!make_ms_params(a, shapes, starts, p)) return 1;
  std::vector<A> acc(p.batch * p.value_len * p.value_row(), A(0));
  for (int64_t i = 0; i < ms_deform_attn_channel_items(p); ++i)
    ms_deform_attn_grad_value_item<T, A>(p, i, grad_output, shapes, starts, loc, attn, acc.data());
  for (int64_t i = 0; i < ms_deform_attn_point_items(p); ++i)
    ms_deform_attn_grad_point_item<T, A>(p, i, grad_output, value, shapes, starts, loc, attn, grad_loc, grad_attn);
  for (size_t j = 0; j < acc.size(); ++j) grad_value[j] = ScalarIO<T, A>::store(acc[j]);
  return 0;
}

// The message of the last refused call (roi_align_rotated, nms_rotated), for the tests.
std::string last_error;

int refuse(int rc, const std::string& err) {
  last_error = err;
  return rc;
}

// a: [N, C, H, W, K, output_height, output_width, sampling_ratio, aligned, clockwise].
// What the CUDA front ends (roi_align_rotated_cuda.cpp) check before launching:
// shapes and attributes (1 when refused), then the rois' values on a host copy
// in float for float32, double for float64 (2 when refused): the items index
// the input with the batch indices and size their loops by the rois.
template <typename T>
int make_roi_params(const int64_t* a, float spatial_scale, const T* rois, RoiAlignRotatedParams& p) {
  const int64_t input[4] = {a[0], a[1], a[2], a[3]};
  const int64_t roi_shape[2] = {a[4], 6};
  std::string err = roi_align_rotated_check(input, 4, roi_shape, 2, a[5], a[6], spatial_scale, a[7], a[8] != 0,
                                            a[9] != 0, p);
  if (!err.empty()) return refuse(1, err);
  err = roi_align_rotated_check_rois<T>(p, rois);
  if (!err.empty()) return refuse(2, err);
  return 0;
}

// launch_roi_align_rotated_forward: every item writes its output element.
template <typename T, typename A>
int roi_forward(const int64_t* a, float spatial_scale, const T* input, const T* rois, T* out) {
  RoiAlignRotatedParams p;
  if (const int rc = make_roi_params(a, spatial_scale, rois, p)) return rc;
  for (int64_t i = 0; i < roi_align_rotated_items(p); ++i) roi_align_rotated_forward_item<T, A>(p, i, input, rois, out);
  return 0;
}

// The backward front end: grad_input zeroed in the accumulation type, the
// items scatter into it, then it is converted to T (grad_input.to(t)).
template <typename T, typename A>
int roi_backward(const int64_t* a, float spatial_scale, const T* grad_output, const T* rois, T* grad_input) {
  RoiAlignRotatedParams p;
  if (const int rc = make_roi_params(a, spatial_scale, rois, p)) return rc;
  std::vector<A> acc(p.batch * p.channels * p.map_size(), A(0));
  for (int64_t i = 0; i < roi_align_rotated_items(p); ++i)
    roi_align_rotated_backward_item<T, A>(p, i, grad_output, rois, acc.data());
  for (size_t j = 0; j < acc.size(); ++j) grad_input[j] = ScalarIO<T, A>::store(acc[j]);
  return 0;
}

// nms_cuda (ops/csrc/cuda/nms_rotated_cuda.cpp): the shape and threshold rule
// (the threshold as the float32 the op keeps), the host plan, then per chunk
// of rows the mask items and the greedy reduction. The mask buffer is
// at::empty on the GPU and reused across chunks: here it starts all ones, so
// a word the items failed to write would suppress boxes. chunk_rows <= 0: the
// kernel's own chunk (nms_rotated_chunk_rows). labels null: not batched.
template <typename T>
int nms(int64_t n, const T* boxes, const T* scores, const int64_t* labels, double iou_threshold, int64_t chunk_rows,
        int64_t* keep, int64_t* kept) {
  const int64_t box_shape[2] = {n, 5}, vec_shape[1] = {n};
  NmsRotatedParams p;
  std::string err = nms_rotated_check(box_shape, 2, vec_shape, 1, labels ? vec_shape : nullptr, labels ? 1 : -1,
                                      static_cast<float>(iou_threshold), p);
  if (!err.empty()) return refuse(1, err);
  NmsRotatedPlan plan;
  err = nms_rotated_prepare<T>(p, boxes, scores, labels, plan);
  if (!err.empty()) return refuse(2, err);
  std::vector<int64_t> out;
  if (n > 0) {
    const int64_t words = nms_rotated_words(n), chunk = chunk_rows > 0 ? chunk_rows : nms_rotated_chunk_rows(n);
    std::vector<uint64_t> mask(chunk * words, ~uint64_t(0));
    std::vector<uint64_t> removed(words, 0);
    for (int64_t row = 0; row < n; row += chunk) {
      const int64_t rows = std::min(chunk, n - row);
      // the instance the CUDA launcher picks for the plan (kernels.cuh: nms_rotated_mask)
      const auto item = plan.extreme ? nms_rotated_mask_item<true> : nms_rotated_mask_item<false>;
      for (int64_t i = 0; i < rows * words; ++i)
        item(n, words, row, i, plan.geometry.data(), p.batched ? plan.labels.data() : nullptr,
             static_cast<double>(p.iou_threshold), mask.data());
      nms_rotated_reduce_mask(mask.data(), row, row + rows, words, plan.order, removed, out);
    }
  }
  std::copy(out.begin(), out.end(), keep);
  *kept = static_cast<int64_t>(out.size());
  return 0;
}

}  // namespace

// grid_sample: a = [N, C, H, W, Ho, Wo, interpolation, padding, align_corners]. The ORT
// CUDA kernel's checks (grid_sample_check_attrs at kernel creation, grid_sample_check at
// run), then every item of launch_grid_sample_forward. 1: refused.
template <typename T, typename A>
int grid_forward(const int64_t* a, const T* input, const T* grid, T* out) {
  std::string err = grid_sample_check_attrs(a[6], a[7], a[8]);
  const int64_t input_shape[4] = {a[0], a[1], a[2], a[3]}, grid_shape[4] = {a[0], a[4], a[5], 2};
  GridSampleParams p;
  if (err.empty()) err = grid_sample_check(input_shape, 4, grid_shape, 4, a[6], a[7], a[8], p);
  if (!err.empty()) return refuse(1, err);
  const int64_t items = p.batch * p.channels * p.out_plane();
  for (int64_t i = 0; i < items; ++i) grid_sample_forward_item<T, A>(p, i, input, grid, out);
  return 0;
}

extern "C" {
int emu_deform_forward_f32(const int64_t* a, int64_t chunk, const float* x, const float* w, const float* o,
                           const float* m, const float* b, float* out) {
  return forward(a, chunk, x, w, o, m, b, out);
}
int emu_deform_forward_f64(const int64_t* a, int64_t chunk, const double* x, const double* w, const double* o,
                           const double* m, const double* b, double* out) {
  return forward(a, chunk, x, w, o, m, b, out);
}
int emu_deform_backward_f64(const int64_t* a, int64_t chunk, const double* g, const double* x, const double* w,
                            const double* o, const double* m, double* gx, double* gw, double* go, double* gm) {
  return backward(a, chunk, g, x, w, o, m, gx, gw, go, gm);
}
int emu_my_add_f32(int n, const int64_t* shape, const int64_t* sa, const int64_t* sb, const float* x, const float* y,
                   float* out) {
  return my_add(n, shape, sa, sb, x, y, out);
}
int emu_my_add_f64(int n, const int64_t* shape, const int64_t* sa, const int64_t* sb, const double* x,
                   const double* y, double* out) {
  return my_add(n, shape, sa, sb, x, y, out);
}
// ms_deform_attn: a = [N, S, M, D, Lq, L, P]; shapes [L, 2] and starts [L] as
// the op takes them; the accumulation type is acc<T> of cuda/scalar.cuh (T itself).
int emu_ms_deform_attn_forward_f32(const int64_t* a, const int64_t* shapes, const int64_t* starts, const float* v,
                                   const float* loc, const float* attn, float* out) {
  return ms_forward<float, float>(a, shapes, starts, v, loc, attn, out);
}
int emu_ms_deform_attn_forward_f64(const int64_t* a, const int64_t* shapes, const int64_t* starts, const double* v,
                                   const double* loc, const double* attn, double* out) {
  return ms_forward<double, double>(a, shapes, starts, v, loc, attn, out);
}
int emu_ms_deform_attn_backward_f32(const int64_t* a, const int64_t* shapes, const int64_t* starts, const float* g,
                                    const float* v, const float* loc, const float* attn, float* gv, float* gloc,
                                    float* gattn) {
  return ms_backward<float, float>(a, shapes, starts, g, v, loc, attn, gv, gloc, gattn);
}
int emu_ms_deform_attn_backward_f64(const int64_t* a, const int64_t* shapes, const int64_t* starts, const double* g,
                                    const double* v, const double* loc, const double* attn, double* gv,
                                    double* gloc, double* gattn) {
  return ms_backward<double, double>(a, shapes, starts, g, v, loc, attn, gv, gloc, gattn);
}

// roi_align_rotated: a = [N, C, H, W, K, output_height, output_width,
// sampling_ratio, aligned, clockwise]; rois [K, 6]; the accumulation type is
// acc<T> of cuda/scalar.cuh (T itself). 0: done, 1: shapes/attributes refused,
// 2: rois values refused (emu_last_error says why).
int emu_roi_align_rotated_forward_f32(const int64_t* a, float scale, const float* x, const float* rois, float* out) {
  return roi_forward<float, float>(a, scale, x, rois, out);
}
int emu_roi_align_rotated_forward_f64(const int64_t* a, float scale, const double* x, const double* rois,
                                      double* out) {
  return roi_forward<double, double>(a, scale, x, rois, out);
}
int emu_roi_align_rotated_backward_f32(const int64_t* a, float scale, const float* g, const float* rois, float* gx) {
  return roi_backward<float, float>(a, scale, g, rois, gx);
}
int emu_roi_align_rotated_backward_f64(const int64_t* a, float scale, const double* g, const double* rois,
                                       double* gx) {
  return roi_backward<double, double>(a, scale, g, rois, gx);
}
// nms_rotated / batched_nms_rotated (labels non-null): keep gets the kept
// indices (room for n), kept their count; chunk_rows <= 0: the kernel's chunk.
int emu_nms_rotated_f32(int64_t n, const float* boxes, const float* scores, const int64_t* labels, double thr,
                        int64_t chunk_rows, int64_t* keep, int64_t* kept) {
  return nms(n, boxes, scores, labels, thr, chunk_rows, keep, kept);
}
int emu_nms_rotated_f64(int64_t n, const double* boxes, const double* scores, const int64_t* labels, double thr,
                        int64_t chunk_rows, int64_t* keep, int64_t* kept) {
  return nms(n, boxes, scores, labels, thr, chunk_rows, keep, kept);
}
int64_t emu_nms_rotated_chunk_rows(int64_t n) { return nms_rotated_chunk_rows(n); }
// grid_sample (see grid_forward); float32 and float64 accumulate in their own type.
int emu_grid_sample_forward_f32(const int64_t* a, const float* x, const float* g, float* out) {
  return grid_forward<float, float>(a, x, g, out);
}
int emu_grid_sample_forward_f64(const int64_t* a, const double* x, const double* g, double* out) {
  return grid_forward<double, double>(a, x, g, out);
}
// out[i] = IoU of boxes a[i] and b[i], each (cx, cy, w, h, angle), as the mask items compute it.
void emu_rotated_box_iou(int64_t n, const double* a, const double* b, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double* p = a + 5 * i;
    const double* q = b + 5 * i;
    out[i] = rotated_box_iou(rotated_box_geometry(p[0], p[1], p[2], p[3], p[4]),
                             rotated_box_geometry(q[0], q[1], q[2], q[3], q[4]));
  }
}
const char* emu_last_error() { return last_error.c_str(); }
}
