// ORT CUDA-EP kernels of opforge::nms_rotated and opforge::batched_nms_rotated:
// the CPU kernels' node and shape checks; the inputs are copied to the host,
// checked, ordered and turned into float64 geometry there (N boxes: small
// synchronous copies), the O(N^2) IoUs run on the GPU as the suppression mask
// (the same CUDA kernel as torch's CUDA path) in row chunks of bounded memory,
// and each chunk is reduced greedily on the host. The kept indices are written
// to the device output.
#include <algorithm>
#include <vector>

#include "core/nms_rotated.h"
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace {

template <typename T>
Ort::Status nms_compute_cuda(OrtKernelContext* ctx, float iou_threshold, const Ort::Custom::Tensor<T>& boxes,
                             const Ort::Custom::Tensor<T>& scores, const Ort::Custom::Tensor<int64_t>* labels,
                             Ort::Custom::Tensor<int64_t>& keep_out) {
  const bool batched = labels != nullptr;
  const std::string op_name = core::nms_rotated_op_name(batched);
  const char* op = op_name.c_str();
  core::NmsRotatedParams p;
  const std::vector<int64_t> label_shape = labels ? labels->Shape() : std::vector<int64_t>{};
  if (Ort::Status bad = nms_rotated_shapes(boxes.Shape(), scores.Shape(), labels ? &label_shape : nullptr,
                                           iou_threshold, p);
      !bad.IsOK())
    return bad;
  const InputDeviceGuard device(ctx);
  const cudaStream_t stream = compute_stream(ctx);
  const size_t n = static_cast<size_t>(p.boxes);
  std::vector<T> host_boxes, host_scores;
  std::vector<int64_t> host_labels;
  if (Ort::Status s = to_host(boxes.Data(), 5 * n, host_boxes, stream, op, "copying boxes to the host"); !s.IsOK())
    return s;
  if (Ort::Status s = to_host(scores.Data(), n, host_scores, stream, op, "copying scores to the host"); !s.IsOK())
    return s;
  if (batched)
    if (Ort::Status s = to_host(labels->Data(), n, host_labels, stream, op, "copying idxs to the host"); !s.IsOK())
      return s;
  if (Ort::Status s = cuda_status(cudaStreamSynchronize(stream), op, "synchronising the copies"); !s.IsOK()) return s;
  core::NmsRotatedPlan plan;
  if (std::string err = nms_rotated_host_plan(p, host_boxes.data(), host_scores.data(),
                                              batched ? host_labels.data() : nullptr, plan);
      !err.empty())
    return invalid_argument(err);

  std::vector<int64_t> keep;
  if (n > 0) {
    const int64_t words = core::nms_rotated_words(p.boxes), chunk = core::nms_rotated_chunk_rows(p.boxes);
    StreamScratch geometry(n * sizeof(core::RotatedBoxGeometry), stream);
    StreamScratch device_labels(batched ? n * sizeof(int64_t) : 1, stream);
    StreamScratch mask(static_cast<size_t>(chunk * words) * sizeof(uint64_t), stream);
    for (const StreamScratch* s : {&geometry, &device_labels, &mask})
      if (Ort::Status st = cuda_status(s->status(), op, "scratch allocation (cudaMallocAsync)"); !st.IsOK()) return st;
    cudaError_t ce = cudaMemcpyAsync(geometry.get(), plan.geometry.data(), n * sizeof(core::RotatedBoxGeometry),
                                     cudaMemcpyHostToDevice, stream);
    if (ce == cudaSuccess && batched)
      ce = cudaMemcpyAsync(device_labels.get(), plan.labels.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice,
                           stream);
    if (Ort::Status s = cuda_status(ce, op, "copying the boxes' geometry to the device"); !s.IsOK()) return s;
    std::vector<uint64_t> removed(static_cast<size_t>(words), 0), host_mask;
    for (int64_t row = 0; row < p.boxes; row += chunk) {
      const int64_t rows = std::min(chunk, p.boxes - row);
      ce = core::cuda::nms_rotated_mask(p.boxes, row, rows,
                                        static_cast<const core::RotatedBoxGeometry*>(geometry.get()),
                                        batched ? static_cast<const int64_t*>(device_labels.get()) : nullptr,
                                        static_cast<double>(p.iou_threshold), static_cast<uint64_t*>(mask.get()),
                                        stream);
      if (ce == cudaSuccess) {
        host_mask.resize(static_cast<size_t>(rows * words));
        ce = cudaMemcpyAsync(host_mask.data(), mask.get(), host_mask.size() * sizeof(uint64_t),
                             cudaMemcpyDeviceToHost, stream);
      }
      if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
      if (Ort::Status s = cuda_status(ce, op, "suppression mask"); !s.IsOK()) return s;
      core::nms_rotated_reduce_mask(host_mask.data(), row, row + rows, words, plan.order, removed, keep);
    }
  }
  int64_t* out = keep_out.Allocate({static_cast<int64_t>(keep.size())});
  if (keep.empty()) return Ort::Status(nullptr);
  cudaError_t ce = cudaMemcpyAsync(out, keep.data(), keep.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);  // `keep` is freed on return
  return cuda_status(ce, op, "copying the kept indices to the device");
}

}  // namespace

static void append_nms_rotated_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(
        Ort::Custom::CreateLiteCustomOp<NmsRotatedKernel<T, nms_compute_cuda<T>>>("nms_rotated", kCudaEp));
    ops.emplace_back(
        Ort::Custom::CreateLiteCustomOp<BatchedNmsRotatedKernel<T, nms_compute_cuda<T>>>("batched_nms_rotated",
                                                                                         kCudaEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_nms_rotated_cuda_ops);
