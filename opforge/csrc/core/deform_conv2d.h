// Deformable convolution v1/v2 (torchvision semantics): the compute core shared
// by the torch extension (opforge::deform_conv2d) and the ORT kernel. Plain C++
// templates over the scalar type; no torch, ORT or BLAS types: the caller
// provides parallel-for and GEMM.
//
//   out[n, o, y, x] = bias[o] + sum_{c in group(o), i, j} weight[o, c, i, j] *
//                     mask[n, g(c), i, j, y, x] * bilinear(input[n, c], py, px)
//   py = y*stride_h - pad_h + i*dil_h + offset[n, g(c), (i*kw+j), 0, y, x]
//   px = x*stride_w - pad_w + j*dil_w + offset[n, g(c), (i*kw+j), 1, y, x]
//
// Layout conventions (all contiguous, NCHW): offset is [N, 2*G*kh*kw, oh, ow]
// with (dy, dx) pairs per kernel tap, mask is [N, G*kh*kw, oh, ow], weight is
// [O, C/wg, kh, kw]. G = offset groups, wg = weight groups.
//
// Speed: the bilinear taps (4 corner indices + 4 weights, mask folded in) of an
// (offset group, kernel tap, pixel) are computed ONCE and reused for every
// channel of the offset group, so the per-channel inner loop is 4 gathers and
// 4 FMAs. Columns are built per pixel tile (im2col_tile) so a tile's columns
// stay in cache for the GEMM that consumes them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "channel_rows.h"
#include "cpu_dispatch.h"
#include "deform_conv2d_tap.h"
#include "format.h"
#include "gemm.h"
#include "layout.h"
#include "shape.h"

