// The CUDA EP kernel of mmdeploy::MMCVRoIAlignRotated: opforge::roi_align_rotated's
// own (cuda/roi_align_rotated_cuda.h) under mmdeploy's name; the node forms are one.
#include <vector>

#include "cuda/roi_align_rotated_cuda.h"
#include "mmdeploy/mmdeploy_ops.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

struct RoiAlignRotatedCudaName {
  static constexpr const char* value = "mmdeploy::MMCVRoIAlignRotated";
};

static void append_roi_align_rotated_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<RoiAlignRotatedCudaKernel<T, RoiAlignRotatedCudaName>>(
        kRoiAlignRotated, kCudaEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_roi_align_rotated_cuda_ops);
