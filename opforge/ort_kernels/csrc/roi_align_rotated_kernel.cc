// ORT kernel of opforge::roi_align_rotated (domain "opforge", version 1):
// inputs (input, rois), attributes output_height, output_width (int),
// spatial_scale (float), sampling_ratio (int), aligned, clockwise (int 0/1),
// output "output" — the torch schema one to one. Same core as the torch
// extension (core/roi_align_rotated.h), parallel over output bins on ORT's intra-op
// pool. float16 / bfloat16 compute in float32 and round once (as the torch CPU
// kernel does).
//
// The rois are run-time data from the model or its caller: their values are
// checked (RoiAlignRotatedKernel in ort_common.h) before anything is read with
// them; a bad one is an INVALID_ARGUMENT status. The computation is
// roi_align_rotated_cpu.h, shared with mmdeploy's node form.
#include <vector>

#include "roi_align_rotated_cpu.h"

namespace opforge {
namespace ort {

const FloatKernels<RoiAlignRotatedKernel, RoiAlignRotatedOp, RoiAlignRotatedCpu>
    roi_align_rotated_kernels("roi_align_rotated", kCpuEp);

}  // namespace ort
}  // namespace opforge