namespace opforge {
namespace core {

// The output size of one spatial dimension, torchvision's rule: (size + 2*pad -
// (dil*(k-1) + 1)) / stride + 1 with C++ division (truncates toward zero: a
// kernel up to stride-1 wider than the padded input still gives one output).
// Returns false when an intermediate overflows int64 (a shape rule evaluated
// with wrapped products would accept absurd arguments and the kernel would
// then read out of bounds).
inline bool deform_conv2d_out_size(int64_t size, int64_t pad, int64_t dil, int64_t k, int64_t stride, int64_t* out) {
  int64_t extent, pad2, span;
  if (!mul_fits(dil, k - 1, &extent) || !add_fits(extent, 1, &extent) || !mul_fits(2, pad, &pad2) ||
      !add_fits(size, pad2, &span))
    return false;
  *out = (span - extent) / stride + 1;  // span, extent >= 0: no overflow
  return true;
}

// The same for a Dim that may be symbolic. A symbolic size divides only a
// non-negative numerator, where C++'s truncation and a symbolic size's floor
// division agree.
template <typename Dim>
bool deform_conv2d_out_size(const Dim& size, int64_t pad, int64_t dil, const Dim& k, int64_t stride, Dim* out) {
  const std::optional<int64_t> size_value = known(size), k_value = known(k);
  if (size_value && k_value) {
    int64_t value;
    if (!deform_conv2d_out_size(*size_value, pad, dil, *k_value, stride, &value)) return false;
    *out = Dim(value);
    return true;
  }
  int64_t pad2;
  if (!mul_fits(2, pad, &pad2)) return false;
  const Dim extent = (k - 1) * dil + 1, span = size + pad2;
  *out = span >= extent ? (span - extent) / stride + 1 : Dim(1) - (extent - span) / stride;
  return true;
}

// The rules on the integer attributes alone: the ORT kernels apply them when
// the node's kernel is created (a bad attribute fails the session), and
// the shape rule repeats them for torch.
inline std::string deform_conv2d_check_attrs(int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                             int64_t dil_h, int64_t dil_w, int64_t weight_groups,
                                             int64_t offset_groups) {
  const std::string op = "opforge::deform_conv2d: ";
  const auto pair = [](int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; };
  if (stride_h <= 0 || stride_w <= 0) return op + "stride must be positive, got " + pair(stride_h, stride_w);
  if (dil_h <= 0 || dil_w <= 0) return op + "dilation must be positive, got " + pair(dil_h, dil_w);
  if (pad_h < 0 || pad_w < 0) return op + "padding must be non-negative, got " + pair(pad_h, pad_w);
  if (weight_groups <= 0) return op + "groups must be positive, got " + std::to_string(weight_groups);
  if (offset_groups <= 0) return op + "offset_groups must be positive, got " + std::to_string(offset_groups);
  return "";
}

// Largest input plane (H*W pixels) the kernels address: bilinear tap corners are
// 32-bit plane indices (core/deform_conv2d_tap.h) to halve the tap tables.
constexpr int64_t kDeformMaxPlanePixels = 2147483647;

// Which dimension of offset / mask is wrong, in torchvision's words (code that
// matches torchvision's messages, e.g. r"mask.shape\[1\] is not valid", keeps
// working); the full expected shape follows.
inline std::string shape_mismatch_phrase(const char* name, int dim) {
  const std::string n = name;
  if (dim == 0) return "invalid batch size of " + n;
  if (dim == 1) return n + ".shape[1] is not valid";
  return n + " output dims do not match the computed output dims";
}

// What deform_conv2d's shape rule reads (the schema's arguments, each tensor by
// its shape). mask is read only when use_mask; an absent mask (ORT's omitted
// input) is a Shape with present = false. bias is required ([O]; torch passes
// zeros for "no bias").
template <typename Dim>
struct DeformConv2dShapes {
  Shape<Dim> input, weight, offset, mask, bias;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1, offset_groups = 1;
  bool use_mask = false;
};

// deform_conv2d's shape rule: checks every argument against torchvision's
// contract and gives the output's shape [N, O, out_h, out_w] in `out`. Returns
// "" when valid, else a message naming op and argument; every front end raises
// it (torch CPU/CUDA and the fake impl: Python exception, ORT CPU/CUDA: error
// status). All arithmetic on known sizes is overflow-checked, group counts are
// bounded by the channel count (C = 0 would otherwise accept 2^62 groups, each
// an empty loop) and every buffer size the kernels compute fits int64.
template <typename Dim>
std::string deform_conv2d_output_shapes(const DeformConv2dShapes<Dim>& in, std::vector<std::vector<Dim>>& out) {
  const std::string op = "opforge::deform_conv2d: ";
  if (in.input.rank() != 4) return message(op, "input must be 4-D [N, C, H, W], got shape ", in.input);
  if (in.weight.rank() != 4) return message(op, "weight must be 4-D [O, C/groups, kh, kw], got shape ", in.weight);
  if (in.offset.rank() != 4)
    return message(op, "offset must be 4-D [N, 2*offset_groups*kh*kw, oh, ow], got shape ", in.offset);
  if (std::string err = deform_conv2d_check_attrs(in.stride_h, in.stride_w, in.pad_h, in.pad_w, in.dil_h, in.dil_w,
                                                  in.groups, in.offset_groups);
      !err.empty())
    return err;
  const Dim &N = in.input[0], &C = in.input[1], &H = in.input[2], &W = in.input[3];
  const Dim &O = in.weight[0], &kh = in.weight[2], &kw = in.weight[3];
  const int64_t groups = in.groups, offset_groups = in.offset_groups;
  if (kh <= 0 || kw <= 0) return message(op, "weight has an empty kernel, shape ", in.weight);
  if (groups > 1 && C < groups) return message(op, "groups (", groups, ") exceeds the input channels (", C, ")");
  if (offset_groups > 1 && C < offset_groups)
    return message(op, "offset_groups (", offset_groups, ") exceeds the input channels (", C, ")");
  if (C % groups != 0) return message(op, "groups (", groups, ") must divide input channels (", C, ")");
  if (O % groups != 0)
    return message(op, "groups (", groups, ") must divide output channels (weight.size(0) = ", O, ")");
  const std::optional<int64_t> weight_c = known(in.weight[1]);
  int64_t product;
  if ((weight_c && !mul_fits(*weight_c, groups, &product)) || in.weight[1] * groups != C)
    return message(op, "weight.size(1) * groups must equal input channels: ", in.weight[1], " * ", groups, " != ", C);
  if (C % offset_groups != 0)
    return message(op, "offset_groups (", offset_groups, ") must divide input channels (", C, ")");
  Dim out_h = H, out_w = W;
  if (!deform_conv2d_out_size(H, in.pad_h, in.dil_h, kh, in.stride_h, &out_h))
    return message(op, "padding (", in.pad_h, "), dilation (", in.dil_h, ") or kernel height (", kh,
                   ") too large: the padded height or the kernel extent overflows int64");
  if (!deform_conv2d_out_size(W, in.pad_w, in.dil_w, kw, in.stride_w, &out_w))
    return message(op, "padding (", in.pad_w, "), dilation (", in.dil_w, ") or kernel width (", kw,
                   ") too large: the padded width or the kernel extent overflows int64");
  if (out_h <= 0 || out_w <= 0)
    return message(op, "output would be empty: input ", in.input, " with kernel (", kh, ", ", kw,
                   "), padding, dilation and stride gives (", out_h, ", ", out_w, ")");
  // The counts the kernels compute, where the sizes are numbers (always in the kernels).
  if (const auto k = known_all(std::vector<Dim>{kh, kw}); k) {
    int64_t taps, channels;
    if (!mul_fits((*k)[0], (*k)[1], &taps) || !mul_fits(offset_groups, taps, &channels) ||
        !mul_fits(2, channels, &channels))
      return message(op, "2 * offset_groups * kh * kw overflows int64 (offset_groups = ", offset_groups, ", kernel ",
                     kh, " x ", kw, ")");
  }
  if (const auto d = known_all(std::vector<Dim>{N, O, out_h, out_w, C, kh, kw}); d) {
    const int64_t n = (*d)[0], o = (*d)[1], oh = (*d)[2], ow = (*d)[3], c = (*d)[4];
    // the output, and the column buffer C*kh*kw x out_h*out_w, in bytes of any dtype (16 bounds them)
    if (!numel_fits({n, o, oh, ow}, 16) || !numel_fits({c, (*d)[5], (*d)[6], oh, ow}, 16))
      return message(op, "output [", n, ", ", o, ", ", oh, ", ", ow, "]",
                     " or its column buffer (C*kh*kw x out_h*out_w) has more elements than int64 can count");
  }
  if (const auto hw = known_all(std::vector<Dim>{H, W}); hw) {
    int64_t plane;
    if (!mul_fits((*hw)[0], (*hw)[1], &plane) || plane > kDeformMaxPlanePixels)
      return message(op, "input plane H x W = ", H, " x ", W, " exceeds the kernel's limit of ", kDeformMaxPlanePixels,
                     " pixels (32-bit sample indices)");
  }
  const Dim mask_channels = kh * kw * offset_groups;
  const Shape<Dim> want_offset{{N, mask_channels * 2, out_h, out_w}};
  for (int i = 0; i < 4; ++i)
    if (in.offset[i] != want_offset[i])
      return message(op, shape_mismatch_phrase("offset", i), ": offset must have shape ", want_offset,
                     " (N, 2*offset_groups*kh*kw, out_h, out_w), got ", in.offset);
  if (in.use_mask) {
    const Shape<Dim> want_mask{{N, mask_channels, out_h, out_w}};
    if (!in.mask.present || in.mask.rank() != 4)
      return message(op, "mask must be 4-D ", want_mask, " when use_mask is true, got shape ",
                     in.mask.present ? in.mask : Shape<Dim>{});
    for (int i = 0; i < 4; ++i)
      if (in.mask[i] != want_mask[i])
        return message(op, shape_mismatch_phrase("mask", i), ": mask must have shape ", want_mask,
                       " (N, offset_groups*kh*kw, out_h, out_w), got ", in.mask);
  }
  if (!(in.bias.rank() == 1 && in.bias[0] == O)) return message(op, "bias must have shape [", O, "], got ", in.bias);
  out = {{N, O, out_h, out_w}};
  return "";
}

// The rule for the kernels, on (pointer, rank) shapes: fills p (incl. out_h /
// out_w). mask may be null when !use_mask.
inline std::string deform_conv2d_check(const int64_t* input, int input_rank, const int64_t* weight, int weight_rank,
                                       const int64_t* offset, int offset_rank, const int64_t* mask, int mask_rank,
                                       const int64_t* bias, int bias_rank, int64_t stride_h, int64_t stride_w,
                                       int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w,
                                       int64_t weight_groups, int64_t offset_groups, bool use_mask,
                                       DeformConv2dParams& p) {
  DeformConv2dShapes<int64_t> in;
  in.input = shape_of(input, input_rank);
  in.weight = shape_of(weight, weight_rank);
  in.offset = shape_of(offset, offset_rank);
  in.mask = mask ? shape_of(mask, mask_rank) : Shape<int64_t>{{}, false};
  in.bias = shape_of(bias, bias_rank);
  in.stride_h = stride_h, in.stride_w = stride_w, in.pad_h = pad_h, in.pad_w = pad_w;
  in.dil_h = dil_h, in.dil_w = dil_w, in.groups = weight_groups, in.offset_groups = offset_groups;
  in.use_mask = use_mask;
  std::vector<std::vector<int64_t>> out;
  if (std::string err = deform_conv2d_output_shapes(in, out); !err.empty()) return err;
  p = DeformConv2dParams{};
  p.batch = input[0], p.in_channels = input[1], p.in_h = input[2], p.in_w = input[3];
  p.out_channels = weight[0], p.kernel_h = weight[2], p.kernel_w = weight[3];
  p.out_h = out[0][2], p.out_w = out[0][3];
  p.stride_h = stride_h, p.stride_w = stride_w, p.pad_h = pad_h, p.pad_w = pad_w, p.dil_h = dil_h, p.dil_w = dil_w;
  p.weight_groups = weight_groups, p.offset_groups = offset_groups, p.use_mask = use_mask;
  return "";
}

// The bilinear taps of one (offset group, kernel tap) over a run of pixels, SoA.
// idx: corner element index in the channel plane (0 when the corner is outside;
// its weight is then 0). w: forward weights (bilinear * mask, 0 outside the
// sampling window like torchvision). For the backward pass, also the
// fractional parts and per-corner validity for coordinate gradients.
template <typename T>
struct TapTable {
  int64_t n = 0;
  std::vector<int32_t> idx[4];
  std::vector<T> w[4];
  // backward extras
  std::vector<T> frac_h, frac_w, mask;
  std::vector<uint8_t> valid;  // bit k set: corner k inside the image
  std::vector<uint8_t> inside;  // sampling point inside (-1, H) x (-1, W), or NaN: grad_mask is taken

