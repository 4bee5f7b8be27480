// opforge's deform_conv2d computation for ORT's CUDA EP, shared by the kernels of
// every node form meaning torchvision's deform_conv2d (opforge::deform_conv2d,
// mmdeploy's MMCVModulatedDeformConv2d): the same CUDA sampling kernel as torch's
// CUDA path, and the GEMM straight from cuBLAS (no libtorch here):
//   out = bias (fill kernel), then per chunk of images: im2col into stream-
//   ordered scratch, and per weight group one strided-batched GEMM over the
//   chunk's images accumulating onto out (beta = 1).
// float32 GEMMs are full fp32 (no TF32), as torch's default; float16 / bfloat16
// columns and weights multiply with float32 accumulation.
#pragma once

#include <algorithm>

#include "core/deform_conv2d_gpu.h"
#include "opforge/ort_cuda.h"
#include "opforge/ort_op.h"

namespace opforge {
namespace ort {
namespace deform_conv2d_cuda_detail {

constexpr int64_t kColumnBudgetBytes = int64_t(256) << 20;

template <typename T>
struct GemmTypes;
template <>
struct GemmTypes<float> {
  using Scale = float;
  static constexpr cudaDataType_t data = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
template <>
struct GemmTypes<double> {
  using Scale = double;
  static constexpr cudaDataType_t data = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
};
template <>
struct GemmTypes<Ort::Float16_t> {
  using Scale = float;
  static constexpr cudaDataType_t data = CUDA_R_16F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

template <>
struct GemmTypes<Ort::BFloat16_t> {
  using Scale = float;
  static constexpr cudaDataType_t data = CUDA_R_16BF;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

}  // namespace deform_conv2d_cuda_detail

// The node's computation on device buffers, p checked; `op` names the node form in
// errors; mask null unless p.use_mask; bias: p.out_channels values on the device.
template <typename T>
inline Ort::Status deform_conv2d_cuda_run(OrtKernelContext* ctx, CublasHandle& cublas, const char* kOp,
                                          const core::DeformConv2dParams& p, const T* input, const T* weight,
                                          const T* offset, const T* mask, const T* bias, T* out) {
  using namespace deform_conv2d_cuda_detail;
  if (p.batch == 0) return Ort::Status(nullptr);
  const InputDeviceGuard device(ctx);
  constexpr core::cuda::Dtype dtype = gpu_dtype<T>();
  const cudaStream_t stream = compute_stream(ctx);
  const int64_t G = p.weight_groups, P = p.out_pixels(), col_per_image = p.in_channels * p.taps() * P;
  constexpr int64_t kIntMax = 2147483647;  // cuBLAS takes int sizes
  if (P > kIntMax || p.col_rows_per_group() > kIntMax || p.out_channels > kIntMax)
    return invalid_argument(std::string(kOp) + ": output plane or column rows exceed cuBLAS's int range");
  const int64_t chunk = core::deform_gpu_chunk_images(p, sizeof(T), kColumnBudgetBytes);

  if (Ort::Status s = cuda_status(core::cuda::fill_bias(dtype, p.batch, p.out_channels, P, bias, out, stream),
                                  kOp, "bias kernel launch");
      !s.IsOK())
    return s;
  if (p.samples_nothing()) return Ort::Status(nullptr);  // all columns 0: the output is the bias
  StreamScratch col(static_cast<size_t>(chunk * col_per_image) * sizeof(T), stream);
  if (Ort::Status s = cuda_status(col.status(), kOp, "scratch allocation (cudaMallocAsync)"); !s.IsOK()) return s;

  cublasHandle_t handle;
  cublasStatus_t cs;
  const auto lock = cublas.acquire(stream, &handle, &cs);
  if (Ort::Status s = cublas_status(cs, kOp, "cuBLAS handle"); !s.IsOK()) return s;
  using G_ = GemmTypes<T>;
  const typename G_::Scale one = 1;
  T* col_data = static_cast<T*>(col.get());
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, p.batch - b0);
    if (Ort::Status s = cuda_status(core::cuda::deform_im2col(dtype, p, input, offset, mask, b0, images, col_data,
                                                              stream),
                                    kOp, "im2col kernel launch");
        !s.IsOK())
      return s;
    for (int64_t g = 0; g < G; ++g) {
      const core::StridedGemm gm = core::deform_forward_gemm(p, g, b0, images);  // see there for the algebra
      cs = cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(gm.m),
                                      static_cast<int>(gm.n), static_cast<int>(gm.k), &one, col_data + gm.a_offset,
                                      G_::data, static_cast<int>(gm.lda), gm.stride_a, weight + gm.b_offset,
                                      G_::data, static_cast<int>(gm.ldb), gm.stride_b, &one, out + gm.c_offset,
                                      G_::data, static_cast<int>(gm.ldc), gm.stride_c, static_cast<int>(gm.batch),
                                      G_::compute, CUBLAS_GEMM_DEFAULT);
      if (Ort::Status s = cublas_status(cs, kOp, "cublasGemmStridedBatchedEx"); !s.IsOK()) return s;
    }
  }
  return Ort::Status(nullptr);
}

// The CUDA EP's part of DeformConv2dKernel (ort_common.h) and of mmdeploy's
// ModulatedDeformConvKernel: deform_conv2d_cuda_run with the kernel's cuBLAS handle; a
// null bias is none (zeros on the device, as torchvision adds for a node without one).
struct DeformConv2dCuda {
  CublasHandle cublas;

  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const char* op, const core::DeformConv2dParams& p, const T* input,
                  const T* weight, const T* offset, const T* mask, const T* bias, T* out) {
    if (bias != nullptr) return deform_conv2d_cuda_run<T>(ctx, cublas, op, p, input, weight, offset, mask, bias, out);
    if (p.batch == 0) return Ort::Status(nullptr);
    const InputDeviceGuard device(ctx);
    const cudaStream_t stream = compute_stream(ctx);
    // All-zero bits are 0 in every float type.
    const size_t bytes = static_cast<size_t>(p.out_channels) * sizeof(T);
    StreamScratch zeros(bytes, stream);
    cudaError_t ce = zeros.status();
    if (ce == cudaSuccess) ce = cudaMemsetAsync(zeros.get(), 0, bytes, stream);
    if (Ort::Status s = cuda_status(ce, op, "zero bias"); !s.IsOK()) return s;
    return deform_conv2d_cuda_run<T>(ctx, cublas, op, p, input, weight, offset, mask,
                                     static_cast<const T*>(zeros.get()), out);
  }
};

}  // namespace ort
}  // namespace opforge
