// The CUDA EP kernel of mmdeploy::MMCVRoIAlignRotated: opforge::roi_align_rotated's
// own (cuda/roi_align_rotated_cuda.h) under mmdeploy's name; the node forms are one.
#include <vector>

#include "cuda/roi_align_rotated_cuda.h"
#include "mmdeploy/mmdeploy_ops.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

static void append_roi_align_rotated_cuda_ops(std::vector<LiteOpPtr>& ops) {
  append_float_kernels<RoiAlignRotatedKernel, MmcvRoiAlignRotatedOp, RoiAlignRotatedCuda>(ops, kRoiAlignRotated,
                                                                                          kCudaEp);
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_roi_align_rotated_cuda_ops);