  void resize(int64_t count, bool with_backward) {
    n = count;
    for (int k = 0; k < 4; ++k) {
      idx[k].resize(count);
      w[k].resize(count);
    }
    if (with_backward) {
      frac_h.resize(count);
      frac_w.resize(count);
      mask.resize(count);
      valid.resize(count);
      inside.resize(count);
    }
  }
};

// Fills taps for image b, offset group g, kernel tap k, output pixels [p0, p0 + count).
// adjoint: weights for the grad_input scatter, 0 on corners outside the image
// (the forward weights of a NaN tap are NaN on every corner; see compute_tap).
template <typename T>
inline void build_taps(const DeformConv2dParams& p, const T* offset, const T* mask, int64_t b, int64_t g, int64_t k,
                       int64_t p0, int64_t count, TapTable<T>& t, bool with_backward, bool adjoint = false) {
  const int64_t P = p.out_pixels();
  const int64_t i = k / p.kernel_w, j = k % p.kernel_w;
  const T* off_h = offset + ((b * p.offset_groups + g) * 2 * p.taps() + 2 * k) * P;
  const T* off_w = off_h + P;
  const T* m = p.use_mask ? mask + ((b * p.offset_groups + g) * p.taps() + k) * P : nullptr;
  for (int64_t q = 0; q < count; ++q) {
    const int64_t pix = p0 + q;
    const T mv = m ? m[pix] : T(1);
    const Tap<T> tap = compute_tap(p, pix / p.out_w, pix % p.out_w, i, j, off_h[pix], off_w[pix], mv);
    for (int c = 0; c < 4; ++c) {
      t.idx[c][q] = tap.idx[c];
      t.w[c][q] = (adjoint && !(tap.valid & (1 << c))) ? T(0) : tap.w[c];
    }
    if (with_backward) {
      t.frac_h[q] = tap.frac_h;
      t.frac_w[q] = tap.frac_w;
      t.mask[q] = mv;
      t.valid[q] = tap.valid;
      t.inside[q] = (tap.inside || tap.nan_point) ? 1 : 0;
    }
  }
}

// ---- channels-last forward: no gathers ----------------------------------------------
// With the input in NHWC, the 4 corners of a tap are 4 contiguous runs of
// channels, shared by all channels of the offset group: the column entries of
// one (pixel, tap) are 4 vector FMAs over channels. Columns are written
// pixel-major ("colT"): colT[q * ldk + (wg * kh*kw + k) * Cg + c_local], i.e.
// per weight group a [pixels, kh*kw*Cg] block whose K order (k, c) matches
// the weight permuted to [O, kh, kw, Cg] (see weight_to_tap_major).

template <typename T>
OPFORGE_ALWAYS_INLINE void im2col_nhwc_tile_impl(const DeformConv2dParams& p, const T* input_nhwc, const T* offset,
                                                 const T* mask, int64_t b, int64_t p0, int64_t count, T* colT,
                                                 int64_t ldk) {
  const int64_t C = p.in_channels, kk = p.taps(), P = p.out_pixels(), cpg = p.channels_per_offset_group();
  const int64_t Cg = p.in_channels_per_group();
  const T* img = input_nhwc + b * p.in_pixels() * C;
  for (int64_t g = 0; g < p.offset_groups; ++g) {
    const T* off = offset + (b * p.offset_groups + g) * 2 * kk * P;
    const T* m = p.use_mask ? mask + (b * p.offset_groups + g) * kk * P : nullptr;
    const int64_t c_lo = g * cpg, c_hi = c_lo + cpg;
    for (int64_t q = 0; q < count; ++q) {
      const int64_t pix = p0 + q, oy = pix / p.out_w, ox = pix % p.out_w;
      T* row = colT + q * ldk;
      for (int64_t k = 0; k < kk; ++k) {
        const Tap<T> t = compute_tap(p, oy, ox, k / p.kernel_w, k % p.kernel_w, off[(2 * k) * P + pix],
                                     off[(2 * k + 1) * P + pix], m ? m[k * P + pix] : T(1));
        // channels [c_lo, c_hi) may span weight groups: write each piece into its group's block
        for (int64_t c = c_lo; c < c_hi;) {
          const int64_t wg = c / Cg, c_end = std::min(c_hi, (wg + 1) * Cg);
          T* dst = row + (wg * kk + k) * Cg + (c - wg * Cg);
          blend4(img + t.idx[0] * C + c, img + t.idx[1] * C + c, img + t.idx[2] * C + c, img + t.idx[3] * C + c,
                 t.w[0], t.w[1], t.w[2], t.w[3], dst, c_end - c);
          c = c_end;
        }
      }
    }
  }
}

template <typename T>
inline void im2col_nhwc_tile_base(const DeformConv2dParams& p, const T* in, const T* off, const T* m, int64_t b,
                                  int64_t p0, int64_t count, T* colT, int64_t ldk) {
  im2col_nhwc_tile_impl(p, in, off, m, b, p0, count, colT, ldk);
}
#if OPFORGE_X86_DISPATCH
template <typename T>
OPFORGE_TARGET_AVX2 void im2col_nhwc_tile_avx2(const DeformConv2dParams& p, const T* in, const T* off, const T* m,
                                               int64_t b, int64_t p0, int64_t count, T* colT, int64_t ldk) {
  im2col_nhwc_tile_impl(p, in, off, m, b, p0, count, colT, ldk);
}
template <typename T>
OPFORGE_TARGET_AVX512 void im2col_nhwc_tile_avx512(const DeformConv2dParams& p, const T* in, const T* off,
                                                   const T* m, int64_t b, int64_t p0, int64_t count, T* colT,
                                                   int64_t ldk) {
  im2col_nhwc_tile_impl(p, in, off, m, b, p0, count, colT, ldk);
}
#endif

// colT tile for image b, pixels [p0, p0 + count); input_nhwc is [N, H, W, C].
template <typename T>
inline void im2col_nhwc_tile(const DeformConv2dParams& p, const T* input_nhwc, const T* offset, const T* mask,
                             int64_t b, int64_t p0, int64_t count, T* colT, int64_t ldk) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return im2col_nhwc_tile_avx512(p, input_nhwc, offset, mask, b, p0, count, colT, ldk);
    case Isa::kAvx2:
      return im2col_nhwc_tile_avx2(p, input_nhwc, offset, mask, b, p0, count, colT, ldk);
    default:
      break;
  }
#endif
  im2col_nhwc_tile_base(p, input_nhwc, offset, mask, b, p0, count, colT, ldk);
}

