// CUDA kernels of opforge::nms_rotated and opforge::batched_nms_rotated: the
// values are checked, ordered and turned into float64 geometry on the host
// (small synchronous copies: N boxes), the O(N^2) IoUs run on the GPU as the
// suppression mask (core/cuda/nms_rotated.cuh) in row chunks of bounded
// memory, and each chunk is reduced greedily on the host. The kept indices are
// returned on the boxes' device.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <vector>

#include "nms_rotated_args.h"
#include "opforge/torch_cuda.h"

namespace opforge {
namespace {

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor* idxs,
                    double iou_threshold) {
  const core::NmsRotatedParams p = nms_rotated_check_args(boxes, scores, idxs, iou_threshold);
  const c10::cuda::CUDAGuard guard(boxes.device());
  core::NmsRotatedPlan plan = nms_rotated_host_plan(p, boxes, scores, idxs);
  const int64_t n = p.boxes;
  std::vector<int64_t> keep;
  if (n > 0) {
    static_assert(sizeof(core::RotatedBoxGeometry) == 8 * sizeof(double), "geometry is 8 doubles");
    const auto device = boxes.options().device(boxes.device());
    const at::Tensor geometry =
        at::from_blob(plan.geometry.data(), {n, 8}, at::TensorOptions().dtype(at::kDouble)).to(device.dtype(at::kDouble));
    at::Tensor labels;
    if (p.batched)
      labels = at::from_blob(plan.labels.data(), {n}, at::TensorOptions().dtype(at::kLong)).to(device.dtype(at::kLong));
    const int64_t words = core::nms_rotated_words(n), chunk = core::nms_rotated_chunk_rows(n);
    at::Tensor mask = at::empty({chunk * words}, device.dtype(at::kLong));
    std::vector<uint64_t> removed(static_cast<size_t>(words), 0);
    const cudaStream_t stream = current_stream(boxes);
    for (int64_t row = 0; row < n; row += chunk) {
      const int64_t rows = std::min(chunk, n - row);
      check_launch(core::cuda::nms_rotated_mask(
                       n, row, rows, reinterpret_cast<const core::RotatedBoxGeometry*>(geometry.const_data_ptr<double>()),
                       p.batched ? labels.const_data_ptr<int64_t>() : nullptr, static_cast<double>(p.iou_threshold),
                       reinterpret_cast<uint64_t*>(mask.mutable_data_ptr<int64_t>()), stream),
                   core::nms_rotated_op_name(p.batched).c_str());
      const at::Tensor host = mask.narrow(0, 0, rows * words).to(at::kCPU);
      core::nms_rotated_reduce_mask(reinterpret_cast<const uint64_t*>(host.const_data_ptr<int64_t>()), row,
                                    row + rows, words, plan.order, removed, keep);
    }
  }
  return nms_rotated_keep_tensor(keep, boxes.device());
}

}  // namespace

at::Tensor nms_rotated_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  return nms_cuda(boxes, scores, nullptr, iou_threshold);
}

at::Tensor batched_nms_rotated_cuda(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                                    double iou_threshold) {
  return nms_cuda(boxes, scores, &idxs, iou_threshold);
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("nms_rotated", &nms_rotated_cuda);
  m.impl("batched_nms_rotated", &batched_nms_rotated_cuda);
}

}  // namespace opforge
