// ORT CUDA-EP kernel of opforge::roi_align_rotated (cuda/roi_align_rotated_cuda.h,
// shared with mmdeploy's node form).
#include <vector>

#include "cuda/roi_align_rotated_cuda.h"

namespace opforge {
namespace ort {

struct RoiAlignRotatedCudaName {
  static constexpr const char* value = "opforge::roi_align_rotated";
};

static void append_roi_align_rotated_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<RoiAlignRotatedCudaKernel<T, RoiAlignRotatedCudaName>>(
        "roi_align_rotated", kCudaEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_roi_align_rotated_cuda_ops);