// weight [O, Cg, kh, kw] -> [O, kh*kw, Cg]: the K order of colT blocks.
template <typename T>
inline void weight_to_tap_major(const T* w, T* dst, int64_t O, int64_t Cg, int64_t kk) {
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t k = 0; k < kk; ++k) dst[(o * kk + k) * Cg + c] = w[(o * Cg + c) * kk + k];
}

// dst[q] = sum_k w_k[q] * plane[idx_k[q]] for one channel: the hot loop.
template <typename T>
OPFORGE_ALWAYS_INLINE void gather4(const TapTable<T>& t, const T* __restrict plane, T* __restrict dst, int64_t n) {
  const int32_t *i0 = t.idx[0].data(), *i1 = t.idx[1].data(), *i2 = t.idx[2].data(), *i3 = t.idx[3].data();
  const T *w0 = t.w[0].data(), *w1 = t.w[1].data(), *w2 = t.w[2].data(), *w3 = t.w[3].data();
  for (int64_t q = 0; q < n; ++q)
    dst[q] = w0[q] * plane[i0[q]] + w1[q] * plane[i1[q]] + w2[q] * plane[i2[q]] + w3[q] * plane[i3[q]];
}

template <typename T>
inline void gather4_channels(const TapTable<T>& t, const T* plane0, int64_t plane_stride, T* dst0,
                             int64_t dst_stride, int64_t channels, int64_t n) {
  for (int64_t c = 0; c < channels; ++c) gather4(t, plane0 + c * plane_stride, dst0 + c * dst_stride, n);
}
#if OPFORGE_X86_DISPATCH
template <typename T>
OPFORGE_TARGET_AVX2 void gather4_channels_avx2(const TapTable<T>& t, const T* plane0, int64_t plane_stride, T* dst0,
                                               int64_t dst_stride, int64_t channels, int64_t n) {
  for (int64_t c = 0; c < channels; ++c) gather4(t, plane0 + c * plane_stride, dst0 + c * dst_stride, n);
}
template <typename T>
OPFORGE_TARGET_AVX512 void gather4_channels_avx512(const TapTable<T>& t, const T* plane0, int64_t plane_stride,
                                                   T* dst0, int64_t dst_stride, int64_t channels, int64_t n) {
  for (int64_t c = 0; c < channels; ++c) gather4(t, plane0 + c * plane_stride, dst0 + c * dst_stride, n);
}
#endif

