// CUDA kernels of opforge::nms_rotated and opforge::batched_nms_rotated: the
// values are checked, ordered and turned into float64 geometry on the host
// (small synchronous copies: N boxes), the O(N^2) IoUs run on the GPU as the
// suppression mask (core/cuda/nms_rotated.cuh) in row chunks of bounded
// memory, and each chunk is reduced greedily on the host. The kept indices are
// returned on the boxes' device.
#include <algorithm>
#include <vector>

// First: it declares the CUDA shims (USE_CUDA) before any torch header includes shim.h.
#include "opforge/torch_cuda.h"

#include "nms_rotated_args.h"

namespace opforge {
namespace {

// A copy on `like`'s device of the host buffer `values` (shape `shape`, row-major, `dtype`);
// synchronous, so the buffer may go once it returns.
Tensor nms_rotated_to_device(void* values, const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  const Tensor host = torch::stable::from_blob(values, IntList(shape), IntList(strides),
                                               torch::stable::Device(torch::headeronly::DeviceType::CPU), dtype);
  return torch::stable::to(host, like.device());
}

Tensor nms_cuda(const Tensor& boxes, const Tensor& scores, const Tensor* idxs, double iou_threshold) {
  const core::NmsRotatedParams p = nms_rotated_check_args(boxes, scores, idxs, iou_threshold);
  const CudaDeviceGuard guard(boxes);
  core::NmsRotatedPlan plan = nms_rotated_host_plan(p, boxes, scores, idxs);
  const int64_t n = p.boxes;
  std::vector<int64_t> keep;
  if (n > 0) {
    static_assert(sizeof(core::RotatedBoxGeometry) == 8 * sizeof(double), "geometry is 8 doubles");
    const Tensor geometry = nms_rotated_to_device(plan.geometry.data(), {n, 8}, ScalarType::Double, boxes);
    Tensor labels;
    if (p.batched) labels = nms_rotated_to_device(plan.labels.data(), {n}, ScalarType::Long, boxes);
    const int64_t words = core::nms_rotated_words(n), chunk = core::nms_rotated_chunk_rows(n);
    const Tensor mask = empty_tensor({chunk * words}, ScalarType::Long, boxes);
    std::vector<uint64_t> removed(static_cast<size_t>(words), 0);
    const cudaStream_t stream = current_stream(boxes);
    for (int64_t row = 0; row < n; row += chunk) {
      const int64_t rows = std::min(chunk, n - row);
      check_launch(core::cuda::nms_rotated_mask(n, row, rows,
                                                reinterpret_cast<const core::RotatedBoxGeometry*>(data<double>(geometry)),
                                                plan.extreme, p.batched ? data<int64_t>(labels) : nullptr,
                                                static_cast<double>(p.iou_threshold),
                                                reinterpret_cast<uint64_t*>(mutable_data<int64_t>(mask)), stream),
                   core::nms_rotated_op_name(p.batched).c_str());
      const Tensor host = to_cpu(narrowed(mask, 0, 0, rows * words));
      core::nms_rotated_reduce_mask(reinterpret_cast<const uint64_t*>(data<int64_t>(host)), row, row + rows, words,
                                    plan.order, removed, keep);
    }
  }
  return nms_rotated_keep_tensor(keep, boxes);
}

}  // namespace

Tensor nms_rotated_cuda(const Tensor& boxes, const Tensor& scores, double iou_threshold) {
  return nms_cuda(boxes, scores, nullptr, iou_threshold);
}

Tensor batched_nms_rotated_cuda(const Tensor& boxes, const Tensor& scores, const Tensor& idxs, double iou_threshold) {
  return nms_cuda(boxes, scores, &idxs, iou_threshold);
}

STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("nms_rotated", TORCH_BOX(&nms_rotated_cuda));
  m.impl("batched_nms_rotated", TORCH_BOX(&batched_nms_rotated_cuda));
}

}  // namespace opforge
