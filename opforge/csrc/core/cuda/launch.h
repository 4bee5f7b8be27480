// The CUDA cores' entry points as plain functions over untyped device
// pointers, so the front ends (torch extension .cpp, ORT kernels .cc) are
// compiled by the host compiler alone and only kernels.cuh goes through nvcc.
// Every function launches on the given stream — the caller's (torch's current
// stream / ORT's compute stream), never the default one — and returns the
// launch status; it does not synchronise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../broadcast.h"
#include "../deform_conv2d_tap.h"
#include "../grid_sample.h"
#include "../ms_deform_attn_sample.h"
#include "../roi_align_rotated_sample.h"
#include "../rotated_box_iou.h"

namespace opforge {
namespace core {
namespace cuda {

enum class Dtype : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

// out = 2 * a + b over a broadcasting plan (core/broadcast.h); out contiguous.
cudaError_t my_add(Dtype dtype, const BinaryPlan& plan, const void* a, const void* b, void* out,
                   cudaStream_t stream);

// Columns [images, C*kh*kw, out_h*out_w] of images [first_image, first_image + images).
// input/offset/mask are the whole batch (NCHW contiguous); mask may be null when !p.use_mask.
cudaError_t deform_im2col(Dtype dtype, const DeformConv2dParams& p, const void* input, const void* offset,
                          const void* mask, int64_t first_image, int64_t images, void* col, cudaStream_t stream);

// From grad_col (columns layout as above): accumulates grad_input (whole batch,
// float32 for 16-bit dtypes, else dtype; must start zeroed) and writes
// grad_offset / grad_mask (whole batch, dtype) of the chunk's images.
cudaError_t deform_backward(Dtype dtype, const DeformConv2dParams& p, const void* input, const void* offset,
                            const void* mask, int64_t first_image, int64_t images, const void* grad_col,
                            void* grad_input, void* grad_offset, void* grad_mask, cudaStream_t stream);

// out[b, o, :] = bias[o] for a [batch, out_channels, pixels] tensor.
cudaError_t fill_bias(Dtype dtype, int64_t batch, int64_t out_channels, int64_t pixels, const void* bias, void* out,
                      cudaStream_t stream);

// Multi-scale deformable attention, output [N, Lq, M*D] (dtype). spatial_shapes /
// level_start_index are int64 device pointers whose host copies passed
// ms_deform_attn_check_levels (the kernels index value with them).
cudaError_t ms_deform_attn_forward(Dtype dtype, const MsDeformAttnParams& p, const void* value,
                                   const int64_t* spatial_shapes, const int64_t* level_start_index,
                                   const void* sampling_locations, const void* attention_weights, void* out,
                                   cudaStream_t stream);

// Its backward: accumulates grad_value ([N, S, M, D], float32 for 16-bit dtypes,
// else dtype; must start zeroed) and writes grad_sampling_locations /
// grad_attention_weights (dtype).
cudaError_t ms_deform_attn_backward(Dtype dtype, const MsDeformAttnParams& p, const void* grad_output,
                                    const void* value, const int64_t* spatial_shapes,
                                    const int64_t* level_start_index, const void* sampling_locations,
                                    const void* attention_weights, void* grad_value, void* grad_sampling_locations,
                                    void* grad_attention_weights, cudaStream_t stream);

// Rotated RoI Align, output [K, C, ph, pw] (dtype) from input [N, C, H, W] and
// rois [K, 6] whose host copies passed roi_align_rotated_check_rois.
cudaError_t roi_align_rotated_forward(Dtype dtype, const RoiAlignRotatedParams& p, const void* input,
                                      const void* rois, void* out, cudaStream_t stream);

// Its backward: accumulates grad_input ([N, C, H, W], float32 for 16-bit dtypes,
// else dtype; must start zeroed).
cudaError_t roi_align_rotated_backward(Dtype dtype, const RoiAlignRotatedParams& p, const void* grad_output,
                                       const void* rois, void* grad_input, cudaStream_t stream);

// Rows [row_begin, row_begin + rows) of rotated NMS's suppression mask
// (core/nms_rotated_gpu.h): mask is rows * nms_rotated_words(n) words;
// geometry (n boxes in visiting order) and labels (null unless batched) are
// device pointers; extreme: the plan's (NmsRotatedPlan::extreme).
cudaError_t nms_rotated_mask(int64_t n, int64_t row_begin, int64_t rows, const RotatedBoxGeometry* geometry,
                             bool extreme, const int64_t* labels, double iou_threshold, uint64_t* mask,
                             cudaStream_t stream);

// grid_sample (mmdeploy::grid_sampler), output [N, C, Ho, Wo] (dtype) from input
// [N, C, H, W] and grid [N, Ho, Wo, 2] checked by grid_sample_check.
cudaError_t grid_sample_forward(Dtype dtype, const GridSampleParams& p, const void* input, const void* grid,
                                void* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace core
}  // namespace opforge