template <typename T>
inline void gather4_channels_dispatch(const TapTable<T>& t, const T* plane0, int64_t plane_stride, T* dst0,
                                      int64_t dst_stride, int64_t channels, int64_t n) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return gather4_channels_avx512(t, plane0, plane_stride, dst0, dst_stride, channels, n);
    case Isa::kAvx2:
      return gather4_channels_avx2(t, plane0, plane_stride, dst0, dst_stride, channels, n);
    default:
      break;
  }
#endif
  gather4_channels(t, plane0, plane_stride, dst0, dst_stride, channels, n);
}

// Column tile for image b, output pixels [p0, p0 + count): writes
// col[(c*kh*kw + k) * ld + q] for all channels c and taps k (q < count).
// `taps` is scratch reused across calls (one per thread).
template <typename T>
inline void im2col_tile(const DeformConv2dParams& p, const T* input, const T* offset, const T* mask, int64_t b,
                        int64_t p0, int64_t count, T* col, int64_t ld, TapTable<T>& taps) {
  const int64_t cpg = p.channels_per_offset_group(), kk = p.taps(), HW = p.in_pixels();
  taps.resize(count, false);
  for (int64_t g = 0; g < p.offset_groups; ++g) {
    for (int64_t k = 0; k < kk; ++k) {
      build_taps(p, offset, mask, b, g, k, p0, count, taps, false);
      const int64_t c0 = g * cpg;
      gather4_channels_dispatch(taps, input + (b * p.in_channels + c0) * HW, HW, col + (c0 * kk + k) * ld, kk * ld,
                                cpg, count);
    }
  }
}

