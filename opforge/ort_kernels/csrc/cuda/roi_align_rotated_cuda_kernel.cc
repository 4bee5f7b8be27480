// ORT CUDA-EP kernel of opforge::roi_align_rotated (cuda/roi_align_rotated_cuda.h,
// shared with mmdeploy's node form).
#include <vector>

#include "cuda/roi_align_rotated_cuda.h"

namespace opforge {
namespace ort {

const FloatKernels<RoiAlignRotatedKernel, RoiAlignRotatedOp, RoiAlignRotatedCuda>
    roi_align_rotated_cuda_kernels("roi_align_rotated", kCudaEp);

}  // namespace ort
}  // namespace opforge
