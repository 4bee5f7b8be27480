// The CUDA EP kernel of mmdeploy::MMCVRoIAlignRotated: opforge::roi_align_rotated's
// own (cuda/roi_align_rotated_cuda.h) under mmdeploy's name; the node forms are one.
#include <vector>

#include "cuda/roi_align_rotated_cuda.h"
#include "mmdeploy/mmdeploy_ops.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

const FloatKernels<RoiAlignRotatedKernel, MmcvRoiAlignRotatedOp, RoiAlignRotatedCuda>
    roi_align_rotated_cuda_kernels(kRoiAlignRotated, kCudaEp);

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