// Coordinate gradients for image b, output pixels [p0, p0 + count), given
// grad_col (same layout as im2col_tile's col): grad_offset and grad_mask for
// those pixels (written, not accumulated: each (b, g, k, pixel) belongs to one
// call, so pixel tiles run in parallel). torchvision's formulas.
template <typename T>
inline void coord_grad_tile(const DeformConv2dParams& p, const T* input, const T* offset, const T* mask, int64_t b,
                            int64_t p0, int64_t count, const T* grad_col, int64_t ld, T* grad_offset, T* grad_mask,
                            TapTable<T>& taps) {
  const int64_t cpg = p.channels_per_offset_group(), kk = p.taps(), HW = p.in_pixels(), P = p.out_pixels();
  taps.resize(count, true);
  for (int64_t g = 0; g < p.offset_groups; ++g) {
    for (int64_t k = 0; k < kk; ++k) {
      build_taps(p, offset, mask, b, g, k, p0, count, taps, true);
      T* go_h = grad_offset + ((b * p.offset_groups + g) * 2 * kk + 2 * k) * P + p0;
      T* go_w = go_h + P;
      T* gm = (grad_mask && p.use_mask) ? grad_mask + ((b * p.offset_groups + g) * kk + k) * P + p0 : nullptr;
      for (int64_t q = 0; q < count; ++q) {
        T acc_h = 0, acc_w = 0, acc_m = 0;
        const uint8_t v = taps.valid[q];
        const T lh = taps.frac_h[q], lw = taps.frac_w[q], mv = taps.mask[q];
        const T hh = T(1) - lh, hw = T(1) - lw;
        const int32_t i0 = taps.idx[0][q], i1 = taps.idx[1][q], i2 = taps.idx[2][q], i3 = taps.idx[3][q];
        const T* plane = input + (b * p.in_channels + g * cpg) * HW;
        const T* gcol = grad_col + (g * cpg * kk + k) * ld + q;
        for (int64_t cl = 0; cl < cpg; ++cl, plane += HW, gcol += kk * ld) {
          const T gc = *gcol;
          const T v0 = (v & 1) ? plane[i0] : T(0), v1 = (v & 2) ? plane[i1] : T(0);
          const T v2 = (v & 4) ? plane[i2] : T(0), v3 = (v & 8) ? plane[i3] : T(0);
          // d bilinear/dy, d bilinear/dx (torchvision's get_coordinate_weight: no window check)
          acc_h += gc * (lw * (v3 - v1) + hw * (v2 - v0));
          acc_w += gc * (lh * (v3 - v2) + hh * (v1 - v0));
          acc_m += gc * (hh * hw * v0 + hh * lw * v1 + lh * hw * v2 + lh * lw * v3);
        }
        go_h[q] = mv * acc_h;
        go_w[q] = mv * acc_w;
        if (gm) gm[q] = taps.inside[q] ? acc_m : T(0);
      }
    }
  }
}

