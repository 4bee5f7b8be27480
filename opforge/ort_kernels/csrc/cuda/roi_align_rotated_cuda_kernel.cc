// ORT CUDA-EP kernel of opforge::roi_align_rotated (cuda/roi_align_rotated_cuda.h,
// shared with mmdeploy's node form).
#include <vector>

#include "cuda/roi_align_rotated_cuda.h"

namespace opforge {
namespace ort {

static void append_roi_align_rotated_cuda_ops(std::vector<LiteOpPtr>& ops) {
  append_float_kernels<RoiAlignRotatedKernel, RoiAlignRotatedOp, RoiAlignRotatedCuda>(ops, "roi_align_rotated",
                                                                                      kCudaEp);
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_roi_align_rotated_cuda_ops);
