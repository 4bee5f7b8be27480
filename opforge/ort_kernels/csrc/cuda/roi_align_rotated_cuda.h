// opforge's roi_align_rotated for ORT's CUDA EP, shared by the kernels of every
// node form meaning mmcv's roi_align_rotated (opforge::roi_align_rotated,
// mmdeploy::MMCVRoIAlignRotated): the CPU kernel's node, shape and rois checks
// (RoiAlignRotatedKernel in ort_common.h), then the same CUDA kernel as torch's
// CUDA path on ORT's compute stream. The rois live on the device here; CudaHostIo
// copies them to the host for the check before the kernel indexes the input with
// them: one small synchronous copy per run, correctness over speed.
#pragma once

#include "core/roi_align_rotated.h"
#include "cuda/cuda_host_io.h"
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

// The CUDA EP's part of RoiAlignRotatedKernel: the kernel reads the device rois.
struct RoiAlignRotatedCuda {
  using Io = CudaHostIo;

  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const char* op, const core::RoiAlignRotatedParams& p, const T* input,
                  const T* rois, const compute_t<T>* /*wide_rois*/, int64_t /*samples*/, T* out) const {
    return cuda_status(core::cuda::roi_align_rotated_forward(gpu_dtype<T>(), p, input, rois, out, compute_stream(ctx)),
                       op, "CUDA kernel launch");
  }
};

}  // namespace ort
}  // namespace opforge