// grad_input for image b, channels [c_begin, c_end): the adjoint of the
// sampling (scatter-add with the forward weights, mask included). Each call
// owns its channels' planes, so channel blocks run in parallel without atomics.
template <typename T>
inline void col2im_channels(const DeformConv2dParams& p, const T* offset, const T* mask, int64_t b, int64_t c_begin,
                            int64_t c_end, const T* grad_col, int64_t ld, T* grad_input, TapTable<T>& taps) {
  const int64_t cpg = p.channels_per_offset_group(), kk = p.taps(), HW = p.in_pixels(), P = p.out_pixels();
  constexpr int64_t kChunk = 1024;
  taps.resize(kChunk, false);
  for (int64_t g = c_begin / cpg; g * cpg < c_end; ++g) {
    const int64_t lo = std::max(c_begin, g * cpg), hi = std::min(c_end, (g + 1) * cpg);
    for (int64_t k = 0; k < kk; ++k) {
      for (int64_t p0 = 0; p0 < P; p0 += kChunk) {
        const int64_t count = std::min(kChunk, P - p0);
        build_taps(p, offset, mask, b, g, k, p0, count, taps, false, /*adjoint=*/true);
        for (int64_t c = lo; c < hi; ++c) {
          T* gplane = grad_input + (b * p.in_channels + c) * HW;
          const T* gc = grad_col + (c * kk + k) * ld + p0;
          for (int64_t q = 0; q < count; ++q) {
            const T v = gc[q];
            gplane[taps.idx[0][q]] += taps.w[0][q] * v;
            gplane[taps.idx[1][q]] += taps.w[1][q] * v;
            gplane[taps.idx[2][q]] += taps.w[2][q] * v;
            gplane[taps.idx[3][q]] += taps.w[3][q] * v;
          }
        }
      }
    }
  }
}

