// opforge's roi_align_rotated for ORT's CUDA EP, shared by the kernels of every
// node form meaning mmcv's roi_align_rotated (opforge::roi_align_rotated,
// mmdeploy::MMCVRoIAlignRotated): the CPU kernel's node and shape checks, then the
// same CUDA kernel as torch's CUDA path on ORT's compute stream. The rois live on
// the device here; they are copied to the host and checked
// (core::roi_align_rotated_check_rois) before the kernel indexes the input with
// them: one small synchronous copy per run, correctness over speed.
#pragma once

#include <vector>

#include "core/roi_align_rotated.h"
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

// The kernel for storage type T; OpName::value is the node form's name in errors.
template <typename T, typename OpName>
struct RoiAlignRotatedCudaKernel {
  RoiAlignRotatedAttrs attrs;

  RoiAlignRotatedCudaKernel(const OrtApi*, const OrtKernelInfo* info) : attrs(info, OpName::value) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& rois, Ort::Custom::Tensor<T>& output) {
    core::RoiAlignRotatedParams p;
    if (Ort::Status bad = attrs.check(input.Shape(), rois.Shape(), p); !bad.IsOK()) return bad;
    const InputDeviceGuard device(ctx);
    const cudaStream_t stream = compute_stream(ctx);
    std::vector<T> host(static_cast<size_t>(6 * p.rois));
    if (!host.empty()) {
      cudaError_t ce = cudaMemcpyAsync(host.data(), rois.Data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost,
                                       stream);
      if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
      if (Ort::Status s = cuda_status(ce, OpName::value, "copying rois to the host"); !s.IsOK()) return s;
    }
    if (std::string err = core::roi_align_rotated_check_rois(p, widened(host.data(), host.size()).data());
        !err.empty())
      return invalid_argument(attrs.in_op_words(err));
    int64_t dims[4];
    core::roi_align_rotated_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    if (dims[0] * dims[1] * dims[2] * dims[3] == 0) return Ort::Status(nullptr);
    return cuda_status(core::cuda::roi_align_rotated_forward(gpu_dtype<T>(), p, input.Data(), rois.Data(), out,
                                                             stream),
                       OpName::value, "CUDA kernel launch");
  }
};

}  // namespace ort
}  // namespace opforge
