// Definitions of launch.h's entry points: instantiates every CUDA kernel for
// every dtype. Include from exactly ONE .cu file per library (the torch
// extension and the ORT library each compile it once, into their own objects).
#pragma once

#include <type_traits>

#include "deform_conv2d.cuh"
#include "launch.h"
#include "ms_deform_attn.cuh"
#include "grid_sample.cuh"
#include "my_add.cuh"
#include "nms_rotated.cuh"
#include "roi_align_rotated.cuh"

namespace opforge {
namespace core {
namespace cuda {

// Calls fn(T*) with the storage type of dtype (a null T* only carries the type).
template <typename Fn>
cudaError_t with_dtype(Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kFloat32:
      return fn(static_cast<float*>(nullptr));
    case Dtype::kFloat64:
      return fn(static_cast<double*>(nullptr));
    case Dtype::kFloat16:
      return fn(static_cast<__half*>(nullptr));
    case Dtype::kBFloat16:
      return fn(static_cast<__nv_bfloat16*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

cudaError_t my_add(Dtype dtype, const BinaryPlan& plan, const void* a, const void* b, void* out,
                   cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_my_add<T>(plan, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), stream);
  });
}

cudaError_t deform_im2col(Dtype dtype, const DeformConv2dParams& p, const void* input, const void* offset,
                          const void* mask, int64_t first_image, int64_t images, void* col, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_deform_im2col<T>(p, static_cast<const T*>(input), static_cast<const T*>(offset),
                                   static_cast<const T*>(mask), first_image, images, static_cast<T*>(col), stream);
  });
}

cudaError_t deform_backward(Dtype dtype, const DeformConv2dParams& p, const void* input, const void* offset,
                            const void* mask, int64_t first_image, int64_t images, const void* grad_col,
                            void* grad_input, void* grad_offset, void* grad_mask, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename acc<T>::type;
    return launch_deform_backward<T>(p, static_cast<const T*>(input), static_cast<const T*>(offset),
                                     static_cast<const T*>(mask), first_image, images,
                                     static_cast<const T*>(grad_col), static_cast<A*>(grad_input),
                                     static_cast<T*>(grad_offset), static_cast<T*>(grad_mask), stream);
  });
}

cudaError_t fill_bias(Dtype dtype, int64_t batch, int64_t out_channels, int64_t pixels, const void* bias, void* out,
                      cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_fill_bias<T>(batch, out_channels, pixels, static_cast<const T*>(bias), static_cast<T*>(out), stream);
  });
}

cudaError_t ms_deform_attn_forward(Dtype dtype, const MsDeformAttnParams& p, const void* value,
                                   const int64_t* spatial_shapes, const int64_t* level_start_index,
                                   const void* sampling_locations, const void* attention_weights, void* out,
                                   cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_ms_deform_attn_forward<T>(p, static_cast<const T*>(value), spatial_shapes, level_start_index,
                                            static_cast<const T*>(sampling_locations),
                                            static_cast<const T*>(attention_weights), static_cast<T*>(out), stream);
  });
}

cudaError_t ms_deform_attn_backward(Dtype dtype, const MsDeformAttnParams& p, const void* grad_output,
                                    const void* value, const int64_t* spatial_shapes,
                                    const int64_t* level_start_index, const void* sampling_locations,
                                    const void* attention_weights, void* grad_value, void* grad_sampling_locations,
                                    void* grad_attention_weights, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename acc<T>::type;
    return launch_ms_deform_attn_backward<T>(
        p, static_cast<const T*>(grad_output), static_cast<const T*>(value), spatial_shapes, level_start_index,
        static_cast<const T*>(sampling_locations), static_cast<const T*>(attention_weights),
        static_cast<A*>(grad_value), static_cast<T*>(grad_sampling_locations),
        static_cast<T*>(grad_attention_weights), stream);
  });
}

cudaError_t roi_align_rotated_forward(Dtype dtype, const RoiAlignRotatedParams& p, const void* input,
                                      const void* rois, void* out, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_roi_align_rotated_forward<T>(p, static_cast<const T*>(input), static_cast<const T*>(rois),
                                               static_cast<T*>(out), stream);
  });
}

cudaError_t roi_align_rotated_backward(Dtype dtype, const RoiAlignRotatedParams& p, const void* grad_output,
                                       const void* rois, void* grad_input, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename acc<T>::type;
    return launch_roi_align_rotated_backward<T>(p, static_cast<const T*>(grad_output), static_cast<const T*>(rois),
                                                static_cast<A*>(grad_input), stream);
  });
}

cudaError_t nms_rotated_mask(int64_t n, int64_t row_begin, int64_t rows, const RotatedBoxGeometry* geometry,
                             bool extreme, const int64_t* labels, double iou_threshold, uint64_t* mask,
                             cudaStream_t stream) {
  const int64_t words = (n + 63) / 64, items = rows * words;
  if (items == 0) return cudaSuccess;
  if (extreme)
    nms_rotated_mask_kernel<true><<<grid_for(items), kThreads, 0, stream>>>(n, words, row_begin, items, geometry,
                                                                            labels, iou_threshold, mask);
  else
    nms_rotated_mask_kernel<false><<<grid_for(items), kThreads, 0, stream>>>(n, words, row_begin, items, geometry,
                                                                             labels, iou_threshold, mask);
  return cudaGetLastError();
}

cudaError_t grid_sample_forward(Dtype dtype, const GridSampleParams& p, const void* input, const void* grid,
                                void* out, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch_grid_sample_forward<T>(p, static_cast<const T*>(input), static_cast<const T*>(grid),
                                         static_cast<T*>(out), stream);
  });
}

}  // namespace cuda
}  // namespace core
}  // namespace opforge