// ---- forward, end to end per tile -------------------------------------------------

// Output pixels per forward tile (a tile's pixel-major columns are
// pixels x C*kh*kw; keep them around L2 size). Env OPFORGE_DCN_TILE overrides (tuning).
inline int64_t forward_tile_pixels(const DeformConv2dParams& p, size_t elem) {
  const int64_t row_bytes = std::max<int64_t>(1, p.in_channels * p.taps() * static_cast<int64_t>(elem));
  int64_t tile = (int64_t(1) << 20) / row_bytes;
  if (const char* env = std::getenv("OPFORGE_DCN_TILE")) tile = std::atoll(env);
  tile = std::max<int64_t>(16, std::min<int64_t>(4096, tile));
  return std::min(tile, p.out_pixels());
}

// out[b, :, p0:p0+count] for one tile: im2col (channels-last, no gathers) then
// one GEMM per weight group with the tap-major weight, plus bias (may be null).
// colT is per-thread scratch. Disjoint tiles run in parallel.
template <typename T>
inline void deform_conv2d_forward_tile(const DeformConv2dParams& p, const T* input_nhwc, const T* offset,
                                       const T* mask, const T* weight_tm, const T* bias, T* out, int64_t b,
                                       int64_t p0, int64_t count, std::vector<T>& colT) {
  const int64_t ldk = p.in_channels * p.taps(), P = p.out_pixels();
  const int64_t Og = p.out_channels_per_group(), Kg = p.col_rows_per_group();
  colT.resize(static_cast<size_t>(count * ldk));
  im2col_nhwc_tile(p, input_nhwc, offset, mask, b, p0, count, colT.data(), ldk);
  for (int64_t g = 0; g < p.weight_groups; ++g) {
    T* dst = out + (b * p.out_channels + g * Og) * P + p0;
    if (bias != nullptr)
      for (int64_t o = 0; o < Og; ++o) std::fill(dst + o * P, dst + o * P + count, bias[g * Og + o]);
    gemm_nt(Og, count, Kg, weight_tm + g * Og * Kg, Kg, colT.data() + g * Kg, ldk, dst, P, bias != nullptr);
  }
}

}  // namespace core
}  // namespace opforge
