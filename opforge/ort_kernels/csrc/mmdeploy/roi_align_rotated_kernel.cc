// mmdeploy::MMCVRoIAlignRotated, the node mmdeploy's symbolic for mmcv's
// roi_align_rotated writes:
//   inputs  (input [N,C,H,W], rois [K,6] rows (batch, cx, cy, w, h, angle))
//   attrs   output_height, output_width, sampling_ratio (INT), spatial_scale (FLOAT),
//           aligned, clockwise (INT 0/1)
//   output  [K,C,output_height,output_width], the input's type
// These are opforge::roi_align_rotated's own node form under another name, so the
// kernel is the same code (roi_align_rotated_cpu.h): mmcv's semantics, rois checked
// before use, every float type.
#include <vector>

#include "mmdeploy_ops.h"
#include "roi_align_rotated_cpu.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

const FloatKernels<RoiAlignRotatedKernel, MmcvRoiAlignRotatedOp, RoiAlignRotatedCpu>
    roi_align_rotated_kernels(kRoiAlignRotated, kCpuEp);

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
